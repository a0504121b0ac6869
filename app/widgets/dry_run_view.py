"""The Config panel's "Dry run" side tab: `dmad train --config FILE --dry-run` (with the same --set
overrides as Start, so it names the folder Start will use) and the engine's report: the resolved
config, the run folder and the memory ledger, or the one line that says what is wrong."""
from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

from PySide6.QtCore import Signal
from PySide6.QtGui import QFont
from PySide6.QtWidgets import QPlainTextEdit, QWidget

from app.engine.process import EngineProcess


class DryRunView(QPlainTextEdit):
    finished = Signal(bool, str)  # passed?, one line for the panel's status

    def __init__(self, font: QFont, parent: Optional[QWidget] = None):
        super().__init__(parent, readOnly=True)
        self.engine = EngineProcess(self)
        self.engine.dry_run_finished.connect(self._on_finished)
        self.setLineWrapMode(QPlainTextEdit.LineWrapMode.NoWrap)
        self.setFont(font)
        self.setPlaceholderText("Dry run: the engine's resolved config and memory ledger appear here.")

    def is_running(self) -> bool:
        return self.engine.is_running()

    def start(self, config_path: Path, overrides: Sequence[str]) -> None:
        self.engine.start_dry_run(config_path, overrides=overrides)

    def _on_finished(self, code: int, text: str) -> None:
        if code == 0:
            self.setPlainText(text)
            line = "Dry run passed: the resolved config and the memory ledger are in the Dry run tab."
        else:
            last = text.strip().splitlines()[-1] if text.strip() else "no message"
            self.setPlainText(f"Dry run failed (exit code {code}):\n{last}")
            line = f"Dry run failed: {last}"
        self.finished.emit(code == 0, line)
