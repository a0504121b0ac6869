"""A plot's legend as a row of clickable entries above the plot, wrapping when narrow.

Outside the plot area, so no curve runs through its text; each entry is a checkable button that
hides or shows its series (checked = shown); an entry appears only once its series has data, so a
figure a device does not report (framework peak on a CPU) has no entry pointing at nothing.
"""
from __future__ import annotations

from typing import Optional

from PySide6.QtCore import QPoint, QRect, QSize, Qt, Signal
from PySide6.QtGui import QColor, QIcon, QPainter, QPen, QPixmap
from PySide6.QtWidgets import QLabel, QLayout, QSizePolicy, QToolButton, QWidget, QWidgetItem

SOLID, BAND, DASH = "solid", "band", "dash"
ICON_W = 20  # px: a line sample long enough to show a dash pattern
# Flat entries: a checked (shown) entry must not look pressed; hovering shows it can be clicked.
_ENTRY_STYLE = ("QToolButton { border: 1px solid transparent; border-radius: 3px; padding: 0 2px; background: transparent; }"
                "QToolButton:hover { border-color: #aaa; }")
_DASHES = (Qt.DashLine, Qt.DotLine, Qt.DashDotLine, Qt.DashDotDotLine)


def dash_style(index: int) -> Qt.PenStyle:
    """The pen style of the index-th overlay run (a few runs stay apart)."""
    return _DASHES[index % len(_DASHES)]


def sample_icon(color: tuple, kind: str = SOLID, dash: Qt.PenStyle = Qt.DashLine) -> QIcon:
    pix = QPixmap(ICON_W, 12)
    pix.fill(Qt.transparent)
    p = QPainter(pix)
    pen = QPen(QColor(*color), 6 if kind == BAND else 2)
    if kind == DASH:
        pen.setStyle(dash)
    p.setPen(pen)
    p.drawLine(1, 6, ICON_W - 1, 6)
    p.end()
    return QIcon(pix)


class FlowLayout(QLayout):
    """Left to right, wrapping to a new line when the width runs out (Qt's flow layout example)."""

    def __init__(self, parent: Optional[QWidget] = None, spacing: int = 2):
        super().__init__(parent)
        self._items = []
        self.setSpacing(spacing)
        self.setContentsMargins(0, 0, 0, 0)

    def addItem(self, item) -> None:
        self._items.append(item)

    def insert_widget(self, index: int, widget: QWidget) -> None:
        self.addChildWidget(widget)
        self._items.insert(index, QWidgetItem(widget))
        self.invalidate()

    def count(self) -> int:
        return len(self._items)

    def itemAt(self, i: int):
        return self._items[i] if 0 <= i < len(self._items) else None

    def takeAt(self, i: int):
        return self._items.pop(i) if 0 <= i < len(self._items) else None

    def hasHeightForWidth(self) -> bool:
        return True

    def heightForWidth(self, width: int) -> int:
        return self._place(QRect(0, 0, width, 0), move=False)

    def setGeometry(self, rect: QRect) -> None:
        super().setGeometry(rect)
        self._place(rect, move=True)

    def sizeHint(self) -> QSize:
        return self.minimumSize()

    def minimumSize(self) -> QSize:
        size = QSize()
        for item in self._items:
            size = size.expandedTo(item.minimumSize())
        return size

    def _place(self, rect: QRect, move: bool) -> int:
        x, y, line = rect.x(), rect.y(), 0
        for item in self._items:
            if item.widget() is not None and item.widget().isHidden():
                continue
            hint = item.sizeHint()
            if x + hint.width() > rect.right() + 1 and line > 0:
                x, y, line = rect.x(), y + line + self.spacing(), 0
            if move:
                item.setGeometry(QRect(QPoint(x, y), hint))
            x += hint.width() + self.spacing() * 2
            line = max(line, hint.height())
        return y + line - rect.y()


class PlotLegend(QWidget):
    """Title, one entry per series that has data, and a remark, in one wrapping row."""

    entry_toggled = Signal(str, bool)  # key, shown
    entries_changed = Signal()  # an entry or the remark appeared or went: the height may change

    def __init__(self, title: str, tip: str = "", parent: Optional[QWidget] = None):
        super().__init__(parent)
        self._flow = FlowLayout(self)
        self.title = QLabel(f"<b>{title}</b>")
        self.title.setToolTip(tip)
        self._flow.addWidget(self.title)
        self._entries: dict[str, QToolButton] = {}
        self.note = QLabel()  # a remark on the entries (a figure this device does not report)
        self.note.setStyleSheet("color: #777; font-style: italic;")
        self.note.hide()
        self._flow.addWidget(self.note)
        self.setSizePolicy(QSizePolicy.Preferred, QSizePolicy.Minimum)

    def add_entry(self, key: str, label: str, icon: QIcon, tip: str = "") -> QToolButton:
        """A hidden entry; `show_entry(key)` once its series has data."""
        button = QToolButton(self)
        button.setText(label)
        button.setIcon(icon)
        button.setIconSize(QSize(ICON_W, 12))
        button.setToolButtonStyle(Qt.ToolButtonTextBesideIcon)
        button.setAutoRaise(True)
        button.setStyleSheet(_ENTRY_STYLE)
        button.setCheckable(True)
        button.setChecked(True)
        button.setToolTip((tip + "\n" if tip else "") + "Click to hide or show this series.")
        button.toggled.connect(lambda on, b=button, k=key: self._toggled(k, b, on))
        button.hide()
        self._flow.insert_widget(self._flow.count() - 1, button)  # before the note
        self._entries[key] = button
        return button

    def _toggled(self, key: str, button: QToolButton, on: bool) -> None:
        font = button.font()
        font.setStrikeOut(not on)  # hidden: struck through and greyed, as in plotly / W&B
        button.setFont(font)
        button.setStyleSheet(_ENTRY_STYLE + ("" if on else "QToolButton { color: #888; }"))
        self.entry_toggled.emit(key, on)

    def show_entry(self, key: str, shown: bool = True) -> None:
        button = self._entries.get(key)
        if button is not None and button.isHidden() == shown:
            button.setVisible(shown)
            self.updateGeometry()
            self.entries_changed.emit()

    def remove_entry(self, key: str) -> None:
        button = self._entries.pop(key, None)
        if button is not None:
            self._flow.removeWidget(button)
            button.deleteLater()
            self.updateGeometry()
            self.entries_changed.emit()

    def set_remark(self, text: str, tip: str = "") -> None:
        if text != self.note.text() or self.note.isHidden() == bool(text):
            self.note.setText(text)
            self.note.setToolTip(tip)
            self.note.setVisible(bool(text))
            self.entries_changed.emit()

    def entry(self, key: str) -> Optional[QToolButton]:
        return self._entries.get(key)

    def is_shown(self, key: str) -> bool:
        """The series is drawn: its entry is checked (an entry not yet listed counts as shown)."""
        button = self._entries.get(key)
        return button is None or button.isChecked()

    def labels(self) -> list[str]:
        """The listed entries' texts, in order."""
        return [b.text() for b in self._entries.values() if not b.isHidden()]
