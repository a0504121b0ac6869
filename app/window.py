"""The main window: one tab per product panel, the status bar, and the wiring between panels.

Panels never know about each other: the window connects their signals (ConfigPanel says whether
the config is valid, TrainingPanel asks to start, RunsPanel opens a run) and tells the run-bound
tabs (Samples, Memory) which run is open. Later issues replace a tab's content with
`set_panel(name, widget)` without reshaping the window.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Optional

from PySide6.QtCore import QSettings, Signal
from PySide6.QtGui import QCloseEvent
from PySide6.QtWidgets import QMainWindow, QMessageBox, QTabWidget, QWidget

from app.dialogs import close as close_dialog
from app.panels.config import ConfigPanel
from app.panels.data import DataPanel
from app.engine.process import EngineProcess
from app.widgets.gpu_status import GpuStatusLabel, _import_pynvml
from app.panels.memory import MemoryTab
from app.panels.runs import RunsPanel
from app.panels.samples import SamplesPanel
from app.panels.training import TrainingPanel

PANELS = ("Config", "Data", "Training", "Samples", "Runs", "Memory")
REPLACEABLE = ("Data", "Samples", "Memory")
APP_NAME = "DMAD Studio"
ROOT_KEY = "runs/root"
DEFAULT_RUNS_ROOT = Path.home() / "dmad-runs"


def remembered_root(settings: QSettings) -> Path:
    value = settings.value(ROOT_KEY)
    return Path(str(value)).expanduser() if value else DEFAULT_RUNS_ROOT


class MainWindow(QMainWindow):
    run_changed = Signal(object)  # the open run folder (Path) or None

    def __init__(self, settings: QSettings, runs_root: Optional[Path] = None,
                 load_nvml: Callable[[], Any] = _import_pynvml, config_path: Optional[Path] = None,
                 unsaved_dir: Optional[Path] = None, parent: Optional[QWidget] = None,
                 probes_dir: Optional[Path] = None):
        """`config_path`: a config file to open instead of the CPU demo preset; `unsaved_dir`: where
        configs that are not saved as shown are written for the engine (default: per user);
        `probes_dir`: where the Memory tab's probes write their folders (default: per user)."""
        super().__init__(parent)
        self._settings = settings
        self._run: Optional[Path] = None
        self._state = ""
        self._close_when_stopped = False
        if runs_root is not None:
            settings.setValue(ROOT_KEY, str(runs_root))
        self.config = ConfigPanel(unsaved_dir=unsaved_dir)  # opens on the CPU demo preset
        self.data = DataPanel()
        self.training = TrainingPanel()
        self.samples = SamplesPanel()
        self.runs = RunsPanel(remembered_root(settings))
        self.memory = MemoryTab(self.config.materialize, lambda: EngineProcess(self), self._root_override,
                                probes_dir=probes_dir)
        self.tabs = QTabWidget()
        self.tabs.setDocumentMode(True)
        for name, widget in zip(PANELS, (self.config, self.data, self.training, self.samples, self.runs,
                                         self.memory)):
            self.tabs.addTab(widget, name)
        self.setCentralWidget(self.tabs)
        self.gpu = GpuStatusLabel(load_nvml)
        self.statusBar().addPermanentWidget(self.gpu)
        self._wire()
        if config_path is not None:
            self.config.load_file(config_path)
        self.training.set_start_enabled(self.config.is_valid(), self.config.validity_message())
        self._sync_config()
        self._update_title()
        self.resize(1280, 800)
        self.gpu.start()

    # ------------------------------------------------------------ layout

    def panel(self, name: str) -> QWidget:
        return self.tabs.widget(PANELS.index(name))

    def set_panel(self, name: str, widget: QWidget) -> None:
        """Replace the content of a place (a later issue's Data, Samples or Memory panel). The window
        keeps feeding it if it has the same methods: Data `set_config(raw, base_dir)`, Samples and
        Memory `set_run(run_dir)`."""
        if name not in REPLACEABLE:
            raise ValueError(f"{name} is wired by signals and cannot be replaced; replaceable: {', '.join(REPLACEABLE)}")
        i = PANELS.index(name)
        current = self.tabs.currentIndex()
        old = self.tabs.widget(i)
        self.tabs.removeTab(i)
        self.tabs.insertTab(i, widget, name)
        self.tabs.setCurrentIndex(current)
        setattr(self, name.lower(), widget)
        old.deleteLater()
        if name == "Memory":
            self._wire_memory()
        if name == "Data":
            self._sync_config()
        else:
            _call(widget, "set_run", self._run)
            if name == "Memory":
                _call(widget, "set_config", self.config.config(), self.config.base_dir())

    def show_panel(self, name: str) -> None:
        self.tabs.setCurrentIndex(PANELS.index(name))

    # ------------------------------------------------------------ wiring

    def _wire(self) -> None:
        self.config.validity_changed.connect(self.training.set_start_enabled)
        self.config.config_edited.connect(lambda _raw: self._sync_config())
        self.training.start_requested.connect(self._start)
        self.training.run_state_changed.connect(self._on_run_state)
        self.runs.run_opened.connect(self.open_run)
        self.runs.root_changed.connect(lambda root: self._settings.setValue(ROOT_KEY, str(root)))
        self.gpu.readings_received.connect(self._on_gpu)
        self.training.processes.valueChanged.connect(lambda n: _call(self.data, "set_processes", n))
        self._wire_memory()

    def _wire_memory(self) -> None:
        """A probe's "Apply to config" edits the Config form (also for a replacement Memory panel)."""
        signal = getattr(self.memory, "apply_requested", None)
        if signal is not None:
            signal.connect(self._apply_config_changes)

    def _apply_config_changes(self, changes: dict) -> None:
        self.config.apply_changes(changes)
        self.show_panel("Config")

    def _on_gpu(self, readings: list) -> None:
        # The first GPU, as the engine uses it by default; NVML's total is device-wide
        if readings:
            self.config.set_device(readings[0].name, readings[0].total_gb)

    def _sync_config(self) -> None:
        """The Data and Memory tabs follow the config; relative paths are relative to the config file."""
        _call(self.data, "set_config", self.config.config(), self.config.base_dir())
        _call(self.memory, "set_config", self.config.config(), self.config.base_dir())

    def _root_override(self) -> list[str]:
        # As TrainingPanel.start does: runs go under the window's runs root (JSON-quoted: always a string)
        return [f"identity.output_dir={json.dumps(str(self.runs.root().expanduser().resolve()))}"]

    def _start(self) -> None:
        warning = _call(self.data, "start_warning")  # the last data check of this config's data found errors
        if warning and QMessageBox.question(self, "Data check", warning, QMessageBox.Yes | QMessageBox.No,
                                            QMessageBox.No) != QMessageBox.Yes:
            return
        try:
            path = self.config.materialize()
        except (OSError, ValueError) as e:  # invalid form or unwritable folder: say so, start nothing
            self.statusBar().showMessage(f"Cannot start: {e}", 10000)
            return
        self.training.start(Path(path), self.runs.root())
        self.show_panel("Training")

    def open_run(self, run_dir: Path) -> None:
        """Show a run folder: its curves (reattaching when it is live), samples and memory."""
        run_dir = Path(run_dir)
        if self.training.open_run(run_dir) is False:  # our own engine is live: the panel says why
            self.show_panel("Training")
            return
        self._set_run(run_dir)
        self.show_panel("Training")

    def _on_run_state(self, state: str) -> None:
        self._state = state
        run = self.training.run_dir()
        # "starting": a new engine whose run folder is not known yet; the old run's tabs go blank
        self._set_run(Path(run) if run is not None else None)
        _call(self.samples, "refresh")  # a checkpoint or the end of a run usually brings new samples
        self.runs.refresh()
        if self._close_when_stopped and not self.training.is_live():
            self.close()

    def _set_run(self, run_dir: Optional[Path]) -> None:
        if run_dir != self._run:
            self._run = run_dir
            _call(self.samples, "set_run", run_dir)
            _call(self.memory, "set_run", run_dir)
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
        if not self.training.is_live():
            self._shutdown()
            event.accept()
            return
        name = self._run.name if self._run else "The run"
        choice = close_dialog.ask_close_during_run(self, name)
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
            event.ignore()

    def _shutdown(self) -> None:
        self.gpu.stop()


def _call(widget: QWidget, method: str, *args: Any) -> Any:
    """Panels that replace Data / Samples / Memory may not need what the window tells them (None)."""
    fn = getattr(widget, method, None)
    return fn(*args) if callable(fn) else None
