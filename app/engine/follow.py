"""Tail a run's events.jsonl: the history of a reopened run, then the live events of a run this
app did not start (or started before it was restarted).

Reads only the bytes added since the last read. A torn last line (the engine is mid-write, or was
killed mid-write) waits for its newline. A file that does not exist yet is polled until it does.
A file that got shorter or was replaced (a resume cuts events.jsonl back to its checkpoint with an
atomic rename) is read again from byte 0 after `rewound` is emitted, so the reader can drop what
it plotted. A QFileSystemWatcher (inotify on Linux) wakes the reader as soon as the engine writes;
the timer poll is the fallback for file systems without notifications (network drives) and for
the moment after a replace, when the watcher has lost the old file.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

from PySide6.QtCore import QFileSystemWatcher, QObject, QTimer, Signal

from app.engine.process import event_dict
from dmad.contract.events import parse_line
from dmad.contract.regular import fopen_regular

POLL_MS = 100
# Bytes parsed per wake-up: ~5,000 events (~25 ms of json parsing). A long run's history is read
# in slices over a few event-loop turns, so opening it never freezes the window.
CHUNK_BYTES = 2 * 1024 * 1024


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

    def is_active(self) -> bool:
        return self._timer.isActive() or self._more.isActive()

    def start(self, live: bool = True) -> None:
        self._live, self._finishing, self._announced_end = live, not live, False
        self._offset, self._identity = 0, None
        self._timer.start()
        self._more.start()

    def stop(self) -> None:
        self._timer.stop()
        self._more.stop()
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
        chunk, at_end = self._read_new()
        if chunk:
            events = [event_dict(ev) for ev in map(parse_line, chunk.splitlines()) if ev is not None]
            if events:
                self.events_received.emit(events)
        if not at_end:
            self._more.start()
            return
        if not self._announced_end:
            self._announced_end = True
            self.caught_up.emit()
        if self._finishing and self.is_active():
            self.stop()
            self.ended.emit()

    def _read_new(self) -> tuple[bytes, bool]:
        """(complete new lines, reached end of file)."""
        try:
            with fopen_regular(self.path, "rb") as f:  # a FIFO there: an OSError at once, never a wait
                st = os.fstat(f.fileno())
                self._check_identity((st.st_dev, st.st_ino), st.st_size)
                f.seek(self._offset)
                data = f.read(CHUNK_BYTES)
        except FileNotFoundError:
            return b"", True
        except OSError:
            return b"", True  # a locked or vanished file: try again at the next poll
        complete = data[:data.rfind(b"\n") + 1]  # a torn last line waits for its newline
        self._offset += len(complete)
        at_end = self._offset + (len(data) - len(complete)) >= st.st_size or not complete
        return complete, at_end

    def _check_identity(self, identity: tuple[int, int], size: int) -> None:
        if self._identity is None:
            self._identity = identity
            self._watch()
        elif identity != self._identity or size < self._offset:
            self._identity, self._offset, self._announced_end = identity, 0, False
            self._watch(renew=True)
            self.rewound.emit()

    def _watch(self, renew: bool = False) -> None:
        # A replaced file is a new inode: the old watch (if inotify kept it) would never fire again.
        if renew and self._watcher.files():
            self._watcher.removePaths(self._watcher.files())
        if self._live and str(self.path) not in self._watcher.files():
            self._watcher.addPath(str(self.path))
