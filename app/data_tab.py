"""The dataset of the current config: its folder, how many images and captions it holds, and a
few examples, so a wrong path or a folder without captions shows before Start.

The folder is scanned in a pool worker (a dataset on a network drive can take seconds to list)
with the engine's own rule for what counts as an image and its caption (dmad.datafiles), so the
counts here are the ones `dmad train` will find.
"""
from __future__ import annotations

import html
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from PySide6.QtCore import QSize, Qt, QTimer
from PySide6.QtGui import QIcon, QImage, QPixmap
from PySide6.QtWidgets import QLabel, QListView, QListWidget, QListWidgetItem, QVBoxLayout, QWidget

from app.background import Task
from dmad.datafiles import caption_of, images_in

EXAMPLES = 12
THUMB_PX = 96
DEBOUNCE_MS = 300  # the config changes on every keystroke; scan once typing pauses
CHECK_DATA_NOTE = ("Deeper checks (unreadable or undersized images, duplicate captions) belong to "
                   "`dmad check-data`, which the engine does not have yet; these counts use the same "
                   "rule as `dmad train`: an image counts when a .txt caption of the same stem is beside it.")


@dataclass(frozen=True)
class DatasetSummary:
    folder: Path
    images: int
    captioned: int
    empty_captions: int
    examples: tuple[tuple[Path, str, QImage], ...]  # (image, caption, thumbnail)

    @property
    def uncaptioned(self) -> int:
        return self.images - self.captioned


def scan_dataset(folder: Path, examples: int = EXAMPLES) -> DatasetSummary:
    """Worker side. Raises ValueError with one line when the folder cannot be used."""
    if not folder.exists():
        raise ValueError(f"train_data_dir not found: {folder}")
    if not folder.is_dir():
        raise ValueError(f"train_data_dir is not a folder: {folder}")
    images = images_in(folder)
    captioned = empty = 0
    shown: list[tuple[Path, str, QImage]] = []
    for img in images:
        cap = caption_of(img)
        if not cap.is_file():
            continue
        captioned += 1
        if len(shown) < examples:
            text = cap.read_text(encoding="utf-8", errors="replace").strip()
            empty += not text
            thumb = QImage(str(img))
            if not thumb.isNull():
                thumb = thumb.scaled(THUMB_PX, THUMB_PX, Qt.KeepAspectRatio, Qt.FastTransformation)
            shown.append((img, text, thumb))
        elif cap.stat().st_size == 0:
            empty += 1
    return DatasetSummary(folder, len(images), captioned, empty, tuple(shown))


def data_dir_of(raw: dict, base_dir: Optional[Path]) -> Optional[Path]:
    """identity.train_data_dir, relative to the config file's folder as the engine reads it."""
    ident = raw.get("identity") if isinstance(raw, dict) else None
    value = ident.get("train_data_dir") if isinstance(ident, dict) else None
    if not isinstance(value, str) or not value.strip():
        return None
    path = Path(value).expanduser()
    return path if path.is_absolute() or base_dir is None else (base_dir / path).resolve()


class DataTab(QWidget):
    def __init__(self, parent: Optional[QWidget] = None):
        super().__init__(parent)
        self._folder: Optional[Path] = None
        self._task = Task(self)
        self._task.done.connect(self._on_scanned)
        self._task.failed.connect(self._on_failed)
        self._debounce = QTimer(self)
        self._debounce.setSingleShot(True)
        self._debounce.setInterval(DEBOUNCE_MS)
        self._debounce.timeout.connect(self.rescan)
        self.summary = QLabel("No dataset: the config has no identity.train_data_dir.")
        self.summary.setWordWrap(True)
        self.summary.setTextInteractionFlags(Qt.TextSelectableByMouse)
        self.examples = QListWidget()
        self.examples.setViewMode(QListView.IconMode)
        self.examples.setIconSize(QSize(THUMB_PX, THUMB_PX))
        self.examples.setResizeMode(QListView.Adjust)
        self.examples.setMovement(QListView.Static)
        self.examples.setWordWrap(True)
        self.examples.setGridSize(QSize(THUMB_PX + 120, THUMB_PX + 64))
        note = QLabel(CHECK_DATA_NOTE)
        note.setWordWrap(True)
        note.setStyleSheet("color: gray")
        lay = QVBoxLayout(self)
        lay.addWidget(self.summary)
        lay.addWidget(QLabel("First captioned images:"))
        lay.addWidget(self.examples, 1)
        lay.addWidget(note)

    def set_config(self, raw: dict, base_dir: Optional[Path]) -> None:
        folder = data_dir_of(raw, base_dir)
        if folder == self._folder:
            return
        self._folder = folder
        self._debounce.start()

    def folder(self) -> Optional[Path]:
        return self._folder

    def rescan(self) -> None:
        folder = self._folder
        self.examples.clear()
        if folder is None:
            self.summary.setText("No dataset: the config has no identity.train_data_dir.")
            return
        self.summary.setText(f"Scanning {folder} ...")
        self._task.submit(lambda: scan_dataset(folder))

    def busy(self) -> bool:
        return self._task.busy() or self._debounce.isActive()

    def _on_scanned(self, s: DatasetSummary) -> None:
        if s.folder != self._folder:
            return
        self.summary.setTextFormat(Qt.RichText)
        lines = [f"<b>{html.escape(s.folder.name)}</b> &nbsp; {html.escape(str(s.folder))}",
                 f"{s.images} images, {s.captioned} with a caption (what training reads)"]
        if s.uncaptioned:
            lines.append(f"{s.uncaptioned} images without a .txt caption are skipped")
        if s.empty_captions:
            lines.append(f"{s.empty_captions} captions are empty")
        if not s.captioned:
            lines.append("<span style='color:#c0392b'>Nothing to train on: each image needs a .txt caption "
                         "of the same stem.</span>")
        self.summary.setText("<br>".join(lines))
        for img, caption, thumb in s.examples:
            item = QListWidgetItem(QIcon(QPixmap.fromImage(thumb)) if not thumb.isNull() else QIcon(),
                                   caption[:60] + ("..." if len(caption) > 60 else ""))
            item.setToolTip(f"{caption}\n{img}")
            self.examples.addItem(item)

    def _on_failed(self, message: str) -> None:
        self.summary.setTextFormat(Qt.PlainText)
        self.summary.setText(message.removeprefix("ValueError: "))
