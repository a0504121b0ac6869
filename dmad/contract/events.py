"""The event protocol: one JSON object per line, on stdout and appended to events.jsonl.

    {"v": 1, "t": <unix time>, "kind": <KIND>, "iter": <int|null>, "data": {...}}

Torch-free; the app parses the engine's stdout with `parse_line` and replays events.jsonl with
`read_events`. Images travel as file paths, never bytes. Readers tolerate a torn last line (a
kill in the middle of a write) and lines that are not events (skipped, never fatal).
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Iterator, Optional

from dmad.contract.regular import fopen_regular

EVENT_VERSION = 1
KINDS = ("started", "phase", "metric", "checkpoint", "samples", "health", "warning", "error",
         "paused", "resumed", "stopped", "finished")
ENDINGS = ("stopped", "finished", "error")  # a run's last event is one of these

# Why a run failed: an error event's data["cause"] (dmad.train.run_open and, for a multi-process run,
# dmad.train.launch write it), and what each means in words (the app's failure report shows a cause
# without words as written). A DmadError's cause is its class name instead.
CAUSE_OUT_OF_MEMORY = "out_of_memory"
CAUSE_NON_FINITE_LOSS = "non_finite_loss"
CAUSE_EXCEPTION = "exception"
CAUSE_INTERRUPTED = "interrupted"
CAUSE_DISK_FULL = "disk_full"
CAUSE_RANK_FAILED = "rank_failed"
ERROR_CAUSES = {CAUSE_OUT_OF_MEMORY: "out of memory", CAUSE_NON_FINITE_LOSS: "a loss became NaN or infinite",
                CAUSE_EXCEPTION: "unexpected error in the engine", CAUSE_INTERRUPTED: "interrupted",
                CAUSE_DISK_FULL: "out of disk space"}


@dataclass(frozen=True)
class Event:
    kind: str
    iter: Optional[int] = None
    data: dict[str, Any] = field(default_factory=dict)
    t: float = 0.0
    v: int = EVENT_VERSION

    def to_line(self) -> str:
        return json.dumps({"v": self.v, "t": self.t, "kind": self.kind, "iter": self.iter, "data": self.data},
                          separators=(",", ":"), allow_nan=False, default=str)


def make_event(kind: str, iter: Optional[int] = None, **data: Any) -> Event:
    if kind not in KINDS:
        raise ValueError(f"unknown event kind {kind!r}; known: {', '.join(KINDS)}")
    return Event(kind=kind, iter=iter, data=_finite(data), t=round(time.time(), 3))


def _finite(obj: Any) -> Any:
    """JSON has no NaN/inf: they become null (the loss that went NaN is named in the event's text)."""
    if isinstance(obj, float) and (obj != obj or obj in (float("inf"), float("-inf"))):
        return None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


MAX_ITER = 2**63 - 1  # an iteration beyond int64 is not one the engine wrote


def parse_line(line: str) -> Optional[Event]:
    """An Event, or None for a torn, empty or foreign line. Newer minor fields are kept in data.
    A line whose fields have the wrong type or range is foreign too: "t" must be a finite number,
    "v" a whole number, "data" an object (a hand-edited "t": "x" or "v": [1] is skipped, never a
    TypeError in a reader); an "iter" that is not a whole number from 0 to int64 reads as none."""
    try:
        d = json.loads(line)
    except (ValueError, RecursionError):  # torn, not JSON, or nested too deeply to be one of ours
        return None
    if not isinstance(d, dict) or d.get("kind") not in KINDS or not isinstance(d.get("data", {}), dict):
        return None
    t, v, it = d.get("t") or 0.0, d.get("v") or EVENT_VERSION, d.get("iter")
    if not _is_number(t) or not math.isfinite(t) or not _is_number(v) or not isinstance(v, int):
        return None
    return Event(kind=d["kind"], iter=it if _is_number(it) and isinstance(it, int) and 0 <= it <= MAX_ITER else None,
                 data=_no_huge_ints(d.get("data") or {}), t=float(t), v=v)


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _no_huge_ints(data: dict) -> dict:
    """`data` (fresh from json.loads) with whole numbers beyond int64 made null, in place: no event of
    ours holds one, and a reader passing it on (a Qt signal, numpy) would overflow. No recursion."""
    stack: list[Any] = [data]
    while stack:
        container = stack.pop()
        keys = container.keys() if isinstance(container, dict) else range(len(container))
        for k in keys:
            v = container[k]
            if isinstance(v, int) and not isinstance(v, bool) and not -MAX_ITER <= v <= MAX_ITER:
                container[k] = None
            elif isinstance(v, (dict, list)):
                stack.append(v)
    return data


def is_iteration_metric(ev: Event) -> bool:
    """A metric event of a logged iteration (losses, times): not a memory sampler reading (those
    carry data.source == "sampler" and the last finished iteration)."""
    return ev.kind == "metric" and ev.data.get("source") != "sampler"


def read_events(path: str | Path) -> Iterator[Event]:
    """All complete events of an events.jsonl; a missing file yields nothing, a FIFO or a folder in
    its place raises dmad.contract.regular.NotRegularFile (an OSError) without waiting on it."""
    try:
        with fopen_regular(path, "r", encoding="utf-8", errors="replace") as f:
            for line in f:
                ev = parse_line(line)  # a torn last line does not parse and is skipped
                if ev is not None:
                    yield ev
    except FileNotFoundError:
        return


class EventWriter:
    """Writes each event to stdout (for the app's QProcess) and appends it to events.jsonl.

    Each line is written with one write() and flushed, so a reader sees whole lines except
    possibly the last one after a kill. Cost: one json.dumps + two small writes per event."""

    def __init__(self, path: str | Path, stream: Optional[IO[str]] = None, echo: bool = True):
        self.path = Path(path)
        self._file = fopen_regular(self.path, "a", encoding="utf-8")  # a FIFO there: refused, never waited on
        self.start_offset = self._file.tell()  # where this writer's own lines begin
        self._stream = stream if stream is not None else sys.stdout
        self._echo = echo
        self._lock = threading.Lock()  # the memory sampler thread emits too: whole lines only
        self._ended = False  # an ending event (ENDINGS) is written

    def emit(self, kind: str, iter: Optional[int] = None, **data: Any) -> Event:
        ev = make_event(kind, iter, **data)
        with self._lock:
            self._write(ev.to_line() + "\n")
            self._ended = self._ended or kind in ENDINGS
        return ev

    def emit_unless_ended(self, kind: str, iter: Optional[int] = None, **data: Any) -> Optional[Event]:
        """An event from another thread (the memory sampler) that must not follow the run's ending
        event: dropped (None) once one is written, checked under the same lock as the write."""
        ev = make_event(kind, iter, **data)
        with self._lock:
            if self._ended:
                return None
            self._write(ev.to_line() + "\n")
        return ev

    def _write(self, line: str) -> None:
        self._file.write(line)
        self._file.flush()
        if self._echo:
            try:
                self._stream.write(line)
                self._stream.flush()
            except (BrokenPipeError, ValueError):
                self._echo = False  # the reader went away; the file still has everything

    def sync(self) -> None:
        self._file.flush()
        os.fsync(self._file.fileno())

    @contextlib.contextmanager
    def paused(self) -> Iterator[int]:
        """No event is written while the file is rewritten (a resume's cut-back, which replaces it):
        yields where this writer's own lines begin; the file is reopened for appending after."""
        with self._lock:
            self._file.close()
            try:
                yield self.start_offset
            finally:
                self._file = fopen_regular(self.path, "a", encoding="utf-8")

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()
