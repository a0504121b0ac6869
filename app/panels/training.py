"""The Training panel: start / pause / resume / stop a run, watch its losses, memory and step time.

It only shows the run. Its lifecycle is `lifecycle`, rules without Qt (app/models/lifecycle.py), fed by
`source` (app/models/run_source.py) from the engine this panel starts (EngineProcess), the run's
events.jsonl (a run opened from disk: its history, then, while it is live, what it writes next: a
reattach) and its status.json; `run_state` (app/models/run_state.py) is its Qt face, which the window
and the Runs panel observe. Events only append to the SeriesStore; a PlotFeed
(app/widgets/plot_feed.py) pushes changed series to their curves at <= 15 Hz.

Continue (`continue_run`) runs `dmad train --resume latest` on the shown run, in its own folder.
Commands go through RunCommands (app/dialogs/run_commands.py): a Stop that takes long offers Stop now
(no checkpoint), then Kill, in the stop bar; "Sample prompt…" shows its one-off image when it comes.
The ETA is the recent pace smoothed (app/models/eta.py), not the engine's jumpy eta_s.

The GUI thread reads nothing from a run folder (a stalled network drive would freeze the window):
opening a run reads its status.json, config.json and engine.log tail in a pool worker
(app/models/run_open.py) and shows the run when the answer comes (`opened`); events.jsonl, health.csv,
status.json polls and the checkpoints are read in workers too. An open that a newer one (or Start,
Continue) overtook is dropped; a read that fails is one line in the panel.
"""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Callable, Optional, Sequence

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtWidgets import QSplitter, QVBoxLayout, QWidget

from app.dialogs.launch import edit_machines
from app.dialogs.run_commands import RunCommands
from app.engine.command import exit_meaning
from app.engine.process import EngineProcess, describe_event
from app.models.controls import enabled_controls, state_line
from app.models.eta import EtaSmoother
from app.models.lifecycle import LIVE, LOG_LINES, Failure, RunLifecycle
from app.models.methods import read_method
from app.models.run_open import OpenedRun
from app.models.resume import CONTINUABLE, ResumeLookup, continue_text
from app.models.run_source import RunSource
from app.models.run_state import RunState
from app.models.run_target import root_override
from app.models.series import SeriesStore
from app.engine.background import Task
from app.panels.training_health import HealthFeed
from app.panels.training_open import RunOpener
from app.widgets.failure_banner import FailureBanner, HealthBanner
from app.widgets.log_tail import LogTail
from app.widgets.plot_board import PlotBoard
from app.widgets.plot_feed import PlotFeed
from app.widgets.run_controls import RunControls
from app.widgets.plots import StepMarks
from app.widgets.run_numbers import RunNumbers
from app.widgets.stop_bar import StopBar
from dmad.contract.runs import LIVE_STATES, RunFolder


def same_path(a: Path, b: Path) -> bool:
    """The same folder by name (absolute, normalised): no stat, which a stalled drive would hold."""
    return os.path.normpath(os.path.abspath(a)) == os.path.normpath(os.path.abspath(b))


class TrainingPanel(QWidget):
    start_requested = Signal()
    run_state_changed = Signal(str)  # the lifecycle's state, after this panel's own timers followed it
    plots_refreshed = Signal(int)  # the newest plotted iteration, after setData ran
    health_alert = Signal(str)  # a new health alert of the followed run, seen live: one line (notification)
    opened = Signal(object)  # the run folder (Path) an open_run asked for is shown, or its one-line error is

    def __init__(self, parent: Optional[QWidget] = None, engine_command: Optional[Sequence[str]] = None):
        super().__init__(parent)
        self.engine = EngineProcess(self, command=engine_command)
        self.engine.log_received.connect(self._log)
        # first: a refused Continue reopens the run, which may be live (another engine writes it)
        self.engine.finished.connect(lambda *_: self._clock_timer.stop())
        self.lifecycle = lc = RunLifecycle()
        self.run_state = RunState(lc, self)
        self.run_state.state_changed.connect(self._on_state_changed)
        lc.failed.connect(self._show_failure)
        lc.noted.connect(lambda line: self.note_label.setText(line))
        lc.refused.connect(self._refused)
        self.source = RunSource(lc, self.engine, lambda: self.stopping.killed, self)
        self.source.event_received.connect(self._show_event)
        self.source.rewound.connect(self._rewound)
        self.source.fed.connect(self._refresh)
        self.engine.finished.connect(lambda *_: self.feed.refresh())  # the last points, drawn now
        self.store = SeriesStore()
        self.opener = RunOpener(self)  # what open_run shows first, read in a worker (app/panels/training_open.py)
        self.opener.opened.connect(self._opened)
        self.opener.failed.connect(self._open_failed)
        self.method_reads = Task(self)  # the method of the config a Start or Continue runs: which plots it fills
        self.method_reads.done.connect(lambda method: self.loss_plot.set_method(method))
        self._start_allowed, self._start_reason = True, ""
        self.resume = ResumeLookup(self)  # what Continue would do: the checkpoints on disk, read in a worker
        self.resume.found.connect(self._update_buttons)
        self.eta = EtaSmoother()  # the ETA shown: the recent pace, smoothed (the engine's eta_s jumps)
        # control.jsonl commands, and what a Stop that takes long offers: Stop now, then Kill
        self.commands = RunCommands(self, self.engine, self.run_state, lambda: self.lifecycle.status)
        self.commands.sent.connect(lambda cmd: self._then(lc.command_sent, cmd))
        self.commands.refused.connect(lambda line: self.note_label.setText(line))
        self.commands.escalated.connect(lambda: self._update_numbers())
        self.stopping = self.commands.stopping
        self._target = ("", "")  # (folder, Start's tooltip) of a new run: said before Start (set_new_run_target)
        self._clock_timer = QTimer(self, interval=1000, timeout=self._update_numbers)
        self._build()
        self._refresh()

    # ------------------------------------------------------------ layout

    def _build(self) -> None:
        self.controls = RunControls()
        self.buttons, self.processes = self.controls.buttons, self.controls.processes
        for key, slot in (("start", lambda: self.start_requested.emit()), ("continue", self.continue_run),
                          ("pause", lambda: self.commands.send("pause")),
                          ("resume", lambda: self.commands.send("resume")), ("stop", self.stop_run),
                          ("sample", lambda: self.commands.send("sample_now")),
                          ("sample_prompt", self.commands.ask_prompt),
                          ("checkpoint", lambda: self.commands.send("checkpoint_now"))):
            self.buttons[key].clicked.connect(slot)
        self.controls.machines_requested.connect(
            lambda: edit_machines(self, self.controls.machines, self.processes.value(), self.controls.show_machines))
        self.stop_bar = StopBar()
        self.stop_bar.stop_now_requested.connect(self.commands.stop_now)
        self.stop_bar.kill_requested.connect(self.commands.kill)
        self.banner = FailureBanner()
        self.health_banner = HealthBanner()
        self.numbers = RunNumbers()
        self.note_label, self.state_label = self.numbers.note_label, self.numbers.state_label
        # loss_plot: every metric plot and its controls (app/widgets/plot_board.py)
        self.loss_plot = PlotBoard(run_dir=lambda: self.lifecycle.run_dir)
        self.memory_plot, self.step_plot = self.loss_plot.memory_plot, self.loss_plot.step_plot
        self.step_marks = StepMarks(self.step_plot)
        self.feed = PlotFeed(self.store, (self.loss_plot,), self)
        self.feed.refreshed.connect(lambda: self.plots_refreshed.emit(
            -1 if self.lifecycle.iteration is None else self.lifecycle.iteration))
        self.loss_plot.display_changed.connect(lambda: self.feed.mark(self.store.names()))
        # the Health page's rows and alerts (app/panels/training_health.py)
        self.health = HealthFeed(self.store, self.feed, self.health_banner, lambda: self.lifecycle.replaying, self)
        self.health.alert.connect(self.health_alert)
        self.health.problem.connect(self._log)
        self.log_view = LogTail()
        split = QSplitter(Qt.Vertical)
        for w in (self.loss_plot, self.log_view):
            split.addWidget(w)
        split.setSizes([750, 130])  # proportions: the splitter scales them to the panel
        layout = QVBoxLayout(self)
        for w in (self.controls, self.stop_bar, self.banner, self.health_banner, self.numbers):
            layout.addWidget(w)
        layout.addWidget(split, 1)

    # ------------------------------------------------------------ public API

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
        if self.lifecycle.is_live():
            self.note_label.setText("a run is already live here: stop it first")
            return False
        self._launch(Path(config_path), lambda: self.lifecycle.start(self._target[0], time.time()),
                     overrides=root_override(runs_root))
        return True

    def open_run(self, run_dir: Path, then: Optional[Callable[[], None]] = None) -> bool:
        """Show a run from its folder; if it is live, keep following it (reattach). Its files are read
        in a worker: the run is shown when they are in (`opened`), then `then()` runs. False when our
        engine is live (the panel says why)."""
        run_dir = Path(run_dir)
        if self.engine.is_running():
            current = self.lifecycle.run_dir
            if current is not None and same_path(run_dir, current):
                return True
            self.note_label.setText("the run started here is still live: stop it before opening another")
            return False
        self._clear()
        self.opener.open(run_dir, then)
        self._refresh()  # every run-bound control waits for the answer
        self.note_label.setText(f"reading {run_dir.name} ...")
        return True

    def opening(self) -> Optional[Path]:
        """The run folder an open_run is reading now (None: none)."""
        return self.opener.waiting()

    def _opened(self, run: OpenedRun, then: Optional[Callable[[], None]]) -> None:
        """The latest open's reads are in (_clear drops an open under way): show it."""
        self.note_label.clear()
        self.loss_plot.set_method(run.method)
        self.log_view.show_tail(run.log_tail)
        self.lifecycle.open(run.run_dir, run.status)
        live = self.lifecycle.state in LIVE_STATES
        self.source.follow(run.run_dir, live)
        self.health.read(run.run_dir)
        self._look_up_resume_point()  # the state may be the one shown before: no state_changed then
        if live:
            self._clock_timer.start()
        self._refresh()
        self.opened.emit(run.run_dir)
        if then is not None:
            then()

    def _open_failed(self, run_dir: Path, message: str) -> None:
        self._refresh()
        self.note_label.setText(f"could not open {run_dir.name}: {' '.join(message.split())}")
        self.opened.emit(run_dir)

    def continue_run(self) -> bool:
        """Continue the shown run in its own folder with this panel's process settings: `dmad train
        --config <run>/config.json --run-dir <run> --resume latest` goes on from its newest complete
        checkpoint, or starts again from iteration 0 when it has none."""
        run_dir, state = self.lifecycle.run_dir, self.lifecycle.state
        if self.opening() is not None:
            self.note_label.setText(f"{self.opening().name} is still being read: continue it once it shows")
            return False
        if run_dir is None or state not in CONTINUABLE or self.engine.is_running():
            self.note_label.setText(f"only a stopped or failed run can be continued (this one is {state})")
            return False
        self._launch(RunFolder(run_dir).config_json, lambda: self.lifecycle.continue_run(run_dir, time.time()),
                     run_dir=run_dir, resume="latest")
        return True

    def _launch(self, config: Path, change: Callable[[], None], **where) -> None:
        """`dmad train` on `config` after the lifecycle's `change` (start or continue), with this
        panel's process settings; `where`: run_dir / resume (a Continue) or overrides (a Start)."""
        self._clear()
        self.method_reads.submit(lambda: read_method(config))  # which plots the run fills
        change()
        run_dir = where.get("run_dir")
        if run_dir is not None:  # the history for the plots; the engine says what happens
            self.source.follow(run_dir, live=True)
            self.health.read(run_dir)
        self._clock_timer.start()
        self.engine.start_train(config, num_processes=self.processes.value(), machines=self.controls.machines, **where)
        self._refresh()  # after the process starts: Stop reaches it at once (SIGTERM), not at its first event

    def stop_run(self) -> None:
        """Graceful stop: the engine saves a checkpoint at the next iteration boundary."""
        if self.commands.stop():
            self._then(self.lifecycle.stop_requested)

    def forget_run(self) -> None:
        """The shown run's folder is gone (deleted in the Runs tab): show nothing."""
        if not self.lifecycle.is_live():
            self._clear()
            self._then(self.lifecycle.clear)

    def leave_running(self) -> None:
        """The app closes but the run goes on; this panel keeps following it through its folder."""
        run_dir = self.engine.run_dir()
        self.engine.detach()
        if run_dir is not None and self.lifecycle.is_live():
            self.open_run(run_dir)

    # ------------------------------------------------------------ display

    def _then(self, change, *args) -> None:
        """One change of the lifecycle, then show where the run stands."""
        change(*args)
        self._refresh()

    def _on_state_changed(self, state: str) -> None:
        """Whoever moved the lifecycle: this panel's clock follows first."""
        if state not in LIVE:
            self._clock_timer.stop()
        self._look_up_resume_point()  # an ended run's checkpoints are final: what would Continue do?
        self.run_state_changed.emit(state)

    def _look_up_resume_point(self) -> None:
        if self.lifecycle.run_dir is not None and self.lifecycle.state in CONTINUABLE:
            self.resume.look_up(self.lifecycle.run_dir)

    def _show_event(self, ev: dict) -> None:
        """What an event shows besides the lifecycle: plots, the ETA, the log, a one-off sample."""
        kind, it, data = ev["kind"], ev["iter"], ev["data"]
        if kind == "metric" and data.get("source") == "sampler":
            return  # a memory sampler reading (gpu_mem.csv; the Memory tab shows those), not an iteration
        self.eta.note_event(kind, it, data, ev["t"])
        self.commands.note_event(kind, it, data, replayed=self.lifecycle.replaying)
        if kind == "metric":
            if self.store.add_metric(it, data, t=ev["t"]):  # t: the wall-clock x axis
                self.feed.schedule()
            if isinstance(data.get("mem_device_total_gb"), (int, float)):
                self.memory_plot.set_total(float(data["mem_device_total_gb"]))
            return
        if kind == "health":
            self.health.show_event(it, data)
        self.step_marks.note_event(kind, it, data, ev["t"])
        if kind == "started" and data.get("effective_batch"):
            self.note_label.setText(f"effective batch {data['effective_batch']} "
                                    f"({data.get('num_processes', 1)} process(es))")
        self._log(describe_event(kind, it, data))

    def _show_failure(self, failure: Failure) -> None:
        lines = failure.log_lines if failure.log_lines is not None else self.log_view.last_lines(LOG_LINES)
        self.banner.show_report(failure.title, failure.details, lines)

    def _refused(self, run_dir: Path, line: str) -> None:
        """The engine would not continue the run (exit 2: another engine writes the folder, or its
        config no longer passes) and changed nothing: show the folder as it is, and the one line why."""
        title = f"Could not continue {run_dir.name} - exit code 2 ({exit_meaning(2)})"
        self.open_run(run_dir, then=lambda: self.banner.show_report(title, [line]))

    def _refresh(self) -> None:
        self._update_buttons()
        self._update_numbers()

    def _update_buttons(self) -> None:
        lc, running = self.lifecycle, self.engine.is_running()
        s, has_dir = lc.state, lc.run_dir is not None
        for key, enabled in enabled_controls(s, has_dir, running, lc.pending, self._start_allowed).items():
            self.buttons[key].setEnabled(enabled and (self.opening() is None or key == "start"))
        self.buttons["start"].setToolTip(self._target[1] if self._start_allowed else self._start_reason)
        known, checkpoint = self.resume.point_for(lc.run_dir)
        self.controls.show_continue(has_dir and s in CONTINUABLE and not running and self.opening() is None,
                                    *continue_text(s, checkpoint, known))
        self.state_label.setText(state_line(s, lc.pending, lc.phase, self._target[0], lc.starting_in, has_dir))

    def _update_numbers(self) -> None:
        lc, now = self.lifecycle, time.time()
        eta = self.eta.eta(now if lc.state == "running" else None) if lc.is_live() else None
        self.numbers.show_numbers(lc.iteration, lc.max_steps, lc.step_time_s, eta, lc.elapsed(now))
        self.stop_bar.show_offer(self.commands.offer())

    def _log(self, line: str) -> None:
        self.log_view.appendPlainText(line)

    def _reset_plots(self) -> None:
        self.store.reset()
        self.health.reset()
        self.loss_plot.reset()  # every plot: data, legend entries, ranges

    def _rewound(self) -> None:
        """events.jsonl was cut back by a resume (and health.csv with it): show it again from the start."""
        self._reset_plots()
        if self.lifecycle.run_dir is not None:
            self.health.read(self.lifecycle.run_dir)

    def _clear(self) -> None:
        """Before another run is shown: stop reading the last one and empty what showed it."""
        self.source.clear()
        self.opener.reset()  # an open still being read answers nobody
        self.method_reads.reset()
        self._clock_timer.stop()
        self.eta.reset()
        self.commands.reset()
        self._reset_plots()
        self.loss_plot.set_method(None)  # the next run's config says (or its metrics show) its method
        self.memory_plot.set_total(None)
        self.banner.hide()
        self.health_banner.hide()
        self.note_label.clear()
        self.log_view.clear()
