"""A/B comparison of two sample images: side by side, blink, absolute-difference heat map; zoom to
fit or 1:1, 2x, 4x, 8x (nearest neighbour: a 64 px render shows its pixels) with the two views
panned together. A and B may come from two runs (the labels then name the run).

The window opens at ~60% of the screen beside the main window, fully on screen; blink and
difference show one image, which then takes the whole width.

Both images are decoded at full size and differenced in a pool worker (a 1024 px pair is ~4 MB of
pixels and ~20 ms of numpy); the difference is per pixel and channel on 0-255 values, reported as
the maximum and the mean over all pixels and channels. Images of different sizes are compared
after scaling B to A's size, and the note says so.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np
from PySide6.QtCore import QRect, Qt, QTimer, Signal
from PySide6.QtGui import QColor, QGuiApplication, QImage, QKeyEvent, QPixmap
from PySide6.QtWidgets import (QButtonGroup, QGraphicsPixmapItem, QGraphicsScene, QGraphicsView, QHBoxLayout,
                               QRadioButton, QToolButton, QVBoxLayout, QWidget)

from app.engine.background import Task
from app.models.decode import decode_image
from app.widgets.elided_label import ElidedLabel
from dmad.contract.regular import read_regular

BLINK_MS = 500
MODES = ("side", "blink", "diff")
ZOOMS = (None, 1.0, 2.0, 4.0, 8.0)  # None: fit the view
SCREEN_SHARE = 0.6  # of the available screen, each way
FRAME_GUESS = (8, 32)  # window frame (side, title) before the window manager has said: px


@dataclass(frozen=True)
class Difference:
    heat: QImage      # per pixel max over channels of |A - B|, scaled so the largest difference is white
    max: int          # 0-255
    mean: float       # over all pixels and channels, 0-255
    note: str = ""


def _rgb(img: QImage) -> np.ndarray:
    """(h, w, 3) uint8 view of a QImage's colour channels (copied, so the QImage may go)."""
    img = img.convertToFormat(QImage.Format_RGB32)
    h, w, bpl = img.height(), img.width(), img.bytesPerLine()
    buf = np.frombuffer(img.constBits(), np.uint8, count=h * bpl).reshape(h, bpl)
    return buf[:, : w * 4].reshape(h, w, 4)[:, :, :3].copy()  # B, G, R on little-endian: order is irrelevant here


def _heat_lut() -> np.ndarray:
    """256 x 3 colours: black -> red -> yellow -> white (small differences stay visible)."""
    x = np.arange(256, dtype=np.float32) / 255.0
    r = np.clip(3 * x, 0, 1)
    g = np.clip(3 * x - 1, 0, 1)
    b = np.clip(3 * x - 2, 0, 1)
    return (np.stack([r, g, b], 1) * 255).round().astype(np.uint8)


_LUT = _heat_lut()


def image_difference(a: QImage, b: QImage) -> Difference:
    note = ""
    if a.size() != b.size():
        note = f"sizes differ ({a.width()}x{a.height()} vs {b.width()}x{b.height()}): B scaled to A's size"
        b = b.scaled(a.size(), Qt.IgnoreAspectRatio, Qt.SmoothTransformation)
    d = np.abs(_rgb(a).astype(np.int16) - _rgb(b).astype(np.int16)).astype(np.uint8)  # (h, w, 3)
    peak = int(d.max()) if d.size else 0
    per_pixel = d.max(axis=2)
    scaled = (per_pixel.astype(np.uint32) * 255 // peak).astype(np.uint8) if peak else per_pixel
    rgb = np.ascontiguousarray(_LUT[scaled])  # (h, w, 3) RGB
    h, w = scaled.shape
    heat = QImage(rgb.data, w, h, 3 * w, QImage.Format_RGB888).copy()  # copy: rgb's buffer dies here
    return Difference(heat, peak, float(d.mean()) if d.size else 0.0, note)


def load_image(path: Path) -> QImage:
    """Worker side: `path` decoded from its bytes (read_regular: a FIFO swapped in for a sample is
    refused at once, never waited on); OSError naming the file when it cannot be decoded."""
    img = decode_image(read_regular(path))
    if img.isNull():
        raise OSError(f"cannot decode {path}")
    return img


def load_and_compare(path_a: Path, path_b: Path) -> tuple[QImage, QImage, Difference]:
    """Worker side."""
    a, b = load_image(path_a), load_image(path_b)
    return a, b, image_difference(a, b)


class ImageView(QGraphicsView):
    """One image; fitted to the view, or at a fixed zoom (1 = one image pixel per screen pixel) with
    scrollbars. Pixels are never smoothed: enlarged renders show their pixels."""

    def __init__(self, parent: Optional[QWidget] = None):
        super().__init__(parent)
        self.setScene(QGraphicsScene(self))
        self._item = QGraphicsPixmapItem()
        self._item.setTransformationMode(Qt.FastTransformation)  # nearest neighbour
        self.scene().addItem(self._item)
        self.zoom: Optional[float] = None
        self.setDragMode(QGraphicsView.ScrollHandDrag)
        self.setBackgroundBrush(QColor(96, 96, 96))  # neutral around the image: white and black edges both show

    def set_image(self, img: QImage) -> None:
        same_size = self._item.pixmap().size() == img.size()
        self._item.setPixmap(QPixmap.fromImage(img))
        if not same_size:  # blinking between equal sizes keeps the zoom and the pan
            self.scene().setSceneRect(self._item.boundingRect())
            self._apply_zoom()

    def set_zoom(self, zoom: Optional[float]) -> None:
        self.zoom = zoom
        self._apply_zoom()

    def scale_factor(self) -> float:
        return self.transform().m11()

    def _apply_zoom(self) -> None:
        self.resetTransform()
        if self.zoom is not None:
            self.scale(self.zoom, self.zoom)
        elif not self._item.pixmap().isNull():
            self.fitInView(self._item, Qt.KeepAspectRatio)

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        if self.zoom is None:
            self._apply_zoom()


def _sync_scroll(a: QGraphicsView, b: QGraphicsView) -> None:
    # Scrollbars share scene coordinates here (same size, same zoom), so equal values = same spot.
    for src, dst in ((a, b), (b, a)):
        src.horizontalScrollBar().valueChanged.connect(dst.horizontalScrollBar().setValue)
        src.verticalScrollBar().valueChanged.connect(dst.verticalScrollBar().setValue)


def placement(avail: QRect, anchor: Optional[QRect], frame: tuple[int, int] = FRAME_GUESS) -> QRect:
    """The A/B window's client rectangle: SCREEN_SHARE of `avail` each way, beside `anchor` (the main
    window's frame) on the side with more room, moved inside `avail` with its frame."""
    side, title = frame
    w = min(int(avail.width() * SCREEN_SHARE), avail.width() - 2 * side)
    h = min(int(avail.height() * SCREEN_SHARE), avail.height() - title - side)
    if anchor is None:
        x, y = avail.center().x() - w // 2, avail.center().y() - h // 2
    else:
        right_room = avail.right() - anchor.right()
        left_room = anchor.left() - avail.left()
        x = anchor.right() + 1 + side if right_room >= left_room else anchor.left() - w - side
        y = anchor.top() + title
    x = max(avail.left() + side, min(x, avail.right() + 1 - side - w))
    y = max(avail.top() + title, min(y, avail.bottom() + 1 - side - h))
    return QRect(x, y, w, h)


class ABView(QWidget):
    compared = Signal(object)  # Difference, once both images are loaded
    failed = Signal(str)

    def __init__(self, parent: Optional[QWidget] = None):
        super().__init__(parent)
        self.setWindowTitle("A/B comparison")
        self.a_img = self.b_img = QImage()
        self.difference: Optional[Difference] = None
        self.showing_b = False  # blink: which image is up
        self._labels = ("A", "B")
        self._task = Task(self)
        self._task.done.connect(self._on_loaded)
        self._task.failed.connect(self._on_failed)
        self._blink = QTimer(self)
        self._blink.setInterval(BLINK_MS)
        self._blink.timeout.connect(self._toggle)
        self._build()

    def _build(self) -> None:
        self.title = ElidedLabel()  # run names and prompt ids: never wider than the window
        self.stats = ElidedLabel("Loading ...")
        self.mode_buttons = QButtonGroup(self)
        bar = QHBoxLayout()
        for i, (mode, text) in enumerate(zip(MODES, ("Side by side", "Blink", "Difference"))):
            button = QRadioButton(text)
            button.setChecked(i == 0)
            self.mode_buttons.addButton(button, i)
            bar.addWidget(button)
        self.mode_buttons.idToggled.connect(lambda i, on: on and self.set_mode(MODES[i]))
        bar.addStretch(1)
        self._zoom_bar(bar)
        self.left, self.right = ImageView(), ImageView()
        _sync_scroll(self.left, self.right)
        self.left_label, self.right_label = ElidedLabel("A"), ElidedLabel("B")
        views = QHBoxLayout()
        self.columns = []
        for label, view in ((self.left_label, self.left), (self.right_label, self.right)):
            column = QWidget()  # hidden as a whole in blink / difference: the other column takes the width
            col = QVBoxLayout(column)
            col.setContentsMargins(0, 0, 0, 0)
            col.addWidget(label)
            col.addWidget(view, 1)
            views.addWidget(column, 1)
            self.columns.append(column)
        lay = QVBoxLayout(self)
        lay.addWidget(self.title)
        lay.addLayout(bar)
        lay.addWidget(self.stats)
        lay.addLayout(views, 1)
        self.mode = "side"

    def _zoom_bar(self, bar: QHBoxLayout) -> None:
        self.zoom_buttons = QButtonGroup(self)
        for i, zoom in enumerate(ZOOMS):
            button = QToolButton()
            button.setText("Fit" if zoom is None else ("1:1" if zoom == 1 else f"{zoom:g}x"))
            button.setCheckable(True)
            button.setChecked(zoom is None)
            button.setToolTip("Fit the image to the view" if zoom is None else
                              f"{zoom:g} screen pixels per image pixel (no smoothing); drag to pan both views")
            self.zoom_buttons.addButton(button, i)
            bar.addWidget(button)
        self.zoom_buttons.idClicked.connect(lambda i: self.set_zoom(ZOOMS[i]))

    # ------------------------------------------------------------ public

    def set_pair(self, label_a: str, path_a: Path, label_b: str, path_b: Path) -> None:
        self._labels = (f"A: {label_a}", f"B: {label_b}")
        self.title.setText(f"{self._labels[0]}   vs   {self._labels[1]}")
        self.setWindowTitle(f"A/B: {label_a} vs {label_b}")
        self.left_label.setText(self._labels[0])
        self.right_label.setText(self._labels[1])
        self.stats.setText("Loading ...")
        self.difference = None
        self.set_zoom(None)  # a new pair starts fitted, as the first one did (the old zoom suited the old pair)
        self._task.submit(lambda: load_and_compare(Path(path_a), Path(path_b)))

    def labels(self) -> tuple[str, str]:
        return self._labels

    def show_beside(self, anchor: Optional[QWidget]) -> None:
        """Show and raise; placed beside `anchor` (the main window) when it opens."""
        if not self.isVisible():
            screen = (anchor.screen() if anchor is not None else None) or QGuiApplication.primaryScreen()
            frame = anchor.frameGeometry() if anchor is not None and anchor.isVisible() else None
            self.setGeometry(placement(screen.availableGeometry(), frame))
        self.show()
        self.raise_()
        self.activateWindow()

    def busy(self) -> bool:
        return self._task.busy()

    def set_mode(self, mode: str) -> None:
        self.mode = mode
        self.mode_buttons.button(MODES.index(mode)).setChecked(True)
        self._blink.stop()
        self.showing_b = False
        self.columns[1].setVisible(mode == "side")
        if mode == "blink":
            self._blink.start()
        self._show()

    def set_zoom(self, zoom: Optional[float]) -> None:
        """None fits the view; 1, 2, 4, 8: screen pixels per image pixel. A and B zoom together."""
        self.zoom_buttons.button(ZOOMS.index(zoom)).setChecked(True)
        self.left.set_zoom(zoom)
        self.right.set_zoom(zoom)

    def blinking(self) -> bool:
        return self._blink.isActive()

    def keyPressEvent(self, event: QKeyEvent) -> None:
        """Escape closes the window, as it closes a dialog (a plain QWidget window ignores it)."""
        if event.key() == Qt.Key.Key_Escape and event.modifiers() == Qt.KeyboardModifier.NoModifier:
            self.close()
            return
        super().keyPressEvent(event)

    def hideEvent(self, event) -> None:
        super().hideEvent(event)
        self._blink.stop()  # a closed window does not blink on; showing it again resumes

    def showEvent(self, event) -> None:
        super().showEvent(event)
        if self.mode == "blink":
            self._blink.start()

    # ------------------------------------------------------------ internals

    def _on_loaded(self, result: tuple[QImage, QImage, Difference]) -> None:
        self.a_img, self.b_img, self.difference = result
        d = self.difference
        self.stats.setText(f"|A - B| per channel (0-255): max {d.max}, mean {d.mean:.3f}"
                           + (" - identical pixels" if d.max == 0 else "") + (f"; {d.note}" if d.note else ""))
        self.right.set_image(self.b_img)
        self._show()
        self.compared.emit(d)

    def _on_failed(self, message: str) -> None:
        self.stats.setText(f"Cannot compare: {message}")
        self.failed.emit(message)

    def _toggle(self) -> None:
        self.showing_b = not self.showing_b
        self._show()

    def _show(self) -> None:
        if self.difference is None:
            return
        if self.mode == "diff":
            self.left_label.setText("|A - B| (white = the largest difference)")
            self.left.set_image(self.difference.heat)
            return
        b_up = self.mode == "blink" and self.showing_b
        self.left_label.setText(self._labels[1] if b_up else self._labels[0])
        self.left.set_image(self.b_img if b_up else self.a_img)
