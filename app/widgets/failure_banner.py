"""The red banner above the Training panel's plots: why a run failed or why the engine refused it,
selectable so the reason can be pasted into a bug report; and its amber sibling, HealthBanner, for a
health alert."""
from __future__ import annotations

import html
from typing import Optional, Sequence

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QHBoxLayout, QLabel, QToolButton, QWidget


class FailureBanner(QLabel):
    def __init__(self, parent: Optional[QWidget] = None):
        super().__init__(parent, wordWrap=True, textInteractionFlags=Qt.TextSelectableByMouse)
        self.setStyleSheet("QLabel { background: #8b1a1a; color: white; padding: 8px; border-radius: 4px; }")
        self.hide()

    def show_report(self, title: str, lines: Sequence[str], log_tail: Sequence[str] = ()) -> None:
        """A bold title, one line per detail, then the last log lines in monospace (when given)."""
        parts = [f"<b>{html.escape(title)}</b>"] + [html.escape(line) for line in lines]
        if log_tail:
            parts.append("<pre>" + html.escape("\n".join(log_tail)) + "</pre>")
        self.setText("<br>".join(parts))
        self.show()


class HealthBanner(QWidget):
    """The amber banner a health alert raises (issue 39): the alert's message and what users usually
    change, selectable, with a button that dismisses it until the next new alert."""

    def __init__(self, parent: Optional[QWidget] = None):
        super().__init__(parent)
        self.setObjectName("healthBanner")
        self.setAttribute(Qt.WA_StyledBackground, True)
        self.setStyleSheet("#healthBanner { background: #8a5a00; border-radius: 4px; }"
                           "QLabel { color: white; } QToolButton { color: white; border: none; }")
        self.label = QLabel(wordWrap=True, textInteractionFlags=Qt.TextSelectableByMouse)
        self.dismiss = QToolButton(text="Dismiss", autoRaise=True)
        self.dismiss.setToolTip("Hide this banner (a new alert shows it again)")
        self.dismiss.clicked.connect(self.hide)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(8, 6, 8, 6)
        layout.addWidget(self.label, 1)
        layout.addWidget(self.dismiss, 0, Qt.AlignTop)
        self.hide()

    def show_alerts(self, alerts: Sequence[dict]) -> None:
        """One paragraph per alert: its message in bold, then its advice."""
        parts = [f"<b>Health alert: {html.escape(a['message'])}</b>"
                 + (f"<br>What to change: {html.escape(a['advice'])}" if a.get("advice") else "") for a in alerts]
        self.label.setText("<br>".join(parts))
        self.show()

    def text(self) -> str:
        return self.label.text()
