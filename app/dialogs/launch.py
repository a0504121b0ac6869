"""Several machines for Start: how many, this machine's rank, and where machine 0
listens. The engine checks the combination again (dmad.cli) and says what is wrong in one line."""
from __future__ import annotations

from typing import Callable, Optional

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (QDialog, QDialogButtonBox, QFormLayout, QLabel, QLineEdit, QSpinBox, QVBoxLayout,
                               QWidget)

from app.engine.process import LaunchMachines
from app.widgets.wheel_guard import guard_wheel


def problem(m: LaunchMachines, processes: int) -> str:
    """What is wrong with `m` for `processes` in all, or ''."""
    if m.count <= 1:
        return ""
    if not 0 <= m.rank < m.count:
        return f"this machine's rank must be 0 .. {m.count - 1}"
    if not m.main_ip.strip():
        return "several machines need the address of machine 0"
    if processes % m.count:
        return f"{processes} processes in all do not split evenly over {m.count} machines"
    return ""


class LaunchDialog(QDialog):
    def __init__(self, current: LaunchMachines, processes: int, parent: Optional[QWidget] = None):
        super().__init__(parent)
        self.setWindowTitle("Machines")
        self.processes = processes
        self.count = QSpinBox(minimum=1, maximum=1024, value=current.count)
        self.rank = QSpinBox(minimum=0, maximum=1023, value=current.rank)
        self.ip = QLineEdit(current.main_ip, placeholderText="e.g. 10.0.0.1")
        self.port = QSpinBox(minimum=1, maximum=65535, value=current.port)
        guard_wheel(self.count, self.rank, self.port)  # wheel only for the field with focus
        form = QFormLayout()
        form.addRow("Machines", self.count)
        form.addRow("This machine's rank", self.rank)
        form.addRow("Machine 0 address", self.ip)
        form.addRow("Machine 0 port", self.port)
        self.error = QLabel(wordWrap=True)
        self.error.setStyleSheet("color: #b00020")
        self.buttons = QDialogButtonBox(QDialogButtonBox.Ok | QDialogButtonBox.Cancel)
        self.buttons.accepted.connect(self.accept)
        self.buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addWidget(QLabel(f"Start the same run on every machine, each with its own rank; "
                                f"{processes} processes in all (the Processes box)."))
        layout.addLayout(form)
        layout.addWidget(self.error)
        layout.addWidget(self.buttons)
        for w in (self.count, self.rank, self.port):
            w.valueChanged.connect(self._check)
        self.ip.textChanged.connect(self._check)
        self._check()

    def value(self) -> LaunchMachines:
        return LaunchMachines(self.count.value(), self.rank.value(), self.ip.text().strip(), self.port.value())

    def _check(self) -> None:
        why = problem(self.value(), self.processes)
        self.error.setText(why)
        self.buttons.button(QDialogButtonBox.Ok).setEnabled(not why)


def edit_machines(parent: QWidget, current: LaunchMachines, processes: int,
                  accepted: Callable[[LaunchMachines], None]) -> None:
    """Open the dialog over `parent` (window-modal, not blocking); `accepted(machines)` on OK."""
    dialog = LaunchDialog(current, processes, parent)
    dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
    dialog.accepted.connect(lambda: accepted(dialog.value()))
    dialog.open()
