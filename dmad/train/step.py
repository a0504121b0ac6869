"""One micro-step of DMAD, as two functions: the student's loss and the critic's loss.

Shapes: latents (B, C, h, w); text conditioning a dmad.models.families.Cond (emb (B, L, D), and
pooled (B, P) for SDXL / SD3 / Flux); timesteps LongTensor (B,). Every network call goes through
the family (its timestep convention, micro-conditioning, latent packing).
Cost per student micro-step: 1 student forward (+ backward-simulation forwards, no grad),
1 batched CFG teacher forward (2B), 1 fake-score forward (no grad), 1 fake-score forward for the
GAN term; per critic micro-step: 1 fake-score forward on student samples (shared with the GAN
fake branch) and 1 on noised real latents.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn

from dmad.methods.dmd2 import (loss_distribution_matching, loss_fake_denoising,
                               loss_gan_critic, loss_gan_generator, sample_timesteps, _fresh_noise)
from dmad.methods.prediction import NoiseSchedule
from dmad.models.families import Cond, FeatureTap, Family
from dmad.methods.noise import SampleRNG


# A guidance-embedding family (Flux dev): the fake score and the GAN feature passes run at
# guidance 1, the plain conditional model (DMD2's fake score is unguided); the teacher gets
# real_guidance_scale and the student Family.guidance (the same scale), so distribution matching
# pulls the student toward the guided teacher from the first step. Other families ignore it.
FAKE_GUIDANCE = 1.0


@dataclass
class RealScore:
    """The frozen teacher with its family's guidance: classifier-free guidance on the family's
    unconditional embedding, or the guidance-embedding input of a guidance-distilled network."""

    unet: nn.Module      # the teacher's denoiser (UNet or transformer)
    uncond: Optional[Cond]  # batch 1
    guidance: float
    family: Family

    def x0(self, schedule: NoiseSchedule, x_t: torch.Tensor, t: torch.Tensor, emb: Cond) -> torch.Tensor:
        return self.family.guided_x0(self.unet, x_t, t, emb, self.uncond, self.guidance, schedule)


@dataclass
class TimestepRange:
    low: int
    high: int

    def sample(self, b: int, device, gen: SampleRNG) -> torch.Tensor:
        return sample_timesteps(b, self.low, self.high, device, gen)


def generator_loss(x0: torch.Tensor, emb: Cond, *, real: RealScore, fake: nn.Module,
                   gan_unet: nn.Module, gan_tap: FeatureTap, head: nn.Module, schedule: NoiseSchedule,
                   trange: TimestepRange, gan_weight: float, gen: SampleRNG, family: Family
                   ) -> tuple[torch.Tensor, dict[str, float]]:
    """Student loss on its sample x0 (with graph): DM + w_g * non-saturating GAN.

    The critic's parameters must be frozen by the caller (requires_grad False) so the GAN term
    only moves the student."""
    b = x0.shape[0]
    t = trange.sample(b, x0.device, gen)
    x_t = schedule.add_noise(x0.detach(), _fresh_noise(x0, gen), t)
    with torch.no_grad():
        x0_real = real.x0(schedule, x_t, t, emb)
        x0_fake = family.x0(fake, x_t, t, emb, schedule, guidance=FAKE_GUIDANCE)
    loss, logs = loss_distribution_matching(x0, x0_real, x0_fake)
    if gan_weight > 0:
        t_g = trange.sample(b, x0.device, gen)
        family.predict(gan_unet, schedule.add_noise(x0, _fresh_noise(x0, gen), t_g), t_g, emb, schedule,
                       guidance=FAKE_GUIDANCE)
        loss_g, logs_g = loss_gan_generator(head(gan_tap.features))
        loss = loss + gan_weight * loss_g
        logs.update(logs_g)
    logs["loss_g"] = loss.detach().item()
    return loss, logs


def critic_loss(x0_student: torch.Tensor, real_latents: torch.Tensor, emb: Cond, *, fake: nn.Module,
                fake_tap: Optional[FeatureTap], teacher: nn.Module, teacher_tap: Optional[FeatureTap],
                head: nn.Module, schedule: NoiseSchedule, trange: TimestepRange, gan_weight: float,
                gen: SampleRNG, family: Family) -> tuple[torch.Tensor, dict[str, float]]:
    """Critic loss: fake-score denoising on detached student samples + w_d * GAN (real vs student).

    With the head on the fake score (fake_tap set), the fake branch reuses the denoising forward's
    bottleneck; with the head on the frozen teacher (teacher_tap set), the teacher is run for
    features only."""
    x0 = x0_student.detach()
    b = x0.shape[0]
    t = trange.sample(b, x0.device, gen)
    noise = _fresh_noise(x0, gen)
    x_t = schedule.add_noise(x0, noise, t)
    pred = family.predict(fake, x_t, t, emb, schedule, guidance=FAKE_GUIDANCE)
    loss, logs = loss_fake_denoising(pred, schedule.target(x0, noise, t))
    if gan_weight > 0:
        t_r = trange.sample(b, x0.device, gen)
        xr_t = schedule.add_noise(real_latents, _fresh_noise(real_latents, gen), t_r)
        if fake_tap is not None:
            feats_fake = fake_tap.features
            family.predict(fake, xr_t, t_r, emb, schedule, guidance=FAKE_GUIDANCE)
            feats_real = fake_tap.features
        else:
            with torch.no_grad():
                family.predict(teacher, x_t, t, emb, schedule, guidance=FAKE_GUIDANCE)
                feats_fake = teacher_tap.features
                family.predict(teacher, xr_t, t_r, emb, schedule, guidance=FAKE_GUIDANCE)
                feats_real = teacher_tap.features
        loss_d, logs_d = loss_gan_critic(head(feats_fake), head(feats_real))
        loss = loss + gan_weight * loss_d
        logs.update(logs_d)
    logs["loss_c"] = loss.detach().item()
    return loss, logs
