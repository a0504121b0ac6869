"""`dmad check-data` speed vs a naive loop: on one generated folder of N captioned
images (128-512 px, mixed PNG/JPEG, 6% with problems), time (a) a loop that fully decodes every
image with PIL (Image.open().convert("RGB")) and reads every caption, (b) dmad.data.check.check_source
with the default workers and an empty fingerprint cache (cold: every file read and decoded, as a
first check), (c) the same again (warm: the files unchanged, results from the cache, as a re-check),
(d) check_source(fast=True) (`dmad check-data --fast`: header and file structure only, no pixel
decoding, the near-constant and near-duplicate checks skipped) with its own empty cache (cold).
The cache goes to a temporary folder ($DMAD_CACHE_DIR), never the user's. Targets: >= 5x faster
than (a), and <= 10 s for 10,000 images; reported for cold, warm and fast separately.

    python bench/check_data.py [--quick] [-n N] [--workers N] [--keep DIR] [--json OUT]
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dmad.data.check import check_source  # noqa: E402


def make_folder(root: Path, n: int, seed: int = 0, px: tuple[int, int] = (128, 512)) -> None:
    """n images with captions; 3 in every 50 have a problem (truncated, no caption, empty caption)."""
    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    grain = rng.normal(0, 6, (px[1], px[1], 3)).astype(np.float32)  # photo-like: smooth shapes + mild grain
    for i in range(n):
        w, h = (int(x) for x in rng.integers(px[0], px[1] + 1, 2))
        coarse = Image.fromarray(rng.integers(0, 255, (6, 6, 3), dtype=np.uint8), "RGB").resize((w, h), Image.BICUBIC)
        arr = (np.asarray(coarse, dtype=np.float32) + grain[:h, :w]).clip(0, 255).astype(np.uint8)
        ext = ".jpg" if i % 2 else ".png"
        path = root / f"img_{i:05d}{ext}"
        Image.fromarray(arr, "RGB").save(path, **({"quality": 90} if ext == ".jpg" else {}))
        kind = i % 50
        if kind == 7:
            path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
        if kind != 13:
            caption = "" if kind == 21 else f"image number {i} of a generated benchmark set"
            path.with_suffix(".txt").write_text(caption, encoding="utf-8")


def cpu_seconds() -> float:
    """User + system CPU of this process and its reaped children (the forked workers): unlike wall
    time, it does not grow when other programs share the cores."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def naive(root: Path) -> float:
    t = time.perf_counter()
    for path in sorted(root.iterdir()):
        if path.suffix == ".txt":
            path.read_text(encoding="utf-8")
            continue
        try:
            with Image.open(path) as im:
                im.convert("RGB")
        except OSError:
            pass
    return time.perf_counter() - t


def ours(root: Path, workers: int | None, fast: bool = False) -> tuple[float, float, dict]:
    c, t = cpu_seconds(), time.perf_counter()
    report = check_source(root, min_size=64, resolution=512, batch=4, workers=workers, cache=True, fast=fast)
    return time.perf_counter() - t, cpu_seconds() - c, report


def _row(label: str, images: int, t_naive: float, t: float, cpu: float) -> dict:
    speedup = t_naive / t
    per10k = t * 10_000 / max(1, images)
    print(f"{label:>6} {images:>8} {t_naive:>9.2f} {t:>8.2f} {cpu:>7.2f} {speedup:>8.1f}x   "
          f">= 5x: {'met' if speedup >= 5 else 'NOT met'}; <= 10 s per 10,000: {per10k:.1f} s, "
          f"{'met' if per10k <= 10 else 'NOT met'}")
    return {"s": t, "cpu_s": cpu, "speedup": speedup, "per_10k_s": per10k}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="1,000 images instead of 10,000")
    ap.add_argument("-n", type=int, help="number of images (overrides --quick)")
    ap.add_argument("--workers", type=int, help="check_source workers (default: its own, the CPU count)")
    ap.add_argument("--px", type=int, nargs=2, default=(128, 512), metavar=("MIN", "MAX"),
                    help="image sides drawn from MIN..MAX pixels (default 128 512, the sizes of docs/benchmarks.md)")
    ap.add_argument("--keep", metavar="DIR", help="build (or reuse) the folder here instead of a temp folder")
    ap.add_argument("--json", metavar="OUT", help="also write the results as JSON")
    args = ap.parse_args(argv)
    n = args.n or (1000 if args.quick else 10_000)
    root = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="dmad-bench-check-")) / "data"
    cache = Path(tempfile.mkdtemp(prefix="dmad-bench-check-cache-"))
    try:
        if not root.exists() or not any(root.iterdir()):
            t = time.perf_counter()
            make_folder(root, n, px=tuple(args.px))
            print(f"built {n} images in {time.perf_counter() - t:.1f} s: {root}", file=sys.stderr)
        naive(root)  # warm the page cache so both timings read from memory
        c = cpu_seconds()
        t_naive = naive(root)
        c_naive = cpu_seconds() - c
        os.environ["DMAD_CACHE_DIR"] = str(cache)  # an empty cache: the first check is cold
        load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
        t_cold, c_cold, report = ours(root, args.workers)
        t_warm, c_warm, warm = ours(root, args.workers)
        t_fast, c_fast, fast = ours(root, args.workers, fast=True)  # its own cache file: empty, cold
        load_after = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
        images = report["summary"]["images"]
        if warm["cache"]["reused"] != images or warm["problems"] != report["problems"]:
            print("warm run did not reuse every image, or found other problems", file=sys.stderr)
            return 1
        skipped = set(fast["skipped_checks"])  # the same files and categories (the details differ)
        if fast["cache"]["reused"] or [(p["path"], p["category"]) for p in fast["problems"]] != \
                [(p["path"], p["category"]) for p in report["problems"] if p["category"] not in skipped]:
            print("the fast run was not cold, or found other problems than the full check (skipped checks aside)",
                  file=sys.stderr)
            return 1
        print(f"{'run':>6} {'images':>8} {'naive s':>9} {'ours s':>8} {'CPU s':>7} {'speed-up':>9}   "
              f"cores {os.cpu_count()}, load {load:.2f} before the checks, {load_after:.2f} after; "
              f"naive CPU {c_naive:.2f} s")
        cold = _row("cold", images, t_naive, t_cold, c_cold)
        hot = _row("warm", images, t_naive, t_warm, c_warm)
        quick = _row("fast", images, t_naive, t_fast, c_fast)
        print(f"CPU per image: naive {c_naive / images * 1e3:.3f} ms, cold {c_cold / images * 1e3:.3f} ms, "
              f"fast {c_fast / images * 1e3:.3f} ms (fast skips: {', '.join(fast['skipped_checks'])})")
        print(f"problems found: { {k: v for k, v in report['counts'].items() if v} }")
        if args.json:
            Path(args.json).write_text(json.dumps({
                "images": images, "naive_s": t_naive, "naive_cpu_s": c_naive, "ours_s": t_cold,
                "speedup": cold["speedup"], "cold_s": t_cold, "cold_cpu_s": c_cold, "cold_speedup": cold["speedup"],
                "warm_s": t_warm, "warm_cpu_s": c_warm, "warm_speedup": hot["speedup"],
                "fast_s": t_fast, "fast_cpu_s": c_fast, "fast_speedup": quick["speedup"],
                "fast_per_10k_s": quick["per_10k_s"], "fast_skipped_checks": fast["skipped_checks"],
                "fast_counts": {k: v for k, v in fast["counts"].items() if v},
                "counts": {k: v for k, v in report["counts"].items() if v}, "cpu_count": os.cpu_count(),
                "load_before": load, "load_after": load_after,
                "load_avg": list(os.getloadavg()) if hasattr(os, "getloadavg") else None}, indent=2))
    finally:
        shutil.rmtree(cache, ignore_errors=True)
        if not args.keep:
            shutil.rmtree(root.parent, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
