"""Which images make each batch: several datasets mixed by weight, every batch
from one aspect bucket, resumable at any batch without replaying the data. Torch-free (numpy).

Groups: the images of one (dataset, bucket). A batch is drawn from group g with chance
    p_g = probability_d * (1 + repeats_d) * n_g / sum over groups
(d: g's dataset, n_g: its images), so with the defaults every image is equally likely, whatever
folder or bucket it is in; `repeats` counts a dataset's images 1 + repeats times, `probability`
scales a dataset's share down (0: never drawn). Inside a group, images come in the order of a
fresh permutation per pass (each image once per pass), consecutive batches of the group taking
consecutive positions of that stream.

Determinism: the group of global batch g is a pure function of (seed, g) (blocks of choices from
a seeded generator), and a group's stream position is the number of earlier batches drawn from
it. So batch b of rank r (global batch g = b * world + r, as the sample positions of
dmad.methods.noise.SampleRNG) is known from (seed, b) alone: a resumed run replays only the choices (a
vector operation), and several processes agree without talking to each other.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import numpy as np

BLOCK = 4096  # group choices drawn per generator call
_MIX_TAG, _PERM_TAG = 0x6D6978, 0x7065726D  # separate the choice and permutation generators


@dataclass(frozen=True)
class Group:
    """The images of one dataset in one bucket: indices into the flat item list."""
    dataset: int
    bucket: tuple[int, int]
    items: tuple[int, ...]
    weight: float  # probability * (1 + repeats) * len(items)


def make_groups(buckets_per_dataset: list[list[tuple[tuple[int, int], list[int]]]],
                weights: list[float]) -> list[Group]:
    """Groups from, per dataset, its (bucket, item indices) lists and its weight factor
    probability * (1 + repeats). Empty groups and zero weights are left out."""
    groups = []
    for d, (buckets, w) in enumerate(zip(buckets_per_dataset, weights)):
        for bucket, items in sorted(buckets):
            if items and w > 0:
                groups.append(Group(d, bucket, tuple(items), w * len(items)))
    return groups


class MixtureBatches:
    """Endless batches of (item index, sample position) for one rank; a DataLoader batch_sampler.
    `consumed`: batches this rank already had (from a checkpoint)."""

    def __init__(self, groups: list[Group], batch_size: int, seed: int, rank: int = 0, world: int = 1,
                 consumed: int = 0):
        if not groups:
            raise ValueError("no group to draw batches from")
        small = [g for g in groups if len(g.items) < batch_size]
        if small:
            raise ValueError(f"bucket {small[0].bucket} has {len(small[0].items)} images, fewer than a batch of {batch_size}")
        self.groups, self.batch_size, self.seed = groups, batch_size, seed
        self.rank, self.world, self.consumed = rank, world, consumed
        w = np.array([g.weight for g in groups], dtype=np.float64)
        self.p = w / w.sum()
        self._block_cache: dict[int, np.ndarray] = {}
        self._perm_cache: dict[tuple[int, int], np.ndarray] = {}

    # ---- the pure functions of (seed, global batch)
    def choices(self, block: int) -> np.ndarray:
        """The groups of global batches block*BLOCK ... (block+1)*BLOCK - 1."""
        got = self._block_cache.get(block)
        if got is None:
            rng = np.random.default_rng([self.seed, _MIX_TAG, block])
            got = rng.choice(len(self.groups), size=BLOCK, p=self.p)
            self._block_cache = {block: got}
        return got

    def group_of(self, g: int) -> int:
        return int(self.choices(g // BLOCK)[g % BLOCK])

    def counts_before(self, g: int) -> np.ndarray:
        """How many of the global batches 0 ... g-1 each group gave."""
        counts = np.zeros(len(self.groups), dtype=np.int64)
        full, rest = divmod(g, BLOCK)
        for block in range(full):
            counts += np.bincount(self.choices(block), minlength=len(self.groups))
        if rest:
            counts += np.bincount(self.choices(full)[:rest], minlength=len(self.groups))
        return counts

    def positions(self, b: int) -> list[int]:
        """Global sample positions of this rank's batch b: unique per sample of the whole run,
        the same whatever the split into processes (rank-interleaved) and micro-batches."""
        start = (b * self.world + self.rank) * self.batch_size
        return list(range(start, start + self.batch_size))

    def _stream(self, group: int, pos: int) -> int:
        """The item at position `pos` of a group's stream (a permutation per pass)."""
        items = self.groups[group].items
        epoch, j = divmod(pos, len(items))
        key = (group, epoch)
        perm = self._perm_cache.get(key)
        if perm is None:
            perm = np.random.default_rng([self.seed, _PERM_TAG, group, epoch]).permutation(len(items))
            if len(self._perm_cache) > 4 * len(self.groups):
                self._perm_cache.clear()
            self._perm_cache[key] = perm
        return items[int(perm[j])]

    def batch(self, g: int, used: int) -> list[tuple[int, int]]:
        """Global batch g, its group having given `used` batches before it."""
        group = self.group_of(g)
        start = used * self.batch_size
        first = g * self.batch_size
        return [(self._stream(group, start + i), first + i) for i in range(self.batch_size)]

    def __iter__(self) -> Iterator[list[tuple[int, int]]]:
        b = self.consumed
        g = b * self.world + self.rank
        counts = self.counts_before(g)
        while True:
            group = self.group_of(g)
            yield self.batch(g, int(counts[group]))
            # advance to this rank's next global batch, counting the other ranks' draws between
            for h in range(g, g + self.world):
                counts[self.group_of(h)] += 1
            g += self.world

    def __len__(self) -> int:  # endless; DataLoader only needs this for progress bars
        return 2**62
