"""The lifecycle of the run the Training panel shows, as one object the rest of the window can read.

The Training panel is the only writer: it starts engines and follows run folders, so it alone knows
when a run starts, moves, ends. The window (title, the run-bound tabs, the close question) and the
Runs panel only read and observe it, so none of them reaches into the panel.

States: "idle" (nothing shown), "starting" (our engine, before its first event; a continued run keeps
its folder, a new one has none yet), then the run folder states of dmad.contract.runs (created,
running, paused, stopping, stopped, finished, failed). An ended run also has the engine's exit code
(when this app ran it or the run recorded one) and one line saying how it ended.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from PySide6.QtCore import QObject, Signal

from dmad.contract.runs import LIVE_STATES

IDLE, STARTING = "idle", "starting"
LIVE = (STARTING,) + LIVE_STATES
ENDED = ("stopped", "finished", "failed")


class RunState(QObject):
    """`changed` after any change (progress included: cheap observers only); `state_changed(state)`
    just before it when the lifecycle state itself changed."""

    changed = Signal()
    state_changed = Signal(str)

    def __init__(self, parent: Optional[QObject] = None):
        super().__init__(parent)
        self._state = IDLE
        self._run_dir: Optional[Path] = None
        self._iteration: Optional[int] = None
        self._max_steps: Optional[int] = None
        self._exit_code: Optional[int] = None
        self._message = ""

    # ------------------------------------------------------------ reading

    @property
    def state(self) -> str:
        return self._state

    @property
    def run_dir(self) -> Optional[Path]:
        return self._run_dir

    @property
    def iteration(self) -> Optional[int]:
        return self._iteration

    @property
    def max_steps(self) -> Optional[int]:
        return self._max_steps

    @property
    def exit_code(self) -> Optional[int]:
        return self._exit_code

    @property
    def message(self) -> str:
        return self._message

    def is_live(self) -> bool:
        """An engine is (or should be) behind the run: closing the window must ask."""
        return self._state in LIVE

    def is_ended(self) -> bool:
        return self._state in ENDED

    # ------------------------------------------------------------ the writer's side

    def start(self, run_dir: Optional[Path] = None) -> None:
        """Our own engine is starting: a new run (its folder is not known yet), or `run_dir` continued
        in its own folder. Nothing of the previous run's progress or end is kept."""
        if self.is_live():
            raise RuntimeError(f"a run is already {self._state}")
        self._replace(STARTING, None if run_dir is None else Path(run_dir))

    def open(self, run_dir: Path, state: str) -> None:
        """A run shown from its folder, in the state its status.json gives (effective_state)."""
        self._replace(state, Path(run_dir))

    def clear(self) -> None:
        """Nothing shown any more (the shown run's folder was deleted)."""
        if self.is_live():
            raise RuntimeError(f"a run is {self._state}: it cannot be forgotten")
        self._replace(IDLE, None)

    def set_run_dir(self, run_dir: Optional[Path]) -> None:
        self._update(run_dir=None if run_dir is None else Path(run_dir))

    def set_state(self, state: str) -> None:
        self._update(state=state)

    def set_progress(self, iteration: Optional[int], max_steps: Optional[int]) -> None:
        self._update(iteration=iteration, max_steps=max_steps)

    def end(self, state: str, exit_code: Optional[int], message: str = "") -> None:
        """The run ended (stopped, finished or failed): with the engine's exit code when known and
        one line saying how."""
        if state not in ENDED:
            raise ValueError(f"{state!r} is not an end state ({', '.join(ENDED)})")
        self._update(state=state, exit_code=exit_code, message=" ".join(message.split()))

    # ------------------------------------------------------------ one change, one signal

    def _replace(self, state: str, run_dir: Optional[Path]) -> None:
        """A new run: always a change, even if it looks like the last one."""
        old = self._state
        self._state, self._run_dir = state, run_dir
        self._iteration = self._max_steps = self._exit_code = None
        self._message = ""
        self._emit(old)

    def _update(self, **values) -> None:
        old = self._state
        changed = False
        for name, value in values.items():
            if getattr(self, "_" + name) != value:
                setattr(self, "_" + name, value)
                changed = True
        if changed:
            self._emit(old)

    def _emit(self, old_state: str) -> None:
        if self._state != old_state:
            self.state_changed.emit(self._state)
        self.changed.emit()
