"""Tail a run's events.jsonl: the history of a reopened run, then the live events of a run this
app did not start (or started before it was restarted).

Reads only the bytes added since the last read, in a pool worker (`read_slice`): a stalled network
drive holds a worker, never the window. One read is in flight at a time; its answer comes back on
the GUI thread, and an answer from before a `stop()` or `start()` is dropped. A torn last line (the
engine is mid-write, or was killed mid-write) waits for its newline. A file that does not exist yet
is polled until it does. A file that got shorter or was replaced (a resume cuts events.jsonl back to
its checkpoint with an atomic rename) is read again from byte 0 after `rewound` is emitted, so the
reader can drop what it plotted. A QFileSystemWatcher (inotify on Linux) wakes the reader as soon as
the engine writes; the timer poll is the fallback for file systems without notifications (network
drives) and for the moment after a replace, when the watcher has lost the old file.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from PySide6.QtCore import QFileSystemWatcher, QObject, QTimer, Signal

from app.engine.background import Task
from app.engine.process import event_dict
from dmad.contract.events import parse_line
from dmad.contract.regular import fopen_regular

POLL_MS = 100
# Bytes read and parsed per worker job: ~5,000 events. A long run's history comes in slices, so the
# plots fill as it is read and the GUI thread takes in one slice per event-loop turn.
CHUNK_BYTES = 2 * 1024 * 1024


@dataclass(frozen=True)
class Slice:
    """One read of events.jsonl (worker side), for the follower to take in on the GUI thread."""
    identity: Optional[tuple[int, int]]  # (st_dev, st_ino) read; None: nothing read (missing, locked)
    offset: int                          # where the next read starts: after the last complete line
    rewound: bool                        # the file was replaced or cut back: read again from byte 0
    events: list                         # [{"v","t","kind","iter","data"}, ...] of the complete lines
    at_end: bool                         # reached the end of the file


def read_slice(path: Path, offset: int, identity: Optional[tuple[int, int]]) -> Slice:
    """Worker side: the complete lines after `offset` of `path` (which was `identity`), parsed."""
    try:
        with fopen_regular(path, "rb") as f:  # a FIFO there: an OSError at once, never a wait
            st = os.fstat(f.fileno())
            now = (st.st_dev, st.st_ino)
            rewound = identity is not None and (now != identity or st.st_size < offset)
            offset = 0 if rewound else offset
            f.seek(offset)
            data = f.read(CHUNK_BYTES)
    except OSError:  # missing, locked, vanished or not a regular file: try again at the next poll
        return Slice(None, offset, False, [], True)
    complete = data[:data.rfind(b"\n") + 1]  # a torn last line waits for its newline
    events = [event_dict(ev) for ev in map(parse_line, complete.splitlines()) if ev is not None]
    at_end = offset + len(data) >= st.st_size or not complete
    return Slice(now, offset + len(complete), rewound, events, at_end)


class EventFollower(QObject):
    """`start(live=True)` follows until `stop()`; `stop_when_caught_up()` (the run ended) reads
    what is left, then stops and emits `ended`. `start(live=False)` reads a finished run to EOF."""

    events_received = Signal(list)  # [{"v","t","kind","iter","data"}, ...] in file order
    rewound = Signal()  # the file was cut back or replaced: everything read so far is void
    caught_up = Signal()  # reached the end of the file (once per start / rewind)
    ended = Signal()  # stopped after reaching the end of a run that is over

    def __init__(self, path: Path, parent: Optional[QObject] = None, poll_ms: int = POLL_MS):
        super().__init__(parent)
        self.path = Path(path)
        self._offset = 0
        self._identity: Optional[tuple[int, int]] = None  # (st_dev, st_ino) of the file being read
        self._live = False
        self._finishing = False
        self._announced_end = False
        self._timer = QTimer(self)
        self._timer.setInterval(poll_ms)
        self._timer.timeout.connect(self.poll)
        self._watcher = QFileSystemWatcher(self)
        self._watcher.fileChanged.connect(self._on_changed)
        self._more = QTimer(self)  # a zero-delay continuation while a long history is still unread
        self._more.setSingleShot(True)
        self._more.setInterval(0)
        self._more.timeout.connect(self.poll)
        self._reads = Task(self)  # read_slice in a pool worker, one at a time
        self._reads.done.connect(self._take)

    def is_active(self) -> bool:
        return self._timer.isActive() or self._more.isActive()

    def start(self, live: bool = True) -> None:
        self._reads.reset()
        self._live, self._finishing, self._announced_end = live, not live, False
        self._offset, self._identity = 0, None
        self._timer.start()
        self._more.start()

    def stop(self) -> None:
        self._timer.stop()
        self._more.stop()
        self._reads.reset()  # a read in flight answers nobody
        if self._watcher.files():
            self._watcher.removePaths(self._watcher.files())

    def stop_when_caught_up(self) -> None:
        """The run is over: read to the end of the file once more, then stop."""
        self._finishing = True
        if self._timer.isActive():
            self._more.start()

    def _on_changed(self, _path: str) -> None:
        if self._timer.isActive() and not self._more.isActive():
            self._more.start()

    def poll(self) -> None:
        """Ask a worker for what was appended; a read still in flight (a stalled drive) answers for
        this poll too, so reads never pile up in the pool."""
        if self._reads.busy():
            return
        path, offset, identity = self.path, self._offset, self._identity
        self._reads.submit(lambda: read_slice(path, offset, identity))

    def _take(self, got: Slice) -> None:
        """A worker's read, on the GUI thread."""
        if got.identity is not None:
            self._check_identity(got.identity, got.rewound)
            self._offset = got.offset
        if got.events:
            self.events_received.emit(got.events)
        if not got.at_end:
            self._more.start()
            return
        if not self._announced_end:
            self._announced_end = True
            self.caught_up.emit()
        if self._finishing and self.is_active():
            self.stop()
            self.ended.emit()

    def _check_identity(self, identity: tuple[int, int], rewound: bool) -> None:
        if self._identity is None:
            self._identity = identity
            self._watch()
        elif rewound:
            self._identity, self._announced_end = identity, False
            self._watch(renew=True)
            self.rewound.emit()

    def _watch(self, renew: bool = False) -> None:
        # A replaced file is a new inode: the old watch (if inotify kept it) would never fire again.
        if renew and self._watcher.files():
            self._watcher.removePaths(self._watcher.files())
        if self._live and str(self.path) not in self._watcher.files():
            self._watcher.addPath(str(self.path))
