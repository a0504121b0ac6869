"""Distillation methods, one unit each: dmd2.py (DMAD: DMD2-style distribution matching + GAN) and
lcm.py (latent consistency distillation, the peer method); unit.py (what they share: the shape of a
unit, an iteration's inputs and logs), prediction.py (schedules, prediction conversions), noise.py
(seeded draws). UNITS is the registry: distillation.method -> its unit; its torch-free description
is dmad.contract.methods.METHODS (the same names, in the same order).

Imports torch; the app must never import this package (see the import contracts in pyproject.toml).
"""
from dmad.methods import dmd2, lcm
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
from dmad.methods.unit import Method

UNITS: dict[str, Method] = {unit.info.name: unit for unit in (dmd2.UNIT, lcm.UNIT)}


def method_unit(name: str) -> Method:
    """The unit of distillation.method `name` (the config has validated it)."""
    return UNITS[name]


__all__ = [
    "GanHead", "Method", "NoiseSchedule", "PREDICTION_TYPES", "UNITS", "backward_simulate",
    "guide", "loss_distribution_matching", "loss_fake_denoising", "loss_gan_critic", "loss_gan_generator",
    "method_unit", "sample_stop_index", "sample_student", "sample_timesteps", "student_timestep_at",
]
