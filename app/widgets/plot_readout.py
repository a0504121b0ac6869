"""Hover readout: a vertical line at the point under the mouse and a box with every shown series'
value there, as TensorBoard and W&B draw it.

Mouse moves are coalesced by a single-shot timer (~30 Hz) and each lookup is a binary search per
curve (O(log n)), so hovering over 1,000,000-point curves costs nothing noticeable.
"""
from __future__ import annotations

import html
from typing import Callable, Optional

import pyqtgraph as pg
from PySide6.QtCore import QEvent, QObject, QPointF, Qt, QTimer

HOVER_MS = 33

# lookup(x in view units) -> (header, [(label, value text, colour)]) or None when nothing is near
Lookup = Callable[[float], Optional[tuple[float, str, list[tuple[str, str, tuple]]]]]


class HoverReadout(QObject):
    def __init__(self, widget: pg.PlotWidget, lookup: Lookup):
        super().__init__(widget)
        self._item = widget.getPlotItem()
        self._view = self._item.getViewBox()
        self._lookup = lookup
        self.line = pg.InfiniteLine(angle=90, movable=False, pen=pg.mkPen((200, 200, 200, 150), style=Qt.DashLine))
        self.box = pg.TextItem(anchor=(0, 0), fill=pg.mkBrush(25, 25, 25, 230), border=pg.mkPen(110, 110, 110))
        for item in (self.line, self.box):
            item.setZValue(1000)  # above every curve
            item.hide()
            self._item.addItem(item, ignoreBounds=True)
        self._pending: Optional[QPointF] = None
        self._timer = QTimer(self, singleShot=True, interval=HOVER_MS, timeout=self._update)
        self._item.scene().sigMouseMoved.connect(self._moved)
        widget.viewport().installEventFilter(self)
        self.rows: list[str] = []  # the text shown, one line per row (tests, screen readers)

    def eventFilter(self, obj, event) -> bool:
        if event.type() == QEvent.Leave:
            self.hide()
        return False

    def _moved(self, scene_pos: QPointF) -> None:
        self._pending = QPointF(scene_pos)
        if not self._timer.isActive():
            self._timer.start()

    def _update(self) -> None:
        pos, self._pending = self._pending, None
        if pos is None or not self._view.sceneBoundingRect().contains(pos):
            self.hide()
            return
        self.show_at(self._view.mapSceneToView(pos).x())

    def show_at(self, x: float) -> bool:
        """Show the readout for view x; False (and hidden) when no shown series has a point."""
        found = self._lookup(x)
        if found is None:
            self.hide()
            return False
        snapped, header, rows = found
        self.rows = [header] + [f"{label}  {value}" for label, value, _ in rows]
        lines = [f"<span style='color:#ddd'>{html.escape(header)}</span>"]
        lines += [f"<span style='color:rgb{tuple(color[:3])}'>&#9632;</span> {html.escape(label)}"
                  f" <b style='color:#eee'>{html.escape(value)}</b>" for label, value, color in rows]
        self.box.setHtml("<br>".join(lines))
        _, (_, y_top) = self._view.viewRange()
        # left of the line when the box (its size is in pixels) would leave the plot on the right
        at = self._view.mapViewToScene(QPointF(snapped, y_top)).x()
        room = self._view.sceneBoundingRect().right() - at
        self.box.setAnchor((1.0, 0.0) if self.box.boundingRect().width() + 4 > room else (0.0, 0.0))
        self.box.setPos(snapped, y_top)
        self.line.setPos(snapped)
        self.line.show()
        self.box.show()
        return True

    def hide(self) -> None:
        self.rows = []
        self.line.hide()
        self.box.hide()
