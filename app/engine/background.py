"""Run a plain function off the GUI thread and get its result back by signal.

File scans (a dataset folder, a run's samples) can take seconds on a network drive: they run in
QThreadPool workers, and the result comes back as a queued signal on the thread that owns the
`Task` (the GUI thread). Workers only touch files and thread-safe Qt classes (QImage, not QPixmap).
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
    """One kind of background job whose latest answer wins.

    `submit(fn)` runs fn in the pool; `done(result)` or `failed(message)` is emitted for the most
    recent submission only, so a slow stale scan never overwrites a newer one."""

    done = Signal(object)
    failed = Signal(str)

    def __init__(self, parent: Optional[QObject] = None, pool: Optional[QThreadPool] = None):
        super().__init__(parent)
        self._pool = pool or QThreadPool.globalInstance()
        self._relay = _Relay(self)
        self._relay.finished.connect(self._deliver)
        self._ticket = 0
        self._pending = 0

    def submit(self, fn: Callable[[], Any]) -> None:
        self._ticket += 1
        self._pending += 1
        self._pool.start(_Job(fn, self._relay, self._ticket))

    def busy(self) -> bool:
        return self._pending > 0

    def _deliver(self, ticket: int, result: object, error: str) -> None:
        self._pending -= 1
        if ticket != self._ticket:
            return
        if error:
            self.failed.emit(error)
        else:
            self.done.emit(result)
