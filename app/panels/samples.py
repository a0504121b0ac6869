"""The Samples panel: every prompt x checkpoint of the open run in one grid, the provenance of the
current image, A/B comparison of any two images, "Render again" and the prompt-set editor.

The grid fills in live: the listing of samples/ is re-read in a worker every RESCAN_MS while the
panel is visible (and at once when the window says the run changed state); thumbnails of new or
re-rendered images are decoded in workers and cached on disk (app/models/thumbs.py). Keys: arrows move
(up/down prompt, left/right checkpoint), A and B mark the current image, C compares A with B.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional, Sequence

from PySide6.QtCore import QStandardPaths, Qt, QTimer, Signal
from PySide6.QtWidgets import QHBoxLayout, QLabel, QPushButton, QSplitter, QVBoxLayout, QWidget

from app.dialogs.ab_view import ABView
from app.engine.background import Task
from app.engine.command import DmadCommand
from app.dialogs.prompt_set_editor import PromptSetEditor
from app.models.sample_index import SamplesIndex, checkpoint_of, provenance, scan_samples
from app.widgets.samples_grid import SamplesGridView, SamplesModel
from app.models.thumbs import ThumbCache, ThumbLoader
from dmad.contract.events import Event

RESCAN_MS = 3000


def default_prompt_set_dir() -> Path:
    base = QStandardPaths.writableLocation(QStandardPaths.AppDataLocation) or str(Path.home() / ".dmad-studio")
    return Path(base) / "prompt_sets"


class SamplesPanel(QWidget):
    grid_filled = Signal()  # every image of the current listing has its thumbnail
    render_finished = Signal(int, str)  # exit code, one line

    def __init__(self, cache: Optional[ThumbCache] = None, render_command: Optional[Sequence[str]] = None,
                 prompt_set_dir: Optional[Path] = None, parent: Optional[QWidget] = None):
        """`cache`: thumbnails (default: the user's cache folder); `render_command` replaces
        engine_command() (tests); `prompt_set_dir`: where edited prompt sets are saved."""
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
        self._build()
        self._timer = QTimer(self)
        self._timer.setInterval(RESCAN_MS)
        self._timer.timeout.connect(self._tick)
        self._timer.start()

    def _build(self) -> None:
        self.header = QLabel("No run open.")
        self.header.setWordWrap(True)
        self.grid = SamplesGridView(self.model)
        self.grid.selectionModel().currentChanged.connect(lambda *_: self._show_current())
        self.preview = QLabel()
        self.preview.setAlignment(Qt.AlignCenter)
        self.preview.setMinimumHeight(160)
        self.details = QLabel("")
        self.details.setWordWrap(True)
        self.details.setAlignment(Qt.AlignTop | Qt.AlignLeft)
        self.details.setTextInteractionFlags(Qt.TextSelectableByMouse)
        side = QWidget()
        col = QVBoxLayout(side)
        col.addWidget(self.preview)
        col.addWidget(self.details, 1)
        split = QSplitter()
        split.addWidget(self.grid)
        split.addWidget(side)
        split.setSizes([900, 300])
        self.buttons = {}
        bar = QHBoxLayout()
        for key, text, slot, tip in (
                ("mark_a", "Mark A", lambda: self.mark("A"), "Mark the current image as A (key A)"),
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
        self.render_status = QLabel("")
        bar.addWidget(self.render_status, 1)
        self.grid.mark_requested.connect(self.mark)
        self.grid.compare_requested.connect(self.compare)
        lay = QVBoxLayout(self)
        lay.addWidget(self.header)
        lay.addLayout(bar)
        lay.addWidget(split, 1)
        self._update_buttons()

    # ------------------------------------------------------------ the window's contract

    def set_run(self, run_dir: Optional[Path]) -> None:
        if run_dir == self._run:
            return
        self._run = Path(run_dir) if run_dir is not None else None
        self.thumbs.reset()
        self.model.set_index(SamplesIndex(None, (), ()))
        self.header.setText("No run open." if run_dir is None else "Reading samples ...")
        self._show_current()
        self.refresh()

    def run_dir(self) -> Optional[Path]:
        return self._run

    def refresh(self) -> None:
        if self._run is not None:
            run = self._run
            self._scan.submit(lambda: scan_samples(run))

    def busy(self) -> bool:
        return self._scan.busy() or self.thumbs.busy()

    def _tick(self) -> None:
        if self.isVisible() and not self._scan.busy():
            self.refresh()

    # ------------------------------------------------------------ listing and thumbnails

    def _on_scanned(self, index: SamplesIndex) -> None:
        if index.run_dir != self._run or index == self.model.index_:
            return  # a stale scan, or nothing new on disk
        current = self.grid.current_cell()
        keep = self.model.key(*current) if current else None
        todo = self.model.set_index(index)
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
        return (f"{len(index.rows)} prompts x {len(index.columns)} checkpoints ({index.image_count()} images); "
                f"{name}. Arrows move, A / B mark, C compares.")

    def _on_thumbs(self, result: list) -> None:
        self.model.add_thumbs(result)
        self._show_current()
        if self.model.filled():
            self.grid_filled.emit()

    # ------------------------------------------------------------ current image

    def _show_current(self) -> None:
        cell = self.grid.current_cell()
        if cell is None or self.model.rowCount() == 0:
            self.details.setText("")
            self.preview.clear()
            self._update_buttons()
            return
        lines = provenance(self.model.index_, *cell)
        self.details.setText("\n".join(f"{label}: {value}" for label, value in lines))
        pm = self.model.data(self.model.index(*cell), Qt.DecorationRole)
        if pm is not None:
            side = max(160, min(320, self.preview.width()))
            mode = Qt.FastTransformation if pm.width() < side else Qt.SmoothTransformation
            self.preview.setPixmap(pm.scaled(side, side, Qt.KeepAspectRatio, mode))
        else:
            self.preview.clear()
        self._update_buttons()

    def provenance_text(self) -> str:
        return self.details.text()

    # ------------------------------------------------------------ A/B

    def mark(self, which: str) -> None:
        cell = self.grid.current_cell()
        if cell is not None and self.model.image(*cell) is not None:
            self.model.set_mark(which, *cell)
            self._update_buttons()

    def _pair(self) -> Optional[tuple[tuple[int, int], tuple[int, int]]]:
        selected = [c for c in self.grid.selected_cells() if self.model.image(*c) is not None]
        if len(selected) == 2:
            return selected[0], selected[1]
        marks = [self.model.mark(m) for m in ("A", "B")]
        cells = [self.model.cell_of(*m) if m else None for m in marks]
        if all(cells) and all(self.model.image(*c) is not None for c in cells):
            return cells[0], cells[1]
        return None

    def compare(self) -> bool:
        """Open the A/B view for the two selected images, else the marked pair; False if neither."""
        pair = self._pair()
        if pair is None:
            self.render_status.setText("Choose two images: ctrl-click two cells, or mark A and B.")
            return False
        (a, b) = pair
        labels = ["{1} / {0}".format(*self.model.key(*cell)) for cell in pair]  # "iter_60 / shape-circle"
        self.ab.set_pair(labels[0], self.model.image(*a).path, labels[1], self.model.image(*b).path)
        self.ab.show()
        self.ab.raise_()
        return True

    # ------------------------------------------------------------ render again

    def _update_buttons(self) -> None:
        cell = self.grid.current_cell()
        render = self.buttons["render"]
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
        self.buttons["prompts"].setEnabled(self._run is not None)

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
        self._render.start(args)
        self._update_buttons()

    def _on_render_event(self, ev: Event) -> None:
        """`dmad sample` names the folder it rendered into: the grid moves there once it lands."""
        if ev.kind == "samples" and isinstance(ev.data.get("folder"), str):
            self._jump_to = Path(ev.data["folder"]).name

    def _render_done(self, code: int, line: str) -> None:
        text = "done" if code == 0 else line
        self.render_status.setText(f"Render again: {text}")
        self._update_buttons()
        self.refresh()
        self.render_finished.emit(code, text)

    # ------------------------------------------------------------ prompt set

    def edit_prompt_set(self) -> Optional[PromptSetEditor]:
        """The editor on the run's prompt_set.json; its name + version counts as taken (the run used it)."""
        if self._run is None:
            return None
        used = []
        source = self._run / "prompt_set.json"
        try:
            used.append(json.loads(source.read_text(encoding="utf-8")))
        except (OSError, ValueError):
            source = None
        editor = PromptSetEditor(self._prompt_set_dir, used, self)
        if source is not None:
            editor.load_file(source)
        editor.show()
        return editor
