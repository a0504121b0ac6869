"""What the plots draw, without widgets: smoothing, the x axis (iteration or wall-clock), the value
under the mouse, another run's metrics for an overlay, and a plot's data as CSV.

Display arrays are derived from the SeriesStore's raw (iteration, value) arrays incrementally: each
refresh maps and smooths only the points added since the last one, O(new points), so a live run of
1,000,000 points costs no more per redraw than a short one.
"""
from __future__ import annotations

import csv
from dataclasses import dataclass, field
from itertools import accumulate
from pathlib import Path
from typing import Callable, Optional

import numpy as np

from app.models.series import Series
from dmad.contract.events import is_iteration_metric, read_events
from dmad.contract.runlog import read_metrics
from dmad.contract.runs import RunFolder

X_ITERATION, X_ELAPSED = "iteration", "elapsed"
Arrays = tuple[np.ndarray, np.ndarray]
_EMPTY = np.empty(0, dtype=np.float64)


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


def elapsed_map(times: Arrays) -> Optional[Callable[[np.ndarray], np.ndarray]]:
    """iteration -> seconds since the run's first metric event, from (iterations, unix times);
    None when no event carried a time. Iterations between two logged ones are interpolated."""
    it, t = times
    if len(it) == 0:
        return None
    t0 = float(t[0])
    return lambda x: np.interp(x, it, t) - t0


class CurveCache:
    """One curve as drawn: x in the plot's unit and y raw or smoothed, extended by the new points only.
    `clear()` when the smoothing or the x unit changes, or the raw series was cut back."""

    __slots__ = ("_x", "_y")

    def __init__(self):
        self._x: Optional[Series] = None  # x = iteration, y = mapped x (elapsed seconds)
        self._y: Optional[Series] = None  # x = iteration, y = smoothed value

    def clear(self) -> None:
        self._x = self._y = None

    def update(self, raw: Arrays, factor: float,
               to_x: Optional[Callable[[np.ndarray], np.ndarray]]) -> Arrays:
        """(x, y) to draw: views of the raw arrays where nothing is derived (no copy)."""
        x_raw, y_raw = raw
        y = y_raw
        if factor > 0.0:
            self._y = _extended(self._y, x_raw, lambda k, done: ema(y_raw[k:], factor, done.last_value))
            y = self._y.view()[1]
        x = x_raw
        if to_x is not None:
            self._x = _extended(self._x, x_raw, lambda k, done: to_x(x_raw[k:]))
            x = self._x.view()[1]
        return x, y


def _extended(done: Optional[Series], x_raw: np.ndarray, tail: Callable[[int, Series], np.ndarray]) -> Series:
    """`done` with the points of x_raw it lacks appended (tail(k, done): the derived values from index k)."""
    if done is None or len(done) > len(x_raw):
        done = Series()
    k = len(done)
    if k < len(x_raw):
        done.extend(x_raw[k:], tail(k, done))
    return done


def nearest(x: np.ndarray, at: float) -> Optional[int]:
    """Index of the point of increasing `x` nearest to `at`; None when x is empty."""
    n = len(x)
    if n == 0:
        return None
    i = int(np.searchsorted(x, at))
    if i >= n:
        return n - 1
    if i > 0 and at - x[i - 1] <= x[i] - at:
        return i - 1
    return i


# ---------------------------------------------------------------- another run, for an overlay

@dataclass
class OverlayRun:
    """Another run's metrics: per metrics.csv column its (iterations, values), empty cells dropped;
    `times`: (iterations, unix times) of its metric events, empty when events.jsonl has none."""
    path: Path
    series: dict[str, Arrays] = field(default_factory=dict)
    times: Arrays = (_EMPTY, _EMPTY)

    @property
    def name(self) -> str:
        return self.path.name


def _increasing(it: np.ndarray, *arrays: np.ndarray) -> list[np.ndarray]:
    """Only the points whose iteration is past every earlier one (plots need increasing x)."""
    before = np.concatenate(([-np.inf], np.maximum.accumulate(it)[:-1])) if len(it) else it
    keep = it > before
    return [it[keep]] + [a[keep] for a in arrays]


def read_overlay(run_dir: Path) -> OverlayRun:
    """Read a run folder's metrics.csv (values) and events.jsonl (times). Runs in a worker: a long
    run's files take seconds. Raises ValueError when the folder has no metric rows."""
    run_dir = Path(run_dir)
    folder = RunFolder(run_dir)
    columns, rows = read_metrics(folder.metrics_csv)
    if not rows:
        raise ValueError(f"{run_dir.name}: no metrics.csv rows (is it a run folder?)")
    it = np.array([r["iter"] for r in rows], dtype=np.float64)
    run = OverlayRun(run_dir)
    for col in columns:
        if col == "iter":
            continue
        v = np.array([np.nan if r.get(col) is None else r[col] for r in rows], dtype=np.float64)
        ok = np.isfinite(v)
        if ok.any():
            x, y = _increasing(it[ok], v[ok])
            run.series[col] = (x, y)
    pairs = [(ev.iter, ev.t) for ev in read_events(folder.events_jsonl)
             if is_iteration_metric(ev) and ev.iter is not None and ev.t]
    if pairs:
        t_it, t = np.array(pairs, dtype=np.float64).T
        run.times = tuple(_increasing(t_it, t))
    return run


# ---------------------------------------------------------------- export

def write_csv(path: Path, columns: dict[str, Arrays], elapsed: Optional[Callable] = None) -> int:
    """One row per iteration any series has, one column per series (empty where a series has no
    point, as in metrics.csv), `elapsed_s` after `iter` when the run's times are known. Runs in a
    worker. Returns the number of rows."""
    iters = np.unique(np.concatenate([x for x, _ in columns.values()])) if columns else _EMPTY
    table = [iters]
    names = ["iter"]
    if elapsed is not None:
        names.append("elapsed_s")
        table.append(np.round(elapsed(iters), 3))  # event times are in ms
    for name, (x, y) in columns.items():
        full = np.full(len(iters), np.nan)
        full[np.searchsorted(iters, x)] = y
        names.append(name)
        table.append(full)
    tmp = Path(path).with_name(Path(path).name + ".partial")
    with open(tmp, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(names)
        for row in zip(*(a.tolist() for a in table)):
            w.writerow([_cell(v, k == 0) for k, v in enumerate(row)])
    tmp.replace(path)  # a reader never sees half a file
    return len(iters)


def _cell(v: float, is_iter: bool) -> str:
    if v != v:  # NaN: no point at this iteration
        return ""
    return str(int(v)) if is_iter else repr(v)
