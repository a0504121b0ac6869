"""Opening a run in the Training panel: its first files (status.json, config.json, engine.log's
tail: app/models/run_open.py) are read in a pool worker, and only the newest open is answered. An
open that a newer one (or Start, Continue: `reset`) overtook is dropped when its answer comes."""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional

from PySide6.QtCore import QObject, Signal

from app.engine.background import Task
from app.models.run_open import OpenedRun, read_opened_run


class RunOpener(QObject):
    opened = Signal(object, object)  # (OpenedRun, then: a callable or None) of the open being waited for
    failed = Signal(object, str)     # (its run folder, the one-line reason)

    def __init__(self, parent: Optional[QObject] = None):
        super().__init__(parent)
        self.reads = Task(self)
        self.reads.done.connect(self._done)
        self.reads.failed.connect(self._failed)
        self._waiting: Optional[tuple[Path, Optional[Callable[[], None]]]] = None  # (run, then) being read

    def open(self, run_dir: Path, then: Optional[Callable[[], None]] = None) -> None:
        self._waiting = (run_dir, then)
        self.reads.submit(lambda: read_opened_run(run_dir))

    def waiting(self) -> Optional[Path]:
        """The run folder being read now (None: none)."""
        return self._waiting[0] if self._waiting is not None else None

    def busy(self) -> bool:
        return self.reads.busy()

    def reset(self) -> None:
        """An open still being read answers nobody."""
        self.reads.reset()
        self._waiting = None

    def _done(self, run: OpenedRun) -> None:
        if self._waiting is None or self._waiting[0] != run.run_dir:
            return
        then, self._waiting = self._waiting[1], None
        self.opened.emit(run, then)

    def _failed(self, message: str) -> None:
        if self._waiting is None:
            return
        run_dir, self._waiting = self._waiting[0], None
        self.failed.emit(run_dir, message)
