"""What the Training panel shows first of a run opened from its folder, read in a pool worker.

Opening a run reads its status.json (the state), its config.json (the method: which plots it fills)
and the tail of logs/engine.log. Each is small and opened non-blocking (dmad.contract.regular), yet a
stalled network drive (NFS, SMB) can hold any read for minutes: the GUI thread reads none of them.
`read_opened_run` runs in a worker; the panel shows its answer when it comes (app/panels/training.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from app.models.methods import read_method
from dmad.contract.regular import fopen_regular
from dmad.contract.runs import RunFolder

TAIL_BYTES = 65536  # the last 64 KiB of engine.log hold its last few hundred lines


@dataclass(frozen=True)
class OpenedRun:
    run_dir: Path
    status: Optional[dict]  # status.json; None when missing or not one the engine wrote
    method: Optional[str]   # config.json's distillation.method; None when unreadable
    log_tail: str           # the end of logs/engine.log ("" when missing or unreadable)


def read_log_tail(path: Path) -> str:
    """The end of a log file (one small read); "" when it is missing or not a regular file."""
    try:
        with fopen_regular(path, "rb") as f:  # a FIFO there is refused, never waited on
            f.seek(0, 2)
            f.seek(max(0, f.tell() - TAIL_BYTES))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def read_opened_run(run_dir: Path) -> OpenedRun:
    """Worker side: what opening `run_dir` shows before its events are replayed."""
    folder = RunFolder(run_dir)
    return OpenedRun(Path(run_dir), folder.read_status(), read_method(folder.config_json),
                     read_log_tail(folder.engine_log))
