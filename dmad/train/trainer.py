"""What trains, built once by dmad.train.build (restored from the checkpoint when resuming): the
accelerator, the frozen teacher, the distillation method's unit with the networks it trains and its
optimizers, the student's timesteps and the pass counter. The loop (dmad.train.loop) hands these to
the method's iteration as arguments; checkpoints (dmad.train.saving) and samples
(dmad.train.validation) read them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from dmad.contract.config import TrainConfig
from dmad.methods.prediction import NoiseSchedule
from dmad.methods.unit import Method, Networks, Stepper, Trainables
from dmad.train.passes import PassCounter

if TYPE_CHECKING:
    from accelerate import Accelerator

    from dmad.models.teacher import Teacher


@dataclass
class Trainer:
    cfg: TrainConfig
    accelerator: Accelerator  # device, mixed precision, processes
    teacher: Teacher  # frozen: denoiser, VAE, text encoders, tokenizers; its family
    weight_dtype: torch.dtype  # the autocast dtype
    method: Method  # the unit of distillation.method (dmad.methods.UNITS)
    trainables: Trainables  # what it trains, unwrapped: checkpoints and samples
    nets: Networks  # what its iteration calls: prepared networks, the guided teacher, the schedule
    optimizers: dict[str, Stepper]  # "generator" (the student's), and the method's others ("critic")
    schedule: NoiseSchedule
    timesteps: list[int]  # the student's
    passes: PassCounter  # network passes of training (not of samples)

    @property
    def device(self) -> torch.device:
        return self.accelerator.device

    @property
    def is_main(self) -> bool:
        """Rank 0 (the only writer) of a multi-process run, or the only process."""
        return self.accelerator.is_main_process

    @property
    def sharded(self) -> bool:
        """resources.distributed fsdp (dmad.train.sharding): checkpoints and samples are collectives."""
        return self.cfg.resources.distributed == "fsdp"

    @property
    def world(self) -> int:
        return self.accelerator.num_processes

    def barrier(self) -> None:
        if self.world > 1:
            self.accelerator.wait_for_everyone()

    def sync_device(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def own_rng(self):
        """Rendering inside its own copy of the global RNGs: whatever a sampler draws from them never
        reaches training's stream, so that stream (saved in each checkpoint's rng.safetensors, for
        dropout in a user's model say) is the same whether samples were rendered or not, how often
        (a resumed run does not render its checkpoint's samples again; Sample now adds some) and on
        which rank (only rank 0 renders)."""
        cuda = self.device.type == "cuda"
        devices = [self.device.index if self.device.index is not None else torch.cuda.current_device()] if cuda else []
        return torch.random.fork_rng(devices=devices)
