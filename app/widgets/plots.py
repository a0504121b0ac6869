"""The Training panel's live plots (pyqtgraph).

Each curve is created once and fed with setData from the panel's refresh timer; the data are
views of the SeriesStore's arrays (no copy). Every plot downsamples ("peak" keeps spikes visible)
and clips to the visible x range: 6 curves of 1,000,000 points redraw in ~25 ms on 2 CPU cores
(bench/gui.py).
"""
from __future__ import annotations

from itertools import accumulate
from typing import Optional

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QCheckBox, QDoubleSpinBox, QHBoxLayout, QLabel, QSlider, QVBoxLayout, QWidget

from app.models.series import Series, SeriesStore

FRAMEWORK_PEAK = "framework peak (torch allocator)"
DEVICE_USED = "device used (NVML / process RSS on CPU)"
# Qualitative colours that stay apart on a dark background (Tableau 10); loss curves take them in turn.
PALETTE = ((78, 121, 167), (242, 142, 43), (225, 87, 89), (118, 183, 178), (89, 161, 79), (237, 201, 72),
           (176, 122, 161), (255, 157, 167), (156, 117, 95), (186, 176, 172))
_SLIDER_STEPS = 1000  # smoothing slider resolution: factor = position / 1000, up to 0.999


class MetricPlot(pg.PlotWidget):
    """A plot whose curves are keyed by metric name."""

    def __init__(self, title: str, y_label: str, parent: Optional[QWidget] = None):
        super().__init__(parent)
        item = self.getPlotItem()
        item.setTitle(title)
        item.setLabel("left", y_label)
        item.getAxis("left").enableAutoSIPrefix(False)  # "GiB (x0.001)" would hide the unit
        item.setLabel("bottom", "iteration")
        # No grid: pyqtgraph's grid lines cost ~6 ms per frame of a 1260x300 plot (Qt raster),
        # more than the axes, legend and 6 downsampled curves together; live redraws need that time.
        item.addLegend(offset=(-10, 10))
        item.setDownsampling(auto=True, mode="peak")
        item.setClipToView(True)
        self._curves: dict[str, pg.PlotDataItem] = {}

    def add_curve(self, key: str, label: str, color: object) -> pg.PlotDataItem:
        # width 1: wider lines go through Qt's stroker, ~10x slower per frame on the raster engine
        curve = self.getPlotItem().plot(name=label, pen=pg.mkPen(color, width=1))
        curve.setDownsampling(auto=True, method="peak")
        curve.setClipToView(True)
        self._curves[key] = curve
        return curve

    def curve(self, key: str) -> Optional[pg.PlotDataItem]:
        return self._curves.get(key)

    def curve_keys(self) -> list[str]:
        return list(self._curves)

    def refresh(self, store: SeriesStore, dirty: set[str]) -> None:
        for key in dirty.intersection(self._curves):
            series = store.get(key)
            if series is not None:
                self._curves[key].setData(*series.view())

    def clear_data(self) -> None:
        for curve in self._curves.values():
            curve.setData([], [])

    def remove_curves(self) -> None:
        item = self.getPlotItem()
        for curve in self._curves.values():
            item.removeItem(curve)  # also drops its legend entry
        self._curves.clear()


class MemoryPlot(MetricPlot):
    """Two scopes, two curves, never mixed (DESIGN.md): the framework's own peak since the last
    log row, and the whole device as NVML sees it (process RSS on a CPU run). The device total is
    a horizontal line once an event carries it."""

    def __init__(self, parent: Optional[QWidget] = None):
        super().__init__("Memory", "GiB", parent)
        self.add_curve("mem_peak_alloc_gb", FRAMEWORK_PEAK, (80, 170, 255))
        self.add_curve("mem_device_used_gb", DEVICE_USED, (255, 150, 60))
        self.total_line = pg.InfiniteLine(angle=0, movable=False, pen=pg.mkPen((200, 60, 60), style=Qt.DashLine),
                                          label="device total {value:.1f} GiB",
                                          labelOpts={"position": 0.05, "color": (200, 60, 60)})
        self.total_line.setVisible(False)
        self.addItem(self.total_line, ignoreBounds=False)

    def set_total(self, gib: Optional[float]) -> None:
        if gib is None:
            self.total_line.setVisible(False)
            return
        if not self.total_line.isVisible() or self.total_line.value() != gib:
            self.total_line.setValue(gib)
            self.total_line.setVisible(True)


class StepTimePlot(MetricPlot):
    def __init__(self, parent: Optional[QWidget] = None):
        super().__init__("Step time", "seconds per iteration", parent)
        self.add_curve("step_time_s", "step time (s)", (120, 220, 120))
        self.add_curve("data_time_s", "data time (s)", (200, 200, 90))


def ema(values: np.ndarray, factor: float, start: Optional[float] = None) -> np.ndarray:
    """Exponential moving average s_t = f * s_(t-1) + (1 - f) * x_t, seeded with the first value
    (or `start`, the last smoothed value, when extending). ~0.1 s per 1,000,000 points."""
    if len(values) == 0 or factor <= 0.0:
        return np.array(values, dtype=np.float64)
    g = 1.0 - factor
    seed = float(values[0]) if start is None else start
    out = accumulate(values.tolist(), lambda s, x: factor * s + g * x, initial=seed)
    next(out)  # the seed itself
    return np.fromiter(out, dtype=np.float64, count=len(values))


class LossPlot(QWidget):
    """Every loss_* field of the metric events as its own curve, with EMA smoothing and log Y."""

    smoothing_changed = Signal(float)

    def __init__(self, parent: Optional[QWidget] = None):
        super().__init__(parent)
        self.plot = MetricPlot("Losses", "loss", self)
        self._smoothed: dict[str, Series] = {}  # per key: the EMA of the series so far
        self._factor = 0.0
        self.slider = QSlider(Qt.Horizontal)
        self.slider.setRange(0, _SLIDER_STEPS - 1)
        self.spin = QDoubleSpinBox()
        self.spin.setRange(0.0, (_SLIDER_STEPS - 1) / _SLIDER_STEPS)
        self.spin.setDecimals(3)
        self.spin.setSingleStep(0.05)
        self.log_y = QCheckBox("log scale")
        tip = "Exponential moving average of each curve (0 = raw values; 0.9 averages ~10 log rows)"
        self.slider.setToolTip(tip)
        self.spin.setToolTip(tip)
        self.slider.valueChanged.connect(lambda v: self.set_smoothing(v / _SLIDER_STEPS))
        self.spin.valueChanged.connect(self.set_smoothing)
        self.log_y.toggled.connect(lambda on: self.plot.getPlotItem().setLogMode(y=on))
        controls = QHBoxLayout()
        controls.addWidget(QLabel("Smoothing"))
        controls.addWidget(self.slider, 1)
        controls.addWidget(self.spin)
        controls.addWidget(self.log_y)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.plot, 1)
        layout.addLayout(controls)

    def smoothing(self) -> float:
        return self._factor

    def set_smoothing(self, factor: float) -> None:
        factor = round(min(max(float(factor), 0.0), (_SLIDER_STEPS - 1) / _SLIDER_STEPS), 3)
        for w, v in ((self.slider, round(factor * _SLIDER_STEPS)), (self.spin, factor)):
            w.blockSignals(True)
            w.setValue(v)
            w.blockSignals(False)
        if factor != self._factor:
            self._factor = factor
            self._smoothed.clear()  # recomputed from the raw series at the next refresh
            self.smoothing_changed.emit(factor)

    def refresh(self, store: SeriesStore, dirty: set[str]) -> None:
        for key in sorted(k for k in dirty if k.startswith("loss_")):
            series = store.get(key)
            if series is None:
                continue
            curve = self.plot.curve(key)
            if curve is None:
                curve = self.plot.add_curve(key, key, PALETTE[len(self.plot.curve_keys()) % len(PALETTE)])
            x, y = series.view()
            curve.setData(x, self._smooth(key, x, y))

    def _smooth(self, key: str, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        if self._factor <= 0.0:
            return y
        done = self._smoothed.get(key)
        if done is None or len(done) > len(y):
            done = self._smoothed[key] = Series()
        n = len(done)
        if n < len(y):  # only the new points: O(new) per refresh
            done.extend(x[n:], ema(y[n:], self._factor, done.last_value))
        return done.view()[1]

    def loss_keys(self) -> list[str]:
        return self.plot.curve_keys()

    def reset(self) -> None:
        """Another run: its loss terms may differ, so the curves (and legend entries) go."""
        self.plot.remove_curves()
        self._smoothed.clear()
