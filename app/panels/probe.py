"""The Memory tab's probe: measure, not estimate. `dmad probe` runs a few training steps per (batch,
resolution) point, each in its own child process, and writes DIR/probe.json: the trade-off table,
the curves and a recommendation whose config changes can be applied to the Config form.

The probe is a DmadCommand: it runs in its own session (POSIX), so Cancel ends the whole process
group: the engine and the point it is measuring. `progress <done> <total>` lines on stderr drive the bar;
probe.json is read in a pool worker when the command ends (also after a cancel or a failure: the
engine rewrites it after every point, so the points measured so far are shown). Results live in a
new folder per probe under the app's data folder (`<AppData>/probes/probe-<time>`), so "Open probe
folder..." shows them again after a restart. Memory scopes are never mixed: each memory column and
the chart's axis name theirs.
"""
from __future__ import annotations

import html
from datetime import datetime
from pathlib import Path
from typing import Callable, Optional, Sequence

import pyqtgraph as pg
from PySide6.QtCore import QStandardPaths, Qt, Signal
from PySide6.QtWidgets import (QFileDialog, QHBoxLayout, QHeaderView, QLabel, QLineEdit, QProgressBar,
                               QPushButton, QSpinBox, QSplitter, QTableWidget, QTableWidgetItem, QVBoxLayout,
                               QWidget)

from app.engine.background import Task
from app.engine.command import DmadCommand
from app.models.probe_result import ProbePoint, ProbeResult, load_probe, parse_int_list
from app.widgets.elided_label import ElidedLabel
from app.widgets.wheel_guard import guard_wheel
from dmad.contract.memory import PROBE_FILE

RED = "#c0392b"
COLUMNS = ("point", "kind", "batch", "accum-\nulation", "effective\nbatch", "resolution", "precision",
           "checkpoint-\ning", "status /\nOOM phase", "framework peak GiB\n(torch allocator)",
           "device peak GiB\n(NVML, all processes)", "process peak RSS\nGiB (host RAM)", "step\ntime s",
           "data\ntime s", "compute\ntime s", "ledger estimate\nGiB (framework)")
CURVE_COLOURS = ("#1f77b4", "#2ca02c", "#ff7f0e", "#9467bd", "#17becf", "#bcbd22", "#e377c2", "#8c564b")  # no red: OOM
SCOPE_AXIS = {"framework": "framework peak (torch allocator), GiB",
              "process": "process peak RSS (host RAM, CPU run), GiB"}


def default_probes_dir() -> Path:
    return Path(QStandardPaths.writableLocation(QStandardPaths.StandardLocation.AppDataLocation)) / "probes"


def _num(x: Optional[float], fmt: str = "{:.2f}") -> str:
    return "" if x is None else fmt.format(x)


def point_cells(p: ProbePoint) -> list[str]:
    return [str(p.point), p.kind, str(p.batch), str(p.grad_accum), str(p.effective_batch), str(p.resolution),
            p.precision, "on" if p.gradient_checkpointing else "off", p.status_text(), _num(p.framework_peak_gb),
            _num(p.device_peak_gb), _num(p.process_peak_rss_gb), _num(p.step_time_s, "{:.3f}"),
            _num(p.data_time_s, "{:.3f}"), _num(p.compute_time_s, "{:.3f}"), _num(p.ledger_gb)]


def peak_of(p: ProbePoint, scope: str) -> Optional[float]:
    return p.framework_peak_gb if scope == "framework" else p.process_peak_rss_gb


class ProbePanel(QWidget):
    probe_finished = Signal(int, str)   # exit code (-1 cancelled / crashed / not started), one line
    result_shown = Signal(object)       # the ProbeResult now shown
    apply_requested = Signal(dict)      # the recommendation's config_changes ("resources.x": value)

    def __init__(self, materialize: Callable[[], Path], command: Optional[Sequence[str]] = None,
                 probes_dir: Optional[Path] = None, parent: Optional[QWidget] = None):
        super().__init__(parent)
        self._materialize = materialize
        self._dmad = DmadCommand(self, program=command)
        self._dmad.progress.connect(self._on_progress)
        self._dmad.finished.connect(self._on_finished)
        self._running = False  # from Run until what was measured is shown
        self._probes_dir = probes_dir
        self._cancelled = False
        self._out: Optional[Path] = None
        self._end_text = ""
        self._code = 0
        self._config_defaults = ("1", "512")  # batch, resolution texts last set from the config
        self._result: Optional[ProbeResult] = None
        self._load = Task(self)
        self._load.done.connect(self._on_loaded)
        self._load.failed.connect(self._on_load_failed)
        self._build()
        self._update_buttons()

    # ------------------------------------------------------------ layout

    def _build(self) -> None:
        self.batch_edit = QLineEdit("1")
        self.batch_edit.setToolTip("Per-device batch sizes to measure, comma separated")
        self.resolution_edit = QLineEdit("512")
        self.resolution_edit.setToolTip("Resolutions to measure, comma separated")
        self.steps = QSpinBox(minimum=1, maximum=10_000, value=10)
        self.steps.setToolTip("Measured training steps per point")
        self.warmup = QSpinBox(minimum=0, maximum=10_000, value=3)
        self.warmup.setToolTip("Steps run before measuring (not timed)")
        guard_wheel(self.steps, self.warmup)
        self.buttons: dict[str, QPushButton] = {}
        row = QHBoxLayout()
        for label, w in (("Batch", self.batch_edit), ("Resolution", self.resolution_edit), ("Steps", self.steps),
                         ("Warmup", self.warmup)):
            row.addWidget(QLabel(label))
            row.addWidget(w, 1 if isinstance(w, QLineEdit) else 0)
        for key, text, slot in (("run", "Run probe", self.run), ("cancel", "Cancel", self.cancel),
                                ("open", "Open probe folder...", self._pick_folder)):
            b = QPushButton(text)
            b.clicked.connect(lambda _=False, s=slot: s())
            self.buttons[key] = b
            row.addWidget(b)
        self.progress = QProgressBar()
        self.progress.setRange(0, 1)
        self.progress.setValue(0)
        # probe folders and engine lines: elided, whole in the tooltip, never widening the window
        self.status = ElidedLabel("Measure peak memory and step time for a few batch sizes and resolutions.")
        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setHorizontalHeaderLabels(list(COLUMNS))
        self.table.verticalHeader().hide()
        self.table.setEditTriggers(QTableWidget.NoEditTriggers)
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.Interactive)
        self.table.setWordWrap(False)
        self.table.resizeColumnsToContents()  # the two-line headers readable before the first result
        self.mem_plot = pg.PlotWidget()
        self.mem_plot.addLegend(offset=(10, 10))
        self.mem_plot.setLabel("bottom", "batch (per device)")
        self.mem_plot.setLabel("left", SCOPE_AXIS["framework"])
        self.mem_plot.showGrid(x=True, y=True, alpha=0.3)
        self.time_plot = pg.PlotWidget()
        self.time_plot.addLegend(offset=(10, 10))
        self.time_plot.setLabel("bottom", "batch (per device)")
        self.time_plot.setLabel("left", "step time, s")
        self.time_plot.showGrid(x=True, y=True, alpha=0.3)
        self.mem_curves: dict[int, pg.PlotDataItem] = {}
        self.time_curves: dict[int, pg.PlotDataItem] = {}
        oom = dict(pen=None, symbol="x", symbolSize=14, symbolPen=pg.mkPen(RED, width=3), symbolBrush=None)
        self.mem_oom = self.mem_plot.plot([], [], name="out of memory", **oom)
        self.time_oom = self.time_plot.plot([], [], name="out of memory (no time)", **oom)
        self.recommendation = QLabel("")
        self.recommendation.setWordWrap(True)
        self.recommendation.setTextFormat(Qt.RichText)
        self.recommendation.setTextInteractionFlags(Qt.TextSelectableByMouse)
        self.apply_button = QPushButton("Apply to config")
        self.apply_button.setToolTip("Set the recommended values in the Config form (not saved)")
        self.apply_button.clicked.connect(self.apply)
        rec = QHBoxLayout()
        rec.addWidget(self.recommendation, 1)
        rec.addWidget(self.apply_button, 0, Qt.AlignTop)
        charts = QSplitter(Qt.Horizontal)
        charts.addWidget(self.mem_plot)
        charts.addWidget(self.time_plot)
        split = QSplitter(Qt.Vertical)
        split.addWidget(self.table)
        split.addWidget(charts)
        split.setSizes([250, 300])
        lay = QVBoxLayout(self)
        lay.addLayout(row)
        lay.addWidget(self.progress)
        lay.addWidget(self.status)
        lay.addWidget(split, 1)
        lay.addLayout(rec)

    # ------------------------------------------------------------ the window's contract

    def set_config(self, raw: dict) -> None:
        """Batch and resolution follow the config until the user types others."""
        res = raw.get("resources") if isinstance(raw, dict) else None
        res = res if isinstance(res, dict) else {}
        batch = res.get("train_batch_size")
        resolution = res.get("resolution")
        new = (str(batch) if isinstance(batch, int) else "1", str(resolution) if isinstance(resolution, int) else "512")
        for edit, old, value in ((self.batch_edit, self._config_defaults[0], new[0]),
                                 (self.resolution_edit, self._config_defaults[1], new[1])):
            if edit.text().strip() in ("", old):
                edit.setText(value)
        self._config_defaults = new

    def result(self) -> Optional[ProbeResult]:
        return self._result

    def is_running(self) -> bool:
        return self._running

    def busy(self) -> bool:
        return self._running or self._load.busy()

    def out_dir(self) -> Optional[Path]:
        return self._out

    # ------------------------------------------------------------ the probe

    def _probe_args(self, config: Path, out: Path) -> list[str]:
        batches = parse_int_list(self.batch_edit.text(), "batch")
        resolutions = parse_int_list(self.resolution_edit.text(), "resolution")
        return ["probe", "--config", str(config), "--batch", ",".join(map(str, batches)),
                "--resolution", ",".join(map(str, resolutions)), "--steps", str(self.steps.value()),
                "--warmup", str(self.warmup.value()), "--out", str(out), "--progress"]

    def run(self) -> bool:
        if self._running:
            return False
        root = self._probes_dir or default_probes_dir()
        out = root / f"probe-{datetime.now():%Y%m%d-%H%M%S-%f}"
        try:
            args = self._probe_args(Path(self._materialize()), out)
            root.mkdir(parents=True, exist_ok=True)
        except (ValueError, OSError) as e:
            self._set_status(f"Probe not started: {e}", error=True)
            return False
        self._running, self._cancelled, self._out = True, False, out
        self.progress.setRange(0, 0)
        self._set_status(f"Probing into {out} ...")
        self._update_buttons()
        self._dmad.start(args)
        return True

    def cancel(self) -> None:
        """Ends the engine and the point it is measuring (its process group) at once: a point mid-step
        has nothing worth saving, and the next probe wants its memory back."""
        if self._dmad.is_running():
            self._cancelled = True
            self._dmad.kill(grace_ms=0)

    def _on_progress(self, done: int, total: int) -> None:
        total = max(total, 1)
        self.progress.setRange(0, total)
        self.progress.setValue(min(done, total))
        self._set_status(f"Probing: {done} of {total} points measured ({self._out})")

    def _on_finished(self, code: int, line: str) -> None:
        if not self._running:
            return
        if self._cancelled:
            code, text = -1, "Probe cancelled."
        elif code != 0:
            text = line or f"dmad probe exited with code {code}"
        else:
            text = f"Probe finished: {self._out}"
        if self._out is not None and (self._out / PROBE_FILE).is_file() and code != 2:
            self._code, self._end_text = code, text  # show what was measured, then end
            folder = self._out
            self._load.submit(lambda: load_probe(folder))
            return
        self._end(code, text, error=code != 0 and not self._cancelled)

    def _end(self, code: int, text: str, error: bool) -> None:
        self._running = False
        self.progress.setRange(0, 1)
        self.progress.setValue(1 if code == 0 else 0)
        self._set_status(" ".join(text.split()), error)
        self._update_buttons()
        self.probe_finished.emit(code, " ".join(text.split()))

    # ------------------------------------------------------------ results

    def open_probe(self, folder: Path) -> None:
        """Show an existing probe folder (its probe.json), read in a worker."""
        if self._running:
            return
        self._code, self._end_text = 0, ""
        self._set_status(f"Reading {Path(folder) / PROBE_FILE} ...")
        self._load.submit(lambda: load_probe(Path(folder)))

    def _on_loaded(self, result: ProbeResult) -> None:
        self.show_result(result)
        if self._running:
            cancelled_or_failed = self._cancelled or self._code != 0
            suffix = f" (showing the {len(result.points)} points measured)" if cancelled_or_failed else ""
            self._end(self._code, self._end_text + suffix, error=self._code != 0 and not self._cancelled)
        else:
            self._set_status(f"Probe of {result.config or '?'} on {result.device}: {len(result.points)} points "
                             f"({result.folder})")

    def _on_load_failed(self, message: str) -> None:
        line = message.removeprefix("ValueError: ")
        if self._running:
            self._end(self._code if self._code else 1, f"{self._end_text}; {line}" if self._end_text else line,
                      error=True)
        else:
            self._set_status(line, error=True)

    def show_result(self, r: ProbeResult) -> None:
        self._result = r
        self.table.setRowCount(len(r.points))
        for i, p in enumerate(r.points):
            for j, text in enumerate(point_cells(p)):
                item = QTableWidgetItem(text)
                if p.is_oom or p.status == "error":
                    item.setForeground(pg.mkColor(RED))
                    if j == 8 and p.error:
                        item.setToolTip(p.error)
                self.table.setItem(i, j, item)
        self.table.resizeColumnsToContents()
        self._plot(r)
        self._show_recommendation(r)
        self._update_buttons()
        self.result_shown.emit(r)

    def _plot(self, r: ProbeResult) -> None:
        scope = r.memory_scope()
        self.mem_plot.setLabel("left", SCOPE_AXIS[scope])
        train = [p for p in r.points if p.kind != "baseline"]  # the baseline runs no backward: table only
        resolutions = sorted({p.resolution for p in train})
        for curves, plot in ((self.mem_curves, self.mem_plot), (self.time_curves, self.time_plot)):
            for res in [res for res in curves if res not in resolutions]:
                plot.removeItem(curves.pop(res))
        for i, res in enumerate(resolutions):
            ok = sorted((p for p in train if p.resolution == res and p.status == "ok"), key=lambda p: p.batch)
            mem = [(p.batch, peak_of(p, scope)) for p in ok if peak_of(p, scope) is not None]
            times = [(p.batch, p.step_time_s) for p in ok if p.step_time_s is not None]
            pen = pg.mkPen(CURVE_COLOURS[i % len(CURVE_COLOURS)], width=2)
            for curves, plot, xy in ((self.mem_curves, self.mem_plot, mem), (self.time_curves, self.time_plot, times)):
                if res not in curves:
                    curves[res] = plot.plot([], [], name=f"{res} px", symbol="o", symbolSize=7)
                curves[res].setPen(pen)
                curves[res].setSymbolBrush(pen.color())
                curves[res].setData([x for x, _ in xy], [y for _, y in xy])
        ooms = [p for p in train if p.is_oom]
        # an OOM point is drawn at what it reached before failing, else at the engine's estimate
        mem_oom = [(p.batch, peak_of(p, scope) if peak_of(p, scope) is not None else p.ledger_gb) for p in ooms]
        mem_oom = [(x, y) for x, y in mem_oom if y is not None]
        self.mem_oom.setData([x for x, _ in mem_oom], [y for _, y in mem_oom])
        self.time_oom.setData([p.batch for p in ooms], [0.0] * len(ooms))

    def _show_recommendation(self, r: ProbeResult) -> None:
        head = {True: "The config fits as recommended.", False: "No measured point fits.",
                None: "No recommendation recorded."}[r.fits]
        steps = "".join(f"<li>{html.escape(s)}</li>" for s in r.steps_text)
        changes = ", ".join(f"{html.escape(k)} = {html.escape(repr(v))}" for k, v in r.config_changes.items())
        device = f"{r.device}" + (f", {r.device_total_gb:.1f} GiB device-wide" if r.device_total_gb else "")
        self.recommendation.setText(f"<b>Recommendation</b> ({html.escape(device)}): {html.escape(head)}"
                                    + (f"<ol>{steps}</ol>" if steps else "")
                                    + (f"Config changes: {changes}" if changes else ""))

    def apply(self) -> None:
        if self._result is not None and self._result.config_changes:
            self.apply_requested.emit(dict(self._result.config_changes))

    # ------------------------------------------------------------ small things

    def _set_status(self, text: str, error: bool = False) -> None:
        self.status.setStyleSheet(f"color: {RED}" if error else "")
        self.status.setText(text)

    def _update_buttons(self) -> None:
        running = self._running
        self.buttons["run"].setEnabled(not running)
        self.buttons["cancel"].setEnabled(running)
        self.buttons["open"].setEnabled(not running)
        self.apply_button.setEnabled(bool(self._result and self._result.config_changes))

    def _pick_folder(self) -> None:
        start = str(self._probes_dir or default_probes_dir())
        folder = QFileDialog.getExistingDirectory(self, "Probe folder (with probe.json)", start)
        if folder:
            self.open_probe(Path(folder))
