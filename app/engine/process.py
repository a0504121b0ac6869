"""The bridge to the engine: `dmad train` in a QProcess, its stdout parsed as events.

The app never imports the training code; it starts the `dmad` command line (what a user types in a
terminal) and reads what it prints. Stdout carries only events (one JSON object per line, DESIGN.md);
stderr carries log lines and, on a clean failure, one "dmad: error: ..." line. Pipes deliver bytes
in arbitrary chunks, so lines are reassembled before parsing. Commands go the other way through
<run>/control.jsonl, which the engine polls at every iteration boundary.

Exit codes (dmad/errors.py): 0 done or stopped, 1 the run failed (an error event says why),
2 invalid input (the stderr line says what and where), 3 out of memory, 130 interrupted.
"""
from __future__ import annotations

import os
import re
import sys
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from PySide6.QtCore import QCoreApplication, QObject, QProcess, QProcessEnvironment, Signal

from dmad.contract.events import Event, parse_line
from dmad.contract.runlog import append_control

EXIT_MEANINGS = {0: "success", 1: "the run failed", 2: "invalid input", 3: "out of memory",
                 130: "interrupted", -1: "the engine crashed or was killed"}
LOG_KEEP = 200  # stderr lines kept for the failure banner


def engine_command() -> list[str]:
    """The engine's command line prefix. A PyInstaller build is one executable that answers the
    `dmad` command line itself (dmad/cli.py writes the same prefix into command.txt)."""
    if getattr(sys, "frozen", False):
        return [sys.executable]
    return [sys.executable, "-m", "dmad"]


@dataclass(frozen=True)
class LaunchMachines:
    """A run over several machines: this machine's rank and where machine 0 listens."""
    count: int = 1
    rank: int = 0
    main_ip: str = ""
    port: int = 29500


PROGRESS = re.compile(r"^progress (\d+) (\d+)\s*$")  # `dmad check-data/probe/cache --progress` on stderr


def progress_of(line: str) -> Optional[tuple[int, int]]:
    """(done, total) of a `progress <done> <total>` stderr line, else None."""
    m = PROGRESS.match(line)
    return (int(m.group(1)), int(m.group(2))) if m else None


def keep_error_line(previous: str, line: str) -> str:
    """The stderr line to show when a `dmad` command fails: the engine's own one-line error
    (`dmad: ...`) wins over library chatter after it; otherwise the latest non-empty line."""
    if line.startswith("dmad: ") or (line.strip() and not previous.startswith("dmad: ")):
        return line.strip()
    return previous


def exit_meaning(code: int) -> str:
    return EXIT_MEANINGS.get(code, f"exit code {code}")


def event_dict(ev: Event) -> dict:
    return {"v": ev.v, "t": ev.t, "kind": ev.kind, "iter": ev.iter, "data": ev.data}


def engine_environment() -> QProcessEnvironment:
    """The app's environment, plus the folder that holds the `dmad` package on PYTHONPATH (a source
    checkout run as `python -m app.main` from elsewhere must still find the engine)."""
    env = QProcessEnvironment.systemEnvironment()
    if not getattr(sys, "frozen", False):
        import dmad

        root = str(Path(dmad.__file__).resolve().parent.parent)
        old = env.value("PYTHONPATH", "")
        env.insert("PYTHONPATH", root + (os.pathsep + old if old else ""))
    env.insert("PYTHONIOENCODING", "utf-8")
    env.insert("PYTHONUNBUFFERED", "1")
    return env


def engine_qprocess(parent: QObject, cmd: list[str]) -> QProcess:
    """A QProcess (not started) for one `dmad` command line, in the engine's environment."""
    proc = QProcess(parent)
    proc.setProgram(cmd[0])
    proc.setArguments(cmd[1:])
    proc.setProcessEnvironment(engine_environment())
    return proc


class LineBuffer:
    """Reassembles lines from pipe chunks. Splits on bytes before decoding, so a multi-byte UTF-8
    character cut between two chunks is decoded whole."""

    def __init__(self):
        self._rest = b""

    def feed(self, chunk: bytes) -> list[str]:
        data = self._rest + chunk
        cut = data.rfind(b"\n") + 1
        self._rest = data[cut:]
        return [line.decode("utf-8", "replace").rstrip("\r") for line in data[:cut].split(b"\n")[:-1]]

    def flush(self) -> list[str]:
        rest, self._rest = self._rest, b""
        return [rest.decode("utf-8", "replace").rstrip("\r")] if rest else []


class EngineProcess(QObject):
    """One `dmad train` (or `--dry-run`) at a time. `command` replaces engine_command() (tests run
    a small script that behaves like the engine)."""

    event_received = Signal(dict)  # {"v","t","kind","iter","data"}, one per stdout event line
    log_received = Signal(str)  # stderr lines, and stdout lines that are not events
    run_dir_found = Signal(object)  # Path: from --run-dir, else the "started" event
    finished = Signal(int, str)  # exit code (-1: crashed / could not start), one-line summary
    dry_run_finished = Signal(int, str)  # exit code, the report (or the error line)

    def __init__(self, parent: Optional[QObject] = None, command: Optional[Sequence[str]] = None):
        super().__init__(parent)
        self._command = list(command) if command is not None else engine_command()
        self._proc: Optional[QProcess] = None
        self._mode = "train"
        self._run_dir: Optional[Path] = None
        self._out, self._err = LineBuffer(), LineBuffer()
        self._stdout_text: list[str] = []  # dry run: the report
        self._log: deque[str] = deque(maxlen=LOG_KEEP)
        self._error_line = ""  # the last "dmad: error: ..." / "dmad: internal error: ..." line
        self._error_event: Optional[dict] = None
        self._final_event: Optional[dict] = None  # the last stopped / finished event

    # ------------------------------------------------------------ starting

    def start_train(self, config_path: Path, run_dir: Optional[Path] = None, resume: Optional[str] = None,
                    overrides: Sequence[str] = (), num_processes: int = 1,
                    machines: Optional["LaunchMachines"] = None) -> None:
        """`num_processes` > 1 (processes in all): the engine starts `accelerate launch` with that
        many processes (one per GPU) and runs the same command on each (dmad.train.launch); `machines`
        when they span several machines."""
        args = ["train", "--config", str(config_path)]
        if num_processes > 1 or (machines and machines.count > 1):
            args += ["--num-processes", str(num_processes)]
        if machines and machines.count > 1:
            args += ["--num-machines", str(machines.count), "--machine-rank", str(machines.rank),
                     "--main-process-ip", machines.main_ip, "--main-process-port", str(machines.port)]
        if run_dir is not None:
            args += ["--run-dir", str(run_dir)]
        if resume is not None:
            args += ["--resume", str(resume)]
        for item in overrides:
            args += ["--set", item]
        self._start(args, "train", Path(run_dir).resolve() if run_dir is not None else None)

    def start_dry_run(self, config_path: Path, overrides: Sequence[str] = ()) -> None:
        args = ["train", "--config", str(config_path), "--dry-run"]
        for item in overrides:
            args += ["--set", item]
        self._start(args, "dry", None)

    def _start(self, args: list[str], mode: str, run_dir: Optional[Path]) -> None:
        if self.is_running():
            raise RuntimeError("the engine is already running; stop it first")
        self._reset(mode)
        proc = QProcess(self)
        proc.setProgram(self._command[0])
        proc.setArguments(self._command[1:] + args)
        proc.setProcessEnvironment(engine_environment())
        _own_session(proc)
        proc.readyReadStandardOutput.connect(self._read_stdout)
        proc.readyReadStandardError.connect(self._read_stderr)
        proc.finished.connect(self._on_finished)
        proc.errorOccurred.connect(self._on_error)
        self._proc = proc
        if run_dir is not None:
            self._set_run_dir(run_dir)
        proc.start()

    def _reset(self, mode: str) -> None:
        if self._proc is not None:
            self._proc.deleteLater()
        self._proc, self._mode, self._run_dir = None, mode, None
        self._out, self._err = LineBuffer(), LineBuffer()
        self._stdout_text, self._error_line = [], ""
        self._log.clear()
        self._error_event = self._final_event = None

    # ------------------------------------------------------------ queries and commands

    def is_running(self) -> bool:
        return self._proc is not None and self._proc.state() != QProcess.ProcessState.NotRunning

    def run_dir(self) -> Optional[Path]:
        return self._run_dir

    def process_id(self) -> Optional[int]:
        return int(self._proc.processId()) if self.is_running() else None

    def last_log_lines(self, n: int = 10) -> list[str]:
        return list(self._log)[-n:]

    def send_control(self, cmd: str) -> bool:
        """Append a command to <run>/control.jsonl; False when there is no run folder yet or it
        cannot be written (the reason goes to log_received)."""
        if self._run_dir is None:
            return False
        try:
            append_control(self._run_dir, cmd)
        except OSError as e:
            self.log_received.emit(f"could not write {self._run_dir / 'control.jsonl'}: {e}")
            return False
        return True

    def terminate_gracefully(self) -> None:
        """Stop with a checkpoint: control "stop" once the run folder exists; before that, SIGTERM
        (the engine's handler also stops at the next iteration boundary and checkpoints)."""
        if not self.is_running():
            return
        if not self.send_control("stop"):
            self._proc.terminate()

    def detach(self) -> None:
        """Leave the engine running after this app exits (the user chose "leave it running").
        QProcess kills its child when destroyed; parented to the main thread object, which Qt never
        deletes before exit, it is never destroyed. Its read channels are closed: Qt drains and
        discards what the engine still prints (a full pipe would block it; buffering it would grow
        without bound). When the app exits the pipes close; the engine tolerates that (EventWriter
        stops echoing to stdout) and keeps writing events.jsonl."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        for sig in (proc.readyReadStandardOutput, proc.readyReadStandardError, proc.finished, proc.errorOccurred):
            sig.disconnect()
        proc.closeReadChannel(QProcess.ProcessChannel.StandardOutput)
        proc.closeReadChannel(QProcess.ProcessChannel.StandardError)
        app = QCoreApplication.instance()
        proc.setParent(app.thread() if app is not None else None)

    # ------------------------------------------------------------ output

    def _read_stdout(self) -> None:
        if self._proc is not None:
            for line in self._out.feed(bytes(self._proc.readAllStandardOutput())):
                self._stdout_line(line)

    def _read_stderr(self) -> None:
        if self._proc is not None:
            for line in self._err.feed(bytes(self._proc.readAllStandardError())):
                self._stderr_line(line)

    def _stdout_line(self, line: str) -> None:
        if self._mode == "dry":
            self._stdout_text.append(line)
            return
        ev = parse_line(line)
        if ev is None:
            if line.strip():
                self.log_received.emit(line)
            return
        d = event_dict(ev)
        if ev.kind == "started" and self._run_dir is None and isinstance(ev.data.get("run_dir"), str):
            self._set_run_dir(Path(ev.data["run_dir"]))
        elif ev.kind == "error":
            self._error_event = d
        elif ev.kind in ("stopped", "finished"):
            self._final_event = d
        self.event_received.emit(d)

    def _stderr_line(self, line: str) -> None:
        if line.startswith("dmad: "):
            self._error_line = line
        self._log.append(line)
        self.log_received.emit(line)

    def _set_run_dir(self, path: Path) -> None:
        self._run_dir = path
        self.run_dir_found.emit(path)

    # ------------------------------------------------------------ the end

    def _on_error(self, error: QProcess.ProcessError) -> None:
        if error != QProcess.ProcessError.FailedToStart or self._proc is None:
            return  # a crash is followed by finished(), which reports it
        message = f"could not start the engine ({' '.join(self._command)}): {self._proc.errorString()}"
        self._emit_end(-1, message)

    def _on_finished(self, code: int, status: QProcess.ExitStatus) -> None:
        self._read_stdout()
        self._read_stderr()
        for line in self._out.flush():
            self._stdout_line(line)
        for line in self._err.flush():
            self._stderr_line(line)
        if status == QProcess.ExitStatus.CrashExit:
            code = -1
        self._emit_end(code, self._summary(code))

    def _emit_end(self, code: int, summary: str) -> None:
        if self._mode == "dry":
            text = "\n".join(self._stdout_text).strip() if code == 0 else (self._error_line or summary)
            self.dry_run_finished.emit(code, text)
        else:
            self.finished.emit(code, summary)

    def _summary(self, code: int) -> str:
        err = self._error_event["data"] if self._error_event else {}
        if code == 0:
            return _final_summary(self._final_event)
        if code == 2 and self._error_line:
            return self._error_line
        if err.get("reason"):
            return str(err["reason"])
        if self._error_line:
            return self._error_line
        tail = [line for line in self._log if line.strip()]
        return f"the engine exited with code {code} ({exit_meaning(code)})" + (f": {tail[-1]}" if tail else "")


def _final_summary(ev: Optional[dict]) -> str:
    if ev is None:
        return "the engine exited normally"
    if ev["kind"] == "stopped":
        ckpt = ev["data"].get("last_checkpoint")
        return f"stopped at iteration {ev['iter']}" + (f" (checkpoint iter_{ckpt})" if ckpt is not None else "")
    elapsed = ev["data"].get("elapsed_s")
    return f"finished {ev['iter']} iterations" + (f" in {elapsed:.0f} s" if isinstance(elapsed, (int, float)) else "")


CAUSES = {"out_of_memory": "out of memory", "non_finite_loss": "a loss became NaN or infinite",
          "exception": "unexpected error in the engine", "interrupted": "interrupted"}  # dmad/train/loop.py _fail


def failure_report(code: Optional[int], summary: str, error: dict, status: dict) -> tuple[str, list[str]]:
    """(title, detail lines) for a failed run, from the exit code, the engine's one-line summary,
    the error event's data (reason, cause, phase, advice, last_checkpoint) and status.json."""
    title = "Training failed" + (f" - exit code {code} ({exit_meaning(code)})" if code is not None else "")
    reason = error.get("reason") or summary or status.get("failure_reason")
    if not reason and status.get("pid") is not None:
        reason = f"the engine process (pid {status['pid']}) is gone and never recorded an end: it was killed or crashed"
    lines = [str(reason or "no reason recorded")]
    if error.get("cause"):
        where = f" during {error['phase']}" if error.get("phase") else ""
        lines.append(f"Cause: {CAUSES.get(error['cause'], str(error['cause']))}{where}")
    advice = error.get("advice") or status.get("advice")  # out of memory: what to change (issue 7)
    if advice:
        lines.append(f"Advice: {advice}")
    if error.get("last_checkpoint") is not None:
        lines.append(f"Last checkpoint: iter_{error['last_checkpoint']}")
    return title, lines


def phase_text(data: dict) -> str:
    """A phase event's name, with its progress when it has one: "teacher-samples 3/10"."""
    done, total = data.get("done"), data.get("total")
    progress = f" {done}/{total}" if isinstance(done, int) and isinstance(total, int) else ""
    return f"{data.get('phase', '')}{progress}"


def describe_event(kind: str, it: Optional[int], data: dict) -> str:
    """One log-tail line for a non-metric event."""
    at = f" at iteration {it}" if it is not None else ""
    if kind == "phase":
        return f"phase: {phase_text(data)}" + (f" ({data['device']})" if data.get("device") else "")
    if kind in ("warning", "error"):
        return f"{kind}{at}: {data.get('message') or data.get('reason') or ''}"
    if kind == "checkpoint":
        return f"checkpoint saved{at}: {data.get('path', '')}"
    if kind == "samples":
        return f"samples{at}: {len(data.get('paths') or [])} images in {data.get('folder', '')}"
    if kind == "started":
        resume = f" (resuming {data['resume_from']})" if data.get("resume_from") else ""
        batch = (f"; effective batch {data['effective_batch']} over {data.get('num_processes', 1)} process(es)"
                 if data.get("effective_batch") else "")
        return f"started: {data.get('run_dir', '')}{resume}{batch}"
    return f"{kind}{at}"


def _own_session(proc: QProcess) -> None:
    """POSIX: the engine gets its own session, so Ctrl+C in the app's terminal (or closing that
    terminal) reaches the app, which decides, and not the engine directly (Qt >= 6.6)."""
    if os.name != "posix" or not hasattr(proc, "setUnixProcessParameters"):
        return
    params = QProcess.UnixProcessParameters()
    params.flags = QProcess.UnixProcessFlag.CreateNewSession
    proc.setUnixProcessParameters(params)
