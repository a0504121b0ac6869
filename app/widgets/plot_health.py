"""One plot of the Training panel's Health page: a health signal over iterations (a MetricPlot fed by the
same SeriesStore and PlotFeed as the loss plots), with two reference lines and the alerts marked:

- dotted grey: the teacher's level, 1.0 (ratio signals only; teacher_distance is absolute);
- dashed, in the curve's colour: the run's own early level, its first health row;
- dash-dotted red: the alert bound(s) (the contract's HEALTH_THRESHOLDS), so that a few percent of
  drift reads as a few percent, and the distance to an alert is plain;
- red triangles: the rows that raised an alert for this signal (series "health_alert.<signal>").

The reference lines are two-point curves over the drawn x span, so the y range always includes them.
"""
from __future__ import annotations

from typing import Optional

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QPoint, Qt
from PySide6.QtGui import QColor, QIcon, QPainter, QPixmap, QPolygon
from PySide6.QtWidgets import QWidget

from app.models.health import ABSOLUTE
from app.models.plot_data import X_ELAPSED, elapsed_map
from app.models.series import SeriesStore
from app.widgets.plot_legend import DASH, sample_icon
from app.widgets.plot_specs import GREY, PlotSpec, health_alert_key
from app.widgets.plots import MetricPlot
from dmad.contract.runlog import HEALTH_THRESHOLDS

ALERT_RED = (235, 60, 60)
TEACHER, EARLY, BOUND, ALERTS = "~teacher", "~early", "~bound", "~alerts"


class HealthPlot(MetricPlot):
    def __init__(self, spec: PlotSpec, signal: str, parent: Optional[QWidget] = None):
        super().__init__(spec, parent)
        self.signal = signal
        self.key = spec.curves[0].key
        self.alert_key = health_alert_key(signal)
        colour = spec.curves[0].color
        item = self.getPlotItem()
        self.teacher_line = None
        if signal not in ABSOLUTE:
            self.teacher_line = pg.PlotDataItem(pen=pg.mkPen(GREY, width=1.5, style=Qt.DotLine))
            item.addItem(self.teacher_line)
            self.legend.add_entry(TEACHER, "teacher", sample_icon(GREY, DASH, Qt.DotLine),
                                  "the teacher's own level: 1.0 = as the teacher")
        self.early_line = pg.PlotDataItem(pen=pg.mkPen(colour, width=1.5, style=Qt.DashLine))
        item.addItem(self.early_line)
        self.legend.add_entry(EARLY, "early", sample_icon(colour, DASH, Qt.DashLine),
                              "this run's early level (its first health row), for comparison")
        self.bounds = tuple(b for b in HEALTH_THRESHOLDS.get(signal, (None, None)) if b is not None)
        self.bound_line = None
        if self.bounds:
            # one item for both bounds: two segments, joined only where connect says so
            self.bound_line = pg.PlotDataItem(pen=pg.mkPen(ALERT_RED, width=1.2, style=Qt.DashDotLine),
                                              connect="pairs")
            item.addItem(self.bound_line)
            self.legend.add_entry(BOUND, "alert bound", sample_icon(ALERT_RED, DASH, Qt.DashDotLine),
                                  "an alert fires beyond this line: " + " and ".join(f"{b:g}" for b in self.bounds))
        self.alert_points = pg.ScatterPlotItem(symbol="t", size=12, pen=pg.mkPen(ALERT_RED),
                                               brush=pg.mkBrush(*ALERT_RED))
        self.alert_points.setZValue(2)
        item.addItem(self.alert_points)
        self.legend.add_entry(ALERTS, "alert", _alert_icon(), "a health row that raised an alert for this signal")
        guides = {TEACHER: self.teacher_line, EARLY: self.early_line, BOUND: self.bound_line, ALERTS: self.alert_points}
        self._guides = {key: item for key, item in guides.items() if item is not None}  # this signal's own

    def _draw(self, key, raw, to_x) -> None:
        super()._draw(key, raw, to_x)
        self.legend.show_entry(key, False)  # the title names the curve: the legend keeps room for the guides

    def refresh(self, store: SeriesStore, dirty: set[str]) -> None:
        super().refresh(store, dirty)
        if self.key in dirty or self.alert_key in dirty:
            self._draw_guides(store)

    def _draw_guides(self, store: SeriesStore) -> None:
        drawn = self._drawn.get(self.key)
        x = drawn[0] if drawn is not None else np.empty(0)
        if len(x) == 0:
            self._clear_guides()
            return
        span = np.array([x[0], x[-1]], dtype=np.float64)
        if self.teacher_line is not None:
            self.teacher_line.setData(span, np.ones(2))
            self.legend.show_entry(TEACHER)
        self.early_line.setData(span, np.full(2, float(drawn[1][0])))
        self.legend.show_entry(EARLY)
        if self.bound_line is not None:
            self.bound_line.setData(np.tile(span, len(self.bounds)), np.repeat(np.array(self.bounds, dtype=np.float64), 2))
            self.legend.show_entry(BOUND)
        alerts = store.get(self.alert_key)
        ax, ay = alerts.view() if alerts is not None else (np.empty(0), np.empty(0))
        if len(ax) and self._x_mode == X_ELAPSED:
            to_x = elapsed_map(store.times.view())
            ax, ay = (to_x(ax), ay) if to_x is not None else (np.empty(0), np.empty(0))
        self.alert_points.setData(ax, ay)
        self.legend.show_entry(ALERTS, len(ax) > 0)

    def _clear_guides(self) -> None:
        for key, item in self._guides.items():
            item.setData([], [])
            self.legend.show_entry(key, False)

    def alert_iterations(self) -> list[float]:
        return [float(v) for v in self.alert_points.data["x"]]

    def reset(self) -> None:
        super().reset()
        self._clear_guides()

    def _set_shown(self, key: str, shown: bool) -> None:
        if key in self._guides:
            self._guides[key].setVisible(shown)
            self.view.updateAutoRange()
            return
        super()._set_shown(key, shown)


def _alert_icon() -> QIcon:
    pix = QPixmap(20, 12)
    pix.fill(Qt.transparent)
    p = QPainter(pix)
    p.setBrush(QColor(*ALERT_RED))
    p.setPen(QColor(*ALERT_RED))
    p.drawPolygon(QPolygon([QPoint(10, 10), QPoint(5, 2), QPoint(15, 2)]))
    p.end()
    return QIcon(pix)
