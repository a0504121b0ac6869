"""The Config panel: the form generated from the engine's schema beside the raw JSON, both editing one
raw config dict that the engine's own validation judges as you type; presets, open / save / save as,
and the engine's dry run (resolved config + memory ledger).

The document is `doc` (app/models/document.py), a model with events: the form, the JSON view, the
file label and the memory estimate redraw from its `changed`, and each edit goes back into it, so the
panel never copies the config in or out by hand.

Relative paths in a config are relative to its file's folder (dmad.contract.config.resolve_paths), so the
document keeps a base folder: a preset's is the preset's folder, a file's is its folder. Save as
rewrites relative paths for the new folder, and materialize() writes a copy with absolute paths, so
neither changes what the config means.

An opened run's config.json is shown read-only (show_run_config, read in a worker) while the document
being edited waits aside, unchanged: "New run from this config" turns the run's config into an editable
unsaved document with run_name cleared, "Back to my config" brings the waiting one back. Dry run gets
the same identity.output_dir override as Start (set_run_overrides), so both name the same folder.

Valid means well formed (the engine's schema, at once) and every path there and of the right kind
(app/models/path_check.py, checked in a worker after each change): a preset's `path/to/...` is red
and Start is disabled with the reason, before the engine would refuse it.
"""
from __future__ import annotations

import copy
from datetime import datetime
from pathlib import Path
from typing import Any, Callable, Optional

from PySide6.QtCore import QStandardPaths, Qt, Signal
from PySide6.QtWidgets import (QComboBox, QDialog, QFileDialog, QHBoxLayout, QLabel, QMenu, QMessageBox, QPushButton, QScrollArea,
                               QSplitter, QTabWidget, QToolButton, QVBoxLayout, QWidget)

from app.models.field_labels import BASIC
from app.models.config_doc import form_spec, materialized, read_run_config, rebase_paths, to_json_text
from app.models.document import DOCUMENT, FORM, JSON, Document
from app.widgets.config_form import ERROR_LABEL_STYLE, ConfigForm
from app.widgets.elided_label import ElidedLabel
from app.widgets.run_config_banner import RunConfigBanner
from app.widgets.dry_run_view import DryRunView
from app.engine.background import Task
from app.models.path_check import path_problems
from app.widgets.json_view import JsonView
from app.widgets.ledger_view import LedgerView
from app.models.presets import (Preset, check_preset_name, delete_user_preset, presets, save_user_preset,
                                user_presets)
from app.models.methods import method_of, unused_fields
from dmad.errors import UserInputError
from dmad.contract.jsonfile import read_json_file
from dmad.contract.paths import resources_dir
from dmad.contract.runs import atomic_write_text


class ConfigInvalid(ValueError):
    """materialize() on a config the engine would reject; the message is the engine's one line."""


def default_unsaved_dir() -> Path:
    """Where materialize() writes configs that are not saved as shown: per user, kept (each run's
    command.txt names the file it was started with)."""
    return Path(QStandardPaths.writableLocation(QStandardPaths.StandardLocation.AppDataLocation)) / "unsaved"


def _is_builtin(path: Path) -> bool:
    """Shipped configs are templates: Save on one asks for a new file instead of overwriting it."""
    return path.resolve().is_relative_to(resources_dir().resolve())


class ConfigPanel(QWidget):
    validity_changed = Signal(bool, str)  # valid?, the first problem as the engine words it ("" when valid)
    queue_requested = Signal()            # "Add to queue": the window queues runnable_copy()
    folder_used = Signal(object)          # the folder a config was opened from or saved to (Path): remembered
    config_edited = Signal(dict)          # the raw config after any change (form, JSON, file, preset)
    modified_changed = Signal(bool)

    def __init__(self, parent: Optional[QWidget] = None, unsaved_dir: Optional[Path] = None,
                 engine_command: Optional[list[str]] = None, presets_dir: Optional[Path] = None):
        """`engine_command` replaces the `dmad` command line for the Memory estimate tab (tests);
        `presets_dir`: the user's own presets (default: the app's data folder)."""
        super().__init__(parent)
        self._presets_dir = presets_dir or default_unsaved_dir().parent / "presets"
        self._engine_command = engine_command
        self._unsaved_dir = unsaved_dir
        self.doc = Document(form_spec(), Path.cwd())
        self._overrides: Callable[[], list[str]] = lambda: []
        self._run_read = Task(self)
        self._run_read.done.connect(self._on_run_config_read)
        self._path_check = Task(self)  # the paths checked off the GUI thread (app/models/path_check.py)
        self._path_check.done.connect(self._on_paths_checked)
        self._path_problems: dict = {}
        self.last_folder: Optional[Path] = None  # where Open and Save as start (the window remembers it)
        self._build()
        self.doc.changed.connect(self._on_doc_changed)
        self.doc.json_failed.connect(lambda _message: self.ledger_view.config_changed(False, self.validity_message()))
        self.doc.validity_changed.connect(lambda _valid, _message: self._say_validity())
        self.doc.modified_changed.connect(self.modified_changed.emit)
        demo = next(iter(self.presets), None)
        if demo is not None:
            self.load_preset(demo)
        if self._preset_problem:  # said after the demo's own line
            self._show_status(self._preset_problem)

    # ------------------------------------------------------------ layout

    def _build(self) -> None:
        self.form = ConfigForm(self.doc.spec)
        self.form.field_edited.connect(self.doc.set_field)
        self.json = JsonView()
        self.json.json_parsed.connect(self.doc.set_json)
        self.json.json_failed.connect(self.doc.fail_json)
        self.dry_run_view = DryRunView(self.json.edit.font())
        self.dry_run_view.finished.connect(self._on_dry_run_finished)
        self._engine = self.dry_run_view.engine
        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setWidget(self.form)
        self.side = QTabWidget()
        self.side.addTab(self.json, "JSON")
        self.side.addTab(self.dry_run_view, "Dry run")
        self.ledger_view = LedgerView(lambda target: self.materialize(target), self._engine_command)
        self.side.addTab(self.ledger_view, "Memory estimate")
        self.view_choice = QComboBox()
        self.view_choice.addItem(f"Basic: the {len(BASIC)} fields changed most", True)
        self.view_choice.addItem(f"Advanced: all {len(self.form.rows)} fields", False)
        self.view_choice.setToolTip("Basic shows the fields users change most, and any field with a problem; "
                                    "Advanced shows every field. The JSON beside it always has everything.")
        self.view_choice.currentIndexChanged.connect(lambda _i: self.set_basic(self.view_choice.currentData()))
        left = QWidget()
        left_layout = QVBoxLayout(left)
        left_layout.setContentsMargins(0, 0, 0, 0)
        left_layout.addWidget(self.view_choice)
        left_layout.addWidget(scroll, 1)
        self.form.set_basic(True)
        split = QSplitter(Qt.Orientation.Horizontal)
        split.addWidget(left)
        split.addWidget(self.side)
        split.setSizes([600, 400])
        self.banner = QLabel()  # problems that name no single field (cross-field rules, unknown keys)
        self.banner.setStyleSheet(ERROR_LABEL_STYLE)
        self.banner.setWordWrap(True)
        self.banner.hide()
        self.status = ElidedLabel()
        self.run_banner = RunConfigBanner()
        self.run_banner.new_run_requested.connect(self.new_run_from_view)
        self.run_banner.back_requested.connect(self.back_to_document)
        layout = QVBoxLayout(self)
        layout.addLayout(self._toolbar())
        layout.addWidget(self.run_banner)
        layout.addWidget(self.banner)
        layout.addWidget(split, 1)
        layout.addWidget(self.status)

    def _toolbar(self) -> QHBoxLayout:
        try:
            self.presets = presets()
        except UserInputError as e:  # a broken install: say so, the panel still edits files
            self.presets = []
            self._show_status(f"Presets unavailable: {e}")
        self.preset_button = QToolButton(text="New from preset", popupMode=QToolButton.ToolButtonPopupMode.InstantPopup)
        self.preset_menu = QMenu(self.preset_button)
        self.preset_menu.setToolTipsVisible(True)
        self.preset_button.setMenu(self.preset_menu)
        self._fill_preset_menu()
        self.file_label = ElidedLabel(mode=Qt.TextElideMode.ElideMiddle)  # a long path keeps both ends
        self.toolbar_buttons: dict[str, QPushButton] = {}
        row = QHBoxLayout()
        row.addWidget(self.preset_button)
        for text, slot, tip in (("Open…", self._on_open, "Open a config file (JSON)"),
                                ("Save", self._on_save, "Save to the current file"),
                                ("Save as…", self._on_save_as, "Save to a new file; relative paths are rewritten "
                                                                "so they still point at the same places"),
                                ("Dry run", self.dry_run, "dmad train --dry-run: validate the config, data, "
                                                          "teacher and run folder; show the resolved config "
                                                          "and memory ledger"),
                                ("Add to queue", lambda: self.queue_requested.emit(),
                                 "Queue this config to run after the ones before it (the Queue tab); a copy is "
                                 "queued: later edits here do not change it")):
            button = QPushButton(text)
            button.setToolTip(tip)
            button.clicked.connect(lambda _=False, s=slot: s())
            row.addWidget(button)
            self.toolbar_buttons[text] = button
        self.dry_run_button = self.toolbar_buttons["Dry run"]
        row.addWidget(self.file_label, 1)
        return row

    # ------------------------------------------------------------ public API

    def config(self) -> dict:
        return self.doc.config()

    def is_valid(self) -> bool:
        """Well formed (the schema) and every path there and of the right kind (path_check)."""
        return self.doc.is_valid() and not self._path_problems

    def validity_message(self) -> str:
        return self.doc.validity_message() or next(iter(self._path_problems.values()), "")

    def path_problems(self) -> dict:
        """The last path check's problems, one line per form field (empty: none, or not checked yet)."""
        return dict(self._path_problems)

    def base_dir(self) -> Path:
        """The folder relative paths in the config are relative to."""
        return self.doc.base_dir

    def has_unsaved_changes(self) -> bool:
        """The document being edited (also while a run's config is shown) differs from its file."""
        return self.doc.has_unsaved_changes()

    def document_name(self) -> str:
        """The document being edited, as the file label names it: a path or "untitled (preset CPU demo)"."""
        return self.doc.name()

    def is_read_only(self) -> bool:
        return self.doc.is_read_only()

    def shown_run(self) -> Optional[Path]:
        """The run whose config.json is shown read-only, or None."""
        return self.doc.run_view

    def set_run_overrides(self, overrides: Callable[[], list[str]]) -> None:
        """The --set arguments Start adds (run_target.root_override): Dry run adds the same."""
        self._overrides = overrides

    def show_run_config(self, run_dir: Path) -> None:
        """Show `run_dir`'s config.json read-only (read in a worker; `config_edited` when it is in).
        The document being edited waits aside until "Back to my config" or "New run from this config"."""
        run_dir = Path(run_dir)
        self._show_status(f"Reading {run_dir / 'config.json'} …")
        self._run_read.submit(lambda: read_run_config(run_dir))

    def new_run_from_view(self) -> bool:
        """The shown run's config becomes an editable, untitled document with run_name cleared, so Start
        makes a new folder; like a preset, it counts as modified once edited. The document that waited
        aside is dropped (asking first if it has edits)."""
        if not self.doc.is_read_only() or not self._ask_discard():
            return False
        name = self.doc.new_run_from_view()
        self._show_status(f"New config from run {name} (run_name cleared): edit it, then Start or Save as")
        return True

    def back_to_document(self) -> None:
        """Leave the run's config and show the document that waited aside, as it was."""
        if self.doc.back():
            self._show_status(f"Back to {self.document_name()}")

    def save_before_close(self) -> bool:
        """Save the document being edited (Save, or Save as… for an untitled one); True when saved."""
        self.back_to_document()
        self._on_save()
        return not self.doc.is_modified()

    def set_config(self, raw: dict, base_dir: Optional[Path] = None) -> None:
        """Show `raw` as a new untitled config; relative paths are relative to `base_dir` (None: the
        current folder, as for a config file given on a command line)."""
        self.doc.replace(raw, Path(base_dir or Path.cwd()).absolute(), None, "untitled")

    def load_preset(self, preset: Preset) -> bool:
        try:
            raw = preset.load_raw()
        except UserInputError as e:
            self._show_status(str(e))
            return False
        self.doc.replace(raw, preset.path.parent, None, f"preset {preset.name}")
        self._show_status(f"New config from the preset {preset.name!r}: {preset.description}")
        return True

    def load_file(self, path: Path) -> bool:
        """Open a config file; on failure the panel keeps what it shows and says why in one line."""
        path = Path(path).absolute()
        try:
            raw = read_json_file(path, "config")
            if not isinstance(raw, dict):
                raise UserInputError(f"{path}: the config must be a JSON object, got {type(raw).__name__}")
        except UserInputError as e:
            self._show_status(str(e))
            return False
        builtin = _is_builtin(path)
        if not builtin:
            self._used(path.parent)
        self.doc.replace(raw, path.parent, None if builtin else path, f"built-in {path.name}")
        self._show_status(f"Opened {path}" + (" (built-in: Save asks for a new file)" if builtin else ""))
        return True

    def save_to(self, path: Path) -> bool:
        """Write the config to `path` atomically; relative paths are rewritten for its folder."""
        path = Path(path).absolute()
        if self._flush_json():
            self._show_status(f"Not saved: the JSON has an error ({self.doc.json_error})")
            return False
        raw = rebase_paths(self.doc.raw, self.doc.base_dir, path.parent)
        try:
            atomic_write_text(path, to_json_text(raw, self.doc.spec))
        except OSError as e:
            self._show_status(f"Cannot save {path}: {e.strerror or e}")
            return False
        rebased = raw != self.doc.raw
        self._used(path.parent)
        self.doc.replace(raw, path.parent, path, "")
        self._show_status(f"Saved {path}" + (" (relative paths rewritten for its folder)" if rebased else "")
                          + ("" if self.is_valid() else f"; not valid yet: {self.validity_message()}"))
        return True

    def runnable_copy(self) -> tuple[dict, str]:
        """The config as Start would run it (absolute paths) and its name, for the run queue. Raises
        ConfigInvalid (a ValueError) with the first problem when it could not start now."""
        self._flush_json()
        if not self.is_valid():
            raise ConfigInvalid(self.validity_message())
        try:
            raw = materialized(self.doc.raw, self.doc.base_dir, self.doc.source())
        except UserInputError as e:
            raise ConfigInvalid(str(e)) from None
        return raw, (self.doc.path.name if self.doc.path is not None else self.document_name())

    def materialize(self, target: Optional[Path] = None) -> Path:
        """A config file whose meaning is exactly what the panel shows, for `dmad train --config`:
        the current file when it is saved and unchanged, else a copy with absolute paths in the
        per-user "unsaved" folder (or at `target`, always written: the memory estimate's scratch file).
        Raises ConfigInvalid (a ValueError) with the engine's message when the config is invalid,
        OSError when the copy cannot be written."""
        self._flush_json()
        doc = self.doc
        if not doc.is_valid():
            raise ConfigInvalid(doc.validity_message())
        if target is None and doc.path is not None and not doc.is_modified() and self._disk_matches():
            return doc.path
        try:
            raw = materialized(doc.raw, doc.base_dir, doc.source())
        except UserInputError as e:
            raise ConfigInvalid(str(e)) from None
        if target is None:
            folder = self._unsaved_dir or default_unsaved_dir()
            folder.mkdir(parents=True, exist_ok=True)
            stem = doc.path.stem if doc.path is not None else "untitled"
            target = folder / f"{stem}-{datetime.now():%Y%m%d-%H%M%S-%f}.json"
        atomic_write_text(Path(target), to_json_text(raw, doc.spec))
        return Path(target)

    def apply_changes(self, changes: dict) -> None:
        """Set dotted fields ("resources.train_batch_size": 1, as a probe recommends) in the form, as
        one edit; the document becomes modified and is judged again."""
        if not changes or (self.is_read_only() and not self.new_run_from_view()):  # a run's config stays as it is
            return
        self._flush_json()
        self.doc.apply(changes)
        self._show_status("Applied: " + ", ".join(f"{k} = {v!r}" for k, v in changes.items()))

    def set_device(self, name: str, total_gb: float) -> None:
        """The GPU's name and device-wide total (NVML), shown against the memory estimate."""
        self.ledger_view.set_device(name, total_gb)

    def dry_run(self) -> bool:
        """Start `dmad train --config <materialize()> --dry-run`; the report arrives in the Dry run tab."""
        if self.dry_run_view.is_running():
            return False
        try:
            path = self.materialize()
        except (ValueError, OSError) as e:
            self._show_status(f"Dry run not started: {e}")
            return False
        self.dry_run_button.setEnabled(False)
        self._show_status(f"Dry run of {path}: checking data, prompt set, teacher and run folder …")
        self.dry_run_view.start(path, self._overrides())
        return True

    # ------------------------------------------------------------ showing the document

    def _on_run_config_read(self, answer: tuple[Path, Any, str]) -> None:
        run_dir, raw, problem = answer
        if raw is None:
            self._show_status(f"Run {run_dir.name}: {problem}")
            return
        self.doc.show_run(run_dir, raw)
        self.run_banner.show_run(run_dir.name, str(run_dir), self.document_name())
        self._show_status(f"Showing {run_dir / 'config.json'} (read-only)")

    def _on_doc_changed(self, origin: str) -> None:
        """The document changed: every view but the one the edit came from shows it again."""
        doc = self.doc
        if origin == DOCUMENT:
            self._set_read_only(doc.is_read_only())
        if origin != FORM:
            self.form.set_values(doc.raw)
        if origin != JSON:
            self.json.show_text(doc.json_text())
        self._mark_errors()
        self._path_check.submit(lambda raw=copy.deepcopy(doc.raw), base=doc.base_dir: path_problems(raw, base))
        self.form.mark_unused(unused_fields(method_of(doc.raw)))  # greyed: the method does not read them
        self.banner.setText("\n".join(doc.problems.general))
        self.banner.setVisible(bool(doc.problems.general))
        name = doc.label()
        self.file_label.setText(name + (" — modified" if doc.is_modified() else ""))
        self.file_label.setToolTip(f"{name}\nRelative paths are relative to {doc.base_dir}")
        self.ledger_view.config_changed(doc.is_valid(), doc.validity_message())
        self.config_edited.emit(doc.config())

    def _mark_errors(self) -> None:
        """The schema's problems, and where a field has none, its path's (red, the line under it)."""
        self.form.mark_errors({**self._path_problems, **self.doc.problems.fields})

    def _on_paths_checked(self, problems: dict) -> None:
        if problems == self._path_problems:
            return
        self._path_problems = problems
        self._mark_errors()
        self._say_validity()

    def _say_validity(self) -> None:
        self.validity_changed.emit(self.is_valid(), self.validity_message())

    def _set_read_only(self, read_only: bool) -> None:
        self.form.setEnabled(not read_only)  # tooltips still show: the fields can be read, not changed
        self.json.edit.setReadOnly(read_only)
        for name in ("Save", "Save as…", "Dry run"):
            self.toolbar_buttons[name].setEnabled(not read_only)
        if not read_only:
            self.run_banner.hide()

    def _flush_json(self) -> str:
        """Apply JSON typed in the last 300 ms before acting on the config; the JSON error, if any."""
        if self.json.is_pending():
            self.json.parse_now()
        return self.doc.json_error

    def _disk_matches(self) -> bool:
        """The file still holds what was loaded or saved (another program may have changed it)."""
        try:
            return read_json_file(self.doc.path, "config") == self.doc.saved_raw
        except UserInputError:
            return False

    def _show_status(self, message: str) -> None:
        self.status.setText(message)

    # ------------------------------------------------------------ dialogs and the engine

    def _ask_discard(self) -> bool:
        if not self.has_unsaved_changes():
            return True
        answer = QMessageBox.question(self, "Discard changes?",
                                      f"The config \u201c{self.document_name()}\u201d has unsaved changes. "
                                      "Discard them?")
        return answer == QMessageBox.StandardButton.Yes

    def set_basic(self, basic: bool) -> None:
        """The form's Basic or Advanced view (the switch above it shows which)."""
        self.form.set_basic(bool(basic))
        i = self.view_choice.findData(bool(basic))
        if i != self.view_choice.currentIndex():
            self.view_choice.setCurrentIndex(i)

    def restore_draft(self, raw: dict, base_dir: Path, path: Optional[Path], label: str) -> None:
        """The last session's unsaved edits, shown unsaved: of their file when it is still there (so
        Save writes it and the document says "modified"), else as an untitled document."""
        saved: dict = {}
        if path is not None:
            try:
                found = read_json_file(path, "config")
                saved = found if isinstance(found, dict) else {}
            except UserInputError:
                path = None
        self.doc.replace(raw, base_dir, path, "last session's draft", saved_raw=saved)
        self._show_status(f"Reopened the last session's unsaved edits of {label}")

    # ------------------------------------------------------------ presets: shipped and the user's own

    def _fill_preset_menu(self) -> None:
        menu = self.preset_menu
        menu.clear()
        self.user_presets, self._preset_problem = user_presets(self._presets_dir)
        if self._preset_problem:
            self._show_status(self._preset_problem)
        for preset in self.presets + self.user_presets:
            if preset is (self.user_presets or [None])[0]:
                menu.addSection("Your presets")
            action = menu.addAction(preset.menu_text())
            action.setToolTip(preset.tooltip_for_user() if preset.user else preset.tooltip())
            action.triggered.connect(lambda _=False, p=preset: self._ask_discard() and self.load_preset(p))
        menu.addSeparator()
        menu.addAction("Save as preset…", self.ask_save_preset).setToolTip(
            "Keep this config as a preset of your own (in your data folder), listed here")
        delete = menu.addMenu("Delete a preset of yours")
        delete.setEnabled(bool(self.user_presets))
        for preset in self.user_presets:
            delete.addAction(preset.name, lambda p=preset: self.delete_preset(p.name))

    def ask_save_preset(self) -> bool:
        from app.dialogs.save_preset import SavePresetDialog

        mine = {p.name for p in self.user_presets}
        dialog = SavePresetDialog(lambda name: check_preset_name(name, self.presets), lambda name: name in mine,
                                  parent=self)
        if dialog.exec() != QDialog.DialogCode.Accepted:
            return False
        return self.save_preset(*dialog.values())

    def save_preset(self, name: str, description: str) -> bool:
        """The config as shown, with absolute paths, as the user's preset `name`."""
        problem = check_preset_name(name, self.presets)
        if problem:
            self._show_status(f"Not saved as a preset: {problem}")
            return False
        self._flush_json()
        try:
            raw = materialized(self.doc.raw, self.doc.base_dir, self.doc.source())
            preset = save_user_preset(self._presets_dir, name, description, raw)
        except (UserInputError, OSError) as e:
            self._show_status(f"Not saved as a preset: {e}")
            return False
        self._fill_preset_menu()
        self._show_status(f"Saved as your preset {preset.name!r} ({preset.path})")
        return True

    def delete_preset(self, name: str) -> bool:
        if QMessageBox.question(self, "Delete preset", f"Delete your preset {name!r}? Its config file goes too.",
                                QMessageBox.Yes | QMessageBox.No, QMessageBox.No) != QMessageBox.Yes:
            return False
        try:
            gone = delete_user_preset(self._presets_dir, name)
        except OSError as e:
            self._show_status(f"Could not delete the preset {name!r}: {e}")
            return False
        self._fill_preset_menu()
        self._show_status(f"Deleted your preset {name!r}" if gone else f"No preset of yours is named {name!r}")
        return gone is not None

    def _used(self, folder: Path) -> None:
        self.last_folder = folder
        self.folder_used.emit(folder)

    def _start_folder(self) -> Path:
        """Where Open and Save as start: the saved file's folder, else the last one used, else home
        (never a preset's folder inside the installation)."""
        return self.doc.base_dir if self.doc.path is not None else (self.last_folder or Path.home())

    def _on_open(self) -> None:
        if not self._ask_discard():
            return
        path, _ = QFileDialog.getOpenFileName(self, "Open config", str(self._start_folder()), "Config (*.json)")
        if path:
            self.load_file(Path(path))

    def _on_save(self) -> None:
        if self.doc.path is None:
            self._on_save_as()
        else:
            self.save_to(self.doc.path)

    def _on_save_as(self) -> None:
        current = self.doc.path
        name = current.name if current is not None else "config.json"
        path, _ = QFileDialog.getSaveFileName(self, "Save config as", str(self._start_folder() / name),
                                              "Config (*.json)")
        if path:
            self.save_to(Path(path))

    def _on_dry_run_finished(self, _passed: bool, line: str) -> None:
        self.dry_run_button.setEnabled(not self.is_read_only())
        self._show_status(line)
        self.side.setCurrentWidget(self.dry_run_view)
