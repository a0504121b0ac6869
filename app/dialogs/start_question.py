"""The question when Start is pressed while a run is open: Start makes a NEW run in a new folder,
which is not what someone looking at a stopped run usually means."""
from __future__ import annotations

from typing import Optional

from PySide6.QtWidgets import QMessageBox, QWidget

NEW, CONTINUE, CANCEL = "new", "continue", "cancel"


def this_run(continue_text: str) -> str:
    """Continue's label (app/models/resume.continue_text) said of the open run, so that it never reads
    like another way to start a new one: "Continue this run from iteration 120", "Start this run again"."""
    if continue_text.startswith("Start again"):
        return "Start this run again (same folder)"
    return continue_text.replace("Continue", "Continue this run", 1)


def ask_start_while_open(parent: Optional[QWidget], run_name: str, continue_text: str, source: str,
                         folder: str) -> str:
    """NEW, CONTINUE (only offered when `continue_text` is not "": what Continue would do) or CANCEL.
    `source`: where the new run's config comes from; `folder`: where the new run goes."""
    box = QMessageBox(QMessageBox.Icon.Question, "Start a new run?",
                      f"{run_name} is open. Start makes a new run in a new folder.", QMessageBox.StandardButton.Cancel,
                      parent)
    new = box.addButton("Start a new run", QMessageBox.ButtonRole.AcceptRole)
    cont = box.addButton(this_run(continue_text), QMessageBox.ButtonRole.ActionRole) if continue_text else None
    going_on = f"\n\n{this_run(continue_text)}: the open run goes on in its own folder." if cont else ""
    box.setInformativeText(f"The new run uses {source}. Its folder: {folder}{going_on}")
    box.setDefaultButton(QMessageBox.StandardButton.Cancel)
    box.exec()
    clicked = box.clickedButton()
    if clicked is new:
        return NEW
    if cont is not None and clicked is cont:
        return CONTINUE
    return CANCEL
