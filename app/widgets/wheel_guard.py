"""Wheel events change only a field that has focus.

Scrolling a long form with the mouse wheel passes the pointer over combo boxes, spin boxes and
sliders; by default each of them takes the wheel and changes its value (seen: mixed_precision
went from no to bf16 while scrolling the config form). A guarded widget takes focus only from a
click or Tab (StrongFocus, never from the wheel), and while it has no focus its wheel events go to
the scroll area around it, which scrolls instead.
"""
from __future__ import annotations

from typing import Optional

from PySide6.QtCore import QEvent, QObject, QPointF, Qt
from PySide6.QtGui import QWheelEvent
from PySide6.QtWidgets import QAbstractScrollArea, QApplication, QWidget


def scroll_area_of(widget: QWidget) -> Optional[QAbstractScrollArea]:
    """The nearest scroll area whose viewport holds `widget` (None outside any)."""
    child, parent = widget, widget.parentWidget()
    while parent is not None:
        if isinstance(parent, QAbstractScrollArea) and child is parent.viewport():
            return parent
        child, parent = parent, parent.parentWidget()
    return None


class WheelGuard(QObject):
    """An event filter for one widget: without focus, its wheel events are handed to the scroll
    area around it (re-addressed to the viewport) and the widget never sees them. Handed on
    explicitly rather than left to propagate: Qt propagates only wheel events from the window
    system, not ones sent by code."""

    def eventFilter(self, obj: QObject, event: QEvent) -> bool:  # noqa: N802 - Qt's name
        if event.type() != QEvent.Type.Wheel or not isinstance(obj, QWidget) or obj.hasFocus():
            return False
        area = scroll_area_of(obj)
        if area is None:
            event.ignore()  # nothing scrolls here: the parents may use it (Qt propagates it)
            return True
        viewport = area.viewport()
        pos = QPointF(viewport.mapFromGlobal(event.globalPosition().toPoint()))
        moved = QWheelEvent(pos, event.globalPosition(), event.pixelDelta(), event.angleDelta(), event.buttons(),
                            event.modifiers(), event.phase(), event.inverted(), event.source())
        QApplication.sendEvent(viewport, moved)
        return True


def guard_wheel(*widgets: QWidget) -> None:
    """Wheel over any of `widgets` scrolls its scroll area unless the widget has focus."""
    for w in widgets:
        w.setFocusPolicy(Qt.FocusPolicy.StrongFocus)
        w.installEventFilter(WheelGuard(w))  # owned by the widget: gone with it
