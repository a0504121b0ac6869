"""Axis ticks people can read: log-scale labels that never pile up, elapsed time as 1h05m.

pyqtgraph's log axis labels every minor tick (2..9 x 10^k) when fewer than three decades are in
view; near the top of a decade those labels overlap. Here only one level is labelled, with at most
one label per ~2.2 text heights (or ~90 px across), and minor ticks stay unlabelled.
"""
from __future__ import annotations

import math

import numpy as np
import pyqtgraph as pg
from PySide6.QtGui import QFontMetricsF

# Elapsed-time tick steps (s): whole seconds, minutes, hours, days.
_TIME_STEPS = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400,
               2 * 86400, 7 * 86400)


def format_elapsed(seconds: float) -> str:
    """90 -> '1m30s', 3900 -> '1h05m', 0 -> '0s' (units spelled: '12:30' reads as mm:ss or hh:mm)."""
    s = int(round(seconds))
    sign, s = ("-" if s < 0 else ""), abs(s)
    d, rem = divmod(s, 86400)
    h, rem = divmod(rem, 3600)
    m, sec = divmod(rem, 60)
    if d:
        return f"{sign}{d}d{h:02d}h"
    if h:
        return f"{sign}{h}h{m:02d}m"
    if m:
        return f"{sign}{m}m{sec:02d}s" if sec else f"{sign}{m}m"
    return f"{sign}{sec}s"


def format_value(v: float) -> str:
    """Compact, scale-free text of a tick or a readout value: 0.8203, 1.5e-5, 1.2e4."""
    a = abs(v)
    if a != 0 and (a < 1e-3 or a >= 1e5):
        mant, exp = f"{v:.2e}".split("e")
        mant = mant.rstrip("0").rstrip(".")
        return f"{mant}e{int(exp)}"
    return f"{v:.4g}"


def _log_labels(lo: float, hi: float, gap: float) -> list[float]:
    """log10 positions to label in [lo, hi], no two closer than `gap` (log10 units = one label's
    room): decades, else 1-2-5 steps, else 1..9, whichever first gives three labels; a sliver of a
    decade gets linear steps."""
    best: list[float] = []
    for mantissas in ((1,), (1, 2, 5), range(1, 10)):
        values = _spaced(_mantissa_ticks(lo, hi, mantissas), gap)
        best = values if len(values) > len(best) else best
        if len(best) >= 3:
            return best
    if len(best) < 2:
        v0, v1 = 10.0 ** lo, 10.0 ** hi
        step = _nice_step((v1 - v0) / 4)
        linear = [math.log10(v) for v in np.arange(math.ceil(v0 / step) * step, v1 + step * 1e-9, step) if v > 0]
        best = max(best, _spaced(linear, gap), key=len)
    return best


def _spaced(values: list[float], gap: float) -> list[float]:
    """The values no two closer than `gap`, chosen decades first, then 2 and 5 x 10^k, then the rest."""
    def rank(v: float) -> int:
        m = round(10.0 ** (v - math.floor(v + 1e-9)), 3)
        return 0 if m == 1 else 1 if m in (2, 5) else 2
    kept: list[float] = []
    for v in sorted(values, key=rank):  # stable: within a rank, from the bottom of the axis
        if all(abs(v - k) >= gap for k in kept):
            kept.append(v)
    return sorted(kept)


def _mantissa_ticks(lo: float, hi: float, mantissas) -> list[float]:
    out = []
    for k in range(math.floor(lo), math.ceil(hi) + 1):
        out += [k + math.log10(m) for m in mantissas if lo <= k + math.log10(m) <= hi]
    return out


def _nice_step(raw: float) -> float:
    p = 10.0 ** math.floor(math.log10(raw))
    return next(m * p for m in (1, 2, 5, 10) if m * p >= raw)


class PlotAxis(pg.AxisItem):
    """An axis with readable log ticks and, on the x axis, an elapsed-time mode."""

    def __init__(self, orientation: str, **kwargs):
        super().__init__(orientation, **kwargs)
        self.enableAutoSIPrefix(False)  # "GiB (x0.001)" would hide the unit
        self.setStyle(maxTextLevel=0)  # label one level only: minor ticks never crowd the labels
        self.time_mode = False

    def set_time_mode(self, on: bool) -> None:
        self.time_mode = on
        self.picture = None
        self.update()

    def _label_room(self) -> float:
        """Pixels along the axis one label needs, with a gap: ~1.6 text lines, or ~90 px across."""
        vertical = self.orientation in ("left", "right")
        return QFontMetricsF(self.style.get("tickFont") or self.font()).height() * 1.6 if vertical else 90.0

    def _most_labels(self, size: float) -> int:
        return max(2, int(size // self._label_room()))

    def tickSpacing(self, minVal: float, maxVal: float, size: float):
        if self.logMode:
            return super().tickSpacing(minVal, maxVal, size)
        if not self.time_mode:
            levels = super().tickSpacing(minVal, maxVal, size)
            if self.orientation == "bottom":  # iterations are whole: no tick at 9.5
                levels = [lv for lv in levels if lv[0] >= 1.0] or [(1.0, 0.0)]
            return levels
        want = (maxVal - minVal) / self._most_labels(size)
        major = next((s for s in _TIME_STEPS if s >= want), _TIME_STEPS[-1])
        minor = next((s for s in reversed(_TIME_STEPS) if s <= major / 4), major / 5)
        return [(float(major), 0.0), (float(minor), 0.0)]

    def logTickValues(self, minVal, maxVal, size, stdTicks):
        labelled = _log_labels(minVal, maxVal, self._label_room() * (maxVal - minVal) / max(size, 1.0))
        minor = []
        if maxVal - minVal <= 6:  # 2..9 x 10^k as unlabelled ticks while they stay a few px apart
            minor = [v for v in _mantissa_ticks(minVal, maxVal, range(2, 10)) if v not in labelled]
        return [(None, labelled), (None, minor)]

    def logTickStrings(self, values, scale, spacing):
        return [format_value(10.0 ** v * scale) for v in values]

    def tickStrings(self, values, scale, spacing):
        if self.logMode:
            return self.logTickStrings(values, scale, spacing)
        if self.time_mode:
            return [format_elapsed(v * scale) for v in values]
        if values and (max(abs(v) for v in values) < 1e-3 or max(abs(v) for v in values) >= 1e5):
            return [format_value(v * scale) for v in values]  # learning rates: 2.5e-5, not 0.00003
        return super().tickStrings(values, scale, spacing)
