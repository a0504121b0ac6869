"""What every distillation method shares: the shape of a method unit (`Method`), what its iteration
takes (MicroBatch, Stepper, Stages, RealScore) and gives back (LogSum), and how a checkpoint names
its files (CheckpointLayout).

A method is one module of dmad/methods/ (dmd2.py: DMAD; lcm.py: latent consistency distillation)
ending in one `UNIT = Method(...)`; dmad.methods.UNITS holds them by distillation.method, and
dmad.contract.methods.METHODS their torch-free descriptions (the app reads those). dmad/methods
sits below dmad/models: a unit gets what it needs from there as arguments (TeacherCopies, the
family, the accelerator), never by import.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Protocol

import torch
from torch import nn

from dmad.contract.methods import MethodInfo
from dmad.methods.noise import SampleRNG
from dmad.methods.prediction import NoiseSchedule


# --------------------------------------------------------------------------- parameters and optimizers

def trainable_parameters(module: nn.Module) -> list[nn.Parameter]:
    return [p for p in module.parameters() if p.requires_grad]


def make_optimizer(params: list[nn.Parameter], name: str, lr: float, betas: tuple[float, float], eps: float,
                   weight_decay: float) -> torch.optim.Optimizer:
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
    if name == "adam":
        return torch.optim.Adam(params, lr=lr, betas=betas, eps=eps)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, weight_decay=weight_decay)
    raise ValueError(f"unknown optimizer {name!r}")


def make_lr_scheduler(optimizer: torch.optim.Optimizer, name: str, warmup_steps: int, total_steps: int):
    """diffusers' schedules, stepped by us once per optimizer step (never through accelerate,
    which would step them once per process and silently rescale the schedule)."""
    from diffusers.optimization import get_scheduler

    return get_scheduler(name, optimizer=optimizer, num_warmup_steps=warmup_steps, num_training_steps=total_steps)


def make_ema(net: nn.Module, decay: Optional[float]):
    """diffusers' EMAModel over the student's trainable parameters (what samples show), or None."""
    if decay is None:
        return None
    from diffusers.training_utils import EMAModel

    return EMAModel(trainable_parameters(net), decay=decay)


class Stepper:
    """An optimizer with its learning-rate schedule and what steps with it (the student's EMA).
    `steps` counts its steps (the generator's are a checkpoint's generator_steps)."""

    def __init__(self, opt: torch.optim.Optimizer, sched: Any, ema: Optional[Any] = None, nets: tuple = ()):
        self.opt, self.sched, self.ema = opt, sched, ema  # sched: a torch LRScheduler; ema: an EMAModel
        self.nets = nets  # the networks it steps (sharded ones are resharded after a step)
        self.steps = 0
        from dmad.methods.sharded import is_sharded_optimizer

        self.sharded = is_sharded_optimizer(opt)  # over FSDP2-sharded parameters (resources.distributed fsdp)

    def params(self) -> list[nn.Parameter]:
        """The network's trainable parameters, as the optimizer lists them (listed once at build
        time: a module-tree walk per step costs ~1 ms on a small UNet)."""
        return [p for group in self.opt.param_groups for p in group["params"]]

    def step(self, acc: Any, max_grad_norm: float) -> Optional[float]:
        """Clip (max_grad_norm > 0: the total norm before clipping is returned), step, schedule, zero
        the gradients; then the EMA."""
        norm = None
        if max_grad_norm > 0:
            if self.sharded:
                from dmad.methods.sharded import clip_grad_norm

                norm = clip_grad_norm(self.params(), max_grad_norm)
            else:
                norm = float(acc.clip_grad_norm_(self.params(), max_grad_norm))
        self.opt.step()
        if self.sharded:
            from dmad.methods.sharded import reshard

            reshard(*self.nets)
        self.sched.step()
        self.opt.zero_grad(set_to_none=True)
        if self.ema is not None:
            self.ema.step(self.params())
        self.steps += 1
        return norm

    def lr(self) -> float:
        return self.sched.get_last_lr()[0]


# --------------------------------------------------------------------------- an iteration's inputs and logs

@dataclass
class MicroBatch:
    """One micro-batch as an iteration takes it: the loader's batch (dmad.data.loading.Batch), its
    per-sample noise (every draw a function of seed and sample position: dmad.methods.noise) and
    the encoder that makes its latents (B, C, h, w) float32 and text conditioning. The iteration
    encodes, so the memory and the out-of-memory phase of encoding are the iteration's."""

    batch: Any
    rng: SampleRNG
    encoder: Callable[[Any, SampleRNG], tuple[torch.Tensor, Any]]

    def encode(self) -> tuple[torch.Tensor, Any]:
        return self.encoder(self.batch, self.rng)


class Stages:
    """Names the part of an iteration an out-of-memory error would come from (dmad.train.oom.Phase):
    the first iteration a process runs by its stage (vae-encode, first-forward, first-backward),
    later ones as step-<N>."""

    def __init__(self, phase: Any, iteration: int, first: bool):
        self.phase, self.iteration, self.first = phase, iteration, first

    def encode(self) -> None:
        self.phase.set("vae-encode" if self.first else f"step-{self.iteration + 1}")

    def forward(self) -> None:
        self.phase.set("first-forward" if self.first else self.phase.name)

    def backward(self) -> None:
        self.phase.set("first-backward" if self.first else self.phase.name)


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


@dataclass
class RealScore:
    """The frozen teacher with its family's guidance: classifier-free guidance on the family's
    unconditional embedding, or the guidance-embedding input of a guidance-distilled network."""

    unet: nn.Module      # the teacher's denoiser (UNet or transformer)
    uncond: Optional[Any]  # a dmad.models.families.Cond, batch 1; None for a guidance-embedding teacher
    guidance: float
    family: Any  # dmad.models.families.Family: every network call goes through it

    def x0(self, schedule: NoiseSchedule, x_t: torch.Tensor, t: torch.Tensor, emb: Any,
           guided_up_to: Optional[int] = None) -> torch.Tensor:
        """The guided x0. `guided_up_to`: a guidance interval (Kynkaenniemi et al. 2024): samples at
        timesteps above it get the plain conditional prediction instead (one pass, no guidance; a
        guidance-embedding network gets guidance 1), the others the guided one."""
        high = t > guided_up_to if guided_up_to is not None else torch.zeros_like(t, dtype=torch.bool)
        if not bool(high.any()):
            return self.family.guided_x0(self.unet, x_t, t, emb, self.uncond, self.guidance, schedule)
        out = torch.empty(x_t.shape, dtype=torch.float32, device=x_t.device)
        plain = 1.0 if self.family.guidance_embedded(self.unet) else None
        out[high] = self.family.x0(self.unet, x_t[high], t[high], cond_rows(emb, high), schedule, guidance=plain).float()
        low = ~high
        if bool(low.any()):
            out[low] = self.family.guided_x0(self.unet, x_t[low], t[low], cond_rows(emb, low), self.uncond,
                                             self.guidance, schedule).float()
        return out


def cond_rows(emb: Any, rows: Any) -> Any:
    """The text conditioning (a dmad.models.families.Cond: batch-first tensors) of some samples:
    `rows` a boolean mask or a slice."""
    return type(emb)({k: v[rows] for k, v in emb.items()})


# --------------------------------------------------------------------------- the unit

class Trainables(Protocol):
    """What a method trains, unwrapped (checkpoints, samples), built before the teacher is cast."""

    student: nn.Module
    ema: Optional[Any]  # diffusers EMAModel over the student's trainable parameters
    shared: Optional[Any]  # dmad.models.shared_base.SharedBase: its networks are adapters on the teacher
    teacher_view: Optional[nn.Module]  # with a shared base, the view that calls the teacher (adapters off)


class Networks(Protocol):
    """What an iteration calls, fixed for the run; the fields every method's have (the probe's
    baseline runs them)."""

    student: nn.Module  # as prepared by accelerate (its gradients are synchronised)
    student_bare: nn.Module  # unwrapped
    real: RealScore
    family: Any
    schedule: NoiseSchedule
    timesteps: list[int]  # the student's


@dataclass(frozen=True)
class CheckpointLayout:
    """The files of a method's checkpoint beside rng.safetensors, training_state.json and the
    student's EMA (dmad.models.checkpoint writes, verifies and reads them)."""

    info: MethodInfo
    networks: tuple[tuple[str, str], ...]  # (name, full|lora): <name>/ (a diffusers folder) or <name>_lora.safetensors
    files: tuple[str, ...]  # the method's own tensors

    @property
    def optimizers(self) -> tuple[str, ...]:  # optimizer_<name>.safetensors
        return self.info.optimizers


@dataclass(frozen=True)
class LedgerInputs:
    """What a method's memory-ledger lines beside the student's are computed from
    (dmad.memory.ledger.estimate_ledger: framework scope, one device)."""

    fake_score: str  # identity.fake_score
    student_trainable: int  # the student's trainable parameters (all of them, or its LoRA adapter's)
    optimizer_states: int  # optimizer state tensors per trainable parameter
    bottleneck_channels: int  # of the teacher's denoiser
    trainable: Callable[[str, str], Any]  # (name, full|lora) -> the line of a trainable copy of the teacher
    line: Callable[[str, float, str], Any]  # (name, bytes, how) -> a line


@dataclass(frozen=True)
class Method:
    """One distillation method, whole. Building a run: `trainables(copies, identity, distillation)`
    makes the networks it trains from the float32 teacher (copies: dmad.models.networks.TeacherCopies),
    before the teacher is cast; then `prepare(trainables, cfg, accelerator, real, schedule,
    timesteps)` makes the optimizers ({"generator": the student's, ...}) and the prepared networks
    its iteration calls. Training: `iteration(nets, optimizers, micro_batches, iteration, cfg,
    accelerator, stages) -> LogSum`, one optimizer step of the method. Checkpoints: the teacher
    copies named in `networks` (their mode is identity.<name>), its own `files`
    (save_files / load_files), optimizer_<name> for its info.optimizers. Memory: `graphs_at_peak`
    and `ledger_lines`."""

    info: MethodInfo  # the torch-free description (dmad.contract.methods): name, columns, plots, settings
    networks: tuple[str, ...]
    files: tuple[str, ...]
    trainables: Callable[[Any, Any, Any], Trainables]
    prepare: Callable[..., tuple[Networks, dict[str, Stepper]]]
    iteration: Callable[..., LogSum]
    modules: Callable[[Any], list[tuple[str, nn.Module]]]  # what it trains, by name: weights checked, passes counted
    save_files: Callable[[Any, Path], None]
    load_files: Callable[[Any, Path], None]
    state_tensors: Callable[[Any], list[torch.Tensor]]  # what else a checkpoint holds (its size on disk)
    graphs_at_peak: int  # network graphs with gradients alive at the memory peak
    ledger_lines: Callable[[LedgerInputs], list]
    shares_base: bool = False  # its LoRA networks may sit on the teacher's frozen base (resources.share_frozen_base)
    own_copy: str = ""  # when it never shares: why its LoRA student keeps a frozen copy of its own (the ledger)
    # its training compute per image of the effective batch, in teacher-denoiser image-passes
    # (dmad.train.passes), given whether the teacher runs with CFG: what a bench plans an
    # equal-compute budget with before the run (the engine counts the passes it actually ran)
    passes_per_image: Optional[Callable[[bool], int]] = None

    def layout(self, identity: Any) -> CheckpointLayout:
        """The checkpoint files for `identity`'s network modes (identity.student, ...)."""
        return CheckpointLayout(self.info, tuple((n, getattr(identity, n)) for n in self.networks), self.files)


def read_shadow(path: Path, tensors: list[torch.Tensor]) -> Optional[int]:
    """Copy the file's shadow.<i> tensors into `tensors` (an EMA of the student's trainable
    parameters, in their order: ema.safetensors, the LCM target). When the file holds another set
    of names nothing is copied and its tensor count is returned."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f, torch.no_grad():
        keys = set(f.keys())
        if keys != {f"shadow.{i}" for i in range(len(tensors))}:
            return len(keys)
        for i, t in enumerate(tensors):
            t.copy_(f.get_tensor(f"shadow.{i}"))
    return None
