"""The question before Kill: what a killed engine loses, said before it is lost."""
from __future__ import annotations

from typing import Optional

from PySide6.QtWidgets import QMessageBox, QWidget


def ask_kill(parent: Optional[QWidget], run_name: str, checkpoint: Optional[int]) -> bool:
    """True when the user confirms killing the engine of `run_name` (`checkpoint`: its newest)."""
    kept = (f"The run keeps checkpoint iter_{checkpoint}; everything after it is lost."
            if checkpoint is not None else "The run has no checkpoint: all its training so far is lost.")
    box = QMessageBox(QMessageBox.Icon.Warning, "Kill the engine?",
                      f"Kill the engine of {run_name} now, without saving?",
                      QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.Cancel, parent)
    box.button(QMessageBox.StandardButton.Yes).setText("Kill engine")
    box.setInformativeText(kept + " The run is marked failed; Continue goes on from its newest checkpoint.")
    box.setDefaultButton(QMessageBox.StandardButton.Cancel)
    return box.exec() == QMessageBox.StandardButton.Yes
