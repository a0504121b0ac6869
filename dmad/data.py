"""Training data: a captioned image folder (image + .txt caption of the same stem).

A deliberately small reader for the engine core; multi-source mixing, buckets and caching
build on it. Order is deterministic and resumable: the sampler's position (samples consumed)
is saved with each checkpoint, so a resumed run sees the same batches as an uninterrupted one.
Bad items never stop a run (dmad.data_checks): the scan keeps them out of the dataset, and an
item that fails to load is replaced by the next index that loads, a pure function of the index
and the files, so resumed runs and accumulation splits still see the same samples.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterator

import numpy as np
import torch
from PIL import Image

from dmad.data_checks import Skip, SkipLog, require_batch, scan_folder
from dmad.datafiles import caption_of, images_in
from dmad.errors import UserInputError

# What a corrupt, truncated or vanished file raises while loading (Pillow: OSError for truncated
# data, SyntaxError/ValueError for broken headers, DecompressionBombError for huge ones).
LOAD_ERRORS = (OSError, ValueError, SyntaxError, EOFError, Image.DecompressionBombError)


def find_pairs(folder: str | Path) -> list[tuple[Path, Path]]:
    """(image, caption) pairs sorted by name; images without a caption are skipped."""
    folder = Path(folder)
    if not folder.is_dir():
        raise UserInputError(f"train_data_dir is not a folder: {folder}")
    return [(img, caption_of(img)) for img in images_in(folder) if caption_of(img).is_file()]


def read_caption(path: Path) -> str:
    """UTF-8 (a BOM is tolerated; anything else raises UnicodeDecodeError); lines are joined with
    spaces so a caption is one line."""
    text = path.read_bytes().decode("utf-8-sig")
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
    """Items are (image (3, R, R), caption, skips): `skips` names the items that failed to load
    before this one was found in their place (usually empty)."""

    def __init__(self, pairs: list[tuple[Path, Path]], resolution: int, folder: str | Path = ""):
        if not pairs:
            raise UserInputError(f"no usable captioned images in {folder} (need image files with a .txt caption "
                                 f"of the same stem; `dmad check-data {folder}` says what is wrong)")
        self.pairs, self.resolution, self.folder = pairs, resolution, folder

    @classmethod
    def from_folder(cls, folder: str | Path, resolution: int) -> "CaptionedImages":
        return cls(find_pairs(folder), resolution, folder)

    def __len__(self) -> int:
        return len(self.pairs)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, str, tuple[Skip, ...]]:
        skips = []
        for k in range(len(self.pairs)):
            j = (i + k) % len(self.pairs)
            try:
                image, caption = self._load(j)
                return image, caption, tuple(skips)
            except LOAD_ERRORS as e:
                skips.append(_skip_of(self.pairs[j], e))
        raise UserInputError(f"no image of {self.folder} loads any more (the first: {skips[0].path}: "
                             f"{skips[0].category}: {skips[0].detail})")

    def _load(self, j: int) -> tuple[torch.Tensor, str]:
        img, cap = self.pairs[j]
        caption = read_caption(cap)
        if not caption:
            raise ValueError("empty caption")
        return load_image(img, self.resolution), caption


def _skip_of(pair: tuple[Path, Path], e: BaseException) -> Skip:
    """Which check category a load failure is: the caption's or the image's."""
    img, cap = pair
    if isinstance(e, UnicodeDecodeError):
        return Skip("caption_not_utf8", str(cap), str(e))
    if isinstance(e, ValueError) and str(e) == "empty caption":
        return Skip("empty_caption", str(cap), "the caption is empty or whitespace only")
    if isinstance(e, OSError) and not cap.is_file():
        return Skip("image_without_caption", str(img), f"caption {cap.name} is gone: {e}")
    if isinstance(e, OSError) and getattr(e, "filename", None) is not None:
        return Skip("file_unreadable", str(e.filename), str(e))
    return Skip("image_corrupt", str(img), f"{type(e).__name__}: {e}")


def collate(items: list) -> tuple[torch.Tensor, list[str], list[Skip]]:
    return (torch.stack([it[0] for it in items]), [it[1] for it in items],
            [s for it in items for s in it[2]])


def open_dataset(folder: str | Path, resolution: int, effective_batch: int, events, run_folder,
                 log) -> tuple[CaptionedImages, SkipLog]:
    """The usable items of `folder` (refused when fewer than one effective batch), and the log
    their skips go to; the scan's skips are reported once per run (a resume keeps the events)."""
    from dmad.events import read_events

    data = scan_folder(Path(folder))
    require_batch(data, effective_batch)
    previous = list(read_events(run_folder.events_jsonl)) if run_folder.events_jsonl.exists() else []
    skip_log = SkipLog(events, run_folder, log, previous)
    reported = any(e.kind == "warning" and e.data.get("stage") == "scan" for e in previous)
    skip_log.scanned(data, report=not reported)
    return CaptionedImages(data.pairs, resolution, folder), skip_log


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
    return torch.utils.data.DataLoader(dataset, batch_sampler=sampler, num_workers=num_workers, collate_fn=collate,
                                       persistent_workers=num_workers > 0, pin_memory=torch.cuda.is_available())
