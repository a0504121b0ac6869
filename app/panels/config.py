"""The Config panel: the form generated from the engine's schema beside the raw JSON, both editing one
raw config dict that the engine's own validation judges as you type; presets, open / save / save as,
and the engine's dry run (resolved config + memory ledger).

Relative paths in a config are relative to its file's folder (dmad.contract.config.resolve_paths), so the
panel keeps a base folder with the document: a preset's is the preset's folder, a file's is its
folder. Save as rewrites relative paths for the new folder, and materialize() writes a copy with
absolute paths, so neither changes what the config means.

An opened run's config.json is shown read-only (show_run_config, read in a worker) while the document
being edited waits aside, unchanged: "New run from this config" turns the run's config into an editable
unsaved document with run_name cleared, "Back to my config" brings the waiting one back. Dry run gets
the same identity.output_dir override as Start (set_run_overrides), so both name the same folder.
"""
from __future__ import annotations

import copy
from datetime import datetime
from pathlib import Path
from typing import Any, Callable, Optional

from PySide6.QtCore import QStandardPaths, Qt, Signal
from PySide6.QtWidgets import (QFileDialog, QHBoxLayout, QLabel, QMenu, QMessageBox, QPushButton, QScrollArea,
                               QSplitter, QTabWidget, QToolButton, QVBoxLayout, QWidget)

from app.models.config_doc import (Document, Key, Problems, all_fields, check, form_spec, materialized,
                                   read_run_config, rebase_paths, to_json_text, with_field)
from app.widgets.config_form import ERROR_LABEL_STYLE, ConfigForm
from app.widgets.elided_label import ElidedLabel
from app.widgets.run_config_banner import RunConfigBanner
from app.widgets.dry_run_view import DryRunView
from app.engine.background import Task
from app.widgets.json_view import JsonView
from app.widgets.ledger_view import LedgerView
from app.models.presets import Preset, presets
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
    config_edited = Signal(dict)          # the raw config after any change (form, JSON, file, preset)
    modified_changed = Signal(bool)

    def __init__(self, parent: Optional[QWidget] = None, unsaved_dir: Optional[Path] = None,
                 engine_command: Optional[list[str]] = None):
        """`engine_command` replaces the `dmad` command line for the Memory estimate tab (tests)."""
        super().__init__(parent)
        self._engine_command = engine_command
        self._spec = form_spec()
        self._fields = all_fields(self._spec)
        self._unsaved_dir = unsaved_dir
        self._raw: dict = {}
        self._saved_raw: dict = {}  # what the file (or the preset) holds: the reference for "modified"
        self._base_dir = Path.cwd()
        self._path: Optional[Path] = None
        self._origin = "untitled"   # shown for untitled documents: "preset CPU demo"
        self._problems = Problems()
        self._json_error = ""
        self._validity: Optional[tuple[bool, str]] = None
        self._was_modified = False
        self._run_view: Optional[Path] = None  # the run whose config.json is shown read-only
        self._stash: Optional[Document] = None  # the document being edited, while a run's config is shown
        self._overrides: Callable[[], list[str]] = lambda: []
        self._run_read = Task(self)
        self._run_read.done.connect(self._on_run_config_read)
        self._build()
        demo = next(iter(self.presets), None)
        if demo is not None:
            self.load_preset(demo)

    # ------------------------------------------------------------ layout

    def _build(self) -> None:
        self.form = ConfigForm(self._spec)
        self.form.field_edited.connect(self._on_field_edited)
        self.json = JsonView()
        self.json.json_parsed.connect(self._on_json_parsed)
        self.json.json_failed.connect(self._on_json_failed)
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
        split = QSplitter(Qt.Orientation.Horizontal)
        split.addWidget(scroll)
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
        menu = QMenu(self.preset_button)
        menu.setToolTipsVisible(True)
        for preset in self.presets:
            action = menu.addAction(preset.menu_text())
            action.setToolTip(preset.tooltip())
            action.triggered.connect(lambda _=False, p=preset: self._ask_discard() and self.load_preset(p))
        self.preset_button.setMenu(menu)
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
                                                          "and memory ledger")):
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
        return copy.deepcopy(self._raw)

    def is_valid(self) -> bool:
        return not self._json_error and self._problems.valid

    def validity_message(self) -> str:
        return f"JSON: {self._json_error}" if self._json_error else self._problems.message

    def current_path(self) -> Optional[Path]:
        return self._path

    def base_dir(self) -> Path:
        """The folder relative paths in the config are relative to."""
        return self._base_dir

    def is_modified(self) -> bool:
        return self._raw != self._saved_raw

    def has_unsaved_changes(self) -> bool:
        """The document being edited (also while a run's config is shown) differs from its file."""
        stash = self._stash
        return stash.raw != stash.saved_raw if stash is not None else self.is_modified()

    def document_name(self) -> str:
        """The document being edited, as the file label names it: a path or "untitled (preset CPU demo)"."""
        doc = self._stash or self._current()
        return str(doc.path) if doc.path is not None else f"untitled ({doc.origin})"

    def is_read_only(self) -> bool:
        return self._run_view is not None

    def shown_run(self) -> Optional[Path]:
        """The run whose config.json is shown read-only, or None."""
        return self._run_view

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
        if self._run_view is None or not self._ask_discard():
            return False
        name = self._run_view.name
        raw = copy.deepcopy(self._raw)
        if isinstance(raw.get("identity"), dict):
            raw["identity"]["run_name"] = None
        self._set_document(raw, self._base_dir, None, f"from run {name}")
        self._show_status(f"New config from run {name} (run_name cleared): edit it, then Start or Save as")
        return True

    def back_to_document(self) -> None:
        """Leave the run's config and show the document that waited aside, as it was."""
        if self._stash is not None:
            doc = self._stash
            self._set_document(doc.raw, doc.base_dir, doc.path, doc.origin, saved_raw=doc.saved_raw)
            self._show_status(f"Back to {self.document_name()}")

    def save_before_close(self) -> bool:
        """Save the document being edited (Save, or Save as… for an untitled one); True when saved."""
        self.back_to_document()
        self._on_save()
        return not self.is_modified()

    def set_config(self, raw: dict, base_dir: Optional[Path] = None) -> None:
        """Show `raw` as a new untitled config; relative paths are relative to `base_dir` (None: the
        current folder, as for a config file given on a command line)."""
        self._set_document(raw, Path(base_dir or Path.cwd()).absolute(), None, "untitled")

    def load_preset(self, preset: Preset) -> bool:
        try:
            raw = preset.load_raw()
        except UserInputError as e:
            self._show_status(str(e))
            return False
        self._set_document(raw, preset.path.parent, None, f"preset {preset.name}")
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
        self._set_document(raw, path.parent, None if builtin else path, f"built-in {path.name}")
        self._show_status(f"Opened {path}" + (" (built-in: Save asks for a new file)" if builtin else ""))
        return True

    def save_to(self, path: Path) -> bool:
        """Write the config to `path` atomically; relative paths are rewritten for its folder."""
        path = Path(path).absolute()
        if self._flush_json():
            self._show_status(f"Not saved: the JSON has an error ({self._json_error})")
            return False
        raw = rebase_paths(self._raw, self._base_dir, path.parent)
        try:
            atomic_write_text(path, to_json_text(raw, self._spec))
        except OSError as e:
            self._show_status(f"Cannot save {path}: {e.strerror or e}")
            return False
        rebased = raw != self._raw
        self._set_document(raw, path.parent, path, "")
        self._show_status(f"Saved {path}" + (" (relative paths rewritten for its folder)" if rebased else "")
                          + ("" if self.is_valid() else f"; not valid yet: {self.validity_message()}"))
        return True

    def materialize(self, target: Optional[Path] = None) -> Path:
        """A config file whose meaning is exactly what the panel shows, for `dmad train --config`:
        the current file when it is saved and unchanged, else a copy with absolute paths in the
        per-user "unsaved" folder (or at `target`, always written: the memory estimate's scratch file).
        Raises ConfigInvalid (a ValueError) with the engine's message when the config is invalid,
        OSError when the copy cannot be written."""
        self._flush_json()
        if not self.is_valid():
            raise ConfigInvalid(self.validity_message())
        if target is None and self._path is not None and not self.is_modified() and self._disk_matches():
            return self._path
        try:
            raw = materialized(self._raw, self._base_dir, self._source())
        except UserInputError as e:
            raise ConfigInvalid(str(e)) from None
        if target is None:
            folder = self._unsaved_dir or default_unsaved_dir()
            folder.mkdir(parents=True, exist_ok=True)
            stem = self._path.stem if self._path is not None else "untitled"
            target = folder / f"{stem}-{datetime.now():%Y%m%d-%H%M%S-%f}.json"
        atomic_write_text(Path(target), to_json_text(raw, self._spec))
        return Path(target)

    def apply_changes(self, changes: dict) -> None:
        """Set dotted fields ("resources.train_batch_size": 1, as a probe recommends) in the form, as
        one edit; the document becomes modified and is judged again."""
        if not changes or (self.is_read_only() and not self.new_run_from_view()):  # a run's config stays as it is
            return
        self._flush_json()
        raw = self._raw
        for dotted, value in changes.items():
            raw = with_field(raw, tuple(str(dotted).split(".")), value)
        self._raw = raw
        self._json_error = ""
        self.form.set_values(self._raw)
        self.json.show_text(to_json_text(self._raw, self._spec))
        self._changed()
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

    def dry_run_text(self) -> str:
        return self.dry_run_view.toPlainText()

    # ------------------------------------------------------------ document changes

    def _current(self) -> Document:
        return Document(self._raw, self._saved_raw, self._base_dir, self._path, self._origin)

    def _on_run_config_read(self, answer: tuple[Path, Any, str]) -> None:
        run_dir, raw, problem = answer
        if raw is None:
            self._show_status(f"Run {run_dir.name}: {problem}")
            return
        stash = self._stash or self._current()  # a second run replaces the first; the document still waits
        self._set_document(raw, run_dir, None, f"run {run_dir.name}", run_view=run_dir)
        self._stash = stash
        self.run_banner.show_run(run_dir.name, str(run_dir), self.document_name())
        self._show_status(f"Showing {run_dir / 'config.json'} (read-only)")

    def _set_document(self, raw: dict, base_dir: Path, path: Optional[Path], origin: str,
                      saved_raw: Optional[dict] = None, run_view: Optional[Path] = None) -> None:
        """Show a document; `saved_raw`: what its file holds (default: `raw`, unmodified); `run_view`: a
        run whose config is shown read-only (any other document leaves that view)."""
        self._raw = copy.deepcopy(raw)
        self._saved_raw = copy.deepcopy(raw if saved_raw is None else saved_raw)
        self._base_dir, self._path, self._origin = base_dir, path, origin
        self._run_view, self._stash = run_view, None
        self._set_read_only(run_view is not None)
        self._json_error = ""
        self.form.set_values(self._raw)
        self.json.show_text(to_json_text(self._raw, self._spec))
        self._changed()

    def _on_field_edited(self, key: Key, value: Any) -> None:
        self._raw = with_field(self._raw, key, value)
        self._json_error = ""  # the form's state replaces whatever the JSON view held
        self.json.show_text(to_json_text(self._raw, self._spec))
        self._changed()

    def _on_json_parsed(self, value: Any) -> None:
        if not isinstance(value, dict):  # the form cannot show it: leave the form as it is
            self._on_json_failed(f"the config must be a JSON object, got {type(value).__name__}")
            return
        self._json_error = ""
        self._raw = value
        self.form.set_values(self._raw)
        self._changed()

    def _on_json_failed(self, message: str) -> None:
        self._json_error = message
        self._update_validity()
        self.ledger_view.config_changed(False, self.validity_message())

    def _changed(self) -> None:
        self._problems = check(self._raw, self._source(), self._fields)
        self.form.mark_errors(self._problems.fields)
        self.form.mark_unused(unused_fields(method_of(self._raw)))  # greyed: the method does not read them
        self.banner.setText("\n".join(self._problems.general))
        self.banner.setVisible(bool(self._problems.general))
        self._update_validity()
        self._update_file_label()
        self.ledger_view.config_changed(self.is_valid(), self.validity_message())
        self.config_edited.emit(self.config())

    def _update_validity(self) -> None:
        state = (self.is_valid(), self.validity_message())
        if state != self._validity:
            self._validity = state
            self.validity_changed.emit(*state)

    def _set_read_only(self, read_only: bool) -> None:
        self.form.setEnabled(not read_only)  # tooltips still show: the fields can be read, not changed
        self.json.edit.setReadOnly(read_only)
        for name in ("Save", "Save as…", "Dry run"):
            self.toolbar_buttons[name].setEnabled(not read_only)
        if not read_only:
            self.run_banner.hide()

    def _update_file_label(self) -> None:
        modified = self.is_modified()
        name = str(self._path) if self._path is not None else f"untitled ({self._origin})"
        if self._run_view is not None:
            name = f"{self._run_view / 'config.json'} (read-only)"
        self.file_label.setText(name + (" — modified" if modified else ""))
        self.file_label.setToolTip(f"{name}\nRelative paths are relative to {self._base_dir}")
        if modified != self._was_modified:
            self._was_modified = modified
            self.modified_changed.emit(modified)

    def _source(self) -> str:
        return self._path.name if self._path is not None else "config"

    def _flush_json(self) -> str:
        """Apply JSON typed in the last 300 ms before acting on the config; the JSON error, if any."""
        if self.json.is_pending():
            self.json.parse_now()
        return self._json_error

    def _disk_matches(self) -> bool:
        """The file still holds what was loaded or saved (another program may have changed it)."""
        try:
            return read_json_file(self._path, "config") == self._saved_raw
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

    def _on_open(self) -> None:
        if not self._ask_discard():
            return
        path, _ = QFileDialog.getOpenFileName(self, "Open config", str(self._base_dir), "Config (*.json)")
        if path:
            self.load_file(Path(path))

    def _on_save(self) -> None:
        if self._path is None:
            self._on_save_as()
        else:
            self.save_to(self._path)

    def _on_save_as(self) -> None:
        start = self._base_dir if self._path is not None else Path.home()
        name = self._path.name if self._path is not None else "config.json"
        path, _ = QFileDialog.getSaveFileName(self, "Save config as", str(start / name), "Config (*.json)")
        if path:
            self.save_to(Path(path))

    def _on_dry_run_finished(self, _passed: bool, line: str) -> None:
        self.dry_run_button.setEnabled(not self.is_read_only())
        self._show_status(line)
        self.side.setCurrentWidget(self.dry_run_view)
