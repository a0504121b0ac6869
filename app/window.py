"""The main window: one tab per product panel, the status bar, and the wiring between panels.

Panels never know about each other: the window connects their signals (ConfigPanel says whether
the config is valid, TrainingPanel asks to start, RunsPanel opens a run) and tells the run-bound
tabs (Samples, Memory) which run is open. The run's lifecycle is the Training panel's RunState
(app/models/run_state.py, the Qt face of app/models/lifecycle.py): the window, the Runs panel and
the close question read it.

Opening a run also shows its own config.json in the Config tab, read-only; Start while a run is open
asks whether a new run is meant (or Continue). Where a new run goes (the Runs tab's folder:
app/models/run_target.py) is said before Start and used alike by Start, Dry run and the memory estimate.
Closing asks about unsaved config edits, then about a live run and a pending queue.

The run queue (the Queue tab; app/models/queue_runner.py) starts queued configs through the same
Start and Continue as the buttons, one at a time, and goes on when the app opens again.
"""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Callable, Optional

from PySide6.QtCore import QSettings, QTimer, Signal
from PySide6.QtGui import QCloseEvent
from PySide6.QtWidgets import QMainWindow, QMessageBox, QTabWidget, QWidget

from app.dialogs import close as close_dialog
from app.dialogs import start_question
from app.panels.config import ConfigPanel
from app.panels.data import DataPanel
from app.engine.process import EngineProcess
from app.models.resume import CONTINUABLE, continue_text
from app.models.run_target import new_run_folder, output_dir_note, root_override, start_tooltip
from app.widgets.run_notifier import RunNotifier
from app.widgets.gpu_status import GpuStatusLabel, import_pynvml
from app.panels.memory import MemoryTab
from app.panels.playground import PlaygroundPanel
from app.panels.queue import QueuePanel, default_queue_dir
from app.models.queue_runner import QueueRunner
from app.models.run_queue import RunQueue
from app.models.session import Draft, find_live_run, read_draft, remove_draft, write_draft
from app.engine.background import Task
from app.panels.runs import RunsPanel
from app.panels.samples import SamplesPanel
from app.panels.training import TrainingPanel, same_path

PANELS = ("Config", "Data", "Training", "Samples", "Playground", "Runs", "Queue", "Memory")
QUEUE_RESUME_MS = 3000  # after the window opens, an active queue goes on (the user sees it first)
QUEUE_NEXT_MS = 1500    # between a queued run's end and the next start
APP_NAME = "DMAD Studio"
ROOT_KEY = "runs/root"
CONFIG_FOLDER_KEY = "config/last_folder"  # where Open and Save as start
SESSION_TAB_KEY, SESSION_CONFIG_KEY = "session/tab", "session/config"
CONFIG_VIEW_KEY = "config/view"  # the form's Basic or Advanced view
DEFAULT_RUNS_ROOT = Path.home() / "dmad-runs"


def remembered_root(settings: QSettings) -> Path:
    value = settings.value(ROOT_KEY)
    return Path(str(value)).expanduser() if value else DEFAULT_RUNS_ROOT


class MainWindow(QMainWindow):
    run_changed = Signal(object)  # the open run folder (Path) or None

    def __init__(self, settings: QSettings, runs_root: Optional[Path] = None,
                 load_nvml: Callable[[], Any] = import_pynvml, config_path: Optional[Path] = None,
                 unsaved_dir: Optional[Path] = None, parent: Optional[QWidget] = None,
                 probes_dir: Optional[Path] = None, queue_dir: Optional[Path] = None,
                 session_dir: Optional[Path] = None):
        """`config_path`: a config file to open instead of the CPU demo preset; `unsaved_dir`: where
        configs that are not saved as shown are written for the engine (default: per user);
        `probes_dir`: where the Memory tab's probes write their folders (default: per user);
        `queue_dir`: the run queue's folder (default: per user); `session_dir`: where the session is
        remembered (the config draft); None: nothing is remembered or restored (tests, --screenshots)."""
        super().__init__(parent)
        self._settings = settings
        self._run: Optional[Path] = None
        self._state = ""
        self._close_when_stopped = False
        self._config_answered = False  # the close question about unsaved config edits was answered
        self._captions_answered = False  # ... about unsaved caption edits
        self._session_dir = session_dir
        self._keep_draft = False  # "Keep as a draft" was the close answer
        if runs_root is not None:
            settings.setValue(ROOT_KEY, str(runs_root))
        self.config = ConfigPanel(unsaved_dir=unsaved_dir)  # opens on the CPU demo preset
        last = settings.value(CONFIG_FOLDER_KEY)
        self.config.last_folder = Path(str(last)) if last else None
        self.config.folder_used.connect(lambda folder: settings.setValue(CONFIG_FOLDER_KEY, str(folder)))
        self.config.set_basic(str(settings.value(CONFIG_VIEW_KEY, "basic")) != "advanced")  # the view last chosen
        self.config.view_choice.currentIndexChanged.connect(lambda _i: settings.setValue(
            CONFIG_VIEW_KEY, "basic" if self.config.view_choice.currentData() else "advanced"))
        self.data = DataPanel()
        self.training = TrainingPanel()
        self.samples = SamplesPanel()
        self.runs = RunsPanel(remembered_root(settings))
        self.run_state = self.training.run_state
        self.config.set_run_overrides(self._root_override)  # Dry run names the folder Start will use
        self.memory = MemoryTab(self.config.materialize, lambda: EngineProcess(self), self._root_override,
                                probes_dir=probes_dir)
        self.queue_runner = self._make_queue(queue_dir or default_queue_dir())
        self.queue = QueuePanel(self.queue_runner)
        self.tabs = QTabWidget()
        self.tabs.setDocumentMode(True)
        self.playground = PlaygroundPanel()
        for name, widget in zip(PANELS, (self.config, self.data, self.training, self.samples, self.playground,
                                         self.runs, self.queue, self.memory)):
            self.tabs.addTab(widget, name)
        self.setCentralWidget(self.tabs)
        self.gpu = GpuStatusLabel(load_nvml)
        self.statusBar().addPermanentWidget(self.gpu)
        self.notifier = RunNotifier(self.run_state, lambda text: self.statusBar().showMessage(text, 60000), self)
        self.training.health_alert.connect(self.notifier.notify_health)
        self.queue_runner.notify.connect(self.notifier.notify)
        if self.queue_runner.queue.problem:
            self.statusBar().showMessage(f"Queue: {self.queue_runner.queue.problem}", 60000)
        QTimer.singleShot(QUEUE_RESUME_MS, self.queue_runner.resume_after_launch)
        self._wire()
        if config_path is not None:
            self.config.load_file(config_path)
        self.training.set_start_enabled(self.config.is_valid(), self.config.validity_message())
        self._sync_config()
        self._update_title()
        self.resize(1280, 800)
        self.gpu.start()
        if session_dir is not None:
            self._restore_session(settings, config_path is None)

    # ------------------------------------------------------------ layout

    def panel(self, name: str) -> QWidget:
        return self.tabs.widget(PANELS.index(name))

    def show_panel(self, name: str) -> None:
        self.tabs.setCurrentIndex(PANELS.index(name))

    # ------------------------------------------------------------ wiring

    def _wire(self) -> None:
        self.config.validity_changed.connect(self.training.set_start_enabled)
        self.config.config_edited.connect(lambda _raw: self._sync_config())
        self.runs.root_changed.connect(lambda _root: self._show_target())
        self.runs.run_renamed.connect(self._on_run_renamed)
        self.runs.run_deleted.connect(self._on_run_deleted)
        self.training.start_requested.connect(self._start)
        self.run_state.state_changed.connect(self._on_run_state)
        self.runs.watch(self.run_state)
        self.runs.run_opened.connect(self.open_run)
        self.runs.continue_requested.connect(self.continue_run)
        self.runs.root_changed.connect(lambda root: self._settings.setValue(ROOT_KEY, str(root)))
        self.gpu.readings_received.connect(self._on_gpu)
        self.training.processes.valueChanged.connect(self.data.set_processes)
        self.training.processes.valueChanged.connect(self.config.ledger_view.set_processes)
        # DDP / FSDP beside Processes is the config's resources.distributed: picking one edits the
        # config (one source of truth), and the config's value is what the box shows
        self.training.controls.distributed_chosen.connect(self._choose_distributed)
        self.config.ledger_view.ledger_shown.connect(
            lambda report: self.training.controls.show_per_gpu(report.by_distributed,
                                                               report.inputs.get("processes", 1)))
        self.memory.apply_requested.connect(self._apply_config_changes)  # a probe's "Apply to config"
        self.queue.add_requested.connect(self.queue_config)
        self.config.queue_requested.connect(self.queue_config)
        self.queue.open_requested.connect(self.open_run)
        self.playground.ab_requested.connect(self._show_ab)
        self.playground.live_sender = self.training.commands.send_one_off  # current weights of a live run
        self.training.commands.one_off_rendered.connect(lambda _data: self.playground.live_rendered())

    def _show_ab(self, label_a: str, path_a: Path, label_b: str, path_b: Path) -> None:
        """The Playground's pair in the Samples tab's A/B window (one A/B window for the app)."""
        self.samples.ab.set_pair(label_a, path_a, label_b, path_b)
        self.samples.ab.show_beside(self)

    # ------------------------------------------------------------ the run queue

    def _make_queue(self, folder: Path) -> QueueRunner:
        busy = lambda: (self.run_state.is_live() or self.training.opening() is not None  # noqa: E731
                        or self.training.engine.is_running())  # an engine that said "finished" and has not exited
        return QueueRunner(RunQueue(folder).load(), self.run_state, self._start_queued, self.continue_run,
                           self.open_run, busy, self, next_ms=QUEUE_NEXT_MS)

    def _start_queued(self, config: Path) -> None:
        """The queue's turn: a new run of the queued copy, as Start makes one (the Runs tab's folder)."""
        self.training.start(config, self.runs.root())

    def queue_config(self) -> bool:
        """Queue the Config tab's config as Start would run it (a run's own config: run_name cleared)."""
        if self.config.is_read_only() and not self.config.new_run_from_view():
            return False
        try:
            raw, label = self.config.runnable_copy()
            entry = self.queue_runner.add(raw, label)
        except (OSError, ValueError) as e:  # invalid, or the queue folder cannot be written
            self.statusBar().showMessage(f"Cannot queue: {e}", 10000)
            return False
        self.statusBar().showMessage(f"Queued {entry.label} ({self.queue_runner.queue.waiting()} waiting)", 10000)
        return True

    def _apply_config_changes(self, changes: dict) -> None:
        self.config.apply_changes(changes)
        self.show_panel("Config")

    def _on_gpu(self, readings: list) -> None:
        # The first GPU, as the engine uses it by default; NVML's total is device-wide
        if readings:
            self.config.set_device(readings[0].name, readings[0].total_gb)

    def _sync_config(self) -> None:
        """The Data and Memory tabs follow the config; relative paths are relative to the config file."""
        self.data.set_config(self.config.config(), self.config.base_dir())
        self.memory.set_config(self.config.config(), self.config.base_dir())
        self._show_distributed()
        self._show_target()

    def _show_distributed(self) -> None:
        resources = self.config.config().get("resources")
        value = resources.get("distributed", "ddp") if isinstance(resources, dict) else "ddp"
        self.training.controls.show_distributed(value)

    def _choose_distributed(self, value: str) -> None:
        """DDP / FSDP picked beside Processes: the config's field is set (a run's own config shown
        read-only stays as it is, and the box goes back to what it says)."""
        self.config.apply_changes({"resources.distributed": value})
        self._show_distributed()

    def _show_target(self) -> None:
        """Where Start would put a new run, said before Start (the state line and Start's tooltip)."""
        root, raw = self.runs.root(), self.config.config()
        self.training.set_new_run_target(new_run_folder(root, raw), start_tooltip(root, raw, self.config.base_dir()))
        self.config.form.set_fixed(("identity", "output_dir"), output_dir_note(root, raw, self.config.base_dir()))

    def _root_override(self) -> list[str]:
        # Start, Dry run and the memory estimate alike: runs go under the Runs tab's folder
        return root_override(self.runs.root())

    def _start(self) -> None:
        if not self._new_run_meant():
            return
        warning = self.data.start_warning()  # the last data check of this config's data found errors
        if warning and QMessageBox.question(self, "Data check", warning, QMessageBox.Yes | QMessageBox.No,
                                            QMessageBox.No) != QMessageBox.Yes:
            return
        if self.config.is_read_only() and not self.config.new_run_from_view():  # never the run's own name
            return
        try:
            path = self.config.materialize()
        except (OSError, ValueError) as e:  # invalid form or unwritable folder: say so, start nothing
            self.statusBar().showMessage(f"Cannot start: {e}", 10000)
            return
        self.training.start(Path(path), self.runs.root())
        self.show_panel("Training")

    def _new_run_meant(self) -> bool:
        """Start while a run is open: a new run, or did the user mean Continue? Asked, never guessed."""
        run, state = self.run_state.run_dir, self.run_state.state
        if run is None or self.run_state.is_live():
            return True
        known, checkpoint = self.training.resume.point_for(run)
        text = continue_text(state, checkpoint, known)[0] if state in CONTINUABLE else ""
        viewing = self.config.is_read_only()  # the run's own config: its run_name is cleared first
        source = (f"{run.name}'s config (run_name cleared)" if viewing
                  else f"the config in the Config tab ({self.config.document_name()})")
        choice = start_question.ask_start_while_open(self, run.name, text, source,
                                                     new_run_folder(self.runs.root(), None if viewing else
                                                                    self.config.config()))
        if choice == start_question.CONTINUE:
            self.training.continue_run()
            self.show_panel("Training")
        return choice == start_question.NEW

    def open_run(self, run_dir: Path, then: Optional[Callable[[], None]] = None) -> bool:
        """Show a run folder: its curves (reattaching when it is live), samples, memory and its own
        config (read-only in the Config tab). Every panel reads the folder in workers: the Training
        panel shows the run when its reads are in (its `opened`), then runs `then()`."""
        run_dir = Path(run_dir)
        self.show_panel("Training")
        if self.training.open_run(run_dir, then) is False:  # our own engine is live: the panel says why
            return False
        self._set_run(run_dir)
        self.config.show_run_config(run_dir)
        return True

    def _shows(self, path: Path) -> bool:
        """Whether `path` is the run the window shows (however the Runs tab spells its folder: a
        symlinked or relative runs root names the same run)."""
        shown = self._run or self.run_state.run_dir
        return shown is not None and same_path(shown, path)

    def _on_run_renamed(self, old: Path, new: Path) -> None:
        if self._shows(old) and not self.run_state.is_live():
            self.open_run(new)  # the shown run moved: show it where it is now

    def _on_run_deleted(self, path: Path) -> None:
        if self._shows(path) and not self.run_state.is_live():
            self.training.forget_run()
            self._set_run(None)
        shown = self.config.shown_run()
        if shown is not None and same_path(shown, path):
            self.config.back_to_document()

    def continue_run(self, run_dir: Path) -> None:
        """Show a stopped or failed run and continue it in its folder. The panel decides from the
        status.json it just read (in a worker), not from the Runs panel's last scan (the run may have moved)."""
        self.open_run(run_dir, then=self.training.continue_run)

    def _on_run_state(self, state: str) -> None:
        self._state = state
        # "starting": a new engine whose run folder is not known yet; the old run's tabs go blank
        self._set_run(self.run_state.run_dir)
        self.samples.refresh()  # a checkpoint or the end of a run usually brings new samples
        self.playground.set_live(self.run_state.is_live() and self.training.engine.is_running())
        self.playground.refresh()
        if self._close_when_stopped and not self.run_state.is_live():
            self.close()

    def _set_run(self, run_dir: Optional[Path]) -> None:
        if run_dir != self._run:
            self._run = run_dir
            self.samples.set_run(run_dir)
            self.playground.set_run(run_dir)
            self.memory.set_run(run_dir)
            self.run_changed.emit(run_dir)
        self._update_title()

    def run_dir(self) -> Optional[Path]:
        return self._run

    def _update_title(self) -> None:
        if self._run is None:
            self.setWindowTitle(APP_NAME)
            return
        state = f" [{self._state}]" if self._state else ""
        self.setWindowTitle(f"{self._run.name}{state} - {APP_NAME}")

    # ------------------------------------------------------------ closing

    def closeEvent(self, event: QCloseEvent) -> None:
        if not self._config_settled() or not self._captions_settled():
            event.ignore()
            return
        if not self.run_state.is_live():
            if not self._queue_settled():
                event.ignore()
                return
            self._shutdown()
            event.accept()
            return
        runner = self.queue_runner
        choice = close_dialog.ask_close_during_run(self, self.run_state, runner.queue.waiting() if runner.queue.active
                                                   else 0)
        if choice != close_dialog.CANCEL:
            runner.closing()  # a queued run stopped now is continued when the queue goes on
        if choice == close_dialog.STOP:
            # The engine needs time to write its checkpoint; the window closes when it has stopped.
            self._close_when_stopped = True
            self.training.stop_run()
            self.statusBar().showMessage("Stopping: the engine is saving a checkpoint; the window closes "
                                         "when it has stopped.")
            event.ignore()
        elif choice == close_dialog.LEAVE:
            self.training.leave_running()
            self._shutdown()
            event.accept()
        else:
            self._close_when_stopped = False
            self._config_answered = self._captions_answered = False  # a later close asks again: the edits may go on
            event.ignore()

    def _captions_settled(self) -> bool:
        """Caption edits in the Data tab not saved yet: close without them, or cancel the close."""
        n = self.data.browser.unsaved()
        if not n or self._captions_answered:
            return True
        self._captions_answered = QMessageBox.question(
            self, "Unsaved captions", f"{n} caption edit{'s are' if n != 1 else ' is'} not saved (Data tab). Close "
            "without saving them?", QMessageBox.Discard | QMessageBox.Cancel, QMessageBox.Cancel) == QMessageBox.Discard
        return self._captions_answered  # asked once: a close that waits for a run to stop does not ask again

    def _queue_settled(self) -> bool:
        """Runs waiting in an active queue: keep it for the next launch, pause it, or cancel the close."""
        queue = self.queue_runner.queue
        if not queue.active or not queue.pending() or self.queue_runner.is_closing():  # asked with the run's question
            return True
        choice = close_dialog.ask_close_with_queue(self, queue.pending())
        if choice == close_dialog.PAUSE:
            self.queue_runner.pause("paused when the app closed")
        if choice != close_dialog.CANCEL:
            self.queue_runner.closing()
        return choice != close_dialog.CANCEL

    def _config_settled(self) -> bool:
        """Unsaved config edits: Save (Save as… for an untitled one), Discard, or Cancel the close.
        Asked once: a close that waits for a run to stop does not ask again."""
        if self._config_answered or not self.config.has_unsaved_changes():
            return True
        choice = close_dialog.ask_unsaved_config(self, self.config.document_name(), draft=self._session_dir is not None)
        self._keep_draft = choice == close_dialog.DRAFT
        if choice == close_dialog.CANCEL or (choice == close_dialog.SAVE and not self.config.save_before_close()):
            return False
        self._config_answered = True
        return True

    def _shutdown(self) -> None:
        self.gpu.stop()
        self._remember_session()

    # ------------------------------------------------------------ the session (app/models/session.py)

    def _restore_session(self, settings: QSettings, restore_config: bool) -> None:
        """The last session's tab and config (its draft, else its file), and a run left training."""
        self._drafts = Task(self, pool=self._draft_pool())  # writes and removals, in order
        self._draft_read = Task(self)
        self._draft_read.done.connect(self._on_draft_read)
        self._live = Task(self)
        self._live.done.connect(self._on_live_run)
        tab = settings.value(SESSION_TAB_KEY)
        if tab in PANELS:
            self.show_panel(str(tab))
        last = settings.value(SESSION_CONFIG_KEY)
        if restore_config:
            folder = self._session_dir
            self._draft_read.submit(lambda: (read_draft(folder), str(last) if last else ""))
        root = self.runs.root()
        self._live.submit(lambda: find_live_run(root))
        self.config.config_edited.connect(lambda _raw: self._save_draft())

    def _draft_pool(self):
        from PySide6.QtCore import QThreadPool

        self._draft_threads = QThreadPool(self)
        self._draft_threads.setMaxThreadCount(1)  # drafts are written in the order they were made
        return self._draft_threads

    def _on_draft_read(self, answer) -> None:
        draft, last = answer
        if self.config.has_unsaved_changes() or self.config.is_read_only():
            self._keep_draft = self._keep_draft or draft is not None  # not shown: kept for the next launch
            return  # the user is already at work (or a run's config is shown): nothing replaces it
        if draft is not None:
            self.config.restore_draft(draft.raw, draft.base_dir, draft.path, draft.label)
            self.statusBar().showMessage(f"Reopened {draft.label} as it was at the end of the last session "
                                         "(not saved: Save or Save as keeps it)", 30000)
        elif last and Path(last).is_file():
            self.config.load_file(Path(last))

    def _on_live_run(self, run_dir) -> None:
        if (run_dir is None or self.run_state.run_dir is not None or self.run_state.is_live()
                or self.training.opening() is not None):
            return
        self.open_run(run_dir)
        self.statusBar().showMessage(f"Following {run_dir.name}: it is still training from the last session", 60000)

    def _save_draft(self) -> None:
        if self._session_dir is None or self.config.is_read_only():
            return
        folder, doc = self._session_dir, self.config.doc
        if self.config.has_unsaved_changes():
            draft = Draft(copy.deepcopy(doc.raw), doc.base_dir, doc.path, self.config.document_name())
            self._drafts.submit(lambda: write_draft(folder, draft))
        else:
            self._drafts.submit(lambda: remove_draft(folder))

    def _remember_session(self) -> None:
        if self._session_dir is None:
            return
        settings = self._settings
        settings.setValue(SESSION_TAB_KEY, PANELS[self.tabs.currentIndex()])
        doc = self.config.doc
        saved = doc.path is not None and not doc.is_modified()
        settings.setValue(SESSION_CONFIG_KEY, str(doc.path) if saved else "")
        if not self._keep_draft:  # saved or discarded at close: no draft to reopen
            self._drafts.submit(lambda folder=self._session_dir: remove_draft(folder))
        self._draft_threads.waitForDone(3000)  # the last draft write or removal lands before the app ends
