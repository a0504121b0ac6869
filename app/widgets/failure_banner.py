"""The red banner above the Training panel's plots: why a run failed or why the engine refused it,
selectable so the reason can be pasted into a bug report."""
from __future__ import annotations

import html
from typing import Optional, Sequence

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QLabel, QWidget


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
