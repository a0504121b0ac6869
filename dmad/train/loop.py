"""`dmad train`: a run folder opened (open_run) around one linear loop (train_loop).

open_run (dmad.train.run_open) writes config / prompt set / env / status, routes stdout to events
only (DESIGN.md; the rest goes to stderr and logs/engine.log) and turns a failure into an error
event, a failed status and an exit code. train_loop, per iteration: control commands, the batches, one iteration of the
method (dmad.train.step.dmad_iteration), a metrics row every log_every_steps, then checkpoints and
validation samples on their schedule. `dmad probe` points (dmad.train.probe_point) use the same
open_run and train_loop, with nothing after each iteration.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Callable, Optional, Sequence

from dmad.contract.config import TrainConfig
from dmad.contract.runlog import one_off_problem
from dmad.contract.runs import ControlReader
from dmad.errors import CheckpointMismatch, CheckpointUnusable
from dmad.train.oom import Phase
from dmad.train.ranks import any_rank, broadcast, mean_logs
from dmad.train.run_files import StopFlag
from dmad.train.run_open import open_run
from dmad.train.session import METRIC_COLUMNS, Session
from dmad.train.step import ITERATIONS, LogSum, NonFiniteLoss


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
                s = run.build()
                run.phase.set("sampling")
                s.render_teacher_reference(run.between_phases)  # before iteration 1; a no-op on resume
                run.between_phases()
                run.exit_code = train_loop(s, run.stop, run.phase, run.control)
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

def train_loop(s: Session, stop: "StopFlag", phase: Phase, control: Optional[ControlReader] = None,
               after_iteration: Optional[Callable[[Session], None]] = None) -> int:
    """Iterations until max_train_steps or a stop: control commands, the batches (data time), one
    iteration of the configured method (dmad.train.step), a metrics row every log_every_steps, then
    `after_iteration` (default: checkpoints and validation samples on their schedule)."""
    cfg = s.cfg
    iteration = ITERATIONS[cfg.distillation.method]
    after_iteration = after_iteration or checkpoint_and_sample
    control = control if control is not None else ControlReader(s.folder.control_jsonl)
    window = _Window()
    s.folder.write_status("running", iter=s.iter, max_train_steps=cfg.optimization.max_train_steps)
    s.events.emit("phase", s.iter, phase="training")
    while s.iter < cfg.optimization.max_train_steps:
        stopping = _handle_control(s, control, stop)
        if stopping:
            return _stop(s, checkpoint=stopping == "stop")
        t_iter = time.perf_counter()
        first_batch = s.batches_used
        batches = [next(s.data) for _ in range(cfg.resources.gradient_accumulation_steps)]
        s.batches_used += len(batches)
        window.data_time += time.perf_counter() - t_iter
        with s.passes.counting():
            logs = iteration(s, batches, first_batch, phase)
        _check_finite(s, logs)
        s.iter += 1
        s.folder.note(iter=s.iter)  # the heartbeat writes it: status.json's iteration is never stale
        window.add(logs)
        if s.iter % cfg.observation.log_every_steps == 0 or s.iter == cfg.optimization.max_train_steps:
            _log_row(s, window)
        after_iteration(s)
    return _finish(s)


def checkpoint_and_sample(s: Session) -> None:
    cfg = s.cfg
    last = s.iter == cfg.optimization.max_train_steps
    if s.iter % cfg.observation.checkpointing_steps == 0 or last:
        s.save_checkpoint()
    v = cfg.observation.validation_steps
    if (v and s.iter % v == 0) or s.iter % cfg.observation.checkpointing_steps == 0 or last:
        s.render_samples()


def _cache_counts(s: Session) -> dict:
    """What the latent/text cache gave this process (status.json `cache`), when the run has one."""
    if s.caches is None:
        return {}
    c = s.caches.counts
    s.log.info("cache: latents %d read, %d encoded; captions %d read, %d encoded", c["latent_hits"],
               c["latent_encoded"], c["text_hits"], c["text_encoded"])
    return {"cache": dict(c)}


def _finish(s: Session) -> int:
    s.folder.write_status("finished", iter=s.iter, **_cache_counts(s))
    s.events.emit("finished", s.iter, elapsed_s=round(time.time() - s.t_start, 3),
                  network_passes=s.passes.equivalents())
    return 0


def _stop(s: Session, checkpoint: bool = True) -> int:
    """stop: a checkpoint at this iteration and its samples (the last column of the grid), then
    stopped. stop_now: stopped at once, with the checkpoints there are."""
    s.folder.write_status("stopping", iter=s.iter)
    saved = checkpoint and s.last_saved != s.iter
    if saved:
        s.save_checkpoint()
        s.render_samples()
    last = s.folder.latest_checkpoint() if s.is_main else None
    s.folder.write_status("stopped", iter=s.iter, **_cache_counts(s))
    s.events.emit("stopped", s.iter, last_checkpoint=last[0] if last else None, checkpoint_saved=saved,
                  network_passes=s.passes.equivalents())
    return 0


def _handle_control(s: Session, control: ControlReader, stop: "StopFlag") -> Optional[str]:
    """Applies control.jsonl commands; returns "stop" or "stop_now" when the run must stop, else
    None. Pausing blocks here (models stay loaded; the monitor thread keeps the heartbeat fresh).
    Rank 0 reads the commands and its stop flag; every rank applies them (checkpoints and samples
    are collective)."""
    paused = False
    while True:
        commands, stopping = _poll_control(s, control, stop)
        for c in commands:
            cmd = c.get("cmd")
            if cmd in ("stop", "stop_now"):
                stopping = "stop_now" if "stop_now" in (cmd, stopping) else "stop"
            elif cmd == "pause" and not paused:
                paused = True
                s.folder.write_status("paused", iter=s.iter)
                s.events.emit("paused", s.iter)
            elif cmd == "resume" and paused:
                paused = False
                s.folder.write_status("running", iter=s.iter)
                s.events.emit("resumed", s.iter)
            elif cmd == "sample_now":
                _sample_now(s, c)
            elif cmd == "checkpoint_now":
                s.save_checkpoint()
        if stopping:
            stop.set()
            return stopping
        if not paused:
            return None
        time.sleep(0.2)


def _sample_now(s: Session, command: dict) -> None:
    prompt, seed = command.get("prompt"), command.get("seed")
    if prompt is None and seed is None:
        s.render_samples()
        return
    problem = one_off_problem(prompt, seed)
    if problem:  # a hand-written line: said, not rendered
        s.events.emit("warning", s.iter, message=f"control.jsonl: {problem}")
        return
    s.render_samples(prompt=prompt, seed=seed)


def _check_finite(s: Session, logs: LogSum) -> None:
    if s.world > 1 and any_rank(s.accelerator, logs.bad is not None):
        term, it = logs.bad or ("loss on another rank", s.iter + 1)
        raise NonFiniteLoss(term, it)


def _poll_control(s: Session, control: ControlReader, stop: "StopFlag") -> tuple[list[dict], Optional[str]]:
    commands = control.poll() if s.is_main else []
    stopping = "stop" if s.is_main and stop.is_set() else None
    if s.world > 1:
        commands, stopping = broadcast(s.accelerator, (commands, stopping))
    return commands, stopping


class _Window(LogSum):
    def __init__(self):
        super().__init__()
        self.reset()

    def reset(self) -> None:
        self.sums, self.counts, self.iters, self.data_time = {}, {}, 0, 0.0
        self.t0 = time.perf_counter()

    def add(self, logs: LogSum, iteration: int = 0) -> None:  # type: ignore[override]
        for k, v in logs.sums.items():
            self.sums[k] = self.sums.get(k, 0.0) + v
            self.counts[k] = self.counts.get(k, 0) + logs.counts[k]
        self.iters += 1


def _log_row(s: Session, w: _Window) -> None:
    if w.iters == 0:
        return
    s.sync_device()  # so the window's wall time covers queued GPU work (one sync per log row)
    elapsed = time.perf_counter() - w.t0
    if s.world > 1:  # the row is the mean over every process's samples; rank 0 writes it
        w.sums, w.counts = mean_logs(s.accelerator, w.sums, w.counts)
        if not s.is_main:
            w.reset()
            return
    row = {k: w.sums[k] / w.counts[k] for k in w.sums}
    row.update(s.memory_row())
    row.update(iter=s.iter, step_time_s=elapsed / w.iters, data_time_s=w.data_time / w.iters,
               lr_generator=s.sched_g.get_last_lr()[0],
               lr_critic=s.sched_c.get_last_lr()[0] if s.sched_c is not None else None)
    s.metrics.append({k: row.get(k) for k in METRIC_COLUMNS})
    remaining = s.cfg.optimization.max_train_steps - s.iter
    s.events.emit("metric", s.iter, **{k: v for k, v in row.items() if k != "iter"},
                  max_train_steps=s.cfg.optimization.max_train_steps, network_passes=s.passes.equivalents()["total"],
                  eta_s=round(remaining * elapsed / w.iters, 1))
    w.reset()
