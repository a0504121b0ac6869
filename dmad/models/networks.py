"""Trainable copies of the teacher's denoiser, as the distillation methods (dmad.methods) ask for
them: a full float32 copy, a LoRA adapter on a frozen copy, or LoRA adapters on the teacher's own
denoiser (one shared frozen base: dmad.models.shared_base). TeacherCopies hands them to a method's
unit, which decides which networks it trains (DMAD: student, fake score and GAN head; the consistency
peer: the student and its target).

The teacher itself (the real score) stays frozen and, under mixed precision, is cast to the
autocast dtype: only trainable weights keep fp32 master copies.
"""
from __future__ import annotations

import copy
import warnings
from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch import nn

from dmad.methods.unit import trainable_parameters  # noqa: F401 - where dmad.models and dmad.train take it from
from dmad.models.teacher_files import LORA_TARGETS


def add_lora(unet: nn.Module, rank: int, alpha: Optional[int], targets: tuple[str, ...] = LORA_TARGETS) -> None:
    """LoRA (peft) on `targets`: by default the attention projections, the layers DMD2 and diffusers'
    LoRA scripts adapt (a transformer family adds its joint-attention text projections:
    Family.lora_targets); identity.lora_targets "attention+ff" adds the feed-forward layers
    (Family.lora_modules). Base weights are frozen; only the adapter trains."""
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


@dataclass(frozen=True)
class TeacherCopies:
    """Trainable networks made from the teacher's float32 denoiser, before it is cast: what a
    method's unit (dmad.methods.unit.Method.trainables) builds its networks with. `family`
    (dmad.models.families.Family) gives the LoRA targets and the feature widths."""

    teacher_unet: nn.Module
    lora_rank: int
    lora_alpha: Optional[int]
    gradient_checkpointing: bool
    family: Any
    base_dtype: Optional[torch.dtype] = None  # a LoRA copy's frozen base (the autocast dtype)
    share_frozen_base: bool = False
    lora_targets: Optional[tuple[str, ...]] = None  # the layers a LoRA adapts; None: family.lora_targets

    @property
    def targets(self) -> tuple[str, ...]:
        """The layers a LoRA copy or adapter adapts (identity.lora_targets: Family.lora_modules)."""
        return tuple(self.lora_targets) if self.lora_targets is not None else tuple(self.family.lora_targets)

    def copy(self, mode: str) -> nn.Module:
        """A copy of its own, full or LoRA (make_trainable_copy)."""
        return make_trainable_copy(self.teacher_unet, mode, self.lora_rank, self.lora_alpha,
                                   self.gradient_checkpointing, self.targets, self.base_dtype)

    def shares_base(self, student: str, fake_score: str) -> bool:
        return shares_base(student, fake_score, self.share_frozen_base)

    def shared_adapters(self):
        """(SharedBase, student view, fake view, teacher view): add_shared_adapters on the teacher's
        own denoiser, which the caller then casts as the teacher (SharedBase.cast_frozen keeps the
        adapters float32)."""
        return add_shared_adapters(self.teacher_unet, self.lora_rank, self.lora_alpha, self.gradient_checkpointing,
                                   self.targets)
