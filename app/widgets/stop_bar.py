"""The bar under the Training panel's buttons while a run is stopping: how long it has been stopping,
"Stop now (no checkpoint)" and "Kill engine". Thin: the panel decides what is offered
(app/models/stopping.py) and does what is asked."""
from __future__ import annotations

from typing import Optional

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QFrame, QHBoxLayout, QPushButton, QWidget

from app.models.stopping import StopOffer
from app.widgets.elided_label import ElidedLabel


class StopBar(QFrame):
    stop_now_requested = Signal()
    kill_requested = Signal()

    def __init__(self, parent: Optional[QWidget] = None):
        super().__init__(parent)
        self.setObjectName("stopBar")
        self.setStyleSheet("#stopBar { background: #fff3cd; border: 1px solid #d29922; border-radius: 4px; }")
        self.line = ElidedLabel()
        self.stop_now_button = QPushButton("Stop now (no checkpoint)")
        self.kill_button = QPushButton("Kill engine…")
        self.stop_now_button.clicked.connect(lambda: self.stop_now_requested.emit())
        self.kill_button.clicked.connect(lambda: self.kill_requested.emit())
        row = QHBoxLayout(self)
        row.setContentsMargins(8, 4, 8, 4)
        row.addWidget(self.line, 1)
        row.addWidget(self.stop_now_button)
        row.addWidget(self.kill_button)
        self.hide()

    def show_offer(self, offer: StopOffer) -> None:
        self.setVisible(offer.visible)
        if not offer.visible:
            return
        self.line.setText(offer.line)
        self.stop_now_button.setEnabled(offer.stop_now)
        self.stop_now_button.setToolTip(offer.stop_now_tip)
        self.kill_button.setEnabled(offer.kill)
        self.kill_button.setToolTip(offer.kill_tip)
