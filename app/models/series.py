"""Metric series for the live plots: per metric name a growable (iteration, value) float64 pair.

Fed by metric events (stdout of our own engine, or events.jsonl of a reopened / reattached run).
Appends are amortised O(1) (capacity doubles), so a 1,000,000-point run costs 16 MB per series
and no reallocation per event. An event whose iteration is <= the last one a series has seen is
ignored: reattaching to a run re-reads events that may already be plotted, and a resumed run's
events.jsonl is cut back and re-read from the start (the store is `reset()` first).
"""
from __future__ import annotations

import math
from typing import Iterable, Optional

import numpy as np

_START_CAPACITY = 1024


class Series:
    """One metric: x = iteration, y = value; `view()` returns the filled part (no copy)."""

    __slots__ = ("_x", "_y", "_n")

    def __init__(self, capacity: int = _START_CAPACITY):
        self._x = np.empty(capacity, dtype=np.float64)
        self._y = np.empty(capacity, dtype=np.float64)
        self._n = 0

    def __len__(self) -> int:
        return self._n

    @property
    def last_iter(self) -> Optional[float]:
        return float(self._x[self._n - 1]) if self._n else None

    @property
    def last_value(self) -> Optional[float]:
        return float(self._y[self._n - 1]) if self._n else None

    def append(self, iteration: float, value: float) -> bool:
        """False (and nothing stored) when `iteration` is not past the last stored one."""
        if self._n and iteration <= self._x[self._n - 1]:
            return False
        if self._n == len(self._x):
            self._grow()
        self._x[self._n] = iteration
        self._y[self._n] = value
        self._n += 1
        return True

    def extend(self, iterations: np.ndarray, values: np.ndarray) -> None:
        """Bulk append of strictly increasing iterations past the last one (benchmarks, history)."""
        need = self._n + len(iterations)
        while need > len(self._x):
            self._grow()
        self._x[self._n:need] = iterations
        self._y[self._n:need] = values
        self._n = need

    def _grow(self) -> None:
        cap = max(_START_CAPACITY, 2 * len(self._x))
        for name in ("_x", "_y"):
            old = getattr(self, name)
            new = np.empty(cap, dtype=np.float64)
            new[:self._n] = old[:self._n]
            setattr(self, name, new)

    def view(self) -> tuple[np.ndarray, np.ndarray]:
        return self._x[:self._n], self._y[:self._n]


def _number(v: object) -> Optional[float]:
    """A plottable float, or None for null (NaN/inf in the engine, or a figure this device lacks)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    f = float(v)
    return f if math.isfinite(f) else None


class SeriesStore:
    """All series of one run, keyed by metric name, plus which ones changed since the last redraw.
    `times`: x = iteration, y = the unix time `t` of its metric event (the wall-clock x axis)."""

    def __init__(self):
        self._series: dict[str, Series] = {}
        self._dirty: set[str] = set()
        self.times = Series()

    def __contains__(self, name: str) -> bool:
        return name in self._series

    def names(self) -> list[str]:
        return list(self._series)

    def get(self, name: str) -> Optional[Series]:
        return self._series.get(name)

    def series(self, name: str) -> Series:
        s = self._series.get(name)
        if s is None:
            s = self._series[name] = Series()
        return s

    def add_metric(self, iteration: Optional[int], data: dict,
                   skip: Iterable[str] = ("max_train_steps", "eta_s"), t: Optional[float] = None) -> list[str]:
        """Append every numeric field of one metric event; returns the names that got a point.
        `skip`: fields that are run bookkeeping, not curves. `t`: the event's unix time."""
        if iteration is None:
            return []
        if _number(t):  # 0: an event without a time (parse_line's default)
            self.times.append(float(iteration), float(t))
        skipped = set(skip)
        added = []
        for name, raw in data.items():
            value = _number(raw)
            if value is None or name in skipped:
                continue
            if self.series(name).append(float(iteration), value):
                added.append(name)
        self._dirty.update(added)
        return added

    def mark_dirty(self, names: Iterable[str]) -> None:
        self._dirty.update(n for n in names if n in self._series)

    def take_dirty(self) -> set[str]:
        dirty, self._dirty = self._dirty, set()
        return dirty

    def reset(self) -> None:
        """Forget everything (another run, or the events file was cut back by a resume)."""
        self._series.clear()
        self._dirty.clear()
        self.times = Series()
