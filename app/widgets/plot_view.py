"""The view box of every metric plot: auto-range rules that keep the axes honest.

pyqtgraph auto-ranges to the data alone: memory between 0.855 and 0.885 GiB fills the plot, so
30 MB of noise looks like big swings; a single point gets an arbitrary unit range. Here the bounds
the auto-range sees are adjusted first: y from 0 where asked, a fixed y range (accuracy 0..1), the
x span every plot of the panel shares (all plots show the same iterations), and a zero span
widened symmetrically around the one value.
"""
from __future__ import annotations

from typing import Optional

import pyqtgraph as pg

Span = Optional[list]


def widened(span: Span, log: bool = False) -> Span:
    """A zero-width [a, a] becomes a small range centred on a: 5 % of |a| (0.05 decade on a log
    axis), at least 1 (one iteration) around 0."""
    if span is None or span[1] > span[0]:
        return span
    a = span[0]
    half = 0.05 if log else (abs(a) * 0.05 or 1.0)
    return [a - half, a + half]


class PlotViewBox(pg.ViewBox):
    def __init__(self, y_from_zero: bool = False, y_fixed: Optional[tuple] = None, **kwargs):
        super().__init__(**kwargs)
        self.y_from_zero, self.y_fixed = y_from_zero, y_fixed
        self.shared_x: Span = None  # (lo, hi) of the data of every plot on the panel; None: this plot's own

    def set_shared_x(self, span: Span) -> None:
        if span != self.shared_x:
            self.shared_x = None if span is None else list(span)
            self.queueUpdateAutoRange()  # applied at the next paint, with the new data's bounds

    def suggestPadding(self, axis: int) -> float:
        # pyqtgraph pads by the view's size in pixels: plots of other widths would get other x
        # ranges from the same shared span. A fixed x padding keeps them identical.
        return 0.02 if axis == 0 else super().suggestPadding(axis)

    def childrenBounds(self, frac=None, orthoRange=(None, None), items=None):
        x, y = super().childrenBounds(frac=frac, orthoRange=orthoRange, items=items)
        if x is not None and self.shared_x is not None:
            x = list(self.shared_x)  # the data of every plot (this one's too), without pen-width padding
        if self.y_fixed is not None and y is not None:
            y = list(self.y_fixed)
        elif self.y_from_zero and y is not None:
            y = [min(y[0], 0.0), max(y[1], 0.0)]
        log_x, log_y = self.state.get("logMode", [False, False])
        return [widened(x, log_x), widened(y, log_y)]
