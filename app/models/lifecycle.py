"""The lifecycle of the run the Training panel shows, as rules without Qt: what the engine's events,
its exit code and status.json make of the run's state.

States: "idle" (nothing shown), "starting" (our engine, before its first event; a continued run keeps
its folder, a new one has none yet), then the run folder states of dmad.contract.runs (created,
running, paused, stopping, stopped, finished, failed). An ended run also has the engine's exit code
(when this app ran it or the run recorded one) and one line saying how it ended.

Where the state comes from:
  our engine (`start`, `continue_run`)  its stdout events and its exit code, which are live;
  events.jsonl (`open`)                  a run opened from its folder: its history is replayed first and
                                         never changes the state; what the engine appends after that is
                                         live (a reattach). A continued run's file is only plotted: it
                                         replays old "stopped"s, and its engine says what happens;
  status.json                            read when a run is opened, then while a run this app does not
                                         run is live: its process can die without a final event
                                         (effective_state: a dead pid or a stale heartbeat means failed).

The model decides and says what to do through its emitters; the panel does it (reads status.json
off the GUI thread and hands it to `status_read`; finishes reading events.jsonl, then calls
`file_ended`) and shows `failed` reports, `noted` lines and `refused` continues.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from app.engine.process import failure_report, final_summary, phase_text
from app.models.evented import Emitter
from dmad.contract.runs import LIVE_STATES, effective_state

IDLE, STARTING = "idle", "starting"
LIVE = (STARTING,) + LIVE_STATES
ENDED = ("stopped", "finished", "failed")
# The state an event of a live run moves it to
EVENT_STATES = {"started": "running", "resumed": "running", "paused": "paused", "stopped": "stopped",
                "finished": "finished", "error": "failed"}
# A control command sent, said until the engine answers (a state change, or the event in ANSWERS)
PENDING = {"pause": "pausing", "resume": "resuming", "sample_now": "sampling requested",
           "checkpoint_now": "checkpoint requested", "stop_now": "stopping now, no checkpoint"}
ANSWERS = {"samples": "sampling requested", "checkpoint": "checkpoint requested"}
KILLED = "the engine was killed from the app while stopping; Continue goes on from its newest checkpoint"
LOG_LINES = 8  # the last log lines a failure report shows


@dataclass(frozen=True)
class Failure:
    """What the failure banner says: a title, detail lines, and the engine's last log lines (None: the
    panel's own log tail)."""
    title: str
    details: tuple[str, ...]
    log_lines: Optional[tuple[str, ...]] = None


class RunLifecycle:
    """The shown run. Read its attributes; only its methods change them. `changed()` after any change
    (progress included: cheap observers only), `state_changed(state)` just before it when the state
    itself changed."""

    def __init__(self) -> None:
        self.changed = Emitter()
        self.state_changed = Emitter()
        self.failed = Emitter()           # (Failure) the run failed: the banner shows it
        self.noted = Emitter()            # (line) how the run ended (our engine's word, else its final event)
        self.refused = Emitter()          # (run_dir, line) the engine would not continue the run (exit 2)
        self.status_wanted = Emitter()    # () read status.json now, then status_read
        self.file_end_wanted = Emitter()  # () read events.jsonl to its end, stop following, then file_ended
        self.state: str = IDLE
        self.run_dir: Optional[Path] = None
        self._forget()

    def _forget(self) -> None:
        """Everything but the state and the folder, for the next run shown."""
        self.iteration: Optional[int] = None
        self.max_steps: Optional[int] = None
        self.exit_code: Optional[int] = None
        self.message = ""        # how the run ended, one line
        self.pending = ""        # a command sent and not answered yet ("pausing")
        self.phase = ""          # the last phase event: "teacher-samples 3/10"
        self.starting_in = ""    # where a new run goes, until its folder is known
        self.step_time_s: object = None  # the last metric event's (the engine's number, unchecked)
        self.started_t: Optional[float] = None  # unix s: when our engine started, else the started event's t
        self.last_t: Optional[float] = None     # unix s of the last event
        self._done_s = 0.0                      # the run's earlier sessions (started -> its ending event), s
        self._session_t: Optional[float] = None  # unix s of the current session's started event
        self.error: Optional[dict] = None       # the error event's data
        self.status: dict = {}                  # status.json as last read
        self.engine_running = False  # our engine runs this run
        self.continuing = False      # ... continuing it (--resume latest): the state is the engine's alone
        self.reads_file = False      # events.jsonl is this run's record (else our engine's stdout)
        self.following = False       # events.jsonl is still being read
        self.replaying = False       # ... and what is read now is history (opened, or cut back by a resume)
        self._exit: Optional[tuple[int, str]] = None  # our engine exited 0 without a final event

    # ------------------------------------------------------------ reading

    def is_live(self) -> bool:
        """An engine is (or should be) behind the run: closing the window must ask."""
        return self.state in LIVE

    def is_ended(self) -> bool:
        return self.state in ENDED

    def error_code(self) -> Optional[int]:
        """The exit code the run recorded: its error event's, else status.json's."""
        code = (self.error or {}).get("exit_code", self.status.get("exit_code"))
        return code if isinstance(code, int) else None

    def elapsed(self, now: float) -> Optional[float]:
        """Seconds the run has taken: each engine session from its started event to its ending event
        (the current one until `now` while it is live, until its last event after), so a live run
        and the same run reopened say the same, and the hours between a stop and a Continue are not
        counted. Before the first started event of our own engine: since it was launched."""
        current = 0.0
        if self._session_t is not None:
            end = now if self.is_live() else (self.last_t or self._session_t)
            current = max(end - self._session_t, 0.0)
        elif not self._done_s:
            return now - self.started_t if self.is_live() and self.started_t else None
        return self._done_s + current

    def wants_status(self) -> bool:
        """A status.json read would tell something: the run is one this app does not run (it may die
        without a final event), or our engine exited 0 without saying how the run ended."""
        return self._exit is not None or (self.run_dir is not None and not self.engine_running
                                          and not self.continuing)

    # ------------------------------------------------------------ what the user did

    def start(self, starting_in: str, now: float) -> None:
        """Our engine starts a new run in the folder `starting_in` (its own name is known once it has
        begun); `now`: unix s."""
        self._refuse_if_live()
        self._forget()
        self.starting_in, self.started_t, self.engine_running = starting_in, now, True
        self._show(STARTING, None)

    def continue_run(self, run_dir: Path, now: float) -> None:
        """Our engine continues `run_dir` in its own folder: its events.jsonl feeds the plots (history
        first), the engine alone says what happens."""
        self._refuse_if_live()
        self._forget()
        self.started_t, self.engine_running, self.continuing = now, True, True
        self.reads_file = self.following = self.replaying = True
        self._show(STARTING, Path(run_dir))

    def open(self, run_dir: Path, status: Optional[dict]) -> None:
        """A run shown from its folder, in the state its status.json gives (effective_state); its
        events.jsonl is replayed, then followed while the run is live. Always a change."""
        self._forget()
        self.status = status or {}
        self.reads_file = self.following = self.replaying = True
        self._show(effective_state(self.status), Path(run_dir))

    def clear(self) -> None:
        """Nothing shown any more (the shown run's folder was deleted)."""
        if self.is_live():
            raise RuntimeError(f"a run is {self.state}: it cannot be forgotten")
        self._forget()
        self._show(IDLE, None)

    def stop_requested(self) -> None:
        """A Stop was sent (control "stop", or SIGTERM before the run folder exists): "stopping" until
        the engine says how the run ended."""
        self._set(state="stopping")

    def command_sent(self, cmd: str) -> None:
        """A command written to control.jsonl."""
        if cmd == "stop":
            self.stop_requested()
        else:
            self._set(pending=PENDING.get(cmd, ""))

    # ------------------------------------------------------------ what the engine said

    def set_run_dir(self, run_dir: Path) -> None:
        """Our engine named its run folder (--run-dir, or its started event)."""
        self._set(run_dir=Path(run_dir))

    def engine_event(self, ev: dict) -> None:
        """An event on our engine's stdout ({"v","t","kind","iter","data"}): live. It is recorded here
        unless events.jsonl is the record (a continued run: file_event records it)."""
        if not self.reads_file:
            self._record(ev)
        self._follow(ev)

    def file_event(self, ev: dict) -> None:
        """An event read from events.jsonl: recorded; it moves the state only when it is live (neither
        history being replayed nor a continued run's file, whose engine says)."""
        self._record(ev)
        if not (self.replaying or self.continuing):
            self._follow(ev)

    def file_rewound(self) -> None:
        """events.jsonl was cut back (a resume) and is read again from its start: history again, so its
        old state events (a "stopped" before the resume) do not count."""
        self.replaying = True
        self._set(iteration=None)

    def file_caught_up(self) -> None:
        """The end of events.jsonl was reached: what comes next is live."""
        if not self.replaying:
            return
        self.replaying = False
        if self.continuing and self._session_t is not None and self.last_t:  # the history's last session
            self._done_s += max(self.last_t - self._session_t, 0.0)  # ended without a word (killed): it is over
            self._session_t = None
        if self.state == "failed" and not self.continuing:  # ours: its exit code has said it
            self._fail(self.error_code(), "")
        elif self.state in LIVE_STATES:
            self._ask_status()  # a state change hidden in the replayed history

    def file_ended(self) -> None:
        """Reading events.jsonl stopped at its end (file_end_wanted): now status.json has the last word."""
        self.following = False
        self._ask_status()

    def engine_finished(self, code: int, summary: str, log_lines: tuple[str, ...], killed: bool) -> None:
        """Our engine exited with `code` (-1: crashed or could not start); `summary`: its one line
        (EngineProcess), `log_lines`: its last stderr lines, `killed`: the user killed it from the app."""
        self.engine_running = False
        if self.reads_file:
            self.file_end_wanted.emit()  # a continued run: read its last lines, then stop
        state, run_dir, log_lines = self.state, self.run_dir, tuple(log_lines)
        if code == 2 and self.continuing and run_dir is not None:
            self.refused.emit(run_dir, summary)  # nothing changed: the panel shows the folder as it is
        elif killed and run_dir is not None:
            self._fail(code, KILLED, log_lines)
        elif state == "stopping" and run_dir is None:  # SIGTERM before the run folder existed: nothing kept
            self._end("stopped", code, "stopped before the run began")
            self.noted.emit("stopped before the run began")
        elif code == 0 and (state in ("stopped", "finished") or run_dir is None):
            self._end(state if state in ("stopped", "finished") else "finished", code, summary)
            self.noted.emit(summary)
        elif code == 0:  # no final event seen: status.json says how the run ended
            self._exit = (code, summary)
            self._ask_status()
        else:
            self._fail(code, summary, log_lines)

    def status_read(self, run_dir: Path, status: Optional[dict], killed: bool) -> None:
        """status.json of `run_dir` as just read (None: missing or not the engine's). A read of another
        run than the one shown now, or that nobody wanted, is dropped. `killed`: the user killed the
        engine from the app."""
        if run_dir != self.run_dir or not self.wants_status():
            return
        state = effective_state(status or {})
        if self._exit is not None:
            (code, summary), self._exit = self._exit, None
            self._end(state, code, summary)
            self.noted.emit(summary)
            return
        self.status = status or {}
        if state in LIVE_STATES:
            # A final event (stopped, finished, error) is never undone; a Stop sent is not undone by a
            # status.json still saying "running" until the engine reaches its boundary
            if self.is_live() and (self.state != "stopping" or state == "stopping"):
                self._set(state=state)
        elif self.following:
            self.file_end_wanted.emit()  # its last events first: file_ended asks for status.json again
        elif state == "failed" and self.state != "failed":
            self._fail(self.error_code(), KILLED if killed else "")
        elif state != self.state:
            self._set(state=state)

    # ------------------------------------------------------------ the rules

    def _time_sessions(self, kind: str, t: Optional[float]) -> None:
        """The run's elapsed time, session by session (elapsed)."""
        if t is None:
            return
        if kind == "started":
            if self._session_t is not None and self.last_t:  # the last session ended without a word (killed)
                self._done_s += max(self.last_t - self._session_t, 0.0)
            self._session_t = t
        elif kind in ("stopped", "finished", "error") and self._session_t is not None:
            self._done_s += max(t - self._session_t, 0.0)
            self._session_t = None

    def _record(self, ev: dict) -> None:
        """Everything an event tells but the state: progress, phase, the error, answered commands."""
        kind, it, data = ev["kind"], ev["iter"], ev["data"]
        self._time_sessions(kind, ev["t"] or None)
        self.last_t = ev["t"] or self.last_t
        if kind == "metric" and data.get("source") == "sampler":
            return  # a memory sampler reading (gpu_mem.csv), not an iteration
        if kind == "metric":
            self.step_time_s = data.get("step_time_s")
            self._set(iteration=it, max_steps=data.get("max_train_steps", self.max_steps))
            return
        if kind == "started":
            self.started_t = self.started_t or ev["t"]  # our own run: when we started the process
            self._set(max_steps=data.get("max_train_steps", self.max_steps))
        elif kind == "phase":
            self._set(phase=phase_text(data))  # "running - teacher-samples 3/10": loading can take minutes
        elif kind == "error":
            self.error = data
        elif ANSWERS.get(kind) == self.pending:
            self._set(pending="")
        if it is not None and kind != "phase":
            self._set(iteration=max(it, self.iteration or 0))

    def _follow(self, ev: dict) -> None:
        state = EVENT_STATES.get(ev["kind"])
        if state == "failed":
            self.error = ev["data"]
            self._fail(ev["data"].get("exit_code"), str(ev["data"].get("reason", "")))
        elif state:
            self._set(state=state)
            if state in ("stopped", "finished") and not self.engine_running:
                self.noted.emit(final_summary(ev))  # a run followed from its folder: no engine of ours says it

    def _fail(self, code: Optional[int], summary: str, log_lines: Optional[tuple[str, ...]] = None) -> None:
        """The run failed: the code and the reason are kept, the banner says it all."""
        title, details = failure_report(code, summary, self.error or {}, self.status)
        self._end("failed", code, details[0])
        self.failed.emit(Failure(title, tuple(details), log_lines))

    def _end(self, state: str, code: Optional[int], message: str) -> None:
        """The run ended; a state that is not an end (status.json still says "created") is kept as is."""
        if state in ENDED:
            self._set(state=state, exit_code=code, message=" ".join(message.split()))
        else:
            self._set(state=state)

    def _ask_status(self) -> None:
        if self.wants_status():
            self.status_wanted.emit()

    def _refuse_if_live(self) -> None:
        if self.is_live():
            raise RuntimeError(f"a run is already {self.state}")

    # ------------------------------------------------------------ one change, one signal

    def _show(self, state: str, run_dir: Optional[Path]) -> None:
        """A new run shown: always a change, even if it looks like the last one."""
        old = self.state
        self.state, self.run_dir = state, run_dir
        self._emit(old)

    def _set(self, **values) -> None:
        old = self.state
        if values.get("state", old) != old:
            values["pending"] = ""  # the engine moved: whatever was asked is answered or moot
        changed = False
        for name, value in values.items():
            if getattr(self, name) != value:
                setattr(self, name, value)
                changed = True
        if changed:
            self._emit(old)

    def _emit(self, old_state: str) -> None:
        if self.state != old_state:
            self.state_changed.emit(self.state)
            if self.state not in LIVE and self.following and not self.replaying:
                self.file_end_wanted.emit()  # the run is over: read what it wrote last, then stop
        self.changed.emit()
