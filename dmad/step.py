"""One micro-step of DMAD, as two functions: the student's loss and the critic's loss.

Shapes: latents (B, C, h, w); text embeddings (B, L, D); timesteps LongTensor (B,).
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

from dmad.methods.dmd2 import (BottleneckTap, loss_distribution_matching, loss_fake_denoising,
                               loss_gan_critic, loss_gan_generator, sample_timesteps, _fresh_noise)
from dmad.methods.prediction import NoiseSchedule, cfg
from dmad.noise import SampleRNG


@dataclass
class RealScore:
    """The frozen teacher with classifier-free guidance (uncond = empty-prompt embedding)."""

    unet: nn.Module
    uncond: torch.Tensor  # (1, L, D)
    guidance: float
    dtype: torch.dtype

    def x0(self, schedule: NoiseSchedule, x_t: torch.Tensor, t: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        b = x_t.shape[0]
        x_in = torch.cat([x_t, x_t]).to(self.dtype)
        e_in = torch.cat([self.uncond.expand(b, -1, -1), emb]).to(self.dtype)
        out_u, out_c = self.unet(x_in, torch.cat([t, t]), e_in).sample.float().chunk(2)
        return schedule.to_x0(x_t.float(), cfg(out_u, out_c, self.guidance), t)


def unet_x0(unet: nn.Module, schedule: NoiseSchedule, x_t: torch.Tensor, t: torch.Tensor,
            emb: torch.Tensor) -> torch.Tensor:
    return schedule.to_x0(x_t, unet(x_t, t, emb).sample, t).float()


@dataclass
class TimestepRange:
    low: int
    high: int

    def sample(self, b: int, device, gen: SampleRNG) -> torch.Tensor:
        return sample_timesteps(b, self.low, self.high, device, gen)


def generator_loss(x0: torch.Tensor, emb: torch.Tensor, *, real: RealScore, fake: nn.Module,
                   gan_unet: nn.Module, gan_tap: BottleneckTap, head: nn.Module, schedule: NoiseSchedule,
                   trange: TimestepRange, gan_weight: float, gen: SampleRNG
                   ) -> tuple[torch.Tensor, dict[str, float]]:
    """Student loss on its sample x0 (with graph): DM + w_g * non-saturating GAN.

    The critic's parameters must be frozen by the caller (requires_grad False) so the GAN term
    only moves the student."""
    b = x0.shape[0]
    t = trange.sample(b, x0.device, gen)
    x_t = schedule.add_noise(x0.detach(), _fresh_noise(x0, gen), t)
    with torch.no_grad():
        x0_real = real.x0(schedule, x_t, t, emb)
        x0_fake = unet_x0(fake, schedule, x_t, t, emb)
    loss, logs = loss_distribution_matching(x0, x0_real, x0_fake)
    if gan_weight > 0:
        t_g = trange.sample(b, x0.device, gen)
        gan_unet(schedule.add_noise(x0, _fresh_noise(x0, gen), t_g).to(gan_dtype(gan_unet)), t_g,
                 emb.to(gan_dtype(gan_unet)))
        loss_g, logs_g = loss_gan_generator(head(gan_tap.features))
        loss = loss + gan_weight * loss_g
        logs.update(logs_g)
    logs["loss_g"] = loss.detach().item()
    return loss, logs


def gan_dtype(unet: nn.Module) -> torch.dtype:
    return next(unet.parameters()).dtype


def critic_loss(x0_student: torch.Tensor, real_latents: torch.Tensor, emb: torch.Tensor, *, fake: nn.Module,
                fake_tap: Optional[BottleneckTap], teacher: nn.Module, teacher_tap: Optional[BottleneckTap],
                head: nn.Module, schedule: NoiseSchedule, trange: TimestepRange, gan_weight: float,
                gen: SampleRNG) -> tuple[torch.Tensor, dict[str, float]]:
    """Critic loss: fake-score denoising on detached student samples + w_d * GAN (real vs student).

    With the head on the fake score (fake_tap set), the fake branch reuses the denoising forward's
    bottleneck; with the head on the frozen teacher (teacher_tap set), the teacher is run for
    features only."""
    x0 = x0_student.detach()
    b = x0.shape[0]
    t = trange.sample(b, x0.device, gen)
    noise = _fresh_noise(x0, gen)
    x_t = schedule.add_noise(x0, noise, t)
    pred = fake(x_t, t, emb).sample
    loss, logs = loss_fake_denoising(pred, schedule.target(x0, noise, t))
    if gan_weight > 0:
        t_r = trange.sample(b, x0.device, gen)
        xr_t = schedule.add_noise(real_latents, _fresh_noise(real_latents, gen), t_r)
        if fake_tap is not None:
            feats_fake = fake_tap.features
            fake(xr_t, t_r, emb)
            feats_real = fake_tap.features
        else:
            dt = gan_dtype(teacher)
            with torch.no_grad():
                teacher(x_t.to(dt), t, emb.to(dt))
                feats_fake = teacher_tap.features
                teacher(xr_t.to(dt), t_r, emb.to(dt))
                feats_real = teacher_tap.features
        loss_d, logs_d = loss_gan_critic(head(feats_fake), head(feats_real))
        loss = loss + gan_weight * loss_d
        logs.update(logs_d)
    logs["loss_c"] = loss.detach().item()
    return loss, logs
