"""The config form, generated from the engine's JSON schema (app.models.config_doc.form_spec): one group box
per config group in schema order, one editor per field chosen by its type.

Editors accept anything the JSON could hold and never clamp or reject: numbers are line edits (a
learning rate is typed as 1e-5), so an out-of-range value reaches the engine's validation, which
marks the field with its own message. An empty editor removes the key (the engine default applies).
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Optional

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (QCheckBox, QComboBox, QFileDialog, QFormLayout, QGroupBox, QHBoxLayout, QLabel,
                               QLineEdit, QMenu, QToolButton, QVBoxLayout, QWidget)

from app.models.config_doc import UNSET, FieldSpec, GroupSpec, Key, get_field
from app.models import methods
from app.models.field_labels import BASIC, label_of
from app.widgets.elided_label import ElidedLabel
from app.widgets.wheel_guard import guard_wheel
from dmad.contract.config import PATH_FIELDS

INVALID_STYLE = "border: 1px solid #c62828;"
ERROR_LABEL_STYLE = "color: #c62828;"
NOTE_LABEL_STYLE = "color: #5f6b7a;"


def parse_number(text: str) -> Any:
    """'1e-5' -> 1e-05, '8' -> 8; text that is not a finite number stays text for the engine to reject."""
    t = text.strip()
    if not t:
        return UNSET
    try:
        value = json.loads(t)
    except ValueError:
        try:
            value = float(t)  # '.5', '5.'
        except ValueError:
            return t
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return t
    return value


def show_value(value: Any) -> str:
    if value is UNSET or value is None:
        return ""
    if isinstance(value, bool):
        return json.dumps(value)
    if isinstance(value, list):
        return ", ".join(show_value(v) for v in value)
    return str(value) if isinstance(value, str) else repr(value)


class _Editor(QWidget):
    """One field's control; `edited` carries the new JSON value, or UNSET to remove the key."""

    edited = Signal(object)

    def __init__(self, spec: FieldSpec):
        super().__init__()
        self.spec = spec
        self._loading = False  # set_value must not look like a user edit
        self.row = QHBoxLayout(self)
        self.row.setContentsMargins(0, 0, 0, 0)

    def set_value(self, value: Any) -> None:
        self._loading = True
        try:
            self._show(value)
        finally:
            self._loading = False

    def _emit(self, value: Any) -> None:
        if not self._loading:
            self.edited.emit(value)

    def _show(self, value: Any) -> None:
        raise NotImplementedError

    def value(self) -> Any:
        """What the control holds now, as a JSON value (UNSET: nothing entered)."""
        raise NotImplementedError

    def control(self) -> QWidget:
        raise NotImplementedError

    def set_fixed(self, fixed: bool) -> None:
        self.control().setEnabled(not fixed)


class BoolEditor(_Editor):
    def __init__(self, spec: FieldSpec):
        super().__init__(spec)
        self.box = QCheckBox()
        self.box.toggled.connect(self._emit)
        self.row.addWidget(self.box)
        self.row.addStretch(1)

    def _show(self, value: Any) -> None:
        self.box.setChecked(value is True)  # a non-bool from the JSON shows unchecked and is marked invalid

    def value(self) -> Any:
        return self.box.isChecked()

    def control(self) -> QWidget:
        return self.box


# readable names for enum values, {key: {value: (text, tooltip)}}; the value itself stays in the text
OPTION_LABELS: dict[Key, dict[Any, tuple[str, str]]] = {
    methods.METHOD_KEY: {m: (methods.label(m), methods.WHAT[m]) for m in methods.LABELS}}


class EnumEditor(_Editor):
    def __init__(self, spec: FieldSpec):
        super().__init__(spec)
        self.combo = QComboBox()
        guard_wheel(self.combo)  # scrolling the form must not change the value under the pointer
        labels = OPTION_LABELS.get(spec.key, {})
        for option in spec.options:
            text, tip = labels.get(option, (str(option), ""))
            self.combo.addItem(text, option)
            if tip:
                self.combo.setItemData(self.combo.count() - 1, tip, Qt.ItemDataRole.ToolTipRole)
        self.combo.currentIndexChanged.connect(lambda i: self._emit(self.combo.itemData(i)))
        self.row.addWidget(self.combo, 1)

    def _show(self, value: Any) -> None:
        while self.combo.count() > len(self.spec.options):  # an invalid value shown earlier
            self.combo.removeItem(self.combo.count() - 1)
        index = self.combo.findData(value) if value is not UNSET else -1
        if index < 0 and value is not UNSET:  # a value the engine will reject: show it as it is
            self.combo.addItem(json.dumps(value), value)
            index = self.combo.count() - 1
        self.combo.setCurrentIndex(max(index, 0))

    def value(self) -> Any:
        return self.combo.currentData()

    def control(self) -> QWidget:
        return self.combo


class TextEditor(_Editor):
    """str, int, float and list fields: a line edit; lists are comma-separated."""

    def __init__(self, spec: FieldSpec):
        super().__init__(spec)
        self.line = QLineEdit()
        if spec.default is not None:
            self.line.setPlaceholderText(f"default: {show_value(spec.default)}")
        self.line.textChanged.connect(lambda text: self._emit(self.parse(text)))
        self.row.addWidget(self.line, 1)
        if spec.key in PATH_FIELDS:
            browse = QToolButton()
            browse.setText("…")
            browse.setToolTip("Choose with a file dialog")
            if spec.name == "train_data_dir":  # a captioned folder or a dataset list JSON
                menu = QMenu(browse)
                menu.addAction("Image folder…", self._browse)
                menu.addAction("Dataset list (JSON)…", self._browse_list)
                browse.setMenu(menu)
                browse.setPopupMode(QToolButton.ToolButtonPopupMode.InstantPopup)
            else:
                browse.clicked.connect(self._browse)
            self.row.addWidget(browse)
            self.browse = browse

    def set_fixed(self, fixed: bool) -> None:
        """Shown but not editable here (the row's note says why and where it is set)."""
        self.line.setReadOnly(fixed)
        if getattr(self, "browse", None) is not None:
            self.browse.setVisible(not fixed)

    def parse(self, text: str) -> Any:
        kind = self.spec.kind
        if kind == "str":
            return text if text else UNSET
        if kind in ("int", "float"):
            return parse_number(text)
        items = [t for t in (s.strip() for s in text.split(",")) if t]
        if not items:
            return UNSET
        return [parse_number(t) if self.spec.item_kind != "str" else t for t in items]

    def _show(self, value: Any) -> None:
        self.line.setText(show_value(value))

    def value(self) -> Any:
        return self.parse(self.line.text())

    def _browse(self) -> None:
        if self.spec.name == "prompt_set":
            path, _ = QFileDialog.getOpenFileName(self, "Prompt set", self.line.text(), "JSON (*.json)")
        else:
            path = QFileDialog.getExistingDirectory(self, self.spec.name, self.line.text())
        if path:
            self.line.setText(str(Path(path)))

    def _browse_list(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Dataset list", self.line.text(), "JSON (*.json)")
        if path:
            self.line.setText(str(Path(path)))

    def control(self) -> QWidget:
        return self.line


class NullableEditor(_Editor):
    """An explicit "none" beside the inner editor: null is a value of its own (the field's
    description says what none means), distinct from an empty or invalid entry."""

    def __init__(self, spec: FieldSpec, inner: _Editor):
        super().__init__(spec)
        self.inner = inner
        self.none = QCheckBox("none")
        self.inner.edited.connect(self._emit)
        self.none.toggled.connect(self._none_toggled)
        self.row.addWidget(inner, 1)
        self.row.addWidget(self.none)

    def _none_toggled(self, on: bool) -> None:
        self.inner.setEnabled(not on)
        self._emit(None if on else self.inner.value())

    def _show(self, value: Any) -> None:
        self.none.setChecked(value is None)
        self.inner.setEnabled(value is not None)
        self.inner.set_value(UNSET if value is None else value)

    def value(self) -> Any:
        return None if self.none.isChecked() else self.inner.value()

    def control(self) -> QWidget:
        return self.inner.control()


class LoraListEditor(_Editor):
    """identity.teacher_loras: one row per LoRA (its file, its scale), Add… with a file dialog,
    Remove. The value is the JSON list [{"path", "scale"}, ...] (the engine checks the files)."""

    def __init__(self, spec: FieldSpec):
        from PySide6.QtWidgets import QAbstractItemView, QHeaderView, QPushButton, QTableWidget

        super().__init__(spec)
        box = QWidget()
        column = QVBoxLayout(box)
        column.setContentsMargins(0, 0, 0, 0)
        self.table = QTableWidget(0, 2)
        self.table.setHorizontalHeaderLabels(["LoRA file (.safetensors, or a diffusers LoRA folder)", "Scale"])
        self.table.horizontalHeader().setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        self.table.horizontalHeader().setSectionResizeMode(1, QHeaderView.ResizeMode.ResizeToContents)
        self.table.verticalHeader().setVisible(False)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setMaximumHeight(130)
        self.table.itemChanged.connect(lambda _item: self._emit(self.value()))
        buttons = QHBoxLayout()
        self.add_button, self.remove_button = QPushButton("Add LoRA…"), QPushButton("Remove")
        self.add_button.clicked.connect(self._add)
        self.remove_button.clicked.connect(self._remove)
        buttons.addWidget(self.add_button)
        buttons.addWidget(self.remove_button)
        buttons.addStretch(1)
        column.addWidget(self.table)
        column.addLayout(buttons)
        self.row.addWidget(box, 1)

    def _rows(self, entries: list) -> None:
        from PySide6.QtWidgets import QTableWidgetItem

        self.table.blockSignals(True)
        try:
            self.table.setRowCount(len(entries))
            for r, entry in enumerate(entries):
                entry = entry if isinstance(entry, dict) else {"path": json.dumps(entry)}
                scale = entry.get("scale", 1.0)
                self.table.setItem(r, 0, QTableWidgetItem(str(entry.get("path", ""))))
                self.table.setItem(r, 1, QTableWidgetItem(json.dumps(scale) if not isinstance(scale, str) else scale))
        finally:
            self.table.blockSignals(False)

    def _show(self, value: Any) -> None:
        self._rows(value if isinstance(value, list) else [])

    def value(self) -> Any:
        out = []
        for r in range(self.table.rowCount()):
            path = self.table.item(r, 0).text() if self.table.item(r, 0) else ""
            text = self.table.item(r, 1).text().strip() if self.table.item(r, 1) else ""
            scale = parse_number(text) if text else 1.0  # an unparsable scale stays text: the engine names it
            out.append({"path": path, "scale": scale if scale is not UNSET else text})
        return out if out else UNSET

    def _add(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "A LoRA for the teacher", "", "LoRA (*.safetensors)")
        if path:
            current = self.value()
            self._rows([*(current if current is not UNSET else []), {"path": str(Path(path)), "scale": 1.0}])
            self._emit(self.value())

    def _remove(self) -> None:
        rows = sorted({i.row() for i in self.table.selectedIndexes()} or {self.table.rowCount() - 1}, reverse=True)
        entries = self.value() if self.value() is not UNSET else []
        for r in rows:
            if 0 <= r < len(entries):
                del entries[r]
        self._rows(entries)
        self._emit(entries if entries else UNSET)

    def control(self) -> QWidget:
        return self.table


def make_editor(spec: FieldSpec) -> _Editor:
    if spec.kind == "list" and spec.item_kind == "object":
        return LoraListEditor(spec)
    editor = {"bool": BoolEditor, "enum": EnumEditor}.get(spec.kind, TextEditor)(spec)
    return NullableEditor(spec, editor) if spec.nullable else editor


class FieldRow(QWidget):
    """An editor with its error line under it."""

    def __init__(self, spec: FieldSpec):
        super().__init__()
        self.spec = spec
        self.editor = make_editor(spec)
        self.error = ElidedLabel()  # the engine's message can quote a long path; the tooltip has it whole
        self.error.setStyleSheet(ERROR_LABEL_STYLE)
        self.error.hide()
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(2)
        layout.addWidget(self.editor)
        layout.addWidget(self.error)
        self.note = ElidedLabel()  # why a field is shown but set elsewhere (set_fixed); the tooltip has it whole
        self.note.setStyleSheet(NOTE_LABEL_STYLE)
        self.note.hide()
        layout.addWidget(self.note)
        self.label = QLabel(label_of(spec.key) + (" *" if spec.required else ""))
        self.unused = ""  # "unused with method <name>": the row is greyed out
        self.set_error("")

    def base_tooltip(self) -> str:
        s = self.spec
        parts = [".".join(s.key) + ":", f"Greyed out: {self.unused} (the value is kept, not read)" if self.unused else "",
                 s.description, s.range_text, "required" if s.required else f"default: {json.dumps(s.default)}"]
        return "\n".join(p for p in parts if p)

    def set_error(self, message: str) -> None:
        self._message = message
        self.error.setText(message)
        self.error.setVisible(bool(message))
        self.editor.control().setStyleSheet(INVALID_STYLE if message else "")
        tip = self.base_tooltip() + (f"\n\n{message}" if message else "")
        self.editor.setToolTip(tip)
        self.editor.control().setToolTip(tip)
        self.label.setToolTip(self.base_tooltip())

    def set_fixed(self, note: str) -> None:
        """Read-only with `note` under it (why, and where the value is set), or editable again ("")."""
        self.editor.set_fixed(bool(note))
        self.note.setText(note)
        self.note.setVisible(bool(note))

    def set_unused(self, note: str) -> None:
        """Grey out (note: why) or enable again (""); the value and any error stay."""
        if note == self.unused:
            return
        self.unused = note
        self.editor.setEnabled(not note)  # disabled widgets still show their tooltips
        self.label.setEnabled(not note)
        self.set_error(self._message)


class ConfigForm(QWidget):
    """The generated form. `field_edited(key, value)` is emitted for user edits only (value UNSET:
    the key was cleared); set_values and mark_errors never emit."""

    field_edited = Signal(tuple, object)

    def __init__(self, spec: tuple[GroupSpec, ...], parent: Optional[QWidget] = None):
        super().__init__(parent)
        self.rows: dict[Key, FieldRow] = {}
        self._groups: list[tuple[QGroupBox, QFormLayout, list[Key]]] = []
        self.basic = False  # the Basic view: the fields users change most, and any field with a problem
        layout = QVBoxLayout(self)
        for group in spec:
            layout.addWidget(self._group_box(group))
        layout.addStretch(1)

    def _group_box(self, group: GroupSpec) -> QGroupBox:
        box = QGroupBox(group.name or "config file")
        box.setToolTip(group.description)
        form = QFormLayout(box)
        if group.description:
            note = QLabel(group.description)
            note.setWordWrap(True)
            note.setEnabled(False)  # greyed: a caption, not a field
            form.addRow(note)
        for spec in group.fields:
            row = FieldRow(spec)
            row.editor.edited.connect(lambda value, key=spec.key: self.field_edited.emit(key, value))
            form.addRow(row.label, row)
            self.rows[spec.key] = row
        self._groups.append((box, form, [f.key for f in group.fields]))
        return box

    def set_basic(self, basic: bool) -> None:
        """Basic: the fields users change most (field_labels.BASIC) and every field with a problem;
        Advanced: all. A group with no field shown is hidden."""
        self.basic = basic
        self._show_rows()

    def shown_fields(self) -> list[Key]:
        return [key for _box, form, keys in self._groups for key in keys if form.isRowVisible(self.rows[key])]

    def _show_rows(self) -> None:
        for box, form, keys in self._groups:
            any_shown = False
            for key in keys:
                row = self.rows[key]
                shown = not self.basic or key in BASIC or bool(row.error.text())
                form.setRowVisible(row, shown)
                any_shown |= shown
            box.setVisible(any_shown)

    def set_values(self, raw: dict) -> None:
        """Show `raw`; absent keys show their default (required ones stay empty)."""
        for key, row in self.rows.items():
            value = get_field(raw, key)
            row.editor.set_value(row.spec.default if value is UNSET and not row.spec.required else value)

    def mark_unused(self, notes: dict[Key, str]) -> None:
        """Grey out the fields in `notes` (key -> why: "unused with method <name>"), enable every other."""
        for key, row in self.rows.items():
            row.set_unused(notes.get(key, ""))

    def unused_fields(self) -> list[Key]:
        return [key for key, row in self.rows.items() if row.unused]

    def mark_errors(self, errors: dict[Key, str]) -> None:
        for key, row in self.rows.items():
            row.set_error(errors.get(key, ""))
        if self.basic:
            self._show_rows()  # a field with a problem shows in the Basic view too

    def set_fixed(self, key: Key, note: str) -> None:
        """The field `key` is shown read-only with `note` under it ("" makes it editable again)."""
        self.rows[key].set_fixed(note)

    def error_of(self, key: Key) -> str:
        return self.rows[key].error.text()
