"""The strip above the Config tab's form while it shows an opened run's own config.json, read-only:
which run, "New run from this config" (an editable, unsaved copy with run_name cleared) and "Back to
<the document that was being edited>"."""
from __future__ import annotations

from typing import Optional

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QFrame, QHBoxLayout, QPushButton, QWidget

from app.widgets.elided_label import ElidedLabel


class RunConfigBanner(QFrame):
    new_run_requested = Signal()
    back_requested = Signal()

    def __init__(self, parent: Optional[QWidget] = None):
        super().__init__(parent)
        self.setObjectName("runConfigBanner")
        self.setStyleSheet("#runConfigBanner { background: #dbe9fb; border: 1px solid #2d6ec8; border-radius: 4px; }")
        self.line = ElidedLabel()
        self.new_run_button = QPushButton("New run from this config")
        self.new_run_button.setToolTip("An editable, unsaved copy of this config with identity.run_name cleared: "
                                       "Start then makes a new run folder")
        self.back_button = QPushButton("Back")
        self.new_run_button.clicked.connect(lambda: self.new_run_requested.emit())
        self.back_button.clicked.connect(lambda: self.back_requested.emit())
        row = QHBoxLayout(self)
        row.setContentsMargins(8, 4, 8, 4)
        row.addWidget(self.line, 1)
        row.addWidget(self.new_run_button)
        row.addWidget(self.back_button)
        self.hide()

    def show_run(self, run_name: str, run_dir: str, back_to: str) -> None:
        self.line.setText(f"Showing run {run_name}'s config (read-only)")
        self.line.setToolTip(f"{run_dir}/config.json: the resolved config the run was started with")
        self.back_button.setText("Back to my config")
        self.back_button.setToolTip(f"Show {back_to} again, as it was")
        self.show()
