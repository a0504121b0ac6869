"""The run folder: the contract between the engine, the app and users' own scripts (DESIGN.md).

    runs/<run_name>/
      config.json  prompt_set.json  env.json  command.txt  status.json  events.jsonl  metrics.csv
      health.csv  gpu_mem.csv  control.jsonl  checkpoints/iter_<N>/  checkpoints/latest.json
      samples/teacher/  samples/iter_<N>/  export/  logs/engine.log  engine.lock (RunLock: one writer)

Torch-free and fast to import: the app imports it. Whole-file writes are atomic (temp file in the
same folder, fsync, os.replace), so a kill at any moment leaves the old or the new file. Append-only
files (events.jsonl, metrics.csv, health.csv, control.jsonl) are written one line per write(); their readers
tolerate a torn last line.
"""
from __future__ import annotations

import csv
import errno
import io
import json
import os
import re
import shlex
import shutil
import socket
import stat
import threading
import time
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any, Iterable, Optional, Union

from dmad.contract.diskspace import is_disk_full
from dmad.errors import UserInputError
from dmad.contract.events import MAX_ITER, parse_line
from dmad.contract.jsonfile import printable, read_json_or_problem
from dmad.contract.regular import fopen_regular, irregular, kind_of, open_regular, read_regular
# The log writers/readers live in dmad.contract.runlog and are re-exported: the app imports dmad.contract.runs.
from dmad.contract.runlog import (CONTROL_COMMANDS, HEALTH_COLUMNS, ControlReader, CsvAppender,  # noqa: F401
                                 _complete_text, _to_int, _write_all, append_control, read_health, read_metrics)

PathLike = Union[str, "os.PathLike[str]"]
STATES = ("created", "running", "paused", "stopping", "stopped", "finished", "failed")
LIVE_STATES = ("running", "paused", "stopping")  # a process should be behind these
TMP_PREFIX = ".tmp-"
SAMPLES_META = "meta.json"  # samples/<folder>/meta.json: every image's provenance, written after the images
_ITER_DIR = re.compile(r"^iter_([0-9]{1,12})$")  # ASCII digits: \d also takes "²"


# ---------------------------------------------------------------- atomic writes

def atomic_write_bytes(path: PathLike, data: bytes, durable: bool = True) -> None:
    """Replace `path` with `data`; readers see the old or the new content, never a mix.

    durable=False skips the fsyncs (still atomic for other processes, but a power cut may lose the
    write): for the few-second heartbeat, whose fsync could stall training behind a checkpoint."""
    path = Path(path)
    tmp = path.parent / f"{TMP_PREFIX}{path.name}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    # os.open (not mkstemp) so the file gets the umask's mode, not 0600: users' scripts read it.
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
    try:
        try:
            _write_all(fd, data)
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        _replace(tmp, path)
    except BaseException:
        _unlink_quietly(tmp)
        raise
    if durable:
        fsync_dir(path.parent)


def atomic_write_text(path: PathLike, text: str, durable: bool = True) -> None:
    atomic_write_bytes(path, text.encode("utf-8"), durable=durable)


def atomic_write_json(path: PathLike, obj: Any, durable: bool = True) -> None:
    # allow_nan=False: NaN is not JSON and would break users' strict parsers; callers pass None.
    atomic_write_text(path, json.dumps(obj, indent=2, ensure_ascii=False, allow_nan=False) + "\n",
                      durable=durable)


def fsync_dir(path: PathLike) -> None:
    """Makes a rename in `path` durable. Windows cannot open folders: renames there are journalled."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _replace(src: Path, dst: Path) -> None:
    # On Windows a reader holding dst open (the app polling status.json) makes the rename fail
    # for a few milliseconds; POSIX renames never wait, so a PermissionError there is real.
    tries = 20 if os.name == "nt" else 1
    for attempt in range(tries):
        try:
            os.replace(src, dst)
            return
        except PermissionError:
            if attempt == tries - 1:
                raise
            time.sleep(0.01)


def _unlink_quietly(path: Path) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _fsync_tree(root: Path) -> None:
    """fsync every file and folder under root: a checkpoint must be on disk before it is renamed."""
    flags = os.O_RDWR if os.name == "nt" else os.O_RDONLY  # Windows cannot fsync read-only fds
    for folder, _, files in os.walk(root):
        for name in files:
            fd = os.open(os.path.join(folder, name), flags)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(folder)


# ---------------------------------------------------------------- names and states

def _safe(piece: str) -> str:
    return re.sub(r"[^A-Za-z0-9._+-]", "-", piece)


def default_run_name(dataset_id: str, prompt_set_name: str, prompt_set_version: str,
                     now: Optional[datetime] = None) -> str:
    """dmad_<YYYYMMDD-HHMM>_<dataset id>_<prompt set name>-<version>, in local time."""
    stamp = (now or datetime.now()).strftime("%Y%m%d-%H%M")
    return f"dmad_{stamp}_{_safe(dataset_id)}_{_safe(prompt_set_name)}-{_safe(prompt_set_version)}"


PID_MAX = 2**31 - 1  # pid_t is a 32-bit int everywhere: a larger "pid" names no process (os.kill would overflow)


def pid_alive(pid: int) -> bool:
    if isinstance(pid, bool) or not isinstance(pid, int) or not 0 < pid <= PID_MAX:
        return False
    if os.name == "nt":  # os.kill(pid, 0) would *terminate* the process on Windows
        return _pid_alive_windows(pid)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    except OSError:
        return False
    return not _zombie(pid)


def _zombie(pid: int) -> bool:
    """Linux: the process has ended and waits for its parent to collect it (a killed rank whose
    launcher died with it waits for init, which may take a while): as dead as a gone one."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read(4096)
    except OSError:  # no /proc (macOS), or gone meanwhile
        return False
    return stat.rsplit(b")", 1)[-1].split()[:1] in ([b"Z"], [b"X"])


def _pid_alive_windows(pid: int) -> bool:
    import ctypes  # only here: keeps the POSIX import cheap
    kernel32 = ctypes.windll.kernel32  # type: ignore[attr-defined]
    handle = kernel32.OpenProcess(0x1000, False, pid)  # PROCESS_QUERY_LIMITED_INFORMATION
    if not handle:
        return ctypes.get_last_error() == 5  # ERROR_ACCESS_DENIED: exists, not ours
    code = ctypes.c_ulong()
    try:
        ok = kernel32.GetExitCodeProcess(handle, ctypes.byref(code))
        return bool(ok) and code.value == 259  # STILL_ACTIVE
    finally:
        kernel32.CloseHandle(handle)


def effective_state(status: Optional[dict], now: Optional[float] = None,
                    stale_after_s: float = 60.0) -> str:
    """The state a reader should believe: a live state whose process died (killed, power cut,
    OOM killer) never wrote "failed" itself, so a dead pid or a stale heartbeat means failed."""
    if not status:
        return "created"
    status, _ = check_status(status)
    state = status.get("state", "created")
    if state not in LIVE_STATES:
        return state
    pid, beat = status.get("pid"), status.get("heartbeat")
    # A pid means nothing on another machine (a run folder on a shared drive): trust the heartbeat.
    same_host = status.get("host") in (None, socket.gethostname())
    if same_host and isinstance(pid, int) and not pid_alive(pid):
        return "failed"
    now = time.time() if now is None else now
    if isinstance(beat, (int, float)) and now - beat > stale_after_s:
        return "failed"
    return state


_WHOLE = (0, MAX_ITER)


def _is_whole(x: Any, low: int, high: int) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and low <= x <= high


def _is_time(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and x == x and abs(x) < 1e12


# status.json's fields as the engine writes them: what each must be to be believed. A field that is
# not (a hand edit, a broken disk, a hostile file) is dropped by check_status, never passed on to
# os.kill, int() or a comparison; fields not named here are kept as they are (a newer engine's).
_STATUS_FIELDS = {
    "state": (lambda v: isinstance(v, str) and v in STATES, "one of " + ", ".join(STATES)),
    "pid": (lambda v: _is_whole(v, 1, PID_MAX), f"a process id from 1 to {PID_MAX}"),
    "host": (lambda v: isinstance(v, str), "text"),
    "heartbeat": (_is_time, "a unix time"),
    "updated": (lambda v: isinstance(v, str), "text"),
    "iter": (lambda v: _is_whole(v, *_WHOLE), "a whole number >= 0"),
    "last_checkpoint": (lambda v: _is_whole(v, *_WHOLE), "a whole number >= 0"),
    "max_train_steps": (lambda v: _is_whole(v, *_WHOLE), "a whole number >= 0"),
    "control_offset": (lambda v: _is_whole(v, *_WHOLE), "a whole number >= 0"),
    "exit_code": (lambda v: _is_whole(v, -255, 255), "an exit code"),
    "failure_reason": (lambda v: isinstance(v, str), "text"),
    "advice": (lambda v: isinstance(v, str), "text"),
}


def check_status(status: dict) -> tuple[dict, str]:
    """(status without the fields that are not what the engine writes, one line naming the first
    such field or ""): a pid of 2**31, a state that is an object, a heartbeat of "x" are dropped,
    so every reader can use what is left without checking types again."""
    bad = [k for k, (ok, _) in _STATUS_FIELDS.items() if k in status and not ok(status[k])]
    if not bad:
        return status, ""
    k = bad[0]
    shown = printable(json.dumps(status[k], default=str)[:60])
    more = f" (and {len(bad) - 1} more bad field{'s' if len(bad) > 2 else ''})" if len(bad) > 1 else ""
    return ({f: v for f, v in status.items() if f not in bad},
            f"status.json: {k} {shown} is not {_STATUS_FIELDS[k][1]}{more}")


# ---------------------------------------------------------------- the run folder

def _child(*parts: str) -> property:
    return property(lambda self: self.path.joinpath(*parts), doc="/".join(parts))


class RunFolder:
    """Paths and the few operations that must be done the same way by every writer."""

    config_json = _child("config.json")
    prompt_set_json = _child("prompt_set.json")
    env_json = _child("env.json")
    command_txt = _child("command.txt")
    status_json = _child("status.json")
    events_jsonl = _child("events.jsonl")
    metrics_csv = _child("metrics.csv")
    health_csv = _child("health.csv")
    gpu_mem_csv = _child("gpu_mem.csv")
    control_jsonl = _child("control.jsonl")
    checkpoints_dir = _child("checkpoints")
    latest_json = _child("checkpoints", "latest.json")
    samples_dir = _child("samples")
    export_dir = _child("export")
    logs_dir = _child("logs")
    engine_log = _child("logs", "engine.log")

    is_writer = True  # a non-main rank's view (dmad.train.ranks.ReadOnlyFolder) is not

    def __init__(self, path: PathLike):
        self.path = Path(path)
        self._status: Optional[dict] = None  # last status written by this process
        self._status_lock = threading.Lock()  # the heartbeat may run on another thread

    def __repr__(self) -> str:
        return f"RunFolder({str(self.path)!r})"

    @property
    def name(self) -> str:
        return self.path.name

    @classmethod
    def create(cls, path: PathLike) -> "RunFolder":
        path = Path(path)
        if not cls(path).has_no_run():
            raise UserInputError(f"run folder already exists: {path} (use --resume latest to continue "
                                 f"it, or choose another --run-dir / run_name)")
        run = cls(path)
        for folder in (run.checkpoints_dir, run.samples_dir / "teacher", run.export_dir, run.logs_dir):
            folder.mkdir(parents=True, exist_ok=True)
        return run

    @classmethod
    def open(cls, path: PathLike) -> "RunFolder":
        run = cls(path)
        if not run.path.is_dir():
            raise UserInputError(f"run folder not found: {run.path}")
        not_regular = irregular(run.config_json)
        if not_regular:
            raise UserInputError(f"run folder {run.path}: {not_regular}")
        if not run.config_json.is_file():
            raise UserInputError(f"not a run folder (no config.json): {run.path}")
        return run

    def write_json(self, name: str, obj: Any) -> Path:
        target = self.path / name
        atomic_write_json(target, obj)
        return target

    def read_json(self, name: str) -> Any:
        """Raises FileNotFoundError / ValueError (bad JSON, or nested too deeply): the caller knows which
        file is optional."""
        with fopen_regular(self.path / name, "r", encoding="utf-8") as f:
            try:
                return json.load(f)
            except RecursionError:
                raise ValueError(f"{self.path / name}: nested too deeply") from None

    def write_command(self, argv: list[str]) -> None:
        # shlex.join quotes for POSIX shells; the line can be pasted into a terminal as is.
        atomic_write_text(self.command_txt, shlex.join(argv) + "\n")

    # -------------------------------------------------------- status

    def write_status(self, state: str, **fields: Any) -> dict:
        """Merge `fields` over the previous status (last checkpoint, failure reason persist);
        a field given as None is removed (e.g. the failure reason when a failed run resumes)."""
        if state not in STATES:
            raise ValueError(f"unknown run state {state!r}; known: {', '.join(STATES)}")
        with self._status_lock:
            status = dict(self._status if self._status is not None else (self.read_status() or {}))
            status.update(fields)
            status = {k: v for k, v in status.items() if v is not None}
            self._stamp(status, state)
            atomic_write_json(self.status_json, status)
            self._status = status
        return status

    def update_status(self, **fields: Any) -> None:
        """Add fields to status.json without changing its state."""
        with self._status_lock:
            state = (self._status if self._status is not None else (self.read_status() or {})).get("state", "created")
        self.write_status(state if state in STATES else "created", **fields)

    def note(self, **fields: Any) -> None:
        """Fields the next heartbeat writes (the current iteration), with no write of its own."""
        with self._status_lock:
            if self._status is not None:
                self._status.update(fields)

    def heartbeat(self) -> None:
        """Every few seconds: no fsync (see atomic_write_bytes), no read of the file."""
        with self._status_lock:
            status = dict(self._status if self._status is not None else (self.read_status() or {}))
            self._stamp(status, status.get("state", "running"))
            atomic_write_json(self.status_json, status, durable=False)
            self._status = status

    @staticmethod
    def _stamp(status: dict, state: str) -> None:
        status.update(state=state, pid=os.getpid(), host=socket.gethostname(),
                      heartbeat=round(time.time(), 3),
                      updated=datetime.now().astimezone().isoformat(timespec="seconds"))

    def read_status(self) -> Optional[dict]:
        """status.json as a dict; None when it is missing or not one the engine wrote (unreadable,
        a FIFO or a folder, not a JSON object, too deep, or over jsonfile.RUN_FILE_MAX_BYTES, so a
        planted giant does not stall a reader). Fields of the wrong type or range are left out
        (check_status)."""
        return self.read_status_or_problem()[0]

    def read_status_or_problem(self) -> tuple[Optional[dict], str]:
        """(read_status(), one line saying what was wrong with status.json or ""): a missing file
        is (None, ""), an unreadable one (None, why), a bad field (the rest, why)."""
        if not self.status_json.exists() and not self.status_json.is_symlink():
            return None, ""
        status, problem = read_json_or_problem(self.status_json)
        if problem:
            return None, problem
        if not isinstance(status, dict):
            return None, "status.json is not a JSON object"
        return check_status(status)

    # -------------------------------------------------------- checkpoints

    def checkpoint_path(self, iter: int) -> Path:
        return self.checkpoints_dir / f"iter_{iter}"

    def begin_checkpoint(self, iter: int) -> Path:
        """A fresh folder to save into; it becomes iter_<N> only in commit_checkpoint."""
        tmp = self.checkpoints_dir / f"{TMP_PREFIX}iter_{iter}-{os.getpid()}"
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
        return tmp

    def commit_checkpoint(self, iter: int, tmp_dir: PathLike, limit: Optional[int] = None,
                          protect: Optional[int] = None) -> Path:
        """Publish tmp_dir as iter_<N>, point latest.json at it, keep the newest `limit` checkpoints;
        checkpoint `protect` (the last healthy one, observation.health.stop_on_alert) is never removed."""
        if limit is not None and limit < 1:
            raise ValueError(f"checkpoint limit must be >= 1 or None (keep all), got {limit}")
        tmp_dir, final = Path(tmp_dir), self.checkpoint_path(iter)
        _fsync_tree(tmp_dir)
        # A folder cannot be renamed over a non-empty one: move the old copy aside first. A kill in
        # between leaves it under .tmp-old-*, which clean_temp() puts back.
        aside = self.checkpoints_dir / f"{TMP_PREFIX}old-iter_{iter}-{os.getpid()}"
        if final.exists():
            if aside.exists():
                shutil.rmtree(aside)
            os.replace(final, aside)
        os.replace(tmp_dir, final)
        fsync_dir(self.checkpoints_dir)
        if aside.exists():
            shutil.rmtree(aside)
        atomic_write_json(self.latest_json, {"iter": iter, "path": final.name})
        if limit is not None:
            self._rotate(keep_iter=iter, limit=limit, protect=protect)
        return final

    def _rotate(self, keep_iter: int, limit: int, protect: Optional[int] = None) -> None:
        found = self.list_checkpoints()
        others = [(i, p) for i, p in found if i not in (keep_iter, protect)]
        for i, p in others[:max(0, len(found) - limit)]:
            # Rename first so a kill half-way through rmtree never leaves a "complete" partial one.
            doomed = self.checkpoints_dir / f"{TMP_PREFIX}del-{p.name}-{os.getpid()}"
            os.replace(p, doomed)
            shutil.rmtree(doomed, ignore_errors=True)

    def list_checkpoints(self) -> list[tuple[int, Path]]:
        """Complete checkpoints, oldest first (temp folders are invisible)."""
        try:
            entries = list(self.checkpoints_dir.iterdir())
        except FileNotFoundError:
            return []
        found = [(int(m.group(1)), p) for p in entries
                 if (m := _ITER_DIR.match(p.name)) and p.is_dir() and self.inside(p)]
        return sorted(found)

    def latest_checkpoint(self) -> Optional[tuple[int, Path]]:
        try:
            latest = json.loads(read_regular(self.latest_json, 4096).decode("utf-8"))
            it = latest["iter"]
            name = latest.get("path") or f"iter_{it}"
            # A plain iter_<N> name in checkpoints/ only: a path into another run would resume from
            # that run's weights and then overwrite this run's checkpoints.
            if isinstance(it, int) and not isinstance(it, bool) and name == f"iter_{it}":
                path = self.checkpoints_dir / name
                if path.is_dir() and self.inside(path):
                    return it, path
        except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError):
            pass  # absent or unreadable: fall back to what is on disk
        found = self.list_checkpoints()
        return found[-1] if found else None

    def checkpoints_from_latest(self) -> list[tuple[int, Path]]:
        """The one rule for "latest", shared by resume, sample, export and the app: the checkpoint
        latest.json names (else the newest on disk), then the older ones, newest first, for a
        caller to fall back to when one proves damaged. A checkpoint newer than latest belongs to
        a branch the run left (it resumed from an older checkpoint and went on from there): it is
        never latest and never a fallback."""
        latest = self.latest_checkpoint()
        if latest is None:
            return []
        return [latest] + [c for c in reversed(self.list_checkpoints()) if c[0] < latest[0]]

    def inside(self, path: PathLike) -> bool:
        """Whether `path`, symbolic links followed, is inside this run folder."""
        try:
            return Path(path).resolve().is_relative_to(self.path.resolve())
        except (OSError, RuntimeError, ValueError):  # a link loop, a NUL byte
            return False

    def irregular_files(self) -> list[str]:
        """One line for each of the run's files (RUN_FILES) that exists and is not a regular file (a
        FIFO, a socket, a device, a folder): opening a FIFO would wait forever, the others fail
        mid-run. A stat each, nothing opened."""
        found = []
        for name in RUN_FILES:
            try:
                mode = os.stat(self.path / name).st_mode
            except OSError:
                continue
            if not stat.S_ISREG(mode):
                found.append(f"{printable(name)} is {kind_of(mode)}, not a regular file")
        return found

    def check_confined(self) -> None:
        """The engine writes only inside its run folder: refuses a symbolic link that leaves it
        where the engine would write (a top-level file or folder, or an entry of checkpoints/,
        samples/, logs/, export/), e.g. logs/engine.log linked to a file elsewhere."""
        places = list(_entries(self.path))
        for sub in (self.checkpoints_dir, self.samples_dir, self.logs_dir, self.export_dir):
            if sub.is_dir() and self.inside(sub):
                places += _entries(sub)
        for p in places:
            if p.is_symlink() and not self.inside(p):
                raise UserInputError(f"{p} is a symbolic link to {os.path.realpath(p)}, outside the run folder "
                                     f"{self.path}: the engine writes only inside its run folder (replace the link "
                                     f"with a real file or folder)")

    def has_no_run(self) -> bool:
        """True for a folder a run may be created in: absent, empty, or only what an engine that
        stopped before writing config.json leaves (empty sub-folders, status, events, logs)."""
        if not self.path.exists():
            return True
        if not self.path.is_dir() or self.config_json.exists() or self.list_checkpoints():
            return False
        return all(p.name in _SKELETON for p in _entries(self.path))

    def clean_temp(self) -> None:
        """Remove what a killed save left behind; put back a checkpoint caught mid-replacement."""
        if not self.checkpoints_dir.is_dir():
            return
        for p in self.checkpoints_dir.iterdir():
            if not p.name.startswith(TMP_PREFIX):
                continue
            m = re.match(rf"^{re.escape(TMP_PREFIX)}old-(iter_\d+)-\d+$", p.name)
            if m and p.is_dir() and not (self.checkpoints_dir / m.group(1)).exists():
                os.replace(p, self.checkpoints_dir / m.group(1))
            elif p.is_dir():
                shutil.rmtree(p, ignore_errors=True)
            else:
                _unlink_quietly(p)

    # -------------------------------------------------------- resume

    def truncate_after(self, iter: int, events_from: Optional[int] = None) -> None:
        """Forget what happened after checkpoint `iter` (metrics.csv and health.csv rows, events), so a
        resumed run's curves do not double back.
        gpu_mem.csv is time-based and stays whole. `events_from`: the byte offset in events.jsonl
        where the resuming engine's own events begin; those are kept as they are."""
        for csv_file in (self.metrics_csv, self.health_csv):
            if csv_file.exists():
                text = _complete_text(read_regular(csv_file))
                atomic_write_text(csv_file, _metrics_upto(text, iter, csv_file))
        if self.events_jsonl.exists():
            data = read_regular(self.events_jsonl)
            cut = len(data) if events_from is None else events_from
            lines = _complete_text(data[:cut]).splitlines(keepends=True)
            own = data[cut:].decode("utf-8", errors="replace") if events_from is not None else ""
            atomic_write_text(self.events_jsonl, "".join(_events_upto(lines, iter)) + own)


def _metrics_upto(text: str, iter: int, path: Path) -> str:
    rows = list(csv.reader(io.StringIO(text)))
    if not rows:
        return ""
    if "iter" not in rows[0]:
        raise ValueError(f"{path} has no 'iter' column (columns: {', '.join(rows[0])})")
    col = rows[0].index("iter")
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(rows[0])
    writer.writerows(r for r in rows[1:] if (i := _to_int(r[col] if col < len(r) else "")) is not None
                     and i <= iter)
    return out.getvalue()


def _events_upto(lines: Iterable[str], iter: int) -> Iterable[str]:
    """Events with iter <= N, and iter-less events (started, warnings) logged before the first
    event past N; iter-less events after that belong to the abandoned stretch. An `error` event
    ended an earlier engine that the run has now continued past: it goes too (engine.log keeps it)."""
    past = False
    for line in lines:
        ev = parse_line(line)
        if ev is None or ev.kind == "error":
            continue
        if ev.iter is not None and ev.iter > iter:
            past = True
        elif ev.iter is not None or not past:
            yield line




# The files of a run folder that engines and the app open (checkpoints/iter_<N>/ files are the
# checkpoint's: a damaged one is passed over, dmad.train.preflight.find_resume_target).
RUN_FILES = ("config.json", "prompt_set.json", "env.json", "command.txt", "status.json", "events.jsonl", "metrics.csv",
             "health.csv", "gpu_mem.csv", "control.jsonl", "engine.lock", "checkpoints/latest.json", "logs/engine.log")
_SKELETON = {"checkpoints", "samples", "export", "logs", "status.json", "events.jsonl", "control.jsonl",
             "gpu_mem.csv", "metrics.csv", "command.txt", "env.json", "engine.lock"}


def _entries(folder: Path) -> list[Path]:
    try:
        return list(folder.iterdir())
    except OSError:
        return []


# ---------------------------------------------------------------- one writer

LOCK_NAME = "engine.lock"


class RunLock:
    """One engine writes a run folder at a time: an exclusive lock on <run>/engine.lock (flock on
    POSIX, a byte-range lock on Windows), held from before the engine touches anything until its
    last status write. The operating system drops it when the process dies, however it dies, so a
    killed engine's lock is taken over by the next one with nothing to clean up. The file holds the
    holder's pid and host, for the error message only; it is never deleted (deleting a lock file
    races with a process that has just opened it). On a filesystem without locks the live pid and
    heartbeat in status.json decide (effective_state)."""

    def __init__(self, run_dir: PathLike):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOCK_NAME
        self._fd: Optional[int] = None

    def acquire(self) -> "RunLock":
        flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0)
        try:
            fd = open_regular(self.path, flags)
        except OSError as e:
            if is_disk_full(e):
                raise  # the engine's own line for a full disk (dmad.train.run_open)
            raise UserInputError(f"run folder {self.run_dir}: cannot open {LOCK_NAME}: {e.strerror or e}") from None
        try:
            if not _lock_fd(fd):
                raise RunInUse(self.run_dir, _read_holder(self.path))
            os.ftruncate(fd, 0)
            holder = {"pid": os.getpid(), "host": socket.gethostname(), "started": round(time.time(), 3)}
            _write_all(fd, (json.dumps(holder) + "\n").encode("utf-8"))
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        return self

    def rewrite(self, data: bytes) -> None:
        """Put back the lock file's earlier content through the held descriptor (a refused start
        leaves the folder as it found it, dmad.train.folder_undo), keeping the lock."""
        if self._fd is not None:
            os.ftruncate(self._fd, 0)
            os.lseek(self._fd, 0, os.SEEK_SET)
            _write_all(self._fd, data)

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing drops the lock
            self._fd = None


class RunInUse(UserInputError):
    def __init__(self, run_dir: Path, holder: dict):
        pid = holder.get("pid", "?")
        since = holder.get("started")
        when = f", running since {datetime.fromtimestamp(since).strftime('%Y-%m-%d %H:%M')}" if isinstance(
            since, (int, float)) else ""
        host = f" on {holder['host']}" if holder.get("host") not in (None, socket.gethostname()) else ""
        super().__init__(f"run folder {run_dir} is in use by engine pid {pid}{host}{when}: one engine writes a run "
                         f"folder at a time (stop that one first, or choose another --run-dir)")


def _lock_fd(fd: int) -> bool:
    """Try to take the lock on an open fd: True when taken, False when another process holds it."""
    try:
        if os.name == "nt":
            import msvcrt

            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
        else:
            import fcntl

            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except (BlockingIOError, PermissionError):
        return False
    except OSError as e:
        if e.errno in (errno.EACCES, errno.EAGAIN):
            return False
        return True  # no locks on this filesystem (ENOLCK, EOPNOTSUPP): the status check decides


def _read_holder(path: Path) -> dict:
    try:
        d = json.loads(read_regular(path, 4096).decode("utf-8", "replace") or "{}")
    except (OSError, ValueError, RecursionError):
        return {}
    return d if isinstance(d, dict) else {}


def check_not_in_use(run_dir: PathLike) -> None:
    """Refuses (RunInUse, exit 2) a run folder another engine is writing: its lock is held, or (a
    filesystem without locks, an older engine) status.json names a live engine. Creates nothing."""
    run = RunFolder(run_dir)
    lock = RunLock(run_dir)
    if lock.path.is_file() and not lock.path.is_symlink():
        try:
            fd = open_regular(lock.path, os.O_RDWR)
        except OSError:
            fd = None
        if fd is not None:
            try:
                if not _lock_fd(fd):
                    raise RunInUse(run.path, _read_holder(lock.path))
            finally:
                os.close(fd)  # closing drops the lock this check may have taken
    status = run.read_status()  # pid, host and state checked (check_status)
    if status and status.get("pid") != os.getpid() and effective_state(status) in LIVE_STATES:
        raise RunInUse(run.path, {"pid": status.get("pid"), "host": status.get("host")})


def list_runs(root: PathLike) -> list[RunFolder]:
    """Run folders under root, newest first (by when config.json was written; status.json else)."""
    try:
        children = [p for p in Path(root).iterdir() if p.is_dir()]
    except FileNotFoundError:
        return []
    runs = []
    for p in children:
        run = RunFolder(p)
        # exists(), not is_file(): a FIFO or a folder as config.json is still a run, whose row says so
        marker = run.config_json if run.config_json.exists() else run.status_json
        try:
            runs.append((marker.stat().st_mtime, p.name, run))
        except OSError:
            continue
    runs.sort(key=lambda t: (t[0], t[1]), reverse=True)
    return [run for _, _, run in runs]

