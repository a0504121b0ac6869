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


def _two_ways(parent: Optional[QWidget], title: str, text: str, yes: tuple[str, str], no: tuple[str, str],
              info: str) -> str:
    """A question with two answers and Cancel: `yes` / `no` are (button label, answer); CANCEL is the
    default. Standard buttons (relabelled) rather than custom ones: exec() returns which was chosen."""
    box = QMessageBox(QMessageBox.Question, title, text, QMessageBox.Yes | QMessageBox.No | QMessageBox.Cancel,
                      parent)
    box.button(QMessageBox.Yes).setText(yes[0])
    box.button(QMessageBox.No).setText(no[0])
    box.setInformativeText(info)
    box.setDefaultButton(QMessageBox.Cancel)
    answer = box.exec()
    return yes[1] if answer == QMessageBox.Yes else no[1] if answer == QMessageBox.No else CANCEL


def ask_close_during_run(parent: Optional[QWidget], state: RunState, queued: int = 0) -> str:
    """STOP (graceful: the engine saves a checkpoint, then the window closes), LEAVE (the engine
    keeps training; reopening the app with the run folder reattaches) or CANCEL. `queued`: runs
    waiting in the active queue, said (they go on when the app opens again)."""
    info = ("A run left running keeps writing its run folder; open it again with dmad-studio RUN_DIR or from the "
            "Runs panel to follow it."
            + (f"\n\nThe queue keeps its {queued} waiting run{'s' if queued != 1 else ''}: it goes on when DMAD "
               "Studio opens again (a stopped queued run is continued from its checkpoint first)." if queued else ""))
    return _two_ways(parent, "A run is training", f"{run_name(state)} is still training. What should happen to it?",
                     ("Stop the run (save a checkpoint)", STOP), ("Leave it running", LEAVE), info)


def ask_close_with_queue(parent: Optional[QWidget], pending: int) -> str:
    """KEEP (the queue goes on when the app opens again), PAUSE (it waits for Start queue) or CANCEL."""
    runs = f"{pending} queued run{'s' if pending != 1 else ''}"
    return _two_ways(parent, "The run queue is running", f"The queue has {runs} to do. What should happen to it?",
                     ("Go on when the app opens again", KEEP), ("Pause the queue", PAUSE),
                     "The queue is kept either way (the Queue tab); nothing runs while the app is closed.")


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
