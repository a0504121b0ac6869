"""The Training panel: start / pause / resume / stop a run, watch its losses, memory and step time.

Two sources feed the same plots: the stdout events of the engine this panel started (EngineProcess),
or events.jsonl of a run opened from disk (EventFollower: its history, then, if the run is still
live, everything it writes next — a reattach). Events only append to the SeriesStore; a
PlotFeed (app/widgets/plot_feed.py) pushes changed series to their curves at <= 15 Hz.

The run's lifecycle lives in `run_state` (app/models/run_state.py), which this panel alone writes and
the window and the Runs panel observe. For an opened run the state comes from status.json read with
effective_state (a dead pid or a stale heartbeat means failed), then from the live events; history
events never change it.

Continue (`continue_run`) runs `dmad train --resume latest` on the shown run, in its own folder. Its
history is in events.jsonl, not in the new engine's stdout, so the panel follows the file (a resume
cuts it back to the checkpoint: the follower rewinds and replays it) and takes only the lifecycle
from the engine's stdout and exit code, which are live, while the file still replays old "stopped"s.

Commands go through RunCommands (app/dialogs/run_commands.py): a Stop that takes long offers Stop now
(no checkpoint), then Kill, in the stop bar; "Sample prompt…" shows its one-off image when it comes.
The ETA is the recent pace smoothed (app/models/eta.py), not the engine's jumpy eta_s.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Optional, Sequence

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtWidgets import QSplitter, QVBoxLayout, QWidget

from app.dialogs.launch import edit_machines
from app.dialogs.run_commands import PENDING, RunCommands
from app.engine.command import exit_meaning
from app.engine.process import EngineProcess, LaunchMachines, describe_event, failure_report, phase_text
from app.engine.follow import EventFollower
from app.models.eta import EtaSmoother
from app.models.methods import read_method
from app.widgets.failure_banner import FailureBanner
from app.widgets.stop_bar import StopBar
from app.widgets.log_tail import LogTail
from app.widgets.plot_feed import PlotFeed
from app.widgets.plot_board import PlotBoard
from app.widgets.run_controls import RunControls
from app.widgets.run_numbers import RunNumbers
from app.models.controls import enabled_controls, state_line
from app.models.resume import CONTINUABLE, ResumeLookup, continue_text
from app.models.run_target import root_override
from app.models.run_state import ENDED, LIVE, RunState
from app.models.series import SeriesStore
from dmad.contract.runs import LIVE_STATES, RunFolder, effective_state

STATUS_POLL_MS = 2000  # a reattached run: is its process still alive?
BANNER_LOG_LINES = 8
KILLED = "the engine was killed from the app while stopping; Continue goes on from its newest checkpoint"


class TrainingPanel(QWidget):
    start_requested = Signal()
    run_state_changed = Signal(str)  # run_state's state, after this panel's own timers followed it
    plots_refreshed = Signal(int)  # the newest plotted iteration, after setData ran

    def __init__(self, parent: Optional[QWidget] = None, engine_command: Optional[Sequence[str]] = None):
        super().__init__(parent)
        self.engine = EngineProcess(self, command=engine_command)
        self.engine.event_received.connect(self._on_engine_event)
        self.engine.log_received.connect(self._log)
        self.engine.run_dir_found.connect(self._on_run_dir)
        self.engine.finished.connect(self._on_engine_finished)
        self.run_state = RunState(self)
        self.run_state.state_changed.connect(self._on_state_changed)
        self.store = SeriesStore()
        self._follower: Optional[EventFollower] = None
        self._pending = ""
        self._start_allowed, self._start_reason = True, ""
        self._replaying = False
        self.resume = ResumeLookup(self)  # what Continue would do: the checkpoints on disk, read in a worker
        self.resume.found.connect(self._update_buttons)
        self.eta = EtaSmoother()  # the ETA shown: the recent pace, smoothed (the engine's eta_s jumps)
        # control.jsonl commands, and what a Stop that takes long offers: Stop now, then Kill
        self.commands = RunCommands(self, self.engine, self.run_state, lambda: self._status)
        self.commands.sent.connect(self._on_sent)
        self.commands.refused.connect(lambda line: self.note_label.setText(line))
        self.commands.escalated.connect(lambda: self._update_numbers())
        self.stopping = self.commands.stopping
        self._target = ("", "")  # (folder, Start's tooltip) of a new run: said before Start (set_new_run_target)
        self._clear_run_facts()
        self._status_timer = QTimer(self, interval=STATUS_POLL_MS, timeout=self._poll_status)
        self._clock_timer = QTimer(self, interval=1000, timeout=self._update_numbers)
        self._build()
        self._refresh_labels()

    # ------------------------------------------------------------ layout

    def _build(self) -> None:
        self.controls = RunControls()
        self.buttons, self.processes = self.controls.buttons, self.controls.processes
        self.machines_button = self.controls.machines_button
        self.machines = LaunchMachines()
        for key, slot in (("start", lambda: self.start_requested.emit()), ("continue", self.continue_run),
                          ("pause", lambda: self.commands.send("pause")),
                          ("resume", lambda: self.commands.send("resume")), ("stop", self.stop_run),
                          ("sample", lambda: self.commands.send("sample_now")),
                          ("sample_prompt", self.commands.ask_prompt),
                          ("checkpoint", lambda: self.commands.send("checkpoint_now"))):
            self.buttons[key].clicked.connect(slot)
        self.controls.machines_requested.connect(
            lambda: edit_machines(self, self.machines, self.processes.value(), self.set_machines))
        self.stop_bar = StopBar()
        self.stop_bar.stop_now_requested.connect(self.commands.stop_now)
        self.stop_bar.kill_requested.connect(self.commands.kill)
        self.banner = FailureBanner()
        self.numbers = RunNumbers()
        self.note_label, self.state_label = self.numbers.note_label, self.numbers.state_label
        # loss_plot: every metric plot and its controls (app/widgets/plot_board.py)
        self.loss_plot = PlotBoard(run_dir=lambda: self.run_state.run_dir)
        self.memory_plot, self.step_plot = self.loss_plot.memory_plot, self.loss_plot.step_plot
        self.feed = PlotFeed(self.store, (self.loss_plot,), self)
        self.feed.refreshed.connect(lambda: self.plots_refreshed.emit(
            -1 if self.run_state.iteration is None else self.run_state.iteration))
        self.loss_plot.display_changed.connect(lambda: self.feed.mark(self.store.names()))
        self.log_view = LogTail()
        split = QSplitter(Qt.Vertical)
        for w in (self.loss_plot, self.log_view):
            split.addWidget(w)
        split.setSizes([750, 130])  # proportions: the splitter scales them to the panel
        layout = QVBoxLayout(self)
        layout.addWidget(self.controls)
        layout.addWidget(self.stop_bar)
        layout.addWidget(self.banner)
        layout.addWidget(self.numbers)
        layout.addWidget(split, 1)

    # ------------------------------------------------------------ public API

    def run_dir(self) -> Optional[Path]:
        return self.run_state.run_dir

    def state(self) -> str:
        return self.run_state.state

    def is_live(self) -> bool:
        return self.run_state.is_live()

    def set_machines(self, machines: LaunchMachines) -> None:
        self.machines = machines
        self.controls.show_machines(machines)

    def set_start_enabled(self, enabled: bool, reason: str = "") -> None:
        self._start_allowed, self._start_reason = enabled, reason
        self._update_buttons()

    def set_new_run_target(self, folder: str, tooltip: str) -> None:
        """Where Start would put a new run (app/models/run_target.py), said before Start: the state
        line while idle and Start's tooltip."""
        self._target = (folder, tooltip)
        self._update_buttons()

    def start(self, config_path: Path, runs_root: Path) -> bool:
        """Start `dmad train` on config_path with its run folder under runs_root (root_override, as the
        Config tab's Dry run does: both name the same folder)."""
        if self.is_live():
            self.note_label.setText("a run is already live here: stop it first")
            return False
        self._clear()
        self.loss_plot.set_method(read_method(config_path))  # which plots this run fills
        self._starting_in = self._target[0]
        self.run_state.start()
        self._refresh_labels()
        self._started_t = time.time()
        self.engine.start_train(Path(config_path), overrides=root_override(runs_root),
                                num_processes=self.processes.value(), machines=self.machines)
        self._clock_timer.start()
        return True

    def open_run(self, run_dir: Path) -> bool:
        """Show a run from its folder; if it is live, keep following it (reattach)."""
        run_dir = Path(run_dir)
        if self.engine.is_running():
            current = self.run_state.run_dir
            if current is not None and run_dir.resolve() == current.resolve():
                return True
            self.note_label.setText("the run started here is still live: stop it before opening another")
            return False
        self._clear()
        folder = RunFolder(run_dir)
        self.loss_plot.set_method(read_method(folder.config_json))
        self._status = folder.read_status() or {}
        state = effective_state(self._status)
        self.log_view.load_tail(folder.engine_log)
        self.run_state.open(run_dir, state)
        self._refresh_labels()
        live = state in LIVE_STATES
        self._follow(run_dir, live)
        self._look_up_resume_point()  # the state may be the one shown before: no state_changed then
        if live:
            self._status_timer.start()
            self._clock_timer.start()
        return True

    def continue_run(self) -> bool:
        """Continue the shown run in its own folder with this panel's process settings: `dmad train
        --config <run>/config.json --run-dir <run> --resume latest` goes on from its newest complete
        checkpoint, or starts again from iteration 0 when it has none."""
        run_dir, state = self.run_state.run_dir, self.run_state.state
        if run_dir is None or state not in CONTINUABLE or self.engine.is_running():
            self.note_label.setText(f"only a stopped or failed run can be continued (this one is {state})")
            return False
        self._clear()
        self.loss_plot.set_method(read_method(run_dir / "config.json"))
        self._continuing = True
        self.run_state.start(run_dir)
        self._started_t = time.time()
        self._follow(run_dir, live=True)
        self._refresh_labels()
        self.engine.start_train(run_dir / "config.json", run_dir=run_dir, resume="latest",
                                num_processes=self.processes.value(), machines=self.machines)
        self._clock_timer.start()
        return True

    def stop_run(self) -> None:
        """Graceful stop: the engine saves a checkpoint at the next iteration boundary."""
        if self.commands.stop():
            self._set_state("stopping")

    def forget_run(self) -> None:
        """The shown run's folder is gone (deleted in the Runs tab): show nothing."""
        if not self.is_live():
            self._clear()
            self.run_state.clear()

    def leave_running(self) -> None:
        """The app closes but the run goes on; this panel keeps following it through its folder."""
        run_dir = self.engine.run_dir()
        self.engine.detach()
        if run_dir is not None and self.run_state.is_live():
            self.open_run(run_dir)

    def _follow(self, run_dir: Path, live: bool) -> None:
        """Replay events.jsonl into the plots and, if `live`, keep reading what is appended."""
        self._replaying = True
        self._follower = EventFollower(RunFolder(run_dir).events_jsonl, self)
        self._follower.events_received.connect(self._on_events)
        self._follower.rewound.connect(self._on_rewound)
        self._follower.caught_up.connect(self._on_caught_up)
        self._follower.ended.connect(self._poll_status)
        self._follower.start(live=live)

    def _look_up_resume_point(self) -> None:
        if self.run_state.run_dir is not None and self.run_state.state in CONTINUABLE:
            self.resume.look_up(self.run_state.run_dir)

    # ------------------------------------------------------------ commands

    def _on_sent(self, cmd: str) -> None:
        self._pending = PENDING.get(cmd, "")
        if cmd == "stop":
            self._set_state("stopping")
        self._update_buttons()

    def _update_buttons(self) -> None:
        s, ctrl = self.run_state.state, self.run_state.run_dir is not None
        for key, enabled in enabled_controls(s, ctrl, self.engine.is_running(), self._pending,
                                             self._start_allowed).items():
            self.buttons[key].setEnabled(enabled)
        self.buttons["start"].setToolTip(self._target[1] if self._start_allowed else self._start_reason)
        known, checkpoint = self.resume.point_for(self.run_state.run_dir)
        self.controls.show_continue(ctrl and s in CONTINUABLE and not self.engine.is_running(),
                                    *continue_text(s, checkpoint, known))
        self._show_state_line()

    def _show_state_line(self) -> None:
        self.state_label.setText(state_line(self.run_state.state, self._pending, self._phase, self._target[0],
                                            self._starting_in, self.run_state.run_dir is not None))

    def _set_state(self, state: str) -> None:
        self.run_state.set_state(state)
        self._refresh_labels()

    def _end(self, state: str, code: Optional[int], message: str) -> None:
        """The run ended; a state that is not an end (status.json still says "created") is kept as is."""
        if state in ENDED:
            self.run_state.end(state, code, message)
        else:
            self.run_state.set_state(state)
        self._refresh_labels()

    def _refresh_labels(self) -> None:
        self._update_buttons()
        self._update_numbers()

    def _on_state_changed(self, state: str) -> None:
        """Whoever moved run_state: this panel's pending request and timers follow first."""
        self._pending = ""
        if state not in LIVE:
            self._status_timer.stop()
            self._clock_timer.stop()
            if self._follower is not None and self._follower.is_active() and not self._replaying:
                self._follower.stop_when_caught_up()
        self._look_up_resume_point()  # an ended run's checkpoints are final: what would Continue do?
        self.run_state_changed.emit(state)

    # ------------------------------------------------------------ events

    def _on_engine_event(self, ev: dict) -> None:
        if self._follower is None:
            self._record(ev)  # a new run: stdout is its only reader (a continued one reads the file)
        self._follow_state(ev)  # our own engine's events are live, whatever the file is replaying
        self._update_numbers()

    def _on_events(self, events: list) -> None:
        for ev in events:
            self._record(ev)
            if not (self._replaying or self._continuing):
                self._follow_state(ev)
        self._update_numbers()

    def _record(self, ev: dict) -> None:
        """Everything an event tells but the lifecycle: plots, progress, phase, the log."""
        kind, it, data = ev["kind"], ev["iter"], ev["data"]
        self._last_t = ev["t"] or self._last_t
        if kind == "metric" and data.get("source") == "sampler":
            return  # a memory sampler reading (gpu_mem.csv; the Memory tab shows those), not an iteration
        self.eta.note_event(kind, it, data, ev["t"])
        self.commands.note_event(kind, it, data, replayed=self._replaying)
        rs = self.run_state
        if kind == "metric":
            if self.store.add_metric(it, data, t=ev["t"]):  # t: the wall-clock x axis
                self.feed.schedule()
            self._metric = data
            rs.set_progress(it, data.get("max_train_steps", rs.max_steps))
            if isinstance(data.get("mem_device_total_gb"), (int, float)):
                self.memory_plot.set_total(float(data["mem_device_total_gb"]))
            return
        if kind == "started":
            self._started_t = self._started_t or ev["t"]  # our own run: when we started the process
            rs.set_progress(rs.iteration, data.get("max_train_steps", rs.max_steps))
            if data.get("effective_batch"):
                self.note_label.setText(f"effective batch {data['effective_batch']} "
                                        f"({data.get('num_processes', 1)} process(es))")
        elif kind == "phase":
            self._phase = phase_text(data)
            self._show_state_line()  # "running - teacher-samples 3/10": loading can take minutes
        elif kind == "error":
            self._error = data
        elif (kind, self._pending) in (("samples", "sampling requested"), ("checkpoint", "checkpoint requested")):
            self._pending = ""
            self._update_buttons()
        if it is not None and kind != "phase":
            rs.set_progress(max(it, rs.iteration or 0), rs.max_steps)
        self._log(describe_event(kind, it, data))

    def _follow_state(self, ev: dict) -> None:
        kind, data = ev["kind"], ev["data"]
        state = {"started": "running", "resumed": "running", "paused": "paused", "stopped": "stopped",
                 "finished": "finished", "error": "failed"}.get(kind)
        if state == "failed":
            self._error = data
            self._fail(data.get("exit_code"), str(data.get("reason", "")))
        elif state:
            self._set_state(state)

    def _on_run_dir(self, path: Path) -> None:
        self.run_state.set_run_dir(path)
        self._update_buttons()

    def _on_engine_finished(self, code: int, summary: str) -> None:
        self._clock_timer.stop()
        state, run_dir = self.run_state.state, self.run_state.run_dir
        if self._follower is not None:
            self._follower.stop_when_caught_up()  # a continued run: read its last lines, then stop
        if code == 2 and self._continuing and run_dir is not None:
            self._refused(run_dir, summary)
        elif self.stopping.killed and self.engine.run_dir() is not None:
            self._fail(code, KILLED, self.engine.last_log_lines(BANNER_LOG_LINES))
        elif state == "stopping" and self.engine.run_dir() is None:
            # SIGTERM before the run folder existed: nothing to keep
            self._end("stopped", code, "stopped before the run began")
            self.note_label.setText("stopped before the run began")
        elif code == 0:
            final = effective_state(RunFolder(run_dir).read_status()) if run_dir else "finished"
            self._end(state if state in ("stopped", "finished") else final, code, summary)
            self.note_label.setText(summary)
        else:
            self._fail(code, summary, self.engine.last_log_lines(BANNER_LOG_LINES))
        self._refresh_plots()

    def _refused(self, run_dir: Path, line: str) -> None:
        """The engine would not continue the run (exit 2: another engine writes the folder, or its
        config no longer passes) and changed nothing: show the folder as it is, and the one line why."""
        self.open_run(run_dir)
        self.banner.show_report(f"Could not continue {run_dir.name} - exit code 2 ({exit_meaning(2)})", [line])

    def _on_rewound(self) -> None:
        """events.jsonl was cut back (a resume): replay it from the start into empty plots. Its old
        state events (a "stopped" kept before the resume) must not change the state meanwhile."""
        self._replaying = self._follower is not None
        self._reset_plots()

    def _reset_plots(self) -> None:
        self.store.reset()
        self.loss_plot.reset()  # every plot: data, legend entries, ranges
        self.run_state.set_progress(None, self.run_state.max_steps)

    def _on_caught_up(self) -> None:
        if not self._replaying:
            return
        self._replaying = False
        if self.run_state.state == "failed" and not self._continuing:  # ours: its exit code has said it
            self._fail(self._error_code(), "")
        elif self.run_state.state in LIVE_STATES:
            self._poll_status()  # a state change hidden in the replayed history
        self._update_numbers()

    def _poll_status(self) -> None:
        """A reattached run: the process may end (or die) without us seeing a final event."""
        run_dir = self.run_state.run_dir
        if run_dir is None or self.engine.is_running() or self._continuing:
            return
        self._status = RunFolder(run_dir).read_status() or {}
        state = effective_state(self._status)
        if state in LIVE_STATES:
            # A final event (stopped, finished, error) is never undone; a Stop sent is not undone by a
            # status.json still saying "running" until the engine reaches its boundary
            if self.run_state.is_live() and (self.run_state.state != "stopping" or state == "stopping"):
                self._set_state(state)
        elif self._follower is not None and self._follower.is_active():
            self._follower.stop_when_caught_up()  # read its last events first; `ended` calls us again
        elif state == "failed" and self.run_state.state != "failed":
            self._fail(self._error_code(), KILLED if self.stopping.killed else "")
        elif state != self.run_state.state:
            self._set_state(state)

    # ------------------------------------------------------------ display

    def _fail(self, code: Optional[int], summary: str, log_lines: Optional[list[str]] = None) -> None:
        """The run failed: run_state records the code and the reason, the banner says it all."""
        title, details = failure_report(code, summary, self._error or {}, self._status)
        self._end("failed", code, details[0])
        self.banner.show_report(title, details, log_lines if log_lines is not None
                                else self.log_view.last_lines(BANNER_LOG_LINES))

    def _error_code(self) -> Optional[int]:
        code = (self._error or {}).get("exit_code", self._status.get("exit_code"))
        return code if isinstance(code, int) else None

    def _update_numbers(self) -> None:
        live, now = self.is_live(), time.time()
        end = now if live else self._last_t
        eta = self.eta.eta(now if self.run_state.state == "running" else None) if live else None
        self.numbers.show_numbers(self.run_state.iteration, self.run_state.max_steps, self._metric.get("step_time_s"),
                                  eta, end - self._started_t if self._started_t and end else None)
        self.stop_bar.show_offer(self.commands.offer())

    def _log(self, line: str) -> None:
        self.log_view.appendPlainText(line)

    def _refresh_plots(self) -> None:
        self.feed.refresh()

    # ------------------------------------------------------------ reset

    def _clear_run_facts(self) -> None:
        self._metric: dict = {}
        self._error: Optional[dict] = None
        self._status: dict = {}
        self._phase = ""
        self._started_t: Optional[float] = None
        self._last_t: Optional[float] = None
        self._continuing = False  # this panel's engine continues the shown run (continue_run)
        self._starting_in = ""  # where the new run being started goes (the state line until it has a folder)
        self.eta.reset()
        self.commands.reset()

    def _clear(self) -> None:
        if self._follower is not None:
            self._follower.stop()
            self._follower.deleteLater()
            self._follower = None
        self._status_timer.stop()
        self._clock_timer.stop()
        self._replaying = False
        self._clear_run_facts()
        self._reset_plots()
        self.loss_plot.set_method(None)  # the next run's config says (or its metrics show) its method
        self.memory_plot.set_total(None)
        self.banner.hide()
        self.note_label.clear()
        self.log_view.clear()
