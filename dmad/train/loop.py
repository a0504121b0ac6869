"""`dmad train`: a run folder opened (open_run) around one linear loop (train_loop).

open_run (dmad.train.run_open) writes config / prompt set / env / status, routes stdout to events
only (DESIGN.md; the rest goes to stderr and logs/engine.log) and turns a failure into an error
event, a failed status and an exit code. train_loop, per iteration: control commands, the batches,
one iteration of the method (its unit's `iteration`: dmad/methods/dmd2.py for DMAD), a metrics row
every log_every_steps, then checkpoints and validation samples on their schedule. `dmad probe`
points (dmad.train.probe_point) use the same open_run and train_loop, with nothing after each
iteration.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, Optional, Sequence

from dmad.contract.config import TrainConfig
from dmad.contract.methods import LR_COLUMNS
from dmad.contract.runlog import one_off_problem
from dmad.contract.runs import ControlReader
from dmad.errors import CheckpointMismatch, CheckpointUnusable
from dmad.memory import readings as memory
from dmad.methods.unit import LogSum, NonFiniteLoss, Stages
from dmad.train.control import handle_control
from dmad.train.monitor import device_reading
from dmad.train.oom import Phase
from dmad.train.ranks import any_rank, broadcast, mean_logs
from dmad.train.run_files import StopFlag
from dmad.train.run_open import open_run
from dmad.train.saving import save_checkpoint
from dmad.train.session import Session
from dmad.train.trackers import log_values, tracking
from dmad.train.trainer import Trainer
from dmad.train.validation import render_samples, render_teacher


def run_training(cfg: TrainConfig, run_dir: Path, resume: Optional[str], argv: list[str], restart: bool = False,
                 fallbacks: Sequence[Path] = (), skipped: Sequence[str] = ()) -> int:
    """`dmad train`: creates (or reopens, to resume or to start again) the run folder, trains,
    returns the exit code. A checkpoint that fails to load falls back to the next of `fallbacks`
    (older checkpoints, newest first), each passed over with a warning event; `skipped` are those
    preflight already passed over. A refused attempt leaves the folder as it found it
    (dmad.train.run_open), so the history it shows is never cut by a start that did not happen."""
    skipped, fallbacks = list(skipped), list(fallbacks)
    while True:
        try:
            with open_run(cfg, run_dir, resume, argv, restart=restart, skipped=skipped) as run:
                s, tr = run.build()
                with tracking(tr.accelerator, cfg, s.files.folder.path, s.progress.iter):  # observation.report_to
                    run.phase.set("sampling")
                    render_teacher(s, tr, run.between_phases)  # before iteration 1; a no-op on resume
                    run.between_phases()
                    run.exit_code = train_loop(s, tr, run.stop, run.phase, run.control)
            return run.exit_code
        except CheckpointUnusable as e:
            if isinstance(e, CheckpointMismatch) or (not fallbacks and not skipped):
                raise  # the only checkpoint there was, the one the user named, or one the config cannot continue
            skipped.append(str(e))
            if not fallbacks:
                raise CheckpointUnusable(f"no usable checkpoint in {Path(resume).parent} ({len(skipped)} damaged; "
                                         f"newest: {skipped[0]})") from None
            resume = str(fallbacks.pop(0))


# --------------------------------------------------------------------------- the loop

def train_loop(s: Session, tr: Trainer, stop: "StopFlag", phase: Phase, control: Optional[ControlReader] = None,
               after_iteration: Optional[Callable[[Session, Trainer], None]] = None) -> int:
    """Iterations until max_train_steps or a stop: control commands, the batches (data time), one
    iteration of the configured method (its unit: networks, optimizers, batches with their noise,
    config and accelerator as arguments), a metrics row every log_every_steps, then
    `after_iteration` (default: checkpoints and validation samples on their schedule)."""
    cfg, p, files = tr.cfg, s.progress, s.files
    max_steps = cfg.optimization.max_train_steps
    after_iteration = after_iteration or checkpoint_and_sample
    control = control if control is not None else ControlReader(files.folder.control_jsonl)
    window = _Window()
    files.folder.write_status("running", iter=p.iter, max_train_steps=max_steps)
    files.events.emit("phase", p.iter, phase="training")
    while p.iter < max_steps:
        t_boundary = time.perf_counter()
        stopping = _control(s, tr, control, stop)
        window.asked += time.perf_counter() - t_boundary  # a pause, a sample-now, a checkpoint-now
        if stopping:
            return _stop(s, tr, checkpoint=stopping == "stop")
        if s.health.stop_signal:  # observation.health.stop_on_alert: as stop_now, no new checkpoint
            return _stop(s, tr, checkpoint=False, reason=f"health alert: {s.health.stop_signal}")
        t_iter = time.perf_counter()
        batches = s.data.take(p.batches_used, cfg.resources.gradient_accumulation_steps)
        p.batches_used += len(batches)
        window.data_time += time.perf_counter() - t_iter
        stages = Stages(phase, p.iter, first=p.iter == p.start_iter)
        with tr.passes.counting():
            logs = tr.method.iteration(tr.nets, tr.optimizers, batches, p.iter, cfg, tr.accelerator, stages)
        _check_finite(tr, logs, p.iter)
        p.iter += 1
        files.folder.note(iter=p.iter)  # the heartbeat writes it: status.json's iteration is never stale
        window.add(logs)
        if p.iter % cfg.observation.log_every_steps == 0 or p.iter == max_steps:
            _log_row(s, tr, window)
        t_boundary = time.perf_counter()
        after_iteration(s, tr)
        window.scheduled += time.perf_counter() - t_boundary  # checkpoints and validation renders
    return _finish(s, tr)


@contextmanager
def phase_span(s: Session, name: str) -> Iterator[None]:
    """Work at an iteration boundary that is not a training step (a checkpoint write, a validation
    or sample-now render): a `phase` event with its name when it starts, and `phase` "training" with
    `after` (the name) and `took_s` when it ends, so the app marks it as a span of its own; its time
    is kept out of step_time_s (train_loop). A pause is the paused / resumed events' span."""
    t0 = time.perf_counter()
    s.files.events.emit("phase", s.progress.iter, phase=name)
    try:
        yield
    finally:
        s.files.events.emit("phase", s.progress.iter, phase="training", after=name,
                            took_s=round(time.perf_counter() - t0, 3))


def checkpoint_and_sample(s: Session, tr: Trainer) -> None:
    obs, it = tr.cfg.observation, s.progress.iter
    last = it == tr.cfg.optimization.max_train_steps
    if it % obs.checkpointing_steps == 0 or last:
        with phase_span(s, "checkpoint"):
            save_checkpoint(s, tr)
    v = obs.validation_steps
    if (v and it % v == 0) or it % obs.checkpointing_steps == 0 or last:
        with phase_span(s, "validation"):
            render_samples(s, tr)


def _cache_counts(s: Session) -> dict:
    """What the latent/text cache gave this process (status.json `cache`), when the run has one."""
    if s.data.caches is None:
        return {}
    c = s.data.caches.counts
    s.files.log.info("cache: latents %d read, %d encoded; captions %d read, %d encoded", c["latent_hits"],
                     c["latent_encoded"], c["text_hits"], c["text_encoded"])
    return {"cache": dict(c)}


def _finish(s: Session, tr: Trainer) -> int:
    it = s.progress.iter
    s.files.folder.write_status("finished", iter=it, **_cache_counts(s))
    s.files.events.emit("finished", it, elapsed_s=round(time.time() - s.progress.t_start, 3),
                        start_iter=s.progress.start_iter, network_passes=tr.passes.equivalents())
    return 0


def _stop(s: Session, tr: Trainer, checkpoint: bool = True, reason: Optional[str] = None) -> int:
    """stop: a checkpoint at this iteration and its samples (the last column of the grid), then
    stopped. stop_now: stopped at once, with the checkpoints there are. `reason`: a health alert
    (stop_on_alert), named in the stopped event with the last checkpoint that raised none."""
    folder, it = s.files.folder, s.progress.iter
    folder.write_status("stopping", iter=it)
    saved = checkpoint and s.progress.last_saved != it
    if saved:
        save_checkpoint(s, tr)
        render_samples(s, tr)
    last = folder.latest_checkpoint() if tr.is_main else None
    folder.write_status("stopped", iter=it, **_cache_counts(s))
    why = {} if reason is None else {"reason": reason, "healthy_checkpoint": s.health.healthy_checkpoint}
    s.files.events.emit("stopped", it, last_checkpoint=last[0] if last else None, checkpoint_saved=saved,
                        network_passes=tr.passes.equivalents(), **why)
    return 0


def _control(s: Session, tr: Trainer, control: ControlReader, stop: "StopFlag") -> Optional[str]:
    """Control commands at an iteration boundary (dmad.train.control): "stop" or "stop_now" when the
    run must stop, else None. Rank 0 reads the commands and its stop flag; every rank applies them
    (checkpoints and samples are collective)."""
    files, it = s.files, s.progress.iter

    def announce(state: str, event: str) -> None:
        files.folder.write_status(state, iter=it)
        files.events.emit(event, it)

    def run(command: dict) -> None:
        if command.get("cmd") == "sample_now":
            with phase_span(s, "sample-now"):
                _sample_now(s, tr, command)
        else:
            with phase_span(s, "checkpoint"):
                save_checkpoint(s, tr)

    stopping = handle_control(lambda: _poll_control(tr, control, stop), announce, run)
    if stopping:
        stop.set()
    return stopping


def _sample_now(s: Session, tr: Trainer, command: dict) -> None:
    prompt, seed = command.get("prompt"), command.get("seed")
    if prompt is None and seed is None:
        render_samples(s, tr)
        return
    problem = one_off_problem(prompt, seed)
    if problem:  # a hand-written line: said, not rendered
        s.files.events.emit("warning", s.progress.iter, message=f"control.jsonl: {problem}")
        return
    render_samples(s, tr, prompt=prompt, seed=seed)


def _check_finite(tr: Trainer, logs: LogSum, it: int) -> None:
    if tr.world > 1 and any_rank(tr.accelerator, logs.bad is not None):
        term, at = logs.bad or ("loss on another rank", it + 1)
        raise NonFiniteLoss(term, at)


def _poll_control(tr: Trainer, control: ControlReader, stop: "StopFlag") -> tuple[list[dict], Optional[str]]:
    commands = control.poll() if tr.is_main else []
    stopping = "stop" if tr.is_main and stop.is_set() else None
    if tr.world > 1:
        commands, stopping = broadcast(tr.accelerator, (commands, stopping))
    return commands, stopping


class _Window(LogSum):
    def __init__(self):
        super().__init__()
        self.reset()

    def reset(self) -> None:
        self.sums, self.counts, self.iters, self.data_time = {}, {}, 0, 0.0
        self.asked = 0.0      # at boundaries, on the user's command: pauses, sample-now, checkpoint-now
        self.scheduled = 0.0  # at boundaries, on the config's schedule: checkpoints, validation renders
        self.t0 = time.perf_counter()

    def add(self, logs: LogSum, iteration: int = 0) -> None:  # type: ignore[override]
        for k, v in logs.sums.items():
            self.sums[k] = self.sums.get(k, 0.0) + v
            self.counts[k] = self.counts.get(k, 0) + logs.counts[k]
        self.iters += 1


def memory_row(device) -> dict:
    """Framework peak since the previous row (then reset) and device-wide use (NVML; process
    RSS on a CPU machine): two scopes, two columns, never mixed."""
    peak = memory.framework_peak_gb(device)
    memory.reset_framework_peak(device)
    _, used, total, _ = device_reading(device)
    # the total rides on the metric event only (the app draws it as a line), not in metrics.csv
    return {"mem_peak_alloc_gb": peak, "mem_device_used_gb": used, "mem_device_total_gb": total}


def _log_row(s: Session, tr: Trainer, w: _Window) -> None:
    if w.iters == 0:
        return
    tr.sync_device()  # so the window's wall time covers queued GPU work (one sync per log row)
    elapsed = time.perf_counter() - w.t0
    if tr.world > 1:  # the row is the mean over every process's samples; rank 0 writes it
        w.sums, w.counts = mean_logs(tr.accelerator, w.sums, w.counts)
        if not tr.is_main:
            w.reset()
            return
    it, max_steps = s.progress.iter, tr.cfg.optimization.max_train_steps
    row = {k: w.sums[k] / w.counts[k] for k in w.sums}
    row.update(memory_row(tr.device))
    # a training step's time alone; the ETA counts the scheduled checkpoints and renders too, never a pause
    training = max(elapsed - w.asked - w.scheduled, 0.0)
    row.update(iter=it, step_time_s=training / w.iters, data_time_s=w.data_time / w.iters)
    opts = tr.optimizers
    row.update({c: opts[c[3:]].lr() if c[3:] in opts else None for c in LR_COLUMNS})  # lr_<optimizer>
    csv_row = {k: row.get(k) for k in s.files.metrics.columns}  # an older run's header may lack new columns
    s.files.metrics.append(csv_row)
    log_values(tr.accelerator, {k: v for k, v in csv_row.items() if k != "iter"}, it)  # observation.report_to
    remaining = max_steps - it
    s.files.events.emit("metric", it, **{k: v for k, v in row.items() if k != "iter"}, max_train_steps=max_steps,
                        network_passes=tr.passes.equivalents()["total"], eta_s=round(remaining * max(elapsed - w.asked, 0.0) / w.iters, 1))
    w.reset()
