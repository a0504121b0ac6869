"""A long status line never widens the window; the whole text is in the tooltip."""
from __future__ import annotations

from PySide6.QtWidgets import QHBoxLayout, QLabel, QWidget

from app.widgets.elided_label import ElidedLabel


def test_a_long_line_does_not_raise_the_minimum_width(qtbot):
    line = "dmad: warning: " + "a library complained about something " * 40
    w = QWidget()
    qtbot.addWidget(w)
    row = QHBoxLayout(w)
    label = ElidedLabel(line + "\nsecond line")
    row.addWidget(label)
    plain = QLabel(line)
    assert plain.minimumSizeHint().width() > 2000  # what a QLabel would have asked for
    assert w.minimumSizeHint().width() < 200
    w.resize(400, 40)
    w.show()
    qtbot.waitExposed(w)
    assert label.toolTip() == " ".join((line + " second line").split())
    shown = label.elided_text()
    assert shown.endswith("…") and len(shown) < len(label.text())
    assert label.fontMetrics().horizontalAdvance(shown) <= label.contentsRect().width()
