"""Show a top-level window so that all of it, frame included, is on its screen.

The main window asks for 1280x800; on a 1280x800 screen the window manager's title bar would then
sit above the top edge (or the bottom rows below it). When the window and a frame do not fit the
screen's available area it is shown maximized: the window manager fits it, frame and panels
included.
"""
from __future__ import annotations

from PySide6.QtWidgets import QWidget

FRAME_ROOM = (16, 48)  # px a window manager's frame and title bar may take around a window


def fits(window: QWidget) -> bool:
    avail = window.screen().availableGeometry()
    return window.width() + FRAME_ROOM[0] <= avail.width() and window.height() + FRAME_ROOM[1] <= avail.height()


def show_fitted(window: QWidget) -> None:
    if fits(window):
        window.show()
    else:
        window.showMaximized()
