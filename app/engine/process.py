"""The bridge to the engine: `dmad train` (a DmadCommand), its stdout parsed as events.

The app never imports the training code; it starts the `dmad` command line (what a user types in a
terminal) and reads what it prints (app/engine/command.py: lines, events, the end). Stdout carries
only events (one JSON object per line, DESIGN.md); stderr carries log lines and, on a clean failure,
one "dmad: error: ..." line. Commands go the other way through <run>/control.jsonl, which the engine
polls at every iteration boundary.

Exit codes (dmad/errors.py): 0 done or stopped, 1 the run failed (an error event says why),
2 invalid input (the stderr line says what and where), 3 out of memory, 130 interrupted.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from PySide6.QtCore import QObject, Signal

from app.engine.command import DmadCommand, exit_meaning
from dmad.contract.events import CAUSE_DISK_FULL, ERROR_CAUSES, Event
from dmad.contract.paths import engine_argv
from dmad.contract.runlog import append_control, health_summary
from dmad.contract.runs import RunFolder

LOG_KEEP = 200  # stderr lines kept for the failure banner


@dataclass(frozen=True)
class LaunchMachines:
    """A run over several machines: this machine's rank and where machine 0 listens."""
    count: int = 1
    rank: int = 0
    main_ip: str = ""
    port: int = 29500


def event_dict(ev: Event) -> dict:
    return {"v": ev.v, "t": ev.t, "kind": ev.kind, "iter": ev.iter, "data": ev.data}


class EngineProcess(QObject):
    """One `dmad train` (or `--dry-run`) at a time. `command` replaces engine_argv() (tests run
    a small script that behaves like the engine)."""

    event_received = Signal(dict)  # {"v","t","kind","iter","data"}, one per stdout event line
    log_received = Signal(str)  # stderr lines, and stdout lines that are not events
    run_dir_found = Signal(object)  # Path: from --run-dir, else the "started" event
    finished = Signal(int, str)  # exit code (-1: crashed / could not start), one-line summary
    dry_run_finished = Signal(int, str)  # exit code, the report (or the error line)

    def __init__(self, parent: Optional[QObject] = None, command: Optional[Sequence[str]] = None):
        super().__init__(parent)
        self._command = list(command) if command is not None else engine_argv()
        self._cmd: Optional[DmadCommand] = None
        self._mode = "train"
        self._run_dir: Optional[Path] = None
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
        # A new command per start: a detached one keeps its process, which this object no longer reads
        cmd = DmadCommand(self, program=self._command, parse_events=mode == "train",
                          label=f"the engine ({' '.join(self._command)})")
        cmd.stdout_line.connect(self._stdout_line)
        cmd.event_received.connect(self._event)
        cmd.stderr_line.connect(self._stderr_line)
        cmd.finished.connect(self._on_finished)
        self._cmd = cmd
        if run_dir is not None:
            self._set_run_dir(run_dir)
        cmd.start(args)

    def _reset(self, mode: str) -> None:
        if self._cmd is not None:
            self._cmd.deleteLater()
        self._cmd, self._mode, self._run_dir = None, mode, None
        self._stdout_text, self._error_line = [], ""
        self._log.clear()
        self._error_event = self._final_event = None

    # ------------------------------------------------------------ queries and commands

    def is_running(self) -> bool:
        return self._cmd is not None and self._cmd.is_running()

    def run_dir(self) -> Optional[Path]:
        return self._run_dir

    def process_id(self) -> Optional[int]:
        return self._cmd.process_id() if self._cmd is not None else None

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
            self.log_received.emit(f"could not write {RunFolder(self._run_dir).control_jsonl}: {e}")
            return False
        return True

    def terminate_gracefully(self) -> None:
        """Stop with a checkpoint: control "stop" once the run folder exists; before that, SIGTERM
        (the engine's handler also stops at the next iteration boundary and checkpoints)."""
        if not self.is_running():
            return
        if not self.send_control("stop"):
            self._cmd.terminate()

    def kill(self, grace_ms: int = 0) -> None:
        """Kill the engine and everything it started (its process group) without waiting for a
        boundary: the user chose Kill because it no longer stops by itself."""
        if self._cmd is not None and self.is_running():
            self._cmd.kill(grace_ms)

    def detach(self) -> None:
        """Leave the engine running after this app exits (the user chose "leave it running"): it
        keeps writing its run folder, which is how the app follows it from then on
        (DmadCommand.detach says how the process survives)."""
        if self._cmd is not None:
            self._cmd.detach()

    # ------------------------------------------------------------ output

    def _stdout_line(self, line: str) -> None:
        if self._mode == "dry":
            self._stdout_text.append(line)
        elif line.strip():
            self.log_received.emit(line)

    def _event(self, ev: Event) -> None:
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

    def _on_finished(self, code: int, line: str) -> None:
        start_error = self._cmd.start_error() if self._cmd is not None else ""
        self._emit_end(code, start_error or self._summary(code))

    def _emit_end(self, code: int, summary: str) -> None:
        if self._mode == "dry":
            text = "\n".join(self._stdout_text).strip() if code == 0 else (self._error_line or summary)
            self.dry_run_finished.emit(code, text)
        else:
            self.finished.emit(code, summary)

    def _summary(self, code: int) -> str:
        err = self._error_event["data"] if self._error_event else {}
        if code == 0:
            return final_summary(self._final_event)
        if code == 2 and self._error_line:
            return self._error_line
        if err.get("reason"):
            return str(err["reason"])
        if self._error_line:
            return self._error_line
        tail = [line for line in self._log if line.strip()]
        return f"the engine exited with code {code} ({exit_meaning(code)})" + (f": {tail[-1]}" if tail else "")


def final_summary(ev: Optional[dict]) -> str:
    """The one line that says how a run ended, from its final event (stopped / finished)."""
    if ev is None:
        return "the engine exited normally"
    if ev["kind"] == "stopped":
        ckpt = ev["data"].get("last_checkpoint")
        kept = f" (checkpoint iter_{ckpt})" if ckpt is not None else ""
        # Stop now: nothing saved at the stop (a checkpoint of this very iteration saved earlier still counts)
        if ev["data"].get("checkpoint_saved") is False and ev["iter"] and ckpt != ev["iter"]:
            kept = (f" without a checkpoint (the newest is iter_{ckpt})" if ckpt is not None
                    else " without a checkpoint (the run has none)")
        if not ev["iter"]:  # None or 0: Stop while it was still loading, no iteration ran
            return "stopped before the first iteration" + kept
        return f"stopped at iteration {ev['iter']}" + kept
    elapsed = ev["data"].get("elapsed_s")
    took = f" in {elapsed:.0f} s" if isinstance(elapsed, (int, float)) else ""
    start = ev["data"].get("start_iter")
    if isinstance(start, int) and not isinstance(start, bool) and 0 < start < (ev["iter"] or 0):
        # a continued run: this session's iterations and time, not the run's whole count in this session's seconds
        return f"finished at iteration {ev['iter']}: {ev['iter'] - start} iterations{took} after continuing from {start}"
    return f"finished {ev['iter']} iterations" + took


# What to do when the engine gave no advice of its own
CAUSE_ADVICE = {CAUSE_DISK_FULL: "free space on the run folder's drive, then Continue the run (Training or Runs tab)"}


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
        lines.append(f"Cause: {ERROR_CAUSES.get(error['cause'], str(error['cause']))}{where}")
    # out of memory: the engine says what to change
    advice = error.get("advice") or status.get("advice") or CAUSE_ADVICE.get(str(error.get("cause")))
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
        took = data.get("took_s")
        after = f" (after {data['after']}, {took:.1f} s)" if data.get("after") and isinstance(took, (int, float)) else ""
        return f"phase: {phase_text(data)}{after}" + (f" ({data['device']})" if data.get("device") else "")
    if kind in ("warning", "error"):
        return f"{kind}{at}: {data.get('message') or data.get('reason') or ''}"
    if kind == "checkpoint":
        return f"checkpoint saved{at}: {data.get('path', '')}"
    if kind == "samples" and data.get("one_off"):
        paths = data.get("paths") or [""]
        return f"sampled prompt{at}: \u201c{data.get('prompt', '')}\u201d -> {paths[0]}"
    if kind == "samples":
        n = len(data.get("paths") or [])
        return f"samples{at}: {n} image{'' if n == 1 else 's'} in {data.get('folder', '')}"
    if kind == "health":
        return f"health{at}: {health_summary(data)}"
    if kind == "started":
        resume = f" (resuming {data['resume_from']})" if data.get("resume_from") else ""
        batch = (f"; effective batch {data['effective_batch']} over {data.get('num_processes', 1)} process(es)"
                 if data.get("effective_batch") else "")
        return f"started: {data.get('run_dir', '')}{resume}{batch}"
    return f"{kind}{at}"
