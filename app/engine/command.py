"""One `dmad` command line in a QProcess: the engine's environment, its own session, lines out.

Every place the app runs the engine (a training run, the data check, the probe, the memory ledger,
"Render again") goes through DmadCommand, so they agree on what is easy to get wrong: pipes deliver
bytes in arbitrary chunks (lines are reassembled, and a last line without its newline is still
delivered when the command ends); the command runs in its own session, so Ctrl+C in the app's
terminal reaches the app, which decides, and kill() reaches whatever the command started; and the end
is always one `finished(exit code, line)`, also when the program cannot start or crashes.

Stdout carries events (one JSON object per line, dmad.contract.events) or a command's plain output;
stderr carries log lines, `progress <done> <total>` lines (--progress) and, on a clean failure, one
"dmad: error: ..." line.
"""
from __future__ import annotations

import os
import re
import signal
import sys
from pathlib import Path
from typing import Optional, Sequence

from PySide6.QtCore import QCoreApplication, QObject, QProcess, QProcessEnvironment, QTimer, Signal

from dmad.contract.events import parse_line
from dmad.contract.paths import engine_argv

EXIT_MEANINGS = {0: "success", 1: "the run failed", 2: "invalid input", 3: "out of memory",
                 130: "interrupted", -1: "the engine crashed or was killed"}
KILL_GRACE_MS = 3000  # after SIGTERM, what a command gets to clean up before SIGKILL
PROGRESS = re.compile(r"^progress (\d+) (\d+)\s*$")  # `dmad check-data/probe/cache --progress` on stderr


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


def own_session(proc: QProcess) -> None:
    """POSIX: the command gets its own session (and so its own process group), so Ctrl+C in the app's
    terminal (or closing that terminal) reaches the app, which decides, and not the command directly;
    and kill() can end the command's own children with it (Qt >= 6.6)."""
    if os.name != "posix" or not hasattr(proc, "setUnixProcessParameters"):
        return
    params = QProcess.UnixProcessParameters()
    params.flags = QProcess.UnixProcessFlag.CreateNewSession
    proc.setUnixProcessParameters(params)


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


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):  # the group is gone already
        pass


# pgid -> the SIGKILL that follows a kill()'s SIGTERM. Not owned by a DmadCommand: it must still
# fire if the command object is deleted meanwhile. Stopped once the group has no process left, so
# no timer outlives its purpose and a later group that reuses the id is never signalled.
_PENDING_KILLS: dict[int, QTimer] = {}


def _kill_group_later(pgid: int, grace_ms: int) -> None:
    old = _PENDING_KILLS.pop(pgid, None)
    if old is not None:  # kill() again: the new grace replaces the old one
        old.stop()
        old.deleteLater()
    timer = QTimer()
    timer.setSingleShot(True)
    timer.setInterval(max(0, grace_ms))
    timer.timeout.connect(lambda: _kill_group_now(pgid))
    _PENDING_KILLS[pgid] = timer
    timer.start()


def _kill_group_now(pgid: int) -> None:
    timer = _PENDING_KILLS.pop(pgid, None)
    if timer is not None:
        timer.stop()
        timer.deleteLater()
    _signal_group(pgid, signal.SIGKILL)


def _forget_group_if_empty(pgid: int) -> None:
    """The group's last process has ended: its pending SIGKILL is not needed any more."""
    if pgid not in _PENDING_KILLS:
        return
    try:
        os.killpg(pgid, 0)
        return  # a process of the group is still there (a child that ignores SIGTERM)
    except (ProcessLookupError, PermissionError):
        pass
    timer = _PENDING_KILLS.pop(pgid)
    timer.stop()
    timer.deleteLater()


def _leads_group(pid: int) -> bool:
    """The command leads its own process group (own_session took effect)."""
    if not pid or os.name != "posix" or not hasattr(os, "killpg"):
        return False
    try:
        return os.getpgid(pid) == pid
    except (ProcessLookupError, PermissionError):
        return False


class DmadCommand(QObject):
    """One `dmad ...` command at a time; start() again once it has finished.

    `program` replaces engine_argv() (tests run a small script that behaves like the engine);
    `parse_events`: stdout lines that are events go to `event_received` instead of `stdout_line`;
    `label` names the command in the one-line messages (default "dmad <subcommand>")."""

    stdout_line = Signal(str)  # stdout lines (with parse_events: those that are not events)
    stderr_line = Signal(str)  # every stderr line, progress lines included
    event_received = Signal(object)  # dmad.contract.events.Event, one per stdout event line (parse_events)
    progress = Signal(int, int)  # (done, total) of a `progress <done> <total>` stderr line
    finished = Signal(int, str)  # exit code (-1: crashed, killed or could not start), what went wrong ("" on 0)

    def __init__(self, parent: Optional[QObject] = None, program: Optional[Sequence[str]] = None,
                 parse_events: bool = False, label: str = ""):
        super().__init__(parent)
        self._program = list(program) if program is not None else engine_argv()
        self._parse_events = parse_events
        self._label = label
        self._args: list[str] = []
        self._proc: Optional[QProcess] = None
        self._out, self._err = LineBuffer(), LineBuffer()
        self._error_line = ""
        self._start_error = ""
        self._discarded = False
        self._killed_group: Optional[int] = None  # the process group kill() signalled

    # ------------------------------------------------------------ queries

    def program(self) -> list[str]:
        """The command line prefix that start()'s arguments follow."""
        return list(self._program)

    def label(self) -> str:
        return self._label or " ".join(["dmad"] + self._args[:1])

    def is_running(self) -> bool:
        return self._proc is not None and self._proc.state() != QProcess.ProcessState.NotRunning

    def process_id(self) -> Optional[int]:
        return (int(self._proc.processId()) or None) if self.is_running() else None

    def start_error(self) -> str:
        """Why the last start() failed to start a process at all ("" when it started)."""
        return self._start_error

    # ------------------------------------------------------------ commands

    def start(self, args: Sequence[str]) -> None:
        """Run the program with `args`. The end is always reported by `finished`, also when the
        program cannot start (which may be reported before start() returns)."""
        if self.is_running():
            raise RuntimeError(f"{self.label()} is already running")
        self._forget_process()
        self._args = list(args)
        self._out, self._err = LineBuffer(), LineBuffer()
        self._error_line = self._start_error = ""
        self._killed_group = None
        proc = QProcess(self)
        proc.setProgram(self._program[0])
        proc.setArguments(self._program[1:] + self._args)
        proc.setProcessEnvironment(engine_environment())
        own_session(proc)
        proc.readyReadStandardOutput.connect(self._read_stdout)
        proc.readyReadStandardError.connect(self._read_stderr)
        proc.finished.connect(self._on_finished)
        proc.errorOccurred.connect(self._on_error)
        self._proc = proc
        proc.start()

    def terminate(self) -> None:
        """SIGTERM to the command itself (not its group): the engine's handler stops at the next
        iteration boundary with a checkpoint."""
        if self.is_running():
            self._proc.terminate()

    def kill(self, grace_ms: int = KILL_GRACE_MS) -> None:
        """End the command and everything it started: SIGTERM to its process group, then SIGKILL to
        the group after grace_ms (a child that ignores SIGTERM cannot outlive a cancel). Without a
        group of its own (not POSIX, Qt < 6.6) the command alone is killed at once."""
        if not self.is_running():
            return
        pid = int(self._proc.processId())
        if not _leads_group(pid):
            self._proc.kill()
            return
        _signal_group(pid, signal.SIGTERM)
        self._killed_group = pid
        _kill_group_later(pid, grace_ms)

    def discard(self) -> None:
        """Nobody wants this command's answer any more (a newer request replaced it): its signals
        stop, it is killed, and it deletes itself once it has ended."""
        self._discarded = True
        self.blockSignals(True)
        if self.is_running():
            self.kill()
        else:
            self.deleteLater()

    def detach(self) -> None:
        """Leave the command running after this object and the app are gone ("leave it running").
        QProcess kills its child when destroyed; parented to the main thread object, which Qt never
        deletes before exit, it is never destroyed. Its read channels are closed: Qt drains and
        discards what the command still prints (a full pipe would block it; buffering it would grow
        without bound). When the app exits the pipes close; the engine tolerates that (EventWriter
        stops echoing to stdout) and keeps writing its run folder. Nothing is reported after this."""
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
                self._stdout(line)

    def _read_stderr(self) -> None:
        if self._proc is not None:
            for line in self._err.feed(bytes(self._proc.readAllStandardError())):
                self._stderr(line)

    def _stdout(self, line: str) -> None:
        ev = parse_line(line) if self._parse_events else None
        if ev is not None:
            self.event_received.emit(ev)
        else:
            self.stdout_line.emit(line)

    def _stderr(self, line: str) -> None:
        done_total = progress_of(line)
        if done_total is not None:
            self.progress.emit(*done_total)
        else:
            self._error_line = keep_error_line(self._error_line, line)
        self.stderr_line.emit(line)

    # ------------------------------------------------------------ the end

    def _on_error(self, error: QProcess.ProcessError) -> None:
        if error != QProcess.ProcessError.FailedToStart or self._proc is None:
            return  # a crash is followed by finished(), which reports it
        self._start_error = f"could not start {self.label()}: {self._proc.errorString()}"
        self._end(-1, self._start_error)

    def _on_finished(self, code: int, status: QProcess.ExitStatus) -> None:
        if self._killed_group is not None:
            _forget_group_if_empty(self._killed_group)
        self._read_stdout()
        self._read_stderr()
        for line in self._out.flush():
            self._stdout(line)
        for line in self._err.flush():
            self._stderr(line)
        crashed = status == QProcess.ExitStatus.CrashExit
        self._end(-1 if crashed else code, self._end_line(-1 if crashed else code, crashed))

    def _end_line(self, code: int, crashed: bool) -> str:
        """"" on success; else the command's own error line or, when it printed none, what happened."""
        if code == 0 or self._error_line:
            return "" if code == 0 else self._error_line
        return f"{self.label()} crashed" if crashed else f"{self.label()} exited with code {code}"

    def _end(self, code: int, line: str) -> None:
        self._forget_process()
        if self._discarded:
            self.deleteLater()
            return
        self.finished.emit(code, " ".join(line.split()))

    def _forget_process(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            proc.deleteLater()
