"""The Runs panel: every run folder under a root, its state, key fields and last metrics.

Scans run in a one-thread pool (app.models.run_scan) every REFRESH_MS while the panel is visible, on
demand, and whenever the state of the run the Training panel shows changes (watch); the table model
only ever receives plain rows. Opening a run, continuing one that is not live, comparing two configs
and revealing a folder are buttons; the shell remembers the root (root_changed), opens runs
(run_opened) and continues them (continue_requested). What Continue will do (go on from iteration N,
or start again from 0) comes from the scan (RunRow.resume_from), never from a read here.
"""
from __future__ import annotations

import time
from datetime import datetime
from pathlib import Path
from typing import Any, Optional

from PySide6.QtCore import (QAbstractTableModel, QModelIndex, QObject, QSortFilterProxyModel, Qt,
                            QThreadPool, QTimer, QUrl, Signal)
from PySide6.QtGui import QColor, QDesktopServices, QIcon, QPainter, QPixmap
from PySide6.QtWidgets import (QAbstractItemView, QFileDialog, QHBoxLayout, QHeaderView, QLabel,
                               QLineEdit, QPushButton, QTableView, QVBoxLayout, QWidget)

from app.dialogs.config_diff import ConfigDiffDialog
from app.engine.background import Task
from app.models.resume import CONTINUABLE, continue_text
from app.models.run_scan import RunRow, ScanCache, ScanResult, scan_or_error
from app.models.run_state import RunState
from app.widgets.run_controls import reserve_width

REFRESH_MS = 2000
STATE_COLOURS = {
    "running": QColor(46, 160, 67), "paused": QColor(210, 153, 34), "stopping": QColor(210, 153, 34),
    "stopped": QColor(120, 120, 120), "finished": QColor(45, 110, 200), "created": QColor(150, 150, 150),
    "failed": QColor(207, 34, 46), "error": QColor(207, 34, 46), "not a run": QColor(150, 150, 150),
}
COLUMNS = ("Name", "Status", "Iteration", "Last checkpoint", "Started", "Teacher", "Dataset",
           "Prompt set", "Student steps", "Batch", "Learning rates (G / C)", "Last losses", "Updated")
NUMERIC = {"Iteration", "Last checkpoint", "Started", "Student steps", "Batch", "Updated"}
SORT_ROLE = Qt.ItemDataRole.UserRole + 1


def _age(seconds: Optional[float]) -> str:
    if seconds is None:
        return ""
    seconds = max(0.0, seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f} {unit} ago"
    return f"{seconds:.0f} s ago"


def _losses(metrics: dict[str, Optional[float]]) -> str:
    return "  ".join(f"{k[5:]} {v:.4g}" for k, v in metrics.items() if k.startswith("loss_") and v is not None)


def _lr(x: Optional[float]) -> str:
    return "?" if x is None else f"{x:g}"


def _cell(row: RunRow, column: str) -> tuple[str, Any]:
    """(display text, sort key) of one cell; sort keys are numbers or lower-case text."""
    if column == "Name":
        return row.name, row.name.lower()
    if column == "Status":
        return row.state, row.state
    if column == "Iteration":
        text = "" if row.iter is None else f"{row.iter} / {row.max_steps if row.max_steps else '?'}"
        return text, -1 if row.iter is None else row.iter
    if column == "Last checkpoint":
        return ("" if row.last_checkpoint is None else f"iter {row.last_checkpoint}",
                -1 if row.last_checkpoint is None else row.last_checkpoint)
    if column == "Started":
        text = "" if row.started is None else datetime.fromtimestamp(row.started).strftime("%Y-%m-%d %H:%M")
        return text, row.started or 0.0
    if column == "Student steps":
        return ("" if row.student_steps is None else str(row.student_steps)), row.student_steps or 0
    if column == "Batch":
        return ("" if row.batch is None else str(row.batch)), row.batch or 0
    if column == "Learning rates (G / C)":
        text = "" if row.config is None else f"{_lr(row.generator_lr)} / {_lr(row.critic_lr)}"
        return text, row.generator_lr or 0.0
    if column == "Last losses":
        text = _losses(row.metrics)
        return text, text
    if column == "Updated":
        return _age(row.age_s), float("inf") if row.age_s is None else row.age_s
    text = {"Teacher": row.teacher, "Dataset": row.dataset, "Prompt set": row.prompt_set}[column]
    return text, text.lower()


def _tooltip(row: RunRow, column: str) -> str:
    if column == "Status":
        return row.reason or row.state
    if column == "Name":
        return str(row.path) + (f"\n{row.reason}" if row.reason and row.state != "failed" else "")
    if column == "Last losses" and row.metrics:
        return "\n".join(f"{k}: {v:.6g}" if v is not None else f"{k}: -" for k, v in row.metrics.items())
    if column == "Batch" and row.batch is not None:
        per_step, accumulation = row.batch_parts
        return f"{per_step} per step x {accumulation} accumulation steps"
    if column == "Teacher" and row.config:
        return str(row.config.get("identity", {}).get("pretrained_model_name_or_path", ""))
    return _cell(row, column)[0]


def _state_icon(state: str, cache: dict[str, QIcon]) -> QIcon:
    if state not in cache:
        pixmap = QPixmap(12, 12)
        pixmap.fill(Qt.GlobalColor.transparent)
        painter = QPainter(pixmap)
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        painter.setBrush(STATE_COLOURS.get(state, QColor(150, 150, 150)))
        painter.setPen(Qt.PenStyle.NoPen)
        painter.drawEllipse(1, 1, 10, 10)
        painter.end()
        cache[state] = QIcon(pixmap)
    return cache[state]


class RunsTableModel(QAbstractTableModel):
    """Rows as the last scan found them; an unchanged list of folders updates cells in place."""

    def __init__(self, parent: Optional[QObject] = None):
        super().__init__(parent)
        self._rows: list[RunRow] = []
        self._icons: dict[str, QIcon] = {}

    def rows(self) -> list[RunRow]:
        return list(self._rows)

    def set_rows(self, rows: list[RunRow]) -> None:
        if [r.path for r in rows] == [r.path for r in self._rows] and rows:
            self._rows = rows
            self.dataChanged.emit(self.index(0, 0), self.index(len(rows) - 1, len(COLUMNS) - 1))
            return
        self.beginResetModel()
        self._rows = rows
        self.endResetModel()

    def rowCount(self, parent: QModelIndex = QModelIndex()) -> int:
        return 0 if parent.isValid() else len(self._rows)

    def columnCount(self, parent: QModelIndex = QModelIndex()) -> int:
        return 0 if parent.isValid() else len(COLUMNS)

    def headerData(self, section: int, orientation: Qt.Orientation, role: int = Qt.ItemDataRole.DisplayRole):
        if orientation == Qt.Orientation.Horizontal and role == Qt.ItemDataRole.DisplayRole:
            return COLUMNS[section]
        return None

    def data(self, index: QModelIndex, role: int = Qt.ItemDataRole.DisplayRole):
        if not index.isValid():
            return None
        row, column = self._rows[index.row()], COLUMNS[index.column()]
        if role == Qt.ItemDataRole.DisplayRole:
            return _cell(row, column)[0]
        if role == SORT_ROLE:
            return _cell(row, column)[1]
        if role == Qt.ItemDataRole.ToolTipRole:
            return _tooltip(row, column)
        if column == "Status" and role == Qt.ItemDataRole.DecorationRole:
            return _state_icon(row.state, self._icons)
        if column == "Status" and role == Qt.ItemDataRole.ForegroundRole:
            return STATE_COLOURS.get(row.state)
        if column in NUMERIC and role == Qt.ItemDataRole.TextAlignmentRole:
            return int(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        return None


class RunsPanel(QWidget):
    """Root chooser, runs table and the actions on the selected runs."""

    run_opened = Signal(Path)    # a run folder to show in the Training panel
    continue_requested = Signal(Path)  # a stopped or failed run folder to show and continue there
    root_changed = Signal(Path)  # the shell remembers it (QSettings)
    runs_scanned = Signal(int)   # a scan's rows are in the table (row count)

    def __init__(self, root: Path, parent: Optional[QWidget] = None, cache: Optional[ScanCache] = None,
                 refresh_ms: int = REFRESH_MS):
        super().__init__(parent)
        self._root = Path(root).expanduser()
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
        self.model = RunsTableModel(self)
        self.proxy = QSortFilterProxyModel(self)
        self.proxy.setSourceModel(self.model)
        self.proxy.setSortRole(SORT_ROLE)
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
        self.message = QLabel()
        self.message.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        top, actions, layout = QHBoxLayout(), QHBoxLayout(), QVBoxLayout(self)
        for w in (QLabel("Runs folder:"), self.root_edit, browse):
            top.addWidget(w)
        for w in (self.refresh_button, self.open_button, self.continue_button, self.compare_button,
                  self.reveal_button):
            actions.addWidget(w)
        actions.addStretch(1)
        layout.addLayout(top)
        layout.addWidget(self.table, 1)
        layout.addLayout(actions)
        layout.addWidget(self.message)
        self._update_buttons()

    def _make_table(self) -> QTableView:
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
        """Rescan when the shown run starts, pauses or ends: its row changes then."""
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
        root, rows = result.root, result.rows
        self._scanning = False
        if root == self._root:
            selected = [r.path for r in self.selected_rows()]
            self.model.set_rows(rows)
            if selected and [r.path for r in self.selected_rows()] != selected:
                self.select_paths(selected)  # a reset model lost the selection
            self._update_buttons()  # the selected run's state or checkpoints may have changed
            self._show_summary(rows)
            self.runs_scanned.emit(len(rows))
        if self._rescan or root != self._root:
            self.refresh()

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
