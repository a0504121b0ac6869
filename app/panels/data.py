"""The Data panel: check a dataset folder or dataset list with `dmad check-data` and show what it
found before a run is started on it.

The check runs the engine's command line (a DmadCommand; the app never imports dmad.data.check):
`--progress` lines on stderr drive the progress bar, `--json` writes the report into a temporary
folder that is read once the command ends and then removed (a cancelled check leaves nothing).
Thumbnails are decoded in pool workers (app/models/thumbs.py) for the rows that are on screen only, so a
report of 100k problems costs nothing until scrolled to. The window asks `start_warning()` before
Start: the last check of the config's own data found errors.

Beside the findings, the image browser (app/widgets/data_browser.py) shows every image of the checked
source with its caption: selecting a finding selects its image there. A caption saved in the browser
is checked again on its own (data_browse.Rechecker: `dmad check-data` on that one image) and the
report's findings and counts follow, without checking the whole dataset again.
"""
from __future__ import annotations

import html
import os
import stat
import tempfile
from pathlib import Path
from typing import Optional, Sequence

from PySide6.QtCore import Qt, QTimer, QUrl, Signal
from PySide6.QtGui import QDesktopServices, QIcon, QPixmap
from PySide6.QtWidgets import (QAbstractItemView, QCheckBox, QComboBox, QFileDialog, QHBoxLayout, QHeaderView, QLabel,
                               QLineEdit, QProgressBar, QPushButton, QSpinBox, QSplitter, QTableView,
                               QTabWidget, QVBoxLayout, QWidget)

from app.engine.background import Task
from app.widgets.bucket_plot import BucketPlot
from app.widgets.data_browser import DataBrowser
from app.widgets.elided_label import ElidedLabel
from app.widgets.wheel_guard import guard_wheel
from app.models.data_browse import Recheck, Rechecker, merge_recheck
from app.models.data_report import DataReport, ProblemsFilter, ProblemsModel, load_report
from app.engine.command import DmadCommand
from app.models.sample_index import ImageFile
from app.models.thumbs import ThumbCache, ThumbLoader
from dmad.contract.config import Resources

THUMB_PX = 48
VISIBLE_DELAY_MS = 60  # scrolling fires per pixel; ask for thumbnails once it pauses
RED = "#c0392b"
PATH_CHARS = 72  # a dataset root longer than this is shortened in the middle (whole in the tooltip)


def data_dir_of(raw: dict, base_dir: Optional[Path]) -> Optional[Path]:
    """identity.train_data_dir, relative to the config file's folder as the engine reads it."""
    ident = raw.get("identity") if isinstance(raw, dict) else None
    value = ident.get("train_data_dir") if isinstance(ident, dict) else None
    if not isinstance(value, str) or not value.strip():
        return None
    path = Path(value).expanduser()
    return path if path.is_absolute() or base_dir is None else (base_dir / path).resolve()


def _resource(raw: dict, key: str) -> int:
    """resources.<key> of a config being edited: the field's default when missing or not a number."""
    res = raw.get("resources") if isinstance(raw, dict) else None
    value = res.get(key) if isinstance(res, dict) else None
    return value if isinstance(value, int) and value > 0 else Resources.model_fields[key].default


def _middle(text: str, chars: int) -> str:
    """`text` shortened to `chars` characters by an ellipsis in the middle (both ends of a path tell)."""
    if len(text) <= chars:
        return text
    head = (chars - 1) // 2
    return text[:head] + "…" + text[len(text) - (chars - 1 - head):]


def _regular_files(paths: list[str]) -> tuple[list[ImageFile], list[str]]:
    """Worker side: (the regular files among `paths` with their size and mtime, the other paths)."""
    files, gone = [], []
    for path in paths:
        try:
            st = os.stat(path)
        except OSError:
            st = None
        if st is None or not stat.S_ISREG(st.st_mode):
            gone.append(path)
        else:
            files.append(ImageFile(Path(path), st.st_size, st.st_mtime_ns))
    return files, gone


class FindingsTable(QWidget):
    """The report's findings: one row per problem with its thumbnail (decoded in pool workers for the
    rows on screen only), filtered by category and severity; Show in folder opens a row's folder."""

    def __init__(self, cache: ThumbCache, parent: Optional[QWidget] = None):
        super().__init__(parent)
        self._asked: set[str] = set()
        self.model = ProblemsModel(THUMB_PX, self)
        self.proxy = ProblemsFilter(self)
        self.proxy.setSourceModel(self.model)
        self.thumbs = ThumbLoader(cache, self)
        self.thumbs.loaded.connect(self._on_thumbs)
        self._stats = Task(self, every_answer=True)  # the rows' files are stat()ed in a worker too
        self._stats.done.connect(self._on_stats)
        self._visible = QTimer(self)
        self._visible.setSingleShot(True)
        self._visible.setInterval(VISIBLE_DELAY_MS)
        self._visible.timeout.connect(self.request_visible_thumbs)
        self.category = QComboBox()
        self.category.currentIndexChanged.connect(
            lambda _i: self._filter(self.proxy.set_category, self.category.currentData() or ""))
        self.severity = QComboBox()
        for text, value in (("errors and warnings", ""), ("errors", "error"), ("warnings", "warning")):
            self.severity.addItem(text, value)
        self.severity.currentIndexChanged.connect(
            lambda _i: self._filter(self.proxy.set_severity, self.severity.currentData() or ""))
        guard_wheel(self.category, self.severity)
        self.reveal = QPushButton("Show in folder")
        self.reveal.clicked.connect(self.show_in_folder)
        self._build_table()
        bar = QHBoxLayout()
        bar.addWidget(QLabel("Show"))
        bar.addWidget(self.category, 1)
        bar.addWidget(self.severity)
        bar.addWidget(self.reveal)
        col = QVBoxLayout(self)
        col.setContentsMargins(0, 0, 0, 0)
        col.addLayout(bar)
        col.addWidget(self.table, 1)
        self.reveal.setEnabled(False)

    def _build_table(self) -> None:
        self.table = QTableView()
        self.table.setModel(self.proxy)
        self.table.setSelectionBehavior(QAbstractItemView.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SingleSelection)
        self.table.setIconSize(QPixmap(THUMB_PX, THUMB_PX).size())
        self.table.verticalHeader().setDefaultSectionSize(THUMB_PX + 4)
        self.table.verticalHeader().hide()
        self.table.setSortingEnabled(True)
        self.table.sortByColumn(1, Qt.AscendingOrder)  # errors first; the proxy's sort is stable
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.Interactive)
        self.table.horizontalHeader().setStretchLastSection(True)
        self.table.setWordWrap(False)
        self.table.setTextElideMode(Qt.ElideMiddle)  # a long path keeps its file name visible
        for col, width in enumerate((170, 70, 300)):
            self.table.setColumnWidth(col, width)
        self.table.verticalScrollBar().valueChanged.connect(lambda _v: self._visible.start())
        self.table.selectionModel().currentRowChanged.connect(
            lambda *_: self.reveal.setEnabled(self.table.currentIndex().isValid()))
        self.table.doubleClicked.connect(lambda _i: self.show_in_folder())

    def set_report(self, r: DataReport, keep: bool = False) -> None:
        """A new report's findings, or (`keep`) the same report's after a recheck: the category stays."""
        self.thumbs.reset()
        self._stats.reset()
        self._asked.clear()
        shown = (self.category.currentData() or "") if keep else ""
        scrolled = self.table.verticalScrollBar().value() if keep else 0
        self.model.set_problems(r.problems)
        self.category.blockSignals(True)
        self.category.clear()
        self.category.addItem(f"all categories ({len(r.problems)})", "")
        for name, n in r.counts.items():
            self.category.addItem(f"{name} ({n})", name)
        self.category.setCurrentIndex(max(self.category.findData(shown), 0))
        self.category.blockSignals(False)
        self.proxy.set_category(self.category.currentData() or "")
        self.table.verticalScrollBar().setValue(scrolled)  # a recheck leaves the reader where they were
        self._visible.start()

    def _filter(self, setter, value: str) -> None:
        setter(value)
        self._visible.start()

    def current_problem(self):
        i = self.table.currentIndex()
        return self.model.problem(self.proxy.mapToSource(i).row()) if i.isValid() else None

    def show_in_folder(self) -> bool:
        p = self.current_problem()
        if p is None:
            return False
        return QDesktopServices.openUrl(QUrl.fromLocalFile(str(Path(p.path).parent)))

    def request_visible_thumbs(self) -> None:
        """Decode the thumbnails of the rows on screen that do not have one yet."""
        rows = self.proxy.rowCount()
        if rows == 0:
            return
        first = max(self.table.rowAt(0), 0)
        last = self.table.rowAt(self.table.viewport().height() - 1)
        last = rows - 1 if last < 0 else last
        todo = []
        for view_row in range(first, last + 1):
            row = self.proxy.mapToSource(self.proxy.index(view_row, 0)).row()
            path = self.model.problem(row).path
            if self.model.wants_thumb(row) and path not in self._asked:
                self._asked.add(path)
                todo.append(path)
        if todo:
            self._stats.submit(lambda: _regular_files(todo))

    def _on_stats(self, result: tuple) -> None:
        files, gone = result
        for path in gone:  # gone since the check, or a FIFO a decoder would block on: the placeholder
            self.model.set_thumb(path, None)
        if files:
            self.thumbs.request(files)

    def busy(self) -> bool:
        return self.thumbs.busy() or self._stats.busy()

    def _on_thumbs(self, result: list) -> None:
        for image, qimage in result:
            icon = None if qimage.isNull() else QIcon(QPixmap.fromImage(qimage))
            self.model.set_thumb(str(image.path), icon)


class DataPanel(QWidget):
    check_finished = Signal(int, str)  # exit code (-1 cancelled / crashed / not started), one line

    def __init__(self, command: Optional[Sequence[str]] = None, cache: Optional[ThumbCache] = None,
                 parent: Optional[QWidget] = None):
        """`command` replaces engine_argv() (tests run a stand-in); `cache`: thumbnails (default:
        the user's cache folder)."""
        super().__init__(parent)
        self._dmad = DmadCommand(self, program=command)
        self._dmad.progress.connect(self._on_progress)
        self._dmad.finished.connect(self._on_finished)
        self._checking = False  # from Check until the report is shown (or the check has failed)
        self._config_source: Optional[Path] = None
        self._resolution = Resources.model_fields["resolution"].default
        self._batch = 1
        self._per_process = 1  # batch x accumulation of the config
        self._processes = 1  # the Training panel's Processes box
        # the report's folder; a TemporaryDirectory is also removed when the panel goes mid-check
        self._tmp: Optional[tempfile.TemporaryDirectory] = None
        self._cancelled = False
        self._code = 0  # the exit code of the check whose report is being read
        self._report: Optional[DataReport] = None
        self._report_source: Optional[Path] = None  # the resolved source the report is of
        self._checked_source: Optional[Path] = None  # the resolved source of the running check
        self.findings = FindingsTable(cache or ThumbCache(px=THUMB_PX))
        self.findings.table.selectionModel().currentRowChanged.connect(lambda *_: self._on_problem())
        f = self.findings  # what tests and the window reach through the panel
        self.model, self.proxy, self.table, self.thumbs = f.model, f.proxy, f.table, f.thumbs
        self.category, self.severity = f.category, f.severity
        self._load = Task(self)  # a report of 100k problems is megabytes of JSON: parsed in a worker
        self._load.done.connect(self._on_loaded)
        self._load.failed.connect(lambda msg: self._end(self._code, msg.removeprefix("ValueError: "), error=True))
        self._flags: list[str] = []  # the last check's options, for the recheck of one image
        self.browser = DataBrowser(self.thumbs.cache.folder)
        self.rechecker = Rechecker(self, program=command)
        self.browser.caption_saved.connect(lambda item: self.rechecker.recheck(
            item, self.browser.options(item.dataset), self._flags))
        self.rechecker.done.connect(self._on_rechecked)
        self.rechecker.failed.connect(self.browser.rechecked)
        self._build()
        self._update_buttons()

    def _build(self) -> None:
        self.source_edit = QLineEdit()
        self.source_edit.setPlaceholderText("A folder of captioned images, or a dataset list (.json)")
        self.source_edit.textChanged.connect(lambda _t: self._update_buttons())
        self.min_size = QSpinBox()
        self.min_size.setRange(0, 8192)
        self.min_size.setSpecialValueText("default")
        self.min_size.setSuffix(" px")
        self.min_size.setToolTip("Images with a side below this are errors (default: the engine's)")
        self.buttons = {"reveal": self.findings.reveal}
        top = QHBoxLayout()
        top.addWidget(QLabel("Data:"))
        top.addWidget(self.source_edit, 1)
        for key, text, listing in (("folder", "Folder...", False), ("json", "Dataset list...", True)):
            top.addWidget(self._button(key, text, lambda _c=False, listing=listing: self._pick(listing)))
        top.addWidget(QLabel("min size"))
        top.addWidget(self.min_size)
        self.fast = QCheckBox("Fast")
        self.fast.setToolTip("Headers and file structure only (check-data --fast): corruption and truncation from "
                             "PNG chunk CRCs and JPEG markers, no pixel decoding, several times quicker; skips the "
                             "near-constant and near-duplicate checks")
        top.addWidget(self.fast)
        guard_wheel(self.min_size)
        top.addWidget(self._button("check", "Check", self.check))
        top.addWidget(self._button("cancel", "Cancel", self.cancel))
        self.progress = QProgressBar()
        self.progress.setRange(0, 1)
        self.progress.setValue(0)
        self.status = ElidedLabel("Not checked yet.")  # an engine line can be any length: never widens the window
        self.summary = QLabel("")
        self.summary.setWordWrap(True)
        self.batch_note = QLabel("")
        self.batch_note.setWordWrap(True)
        self.batch_note.setStyleSheet(f"color: {RED}; font-weight: bold")
        self.batch_note.hide()
        self.datasets = QLabel("")
        self.datasets.setWordWrap(True)
        self.datasets.setTextInteractionFlags(Qt.TextSelectableByMouse)
        self.summary.hide()  # shown with a report: empty, they would leave a gap above the table
        self.datasets.hide()
        lay = QVBoxLayout(self)
        lay.addLayout(top)
        lay.addWidget(self.progress)
        lay.addWidget(self.status)
        lay.addWidget(self.summary)
        lay.addWidget(self.batch_note)
        lay.addWidget(self.datasets)
        self.buckets = BucketPlot()
        self.pages = QTabWidget()
        self.pages.addTab(self.findings, "Findings")
        self.pages.addTab(self.buckets, "Buckets")
        split = QSplitter()
        split.addWidget(self.pages)
        split.addWidget(self.browser)
        split.setSizes([500, 600])
        split.setChildrenCollapsible(False)
        lay.addWidget(split, 1)

    def _button(self, key: str, text: str, slot) -> QPushButton:
        b = QPushButton(text)
        b.clicked.connect(slot)
        self.buttons[key] = b
        return b

    # ------------------------------------------------------------ the window's contract

    def set_config(self, raw: dict, base_dir: Optional[Path]) -> None:
        """The source follows the config's train_data_dir until the user picks another one."""
        new = data_dir_of(raw, base_dir)
        old_text = str(self._config_source) if self._config_source is not None else ""
        if self.source_edit.text() in ("", old_text):
            self.source_edit.setText(str(new) if new is not None else "")
            if new is not None and new != self._config_source and self._report is None:
                self.browser.set_source(str(new), [], [])  # browse before any check (findings come with one)
        self._config_source = new
        self._resolution = _resource(raw, "resolution")
        self._per_process = _resource(raw, "train_batch_size") * _resource(raw, "gradient_accumulation_steps")
        self._batch = self._per_process * self._processes
        self._show_usable()

    def set_processes(self, n: int) -> None:
        """The effective batch is batch x accumulation x processes."""
        self._processes = max(1, int(n))
        self._batch = self._per_process * self._processes
        self._show_usable()

    def start_warning(self) -> Optional[str]:
        """The question to ask before Start, when the last check of the config's data found errors."""
        r = self._report
        if r is None or self._config_source is None or not r.errors:
            return None
        if self._report_source != self._config_source.expanduser().resolve():
            return None
        return (f"The data check found {r.errors} errors in {self._config_source} ({r.usable} of {r.images} "
                "images usable; training skips the others).\n\nStart anyway?")

    def busy(self) -> bool:
        return self.is_checking() or self.findings.busy() or self.browser.busy() or self.rechecker.busy()

    # ------------------------------------------------------------ the check

    def source(self) -> Optional[Path]:
        text = self.source_edit.text().strip()
        return Path(text).expanduser() if text else None

    def effective_batch(self) -> int:
        return self._batch

    def report(self) -> Optional[DataReport]:
        return self._report

    def is_checking(self) -> bool:
        return self._checking

    def check_command(self, report_path: Path) -> Optional[list[str]]:
        args = self._check_args(report_path)
        return None if args is None else self._dmad.program() + args

    def _check_args(self, report_path: Path) -> Optional[list[str]]:
        source = self.source()
        if source is None:
            return None
        args = ["check-data", str(source), "--json", str(report_path), "--progress",
                "--resolution", str(self._resolution), "--batch", str(self._batch)]
        if self.min_size.value() > 0:
            args += ["--min-size", str(self.min_size.value())]
        if self.fast.isChecked():
            args.append("--fast")
        return args

    def check(self) -> None:
        if self._checking or self.source() is None:
            return
        self._tmp = tempfile.TemporaryDirectory(prefix="dmad-check-")
        args = self._check_args(Path(self._tmp.name) / "report.json")
        self._flags = ["--resolution", str(self._resolution)] + args[args.index("--batch") + 2:]  # min size, fast
        self._checking, self._cancelled = True, False
        self._checked_source = self.source().resolve()
        self.progress.setRange(0, 0)  # busy until the first progress line says how many
        self._set_status(f"Checking {self.source()} ...")
        self._update_buttons()
        self._dmad.start(args)

    def cancel(self) -> None:
        if self._dmad.is_running():  # not once it is reading the report
            self._cancelled = True
            self._dmad.kill()

    def _on_progress(self, done: int, total: int) -> None:
        self.progress.setRange(0, max(total, 1))
        self.progress.setValue(min(done, max(total, 1)))

    def _on_finished(self, code: int, line: str) -> None:
        if not self._checking:
            return
        if self._cancelled:
            self._end(-1, "Check cancelled.", error=False)
            return
        report_path = Path(self._tmp.name) / "report.json" if self._tmp else None
        if code not in (0, 1) or report_path is None or not report_path.is_file():
            self._end(code, line or f"dmad check-data exited with code {code}", error=True)
            return
        self._code = code
        self._load.submit(lambda: load_report(report_path))

    def _on_loaded(self, report: DataReport) -> None:
        self._report, self._report_source = report, self._checked_source
        self._show_report(report)
        self.rechecker.reset()
        self.browser.set_source(report.source, report.problems, list(report.counts))
        self._end(self._code, self._outcome(report), error=False)

    def _on_rechecked(self, found: Recheck) -> None:
        """One image checked again after its caption was saved: its findings and the counts follow."""
        if self.browser.item_of(found.image) is None:
            return
        if self._report is None:  # browsing before any check: the caption is saved, findings come with a check
            self.browser.rechecked(found.image)
            return
        self._report = merge_recheck(self._report, found)
        self._show_report(self._report, keep=True)
        self.browser.set_findings(self._report.problems, list(self._report.counts))
        self.browser.rechecked(found.image)
        self._set_status(self._outcome(self._report))

    def _end(self, code: int, text: str, error: bool) -> None:
        self._checking = False
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None
        self.progress.setRange(0, 1)
        self.progress.setValue(1 if code in (0, 1) else 0)
        self._set_status(text, error)
        self._update_buttons()
        self.check_finished.emit(code, text)

    def _set_status(self, text: str, error: bool = False) -> None:
        self.status.setStyleSheet(f"color: {RED}" if error else "")
        self.status.setText(text)

    @staticmethod
    def _outcome(r: DataReport) -> str:
        skipped = (f" Fast check: {', '.join(r.skipped_checks)} not checked." if r.skipped_checks else "")
        if r.clean:
            return f"Clean: {r.images} images, no problems found.{skipped}"
        return f"{r.errors} errors and {r.warnings} warnings in {r.images} images ({r.usable} usable).{skipped}"

    # ------------------------------------------------------------ results

    def _show_report(self, r: DataReport, keep: bool = False) -> None:
        """A new report, or (`keep`) the same one after a recheck: the category shown stays."""
        self.findings.set_report(r, keep)
        # A word-wrapped label cannot break a path: a long root would set the window's minimum width
        lines = [f"<b>{html.escape(d.get('id', '?'))}</b>: {d.get('images', 0)} images, {d.get('usable', 0)} usable, "
                 f"{d.get('captions', 0)} captions &nbsp; "
                 f"<span style='color:gray'>{html.escape(_middle(str(d.get('root', '')), PATH_CHARS))}</span>"
                 for d in r.datasets]
        self.datasets.setText("<br>".join(lines))
        self.datasets.setVisible(bool(lines))
        self.datasets.setToolTip("\n".join(f"{d.get('id', '?')}: {d.get('root', '')}" for d in r.datasets))
        self.buckets.set_buckets(r.buckets, r.images, r.counts)
        self._show_usable()

    def _show_usable(self) -> None:
        r = self._report
        if r is None:
            self.summary.setText("")
            self.summary.hide()
            self.batch_note.hide()
            return
        procs = f" x {self._processes} processes" if self._processes > 1 else ""
        self.summary.setText(f"Usable images {r.usable} (of {r.images}) against the effective batch {self._batch} "
                             f"of the current config (train_batch_size x gradient_accumulation_steps{procs}).")
        self.summary.show()
        short = r.usable < self._batch
        self.batch_note.setText(f"Fewer usable images ({r.usable}) than the effective batch ({self._batch}): "
                                "training cannot fill one batch. Fix the errors or lower the batch." if short else "")
        self.batch_note.setVisible(short)

    def _on_problem(self) -> None:
        """A finding selected: its image in the browser."""
        p = self.findings.current_problem()
        if p is not None:
            self.browser.show_path(p.path)

    def _update_buttons(self) -> None:
        running = self._checking
        self.buttons["check"].setEnabled(not running and self.source() is not None)
        self.buttons["cancel"].setEnabled(running)
        for key in ("folder", "json"):
            self.buttons[key].setEnabled(not running)

    def show_in_folder(self) -> bool:
        return self.findings.show_in_folder()

    def _pick(self, listing: bool) -> None:
        text = self.source_edit.text()
        path = (QFileDialog.getOpenFileName(self, "Dataset list", text, "Dataset list (*.json)")[0] if listing
                else QFileDialog.getExistingDirectory(self, "Dataset folder", text))
        if path:
            self.source_edit.setText(path)
