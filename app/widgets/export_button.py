"""Export one checkpoint's student: `dmad export --run DIR --checkpoint N --format diffusers|lora|lora-single-file|single-file`,
run through the app's command runner, then the output folder is shown in the file manager.

The engine prints the folder it wrote as its last stdout line (default <run>/export/iter_<N>-<format>);
a refused request (a LoRA export of a full student, a folder that exists) is its one `dmad: error:`
line. The export loads the teacher and the student (seconds on the demo, minutes for SDXL): the
button is busy meanwhile and a second export waits for the first.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional, Sequence

from PySide6.QtCore import QUrl, Signal
from PySide6.QtGui import QDesktopServices
from PySide6.QtWidgets import QMenu, QToolButton, QWidget

from app.engine.command import DmadCommand
from dmad.contract.exports import FORMATS, LORA_FORMATS

TEXTS = {"diffusers": "diffusers pipeline folder", "lora": "LoRA weights (LoRA students)",
         "lora-single-file": "LoRA as one file for ComfyUI / Forge / A1111 (LoRA students)",
         "single-file": "the student's model as one file for ComfyUI (Load Diffusion Model)"}


def reveal_folder(folder: Path) -> bool:
    return QDesktopServices.openUrl(QUrl.fromLocalFile(str(folder)))


class ExportButton(QToolButton):
    export_started = Signal(str)        # the command line's arguments, for a status line
    export_finished = Signal(int, str)  # exit code, the output folder (0) or what went wrong

    def __init__(self, parent: Optional[QWidget] = None, program: Optional[Sequence[str]] = None,
                 reveal: Callable[[Path], bool] = reveal_folder):
        """`program` replaces engine_argv() (tests run a stand-in); `reveal(folder)` shows the result."""
        super().__init__(parent)
        self.setText("Export")
        self._reveal = reveal
        self._dmad = DmadCommand(self, program=program)
        self._dmad.stdout_line.connect(self._on_line)
        self._dmad.finished.connect(self._on_finished)
        self._last_line = ""
        self._run: Optional[Path] = None
        self._checkpoint: Optional[int] = None
        self._why_not = "Choose a student checkpoint's image"
        menu = QMenu(self)
        self.actions_by_format = {fmt: menu.addAction(text, lambda f=fmt: self.export(f)) for fmt, text in ((f, TEXTS[f]) for f in FORMATS)}
        self.setMenu(menu)
        self.setPopupMode(QToolButton.ToolButtonPopupMode.InstantPopup)
        self._update()

    def set_target(self, run_dir: Optional[Path], checkpoint: Optional[int], why_not: str = "",
                   lora: bool = False) -> None:
        """What Export exports: checkpoint N of run_dir; `why_not` when there is nothing to export
        (the teacher, a checkpoint no longer on disk); `lora`: the run trains a LoRA student."""
        self._run, self._checkpoint = run_dir, checkpoint
        self._why_not = why_not or ("" if checkpoint is not None else "Choose a student checkpoint's image")
        for fmt in LORA_FORMATS:
            self.actions_by_format[fmt].setEnabled(lora)
            self.actions_by_format[fmt].setToolTip("" if lora else "The run's student is a full UNet, not a LoRA")
        self._update()

    def is_running(self) -> bool:
        return self._dmad.is_running()

    def args(self, fmt: str) -> Optional[list[str]]:
        if self._run is None or self._checkpoint is None or self._why_not:
            return None
        return ["export", "--run", str(self._run), "--checkpoint", str(self._checkpoint), "--format", fmt]

    def export(self, fmt: str) -> bool:
        args = self.args(fmt)
        if args is None or self.is_running():
            return False
        self._last_line = ""
        self._dmad.start(args)
        self._update()
        self.export_started.emit(" ".join(["dmad", *args]))
        return True

    def _on_line(self, line: str) -> None:
        if line.strip():
            self._last_line = line.strip()

    def _on_finished(self, code: int, line: str) -> None:
        self._update()
        if code != 0:
            self.export_finished.emit(code, line)
            return
        folder = Path(self._last_line)
        if self._last_line and folder.is_dir():
            self._reveal(folder)
        self.export_finished.emit(0, self._last_line or "done")

    def _update(self) -> None:
        running = self.is_running()
        self.setEnabled(not running and not self._why_not)
        if running:
            self.setToolTip("dmad export is running")
        elif self._why_not:
            self.setToolTip(f"Export: {self._why_not}")
        else:
            self.setToolTip(f"dmad export --run <this run> --checkpoint {self._checkpoint} --format "
                            "diffusers|lora|lora-single-file|single-file, then show the folder")
