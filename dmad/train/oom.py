"""Out of memory, explained: the phase a run is in, the advice for an out-of-memory error in each
phase, and fault injection for testing it without a GPU. Torch-free until a fault fires.

Phases (DESIGN.md, `dmad probe`): loading (models to the device), sampling (teacher reference
samples before iteration 1), vae-encode (the first batch through the VAE), first-forward,
first-backward (the first iteration's networks), step-N (iteration N >= 2, any part of it).

The advice follows the triage order of the field notes: gradient checkpointing first; then batch
size 1 with gradient accumulation keeping the effective batch; then the resolution. Early
out-of-memory in the VAE is usually vae_batch_size; out-of-memory while loading is the models
themselves (precision, LoRA).

DMAD_FAULT=oom:<phase> (oom:loading, oom:vae-encode, oom:first-forward, oom:first-backward,
oom:step-7, oom:sampling) makes the engine raise torch's real OutOfMemoryError when the run
enters that phase, once per process: the same path as a real one, so its handling is testable
on a CPU.
"""
from __future__ import annotations

import os
import re
from typing import Any, Optional

from dmad.errors import UserInputError
from dmad.train.launch import world_rank

PHASES = ("loading", "sampling", "vae-encode", "first-forward", "first-backward")
_STEP = re.compile(r"^step-([1-9][0-9]*)$")


def parse_fault(value: Optional[str]) -> Optional[tuple[str, str]]:
    """(kind, phase) of a DMAD_FAULT value that applies to this process, None when unset or meant
    for another rank; a bad value is a one-line error. Forms: oom:<phase>, crash:<phase> (an
    ordinary exception, for multi-process tests), either with @rank<k> to fire on rank k only."""
    if not value:
        return None
    spec, _, rank = value.partition("@")
    kind, _, phase = spec.partition(":")
    if kind not in ("oom", "crash") or not (phase in PHASES or _STEP.match(phase)) or \
            (rank and not re.match(r"^rank[0-9]+$", rank)):
        raise UserInputError(f"DMAD_FAULT={value!r}: expected oom:<phase> or crash:<phase>, optionally @rank<k>, "
                             f"with phase one of {', '.join(PHASES)}, step-N")
    if rank and int(rank[4:]) != world_rank()[0]:
        return None
    return kind, phase


class Phase:
    """What the run is doing now, for out-of-memory classification; entering a phase named by
    DMAD_FAULT raises torch.OutOfMemoryError there (once)."""

    def __init__(self, name: str = "setup", fault: Optional[str] = None):
        self.name = name
        found = ("oom", fault) if fault is not None else parse_fault(os.environ.get("DMAD_FAULT"))
        self._kind, self._fault = found if found else (None, None)

    def set(self, name: str) -> None:
        self.name = name
        if self._fault is not None and name == self._fault:
            self._fault = None
            if self._kind == "crash":
                raise RuntimeError(f"injected crash (DMAD_FAULT) in phase {name}")
            import torch

            raise torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate 2.00 GiB (injected by DMAD_FAULT "
                                         f"in phase {name})")

    def __str__(self) -> str:
        return self.name


def classify(phase: str) -> str:
    """The reported phase: anything before loading counts as loading."""
    return "loading" if phase == "setup" else phase


def advice(phase: str, resources: Any) -> str:
    """What to change, in order, for an out-of-memory error in `phase` under `resources` (the
    config's resources group)."""
    r = resources
    if phase == "loading":
        return ("the models alone do not fit: set resources.mixed_precision to bf16 (or fp16 on GPUs without bf16), "
                "train LoRA adapters instead of full copies (identity.student and identity.fake_score = lora: both "
                "sit on the teacher's own frozen weights with resources.share_frozen_base), or "
                "free the GPU of other programs; `dmad train --dry-run` shows the memory ledger")
    if phase == "vae-encode":
        return (f"the VAE ran out on the first batch: set resources.vae_batch_size to 1 (now {r.vae_batch_size}), "
                f"or encode ahead with `dmad cache --config FILE` and resources.cache_latents = true; then lower "
                f"resources.train_batch_size")
    if phase == "sampling":
        return ("rendering the reference samples ran out: lower the prompt set's resolution, or train first and "
                "render later with `dmad sample`")
    steps = []
    if not r.gradient_checkpointing:
        steps.append("turn on resources.gradient_checkpointing (activations recomputed in backward: much less "
                     "memory, ~30% slower)")
    if r.train_batch_size > 1:
        keep = r.train_batch_size * r.gradient_accumulation_steps
        steps.append(f"set resources.train_batch_size to 1 and resources.gradient_accumulation_steps to {keep} "
                     f"(the same effective batch)")
    if r.resolution > 64:
        lower = max(64, (r.resolution * 3 // 4) // 64 * 64)
        steps.append(f"lower resources.resolution (e.g. {lower}; activations grow with its square)")
    if phase.startswith("step-"):
        steps.append("it ran before, so memory grew: set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True against "
                     "fragmentation, and check for larger buckets in the data")
    steps.append("`dmad probe --config FILE` measures which batch and resolution fit")
    return "; then ".join(steps)
