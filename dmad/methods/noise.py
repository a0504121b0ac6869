"""Random draws that depend only on (seed, global sample position).

Every sample the loop draws from the data stream has a position p = 0, 1, 2, ... (its index in
the run's sample order across all processes). All randomness a sample needs (VAE posterior
noise, the student's input noise, DM / critic timesteps and noises) comes from its own
generator seeded by (seed, p), drawn in a fixed order. So the numbers do not depend on how
samples are grouped into micro-batches or split across processes: batch 4 x 1 step, 1 x 4
accumulation steps and 2 processes x 2 see identical noise, and resume needs no RNG state.
Cost: B small generators per micro-batch and B small draws per random tensor (CPU, then one
copy to the device).
"""
from __future__ import annotations

from typing import Optional

import numpy as np
import torch


def sample_seed(seed: int, position: int) -> int:
    """A well-mixed 63-bit seed for (run seed, sample position)."""
    return int(np.random.SeedSequence([seed, position]).generate_state(2, dtype=np.uint32).view(np.uint64)[0] >> 1)


class SampleRNG:
    def __init__(self, seed: int, positions: list[int], device: torch.device | str = "cpu"):
        self.gens = [torch.Generator("cpu").manual_seed(sample_seed(seed, p)) for p in positions]
        self.device = torch.device(device)

    def __len__(self) -> int:
        return len(self.gens)

    def randn(self, shape: tuple[int, ...], dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """(B, *shape) standard normal, row b from sample b's generator."""
        out = torch.stack([torch.randn(shape, generator=g) for g in self.gens])
        return out.to(self.device, dtype)

    def randn_like(self, like: torch.Tensor) -> torch.Tensor:
        if like.shape[0] != len(self.gens):
            raise ValueError(f"batch of {like.shape[0]} but {len(self.gens)} sample generators")
        return self.randn(tuple(like.shape[1:]), torch.float32).to(like.dtype)

    def randint(self, low: int, high: int) -> torch.Tensor:
        """(B,) integers in [low, high) (high exclusive, like torch.randint)."""
        out = torch.cat([torch.randint(low, high, (1,), generator=g) for g in self.gens])
        return out.to(self.device)


def fresh_noise(like: torch.Tensor, generator: "Optional[torch.Generator | SampleRNG]") -> torch.Tensor:
    """Standard normal noise like `like`: from a SampleRNG (one row per sample), else drawn on the
    generator's device (so a CPU generator gives the same numbers whichever device trains), then moved."""
    if generator is None:
        return torch.randn_like(like)
    if hasattr(generator, "randn_like"):  # a SampleRNG
        return generator.randn_like(like)
    n = torch.randn(like.shape, generator=generator, device=generator.device, dtype=torch.float32)
    return n.to(device=like.device, dtype=like.dtype)


def iteration_generator(seed: int, iteration: int) -> torch.Generator:
    """For choices shared by the whole iteration on every process (the backward-simulation step
    index): the same on every rank without communication."""
    return torch.Generator("cpu").manual_seed(sample_seed(seed + 1, iteration))
