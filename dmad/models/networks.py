"""The three networks of DMAD and their optimizers.

student   : the few-step generator, initialised from the teacher (full copy or LoRA on a copy).
fake score: a trainable copy of the teacher that tracks the student's distribution
            (denoising loss on detached student samples); its UNet bottleneck also feeds the
            GAN head.
GAN head  : a small conv classifier on bottleneck features (real vs student).
The teacher itself (the real score) stays frozen and, under mixed precision, is cast to the
autocast dtype: only trainable weights keep fp32 master copies.
"""
from __future__ import annotations

import copy
import warnings
from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn

from dmad.methods.dmd2 import GanHead

from dmad.models.teacher_files import LORA_TARGETS


def add_lora(unet: nn.Module, rank: int, alpha: Optional[int], targets: tuple[str, ...] = LORA_TARGETS) -> None:
    """LoRA (peft) on the attention projections, the layers DMD2 and diffusers' LoRA scripts adapt
    (a transformer family adds its joint-attention text projections: Family.lora_targets).
    Base weights are frozen; only the adapter trains."""
    from peft import LoraConfig

    unet.requires_grad_(False)
    unet.add_adapter(LoraConfig(r=rank, lora_alpha=alpha or rank, init_lora_weights="gaussian",
                                target_modules=list(targets)))


def make_trainable_copy(teacher_unet: nn.Module, mode: str, rank: int, alpha: Optional[int],
                        gradient_checkpointing: bool, targets: tuple[str, ...] = LORA_TARGETS,
                        base_dtype: Optional[torch.dtype] = None) -> nn.Module:
    """A float32 copy of the teacher's denoiser (UNet or transformer), fully trainable or with a
    LoRA adapter. `base_dtype` (LoRA only): the frozen base weights in that dtype (the autocast
    dtype under mixed precision: only the adapter is trained, so only it needs fp32 master
    weights; for SDXL this halves the copy, 10.2 -> 5.1 GB)."""
    unet = copy.deepcopy(teacher_unet)
    object.__setattr__(unet, "_dmad_taps", [])  # feature taps belong to the network they were put on
    unet = unet.float()
    if mode == "lora":
        add_lora(unet, rank, alpha, targets)
        if base_dtype is not None and base_dtype != torch.float32:
            for p in unet.parameters():
                if not p.requires_grad:
                    p.data = p.data.to(base_dtype)
    else:
        unet.requires_grad_(True)
    if gradient_checkpointing:
        unet.enable_gradient_checkpointing()
    unet.train()
    return unet


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


@dataclass
class Networks:
    student: nn.Module
    fake_score: Optional[nn.Module]  # None for LCM (no critic)
    gan_head: Optional[nn.Module]    # None for LCM
    ema: Optional[object]  # diffusers EMAModel over the student's trainable parameters
    shared: Optional[object] = None  # dmad.models.shared_base.SharedBase when the three share one frozen base
    teacher: Optional[nn.Module] = None  # the view that calls the teacher (adapters disabled); None: the denoiser
    target: Optional[object] = None  # LCM: dmad.methods.lcm.TargetEMA, the consistency target theta^-

    def trained(self) -> list[tuple[str, nn.Module]]:
        """The trained networks a checkpoint saves, by name (LCM has only the student)."""
        return [(n, m) for n, m in (("student", self.student), ("fake_score", self.fake_score),
                                    ("gan_head", self.gan_head)) if m is not None]


def shares_base(student: str, fake_score: str, share_frozen_base: bool) -> bool:
    """One frozen base for teacher, student and fake score: both trainable networks are LoRA
    adapters (a full network is its own copy) and the config allows it."""
    return share_frozen_base and student == "lora" and fake_score == "lora"


def add_shared_adapters(teacher_unet: nn.Module, rank: int, alpha: Optional[int], gradient_checkpointing: bool,
                        targets: tuple[str, ...] = LORA_TARGETS):
    """The "student" and "fake" adapters on the teacher's own denoiser, initialised exactly as two
    separate LoRA copies would be (same layers, same order, same random draws); the base stays
    frozen. Returns (SharedBase, student view, fake view, teacher view)."""
    from peft import LoraConfig

    from dmad.models.shared_base import FAKE, STUDENT, AdapterView, SharedBase

    teacher_unet.requires_grad_(False)
    with warnings.catch_warnings():  # peft warns that a second adapter makes "multiple adapters": the point
        warnings.filterwarnings("ignore", message="Already found a `peft_config` attribute")
        for name in (STUDENT, FAKE):
            teacher_unet.add_adapter(LoraConfig(r=rank, lora_alpha=alpha or rank, init_lora_weights="gaussian",
                                                target_modules=list(targets)), adapter_name=name)
    shared = SharedBase(teacher_unet)
    for name in (STUDENT, FAKE):
        for _, p in shared.adapter_parameters(name):
            p.requires_grad_(True)
    if gradient_checkpointing:
        teacher_unet.enable_gradient_checkpointing(shared.checkpoint_keeping_adapter)
    views = [AdapterView(shared, a) for a in (STUDENT, FAKE, None)]
    for v in views[:2]:
        v.train()
    views[2].eval()
    return (shared, *views)


def build_networks(teacher_unet: nn.Module, *, student: str, fake_score: str, lora_rank: int,
                   lora_alpha: Optional[int], gradient_checkpointing: bool, ema_decay: Optional[float],
                   gan_on_teacher: bool, family=None, base_dtype: Optional[torch.dtype] = None,
                   share_frozen_base: bool = False, lcm_target_decay: Optional[float] = None) -> Networks:
    """Copies are made from the float32 teacher before it is cast down. `family`
    (dmad.models.families.Family; None: SD) gives the LoRA targets and the GAN feature width.
    With `share_frozen_base` and two LoRA networks, no copy is made: both adapters go on the
    teacher's denoiser itself (dmad.models.shared_base), which the caller then casts as the
    teacher (SharedBase.cast_frozen keeps the adapters float32).
    `lcm_target_decay` (method lcm): only the student, full or LoRA on its own copy (as diffusers'
    LCM and LCM-LoRA scripts), plus its EMA target (dmad.methods.lcm.TargetEMA); no fake score, no
    GAN head."""
    from dmad.models.families import Family

    family = family or Family()
    if lcm_target_decay is not None:
        from dmad.methods.lcm import TargetEMA

        s = make_trainable_copy(teacher_unet, student, lora_rank, lora_alpha, gradient_checkpointing,
                                family.lora_targets, base_dtype)
        ema = None
        if ema_decay is not None:
            from diffusers.training_utils import EMAModel

            ema = EMAModel(trainable_parameters(s), decay=ema_decay)
        return Networks(student=s, fake_score=None, gan_head=None, ema=ema,
                        target=TargetEMA(trainable_parameters(s), lcm_target_decay))
    shared = teacher_view = None
    if shares_base(student, fake_score, share_frozen_base):
        shared, s, f, teacher_view = add_shared_adapters(teacher_unet, lora_rank, lora_alpha, gradient_checkpointing,
                                                         family.lora_targets)
    else:
        s = make_trainable_copy(teacher_unet, student, lora_rank, lora_alpha, gradient_checkpointing,
                                family.lora_targets, base_dtype)
        f = make_trainable_copy(teacher_unet, fake_score, lora_rank, lora_alpha, gradient_checkpointing,
                                family.lora_targets, base_dtype)
    head = GanHead(family.feature_channels(teacher_unet if gan_on_teacher else f))
    ema = None
    if ema_decay is not None:
        from diffusers.training_utils import EMAModel

        ema = EMAModel(trainable_parameters(s), decay=ema_decay)
    return Networks(student=s, fake_score=f, gan_head=head, ema=ema, shared=shared, teacher=teacher_view)
