"""The aspect-ratio bucket histogram of a data check: images and usable images per bucket, side by
side, each bucket labelled WxH (the size training crops or resizes its images to, dmad/data/buckets.py).
"""
from __future__ import annotations

from typing import Optional, Sequence

import pyqtgraph as pg
from PySide6.QtWidgets import QWidget

BAR_WIDTH = 0.4
IMAGES_BRUSH = (120, 120, 120)
USABLE_BRUSH = (46, 134, 193)


class BucketPlot(pg.PlotWidget):
    def __init__(self, parent: Optional[QWidget] = None):
        super().__init__(parent, background="w")
        self.setMenuEnabled(False)
        self.setMouseEnabled(x=False, y=False)
        plot = self.getPlotItem()
        plot.setLabel("left", "images")
        plot.addLegend(offset=(-10, 10))
        plot.showGrid(y=True, alpha=0.3)
        self.images_bars = pg.BarGraphItem(x=[], height=[], width=BAR_WIDTH, brush=IMAGES_BRUSH, name="images")
        self.usable_bars = pg.BarGraphItem(x=[], height=[], width=BAR_WIDTH, brush=USABLE_BRUSH, name="usable")
        plot.addItem(self.images_bars)
        plot.addItem(self.usable_bars)
        self._labels: list[str] = []

    def set_buckets(self, buckets: Sequence[dict]) -> None:
        """`buckets`: the report's summary.buckets ({"width", "height", "images", "usable", ...})."""
        xs = list(range(len(buckets)))
        self._labels = [f"{b['width']}x{b['height']}" for b in buckets]
        self.images_bars.setOpts(x=[x - BAR_WIDTH / 2 for x in xs], height=[b["images"] for b in buckets])
        self.usable_bars.setOpts(x=[x + BAR_WIDTH / 2 for x in xs], height=[b["usable"] for b in buckets])
        self.getPlotItem().getAxis("bottom").setTicks([list(zip(xs, self._labels))])
        if xs:
            top = max(max(b["images"] for b in buckets), 1)
            self.getPlotItem().setRange(xRange=(-0.8, len(xs) - 0.2), yRange=(0, top * 1.1), padding=0)

    def labels(self) -> list[str]:
        return list(self._labels)
