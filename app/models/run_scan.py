"""Scanning a root folder of runs into plain rows for the Runs panel, off the GUI thread.

Each scan lists the run folders (dmad.contract.runs.list_runs) and re-reads only the files whose
(mtime, size, inode) changed since the last scan: a heartbeat re-reads one small status.json, a
metrics row re-reads the tail of metrics.csv. metrics.csv and events.jsonl are read from the end
(the last TAIL_BYTES), never whole: a long run's files are tens of megabytes. The state is
recomputed every scan from the cached status (dmad.contract.runs.effective_state), because a pid can die
and a heartbeat can go stale without any file changing.
"""
from __future__ import annotations

import csv
import math
import os
import socket
import stat
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path, PurePath
from typing import Any, Callable, Optional

from app.models.methods import method_of
from app.models.resume import CONTINUABLE
from app.models.run_files import NOTE_NAME, read_note
from dmad.contract.events import is_iteration_metric, parse_line
from dmad.contract.events import MAX_ITER
from dmad.contract.jsonfile import read_json_or_problem
from dmad.contract.regular import fopen_regular
from dmad.contract.runs import RunFolder, check_status, effective_state, list_runs, pid_alive

STALE_AFTER_S = 60.0  # no heartbeat for this long = the engine is gone (it beats every few seconds)
TAIL_BYTES = 65536    # enough for hundreds of metrics rows or events; one read per changed file
NOT_A_RUN = "not a run folder (no config.json or status.json)"


@dataclass
class RunRow:
    """One line of the runs table: plain python, built on a worker thread."""

    path: Path
    name: str
    state: str                       # effective state; "error": unreadable run files; "not a run"
    reason: str = ""                 # failure reason or what is wrong with the folder
    is_run: bool = True
    iter: Optional[int] = None
    max_steps: Optional[int] = None
    last_checkpoint: Optional[int] = None  # status.json's word
    resume_from: Optional[int] = None  # the complete checkpoint on disk Continue would use (CONTINUABLE rows)
    started: Optional[float] = None  # unix time of the run's first "started" event
    teacher: str = ""
    dataset: str = ""
    prompt_set: str = ""
    method: str = ""                 # distillation.method ("" without a config)
    student_steps: Optional[int] = None
    batch: Optional[int] = None      # effective batch: train_batch_size x gradient_accumulation_steps
    batch_parts: tuple[Optional[int], Optional[int]] = (None, None)
    generator_lr: Optional[float] = None
    critic_lr: Optional[float] = None
    metrics: dict[str, Optional[float]] = field(default_factory=dict)  # last metrics row / event
    age_s: Optional[float] = None    # seconds since the last heartbeat (status.json write)
    config: Optional[dict] = None    # parsed config.json, for "Compare configs" without re-reading
    note: str = ""                   # <run>/note.txt: the user's own words about the run


class ScanError(Exception):
    """The root itself cannot be scanned; shown as one line in the panel."""


# ---------------------------------------------------------------- file cache

class ScanCache:
    """Parsed files keyed by path, valid while (mtime_ns, size, inode) is unchanged.

    Used by one scan at a time (the panel never starts a second scan while one runs).
    `reads` counts actual file reads per kind and `bytes_read` their size: the cost of a scan."""

    def __init__(self) -> None:
        self._files: dict[tuple[Path, str], tuple[tuple, Any]] = {}
        self.reads: Counter[str] = Counter()
        self.bytes_read = 0

    def load(self, path: Path, kind: str, reader: Callable[[Path], Any]) -> Any:
        """reader(path) on a change, else the cached value; None when the file is absent or not a
        regular file (a FIFO would block the read: scan_run names it as the run's reason)."""
        try:
            st = path.stat()
        except OSError:
            st = None
        if st is None or not stat.S_ISREG(st.st_mode):
            self._files.pop((path, kind), None)
            return None
        stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        hit = self._files.get((path, kind))
        if hit is not None and hit[0] == stamp:
            return hit[1]
        value = reader(path)
        self.reads[kind] += 1
        self._files[(path, kind)] = (stamp, value)
        return value

    def keep_only(self, folders: set[Path]) -> None:
        """Forget the files of folders that are gone, so the cache does not grow forever
        (checkpoints/latest.json sits one level down)."""
        self._files = {k: v for k, v in self._files.items()
                       if k[0].parent in folders or k[0].parent.parent in folders}

    def read_head_tail(self, path: Path, head: bool, tail: bool) -> tuple[bytes, bytes]:
        """(the first line if head, the last TAIL_BYTES after it cut to start at a line if tail)."""
        with fopen_regular(path, "rb") as f:  # a FIFO there: NotRegularFile at once, never a wait
            first = f.readline(TAIL_BYTES) if head else b""
            body = b""
            if tail:
                start = max(len(first), os.fstat(f.fileno()).st_size - TAIL_BYTES)
                # One byte earlier tells whether `start` is a line start or mid-line.
                f.seek(max(len(first), start - 1))
                body = f.read()
        self.bytes_read += len(first) + len(body)
        if tail and start > len(first):
            body = body[body.find(b"\n") + 1:] if b"\n" in body else b""
        return first, body


def _json_reader(path: Path) -> tuple[Any, str]:
    """(parsed, "") or (None, one-line problem): a hostile file is that run's row, not the scan's end."""
    return read_json_or_problem(path)


def _complete_lines(data: bytes) -> list[str]:
    # A torn last line (the engine is mid-write) is dropped; it is complete on the next scan.
    return data[:data.rfind(b"\n") + 1].decode("utf-8", errors="replace").splitlines()


def _number(cell: str) -> Optional[float]:
    """A finite number, or None (text, NaN, 1e999: a hand-edited cell is no number to show)."""
    try:
        value = float(cell) if cell != "" else None
    except ValueError:
        return None
    return value if value is not None and math.isfinite(value) else None


def _finite(v: Any) -> Optional[float]:
    """An event's number as a finite float, or None (a bool, 1e999, an int too large for a float)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    try:
        value = float(v)
    except OverflowError:
        return None
    return value if math.isfinite(value) else None


def _iteration(x: Any) -> Optional[int]:
    """An iteration read back (a metrics cell, status.json): a whole number from 0 to int64, else None."""
    if isinstance(x, float) and x.is_integer():
        x = int(x)
    return x if isinstance(x, int) and not isinstance(x, bool) and 0 <= x <= MAX_ITER else None


def metrics_tail(cache: ScanCache, path: Path) -> dict[str, Optional[float]]:
    """The last complete row of metrics.csv ({} when none), from its header and its tail only."""
    head, body = cache.read_head_tail(path, head=True, tail=True)
    if not head.endswith(b"\n"):
        return {}
    columns = next(csv.reader([head.decode("utf-8", errors="replace")]), [])
    for line in reversed(_complete_lines(body)):
        cells = next(csv.reader([line]), [])
        row = {c: _number(v) for c, v in zip(columns, cells)}
        if len(cells) == len(columns) and ("iter" not in row or _iteration(row["iter"]) is not None):
            return row  # the last row with an iteration: a hand-written 1e999 or nan is passed over
    return {}


def events_tail(cache: ScanCache, path: Path) -> dict[str, Optional[float]]:
    """The last metric event's numbers (with its iter), from the tail of events.jsonl."""
    _, body = cache.read_head_tail(path, head=False, tail=True)
    for line in reversed(_complete_lines(body)):
        ev = parse_line(line)
        if ev is not None and is_iteration_metric(ev):
            numbers = {k: f for k, v in ev.data.items() if (f := _finite(v)) is not None}
            return {"iter": ev.iter, **numbers} if ev.iter is not None else numbers
    return {}


def started_time(cache: ScanCache, path: Path) -> Optional[float]:
    """Time of the first "started" event: the first line of events.jsonl (a resume keeps it)."""
    head, _ = cache.read_head_tail(path, head=True, tail=False)
    ev = parse_line(head.decode("utf-8", errors="replace")) if head.endswith(b"\n") else None
    return ev.t if ev is not None and ev.kind == "started" else None


# ---------------------------------------------------------------- one folder

def _get(config: Optional[dict], dotted: str) -> Any:
    cur: Any = config
    for key in dotted.split("."):
        if not isinstance(cur, dict):
            return None
        cur = cur.get(key)
    return cur


def _int(x: Any) -> Optional[int]:
    return x if isinstance(x, int) and not isinstance(x, bool) else None


def _float(x: Any) -> Optional[float]:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def _short(path_or_id: Any) -> str:
    """The last two parts of a path or hub id: "demo/teacher", "runwayml/stable-diffusion-v1-5"."""
    if not isinstance(path_or_id, str) or not path_or_id:
        return ""
    return "/".join(PurePath(path_or_id).parts[-2:])


def failure_reason(status: dict, now: float) -> str:
    """Why a run counts as failed: its own words, or why we do not believe its live state."""
    if status.get("state") == "failed":
        reason = status.get("failure_reason") or "failed (no reason recorded)"
        code = status.get("exit_code")
        return f"{reason} (exit code {code})" if code is not None else str(reason)
    pid, host, beat = status.get("pid"), status.get("host"), status.get("heartbeat")
    last = status.get("state")
    if host in (None, socket.gethostname()) and isinstance(pid, int) and not pid_alive(pid):
        return f"the engine process (pid {pid}) is gone without writing a final state (was {last})"
    age = f"{now - beat:.0f} s" if isinstance(beat, (int, float)) else "a long time"
    # Alive but silent (hung on a network drive, a deadlock) also lands here: the run is not progressing.
    return f"no heartbeat for {age} from host {host or '?'} (was {last}): the engine is gone or hung"


def scan_run(cache: ScanCache, run: RunFolder, now: float) -> RunRow:
    row = RunRow(path=run.path, name=run.name, state="created")
    status, status_problem = cache.load(run.status_json, "status", _json_reader) or (None, "")
    config, config_problem = cache.load(run.config_json, "config", _json_reader) or (None, "")
    status = _apply_status(row, status, status_problem, now)
    if config_problem or (config is not None and not isinstance(config, dict)):
        row.reason = "; ".join(r for r in (row.reason, config_problem or "config.json is not a JSON object") if r)
        config = None
    irregular = run.irregular_files()  # a FIFO, a folder ... in place of a run file: never read, said here
    if irregular:
        if any(p.startswith("status.json ") for p in irregular):
            row.state = "error"
        row.reason = "; ".join(r for r in (row.reason, *irregular) if r)
    _fill_from_config(row, config)
    _fill_progress(cache, run, row, status or {})
    return row


def _apply_status(row: RunRow, status: Any, problem: str, now: float) -> Optional[dict]:
    """The row's state, reason and heartbeat age from status.json; the status fields to use, each of
    the type and range the engine writes (check_status), or None when there is no usable status."""
    if problem or (status is not None and not isinstance(status, dict)):
        row.state, row.reason = "error", problem or "status.json is not a JSON object"
        return None
    if status is None:
        return None
    checked, row.reason = check_status(status)  # a pid of 2**31, a state that is an object: dropped
    if "state" in status and "state" not in checked:
        row.state = "error"  # what the run is cannot be told
        return checked
    row.state = effective_state(checked, now=now, stale_after_s=STALE_AFTER_S)
    if row.state == "failed":
        row.reason = "; ".join(r for r in (failure_reason(checked, now), row.reason) if r)
    beat = checked.get("heartbeat")
    row.age_s = now - beat if beat is not None else None
    return checked


def _fill_from_config(row: RunRow, config: Optional[dict]) -> None:
    row.config = config
    row.teacher = _short(_get(config, "identity.pretrained_model_name_or_path"))
    data_dir = _get(config, "identity.train_data_dir")
    row.dataset = PurePath(data_dir).name if isinstance(data_dir, str) else ""
    row.student_steps = _int(_get(config, "distillation.student_steps"))
    row.method = str(method_of(config)) if config is not None else ""
    per_step = _int(_get(config, "resources.train_batch_size"))
    accumulation = _int(_get(config, "resources.gradient_accumulation_steps"))
    row.batch_parts = (per_step, accumulation)
    row.batch = per_step * accumulation if per_step is not None and accumulation is not None else None
    row.generator_lr = _float(_get(config, "optimization.generator_lr"))
    row.critic_lr = _float(_get(config, "optimization.critic_lr"))
    row.max_steps = _int(_get(config, "optimization.max_train_steps"))
    prompt_file = _get(config, "observation.prompt_set")
    row.prompt_set = PurePath(prompt_file).stem if isinstance(prompt_file, str) else ""


def _fill_progress(cache: ScanCache, run: RunFolder, row: RunRow, status: dict) -> None:
    prompt_set, _ = cache.load(run.prompt_set_json, "prompt_set", _json_reader) or (None, "")
    if isinstance(prompt_set, dict) and prompt_set.get("prompt_set"):
        row.prompt_set = f"{prompt_set['prompt_set']}-{prompt_set.get('version', '?')}"
    row.metrics = cache.load(run.metrics_csv, "metrics", lambda p: metrics_tail(cache, p)) or {}
    if not row.metrics:  # a run that died before its first metrics row, or an older engine
        row.metrics = cache.load(run.events_jsonl, "events_tail", lambda p: events_tail(cache, p)) or {}
    row.started = cache.load(run.events_jsonl, "events_head", lambda p: started_time(cache, p))
    # status.json's iter is refreshed by every heartbeat; a metrics row written since is newer still
    known = [i for i in (_iteration(status.get("iter")), _iteration(row.metrics.get("iter"))) if i is not None]
    row.iter = max(known) if known else None
    row.note = cache.load(run.path / NOTE_NAME, "note", read_note) or ""
    row.max_steps = _int(status.get("max_train_steps")) or row.max_steps
    row.last_checkpoint = _int(status.get("last_checkpoint"))
    if row.state in CONTINUABLE:
        row.resume_from = scan_resume_point(cache, run)


def scan_resume_point(cache: ScanCache, run: RunFolder) -> Optional[int]:
    """resume.resume_point with latest.json cached: one stat per scan while nothing changes."""
    latest = cache.load(run.latest_json, "latest_checkpoint", lambda _: run.latest_checkpoint())
    if latest is not None and latest[1].is_dir():
        return latest[0]
    found = run.list_checkpoints()  # no latest.json, or its folder was deleted: what is on disk
    return found[-1][0] if found else None


# ---------------------------------------------------------------- the root

def scan_root(root: Path, cache: ScanCache, now: Optional[float] = None) -> list[RunRow]:
    """Rows for every folder under root: runs newest first, then folders that are not runs.
    A folder that cannot be read becomes a row that says why; the scan goes on."""
    if not root.is_dir():
        raise ScanError(f"runs folder not found: {root}")
    now = time.time() if now is None else now
    runs = list_runs(root)
    known = {r.path for r in runs}
    others = sorted(p for p in root.iterdir()
                    if p.is_dir() and p not in known and not p.name.startswith("."))
    rows = []
    for run in runs:
        try:
            rows.append(scan_run(cache, run, now))
        except OSError as e:  # permissions, a folder deleted mid-scan, a network drive gone
            rows.append(RunRow(path=run.path, name=run.name, state="error", reason=f"cannot read: {e}"))
    rows += [RunRow(path=p, name=p.name, state="not a run", reason=NOT_A_RUN, is_run=False) for p in others]
    cache.keep_only(known)
    return rows


@dataclass(frozen=True)
class ScanResult:
    """What one scan of one root found: its rows, or one line saying why it could not scan."""

    root: Path
    rows: Optional[list[RunRow]]
    error: str = ""


def scan_or_error(root: Path, cache: ScanCache) -> ScanResult:
    """Worker side (app.engine.background.Task): a scan that never raises."""
    try:
        return ScanResult(root, scan_root(root, cache))
    except ScanError as e:
        return ScanResult(root, None, str(e))
    except Exception as e:  # a bug: one line in the panel, the traceback on stderr for the report
        traceback.print_exc()
        return ScanResult(root, None, f"scanning {root} failed: {type(e).__name__}: {e}")
