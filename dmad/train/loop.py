"""`dmad train`: a run folder opened (open_run) around one linear loop (train_loop).

open_run writes config / prompt set / env / status, routes stdout to events only (DESIGN.md; the
rest goes to stderr and logs/engine.log) and turns a failure into an error event, a failed status
and an exit code. train_loop, per iteration: control commands, the batches, one iteration of the
method (dmad.train.step.dmad_iteration), a metrics row every log_every_steps, then checkpoints and
validation samples on their schedule. `dmad probe` points (dmad.train.probe_point) use the same
open_run and train_loop, with nothing after each iteration.
"""
from __future__ import annotations

import contextlib
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Sequence

from dmad.contract.config import TrainConfig
from dmad.errors import CheckpointUnusable, DmadError, StopRequested
from dmad.contract.events import EventWriter
from dmad.train.monitor import Monitor
from dmad.train.launch import world_rank
from dmad.train.oom import Phase, advice, classify
from dmad.contract.prompts import load_prompt_set
from dmad.train.ranks import NullEvents, NullMonitor, ReadOnlyFolder, any_rank, broadcast, mean_logs, record_failure
from dmad.contract.runs import ControlReader, RunFolder, RunLock
from dmad.train.build import build_session, make_accelerator
from dmad.train.session import (METRIC_COLUMNS, Session, StopFlag, close_logging, cut_back_to_checkpoint, disk_full,
                                engine_started_at, is_disk_full, PipeSafeStream, is_oom, prepare_folder,
                                setup_logging)
from dmad.train.step import ITERATIONS, LogSum, NonFiniteLoss


@dataclass
class OpenRun:
    """A run folder opened for training: its writers, the prompt set, the control commands and the
    phase an out-of-memory error would be blamed on. `exit_code` is what the command returns."""

    cfg: TrainConfig
    folder: Any  # RunFolder on rank 0, ReadOnlyFolder on the others
    events: Any  # EventWriter on rank 0, NullEvents on the others
    log: Any
    monitor: Any
    prompt_set: Any
    phase: Phase
    stop: StopFlag
    control: ControlReader  # read from the engine's start: a Stop during loading counts
    accelerator: Any  # joined process group with several processes, else None (build_session makes one)
    resume: Optional[str]
    session: Optional[Session] = None
    exit_code: int = 0

    def build(self) -> Session:
        self.phase.set("loading")
        self.session = build_session(self.cfg, self.folder, self.prompt_set, self.events, self.log, self.monitor,
                                     self.accelerator, self.resume, between_phases=self.between_phases)
        return self.session

    def between_phases(self, collective: bool = True) -> None:
        """Control commands at a boundary before training (data opened, teacher loaded, each teacher
        sample): stop raises StopRequested, pause waits here for resume or stop, and sample_now /
        checkpoint_now wait for the loop. Rank 0 reads; with several processes the outcome is
        broadcast when `collective` (every rank is at the same boundary)."""
        stopping = False
        if self.folder.is_writer:
            stopping = self._apply_early(self.control.poll())
        if collective and self.accelerator is not None:
            stopping = broadcast(self.accelerator, stopping)
        if stopping:
            raise StopRequested()

    def _apply_early(self, commands: list[dict]) -> bool:
        paused = False
        while True:
            for c in commands:
                name = c.get("cmd")
                if name == "stop":
                    return True
                if name == "pause" and not paused:
                    paused = True
                    self.folder.write_status("paused")
                    self.events.emit("paused", None, phase=self.phase.name)
                elif name == "resume" and paused:
                    paused = False
                    self.folder.write_status("running")
                    self.events.emit("resumed", None, phase=self.phase.name)
                elif name in ("sample_now", "checkpoint_now"):
                    self.control.defer(c)  # there is no student to sample or save yet
            if self.stop.is_set():
                return True
            if not paused:
                return False
            time.sleep(0.2)
            commands = self.control.poll()


def run_training(cfg: TrainConfig, run_dir: Path, resume: Optional[str], argv: list[str], restart: bool = False,
                 fallbacks: Sequence[Path] = (), skipped: Sequence[str] = ()) -> int:
    """`dmad train`: creates (or reopens, to resume or to start again) the run folder, trains,
    returns the exit code. A checkpoint that fails to load falls back to the next of `fallbacks`
    (older checkpoints, newest first), each passed over with a warning event; `skipped` are those
    preflight already passed over."""
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
            if not fallbacks and not skipped:
                raise  # the only checkpoint there was, or the one the user named
            skipped.append(str(e))
            if not fallbacks:
                raise CheckpointUnusable(f"no usable checkpoint in {Path(resume).parent} ({len(skipped)} damaged; "
                                         f"newest: {skipped[0]})") from None
            resume = str(fallbacks.pop(0))


@contextlib.contextmanager
def open_run(cfg: TrainConfig, run_dir: Path, resume: Optional[str], argv: list[str], restart: bool = False,
             skipped: Sequence[str] = ()) -> Iterator[OpenRun]:
    """The run folder, logging, events, status and heartbeat around whatever trains in it (the loop,
    or a `dmad probe` point), and what a failure leaves there: an error event, a failed status,
    one line on stderr and the exit code (1, 3 out of memory, 130 interrupted) in `exit_code`.
    A DmadError (bad input) is recorded and re-raised for the CLI to print. Rank 0 holds the run
    folder's lock (dmad.contract.runs.RunLock) from before its first write to after its last."""
    phase = Phase()  # a bad DMAD_FAULT is refused before the run folder is touched
    rank, world = world_rank()
    acc = make_accelerator(cfg.resources.mixed_precision) if world > 1 else None  # joins the process group
    main = rank == 0
    lock = None
    if main:
        reopen = resume or (restart and RunFolder(run_dir).config_json.is_file())
        folder = RunFolder.open(run_dir) if reopen else RunFolder.create(run_dir)
        folder.check_confined()  # nothing is written before: a link out of the folder is refused
        lock = RunLock(run_dir).acquire()  # a second engine stops here, with nothing touched
        try:
            if resume:  # before any writer opens events.jsonl / metrics.csv (they are rewritten, not edited)
                cut_back_to_checkpoint(folder, Path(resume))
            elif restart:
                folder.clean_temp()
                folder.truncate_after(0)
        except BaseException:
            lock.release()
            raise
    if acc is not None:
        acc.wait_for_everyone()  # rank 0 made the folder
    if not main:
        folder = ReadOnlyFolder(run_dir)
    previous = folder.read_status() or {} if main else {}
    offset = previous.get("control_offset")
    control = ControlReader(folder.control_jsonl, offset=offset if isinstance(offset, int) else 0,
                            since=engine_started_at())
    real_stderr, sys.stderr = sys.stderr, PipeSafeStream(sys.stderr)  # before logging takes its handle
    log = setup_logging(folder.engine_log if main else folder.logs_dir / f"rank_{rank}.log")
    real_stdout, sys.stdout = sys.stdout, sys.stderr  # library print()s must never reach the event stream
    events = EventWriter(folder.events_jsonl, stream=real_stdout) if main else NullEvents()
    run = OpenRun(cfg, folder, events, log, None, None, phase, StopFlag().install(), control, acc, resume)

    def sampled(row: dict) -> None:  # the sampler's events carry the iteration once there is one
        it = run.session.iter if run.session is not None else None
        events.emit("metric", it, source="sampler", **{k: v for k, v in row.items() if k != "t"})

    run.monitor = Monitor(folder, None, cfg.observation.gpu_mem_interval_s, on_sample=sampled) if main else NullMonitor()
    try:
        if main:
            run.prompt_set = prepare_folder(folder, cfg, resume, argv, events, world, reopened=restart)
            for reason in skipped:
                events.emit("warning", None, message=f"passed over a damaged checkpoint: {reason}")
            if restart:
                events.emit("warning", None, message=f"no complete checkpoint in {folder.checkpoints_dir}: "
                                                     f"starting again from iteration 0")
        if acc is not None:
            acc.wait_for_everyone()  # rank 0 wrote the run's prompt set
        if not main:
            run.prompt_set = load_prompt_set(folder.prompt_set_json)
        run.monitor.start()
        yield run
    except StopRequested:
        run.exit_code = _stopped_early(run)
    except NonFiniteLoss as e:
        run.exit_code = _fail(folder, events, run.session, f"{e}; the last good checkpoint is kept", 1, term=e.term,
                              cause="non_finite_loss")
    except DmadError as e:
        _fail(folder, events, run.session, str(e), e.exit_code, cause=type(e).__name__, quiet=True)
        raise
    except BaseException as e:
        s = run.session
        if is_disk_full(e):
            full = disk_full(folder, s, e)
            _fail(folder, events, s, str(full), full.exit_code, cause="disk_full", quiet=True)
            raise full from None
        if is_oom(e):
            where = classify(phase.name)
            tip = advice(where, cfg.resources)
            folder.write_status("failed", advice=tip)
            run.exit_code = _fail(folder, events, s, f"out of memory during {where}: {str(e).splitlines()[0][:200]}",
                                  3, cause="out_of_memory", phase=where, advice=tip)
            return
        if isinstance(e, KeyboardInterrupt):
            _fail(folder, events, s, "interrupted", 130, cause="interrupted", quiet=True)
            raise
        log.error("unexpected failure in phase %s\n%s", phase.name, traceback.format_exc())
        if not main:
            record_failure(folder, rank, f"{type(e).__name__}: {e} (in {phase.name})")
        _fail(folder, events, s, f"{type(e).__name__}: {e} (in {phase.name}; details in {folder.engine_log})", 1,
              cause="exception", quiet=True)
        raise DmadError(f"{type(e).__name__}: {e} (details in {folder.engine_log})") from None
    finally:
        run.stop.uninstall()
        run.monitor.stop()
        if run.session is not None:
            run.session.metrics.close()
        _quietly(folder.update_status, control_offset=control.offset)  # the next engine starts after these
        events.close()
        close_logging()
        sys.stdout, sys.stderr = real_stdout, real_stderr
        if lock is not None:
            lock.release()


def _quietly(write: Callable, *args, **kwargs) -> None:
    """A write while the run ends: a full disk must not hide the reason the run ended."""
    try:
        write(*args, **kwargs)
    except OSError:
        pass


def _stopped_early(run: OpenRun) -> int:
    """A stop before training began: no checkpoint is written (a resumed run keeps the one it
    resumed from); the folder can be resumed, or started again when it has none."""
    s = run.session
    it = s.iter if s is not None else None
    last = run.folder.latest_checkpoint() if run.folder.is_writer else None
    run.folder.write_status("stopped", iter=it)
    run.events.emit("stopped", it, last_checkpoint=last[0] if last else None, phase=run.phase.name)
    return 0


def _fail(folder: RunFolder, events: EventWriter, s: Optional[Session], reason: str, code: int,
          quiet: bool = False, **data) -> int:
    """Error event + failed status; one line on stderr unless the CLI prints the exception itself.
    Each write is tried on its own: a full disk must not hide the reason."""
    last = folder.latest_checkpoint()
    it = s.iter if s is not None else None
    _quietly(events.emit, "error", it, reason=reason, exit_code=code, last_checkpoint=last[0] if last else None,
             **data)
    _quietly(folder.write_status, "failed", failure_reason=reason, exit_code=code)
    if not quiet:
        print(f"dmad: error: {reason}", file=sys.stderr, flush=True)
    return code


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
        if _handle_control(s, control, stop):
            return _stop(s)
        t_iter = time.perf_counter()
        first_batch = s.batches_used
        batches = [next(s.data) for _ in range(cfg.resources.gradient_accumulation_steps)]
        s.batches_used += len(batches)
        window.data_time += time.perf_counter() - t_iter
        logs = iteration(s, batches, first_batch, phase)
        _check_finite(s, logs)
        s.iter += 1
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
    s.events.emit("finished", s.iter, elapsed_s=round(time.time() - s.t_start, 3))
    return 0


def _stop(s: Session) -> int:
    s.folder.write_status("stopping", iter=s.iter)
    if s.last_saved != s.iter:
        s.save_checkpoint()
    s.folder.write_status("stopped", iter=s.iter, **_cache_counts(s))
    s.events.emit("stopped", s.iter, last_checkpoint=s.last_saved)
    return 0


def _handle_control(s: Session, control: ControlReader, stop: "StopFlag") -> bool:
    """Applies control.jsonl commands; returns True when the run must stop. Pausing blocks here
    (models stay loaded; the monitor thread keeps the heartbeat fresh). Rank 0 reads the commands
    and its stop flag; every rank applies them (checkpoints and samples are collective)."""
    paused = False
    while True:
        commands, stopping = _poll_control(s, control, stop)
        for cmd in commands:
            if cmd == "stop":
                stopping = True
            elif cmd == "pause" and not paused:
                paused = True
                s.folder.write_status("paused", iter=s.iter)
                s.events.emit("paused", s.iter)
            elif cmd == "resume" and paused:
                paused = False
                s.folder.write_status("running", iter=s.iter)
                s.events.emit("resumed", s.iter)
            elif cmd == "sample_now":
                s.render_samples()
            elif cmd == "checkpoint_now":
                s.save_checkpoint()
        if stopping:
            stop.set()
            return True
        if not paused:
            return False
        time.sleep(0.2)


def _check_finite(s: Session, logs: LogSum) -> None:
    if s.world > 1 and any_rank(s.accelerator, logs.bad is not None):
        term, it = logs.bad or ("loss on another rank", s.iter + 1)
        raise NonFiniteLoss(term, it)


def _poll_control(s: Session, control: ControlReader, stop: "StopFlag") -> tuple[list, bool]:
    commands = [c.get("cmd") for c in control.poll()] if s.is_main else []
    stopping = stop.is_set() if s.is_main else False
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
               lr_generator=s.sched_g.get_last_lr()[0], lr_critic=s.sched_c.get_last_lr()[0])
    s.metrics.append({k: row.get(k) for k in METRIC_COLUMNS})
    remaining = s.cfg.optimization.max_train_steps - s.iter
    s.events.emit("metric", s.iter, **{k: v for k, v in row.items() if k != "iter"},
                  max_train_steps=s.cfg.optimization.max_train_steps,
                  eta_s=round(remaining * elapsed / w.iters, 1))
    w.reset()
