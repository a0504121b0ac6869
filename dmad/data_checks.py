"""Training's side of the data checks (dmad.checkdata): which pairs a run can use, the usable
count preflight enforces before any model loads, and the record of items skipped on the way.

Torch-free: preflight scans the folder before torch is imported. Two stages find bad items:
- scan: `scan_folder` runs the checks of dmad.checkdata that need no decoding (file type,
  symlinks, image header: format, size, pixel limit; the caption file; one stem with two
  images) on every image of the folder, in threads; images with an error-severity problem never
  enter the dataset, so batches are drawn from usable items only;
- load: an item that still fails when the data loader decodes it (truncated pixel data the scan
  did not read, a file changed since) is replaced by the next index that loads (dmad.data).
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

from dmad.checkdata import CATEGORIES
from dmad.checkdata_items import DEFAULT_MAX_PIXELS, Problem, check_caption_file, path_problem
from dmad.datafiles import caption_of, images_in
from dmad.errors import UserInputError

# Training has no minimum-size option yet: any image is resized to the training resolution, so
# only images too small to mean anything are refused (`dmad check-data` defaults to a stricter
# --min-size). Declared sizes beyond the pixel limit are refused from the header alone.
TRAIN_MIN_SIZE = 8
SCAN_EVENTS_PER_CATEGORY = 20  # more scan problems of one category become one summary warning


@dataclass(frozen=True)
class Skip:
    """One item training does not use: the first error-severity problem found for it."""
    category: str
    path: str
    detail: str


@dataclass
class UsableData:
    folder: Path
    images: int
    pairs: list[tuple[Path, Path]]  # (image, caption) of the usable images, sorted by name
    skipped: list[Skip] = field(default_factory=list)
    min_size: int = TRAIN_MIN_SIZE

    def counts(self) -> Counter:
        return Counter(s.category for s in self.skipped)


def check_pair(image: Path, min_size: int = TRAIN_MIN_SIZE, max_pixels: int = DEFAULT_MAX_PIXELS) -> Optional[Skip]:
    """The first error-severity problem of one image and its caption from headers and the
    caption's bytes (no pixel decoding), or None when usable."""
    caption = caption_of(image)
    problems = [_header_problem(image, min_size, max_pixels)]
    if not os.path.lexists(caption):
        problems.append(Problem("image_without_caption", str(image), f"no caption file {caption.name}"))
    else:
        problems += check_caption_file(caption)[0]
    for p in problems:
        if p is not None and CATEGORIES[p.category][0] == "error":
            return Skip(p.category, p.path, p.detail)
    return None


def _header_problem(path: Path, min_size: int, max_pixels: int) -> Optional[Problem]:
    bad = path_problem(path)
    if bad is not None:
        return bad
    try:
        with Image.open(path) as im:  # reads the header only
            w, h = im.size
    except Image.DecompressionBombError as e:
        return Problem("pixel_limit_exceeded", str(path), f"refused without decoding: {e}")
    except OSError as e:
        if getattr(e, "filename", None) is not None:  # open() itself failed, not the image
            return Problem("file_unreadable", str(path), f"cannot open: {e.strerror or e}")
        return Problem("image_corrupt", str(path), f"{type(e).__name__}: {e}")
    except Exception as e:  # noqa: BLE001 - a broken header is a corrupt image, never a crash
        return Problem("image_corrupt", str(path), f"{type(e).__name__}: {e}")
    if w * h > max_pixels:
        return Problem("pixel_limit_exceeded", str(path), f"declares {w}x{h} = {w * h} pixels, above the limit "
                                                          f"of {max_pixels}: refused without decoding")
    if min(w, h) < min_size:
        return Problem("image_too_small", str(path), f"{w}x{h}: shorter side below {min_size}")
    return None


def _two_image_stems(images: list[Path]) -> dict[Path, Skip]:
    """Images sharing a stem share one caption: which image it describes is unknown (an error
    of dmad.checkdata too), so none of them is used."""
    stems: dict[str, list[Path]] = {}
    for img in images:
        stems.setdefault(img.stem, []).append(img)
    return {img: Skip("stem_two_images", str(img), f"{len(g)} images share the stem '{img.stem}'")
            for g in stems.values() if len(g) > 1 for img in g}


def scan_folder(folder: Path, min_size: int = TRAIN_MIN_SIZE, max_pixels: int = DEFAULT_MAX_PIXELS,
                workers: Optional[int] = None) -> UsableData:
    """Every image at the top of `folder` checked (threads: the work is file I/O and header
    parsing); the order of `pairs` is the sorted file order, whatever the thread timing."""
    images = images_in(folder)
    workers = workers or min(8, os.cpu_count() or 1)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        found = list(pool.map(lambda p: check_pair(p, min_size, max_pixels), images))
    two = _two_image_stems(images)
    found = [two.get(img) or skip for img, skip in zip(images, found)]
    pairs = [(img, caption_of(img)) for img, skip in zip(images, found) if skip is None]
    return UsableData(folder=folder, images=len(images), pairs=pairs, skipped=[s for s in found if s is not None],
                      min_size=min_size)


def format_counts(counts: Counter) -> str:
    """'3 empty_caption, 2 image_corrupt': most frequent first, then by name."""
    return ", ".join(f"{n} {cat}" for cat, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def require_batch(data: UsableData, effective_batch: int) -> None:
    """Fewer usable images than one effective batch cannot make a single iteration."""
    usable = len(data.pairs)
    if usable >= effective_batch:
        return
    why = ""
    if data.skipped:
        why = (f" ({len(data.skipped)} unusable: {format_counts(data.counts())}; "
               f"run `dmad check-data {data.folder} --min-size {data.min_size}` for the paths)")
    raise UserInputError(f"train_data_dir {data.folder}: {usable} usable image{'s' if usable != 1 else ''}, "
                         f"fewer than one effective batch of {effective_batch}{why}")


def world_size() -> int:
    """Processes of a launched run (accelerate/torchrun set WORLD_SIZE), known before torch loads."""
    try:
        return max(1, int(os.environ.get("WORLD_SIZE", "1")))
    except ValueError:
        return 1


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

    def scanned(self, data: UsableData, report: bool) -> None:
        """The scan's exclusions: counted always, reported as events only when `report` (a fresh
        run; a resumed run already has them in events.jsonl)."""
        self.scan_counts = data.counts()
        if report:
            per_cat: Counter = Counter()
            for s in data.skipped:
                per_cat[s.category] += 1
                if per_cat[s.category] <= SCAN_EVENTS_PER_CATEGORY:
                    self._emit(None, s, "scan")
            for cat, n in per_cat.items():
                if n > SCAN_EVENTS_PER_CATEGORY:
                    more = n - SCAN_EVENTS_PER_CATEGORY
                    self.events.emit("warning", None, category=cat, stage="scan", count=more,
                                     message=f"data: {more} more {cat} skipped (`dmad check-data` lists them)")
        if data.skipped:
            self.log.warning("data: %d of %d images unusable (%s)", len(data.skipped), data.images,
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
    """(images, captions, skips) batches -> (images, captions), handing the skips to `on_skip`."""
    for images, captions, skips in batches:
        if skips:
            on_skip(skips)
        yield images, captions
