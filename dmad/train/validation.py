"""What a training session renders: the teacher reference before iteration 1, the prompt set with
the student's own timesteps (at checkpoints, every validation_steps, and on sample_now), and one
image of a prompt typed in the app (sample_now with a prompt). Rank 0 only (Session.render_*
wraps these in the barrier). A failure is a warning event: sampling never ends training.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
from pathlib import Path
from typing import Callable, Iterator, Optional

import torch

from dmad.contract.prompts import PromptItem
from dmad.contract.runs import SAMPLES_META, TMP_PREFIX, atomic_write_json
from dmad.models.networks import trainable_parameters
from dmad.train.run_files import is_oom

ONE_OFF = "oneoff"  # samples/oneoff/iter_<N>-<k>.png + .json: prompts typed in the app


@contextlib.contextmanager
def _ema_weights(s) -> Iterator[None]:
    """The student holds its EMA weights (what samples show) inside the block, its own after."""
    params = trainable_parameters(s.nets.student)
    if s.nets.ema is not None:
        s.nets.ema.store(params)
        s.nets.ema.copy_to(params)
    try:
        yield
    finally:
        if s.nets.ema is not None:
            s.nets.ema.restore(params)


@contextlib.contextmanager
def _warn_on_failure(s, what: str) -> Iterator[None]:
    try:
        yield
    except Exception as e:  # noqa: BLE001 - reported, training goes on
        if is_oom(e) and torch.cuda.is_available():
            torch.cuda.empty_cache()
        s.log.warning("%s at iteration %d failed: %r", what, s.iter, e, exc_info=True)
        s.events.emit("warning", s.iter, message=f"{what} failed: {type(e).__name__}: {e}")


def _render(s, out: Path, prompt_set) -> list[str]:
    from dmad.models.checkpoint import student_weight_files
    from dmad.sample.render import library_versions, render_student_samples, sha256_files

    t = s.teacher
    # between checkpoints the weights exist only in memory: no checkpoint, no hash
    ckpt = s.folder.checkpoint_path(s.iter) if s.last_saved == s.iter else None
    with _ema_weights(s):
        return render_student_samples(
            out, student=s.nets.student, vae=t.vae, family=t.family,
            encode=lambda p: t.family.encode(t.modules, p, s.device),
            schedule=s.schedule, timesteps=s.timesteps, prompt_set=prompt_set, iteration=s.iter,
            device=s.device, dtype=torch.float32, versions=library_versions(),
            checkpoint=ckpt.name if ckpt else None, ema=s.nets.ema is not None, method=s.cfg.distillation.method,
            weights_sha256=sha256_files(student_weight_files(ckpt)) if ckpt else None)


def render_prompt_set(s) -> None:
    """samples/iter_<N>/: the run's prompt set with the student's own timesteps (EMA when on)."""
    out = s.folder.samples_dir / f"iter_{s.iter}"
    with _warn_on_failure(s, "sampling"):
        paths = _render(s, out, s.prompt_set)
        s.events.emit("samples", s.iter, folder=str(out), paths=paths, model="student", ema=s.nets.ema is not None)


def render_one_off(s, prompt: str, seed: Optional[int]) -> None:
    """samples/oneoff/iter_<N>-<k>.png and .json (the provenance meta.json of a one-item prompt
    set, with one_off true): the run's prompt set's resolution and the student's timesteps; the
    seed given, else the set's base seed."""
    folder = s.folder.samples_dir / ONE_OFF
    with _warn_on_failure(s, "one-off sample"):
        folder.mkdir(parents=True, exist_ok=True)
        item = PromptItem(id=ONE_OFF, topic="one-off prompt", prompt=prompt, seed=seed)
        prompt_set = s.prompt_set.model_copy(update={"items": [item]})
        tmp = folder / f"{TMP_PREFIX}{os.getpid()}-{s.iter}"
        try:
            _render(s, tmp, prompt_set)
            name = _free_name(folder, f"iter_{s.iter}")
            meta = json.loads((tmp / SAMPLES_META).read_text(encoding="utf-8"))
            meta.update(one_off=True, items={ONE_OFF: {**meta["items"][ONE_OFF], "file": f"{name}.png"}})
            os.replace(tmp / f"{ONE_OFF}.png", folder / f"{name}.png")
            atomic_write_json(folder / f"{name}.json", meta)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        used = meta["items"][ONE_OFF]["seed"]
        s.events.emit("samples", s.iter, folder=str(folder), paths=[str(folder / f"{name}.png")], model="student",
                      ema=s.nets.ema is not None, one_off=True, prompt=prompt, seed=used)


def _free_name(folder: Path, stem: str) -> str:
    k = 1
    while (folder / f"{stem}-{k}.png").exists() or (folder / f"{stem}-{k}.json").exists():
        k += 1
    return f"{stem}-{k}"


def render_teacher_reference(s, between_images: Optional[Callable[..., None]] = None) -> None:
    """samples/teacher/, once per run (dmad.sample.render.ensure_teacher_samples). `between_images`
    (called with collective=False after each image): a stop command ends the phase there."""
    from dmad.sample.render import ensure_teacher_samples

    check = (lambda: between_images(collective=False)) if between_images is not None else None
    ensure_teacher_samples(s.folder.samples_dir / "teacher", teacher=s.teacher, prompt_set=s.prompt_set,
                           device=s.device, events=s.events, log=s.log, iteration=s.iter, between_images=check)
