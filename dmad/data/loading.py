"""Training data: one or more datasets (a captioned folder, or a dataset list JSON: dmad.contract.datasets)
read as batches that each come from one aspect bucket of one dataset (dmad.data.mixing).

Order is deterministic and resumable: batch b is a pure function of (seed, b) (dmad.data.mixing), and
the number of batches used is saved with each checkpoint, so a resumed run sees the same batches
as an uninterrupted one. Bad items never stop a run (dmad.data.scan): the scan keeps them out,
and an item that fails to load is replaced by the next item of its bucket that loads, a pure
function of the index and the files. With a latent cache (dmad.data.latent_cache) an item that is
cached comes as its VAE posterior instead of pixels; the training loop encodes the rest.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np
import torch
from PIL import Image, ImageOps

from dmad.data.buckets import crop_box
from dmad.data.scan import Skip, SkipLog, UsableData, require_batch, scan_datasets
from dmad.contract.datafiles import filename_caption, normalize_caption
from dmad.contract.datasets import DatasetEntry, dataset_name, load_dataset_list
from dmad.errors import UserInputError
from dmad.data.mixing import Group, make_groups

# What a corrupt, truncated or vanished file raises while loading (Pillow: OSError for truncated
# data, SyntaxError/ValueError for broken headers, DecompressionBombError for huge ones).
LOAD_ERRORS = (OSError, ValueError, SyntaxError, EOFError, Image.DecompressionBombError)
WIDE_MODES = ("I;16", "I;16B", "I;16L", "I", "F")


def read_caption(path: Path, lines: str = "join", pick: int = 0) -> str:
    """UTF-8 (a BOM is tolerated; anything else raises UnicodeDecodeError), made one line by
    dmad.contract.datafiles.normalize_caption."""
    return normalize_caption(path.read_bytes().decode("utf-8-sig"), lines, pick)


def to_rgb(im: Image.Image) -> Image.Image:
    """RGB for the VAE: transparency composited over white (what a viewer shows), 16-bit and
    float greys scaled to 8 bits instead of clipped, everything else converted by PIL."""
    if im.mode in ("RGBA", "LA", "PA") or (im.mode == "P" and "transparency" in im.info):
        rgba = im.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    if im.mode in WIDE_MODES:
        arr = np.asarray(im, dtype=np.float64)
        top = 65535.0 if im.mode.startswith("I;16") else max(1.0, float(arr.max()))
        return Image.fromarray((arr.clip(0, top) * (255.0 / top)).round().astype(np.uint8), "L").convert("RGB")
    return im.convert("RGB")


def path_key(path: Path) -> int:
    """A stable integer per file (random crops are a pure function of the image)."""
    return int.from_bytes(hashlib.blake2b(str(path).encode("utf-8"), digest_size=8).digest(), "big")


def fit(path: Path, size: tuple[int, int], bucket: tuple[int, int], crop: bool,
        style: str) -> tuple[tuple[int, int], tuple[int, int, int, int]]:
    """(resize size, crop box) that turn an upright image of `size` into `bucket`."""
    return crop_box(size[0], size[1], bucket, crop, style, key=path_key(path))


def load_image(path: Path, bucket: tuple[int, int], crop: bool = True, style: str = "center") -> torch.Tensor:
    """(3, H, W) float32 in [-1, 1] for a bucket (W, H): upright (EXIF), RGB, resized with
    Lanczos (only ever down: buckets are never larger than the image), then cropped."""
    with Image.open(path) as im:
        im = to_rgb(ImageOps.exif_transpose(im))
        resize, box = fit(path, im.size, bucket, crop, style)
        im = im.resize(resize, Image.LANCZOS, reducing_gap=3.0).crop(box)
        arr = np.asarray(im, dtype=np.float32) / 127.5 - 1.0
    return torch.from_numpy(arr).permute(2, 0, 1).contiguous()


@dataclass
class LatentLookup:
    """What a data-loading worker needs to find cached latents: the VAE identity, its dtype and
    each dataset's cache (dmad.data.latent_cache.TensorCache)."""
    vae_id: str
    dtype: str
    caches: list  # per dataset index


@dataclass
class Loaded:
    """One item as the loader hands it over: pixels, or the cached posterior."""
    pixels: Optional[torch.Tensor]
    latent: Optional[dict]
    key: Optional[str]
    caption: str
    dataset: int
    skips: tuple[Skip, ...] = ()


class MixedImages(torch.utils.data.Dataset):
    """The usable items of all datasets; indexed by (item index, sample position)."""

    def __init__(self, sets: list[UsableData], groups: list[Group], seed: int, source: object = ""):
        self.entries: list[DatasetEntry] = [d.entry for d in sets]
        self.items = [it for d in sets for it in d.items]
        self.dataset_of = [k for k, d in enumerate(sets) for _ in d.items]
        self.group_members: dict[int, tuple[int, ...]] = {i: g.items for g in groups for i in g.items}
        self.seed, self.source = seed, source
        self.latents: Optional[LatentLookup] = None
        self.cache_dirs: list[Path] = []

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: tuple[int, int]) -> Loaded:
        i, pos = index
        members = self.group_members[i]
        at = members.index(i)
        skips = []
        for k in range(len(members)):
            j = members[(at + k) % len(members)]
            try:
                got = self._load(j, pos)
                got.skips = tuple(skips)
                return got
            except LOAD_ERRORS as e:
                skips.append(_skip_of(self.items[j], e))
        raise UserInputError(f"no image of a {self.items[i].bucket[0]}x{self.items[i].bucket[1]} bucket of "
                             f"{self.source} loads any more (the first: {skips[0].path}: {skips[0].category}: "
                             f"{skips[0].detail})")

    def caption(self, j: int, pos: int) -> str:
        it, entry = self.items[j], self.entries[self.dataset_of[j]]
        if entry.caption_strategy == "instanceprompt":
            text = normalize_caption(entry.instance_prompt or "")
        elif entry.caption_strategy == "filename":
            text = filename_caption(it.image)
        else:
            pick = int(np.random.default_rng([self.seed, pos, 0xCA97]).integers(1 << 30)) \
                if entry.caption_lines == "random" else 0
            text = read_caption(it.caption, entry.caption_lines, pick)
        if not text:
            raise ValueError("empty caption")
        return text

    def all_captions(self, j: int) -> list[str]:
        """Every caption item j can be trained with (each line for caption_lines 'random')."""
        entry = self.entries[self.dataset_of[j]]
        if entry.caption_strategy == "textfile" and entry.caption_lines == "random":
            from dmad.contract.datafiles import caption_lines

            return caption_lines(self.items[j].caption.read_bytes().decode("utf-8-sig"))
        return [self.caption(j, 0)]

    def _load(self, j: int, pos: int) -> Loaded:
        it, d = self.items[j], self.dataset_of[j]
        entry = self.entries[d]
        caption = self.caption(j, pos)
        key = None
        if self.latents is not None:
            from dmad.data.latent_cache import latent_key

            # the scan's upright size: the key also holds the file's size and mtime, so a file changed
            # since the scan gets a new key and is loaded, never served a latent of its old pixels
            resize, box = fit(it.image, it.size, it.bucket, entry.crop, entry.crop_style)
            key = latent_key(it.image, it.bucket, resize, box, self.latents.vae_id, self.latents.dtype)
            cached = self.latents.caches[d].get(key)
            if cached is not None:
                return Loaded(None, cached, key, caption, d)
        return Loaded(load_image(it.image, it.bucket, entry.crop, entry.crop_style), None, key, caption, d)


def _skip_of(item, e: BaseException) -> Skip:
    """Which check category a load failure is: the caption's or the image's."""
    img, cap = item.image, item.caption
    if isinstance(e, UnicodeDecodeError):
        return Skip("caption_not_utf8", str(cap), str(e))
    if isinstance(e, ValueError) and str(e) == "empty caption":
        return Skip("empty_caption", str(cap or img), "the caption is empty or whitespace only")
    if isinstance(e, OSError) and cap is not None and not cap.is_file():
        return Skip("image_without_caption", str(img), f"caption {cap.name} is gone: {e}")
    if isinstance(e, OSError) and getattr(e, "filename", None) is not None:
        return Skip("file_unreadable", str(e.filename), str(e))
    return Skip("image_corrupt", str(img), f"{type(e).__name__}: {e}")


@dataclass
class Batch:
    """One micro-batch of one bucket: pixels of the items to encode (their batch positions in
    `miss`), the cached posteriors of the others, and every item's caption."""
    captions: list[str]
    datasets: list[int]
    keys: list[Optional[str]]
    miss: list[int]
    pixels: Optional[torch.Tensor]
    cached: dict[int, dict] = field(default_factory=dict)
    skips: list[Skip] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.captions)


def collate(items: list[Loaded]) -> Batch:
    miss = [k for k, it in enumerate(items) if it.pixels is not None]
    return Batch(captions=[it.caption for it in items], datasets=[it.dataset for it in items],
                 keys=[it.key for it in items], miss=miss,
                 pixels=torch.stack([items[k].pixels for k in miss]) if miss else None,
                 cached={k: it.latent for k, it in enumerate(items) if it.latent is not None},
                 skips=[s for it in items for s in it.skips])


def load_datasets(source: str | Path, resolution: int, train_batch: int,
                  effective_batch: int) -> tuple[list[UsableData], list[Group]]:
    """The scanned datasets of `source` (folder or dataset list) and their groups; refused (one
    line) when fewer usable images than one effective batch remain."""
    entries = load_dataset_list(source)
    sets = scan_datasets(entries, resolution, train_batch)
    require_batch(sets, effective_batch, source)
    buckets: list[dict[tuple[int, int], list[int]]] = []
    offset = 0  # item indices run over all datasets, in MixedImages' order
    for d in sets:
        per: dict[tuple[int, int], list[int]] = {}
        for k, it in enumerate(d.items):
            per.setdefault(it.bucket, []).append(offset + k)
        buckets.append(per)
        offset += len(d.items)
    weights = [d.entry.probability * (1 + d.entry.repeats) for d in sets]
    return sets, make_groups([list(per.items()) for per in buckets], weights)


def open_dataset(source: str | Path, resolution: int, train_batch: int, effective_batch: int, seed: int,
                 events, run_folder, log) -> tuple[MixedImages, list[Group], SkipLog]:
    """The usable items of `source` (refused when fewer than one effective batch), their groups,
    and the log their skips go to; the scan's skips are reported once per run (a resume keeps the
    events)."""
    from dmad.contract.events import read_events

    sets, groups = load_datasets(source, resolution, train_batch, effective_batch)
    previous = list(read_events(run_folder.events_jsonl)) if run_folder.events_jsonl.exists() else []
    skip_log = SkipLog(events, run_folder, log, previous)
    reported = any(e.kind == "warning" and e.data.get("stage") == "scan" for e in previous)
    skip_log.scanned(sets, report=not reported)
    name = dataset_name(source, [d.entry for d in sets])
    log.info("data %s: %d usable images in %d bucket(s) of %d dataset(s)", name, sum(len(d.items) for d in sets),
             len(groups), len(sets))
    return MixedImages(sets, groups, seed, source), groups, skip_log


def make_loader(dataset: MixedImages, sampler, num_workers: int) -> torch.utils.data.DataLoader:
    """A generator of the loader's own: without one, starting an iterator draws the workers' base
    seed from the global RNG, and a resumed run (which starts its iterator after restoring the
    checkpoint's RNG state) ran one draw ahead of an uninterrupted one. Items use no RNG (they
    are pure functions of (seed, b)); the seed only names the workers'."""
    return torch.utils.data.DataLoader(dataset, batch_sampler=sampler, num_workers=num_workers, collate_fn=collate,
                                       persistent_workers=num_workers > 0, pin_memory=torch.cuda.is_available(),
                                       generator=torch.Generator().manual_seed(dataset.seed))
