"""The last few hundred log lines of a run: engine.log's tail when a run is opened, then the engine's
stderr and one line per event. A fixed-width font keeps the engine's aligned tables aligned."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from PySide6.QtGui import QFontDatabase
from PySide6.QtWidgets import QPlainTextEdit, QWidget

from dmad.contract.regular import fopen_regular

LOG_LINES = 500
TAIL_BYTES = 65536  # the last 64 KiB of engine.log hold its last few hundred lines


class LogTail(QPlainTextEdit):
    def __init__(self, parent: Optional[QWidget] = None):
        super().__init__(parent, readOnly=True)
        self.setMaximumBlockCount(LOG_LINES)  # older lines drop off: the full log is logs/engine.log
        self.setFont(QFontDatabase.systemFont(QFontDatabase.FixedFont))

    def last_lines(self, n: int) -> list[str]:
        doc = self.document()
        return [doc.findBlockByNumber(i).text() for i in range(max(0, doc.blockCount() - n), doc.blockCount())]

    def load_tail(self, path: Path) -> None:
        """Show the end of a log file (one small read); a missing file shows nothing."""
        try:
            with fopen_regular(path, "rb") as f:  # a FIFO there is refused, never waited on
                f.seek(0, 2)
                f.seek(max(0, f.tell() - TAIL_BYTES))
                text = f.read().decode("utf-8", "replace")
        except OSError:
            return
        self.setPlainText("\n".join(text.splitlines()[-LOG_LINES:]))
