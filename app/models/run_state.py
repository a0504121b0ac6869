"""The shown run's lifecycle as the rest of the window reads it: the Qt face of RunLifecycle
(app/models/lifecycle.py, where the rules are, without Qt).

The Training panel alone feeds the lifecycle: it starts engines and follows run folders, so it alone
knows when a run starts, moves, ends. The window (title, the run-bound tabs, the close question), the
Runs panel, the run notifier and the run commands only read and observe this object, so none of them
reaches into the panel.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from PySide6.QtCore import QObject, Signal

from app.models.lifecycle import RunLifecycle


class RunState(QObject):
    """`changed` after any change (progress included: cheap observers only); `state_changed(state)`
    just before it when the lifecycle state itself changed."""

    changed = Signal()
    state_changed = Signal(str)

    def __init__(self, lifecycle: RunLifecycle, parent: Optional[QObject] = None):
        super().__init__(parent)
        self._lifecycle = lifecycle
        lifecycle.state_changed.connect(self.state_changed.emit)
        lifecycle.changed.connect(self.changed.emit)

    @property
    def state(self) -> str:
        return self._lifecycle.state

    @property
    def run_dir(self) -> Optional[Path]:
        return self._lifecycle.run_dir

    @property
    def iteration(self) -> Optional[int]:
        return self._lifecycle.iteration

    @property
    def max_steps(self) -> Optional[int]:
        return self._lifecycle.max_steps

    @property
    def exit_code(self) -> Optional[int]:
        return self._lifecycle.exit_code

    @property
    def message(self) -> str:
        return self._lifecycle.message

    def is_live(self) -> bool:
        """An engine is (or should be) behind the run: closing the window must ask."""
        return self._lifecycle.is_live()

    def is_ended(self) -> bool:
        return self._lifecycle.is_ended()
