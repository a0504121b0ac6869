"""Prompt-set editor: load a prompt set JSON, edit its items and settings, validate as you type with
the engine's own rules and words (dmad.contract.prompts), and save without ever changing an existing version.

Versions are immutable, so a name + version always means the prompts a run's samples were rendered
from: an edited set whose name + version already exists in the save folder, or is the one a run used,
is saved as the next version (v2 after v1) in a new file; the existing files keep their bytes. The
engine owns the rule (dmad.contract.prompts.save_new_version); this dialog only adds the run's copy to
the versions that count as taken.

A run whose family samples with its own sampler whatever the set names (SD3, Flux: flow matching,
family_sampler) shows that sampler, disabled, in place of the set's, which the file keeps.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable, Optional

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (QComboBox, QDialog, QDoubleSpinBox, QFileDialog, QFormLayout, QHBoxLayout, QHeaderView,
                               QLabel, QLineEdit, QPushButton, QSpinBox, QTableWidget, QTableWidgetItem, QVBoxLayout,
                               QWidget)
from app.widgets.wheel_guard import guard_wheel

from dmad.errors import UserInputError
from dmad.contract.jsonfile import read_json_or_problem
from dmad.contract.prompts import SAMPLERS, find_versions, save_new_version, save_prompt_set, validate_prompt_set

ITEM_COLUMNS = ("id", "topic", "prompt", "negative_prompt", "seed")
FORM_KEYS = ("prompt_set", "version", "resolution", "seed", "sampler", "steps", "cfg", "items")  # what the form edits
SOURCE = "prompt set"  # the name the engine's messages start with
# A flow-matching family (SD3, Flux) samples with its own sampler whatever the set names: the engine's
# dmad/sample/render.py FLOW_SAMPLER and sampler_name (no torch-free copy in dmad.contract yet).
FLOW_FAMILIES = ("sd3", "flux")
FLOW_SAMPLER = "flow_match_euler"


def family_sampler(model_family: Optional[str], teacher_meta: Optional[dict] = None) -> Optional[str]:
    """The sampler a run's teacher renders its references with whatever the prompt set names, or None
    when it uses the set's: a flow-matching family's own. `model_family`: the run's config.json
    identity.model_family (samples_grid.GridListing.model_family); with "auto" (found from the
    teacher's files at run time) the teacher samples' meta.json says what it rendered with
    (GridListing.teacher_meta()). Neither known: None (the set's sampler is shown)."""
    if model_family in FLOW_FAMILIES:
        return FLOW_SAMPLER
    if model_family not in (None, "auto"):
        return None  # SD 1.x / 2.x / XL: the set's sampler
    used = teacher_meta.get("sampler") if isinstance(teacher_meta, dict) else None
    return FLOW_SAMPLER if used == FLOW_SAMPLER else None


def save_edited(raw: dict, folder: Path, used: Iterable[dict] = ()) -> Path:
    """Save `raw` into `folder` under the versioning rule; `used`: prompt sets runs were made with
    (their name + version is taken even when `folder` has no such file)."""
    ps = validate_prompt_set(raw, SOURCE)
    taken = {}
    for u in used:
        try:
            other = validate_prompt_set(u, SOURCE)
        except UserInputError:
            continue
        if other.prompt_set == ps.prompt_set:
            taken[other.version] = other
    if taken.get(ps.version) == ps and ps.version not in find_versions(folder, ps.prompt_set):
        return save_prompt_set(raw, folder)  # a run's set, unedited: kept under its own version
    return save_new_version(raw, folder, taken=set(taken))


def _int_or_text(text: str):
    """A cell's seed: empty -> None (left out), digits -> int, else the text (the engine says why)."""
    text = text.strip()
    if not text:
        return None
    try:
        return int(text)
    except ValueError:
        return text


class PromptSetEditor(QDialog):
    saved = Signal(object)  # Path of the file written (or of the identical version found)

    def __init__(self, save_dir: Path, used: Iterable[dict] = (), parent: Optional[QWidget] = None,
                 own_sampler: Optional[str] = None):
        """`own_sampler`: the sampler the run's family renders with whatever the set names (see
        family_sampler), shown instead of the set's, which the file keeps; None: the set's is used."""
        super().__init__(parent)
        self.setWindowTitle("Prompt set")
        self.save_dir = Path(save_dir)
        self.used = list(used)
        self.own_sampler = own_sampler
        self._loaded: dict = {}
        self._extra: dict = {}  # the loaded set's keys the form does not show (health_seeds): kept as they are
        self._filling = False
        self._build()
        self.set_raw({"prompt_set": "my_prompts", "version": "v1", "resolution": [512, 512], "seed": 0,
                      "sampler": "ddim", "steps": 50, "cfg": 7.5,
                      "items": [{"id": "item-1", "topic": "general", "prompt": ""}]})

    def _build(self) -> None:
        self.name = QLineEdit()
        self.version = QLineEdit()
        self.width_box, self.height_box = QSpinBox(), QSpinBox()
        for box in (self.width_box, self.height_box):
            box.setRange(0, 16384)
            box.setSingleStep(8)
        self.seed = QLineEdit()
        self.sampler = QComboBox()
        self.sampler.addItems(SAMPLERS)
        self.own_sampler_box = QLineEdit()  # the run family's own sampler, in place of the set's (kept in the file)
        self.own_sampler_box.setEnabled(False)
        sampler_row = QHBoxLayout()
        sampler_row.addWidget(self.sampler, 1)
        sampler_row.addWidget(self.own_sampler_box, 1)
        self.steps = QSpinBox()
        self.steps.setRange(0, 100000)
        self.cfg = QDoubleSpinBox()
        self.cfg.setRange(0.0, 1000.0)
        self.cfg.setDecimals(2)
        guard_wheel(self.width_box, self.height_box, self.sampler, self.steps, self.cfg)  # wheel only with focus
        res = QHBoxLayout()
        res.addWidget(self.width_box)
        res.addWidget(QLabel("x"))
        res.addWidget(self.height_box)
        form = QFormLayout()
        form.addRow("Name", self.name)
        form.addRow("Version", self.version)
        form.addRow("Resolution (w x h)", res)
        form.addRow("Base seed", self.seed)
        form.addRow("Teacher sampler", sampler_row)
        form.addRow("Teacher steps", self.steps)
        form.addRow("Teacher CFG", self.cfg)
        self.items = QTableWidget(0, len(ITEM_COLUMNS))
        self.items.setHorizontalHeaderLabels(list(ITEM_COLUMNS))
        self.items.horizontalHeader().setSectionResizeMode(2, QHeaderView.Stretch)
        add, remove = QPushButton("Add item"), QPushButton("Remove item")
        add.clicked.connect(self.add_item)
        remove.clicked.connect(self._remove_item)
        self.message = QLabel()
        self.message.setWordWrap(True)
        self.message.setTextInteractionFlags(Qt.TextSelectableByMouse)
        self.folder_label = QLabel()
        open_button, folder_button = QPushButton("Open..."), QPushButton("Save folder...")
        open_button.clicked.connect(self._ask_open)
        folder_button.clicked.connect(self._ask_folder)
        self.save_button = QPushButton("Save")
        self.save_button.clicked.connect(self.save)
        close = QPushButton("Close")
        close.clicked.connect(self.reject)
        rows = QHBoxLayout()
        rows.addWidget(add)
        rows.addWidget(remove)
        rows.addStretch(1)
        buttons = QHBoxLayout()
        for w in (open_button, folder_button, self.folder_label):
            buttons.addWidget(w)
        buttons.addStretch(1)
        buttons.addWidget(self.save_button)
        buttons.addWidget(close)
        lay = QVBoxLayout(self)
        lay.addLayout(form)
        lay.addWidget(self.items, 1)
        lay.addLayout(rows)
        lay.addWidget(self.message)
        lay.addLayout(buttons)
        for w in (self.name, self.version, self.seed):
            w.textChanged.connect(self._changed)
        for box in (self.width_box, self.height_box, self.steps):
            box.valueChanged.connect(self._changed)
        self.cfg.valueChanged.connect(self._changed)
        self.sampler.currentTextChanged.connect(self._changed)
        self.items.itemChanged.connect(self._changed)
        self.items.model().rowsRemoved.connect(self._changed)
        self.resize(900, 600)

    # ------------------------------------------------------------ content

    def load_file(self, path: Path) -> None:
        """Show a prompt set file (its JSON, even when invalid: the message says what to fix).
        ValueError with one line when it is not JSON at all (unreadable, too big, too deep)."""
        raw, problem = read_json_or_problem(path)
        if problem:
            raise ValueError(problem)
        self.show_raw(raw, Path(path).name)

    def show_raw(self, raw, name: str) -> None:
        """Show parsed prompt-set JSON read from the file `name` (a non-object shows as empty)."""
        self.set_raw(raw if isinstance(raw, dict) else {})
        self.setWindowTitle(f"Prompt set - {name}")

    def set_raw(self, raw: dict) -> None:
        self._filling = True
        self._extra = {k: v for k, v in raw.items() if k not in FORM_KEYS}  # health_seeds and the like: kept
        self.name.setText(str(raw.get("prompt_set", "")))
        self.version.setText(str(raw.get("version", "")))
        res = raw.get("resolution") if isinstance(raw.get("resolution"), list) else [0, 0]
        self.width_box.setValue(int(res[0]) if len(res) > 0 and isinstance(res[0], int) else 0)
        self.height_box.setValue(int(res[1]) if len(res) > 1 and isinstance(res[1], int) else 0)
        self.seed.setText(str(raw.get("seed", 0)))
        sampler = str(raw.get("sampler", "ddim"))
        if self.sampler.findText(sampler) < 0:
            self.sampler.addItem(sampler)  # shown as it is; validation names the problem
        self.sampler.setCurrentText(sampler)
        self._show_sampler(sampler)
        self.steps.setValue(int(raw.get("steps", 50)) if isinstance(raw.get("steps"), int) else 0)
        self.cfg.setValue(float(raw.get("cfg", 7.5)) if isinstance(raw.get("cfg"), (int, float)) else 0.0)
        self.items.setRowCount(0)
        for it in raw.get("items") if isinstance(raw.get("items"), list) else []:
            self.add_item(it if isinstance(it, dict) else {})
        self._filling = False
        self._loaded = self.raw()
        self._changed()

    def _show_sampler(self, sampler: str) -> None:
        """The set's sampler, or, for a family that never uses it, that family's own (disabled): the
        editor said "ddim" for a run whose teacher rendered with flow_match_euler."""
        own = self.own_sampler
        self.sampler.setHidden(own is not None)
        self.own_sampler_box.setHidden(own is None)
        if own is not None:
            self.own_sampler_box.setText(f"{own} (the family's own)")
            self.own_sampler_box.setToolTip(
                f"This run's teacher is a flow-matching model (SD3 / Flux): it always samples with its own "
                f"{own} sampler, whatever a prompt set names. The set keeps sampler \"{sampler}\" for runs of "
                "other families.")

    def add_item(self, item: Optional[dict] = None) -> None:
        item = item if isinstance(item, dict) else {}
        was, self._filling = self._filling, True
        r = self.items.rowCount()
        self.items.insertRow(r)
        for c, key in enumerate(ITEM_COLUMNS):
            value = item.get(key)
            self.items.setItem(r, c, QTableWidgetItem("" if value is None else str(value)))
        self._filling = was
        self._changed()

    def _remove_item(self) -> None:
        rows = sorted({i.row() for i in self.items.selectedIndexes()} or {self.items.rowCount() - 1}, reverse=True)
        for r in rows:
            if r >= 0:
                self.items.removeRow(r)

    def raw(self) -> dict:
        """The set as the form shows it, in the file's form (empty optional cells left out), with the
        loaded set's keys the form does not show (health_seeds) as they were."""
        items = []
        for r in range(self.items.rowCount()):
            cell = {key: (self.items.item(r, c).text() if self.items.item(r, c) else "")
                    for c, key in enumerate(ITEM_COLUMNS)}
            item = {"id": cell["id"].strip(), "topic": cell["topic"], "prompt": cell["prompt"]}
            if cell["negative_prompt"]:
                item["negative_prompt"] = cell["negative_prompt"]
            seed = _int_or_text(cell["seed"])
            if seed is not None:
                item["seed"] = seed
            items.append(item)
        seed = _int_or_text(self.seed.text())
        return {**self._extra, "prompt_set": self.name.text().strip(),
                "version": self.version.text().strip(),
                "resolution": [self.width_box.value(), self.height_box.value()],
                "seed": 0 if seed is None else seed, "sampler": self.sampler.currentText(),
                "steps": self.steps.value(), "cfg": round(self.cfg.value(), 4), "items": items}

    def is_edited(self) -> bool:
        return self.raw() != self._loaded

    def problem(self) -> str:
        """The engine's one-line message for the form's content; "" when it is a valid set."""
        try:
            validate_prompt_set(self.raw(), SOURCE)
        except UserInputError as e:
            return str(e)
        return ""

    # ------------------------------------------------------------ validation and saving

    def _changed(self, *_args) -> None:
        if self._filling:
            return
        problem = self.problem()
        self.save_button.setEnabled(not problem)
        self.save_button.setToolTip(problem or f"Saves into {self.save_dir}; an existing name + version is "
                                               "never overwritten: an edit becomes the next version")
        self.message.setText(problem or ("Edited: Save writes a new version." if self.is_edited() else "Valid."))
        self.message.setStyleSheet("color: #b00020;" if problem else "")
        self.folder_label.setText(f"into {self.save_dir}")

    def save(self) -> Optional[Path]:
        """Write the set (see save_edited); None, with the reason shown, when it cannot be saved."""
        try:
            path = save_edited(self.raw(), self.save_dir, self.used)
        except (UserInputError, OSError) as e:
            self.message.setText(f"Not saved: {e}")
            return None
        saved = json.loads(path.read_text(encoding="utf-8"))
        self.set_raw(saved)
        self.message.setText(f"Saved as {path} (version {saved.get('version')}).")
        self.saved.emit(path)
        return path

    def _ask_open(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Open prompt set", str(self.save_dir), "Prompt sets (*.json)")
        if path:
            try:
                self.load_file(Path(path))
            except (OSError, ValueError) as e:
                self.message.setText(f"Cannot open {path}: {e}")

    def _ask_folder(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "Save prompt sets into", str(self.save_dir))
        if folder:
            self.save_dir = Path(folder)
            self._changed()
