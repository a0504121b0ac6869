"""The Runs table: one plain RunRow (app/models/run_scan.py) per line, as a Qt table model.

Each cell has its display text, a sort key (numbers sort as numbers, text without case) and a tooltip;
the Name and Note tooltips carry the whole name, the path and the note, so runs whose names differ
only in the middle never look alike. Rows are replaced in place while the list of folders stays the
same, so a rescan keeps the selection and the scroll position.
"""
from __future__ import annotations

from datetime import datetime
from typing import Any, Optional

from PySide6.QtCore import QAbstractTableModel, QModelIndex, QObject, Qt
from PySide6.QtGui import QColor, QIcon, QPainter, QPixmap

from app.models.methods import EMPTY_COLUMNS, WHAT, is_unused, label, short_name, unused_note
from app.models.run_scan import RunRow

STATE_COLOURS = {
    "running": QColor(46, 160, 67), "paused": QColor(210, 153, 34), "stopping": QColor(210, 153, 34),
    "stopped": QColor(120, 120, 120), "finished": QColor(45, 110, 200), "created": QColor(150, 150, 150),
    "failed": QColor(207, 34, 46), "error": QColor(207, 34, 46), "not a run": QColor(150, 150, 150),
}
COLUMNS = ("Name", "Status", "Note", "Iteration", "Last checkpoint", "Started", "Teacher", "Dataset",
           "Prompt set", "Method", "Student steps", "Batch", "Learning rates (G / C)", "Last losses", "Updated")
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


def _critic_unused(row: RunRow) -> bool:
    """The run's method trains no critic: its critic_lr is a kept, unread value."""
    return is_unused(row.method, "optimization.critic_lr")


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
    if column == "Method":
        text = short_name(row.method) if row.method else ""
        return text, text.lower()
    if column == "Learning rates (G / C)":
        critic = "-" if _critic_unused(row) else _lr(row.critic_lr)
        text = "" if row.config is None else f"{_lr(row.generator_lr)} / {critic}"
        return text, row.generator_lr or 0.0
    if column == "Last losses":
        text = _losses(row.metrics)
        return text, text
    if column == "Updated":
        return _age(row.age_s), float("inf") if row.age_s is None else row.age_s
    if column == "Note":
        first = row.note.splitlines()[0] if row.note else ""  # one line in the table, all of it in the tooltip
        return first, row.note.lower()
    text = {"Teacher": row.teacher, "Dataset": row.dataset, "Prompt set": row.prompt_set}[column]
    return text, text.lower()


def _tooltip(row: RunRow, column: str) -> str:
    if column == "Status":
        return row.reason or row.state
    if column in ("Name", "Note"):  # a note is the user's own name for a run: both say both
        return (row.name + "\n" + str(row.path) + (f"\n{row.reason}" if row.reason and row.state != "failed" else "")
                + (f"\n\nNote: {row.note}" if row.note else ""))
    if column == "Last losses" and row.metrics:
        other = EMPTY_COLUMNS.get(row.method, ())  # the other method's columns, always empty here
        return "\n".join(f"{k}: {v:.6g}" if v is not None else f"{k}: -" for k, v in row.metrics.items()
                         if v is not None or k not in other)
    if column == "Batch" and row.batch is not None:
        per_step, accumulation = row.batch_parts
        return f"{per_step} per step x {accumulation} accumulation steps"
    if column == "Method" and row.method:
        return f"{label(row.method)}: {WHAT[row.method]}" if row.method in WHAT else row.method
    if column == "Learning rates (G / C)" and _critic_unused(row):
        return (f"generator (student) {_lr(row.generator_lr)}; no critic with method {row.method} "
                f"(critic_lr {_lr(row.critic_lr)}: {unused_note(row.method)})")
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

    def set_rows(self, rows: list[RunRow]) -> bool:
        """Replace the rows; True when the model was reset (other folders), False when the same folders'
        cells were updated in place (the view then fits only columns that no longer fit: no jitter)."""
        if [r.path for r in rows] == [r.path for r in self._rows] and rows:
            self._rows = rows
            self.dataChanged.emit(self.index(0, 0), self.index(len(rows) - 1, len(COLUMNS) - 1))
            return False
        self.beginResetModel()
        self._rows = rows
        self.endResetModel()
        return True

    def column_texts(self) -> list[tuple[str, ...]]:
        """Each column's display texts, top to bottom: what the view compares to know which columns changed."""
        return [tuple(_cell(row, column)[0] for row in self._rows) for column in COLUMNS]

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
