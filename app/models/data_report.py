"""The report of `dmad check-data --json` as the Data panel shows it: the parsed report, the problems
table model and its category / severity filter.

The report format is documented in docs/check-data.md (report_version 1). The app reads the JSON
the engine wrote rather than importing dmad.data.check, so the panel shows exactly what the command
line found. A report that is not one (truncated, another version) is refused with one line.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from PySide6.QtCore import QAbstractTableModel, QModelIndex, QObject, QSortFilterProxyModel, Qt
from PySide6.QtGui import QColor, QIcon, QPainter, QPen, QPixmap

from dmad.contract.datafiles import IMAGE_EXTS

REPORT_VERSION = 1
COLUMNS = ("Category", "Severity", "Path", "Detail")
PATH_COLUMN = 2
ERROR_COLOR = QColor(192, 57, 43)
# Problems whose image cannot be decoded safely or at all: the table shows the placeholder instead of
# handing the file to a decoder (pixel_limit_exceeded is refused by the engine without decoding).
UNDECODABLE = frozenset({"image_corrupt", "pixel_limit_exceeded", "file_unreadable", "broken_symlink",
                         "symlink_loop", "no_images"})


@dataclass(frozen=True)
class Problem:
    category: str
    severity: str  # "error" | "warning"
    path: str
    dataset: str
    detail: str
    related: tuple[str, ...]


@dataclass(frozen=True)
class DataReport:
    source: str
    batch: Optional[int]
    max_pixels: int
    datasets: tuple[dict, ...]  # {"id", "root", "images", "usable", "captions"}
    problems: tuple[Problem, ...]
    counts: dict[str, int]  # every category, zeros included, in the engine's order
    images: int
    usable: int
    errors: int
    warnings: int
    buckets: tuple[dict, ...]  # {"width", "height", "images", "usable", "full_batches"}
    clean: bool
    skipped_checks: tuple[str, ...] = ()  # `--fast`: categories that were not checked


def load_report(path: Path) -> DataReport:
    """Raises ValueError with one line when the file is not a version-1 check-data report."""
    try:
        raw = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ValueError(f"cannot read the data check report {path}: {e}") from None
    except RecursionError:
        raise ValueError(f"cannot read the data check report {path}: nested too deeply") from None
    if not isinstance(raw, dict) or raw.get("report_version") != REPORT_VERSION:
        raise ValueError(f"{path} is not a check-data report of version {REPORT_VERSION}")
    try:
        return _parse(raw)
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise ValueError(f"{path}: malformed check-data report ({type(e).__name__}: {e})") from None


def _parse(raw: dict[str, Any]) -> DataReport:
    summary = raw["summary"]
    problems = tuple(Problem(str(p["category"]), str(p["severity"]), str(p["path"]), str(p.get("dataset", "")),
                             str(p.get("detail", "")), tuple(str(r) for r in p.get("related", ())))
                     for p in raw["problems"])
    counts = {str(k): int(v) for k, v in raw["counts"].items()}
    for p in problems:  # a category the app has never heard of still gets a filter entry
        counts.setdefault(p.category, 0)
    return DataReport(source=str(raw["source"]), batch=raw.get("batch"), max_pixels=int(raw.get("max_pixels", 0)),
                      datasets=tuple(raw.get("datasets", ())), problems=problems, counts=counts,
                      images=int(summary["images"]), usable=int(summary["usable"]),
                      errors=int(summary["errors"]), warnings=int(summary["warnings"]),
                      buckets=tuple(summary.get("buckets") or ()), clean=bool(raw.get("clean", not problems)),
                      skipped_checks=tuple(str(c) for c in raw.get("skipped_checks") or ()))


def placeholder_icon(px: int) -> QIcon:
    """A grey square with a red cross: the image could not (or must not) be decoded."""
    pm = QPixmap(px, px)
    pm.fill(QColor(90, 90, 90))
    p = QPainter(pm)
    p.setPen(QPen(ERROR_COLOR, max(2, px // 12)))
    m = px // 4
    p.drawLine(m, m, px - m, px - m)
    p.drawLine(px - m, m, m, px - m)
    p.end()
    return QIcon(pm)


class ProblemsModel(QAbstractTableModel):
    """One row per problem. The Path column carries the thumbnail (set_thumb) or the placeholder."""

    def __init__(self, thumb_px: int = 48, parent: Optional[QObject] = None):
        super().__init__(parent)
        self._rows: tuple[Problem, ...] = ()
        self._icons: dict[str, QIcon] = {}
        self._placeholder = placeholder_icon(thumb_px)

    def set_problems(self, problems: tuple[Problem, ...]) -> None:
        self.beginResetModel()
        self._rows = problems
        self._icons.clear()
        self.endResetModel()

    def problem(self, row: int) -> Problem:
        return self._rows[row]

    def wants_thumb(self, row: int) -> bool:
        """An image path (not a caption) that may be decoded and has no thumbnail yet."""
        p = self._rows[row]
        return (p.category not in UNDECODABLE and Path(p.path).suffix.lower() in IMAGE_EXTS
                and p.path not in self._icons)

    def set_thumb(self, path: str, icon: Optional[QIcon]) -> None:
        """`icon` None: the image did not decode; the placeholder is shown."""
        self._icons[path] = icon if icon is not None else self._placeholder
        for row, p in enumerate(self._rows):
            if p.path == path:
                i = self.index(row, PATH_COLUMN)
                self.dataChanged.emit(i, i, [Qt.DecorationRole])

    def rowCount(self, parent: QModelIndex = QModelIndex()) -> int:
        return 0 if parent.isValid() else len(self._rows)

    def columnCount(self, parent: QModelIndex = QModelIndex()) -> int:
        return 0 if parent.isValid() else len(COLUMNS)

    def headerData(self, section: int, orientation: Qt.Orientation, role: int = Qt.DisplayRole) -> Any:
        if orientation == Qt.Horizontal and role == Qt.DisplayRole:
            return COLUMNS[section]
        return None

    def data(self, index: QModelIndex, role: int = Qt.DisplayRole) -> Any:
        if not index.isValid():
            return None
        p = self._rows[index.row()]
        col = index.column()
        if role == Qt.DisplayRole:
            return (p.category, p.severity, p.path, p.detail)[col]
        if role == Qt.ToolTipRole:
            related = "\n".join(f"related: {r}" for r in p.related)
            return f"{p.path}\n{p.detail}" + (f"\n{related}" if related else "") + f"\ndataset: {p.dataset}"
        if role == Qt.ForegroundRole and col == 1 and p.severity == "error":
            return ERROR_COLOR
        if role == Qt.DecorationRole and col == PATH_COLUMN:
            if p.category in UNDECODABLE:
                return self._placeholder
            return self._icons.get(p.path)
        return None


class ProblemsFilter(QSortFilterProxyModel):
    """Rows of one category and/or one severity; "" means all."""

    def __init__(self, parent: Optional[QObject] = None):
        super().__init__(parent)
        self._category = ""
        self._severity = ""

    def set_category(self, category: str) -> None:
        # begin/endFilterChange, not the deprecated invalidateFilter (Qt 6.10): only rows come and go
        self.beginFilterChange()
        self._category = category
        self.endFilterChange(QSortFilterProxyModel.Direction.Rows)

    def set_severity(self, severity: str) -> None:
        self.beginFilterChange()
        self._severity = severity
        self.endFilterChange(QSortFilterProxyModel.Direction.Rows)

    def filterAcceptsRow(self, row: int, parent: QModelIndex) -> bool:
        p = self.sourceModel().problem(row)
        return (not self._category or p.category == self._category) and \
               (not self._severity or p.severity == self._severity)
