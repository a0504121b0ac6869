"""The Playground tab: try a prompt of your own on any checkpoint of the open run (finished or live)
and on its teacher, side by side.

The user sets the prompt, the negative prompt (where the family has one), the seed, the student's
steps and CFG, and the resolution; Render (Ctrl+Enter) runs `dmad sample --prompt` (app/models/
playground.py) in its own process: the student's image at those settings and the teacher's with its
own sampler, steps and CFG, from the same noise. The pair lands in <run>/samples/oneoff/ with its
provenance and shows here; the history lists every one-off of the run (the live run's "Sample
prompt…" images too), and A/B compares a pair in the A/B window. Files are read in workers. On a run
whose engine is live here, "current weights" asks that engine (sample_now with the prompt and seed,
as "Sample prompt…" does): the student as it is now; the teacher's image of the same request renders
on the CPU meanwhile (`dmad sample --checkpoint teacher --device cpu`: the device is training's) and
goes beside it (app/models/playground.py pairs them); saved checkpoints render through `dmad sample`.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QImage, QKeySequence, QPixmap, QShortcut
from PySide6.QtWidgets import (QCheckBox, QComboBox, QDoubleSpinBox, QFormLayout, QGridLayout, QHBoxLayout, QLabel,
                               QLineEdit, QListWidget, QListWidgetItem, QPlainTextEdit, QPushButton, QSpinBox,
                               QSplitter, QVBoxLayout, QWidget)

from app.dialogs.one_off_view import load_image
from app.engine.background import Task
from app.engine.command import DmadCommand
from app.models.playground import OneOffPair, Request, RunOffer, read_offer, sample_args, scan_one_offs
from app.widgets.elided_label import ElidedLabel
from app.widgets.wheel_guard import guard_wheel

LIVE = "live"  # the checkpoint box's item for the live run's current weights
VIEW_SIDE = 256  # px: a 64 px demo image is shown enlarged (nearest neighbour)
MAX_SEED = 2**31 - 1  # a QSpinBox holds an int32; the engine takes up to 2**32 - 1


class ImageBox(QWidget):
    """One image of a pair with its caption (what made it)."""

    def __init__(self, title: str):
        super().__init__()
        self.title = QLabel(f"<b>{title}</b>")
        self.image = QLabel("—")
        self.image.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.image.setMinimumSize(VIEW_SIDE, VIEW_SIDE)
        self.caption = QLabel()  # what made the image, wrapped under it (never widens the box)
        self.caption.setWordWrap(True)
        self.caption.setMaximumWidth(VIEW_SIDE)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        for w in (self.title, self.image, self.caption):
            layout.addWidget(w)

    def show_image(self, img: Optional[QImage], caption: str) -> None:
        if img is None or img.isNull():
            self.image.setPixmap(QPixmap())
            self.image.setText("—")
        else:
            side = max(VIEW_SIDE, min(img.width(), 512))
            self.image.setPixmap(QPixmap.fromImage(img).scaled(side, side, Qt.AspectRatioMode.KeepAspectRatio,
                                                               Qt.TransformationMode.FastTransformation))
        self.caption.setText(caption)


class PlaygroundPanel(QWidget):
    ab_requested = Signal(str, object, str, object)  # (label A, path A, label B, path B): the A/B window

    def __init__(self, parent: Optional[QWidget] = None, program: Optional[list[str]] = None):
        super().__init__(parent)
        self._run: Optional[Path] = None
        # the open run's live engine, when there is one: (prompt, seed) -> sent (the window sets it)
        self.live_sender: Optional[Callable[[str, int], bool]] = None
        self._live = False
        self._offer: Optional[RunOffer] = None
        self._pairs: list[OneOffPair] = []
        self._shown: Optional[OneOffPair] = None
        self._want_newest = False
        self.command = DmadCommand(self, program=program, parse_events=True, label="dmad sample --prompt")
        self.command.finished.connect(self._rendered)
        self._offers = Task(self)
        self._offers.done.connect(self._on_offer)
        self._history = Task(self)
        self._history.done.connect(self._on_history)
        self._images = Task(self, every_answer=True)
        self._images.done.connect(self._on_image)
        self._build()
        self.set_run(None)

    # ------------------------------------------------------------ layout

    def _build(self) -> None:
        self.header = ElidedLabel("No run open.")
        self.prompt = QPlainTextEdit()
        self.prompt.setPlaceholderText("a prompt of your own")
        self.prompt.setFixedHeight(56)
        self.negative = QLineEdit()
        self.negative.setPlaceholderText("none")
        self.checkpoint = QComboBox()
        self._picked = False  # the user chose a checkpoint: a refresh keeps it (else the latest is shown)
        self.checkpoint.activated.connect(lambda _i: setattr(self, "_picked", True))
        self.seed = QSpinBox(minimum=0, maximum=MAX_SEED)
        self.steps = QSpinBox(minimum=0, maximum=1000)
        self.steps.setSpecialValueText("as trained")
        self.cfg = QDoubleSpinBox(minimum=0.0, maximum=100.0, singleStep=0.5, decimals=2)
        self.cfg.setSpecialValueText("none")
        self.width_box, self.height_box = (QSpinBox(minimum=8, maximum=4096, singleStep=8) for _ in range(2))
        for box in (self.checkpoint, self.seed, self.steps, self.cfg, self.width_box, self.height_box):
            guard_wheel(box)
        self.with_teacher = QCheckBox("and the teacher (its own sampler, steps and CFG)")
        self.with_teacher.setChecked(True)
        self.render_button = QPushButton("Render")
        self.render_button.setToolTip("Render the prompt with the chosen checkpoint and the teacher (Ctrl+Enter)")
        self.render_button.clicked.connect(self.render)
        QShortcut(QKeySequence("Ctrl+Return"), self, activated=self.render)
        self.status = ElidedLabel()
        size = QHBoxLayout()
        for w in (self.width_box, QLabel("x"), self.height_box):
            size.addWidget(w)
        size.addStretch(1)
        form = QFormLayout()
        form.addRow("Prompt", self.prompt)
        form.addRow("Negative prompt", self.negative)
        form.addRow("Checkpoint", self.checkpoint)
        numbers = QGridLayout()
        for col, (label, box) in enumerate((("Seed", self.seed), ("Student steps", self.steps), ("Student CFG", self.cfg))):
            numbers.addWidget(QLabel(label), 0, 2 * col)
            numbers.addWidget(box, 0, 2 * col + 1)
        form.addRow(numbers)
        form.addRow("Resolution", size)
        form.addRow(self.with_teacher)
        row = QHBoxLayout()
        row.addWidget(self.render_button)
        self.ab_button = QPushButton("A/B")
        self.ab_button.setToolTip("Compare the two images in the A/B window (blink, difference, zoom)")
        self.ab_button.clicked.connect(self._ab)
        row.addWidget(self.ab_button)
        row.addWidget(self.status, 1)
        form.addRow(row)
        self.student_box, self.teacher_box = ImageBox("Student"), ImageBox("Teacher")
        images = QHBoxLayout()
        images.addWidget(self.student_box)
        images.addWidget(self.teacher_box)
        images.addStretch(1)
        left = QWidget()
        left_layout = QVBoxLayout(left)
        left_layout.addLayout(form)
        left_layout.addLayout(images)
        left_layout.addStretch(1)
        self.history = QListWidget()
        self.history.setToolTip("Every one-off of this run, newest first: the Playground's and Sample prompt…'s")
        self.history.currentRowChanged.connect(self._pick)
        split = QSplitter(Qt.Orientation.Horizontal)
        split.addWidget(left)
        split.addWidget(self.history)
        split.setSizes([700, 300])
        layout = QVBoxLayout(self)
        layout.addWidget(self.header)
        layout.addWidget(split, 1)

    # ------------------------------------------------------------ the run

    def set_run(self, run_dir: Optional[Path]) -> None:
        if run_dir is not None and run_dir == self._run:
            return
        self._run = Path(run_dir) if run_dir is not None else None
        self._offer, self._pairs, self._shown, self._picked = None, [], None, False
        self.history.clear()
        self.checkpoint.clear()
        self.student_box.show_image(None, "")
        self.teacher_box.show_image(None, "")
        self.header.setText("No run open: open one in the Runs tab to try prompts on its checkpoints."
                            if run_dir is None else f"Reading {self._run.name} ...")
        self._enable()
        if self._run is not None:
            self._read()

    def set_live(self, live: bool) -> None:
        """Whether the open run's engine is live here (its current weights can be asked for)."""
        if live != self._live:
            self._live = live
            self._picked = False
            self.refresh()

    def live_rendered(self) -> None:
        """The live engine rendered a one-off: show the history's newest."""
        self._want_newest = True
        self.status.setText("Rendered by the live run's engine.")
        self.refresh()

    def refresh(self) -> None:
        """Read the run's checkpoints and one-offs again (a checkpoint or a live one-off may be new)."""
        if self._run is not None and not self.command.is_running():
            self._read()

    def _read(self) -> None:
        """The open run's offer and one-off history, read in workers."""
        run = self._run
        self._offers.submit(lambda: read_offer(run))
        self._history.submit(lambda: scan_one_offs(run))

    def _on_offer(self, offer: RunOffer) -> None:
        if self._run is None or offer.run_dir != self._run:
            return
        first = self._offer is None
        self._offer = offer
        chosen = self.checkpoint.currentData() if self._picked else None  # else the latest (it may be new)
        self.checkpoint.clear()
        if self._live:
            self.checkpoint.addItem("current weights (the live run's engine renders them)", LIVE)
        for it in reversed(offer.iterations):
            self.checkpoint.addItem(f"iteration {it:,}" + (" (latest)" if it == offer.iterations[-1] else ""), str(it))
        self.checkpoint.addItem("the teacher alone", "teacher")
        if chosen is not None and self.checkpoint.findData(chosen) >= 0:
            self.checkpoint.setCurrentIndex(self.checkpoint.findData(chosen))
        if first:
            self.width_box.setValue(offer.size[0])
            self.height_box.setValue(offer.size[1])
            self.seed.setValue(min(offer.seed, MAX_SEED))
        self.negative.setEnabled(offer.negative_prompt)
        self.negative.setToolTip("" if offer.negative_prompt else f"{offer.family} has no negative prompt")
        said = offer.problem or (f"{offer.run_dir.name}: {len(offer.iterations)} checkpoints" if offer.iterations
                                 else f"{offer.run_dir.name}: no checkpoint yet; the teacher can render")
        self.header.setText(said)
        self._enable()

    # ------------------------------------------------------------ rendering

    def request(self) -> Request:
        return Request(prompt=self.prompt.toPlainText().strip(), checkpoint=self.checkpoint.currentData() or "teacher",
                       negative_prompt=self.negative.text() if self.negative.isEnabled() else "",
                       seed=self.seed.value(), steps=self.steps.value() or None, cfg=self.cfg.value() or None,
                       size=(self.width_box.value(), self.height_box.value()), teacher=self.with_teacher.isChecked())

    def render(self) -> bool:
        req = self.request()
        if self._run is None or self._offer is None or self.command.is_running():
            return False
        if not req.prompt:
            self.status.setText("Type a prompt first.")
            return False
        if req.size[0] % 8 or req.size[1] % 8:
            self.status.setText("The resolution must be a multiple of 8 on each side.")
            return False
        self._want_newest = True
        if req.checkpoint == LIVE:  # the engine renders the student as it is now
            if self.live_sender is None or not self.live_sender(req.prompt, req.seed):
                self._want_newest = False
                self.status.setText("The live run's engine did not take the request (see the Training tab).")
                return False
            said = "Asked the live run's engine: it renders at its next iteration boundary"
            if req.teacher:  # the teacher on the CPU: the device is training's (shown beside it when both are in)
                self.command.start(sample_args(self._run, Request(
                    req.prompt, "teacher", req.negative_prompt, req.seed, size=req.size)) + ["--device", "cpu"])
                said += "; the teacher renders on the CPU meanwhile"
            self.status.setText(said + " ...")
            self._enable()
            return True
        self.command.start(sample_args(self._run, req))
        self.status.setText(f"Rendering with {self.checkpoint.currentText()} ... (the models load first)")
        self._enable()
        return True

    def busy(self) -> bool:
        return self.command.is_running() or self._history.busy() or self._offers.busy()

    def _rendered(self, code: int, line: str) -> None:
        self.status.setText("Rendered." if code == 0 else f"Not rendered: {line}")
        if code != 0:
            self._want_newest = False
        self._enable()
        if self._run is not None:
            run = self._run
            self._history.submit(lambda: scan_one_offs(run))

    # ------------------------------------------------------------ history and images

    def _on_history(self, pairs: list) -> None:
        if self._run is None:
            return
        keep = self._shown.key if self._shown is not None else None
        self._pairs = pairs
        self.history.blockSignals(True)
        self.history.clear()
        for pair in pairs:
            item = QListWidgetItem(pair.title())
            item.setToolTip(pair.title())
            self.history.addItem(item)
        if not pairs:  # said, not a blank pane
            hint = QListWidgetItem("No one-off image in this run yet: type a prompt and Render.")
            hint.setFlags(Qt.ItemFlag.NoItemFlags)
            self.history.addItem(hint)
        self.history.blockSignals(False)
        index = 0 if self._want_newest or keep is None else next(
            (i for i, p in enumerate(pairs) if p.key == keep), 0)
        self._want_newest = False
        if pairs:
            self.history.setCurrentRow(index)
            self._pick(index)
        self._enable()

    def _pick(self, row: int) -> None:
        if not 0 <= row < len(self._pairs):
            return
        pair = self._shown = self._pairs[row]
        for path in (pair.student, pair.teacher):
            if path is not None:
                self._images.submit(lambda p=path: load_image(p))
        if pair.student is None:
            self.student_box.show_image(None, "")
        if pair.teacher is None:
            self.teacher_box.show_image(None, "not rendered")
        self._enable()

    def _on_image(self, answer: tuple[Path, QImage]) -> None:
        path, img = answer
        pair = self._shown
        if pair is None:
            return
        if path == pair.student:
            m = pair.student_meta
            self.student_box.show_image(img, f"{m.get('checkpoint') or 'live'}, {m.get('steps', '?')} steps, "
                                             f"CFG {m.get('cfg') or 'none'}, seed {pair.seed}")
        elif path == pair.teacher:
            m = pair.teacher_meta
            self.teacher_box.show_image(img, f"{m.get('sampler', '')} {m.get('steps', '?')} steps, CFG {m.get('cfg')}, "
                                             f"seed {pair.seed}")

    def _ab(self) -> None:
        pair = self._shown
        if pair is not None and pair.student is not None and pair.teacher is not None:
            self.ab_requested.emit("student", pair.student, "teacher", pair.teacher)

    def _enable(self) -> None:
        running = self.command.is_running()
        self.render_button.setEnabled(self._offer is not None and not self._offer.problem and not running)
        pair = self._shown
        self.ab_button.setEnabled(pair is not None and pair.student is not None and pair.teacher is not None)
