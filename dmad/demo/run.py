"""`dmad demo`: the first-run experience, on any machine, with nothing to download.

1. Makes sure the shapes dataset is there (resources/demo/shapes; regenerated when missing or
   incomplete, into a user cache folder when resources/ is read-only, e.g. in a bundle).
2. Runs the default distillation (resources/configs/demo.json, the app's default config) through
   `dmad train` in a subprocess, showing one progress line per logged iteration.
3. Writes a grid (prompts x [teacher, checkpoints...]) into samples/grid.png from the images
   the run itself rendered: the teacher's reference samples (its 50-step sampler + CFG, before
   iteration 1) in samples/teacher/ and the student's at every checkpoint.
4. Prints where to look.
"""
from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Callable, Optional, Sequence

from dmad.errors import RunFailed, UserInputError

DATASET_SIZE, DATASET_SEED, DATASET_PX = 512, 0, 64
# Half the captions leave attributes out, as the teacher learnt at the end of its training: DMAD
# distils the teacher on the data's prompts, and a student that never met "a red shape" drew it
# far from the teacher (tuning set, 2026-12-06: docs/benchmarks.md).
DATASET_UNDER_SPECIFIED = 0.5


def _say(msg: str) -> None:
    print(msg, flush=True)


def dataset_complete(folder: Path, n: int = DATASET_SIZE, seed: int = DATASET_SEED,
                     under_specified_share: float = DATASET_UNDER_SPECIFIED) -> bool:
    from dmad.demo.shapes import GENERATOR, image_name

    try:
        meta = json.loads((folder / "dataset.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    if not isinstance(meta, dict) or meta.get("generator") != GENERATOR or meta.get("count") != n \
            or meta.get("seed") != seed or meta.get("under_specified_share", 0.0) != under_specified_share:
        return False
    return all((folder / f"{image_name(i)}{ext}").is_file() for i in range(n) for ext in (".png", ".txt"))


def user_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "dmad-studio"


def ensure_dataset(shipped: Path) -> Optional[Path]:
    """None when the shipped dataset is complete (or was repaired in place); else the cache
    folder the dataset was generated into."""
    from dmad.demo.shapes import write_dataset

    if dataset_complete(shipped):
        return None
    try:
        _say(f"Generating the shapes dataset ({DATASET_SIZE} images) in {shipped} ...")
        write_dataset(shipped, DATASET_SIZE, DATASET_PX, DATASET_SEED, DATASET_UNDER_SPECIFIED)
        return None
    except OSError:
        cache = user_cache_dir() / "shapes"
        if not dataset_complete(cache):
            _say(f"{shipped} is not writable; generating the dataset in {cache} ...")
            write_dataset(cache, DATASET_SIZE, DATASET_PX, DATASET_SEED, DATASET_UNDER_SPECIFIED)
        return cache


def main_make_data(*, out: str | Path, style: str = "plain") -> int:
    """`dmad demo make-data --out DIR [--style S]`: the shipped shapes dataset (the same images'
    shapes and the same captions) drawn in a style: the real images of a user's style LoRA, which
    a distillation of teacher + that LoRA can give its GAN (identity.train_data_dir). DIR must not
    exist; it appears complete or not at all."""
    import shutil

    from dmad.contract.jsonfile import new_folder_and_temp
    from dmad.demo.shapes import STYLES, write_dataset

    if style not in STYLES:
        raise UserInputError(f"--style {style!r}: unknown style; known: {', '.join(STYLES)}")
    out, tmp = new_folder_and_temp(out, "--out", "the dataset")
    try:
        write_dataset(tmp, DATASET_SIZE, DATASET_PX, DATASET_SEED, DATASET_UNDER_SPECIFIED, style=style)
        os.replace(tmp, out)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise UserInputError(f"--out {out}: cannot write the dataset ({type(e).__name__}: {e.strerror or e})") from None
    _say(f"wrote {DATASET_SIZE} {style} shapes images with their captions to {out}")
    return 0


def _progress(line: str, state: dict) -> None:
    from dmad.contract.events import is_iteration_metric, parse_line
    from dmad.contract.runlog import health_summary

    ev = parse_line(line)
    if ev is None:
        return
    d = ev.data
    if is_iteration_metric(ev):
        total = d.get("max_train_steps") or "?"
        losses = "  ".join(f"{k} {d[k]:.4g}" for k in ("loss_dm", "loss_fake", "loss_gan_g", "loss_gan_d")
                           if isinstance(d.get(k), (int, float)))
        eta = d.get("eta_s")
        _say(f"  iter {ev.iter}/{total}  {losses}  {d.get('step_time_s', 0):.2f} s/it"
             + (f"  ETA {eta / 60:.1f} min" if isinstance(eta, (int, float)) else ""))
    elif ev.kind == "started":
        state["run_dir"] = d.get("run_dir")
        _say(f"Run folder: {d.get('run_dir')}")
    elif ev.kind == "checkpoint":
        _say(f"  checkpoint at iter {ev.iter}")
    elif ev.kind == "samples":
        _say(f"  {d.get('model', 'student')} samples: {d.get('folder')}")
    elif ev.kind == "health":
        _say(f"  health at iter {ev.iter}: {health_summary(d)}")
    elif ev.kind in ("warning", "error"):
        _say(f"  {ev.kind}: {d.get('message') or d.get('reason')}")



def run_demo(*, run_dir: Optional[str | Path] = None, overrides: Sequence[str] = (),
             on_run_dir: Optional[Callable[[Path], None]] = None) -> int:
    """`dmad demo`. `run_dir` None: a new dated folder under runs/; `overrides`: --set items for the
    demo config; `on_run_dir` is told the run folder as soon as preflight has fixed it (the command
    line puts a crash log there)."""
    from dmad.contract.config import load_config
    from dmad.contract.paths import engine_argv, resource
    from dmad.train.preflight import preflight

    config = resource("configs", "demo.json")
    overrides = list(overrides)
    cache = ensure_dataset(resource("demo", "shapes"))
    if cache is not None:
        overrides.append(f"identity.train_data_dir={json.dumps(str(cache))}")
    cfg = load_config(config, overrides)
    rd = Path(run_dir).expanduser().resolve() if run_dir else None
    pf = preflight(cfg, run_dir=rd, resume=None)
    if not pf.teacher_has_weights:
        raise UserInputError(f"the demo teacher in {cfg.identity.pretrained_model_name_or_path} has no weights; "
                             f"train it with 'dmad demo make-teacher --out DIR' and pass "
                             f"--set identity.pretrained_model_name_or_path=DIR")
    if on_run_dir is not None:
        on_run_dir(pf.run_dir)
    _say(f"DMAD demo: distilling the shapes teacher into a {cfg.distillation.student_steps}-step student "
         f"({cfg.optimization.max_train_steps} iterations, batch {cfg.resources.train_batch_size}, "
         f"{cfg.resources.resolution} px) ...")
    argv = engine_argv("train", "--config", str(config), "--run-dir", str(pf.run_dir))
    for item in overrides:
        argv += ["--set", item]
    t0 = time.time()
    code, err, stopped = _train(argv)
    if stopped:  # Ctrl+C or SIGTERM: the engine stopped (with a checkpoint) and has ended
        _say(f"Stopped. Run folder: {pf.run_dir} (its checkpoints are kept)")
        raise KeyboardInterrupt  # the command's interrupted exit (130)
    if code != 0:
        last = (err or "").strip().splitlines()[-1:] or [f"exit code {code}"]
        raise RunFailed(f"the demo distillation failed: {last[0]}")
    _say(f"Distilled in {(time.time() - t0) / 60:.1f} min.")
    grid = render_demo_outputs(pf.run_dir)
    _say("")
    _say(f"Done. Run folder: {pf.run_dir}")
    _say(f"  samples:   {pf.run_dir / 'samples'} (teacher/ and one folder per checkpoint)")
    _say(f"  grid:      {grid} (rows: prompts; columns: teacher, then each checkpoint)")
    _say(f"  metrics:   {pf.run_dir / 'metrics.csv'}")
    _say(f"  student:   {pf.run_dir / 'checkpoints'}")
    return 0


def _train(argv: list[str]) -> tuple[int, str, bool]:
    """The engine, showing its progress, until it has ended: (its exit code, its stderr, whether a
    SIGINT or SIGTERM to this command asked it to stop). Such a signal reaches the engine as a
    graceful stop (stops_passed_on) and the demo waits for it: it never leaves an engine training
    behind; an error here (a closed stdout) stops the engine too, and a SIGKILL kills it."""
    from dmad.train.children import die_with_parent_preexec, stops_passed_on

    state: dict = {}
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, encoding="utf-8",
                            preexec_fn=die_with_parent_preexec(os.getpid()))  # a SIGKILL here ends it too
    with stops_passed_on(proc) as received:
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                _progress(line, state)
            _, err = proc.communicate()
        finally:
            if proc.poll() is None:
                proc.terminate()  # the engine saves a checkpoint on SIGTERM
                proc.wait()
    return proc.returncode, err, bool(received)


def render_demo_outputs(run_dir: Path) -> Path:
    """The comparison grid of what the run rendered (the engine writes samples/teacher/ itself,
    once per run). Returns the grid path."""
    from dmad.contract.prompts import load_prompt_set
    from dmad.contract.runs import RunFolder

    folder = RunFolder(run_dir)
    ps = load_prompt_set(folder.prompt_set_json)
    return write_grid(folder.samples_dir, [item.id for item in ps.items], [item.prompt for item in ps.items],
                      title=f"{run_dir.name} · prompt set {ps.name} {ps.version} · {ps.width}x{ps.height}, "
                            f"seed {ps.seed}")


def write_grid(samples: Path, ids: list[str], prompts: list[str] | None = None, title: str = "") -> Path:
    """samples/grid.png: one row per prompt (labelled "id: prompt"), columns "teacher" then
    "iteration N" ascending, as the Samples panel shows them (dmad.sample.grid.labelled_grid);
    samples/grid.json says which image is in which cell (box: x, y, width, height)."""
    import re

    from dmad.contract.runs import atomic_write_json
    from dmad.sample.grid import labelled_grid

    cols = (["teacher"] if (samples / "teacher").is_dir() else []) + [
        p.name for p in sorted((d for d in samples.iterdir() if re.fullmatch(r"iter_\d+", d.name)),
                               key=lambda d: int(d.name[5:]))]
    first = next((samples / c / f"{i}.png" for c in cols for i in ids if (samples / c / f"{i}.png").is_file()), None)
    if first is None:
        raise RunFailed(f"no sample images under {samples}")
    blank = _blank_png(first)  # a missing image (a prompt added later) shows as a grey cell
    pngs = [(samples / c / f"{i}.png").read_bytes() if (samples / c / f"{i}.png").is_file() else blank
            for i in ids for c in cols]
    labels = [f"{i}: {p}" for i, p in zip(ids, prompts)] if prompts else list(ids)
    headers = ["teacher" if c == "teacher" else f"iteration {int(c[5:]):,}" for c in cols]
    out = samples / "grid.png"
    boxes = labelled_grid(out, pngs, labels, headers, title=title)
    atomic_write_json(samples / "grid.json", {
        "rows": ids, "columns": cols, "row_labels": labels, "column_labels": headers,
        "cells": [{"row": ids[r], "column": cols[c], "image": f"{cols[c]}/{ids[r]}.png", "box": list(box)}
                  for (r, c), box in sorted(boxes.items())]})
    return out


def _blank_png(like: Path) -> bytes:
    import io

    from PIL import Image

    with Image.open(like) as im:
        size = im.size
    buf = io.BytesIO()
    Image.new("RGB", size, (40, 40, 40)).save(buf, format="PNG")
    return buf.getvalue()
