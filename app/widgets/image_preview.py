"""One image fitted to whatever space the layout gives it.

A QLabel showing a pixmap asks for the pixmap's size as its minimum: the Samples panel scaled its
preview to the label's width, so the side panel could grow but never shrink again and the splitter
beside it stopped moving. This widget asks for little and paints the image into its rectangle:
enlarged without smoothing (a 64 px render keeps its pixels) unless told the picture is itself a
reduction of a larger image, reduced with smoothing.
"""
from __future__ import annotations

from typing import Optional

from PySide6.QtCore import QRect, QSize, Qt
from PySide6.QtGui import QPainter, QPixmap
from PySide6.QtWidgets import QSizePolicy, QWidget

MIN_PX = 96


class ImagePreview(QWidget):
    def __init__(self, parent: Optional[QWidget] = None):
        super().__init__(parent)
        self._pixmap: Optional[QPixmap] = None
        self._pixels = True
        self.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Expanding)

    def set_pixmap(self, pixmap: Optional[QPixmap], pixels: bool = True) -> None:
        """`pixels`: the picture is the image itself, so enlarging shows its pixels (False: a
        thumbnail of a larger image, enlarged smoothly)."""
        self._pixmap = pixmap if pixmap is not None and not pixmap.isNull() else None
        self._pixels = pixels
        self.update()

    def pixmap(self) -> Optional[QPixmap]:
        return self._pixmap

    def target_rect(self) -> QRect:
        """Where the image is painted: fitted, centred, aspect kept (an empty rect without one)."""
        if self._pixmap is None:
            return QRect()
        size = self._pixmap.size().scaled(self.contentsRect().size(), Qt.AspectRatioMode.KeepAspectRatio)
        rect = QRect(0, 0, size.width(), size.height())
        rect.moveCenter(self.contentsRect().center())
        return rect

    def minimumSizeHint(self) -> QSize:  # noqa: N802 - Qt's name
        return QSize(MIN_PX, MIN_PX)

    def sizeHint(self) -> QSize:  # noqa: N802
        return QSize(240, 240)

    def paintEvent(self, event) -> None:  # noqa: N802
        if self._pixmap is None:
            return
        target = self.target_rect()
        painter = QPainter(self)
        smooth = target.width() < self._pixmap.width() or not self._pixels
        painter.setRenderHint(QPainter.RenderHint.SmoothPixmapTransform, smooth)
        painter.drawPixmap(target, self._pixmap)
