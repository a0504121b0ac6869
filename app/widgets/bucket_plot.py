"""The aspect-ratio bucket histogram of a data check: images and usable images per bucket, side by
side, each bucket labelled WxH (the size training crops or resizes its images to, dmad/data/buckets.py).

Every checked image is counted: the engine buckets only images whose size it read, so an image it
could not read or decode, a broken link, or one beyond the pixel limit is in no bucket (the report's
summary.images counts it, its buckets do not); those get a last "no size" bar, with its reason in the
tooltip, so the bars add up to the images checked. The legend is a line above the plot area, so no
bar, however tall, runs under it.
"""
from __future__ import annotations

import html
from typing import Mapping, Optional, Sequence

import pyqtgraph as pg
from PySide6.QtWidgets import QWidget

BAR_WIDTH = 0.4
IMAGES_BRUSH = (120, 120, 120)
USABLE_BRUSH = (46, 134, 193)
NO_SIZE_BRUSH = (192, 57, 43)
NO_SIZE = "no size"
# The engine's checks that can leave an image without a size (dmad/data/check_report.py _buckets).
NO_SIZE_CATEGORIES = ("image_corrupt", "file_unreadable", "broken_symlink", "symlink_loop", "pixel_limit_exceeded")


def _swatch(rgb: tuple[int, int, int], text: str) -> str:
    return f"<span style='color: #{'%02x%02x%02x' % rgb}'>&#9632;</span>&nbsp;{html.escape(text)}"


class BucketPlot(pg.PlotWidget):
    def __init__(self, parent: Optional[QWidget] = None):
        super().__init__(parent, background="w")
        self.setMenuEnabled(False)
        self.setMouseEnabled(x=False, y=False)
        plot = self.getPlotItem()
        plot.setLabel("left", "images")
        # The legend is the title row above the view box: anchored inside it, it covered the top of the
        # tallest bars (the y range ends 10% above them).
        plot.setTitle(f"{_swatch(IMAGES_BRUSH, 'images')}&nbsp;&nbsp;&nbsp;{_swatch(USABLE_BRUSH, 'usable')}",
                      size="9pt", color=(60, 60, 60))
        plot.showGrid(y=True, alpha=0.3)
        self.images_bars = pg.BarGraphItem(x=[], height=[], width=BAR_WIDTH, brush=IMAGES_BRUSH, name="images")
        self.usable_bars = pg.BarGraphItem(x=[], height=[], width=BAR_WIDTH, brush=USABLE_BRUSH, name="usable")
        plot.addItem(self.images_bars)
        plot.addItem(self.usable_bars)
        self._labels: list[str] = []
        self.no_size = 0  # images checked that are in no bucket

    def set_buckets(self, buckets: Sequence[dict], images: Optional[int] = None,
                    counts: Optional[Mapping[str, int]] = None) -> None:
        """`buckets`: the report's summary.buckets ({"width", "height", "images", "usable", ...});
        `images`: its summary.images (all images checked); `counts`: problems per category, to say
        why an image has no size."""
        bucketed = sum(b["images"] for b in buckets)
        self.no_size = max(0, images - bucketed) if images is not None else 0
        heights = [b["images"] for b in buckets] + ([self.no_size] if self.no_size else [])
        usable = [b["usable"] for b in buckets] + ([0] if self.no_size else [])
        xs = list(range(len(heights)))
        self._labels = [f"{b['width']}x{b['height']}" for b in buckets] + ([NO_SIZE] if self.no_size else [])
        brushes = [IMAGES_BRUSH] * len(buckets) + ([NO_SIZE_BRUSH] if self.no_size else [])
        self.images_bars.setOpts(x=[x - BAR_WIDTH / 2 for x in xs], height=heights, brushes=brushes)
        self.usable_bars.setOpts(x=[x + BAR_WIDTH / 2 for x in xs], height=usable)
        self.getPlotItem().getAxis("bottom").setTicks([list(zip(xs, self._labels))])
        self.setToolTip(self._no_size_note(images, counts or {}))
        if xs:
            top = max(max(heights), 1)
            self.getPlotItem().setRange(xRange=(-0.8, len(xs) - 0.2), yRange=(0, top * 1.1), padding=0)

    def _no_size_note(self, images: Optional[int], counts: Mapping[str, int]) -> str:
        if not self.no_size:
            return ""
        found = ", ".join(f"{c} ({counts[c]})" for c in NO_SIZE_CATEGORIES if counts.get(c))
        return (f"{self.no_size} of {images} images in no bucket: size unreadable or beyond the pixel limit, "
                "so training cannot use them" + (f" (errors: {found})" if found else ""))

    def labels(self) -> list[str]:
        return list(self._labels)
