"""The last few hundred log lines of a run: engine.log's tail when a run is opened (read in a worker:
app/models/run_open.py), then the engine's stderr and one line per event. A fixed-width font keeps the
engine's aligned tables aligned."""
from __future__ import annotations

from typing import Optional

from PySide6.QtGui import QFontDatabase
from PySide6.QtWidgets import QPlainTextEdit, QWidget

LOG_LINES = 500


class LogTail(QPlainTextEdit):
    def __init__(self, parent: Optional[QWidget] = None):
        super().__init__(parent, readOnly=True)
        self.setMaximumBlockCount(LOG_LINES)  # older lines drop off: the full log is logs/engine.log
        self.setFont(QFontDatabase.systemFont(QFontDatabase.FixedFont))

    def last_lines(self, n: int) -> list[str]:
        doc = self.document()
        return [doc.findBlockByNumber(i).text() for i in range(max(0, doc.blockCount() - n), doc.blockCount())]

    def show_tail(self, text: str) -> None:
        """Show the end of a log file (its text, read off the GUI thread): its last LOG_LINES lines."""
        self.setPlainText("\n".join(text.splitlines()[-LOG_LINES:]))
