"""The questions asked when the window closes: about unsaved config edits, a live run and the run queue."""
from __future__ import annotations

from typing import Optional

from PySide6.QtWidgets import QMessageBox, QWidget

from app.models.run_state import RunState

STOP, LEAVE, CANCEL = "stop", "leave", "cancel"
KEEP, PAUSE = "keep", "pause"
SAVE, DISCARD, DRAFT = "save", "discard", "draft"


def run_name(state: RunState) -> str:
    """The live run's folder name; a run still starting has none yet."""
    return state.run_dir.name if state.run_dir is not None else "The run"


def ask_close_during_run(parent: Optional[QWidget], state: RunState, queued: int = 0) -> str:
    """STOP (graceful: the engine saves a checkpoint, then the window closes), LEAVE (the engine
    keeps training; reopening the app with the run folder reattaches) or CANCEL. `queued`: runs
    waiting in the active queue, said (they go on when the app opens again)."""
    box = QMessageBox(QMessageBox.Question, "A run is training",
                      f"{run_name(state)} is still training. What should happen to it?",
                      QMessageBox.Yes | QMessageBox.No | QMessageBox.Cancel, parent)
    # Standard buttons (relabelled) rather than custom ones: exec() then returns which was chosen.
    box.button(QMessageBox.Yes).setText("Stop the run (save a checkpoint)")
    box.button(QMessageBox.No).setText("Leave it running")
    box.setInformativeText("A run left running keeps writing its run folder; open it again with "
                           "dmad-studio RUN_DIR or from the Runs panel to follow it."
                           + (f"\n\nThe queue keeps its {queued} waiting run{'s' if queued != 1 else ''}: it goes on "
                              "when DMAD Studio opens again (a stopped queued run is continued from its "
                              "checkpoint first)." if queued else ""))
    box.setDefaultButton(QMessageBox.Cancel)
    answer = box.exec()
    if answer == QMessageBox.Yes:
        return STOP
    if answer == QMessageBox.No:
        return LEAVE
    return CANCEL


def ask_close_with_queue(parent: Optional[QWidget], pending: int) -> str:
    """KEEP (the queue goes on when the app opens again), PAUSE (it waits for Start queue) or CANCEL."""
    runs = f"{pending} queued run{'s' if pending != 1 else ''}"
    box = QMessageBox(QMessageBox.Question, "The run queue is running",
                      f"The queue has {runs} to do. What should happen to it?",
                      QMessageBox.Yes | QMessageBox.No | QMessageBox.Cancel, parent)
    box.button(QMessageBox.Yes).setText("Go on when the app opens again")
    box.button(QMessageBox.No).setText("Pause the queue")
    box.setInformativeText("The queue is kept either way (the Queue tab); nothing runs while the app is closed.")
    box.setDefaultButton(QMessageBox.Cancel)
    answer = box.exec()
    if answer == QMessageBox.Yes:
        return KEEP
    if answer == QMessageBox.No:
        return PAUSE
    return CANCEL


def ask_unsaved_config(parent: Optional[QWidget], document: str, draft: bool = False) -> str:
    """SAVE, DISCARD or CANCEL for the Config tab's unsaved edits of `document`; with `draft`, also
    DRAFT (kept as they are and reopened at the next launch, nothing written to the file)."""
    buttons = QMessageBox.Save | QMessageBox.Discard | QMessageBox.Cancel | (QMessageBox.Ignore if draft else 0)
    box = QMessageBox(QMessageBox.Question, "Unsaved config",
                      f"The config \u201c{document}\u201d has unsaved changes. Save them before closing?",
                      QMessageBox.StandardButtons(buttons), parent)
    if draft:
        box.button(QMessageBox.Ignore).setText("Keep as a draft")
        box.button(QMessageBox.Ignore).setToolTip("Not saved to the file: the edits reopen as they are at the "
                                                  "next launch")
    box.setDefaultButton(QMessageBox.Save)
    answer = box.exec()
    if answer == QMessageBox.Save:
        return SAVE
    if answer == QMessageBox.Discard:
        return DISCARD
    if answer == QMessageBox.Ignore:
        return DRAFT
    return CANCEL
