"""The mouse wheel scrolls a form; it changes a combo box, spin box or slider only when that field
has focus (seen: scrolling the config form turned resources.mixed_precision from no to bf16)."""
from __future__ import annotations

from PySide6.QtCore import QPoint, QPointF, Qt
from PySide6.QtGui import QWheelEvent
from PySide6.QtWidgets import QApplication, QScrollArea

from app.panels.config import ConfigPanel
from app.panels.data import DataPanel
from app.panels.probe import ProbePanel

NOTCH = 120  # one wheel notch, in eighths of a degree


def wheel(widget, notches: int = -1) -> bool:
    """A wheel turn over the middle of `widget`, delivered as the window system would (through
    QApplication, which passes an ignored wheel event on to the parents). True if accepted."""
    pos = QPointF(widget.width() / 2, widget.height() / 2)
    event = QWheelEvent(pos, QPointF(widget.mapToGlobal(pos.toPoint())), QPoint(0, 0), QPoint(0, NOTCH * notches),
                        Qt.NoButton, Qt.NoModifier, Qt.NoScrollPhase, False)
    QApplication.sendEvent(widget, event)
    return event.isAccepted()


def test_the_wheel_scrolls_the_config_form_past_a_combo_box_without_changing_it(qtbot, tmp_path):
    panel = ConfigPanel(unsaved_dir=tmp_path / "unsaved")
    qtbot.addWidget(panel)
    panel.resize(900, 500)  # the form is taller than this: its scroll area scrolls
    panel.show()
    qtbot.waitExposed(panel)
    combo = panel.form.rows[("resources", "mixed_precision")].editor.control()
    scroll = next(a for a in panel.findChildren(QScrollArea) if a.widget() is panel.form)
    combo.clearFocus()
    scroll.ensureWidgetVisible(combo)
    before, bar = combo.currentText(), scroll.verticalScrollBar()
    at = bar.value()
    for _ in range(3):
        wheel(combo, -1)
    assert combo.currentText() == before  # the value under the pointer is untouched
    assert bar.value() != at  # and the form scrolled instead
    assert combo.focusPolicy() == Qt.FocusPolicy.StrongFocus  # the wheel never gives it focus either


def test_a_focused_combo_box_still_takes_the_wheel(qtbot, tmp_path):
    panel = ConfigPanel(unsaved_dir=tmp_path / "unsaved")
    qtbot.addWidget(panel)
    panel.show()
    qtbot.waitExposed(panel)
    combo = panel.form.rows[("resources", "mixed_precision")].editor.control()
    panel.activateWindow()
    combo.setFocus(Qt.FocusReason.MouseFocusReason)
    qtbot.waitUntil(combo.hasFocus, timeout=5_000)
    before = combo.currentIndex()
    wheel(combo, -1 if before < combo.count() - 1 else 1)
    assert combo.currentIndex() != before


def test_spin_boxes_and_filters_of_the_data_and_probe_panels_ignore_the_wheel_without_focus(qtbot, tmp_path):
    data = DataPanel()
    probe = ProbePanel(lambda: tmp_path / "config.json", probes_dir=tmp_path / "probes")
    for w in (data, probe):
        qtbot.addWidget(w)
        w.show()
    data.severity.setCurrentIndex(1)
    fields = [(data.min_size, data.min_size.value), (data.severity, data.severity.currentIndex),
              (probe.steps, probe.steps.value), (probe.warmup, probe.warmup.value)]
    for widget, value in fields:
        widget.clearFocus()
        before = value()
        wheel(widget, 1)
        wheel(widget, -1)
        wheel(widget, -1)
        assert value() == before, widget
