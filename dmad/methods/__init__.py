"""Distillation methods: the math of DMAD (DMD2-style distribution matching + GAN), in paper notation.

Imports torch; the app must never import this package (see the import contracts in pyproject.toml).
"""
from dmad.methods.dmd2 import (
    GanHead,
    backward_simulate,
    loss_distribution_matching,
    loss_fake_denoising,
    loss_gan_critic,
    loss_gan_generator,
    sample_stop_index,
    sample_student,
    sample_timesteps,
    student_timestep_at,
)
from dmad.methods.prediction import PREDICTION_TYPES, NoiseSchedule, guide

__all__ = [
    "GanHead", "NoiseSchedule", "PREDICTION_TYPES", "backward_simulate",
    "guide", "loss_distribution_matching", "loss_fake_denoising", "loss_gan_critic", "loss_gan_generator",
    "sample_stop_index", "sample_student", "sample_timesteps", "student_timestep_at",
]
