"""Samples grid opening time (target: 50 prompts x 20 checkpoints in <= 1 s with a warm cache).

    python bench/samples_grid.py [--prompts 50] [--checkpoints 20] [--px 256] [--repeats 3] [--json OUT]

Builds a synthetic run folder (prompt_set.json; samples/teacher and samples/iter_<N>, one PNG per
prompt with noise so PNG decoding is not trivial, and a meta.json each), then opens it in the
Samples panel and measures set_run() -> every cell has its thumbnail (grid_filled) -> the visible
cells painted (one grab of the panel):

cold  empty thumbnail cache: every sample is decoded and scaled in pool workers and written to the cache
warm  a new panel and cache object on the same cache folder (what reopening the app does): only
      the cached thumbnails are read. Median of --repeats.

Offscreen Qt unless a display is set. Cost: ~10-30 s (building the folder dominates). Timings are
of this machine only: record it next to the numbers.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
if not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY") or os.name == "nt"):
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import numpy as np  # noqa: E402
from PySide6.QtCore import QEventLoop, QThreadPool, QTimer  # noqa: E402
from PySide6.QtGui import QImage  # noqa: E402
from PySide6.QtWidgets import QApplication  # noqa: E402

TARGET_WARM_S = 1.0


def build_run(root: Path, prompts: int, checkpoints: int, px: int) -> Path:
    """A run folder with `checkpoints` sample folders (teacher + iter_100, iter_200, ...)."""
    run = root / "bench_run"
    items = [{"id": f"prompt-{i:03d}", "topic": "bench", "prompt": f"synthetic prompt {i}"} for i in range(prompts)]
    run.mkdir(parents=True)
    (run / "prompt_set.json").write_text(json.dumps({"prompt_set": "bench", "version": "v1", "resolution": [px, px],
                                                     "seed": 0, "sampler": "ddim", "steps": 50, "cfg": 7.5,
                                                     "items": items}))
    rng = np.random.default_rng(0)
    names = ["teacher"] + [f"iter_{100 * (i + 1)}" for i in range(checkpoints - 1)]
    for name in names:
        folder = run / "samples" / name
        folder.mkdir(parents=True)
        for it in items:
            pixels = np.ascontiguousarray(rng.integers(0, 256, (px, px, 3), dtype=np.uint8))
            QImage(pixels.data, px, px, 3 * px, QImage.Format_RGB888).save(str(folder / f"{it['id']}.png"))
        meta = {"source": name, "model": "teacher" if name == "teacher" else "student", "prompt_set": "bench",
                "prompt_set_version": "v1", "sampler": "ddim", "steps": 50, "cfg": 7.5, "resolution": [px, px],
                "items": {it["id"]: {"prompt": it["prompt"], "seed": i, "file": f"{it['id']}.png"}
                          for i, it in enumerate(items)}}
        (folder / "meta.json").write_text(json.dumps(meta))
    return run


def open_once(run: Path, cache_dir: Path) -> tuple[float, int, int]:
    """(seconds to a filled and painted grid, source decodes, cache hits)."""
    from app.panels.samples import SamplesPanel
    from app.models.thumbs import ThumbCache

    panel = SamplesPanel(cache=ThumbCache(cache_dir))
    panel.resize(1280, 760)
    panel.show()
    loop = QEventLoop()
    panel.grid_filled.connect(loop.quit)
    QTimer.singleShot(120_000, loop.quit)
    t0 = time.perf_counter()
    panel.set_run(run)
    loop.exec()
    panel.grab()  # paints the visible cells
    elapsed = time.perf_counter() - t0
    if not panel.model.filled() or panel.model.thumb_count() == 0:
        raise SystemExit("the grid did not fill within 120 s")
    cache = panel.thumbs.cache
    result = (elapsed, cache.decodes, cache.hits)
    QThreadPool.globalInstance().waitForDone()
    panel.close()
    panel.deleteLater()
    return result


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--prompts", type=int, default=50)
    p.add_argument("--checkpoints", type=int, default=20, help="columns, the teacher included")
    p.add_argument("--px", type=int, default=256, help="side of each sample PNG")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    app = QApplication.instance() or QApplication([])
    with tempfile.TemporaryDirectory(prefix="dmad-bench-grid-") as tmp:
        t = time.perf_counter()
        run = build_run(Path(tmp), args.prompts, args.checkpoints, args.px)
        build_s = time.perf_counter() - t
        cache = Path(tmp) / "thumbs"
        cold = open_once(run, cache)
        warm = [open_once(run, cache) for _ in range(args.repeats)]
    warm_s = statistics.median(w[0] for w in warm)
    n = args.prompts * args.checkpoints
    rows = [("cold (empty cache)", cold[0], cold[1], cold[2], ""),
            (f"warm (median of {args.repeats})", warm_s, warm[0][1], warm[0][2],
             "PASS" if warm_s <= TARGET_WARM_S else "FAIL")]
    machine = (f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, {platform.system()} "
               f"{platform.release()}, Python {platform.python_version()}, Qt platform {app.platformName()}")
    print(f"Samples grid: {args.prompts} prompts x {args.checkpoints} checkpoints = {n} PNGs of {args.px} px "
          f"(built in {build_s:.1f} s); {machine}")
    print(f"| open | time to filled grid (s) | decodes | cache hits | target <= {TARGET_WARM_S:g} s warm |")
    print("|---|---|---|---|---|")
    for name, s, dec, hits, verdict in rows:
        print(f"| {name} | {s:.3f} | {dec} | {hits} | {verdict} |")
    if args.json:
        args.json.write_text(json.dumps({"prompts": args.prompts, "checkpoints": args.checkpoints, "px": args.px,
                                         "cold_s": cold[0], "warm_s": warm_s, "warm_all_s": [w[0] for w in warm],
                                         "machine": machine}, indent=2))
    return 0 if warm_s <= TARGET_WARM_S else 1


if __name__ == "__main__":
    sys.exit(main())
