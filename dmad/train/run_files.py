"""The run folder's files and the engine process around the loop: logging (engine.log, stderr
that outlives its reader), the stop flag (SIGTERM / SIGINT), the engine's start time, what a full
disk or an out-of-memory error looks like, and writing / cutting back the run's files on start and
resume. dmad.train.run_open.open_run uses all of it; Session (dmad.train.session) none of it.
"""
from __future__ import annotations

import json
import logging
import signal
import threading
from pathlib import Path
from typing import Any, Optional

import torch

from dmad.contract.config import TrainConfig
from dmad.contract.events import EventWriter
from dmad.contract.methods import canonical_method
from dmad.contract.prompts import PromptSet, default_prompt_set_path, load_prompt_set, to_json
from dmad.contract.regular import fopen_regular, read_regular
from dmad.contract.runs import RunFolder
from dmad.contract.diskspace import disk_full as disk_full_error
from dmad.errors import DiskFull, UserInputError
from dmad.models.checkpoint import config_fingerprint

LIBRARY_LOGGERS = ("diffusers", "transformers", "accelerate", "peft", "torch")


class PipeSafeStream:
    """stderr that outlives its reader. When the app that started the engine exits and leaves the
    run going, the engine's stderr pipe has no reader: a later write (a log line, a library's
    print) would raise BrokenPipeError in the middle of training. Everything also goes to
    logs/engine.log, so once the reader is gone the writes are dropped."""

    def __init__(self, stream):
        self._stream, self.reader_gone = stream, False

    def write(self, text: str) -> int:
        if not self.reader_gone:
            try:
                self._stream.write(text)
            except (BrokenPipeError, ValueError):  # ValueError: the stream was closed
                self.reader_gone = True
        return len(text)

    def flush(self) -> None:
        if not self.reader_gone:
            try:
                self._stream.flush()
            except (BrokenPipeError, ValueError):
                self.reader_gone = True

    def __getattr__(self, name):  # fileno, isatty, encoding ...: those of the wrapped stream
        return getattr(self._stream, name)


class _QuietFileHandler(logging.FileHandler):
    """engine.log on a full disk: the line is lost (stderr still has it), and no 'Logging error'
    traceback is printed for it. Opened as a regular file only: a FIFO there is refused, never
    waited on (dmad.contract.regular)."""

    def _open(self):
        return fopen_regular(self.baseFilename, "a", encoding=self.encoding, errors=self.errors)

    def handleError(self, record: logging.LogRecord) -> None:
        pass


class NoTracebackFormatter(logging.Formatter):
    """stderr's formatter: a record's message without its traceback or stack (the CLI prints one
    line for a failure, never a traceback; logs/engine.log keeps it). The traceback a first handler
    cached on the record (exc_text) is hidden too, and put back for the handlers after this one."""

    def format(self, record: logging.LogRecord) -> str:
        saved = record.exc_info, record.exc_text, record.stack_info
        record.exc_info = record.exc_text = record.stack_info = None
        try:
            return super().format(record)
        finally:
            record.exc_info, record.exc_text, record.stack_info = saved


LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def setup_logging(path: Path) -> logging.Logger:
    """Engine log to stderr (without tracebacks) and logs/engine.log (with them); library chatter at
    WARNING, never on stdout."""
    path.parent.mkdir(parents=True, exist_ok=True)
    close_logging()
    root = logging.getLogger()
    for h, fmt in ((_QuietFileHandler(path, encoding="utf-8"), logging.Formatter(LOG_FORMAT)),
                   (logging.StreamHandler(__import__("sys").stderr), NoTracebackFormatter(LOG_FORMAT))):
        h.setFormatter(fmt)
        h._dmad = True  # type: ignore[attr-defined]
        root.addHandler(h)
    root.setLevel(logging.INFO)
    for name in LIBRARY_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    try:
        from diffusers.utils import logging as dlog
        from transformers.utils import logging as tlog

        dlog.disable_progress_bar()
        tlog.disable_progress_bar()
    except ImportError:
        pass
    return logging.getLogger("dmad")


def close_logging() -> None:
    """Remove and close the engine's log handlers (engine.log stays closed between in-process runs)."""
    root = logging.getLogger()
    for h in list(root.handlers):
        if getattr(h, "_dmad", False):
            root.removeHandler(h)
            h.close()


class StopFlag:
    """SIGTERM / SIGINT ask for a graceful stop (checkpoint, `stopped` event) at the next
    iteration boundary; a second SIGINT interrupts at once."""

    def __init__(self):
        self._event = threading.Event()
        self._old: dict[int, Any] = {}

    def install(self) -> "StopFlag":
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame) -> None:
        if signum == signal.SIGINT and self._event.is_set():
            raise KeyboardInterrupt
        self._event.set()

    def set(self) -> None:
        self._event.set()

    def is_set(self) -> bool:
        return self._event.is_set()

    def uninstall(self) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)
        self._old.clear()


def engine_started_at() -> float:
    """When this engine started (unix s): the launcher's start for a rank of a multi-process run
    (DMAD_STARTED_AT), else this process's own. Control commands stamped earlier were meant for an
    earlier engine (dmad.contract.runlog.ControlReader)."""
    import os

    import psutil

    try:
        return float(os.environ["DMAD_STARTED_AT"])
    except (KeyError, ValueError):
        return psutil.Process().create_time()


def disk_full(folder: RunFolder, s: Optional[Any], e: BaseException, advice: str = "",
              clean: bool = True) -> DiskFull:
    """What a full disk leaves: the partial checkpoint removed when `clean` (it must not keep holding
    the space), and one line naming what was being written, the space a checkpoint needs and the
    space free."""
    if clean:
        folder.clean_temp()
    name = getattr(e, "filename", None)
    what = "the run's files"
    if name and isinstance(name, (str, Path)):
        try:
            what = str(Path(name).resolve().relative_to(folder.path.resolve()))
        except (OSError, ValueError):
            what = str(name)
    needed = s.checkpoint_bytes if s is not None else None
    return disk_full_error(what, folder.path, needed, advice=advice or RESUME_ADVICE)


RESUME_ADVICE = "nothing complete was lost: free some space, then continue with --resume latest"


def is_oom(e: BaseException) -> bool:
    if isinstance(e, torch.OutOfMemoryError):
        return True
    return isinstance(e, RuntimeError) and ("out of memory" in str(e) or "can't allocate memory" in str(e))


# --------------------------------------------------------------------------- run folder files

def prepare_folder(folder: RunFolder, cfg: TrainConfig, resume: Optional[str], argv: list[str],
                   events: EventWriter, world: int = 1, reopened: bool = False) -> PromptSet:
    """Writes config.json, prompt_set.json, env.json and command.txt. A resumed run (or one started
    again, `reopened`) keeps its prompt set and appends its command; a changed config is a warning."""
    from dmad.train.env import collect_env

    prompt_set = load_prompt_set(cfg.observation.prompt_set or default_prompt_set_path())
    resolved = cfg.model_dump(mode="json")
    if resume or (reopened and folder.config_json.is_file()):
        changed = _config_changes(folder, resolved)
        if changed:
            events.emit("warning", None, message=f"resuming with a changed config: {', '.join(changed)}")
        prompt_set = _resumed_prompt_set(folder, prompt_set, events)
        command = read_regular(folder.command_txt).decode("utf-8", "replace") if folder.command_txt.is_file() else ""
        from dmad.contract.runs import atomic_write_text
        import shlex

        atomic_write_text(folder.command_txt, command + shlex.join(argv) + "\n")
    else:
        folder.write_command(argv)
        folder.write_json("prompt_set.json", to_json(prompt_set))
    folder.write_json("config.json", resolved)
    folder.write_json("env.json", collect_env())
    folder.write_status("running", iter=None, failure_reason=None, exit_code=None, advice=None)
    events.emit("started", None, run_dir=str(folder.path), config_fingerprint=config_fingerprint(resolved),
                resume_from=resume, max_train_steps=cfg.optimization.max_train_steps,
                effective_batch=cfg.effective_batch(world), num_processes=world, prompt_set=f"{prompt_set.name}-{prompt_set.version}")
    return prompt_set


def _resumed_prompt_set(folder: RunFolder, wanted: PromptSet, events: EventWriter) -> PromptSet:
    """On resume the run's own copy wins over an in-place edit of the same name + version
    (versions are immutable); another name or version replaces the copy, with a warning."""
    try:
        own = load_prompt_set(folder.prompt_set_json)
    except UserInputError:
        own = None
    if own is not None and (own.name, own.version) == (wanted.name, wanted.version):
        if own != wanted:
            events.emit("warning", None, message=f"prompt set {wanted.name}-{wanted.version} was edited in place; "
                                                 f"using the run's copy (save an edit as a new version)")
        return own
    if own is not None:
        events.emit("warning", None, message=f"prompt set changed on resume: {own.name}-{own.version} -> "
                                             f"{wanted.name}-{wanted.version}")
    folder.write_json("prompt_set.json", to_json(wanted))
    return wanted


def _config_changes(folder: RunFolder, resolved: dict) -> list[str]:
    try:
        old = json.loads(read_regular(folder.config_json).decode("utf-8"))
    except (OSError, ValueError, RecursionError):
        return []
    if not isinstance(old, dict):
        return []
    out = []
    for group, fields in resolved.items():
        if not isinstance(fields, dict):
            continue
        for k, v in fields.items():
            before = old.get(group, {}).get(k) if isinstance(old.get(group), dict) else None
            if (group, k) == ("distillation", "method"):
                before = canonical_method(before)  # a run from before "dmd2" was called "dmad" is unchanged
            if before != v and k != "resume_from_checkpoint":
                out.append(f"{group}.{k} {before!r} -> {v!r}")
    return out
