"""`dmad sample --prompt`: one prompt of the user's on a checkpoint and, beside it, the teacher (the
app's Playground, on any run, finished or live).

The student renders at the steps and CFG asked (default: as trained, its own timesteps, no CFG);
the teacher with its own sampler, steps and CFG (the run's prompt set's), from the same initial
noise (the seed's), so the two images of a request are comparable. Both land in
<run>/samples/oneoff/ as <pair>-student.png / <pair>-teacher.png, each with a .json of its full
provenance (the request, the model, steps, timesteps, CFG, sampler, checkpoint and weight hashes,
library versions, device), written after its image: a listed .json always has its whole image.
`pair` is <checkpoint>-<date>-<time>[-k]; the app's history groups the two by it.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from dmad.contract.runlog import one_off_problem
from dmad.errors import UserInputError

ONE_OFF = "oneoff"  # the folder under samples/ (the live "Sample prompt…" writes there too)
MAX_SIDE = 4096
MAX_STEPS = 1000


@dataclass(frozen=True)
class OneOff:
    prompt: str
    negative_prompt: Optional[str] = None
    seed: Optional[int] = None            # None: the prompt set's base seed
    steps: Optional[int] = None           # the student's; None: its trained timesteps
    cfg: Optional[float] = None           # the student's; None or 1: plain, as trained
    size: Optional[tuple[int, int]] = None  # None: the prompt set's resolution
    teacher: bool = True                  # the teacher's image beside the student's


def parse_size(text: str) -> tuple[int, int]:
    """--size WxH: multiples of 8 from 8 to MAX_SIDE."""
    parts = text.lower().split("x")
    if len(parts) != 2 or not all(p.strip().isdigit() for p in parts):
        raise UserInputError(f"--size {text!r}: expected WIDTHxHEIGHT in pixels, e.g. 1024x1024")
    w, h = (int(p) for p in parts)
    if not all(8 <= v <= MAX_SIDE and v % 8 == 0 for v in (w, h)):
        raise UserInputError(f"--size {text}: each side must be a multiple of 8 from 8 to {MAX_SIDE}")
    return w, h


def check_one_off(req: OneOff) -> None:
    """One line for what cannot be rendered, before any model loads."""
    problem = one_off_problem(req.prompt, req.seed, "--prompt", "--seed") or (
        one_off_problem(req.negative_prompt, None, "--negative-prompt") if req.negative_prompt else None)
    if problem:
        raise UserInputError(problem)
    if req.steps is not None and not 1 <= req.steps <= MAX_STEPS:
        raise UserInputError(f"--steps {req.steps}: from 1 to {MAX_STEPS}")
    if req.cfg is not None and (not math.isfinite(req.cfg) or not 0 <= req.cfg <= 100):
        raise UserInputError(f"--cfg {req.cfg}: a number from 0 to 100 (1: no guidance)")


def one_off_prompt_set(ps, req: OneOff):
    """The run's prompt set with the request as its one item (its sampler, steps and CFG for the
    teacher), at the request's size, without health seeds (one image each)."""
    from dmad.contract.prompts import PromptItem

    item = PromptItem(id=ONE_OFF, topic="one-off prompt", prompt=req.prompt,
                      negative_prompt=req.negative_prompt or None, seed=req.seed)
    update = {"items": [item], "health_seeds": 0}
    if req.size is not None:
        update["resolution"] = list(req.size)
    return ps.model_copy(update=update)


def free_pair(folder: Path, stem: str) -> str:
    k, name = 1, stem
    while any((folder / f"{name}-{m}{ext}").exists() for m in ("student", "teacher") for ext in (".png", ".json")):
        k += 1
        name = f"{stem}-{k}"
    return name


def render_one_off(out: Path, *, target, ps, req: OneOff, teacher, student, ema: bool, device, schedule,
                   method: str) -> list[str]:
    """The request's images into `out` (samples/oneoff); returns their paths, student first."""
    import torch

    from dmad.contract.prompts import item_seed
    from dmad.contract.runs import atomic_write_bytes, atomic_write_json
    from dmad.models.checkpoint import student_weight_files
    from dmad.sample.command import student_timesteps
    from dmad.sample.render import (inputs_in_own_dtype, library_versions, make_scheduler, provenance, sampler_name,
                                    sd_pipeline, sha256_files, student_png, teacher_png, teacher_weight_files)

    one = one_off_prompt_set(ps, req)
    item = one.items[0]
    seed, size, fam = item_seed(one, item), (one.width, one.height), teacher.family
    out.mkdir(parents=True, exist_ok=True)
    pair = free_pair(out, f"{target.name}-{time.strftime('%Y%m%d-%H%M%S')}")
    versions = library_versions()
    common = {"one_off": True, "pair": pair, "prompt": req.prompt, "negative_prompt": item.negative_prompt,
              "seed": seed, "resolution": list(size), "prompt_set": ps.name, "prompt_set_version": ps.version}
    paths = []
    encode = lambda prompts: fam.encode(teacher.modules, prompts, device)  # noqa: E731
    if student is not None:
        t0 = time.perf_counter()
        ts = student_timesteps(target.timesteps, req.steps or len(target.timesteps), schedule.num_train_timesteps)
        uncond = encode([item.negative_prompt or ""]).to(device) if req.cfg not in (None, 1.0) else None
        png = student_png(student=student, vae=teacher.vae, emb=encode([item.prompt]).to(device), schedule=schedule,
                          timesteps=ts, seed=seed, device=device, dtype=torch.float32, cfg=req.cfg, uncond=uncond,
                          size=size, family=fam)
        path = out / f"{pair}-student.png"
        atomic_write_bytes(path, png, durable=False)
        atomic_write_json(path.with_suffix(".json"), {
            **common, "model": "student", "file": path.name, "iter": int(target.name[5:]), "method": method,
            "ema": ema, "steps": len(ts), "timesteps": ts, "cfg": req.cfg,
            "render_s": round(time.perf_counter() - t0, 4),
            **provenance(device, target.name, sha256_files(student_weight_files(target.checkpoint)), versions,
                         teacher.loras)})
        paths.append(str(path))
    if req.teacher or student is None:
        t0 = time.perf_counter()
        pipe = sd_pipeline(teacher, make_scheduler(one.sampler, teacher.scheduler.config, fam))
        with inputs_in_own_dtype(teacher.denoiser):
            png = teacher_png(pipe, prompt=item.prompt, negative_prompt=item.negative_prompt, seed=seed,
                              steps=one.steps, cfg=one.cfg, size=size, device=device, family=fam)
        path = out / f"{pair}-teacher.png"
        atomic_write_bytes(path, png, durable=False)
        atomic_write_json(path.with_suffix(".json"), {
            **common, "model": "teacher", "file": path.name, "iter": None, "sampler": sampler_name(one.sampler, fam),
            "steps": one.steps, "cfg": one.cfg, "render_s": round(time.perf_counter() - t0, 4),
            **provenance(device, None, sha256_files(teacher_weight_files(teacher)), versions, teacher.loras)})
        paths.append(str(path))
    return paths
