"""The raw JSON of the config, editable. Text the user types is parsed 300 ms after the last key
(a parse per key would flash errors for every half-typed token); text set by the panel is shown
without being parsed back."""
from __future__ import annotations

from typing import Optional

from PySide6.QtCore import QTimer, Signal
from PySide6.QtGui import QFontDatabase
from PySide6.QtWidgets import QPlainTextEdit, QVBoxLayout, QWidget

from app.models.config_doc import JsonTextError, parse_json_text
from app.widgets.config_form import ERROR_LABEL_STYLE
from app.widgets.elided_label import ElidedLabel

DEBOUNCE_MS = 300


class JsonView(QWidget):
    """`json_parsed(object)`: the user's text parsed (any JSON value; the panel judges it).
    `json_failed(str)`: it does not parse: "line L, column C: message", or a duplicate key."""

    json_parsed = Signal(object)
    json_failed = Signal(str)

    def __init__(self, parent: Optional[QWidget] = None):
        super().__init__(parent)
        self.edit = QPlainTextEdit()
        self.edit.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
        self.edit.setLineWrapMode(QPlainTextEdit.LineWrapMode.NoWrap)
        self.error = ElidedLabel()  # a parse error can quote a long key: whole in the tooltip
        self.error.setStyleSheet(ERROR_LABEL_STYLE)
        self.error.hide()
        self._timer = QTimer(self, singleShot=True, interval=DEBOUNCE_MS)
        self._timer.timeout.connect(self.parse_now)
        self._setting = False
        self.edit.textChanged.connect(self._text_changed)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.edit, 1)
        layout.addWidget(self.error)

    def show_text(self, text: str) -> None:
        """Replace the text (from the form or a file) without parsing it back."""
        if text == self.edit.toPlainText():
            self._show_error("")
            return
        self._timer.stop()
        self._setting = True
        try:
            bar = self.edit.verticalScrollBar().value()
            self.edit.setPlainText(text)
            self.edit.verticalScrollBar().setValue(bar)  # keep the reader's place while the form edits
        finally:
            self._setting = False
        self._show_error("")

    def text(self) -> str:
        return self.edit.toPlainText()

    def is_pending(self) -> bool:
        return self._timer.isActive()

    def _text_changed(self) -> None:
        if not self._setting:
            self._timer.start()

    def parse_now(self) -> None:
        self._timer.stop()
        try:
            value = parse_json_text(self.edit.toPlainText())
        except JsonTextError as e:
            self._show_error(str(e))
            self.json_failed.emit(str(e))
            return
        self._show_error("")
        self.json_parsed.emit(value)

    def _show_error(self, message: str) -> None:
        self.error.setText(message)
        self.error.setVisible(bool(message))
