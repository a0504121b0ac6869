"""Training data: a captioned image folder (image + .txt caption of the same stem).

A deliberately small reader for the engine core; multi-source mixing, buckets, caching and
`dmad check-data` build on it. Order is deterministic and resumable: the sampler's position
(samples consumed) is saved with each checkpoint, so a resumed run sees the same batches as
an uninterrupted one.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterator

import numpy as np
import torch
from PIL import Image

from dmad.datafiles import caption_of, images_in
from dmad.errors import UserInputError



def find_pairs(folder: str | Path) -> list[tuple[Path, Path]]:
    """(image, caption) pairs sorted by name; images without a caption are skipped."""
    folder = Path(folder)
    if not folder.is_dir():
        raise UserInputError(f"train_data_dir is not a folder: {folder}")
    return [(img, caption_of(img)) for img in images_in(folder) if caption_of(img).is_file()]


def read_caption(path: Path) -> str:
    """UTF-8 (a BOM is tolerated); lines are joined with spaces so a caption is one line."""
    text = path.read_bytes().decode("utf-8-sig", errors="replace")
    return " ".join(text.split())


def load_image(path: Path, resolution: int) -> torch.Tensor:
    """(3, R, R) float32 in [-1, 1]: shorter side resized to R (bicubic), centre crop."""
    with Image.open(path) as im:
        im = im.convert("RGB")
        w, h = im.size
        s = resolution / min(w, h)
        im = im.resize((max(resolution, round(w * s)), max(resolution, round(h * s))), Image.BICUBIC)
        left, top = (im.width - resolution) // 2, (im.height - resolution) // 2
        im = im.crop((left, top, left + resolution, top + resolution))
        arr = np.asarray(im, dtype=np.float32) / 127.5 - 1.0
    return torch.from_numpy(arr).permute(2, 0, 1).contiguous()


class CaptionedImages(torch.utils.data.Dataset):
    def __init__(self, folder: str | Path, resolution: int):
        self.pairs = find_pairs(folder)
        if not self.pairs:
            raise UserInputError(f"no captioned images in {folder} (need image files with a .txt caption of the same stem)")
        self.resolution = resolution

    def __len__(self) -> int:
        return len(self.pairs)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, str]:
        img, cap = self.pairs[i]
        return load_image(img, self.resolution), read_caption(cap)


class ResumableBatches(torch.utils.data.Sampler):
    """Endless batches of indices: epoch e is a permutation seeded by (seed, e), split across
    ranks. `consumed` counts batches handed out, so a checkpoint can restart at the same batch."""

    def __init__(self, n: int, batch_size: int, seed: int, rank: int = 0, world: int = 1, consumed: int = 0):
        self.n, self.batch_size, self.seed, self.rank, self.world = n, batch_size, seed, rank, world
        self.consumed = consumed

    def positions(self, b: int) -> list[int]:
        """Global sample positions of this rank's batch b: the same samples get the same positions
        whatever the split into processes (rank-interleaved) and micro-batches."""
        start = (b * self.world + self.rank) * self.batch_size
        return list(range(start, start + self.batch_size))

    def _batch(self, b: int) -> list[int]:
        # Positions mapped through per-epoch permutations to dataset indices.
        out = []
        for pos in self.positions(b):
            epoch, j = divmod(pos, self.n)
            perm = self._perm(epoch)
            out.append(int(perm[j]))
        return out

    def _perm(self, epoch: int) -> np.ndarray:
        if getattr(self, "_cached_epoch", None) != epoch:
            self._cached_perm = np.random.default_rng([self.seed, epoch]).permutation(self.n)
            self._cached_epoch = epoch
        return self._cached_perm

    def __iter__(self) -> Iterator[list[int]]:
        b = self.consumed
        while True:
            yield self._batch(b)
            b += 1

    def __len__(self) -> int:  # endless; DataLoader only needs this for progress bars
        return 2**62


def make_loader(dataset: CaptionedImages, sampler: ResumableBatches, num_workers: int) -> torch.utils.data.DataLoader:
    return torch.utils.data.DataLoader(dataset, batch_sampler=sampler, num_workers=num_workers,
                                       persistent_workers=num_workers > 0, pin_memory=torch.cuda.is_available())
