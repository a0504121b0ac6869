"""Run a plain function off the GUI thread and get its result back by signal.

File scans (a dataset folder, a run's samples, the runs root), thumbnail decoding and NVML queries
can take seconds (a network drive, a wedged driver): they run in QThreadPool workers, and the result
comes back as a queued signal on the thread that owns the `Task` (the GUI thread). Workers only
touch files and thread-safe Qt classes (QImage, not QPixmap), and decode images with Pillow, never
with Qt's image readers (app/models/decode.py: those hold the GIL while taking Qt's locks).
"""
from __future__ import annotations

from typing import Any, Callable, Optional

from PySide6.QtCore import QObject, QRunnable, QThreadPool, Signal


class _Relay(QObject):
    # Lives on the GUI thread; emitting from a worker queues the call onto it.
    finished = Signal(int, object, str)  # (ticket, result, error message or "")


class _Job(QRunnable):
    def __init__(self, fn: Callable[[], Any], relay: _Relay, ticket: int):
        super().__init__()
        self._fn, self._relay, self._ticket = fn, relay, ticket

    def run(self) -> None:
        try:
            result, error = self._fn(), ""
        except Exception as e:  # shown to the user as one line; a scan must never kill the app
            result, error = None, f"{type(e).__name__}: {e}"
        try:
            self._relay.finished.emit(self._ticket, result, error)
        except RuntimeError:  # the owner was deleted while we worked (window closed)
            pass


class Task(QObject):
    """One kind of background job.

    `submit(fn)` runs fn in the pool (default: the global one; a one-thread pool keeps jobs from
    overlapping); `done(result)` or `failed(message)` comes back on the owner's thread. By default
    only the most recent submission answers, so a slow stale scan never overwrites a newer one;
    `every_answer=True` delivers each submission's answer (batches of one request). `reset()` drops
    the answers of everything submitted so far (a new run: old thumbnails are not wanted)."""

    done = Signal(object)
    failed = Signal(str)

    def __init__(self, parent: Optional[QObject] = None, pool: Optional[QThreadPool] = None,
                 every_answer: bool = False):
        super().__init__(parent)
        self._pool = pool or QThreadPool.globalInstance()
        self._every = every_answer
        self._relay = _Relay(self)
        self._relay.finished.connect(self._deliver)
        self._ticket = 0  # the latest submission
        self._floor = 0  # submissions up to this one were reset: their answers are dropped
        self._running: set[int] = set()

    def submit(self, fn: Callable[[], Any]) -> None:
        self._ticket += 1
        self._running.add(self._ticket)
        self._pool.start(_Job(fn, self._relay, self._ticket))

    def busy(self) -> bool:
        """A submission (since the last reset) has not answered yet."""
        return bool(self._running)

    def reset(self) -> None:
        self._floor = self._ticket
        self._running.clear()

    def _deliver(self, ticket: int, result: object, error: str) -> None:
        self._running.discard(ticket)
        if ticket <= self._floor or (not self._every and ticket != self._ticket):
            return
        if error:
            self.failed.emit(error)
        else:
            self.done.emit(result)
