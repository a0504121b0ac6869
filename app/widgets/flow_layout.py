"""A layout that places its items left to right and starts a new line when the next one does not fit
(Qt's own "Flow Layout" example, which Qt does not ship as a class).

Used where a row of controls must fit a narrow window (1024 px) without clipping and still be one
row on a wide one: the Training panel's run controls. Its minimum width is its widest item, its
height follows its width (heightForWidth), so a box layout above it gives it the lines it needs.
"""
from __future__ import annotations

from typing import Optional

from PySide6.QtCore import QPoint, QRect, QSize, Qt
from PySide6.QtWidgets import QLayout, QLayoutItem, QSizePolicy, QWidget


class FlowLayout(QLayout):
    def __init__(self, parent: Optional[QWidget] = None, spacing: int = 6, line_spacing: int = 4):
        super().__init__(parent)
        self._items: list[QLayoutItem] = []
        self._spacing, self._line_spacing = spacing, line_spacing
        self.setContentsMargins(0, 0, 0, 0)

    # --------------------------------------------------------- QLayout's interface

    def addItem(self, item: QLayoutItem) -> None:  # noqa: N802 - Qt's name
        self._items.append(item)

    def count(self) -> int:
        return len(self._items)

    def itemAt(self, index: int) -> Optional[QLayoutItem]:  # noqa: N802
        return self._items[index] if 0 <= index < len(self._items) else None

    def takeAt(self, index: int) -> Optional[QLayoutItem]:  # noqa: N802
        return self._items.pop(index) if 0 <= index < len(self._items) else None

    def expandingDirections(self) -> Qt.Orientations:  # noqa: N802
        return Qt.Orientations(0)

    def hasHeightForWidth(self) -> bool:  # noqa: N802
        return True

    def heightForWidth(self, width: int) -> int:  # noqa: N802
        return self._place(QRect(0, 0, width, 0), move=False)

    def setGeometry(self, rect: QRect) -> None:  # noqa: N802
        super().setGeometry(rect)
        self._place(rect, move=True)

    def sizeHint(self) -> QSize:  # noqa: N802
        """One line: every item side by side."""
        shown = self._shown()
        width = sum(i.sizeHint().width() for i in shown) + self._spacing * max(0, len(shown) - 1)
        height = max((i.sizeHint().height() for i in shown), default=0)
        m = self.contentsMargins()
        return QSize(width + m.left() + m.right(), height + m.top() + m.bottom())

    def minimumSize(self) -> QSize:  # noqa: N802
        """The widest item: everything else can go on a line of its own."""
        size = QSize()
        for item in self._shown():
            size = size.expandedTo(item.minimumSize())
        m = self.contentsMargins()
        return size + QSize(m.left() + m.right(), m.top() + m.bottom())

    # --------------------------------------------------------- placing

    def _shown(self) -> list[QLayoutItem]:
        return [i for i in self._items if not i.isEmpty()]

    def lines(self, width: int) -> int:
        """How many lines the items take at `width` (for tests and the layout check)."""
        return len(self._lines(width - self.contentsMargins().left() - self.contentsMargins().right()))

    def _lines(self, width: int) -> list[list[QLayoutItem]]:
        lines: list[list[QLayoutItem]] = []
        used = 0
        for item in self._shown():
            w = item.sizeHint().width()
            if lines and used + self._spacing + w <= width:
                lines[-1].append(item)
                used += self._spacing + w
            else:
                lines.append([item])
                used = w
        return lines

    def _place(self, rect: QRect, move: bool) -> int:
        """Lay the items out inside `rect` (when `move`); returns the height they take."""
        m = self.contentsMargins()
        inner = rect.adjusted(m.left(), m.top(), -m.right(), -m.bottom())
        y = inner.y()
        for n, line in enumerate(self._lines(inner.width())):
            y += self._line_spacing if n else 0
            height = max(i.sizeHint().height() for i in line)
            x = inner.x()
            for item in line:
                hint = item.sizeHint()
                width = min(hint.width(), inner.width())  # an item alone on a narrow line is squeezed, not cut
                policy = item.widget().sizePolicy() if item.widget() is not None else None
                grows = policy is not None and policy.verticalPolicy() != QSizePolicy.Fixed
                h = height if grows else hint.height()
                if move:
                    item.setGeometry(QRect(QPoint(x, y + (height - h) // 2), QSize(width, h)))
                x += width + self._spacing
            y += height
        return y - rect.y() + m.bottom() if self._shown() else 0
