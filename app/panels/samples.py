"""The Samples panel: every prompt x checkpoint of the open run in one grid, the provenance of the
current image, A/B comparison of any two images (also from two runs), "Render again", Export and the
prompt-set editor.

The grid fills in live: the listing of samples/ (and of checkpoints/, for checkpoints without
samples) is re-read in a worker every RESCAN_MS while the panel is visible (and at once when the
window says the run changed state); thumbnails of new or re-rendered images are decoded in workers
and cached on disk (app/models/thumbs.py). Keys: arrows move (up/down prompt, left/right
checkpoint), A and B mark the current image, C compares A with B. Each checkpoint's health figures
are under its header (samples_grid.py); "Order by" sorts the columns by a health signal (teacher
first) and "Best" goes to the checkpoint closest to the teacher by it. Every message line is elided
(whole in its tooltip) and the side column is on a movable splitter: nothing here widens the window.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

from PySide6.QtCore import QStandardPaths, Qt, QTimer, Signal
from PySide6.QtWidgets import (QComboBox, QHBoxLayout, QLabel, QPushButton, QSlider, QSplitter, QVBoxLayout,
                               QWidget)

from app.dialogs.ab_view import ABView
from app.dialogs.prompt_set_editor import PromptSetEditor, family_sampler
from app.engine.background import Task
from app.engine.command import DmadCommand
from app.models.health import LABELS, SIGNALS, figure
from app.models.sample_index import NO_PROMPT_SET, SamplesIndex, checkpoint_of, provenance
from app.models.thumbs import THUMB_PX, ThumbCache, ThumbLoader
from app.widgets.elided_label import ElidedLabel
from app.widgets.export_button import ExportButton, reveal_folder
from app.widgets.image_preview import ImagePreview
from app.widgets.provenance_view import ProvenanceView
from app.widgets.samples_grid import (CELL_PX, CELL_RANGE, NO_SAMPLES, GridListing, Mark, SamplesGridView,
                                      SamplesModel, scan_grid)
from app.widgets.wheel_guard import guard_wheel
from dmad.contract.events import Event
from dmad.contract.runs import RunFolder

RESCAN_MS = 3000
SIDE_MIN_PX = 160  # the side column can be dragged down to this


def default_prompt_set_dir() -> Path:
    base = QStandardPaths.writableLocation(QStandardPaths.AppDataLocation) or str(Path.home() / ".dmad-studio")
    return Path(base) / "prompt_sets"


def column_lines(lines: list[tuple[str, str]], name: str, state: str) -> list[tuple[str, str]]:
    """Provenance lines as the column's state tells them: a folder without meta.json is "rendering…"
    while a render is live, a render that stopped otherwise; a checkpoint without samples says so."""
    if state == "no-samples":
        return [("checkpoint", name), ("samples", f"{NO_SAMPLES}: Render renders the run's prompt set with it")]
    note = {"rendering": f"samples/{name}: rendering… (meta.json is written when the render ends)",
            "failed": f"samples/{name}: no meta.json (a render that stopped before it finished, or a folder "
                      "from elsewhere); provenance unknown"}
    if state not in note:
        return lines
    return [("meta.json", note[state]) if label == "meta.json" else (label, value) for label, value in lines]


class SamplesPanel(QWidget):
    grid_filled = Signal()  # every image of the current listing has its thumbnail
    render_finished = Signal(int, str)  # exit code, one line
    export_finished = Signal(int, str)  # exit code, the output folder or what went wrong

    def __init__(self, cache: Optional[ThumbCache] = None, render_command: Optional[Sequence[str]] = None,
                 prompt_set_dir: Optional[Path] = None, parent: Optional[QWidget] = None, reveal=reveal_folder):
        """`cache`: thumbnails (default: the user's cache folder); `render_command` replaces
        engine_argv() for `dmad sample` and `dmad export` (tests); `prompt_set_dir`: where edited
        prompt sets are saved; `reveal(folder)`: shows an export's folder (the file manager)."""
        super().__init__(parent)
        self._run: Optional[Path] = None
        self._render = DmadCommand(self, program=render_command, parse_events=True)
        self._render.event_received.connect(self._on_render_event)
        self._render.finished.connect(self._render_done)
        self._prompt_set_dir = prompt_set_dir or default_prompt_set_dir()
        self._jump_to: Optional[str] = None  # the folder `dmad sample` reported: shown when it lands
        self.model = SamplesModel(self)
        self.thumbs = ThumbLoader(cache or ThumbCache(), self)
        self.thumbs.loaded.connect(self._on_thumbs)
        self._scan = Task(self)
        self._scan.done.connect(self._on_scanned)
        self._scan.failed.connect(lambda msg: self.header.setText(f"Could not read samples: {msg}"))
        self.ab = ABView(self)
        self.ab.setWindowFlag(Qt.Window)
        self.export = ExportButton(program=render_command, reveal=reveal)
        self.export.export_started.connect(lambda line: self.render_status.setText(f"Exporting: {line} ..."))
        self.export.export_finished.connect(self._export_done)
        self._build()
        self._timer = QTimer(self)
        self._timer.setInterval(RESCAN_MS)
        self._timer.timeout.connect(self._tick)
        self._timer.start()

    def _build(self) -> None:
        self.header = ElidedLabel("No run open.")
        self.grid = SamplesGridView(self.model)
        self.grid.selectionModel().currentChanged.connect(lambda *_: self._show_current())
        self.grid.doubleClicked.connect(self._double_clicked)
        self.grid.mark_requested.connect(self.mark)
        self.grid.compare_requested.connect(self.compare)
        self.preview = ImagePreview()
        self.details = ProvenanceView()
        side = QWidget()
        side.setMinimumWidth(SIDE_MIN_PX)
        col = QVBoxLayout(side)
        col.setContentsMargins(0, 0, 0, 0)
        col.addWidget(self.preview, 1)
        col.addWidget(self.details, 1)
        self.splitter = QSplitter()
        self.splitter.addWidget(self.grid)
        self.splitter.addWidget(side)
        self.splitter.setChildrenCollapsible(False)
        self.splitter.setStretchFactor(0, 1)  # a wider window widens the grid, not the side column
        self.splitter.setSizes([900, 300])
        lay = QVBoxLayout(self)
        lay.addLayout(self._header_row())
        lay.addLayout(self._button_bar())
        lay.addWidget(self.splitter, 1)
        self._update_buttons()

    def _header_row(self) -> QHBoxLayout:
        """The listing's summary, then the health ordering (issue 39): the button bar has no room left."""
        self.order_by = QComboBox()
        self.order_by.addItem("checkpoint", "")
        for signal in SIGNALS:
            self.order_by.addItem(LABELS[signal], signal)
        self.order_by.setToolTip("Order the checkpoint columns by a health signal, best first (closest to the "
                                 "teacher's level; the lowest distance to the teacher); the teacher stays first")
        self.order_by.currentIndexChanged.connect(lambda _: self._order_columns())
        self.best = QPushButton("Best")
        self.best.setToolTip("Go to the checkpoint whose health figure is closest to the teacher's, by the "
                             "signal chosen in Order by (Diversity when none is)")
        self.best.clicked.connect(self.go_to_best)
        guard_wheel(self.order_by)
        row = QHBoxLayout()
        row.addWidget(self.header, 1)
        for w in (QLabel("Order by"), self.order_by, self.best):
            row.addWidget(w)
        return row

    def _button_bar(self) -> QHBoxLayout:
        self.buttons = {}
        bar = QHBoxLayout()
        for key, text, slot, tip in (
                ("mark_a", "Mark A", lambda: self.mark("A"), "Mark the current image as A (key A); A and B "
                                                             "may be in two runs"),
                ("mark_b", "Mark B", lambda: self.mark("B"), "Mark the current image as B (key B)"),
                ("compare", "Compare A/B", self.compare, "A/B view of the two selected images (ctrl-click) "
                                                         "or of the images marked A and B (key C)"),
                ("render", "Render again", self.render_again, ""),
                ("prompts", "Edit prompt set...", self.edit_prompt_set, "Edit the run's prompt set; an edit "
                                                                        "is saved as a new version")):
            b = QPushButton(text)
            b.clicked.connect(slot)
            b.setToolTip(tip)
            bar.addWidget(b)
            self.buttons[key] = b
            if key == "render":
                bar.addWidget(self.export)
        self.thumb_size = QSlider(Qt.Horizontal)
        self.thumb_size.setRange(*CELL_RANGE)
        self.thumb_size.setSingleStep(8)
        self.thumb_size.setPageStep(32)
        self.thumb_size.setValue(CELL_PX)
        self.thumb_size.setMaximumWidth(140)
        self.thumb_size.setToolTip("Thumbnail size")
        self.thumb_size.valueChanged.connect(self.grid.set_cell_px)
        guard_wheel(self.thumb_size)
        bar.addWidget(QLabel("Size"))
        bar.addWidget(self.thumb_size)
        self.render_status = ElidedLabel("")  # engine lines (a library warning) can be any length
        bar.addWidget(self.render_status, 1)
        return bar

    # ------------------------------------------------------------ the window's contract

    def set_run(self, run_dir: Optional[Path]) -> None:
        """Show another run; the A and B marks stay (A in one run, B in another compares two runs)."""
        if run_dir == self._run:
            return
        self._run = Path(run_dir) if run_dir is not None else None
        self.render_status.setText("")  # "Exported to ..." of another (renamed, deleted) run says nothing here
        self.thumbs.reset()
        self.model.set_listing(GridListing(SamplesIndex(None, (), ())))
        self.header.setText("No run open." if run_dir is None else "Reading samples ...")
        self._show_current()
        self.refresh()

    def run_dir(self) -> Optional[Path]:
        return self._run

    def refresh(self) -> None:
        if self._run is not None:
            run = self._run
            self._scan.submit(lambda: scan_grid(run))

    def busy(self) -> bool:
        return self._scan.busy() or self.thumbs.busy()

    def _tick(self) -> None:
        if self.isVisible() and not self._scan.busy():
            self.refresh()

    # ------------------------------------------------------------ listing and thumbnails

    def _on_scanned(self, listing: GridListing) -> None:
        index = listing.index
        if index.run_dir != self._run or listing == self.model.listing:
            return  # a stale scan, or nothing new on disk
        current = self.grid.current_cell()
        keep = self.model.key(*current) if current else None
        todo = self.model.set_listing(listing)
        self.grid.hide_columns(self.model.empty_failed_columns())
        self._order_columns()
        pos = self.model.cell_of(*keep) if keep else None
        if pos is None and index.rows and index.columns:
            pos = (0, 0)
        if self._jump_to is not None and pos is not None:
            col = self.model.cell_of(index.rows[pos[0]], self._jump_to)
            if col is not None:
                pos, self._jump_to = col, None
        if pos is not None:
            self.grid.set_current_cell(*pos)
        self.header.setText(self._summary(index))
        self._show_current()
        if todo:
            self.thumbs.request(todo)
        elif self.model.filled():
            self.grid_filled.emit()

    def _summary(self, index: SamplesIndex) -> str:
        if not index.columns:
            return ("This run has no samples yet (they are rendered at checkpoints and every "
                    "observation.validation_steps)." + (f" {index.prompt_note}." if index.prompt_note else ""))
        ps = index.prompt_set
        name = f"prompt set {ps.get('prompt_set', '?')} {ps.get('version', '?')}" if ps else index.prompt_note
        hidden = [index.columns[c].name for c in self.model.empty_failed_columns()]
        note = (f" Hidden: {', '.join(hidden)} (a render that stopped before its first image)." if hidden else "")
        shown = len(index.columns) - len(hidden)
        health = f" health: {self.model.listing.health_note}." if self.model.listing.health_note else ""
        return (f"{len(index.rows)} prompts x {shown} checkpoints ({index.image_count()} images); "
                f"{name}. Arrows move, A / B mark, C compares.{note}{health}")

    # ------------------------------------------------------------ health (issue 39)

    def order_signal(self) -> str:
        return self.order_by.currentData() or ""

    def _order_columns(self) -> None:
        signal = self.order_signal()
        self.model.set_sort_signal(signal)
        self.grid.set_column_order(self.model.health_order(signal) if signal else
                                   list(range(self.model.columnCount())))

    def go_to_best(self) -> Optional[str]:
        """The current cell moves to the best checkpoint by the chosen signal; its name, or None."""
        signal = self.order_signal() or "diversity"
        col = self.model.best_column(signal)
        if col is None:
            self.render_status.setText(f"No checkpoint has a {LABELS[signal].lower()} figure (health.csv)")
            return None
        cell = self.grid.current_cell()
        self.grid.set_current_cell(cell[0] if cell else 0, col)
        self.grid.scrollTo(self.model.index(cell[0] if cell else 0, col))
        name = self.model.index_.columns[col].name
        value = self.model.health_of(col).value(signal)
        self.render_status.setText(f"Best by {LABELS[signal].lower()}: {name} ({figure(signal, value)})")
        return name

    def _on_thumbs(self, result: list) -> None:
        self.model.add_thumbs(result)
        self._show_current()
        if self.model.filled():
            self.grid_filled.emit()

    # ------------------------------------------------------------ current image

    def _show_current(self) -> None:
        cell = self.grid.current_cell()
        if cell is None or self.model.rowCount() == 0:
            self.details.set_lines([])
            self.preview.set_pixmap(None)
            self._update_buttons()
            return
        name = self.model.key(*cell)[1]
        state = self.model.column_state(cell[1])
        self.details.set_lines(column_lines(provenance(self.model.index_, *cell), name, state))
        pm = self.model.data(self.model.index(*cell), Qt.DecorationRole)
        self.preview.set_pixmap(pm, pixels=pm is None or max(pm.width(), pm.height()) < THUMB_PX)
        self._update_buttons()

    def provenance_text(self) -> str:
        return self.details.text()

    def _double_clicked(self, index) -> None:
        if self.model.column_state(index.column()) == "no-samples":
            self.render_again()

    # ------------------------------------------------------------ A/B

    def mark(self, which: str) -> None:
        cell = self.grid.current_cell()
        if cell is not None and self.model.set_mark(which, *cell) is not None:
            self._update_buttons()

    def _pair(self) -> Optional[tuple[Mark, Mark]]:
        """The two selected images of this run, else the images marked A and B (of any runs)."""
        selected = [c for c in self.grid.selected_cells() if self.model.image(*c) is not None]
        if len(selected) == 2:
            run = self.model.index_.run_dir
            a, b = (Mark(run, *self.model.key(*c), self.model.image(*c).path) for c in selected)
            return a, b
        a, b = self.model.mark("A"), self.model.mark("B")
        if a is not None and b is not None:
            return a, b  # not stat()ed here: the A/B view's worker says if one is gone
        return None

    def compare(self) -> bool:
        """Open the A/B view for the two selected images, else the marked pair; False if neither."""
        pair = self._pair()
        if pair is None:
            self.render_status.setText("Choose two images: ctrl-click two cells, or mark A and B "
                                       "(in this run or another one).")
            return False
        a, b = pair
        self.ab.set_pair(a.label(b), a.path, b.label(a), b.path)
        self.ab.show_beside(self.window())
        return True

    # ------------------------------------------------------------ render again, export

    def _update_buttons(self) -> None:
        cell = self.grid.current_cell()
        render = self.buttons["render"]
        state = self.model.column_state(cell[1]) if cell is not None and self.model.columnCount() else ""
        render.setText("Render" if state == "no-samples" else "Render again")
        if self._render.is_running():
            render.setEnabled(False)
            render.setToolTip("dmad sample is running")
        elif cell is None or self._run is None:
            render.setEnabled(False)
            render.setToolTip("Choose an image: its checkpoint is rendered again")
        else:
            render.setEnabled(True)
            ckpt = checkpoint_of(self.model.key(*cell)[1])
            render.setToolTip(f"Run dmad sample --run <this run> --checkpoint {ckpt}: the same prompt set, "
                              "seeds and settings, into a new column <folder>-r<K> beside it")
        self.buttons["prompts"].setEnabled(self._listed())
        self._update_export(cell)

    def _update_export(self, cell: Optional[tuple[int, int]]) -> None:
        listing = self.model.listing
        if cell is None or self._run is None or not self.model.columnCount():
            self.export.set_target(None, None)
            return
        ckpt = checkpoint_of(self.model.key(*cell)[1])
        if ckpt == "teacher":
            self.export.set_target(self._run, None, "the teacher is not exported: choose a student checkpoint")
        elif int(ckpt) not in listing.checkpoints:
            self.export.set_target(self._run, None, f"checkpoints/iter_{ckpt} is not on disk (a validation "
                                                    "render, or removed by checkpoints_total_limit)")
        else:
            self.export.set_target(self._run, int(ckpt), lora=listing.student == "lora")

    def _export_done(self, code: int, text: str) -> None:
        self.render_status.setText(f"Exported to {text}" if code == 0 else f"Export failed: {text}")
        self.export_finished.emit(code, text)

    def _render_args(self) -> Optional[list[str]]:
        cell = self.grid.current_cell()
        if cell is None or self._run is None:
            return None
        name = self.model.key(*cell)[1]
        return ["sample", "--run", str(self._run), "--checkpoint", checkpoint_of(name)]

    def render_again(self) -> None:
        args = self._render_args()
        if args is None or self._render.is_running():
            return
        self.render_status.setText(f"Rendering: {' '.join(args[-4:])} ...")
        self.model.set_rendering({args[-1]})
        self._render.start(args)
        self._update_buttons()

    def _on_render_event(self, ev: Event) -> None:
        """`dmad sample` names the folder it rendered into: the grid moves there once it lands."""
        if ev.kind == "samples" and isinstance(ev.data.get("folder"), str):
            self._jump_to = Path(ev.data["folder"]).name

    def _render_done(self, code: int, line: str) -> None:
        text = "done" if code == 0 else line
        self.render_status.setText(f"Render again: {text}")
        self.model.set_rendering(set())
        self._update_buttons()
        self._show_current()
        self.refresh()
        self.render_finished.emit(code, text)

    # ------------------------------------------------------------ prompt set

    def _listed(self) -> bool:
        """The open run's listing (its prompt_set.json with it) has come from the worker."""
        return self._run is not None and self.model.listing.index.run_dir == self._run

    def edit_prompt_set(self) -> Optional[PromptSetEditor]:
        """The editor on the run's prompt_set.json, as the listing's worker read it (the GUI thread reads
        no run file); its name + version counts as taken (the run used it). None until the listing is in."""
        if not self._listed():
            return None
        index = self.model.listing.index
        raw, problem = index.prompt_set, index.prompt_note
        listing = self.model.listing
        editor = PromptSetEditor(self._prompt_set_dir, [] if problem else [raw], self,
                                 own_sampler=family_sampler(listing.model_family, listing.teacher_meta()))
        if not problem:
            editor.show_raw(raw, RunFolder(self._run).prompt_set_json.name)
        elif problem != NO_PROMPT_SET:  # the run's copy is broken (or planted): an empty editor that says so
            editor.message.setText(f"The run's prompt set is not shown: {problem}")
        editor.show()
        return editor
