""""Sample prompt…": one prompt of the user's own (and optionally a seed) for the current student.

The panel sends it as control "sample_now" with the prompt (dmad.contract.runlog.append_control); the
engine renders it into samples/oneoff/ at its next iteration boundary. The dialog checks the prompt
and seed with the engine's own rule (one_off_problem), so what it accepts the engine renders.
"""
from __future__ import annotations

from typing import Optional

from PySide6.QtWidgets import (QCheckBox, QDialog, QDialogButtonBox, QFormLayout, QLineEdit, QVBoxLayout,
                               QWidget)

from app.widgets.elided_label import ElidedLabel
from dmad.contract.runlog import one_off_problem

SEED_TIP = "Leave it off for the run's own seed; on: the same seed gives the same image for the same student"


class SamplePromptDialog(QDialog):
    def __init__(self, run_name: str, prompt: str = "", parent: Optional[QWidget] = None):
        super().__init__(parent)
        self.setWindowTitle(f"Sample a prompt - {run_name}")
        self.prompt = QLineEdit(prompt, placeholderText="a small blue square")
        self.use_seed = QCheckBox("Seed")
        self.use_seed.setToolTip(SEED_TIP)
        self.seed = QLineEdit("0")
        self.seed.setToolTip("a whole number from 0 to 4294967295")
        self.seed.setEnabled(False)
        self.use_seed.toggled.connect(self.seed.setEnabled)
        self.problem = ElidedLabel()
        self.problem.setStyleSheet("color: #b00020;")
        form = QFormLayout()
        form.addRow("Prompt", self.prompt)
        form.addRow(self.use_seed, self.seed)
        self.buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        self.buttons.button(QDialogButtonBox.StandardButton.Ok).setText("Render")
        self.buttons.accepted.connect(self._accept)
        self.buttons.rejected.connect(self.reject)
        for signal in (self.prompt.textChanged, self.seed.textChanged, self.use_seed.toggled):
            signal.connect(lambda *_: self.problem.clear())
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addWidget(self.problem)
        layout.addWidget(self.buttons)
        self.resize(520, self.sizeHint().height())

    def value(self) -> tuple[str, Optional[int]]:
        """(prompt, seed or None); seed is -1 when the text is not a whole number (judged by check())."""
        seed: Optional[int] = None
        if self.use_seed.isChecked():
            text = self.seed.text().strip()
            seed = int(text) if text.isdigit() else -1
        return self.prompt.text(), seed

    def check(self) -> str:
        """The engine's words for what is wrong with the prompt and seed, or ""."""
        prompt, seed = self.value()
        return one_off_problem(prompt, seed) or ""

    def _accept(self) -> None:
        problem = self.check()
        if problem:
            self.problem.setText(problem)
            return
        self.accept()
