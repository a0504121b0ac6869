"""Where the shown run's news comes from, fed into its lifecycle (app/models/lifecycle.py): the engine
this app runs (EngineProcess: stdout events, run folder, exit), the run's events.jsonl (EventFollower:
history, then what is appended) and its status.json, read in a pool worker (a network drive can
stall) when the lifecycle wants it and every STATUS_POLL_MS while a followed run is live: a run this
app does not run may end, or die, without a final event.

Every event also goes out once on `event_received`, in order, for what shows it (plots, ETA, log):
a new run's from our engine's stdout, any other's from events.jsonl. `fed` follows each change (once
per batch of events), so the panel redraws once.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional

from PySide6.QtCore import QObject, QTimer, Signal

from app.engine.background import Task
from app.engine.follow import EventFollower
from app.engine.process import EngineProcess
from app.models.lifecycle import LIVE, LOG_LINES, RunLifecycle
from dmad.contract.runs import RunFolder

STATUS_POLL_MS = 2000  # a reattached run: is its process still alive?


def read_status(run_dir: Path) -> tuple[Path, Optional[dict]]:
    """(run_dir, its status.json; None when missing or not the engine's): a pool worker's job."""
    return run_dir, RunFolder(run_dir).read_status()


class RunSource(QObject):
    """`killed()`: whether the user killed the engine from the app (RunCommands' StopEscalation)."""

    event_received = Signal(dict)  # {"v","t","kind","iter","data"}: each event to show, once
    rewound = Signal()  # events.jsonl was cut back (a resume): what was shown of it is void
    fed = Signal()  # the lifecycle took something in

    def __init__(self, lifecycle: RunLifecycle, engine: EngineProcess, killed: Callable[[], bool],
                 parent: Optional[QObject] = None):
        super().__init__(parent)
        self._lc, self._engine, self._killed = lifecycle, engine, killed
        self._follower: Optional[EventFollower] = None
        engine.event_received.connect(self._on_engine_event)
        engine.run_dir_found.connect(lambda path: self._then(lifecycle.set_run_dir, path))
        engine.finished.connect(self._on_engine_finished)
        self.status_reads = Task(self)
        self.status_reads.done.connect(lambda answer: self._then(lifecycle.status_read, *answer, killed=killed()))
        self._timer = QTimer(self, interval=STATUS_POLL_MS, timeout=self.poll)
        lifecycle.status_wanted.connect(self.poll)
        lifecycle.file_end_wanted.connect(self._finish_reading)
        lifecycle.state_changed.connect(self._on_state_changed)

    def follow(self, run_dir: Path, live: bool) -> None:
        """Replay `run_dir`'s events.jsonl and, if `live`, keep reading what is appended."""
        self._follower = follower = EventFollower(RunFolder(run_dir).events_jsonl, self)
        follower.events_received.connect(self._on_events)
        follower.rewound.connect(self._on_rewound)
        follower.caught_up.connect(lambda: self._then(self._lc.file_caught_up))
        follower.ended.connect(lambda: self._then(self._lc.file_ended))
        follower.start(live=live)
        if live:
            self._timer.start()

    def clear(self) -> None:
        """Another run is shown: stop reading this one; a status read under way answers nobody."""
        if self._follower is not None:
            self._follower.stop()
            self._follower.deleteLater()
            self._follower = None
        self._timer.stop()
        self.status_reads.reset()

    def poll(self) -> None:
        """Read status.json if the lifecycle wants it; a read still under way (a stalled drive) answers
        for this one too, so stalled reads never pile up in the pool."""
        run_dir = self._lc.run_dir
        if run_dir is not None and self._lc.wants_status() and not self.status_reads.busy():
            self.status_reads.submit(lambda: read_status(run_dir))

    # ------------------------------------------------------------ into the lifecycle

    def _then(self, change: Callable[..., None], *args, **kwargs) -> None:
        change(*args, **kwargs)
        self.fed.emit()

    def _on_engine_event(self, ev: dict) -> None:
        if not self._lc.reads_file:
            self.event_received.emit(ev)  # a new run: stdout is its only reader (a continued one reads the file)
        self._then(self._lc.engine_event, ev)

    def _on_events(self, events: list) -> None:
        for ev in events:
            self.event_received.emit(ev)
            self._lc.file_event(ev)
        self.fed.emit()

    def _on_rewound(self) -> None:
        self.rewound.emit()
        self._then(self._lc.file_rewound)

    def _on_engine_finished(self, code: int, summary: str) -> None:
        self._then(self._lc.engine_finished, code, summary, tuple(self._engine.last_log_lines(LOG_LINES)),
                   self._killed())

    def _finish_reading(self) -> None:
        if self._follower is not None:
            self._follower.stop_when_caught_up()  # reads what is left; its `ended` goes to file_ended

    def _on_state_changed(self, state: str) -> None:
        if state not in LIVE:
            self._timer.stop()
