"""The Config panel's "Memory estimate" side tab: the engine's memory ledger for what the form shows.

`dmad ledger --config FILE --json` (the engine reads teacher configs, never weights, and imports
torch: 2-3 s) runs as a DmadCommand DEBOUNCE_MS after the last valid change, and only while the tab
is on screen (a hidden tab is marked stale and refreshed when shown). A newer request supersedes an
older one: the old command is discarded (silenced and killed), so a slow stale answer can never
overwrite a newer one. The numbers are the engine's framework-scope estimate (torch's allocator, per device);
the GPU's total, when NVML knows it, is device-wide, and the two are labelled as such. The status
names the teacher family the engine sized. With teacher_cpu_offload the ledger has a host-RAM line
(scope "cpu"): it is listed under its own heading below the GPU lines and stated apart from the GPU
total, which is the engine's own sum of the GPU lines and never includes it. The engine says which
device it sized (inputs.device): a CPU run (no CUDA device where the engine runs) has no CUDA context,
so neither its margin line nor the words around the table mention one, and a GPU's NVML total is not
set against it.
"""
from __future__ import annotations

import html
import shutil
import tempfile
import weakref
from pathlib import Path
from typing import Callable, Optional, Sequence

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtGui import QBrush, QColor, QFont
from PySide6.QtWidgets import QHeaderView, QLabel, QTableWidget, QTableWidgetItem, QVBoxLayout, QWidget

from app.engine.command import DmadCommand
from app.widgets.elided_label import ElidedLabel
from dmad.contract.memory import LedgerReport, parse_ledger

DEBOUNCE_MS = 800
RED = "#c0392b"
GRAY = "#7f8c8d"
CPU_HEADING = "CPU RAM (host memory, not in the GPU total)"
GPU_NOTE = ("Framework scope: what torch's allocator will hold on one device at peak. The device also holds the "
            "CUDA context and whatever other processes use; a probe (Memory tab) measures both.")
CPU_NOTE = ("Framework scope: what the run's process will hold in RAM at peak. A CPU run has no CUDA context; "
            "other processes' memory is not in it; a probe (Memory tab) measures the process.")
# how the status names the engine's model_family values
FAMILY_NAMES = {"sd1": "SD 1.x", "sd2": "SD 2.x", "sdxl": "SDXL", "sd3": "SD3", "flux": "Flux"}


def family_text(family: Optional[str]) -> str:
    """"SD3 (sd3)" for the status line; "" when the engine did not say."""
    if not family:
        return ""
    name = FAMILY_NAMES.get(family)
    return f"{name} ({family})" if name else family


def _on_cpu(ledger: LedgerReport) -> bool:
    """The engine sized a CPU run (an engine from before inputs.device sized a GPU run)."""
    return ledger.inputs.get("device") == "cpu"


class LedgerView(QWidget):
    ledger_shown = Signal(object)   # the LedgerReport now in the table
    failed = Signal(str)            # the one-line error now shown

    def __init__(self, materialize: Callable[[Path], Path], command: Optional[Sequence[str]] = None,
                 parent: Optional[QWidget] = None):
        """`materialize(target)` writes the form's config to `target` (raises ValueError when invalid);
        `command` replaces engine_argv() (tests run a stand-in)."""
        super().__init__(parent)
        self._materialize = materialize
        self._program = list(command) if command is not None else None
        # the configs handed to `dmad ledger`; removed with the widget (or at exit), never left behind
        self._tmp = Path(tempfile.mkdtemp(prefix="dmad-ledger-"))
        weakref.finalize(self, shutil.rmtree, str(self._tmp), True)
        self._dmad: Optional[DmadCommand] = None  # the request in flight; one command per request
        self._out: list[str] = []
        self._generation = 0      # bumped per request: names its config file
        self._stale = True        # the form changed since the table was filled
        self._valid = True
        self._ledger: Optional[LedgerReport] = None
        self._device: Optional[tuple[str, float]] = None
        self._processes = 1       # the Training panel's Processes box: the ledger is per GPU of that many
        self._timer = QTimer(self)
        self._timer.setSingleShot(True)
        self._timer.setInterval(DEBOUNCE_MS)
        self._timer.timeout.connect(self.refresh)
        self._build()

    def _build(self) -> None:
        self.status = ElidedLabel("The engine's memory estimate for this config appears here.")  # engine lines
        self.table = QTableWidget(0, 3)
        self.table.setHorizontalHeaderLabels(["component", "GiB", "assumption"])
        self.table.verticalHeader().hide()
        self.table.setEditTriggers(QTableWidget.NoEditTriggers)
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeToContents)
        self.table.horizontalHeader().setStretchLastSection(True)
        self.total = QLabel("")
        self.total.setWordWrap(True)
        self.total.setTextFormat(Qt.RichText)
        self.note = QLabel(GPU_NOTE)
        self.note.setWordWrap(True)
        self.note.setStyleSheet("color: gray")
        lay = QVBoxLayout(self)
        lay.addWidget(self.status)
        lay.addWidget(self.table, 1)
        lay.addWidget(self.total)
        lay.addWidget(self.note)

    # ------------------------------------------------------------ the panel's contract

    def config_changed(self, valid: bool, message: str = "") -> None:
        """The form changed: refresh DEBOUNCE_MS after the last valid change (on screen only)."""
        self._stale, self._valid = True, valid
        if not valid:
            self._timer.stop()
            self._supersede()
            self._set_status(f"Not estimated: the config is not valid ({message})" if message
                             else "Not estimated: the config is not valid.", error=True)
            return
        if self.isVisible():
            self._timer.start()

    def set_device(self, name: str, total_gb: float) -> None:
        """The GPU the app sees (NVML, device-wide total), shown beside the framework estimate."""
        if self._device != (name, total_gb):
            self._device = (name, total_gb)
            self._show_total()

    def set_processes(self, n: int) -> None:
        """The number of processes Start launches (one per GPU): the estimate is per GPU of them."""
        if n != self._processes:
            self._processes = n
            self.config_changed(self._valid)

    def ledger(self) -> Optional[LedgerReport]:
        return self._ledger

    def is_running(self) -> bool:
        return self._dmad is not None

    def is_pending(self) -> bool:
        return self._timer.isActive() or self._dmad is not None

    def showEvent(self, event) -> None:
        super().showEvent(event)
        if self._stale and self._valid and not self.is_pending():
            self._timer.start()

    # ------------------------------------------------------------ the engine

    def refresh(self) -> None:
        """Run `dmad ledger` now on the form's config, superseding any request still running."""
        self._timer.stop()
        self._supersede()
        self._generation += 1
        try:
            path = self._materialize(self._tmp / f"config-{self._generation}.json")
        except (ValueError, OSError) as e:
            self._fail(f"Not estimated: {e}")
            return
        self._stale = False
        dmad = DmadCommand(self, program=self._program)
        dmad.stdout_line.connect(self._out_line)
        dmad.finished.connect(self._on_finished)
        self._dmad, self._out = dmad, []
        self._set_status("Estimating (dmad ledger) ...")
        dmad.start(["ledger", "--config", str(path), "--json", "--processes", str(self._processes)])

    def _supersede(self) -> None:
        dmad, self._dmad = self._dmad, None
        if dmad is not None:
            dmad.discard()  # anything it still delivers is stale

    def _out_line(self, line: str) -> None:
        self._out.append(line)

    def _on_finished(self, code: int, line: str) -> None:
        out, self._out = self._out, []
        dmad, self._dmad = self._dmad, None
        if dmad is not None:
            dmad.deleteLater()
        if code != 0:
            self._fail(line)
            return
        try:
            ledger = parse_ledger("\n".join(out))
        except ValueError as e:
            self._fail(str(e))
            return
        self._show(ledger)

    # ------------------------------------------------------------ display

    def _fail(self, line: str) -> None:
        line = " ".join(line.split())  # one line, whatever the engine printed
        self._ledger = None
        self.table.setRowCount(0)
        self.total.setText("")
        self._set_status(line, error=True)
        self.failed.emit(line)

    def _show(self, ledger: LedgerReport) -> None:
        """GPU lines first; then, when the teacher is offloaded, a heading row and the host-RAM lines
        (gray), so a CPU figure is never read as part of the GPU total under the table."""
        self._ledger = ledger
        gpu, cpu = ledger.gpu_lines, ledger.cpu_lines
        self.table.clearSpans()
        self.table.setRowCount(len(gpu) + (1 + len(cpu) if cpu else 0))
        for i, line in enumerate(gpu):
            self._set_row(i, line.name, line.gib, line.assumption)
        if cpu:
            heading = QTableWidgetItem(CPU_HEADING)
            font = QFont(heading.font())
            font.setBold(True)
            heading.setFont(font)
            self.table.setItem(len(gpu), 0, heading)
            self.table.setSpan(len(gpu), 0, 1, 3)
            for i, line in enumerate(cpu, start=len(gpu) + 1):
                self._set_row(i, line.name, line.gib, line.assumption, color=GRAY)
        family = family_text(ledger.family)
        on_cpu = _on_cpu(ledger)
        self._set_status(f"Estimate by the engine ({ledger.scope}) for the config as shown"
                         + (f", teacher family {family}" if family else "")
                         + (", a CPU run (no CUDA device where the engine runs)." if on_cpu else ".")
                         + (" What stays in host RAM is listed apart, under the GPU lines." if cpu else ""))
        self.note.setText(CPU_NOTE if on_cpu else GPU_NOTE)
        self._show_total()
        self.ledger_shown.emit(ledger)

    def _set_row(self, row: int, name: str, gib: float, assumption: str, color: Optional[str] = None) -> None:
        for j, text in enumerate((name, f"{gib:.2f}", assumption)):
            item = QTableWidgetItem(text)
            if j == 1:
                item.setTextAlignment(Qt.AlignRight | Qt.AlignVCenter)
            if color:
                item.setForeground(QBrush(QColor(color)))
            self.table.setItem(row, j, item)

    def total_text(self) -> str:
        return self.total.text()

    def _show_total(self) -> None:
        if self._ledger is None:
            return
        n = self._ledger.inputs.get("processes", 1)
        on_cpu = _on_cpu(self._ledger)
        text = f"<b>{self._ledger.total_gib:.2f} GiB estimated</b> (framework scope" + \
            (f", one GPU of {n} processes, {html.escape(str(self._ledger.inputs.get('distributed')))})" if n > 1 else ")")
        if self._device is not None and not on_cpu:  # a GPU torch cannot use is not where this run's memory is
            name, total = self._device
            text += (f" of <b>{total:.1f} GiB on {html.escape(name)}</b> (device-wide total, NVML)")
        if self._ledger.cpu_lines:
            what = "; ".join(html.escape(line.name) for line in self._ledger.cpu_lines)
            text += (f"<br>GPU lines only; plus <b>{self._ledger.cpu_gib:.2f} GiB of CPU RAM</b> (host memory, not in "
                     f"the GPU total): {what}")
        by = self._ledger.by_distributed
        if by:
            text += "<br>Per GPU at {} processes: {}".format(n, ", ".join(
                f"{html.escape(m)} <b>{gib:.1f} GiB</b>" for m, gib in by.items()))
        self.total.setText(text)

    def _set_status(self, text: str, error: bool = False) -> None:
        self.status.setStyleSheet(f"color: {RED}" if error else "")
        self.status.setText(text)
