"""The append-only logs of a run folder: metrics.csv / gpu_mem.csv rows and control.jsonl.

Torch-free (the app reads metrics and writes control commands). One row or command per
write(), flushed, so a live reader sees whole lines; readers drop a torn last line.
"""
from __future__ import annotations

import csv
import io
import json
import math
import numbers
import os
import time
from pathlib import Path
from typing import IO, Any, Callable, Optional, Union

from dmad.contract.events import MAX_ITER
from dmad.contract.regular import NotRegularFile, fopen_regular, open_regular, read_regular

PathLike = Union[str, "os.PathLike[str]"]
CONTROL_COMMANDS = ("stop", "stop_now", "pause", "resume", "sample_now", "checkpoint_now")
MAX_PROMPT_CHARS = 1000  # a one-off sample_now prompt: far more than any text encoder reads


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _complete_text(data: bytes) -> str:
    """Text up to and including the last newline: a torn last line (a kill mid-write) is dropped."""
    return data[:data.rfind(b"\n") + 1].decode("utf-8", errors="replace")


def _to_int(s: str) -> Optional[int]:
    """An iteration cell as an int; None for text, NaN, 1e999 or anything beyond int64."""
    try:
        value = int(s)
    except ValueError:
        try:
            value = int(float(s))
        except (ValueError, OverflowError):
            return None
    return value if -MAX_ITER <= value <= MAX_ITER else None


def _to_float(s: str) -> Optional[float]:
    try:
        return float(s) if s != "" else None
    except ValueError:
        return None


# ---------------------------------------------------------------- metrics.csv, gpu_mem.csv

class CsvAppender:
    """Appends one row per write() and flushes it, so a live reader sees whole rows."""

    def __init__(self, path: PathLike, columns: list[str]):
        self.path, self.columns = Path(path), list(columns)
        self._fd = open_regular(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND)
        try:
            self._check_or_write_header()
        except BaseException:
            os.close(self._fd)
            raise

    def _check_or_write_header(self) -> None:
        # Reads the first line and the last 64 KiB only: metrics.csv of a long run is megabytes.
        size = os.fstat(self._fd).st_size
        with os.fdopen(os.dup(self._fd), "rb") as f:  # the fd checked by open_regular, not the name again
            f.seek(0)
            first = f.readline(65536)
            f.seek(max(0, size - 65536))
            tail = f.read()
        if tail and not tail.endswith(b"\n"):  # a torn row from a killed writer: drop it
            size -= len(tail) - (tail.rfind(b"\n") + 1)
            os.ftruncate(self._fd, size)
        if size == 0:
            self._write(self.columns)
            return
        header = next(csv.reader([first.decode("utf-8", "replace")]), [])
        if header != self.columns:
            raise ValueError(f"{self.path} has columns {header} but this run writes {self.columns}")

    @classmethod
    def continued(cls, path: PathLike, columns: list[str]) -> "CsvAppender":
        """The appender of a file this engine version may continue: one an older engine started with
        fewer columns (a prefix of `columns`: columns are only ever added at the end) keeps its own
        header, and the newer columns are left out of it. Anything else is refused as __init__ does."""
        try:
            return cls(path, columns)
        except ValueError:
            with fopen_regular(path, "r", newline="", encoding="utf-8") as f:
                header = next(csv.reader(f), [])
            if header and header == list(columns)[:len(header)]:
                return cls(path, header)
            raise

    def append(self, row: dict[str, Any]) -> None:
        unknown = set(row) - set(self.columns)
        if unknown:
            raise ValueError(f"{self.path}: unknown columns {sorted(unknown)}; known: {self.columns}")
        self._write([_cell(row.get(c)) for c in self.columns])

    def _write(self, cells: list[str]) -> None:
        buf = io.StringIO()
        csv.writer(buf, lineterminator="\n").writerow(cells)
        _write_all(self._fd, buf.getvalue().encode("utf-8"))

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> "CsvAppender":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _cell(x: Any) -> str:
    if x is None:
        return ""
    if isinstance(x, bool):
        return str(int(x))
    if isinstance(x, numbers.Integral):
        return str(int(x))
    if isinstance(x, numbers.Real):
        # repr is the shortest text that round-trips: '.6g' would hide a loss changing in digit 7.
        return repr(float(x))
    return str(x)


def read_metrics(path: PathLike) -> tuple[list[str], list[dict[str, Optional[float]]]]:
    """(columns, rows); iter is an int, other cells floats or None. Missing file: ([], []); a FIFO
    or a folder in its place is dmad.contract.regular.NotRegularFile (an OSError)."""
    try:
        text = _complete_text(read_regular(path))
    except FileNotFoundError:
        return [], []
    rows = list(csv.reader(io.StringIO(text)))
    if not rows:
        return [], []
    columns, out = rows[0], []
    col = columns.index("iter") if "iter" in columns else None
    for r in rows[1:]:
        d: dict[str, Any] = {c: _to_float(r[k]) if k < len(r) else None for k, c in enumerate(columns)}
        if col is not None:
            d["iter"] = _to_int(r[col]) if col < len(r) else None
            if d["iter"] is None:
                continue  # a row without an iteration cannot be plotted
        out.append(d)
    return columns, out


# ---------------------------------------------------------------- health.csv

# The health signals (dmad.sample.health), in display order, and health.csv's columns: one row per
# validation of a prompt set with health_seeds (rank 0 writes; cut back on resume like metrics.csv).
HEALTH_SIGNALS = ("diversity", "saturation", "brightness", "contrast", "colourfulness", "detail", "teacher_distance")
HEALTH_COLUMNS = ["iter", "checkpoint", *HEALTH_SIGNALS, "alerts"]
HEALTH_LABELS = {"diversity": "Diversity", "saturation": "Saturation", "brightness": "Brightness",
                 "contrast": "Contrast", "colourfulness": "Colourfulness", "detail": "Detail",
                 "teacher_distance": "Distance to teacher"}

# The health alerts' bounds (dmad.sample.health.alerts_for; the app's Health page draws them). Per
# signal (low, high): an alert fires when the signal is below `low` or above `high` (None: no
# bound); ratios to the teacher, except teacher_distance (absolute). Set on the demo (docs/benchmarks.md,
# "Health signals"; bench/health_broken.py, bench/health_evidence.py), on training seed 0 of the
# deliberately broken runs and on the held-out bench's healthy runs, then checked on seed 1:
# - diversity 0.7: healthy runs 0.84 at the least (DMAD, DM alone, the peer: 30 checkpoints); the
#   collapse (generator_lr 25x) 0.66 at its best-FD checkpoint, 0.53-0.56 after; the consistency
#   peer's 1-step student 0.66-0.70.
# - saturation 1.15: healthy 0.99 at most; a critic that does not learn 1.19 one validation before
#   its FD_real quadrupled; a real-score CFG of 40 drifts up to 1.13 without FD damage.
# - colourfulness 1.25: healthy 1.03 at most; GAN alone 1.32-1.34; the frozen critic 1.33-1.37.
# - detail (0.7, 1.6): healthy 1.02-1.13; GAN alone 2.0-8; the collapse 1.93 at its worst-FD
#   checkpoint; the peer's 1-step student (blur) 0.60-0.65; CFG 40 rises to 1.59.
# - brightness, contrast, teacher_distance: not moved from their first guesses; no healthy run came
#   within 25% of them, and a broken run crossed them only where another signal fired too.
HEALTH_THRESHOLDS: dict[str, tuple[Optional[float], Optional[float]]] = {
    "diversity": (0.7, None),
    "saturation": (None, 1.15),
    "brightness": (0.67, 1.5),
    "contrast": (0.6, 1.6),
    "colourfulness": (None, 1.25),
    "detail": (0.7, 1.6),
    "teacher_distance": (None, 0.35),
}


def health_summary(data: dict) -> str:
    """One line of a `health` event for a log or a terminal: "diversity 84%, saturation 94%, detail
    109% of the teacher's (no alert)"; its alerts' own lines follow as warning events."""
    signals = data.get("signals") if isinstance(data.get("signals"), dict) else {}
    shown = [f"{name} {v * 100:.0f}%" for name in ("diversity", "saturation", "detail")
             if isinstance(v := signals.get(name), (int, float)) and not isinstance(v, bool) and math.isfinite(v)]
    alerts = [a.get("signal") for a in data.get("alerts") or [] if isinstance(a, dict)]
    return (", ".join(shown) + " of the teacher's" if shown else "no signal computed") + \
        (f" (alert: {', '.join(map(str, alerts))})" if alerts else " (no alert)")


def health_row(iter: int, checkpoint: Optional[str], signals: dict[str, float], alerts: list[str]) -> dict[str, str]:
    """A health.csv row: signals with 6 significant digits, empty when absent; alerts ';'-joined."""
    return {"iter": str(int(iter)), "checkpoint": checkpoint or "",
            **{s: (f"{signals[s]:.6g}" if signals.get(s) is not None else "") for s in HEALTH_SIGNALS},
            "alerts": ";".join(alerts)}


def read_health(path: PathLike) -> list[dict[str, Any]]:
    """health.csv's rows: iter int, checkpoint str or None, the signals floats or None, alerts a list
    of signal names. Missing file: []. A torn last row and rows without an iteration are dropped."""
    try:
        text = _complete_text(read_regular(path))
    except FileNotFoundError:
        return []
    rows = list(csv.DictReader(io.StringIO(text)))
    out = []
    for r in rows:
        it = _to_int(r.get("iter") or "")
        if it is None:
            continue
        out.append({"iter": it, "checkpoint": r.get("checkpoint") or None,
                    **{s: _to_float(r.get(s) or "") for s in HEALTH_SIGNALS},
                    "alerts": [a for a in (r.get("alerts") or "").split(";") if a]})
    return out


# ---------------------------------------------------------------- control.jsonl

MAX_CONTROL_LINE = 4096  # bytes; a command is ~40: a longer line is not one, and is never parsed
_READ_CHUNK = 1 << 20  # bytes per poll: a huge file is read a megabyte at a time, never whole


class ControlReader:
    """The commands appended to control.jsonl for this engine, from the moment it starts.

    `offset`: where the commands of earlier engines end (status.json `control_offset`, recorded by
    the engine before this one); `since`: this engine's start time (unix s). Commands before the
    offset, or stamped before `since` (one an earlier engine was killed before reading), were
    meant for an earlier process; everything after, including a Stop pressed while this engine
    was still loading, is for this one. since=None: the current end of the file is the offset.
    No line, however long, deep or malformed, raises: it is counted in `ignored` and skipped.
    More than _READ_CHUNK unread (a planted gigabyte of garbage) is passed over to its last
    _READ_CHUNK, so a command written after it is read at the next poll, not a thousand polls on.
    A control.jsonl that is not a regular file (a FIFO, a folder) is never opened, so a poll never
    blocks: no commands while it is so, and `on_problem(line)` is called once, the first time."""

    def __init__(self, path: PathLike, from_start: bool = False, offset: Optional[int] = None,
                 since: Optional[float] = None, on_problem: Optional[Callable[[str], None]] = None):
        self.path = Path(path)
        self.since = since
        self.on_problem = on_problem
        self.problem = ""  # why commands cannot be read now ("" while they can)
        self._reported = False
        self._identity: Optional[tuple[int, int]] = None  # (device, inode) of the file last read
        self.ignored = 0  # lines that were not commands (bad JSON, unknown cmd, over-long)
        self._skipping = False  # inside an over-long line: drop bytes up to its newline
        self._deferred: list[dict] = []  # read before they could be applied (defer)
        if offset is not None or from_start or since is not None:
            self._offset = max(0, int(offset or 0))
        else:
            try:
                self._offset = self.path.stat().st_size
            except OSError:
                self._offset = 0

    @property
    def offset(self) -> int:
        """Bytes consumed: what the next engine starts after (status.json `control_offset`)."""
        return self._offset

    def defer(self, command: dict) -> None:
        """Hand `command` back: the next poll returns it first (a sample_now before training)."""
        self._deferred.append(command)

    def poll(self) -> list[dict]:
        deferred, self._deferred = self._deferred, []
        return deferred + self._read()

    def _read(self) -> list[dict]:
        try:
            with os.fdopen(open_regular(self.path), "rb") as f:
                st = os.fstat(f.fileno())
                size, identity = st.st_size, (st.st_dev, st.st_ino)
                # Replaced (another inode, or a file again after a FIFO) or cut: read it afresh.
                if size < self._offset or identity != (self._identity or identity) or self.problem:
                    self._offset, self._skipping = 0, False
                self._identity = identity
                if size - self._offset > _READ_CHUNK:
                    self._pass_over(f, size - _READ_CHUNK)
                f.seek(self._offset)
                data = f.read(min(size - self._offset, _READ_CHUNK))
        except NotRegularFile as e:
            self._report(e.short)
            return []
        except OSError:  # missing, unreadable: no commands, never an error
            return []
        self.problem = ""
        commands, start = [], 0
        while (nl := data.find(b"\n", start)) >= 0:
            if self._skipping:
                self._skipping = False  # the end of an over-long line
            else:
                cmd = _parse_control(data[start:nl])
                if cmd is None:
                    self.ignored += 1
                elif self._is_new(cmd):
                    commands.append(cmd)
            start = nl + 1
        if len(data) - start > MAX_CONTROL_LINE:  # an over-long line still being written: skip it
            self.ignored += 0 if self._skipping else 1
            self._skipping, start = True, len(data)
        self._offset += start  # a torn last line waits for the next poll
        return commands

    def _pass_over(self, f: IO[bytes], to: int) -> None:
        """Skip the unread bytes before `to` (counted as one ignored line): what follows starts a line
        when the byte before `to` ends one, else it is the rest of a line (skipped up to its newline)."""
        f.seek(to - 1)
        self._skipping = f.read(1) != b"\n"
        self._offset = to
        self.ignored += 1

    def _report(self, problem: str) -> None:
        self.problem = problem
        if not self._reported:
            self._reported = True
            if self.on_problem is not None:
                self.on_problem(problem)

    def _is_new(self, cmd: dict) -> bool:
        t = cmd.get("t")
        return self.since is None or not isinstance(t, (int, float)) or t >= self.since


def _parse_control(line: bytes) -> Optional[dict]:
    if len(line) > MAX_CONTROL_LINE:
        return None
    try:
        d = json.loads(line.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    if not isinstance(d, dict) or d.get("cmd") not in CONTROL_COMMANDS:
        return None
    t = d.get("t")
    if t is not None and (isinstance(t, bool) or not isinstance(t, (int, float)) or t != t):
        return None  # a time stamp that is not a number cannot be placed before or after a start
    return d


def append_control(run_dir: PathLike, cmd: str, prompt: Optional[str] = None, seed: Optional[int] = None) -> dict:
    """One line, one write() on an O_APPEND fd: concurrent writers never interleave inside a line.
    A control.jsonl that is not a regular file is dmad.contract.regular.NotRegularFile (an OSError).
    stop: checkpoint, then stop; stop_now: stop without a checkpoint. sample_now with `prompt`
    (and optionally `seed`): one image of that prompt instead of the prompt set."""
    if cmd not in CONTROL_COMMANDS:
        raise ValueError(f"unknown control command {cmd!r}; known: {', '.join(CONTROL_COMMANDS)}")
    command: dict[str, Any] = {"cmd": cmd, "t": round(time.time(), 3)}
    if prompt is not None or seed is not None:
        if cmd != "sample_now":
            raise ValueError(f"{cmd}: only sample_now takes a prompt or a seed")
        problem = one_off_problem(prompt, seed)
        if problem:
            raise ValueError(problem)
        command.update({"prompt": prompt} if seed is None else {"prompt": prompt, "seed": seed})
    line = (json.dumps(command, separators=(",", ":")) + "\n").encode("utf-8")
    # open_regular: a FIFO in its place is refused at once (NotRegularFile) instead of waiting for
    # a reader that never comes, so the app's Stop never blocks (it falls back to a signal).
    fd = open_regular(Path(run_dir) / "control.jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)
    return command


def one_off_problem(prompt: Any, seed: Any, prompt_name: str = "sample_now: the prompt",
                    seed_name: str = "sample_now: the seed") -> Optional[str]:
    """Why a sample_now prompt / seed cannot be rendered, or None (the app and the engine check alike).
    `prompt_name` / `seed_name` start the line (`dmad sample --prompt` says "--prompt", "--seed")."""
    if not isinstance(prompt, str) or not prompt.strip():
        return f"{prompt_name} must be non-empty text"
    if len(prompt) > MAX_PROMPT_CHARS:
        return f"{prompt_name} has {len(prompt)} characters; at most {MAX_PROMPT_CHARS}"
    try:  # a lone surrogate (JSON's "\ud800") is text no file, tokenizer or event line can hold
        prompt.encode("utf-8")
    except UnicodeEncodeError as e:
        return f"{prompt_name} is not valid Unicode text (a lone surrogate at character {e.start + 1})"
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**32):
        return f"{seed_name} must be a whole number from 0 to 4294967295"
    return None
