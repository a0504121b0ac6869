"""Export a run's student: `dmad export --run DIR --format diffusers|lora|lora-single-file|single-file
[--dtype fp32|fp16|bf16] [--checkpoint N]` on a
DmadCommand, with its progress (elapsed time and the engine's last log line: loading the teacher and
writing the weights take a while), Cancel (the command's process group), and, when it is done, the
output folder the engine printed, revealed in the file manager, and its path (Copy path) where no
file manager opens it. "Into" chooses the folder the export's new folder goes in (default
<run>/export, the engine's own default; elsewhere the folder is named <run>-<checkpoint>-<format>).

The LoRA formats (diffusers' LoRA file, and one file for ComfyUI / Forge / A1111) are offered only
for a run whose student is a LoRA (identity.student "lora"): the engine refuses them for a full
student, and the dialog says so before the click rather than after. "model, one file" (the
student's UNet or transformer as one .safetensors for ComfyUI's Load Diffusion Model) takes any
student. For a run whose teacher had LoRAs (identity.teacher_loras), the LoRA one-file format
offers "Merge my LoRAs into the one file" (--merge-user-loras).
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Optional, Sequence

from PySide6.QtCore import QTimer, QUrl
from PySide6.QtGui import QDesktopServices
from PySide6.QtWidgets import (QApplication, QCheckBox, QComboBox, QDialog, QDialogButtonBox, QFileDialog, QFormLayout,
                               QHBoxLayout, QLineEdit, QProgressBar, QPushButton, QVBoxLayout, QWidget)

from app.engine.background import Task
from app.engine.command import DmadCommand
from app.widgets.elided_label import ElidedLabel
from dmad.contract.exports import DTYPES, FORMATS, LORA_FORMATS
from dmad.contract.runs import RunFolder

LORA_TIP = "this run's student is a full UNet (identity.student is not \"lora\"): export it as diffusers"
FORMAT_TEXT = {"diffusers": "diffusers (a full pipeline folder)", "lora": "LoRA (diffusers' LoRA file)",
               "lora-single-file": "LoRA, one file for ComfyUI / Forge / A1111",
               "single-file": "model, one file for ComfyUI (Load Diffusion Model)"}
DTYPE_TEXT = {"fp32": "fp32 (as trained: the run's samples exactly)", "fp16": "fp16 (half the size)",
              "bf16": "bf16 (half the size)"}


def checkpoints(run: Path) -> list[int]:
    """The iterations of the run's complete checkpoints, oldest first (reads the folder: a worker's job)."""
    return [it for it, _ in RunFolder(run).list_checkpoints()]


def user_loras(run: Path) -> list[str]:
    """The file names of the LoRAs the run's teacher had (identity.teacher_loras in its config.json);
    [] when it had none or the config cannot be read (a worker's job)."""
    from dmad.contract.jsonfile import read_json_file
    from dmad.errors import UserInputError

    try:
        raw = read_json_file(RunFolder(run).config_json, "config")
        found = raw["identity"].get("teacher_loras") or []
        return [Path(str(x["path"])).name for x in found]
    except (UserInputError, KeyError, TypeError, AttributeError):
        return []


def run_facts(run: Path) -> tuple[list[int], list[str]]:
    return checkpoints(run), user_loras(run)


class ExportDialog(QDialog):
    def __init__(self, run: Path, lora_student: bool, program: Optional[Sequence[str]] = None,
                 parent: Optional[QWidget] = None):
        super().__init__(parent)
        self.setWindowTitle(f"Export {run.name}")
        self.run, self.output = Path(run), None
        self._started = 0.0
        self.command = DmadCommand(self, program=program, label="dmad export")
        self.command.stdout_line.connect(self._on_stdout)
        self.command.stderr_line.connect(lambda line: line.strip() and self.status.setText(line.strip()))
        self.command.finished.connect(self._on_finished)
        self._clock = QTimer(self, interval=1000, timeout=self._tick)
        self._build(lora_student)
        self._list = Task(self)
        self._list.done.connect(self._on_facts)
        self._list.submit(lambda: run_facts(self.run))

    def _build(self, lora_student: bool) -> None:
        self.format = QComboBox()
        for row, fmt in enumerate(FORMATS):
            self.format.addItem(FORMAT_TEXT[fmt], fmt)
            if fmt in LORA_FORMATS and not lora_student:
                self.format.model().item(row).setEnabled(False)
                self.format.model().item(row).setToolTip(LORA_TIP)
        self.format.setCurrentIndex(1 if lora_student else 0)
        self.dtype = QComboBox()
        for dtype in DTYPES:
            self.dtype.addItem(DTYPE_TEXT[dtype], dtype)
        self.checkpoint = QComboBox()
        self.checkpoint.addItem("latest", "latest")
        self.destination = QLineEdit(str(self.run / "export"), readOnly=True)
        self.destination.setToolTip("the folder the export's own new folder is written into")
        self.choose = QPushButton("Choose…")
        self.choose.clicked.connect(self._choose_destination)
        where = QHBoxLayout()
        where.addWidget(self.destination, 1)
        where.addWidget(self.choose)
        form = QFormLayout()
        form.addRow("Format", self.format)
        form.addRow("Precision", self.dtype)
        form.addRow("Checkpoint", self.checkpoint)
        form.addRow("Into", where)
        # --merge-user-loras: shown once the run's config says its teacher had LoRAs (read in a worker)
        self.merge = QCheckBox("Merge my LoRAs into the one file")
        self.merge.setToolTip("for tools that load one LoRA at a time: the file holds your LoRAs at their scales "
                              "and the student (exact: their ranks add up)")
        self.format.currentIndexChanged.connect(self._update_merge)
        form.addRow("", self.merge)
        self._form = form
        form.setRowVisible(self.merge, False)  # the whole row: a hidden widget alone leaves its gap
        self.progress = QProgressBar(textVisible=True)
        self.progress.setRange(0, 0)  # busy: the engine reports no fraction for an export
        self.progress.hide()  # only while the export runs
        self.status = ElidedLabel(f"Writes a new folder into {self.run / 'export'}")
        self.buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        self.copy_button = QPushButton("Copy path")
        self.copy_button.setToolTip("copy the exported folder's path")
        self.copy_button.clicked.connect(self._copy_path)
        self.buttons.addButton(self.copy_button, QDialogButtonBox.ButtonRole.ActionRole)
        self.copy_button.hide()  # once something was exported (after addButton, which shows it)
        self.export_button = QPushButton("Export")
        self.buttons.addButton(self.export_button, QDialogButtonBox.ButtonRole.ActionRole)
        self.export_button.clicked.connect(self.start)
        self.buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        for w in (self.progress, self.status, self.buttons):
            layout.addWidget(w)
        self.resize(560, self.sizeHint().height())

    def _on_facts(self, facts: tuple[list[int], list[str]]) -> None:
        found, self._user_loras = facts
        for it in reversed(found):
            self.checkpoint.addItem(f"iter_{it}", str(it))
        if self._user_loras:
            self.merge.setText(f"Merge my LoRAs ({', '.join(self._user_loras)}) into the one file")
        self._update_merge()

    def _update_merge(self) -> None:
        """The merge switch exists for a LoRA one-file export of a run whose teacher had LoRAs."""
        self._form.setRowVisible(self.merge, bool(getattr(self, "_user_loras", []))
                                 and self.format.currentData() == "lora-single-file")

    def start(self) -> bool:
        if self.command.is_running():
            return False
        args = ["export", "--run", str(self.run), "--format", self.format.currentData()]
        if self.dtype.currentData() != "fp32":
            args += ["--dtype", self.dtype.currentData()]
        if self.checkpoint.currentData() != "latest":
            args += ["--checkpoint", self.checkpoint.currentData()]
        if not self.merge.isHidden() and self.merge.isChecked():
            args += ["--merge-user-loras"]
        into = Path(self.destination.text())
        if into != self.run / "export":  # the engine's default folder name, in the chosen folder
            ckpt = "latest" if self.checkpoint.currentData() == "latest" else f"iter_{self.checkpoint.currentData()}"
            args += ["--out", str(into / f"{self.run.name}-{ckpt}-{self.format.currentData()}")]
        self.output, self._started = None, time.monotonic()
        self.progress.setFormat("0 s")
        self.progress.show()
        self.export_button.setText("Cancel")
        self.export_button.clicked.disconnect()
        self.export_button.clicked.connect(self.command.kill)
        self.status.setText(f"Exporting {self.run.name} as {self.format.currentData()} …")
        self._clock.start()
        self.command.start(args)
        return True

    def _tick(self) -> None:
        self.progress.setFormat(f"{time.monotonic() - self._started:.0f} s")

    def _on_stdout(self, line: str) -> None:
        if line.strip():
            self.output = Path(line.strip())  # `dmad export` prints the folder it wrote, and nothing else

    def _on_finished(self, code: int, line: str) -> None:
        self._clock.stop()
        self.progress.hide()
        self.export_button.setText("Export")
        self.export_button.clicked.disconnect()
        self.export_button.clicked.connect(self.start)
        if code == 0 and self.output is not None:
            self.copy_button.show()
            if QDesktopServices.openUrl(QUrl.fromLocalFile(str(self.output))):
                self.status.setText(f"Exported to {self.output}")
            else:  # no file manager here: the path is what the user needs
                self.status.setText(f"Exported to {self.output} (no file manager opened it: Copy path)")
        else:
            self.status.setText(f"Export failed: {line or f'exit code {code}'}")

    def _choose_destination(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "Export into", self.destination.text())
        if folder:
            self.destination.setText(folder)
            self.status.setText(f"Writes a new folder into {folder}")

    def _copy_path(self) -> None:
        if self.output is not None:
            QApplication.clipboard().setText(str(self.output))
            self.status.setText(f"Copied {self.output}")

    def reject(self) -> None:
        self.command.kill()  # closing the dialog cancels an export in flight
        self._clock.stop()
        super().reject()
