"""A full disk, told the same way by every writer (train, export, sample, check-data, bench).

is_disk_full recognises it: an OSError ENOSPC / EDQUOT, and the Rust safetensors writer's
SafetensorError (no OSError: known by the OS's text in its message, "No space left on device (os
error 28)"). disk_full makes the one line: what was being written, about how many bytes it needs
and how many are free. check_free_space refuses work that cannot fit before it starts, and
complete_or_absent removes what a failed write made. Torch-free: the app and the CLI import it.
"""
from __future__ import annotations

import contextlib
import errno
import os
import shutil
from pathlib import Path
from typing import Callable, Iterator, Optional, Union

from dmad.errors import DiskFull, UserInputError

DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)})
# What a writer that is no Python OSError (Rust's std::io::Error in safetensors, a C library) says.
DISK_FULL_TEXTS = ("No space left on device", "Disk quota exceeded", f"(os error {errno.ENOSPC})")
Needed = Union[int, None, Callable[[], Optional[int]]]


def is_disk_full(e: BaseException) -> bool:
    """The disk (or the user's quota) is full: an OSError ENOSPC / EDQUOT, or an error whose message
    is the OS's (safetensors' SafetensorError), also as the cause of the error raised."""
    seen = 0
    while e is not None and seen < 8:
        if isinstance(e, OSError) and e.errno is not None:
            if e.errno in DISK_FULL_ERRNOS:
                return True
        elif any(text in str(e) for text in DISK_FULL_TEXTS):
            return True
        e, seen = e.__cause__ or e.__context__, seen + 1
    return False


def free_bytes(path: Path) -> Optional[int]:
    """Free bytes (for this user) on the file system of `path`, or of its nearest existing folder;
    None when it cannot be told."""
    path = Path(path)
    for p in [path, *path.parents]:
        try:
            if p.is_dir():
                return shutil.disk_usage(p).free
        except OSError:
            return None
    return None


def size_text(n: int) -> str:
    """12 bytes, 3.4 kB, 28.1 MB, 2.05 GB (decimal units, as file managers show)."""
    if n < 1000:
        return f"{n} bytes"
    for unit, scale in (("kB", 1e3), ("MB", 1e6), ("GB", 1e9)):
        if n < scale * 1000:
            return f"{n / scale:.1f} {unit}"
    return f"{n / 1e12:.2f} TB"


def disk_full_message(what: str, where: Path, needed: Optional[int]) -> str:
    """'out of disk space writing <what> in <where>: needs about N, M free'."""
    free = free_bytes(where)
    need = f"needs about {size_text(needed)}" if needed else "needs more space"
    return f"out of disk space writing {what} in {where}: {need}, " + (
        f"{size_text(free)} free" if free is not None else "free space unknown")


def disk_full(what: str, where: Path, needed: Needed = None, advice: str = "") -> DiskFull:
    """The DiskFull (exit 1) whose one line is disk_full_message, then `advice` after a semicolon."""
    try:
        need = needed() if callable(needed) else needed
    except Exception:  # noqa: BLE001 - sizing is for the message only
        need = None
    return DiskFull(disk_full_message(what, where, need) + (f"; {advice}" if advice else ""))


@contextlib.contextmanager
def reporting_disk_full(what: str, where: Path, needed: Needed = None, advice: str = "") -> Iterator[None]:
    """A full disk inside the block becomes DiskFull (one line, exit 1); other errors pass."""
    try:
        yield
    except BaseException as e:
        if isinstance(e, DiskFull) or not is_disk_full(e):
            raise
        raise disk_full(what, where, needed, advice) from None


def check_free_space(what: str, where: Path, needed: int, advice: str = "") -> None:
    """UserInputError (exit 2) when the file system of `where` has less than `needed` bytes free:
    work that cannot be written is refused before it starts, with nothing written."""
    free = free_bytes(where)
    if free is not None and free < needed:
        raise UserInputError(f"not enough disk space in {where} for {what}: needs about {size_text(needed)}, "
                             f"{size_text(free)} free" + (f" ({advice})" if advice else ""))


@contextlib.contextmanager
def complete_or_absent(path: Path) -> Iterator[Path]:
    """The block makes `path` (a file or a folder that does not exist yet): when it fails, `path`
    is removed, and so are the folders above it that the block made and left empty."""
    made = missing_folders(path)
    try:
        yield path
    except BaseException:
        remove_made(made)
        raise


def missing_folders(path: Path) -> list[Path]:
    """`path` and those of its parents that do not exist, deepest first (what making it makes)."""
    made = []
    for p in [Path(path), *Path(path).parents]:
        if os.path.lexists(p):
            break
        made.append(p)
    return made


def remove_made(made: list[Path]) -> None:
    """Remove made[0] (a file or a folder tree) and then made[1:] (its parents, deepest first) while empty."""
    if not made:
        return
    first = made[0]
    if first.is_dir() and not first.is_symlink():
        shutil.rmtree(first, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            first.unlink()
    for p in made[1:]:
        try:
            p.rmdir()
        except OSError:
            break
