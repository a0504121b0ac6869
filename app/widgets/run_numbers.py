"""The Training panel's line of numbers: iteration / max, iterations per second, ETA, elapsed time,
and a note (the effective batch, how the run ended, why a request was refused)."""
from __future__ import annotations

from typing import Optional

from PySide6.QtWidgets import QHBoxLayout, QLabel, QWidget


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
        labels = [QLabel() for _ in range(5)]
        self.iter_label, self.rate_label, self.eta_label, self.elapsed_label, self.note_label = labels
        for w in (self.iter_label, self.rate_label, self.eta_label, self.elapsed_label):
            row.addWidget(w)
            row.addSpacing(18)
        row.addWidget(self.note_label, 1)

    def show_numbers(self, iteration: Optional[int], max_steps: Optional[int], step_time_s: object,
                     eta_s: Optional[float], elapsed_s: Optional[float]) -> None:
        """`step_time_s` as the metric event carried it (anything but a positive number shows "-")."""
        self.iter_label.setText(f"iteration {'-' if iteration is None else iteration} / {max_steps or '-'}")
        rate = (f"{1.0 / step_time_s:.2f}" if isinstance(step_time_s, (int, float)) and step_time_s > 0 else "-")
        self.rate_label.setText(f"{rate} it/s")
        self.eta_label.setText(f"ETA {clock(eta_s)}")
        self.elapsed_label.setText(f"elapsed {clock(elapsed_s)}")
