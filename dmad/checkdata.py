"""`dmad check-data`: one pass over a folder or a dataset list that reports every data problem
with its path (docs/check-data.md documents the categories and the JSON report). Torch-free
(stdlib, PIL, numpy): training imports check_item to apply the same per-pair checks lazily.

The pass: list each dataset's folder (top level, like training), run the per-file checks
(dmad.checkdata_items) in a thread pool, then the cross-file checks (captions without images, one
stem with two images, exact and near duplicates) and the summary (dmad.checkdata_report)."""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import numpy as np

from dmad.checkdata_items import (DEFAULT_MAX_PIXELS, ImageInfo, Problem, check_caption_file, check_image_file,
                                  quiet_bomb_warnings)
from dmad.datafiles import IMAGE_EXTS
from dmad.datasets import DatasetEntry, load_dataset_list

__all__ = ["CATEGORIES", "Problem", "check_item", "check_source", "DEFAULT_MAX_PIXELS", "NEAR_DUPLICATE_BITS"]

# Stable ids (the JSON report and the app use them) -> (severity, one-line description). Errors make
# an image unusable; warnings do not.
CATEGORIES: dict[str, tuple[str, str]] = {
    "image_without_caption": ("error", "image without a caption file"),
    "caption_without_image": ("warning", "caption file without an image"),
    "empty_caption": ("error", "empty or whitespace-only caption"),
    "caption_not_utf8": ("error", "caption is not valid UTF-8"),
    "caption_multiline": ("warning", "newline or tab inside a caption"),
    "image_corrupt": ("error", "unreadable, corrupt or truncated image"),
    "image_too_small": ("error", "image below the minimum size"),
    "image_near_constant": ("warning", "solid or near-constant image"),
    "duplicate_exact": ("warning", "byte-identical to another image"),
    "duplicate_near": ("warning", "near duplicate of another image (perceptual hash)"),
    "stem_two_images": ("error", "one stem, two image extensions: the caption is ambiguous"),
    "unusual_mode": ("warning", "unusual mode: CMYK, 16-bit, alpha or palette"),
    "pixel_limit_exceeded": ("error", "declared dimensions beyond the safe pixel limit, refused without decoding"),
    "file_unreadable": ("error", "file cannot be read (permissions, or not a regular file)"),
    "broken_symlink": ("error", "symbolic link to a missing file"),
    "symlink_loop": ("error", "symbolic link loop"),
}
NEAR_DUPLICATE_BITS = 4  # dHash Hamming distance (of 64 bits) at or below which two images are near duplicates
NEAR_DUPLICATE_COLOUR = 24  # ... and no value of their 4 x 4 RGB thumbnails more than this apart (0-255)
CAPTION_EXTS = (".txt",)


def severity(category: str) -> str:
    return CATEGORIES[category][0]


def check_item(image: Path, caption: Optional[Path], min_size: int,
               max_pixels: int = DEFAULT_MAX_PIXELS) -> list[Problem]:
    """Problems of one (image, caption) pair that need no other file. `caption` None: the dataset
    needs no caption file (caption_strategy filename / instanceprompt)."""
    quiet_bomb_warnings()
    problems = list(check_image_file(Path(image), min_size, max_pixels).problems)
    if caption is not None:
        problems += _caption_problems(Path(image), Path(caption))[0]
    return problems


def _caption_problems(image: Path, caption: Path) -> tuple[list[Problem], Optional[str]]:
    if not os.path.lexists(caption):
        return [Problem("image_without_caption", str(image), f"no caption file {caption.name}")], None
    return check_caption_file(caption)


@dataclass
class _Pair:
    dataset: str
    image: Path
    caption: Optional[Path]  # the .txt to read (textfile strategy)
    info: Optional[ImageInfo] = None
    caption_problems: tuple = ()
    caption_text: Optional[str] = None


def _list_folder(entry: DatasetEntry) -> tuple[list[_Pair], list[Path], list[Problem]]:
    """Pairs, orphan captions, and folder-level problems (stems with two images)."""
    try:
        names = sorted(os.listdir(entry.root))
    except OSError as e:
        return [], [], [Problem("file_unreadable", str(entry.root), f"cannot list the folder: {e.strerror or e}")]
    root = entry.root
    images = [root / n for n in names if os.path.splitext(n)[1].lower() in IMAGE_EXTS]
    captions = {os.path.splitext(n)[0]: root / n for n in names if os.path.splitext(n)[1].lower() in CAPTION_EXTS}
    textfile = entry.caption_strategy == "textfile"
    pairs = [_Pair(entry.id, img, img.with_suffix(".txt") if textfile else None) for img in images]
    stems: dict[str, list[Path]] = {}
    for img in images:
        stems.setdefault(img.stem, []).append(img)
    problems = []
    if textfile:
        for group in (g for g in stems.values() if len(g) > 1):
            for img in group:
                others = [str(o) for o in group if o != img]
                problems.append(Problem("stem_two_images", str(img), f"{len(group)} images share the stem "
                                        f"'{img.stem}': which one does {img.stem}.txt describe?", others))
    orphans = [c for stem, c in captions.items() if textfile and stem not in stems]
    return pairs, orphans, problems


def _run_pair(pair: _Pair, min_size: int, max_pixels: int) -> _Pair:
    pair.info = check_image_file(pair.image, min_size, max_pixels)
    if pair.caption is not None:
        probs, pair.caption_text = _caption_problems(pair.image, pair.caption)
        pair.caption_problems = tuple(probs)
    return pair


def _run_all(pairs: list[_Pair], entries: dict[str, DatasetEntry], min_size: int, max_pixels: int,
             workers: int, progress: Optional[Callable[[int, int], None]]) -> None:
    def one(pair: _Pair) -> _Pair:
        size = entries[pair.dataset].minimum_image_size
        return _run_pair(pair, min_size if size is None else size, max_pixels)

    total = len(pairs)
    if progress:
        progress(0, total)
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        # map keeps order; chunks of work are small, so the pool stays busy.
        for done, _ in enumerate(pool.map(one, pairs), 1):
            if progress:
                progress(done, total)


def exact_duplicates(pairs: list[_Pair]) -> list[Problem]:
    """Every copy after the first (by dataset order, then name) of byte-identical images."""
    first: dict[str, str] = {}
    problems = []
    for pair in pairs:
        digest = pair.info.sha1 if pair.info else None
        if digest is None:
            continue
        if digest in first:
            problems.append(Problem("duplicate_exact", str(pair.image), f"byte-identical to {Path(first[digest]).name}",
                                    [first[digest]]))
        else:
            first[digest] = str(pair.image)
    return problems


def near_duplicates(pairs: list[_Pair], max_bits: int = NEAR_DUPLICATE_BITS, chunk: int = 512) -> list[Problem]:
    """Images whose dHash is within `max_bits` of an earlier image's and whose 4 x 4 colour layout
    is within NEAR_DUPLICATE_COLOUR, byte-identical copies aside.
    Vectorised: XOR + popcount of uint64 hashes, a chunk of rows against all earlier ones."""
    items = [(p, p.info.dhash, p.info.sha1) for p in pairs if p.info and p.info.dhash is not None]
    if len(items) < 2:
        return []
    hashes = np.array([h for _, h, _ in items], dtype=np.uint64)
    problems = []
    for start in range(0, len(items), chunk):
        rows = hashes[start:start + chunk]
        dist = np.bitwise_count(rows[:, None] ^ hashes[None, :start + chunk])
        for r, j in zip(*np.nonzero(dist <= max_bits)):
            i = start + int(r)
            if j >= i or items[i][2] == items[j][2]:
                continue  # each pair once (on the later image); exact copies are duplicate_exact
            ci, cj = items[i][0].info.colour, items[j][0].info.colour
            if np.abs(ci.astype(np.int16) - cj).max() > NEAR_DUPLICATE_COLOUR:
                continue  # same luminance edges, other colours (a red and a blue square)
            problems.append((i, int(j), int(dist[r, j])))
    return _group_near(items, problems)


def _group_near(items, hits) -> list[Problem]:
    by_image: dict[int, list[tuple[int, int]]] = {}
    for i, j, d in hits:
        by_image.setdefault(i, []).append((j, d))
    out = []
    for i in sorted(by_image):
        near = sorted(by_image[i])
        names = ", ".join(f"{items[j][0].image.name} ({d} bits)" for j, d in near[:5])
        out.append(Problem("duplicate_near", str(items[i][0].image), f"looks like {names}",
                           [str(items[j][0].image) for j, _ in near]))
    return out


def load_source(source: Path) -> list[DatasetEntry]:
    return load_dataset_list(source)


def check_source(source: Path, *, min_size: int = 256, resolution: int = 512, batch: Optional[int] = None,
                 workers: Optional[int] = None, progress: Optional[Callable[[int, int], None]] = None,
                 max_pixels: int = DEFAULT_MAX_PIXELS) -> dict:
    """The whole report (docs/check-data.md) for a folder or a dataset list JSON. UserInputError
    when the source itself is not valid; problems of files are reported, never raised."""
    from dmad.checkdata_report import build_report

    entries = load_source(Path(source))
    quiet_bomb_warnings()
    pairs, orphans, problems = [], [], []
    for entry in entries:
        p, o, folder_problems = _list_folder(entry)
        pairs += p
        orphans += [(entry.id, c) for c in o]
        problems += [(entry.id, x) for x in folder_problems]
    _run_all(pairs, {e.id: e for e in entries}, min_size, max_pixels, workers or os.cpu_count() or 1, progress)
    by_path = {str(p.image): p.dataset for p in pairs}
    for pair in pairs:
        problems += [(pair.dataset, x) for x in (*pair.info.problems, *pair.caption_problems)]
    problems += [(ds, Problem("caption_without_image", str(c), f"no image with the stem '{c.stem}'"))
                 for ds, c in orphans]
    problems += [(by_path[x.path], x) for x in exact_duplicates(pairs) + near_duplicates(pairs)]
    return build_report(source=Path(source), entries=entries, pairs=pairs, problems=problems, min_size=min_size,
                        resolution=resolution, batch=batch, max_pixels=max_pixels)
