"""The commands the Training panel sends to a live run through <run>/control.jsonl, and what a Stop
that takes long escalates to (app/models/stopping.py): Stop now (control "stop_now": no checkpoint),
then Kill (the engine's process group, after a confirmation that says what is lost). "Sample prompt…"
asks for one prompt and seed, and the image it rendered is shown when its `samples` event (one_off)
arrives. The lifecycle (app/models/lifecycle.py) keeps the state; this object only writes commands
and kills, and says so by signal.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Callable, Optional

from PySide6.QtCore import QObject, Qt, Signal
from PySide6.QtWidgets import QWidget

from app.dialogs.kill import ask_kill
from app.dialogs.one_off_view import OneOffViewer
from app.dialogs.sample_prompt import SamplePromptDialog
from app.engine.kill import kill_engine, kill_problem
from app.engine.process import EngineProcess
from app.models.run_state import RunState
from app.models.stopping import StopEscalation, StopOffer
from dmad.contract.runlog import append_control


class RunCommands(QObject):
    """`status()`: the run's status.json as last read (the pid a reattached engine is killed by)."""

    sent = Signal(str)     # a command written to control.jsonl
    refused = Signal(str)  # one line: why a command was not sent or a kill did not happen
    escalated = Signal()   # Stop now sent or the engine killed: what the stop bar offers changed
    one_off_rendered = Signal(object)  # the engine rendered a one-off prompt (its samples event's data)

    def __init__(self, panel: QWidget, engine: EngineProcess, run_state: RunState, status: Callable[[], dict]):
        super().__init__(panel)
        self._panel, self._engine, self._state, self._status = panel, engine, run_state, status
        self.stopping = StopEscalation()
        self._last_prompt = ""
        self._checkpoint: Optional[int] = None  # the newest checkpoint event of the shown run
        self.viewer: Optional[OneOffViewer] = None
        self.quiet_one_offs = False  # the next one-off was the Playground's: it shows it

    def reset(self) -> None:
        """Another run is shown."""
        self.stopping.reset()
        self._checkpoint = None

    def note_event(self, kind: str, iteration: Optional[int], data: dict, replayed: bool) -> None:
        """Every event of the shown run: checkpoints (what Kill would lose) and one-off samples to show
        (not those of the history replayed when a run is opened)."""
        if kind == "checkpoint" and iteration is not None:
            self._checkpoint = iteration
        elif kind == "samples" and data.get("one_off") and data.get("paths") and not replayed:
            self.one_off_rendered.emit(data)
            if not self.quiet_one_offs:  # the Playground's own request shows in the Playground
                self.show_one_off(data, iteration)
            self.quiet_one_offs = False

    def newest_checkpoint(self) -> Optional[int]:
        known = [c for c in (self._checkpoint, self._status().get("last_checkpoint")) if isinstance(c, int)]
        return max(known) if known else None

    def send_one_off(self, prompt: str, seed: Optional[int]) -> bool:
        """The Playground's request to the live engine: sample_now with a prompt and seed, its image
        shown there (not in the one-off window)."""
        self.quiet_one_offs = self.send("sample_now", prompt=prompt, seed=seed)
        return self.quiet_one_offs

    def send(self, cmd: str, **fields) -> bool:
        """Append a control command (sample_now with a prompt and seed); False when not sent."""
        run_dir = self._state.run_dir
        if run_dir is None:
            return False
        try:
            append_control(run_dir, cmd, **fields)
        except (OSError, ValueError) as e:  # ValueError: a prompt or seed the engine would refuse
            self.refused.emit(f"could not send {cmd}: {e}")
            return False
        if cmd == "stop":
            self.stopping.requested(time.time())
        self.sent.emit(cmd)
        return True

    def stop(self) -> bool:
        """Graceful stop, checkpoint first: our engine by control "stop" (SIGTERM before it has a run
        folder), a reattached one by control "stop". False when there is nothing to stop."""
        if self._engine.is_running():
            self.stopping.requested(time.time())
            self._engine.terminate_gracefully()
            return True
        if self._state.run_dir is not None and self._state.state in ("running", "paused", "stopping"):
            return self.send("stop")
        return False

    def stop_now(self) -> bool:
        """While stopping: stop at the next boundary WITHOUT a checkpoint."""
        if self._state.state != "stopping" or not self.send("stop_now"):
            return False
        self.stopping.sent_stop_now()
        self.escalated.emit()
        return True

    def kill(self) -> bool:
        """While stopping, once confirmed: kill ours through its process group, a reattached engine by
        the pid its status.json names (this machine only; its status poll then sees it gone)."""
        run_dir = self._state.run_dir
        name = run_dir.name if run_dir is not None else "the starting run"
        if self._state.state != "stopping" or not ask_kill(self._panel, name, self.newest_checkpoint()):
            return False
        problem = "" if self._engine.is_running() else kill_engine(self._status())
        if problem:
            self.refused.emit(f"could not kill the engine: {problem}")
            return False
        self.stopping.killed = True
        self._engine.kill()
        self.escalated.emit()
        return True

    def offer(self) -> StopOffer:
        own = self._engine.is_running()
        return self.stopping.offer(self._state.state == "stopping", time.time(), self._state.run_dir is not None,
                                   "" if own else kill_problem(self._status()), self.newest_checkpoint(),
                                   self._state.iteration)

    def ask_prompt(self) -> None:
        """"Sample prompt…": the dialog, then control sample_now with its prompt and seed."""
        run_dir = self._state.run_dir
        if run_dir is None:
            return
        dialog = SamplePromptDialog(run_dir.name, self._last_prompt, self._panel)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.accepted.connect(lambda: self._send_prompt(*dialog.value()))
        dialog.open()

    def _send_prompt(self, prompt: str, seed: Optional[int]) -> None:
        self._last_prompt = prompt
        self.send("sample_now", prompt=prompt, seed=seed)

    def show_one_off(self, data: dict, iteration: Optional[int]) -> None:
        """A `samples` event with one_off: show its image (relative paths are the run folder's)."""
        path = Path(data["paths"][0])
        if not path.is_absolute() and self._state.run_dir is not None:
            path = self._state.run_dir / path
        if self.viewer is None:
            self.viewer = OneOffViewer(self._panel)
        self.viewer.show_sample(path, str(data.get("prompt", "")), data.get("seed"), iteration)
