"""Samples of the open run: samples/grid.png (prompts x [teacher, checkpoints]) and each folder
(samples/teacher, samples/iter_<N>) as thumbnails with the prompt of every image.

Folder listings and image decoding run in pool workers (QImage is safe off the GUI thread,
QPixmap is not); the listing is re-read every few seconds while the tab is visible, so samples
a live run writes at its checkpoints appear without a click.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from PySide6.QtCore import QSize, Qt, QTimer
from PySide6.QtGui import QIcon, QImage, QPixmap
from PySide6.QtWidgets import (QHBoxLayout, QLabel, QListView, QListWidget, QListWidgetItem, QScrollArea,
                               QSplitter, QStackedWidget, QVBoxLayout, QWidget)

from app.background import Task

IMAGE_EXTS = (".png", ".jpg", ".jpeg", ".webp")
THUMB_PX = 160
GRID_ITEM = "Grid (all checkpoints)"
RESCAN_MS = 5000
_ITER = re.compile(r"^iter_(\d+)$")


@dataclass(frozen=True)
class SampleFolder:
    name: str                     # "teacher" or "iter_<N>"
    images: tuple[Path, ...]
    prompts: dict[str, str] = field(default_factory=dict, compare=False)  # file name -> prompt
    summary: str = ""             # from meta.json: model, sampler steps, resolution


@dataclass(frozen=True)
class SamplesIndex:
    grid: Optional[Path]
    folders: tuple[SampleFolder, ...]
    grid_columns: tuple[str, ...] = ()  # from grid.json: "teacher", "iter_<N>", ... left to right


def _folder_order(p: Path) -> tuple:
    m = _ITER.match(p.name)
    return (0, 0, "") if p.name == "teacher" else (1, int(m.group(1)), "") if m else (2, 0, p.name)


def scan_samples(run_dir: Path) -> SamplesIndex:
    """Worker side: list samples/ (no image is decoded here)."""
    root = run_dir / "samples"
    if not root.is_dir():
        return SamplesIndex(None, ())
    grid = root / "grid.png"
    folders = sorted((p for p in root.iterdir() if p.is_dir()), key=_folder_order)
    return SamplesIndex(grid if grid.is_file() else None, tuple(_read_folder(p) for p in folders),
                        _grid_columns(root / "grid.json"))


def _grid_columns(path: Path) -> tuple[str, ...]:
    try:
        columns = json.loads(path.read_text(encoding="utf-8")).get("columns")
    except (OSError, ValueError, AttributeError):
        return ()
    return tuple(str(c) for c in columns) if isinstance(columns, list) else ()


def _read_folder(folder: Path) -> SampleFolder:
    images = tuple(sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_EXTS and p.is_file()))
    try:
        meta = json.loads((folder / "meta.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        meta = {}
    if not isinstance(meta, dict):
        meta = {}
    items = meta.get("items") if isinstance(meta.get("items"), dict) else {}
    prompts = {str(v.get("file")): str(v.get("prompt")) for v in items.values()
               if isinstance(v, dict) and v.get("file") and v.get("prompt")}
    bits = [str(meta[k]) for k in ("model",) if meta.get(k)]
    if meta.get("steps"):
        bits.append(f"{meta['steps']} steps")
    if meta.get("cfg"):
        bits.append(f"CFG {meta['cfg']}")
    res = meta.get("resolution")
    if isinstance(res, list) and len(res) == 2:
        bits.append(f"{res[0]}x{res[1]} px")
    return SampleFolder(folder.name, images, prompts, ", ".join(bits))


def load_images(paths: tuple[Path, ...], max_px: int) -> list[tuple[Path, QImage]]:
    """Worker side: decode and scale. Small samples are enlarged by whole factors without smoothing,
    so 64 px renders keep their pixels; larger ones are scaled down smoothly."""
    out = []
    for p in paths:
        img = QImage(str(p))
        if img.isNull():
            continue
        out.append((p, _fit(img, max_px)))
    return out


def _fit(img: QImage, max_px: int) -> QImage:
    side = max(img.width(), img.height())
    if side <= max_px:
        k = max(1, max_px // side)
        return img.scaled(img.width() * k, img.height() * k, Qt.IgnoreAspectRatio, Qt.FastTransformation)
    return img.scaled(max_px, max_px, Qt.KeepAspectRatio, Qt.SmoothTransformation)


class SamplesTab(QWidget):
    def __init__(self, parent: Optional[QWidget] = None):
        super().__init__(parent)
        self._run: Optional[Path] = None
        self._index: Optional[SamplesIndex] = None
        self._shown: Optional[str] = None  # the folder (or GRID_ITEM) whose images are on screen
        self._scan, self._loader = Task(self), Task(self)
        self._scan.done.connect(self._on_scanned)
        self._scan.failed.connect(lambda msg: self._header.setText(f"Could not read samples: {msg}"))
        self._loader.done.connect(self._on_images)
        self._loader.failed.connect(lambda msg: self._header.setText(f"Could not read images: {msg}"))
        self._build()
        self._timer = QTimer(self)
        self._timer.setInterval(RESCAN_MS)
        self._timer.timeout.connect(self._tick)
        self._timer.start()

    def _build(self) -> None:
        self.folders = QListWidget()
        self.folders.currentTextChanged.connect(self._select)
        self._header = QLabel("No run open.")
        self._header.setWordWrap(True)
        self.grid_label = QLabel()
        self.grid_label.setAlignment(Qt.AlignLeft | Qt.AlignTop)
        grid_scroll = QScrollArea()
        grid_scroll.setWidget(self.grid_label)
        grid_scroll.setWidgetResizable(True)
        self.thumbs = QListWidget()
        self.thumbs.setViewMode(QListView.IconMode)
        self.thumbs.setIconSize(QSize(THUMB_PX, THUMB_PX))
        self.thumbs.setResizeMode(QListView.Adjust)
        self.thumbs.setMovement(QListView.Static)
        self.thumbs.setWordWrap(True)
        self.thumbs.setGridSize(QSize(THUMB_PX + 40, THUMB_PX + 56))
        self._stack = QStackedWidget()
        self._stack.addWidget(grid_scroll)
        self._stack.addWidget(self.thumbs)
        right = QWidget()
        col = QVBoxLayout(right)
        col.setContentsMargins(0, 0, 0, 0)
        col.addWidget(self._header)
        col.addWidget(self._stack, 1)
        split = QSplitter()
        split.addWidget(self.folders)
        split.addWidget(right)
        split.setSizes([180, 800])
        lay = QHBoxLayout(self)
        lay.addWidget(split)

    # ------------------------------------------------------------ public

    def set_run(self, run_dir: Optional[Path]) -> None:
        if run_dir == self._run:
            return
        self._run, self._index, self._shown = run_dir, None, None
        self.folders.clear()
        self.thumbs.clear()
        self.grid_label.clear()
        self._header.setText("No run open." if run_dir is None else "Reading samples ...")
        self.refresh()

    def run_dir(self) -> Optional[Path]:
        return self._run

    def refresh(self) -> None:
        if self._run is not None:
            run = self._run
            self._scan.submit(lambda: scan_samples(run))

    def busy(self) -> bool:
        return self._scan.busy() or self._loader.busy()

    def _tick(self) -> None:
        if self.isVisible() and not self._scan.busy():
            self.refresh()

    # ------------------------------------------------------------ results

    def _on_scanned(self, index: SamplesIndex) -> None:
        if index == self._index:
            return  # nothing new on disk: keep the images on screen
        self._index = index
        names = ([GRID_ITEM] if index.grid else []) + [f.name for f in index.folders]
        keep = self._shown if self._shown in names else (names[0] if names else None)
        self._shown = None  # force a reload: a folder's content may have grown
        self.folders.blockSignals(True)
        self.folders.clear()
        self.folders.addItems(names)
        self.folders.blockSignals(False)
        if keep is None:
            self._header.setText("This run has no samples yet (they are rendered at checkpoints "
                                 "and every observation.validation_steps).")
            self.thumbs.clear()
            self.grid_label.clear()
            return
        self.folders.setCurrentRow(names.index(keep))  # emits currentTextChanged -> _select

    def _select(self, name: str) -> None:
        if not name or self._index is None or name == self._shown:
            return
        self._shown = name
        if name == GRID_ITEM:
            self._stack.setCurrentIndex(0)
            cols = ", ".join(self._index.grid_columns) or "the teacher, then each checkpoint"
            self._header.setText(f"samples/grid.png: one row per prompt; columns: {cols}")
            self._loader.submit(lambda g=self._index.grid: (GRID_ITEM, load_images((g,), 1400)))
            return
        folder = next(f for f in self._index.folders if f.name == name)
        self._stack.setCurrentIndex(1)
        detail = f" ({folder.summary})" if folder.summary else ""
        self._header.setText(f"samples/{folder.name}: {len(folder.images)} images{detail}")
        self._loader.submit(lambda: (name, load_images(folder.images, THUMB_PX)))

    def _on_images(self, result: tuple[str, list[tuple[Path, QImage]]]) -> None:
        name, images = result
        if name != self._shown:
            return
        if name == GRID_ITEM:
            if images:
                self.grid_label.setPixmap(QPixmap.fromImage(images[0][1]))
            return
        folder = next((f for f in self._index.folders if f.name == name), None) if self._index else None
        prompts = folder.prompts if folder else {}
        self.thumbs.clear()
        for path, img in images:
            item = QListWidgetItem(QIcon(QPixmap.fromImage(img)), path.stem)
            item.setToolTip(f"{prompts.get(path.name, path.stem)}\n{path}")
            self.thumbs.addItem(item)
