"""Memory: measure the current config (a probe, app/panels/probe.py), will it fit (the engine's
dry-run ledger), and what did the open run use (its gpu_mem.csv).

The estimate comes from `dmad train --config FILE --dry-run`, run by the engine as a subprocess:
the app never computes memory itself. gpu_mem.csv rows name their scope (device_nvml: NVML
device-wide, every process; process_rss: the engine process's resident memory on a CPU run); one
row per scope here, never a mix of the two in one number.
"""
from __future__ import annotations

import csv
import io
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence

from PySide6.QtCore import QTimer, Signal
from PySide6.QtGui import QFontDatabase
from PySide6.QtWidgets import (QHBoxLayout, QPlainTextEdit, QPushButton, QTableWidget, QTableWidgetItem,
                               QTabWidget, QVBoxLayout, QWidget)

from app.engine.background import Task
from app.panels.probe import ProbePanel
from app.widgets.elided_label import ElidedLabel
from dmad.contract.regular import fopen_regular
from dmad.contract.runs import RunFolder

RESCAN_MS = 5000
TAIL_BYTES = 4 * 2 ** 20  # gpu_mem.csv grows ~1 MB a day at the default 5 s interval
SCOPE_NAMES = {
    "device_nvml": "device-wide (NVML, all processes on the GPU)",
    "process_rss": "engine process resident memory (CPU run)",
}


@dataclass(frozen=True)
class ScopeReading:
    scope: str
    last_used_gb: Optional[float]
    total_gb: Optional[float]
    peak_used_gb: Optional[float]
    t: float        # unix time of the last sample
    samples: int


def _num(s: str) -> Optional[float]:
    try:
        return float(s) if s else None
    except ValueError:
        return None


def read_gpu_mem(path: Path) -> list[ScopeReading]:
    """Worker side: the last and peak reading of each scope in (the tail of) gpu_mem.csv."""
    try:
        with fopen_regular(path, "rb") as f:  # a FIFO there is refused, never waited on
            header = f.readline(TAIL_BYTES)
            size = f.seek(0, 2)
            f.seek(max(len(header), size - TAIL_BYTES))
            body = f.read()
    except OSError:  # missing, or not a regular file
        return []
    if size > TAIL_BYTES + len(header):
        body = body[body.find(b"\n") + 1:]  # the tail starts mid-row
    body = body[:body.rfind(b"\n") + 1]  # a torn last row waits for the next read
    rows = csv.DictReader(io.StringIO((header + body).decode("utf-8", "replace")))
    acc: dict[str, dict] = {}
    for row in rows:
        scope = row.get("scope") or "unknown"
        used, t = _num(row.get("mem_used_gb", "")), _num(row.get("t", "")) or 0.0
        a = acc.setdefault(scope, {"n": 0, "peak": None})
        a.update(n=a["n"] + 1, t=t, used=used, total=_num(row.get("mem_total_gb", "")))
        if used is not None and (a["peak"] is None or used > a["peak"]):
            a["peak"] = used
    return [ScopeReading(s, a["used"], a["total"], a["peak"], a["t"], a["n"]) for s, a in acc.items()]


def ledger_part(report: str) -> str:
    """The dry-run report minus the resolved config JSON (the Config panel shows that)."""
    lines = report.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("Run folder:")), 0)
    return "\n".join(lines[start:]).strip()


def _gb(x: Optional[float]) -> str:
    return "" if x is None else f"{x:.2f}"


class MemoryTab(QWidget):
    apply_requested = Signal(dict)  # a probe's recommended config changes, for the Config panel

    def __init__(self, materialize: Callable[[], Path], make_engine: Callable[[], object],
                 overrides: Callable[[], list[str]] = list, parent: Optional[QWidget] = None,
                 command: Optional[Sequence[str]] = None, probes_dir: Optional[Path] = None):
        """`materialize`: the current config as a file; `make_engine`: an EngineProcess;
        `overrides`: --set items for the dry run (the window's runs root as identity.output_dir);
        `command`: replaces the `dmad` command line of the probe (tests); `probes_dir`: where probe
        folders are made (default: the app's data folder)."""
        super().__init__(parent)
        self._materialize, self._make_engine, self._overrides = materialize, make_engine, overrides
        self.probe = ProbePanel(materialize, command, probes_dir)
        self.probe.apply_requested.connect(self.apply_requested)
        self._engine = None  # created on first use: a QProcess wrapper, cheap, but not needed before
        self._estimating = False
        self._run: Optional[Path] = None
        self._task = Task(self)
        self._task.done.connect(self._show_readings)
        self._task.failed.connect(lambda msg: self.run_label.setText(f"Could not read gpu_mem.csv: {msg}"))
        self._build()
        self._timer = QTimer(self)
        self._timer.setInterval(RESCAN_MS)
        self._timer.timeout.connect(self._tick)
        self._timer.start()

    def _build(self) -> None:
        self.estimate_button = QPushButton("Estimate memory")
        self.estimate_button.setToolTip("Runs `dmad train --config <this config> --dry-run`: validates the config, "
                                        "data and teacher and prints the memory ledger, without training")
        self.estimate_button.clicked.connect(self.estimate)
        # paths and engine lines: elided, whole in the tooltip, never widening the window
        self.estimate_status = ElidedLabel("The engine's estimate for the current config (framework peak per device).")
        self.ledger = QPlainTextEdit()
        self.ledger.setReadOnly(True)
        self.ledger.setFont(QFontDatabase.systemFont(QFontDatabase.FixedFont))
        self.ledger.setLineWrapMode(QPlainTextEdit.NoWrap)
        self.run_label = ElidedLabel("No run open.")
        self.readings = QTableWidget(0, 5)
        self.readings.setHorizontalHeaderLabels(["scope", "last used (GB)", "total (GB)", "peak used (GB)", "last sample"])
        self.readings.horizontalHeader().setStretchLastSection(True)
        self.readings.verticalHeader().hide()
        self.readings.setEditTriggers(QTableWidget.NoEditTriggers)
        top = QHBoxLayout()
        top.addWidget(self.estimate_button)
        top.addWidget(self.estimate_status, 1)
        page = QWidget()
        lay = QVBoxLayout(page)
        lay.addLayout(top)
        lay.addWidget(self.ledger, 3)
        lay.addWidget(self.run_label)
        lay.addWidget(self.readings, 1)
        self.pages = QTabWidget()
        self.pages.addTab(self.probe, "Probe")
        self.pages.addTab(page, "Estimate and run readings")
        QVBoxLayout(self).addWidget(self.pages)

    # ------------------------------------------------------------ the window's contract

    def set_config(self, raw: dict, base_dir: Optional[Path] = None) -> None:
        """The probe's batch and resolution follow the config being edited."""
        self.probe.set_config(raw)

    def open_probe(self, folder: Path) -> None:
        self.probe.open_probe(folder)

    # ------------------------------------------------------------ estimate (dry run)

    def estimate(self) -> None:
        if self._estimating:
            return
        try:
            path = self._materialize()
        except (OSError, ValueError) as e:  # the form is invalid or the temp folder is not writable
            self.estimate_status.setText(f"Cannot estimate: {e}")
            return
        if self._engine is None:
            self._engine = self._make_engine()
            self._engine.dry_run_finished.connect(self._on_dry_run)
        self._estimating = True
        self.estimate_button.setEnabled(False)
        self.estimate_status.setText(f"Running the engine's dry run on {path} ...")
        self._engine.start_dry_run(Path(path), overrides=self._overrides())

    def _on_dry_run(self, code: int, text: str) -> None:
        self._estimating = False
        self.estimate_button.setEnabled(True)
        if code == 0:
            cpu = "(CPU run)" in text
            self.estimate_status.setText("Estimate from the engine's dry run (framework peak per device; "
                                         + ("a CPU run: process memory, no CUDA context)." if cpu else
                                            "the device also holds the CUDA context and other processes)."))
            self.ledger.setPlainText(ledger_part(text))
        else:
            self.estimate_status.setText(f"Dry run failed (exit {code}): {text.strip().splitlines()[-1] if text.strip() else 'no message'}")

    # ------------------------------------------------------------ the open run

    def set_run(self, run_dir: Optional[Path]) -> None:
        self._run = run_dir
        self.readings.setRowCount(0)
        self.run_label.setText("No run open." if run_dir is None else f"{run_dir.name}: reading gpu_mem.csv ...")
        self.refresh()

    def refresh(self) -> None:
        if self._run is not None:
            path = RunFolder(self._run).gpu_mem_csv
            self._task.submit(lambda: read_gpu_mem(path))

    def busy(self) -> bool:
        return self._task.busy() or self._estimating or self.probe.busy()

    def _tick(self) -> None:
        if self.isVisible() and not self._task.busy():
            self.refresh()

    def _show_readings(self, readings: list[ScopeReading]) -> None:
        if self._run is None:
            return
        self.run_label.setText(f"{self._run.name}: memory sampled by the engine (gpu_mem.csv), one row per scope"
                               if readings else f"{self._run.name}: no gpu_mem.csv samples yet")
        self.readings.setRowCount(len(readings))
        for i, r in enumerate(readings):
            ago = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r.t)) if r.t else ""
            cells = [r.scope, _gb(r.last_used_gb), _gb(r.total_gb), _gb(r.peak_used_gb), f"{ago} ({r.samples} samples)"]
            for j, text in enumerate(cells):
                item = QTableWidgetItem(text)
                if j == 0:
                    item.setToolTip(SCOPE_NAMES.get(r.scope, "scope as written by the engine"))
                self.readings.setItem(i, j, item)
        self.readings.resizeColumnsToContents()
