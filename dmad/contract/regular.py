"""Opening a run folder's files without ever blocking: regular files only.

A FIFO, a socket, a device or a folder where a run folder keeps a file would hang a plain open()
(opening a FIFO waits for its other end) or fail later in a way no one can read. Every open of a
run-folder file, by the engine and by the app, goes through `open_regular`: the file is opened
with O_NONBLOCK (an open that cannot wait) and O_NOCTTY, fstat()ed, and refused unless it is a
regular file; then O_NONBLOCK is cleared, so reads and writes behave as usual. A refusal is
`NotRegularFile`, an OSError whose text is one line naming the file and what it is.

Torch-free and dependency-free: the lowest module of dmad.contract.
"""
from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import IO, Any, Optional, Union

PathLike = Union[str, "os.PathLike[str]"]

_NONBLOCK = getattr(os, "O_NONBLOCK", 0)  # Windows has no FIFOs to wait on, and no flag
_OPEN_FLAGS = _NONBLOCK | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_BINARY", 0)


def kind_of(mode: int) -> str:
    """What a stat mode names, in words ("a FIFO (named pipe)", "a folder" ...)."""
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a regular file"


class NotRegularFile(OSError):
    """`path` exists but is not a regular file (str: one line naming it and what it is)."""

    def __init__(self, path: PathLike, mode: int):
        self.path, self.kind = Path(path), kind_of(mode)
        super().__init__(errno.EINVAL, f"{self.path} is {self.kind}, not a regular file")

    def __str__(self) -> str:
        return self.strerror

    @property
    def short(self) -> str:
        """The same line with the file's name only (where the folder is said already)."""
        return f"{self.path.name} is {self.kind}, not a regular file"


def open_regular(path: PathLike, flags: int = os.O_RDONLY, mode: int = 0o666) -> int:
    """An fd of `path`, opened with `flags`, when it is a regular file (links followed);
    NotRegularFile when it is anything else, other OSErrors as os.open raises them. Never
    blocks: a FIFO is found out without waiting for its other end."""
    try:
        fd = os.open(path, flags | _OPEN_FLAGS, mode)
    except OSError as e:
        # O_WRONLY on a FIFO with no reader is ENXIO, on a folder EISDIR: say what is there instead.
        if e.errno in (errno.ENXIO, errno.EISDIR, errno.ENODEV, errno.EOPNOTSUPP, errno.EACCES, errno.EPERM):
            _refuse_non_regular(path)
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegularFile(path, st.st_mode)
        if _NONBLOCK:
            os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _refuse_non_regular(path: PathLike) -> None:
    try:
        st = os.stat(path)
    except OSError:
        return
    if not stat.S_ISREG(st.st_mode):
        raise NotRegularFile(path, st.st_mode) from None


def fopen_regular(path: PathLike, mode: str = "rb", **kwargs: Any) -> IO:
    """open(path, mode) through open_regular: "rb", "r", "ab", "a", "r+b" (text modes take
    encoding / errors / newline)."""
    flags = {"r": os.O_RDONLY, "a": os.O_WRONLY | os.O_CREAT | os.O_APPEND,
             "r+": os.O_RDWR}[mode.replace("b", "").replace("t", "")]
    fd = open_regular(path, flags)
    try:
        return os.fdopen(fd, mode, **kwargs)
    except BaseException:
        os.close(fd)
        raise


def read_regular(path: PathLike, limit: Optional[int] = None) -> bytes:
    """The bytes of a regular file (its first `limit` bytes when given)."""
    with fopen_regular(path, "rb") as f:
        return f.read() if limit is None else f.read(limit)


def irregular(path: PathLike) -> Optional[str]:
    """One line when `path` exists (links followed) and is not a regular file; None when it is
    one or is absent. A stat only: nothing is opened."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return None if stat.S_ISREG(st.st_mode) else str(NotRegularFile(path, st.st_mode))
