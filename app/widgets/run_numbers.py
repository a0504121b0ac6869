"""The Training panel's line of numbers: the state line ("running - training", "idle - Start makes a new
run in <folder>"), iteration / max, iterations per second, ETA, elapsed time, and a note (the effective
batch, how the run ended, why a request was refused)."""
from __future__ import annotations

from typing import Optional

from PySide6.QtWidgets import QHBoxLayout, QLabel, QWidget

from app.widgets.elided_label import ElidedLabel


def clock(seconds: Optional[float]) -> str:
    """h:mm:ss; "-" when unknown."""
    if seconds is None or seconds < 0:
        return "-"
    s = int(round(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


class RunNumbers(QWidget):
    def __init__(self, parent: Optional[QWidget] = None):
        super().__init__(parent)
        row = QHBoxLayout(self)
        row.setContentsMargins(0, 0, 0, 0)
        self.state_label = ElidedLabel()  # a long folder in it never widens the window
        font = self.state_label.font()
        font.setBold(True)
        self.state_label.setFont(font)
        row.addWidget(self.state_label, 3)
        row.addSpacing(18)
        self.iter_label, self.rate_label, self.eta_label, self.elapsed_label = (QLabel() for _ in range(4))
        self.note_label = ElidedLabel()  # a summary or a refusal can be any length
        self.eta_label.setToolTip("At the recent pace (smoothed over the last few hundred iterations, saves and "
                                  "renders included), counting down between log rows")
        for w in (self.iter_label, self.rate_label, self.eta_label, self.elapsed_label):
            row.addWidget(w)
            row.addSpacing(18)
        row.addWidget(self.note_label, 2)

    def show_numbers(self, iteration: Optional[int], max_steps: Optional[int], step_time_s: object,
                     eta_s: Optional[float], elapsed_s: Optional[float]) -> None:
        """`step_time_s` as the metric event carried it (anything but a positive number shows "-")."""
        self.iter_label.setText(f"iteration {'-' if iteration is None else iteration} / {max_steps or '-'}")
        rate = (f"{1.0 / step_time_s:.2f}" if isinstance(step_time_s, (int, float)) and step_time_s > 0 else "-")
        self.rate_label.setText(f"{rate} it/s")
        self.eta_label.setText(f"ETA {clock(eta_s)}")
        self.elapsed_label.setText(f"elapsed {clock(elapsed_s)}")
