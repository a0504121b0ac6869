"""The run queue's policy: start the next queued config when nothing runs, follow its run, go on.

No widgets: the window gives it what it may do (start a run from a config file, continue a run
folder, open one to follow it) and the shown run's state (RunState); the Queue tab shows `queue` and
calls start / pause. Reads of files (a queued config judged, a run folder's status) go to workers.

- Its turn: the queued copy is judged as Start judges a config (the engine's schema and
  app/models/path_check.py); a config that no longer validates is skipped with the reason, and the
  queue goes on.
- Its run ends: finished or failed, the queue goes on; stopped by the user, the queue pauses (the
  user stepped in; Start queue goes on).
- The app closes: a run the close question stopped is `interrupted` and continued from its
  checkpoint first when the queue goes on; a run left training is followed again (reattached). An
  active queue goes on by itself when the app opens again (resume_after_launch).
- When nothing is left: a summary notification ("Queue done: 3 runs: 2 finished, 1 skipped").
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional

from PySide6.QtCore import QObject, QTimer, Signal

from app.engine.background import Task
from app.models.lifecycle import ENDED as RUN_ENDED, LIVE
from app.models.path_check import path_problems
from app.models.run_queue import (FAILED, FINISHED, INTERRUPTED, RUNNING, SKIPPED, STOPPED, WAITING, QueueEntry,
                                  RunQueue)
from app.models.run_state import RunState
from dmad.contract.config import validate_config
from dmad.contract.jsonfile import read_json_file
from dmad.contract.runs import LIVE_STATES, RunFolder, effective_state
from dmad.errors import UserInputError

NEXT_MS = 1500  # between one run's end and the next start: the ended run's last reads land, the user sees it


def judge_config(path: Path) -> str:
    """Why the queued config at `path` cannot start now ("" when it can): one line."""
    try:
        raw = read_json_file(path, "queued config")
        validate_config(raw, str(path))
    except UserInputError as e:
        return str(e)
    problems = path_problems(raw, path.parent)
    return next(iter(problems.values()), "")


def run_folder_state(run_dir: Path) -> str:
    """The run folder's state as its status.json says (a dead process: failed), "" without one."""
    try:
        status = RunFolder(run_dir).read_status()
    except (OSError, UserInputError, ValueError):
        return ""
    return effective_state(status) if status else ""


class QueueRunner(QObject):
    changed = Signal()           # the queue or its state changed: the tab redraws
    notify = Signal(str, str)    # (title, message): the window's notifier

    def __init__(self, queue: RunQueue, run_state: RunState, start: Callable[[Path], None],
                 continue_run: Callable[[Path], None], follow: Callable[[Path], None],
                 busy: Callable[[], bool], parent: Optional[QObject] = None, next_ms: int = NEXT_MS):
        super().__init__(parent)
        self.queue = queue
        self._state = run_state
        self._start, self._continue, self._follow, self._busy = start, continue_run, follow, busy
        # one pending "go on" at a time: a busy queue asks again later without stacking timers
        self._next = QTimer(self, singleShot=True, interval=next_ms, timeout=self.advance)
        self._launched: Optional[str] = None  # the entry whose run the app started or follows
        self._seen_live = False               # its run has been live since (an opened run first replays its end)
        self._last_ended: Optional[str] = None  # the entry whose run ended last: its engine's last word comes after
        self._waiting_for = ""                # a worker is judging / reading for this entry
        self._closing = False
        self._ran = 0                         # runs ended in this pass (for the summary)
        self._judge = Task(self)
        self._judge.done.connect(self._on_judged)
        self._recover = Task(self)
        self._recover.done.connect(self._on_recovered)
        run_state.state_changed.connect(self._on_run_state)
        run_state.changed.connect(self._on_run_change)

    # ------------------------------------------------------------ the user's commands

    def start(self) -> None:
        self.queue.set_active(True)
        self._ran = 0
        self.changed.emit()
        self.advance()

    def pause(self, note: str = "paused: the run under way finishes, nothing after it starts") -> None:
        self.queue.set_active(False, note)
        self.changed.emit()

    def add(self, config: dict, label: str) -> QueueEntry:
        entry = self.queue.add(config, label)
        self.changed.emit()
        if self.queue.active:
            self.advance()
        return entry

    def remove(self, entry_id: str) -> bool:
        done = self.queue.remove(entry_id)
        self.changed.emit()
        return done

    def move(self, entry_id: str, delta: int) -> bool:
        done = self.queue.move(entry_id, delta)
        self.changed.emit()
        return done

    def clear_ended(self) -> int:
        n = self.queue.clear_ended()
        self.changed.emit()
        return n

    def resume_after_launch(self) -> None:
        """The app has opened: an active queue goes on (a run under way first)."""
        if self.queue.active and self.queue.pending():
            n = self.queue.pending()
            self.notify.emit("Queue", f"going on with the {n} run{'s' if n != 1 else ''} left from the last session")
            self.advance()

    def closing(self) -> None:
        """The window closes: a queued run stopped now is interrupted, not stopped by the user."""
        self._closing = True

    def is_closing(self) -> bool:
        return self._closing

    def launched(self) -> Optional[QueueEntry]:
        return self.queue.get(self._launched) if self._launched else None

    # ------------------------------------------------------------ going on

    def advance(self) -> None:
        """Start what comes next, when the queue runs and nothing else does (an engine that has said
        "finished" but not exited yet, or a run of the user's, is waited for: asked again later)."""
        if not self.queue.active or self._launched or self._waiting_for or self._closing:
            return
        if self._busy():
            self._later()
            return
        under = self.queue.under_way()
        if under is not None:
            self._recover_entry(under)
            return
        entry = self.queue.next_waiting()
        if entry is None:
            self._done()
            return
        self._waiting_for = entry.id
        self._judge.submit(lambda e=entry: (e.id, judge_config(Path(e.config))))

    def _on_judged(self, answer: tuple[str, str]) -> None:
        entry_id, problem = answer
        self._waiting_for = ""
        entry = self.queue.get(entry_id)
        if entry is None or entry.state != WAITING or not self.queue.active or self._busy():
            self.advance()  # removed, paused or a run of the user's meanwhile
            return
        if problem:
            self.queue.mark(entry_id, SKIPPED, problem)
            self._ran += 1
            self.notify.emit("Queue: run skipped", f"{entry.label}: {problem}")
            self.changed.emit()
            self.advance()
            return
        self._launch(entry_id)
        self._start(Path(entry.config))

    def _recover_entry(self, entry: QueueEntry) -> None:
        """A run under way from before the app closed: follow it, continue it, or count it ended."""
        if not entry.run_dir:  # closed before the engine named its folder: nothing was kept
            self.queue.mark(entry.id, WAITING)
            self.changed.emit()
            self.advance()
            return
        self._waiting_for = entry.id
        self._recover.submit(lambda e=entry: (e.id, run_folder_state(Path(e.run_dir))))

    def _on_recovered(self, answer: tuple[str, str]) -> None:
        entry_id, state = answer
        self._waiting_for = ""
        entry = self.queue.get(entry_id)
        if entry is None or not self.queue.active or self._busy():
            return
        run_dir = Path(entry.run_dir)
        if state == "finished":
            self._ended(entry, FINISHED, "finished while the app was closed")
            return
        self._launch(entry_id, run_dir)
        if state in LIVE_STATES:
            self._follow(run_dir)  # left training when the app closed: follow it to its end
        elif state in ("stopped", "failed", "created"):
            self._continue(run_dir)  # from its newest checkpoint
        else:
            self._launched = None
            self._ended(entry, FAILED, f"its run folder {run_dir} cannot be read")

    def _launch(self, entry_id: str, run_dir: Optional[Path] = None) -> None:
        self._launched, self._seen_live, self._last_ended = entry_id, False, None
        self.queue.mark(entry_id, RUNNING, run_dir=run_dir)
        self.changed.emit()

    def _on_run_state(self, state: str) -> None:
        entry = self.launched()
        if entry is None:
            if state not in LIVE:
                self._later()  # a run of the user's ended (or one was opened): the queue may go on
            return
        self._seen_live |= state in LIVE
        if not self._seen_live:
            return  # the run being opened to be continued shows how it ended last time: not this run's end
        run_dir = self._state.run_dir
        if state in LIVE and run_dir is not None and entry.run_dir != str(run_dir):
            self.queue.mark(entry.id, RUNNING, run_dir=run_dir)
            self.changed.emit()
        if state not in RUN_ENDED:
            return
        self._launched = None
        message = self._state.message
        if state == "stopped" and self._closing:
            self.queue.mark(entry.id, INTERRUPTED, "stopped when the app closed; continued when the queue goes on")
            self.changed.emit()
        elif state == "stopped":
            self._ended(entry, STOPPED, message or "stopped")
            self.pause(f"paused: {entry.label} was stopped; Start queue goes on with the next")
        else:
            self._ended(entry, FINISHED if state == "finished" else FAILED, message)

    def _on_run_change(self) -> None:
        """How the run ended, in the engine's words ("finished 40 iterations in 95 s"), arrives when its
        process exits, after the state: the entry's reason follows it."""
        entry = self.queue.get(self._last_ended) if self._last_ended else None
        message = self._state.message
        if entry is not None and message and not entry.reason and self._launched is None:
            self.queue.mark(entry.id, entry.state, message, now=entry.ended)
            self.changed.emit()

    def _ended(self, entry: QueueEntry, state: str, reason: str) -> None:
        self._last_ended = entry.id
        self.queue.mark(entry.id, state, reason)
        self._ran += 1
        self.changed.emit()
        self._later()

    def _later(self) -> None:
        if self.queue.active:
            self._next.start()  # restarts a pending one

    def _done(self) -> None:
        if self._ran:
            summary = self.queue.summary()
            self.notify.emit("Queue done", summary)
            self.queue.set_active(False, f"done: {summary}")
        else:
            self.queue.set_active(False, "nothing waiting")
        self._ran = 0
        self.changed.emit()
