"""Latent consistency distillation (LCM; Luo et al. 2023), the peer method DMAD is measured against.

Follows diffusers' reference scripts (examples/consistency_distillation/train_lcm_distill_*.py):

    x_{t_{n+k}} = add_noise(x0, eps, t_{n+k})              t_{n+k} on the solver's grid (19, 39, ..., 999)
    x^_{t_n}    = DDIM(x_{t_{n+k}}, guided teacher)         one skipping step with classifier-free guidance
    f(x, t)     = c_skip(t) x + c_out(t) x0_theta(x, t)     boundary conditions: f(x, 0) = x
    loss        = mean( d(f_theta(x_{t_{n+k}}, t_{n+k}), f_target(x^_{t_n}, t_n)) )
                  d = squared error ("l2", the scripts' default) or pseudo-Huber sqrt(.^2 + c^2) - c

with the target network an EMA of the student (theta^- <- mu theta^- + (1 - mu) theta after each
student step). c_skip = s_d^2 / ((10 t)^2 + s_d^2), c_out = 10 t / sqrt((10 t)^2 + s_d^2), s_d = 0.5
(timestep_scaling 10, as the scripts).

The teacher's guidance scale is fixed (distillation.real_guidance_scale): the scripts sample
w ~ U[w_min, w_max] and, for a full student, feed it to the UNet through a guidance embedding
(time_cond_proj_dim); a network without that input (every teacher family here, and the
LCM-LoRA scripts' students) cannot be told w, so one w is the faithful choice.

Everything is written in x0 / noise terms with the schedule's (alpha_t, sigma_t), so the same code
serves a DDPM teacher (x_t = sqrt(a) x0 + sqrt(1 - a) eps) and a flow teacher (x_t = (1 - s) x0
+ s eps), where the DDIM step is the Euler step of the flow ODE. The maths first; then one
iteration (`iteration`, called by dmad.train.loop) and the unit that builds and checkpoints it:
only the student (full, or LoRA on its own frozen copy, as diffusers' LCM and LCM-LoRA scripts)
and its target; no fake score, no GAN head, no critic.
Shapes: latents (B, C, h, w); timesteps LongTensor (B,).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import torch
from torch import nn

from dmad.contract.methods import LCM
from dmad.methods.noise import fresh_noise
from dmad.methods.prediction import NoiseSchedule, ddim_step
from dmad.methods.sharded import no_sync
from dmad.methods.unit import (LedgerInputs, LogSum, Method, MicroBatch, RealScore, Stages, Stepper, make_ema,
                               make_lr_scheduler, make_optimizer, read_shadow, trainable_parameters)

TIMESTEP_SCALING = 10.0
SIGMA_DATA = 0.5


def solver_grid(num_ddim_timesteps: int, num_train_timesteps: int = 1000, device=None) -> torch.Tensor:
    """(N,) ascending: k * (T // N) - 1 for k = 1 .. N (diffusers' DDIMSolver.ddim_timesteps)."""
    step = num_train_timesteps // num_ddim_timesteps
    return torch.arange(1, num_ddim_timesteps + 1, device=device, dtype=torch.long) * step - 1


def sample_solver_steps(b: int, num_ddim_timesteps: int, gen, device,
                        num_train_timesteps: int = 1000) -> tuple[torch.Tensor, torch.Tensor]:
    """(t_{n+k}, t_n) per sample: a uniform grid index, its timestep and the one a solver step below
    (clamped at 0: the first grid point's step lands on t = 0, where f is the identity)."""
    grid = solver_grid(num_ddim_timesteps, num_train_timesteps, device)
    if hasattr(gen, "randint") and not isinstance(gen, torch.Generator):  # SampleRNG: one draw per sample
        index = gen.randint(0, num_ddim_timesteps).to(device)
    else:
        index = torch.randint(0, num_ddim_timesteps, (b,), generator=gen).to(device)
    start = grid[index]
    prev = (start - num_train_timesteps // num_ddim_timesteps).clamp(min=0)
    return start, prev


def boundary_scalings(t: torch.Tensor, ndim: int, timestep_scaling: float = TIMESTEP_SCALING,
                      sigma_data: float = SIGMA_DATA) -> tuple[torch.Tensor, torch.Tensor]:
    """(c_skip, c_out) float32, shaped (B, 1, ...): diffusers' scalings_for_boundary_conditions."""
    s = t.float() * timestep_scaling
    c_skip = sigma_data ** 2 / (s ** 2 + sigma_data ** 2)
    c_out = s / (s ** 2 + sigma_data ** 2) ** 0.5
    shape = (-1, *([1] * (ndim - 1)))
    return c_skip.view(shape), c_out.view(shape)


def consistency_output(x_t: torch.Tensor, x0: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """f(x_t, t) = c_skip(t) x_t + c_out(t) x0 (float32)."""
    c_skip, c_out = boundary_scalings(t, x_t.ndim)
    return c_skip * x_t.float() + c_out * x0.float()


def loss_consistency(pred: torch.Tensor, target: torch.Tensor, huber_c: float,
                     loss_type: str = "huber") -> tuple[torch.Tensor, dict]:
    """The consistency loss of the scripts (--loss_type), elementwise in float32 and averaged:
    "huber": the pseudo-Huber mean(sqrt((pred - target)^2 + c^2) - c); "l2": the squared error
    mean((pred - target)^2) (F.mse_loss, the scripts' default). Logs: loss_lcm."""
    d = pred.float() - target.float()
    if loss_type == "l2":
        loss = torch.mean(d ** 2)
    elif loss_type == "huber":
        loss = torch.mean(torch.sqrt(d ** 2 + huber_c ** 2) - huber_c)
    else:
        raise ValueError(f"unknown LCM loss type {loss_type!r} (huber or l2)")
    return loss, {"loss_lcm": loss.detach().item()}


class TargetEMA:
    """The target network theta^-: a constant-rate EMA of the student's trainable parameters
    (diffusers' update_ema(target, online, mu)), held as shadow tensors. `swapped_in` runs a block
    with the student's parameters replaced by the shadow (for the target's no-grad forward) and
    puts the student's own back, so one network object serves both (full, LoRA or shared-base
    adapters alike)."""

    def __init__(self, params: list[torch.nn.Parameter], decay: float):
        self.decay = float(decay)
        self.shadow = [p.detach().clone() for p in params]

    @torch.no_grad()
    def step(self, params: list[torch.nn.Parameter]) -> None:
        # theta^- = mu theta^- + (1 - mu) theta
        torch._foreach_lerp_(self.shadow, [p.detach() for p in params], 1.0 - self.decay)

    def to(self, device) -> "TargetEMA":
        self.shadow = [t.to(device) for t in self.shadow]
        return self

    @contextlib.contextmanager
    def swapped_in(self, params: list[torch.nn.Parameter]):
        with torch.no_grad():
            own = [p.detach().clone() for p in params]
            for p, t in zip(params, self.shadow):
                p.copy_(t)
        try:
            yield
        finally:
            with torch.no_grad():
                for p, t in zip(params, own):
                    p.copy_(t)


# --------------------------------------------------------------------------- one iteration

@dataclass(frozen=True)
class LcmNetworks:
    """What one latent-consistency-distillation iteration calls, fixed for the run: the student as
    prepared by accelerate (its gradients are synchronised) and unwrapped (the target's no-grad
    pass with the EMA weights swapped in), the guided teacher, the EMA target."""

    student: nn.Module
    student_bare: nn.Module
    real: RealScore
    target: TargetEMA
    family: Any  # dmad.models.families.Family
    schedule: NoiseSchedule
    num_ddim_timesteps: int
    huber_c: float
    loss_type: str
    timesteps: list[int]  # the student's (sampling; the iteration trains on the solver's grid)


def iteration(nets: LcmNetworks, opts: dict[str, Stepper], batches: list[MicroBatch], it: int, cfg: Any,
              acc: Any, stages: Stages) -> LogSum:
    """One LCM iteration (= one student optimizer step) on `batches`, as diffusers'
    train_lcm_distill scripts; `it` iterations done before it, cfg the run's TrainConfig, acc its
    accelerate.Accelerator:

    1. per micro-batch: encode, draw a solver step (t_{n+k}, t_n) on the skipping grid and the noise,
       x_{t_{n+k}} = add_noise(latents); the guided teacher's one DDIM step to x^_{t_n} (no grad);
    2. the target f_{theta^-}(x^_{t_n}, t_n): the student with its EMA weights swapped in (no grad);
    3. per micro-batch: the student's f_theta(x_{t_{n+k}}, t_{n+k}), the consistency loss (L2 or pseudo-Huber),
       backward; then the optimizer step and the target's EMA update.
    Cost per micro-batch: 1 batched CFG teacher forward (2B), 1 target forward, 1 student forward
    and backward."""
    family, schedule, student = nets.family, nets.schedule, opts["generator"]
    accum = len(batches)
    logs = LogSum(defer=acc.num_processes > 1)
    items = []
    for mb in batches:
        stages.encode()
        latents, emb = mb.encode()
        t, t_prev = sample_solver_steps(latents.shape[0], nets.num_ddim_timesteps, mb.rng, latents.device,
                                        schedule.num_train_timesteps)
        x_t = schedule.add_noise(latents, fresh_noise(latents, mb.rng), t)
        stages.forward()
        with torch.no_grad(), acc.autocast():
            x_prev = ddim_step(x_t, nets.real.x0(schedule, x_t, t, emb), t, t_prev, schedule).to(x_t.dtype)
        items.append((x_t, t, x_prev, t_prev, emb))
    params = student.params()
    with nets.target.swapped_in(params), torch.no_grad(), acc.autocast():
        targets = [consistency_output(x_prev, family.x0(nets.student_bare, x_prev, t_prev, emb, schedule), t_prev)
                   for _, _, x_prev, t_prev, emb in items]
    for m, ((x_t, t, _, _, emb), target) in enumerate(zip(items, targets)):
        sync = no_sync(acc, nets.student) if m < accum - 1 else contextlib.nullcontext()
        with sync, acc.autocast():
            pred = consistency_output(x_t, family.x0(nets.student, x_t, t, emb, schedule), t)
            loss, lg = loss_consistency(pred, target, nets.huber_c, nets.loss_type)
            stages.backward()
            acc.backward(loss / accum)
        logs.add(lg, it + 1)
    logs.add({"grad_norm_g": student.step(acc, cfg.optimization.max_grad_norm)}, it + 1)
    nets.target.step(params)
    return logs


# --------------------------------------------------------------------------- the unit: networks, checkpoint, memory

TARGET = "lcm_target.safetensors"  # shadow.<i>, in the order of the student's trainable parameters


@dataclass
class LcmTrainables:
    """LCM's trained networks, unwrapped: the student (+ its EMA, when distillation.ema_decay) and
    the consistency target theta^-."""

    student: nn.Module
    ema: Optional[Any]
    target: TargetEMA
    shared: None = None  # the student is always its own copy
    teacher_view: None = None


def make_networks(copies: Any, *, student: str, ema_decay: Optional[float], target_decay: float) -> LcmTrainables:
    """The student from the float32 teacher (copies: dmad.models.networks.TeacherCopies), full or
    LoRA on its own frozen copy; its EMA; its target."""
    s = copies.copy(student)
    return LcmTrainables(s, make_ema(s, ema_decay), TargetEMA(trainable_parameters(s), target_decay))


def _trainables(copies: Any, ident: Any, dist: Any) -> LcmTrainables:
    return make_networks(copies, student=ident.student, ema_decay=dist.ema_decay,
                         target_decay=dist.lcm_target_ema_decay)


def prepare(nets: LcmTrainables, cfg: Any, acc: Any, real: RealScore, schedule: NoiseSchedule,
            timesteps: list[int]) -> tuple[LcmNetworks, dict[str, Stepper]]:
    """The student's optimizer and schedule (it steps every iteration), the student prepared by
    accelerate, the target on the device, and what an iteration calls."""
    opt, dist = cfg.optimization, cfg.distillation
    opt_g = make_optimizer(trainable_parameters(nets.student), opt.optimizer, opt.generator_lr,
                           (opt.adam_beta1, opt.adam_beta2), opt.adam_epsilon, opt.adam_weight_decay)
    sched_g = make_lr_scheduler(opt_g, opt.lr_scheduler, opt.lr_warmup_steps, opt.max_train_steps)
    student, opt_g = acc.prepare(nets.student, opt_g)
    nets.target.to(acc.device)
    calls = LcmNetworks(student=student, student_bare=nets.student, real=real, target=nets.target,
                        family=real.family, schedule=schedule, num_ddim_timesteps=dist.lcm_ddim_timesteps,
                        huber_c=dist.lcm_huber_c, loss_type=dist.lcm_loss_type, timesteps=timesteps)
    return calls, {"generator": Stepper(opt_g, sched_g, nets.ema)}


def _save_files(nets: LcmTrainables, out: Path) -> None:
    from safetensors.torch import save_file

    save_file({f"shadow.{i}": t.detach().contiguous().cpu() for i, t in enumerate(nets.target.shadow)},
              str(out / TARGET), metadata={"decay": str(nets.target.decay)})


def _load_files(nets: LcmTrainables, ckpt: Path) -> None:
    from dmad.errors import CheckpointUnusable

    found = read_shadow(ckpt / TARGET, nets.target.shadow)
    if found is not None:
        raise CheckpointUnusable(f"checkpoint {ckpt}: {TARGET} has {found} tensors for "
                                 f"{len(nets.target.shadow)} student parameters")


def _ledger_lines(x: LedgerInputs) -> list:
    n = x.student_trainable
    return [x.line("LCM target (EMA of the student)", 2 * n * 4,
                   f"{n / 1e6:.1f} M trainable params fp32, twice: the EMA target and the student's own weights "
                   f"kept while the target's pass runs with it swapped in")]


UNIT = Method(
    info=LCM, networks=("student",), files=(TARGET,),
    trainables=_trainables, prepare=prepare, iteration=iteration,
    modules=lambda nets: [("student", nets.student)],
    save_files=_save_files, load_files=_load_files, state_tensors=lambda nets: list(nets.target.shadow),
    graphs_at_peak=1,  # the student's: the teacher's and the target's passes run without gradients
    ledger_lines=_ledger_lines, own_copy="LCM's student is its own copy (as diffusers' LCM-LoRA scripts)",
    # the teacher (2 passes an image with CFG), the EMA target (1), the student forward (1) and its
    # backward (2); a full student is the teacher's size
    passes_per_image=lambda guided_teacher: (2 if guided_teacher else 1) + 1 + 1 + 2)
