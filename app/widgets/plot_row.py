"""Plots side by side, lined up."""
from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QSplitter

from app.widgets.plots import MetricPlot


class PlotRow(QSplitter):
    """Plots side by side whose legends take the same height, so their plot areas line up (a long
    legend wraps to a second line in a narrow plot)."""

    def __init__(self, plots: list[MetricPlot]):
        super().__init__(Qt.Horizontal)
        self._plots = plots
        for plot in plots:
            self.addWidget(plot)
            plot.legend.entries_changed.connect(self.align)
        self.setChildrenCollapsible(False)
        self.splitterMoved.connect(lambda *_: self.align())

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        self.align()

    def align(self) -> None:
        shown = [plot for plot in self._plots if not plot.isHidden()]  # a hidden plot's width is stale
        tallest = max((plot.legend_height(plot.width()) for plot in shown), default=0)
        for plot in shown:
            plot.legend.setMinimumHeight(tallest)


class PlotGrid(QSplitter):
    """Rows of plots side by side, one above the other (the Health page's seven plots)."""

    def __init__(self, plots: list[MetricPlot], per_row: int):
        super().__init__(Qt.Vertical)
        self.rows = [PlotRow(plots[i:i + per_row]) for i in range(0, len(plots), per_row)]
        for row in self.rows:
            self.addWidget(row)
        self.setChildrenCollapsible(False)

    def align(self) -> None:
        for row in self.rows:
            row.align()
