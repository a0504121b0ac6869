"""Continuing a run that is not live: which runs can be continued and what Continue will do.

`dmad train --config <run>/config.json --run-dir <run> --resume latest` continues a stopped or failed
run from its newest complete checkpoint, or, when it never wrote one (it ended while loading or
before its first checkpoint), starts it again from iteration 0 in the same folder. The button says
which, so the user knows before clicking whether hours of training are kept.

"Complete checkpoint" is what the engine's `--resume latest` finds (RunFolder.latest_checkpoint:
checkpoints/latest.json when the folder it names exists, else the newest iter_<N> on disk), not
status.json's last_checkpoint: a checkpoint folder deleted by hand to save space is gone for both.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from PySide6.QtCore import QObject, Signal

from app.engine.background import Task
from dmad.contract.runs import RunFolder

# Finished is left out: its config is its own, so it would only finish again at once.
CONTINUABLE = ("stopped", "failed", "created")
START_AGAIN_TIP = "no checkpoint was written before the run ended: starts again from iteration 0 in the same folder"


def resume_point(run_dir: Path) -> Optional[int]:
    """The iteration `--resume latest` would continue from; None when it would start again.
    Reads checkpoints/latest.json and stats a folder or two: call it off the GUI thread."""
    latest = RunFolder(Path(run_dir)).latest_checkpoint()
    return latest[0] if latest is not None else None


def continue_text(state: str, checkpoint: Optional[int], known: bool) -> tuple[str, str]:
    """(button text, tooltip) of Continue for a run in `state` whose resume point is `checkpoint`
    (`known` False: not looked up yet)."""
    if state not in CONTINUABLE:
        return "Continue", ("Continue a stopped or failed run in its own folder: from its newest checkpoint, "
                            "or from iteration 0 when it has none")
    if not known:
        return "Continue", ("Continues from the run's newest complete checkpoint, or starts it again from "
                            "iteration 0 when it has none (looking for its checkpoints...)")
    if checkpoint is None:
        return "Start again", START_AGAIN_TIP
    return (f"Continue from iteration {checkpoint}",
            f"continues in the same folder from checkpoints/iter_{checkpoint} (dmad train --resume latest); "
            "curves and events logged after that checkpoint are cut back")


class ResumeLookup(QObject):
    """resume_point of one run at a time, looked up in a pool worker (a network drive can take
    seconds); `found` when the answer for the latest run asked about is in."""

    found = Signal()

    def __init__(self, parent: Optional[QObject] = None):
        super().__init__(parent)
        self._task = Task(self)
        self._task.done.connect(self._on_done)
        self._answer: Optional[tuple[Path, Optional[int]]] = None

    def look_up(self, run_dir: Path) -> None:
        self._answer = None  # until the worker answers, nobody claims either outcome
        self._task.submit(lambda: (run_dir, resume_point(run_dir)))

    def point_for(self, run_dir: Optional[Path]) -> tuple[bool, Optional[int]]:
        """(known, the iteration Continue would go on from; None: it would start again)."""
        if self._answer is None or self._answer[0] != run_dir:
            return False, None
        return True, self._answer[1]

    def _on_done(self, answer: tuple[Path, Optional[int]]) -> None:
        self._answer = answer
        self.found.emit()
