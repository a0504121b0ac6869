"""Save as preset…: a name and a description for the user's own preset (app/models/presets.py), checked
as typed (empty, too long, a shipped preset's name); OK is enabled only for a name that can be used."""
from __future__ import annotations

from typing import Callable, Optional

from PySide6.QtWidgets import QDialog, QDialogButtonBox, QFormLayout, QLabel, QLineEdit, QPlainTextEdit, QWidget


class SavePresetDialog(QDialog):
    def __init__(self, check: Callable[[str], str], replaces: Callable[[str], bool], description: str = "",
                 parent: Optional[QWidget] = None):
        """`check(name)`: why the name cannot be used ("" when it can); `replaces(name)`: one of the
        user's presets has it (said: saving replaces it)."""
        super().__init__(parent)
        self.setWindowTitle("Save as preset")
        self._check, self._replaces = check, replaces
        self.name = QLineEdit()
        self.name.setPlaceholderText("e.g. SDXL LoRA 24 GB, my settings")
        self.description = QPlainTextEdit(description)
        self.description.setPlaceholderText("What it is for: shown as the preset's tooltip")
        self.description.setFixedHeight(80)
        self.note = QLabel()
        self.note.setWordWrap(True)
        self.buttons = QDialogButtonBox(QDialogButtonBox.Save | QDialogButtonBox.Cancel)
        self.buttons.accepted.connect(self.accept)
        self.buttons.rejected.connect(self.reject)
        form = QFormLayout(self)
        form.addRow("Name", self.name)
        form.addRow("Description", self.description)
        form.addRow(self.note)
        form.addRow(self.buttons)
        self.name.textChanged.connect(self._judge)
        self.resize(460, self.sizeHint().height())
        self._judge()

    def _judge(self) -> None:
        name = self.name.text()
        problem = self._check(name)
        if not problem and self._replaces(name.strip()):
            self.note.setText(f"Replaces your preset {name.strip()!r}.")
        else:
            self.note.setText(problem)
        self.buttons.button(QDialogButtonBox.Save).setEnabled(not problem)

    def values(self) -> tuple[str, str]:
        return self.name.text().strip(), self.description.toPlainText().strip()
