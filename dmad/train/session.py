"""What a training run reads and writes besides its networks: the run folder's writers (RunFiles),
the data stream (DataStream) and where the run is (Progress). Built once by dmad.train.build
(already at the checkpoint's iteration when resuming); the networks, optimizers and teacher are the
Trainer's (dmad.train.trainer).
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterator, Optional

import torch

from dmad.contract.events import EventWriter
from dmad.contract.prompts import PromptSet
from dmad.contract.runs import CsvAppender, RunFolder
from dmad.methods.noise import SampleRNG
from dmad.methods.unit import MicroBatch
from dmad.train.health_check import HealthState

if TYPE_CHECKING:
    from dmad.data.encode import Caches
    from dmad.data.loading import Batch, MixedImages
    from dmad.data.mixing import MixtureBatches
    from dmad.data.scan import SkipLog
    from dmad.models.teacher import Teacher


@dataclass
class RunFiles:
    """The run folder as training writes it (rank 0; the other ranks get writers that write
    nothing: dmad.train.ranks)."""

    folder: RunFolder  # a ReadOnlyFolder on ranks other than 0
    events: EventWriter  # NullEvents on ranks other than 0
    log: logging.Logger
    metrics: CsvAppender  # metrics.csv (NullCsv on ranks other than 0)
    prompt_set: PromptSet  # the run's own copy


@dataclass
class DataStream:
    """The batches in the run's order (dmad.data.mixing: a pure function of seed and batch number,
    so resume replays only the count), each sample's noise, and the encoders that turn a batch into
    latents and text conditioning."""

    dataset: MixedImages
    sampler: MixtureBatches  # the items and sample positions of each batch
    skip_log: SkipLog  # items the data skipped, as events and status counts
    caches: Optional[Caches]  # with resources.cache_latents
    teacher: Teacher  # its VAE, text encoders and family encode
    device: torch.device
    seed: int
    vae_batch_size: int
    batches: Iterator[Batch]  # the loader, from batch `batches_used` on

    def rng(self, batch_number: int) -> SampleRNG:
        return SampleRNG(self.seed, self.sampler.positions(batch_number), self.device)

    def encode(self, batch: Batch, rng: SampleRNG) -> tuple[torch.Tensor, Any]:
        """A batch -> latents (B, C, H/f, W/f) float32, a posterior sample drawn with the per-sample
        noise (the same whether the posterior came from the cache or the VAE), in the family's
        latent space (scaled, shifted), and the text conditioning (a Cond)."""
        from dmad.data.encode import posteriors, text_embeddings

        t = self.teacher
        mean, std = posteriors(batch, t.vae, self.device, self.vae_batch_size, self.caches)
        latents = t.family.latents(t.vae, mean + std * rng.randn_like(mean))
        emb = text_embeddings(batch.captions, batch.datasets, t, self.device, self.caches)
        return latents, emb

    def take(self, first_batch: int, n: int) -> list[MicroBatch]:
        """The next `n` batches (numbers first_batch, first_batch + 1, ...), each with its samples' noise."""
        return [MicroBatch(next(self.batches), self.rng(first_batch + m), self.encode) for m in range(n)]


@dataclass
class Progress:
    """Where the run is: iterations done (the checkpoint's when resuming), batches drawn, the last
    checkpoint this engine saved or resumed from."""

    iter: int = 0
    batches_used: int = 0
    t_start: float = field(default_factory=time.time)
    start_iter: int = field(init=False)  # where this engine began
    last_saved: Optional[int] = field(init=False)

    def __post_init__(self):
        self.start_iter = self.iter
        self.last_saved = self.iter if self.iter else None


@dataclass
class Session:
    files: RunFiles
    data: DataStream
    progress: Progress
    checkpoint_bytes: Callable[[], int]  # about what a checkpoint takes on disk (a full disk's message)
    health: HealthState = field(default_factory=HealthState)  # the health signals' state (dmad.train.health_check)
