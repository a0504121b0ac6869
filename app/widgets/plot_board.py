"""The Training panel's plots and their shared controls.

Three pages of metric plots (losses: each method's loss plots, DMAD's generator | critic; then
accuracy | gradient norms | learning rates; then Health: one plot per health signal of the samples,
plot_health.py, fed as series "health.<signal>" by the Training panel) above memory | step time, which
stay in view whatever page is chosen. The plots shown are those the run's distillation method fills (plot_specs.METHOD_PLOTS,
from dmad.contract.methods: the peer method has one consistency-loss plot and no critic or accuracy
plot), plus any that has data, a compared run's included; the method comes from the run's config
(set_method), or, when that is unknown, from the first metrics it logs. The controls apply to all:
smoothing, log y, the x axis (iteration or elapsed wall-clock time), and other runs to compare
(their metrics.csv read in a pool worker, drawn dashed). Every plot spans the same x range, so a
generator curve that ends early (logged only on student updates) is seen to.

Plots on the page not shown are not fed: their changed series wait and are drawn when the page is
chosen (setData of a million points costs ms even for a widget nobody sees).
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (QCheckBox, QComboBox, QDoubleSpinBox, QFileDialog, QHBoxLayout, QLabel, QMenu,
                               QSlider, QSplitter, QTabWidget, QToolButton, QVBoxLayout, QWidget)

from app.engine.background import Task
from app.models.plot_data import X_ELAPSED, X_ITERATION, OverlayRun, read_overlay
from app.models.series import SeriesStore
from app.widgets.elided_label import ElidedLabel
from app.widgets.plot_legend import dash_style
from app.models.methods import DEFAULT
from app.widgets.plot_specs import HEALTH_PLOTS, METHOD_OWN_PLOTS, METHOD_PLOTS, SHARED_PLOTS
from dmad.contract.methods import METHODS, own_columns
from app.widgets.plot_memory import MemoryPlot
from app.widgets.plot_health import HealthPlot
from app.widgets.plot_row import PlotGrid, PlotRow
from app.widgets.plots import MetricPlot, step_time_plot
from app.widgets.wheel_guard import guard_wheel

_SLIDER_STEPS = 1000  # smoothing slider resolution: factor = position / 1000, up to 0.999
_X_CHOICES = ((X_ITERATION, "iteration"), (X_ELAPSED, "wall-clock time"))


def guess_method(names) -> Optional[str]:
    """The method whose own columns the metric names include, None before a loss is logged."""
    names = set(names)
    return next((m for m in METHODS if names.intersection(own_columns(m))), None)


class PlotBoard(QWidget):
    display_changed = Signal()  # smoothing or the x axis changed: every series must be drawn again
    _overlay_dir: Optional[Path] = None  # the folder of the last compared run: the next dialog opens there

    def __init__(self, parent: Optional[QWidget] = None, run_dir: Callable[[], Optional[Path]] = lambda: None):
        """`run_dir`: the shown run's folder, where the compare dialog starts (its siblings are runs)."""
        super().__init__(parent)
        self._run_dir = run_dir
        self._named = {spec.name: MetricPlot(spec) for spec in METHOD_OWN_PLOTS + SHARED_PLOTS}
        self.gradients, self.lr = self._named["gradients"], self._named["lr"]
        self.memory_plot, self.step_plot = MemoryPlot(), step_time_plot()
        # the Health page: one plot per health signal (plot_health.py), shown for every method
        self.health_plots = [HealthPlot(spec, spec.name[len("health_"):]) for spec in HEALTH_PLOTS]
        self._named.update({p.spec.name: p for p in self.health_plots})
        self.pages = tuple([p for p in self._named.values() if p.spec.page == page]
                           for page in ("losses", "health", "signals"))
        self._method: Optional[str] = None  # from the run's config; None: guessed from the metrics
        self._shown: Optional[list] = None  # which plots of each page are shown
        self._factor, self._store = 0.0, None
        self._pending: dict[MetricPlot, set[str]] = {}
        self._overlays: dict[str, OverlayRun] = {}
        self._reader = Task(self, every_answer=True)
        self._reader.done.connect(self._overlay_read)
        self._reader.failed.connect(lambda why: self.status.setText(f"could not compare: {why}"))
        self._build()
        for plot in self.plots():
            plot.reported.connect(self.status.setText)
        self._show_method_plots()

    def _build(self) -> None:
        self.tabs = QTabWidget()
        self.rows = [PlotRow(plots) for plots in self.pages[:2]] + [PlotGrid(self.pages[2], per_row=4)]
        for row in self.rows:
            self.tabs.addTab(row, "")
        self.tabs.setCornerWidget(self._controls(), Qt.TopRightCorner)
        self.tabs.currentChanged.connect(self._page_shown)
        split = QSplitter(Qt.Vertical)
        split.addWidget(self.tabs)
        split.addWidget(PlotRow([self.memory_plot, self.step_plot]))
        split.setSizes([560, 400])  # proportions: the splitter scales them to the board
        split.setChildrenCollapsible(False)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(split)

    def _controls(self) -> QWidget:
        self.slider = QSlider(Qt.Horizontal)
        self.slider.setRange(0, _SLIDER_STEPS - 1)
        self.slider.setMinimumWidth(120)
        self.spin = QDoubleSpinBox()
        self.spin.setRange(0.0, (_SLIDER_STEPS - 1) / _SLIDER_STEPS)
        self.spin.setDecimals(3)
        self.spin.setSingleStep(0.05)
        tip = "Exponential moving average of each curve (0 = raw values; 0.9 averages ~10 log rows)"
        self.slider.setToolTip(tip)
        self.spin.setToolTip(tip)
        self.slider.valueChanged.connect(lambda v: self.set_smoothing(v / _SLIDER_STEPS))
        self.spin.valueChanged.connect(self.set_smoothing)
        self.log_y = QCheckBox("log y")
        self.log_y.setToolTip("Logarithmic y axis on the loss, gradient and learning-rate plots")
        self.log_y.toggled.connect(self._set_log)
        self.x_axis = QComboBox()
        for mode, text in _X_CHOICES:
            self.x_axis.addItem(text, mode)
        self.x_axis.setToolTip("x axis of every plot: the iteration, or the time since the run's first metric")
        self.x_axis.currentIndexChanged.connect(lambda _: self.set_x_mode(self.x_axis.currentData()))
        guard_wheel(self.spin, self.x_axis)  # wheel only with focus
        self.compare = QToolButton()
        self.compare.setText("Compare")
        self.compare.setToolTip("Draw another run's metrics (its metrics.csv) as dashed curves")
        self.compare.setPopupMode(QToolButton.InstantPopup)
        self.compare.setMenu(QMenu(self.compare))
        self._fill_compare_menu()
        self.status = ElidedLabel(mode=Qt.TextElideMode.ElideMiddle)  # a saved file's name stays readable
        self.status.setMinimumWidth(200)  # the corner widget gets its size hint: room for a line
        self.status.setStyleSheet("color: #777;")
        return _hbox([self.status, QLabel("Smoothing"), self.slider, self.spin, self.log_y, QLabel("x:"),
                      self.x_axis, self.compare], stretch_first=True)

    # ------------------------------------------------------------ feeding

    def plots(self) -> list[MetricPlot]:
        return [p for page in self.pages for p in page] + [self.memory_plot, self.step_plot]

    def refresh(self, store: SeriesStore, dirty: set[str]) -> None:
        self._store = store
        hidden = self._hidden_plots()
        for plot in self.plots():
            if plot in hidden:
                self._pending.setdefault(plot, set()).update(dirty)
            else:
                plot.refresh(store, dirty | self._pending.pop(plot, set()))
        self._show_method_plots()
        self._share_x()

    def _hidden_plots(self) -> set[MetricPlot]:
        current = self.tabs.currentIndex()
        return {p for i, page in enumerate(self.pages) if i != current for p in page}

    def _page_shown(self, index: int) -> None:
        if self._store is None:
            return
        for plot in self.pages[index]:
            dirty = self._pending.pop(plot, set())
            if dirty:
                plot.refresh(self._store, dirty)
        self._share_x()

    def _share_x(self) -> None:
        """The metric plots share one x span (overlays included); memory and step time share this run's."""
        def union(plots):
            spans = [s for s in (p.x_span() for p in plots) if s is not None]
            return [min(s[0] for s in spans), max(s[1] for s in spans)] if spans else None
        metric = [p for page in self.pages for p in page]
        lower = [self.memory_plot, self.step_plot]
        run_span = union(lower)
        for plots, span in ((metric, union(metric + lower)), (lower, run_span)):
            for plot in plots:
                plot.view.set_shared_x(span)

    def reset(self) -> None:
        """Another run (or the events file was cut back): no data, fresh ranges; compared runs stay.
        The method stays: a resumed run replays its own metrics (the panel sets another run's)."""
        self._pending.clear()
        for plot in self.plots():
            plot.reset()
        self._show_method_plots()
        self._share_x()

    # ------------------------------------------------------------ which plots the method fills

    def set_method(self, method: Optional[str]) -> None:
        """The shown run's distillation.method; None: not known, guessed from its metrics."""
        self._method = method
        self._show_method_plots()

    def method(self) -> str:
        """The method whose plots are shown: the run's, else the one its metrics show, else the default."""
        guessed = guess_method(self._store.names()) if self._store is not None else None
        return self._method or guessed or DEFAULT

    def shown_plots(self) -> list[MetricPlot]:
        return [p for page in self.pages for p in page if not p.isHidden()]

    def _show_method_plots(self) -> None:
        """Show the method's plots and any other that has data (a compared run of the other method);
        a method the app does not know shows every plot. Page titles name what they hold."""
        wanted = METHOD_PLOTS.get(self.method())
        shown = [[wanted is None or p.spec.name in wanted or p.spec.page == "signals" or self._has_data(p)
                  for p in page] for page in self.pages]
        if shown == self._shown:  # called on every redraw: relayout only on a change
            return
        self._shown = shown
        for row, page, flags in zip(self.rows, self.pages, shown):
            for plot, on in zip(page, flags):
                plot.setVisible(on)
            row.align()
        for i, page in enumerate(self.pages):
            words = list(dict.fromkeys(p.spec.word for p in page if not p.isHidden()))
            title = " · ".join(words)
            self.tabs.setTabText(i, title[:1].upper() + title[1:])

    def _has_data(self, plot: MetricPlot) -> bool:
        store = self._store
        return plot.has_overlays() or (store is not None and any(
            store.get(k) is not None and len(store.get(k)) for k in plot.curve_keys()))

    # ------------------------------------------------------------ shared settings

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
            for plot in self.plots():
                plot.set_smoothing(factor)
            self.display_changed.emit()

    def set_x_mode(self, mode: str) -> None:
        self.x_axis.setCurrentIndex(self.x_axis.findData(mode))
        for plot in self.plots():
            plot.set_x_mode(mode)
        self._share_x()
        self.display_changed.emit()

    def _set_log(self, on: bool) -> None:
        for plot in self.plots():
            plot.set_log_y(on)

    # ------------------------------------------------------------ lookups (tests, the window)

    def loss_keys(self) -> list[str]:
        return [k for p in self.pages[0] for k in p.keys_with_data()]

    def plot_named(self, name: str) -> MetricPlot:
        """A metric plot by its spec's name ("generator", "gradients", ...)."""
        return self._named[name]

    def plot_for(self, key: str) -> Optional[MetricPlot]:
        return next((p for p in self.plots() if key in p.curve_keys()), None)

    def curve(self, key: str):
        plot = self.plot_for(key)
        return None if plot is None else plot.curve(key)

    # ------------------------------------------------------------ other runs

    def ask_overlay(self) -> None:
        shown = self._run_dir()
        start = str(self._overlay_dir or (shown.parent if shown is not None else Path.home()))
        folder = QFileDialog.getExistingDirectory(self, "Compare with the run in folder", start)
        if folder:
            self.add_overlay_dir(Path(folder))

    def add_overlay_dir(self, run_dir: Path) -> None:
        """Read the run's metrics in a worker; its curves appear when it is read."""
        run_dir = Path(run_dir)
        PlotBoard._overlay_dir = run_dir.parent
        if run_dir.name in self._overlays:
            self.status.setText(f"{run_dir.name} is already compared")
            return
        self.status.setText(f"reading {run_dir.name} ...")
        self._reader.submit(lambda: read_overlay(run_dir))

    def _overlay_read(self, run: OverlayRun) -> None:
        if run.name in self._overlays:
            return
        dash = dash_style(len(self._overlays))
        added = [plot.add_overlay(run, dash) for page in self.pages for plot in page]
        if not any(added):
            self.status.setText(f"{run.name}: no metrics these plots show")
            return
        self._overlays[run.name] = run
        self.status.setText(f"comparing with {run.name} (dashed)")
        self._fill_compare_menu()
        self._show_method_plots()
        self._share_x()

    def remove_overlay(self, name: str) -> None:
        if self._overlays.pop(name, None) is None:
            return
        for page in self.pages:
            for plot in page:
                plot.remove_overlay(name)
        self.status.setText("")
        self._fill_compare_menu()
        self._show_method_plots()
        self._share_x()

    def overlay_names(self) -> list[str]:
        return list(self._overlays)

    def _fill_compare_menu(self) -> None:
        menu = self.compare.menu()
        menu.clear()
        menu.addAction("Add a run folder...", self.ask_overlay)
        for name in self._overlays:
            menu.addAction(f"Remove {name}", lambda n=name: self.remove_overlay(n))


def _hbox(widgets: list[QWidget], stretch_first: bool = False) -> QWidget:
    box = QWidget()
    layout = QHBoxLayout(box)
    layout.setContentsMargins(0, 0, 4, 0)
    for i, w in enumerate(widgets):
        layout.addWidget(w, 1 if (stretch_first and i == 0) else 0)
    return box
