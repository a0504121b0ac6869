"""DMAD: distribution matching + adversarial distillation, as in DMD2 (Yin et al. 2024): the losses,
the GAN head, the student's rollouts, one iteration, and the unit that builds and checkpoints it.

Three networks: the frozen teacher (real score, mu_real), the fake score (mu_fake, a copy of the
teacher trained to denoise the student's samples) and the student G (1-4 steps). Per iteration
the critic (fake score + GAN head) steps; every K-th iteration the student steps too:

    student:  loss_distribution_matching(G(z), mu_real(x_t), mu_fake(x_t)) + w_g * loss_gan_generator
    critic:   loss_fake_denoising(fake(x_t'), target) + w_d * loss_gan_critic

x_t is a noised student sample; the GAN head reads the fake score's bottleneck features (the
family's feature tap: dmad.models.families.FeatureTap). Multi-step
students train on their own rollouts (backward_simulate), never on noised real images.

Every loss is `loss_<name>(...) -> (loss, logs)`: a scalar float32 tensor and a dict of python
floats for metrics.csv. `iteration` runs the networks around them (called by dmad.train.loop).

Shapes: latents (B, C, h, w); text conditioning a dmad.models.families.Cond (emb (B, L, D), and
pooled (B, P) for SDXL / SD3 / Flux); timesteps LongTensor (B,). Every network call goes through
the family (its timestep convention, micro-conditioning, latent packing).
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import torch
import torch.nn.functional as F
from torch import nn

from dmad.contract.methods import DMAD
from dmad.methods.noise import SampleRNG, fresh_noise, iteration_generator
from dmad.methods.prediction import NoiseSchedule, ddim_step
from dmad.methods.sharded import no_sync, prepare as prepare_replicated, reshard
from dmad.methods.unit import (LedgerInputs, LogSum, Method, MicroBatch, RealScore, Stages, Stepper, cond_rows,
                               make_ema, make_lr_scheduler, make_optimizer, trainable_parameters)

StudentX0Fn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (x_t, t (B,) long) -> x0


# --------------------------------------------------------------------------- losses

def loss_distribution_matching(x0_student: torch.Tensor, x0_real: torch.Tensor,
                               x0_fake: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
    """DMD2's distribution-matching loss (tianweiy/DMD2 sd_guidance.py, compute_distribution_matching_loss).

    x0_student (B, ...) carries the student's graph; x0_real / x0_fake are the teacher's and the
    fake score's x0 predictions from the same noised student sample, computed under no_grad.
    The KL gradient (x0_fake - x0_real) is divided per sample by mean|x - x0_real| (DMD's weighting:
    scale-free across samples and timesteps), then applied through a stop-gradient MSE whose
    gradient w.r.t. x is exactly grad / x.numel(). A sample whose teacher prediction equals it
    has a 0/0 weight; nan_to_num zeroes it, as in the reference.
    """
    if x0_student.ndim < 2:
        raise ValueError(f"x0_student must be (B, ...) with at least one non-batch dim, got {tuple(x0_student.shape)}")
    x = x0_student.float()
    with torch.no_grad():
        p_real = x - x0_real.float()
        p_fake = x - x0_fake.float()
        w = p_real.abs().flatten(1).mean(1).view(-1, *([1] * (x.ndim - 1)))  # (B, 1, ...)
        grad = torch.nan_to_num((p_real - p_fake) / w)
    loss = 0.5 * F.mse_loss(x, (x - grad).detach())
    return loss, {"loss_dm": loss.detach().item(), "dm_grad_norm": grad.abs().mean().item()}


def loss_regression(x0_student: torch.Tensor, x0_teacher: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
    """DMD's paired regression loss: the student's x0 against the teacher's ODE end from the same
    input, mean squared error in latent space (DMD used LPIPS on images, which needs a download)."""
    loss = F.mse_loss(x0_student.float(), x0_teacher.float())
    return loss, {"loss_reg": loss.detach().item()}


def ode_grid(t_start: int, steps_full: int, num_train_timesteps: int = 1000) -> list[int]:
    """Descending timesteps from t_start to 0 with the spacing of `steps_full` steps over the whole
    range: ceil(steps_full * (t_start + 1) / T) steps (7 steps from 249 at 25 over the range)."""
    n = max(1, math.ceil(steps_full * (t_start + 1) / num_train_timesteps))
    return [round(t_start * (n - i) / n) for i in range(n + 1)]


@torch.no_grad()
def teacher_ode_x0(real: RealScore, schedule: NoiseSchedule, x_t: torch.Tensor, t_start: int, emb: Any,
                   steps_full: int) -> torch.Tensor:
    """Where the guided teacher's deterministic sampler takes x_t (at t_start) : DDIM steps (Euler
    for a flow schedule) on ode_grid, and its x0 prediction at the last point before 0. Cost: one
    CFG teacher pass per step."""
    grid = ode_grid(t_start, steps_full, schedule.num_train_timesteps)
    x = x_t
    for a, b in zip(grid[:-1], grid[1:]):
        t = torch.full((x.shape[0],), a, dtype=torch.long, device=x.device)
        x0 = real.x0(schedule, x, t, emb)
        if b == 0:
            return x0
        x = ddim_step(x, x0, t, torch.full_like(t, b), schedule).to(x_t.dtype)
    return x0


def loss_fake_denoising(pred: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
    """The fake score's plain denoising loss on student samples, in its native prediction (eps / v / x0)."""
    loss = F.mse_loss(pred.float(), target.float())
    return loss, {"loss_fake": loss.detach().item()}


def loss_gan_generator(logits_fake: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
    """Non-saturating generator loss -log sigmoid(D(G(z))) = softplus(-logit)."""
    loss = F.softplus(-logits_fake.float()).mean()
    return loss, {"loss_g_gan": loss.detach().item()}


def loss_gan_critic(logits_fake: torch.Tensor, logits_real: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
    """Logistic critic loss: -log(1 - sigmoid(D(fake))) - log sigmoid(D(real)). 2 log 2 at chance."""
    fake, real = logits_fake.float(), logits_real.float()
    loss = F.softplus(fake).mean() + F.softplus(-real).mean()
    return loss, {"loss_d_gan": loss.detach().item(),
                  "d_real_acc": (real > 0).float().mean().item(),
                  "d_fake_acc": (fake < 0).float().mean().item()}


# --------------------------------------------------------------------------- GAN head on the UNet bottleneck

def _groups(channels: int, max_groups: int = 32) -> int:
    """Most GroupNorm groups (<= max_groups) with >= 2 channels each: at a 1x1 bottleneck a
    one-channel group has zero variance and would erase its input."""
    for g in range(min(max_groups, channels // 2), 0, -1):
        if channels % g == 0:
            return g
    return 1


class GanHead(nn.Module):
    """Bottleneck features (B, C, h, w) -> one realism logit per sample (B,), float32.

    3x3 convolutions with stride 2 and padding 1 map a side n to ceil(n / 2) >= 1 for every n >= 1,
    so one fixed set of layers serves any bottleneck (SD 1.5 at 512 px: 8x8 -> 4x4 -> 2x2; a tiny
    test UNet's 2x2 -> 1x1 -> 1x1); global average pooling then removes the remaining size.
    Cost at C = 1280, hidden = 256: ~3.5 M parameters, negligible next to the UNet.
    """

    def __init__(self, in_channels: int, hidden: int = 256):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(in_channels, hidden, kernel_size=3, stride=2, padding=1),
            nn.GroupNorm(_groups(hidden), hidden),
            nn.SiLU(),
            nn.Conv2d(hidden, hidden, kernel_size=3, stride=2, padding=1),
            nn.GroupNorm(_groups(hidden), hidden),
            nn.SiLU(),
        )
        self.out = nn.Linear(hidden, 1)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        h = self.body(features.to(self.out.weight.dtype))
        # a fresh tensor, not a view: FSDP2 hooks a sharded head's output for its backward
        return self.out(h.mean(dim=(2, 3))).squeeze(1).float().clone()


# --------------------------------------------------------------------------- timesteps and student rollouts

def sample_timesteps(batch: int, min_timestep: int, max_timestep: int, device: torch.device | str,
                     generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """Uniform integer timesteps in [min_timestep, max_timestep] (both inclusive), LongTensor (B,)."""
    if not 0 <= min_timestep <= max_timestep:
        raise ValueError(f"need 0 <= min_timestep <= max_timestep, got {min_timestep}, {max_timestep}")
    if hasattr(generator, "randint"):  # dmad.methods.noise.SampleRNG: one draw per sample from its own generator
        return generator.randint(min_timestep, max_timestep + 1).to(device)
    gen_device = generator.device if generator is not None else "cpu"
    t = torch.randint(min_timestep, max_timestep + 1, (batch,), generator=generator, device=gen_device)
    return t.to(device)


def sample_stop_index(num_steps: int, generator: Optional[torch.Generator] = None) -> int:
    """Which student step to train this iteration, uniform in [0, num_steps) (DMD2: one per batch)."""
    gen_device = generator.device if generator is not None else "cpu"
    return int(torch.randint(0, num_steps, (1,), generator=generator, device=gen_device).item())


def student_timestep_at(timesteps: list[int], k: int) -> int:
    """The student's timestep for step k (0 = pure noise), with a clear error out of range."""
    if not 0 <= k < len(timesteps):
        raise ValueError(f"student step {k} out of range: the student has {len(timesteps)} steps {timesteps}")
    return int(timesteps[k])


def _rollout(student_x0_fn: StudentX0Fn, noise: torch.Tensor, timesteps: list[int], steps: int,
             schedule: NoiseSchedule, generator: Optional[torch.Generator], noise_fn=None):
    """Run `steps` student steps from pure noise at timesteps[0]; each x0 is re-noised to the next
    timestep with fresh noise (noise_fn(x0), or drawn from `generator` in x0's layout). Returns
    (x, t) at step `steps` and the last x0 (None if steps == 0)."""
    fresh = noise_fn or (lambda like: fresh_noise(like, generator))
    x, x0 = noise, None
    for i in range(steps):
        t = torch.full((noise.shape[0],), timesteps[i], dtype=torch.long, device=noise.device)
        x0 = student_x0_fn(x, t)
        if i + 1 < len(timesteps):
            t_next = torch.full_like(t, timesteps[i + 1])
            x = schedule.add_noise(x0, fresh(x0), t_next).to(noise.dtype)
    t = torch.full((noise.shape[0],), timesteps[min(steps, len(timesteps) - 1)], dtype=torch.long,
                   device=noise.device)
    return x, t, x0


@torch.no_grad()
def backward_simulate(student_x0_fn: StudentX0Fn, noise: torch.Tensor, timesteps: list[int], stop_index: int,
                      schedule: NoiseSchedule, generator: Optional[torch.Generator] = None
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """DMD2 backward simulation: the input the student sees at step `stop_index` of its own sampler.

    Runs stop_index student steps under no_grad (cost: stop_index forwards, no activations kept)
    and returns (x_t, t (B,) long) for the step to train with gradient. Takes no data argument:
    a multi-step student trains on its own rollouts, the inputs it meets when sampling.
    """
    student_timestep_at(timesteps, stop_index)
    x, t, _ = _rollout(student_x0_fn, noise, timesteps, stop_index, schedule, generator)
    return x, t


@torch.no_grad()
def sample_student(student_x0_fn: StudentX0Fn, noise: torch.Tensor, timesteps: list[int],
                   schedule: NoiseSchedule, generator: Optional[torch.Generator] = None,
                   noise_fn=None) -> torch.Tensor:
    """The student's len(timesteps)-step sampler (same re-noising as training); returns x0.
    `noise_fn(like)`: the re-noising draw, when it must follow a pipeline's layout (Flux draws in
    its packed token layout, so an exported student reproduces these pixels)."""
    if not timesteps:
        raise ValueError("the student needs at least one timestep")
    _, _, x0 = _rollout(student_x0_fn, noise, timesteps, len(timesteps), schedule, generator, noise_fn)
    return x0


# --------------------------------------------------------------------------- one iteration

# A guidance-embedding family (Flux dev): the fake score and the GAN feature passes run at
# guidance 1, the plain conditional model (DMD2's fake score is unguided); the teacher gets
# real_guidance_scale and the student Family.guidance (the same scale), so distribution matching
# pulls the student toward the guided teacher from the first step. Other families ignore it.
FAKE_GUIDANCE = 1.0


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
    processes): the ones whose gradients are synchronised. student_bare and fake_score_bare are the
    same networks unwrapped, for the no-grad rollouts and GAN passes (they must not trigger a DDP
    reduction). The GAN head reads `tap`'s features of `gan_net`: the fake score's bottleneck
    (DMD2's default) or the frozen teacher's (head_on_teacher)."""

    student: nn.Module
    student_bare: nn.Module
    fake_score: nn.Module
    fake_score_bare: nn.Module
    gan_head: nn.Module
    real: RealScore
    gan_net: nn.Module
    tap: Any  # dmad.models.families.FeatureTap
    head_on_teacher: bool
    family: Any  # dmad.models.families.Family
    schedule: NoiseSchedule
    trange: TimestepRange
    timesteps: list[int]  # the student's


def iteration(nets: DmadNetworks, opts: dict[str, Stepper], batches: list[MicroBatch], it: int, cfg: Any,
              acc: Any, stages: Stages) -> LogSum:
    """One iteration (= one critic optimizer step) on `batches` (gradient_accumulation_steps of them),
    `it` iterations done before it; cfg: the run's TrainConfig, acc: its accelerate.Accelerator.

    1. per micro-batch: encode images and captions, make the student's input (pure noise, or for
       a multi-step student its own backward-simulated rollout), run the student; every K-th
       iteration (critic_updates_per_generator_update) also backpropagate the student's loss
       (distribution matching + GAN) through it, with the critic frozen;
    2. on those iterations, the student's optimizer step (and EMA);
    3. the critic's micro-batches on the detached student samples (fake-score denoising + GAN on
       real vs student), then its optimizer step.
    Cost per student micro-step: 1 student forward (+ backward-simulation forwards, no grad), 1
    batched CFG teacher forward (2B), 1 fake-score forward (no grad), 1 fake-score forward for the
    GAN term; per critic micro-step: 1 fake-score forward on student samples (shared with the GAN
    fake branch) and 1 on noised real latents."""
    dist, max_norm = cfg.distillation, cfg.optimization.max_grad_norm
    accum = len(batches)
    gen_step = it % dist.critic_updates_per_generator_update == 0
    samples, logs = [], LogSum(defer=acc.num_processes > 1)
    for m, mb in enumerate(batches):
        stages.encode()
        latents, emb = mb.encode()
        stages.forward()
        x_t, t = student_input(nets, latents.shape, emb, it, cfg.resources.seed, mb.rng, acc)
        sync = no_sync(acc, nets.student) if m < accum - 1 else contextlib.nullcontext()
        with sync, acc.autocast(), torch.set_grad_enabled(gen_step):
            x0 = nets.family.x0(nets.student, x_t, t, emb, nets.schedule)
            if gen_step:
                with critic_frozen(opts["critic"]):  # backward too: checkpointed recomputation must see the same graph
                    loss, lg = generator_loss(nets, x0, emb, mb.rng, dist.generator_gan_weight, dist.dm_weight,
                                              dist.real_guidance_max_timestep)
                    if dist.regression_weight > 0:
                        loss, lg = with_regression(nets, loss, lg, x0, x_t, t, emb, dist)
                    stages.backward()
                    acc.backward(loss / accum)
                logs.add(lg, it + 1)
        samples.append((x0.detach(), latents, emb, mb.rng))
    if gen_step:
        logs.add({"grad_norm_g": opts["generator"].step(acc, max_norm)}, it + 1)
    for m, (x0, latents, emb, rng) in enumerate(samples):
        stages.forward()
        sync = no_sync(acc, nets.fake_score) if m < accum - 1 else contextlib.nullcontext()
        with sync, acc.autocast():
            loss, lc = critic_loss(nets, x0, latents, emb, rng, dist.critic_gan_weight)
        stages.backward()
        acc.backward(loss / accum)
        logs.add(lc, it + 1)
    logs.add({"grad_norm_c": opts["critic"].step(acc, max_norm)}, it + 1)
    return logs


def student_input(nets: DmadNetworks, shape: torch.Size, emb: Any, it: int, seed: int, rng: SampleRNG,
                  acc: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Pure noise at the first student timestep; for multi-step students, the student's own
    rollout to a step index drawn from (seed, iteration): the same for every micro-batch and
    on every process, without communication."""
    noise = rng.randn(tuple(shape[1:]))
    timesteps = nets.timesteps
    if len(timesteps) == 1:
        return noise, torch.full((shape[0],), timesteps[0], dtype=torch.long, device=acc.device)
    k = sample_stop_index(len(timesteps), iteration_generator(seed, it))
    if acc.num_processes > 1:  # the same on every rank by construction; rank 0's value, to be certain
        from accelerate.utils import broadcast_object_list

        box = [k]
        broadcast_object_list(box, from_process=0)
        k = box[0]

    def x0_fn(x_t, t):
        with acc.autocast():
            return nets.family.x0(nets.student_bare, x_t, t, emb, nets.schedule)

    return backward_simulate(x0_fn, noise, timesteps, k, nets.schedule, rng)


@contextlib.contextmanager
def critic_frozen(critic: Stepper):
    """During the student's update the critic only passes gradients through to the student.
    Sharded critic networks are resharded on the way in and out, so their next call gathers
    weights with the requires_grad just set."""
    params = critic.params()
    for p in params:
        p.requires_grad_(False)
    reshard(*critic.nets)
    try:
        yield
    finally:
        for p in params:
            p.requires_grad_(True)
        reshard(*critic.nets)


def generator_loss(nets: DmadNetworks, x0: torch.Tensor, emb: Any, gen: SampleRNG, gan_weight: float,
                   dm_weight: float = 1.0, guided_up_to: int = 999) -> tuple[torch.Tensor, dict[str, float]]:
    """Student loss on its sample x0 (with graph): w_dm * DM + w_g * non-saturating GAN.

    The critic's parameters must be frozen by the caller (requires_grad False) so the GAN term
    only moves the student. dm_weight 0 (the GAN alone: an ablation) skips the teacher and
    fake-score passes; the noise draws are the same either way. guided_up_to
    (real_guidance_max_timestep): distribution matching guides the teacher only at timesteps up
    to it (999: everywhere, DMD2)."""
    family, schedule = nets.family, nets.schedule
    b = x0.shape[0]
    t = nets.trange.sample(b, x0.device, gen)
    x_t = schedule.add_noise(x0.detach(), fresh_noise(x0, gen), t)
    loss, logs = x0.new_zeros((), dtype=torch.float32), {}
    if dm_weight > 0:
        with torch.no_grad():
            x0_real = nets.real.x0(schedule, x_t, t, emb, guided_up_to=guided_up_to)
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


def with_regression(nets: DmadNetworks, loss: torch.Tensor, logs: dict, x0: torch.Tensor, x_t: torch.Tensor,
                    t: torch.Tensor, emb: Any, dist: Any) -> tuple[torch.Tensor, dict[str, float]]:
    """The student loss plus regression_weight * loss_regression on the first regression_images of
    the micro-batch: their x0 against the guided teacher's ODE end from the same input x_t (the
    student's own input at its step: pure noise, or its backward-simulated rollout)."""
    r = min(dist.regression_images, x0.shape[0])
    head = cond_rows(emb, slice(0, r))
    target = teacher_ode_x0(nets.real, nets.schedule, x_t[:r], int(t[0]), head, dist.regression_teacher_steps)
    loss_r, logs_r = loss_regression(x0[:r], target)
    loss = loss + dist.regression_weight * loss_r
    return loss, {**logs, **logs_r, "loss_g": loss.detach().item()}


def critic_loss(nets: DmadNetworks, x0_student: torch.Tensor, real_latents: torch.Tensor, emb: Any,
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


# --------------------------------------------------------------------------- the unit: networks, checkpoint, memory

GAN_HEAD = "gan_head.safetensors"


@dataclass
class DmadTrainables:
    """DMAD's trained networks, unwrapped: the student (+ EMA), the fake score and the GAN head.
    With a LoRA student and a LoRA fake score on a shared base (dmad.models.shared_base) both are
    adapter views of the teacher's own denoiser and teacher_view calls it with the adapters off."""

    student: nn.Module
    fake_score: nn.Module
    gan_head: nn.Module
    ema: Optional[Any]
    shared: Optional[Any] = None
    teacher_view: Optional[nn.Module] = None


def make_networks(copies: Any, *, student: str, fake_score: str, gan_on_teacher: bool,
                  ema_decay: Optional[float]) -> DmadTrainables:
    """Student and fake score from the float32 teacher (copies: dmad.models.networks.TeacherCopies),
    full or LoRA, on one shared frozen base when both are LoRA and the config allows it; the GAN
    head on the width of the bottleneck it reads; the student's EMA."""
    shared = teacher_view = None
    if copies.shares_base(student, fake_score):
        shared, s, f, teacher_view = copies.shared_adapters()
    else:
        s, f = copies.copy(student), copies.copy(fake_score)
    head = GanHead(copies.family.feature_channels(copies.teacher_unet if gan_on_teacher else f))
    return DmadTrainables(s, f, head, make_ema(s, ema_decay), shared, teacher_view)


def _trainables(copies: Any, ident: Any, dist: Any) -> DmadTrainables:
    return make_networks(copies, student=ident.student, fake_score=ident.fake_score, ema_decay=dist.ema_decay,
                         gan_on_teacher=dist.gan_head_placement == "teacher_bottleneck")


def prepare(nets: DmadTrainables, cfg: Any, acc: Any, real: RealScore, schedule: NoiseSchedule,
            timesteps: list[int]) -> tuple[DmadNetworks, dict[str, Stepper]]:
    """The student's and the critic's (fake score + GAN head) optimizers with their schedules (the
    student steps every K-th iteration, so its schedule counts K times fewer steps), the networks
    prepared by accelerate, and what an iteration calls."""
    opt, dist = cfg.optimization, cfg.distillation
    betas = (opt.adam_beta1, opt.adam_beta2)
    opt_g = make_optimizer(trainable_parameters(nets.student), opt.optimizer, opt.generator_lr, betas,
                           opt.adam_epsilon, opt.adam_weight_decay)
    critic_params = trainable_parameters(nets.fake_score) + trainable_parameters(nets.gan_head)
    opt_c = make_optimizer(critic_params, opt.optimizer, opt.critic_lr, betas, opt.adam_epsilon, opt.adam_weight_decay)
    k = dist.critic_updates_per_generator_update
    sched_g = make_lr_scheduler(opt_g, opt.lr_scheduler, math.ceil(opt.lr_warmup_steps / k),
                                math.ceil(opt.max_train_steps / k))
    sched_c = make_lr_scheduler(opt_c, opt.lr_scheduler, opt.lr_warmup_steps, opt.max_train_steps)
    student, fake, head, opt_g, opt_c = prepare_replicated(acc, nets.student, nets.fake_score, nets.gan_head, opt_g,
                                                           opt_c)
    on_teacher = dist.gan_head_placement == "teacher_bottleneck"
    gan_net = real.unet if on_teacher else nets.fake_score
    calls = DmadNetworks(student=student, student_bare=nets.student, fake_score=fake, fake_score_bare=nets.fake_score,
                         gan_head=head, real=real, gan_net=gan_net, tap=real.family.tap(gan_net),
                         head_on_teacher=on_teacher, family=real.family, schedule=schedule,
                         trange=TimestepRange(dist.min_timestep, dist.max_timestep), timesteps=timesteps)
    return calls, {"generator": Stepper(opt_g, sched_g, nets.ema, (nets.student,)),
                   "critic": Stepper(opt_c, sched_c, nets=(nets.fake_score, nets.gan_head))}


def _save_files(nets: DmadTrainables, out: Path) -> None:
    from safetensors.torch import save_file

    save_file({k: v.contiguous().cpu() for k, v in nets.gan_head.state_dict().items()}, str(out / GAN_HEAD))


def _load_files(nets: DmadTrainables, ckpt: Path) -> None:
    from safetensors.torch import load_file

    nets.gan_head.load_state_dict(load_file(str(ckpt / GAN_HEAD)))


def gan_head_params(bottleneck_channels: int) -> int:
    with torch.device("meta"):
        return sum(p.numel() for p in GanHead(bottleneck_channels).parameters())


def _ledger_lines(x: LedgerInputs) -> list:
    head = gan_head_params(x.bottleneck_channels)
    return [x.trainable("fake score", x.fake_score),
            x.line("GAN head", head * 4 * (2 + x.optimizer_states),
                   f"{head / 1e6:.1f} M params on {x.bottleneck_channels}-channel bottleneck features, "
                   f"fp32 + grads + optimizer states")]


UNIT = Method(
    info=DMAD, networks=("student", "fake_score"), files=(GAN_HEAD,),
    trainables=_trainables, prepare=prepare, iteration=iteration,
    modules=lambda nets: [("student", nets.student), ("fake_score", nets.fake_score), ("gan_head", nets.gan_head)],
    save_files=_save_files, load_files=_load_files, state_tensors=lambda nets: [],
    # the critic step backpropagates through the fake score on student samples and on noised real
    # latents; the student step through the student and the fake score (GAN)
    graphs_at_peak=2, ledger_lines=_ledger_lines, shares_base=True)
