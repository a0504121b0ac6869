"""Deleting, renaming and annotating run folders (the Runs tab), as plain functions for pool workers.

Each action reads the run's status.json again right before it acts and refuses a live run (an engine
writes it: a rename would pull the folder from under it, a delete would lose it), whatever the table
showed a second ago. A folder moves to the desktop's trash when QFile.moveToTrash can put it there;
only then is a permanent delete offered, and it is the caller's question to ask. A note is
<run>/note.txt, written atomically (dmad.contract.runs.atomic_write_text): the engine never reads it.
"""
from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from PySide6.QtCore import QFile

from dmad.contract.regular import fopen_regular
from dmad.contract.runs import LIVE_STATES, RunFolder, atomic_write_text, effective_state

NOTE_NAME = "note.txt"
NOTE_MAX_BYTES = 65536  # a note is a few lines; a bigger file is not ours to load into a table
# Characters no folder name may hold on Windows, macOS or Linux (a run folder moves between them)
FORBIDDEN = set('<>:"/\\|?*')
RESERVED = {"CON", "PRN", "AUX", "NUL", *(f"COM{i}" for i in range(1, 10)), *(f"LPT{i}" for i in range(1, 10))}


class RunBusy(Exception):
    """The action would touch a live run, or the folder cannot take it; the message says which."""


@dataclass(frozen=True)
class FileResult:
    """What a worker did: `kind` (trash, delete, rename, note), the folder before and after, one line."""
    kind: str
    path: Path
    new_path: Optional[Path]
    message: str
    ok: bool = True
    trash_failed: bool = False  # moveToTrash could not: the caller may offer a permanent delete


def live_state(path: Path) -> Optional[str]:
    """The run's live state ("running", "paused", "stopping") or None when no engine is behind it."""
    state = effective_state(RunFolder(path).read_status())
    return state if state in LIVE_STATES else None


def _refuse_live(path: Path, action: str) -> None:
    state = live_state(path)
    if state is not None:
        raise RunBusy(f"{path.name} is {state}: stop it before you {action} it")


def name_problem(root: Path, old: Path, name: str) -> str:
    """Why `name` cannot be the new folder name of `old` under `root` ("" when it can)."""
    if not name or name != name.strip():
        return "the name is empty or starts or ends with a space"
    if name in (".", "..") or name.startswith(".") or name.endswith("."):
        return "the name may not start or end with a dot (a hidden folder is not listed)"
    bad = sorted({c for c in name if c in FORBIDDEN or ord(c) < 32})
    if bad:
        return "the name may not contain " + " ".join(repr(c) for c in bad)
    if name.split(".")[0].upper() in RESERVED:
        return f"{name} is a reserved device name on Windows"
    if len(name.encode("utf-8")) > 255:
        return "the name is longer than 255 bytes"
    if name == old.name:
        return "that is its name already"
    if (Path(root) / name).exists() or os.path.lexists(Path(root) / name):
        return f"{name} exists already in {root}"
    return ""


def rename_run(root: Path, path: Path, name: str) -> FileResult:
    problem = name_problem(root, path, name)
    if problem:
        raise RunBusy(problem)
    _refuse_live(path, "rename")
    target = Path(root) / name
    os.rename(path, target)  # same folder: atomic, and never over an existing name (checked just above)
    return FileResult("rename", path, target, f"renamed {path.name} to {name}")


def trash_run(path: Path) -> FileResult:
    _refuse_live(path, "delete")
    answer = QFile.moveToTrash(str(path))  # PySide answers a bool, or (bool, path in the trash) on some versions
    ok, where = answer if isinstance(answer, tuple) else (bool(answer), "")
    if not ok:
        return FileResult("trash", path, None, f"{path.name} could not be moved to the trash", ok=False,
                          trash_failed=True)
    return FileResult("trash", path, Path(where) if where else None, f"moved {path.name} to the trash")


def delete_run(path: Path) -> FileResult:
    """Permanently: the caller has asked. Refused for a live run, like every action here."""
    _refuse_live(path, "delete")
    shutil.rmtree(path)
    return FileResult("delete", path, None, f"deleted {path.name} permanently")


def write_note(path: Path, text: str) -> FileResult:
    """<run>/note.txt holds `text` (an empty note removes the file)."""
    note = Path(path) / NOTE_NAME
    text = text.strip()
    if text:
        atomic_write_text(note, text + "\n")
    else:
        note.unlink(missing_ok=True)
    return FileResult("note", path, path, f"note of {path.name} " + ("saved" if text else "removed"))


def read_note(path: Path) -> str:
    """A note.txt's text ("" when unreadable or not a note: too big, binary)."""
    try:
        with fopen_regular(path, "rb") as f:  # a FIFO there is refused, never waited on
            data = f.read(NOTE_MAX_BYTES + 1)
    except OSError:
        return ""
    if len(data) > NOTE_MAX_BYTES:
        return ""
    return data.decode("utf-8", errors="replace").strip()
