"""The image a "Sample prompt…" request rendered: shown when the engine's `samples` event (one_off) says
it is on disk, with its prompt, seed and iteration. One window, reused: a new one-off replaces the last.

The PNG is read and decoded in a pool worker as a QImage (QPixmap is made on the GUI thread).
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from PySide6.QtCore import Qt, QUrl
from PySide6.QtGui import QDesktopServices, QImage, QPixmap
from PySide6.QtWidgets import QDialog, QDialogButtonBox, QLabel, QPushButton, QVBoxLayout, QWidget

from app.engine.background import Task
from app.models.decode import decode_image
from app.widgets.elided_label import ElidedLabel
from dmad.contract.regular import read_regular

MIN_SIDE = 256  # px on screen: a 64 px demo image is shown enlarged (nearest neighbour), not as a speck
MIN_WIDTH = 460  # px: the caption (prompt, seed, iteration) and the path have room


def load_image(path: Path) -> tuple[Path, QImage]:
    """Worker side; a null QImage when the bytes are not an image (read_regular: a FIFO there is
    refused at once, never waited on)."""
    return path, decode_image(read_regular(path))


class OneOffViewer(QDialog):
    def __init__(self, parent: Optional[QWidget] = None):
        super().__init__(parent)
        self.setWindowTitle("Sampled prompt")
        self._path: Optional[Path] = None
        self._task = Task(self)
        self._task.done.connect(self._on_loaded)
        self._task.failed.connect(lambda message: self.caption.setText(f"cannot read the image: {message}"))
        self.image = QLabel(alignment=Qt.AlignmentFlag.AlignCenter)
        self.image.setMinimumSize(MIN_SIDE, MIN_SIDE)
        self.caption = ElidedLabel()
        self.path_label = ElidedLabel(mode=Qt.TextElideMode.ElideMiddle)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        reveal = QPushButton("Reveal in file manager")
        reveal.clicked.connect(self._reveal)
        buttons.addButton(reveal, QDialogButtonBox.ButtonRole.ActionRole)
        buttons.rejected.connect(self.close)
        layout = QVBoxLayout(self)
        for w in (self.image, self.caption, self.path_label, buttons):
            layout.addWidget(w)
        self.setMinimumWidth(MIN_WIDTH)

    def show_sample(self, path: Path, prompt: str, seed: object, iteration: Optional[int]) -> None:
        """Show this image (decoded in a worker) with what made it."""
        self._path = Path(path)
        seed_text = "the run's seed" if seed is None else f"seed {seed}"
        at = f"iteration {iteration}" if iteration is not None else "the current student"
        self.caption.setText(f"\u201c{prompt}\u201d - {seed_text}, {at}")
        self.path_label.setText(str(self._path))
        self.image.setText("loading…")
        self._task.submit(lambda p=self._path: load_image(p))
        self.show()
        self.raise_()

    def shown_path(self) -> Optional[Path]:
        return self._path

    def has_image(self) -> bool:
        pixmap = self.image.pixmap()
        return pixmap is not None and not pixmap.isNull()

    def _on_loaded(self, answer: tuple[Path, QImage]) -> None:
        path, image = answer
        if path != self._path:
            return
        if image.isNull():
            self.image.setText(f"cannot decode {path.name}")
            return
        scale = max(1, MIN_SIDE // max(1, min(image.width(), image.height())))
        pixmap = QPixmap.fromImage(image)
        if scale > 1:
            pixmap = pixmap.scaled(image.width() * scale, image.height() * scale,
                                   Qt.AspectRatioMode.KeepAspectRatio, Qt.TransformationMode.FastTransformation)
        self.image.setPixmap(pixmap)

    def _reveal(self) -> None:
        if self._path is not None:
            QDesktopServices.openUrl(QUrl.fromLocalFile(str(self._path.parent)))
