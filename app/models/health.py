"""Health signals of a run's samples against the teacher's (issue 39), without widgets.

The engine writes `<run>/health.csv` (one row per validation: iter, checkpoint, the seven signals,
the `;`-joined signals that raised an alert) and a `health` event per validation (data.signals,
data.teacher, data.alerts). Ratio signals are student / teacher (1.0 = the teacher's own level);
teacher_distance is absolute, in [0, 1] (0 = the teacher's own image).

`read_health_csv` runs in a worker: it never blocks on a FIFO (opened non-blocking, then only a
regular file is read), never reads more than MAX_BYTES, and turns any bad cell (text, 1e999, NaN)
into "not computed"; a file it cannot use is one line in `HealthTable.problem`.
"""
from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from dmad.contract.regular import NotRegularFile, read_regular
from dmad.contract.runlog import HEALTH_LABELS, HEALTH_SIGNALS

HEALTH_CSV = "health.csv"
SIGNALS, LABELS = HEALTH_SIGNALS, HEALTH_LABELS  # the engine's (dmad.contract.runlog)
SHORT = {"diversity": "div", "saturation": "sat", "brightness": "bright", "contrast": "contr",
         "colourfulness": "colour", "detail": "detail", "teacher_distance": "dist"}
ABSOLUTE = ("teacher_distance",)  # not a ratio: no teacher level of 1.0; lower is closer to the teacher
HEADER_SIGNALS = ("diversity", "saturation", "detail")  # what a Samples column header shows
MAX_BYTES = 16 << 20  # one row per validation is ~100 bytes: a bigger file is not the engine's


@dataclass(frozen=True)
class HealthRow:
    iter: int
    checkpoint: str                            # "iter_<N>", or "" for a validation between checkpoints
    values: tuple[tuple[str, float], ...]      # (signal, finite value) of the signals computed
    alerts: tuple[str, ...] = ()               # the signals that raised an alert at this row

    def value(self, signal: str) -> Optional[float]:
        return dict(self.values).get(signal)


@dataclass(frozen=True)
class HealthTable:
    rows: tuple[HealthRow, ...] = ()
    problem: str = ""                          # one line: why the file (or part of it) was not used

    def by_checkpoint(self) -> dict[str, HealthRow]:
        """The last row of each checkpoint (a resumed run may have validated one twice)."""
        return {r.checkpoint: r for r in self.rows if r.checkpoint}


def _number(v: object) -> Optional[float]:
    """A finite float, or None (absent, text, bool, NaN, 1e999)."""
    if isinstance(v, bool):
        return None
    try:
        f = float(v)  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):
        return None
    return f if math.isfinite(f) else None


def _iteration(text: str) -> Optional[int]:
    f = _number(text)
    return int(f) if f is not None and f >= 0 and f == int(f) else None


def _read_bytes(path: Path) -> tuple[bytes, str]:
    """(the file's first MAX_BYTES, problem): never waits on a FIFO or a device (read_regular)."""
    try:
        data = read_regular(path, MAX_BYTES + 1)
    except FileNotFoundError:
        return b"", ""
    except NotRegularFile:
        return b"", f"{path.name} is not a regular file: not read"
    except OSError as e:
        return b"", f"{path.name}: cannot be read ({e.strerror or e})"
    if len(data) > MAX_BYTES:
        return b"", f"{path.name} is larger than {MAX_BYTES >> 20} MB: not read"
    return data, ""


def parse_health_csv(text: str, name: str = HEALTH_CSV) -> HealthTable:
    lines = text.splitlines(keepends=True)
    if lines and not lines[-1].endswith(("\n", "\r")):
        lines.pop()  # a row the engine is still writing (rows are appended whole, but a copy may cut one)
    table = list(csv.reader(io.StringIO("".join(lines).replace("\0", ""))))
    if not table:
        return HealthTable()
    columns = [c.strip() for c in table[0]]
    if "iter" not in columns:
        return HealthTable((), f"{name} has no iter column: not read")
    at = {c: k for k, c in enumerate(columns)}
    rows, skipped = [], 0
    for r in table[1:]:
        cell = lambda c: r[at[c]].strip() if c in at and at[c] < len(r) else ""  # noqa: E731
        it = _iteration(cell("iter"))
        if it is None:
            skipped += 1
            continue
        values = tuple((s, v) for s in SIGNALS if (v := _number(cell(s) or None)) is not None)
        alerts = tuple(a for a in cell("alerts").split(";") if a in SIGNALS)
        rows.append(HealthRow(it, _checkpoint(cell("checkpoint")), values, alerts))
    missing = [s for s in SIGNALS if s not in at]
    notes = ([f"{skipped} row(s) without a valid iter skipped"] if skipped else []) + \
            ([f"no column {', '.join(missing)}"] if missing and rows else [])
    return HealthTable(tuple(rows), f"{name}: " + "; ".join(notes) if notes else "")


def _checkpoint(text: str) -> str:
    return text if text.startswith("iter_") and text[5:].isdigit() else ""


def read_health_csv(run_dir: Path) -> HealthTable:
    """A pool worker's job: `<run>/health.csv` as rows ((), "" when there is none)."""
    path = Path(run_dir) / HEALTH_CSV
    data, problem = _read_bytes(path)
    if problem or not data:
        return HealthTable((), problem)
    return parse_health_csv(data.decode("utf-8", errors="replace"), path.name)


def row_from_event(it: Optional[int], data: dict) -> Optional[HealthRow]:
    """A `health` event as a row (None when it has no usable iteration)."""
    if not isinstance(it, int) or isinstance(it, bool) or it < 0 or not isinstance(data, dict):
        return None
    signals = data.get("signals") if isinstance(data.get("signals"), dict) else {}
    values = tuple((s, v) for s in SIGNALS if (v := _number(signals.get(s))) is not None)
    ckpt = data.get("checkpoint")
    return HealthRow(it, _checkpoint(ckpt) if isinstance(ckpt, str) else "", values,
                     tuple(a["signal"] for a in event_alerts(data)))


def event_alerts(data: dict) -> list[dict]:
    """The event's alerts that name a known signal, each with message and advice as text."""
    alerts = data.get("alerts") if isinstance(data, dict) else None
    out = []
    for a in alerts if isinstance(alerts, list) else []:
        if isinstance(a, dict) and a.get("signal") in SIGNALS:
            out.append({**a, "message": str(a.get("message") or f"{a['signal']} raised an alert"),
                        "advice": str(a.get("advice") or "")})
    return out


# ---------------------------------------------------------------- figures and ranking

def figure(signal: str, value: Optional[float]) -> str:
    if value is None:
        return "–"
    return f"{value:.2f}" if signal in ABSOLUTE else f"{value * 100:.0f}%"


def header_figures(row: Optional[HealthRow], extra: str = "") -> str:
    """"div 82% · sat 105% · detail 93%" (plus `extra`, the signal sorted by, when not among them)."""
    if row is None:
        return ""
    shown = HEADER_SIGNALS + ((extra,) if extra in SIGNALS and extra not in HEADER_SIGNALS else ())
    return " · ".join(f"{SHORT[s]} {figure(s, row.value(s))}" for s in shown if row.value(s) is not None)


def all_figures(row: HealthRow) -> list[str]:
    return [f"{LABELS[s]}: {figure(s, row.value(s))}" + (" (alert)" if s in row.alerts else "") for s in SIGNALS]


def badness(signal: str, value: Optional[float]) -> float:
    """How far from the teacher: |v - 1| for a ratio, v for teacher_distance; inf when not computed."""
    if value is None:
        return math.inf
    return value if signal in ABSOLUTE else abs(value - 1.0)


class AlertTracker:
    """Which alerts are new: a signal that raised none at the run's previous health row. A signal that
    stays in alert row after row is announced once; it is new again after a row without it."""

    def __init__(self):
        self._alerting: set[str] = set()
        self._last_iter = -1

    def reset(self) -> None:
        self._alerting, self._last_iter = set(), -1

    def new_alerts(self, it: int, alerts: list[dict]) -> list[dict]:
        if it <= self._last_iter:
            return []  # a row seen already (the history and the events both tell it)
        self._last_iter = it
        now = {a["signal"] for a in alerts}
        fresh = [a for a in alerts if a["signal"] not in self._alerting]
        self._alerting = now
        return fresh
