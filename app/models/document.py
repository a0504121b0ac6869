"""The config being edited in the Config panel, as a model with events and without Qt: the raw dict
(the source of truth: the form and the JSON view both edit it, and it keeps whatever the user wrote,
for the engine to judge), what its file holds, the folder its relative paths are relative to, its file
and where it came from, the engine's judgement of it, and the run whose config.json is shown
read-only while the document being edited waits aside.

Views bind to it: each edit goes in through one method (`set_field` from the form, `set_json` and
`fail_json` from the JSON view, `apply` from a probe's recommendation), and every view redraws from
`changed(origin)`, skipping the view the edit came from. File dialogs, file writes and questions stay
in the panel (app/panels/config.py); the functions it uses are app/models/config_doc.py's.
"""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, NamedTuple, Optional

from app.models.config_doc import GroupSpec, Key, Problems, all_fields, check, to_json_text, with_field
from app.models.evented import Emitter

FORM, JSON, APPLY, DOCUMENT = "form", "json", "apply", "document"  # where a change came from


class _Kept(NamedTuple):
    """The document being edited, kept aside while a run's config is shown."""
    raw: dict
    saved_raw: dict
    base_dir: Path
    path: Optional[Path]
    origin: str


class Document:
    """Read its attributes (`raw` is the live dict: copy it before changing it); only its methods
    change them. `changed(origin)`: the raw dict or the whole document changed, already judged again
    (origin FORM or JSON: that view already shows it; APPLY: set in code; DOCUMENT: another document,
    which may be read-only). `json_failed(message)`: the JSON text does not parse (the raw dict is
    kept). `validity_changed(valid, message)` and `modified_changed(modified)` when either differs
    from what it last said."""

    def __init__(self, spec: tuple[GroupSpec, ...], base_dir: Path):
        self.spec = spec
        self.fields = all_fields(spec)
        self.changed = Emitter()
        self.json_failed = Emitter()
        self.validity_changed = Emitter()
        self.modified_changed = Emitter()
        self.raw: dict = {}
        self.saved_raw: dict = {}  # what the file (or the preset) holds: the reference for "modified"
        self.base_dir = base_dir
        self.path: Optional[Path] = None
        self.origin = "untitled"  # shown for untitled documents: "preset CPU demo"
        self.run_view: Optional[Path] = None  # the run whose config.json is shown read-only
        self.problems = Problems()
        self.json_error = ""
        self._kept: Optional[_Kept] = None  # the document being edited, while a run's config is shown
        self._validity: Optional[tuple[bool, str]] = None
        self._modified = False

    # ------------------------------------------------------------ reading

    def config(self) -> dict:
        return copy.deepcopy(self.raw)

    def json_text(self) -> str:
        """The raw dict as the JSON view shows it: schema order, two-space indent."""
        return to_json_text(self.raw, self.spec)

    def is_valid(self) -> bool:
        return not self.json_error and self.problems.valid

    def validity_message(self) -> str:
        return f"JSON: {self.json_error}" if self.json_error else self.problems.message

    def is_modified(self) -> bool:
        return self.raw != self.saved_raw

    def has_unsaved_changes(self) -> bool:
        """The document being edited (also while a run's config is shown) differs from its file."""
        kept = self._kept
        return kept.raw != kept.saved_raw if kept is not None else self.is_modified()

    def is_read_only(self) -> bool:
        return self.run_view is not None

    def name(self) -> str:
        """The document being edited: a path, or "untitled (preset CPU demo)"."""
        doc = self._kept or self
        return str(doc.path) if doc.path is not None else f"untitled ({doc.origin})"

    def label(self) -> str:
        """What the file label names: the file, an untitled document's origin, or the run's config.json."""
        name = str(self.path) if self.path is not None else f"untitled ({self.origin})"
        if self.run_view is not None:
            name = f"{self.run_view / 'config.json'} (read-only)"
        return name

    def source(self) -> str:
        """How the engine's messages name the config."""
        return self.path.name if self.path is not None else "config"

    # ------------------------------------------------------------ edits

    def set_field(self, key: Key, value: Any) -> None:
        """The form changed one field (config_doc.UNSET removes the key: the default applies)."""
        self.raw = with_field(self.raw, key, value)
        self.json_error = ""  # the form's state replaces whatever the JSON view held
        self._judge(FORM)

    def set_json(self, value: Any) -> None:
        """The JSON view's text parsed to `value`; anything but an object is an error the form cannot show."""
        if not isinstance(value, dict):
            self.fail_json(f"the config must be a JSON object, got {type(value).__name__}")
            return
        self.raw, self.json_error = value, ""
        self._judge(JSON)

    def fail_json(self, message: str) -> None:
        """The JSON view's text does not parse ("line L, column C: ..."): the raw dict stays as it was."""
        self.json_error = message
        self.json_failed.emit(message)
        self._say_validity()

    def apply(self, changes: dict) -> None:
        """Set dotted fields ("resources.train_batch_size": 1) as one edit."""
        raw = self.raw
        for dotted, value in changes.items():
            raw = with_field(raw, tuple(str(dotted).split(".")), value)
        self.raw, self.json_error = raw, ""
        self._judge(APPLY)

    # ------------------------------------------------------------ whole documents

    def replace(self, raw: dict, base_dir: Path, path: Optional[Path], origin: str,
                saved_raw: Optional[dict] = None, run_view: Optional[Path] = None) -> None:
        """Another document; `saved_raw`: what its file holds (default: `raw`, unmodified); `run_view`:
        a run whose config is shown read-only (any other document leaves that view, and what waited
        aside is dropped)."""
        self.raw = copy.deepcopy(raw)
        self.saved_raw = copy.deepcopy(raw if saved_raw is None else saved_raw)
        self.base_dir, self.path, self.origin = base_dir, path, origin
        self.run_view, self._kept, self.json_error = run_view, None, ""
        self._judge(DOCUMENT)

    def show_run(self, run_dir: Path, raw: dict) -> None:
        """Show `run_dir`'s config.json read-only; the document being edited waits aside (a second run
        replaces the first: the document still waits)."""
        kept = self._kept or _Kept(self.raw, self.saved_raw, self.base_dir, self.path, self.origin)
        self.replace(raw, run_dir, None, f"run {run_dir.name}", run_view=run_dir)
        self._kept = kept

    def back(self) -> bool:
        """Leave the run's config and edit the document that waited aside, as it was; False when none did."""
        kept = self._kept
        if kept is None:
            return False
        self.replace(kept.raw, kept.base_dir, kept.path, kept.origin, saved_raw=kept.saved_raw)
        return True

    def new_run_from_view(self) -> str:
        """The shown run's config becomes an editable, untitled document with run_name cleared (Start
        makes a new folder); what waited aside is dropped. Returns the run's name."""
        if self.run_view is None:
            raise RuntimeError("no run's config is shown")
        name = self.run_view.name
        raw = copy.deepcopy(self.raw)
        if isinstance(raw.get("identity"), dict):
            raw["identity"]["run_name"] = None
        self.replace(raw, self.base_dir, None, f"from run {name}")
        return name

    # ------------------------------------------------------------ judging

    def _judge(self, origin: str) -> None:
        self.problems = check(self.raw, self.source(), self.fields)
        self.changed.emit(origin)
        self._say_validity()
        modified = self.is_modified()
        if modified != self._modified:
            self._modified = modified
            self.modified_changed.emit(modified)

    def _say_validity(self) -> None:
        validity = (self.is_valid(), self.validity_message())
        if validity != self._validity:
            self._validity = validity
            self.validity_changed.emit(*validity)
