"""`dmad sample`: render a run's checkpoint (or its teacher) again, any time after training.

The student samples with the timesteps stored in its checkpoint's training_state.json, never the
teacher's step count or the current config; with the EMA weights when the run kept an EMA (as
the training's own samples did). Each item's noise comes from a CPU generator seeded with its
prompt-set seed, and deterministic algorithms are switched on (for the command only), so the same
checkpoint and prompt set give byte-identical PNGs on a CPU (and, where torch offers deterministic
kernels, on a GPU).

Output never replaces an existing folder: <out>/<iter_N|teacher>/ when free, else the first free
sibling <iter_N|teacher>-r2, -r3, ... (the training's own samples stay as they were rendered).
--sweep renders one prompt over a grid of settings into <out>/sweep_<iter_N|teacher>_<id>.png
plus a .json beside it (the same -rK rule).
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from dmad.contract.diskspace import complete_or_absent, reporting_disk_full
from dmad.contract.jsonfile import check_output_folder, check_path, printable
from dmad.errors import UserInputError

SWEEP_KEYS = {"steps": int, "cfg": float}
# Each cell is a full render: 16 values per key and 64 cells keep a sweep to minutes, not days.
MAX_SWEEP_VALUES, MAX_SWEEP_CELLS = 16, 64
# ASCII digits only: str.isdigit also accepts '²' and '١', which int() then refuses or reads; 12
# digits stay far below int()'s 4300-digit limit.
ITERATION = re.compile(r"[0-9]{1,12}")


@dataclass(frozen=True)
class Target:
    name: str                      # "teacher" | "iter_<N>": the output folder's name
    checkpoint: Optional[Path]     # None for the teacher
    timesteps: Optional[list[int]]  # the student's, from training_state.json


def open_run(run: str):
    """The run folder, or UserInputError when `run` is not one (no config.json)."""
    from dmad.contract.runs import RunFolder

    folder = RunFolder(check_path(run, "--run").expanduser().resolve())
    if not folder.path.is_dir():
        raise UserInputError(f"--run {printable(str(run))}: run folder not found")
    if not folder.config_json.is_file():
        raise UserInputError(f"--run {printable(str(run))}: not a run folder (no config.json)")
    return folder


def resolve_target(folder, spec: str, cfg) -> Target:
    """--checkpoint latest | teacher | N -> what to render. latest follows the rule resume and export
    share (RunFolder.checkpoints_from_latest): a damaged checkpoint, or one whose student holds NaN
    or Inf, is passed over for an older one with a warning; a named one is used or refused."""
    from dmad.models.checkpoint import read_training_state

    if spec == "teacher":
        return Target("teacher", None, None)
    available = folder.list_checkpoints()
    names = ", ".join(str(i) for i, _ in available) or "none"
    if spec == "latest":
        candidates = folder.checkpoints_from_latest()
        if not candidates:
            raise UserInputError(f"--checkpoint latest: no complete checkpoint in {folder.checkpoints_dir}")
    elif ITERATION.fullmatch(spec):
        candidates = [(i, p) for i, p in available if i == int(spec)]  # inside the run: no link to another one
        if not candidates:
            raise UserInputError(f"--checkpoint {spec}: no checkpoint iter_{int(spec)} in {folder.checkpoints_dir} "
                                 f"(available: {names})")
    else:
        raise UserInputError(f"--checkpoint {printable(spec)[:40]!r}: expected latest, teacher or an iteration number "
                             f"(available: {names})")
    it, path = usable_checkpoint(candidates, cfg, spec)
    return Target(f"iter_{it}", path, list(read_training_state(path).student_timesteps))


def usable_checkpoint(candidates: list, cfg, spec: str) -> tuple[int, Path]:
    """(iteration, folder) of the checkpoint `dmad sample` or `dmad export` reads: the first of
    `candidates` whose files verify and whose student holds no NaN or Inf (dmad.models.checkpoint.
    pick_checkpoint); each passed over is a warning line, and a named one (`spec` not latest)
    that fails is one line, exit 2."""
    from dmad.errors import CheckpointUnusable
    from dmad.methods import method_unit
    from dmad.models.checkpoint import pick_checkpoint

    try:
        picked = pick_checkpoint(candidates, method_unit(cfg.distillation.method).layout(cfg.identity),
                                 finite=("student",), named=spec != "latest")
    except CheckpointUnusable as e:
        raise UserInputError(f"--checkpoint {spec}: {e}") from None
    for reason in picked.skipped:
        print(f"dmad: warning: passed over a damaged checkpoint: {' '.join(reason.split())}", file=sys.stderr,
              flush=True)
    return picked.iteration, picked.path


def parse_sweep(tokens: list[str]) -> list[tuple[str, list]]:
    """["steps=1,2,4", "cfg=1,3"] -> [("steps", [1, 2, 4]), ("cfg", [1.0, 3.0])]: rows, then columns."""
    out: list[tuple[str, list]] = []
    for tok in tokens:
        key, eq, values = tok.partition("=")
        shown = f"--sweep {printable(tok)[:60]!r}"
        if not eq or key not in SWEEP_KEYS:
            raise UserInputError(f"{shown}: expected KEY=V1,V2,... with KEY one of {', '.join(SWEEP_KEYS)}")
        if any(k == key for k, _ in out):
            raise UserInputError(f"--sweep: {key} is given twice")
        if values.count(",") >= MAX_SWEEP_VALUES:
            raise UserInputError(f"--sweep {key}: {values.count(',') + 1} values (at most {MAX_SWEEP_VALUES} per key)")
        out.append((key, _sweep_values(key, values, shown)))
    if not 1 <= len(out) <= 2:
        raise UserInputError("--sweep: give one or two of KEY=V1,V2,... (rows, then columns)")
    cells = math.prod(len(v) for _, v in out)
    if cells > MAX_SWEEP_CELLS:
        raise UserInputError(f"--sweep: {' x '.join(str(len(v)) for _, v in out)} = {cells} images "
                             f"(at most {MAX_SWEEP_CELLS})")
    return out


def _sweep_values(key: str, values: str, shown: str) -> list:
    """'1,2,4' -> [1, 2, 4] for steps (ASCII integers in [1, 1000]), floats in [0, 100] for cfg."""
    parts = values.split(",")
    if key == "steps":
        if not all(ITERATION.fullmatch(v.strip()) for v in parts):
            raise UserInputError(f"{shown}: steps values must be integers, separated by commas")
        vals: list = [int(v) for v in parts]
        if not all(1 <= v <= 1000 for v in vals):
            raise UserInputError(f"{shown}: steps must be in [1, 1000]")
        return vals
    try:
        vals = [float(v) for v in parts]
    except ValueError:
        raise UserInputError(f"{shown}: cfg values must be numbers, separated by commas") from None
    if not all(0 <= v <= 100 for v in vals):  # NaN fails this too
        raise UserInputError(f"{shown}: cfg must be in [0, 100]")
    return vals


def free_path(base: Path, name: str, suffix: str = "") -> Path:
    """base/name<suffix>, or the first free base/name-r2<suffix>, -r3, ...: never an existing one."""
    path, k = base / f"{name}{suffix}", 2
    while path.exists():
        path, k = base / f"{name}-r{k}{suffix}", k + 1
    return path


def png_bytes(images: int, width: int, height: int) -> int:
    """About the most `images` PNGs of width x height and their meta.json take: RGB, uncompressed."""
    return images * (width * height * 3 + 1024) + 4096


def student_timesteps(trained: list[int], steps: int, num_train_timesteps: int) -> list[int]:
    """The trained timesteps at their own count; other counts (a sweep) are spaced as the config's
    default ones are: T-1, T-1 - T/k, ..."""
    if steps == len(trained):
        return list(trained)
    return [num_train_timesteps - 1 - i * num_train_timesteps // steps for i in range(steps)]


@contextlib.contextmanager
def deterministic(device):
    """Deterministic kernels where torch has them (warn, not fail, where it has none), for the block
    only: torch's switches are process-wide, and main_sample also runs inside other processes (the
    tests call the CLI's main() in process; a training run after it must keep its own setting)."""
    import torch

    before = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
              torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic)
    if device.type == "cuda":
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # cuBLAS needs it for determinism
        torch.backends.cudnn.benchmark = False
        torch.backends.cudnn.deterministic = True
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])
        torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = before[2], before[3]


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def main_sample(*, run: str | Path, checkpoint: str = "latest", prompt_set: Optional[str | Path] = None,
                out: Optional[str | Path] = None, sweep: Optional[Sequence[str]] = None,
                prompt_id: Optional[str] = None, device: str = "auto", one_off=None) -> int:
    """The `dmad sample` command. stdout: one `samples` event (dmad.contract.events), with the render time
    (models loaded, so loading is not counted); stderr: a human line. Input problems raise UserInputError before any model is loaded.
    `checkpoint`: latest | teacher | N; `prompt_set` None: the run's prompt_set.json; `out` None:
    <run>/samples; `sweep`: KEY=V1,V2,... items (--sweep); `device`: auto | cpu | cuda; `one_off`: a
    dmad.sample.one_off.OneOff (--prompt: the Playground's request) instead of the prompt set."""
    from dmad.contract.config import load_config
    from dmad.contract.prompts import load_prompt_set

    folder = open_run(run)
    cfg = load_config(folder.config_json)
    target = resolve_target(folder, checkpoint, cfg)
    ps = load_prompt_set(prompt_set or folder.prompt_set_json)
    sweeps = parse_sweep(sweep) if sweep else None
    item = None
    if sweeps is not None:
        item = next((it for it in ps.items if it.id == prompt_id), None) if prompt_id else ps.items[0]
        if item is None:
            raise UserInputError(f"--prompt-id {prompt_id!r}: not in prompt set {ps.name}-{ps.version} "
                                 f"(ids: {', '.join(it.id for it in ps.items)})")
    elif prompt_id:
        raise UserInputError("--prompt-id is for --sweep (without it every prompt is rendered)")
    if one_off is not None:
        from dmad.sample.one_off import ONE_OFF, check_one_off

        if sweeps is not None:
            raise UserInputError("--prompt renders one request; --sweep renders the prompt set's prompts: use one")
        check_one_off(one_off)
        if not out:
            folder.check_confined()
        out = Path(out).expanduser().resolve() if out else folder.samples_dir / ONE_OFF
        check_output_folder(out, "--out", new=False)
        return _main_one_off(cfg, target, ps, one_off, out, device)
    if not out:  # into the run folder: never through a link that leaves it
        folder.check_confined()
    out = Path(out).expanduser().resolve() if out else folder.samples_dir
    check_output_folder(out, "--out", new=False)  # before the models load

    from dmad.contract.events import make_event

    device = _device(device)
    with deterministic(device):
        teacher, schedule, student, ema = _load_models(cfg, target, device)
        t0 = time.perf_counter()
        images = len(ps.items) if sweeps is None else math.prod(len(v) for _, v in sweeps)
        full = reporting_disk_full(f"the samples of {target.name}", out, png_bytes(images, ps.width, ps.height))
        if sweeps is None:
            with full:
                paths, dest = _render_folder(out, target, ps, teacher, student, ema, device, schedule,
                                             cfg.distillation.method)
            n = len(paths)
            event = make_event("samples", _iter(target), folder=str(dest), paths=paths, model=_model(target),
                               checkpoint=target.name, ema=ema)
        else:
            with full:
                dest, grid_json = _render_sweep(out, target, ps, item, sweeps, teacher, student, device, schedule,
                                                cfg.distillation.method)
            n = len(grid_json["cells"])
            event = make_event("samples", _iter(target), folder=str(dest.parent), paths=[str(dest)], model=_model(target),
                               checkpoint=target.name, sweep=str(dest.with_suffix(".json")))
        sec = time.perf_counter() - t0
        event.data.update(images=n, render_s=round(sec, 4), s_per_image=round(sec / max(n, 1), 4), device=str(device))
        print(event.to_line(), flush=True)
        _say(f"dmad sample: {n} image{'s' if n != 1 else ''} of {target.name} in {sec:.2f} s "
             f"({sec / max(n, 1):.3f} s/image) -> {dest}")
        return 0


def _device(name: str):
    import torch

    if name == "cuda" and not torch.cuda.is_available():
        raise UserInputError("--device cuda: this machine has no CUDA device torch can use")
    return torch.device(name if name != "auto" else ("cuda" if torch.cuda.is_available() else "cpu"))


def _load_models(cfg, target: Target, device):
    """(teacher, schedule, student or None, ema) on `device`, as training saw them."""
    import torch

    from dmad.models.checkpoint import load_student
    from dmad.models.teacher import load_identity_teacher

    ident = cfg.identity
    teacher = load_identity_teacher(ident, dtype=torch.float32)
    for m in teacher.networks():
        m.to(device)
    # as in training: the guidance a guidance-embedding student was given; Flux's shift at the run's resolution
    teacher.family.guidance = cfg.distillation.real_guidance_scale
    schedule = teacher.family.schedule(teacher.scheduler, cfg.resources.resolution)
    student = ema = None
    if target.checkpoint is not None:
        student, ema = load_student(teacher, ident, target.checkpoint)
        student.to(device)
    return teacher, schedule, student, ema


def _main_one_off(cfg, target: Target, ps, req, out: Path, device: str) -> int:
    """--prompt: the request on the checkpoint (and the teacher) into <run>/samples/oneoff."""
    from dmad.contract.events import make_event
    from dmad.sample.one_off import render_one_off

    device = _device(device)
    with deterministic(device):
        teacher, schedule, student, ema = _load_models(cfg, target, device)
        t0 = time.perf_counter()
        n = (student is not None) + (req.teacher or student is None)
        with reporting_disk_full("the one-off samples", out, png_bytes(n, *(req.size or (ps.width, ps.height)))):
            paths = render_one_off(out, target=target, ps=ps, req=req, teacher=teacher, student=student,
                                   ema=bool(ema), device=device, schedule=schedule, method=cfg.distillation.method)
        sec = time.perf_counter() - t0
        event = make_event("samples", _iter(target), folder=str(out), paths=paths, model=_model(target),
                           checkpoint=target.name, ema=ema, one_off=True, prompt=req.prompt,
                           seed=json.loads(Path(paths[0]).with_suffix(".json").read_text(encoding="utf-8"))["seed"],
                           images=len(paths), render_s=round(sec, 4), device=str(device))
        print(event.to_line(), flush=True)
        _say(f"dmad sample: {len(paths)} one-off image{'s' if len(paths) != 1 else ''} of {target.name} in "
             f"{sec:.2f} s ({sec / len(paths):.3f} s/image) -> {out}")
        return 0


def _iter(target: Target) -> Optional[int]:
    return int(target.name[5:]) if target.checkpoint is not None else None


def _model(target: Target) -> str:
    return "student" if target.checkpoint is not None else "teacher"


def _encoder(teacher, device):
    return lambda prompts: teacher.family.encode(teacher.modules, prompts, device)


def _render_folder(out: Path, target: Target, ps, teacher, student, ema, device, schedule,
                   method: str) -> tuple[list[str], Path]:
    import torch

    from dmad.models.checkpoint import student_weight_files
    from dmad.sample.render import library_versions, render_student_samples, render_teacher_samples, sha256_files

    dest = free_path(out, target.name)
    if target.checkpoint is None:
        return render_teacher_samples(dest, teacher=teacher, prompt_set=ps, versions=library_versions(),
                                      device=device), dest
    paths = render_student_samples(
        dest, student=student, vae=teacher.vae, encode=_encoder(teacher, device), family=teacher.family,
        schedule=schedule, timesteps=target.timesteps, prompt_set=ps,
        iteration=_iter(target), device=device, dtype=torch.float32, versions=library_versions(),
        checkpoint=target.name, weights_sha256=sha256_files(student_weight_files(target.checkpoint)), ema=ema,
        method=method, teacher_loras=teacher.loras)
    return paths, dest


def _render_sweep(out: Path, target: Target, ps, item, sweep, teacher, student, device,
                  schedule, method: str) -> tuple[Path, dict]:
    """Every combination of the sweep values for one prompt; a labelled grid PNG and its JSON."""
    from dmad.contract.prompts import item_seed
    from dmad.sample.render import (library_versions, make_scheduler, provenance, sampler_name, sd_pipeline,
                               student_png, teacher_png)
    from dmad.sample.grid import labelled_grid

    import torch

    seed, size = item_seed(ps, item), (ps.width, ps.height)
    rows = sweep[0]
    cols = sweep[1] if len(sweep) > 1 else ("", [None])
    encode = _encoder(teacher, device)
    fam = teacher.family
    pipe = sd_pipeline(teacher, make_scheduler(ps.sampler, teacher.scheduler.config, fam)) if student is None else None
    cells, images = [], []
    for rv in rows[1]:
        for cv in cols[1]:
            setting = {rows[0]: rv, **({cols[0]: cv} if cols[0] else {})}
            if student is None:
                steps, cfg = setting.get("steps", ps.steps), setting.get("cfg", ps.cfg)
                png = teacher_png(pipe, prompt=item.prompt, negative_prompt=item.negative_prompt, seed=seed,
                                  steps=steps, cfg=cfg, size=size, device=device, family=fam)
                cell = {"steps": steps, "cfg": cfg, "sampler": sampler_name(ps.sampler, fam)}
            else:
                ts = student_timesteps(target.timesteps, setting.get("steps", len(target.timesteps)),
                                       schedule.num_train_timesteps)
                cfg = setting.get("cfg")
                uncond = encode([item.negative_prompt or ""]).to(device) if cfg not in (None, 1.0) else None
                png = student_png(student=student, vae=teacher.vae, emb=encode([item.prompt]).to(device),
                                  schedule=schedule, timesteps=ts, seed=seed, device=device, dtype=torch.float32,
                                  cfg=cfg, uncond=uncond, size=size, family=fam)
                cell = {"steps": len(ts), "timesteps": ts, "cfg": cfg}
            cells.append({**setting, **cell})
            images.append(png)
    dest = free_path(out, f"sweep_{target.name}_{item.id}", ".png")
    doc = {"checkpoint": target.name, "model": _model(target),
           "method": method if target.checkpoint is not None else None, "prompt_set": ps.name, "prompt_set_version": ps.version,
           "prompt_id": item.id, "prompt": item.prompt, "seed": seed, "resolution": [ps.width, ps.height],
           "rows": {"key": rows[0], "values": rows[1]},
           "columns": {"key": cols[0], "values": cols[1]} if cols[0] else None,
           "cells": cells, **provenance(device, target.name, None, library_versions(), teacher.loras)}
    from dmad.contract.runs import atomic_write_json

    with complete_or_absent(dest), complete_or_absent(dest.with_suffix(".json")):  # both files or neither
        dest.parent.mkdir(parents=True, exist_ok=True)
        labelled_grid(dest, images, [f"{rows[0]}={v}" for v in rows[1]],
                      [f"{cols[0]}={v}" for v in cols[1]] if cols[0] else [""], title=f"{target.name} · {item.id}")
        atomic_write_json(dest.with_suffix(".json"), doc)
    return dest, doc
