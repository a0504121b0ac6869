"""Save a plot as a PNG and its data as a CSV, the files written in a pool worker.

The image is rendered on the GUI thread (painting a widget must happen there; ~10 ms) and saved
by the worker; the CSV (up to ~1,000,000 rows, seconds of text) is built and written by the
worker from the plot's arrays, which appends never change (SeriesStore writes past their end).
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional

from PySide6.QtCore import QObject, Signal
from PySide6.QtGui import QImage
from PySide6.QtWidgets import QFileDialog, QWidget

from app.engine.background import Task
from app.models.plot_data import Arrays, write_csv


def save_image(image: QImage, path: Path) -> Path:
    tmp = path.with_name(path.name + ".partial")
    if not image.save(str(tmp), "PNG"):
        raise OSError(f"could not write {path}")
    tmp.replace(path)  # a reader never sees half a file
    return path


class PlotExporter(QObject):
    """`exported(path)` or `failed(message)` once a file is written."""

    exported = Signal(str)
    failed = Signal(str)
    last_dir = ""  # where the previous export went: the next save dialog opens there

    def __init__(self, parent: Optional[QObject] = None):
        super().__init__(parent)
        self._task = Task(self, every_answer=True)
        self._task.done.connect(lambda path: self.exported.emit(str(path)))
        self._task.failed.connect(self.failed.emit)

    def busy(self) -> bool:
        return self._task.busy()

    def png(self, widget: QWidget, path: Path) -> None:
        image = widget.grab().toImage()
        self._task.submit(lambda: save_image(image, Path(path)))

    def csv(self, columns: dict[str, Arrays], path: Path, elapsed: Optional[Callable] = None) -> None:
        self._task.submit(lambda: (write_csv(Path(path), columns, elapsed), Path(path))[1])

    def ask(self, parent: QWidget, what: str, name: str, pattern: str) -> Optional[Path]:
        """A save dialog; None when cancelled."""
        start = str(Path(PlotExporter.last_dir or Path.home()) / name)
        chosen, _ = QFileDialog.getSaveFileName(parent, what, start, pattern)
        if not chosen:
            return None
        PlotExporter.last_dir = str(Path(chosen).parent)
        return Path(chosen)
