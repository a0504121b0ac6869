"""What a training session renders: the teacher reference before iteration 1, the prompt set with
the student's own timesteps (at checkpoints, every validation_steps, and on sample_now), and one
image of a prompt typed in the app (sample_now with a prompt). Every rank calls render_samples and
render_teacher; rank 0 renders (in its own copy of the global RNGs) while the others wait, then
computes the prompt set's health signals (when it has health_seeds). A failure is a warning event:
sampling never ends training (a health alert does, with observation.health.stop_on_alert).
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable, Iterator, Optional

import torch

from dmad.contract.prompts import PromptItem
from dmad.contract.runs import SAMPLES_META, TMP_PREFIX, atomic_write_json
from dmad.models.networks import trainable_parameters
from dmad.train.ranks import broadcast
from dmad.train.run_files import is_oom
from dmad.train.session import Session
from dmad.train.trainer import Trainer

ONE_OFF = "oneoff"  # samples/oneoff/iter_<N>-<k>.png + .json: prompts typed in the app


def render_samples(s: Session, tr: Trainer, prompt: Optional[str] = None, seed: Optional[int] = None) -> None:
    """Validation images of the prompt set (or one image of `prompt`: sample_now with a prompt).
    An fsdp run's networks gather their shards in each call, so there every rank renders the same
    images and rank 0 alone keeps them."""
    if tr.sharded and not tr.is_main:
        with tr.own_rng(), tempfile.TemporaryDirectory(prefix="dmad-rank-samples-") as d:
            with _warn_on_failure(s, "sampling"):
                _render(s, tr, Path(d) / "out", _one_off_set(s, prompt, seed) if prompt else s.files.prompt_set,
                        provenance=False)
        tr.barrier()
    elif tr.is_main:
        try:
            with tr.own_rng():
                render_one_off(s, tr, prompt, seed) if prompt else render_prompt_set(s, tr)
        finally:
            tr.barrier()
    else:
        tr.barrier()
    if not prompt and tr.world > 1 and tr.cfg.observation.health.stop_on_alert and s.files.prompt_set.health_seeds:
        s.health.stop_signal = broadcast(tr.accelerator, s.health.stop_signal)  # every rank stops alike


def render_teacher(s: Session, tr: Trainer, between_images: Optional[Callable[..., None]] = None) -> None:
    """samples/teacher/, once per run, before iteration 1 (a no-op on resume).
    `between_images(collective=False)` runs after each image. With fsdp_shard_teacher every rank
    renders (rank k into a copy of rank 0's folder, so it renders what rank 0 renders) and the stop
    check between images is a collective."""
    if tr.sharded and tr.cfg.resources.fsdp_shard_teacher:
        check = (lambda: between_images(collective=True)) if between_images is not None else None
        if tr.is_main:
            try:
                with tr.own_rng():
                    render_teacher_reference(s, tr, check, collective=True)
            finally:
                tr.barrier()
            return
        with tr.own_rng(), tempfile.TemporaryDirectory(prefix="dmad-rank-teacher-") as d:
            copy = Path(d) / "teacher"
            source = s.files.folder.samples_dir / "teacher"
            if source.is_dir():
                shutil.copytree(source, copy)
            try:
                render_teacher_reference(s, tr, check, collective=True, folder=copy)
            finally:
                tr.barrier()
        return
    if tr.is_main:
        try:
            with tr.own_rng():
                render_teacher_reference(s, tr, between_images)
        finally:
            tr.barrier()
    else:
        tr.barrier()


@contextlib.contextmanager
def _ema_weights(tr: Trainer) -> Iterator[None]:
    """The student holds its EMA weights (what samples show) inside the block, its own after."""
    from dmad.methods.sharded import reshard

    nets = tr.trainables
    params = trainable_parameters(nets.student)
    if nets.ema is not None:
        nets.ema.store(params)
        nets.ema.copy_to(params)
        reshard(nets.student)  # a sharded student gathers the EMA weights, not a stale copy
    try:
        yield
    finally:
        if nets.ema is not None:
            nets.ema.restore(params)
            reshard(nets.student)


@contextlib.contextmanager
def _warn_on_failure(s: Session, what: str) -> Iterator[None]:
    try:
        yield
    except Exception as e:  # noqa: BLE001 - reported, training goes on
        if is_oom(e) and torch.cuda.is_available():
            torch.cuda.empty_cache()
        it = s.progress.iter
        s.files.log.warning("%s at iteration %d failed: %r", what, it, e, exc_info=True)
        s.files.events.emit("warning", it, message=f"{what} failed: {type(e).__name__}: {e}")


def _render(s: Session, tr: Trainer, out: Path, prompt_set, provenance: bool = True) -> list[str]:
    from dmad.models.checkpoint import student_weight_files
    from dmad.sample.render import library_versions, render_student_samples, sha256_files

    t, it = tr.teacher, s.progress.iter
    # between checkpoints the weights exist only in memory: no checkpoint, no hash
    ckpt = s.files.folder.checkpoint_path(it) if s.progress.last_saved == it and provenance else None
    ema = tr.trainables.ema is not None
    with _ema_weights(tr):
        return render_student_samples(
            out, student=tr.trainables.student, vae=t.vae, family=t.family,
            encode=lambda p: t.family.encode(t.modules, p, tr.device),
            schedule=tr.schedule, timesteps=tr.timesteps, prompt_set=prompt_set, iteration=it,
            device=tr.device, dtype=torch.float32, versions=library_versions(),
            checkpoint=ckpt.name if ckpt else None, ema=ema, method=tr.cfg.distillation.method, teacher_loras=t.loras,
            weights_sha256=sha256_files(student_weight_files(ckpt)) if ckpt else None)


def render_prompt_set(s: Session, tr: Trainer) -> None:
    """samples/iter_<N>/: the run's prompt set with the student's own timesteps (EMA when on);
    with the prompt set's health_seeds, then its health signals (dmad.train.health_check)."""
    it = s.progress.iter
    out = s.files.folder.samples_dir / f"iter_{it}"
    rendered = False
    with _warn_on_failure(s, "sampling"):
        paths = _render(s, tr, out, s.files.prompt_set)
        s.files.events.emit("samples", it, folder=str(out), paths=paths, model="student",
                            ema=tr.trainables.ema is not None)
        rendered = True
    if rendered and s.files.prompt_set.health_seeds > 0:
        from dmad.train.health_check import record_health

        checkpoint = f"iter_{it}" if s.progress.last_saved == it else None
        with _warn_on_failure(s, "health signals"):
            record_health(s, tr, out, checkpoint)


def render_one_off(s: Session, tr: Trainer, prompt: str, seed: Optional[int]) -> None:
    """samples/oneoff/iter_<N>-<k>.png and .json (the provenance meta.json of a one-item prompt
    set, with one_off true): the run's prompt set's resolution and the student's timesteps; the
    seed given, else the set's base seed."""
    it = s.progress.iter
    folder = s.files.folder.samples_dir / ONE_OFF
    with _warn_on_failure(s, "one-off sample"):
        folder.mkdir(parents=True, exist_ok=True)
        prompt_set = _one_off_set(s, prompt, seed)
        tmp = folder / f"{TMP_PREFIX}{os.getpid()}-{it}"
        try:
            _render(s, tr, tmp, prompt_set)
            name = _free_name(folder, f"iter_{it}")
            meta = json.loads((tmp / SAMPLES_META).read_text(encoding="utf-8"))
            meta.update(one_off=True, items={ONE_OFF: {**meta["items"][ONE_OFF], "file": f"{name}.png"}})
            os.replace(tmp / f"{ONE_OFF}.png", folder / f"{name}.png")
            atomic_write_json(folder / f"{name}.json", meta)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        used = meta["items"][ONE_OFF]["seed"]
        s.files.events.emit("samples", it, folder=str(folder), paths=[str(folder / f"{name}.png")], model="student",
                            ema=tr.trainables.ema is not None, one_off=True, prompt=prompt, seed=used)


def _one_off_set(s: Session, prompt: str, seed: Optional[int]):
    """The run's prompt set with one item: `prompt` at `seed` (None: the set's base seed)."""
    item = PromptItem(id=ONE_OFF, topic="one-off prompt", prompt=prompt, seed=seed)
    return s.files.prompt_set.model_copy(update={"items": [item]})


def _free_name(folder: Path, stem: str) -> str:
    k = 1
    while (folder / f"{stem}-{k}.png").exists() or (folder / f"{stem}-{k}.json").exists():
        k += 1
    return f"{stem}-{k}"


def render_teacher_reference(s: Session, tr: Trainer, between_images: Optional[Callable[..., None]] = None,
                             collective: bool = False, folder: Optional[Path] = None) -> None:
    """samples/teacher/ (or `folder`), once per run (dmad.sample.render.ensure_teacher_samples).
    `between_images` (called after each image, with collective=False; `collective`: it is already
    the check to call): a stop command ends the phase there."""
    from dmad.sample.render import ensure_teacher_samples

    check = between_images if collective else \
        ((lambda: between_images(collective=False)) if between_images is not None else None)
    f = s.files
    ensure_teacher_samples(folder or f.folder.samples_dir / "teacher", teacher=tr.teacher, prompt_set=f.prompt_set,
                           device=tr.device, events=f.events, log=f.log, iteration=s.progress.iter,
                           between_images=check)
