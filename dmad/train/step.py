"""One DMAD iteration: the student's loss, the critic's loss, and the iteration that runs them;
and one iteration of the peer method, latent consistency distillation (lcm_iteration).

Shapes: latents (B, C, h, w); text conditioning a dmad.models.families.Cond (emb (B, L, D), and
pooled (B, P) for SDXL / SD3 / Flux); timesteps LongTensor (B,). Every network call goes through
the family (its timestep convention, micro-conditioning, latent packing).
Cost per student micro-step: 1 student forward (+ backward-simulation forwards, no grad),
1 batched CFG teacher forward (2B), 1 fake-score forward (no grad), 1 fake-score forward for the
GAN term; per critic micro-step: 1 fake-score forward on student samples (shared with the GAN
fake branch) and 1 on noised real latents.
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Optional

import torch
from torch import nn

from dmad.methods.dmd2 import (loss_distribution_matching, loss_fake_denoising,
                               loss_gan_critic, loss_gan_generator, sample_timesteps)
from dmad.methods.lcm import TargetEMA, consistency_output, ddim_step, loss_consistency, sample_solver_steps
from dmad.methods.noise import SampleRNG, fresh_noise
from dmad.methods.prediction import NoiseSchedule
from dmad.models.families import Cond, FeatureTap, Family
from dmad.train.oom import Phase

if TYPE_CHECKING:
    from dmad.train.session import Session


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


@dataclass(frozen=True)
class TimestepRange:
    low: int
    high: int

    def sample(self, b: int, device, gen: SampleRNG) -> torch.Tensor:
        return sample_timesteps(b, self.low, self.high, device, gen)


@dataclass(frozen=True)
class DmadNetworks:
    """What one DMAD iteration calls, fixed for the run.

    student and fake_score are the networks as prepared by accelerate (DDP-wrapped with several
    processes): the ones whose gradients are synchronised. fake_score_bare is the same fake score
    unwrapped, for the student's no-grad and GAN passes (they must not trigger a DDP reduction).
    The GAN head reads `tap`'s features of `gan_net`: the fake score's bottleneck (DMD2's default)
    or the frozen teacher's (head_on_teacher)."""

    student: nn.Module
    fake_score: nn.Module
    fake_score_bare: nn.Module
    gan_head: nn.Module
    real: RealScore
    gan_net: nn.Module
    tap: FeatureTap
    head_on_teacher: bool
    family: Family
    schedule: NoiseSchedule
    trange: TimestepRange


def generator_loss(nets: DmadNetworks, x0: torch.Tensor, emb: Cond, gen: SampleRNG, gan_weight: float,
                   dm_weight: float = 1.0) -> tuple[torch.Tensor, dict[str, float]]:
    """Student loss on its sample x0 (with graph): w_dm * DM + w_g * non-saturating GAN.

    The critic's parameters must be frozen by the caller (requires_grad False) so the GAN term
    only moves the student. dm_weight 0 (the GAN alone: an ablation) skips the teacher and
    fake-score passes; the noise draws are the same either way."""
    family, schedule = nets.family, nets.schedule
    b = x0.shape[0]
    t = nets.trange.sample(b, x0.device, gen)
    x_t = schedule.add_noise(x0.detach(), fresh_noise(x0, gen), t)
    loss, logs = x0.new_zeros((), dtype=torch.float32), {}
    if dm_weight > 0:
        with torch.no_grad():
            x0_real = nets.real.x0(schedule, x_t, t, emb)
            x0_fake = family.x0(nets.fake_score_bare, x_t, t, emb, schedule, guidance=FAKE_GUIDANCE)
        loss_dm, logs = loss_distribution_matching(x0, x0_real, x0_fake)
        loss = dm_weight * loss_dm
    if gan_weight > 0:
        t_g = nets.trange.sample(b, x0.device, gen)
        _, features = family.predict_with_features(nets.gan_net, nets.tap,
                                                   schedule.add_noise(x0, fresh_noise(x0, gen), t_g), t_g, emb,
                                                   schedule, guidance=FAKE_GUIDANCE)
        loss_g, logs_g = loss_gan_generator(nets.gan_head(features))
        loss = loss + gan_weight * loss_g
        logs.update(logs_g)
    logs["loss_g"] = loss.detach().item()
    return loss, logs


def critic_loss(nets: DmadNetworks, x0_student: torch.Tensor, real_latents: torch.Tensor, emb: Cond,
                gen: SampleRNG, gan_weight: float) -> tuple[torch.Tensor, dict[str, float]]:
    """Critic loss: fake-score denoising on detached student samples + w_d * GAN (real vs student).

    With the head on the fake score, the fake branch reuses the denoising forward's bottleneck;
    with the head on the frozen teacher, the teacher is run for features only."""
    family, schedule = nets.family, nets.schedule
    x0 = x0_student.detach()
    b = x0.shape[0]
    t = nets.trange.sample(b, x0.device, gen)
    noise = fresh_noise(x0, gen)
    x_t = schedule.add_noise(x0, noise, t)
    use_tap = gan_weight > 0 and not nets.head_on_teacher
    if use_tap:
        pred, feats_fake = family.predict_with_features(nets.fake_score, nets.tap, x_t, t, emb, schedule,
                                                        guidance=FAKE_GUIDANCE)
    else:
        pred = family.predict(nets.fake_score, x_t, t, emb, schedule, guidance=FAKE_GUIDANCE)
    loss, logs = loss_fake_denoising(pred, schedule.target(x0, noise, t))
    if gan_weight > 0:
        t_r = nets.trange.sample(b, x0.device, gen)
        xr_t = schedule.add_noise(real_latents, fresh_noise(real_latents, gen), t_r)
        if use_tap:
            _, feats_real = family.predict_with_features(nets.fake_score, nets.tap, xr_t, t_r, emb, schedule,
                                                         guidance=FAKE_GUIDANCE)
        else:
            with torch.no_grad():
                _, feats_fake = family.predict_with_features(nets.gan_net, nets.tap, x_t, t, emb, schedule,
                                                             guidance=FAKE_GUIDANCE)
                _, feats_real = family.predict_with_features(nets.gan_net, nets.tap, xr_t, t_r, emb, schedule,
                                                             guidance=FAKE_GUIDANCE)
        loss_d, logs_d = loss_gan_critic(nets.gan_head(feats_fake), nets.gan_head(feats_real))
        loss = loss + gan_weight * loss_d
        logs.update(logs_d)
    logs["loss_c"] = loss.detach().item()
    return loss, logs


class NonFiniteLoss(Exception):
    """A loss term (or, at checkpoint time, a network's weights) went NaN/inf."""

    def __init__(self, term: str, iteration: int):
        super().__init__(f"{term} is not finite at iteration {iteration}")
        self.term, self.iteration = term, iteration


class LogSum:
    """Sums of per-micro-step logs for one iteration (means are taken over the log window). A
    non-finite loss raises at once in a single process; with several, it is noted and every rank
    raises together at the end of the iteration, so none waits on a dead peer."""

    def __init__(self, defer: bool = False):
        self.sums: dict[str, float] = {}
        self.counts: dict[str, int] = {}
        self.defer = defer
        self.bad: Optional[tuple[str, int]] = None

    def add(self, logs: dict, iteration: int) -> None:
        for k, v in logs.items():
            if v is None:
                continue
            if k.startswith("loss_") and not math.isfinite(v):
                if not self.defer:
                    raise NonFiniteLoss(k, iteration)
                self.bad = self.bad or (k, iteration)
            self.sums[k] = self.sums.get(k, 0.0) + v
            self.counts[k] = self.counts.get(k, 0) + 1


def dmad_iteration(s: "Session", batches: list, first_batch: int, phase: Phase) -> LogSum:
    """One iteration (= one critic optimizer step) on `batches` (gradient_accumulation_steps of them):

    1. per micro-batch: encode images and captions, make the student's input (pure noise, or for
       a multi-step student its own backward-simulated rollout), run the student; every K-th
       iteration (critic_updates_per_generator_update) also backpropagate the student's loss
       (distribution matching + GAN) through it, with the critic frozen;
    2. on those iterations, the student's optimizer step (and EMA);
    3. the critic's micro-batches on the detached student samples (fake-score denoising + GAN on
       real vs student), then its optimizer step.
    `phase` names where an out-of-memory error would come from (dmad.train.oom)."""
    acc, nets, dist = s.accelerator, s.dmad, s.cfg.distillation
    accum, first = len(batches), s.iter == s.start_iter
    gen_step = s.iter % dist.critic_updates_per_generator_update == 0
    samples, logs = [], LogSum(defer=s.world > 1)
    for m, batch in enumerate(batches):
        phase.set("vae-encode" if first else f"step-{s.iter + 1}")
        rng = s.rng(first_batch + m)
        latents, emb = s.encode_batch(batch, rng)
        phase.set("first-forward" if first else phase.name)
        x_t, t = s.student_input(latents.shape, emb, s.iter, rng)
        sync = acc.no_sync(nets.student) if m < accum - 1 else contextlib.nullcontext()
        with sync, acc.autocast(), torch.set_grad_enabled(gen_step):
            x0 = nets.family.x0(nets.student, x_t, t, emb, nets.schedule)
            if gen_step:
                with s.critic_frozen():  # backward too: checkpointed recomputation must see the same graph
                    loss, lg = generator_loss(nets, x0, emb, rng, dist.generator_gan_weight, dist.dm_weight)
                    phase.set("first-backward" if first else phase.name)
                    acc.backward(loss / accum)
                logs.add(lg, s.iter + 1)
        samples.append((x0.detach(), latents, emb, rng))
    if gen_step:
        logs.add({"grad_norm_g": s.step_generator()}, s.iter + 1)
    for m, (x0, latents, emb, rng) in enumerate(samples):
        phase.set("first-forward" if first else phase.name)
        sync = acc.no_sync(nets.fake_score) if m < accum - 1 else contextlib.nullcontext()
        with sync, acc.autocast():
            loss, lc = critic_loss(nets, x0, latents, emb, rng, dist.critic_gan_weight)
        phase.set("first-backward" if first else phase.name)
        acc.backward(loss / accum)
        logs.add(lc, s.iter + 1)
    logs.add({"grad_norm_c": s.step_critic()}, s.iter + 1)
    return logs


# --------------------------------------------------------------------------- LCM, the peer method

@dataclass(frozen=True)
class LcmNetworks:
    """What one latent-consistency-distillation iteration calls (dmad.methods.lcm), fixed for the run:
    the student as prepared by accelerate (its gradients are synchronised) and unwrapped (the
    target's no-grad pass with the EMA weights swapped in), the guided teacher, the EMA target."""

    student: nn.Module
    student_bare: nn.Module
    real: RealScore
    target: TargetEMA
    family: Family
    schedule: NoiseSchedule
    num_ddim_timesteps: int
    huber_c: float
    loss_type: str


def lcm_iteration(s: "Session", batches: list, first_batch: int, phase: Phase) -> LogSum:
    """One LCM iteration (= one student optimizer step) on `batches`, as diffusers'
    train_lcm_distill scripts:

    1. per micro-batch: encode, draw a solver step (t_{n+k}, t_n) on the skipping grid and the noise,
       x_{t_{n+k}} = add_noise(latents); the guided teacher's one DDIM step to x^_{t_n} (no grad);
    2. the target f_{theta^-}(x^_{t_n}, t_n): the student with its EMA weights swapped in (no grad);
    3. per micro-batch: the student's f_theta(x_{t_{n+k}}, t_{n+k}), the consistency loss (L2 or pseudo-Huber),
       backward; then the optimizer step and the target's EMA update.
    Cost per micro-batch: 1 batched CFG teacher forward (2B), 1 target forward, 1 student forward
    and backward."""
    acc, nets = s.accelerator, s.dmad
    family, schedule = nets.family, nets.schedule
    accum, first = len(batches), s.iter == s.start_iter
    logs = LogSum(defer=s.world > 1)
    items = []
    for m, batch in enumerate(batches):
        phase.set("vae-encode" if first else f"step-{s.iter + 1}")
        rng = s.rng(first_batch + m)
        latents, emb = s.encode_batch(batch, rng)
        t, t_prev = sample_solver_steps(latents.shape[0], nets.num_ddim_timesteps, rng, latents.device,
                                        schedule.num_train_timesteps)
        x_t = schedule.add_noise(latents, fresh_noise(latents, rng), t)
        phase.set("first-forward" if first else phase.name)
        with torch.no_grad(), acc.autocast():
            x_prev = ddim_step(x_t, nets.real.x0(schedule, x_t, t, emb), t, t_prev, schedule).to(x_t.dtype)
        items.append((x_t, t, x_prev, t_prev, emb))
    params = s.generator_params()
    with nets.target.swapped_in(params), torch.no_grad(), acc.autocast():
        targets = [consistency_output(x_prev, family.x0(nets.student_bare, x_prev, t_prev, emb, schedule), t_prev)
                   for _, _, x_prev, t_prev, emb in items]
    for m, ((x_t, t, _, _, emb), target) in enumerate(zip(items, targets)):
        sync = acc.no_sync(nets.student) if m < accum - 1 else contextlib.nullcontext()
        with sync, acc.autocast():
            pred = consistency_output(x_t, family.x0(nets.student, x_t, t, emb, schedule), t)
            loss, lg = loss_consistency(pred, target, nets.huber_c, nets.loss_type)
            phase.set("first-backward" if first else phase.name)
            acc.backward(loss / accum)
        logs.add(lg, s.iter + 1)
    logs.add({"grad_norm_g": s.step_generator()}, s.iter + 1)
    nets.target.step(params)
    return logs


# distillation.method -> its iteration (the loop, run folder, checkpoints and samples are shared)
ITERATIONS: dict[str, Callable[["Session", list, int, Phase], LogSum]] = {"dmd2": dmad_iteration,
                                                                         "lcm": lcm_iteration}
