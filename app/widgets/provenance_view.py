"""The provenance of one sample image as wrapped, selectable, copyable text.

A word-wrapped QLabel cannot break a word, so one unbroken line (a weights sha256, a file path)
held the Samples panel's side column at its width. Here long words break anywhere, the text scrolls
when it is taller than the space, and the context menu copies all of it in one go.
"""
from __future__ import annotations

from typing import Optional

from PySide6.QtCore import QSize
from PySide6.QtGui import QGuiApplication, QTextOption
from PySide6.QtWidgets import QFrame, QPlainTextEdit, QWidget


class ProvenanceView(QPlainTextEdit):
    def __init__(self, parent: Optional[QWidget] = None):
        super().__init__(parent)
        self.setReadOnly(True)
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.setLineWrapMode(QPlainTextEdit.LineWrapMode.WidgetWidth)
        self.setWordWrapMode(QTextOption.WrapMode.WrapAtWordBoundaryOrAnywhere)  # a sha256 breaks too
        self.viewport().setAutoFillBackground(False)  # reads as a caption, not an input field

    def set_lines(self, lines: list[tuple[str, str]]) -> None:
        self.setPlainText("\n".join(f"{label}: {value}" for label, value in lines))

    def text(self) -> str:
        return self.toPlainText()

    def copy_all(self) -> None:
        QGuiApplication.clipboard().setText(self.toPlainText())

    def contextMenuEvent(self, event) -> None:  # noqa: N802 - Qt's name
        menu = self.createStandardContextMenu(event.pos())
        menu.addSeparator()
        menu.addAction("Copy all details", self.copy_all)
        menu.exec(event.globalPos())
        menu.deleteLater()

    def minimumSizeHint(self) -> QSize:  # noqa: N802
        return QSize(80, 3 * self.fontMetrics().lineSpacing())
