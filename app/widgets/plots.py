"""One metric plot of the Training panel: a legend row above a pyqtgraph plot, a hover readout,
other runs as dashed overlays, and export of the image and the data.

Each curve is created once (per metric of its PlotSpec, per overlay run) and fed with setData from
the PlotFeed's timer; the data are views of the SeriesStore's arrays, or of CurveCache arrays where
smoothing or the wall-clock x axis derive them (extended by the new points only). Every curve
downsamples ("peak": spikes stay visible, ~4 points per pixel column) and clips to the view: 6 curves
of 1,000,000 points redraw in ~20 ms on 2 CPU cores (bench/gui.py). Pens are 2 px, solid and opaque,
which keeps pyqtgraph's segmented-line fast path (a dashed pen is ~2x slower: overlays only).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QHBoxLayout, QMenu, QStyle, QToolButton, QVBoxLayout, QWidget

from app.models.plot_data import X_ELAPSED, X_ITERATION, Arrays, CurveCache, OverlayRun, elapsed_map, nearest
from app.models.plot_data import ema
from app.models.series import SeriesStore
from app.widgets.plot_axis import PlotAxis, format_elapsed, format_value
from app.widgets.plot_export import PlotExporter
from app.widgets.plot_legend import BAND, DASH, SOLID, PlotLegend, sample_icon
from app.widgets.plot_readout import HoverReadout
from app.widgets.plot_specs import DEVICE_USED, FRAMEWORK_PEAK, GREY, STEP_TIME, PlotSpec
from app.widgets.plot_view import PlotViewBox

# the curve names and the smoothing, for whoever checks what the plots show
MARK_COLOR = (120, 120, 140)  # the marks of checkpoints, renders and pauses on the step-time plot

__all__ = ["MetricPlot", "StepMarks", "step_time_plot", "ema", "DEVICE_USED", "FRAMEWORK_PEAK"]
_EMPTY = (np.empty(0), np.empty(0), np.empty(0))
_X_LABELS = {X_ITERATION: "iteration", X_ELAPSED: "elapsed wall-clock time"}


@dataclass
class _Overlay:
    run: OverlayRun
    curves: dict[str, pg.PlotDataItem] = field(default_factory=dict)
    caches: dict[str, CurveCache] = field(default_factory=dict)
    drawn: dict[str, tuple] = field(default_factory=dict)  # key -> (x, y, iterations) as drawn


class MetricPlot(QWidget):
    """The curves of one PlotSpec, keyed by metric name."""

    reported = Signal(str)  # an export's outcome, one line

    def __init__(self, spec: PlotSpec, parent: Optional[QWidget] = None):
        super().__init__(parent)
        self.spec = spec
        self._labels = {c.key: c for c in spec.curves}
        self._factor, self._x_mode, self._store = 0.0, X_ITERATION, None
        self._empty: Optional[bool] = None
        self._build_plot()
        self.legend = PlotLegend(spec.title, spec.tip)
        self.legend.entry_toggled.connect(self._set_shown)
        self._curves = {c.key: self._make_curve(c.color, 6 if c.band else 2, band=c.band) for c in spec.curves}
        for c in spec.curves:
            self.legend.add_entry(c.key, c.label, sample_icon(c.color, BAND if c.band else SOLID), c.tip)
        self._caches = {k: CurveCache() for k in self._curves}
        self._drawn: dict[str, tuple] = {}
        self._overlays: dict[str, _Overlay] = {}
        self._marks: dict[float, tuple[list[str], pg.InfiniteLine]] = {}  # iteration -> (labels, its line)
        self.readout = HoverReadout(self.widget, self._look_up)
        self.exporter = PlotExporter(self)
        self.exporter.exported.connect(lambda path: self.reported.emit(f"saved {path}"))
        self.exporter.failed.connect(lambda why: self.reported.emit(f"could not save: {why}"))
        self._build_layout()
        self._update_empty()

    def _build_plot(self) -> None:
        self.x_axis, self.y_axis = PlotAxis("bottom"), PlotAxis("left")
        self.view = PlotViewBox(y_from_zero=self.spec.y_from_zero, y_fixed=self.spec.y_fixed)
        self.widget = pg.PlotWidget(viewBox=self.view, axisItems={"bottom": self.x_axis, "left": self.y_axis})
        item = self.widget.getPlotItem()
        item.setLabel("left", self.spec.y_label)
        item.setLabel("bottom", self._x_label(X_ITERATION))
        # No grid: pyqtgraph's grid lines cost ~6 ms per frame of a 1260x300 plot (Qt raster).
        item.setDownsampling(auto=True, mode="peak")
        item.setClipToView(True)
        self.empty_text = pg.TextItem("no data yet", anchor=(0.5, 0.5), color=(150, 150, 150))
        item.addItem(self.empty_text, ignoreBounds=True)
        if self.spec.y_guide is not None:
            item.addItem(pg.InfiniteLine(self.spec.y_guide, angle=0, pen=pg.mkPen(GREY, style=Qt.DotLine)),
                         ignoreBounds=True)

    def _build_layout(self) -> None:
        self.save_button = QToolButton(self)
        self.save_button.setIcon(self.style().standardIcon(QStyle.SP_DialogSaveButton))
        self.save_button.setToolTip("Save this plot as a PNG image, or its data as CSV")
        self.save_button.setAutoRaise(True)
        self.save_button.setPopupMode(QToolButton.InstantPopup)
        menu = QMenu(self.save_button)
        self.save_button.setMenu(menu)
        self.view.menu.addSeparator()  # the same actions in the plot's right-click menu
        for m in (menu, self.view.menu):
            m.addAction("Save image (PNG)...", self.ask_png)
            m.addAction("Save data (CSV)...", self.ask_csv)
        header = QHBoxLayout()
        header.setContentsMargins(4, 0, 0, 0)
        header.addWidget(self.legend, 1)
        header.addWidget(self.save_button, 0, Qt.AlignTop)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(0)
        layout.addLayout(header)
        layout.addWidget(self.widget, 1)

    def _make_curve(self, color: tuple, width: float, dash: Optional[Qt.PenStyle] = None,
                    band: bool = False) -> pg.PlotDataItem:
        pen = pg.mkPen(color, width=width) if dash is None else pg.mkPen(color, width=width, style=dash)
        # skipFiniteCheck: the store and the overlay reader keep only finite numbers
        curve = pg.PlotDataItem(pen=pen, autoDownsampleFactor=2.0, skipFiniteCheck=True)
        curve.setDownsampling(auto=True, method="peak")
        curve.setClipToView(True)
        curve.setZValue(-1 if band else 0)  # a band lies under the curve it sums
        self.widget.getPlotItem().addItem(curve)
        return curve

    # ------------------------------------------------------------ data

    def legend_height(self, width: int) -> int:
        """The legend's height when this plot is `width` px wide (PlotRow lines plots up by it)."""
        return self.legend.heightForWidth(max(1, width - self.save_button.sizeHint().width() - 4))

    def getPlotItem(self) -> pg.PlotItem:
        return self.widget.getPlotItem()

    def curve(self, key: str) -> Optional[pg.PlotDataItem]:
        return self._curves.get(key)

    def curve_keys(self) -> list[str]:
        return list(self._curves)

    def keys_with_data(self) -> list[str]:
        return [k for k in self._curves if len(self._drawn.get(k, _EMPTY)[0])]

    def refresh(self, store: SeriesStore, dirty: set[str]) -> None:
        self._store = store
        series = {k: store.get(k) for k in self._curves if k in dirty and store.get(k) is not None}
        if series:
            if any(len(s) for s in series.values()):
                self._update_empty(False)  # before setData: an empty plot's fixed range would clip the data
            to_x = elapsed_map(store.times.view()) if self._x_mode == X_ELAPSED else None
            for key, s in series.items():
                self._draw(key, s.view(), to_x)
            self._update_empty()
            self._place_marks()

    def _draw(self, key: str, raw: Arrays, to_x) -> None:
        if self._x_mode == X_ELAPSED and to_x is None:
            x, y = _EMPTY[:2]  # no event carried a time: nothing to place on a time axis
        else:
            x, y = self._caches[key].update(raw, self._factor, to_x)
        _set_data(self._curves[key], x, y)
        self._drawn[key] = (x, y, raw[0])
        self.legend.show_entry(key, len(x) > 0)

    def x_span(self) -> Optional[list]:
        """The x range of everything drawn here (main curves and overlays), None when empty."""
        spans = [(d[0][0], d[0][-1]) for d in self._all_drawn() if len(d[0])]
        return [min(s[0] for s in spans), max(s[1] for s in spans)] if spans else None

    def _all_drawn(self) -> list[tuple]:
        return list(self._drawn.values()) + [d for o in self._overlays.values() for d in o.drawn.values()]

    def _update_empty(self, empty: Optional[bool] = None) -> None:
        """An empty plot says so, with no fake 0..1 ticks; data turns the auto-range back on."""
        if empty is None:
            empty = not any(len(d[0]) for d in self._all_drawn())
        if empty == self._empty:
            return
        self._empty = empty
        self.empty_text.setVisible(empty)
        for axis in (self.x_axis, self.y_axis):
            axis.setStyle(showValues=not empty)
            axis.setTicks([] if empty else None)  # no tick marks that measure nothing
        if empty:
            self.view.disableAutoRange()
            self.view.setRange(xRange=(0, 1), yRange=(0, 1), padding=0)
            self.empty_text.setPos(0.5, 0.5)
        else:
            self.view.enableAutoRange()

    def is_empty(self) -> bool:
        return bool(self._empty)

    def reset(self) -> None:
        """Another run: no data, every series shown again, the ranges fitted to what comes next."""
        for key, curve in self._curves.items():
            curve.setData([], [])
            self._caches[key].clear()
            self.legend.show_entry(key, False)
            self.legend.entry(key).setChecked(True)
        self._drawn.clear()
        for _labels, line in self._marks.values():
            self.widget.getPlotItem().removeItem(line)
        self._marks.clear()
        self.readout.hide()
        self.view.shared_x = None
        self._empty = None
        self._update_empty()
        self.view.enableAutoRange()

    # ------------------------------------------------------------ display settings

    def set_smoothing(self, factor: float) -> None:
        """The main curves are redrawn at the next refresh (the board marks them dirty)."""
        factor = factor if self.spec.smooth else 0.0
        if factor != self._factor:
            self._factor = factor
            self._invalidate()

    def set_x_mode(self, mode: str) -> None:
        if mode != self._x_mode:
            self._x_mode = mode
            self.x_axis.set_time_mode(mode == X_ELAPSED)
            self.getPlotItem().setLabel("bottom", self._x_label(mode))
            self._invalidate()
            self.view.enableAutoRange()  # another unit: the old range means nothing

    def _x_label(self, mode: str) -> str:
        return _X_LABELS[mode] + (f" · {self.spec.x_note}" if self.spec.x_note else "")

    def set_log_y(self, on: bool) -> None:
        if self.spec.log_ok:
            self.getPlotItem().setLogMode(y=on)

    # ------------------------------------------------------------ marks: what is not a training step

    def add_mark(self, iteration: float, label: str) -> None:
        """A dashed vertical line at the iteration boundary where something that is not a training step
        took time ("validation 5.6 s", "pause 20 s"); several at one boundary share a line."""
        item = self.widget.getPlotItem()
        labels, line = self._marks.get(iteration, ([], None))
        if line is None:
            line = pg.InfiniteLine(angle=90, movable=False, pen=pg.mkPen(MARK_COLOR, style=Qt.DashLine),
                                   label="", labelOpts={"position": 0.92, "color": MARK_COLOR, "anchors": [(0, 0), (0, 0)]})
            item.addItem(line, ignoreBounds=True)
        labels.append(label)
        line.label.setFormat(" · ".join(labels))
        line.setToolTip(f"iteration {int(iteration):,}: " + ", ".join(labels) + " (not counted in the step time)")
        self._marks[iteration] = (labels, line)
        self._place_marks()

    def marks(self) -> dict[float, str]:
        return {it: " · ".join(labels) for it, (labels, _line) in self._marks.items()}

    def _place_marks(self) -> None:
        to_x = elapsed_map(self._store.times.view()) if self._x_mode == X_ELAPSED and self._store is not None else None
        for it, (_labels, line) in self._marks.items():
            if self._x_mode == X_ELAPSED and to_x is None:
                line.hide()
                continue
            line.setPos(float(to_x(np.array([it]))[0]) if to_x is not None else it)
            line.show()

    def _invalidate(self) -> None:
        for cache in self._caches.values():
            cache.clear()
        for name in self._overlays:
            self._draw_overlay(name)
        self._place_marks()
        self.readout.hide()

    # ------------------------------------------------------------ overlays

    def add_overlay(self, run: OverlayRun, dash: Qt.PenStyle) -> bool:
        """Dashed curves of another run for the metrics this plot shows; False when it has none."""
        keys = [c for c in self.spec.curves if c.key in run.series]
        if not keys or run.name in self._overlays:
            return False
        ov = self._overlays[run.name] = _Overlay(run)
        for c in keys:  # a band's dark colour would vanish as a thin dashed line: lighter
            color = tuple(min(255, int(v * 1.7)) for v in c.color) if c.band else c.color
            ov.curves[c.key] = self._make_curve(color, 2, dash=dash)
            ov.caches[c.key] = CurveCache()
        self.legend.add_entry("@" + run.name, f"{run.name} (dashed)", sample_icon(GREY, DASH, dash),
                              f"another run, for comparison: {run.path}")
        self.legend.show_entry("@" + run.name)
        self._update_empty(False)
        self._draw_overlay(run.name)
        return True

    def _draw_overlay(self, name: str) -> None:
        ov = self._overlays[name]
        to_x = elapsed_map(ov.run.times) if self._x_mode == X_ELAPSED else None
        for key, curve in ov.curves.items():
            raw = ov.run.series[key]
            ov.caches[key].clear()
            x, y = _EMPTY[:2] if self._x_mode == X_ELAPSED and to_x is None else \
                ov.caches[key].update(raw, self._factor, to_x)
            _set_data(curve, x, y)
            ov.drawn[key] = (x, y, raw[0])

    def remove_overlay(self, name: str) -> None:
        ov = self._overlays.pop(name, None)
        if ov is None:
            return
        for curve in ov.curves.values():
            self.getPlotItem().removeItem(curve)
        self.legend.remove_entry("@" + name)
        self._update_empty()

    def has_overlays(self) -> bool:
        return bool(self._overlays)

    def overlay_curves(self, name: str) -> dict[str, pg.PlotDataItem]:
        ov = self._overlays.get(name)
        return dict(ov.curves) if ov else {}

    def _set_shown(self, key: str, shown: bool) -> None:
        curves = self._overlays[key[1:]].curves.values() if key.startswith("@") else [self._curves[key]]
        for curve in curves:
            curve.setVisible(shown)
        self.readout.hide()
        self.view.updateAutoRange()  # a hidden series no longer sets the range

    # ------------------------------------------------------------ hover readout

    def _shown_rows(self) -> list[tuple[str, tuple, tuple]]:
        """(label, (x, y, iterations), colour) of every series drawn and not hidden."""
        rows = [(self._labels[k].label, d, self._labels[k].color) for k, d in self._drawn.items()
                if len(d[0]) and self.legend.is_shown(k)]
        for name, ov in self._overlays.items():
            if self.legend.is_shown("@" + name):
                rows += [(f"{k} · {name}", d, self._labels[k].color) for k, d in ov.drawn.items() if len(d[0])]
        return rows

    def _look_up(self, at: float):
        found = []
        for label, (x, y, its), color in self._shown_rows():
            i = nearest(x, at)
            found.append((abs(x[i] - at), label, float(x[i]), float(y[i]), float(its[i]), color))
        if not found:
            return None
        _, _, snapped, _, it, _ = min(found, key=lambda f: f[0])
        header = (f"iteration {int(it):,}" if self._x_mode == X_ITERATION
                  else f"{format_elapsed(snapped)} · iteration {int(it):,}")
        rows = [(label, format_value(v) + ("" if i_ == it else f"  @ iter {int(i_):,}"), color)
                for _, label, _, v, i_, color in found]
        return snapped, header, rows

    # ------------------------------------------------------------ export

    def ask_png(self) -> None:
        path = self.exporter.ask(self, "Save plot image", f"{self.spec.name}.png", "PNG image (*.png)")
        if path is not None:
            self.export_png(path)

    def ask_csv(self) -> None:
        path = self.exporter.ask(self, "Save plot data", f"{self.spec.name}.csv", "CSV (*.csv)")
        if path is not None:
            self.export_csv(path)

    def export_png(self, path) -> None:
        """The legend and the plot as on screen, without the hover box and the save button."""
        self.readout.hide()
        self.save_button.hide()  # grab() paints now: hidden for the picture, shown again before any layout
        self.exporter.png(self, path)
        self.save_button.show()

    def export_csv(self, path) -> None:
        """Raw values (not smoothed), one column per series; `elapsed_s` when only this run is in it."""
        store = self._store
        columns = {k: store.get(k).view() for k in self.keys_with_data()} if store is not None else {}
        for name, ov in self._overlays.items():
            columns.update({f"{k} [{name}]": ov.run.series[k] for k in ov.curves})
        elapsed = elapsed_map(store.times.view()) if store is not None and not self._overlays else None
        self.exporter.csv(columns, path, elapsed)


def _set_data(curve: pg.PlotDataItem, x: np.ndarray, y: np.ndarray) -> None:
    """setData, and a dot while the curve is a single point (a line of one point draws nothing)."""
    lonely = len(x) == 1
    if lonely != (curve.opts["symbol"] is not None):
        color = curve.opts["pen"].color()
        curve.setSymbol("o" if lonely else None)
        curve.setSymbolSize(7)
        curve.setSymbolPen(color)
        curve.setSymbolBrush(color)
    curve.setData(x, y)


def step_time_plot(parent: Optional[QWidget] = None) -> MetricPlot:
    return MetricPlot(STEP_TIME, parent)


class StepMarks:
    """What took time between training steps, as marks on the step-time plot: a span the engine timed
    (a phase event "training" after a checkpoint, validation or sample-now, with took_s), or a pause
    (paused -> resumed events)."""

    def __init__(self, plot: MetricPlot):
        self._plot = plot
        self._paused_at = 0.0  # the unix time of the last paused event

    def note_event(self, kind: str, it, data: dict, t: float) -> None:
        if not isinstance(it, int):
            return
        took = data.get("took_s")
        if kind == "phase" and data.get("after") and isinstance(took, (int, float)):
            self._plot.add_mark(it, f"{data['after']} {took:.1f} s")
        elif kind == "paused":
            self._paused_at = t
        elif kind == "resumed" and self._paused_at:
            self._plot.add_mark(it, f"pause {max(t - self._paused_at, 0):.0f} s")
            self._paused_at = 0.0
