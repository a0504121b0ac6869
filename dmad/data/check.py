"""`dmad check-data`: one pass over a folder or a dataset list that reports every data problem
with its path (docs/check-data.md documents the categories and the JSON report). Torch-free
(stdlib, PIL, numpy): training imports check_item to apply the same per-pair checks lazily.

The pass: list each dataset's folder (top level, like training), run the per-file checks
(dmad.data.check_items) on every image the fingerprint cache does not vouch for (a process pool of
forked workers for large folders, else threads), then the cross-file checks (captions without
images, one stem with two images, exact and near duplicates) and the summary
(dmad.data.check_report).

Speed (docs/benchmarks.md): the per-image cost is the decode, which the near-constant and
near-duplicate checks need and which finds truncation; PNG has no reduced decode (inflating is
most of it) and JPEG already decodes at 1/8 scale. So a cold pass is bound by decoding on the
available cores, and re-checks are made cheap by the cache: per image, results keyed by (absolute
path, size, mtime_ns, ctime_ns, inode, min_size, max_pixels), so an unchanged file costs one
lstat and any change re-checks it.

`fast` (--fast, dmad.data.check_fast): no pixel decoding at all; truncation and corruption are found
from the file structure (PNG chunk CRCs, JPEG markers and EOI, RIFF and BMP sizes); the
near-constant and near-duplicate checks are skipped (the report says so); only images whose byte
size another image shares are hashed (exact duplicates have one size). Its results are cached
in a file of their own (cache_file(..., fast=True)), never mixed with the full check's."""
from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import sys
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Optional

import numpy as np
import PIL

from dmad.data.check_fast import SKIPPED_CHECKS, check_image_fast
from dmad.data.check_items import (CATEGORIES, DEFAULT_MAX_PIXELS, ImageInfo, Problem, check_caption_file,
                                  check_image_file, info_from_json, info_to_json, quiet_bomb_warnings, stat_regular)
from dmad.data.check_report import build_report
from dmad.contract.datafiles import IMAGE_EXTS
from dmad.contract.datasets import DatasetEntry, load_dataset_list
from dmad.contract.paths import cache_root

__all__ = ["CATEGORIES", "Problem", "check_item", "check_source", "DEFAULT_MAX_PIXELS", "NEAR_DUPLICATE_BITS",
           "cache_file", "SKIPPED_CHECKS"]

NEAR_DUPLICATE_BITS = 4  # dHash Hamming distance (of 64 bits) at or below which two images are near duplicates
NEAR_DUPLICATE_COLOUR = 24  # ... and no value of their 4 x 4 RGB thumbnails more than this apart (0-255)
CAPTION_EXTS = (".txt",)
# Fewer images to decode than this: threads. A forked process pool escapes the GIL (the per-image
# Python work: header parsing, the thumbnail, hashing small files) but costs ~10 ms a worker to start.
PROCESS_POOL_MIN = 256
CACHE_VERSION = 1  # bump when a per-image check changes what it finds: older caches are then ignored
CACHE_MAX_BYTES = 512 << 20  # a larger cache file is not ours (or is damaged): ignored, never loaded


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
    if not images:  # nothing to train on: not "clean"
        problems.append(Problem("no_images", str(root), f"no {' '.join(IMAGE_EXTS)} files at the top level "
                                                        f"of the folder"))
    return pairs, orphans, problems


def _stamp(st: os.stat_result, min_size: int, max_pixels: int) -> list[int]:
    """What a cached result depends on: the file (size, mtime, ctime, inode: any rewrite, touch,
    copy over it or rename onto it changes one) and the inputs of the per-image checks."""
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, min_size, max_pixels]


def cache_file(roots: list[Path], fast: bool = False) -> Path:
    """The fingerprint cache of one set of dataset folders: one file per set, so checking two
    folders never rewrites the other's cache, and stale entries go when their file does. `fast`:
    the --fast mode's own file (its results lack the pixel checks: never used by a full check)."""
    key = "\n".join(sorted(os.path.abspath(str(r)) for r in roots))
    name = hashlib.sha256(key.encode('utf-8', 'surrogatepass')).hexdigest()[:24]
    return cache_root() / "check-data" / f"{name}{'.fast' if fast else ''}.json"


def load_cache(path: Path) -> dict[str, dict]:
    """The entries of a cache file; {} when it is missing, damaged, too large, or written by another
    cache version or Pillow version (a decoder upgrade can change what an image decodes to)."""
    try:
        if os.stat(path).st_size > CACHE_MAX_BYTES:
            return {}
        with open(path, "rb") as f:
            raw = json.loads(f.read())
    except (OSError, ValueError, RecursionError):
        return {}
    if (not isinstance(raw, dict) or raw.get("version") != CACHE_VERSION or raw.get("pillow") != PIL.__version__
            or not isinstance(raw.get("entries"), dict)):
        return {}
    return raw["entries"]


def save_cache(path: Path, entries: dict[str, dict]) -> bool:
    """Atomically (temp file in the same folder, then os.replace): a crash or a concurrent check
    leaves the old cache or the new one, never half of one. False when it cannot be written (a
    read-only home): the cache only saves time, so that is not an error."""
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump({"version": CACHE_VERSION, "pillow": PIL.__version__, "entries": entries}, f,
                      separators=(",", ":"))
        os.replace(tmp, path)
        return True
    except (OSError, ValueError):
        if tmp:
            try:
                os.unlink(tmp)
            except OSError:
                pass
        return False


def _cached(entries: dict[str, dict], key: str, stamp: list[int], path: str) -> Optional[ImageInfo]:
    entry = entries.get(key)
    if not isinstance(entry, dict) or entry.get("stamp") != stamp:
        return None
    return info_from_json(entry, path, CATEGORIES)


def _image_job(job: tuple) -> ImageInfo:
    """job: (path, min_size, max_pixels[, fast, sha1])."""
    if len(job) > 3 and job[3]:
        return check_image_fast(Path(job[0]), job[1], job[2], job[4])
    return check_image_file(Path(job[0]), job[1], job[2])


def _worker_init(parent: int) -> None:
    """Forked workers end when the parent does: the app cancels a check by killing the command,
    and orphaned workers would otherwise wait on their queue forever."""
    quiet_bomb_warnings()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.25)
        os._exit(1)

    threading.Thread(target=watch, daemon=True).start()


def _can_fork() -> bool:
    """fork only from a single-threaded process (forking a threaded one can copy a held lock), and
    only where fork exists (not Windows; on macOS it is unsafe with system frameworks)."""
    return (sys.platform.startswith("linux") and "fork" in multiprocessing.get_all_start_methods()
            and threading.active_count() == 1)


def _map_images(jobs: list[tuple], workers: int) -> Iterator[ImageInfo]:
    """check_image_file of each job, in order. A process pool when it pays (see PROCESS_POOL_MIN);
    if a worker dies (out of memory), the rest are checked in threads."""
    done = 0
    if workers > 1 and len(jobs) >= PROCESS_POOL_MIN and _can_fork():
        chunk = max(1, min(32, len(jobs) // (workers * 8)))
        try:
            with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork"),
                                     initializer=_worker_init, initargs=(os.getpid(),)) as pool:
                for info in pool.map(_image_job, jobs, chunksize=chunk):
                    done += 1
                    try:
                        yield info
                    except GeneratorExit:  # the consumer stopped: as _cancel_on_exit
                        pool.shutdown(wait=False, cancel_futures=True)
                        raise
            return
        except (BrokenProcessPool, OSError):
            pass  # e.g. a worker killed by the OOM killer, or no fork allowed: threads take over
    rest = jobs[done:]
    if workers <= 1:
        yield from map(_image_job, rest)
        return
    with ThreadPoolExecutor(max_workers=workers) as pool:
        yield from _cancel_on_exit(pool, pool.map(_image_job, rest))


def _cancel_on_exit(pool, results: Iterator[ImageInfo]) -> Iterator[ImageInfo]:
    """`results`, and when the consumer stops early (an exception, Ctrl-C), the queued work is
    dropped, so leaving the pool's `with` waits only for the images being decoded, not all."""
    try:
        yield from results
    except GeneratorExit:
        pool.shutdown(wait=False, cancel_futures=True)
        raise


def _run_all(pairs: list[_Pair], entries: dict[str, DatasetEntry], min_size: int, max_pixels: int,
             workers: int, progress: Optional[Callable[[int, int], None]],
             cache: Optional[dict[str, dict]], fast: bool = False) -> tuple[int, dict[str, dict]]:
    """Sets pair.info and the caption results of every pair. `cache`: the loaded cache entries, or
    None for no cache. Returns (images whose results came from the cache, the new cache entries:
    every image read in this pass, so entries of deleted files are dropped)."""
    total = len(pairs)
    if progress:
        progress(0, total)
    fresh: dict[str, dict] = {}
    todo: list[tuple[_Pair, str, list[int], int, bool]] = []
    stats = []
    for pair in pairs:
        st, bad = stat_regular(pair.image)
        if bad is not None:
            pair.info = ImageInfo(problems=[bad])
        else:
            stats.append((pair, st))
    # fast mode hashes only files whose byte size another image shares: byte copies have one size
    sizes = Counter(st.st_size for _, st in stats)
    for pair, st in stats:
        size = entries[pair.dataset].minimum_image_size
        eff_min = min_size if size is None else size
        sha1 = not fast or sizes[st.st_size] > 1
        key, stamp = os.path.abspath(str(pair.image)), _stamp(st, eff_min, max_pixels)
        if cache is not None:
            pair.info = _cached(cache, key, stamp, str(pair.image))
            if pair.info is not None and (pair.info.sha1 is not None or not sha1):
                fresh[key] = cache[key]
                continue
        todo.append((pair, key, stamp, eff_min, sha1))
    reused, ready = len(fresh), total - len(todo)
    if progress and ready:
        progress(ready, total)
    jobs = [(str(pair.image), eff_min, max_pixels, *((True, sha1) if fast else ()))
            for pair, _, _, eff_min, sha1 in todo]
    results = _map_images(jobs, max(1, workers))  # the pools start now; captions are read meanwhile
    for pair in pairs:
        if pair.caption is not None:
            probs, pair.caption_text = _caption_problems(pair.image, pair.caption)
            pair.caption_problems = tuple(probs)
    for done, ((pair, key, stamp, _, _), info) in enumerate(zip(todo, results), ready + 1):
        pair.info = info
        if info.read:  # its result depends only on the bytes the stamp vouches for
            fresh[key] = {"stamp": stamp, **info_to_json(info)}
        if progress:
            progress(done, total)
    return reused, fresh


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
                 max_pixels: int = DEFAULT_MAX_PIXELS, cache: bool = False, fast: bool = False) -> dict:
    """The whole report (docs/check-data.md) for a folder or a dataset list JSON. UserInputError
    when the source itself is not valid; problems of files are reported, never raised.
    `cache`: reuse and update the fingerprint cache (cache_file); off by default for library
    callers, on for the command (`--no-cache` turns it off). Cross-file checks always run on
    all images, cached or not. `fast`: no pixel decoding (module docstring); the report then has
    "mode": "fast" and "skipped_checks", and its own cache file."""
    entries = load_source(Path(source))
    quiet_bomb_warnings()
    pairs, orphans, problems = [], [], []
    for entry in entries:
        p, o, folder_problems = _list_folder(entry)
        pairs += p
        orphans += [(entry.id, c) for c in o]
        problems += [(entry.id, x) for x in folder_problems]
    path = None
    if cache:
        try:
            path = cache_file([e.root for e in entries], fast=fast)
        except RuntimeError:  # no home folder to put it in (HOME unset, no passwd entry): no cache
            path = None
    loaded = load_cache(path) if path else None
    reused, fresh = _run_all(pairs, {e.id: e for e in entries}, min_size, max_pixels,
                             workers or os.cpu_count() or 1, progress, loaded, fast)
    saved = bool(path) and (fresh != loaded) and save_cache(path, fresh)
    by_path = {str(p.image): p.dataset for p in pairs}
    for pair in pairs:
        problems += [(pair.dataset, x) for x in (*pair.info.problems, *pair.caption_problems)]
    problems += [(ds, Problem("caption_without_image", str(c), f"no image with the stem '{c.stem}'"))
                 for ds, c in orphans]
    problems += [(by_path[x.path], x) for x in exact_duplicates(pairs) + near_duplicates(pairs)]
    report = build_report(source=Path(source), entries=entries, pairs=pairs, problems=problems, min_size=min_size,
                          resolution=resolution, batch=batch, max_pixels=max_pixels)
    report["cache"] = {"enabled": bool(path), "file": str(path) if path else None, "reused": reused if path else 0,
                       "saved": saved}
    if fast:  # only then: a full check's report is unchanged (absent "mode" means every check ran)
        report["mode"] = "fast"
        report["skipped_checks"] = list(SKIPPED_CHECKS)
    return report
