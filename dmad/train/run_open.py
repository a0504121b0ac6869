"""A run folder opened for training (open_run): the one-writer lock, the cut-back on resume, the
files, logging, events, status and heartbeat, control commands read from the engine's start, and
what a failure, a full disk or a stop before training leaves there. `dmad train` (dmad.train.loop)
and `dmad probe` points (dmad.train.probe_point) train inside it.
"""
from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Sequence

from dmad.contract.config import TrainConfig
from dmad.contract.events import (CAUSE_DISK_FULL, CAUSE_EXCEPTION, CAUSE_INTERRUPTED, CAUSE_NON_FINITE_LOSS,
                                  CAUSE_OUT_OF_MEMORY, EventWriter)
from dmad.contract.prompts import load_prompt_set
from dmad.contract.diskspace import disk_full as disk_full_error
from dmad.contract.diskspace import is_disk_full
from dmad.contract.runs import LOCK_NAME, ControlReader, RunFolder, RunLock
from dmad.errors import EXIT_INVALID_INPUT, DiskFull, DmadError, StopRequested
from dmad.methods.unit import NonFiniteLoss
from dmad.train.build import build, make_accelerator
from dmad.train.control import handle_control
from dmad.train.folder_undo import FolderSnapshot
from dmad.train.launch import world_rank
from dmad.train.monitor import Monitor
from dmad.train.oom import Phase, advice, classify
from dmad.train.ranks import NullEvents, NullMonitor, ReadOnlyFolder, broadcast, record_failure
from dmad.train.run_files import (PipeSafeStream, StopFlag, close_logging, disk_full, engine_started_at, is_oom,
                                  prepare_folder, setup_logging)
from dmad.train.session import Session
from dmad.train.trainer import Trainer


NOTHING_CHANGED = "the run folder was left as it was: free some space, then start again"


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
    accelerator: Any  # joined process group with several processes, else None (dmad.train.build.build makes one)
    resume: Optional[str]
    restart: bool = False  # --resume latest of a run with no checkpoint: from iteration 0 in the same folder
    session: Optional[Session] = None
    trainer: Optional[Trainer] = None
    exit_code: int = 0
    committed: bool = False  # the run continues from a loaded state: a failure from here on is the run's

    def build(self) -> tuple[Session, Trainer]:
        self.phase.set("loading")
        self.session, self.trainer = build(self.cfg, self.folder, self.prompt_set, self.events, self.log, self.monitor,
                                           self.accelerator, self.resume, between_phases=self.between_phases,
                                           loaded=self.commit)
        return self.session, self.trainer

    def commit(self, iteration: int) -> None:
        """Everything has loaded and the run continues from `iteration` (the checkpoint's; 0 for a
        fresh start or a start again). Only now is what an earlier engine logged after that
        iteration dropped (metrics rows, events, leftover temp checkpoints), so each iteration
        appears once; a start refused before this point leaves the folder as it found it."""
        if self.folder.is_writer and (self.resume or self.restart):
            self.folder.clean_temp()
            with self.events.paused() as own:
                self.folder.truncate_after(iteration, events_from=own)
        self.committed = True

    def between_phases(self, collective: bool = True) -> None:
        """Control commands at a boundary before training (data opened, teacher loaded, each teacher
        sample): stop raises StopRequested, pause waits here for resume or stop, and sample_now /
        checkpoint_now wait for the loop. Rank 0 reads; with several processes the outcome is
        broadcast when `collective` (every rank is at the same boundary)."""
        stopping = None
        if self.folder.is_writer:  # sample_now and checkpoint_now wait: there is no student to sample or save yet
            stopping = handle_control(self._poll, self._announce, self.control.defer)
        if collective and self.accelerator is not None:
            stopping = broadcast(self.accelerator, stopping)
        if stopping:
            raise StopRequested()

    def _poll(self) -> tuple[list[dict], Optional[str]]:
        return self.control.poll(), "stop" if self.stop.is_set() else None

    def _announce(self, state: str, event: str) -> None:
        self.folder.write_status(state)
        self.events.emit(event, None, phase=self.phase.name)


@contextlib.contextmanager
def open_run(cfg: TrainConfig, run_dir: Path, resume: Optional[str], argv: list[str], restart: bool = False,
             skipped: Sequence[str] = ()) -> Iterator[OpenRun]:
    """The run folder, logging, events, status and heartbeat around whatever trains in it (the loop,
    or a `dmad probe` point), and what a failure leaves there: an error event, a failed status,
    one line on stderr and the exit code (1, 3 out of memory, 130 interrupted) in `exit_code`.
    A DmadError (bad input) is recorded and re-raised for the CLI to print. Rank 0 holds the run
    folder's lock (dmad.contract.runs.RunLock) from before its first write to after its last. A start
    refused with exit 2 before it commits (OpenRun.commit) leaves the folder byte for byte as it
    was (dmad.train.folder_undo): the history of a run is cut back only once a checkpoint has loaded."""
    phase = Phase()  # a bad DMAD_FAULT is refused before the run folder is touched
    rank, world = world_rank()
    # joins the process group
    acc = make_accelerator(cfg.resources.mixed_precision, cfg.observation.report_to, run_dir) if world > 1 else None
    main = rank == 0
    refused = False  # a start refused before it committed (exit 2): the folder goes back as it was
    folder, before, lock = _open_folder(run_dir, resume, restart, main, acc)
    control = _control_reader(folder, main)
    real_stderr, sys.stderr = sys.stderr, PipeSafeStream(sys.stderr)  # before logging takes its handle
    log = setup_logging(folder.engine_log if main else folder.logs_dir / f"rank_{rank}.log")
    real_stdout, sys.stdout = sys.stdout, sys.stderr  # library print()s must never reach the event stream
    events = EventWriter(folder.events_jsonl, stream=real_stdout) if main else NullEvents()
    control.on_problem = lambda problem: _control_off(events, log, problem)
    run = OpenRun(cfg, folder, events, log, None, None, phase, StopFlag().install(), control, acc, resume, restart)

    def sampled(row: dict) -> None:  # the sampler's events carry the iteration once there is one
        it = run.session.progress.iter if run.session is not None else None
        # never after the run's ending event: the sampler runs until the monitor stops, after it
        events.emit_unless_ended("metric", it, source="sampler", **{k: v for k, v in row.items() if k != "t"})

    run.monitor = Monitor(folder, None, cfg.observation.gpu_mem_interval_s, on_sample=sampled) if main else NullMonitor()
    try:
        _prepare(run, main, world, argv, skipped)
        yield run
    except StopRequested:
        run.exit_code = _stopped_early(run)
    except NonFiniteLoss as e:
        run.exit_code = _fail(folder, events, run.session, f"{e}; the last good checkpoint is kept", 1, term=e.term,
                              cause=CAUSE_NON_FINITE_LOSS)
    except DmadError as e:
        refused = main and not run.committed and (e.exit_code == EXIT_INVALID_INPUT or isinstance(e, DiskFull))
        if not refused:
            if isinstance(e, DiskFull):
                folder.clean_temp()
            _fail(folder, events, run.session, str(e), e.exit_code, quiet=True,
                  cause=CAUSE_DISK_FULL if isinstance(e, DiskFull) else type(e).__name__)
        raise
    except BaseException as e:
        s = run.session
        if is_disk_full(e):
            refused = main and not run.committed  # a start that filled the disk leaves the folder as it was
            full = disk_full(folder, s, e, advice=NOTHING_CHANGED if refused else "", clean=not refused)
            if not refused:
                _fail(folder, events, s, str(full), full.exit_code, cause=CAUSE_DISK_FULL, quiet=True)
            raise full from None
        _failed(run, e, rank)  # out of memory: exit code 3 in run.exit_code; anything else raised
    finally:
        run.stop.uninstall()
        run.monitor.stop()
        if run.session is not None:
            run.session.files.metrics.close()
        if not refused:
            _quietly(folder.update_status, control_offset=control.offset)  # the next engine starts after these
        events.close()
        close_logging()
        sys.stdout, sys.stderr = real_stdout, real_stderr
        if refused:
            for problem in _restore(before, lock.rewrite):
                print(f"dmad: warning: {problem}", file=sys.stderr, flush=True)
        if lock is not None:
            lock.release()
        if world == 1:
            _release_accelerate_state()


def _failed(run: OpenRun, e: BaseException, rank: int) -> None:
    """What an unexpected exception `e` (being handled) leaves: out of memory is recorded by phase with
    its advice (exit code 3 in run.exit_code); an interrupt is recorded and re-raised; anything else is
    recorded with its traceback in the log file only (stderr's formatter leaves it out) and raised as
    one DmadError line."""
    folder, events, s, phase = run.folder, run.events, run.session, run.phase
    if is_oom(e):
        where = classify(phase.name)
        tip = advice(where, run.cfg.resources)
        folder.write_status("failed", advice=tip)
        run.exit_code = _fail(folder, events, s, f"out of memory during {where}: {str(e).splitlines()[0][:200]}",
                              3, cause=CAUSE_OUT_OF_MEMORY, phase=where, advice=tip)
        return
    if isinstance(e, KeyboardInterrupt):
        _fail(folder, events, s, "interrupted", 130, cause=CAUSE_INTERRUPTED, quiet=True)
        raise e
    run.log.error("unexpected failure in phase %s: %s: %s", phase.name, type(e).__name__, e, exc_info=True)
    if rank != 0:
        record_failure(folder, rank, f"{type(e).__name__}: {e} (in {phase.name})")
    _fail(folder, events, s, f"{type(e).__name__}: {e} (in {phase.name}; details in {folder.engine_log})", 1,
          cause=CAUSE_EXCEPTION, quiet=True)
    raise DmadError(f"{type(e).__name__}: {e} (details in {folder.engine_log})") from None


def _open_folder(run_dir: Path, resume: Optional[str], restart: bool, main: bool, acc) -> tuple[Any, Any, Any]:
    """(folder, the snapshot a refused start restores, the lock): rank 0 opens the run folder (or
    makes it) and takes its lock before its first write; the other ranks read it once it exists."""
    lock = before = None
    if main:
        reopen = resume or (restart and RunFolder(run_dir).config_json.is_file())
        before = FolderSnapshot.take(run_dir)  # before the first write, mkdir included
        try:
            folder = RunFolder.open(run_dir) if reopen else RunFolder.create(run_dir)
            folder.check_confined()  # nothing is written before: a link out of the folder is refused
            lock = RunLock(run_dir).acquire()  # a second engine stops here, with nothing touched
        except BaseException as e:
            if not is_disk_full(e):
                raise
            _restore(before)  # no skeleton folder, no half-written lock file
            name = getattr(e, "filename", None)  # a folder of the skeleton, or the lock
            what = Path(name).name if name and isinstance(name, (str, Path)) else LOCK_NAME
            raise disk_full_error(what, run_dir, advice=NOTHING_CHANGED) from None
    if acc is not None:
        acc.wait_for_everyone()  # rank 0 made the folder
    if not main:
        folder = ReadOnlyFolder(run_dir)
    return folder, before, lock


def _restore(before: FolderSnapshot, write_lock: Optional[Callable[[bytes], None]] = None) -> list[str]:
    """Put the run folder back as this start found it (a refused start, or one that filled the disk);
    the problems met, as lines. On a full disk a file may not go back: that is one of the lines."""
    try:
        return before.restore(write_lock=write_lock)
    except OSError as e:
        return [f"{before.root} could not be put back as it was: {e.strerror or e}"]


def _control_reader(folder, main: bool) -> ControlReader:
    """control.jsonl from where the previous engine stopped reading; commands older than this
    engine's start are ignored."""
    previous = folder.read_status() or {} if main else {}
    offset = previous.get("control_offset")
    return ControlReader(folder.control_jsonl, offset=offset if isinstance(offset, int) else 0,
                         since=engine_started_at())


def _control_off(events, log, problem: str) -> None:
    """control.jsonl stopped being a regular file (a FIFO swapped in): said once, in the log and as a
    warning event the app shows; training goes on, and commands are read again once it is a file."""
    message = (f"{problem}: control commands are not read while it is so (training goes on; the app's Stop "
               f"signals the engine instead)")
    log.warning(message)
    events.emit("warning", None, message=message, control="off")


def _prepare(run: OpenRun, main: bool, world: int, argv: list[str], skipped: Sequence[str]) -> None:
    """Rank 0 writes the run's files (config, prompt set, env, command) and says what this start passed
    over; every rank reads the run's prompt set; the monitor starts."""
    if main:
        run.prompt_set = prepare_folder(run.folder, run.cfg, run.resume, argv, run.events, world,
                                        reopened=run.restart)
        for reason in skipped:
            run.events.emit("warning", None, message=f"passed over a damaged checkpoint: {reason}")
        if run.restart:
            run.events.emit("warning", None, message=f"no complete checkpoint in {run.folder.checkpoints_dir}: "
                                                     f"starting again from iteration 0")
    if run.accelerator is not None:
        run.accelerator.wait_for_everyone()  # rank 0 wrote the run's prompt set
    if not main:
        run.prompt_set = load_prompt_set(run.folder.prompt_set_json)
    run.monitor.start()


def _release_accelerate_state() -> None:
    """accelerate keeps one state per process and refuses a second Accelerator with another mixed
    precision ("AcceleratorState has already been initialized"): a run inside a longer-lived
    process (a script calling run_training twice, the tests) leaves none behind. A rank of a
    multi-process run ends with its process; its process group is not touched."""
    from accelerate.state import AcceleratorState, GradientState

    from dmad.train.sharding import release_own_process_group

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    release_own_process_group()  # a one-process fsdp run's group of one


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
    it = s.progress.iter if s is not None else None
    last = run.folder.latest_checkpoint() if run.folder.is_writer else None
    run.folder.write_status("stopped", iter=it)
    run.events.emit("stopped", it, last_checkpoint=last[0] if last else None, phase=run.phase.name)
    return 0


def _fail(folder: RunFolder, events: EventWriter, s: Optional[Session], reason: str, code: int,
          quiet: bool = False, **data) -> int:
    """Error event + failed status; one line on stderr unless the CLI prints the exception itself.
    Each write is tried on its own: a full disk must not hide the reason."""
    last = folder.latest_checkpoint()
    it = s.progress.iter if s is not None else None
    _quietly(events.emit, "error", it, reason=reason, exit_code=code, last_checkpoint=last[0] if last else None,
             **data)
    _quietly(folder.write_status, "failed", failure_reason=reason, exit_code=code)
    if not quiet:
        print(f"dmad: error: {reason}", file=sys.stderr, flush=True)
    return code
