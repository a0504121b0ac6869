"""Training's side of the data checks (dmad.data.check): which pairs a run can use, the usable
count preflight enforces before any model loads, and the record of items skipped on the way.

Torch-free: preflight scans the folder before torch is imported. Two stages find bad items:
- scan: `scan_folder` runs the checks of dmad.data.check that need no decoding (file type,
  symlinks, image header: format, size, pixel limit; the caption file; one stem with two
  images) on every image of the folder, in threads; images with an error-severity problem never
  enter the dataset, so batches are drawn from usable items only;
- load: an item that still fails when the data loader decodes it (truncated pixel data the scan
  did not read, a file changed since) is replaced by the next index that loads (dmad.data.loading).
`SkipLog` reports both as `warning` events ({category, path, detail, stage, message}) and keeps
the counts in status.json (`skipped_items`).
"""
from __future__ import annotations

import os
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Optional

from PIL import Image

from dmad.data.check_items import CATEGORIES, DEFAULT_MAX_PIXELS, Problem, check_caption_file, path_problem
from dmad.data.buckets import training_bucket
from dmad.contract.datafiles import caption_of, filename_caption, images_in
from dmad.contract.datasets import DatasetEntry
from dmad.errors import UserInputError

# The smallest image training takes when a dataset sets no minimum_image_size (`dmad check-data`
# defaults to a stricter --min-size). Images are never upscaled: an image whose bucket would be
# below the bucket step is refused too. Declared sizes beyond the pixel limit are refused from the
# header alone.
TRAIN_MIN_SIZE = 8
SCAN_EVENTS_PER_CATEGORY = 20  # more scan problems of one category become one summary warning
# EXIF orientations that turn the image a quarter: its upright width and height swap
QUARTER_TURNS = (5, 6, 7, 8)


@dataclass(frozen=True)
class Skip:
    """One item training does not use: the first error-severity problem found for it."""
    category: str
    path: str
    detail: str


@dataclass(frozen=True)
class Item:
    """One usable image: its caption file (caption_strategy textfile; else None), its upright size
    from the header and its bucket."""
    image: Path
    caption: Optional[Path]
    size: tuple[int, int]
    bucket: tuple[int, int]


@dataclass
class UsableData:
    """The scan of one dataset entry (a plain folder is an entry of its own)."""
    folder: Path
    images: int
    items: list[Item]
    skipped: list[Skip] = field(default_factory=list)
    min_size: int = TRAIN_MIN_SIZE
    entry: Optional[DatasetEntry] = None

    @property
    def pairs(self) -> list[tuple[Path, Optional[Path]]]:
        return [(it.image, it.caption) for it in self.items]

    def counts(self) -> Counter:
        return Counter(s.category for s in self.skipped)

    def buckets(self) -> Counter:
        return Counter(it.bucket for it in self.items)


def check_image_item(image: Path, caption_strategy: str, min_size: int,
                     max_pixels: int = DEFAULT_MAX_PIXELS) -> tuple[Optional[Skip], Optional[tuple[int, int]]]:
    """(first error-severity problem or None, upright size from the header) of one image and its
    caption under `caption_strategy`."""
    header, size = _header(image, min_size, max_pixels)
    problems = [header]
    if caption_strategy == "textfile":
        caption = caption_of(image)
        if not os.path.lexists(caption):
            problems.append(Problem("image_without_caption", str(image), f"no caption file {caption.name}"))
        else:
            problems += check_caption_file(caption)[0]
    elif caption_strategy == "filename" and not filename_caption(image):
        problems.append(Problem("empty_caption", str(image), "caption_strategy 'filename': the file name "
                                                             "has no words"))
    for p in problems:
        if p is not None and CATEGORIES[p.category][0] == "error":
            return Skip(p.category, p.path, p.detail), size
    return None, size


def _header(path: Path, min_size: int, max_pixels: int) -> tuple[Optional[Problem], Optional[tuple[int, int]]]:
    bad = path_problem(path)
    if bad is not None:
        return bad, None
    try:
        with Image.open(path) as im:  # reads the header only
            w, h = im.size
            orientation = _orientation(im)
    except Image.DecompressionBombError as e:
        return Problem("pixel_limit_exceeded", str(path), f"refused without decoding: {e}"), None
    except OSError as e:
        if getattr(e, "filename", None) is not None:  # open() itself failed, not the image
            return Problem("file_unreadable", str(path), f"cannot open: {e.strerror or e}"), None
        return Problem("image_corrupt", str(path), f"{type(e).__name__}: {e}"), None
    except Exception as e:  # noqa: BLE001 - a broken header is a corrupt image, never a crash
        return Problem("image_corrupt", str(path), f"{type(e).__name__}: {e}"), None
    if w * h > max_pixels:
        return Problem("pixel_limit_exceeded", str(path), f"declares {w}x{h} = {w * h} pixels, above the limit "
                                                          f"of {max_pixels}: refused without decoding"), None
    if orientation in QUARTER_TURNS:
        w, h = h, w
    if min(w, h) < min_size:
        return Problem("image_too_small", str(path), f"{w}x{h}: shorter side below {min_size}"), (w, h)
    return None, (w, h)


def _orientation(im: Image.Image) -> int:
    """The EXIF orientation tag (1 when absent or unreadable): training loads images upright."""
    try:
        return int(im.getexif().get(0x0112, 1))
    except Exception:  # noqa: BLE001 - broken EXIF is no reason to refuse an image
        return 1


def _two_image_stems(images: list[Path]) -> dict[Path, Skip]:
    """Images sharing a stem share one caption: which image it describes is unknown (an error
    of dmad.data.check too), so none of them is used."""
    stems: dict[str, list[Path]] = {}
    for img in images:
        stems.setdefault(img.stem, []).append(img)
    return {img: Skip("stem_two_images", str(img), f"{len(g)} images share the stem '{img.stem}'")
            for g in stems.values() if len(g) > 1 for img in g}


def scan_folder(folder: Path, min_size: int = TRAIN_MIN_SIZE, max_pixels: int = DEFAULT_MAX_PIXELS,
                workers: Optional[int] = None, resolution: int = 512) -> UsableData:
    """A plain captioned folder scanned as a one-entry dataset list (no bucket is dropped)."""
    entry = DatasetEntry(id=folder.name or "data", instance_data_dir=str(folder), minimum_image_size=min_size)
    return scan_entry(entry, resolution, train_batch=1, max_pixels=max_pixels, workers=workers)


def scan_entry(entry: DatasetEntry, resolution: int, train_batch: int, max_pixels: int = DEFAULT_MAX_PIXELS,
               workers: Optional[int] = None) -> UsableData:
    """Every image at the top of the entry's folder checked from headers and caption bytes
    (threads: the work is file I/O and header parsing) and put in its bucket. The order of
    `items` is the sorted file order, whatever the thread timing. Refused: error-severity
    problems, images whose bucket would fall below the bucket step (never upscaled), and the
    images of buckets with fewer than `train_batch` images (a batch is one bucket)."""
    folder = entry.root
    min_size = max(TRAIN_MIN_SIZE, entry.minimum_image_size or 0)
    res, step = entry.target_resolution(resolution), entry.step(resolution)
    images = images_in(folder)
    workers = workers or min(8, os.cpu_count() or 1)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        found = list(pool.map(lambda p: check_image_item(p, entry.caption_strategy, min_size, max_pixels), images))
    two = _two_image_stems(images) if entry.caption_strategy == "textfile" else {}
    items, skipped = [], []
    for img, (skip, size) in zip(images, found):
        skip = two.get(img) or skip
        if skip is None:
            bucket = training_bucket(size[0], size[1], res, step, entry.resolution_type, entry.crop_aspect == "square",
                                     entry.bucket_rounding)
            if min(bucket) < step:
                skip = Skip("image_too_small", str(img), f"{size[0]}x{size[1]} fits a bucket of {bucket[0]}x{bucket[1]}, "
                                                         f"below the bucket step {step} (images are never upscaled)")
            else:
                items.append(Item(img, caption_of(img) if entry.caption_strategy == "textfile" else None, size, bucket))
        if skip is not None:
            skipped.append(skip)
    sizes = Counter(it.bucket for it in items)
    small = {b for b, n in sizes.items() if n < train_batch}
    for it in items:
        if it.bucket in small:
            skipped.append(Skip("bucket_too_small", str(it.image),
                                f"bucket {it.bucket[0]}x{it.bucket[1]} of dataset '{entry.id}' has {sizes[it.bucket]} "
                                f"image{'s' if sizes[it.bucket] != 1 else ''}, fewer than train_batch_size "
                                f"{train_batch} (a batch is one bucket)"))
    items = [it for it in items if it.bucket not in small]
    return UsableData(folder=folder, images=len(images), items=items, skipped=skipped, min_size=min_size, entry=entry)


_last_scan: dict = {}  # one slot: preflight's scan, reused when the session builds its dataset


def scan_datasets(entries: list[DatasetEntry], resolution: int, train_batch: int,
                  max_pixels: int = DEFAULT_MAX_PIXELS) -> list[UsableData]:
    """The scan of every entry that can be drawn (probability > 0). `dmad train` scans in preflight
    and again when the session builds its dataset, in the same process: the second call reuses
    the first when the inputs and every folder's modification time (files added, removed or
    renamed) are unchanged; a file changed in place in between is caught on load."""
    live = [e for e in entries if e.probability > 0]
    key = (tuple(e.model_dump_json() for e in live), resolution, train_batch, max_pixels)
    stamp = tuple(_mtime(e.root) for e in live)
    if _last_scan.get("key") == key and _last_scan.get("stamp") == stamp:
        return _last_scan["sets"]
    sets = [scan_entry(e, resolution, train_batch, max_pixels) for e in live]
    _last_scan.update(key=key, stamp=stamp, sets=sets)
    return sets


def _mtime(folder: Path) -> Optional[int]:
    try:
        return os.stat(folder).st_mtime_ns
    except OSError:
        return None


def format_counts(counts: Counter) -> str:
    """'3 empty_caption, 2 image_corrupt': most frequent first, then by name."""
    return ", ".join(f"{n} {cat}" for cat, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def require_batch(data: UsableData | list[UsableData], effective_batch: int, source: object = None) -> None:
    """Fewer usable images than one effective batch cannot make a single iteration; nor can usable
    images that sit in buckets too small for a batch."""
    sets = data if isinstance(data, list) else [data]
    batchable = sum(len(d.items) for d in sets)
    if batchable >= effective_batch:
        return
    where = source or sets[0].folder
    skipped = [s for d in sets for s in d.skipped]
    unbatched = [s for s in skipped if s.category == "bucket_too_small"]
    unusable = [s for s in skipped if s.category != "bucket_too_small"]
    usable = batchable + len(unbatched)
    if usable >= effective_batch:
        buckets = len({s.detail.split(" of dataset")[0] for s in unbatched})
        raise UserInputError(f"train_data_dir {where}: {usable} usable images, but only {batchable} in buckets that "
                             f"hold a batch (train_batch_size): {len(unbatched)} sit in {buckets} smaller bucket(s), "
                             f"fewer than one effective batch of {effective_batch} (lower train_batch_size, or use "
                             f"crop_aspect 'square' or a larger bucket_step in a dataset list)")
    why = ""
    if unusable:
        counts = Counter(s.category for s in unusable)
        min_size = f" --min-size {sets[0].min_size}" if len(sets) == 1 else ""
        why = f" ({len(unusable)} unusable: {format_counts(counts)}; run `dmad check-data {where}{min_size}` for the paths)"
    raise UserInputError(f"train_data_dir {where}: {usable} usable image{'s' if usable != 1 else ''}, "
                         f"fewer than one effective batch of {effective_batch}{why}")


class SkipLog:
    """Reports skipped items once per path as warning events and keeps status.json's
    `skipped_items` ({"total": N, "by_category": {...}}) current.

    `previous` are the warning events already in the run's events.jsonl (a resume keeps those up
    to the checkpoint): their items are not reported again, so a resumed run's events and counts
    match an uninterrupted run's."""

    def __init__(self, events, folder, log, previous: Iterable = ()):
        self.events, self.folder, self.log = events, folder, log
        self.seen: dict[str, str] = {}  # path -> category, items found on load
        self.scan_counts: Counter = Counter()
        for e in previous:
            if e.kind == "warning" and e.data.get("stage") == "load" and e.data.get("path"):
                self.seen[e.data["path"]] = e.data.get("category", "image_corrupt")

    def scanned(self, data: UsableData | list[UsableData], report: bool) -> None:
        """The scan's exclusions: counted always, reported as events only when `report` (a fresh
        run; a resumed run already has them in events.jsonl)."""
        sets = data if isinstance(data, list) else [data]
        skipped = [s for d in sets for s in d.skipped]
        self.scan_counts = Counter(s.category for s in skipped)
        if report:
            per_cat: Counter = Counter()
            for s in skipped:
                per_cat[s.category] += 1
                if per_cat[s.category] <= SCAN_EVENTS_PER_CATEGORY:
                    self._emit(None, s, "scan")
            for cat, n in per_cat.items():
                if n > SCAN_EVENTS_PER_CATEGORY:
                    more = n - SCAN_EVENTS_PER_CATEGORY
                    self.events.emit("warning", None, category=cat, stage="scan", count=more,
                                     message=f"data: {more} more {cat} skipped (`dmad check-data` lists them)")
        if skipped:
            self.log.warning("data: %d of %d images unusable (%s)", len(skipped), sum(d.images for d in sets),
                             format_counts(self.scan_counts))
        self._write_status()

    def loaded(self, iteration: Optional[int], skips: Iterable[Skip]) -> None:
        """Items the data loader replaced while building a batch."""
        new = False
        for s in skips:
            if s.path in self.seen:
                continue
            self.seen[s.path] = s.category
            self._emit(iteration, s, "load")
            self.log.warning("data: skipped %s (%s: %s)", s.path, s.category, s.detail)
            new = True
        if new:
            self._write_status()

    def counts(self) -> Counter:
        return self.scan_counts + Counter(self.seen.values())

    def _emit(self, iteration: Optional[int], s: Skip, stage: str) -> None:
        self.events.emit("warning", iteration, category=s.category, path=s.path, detail=s.detail, stage=stage,
                         message=f"data: skipped {s.path} ({s.category}: {s.detail})")

    def _write_status(self) -> None:
        counts = self.counts()
        state = (self.folder.read_status() or {}).get("state", "running")
        self.folder.write_status(state, skipped_items={"total": sum(counts.values()), "by_category": dict(counts)})


def report_skips(batches, on_skip: Callable[[list[Skip]], None]):
    """Batches (dmad.data.loading.Batch) passed on, their skips handed to `on_skip` first."""
    for batch in batches:
        if batch.skips:
            on_skip(batch.skips)
        yield batch
