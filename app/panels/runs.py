"""The Runs panel: every run folder under a root, its state, key fields and last metrics.

Scans run in a one-thread pool (app.models.run_scan) every REFRESH_MS while the panel is visible, on
demand, and whenever the state of the run the Training panel shows changes (watch); the table model
only ever receives plain rows. Opening a run, continuing one that is not live, comparing two configs
and revealing a folder are buttons; the shell remembers the root (root_changed), opens runs
(run_opened) and continues them (continue_requested). What Continue will do (go on from iteration N,
or start again from 0) comes from the scan (RunRow.resume_from), never from a read here.

Delete (to the trash), Rename, Note and Export act through app/dialogs/run_actions.py, never on a live
run; the shell hears of a renamed or deleted folder (run_renamed, run_deleted). The filter box keeps
the rows whose any cell holds its text. The run the Training panel shows is listed in the state that
panel knows: a Stop it sent shows "stopping" before the engine has read it.
"""
from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Optional, Sequence

from PySide6.QtCore import QModelIndex, QSortFilterProxyModel, Qt, QThreadPool, QTimer, QUrl, Signal
from PySide6.QtGui import QDesktopServices
from PySide6.QtWidgets import (QAbstractItemView, QFileDialog, QHBoxLayout, QHeaderView, QLabel,
                               QLineEdit, QPushButton, QTableView, QVBoxLayout, QWidget)

from app.dialogs.config_diff import ConfigDiffDialog
from app.dialogs.run_actions import RunFileActions
from app.engine.background import Task
from app.models.run_files import FileResult
from app.models.resume import CONTINUABLE, continue_text
from app.models.run_scan import RunRow, ScanCache, ScanResult, scan_or_error
from app.models.runs_table import COLUMNS, SORT_ROLE, RunsTableModel
from app.models.run_state import RunState
from app.widgets.elided_label import ElidedLabel
from app.widgets.run_controls import reserve_width
from dmad.contract.runs import LIVE_STATES

REFRESH_MS = 2000
NOTE_WIDTH = 260  # px: a long note is the tooltip's; the columns after it stay in view
NOTICE_S = 30.0  # an action's one line stays ahead of the scan summary this long


class RunsPanel(QWidget):
    """Root chooser, runs table and the actions on the selected runs."""

    run_opened = Signal(Path)    # a run folder to show in the Training panel
    continue_requested = Signal(Path)  # a stopped or failed run folder to show and continue there
    root_changed = Signal(Path)  # the shell remembers it (QSettings)
    runs_scanned = Signal(int)   # a scan's rows are in the table (row count)
    run_renamed = Signal(Path, Path)  # (old folder, new folder)
    run_deleted = Signal(Path)   # moved to the trash or deleted

    def __init__(self, root: Path, parent: Optional[QWidget] = None, cache: Optional[ScanCache] = None,
                 refresh_ms: int = REFRESH_MS, engine_command: Optional[Sequence[str]] = None):
        """`engine_command` replaces the `dmad` command line for Export (tests run a stand-in)."""
        super().__init__(parent)
        self._root = Path(root).expanduser()
        self._watched: Optional[RunState] = None  # the Training panel's run: its state is the freshest
        self._texts: Optional[list[tuple[str, ...]]] = None  # each column's texts when last fitted
        self._notice = ("", 0.0)  # what the last action did, kept ahead of the summary for NOTICE_S
        self._reselect: Optional[Path] = None  # a renamed run: selected again under its new name
        self.actions = RunFileActions(self, engine_command)
        self.actions.done.connect(self._on_file_action)
        # Pool before the task: a child is destroyed after the ones created before it, and the
        # pool's destructor waits for a running scan that may still answer through the task.
        self._pool = QThreadPool(self)
        self._pool.setMaxThreadCount(1)  # one scan at a time: the cache is not shared between threads
        self._scan = Task(self, self._pool)
        self._scan.done.connect(self._on_scanned)
        self._cache = cache if cache is not None else ScanCache()
        self._scanning = self._rescan = False
        self._timer = QTimer(self)
        self._timer.setInterval(refresh_ms)
        self._timer.timeout.connect(self.refresh)
        self._build()
        self.refresh()

    def _build(self) -> None:
        self.root_edit = QLineEdit(str(self._root))
        self.root_edit.setToolTip("The folder that holds the run folders (identity.output_dir)")
        self.root_edit.editingFinished.connect(self._root_edited)
        browse = QPushButton("Browse...")
        browse.clicked.connect(self._browse)
        self.filter_edit = QLineEdit(placeholderText="Filter: name, note, state, teacher…", clearButtonEnabled=True)
        self.filter_edit.textChanged.connect(self._filter_changed)
        self.table = self._make_table()
        self.refresh_button = QPushButton("Refresh")
        self.refresh_button.clicked.connect(self.refresh)
        self.open_button = QPushButton("Open")
        self.open_button.clicked.connect(self._open_selected)
        self.continue_button = QPushButton("Continue")
        self.continue_button.clicked.connect(self._continue_selected)
        reserve_width(self.continue_button)
        self.compare_button = QPushButton("Compare configs")
        self.compare_button.setToolTip("Select exactly two runs")
        self.compare_button.clicked.connect(self._compare_selected)
        self.reveal_button = QPushButton("Reveal in file manager")
        self.reveal_button.clicked.connect(self._reveal)
        self._build_file_buttons()
        self.message = ElidedLabel()
        top, actions, layout = QHBoxLayout(), QHBoxLayout(), QVBoxLayout(self)
        for w in (QLabel("Runs folder:"), self.root_edit, browse, QLabel("Filter:"), self.filter_edit):
            top.addWidget(w)
        top.setStretch(1, 3)
        top.setStretch(4, 2)
        for w in (self.refresh_button, self.open_button, self.continue_button, self.compare_button,
                  self.reveal_button, self.note_button, self.rename_button, self.export_button, self.delete_button):
            actions.addWidget(w)
        actions.addStretch(1)
        layout.addLayout(top)
        layout.addWidget(self.table, 1)
        layout.addLayout(actions)
        layout.addWidget(self.message)
        self._update_buttons()

    def _build_file_buttons(self) -> None:
        self.note_button = QPushButton("Note…")
        self.note_button.setToolTip("Your own words about the run, kept in its folder as note.txt")
        self.note_button.clicked.connect(lambda: self._on_one(lambda r: self.actions.note(r.path, r.note)))
        self.rename_button = QPushButton("Rename…")
        self.rename_button.clicked.connect(lambda: self._on_one(lambda r: self.actions.rename(self._root, r.path)))
        self.export_button = QPushButton("Export…")
        self.export_button.clicked.connect(lambda: self._on_one(lambda r: self.actions.export(r.path, _lora(r))))
        self.delete_button = QPushButton("Delete…")
        self.delete_button.clicked.connect(self._delete_selected)

    def _make_table(self) -> QTableView:
        self.model = RunsTableModel(self)
        self.proxy = QSortFilterProxyModel(self)
        self.proxy.setSourceModel(self.model)
        self.proxy.setSortRole(SORT_ROLE)
        self.proxy.setFilterKeyColumn(-1)  # any column: a name, a note, a state, a teacher
        self.proxy.setFilterCaseSensitivity(Qt.CaseSensitivity.CaseInsensitive)
        table = QTableView()
        table.setModel(self.proxy)
        table.setSortingEnabled(True)
        table.sortByColumn(COLUMNS.index("Started"), Qt.SortOrder.DescendingOrder)
        table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        table.setSelectionMode(QAbstractItemView.SelectionMode.ExtendedSelection)
        table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        table.verticalHeader().setVisible(False)
        table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.Interactive)
        table.horizontalHeader().setStretchLastSection(True)
        table.doubleClicked.connect(lambda index: self._open_row(self._row_at(index)))
        table.selectionModel().selectionChanged.connect(self._update_buttons)
        return table

    # -------------------------------------------------------- public API

    def root(self) -> Path:
        return self._root

    def set_root(self, path: Path) -> None:
        path = Path(path).expanduser()
        self.root_edit.setText(str(path))
        if path == self._root:
            return
        self._root = path
        self.model.set_rows([])
        self.root_changed.emit(path)
        self.refresh()

    def refresh(self) -> None:
        """Start a scan now; one already running is followed by another (the files may have changed)."""
        if self._scanning:
            self._rescan = True
            return
        self._scanning, self._rescan = True, False
        root, cache = self._root, self._cache
        self._scan.submit(lambda: scan_or_error(root, cache))

    def watch(self, state: RunState) -> None:
        """Rescan when the shown run starts, pauses or ends: its row changes then. Its state is shown
        as that run's row state while it is stopping (the engine says so only once at its boundary)."""
        self._watched = state
        state.state_changed.connect(self._on_run_state)

    def _on_run_state(self, _state: str) -> None:
        self.refresh()

    def rows(self) -> list[RunRow]:
        """The rows in the table, in the model's order (not the view's sort)."""
        return self.model.rows()

    def selected_rows(self) -> list[RunRow]:
        indexes = self.table.selectionModel().selectedRows()
        return [r for r in (self._row_at(i) for i in indexes) if r is not None]

    def select_paths(self, paths: list[Path]) -> None:
        """Select these run folders (the others are deselected)."""
        selection = self.table.selectionModel()
        selection.clearSelection()
        wanted = set(paths)
        for source_row, row in enumerate(self.model.rows()):
            if row.path in wanted:
                index = self.proxy.mapFromSource(self.model.index(source_row, 0))
                selection.select(index, selection.SelectionFlag.Select | selection.SelectionFlag.Rows)

    # -------------------------------------------------------- scanning

    def showEvent(self, event) -> None:
        super().showEvent(event)
        self._timer.start()  # only while visible: a hidden table needs no fresh ages
        self.refresh()

    def hideEvent(self, event) -> None:
        super().hideEvent(event)
        self._timer.stop()

    def _on_scanned(self, result: ScanResult) -> None:
        if result.error:
            self._on_scan_failed(result.root, result.error)
            return
        root, rows = result.root, [self._as_known(r) for r in result.rows]
        self._scanning = False
        if root == self._root:
            selected = [r.path for r in self.selected_rows()]
            reset = self.model.set_rows(rows)
            if self._reselect is not None:
                selected, self._reselect = [self._reselect], None
            if selected and [r.path for r in self.selected_rows()] != selected:
                self.select_paths(selected)  # a reset model lost the selection
            self._fit_columns(reset)
            self._update_buttons()  # the selected run's state or checkpoints may have changed
            self._show_summary(rows)
            self.runs_scanned.emit(len(rows))
        if self._rescan or root != self._root:
            self.refresh()

    def _as_known(self, row: RunRow) -> RunRow:
        """The shown run's row in the state the Training panel knows: a Stop it sent is "stopping"
        while status.json still says running (the engine writes "stopping" at its boundary)."""
        w = self._watched
        if w is not None and w.state == "stopping" and w.run_dir == row.path and row.state in ("running", "paused"):
            return dataclasses.replace(row, state="stopping")
        return row

    def _fit_columns(self, reset: bool) -> None:
        """Fit each column whose texts changed since the last scan to its header and cells, so a state
        that becomes "finished" or "stopping", a later iteration or a longer name is never elided (the
        columns were once fitted to the first rows only). After a reset (runs came or went, another
        root) the changed columns fit exactly; an in-place update only widens a column that no longer
        fits, so a live run's losses and ages do not make the columns jitter every scan. A column whose
        texts did not change keeps the user's width. Note stops at NOTE_WIDTH (its tooltip has the
        rest); the last column stays stretched, its fitted width its minimum when the table is narrow."""
        texts = self.model.column_texts()
        before, self._texts = self._texts, texts
        header, note = self.table.horizontalHeader(), COLUMNS.index("Note")
        for column, cells in enumerate(texts):
            if before is not None and before[column] == cells:
                continue
            wanted = max(self.table.sizeHintForColumn(column), header.sectionSizeHint(column))
            if column == note:
                wanted = min(wanted, NOTE_WIDTH)
            if reset or before is None or header.sectionSize(column) < wanted:
                header.resizeSection(column, wanted)

    def _on_scan_failed(self, root: Path, message: str) -> None:
        self._scanning = False
        if root == self._root:
            self.model.set_rows([])
            self.message.setText(message)
            self.runs_scanned.emit(0)
        if self._rescan or root != self._root:
            self.refresh()

    def _show_summary(self, rows: list[RunRow]) -> None:
        runs = [r for r in rows if r.is_run]
        live = sum(r.state in ("running", "paused", "stopping") for r in runs)
        failed = sum(r.state == "failed" for r in runs)
        problems = sum(r.state == "error" for r in runs)
        parts = [f"{len(runs)} runs", f"{live} live", f"{failed} failed"]
        if problems:
            parts.append(f"{problems} unreadable (see the Status tooltips)")
        others = len(rows) - len(runs)
        if others:
            parts.append(f"{others} other folder{'s' if others > 1 else ''} (not runs)")
        notice, at = self._notice
        if notice and time.monotonic() - at < NOTICE_S:
            parts.insert(0, notice)
        self.message.setText(" · ".join(parts) + time.strftime(" · checked %H:%M:%S"))

    # -------------------------------------------------------- actions

    def _row_at(self, index: QModelIndex) -> Optional[RunRow]:
        if not index.isValid():
            return None
        rows = self.model.rows()
        source = self.proxy.mapToSource(index).row()
        return rows[source] if 0 <= source < len(rows) else None

    def _update_buttons(self) -> None:
        rows = self.selected_rows()
        self.open_button.setEnabled(len(rows) == 1 and rows[0].is_run)
        row = rows[0] if len(rows) == 1 and rows[0].is_run else None
        state = row.state if row is not None else ""
        text, tip = continue_text(state, row.resume_from if row is not None else None, True)
        self.continue_button.setText(text)
        self.continue_button.setToolTip(tip + ("" if row is not None else " (select one run)"))
        self.continue_button.setEnabled(state in CONTINUABLE)
        self.compare_button.setEnabled(len(rows) == 2)
        self.reveal_button.setEnabled(len(rows) <= 1)
        busy = [r for r in rows if self._is_live(r)]
        for button in (self.rename_button, self.delete_button):
            button.setEnabled(bool(rows) and not busy and (button is self.delete_button or len(rows) == 1))
            button.setToolTip(f"{busy[0].name} is {busy[0].state}: stop it first" if busy else
                              "Move the selected runs to the trash (asks first)" if button is self.delete_button
                              else "Give the selected run's folder a new name")
        self.note_button.setEnabled(row is not None)
        self.export_button.setEnabled(row is not None and (row.last_checkpoint is not None
                                                           or row.resume_from is not None))
        self.export_button.setToolTip("Export the student of a checkpoint: diffusers, or LoRA for a LoRA student"
                                      if self.export_button.isEnabled() else "Select one run with a checkpoint")

    def _is_live(self, row: RunRow) -> bool:
        w = self._watched
        return row.state in LIVE_STATES or (w is not None and w.is_live() and w.run_dir == row.path)

    def _root_edited(self) -> None:
        text = self.root_edit.text().strip()
        if text:
            self.set_root(Path(text))
        else:  # an empty path would mean the current directory: put the root back
            self.root_edit.setText(str(self._root))

    def _browse(self) -> None:
        chosen = QFileDialog.getExistingDirectory(self, "Runs folder", str(self._root))
        if chosen:
            self.set_root(Path(chosen))

    def _open_selected(self) -> None:
        rows = self.selected_rows()
        if len(rows) == 1:
            self._open_row(rows[0])

    def _open_row(self, row: Optional[RunRow]) -> None:
        if row is None:
            return
        if not row.is_run:
            self.message.setText(f"{row.name}: {row.reason}")
            return
        self.run_opened.emit(row.path)

    def _continue_selected(self) -> None:
        rows = self.selected_rows()
        if len(rows) == 1 and rows[0].is_run and rows[0].state in CONTINUABLE:
            self.continue_requested.emit(rows[0].path)

    def _compare_selected(self) -> None:
        rows = self.selected_rows()
        if len(rows) != 2:
            self.message.setText("Select exactly two runs to compare their configs")
            return
        missing = [r for r in rows if r.config is None]
        if missing:
            r = missing[0]
            self.message.setText(f"{r.name} has no readable config.json" + (f": {r.reason}" if r.reason else ""))
            return
        a, b = rows
        dialog = ConfigDiffDialog(a.name, a.config or {}, b.name, b.config or {}, self)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.open()

    def _reveal(self) -> None:
        rows = self.selected_rows()
        target = rows[0].path if len(rows) == 1 else self._root
        if not QDesktopServices.openUrl(QUrl.fromLocalFile(str(target))):
            self.message.setText(f"No file manager could open {target}")

    def _filter_changed(self, text: str) -> None:
        self.proxy.setFilterFixedString(text.strip())
        self._update_buttons()

    def _on_one(self, action) -> None:
        rows = self.selected_rows()
        if len(rows) == 1 and rows[0].is_run:
            action(rows[0])

    def _delete_selected(self) -> None:
        rows = self.selected_rows()
        busy = [r for r in rows if self._is_live(r)]
        if busy:  # the button is off for these; the table may have changed since
            self.message.setText(f"{busy[0].name} is {busy[0].state}: stop it before you delete it")
            return
        self.actions.delete([r.path for r in rows])

    def _on_file_action(self, result: FileResult) -> None:
        self._notice = (result.message, time.monotonic())
        self.message.setText(result.message)
        if result.ok and result.kind == "rename" and result.new_path is not None:
            self._reselect = result.new_path
            self.run_renamed.emit(result.path, result.new_path)
        elif result.ok and result.kind in ("trash", "delete"):
            self.run_deleted.emit(result.path)
        self.refresh()


def _lora(row: RunRow) -> bool:
    identity = (row.config or {}).get("identity")
    return isinstance(identity, dict) and identity.get("student") == "lora"
