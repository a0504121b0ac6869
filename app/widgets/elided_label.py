"""A one-line label that never widens the window: long text (a stderr line, a path, a sha256) is
elided to the width the layout gives it, and the whole text is in the tooltip.

QLabel's size hint is its text's full width, so one long line in a status label raised the main
window's minimum width past the screen (seen: 2,149 px on a 1,600 px screen). This label asks for
a small minimum width and paints the elided text itself.
"""
from __future__ import annotations

from typing import Optional

from PySide6.QtCore import QSize, Qt
from PySide6.QtGui import QPainter
from PySide6.QtWidgets import QLabel, QSizePolicy, QWidget

MIN_CHARS = 12  # the width asked for, in average characters: room for "… " plus a word


class ElidedLabel(QLabel):
    def __init__(self, text: str = "", parent: Optional[QWidget] = None,
                 mode: Qt.TextElideMode = Qt.TextElideMode.ElideRight):
        super().__init__(parent)
        self._mode = mode
        self.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self.setText(text)

    def setText(self, text: str) -> None:  # noqa: N802 - Qt's name
        text = " ".join(str(text).split())  # one line: a multi-line stderr chunk stays one row high
        super().setText(text)
        self.setToolTip(text if text else "")
        self.update()

    def full_text(self) -> str:
        return self.text()

    def elided_text(self) -> str:
        return self.fontMetrics().elidedText(self.text(), self._mode, max(0, self.contentsRect().width()))

    def minimumSizeHint(self) -> QSize:  # noqa: N802
        fm = self.fontMetrics()
        return QSize(min(fm.averageCharWidth() * MIN_CHARS, fm.horizontalAdvance(self.text()) + 2), fm.height())

    def sizeHint(self) -> QSize:  # noqa: N802
        fm = self.fontMetrics()
        return QSize(fm.horizontalAdvance(self.text()) + 2, fm.height())

    def paintEvent(self, event) -> None:  # noqa: N802
        painter = QPainter(self)
        painter.setPen(self.palette().color(self.foregroundRole()))
        painter.drawText(self.contentsRect(), int(self.alignment() | Qt.AlignmentFlag.AlignVCenter), self.elided_text())
