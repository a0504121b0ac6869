"""The Training panel's memory plot."""
from __future__ import annotations

from typing import Optional

import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QWidget

from app.models.series import SeriesStore
from app.widgets.plot_specs import MEMORY
from app.widgets.plots import MetricPlot


class MemoryPlot(MetricPlot):
    """Two scopes, two curves, never mixed (DESIGN.md): the framework's own peak since the last
    log row, and the whole device as NVML sees it (process RSS on a CPU run). The y axis starts at
    0; the device total is a horizontal line once an event carries it."""

    def __init__(self, parent: Optional[QWidget] = None):
        super().__init__(MEMORY, parent)
        self.total_line = pg.InfiniteLine(angle=0, movable=False, pen=pg.mkPen((200, 60, 60), style=Qt.DashLine),
                                          label="device total {value:.1f} GiB",
                                          labelOpts={"position": 0.05, "color": (200, 60, 60)})
        self.total_line.setVisible(False)
        self.getPlotItem().addItem(self.total_line, ignoreBounds=False)  # the y range reaches it

    def set_total(self, gib: Optional[float]) -> None:
        if gib is None:
            self.total_line.setVisible(False)
            return
        if not self.total_line.isVisible() or self.total_line.value() != gib:
            self.total_line.setValue(gib)
            self.total_line.setVisible(True)

    def refresh(self, store: SeriesStore, dirty: set[str]) -> None:
        super().refresh(store, dirty)
        # The engine writes framework peak as null where there is no allocator to ask (CPU)
        na = bool(self.keys_with_data()) and "mem_peak_alloc_gb" not in self.keys_with_data()
        self.legend.set_remark("framework peak: n/a on CPU" if na else "",
                               "The engine reports the framework allocator's peak only on a GPU.")

    def reset(self) -> None:
        super().reset()
        self.legend.set_remark("")
