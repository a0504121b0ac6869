"""What a refused start leaves in its run folder: exactly what was there before.

An engine opens its run folder before it can know everything (a checkpoint's tensors only load
once the teacher and the networks are built, which can take minutes for a large family), and it
must say it is alive meanwhile: status.json `running` with its pid and heartbeat, the `started`
and `phase` events, engine.log, gpu_mem.csv. When that start is then refused (exit 2: a
checkpoint that does not fit the config, a bad input found while loading), FolderSnapshot.restore
puts every file back as it was: the files the engine rewrites whole (config.json, status.json ...)
byte for byte, the append-only logs cut back to their old length, and whatever it created
removed; a folder it created is removed whole. The history of a run is never cut by a start that
did not happen (dmad.train.run_open commits to a checkpoint, and cuts the logs back to it, only
once it has loaded).

Cost: one walk of the folder's names (checkpoints and samples included: names only) and a read of
the few small files the engine rewrites, before the first write.
"""
from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from dmad.contract.runs import LOCK_NAME, atomic_write_bytes

CONTROL_NAME = "control.jsonl"  # the app's to write: never touched

# Rewritten whole by an engine's start: kept byte for byte (the lock file goes back through the
# lock's own descriptor, see restore).
REWRITTEN = ("config.json", "prompt_set.json", "env.json", "command.txt", "status.json", LOCK_NAME)
# Appended to while the engine runs: their old length, and the last bytes (a torn last row or line
# is cut when a writer opens the file).
APPENDED = ("events.jsonl", "metrics.csv", "health.csv", "gpu_mem.csv")
TAIL_BYTES = 1 << 20
WHOLE_MAX_BYTES = 64 << 20  # a planted giant status.json is not copied into memory; it is left as it is


@dataclass
class FolderSnapshot:
    root: Path
    existed: bool
    absent_parents: list[Path] = field(default_factory=list)  # ancestors the start may create, deepest first
    entries: set[str] = field(default_factory=set)  # relative paths there were (files, folders, links)
    whole: dict[str, bytes] = field(default_factory=dict)
    tails: dict[str, tuple[int, bytes]] = field(default_factory=dict)  # relative path: (size, last bytes)

    @classmethod
    def take(cls, root: Path) -> "FolderSnapshot":
        root = Path(root)
        if not root.is_dir() or root.is_symlink():
            absent = []
            for p in [root, *root.parents]:
                if os.path.lexists(p):
                    break
                absent.append(p)
            return cls(root, existed=False, absent_parents=absent)
        snap = cls(root, existed=True)
        for folder, dirs, files in os.walk(root):
            rel = Path(folder).relative_to(root)
            for name in dirs + files:
                snap.entries.add(str(rel / name))
        for name in REWRITTEN:
            data = _read_regular(root / name, WHOLE_MAX_BYTES)
            if data is not None:
                snap.whole[name] = data
        for rel in [*APPENDED, *(f"logs/{p.name}" for p in _logs(root))]:
            tail = _tail(root / rel)
            if tail is not None:
                snap.tails[rel] = tail
        return snap

    def restore(self, write_lock: Optional[Callable[[bytes], None]] = None) -> list[str]:
        """Put the folder back as it was. `write_lock` rewrites the lock file through the lock's
        own descriptor (replacing it while locked would let a second engine lock a new inode).
        Returns the problems met (a file someone else shortened meanwhile), for the log."""
        if not self.existed:
            shutil.rmtree(self.root, ignore_errors=True)
            for p in self.absent_parents[1:]:  # parents made on the way, when nothing else is in them
                try:
                    p.rmdir()
                except OSError:
                    break
            return []
        problems = self._remove_new()
        for rel, data in self.whole.items():
            path = self.root / rel
            if _read_regular(path, WHOLE_MAX_BYTES) == data:
                continue
            if rel == LOCK_NAME and write_lock is not None:
                write_lock(data)
            else:
                atomic_write_bytes(path, data)
        for rel, (size, tail) in self.tails.items():
            problem = _restore_tail(self.root / rel, size, tail)
            if problem:
                problems.append(problem)
        return problems

    def _remove_new(self) -> list[str]:
        problems = []
        for folder, dirs, files in os.walk(self.root, topdown=False):
            rel = Path(folder).relative_to(self.root)
            for name in files + dirs:
                r = str(rel / name)
                if r in self.entries or r == CONTROL_NAME:
                    continue
                path = Path(folder) / name
                try:
                    if path.is_dir() and not path.is_symlink():
                        shutil.rmtree(path)
                    else:
                        path.unlink()
                except OSError as e:
                    problems.append(f"{path}: {e.strerror or e}")
        return problems


def _logs(root: Path) -> list[Path]:
    try:
        return [p for p in (root / "logs").iterdir() if p.suffix == ".log"]
    except OSError:
        return []


def _is_regular(path: Path) -> bool:
    try:
        return path.is_file() and not path.is_symlink()
    except OSError:
        return False


def _read_regular(path: Path, limit: int) -> Optional[bytes]:
    if not _is_regular(path) or path.stat().st_size > limit:
        return None
    try:
        return path.read_bytes()
    except OSError:
        return None


def _tail(path: Path) -> Optional[tuple[int, bytes]]:
    if not _is_regular(path):
        return None
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            f.seek(max(0, size - TAIL_BYTES))
            return size, f.read()
    except OSError:
        return None


def _restore_tail(path: Path, size: int, tail: bytes) -> Optional[str]:
    """Cut an appended file back to `size`, with its last bytes as they were (a writer that opened
    it may have cut a torn last line)."""
    start = size - len(tail)
    try:
        with open(path, "r+b") as f:
            if os.fstat(f.fileno()).st_size < start:
                return f"{path} is shorter than before this start; left as it is"
            f.truncate(start)
            f.seek(start)
            f.write(tail)
    except FileNotFoundError:
        return f"{path} was removed during this start"
    except OSError as e:
        return f"{path}: {e.strerror or e}"
    return None
