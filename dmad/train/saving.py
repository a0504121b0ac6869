"""Checkpoints of a training run: written (save_checkpoint: every rank calls it, rank 0 writes),
sized (checkpoint_bytes) and read back when resuming (restore). What the files are is
dmad.models.checkpoint's and the method's (its unit names its networks and files).
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import torch

from dmad.contract.diskspace import reporting_disk_full
from dmad.errors import UserInputError
from dmad.methods.unit import NonFiniteLoss
from dmad.models.checkpoint import TrainingState, config_fingerprint, load_checkpoint, save_checkpoint as write
from dmad.methods.sharded import all_finite
from dmad.train.ranks import any_rank
from dmad.train.run_files import RESUME_ADVICE
from dmad.train.session import Session
from dmad.train.trainer import Trainer


def training_state(s: Session, tr: Trainer) -> TrainingState:
    p = s.progress
    return TrainingState(iter=p.iter, generator_steps=tr.optimizers["generator"].steps, batches_used=p.batches_used,
                         student_timesteps=tr.timesteps, prediction_type=tr.schedule.prediction_type,
                         config_fingerprint=config_fingerprint(tr.cfg.model_dump(mode="json")),
                         lr_generator={}, lr_critic={}, network_passes=tr.passes.state())


def save_checkpoint(s: Session, tr: Trainer) -> None:
    """Every rank calls it (the weights are the same everywhere); rank 0 writes."""
    p = s.progress
    if p.last_saved == p.iter:
        return
    bad = None
    for name, net in tr.method.modules(tr.trainables):
        # One pass over the weights per checkpoint, so a saved checkpoint is always a good one
        # (on every rank: the weights are the same, so every rank stops alike; sharded weights
        # are checked shard by shard and the verdict shared).
        if bad is None and not all_finite(net.parameters()):
            bad = name
    if tr.sharded and tr.world > 1 and any_rank(tr.accelerator, bad is not None) and bad is None:
        bad = "sharded"
    if bad is not None:
        raise NonFiniteLoss(f"{bad} weights", p.iter)
    tr.barrier()
    if tr.sharded:
        _write_sharded(s, tr)
        return
    if not tr.is_main:
        p.last_saved = p.iter
        tr.barrier()
        return
    try:
        _write_checkpoint(s, tr)
    finally:
        tr.barrier()


def sharded_parts(tr: Trainer) -> tuple[dict, Optional[object], dict]:
    """(networks, EMA, optimizers) of an fsdp run that are sharded: what its ranks write together."""
    from dmad.methods.sharded import is_sharded

    nets = {name: net for name, net in tr.method.modules(tr.trainables) if is_sharded(net)}
    ema = tr.trainables.ema if "student" in nets else None
    opts = {name: st.opt for name, st in tr.optimizers.items() if st.sharded}
    return nets, ema, opts


def _write_sharded(s: Session, tr: Trainer) -> None:
    """Every rank writes its shards into the temp folder rank 0 made (a collective); then rank 0
    writes the rest and commits the folder, so the checkpoint is whole or absent."""
    from dmad.models.sharded_checkpoint import save_sharded
    from dmad.train.ranks import broadcast

    folder, p = s.files.folder, s.progress
    tmp = folder.begin_checkpoint(p.iter) if tr.is_main else None
    if tr.world > 1:
        tmp = broadcast(tr.accelerator, str(tmp) if tmp else None)
    tmp = Path(tmp)
    if not tmp.is_dir():  # rank k on another machine: rank 0 made the folder on storage this machine does not see
        raise UserInputError(f"checkpoint iter_{p.iter}: {tmp} (made by rank 0) is not visible here: an fsdp run's "
                             f"ranks each write their shards into the run folder, so over several machines it must be "
                             f"on storage every machine sees")
    nets, ema, opts = sharded_parts(tr)
    done = frozenset({*nets, *(("ema",) if ema is not None else ()), *(f"optimizer_{n}" for n in opts)})
    try:
        with reporting_disk_full(f"checkpoint iter_{p.iter}", folder.checkpoints_dir, lambda: checkpoint_bytes(tr),
                                 advice=RESUME_ADVICE):
            save_sharded(tmp, nets, ema, opts, tr.is_main)
    except BaseException:
        if tr.is_main:
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)
        raise
    if not tr.is_main:
        p.last_saved = p.iter
        tr.barrier()
        return
    try:
        _write_checkpoint(s, tr, tmp, done)
    finally:
        tr.barrier()


def _write_checkpoint(s: Session, tr: Trainer, tmp: Optional[Path] = None, sharded: frozenset = frozenset()) -> None:
    """Rank 0: the checkpoint's files into a fresh temp folder (or `tmp`, where the ranks already
    wrote the `sharded` parts), then the folder committed as iter_<N>."""
    folder, p, unit = s.files.folder, s.progress, tr.method
    # a full disk (an OSError, or the safetensors writer's SafetensorError) is one line naming the checkpoint
    with reporting_disk_full(f"checkpoint iter_{p.iter}", folder.checkpoints_dir, lambda: checkpoint_bytes(tr),
                             advice=RESUME_ADVICE):
        tmp = tmp or folder.begin_checkpoint(p.iter)
        files = (lambda out: None) if "gan_head" in sharded else (lambda out: unit.save_files(tr.trainables, out))
        try:
            write(tmp, unit.layout(tr.cfg.identity), modules=dict(unit.modules(tr.trainables)),
                  ema=tr.trainables.ema, save_files=files, optimizers=tr.optimizers, scaler=tr.accelerator.scaler,
                  state=training_state(s, tr), sharded=sharded)
        except BaseException:
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)  # a partial checkpoint (a full disk) must not hold the space
            raise
    path = folder.commit_checkpoint(p.iter, tmp, tr.cfg.observation.checkpoints_total_limit, protect=_healthy(s, tr))
    p.last_saved = p.iter
    folder.write_status(folder.read_status().get("state", "running"), last_checkpoint=p.iter)
    s.files.events.emit("checkpoint", p.iter, path=str(path), student_timesteps=tr.timesteps)


def _healthy(s: Session, tr: Trainer) -> Optional[int]:
    """The checkpoint rotation must keep: the last one whose health raised no alert, with
    observation.health.stop_on_alert (health.csv after a resume; what this engine saw since)."""
    if not (tr.cfg.observation.health.stop_on_alert and s.files.prompt_set.health_seeds):
        return None
    from dmad.contract.runlog import read_health
    from dmad.train.health_check import last_healthy_checkpoint

    return last_healthy_checkpoint(read_health(s.files.folder.health_csv))


def checkpoint_bytes(tr: Trainer) -> int:
    """About what a checkpoint takes on disk: the saved weights and the optimizer states."""
    unit, nets = tr.method, tr.trainables
    tensors = [t for _, net in unit.modules(nets) for t in net.state_dict().values()]
    if nets.ema is not None:
        tensors += list(nets.ema.shadow_params)
    tensors += unit.state_tensors(nets)
    for opt in (o.opt for o in tr.optimizers.values()):
        tensors += [v for st in opt.state.values() for v in st.values() if isinstance(v, torch.Tensor)]
    return sum(t.numel() * t.element_size() for t in tensors)


def restore(tr: Trainer, resume: str) -> TrainingState:
    """Weights, the method's own files, EMA, optimizers, schedules, grad scaler and RNG states from
    the checkpoint `resume` (exact resume), and its counts of generator steps and network passes;
    the rest of its counters are returned."""
    unit, nets = tr.method, tr.trainables
    state = load_checkpoint(Path(resume), unit.layout(tr.cfg.identity), modules=dict(unit.modules(nets)),
                            ema=nets.ema, load_files=lambda ckpt: unit.load_files(nets, ckpt),
                            optimizers=tr.optimizers, scaler=tr.accelerator.scaler)
    if state.student_timesteps != tr.timesteps:
        raise UserInputError(f"checkpoint {resume} was trained with student timesteps {state.student_timesteps}, "
                             f"the config asks for {tr.timesteps}")
    tr.optimizers["generator"].steps = state.generator_steps
    tr.passes.start_from(state.network_passes)
    return state
