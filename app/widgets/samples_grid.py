"""The samples grid: one row per prompt id, one column per checkpoint (teacher first), as a
QTableView over a table model with a painting delegate.

No widget per image: a 50 x 20 grid is one view that paints the visible cells from a dict of
thumbnail pixmaps, so opening, scrolling and live updates stay cheap. Arrow keys are the view's own
navigation: up/down moves along prompts, left/right along checkpoints.
"""
from __future__ import annotations

from typing import Optional

from PySide6.QtCore import QAbstractTableModel, QModelIndex, QRect, QSize, Qt, Signal
from PySide6.QtGui import QColor, QImage, QKeyEvent, QPainter, QPixmap
from PySide6.QtWidgets import QAbstractItemView, QStyle, QStyledItemDelegate, QStyleOptionViewItem, QTableView, QWidget

from app.models.sample_index import ImageFile, SamplesIndex, provenance_text

CELL_PX = 120
STATE_ROLE = Qt.UserRole + 1   # "ok" | "loading" | "missing" | "broken"
MARK_ROLE = Qt.UserRole + 2    # "A" | "B" | "A/B" | ""


class SamplesModel(QAbstractTableModel):
    def __init__(self, parent=None):
        super().__init__(parent)
        self.index_ = SamplesIndex(None, (), ())
        self._pixmaps: dict[ImageFile, Optional[QPixmap]] = {}  # None: the file could not be decoded
        self._where: dict[ImageFile, tuple[int, int]] = {}
        self._marks: dict[str, tuple[str, str]] = {}  # "A"/"B" -> (prompt id, checkpoint name)

    # ------------------------------------------------------------ content

    def set_index(self, index: SamplesIndex) -> list[ImageFile]:
        """Show `index`; returns the images that still need a thumbnail. Thumbnails of images that
        did not change (same path, size, mtime) are kept."""
        old_cols = [c.name for c in self.index_.columns]
        new_cols = [c.name for c in index.columns]
        # A live run appends columns (a new checkpoint) or images: no reset, so the view keeps its
        # scroll position and selection. Anything else (new prompts, a re-render column) resets.
        grows = bool(old_cols) and index.rows == self.index_.rows and new_cols[:len(old_cols)] == old_cols
        if not grows:
            self.beginResetModel()
        elif len(new_cols) > len(old_cols):
            self.beginInsertColumns(QModelIndex(), len(old_cols), len(new_cols) - 1)
        self.index_ = index
        self._where = {img: (r, c) for c, col in enumerate(index.columns) for r, rid in enumerate(index.rows)
                       if (img := col.images.get(rid)) is not None}
        self._pixmaps = {img: pm for img, pm in self._pixmaps.items() if img in self._where}
        if not grows:
            self.endResetModel()
        else:
            if len(new_cols) > len(old_cols):
                self.endInsertColumns()
            if self.rowCount() and old_cols:
                self.dataChanged.emit(self.index(0, 0), self.index(self.rowCount() - 1, len(old_cols) - 1))
        return [img for img in self._where if img not in self._pixmaps]

    def add_thumbs(self, thumbs: list[tuple[ImageFile, QImage]]) -> None:
        cells = []
        for image, thumb in thumbs:
            pos = self._where.get(image)
            if pos is None:
                continue  # the listing changed while it was decoded
            self._pixmaps[image] = QPixmap.fromImage(thumb) if not thumb.isNull() else None
            cells.append(pos)
        if cells:  # one signal per batch: the view repaints what is visible in that range
            rows, cols = [r for r, _ in cells], [c for _, c in cells]
            self.dataChanged.emit(self.index(min(rows), min(cols)), self.index(max(rows), max(cols)),
                                  [Qt.DecorationRole, STATE_ROLE])

    def filled(self) -> bool:
        """Every image on disk has its thumbnail (or is known to be unreadable)."""
        return len(self._pixmaps) == len(self._where)

    def thumb_count(self) -> int:
        return len(self._pixmaps)

    def image(self, row: int, col: int) -> Optional[ImageFile]:
        inside = 0 <= row < len(self.index_.rows) and 0 <= col < len(self.index_.columns)
        return self.index_.image(row, col) if inside else None

    def cell_of(self, prompt_id: str, checkpoint: str) -> Optional[tuple[int, int]]:
        rows, cols = self.index_.rows, [c.name for c in self.index_.columns]
        return (rows.index(prompt_id), cols.index(checkpoint)) if prompt_id in rows and checkpoint in cols else None

    def key(self, row: int, col: int) -> tuple[str, str]:
        return self.index_.rows[row], self.index_.columns[col].name

    # ------------------------------------------------------------ A/B marks

    def set_mark(self, which: str, row: int, col: int) -> None:
        old = self._marks.get(which)
        self._marks[which] = self.key(row, col)
        for key in (old, self._marks[which]):
            pos = self.cell_of(*key) if key else None
            if pos:
                self.dataChanged.emit(self.index(*pos), self.index(*pos), [MARK_ROLE])

    def mark(self, which: str) -> Optional[tuple[str, str]]:
        return self._marks.get(which)

    # ------------------------------------------------------------ Qt model

    def rowCount(self, parent=QModelIndex()) -> int:
        return 0 if parent.isValid() else len(self.index_.rows)

    def columnCount(self, parent=QModelIndex()) -> int:
        return 0 if parent.isValid() else len(self.index_.columns)

    def data(self, index: QModelIndex, role: int = Qt.DisplayRole):
        if not index.isValid():
            return None
        r, c = index.row(), index.column()
        image = self.index_.image(r, c)
        if role == Qt.DecorationRole:
            return self._pixmaps.get(image) if image else None
        if role == STATE_ROLE:
            if image is None:
                return "missing"
            if image not in self._pixmaps:
                return "loading"
            return "ok" if self._pixmaps[image] is not None else "broken"
        if role == Qt.ToolTipRole:
            return provenance_text(self.index_, r, c)
        if role == MARK_ROLE:
            key = self.key(r, c)
            return "/".join(m for m in ("A", "B") if self._marks.get(m) == key)
        return None

    def headerData(self, section: int, orientation: Qt.Orientation, role: int = Qt.DisplayRole):
        if orientation == Qt.Horizontal and section < len(self.index_.columns):
            if role == Qt.DisplayRole:
                return self.index_.columns[section].name
        elif orientation == Qt.Vertical and section < len(self.index_.rows):
            rid = self.index_.rows[section]
            if role == Qt.DisplayRole:
                return rid
            if role == Qt.ToolTipRole:
                items = self.index_.prompt_set.get("items") or []
                return next((str(it.get("prompt")) for it in items
                             if isinstance(it, dict) and it.get("id") == rid), None)
        return None


class ThumbDelegate(QStyledItemDelegate):
    """Paints the thumbnail fitted to the cell: enlarged without smoothing (pixels stay pixels),
    reduced with smoothing; a state word where there is no image; A/B badges in the corner."""

    def paint(self, painter: QPainter, option: QStyleOptionViewItem, index: QModelIndex) -> None:
        painter.save()
        rect = option.rect.adjusted(3, 3, -3, -3)
        if option.state & QStyle.State_Selected:
            painter.fillRect(option.rect, option.palette.highlight())
        pm = index.data(Qt.DecorationRole)
        if pm is not None:
            size = pm.size().scaled(rect.size(), Qt.KeepAspectRatio)
            target = QRect(0, 0, size.width(), size.height())
            target.moveCenter(rect.center())
            painter.setRenderHint(QPainter.SmoothPixmapTransform, size.width() < pm.width())
            painter.drawPixmap(target, pm)
        else:
            state = index.data(STATE_ROLE)
            painter.setPen(QColor(140, 140, 140))
            painter.drawText(rect, Qt.AlignCenter, {"loading": "...", "broken": "unreadable"}.get(state, "-"))
        if option.state & QStyle.State_HasFocus:
            painter.setPen(option.palette.highlight().color().darker(150))
            painter.drawRect(option.rect.adjusted(0, 0, -1, -1))
        mark = index.data(MARK_ROLE)
        if mark:
            badge = QRect(rect.left(), rect.top(), 14 * len(mark), 16)
            painter.fillRect(badge, QColor(255, 200, 0))
            painter.setPen(QColor(0, 0, 0))
            painter.drawText(badge, Qt.AlignCenter, mark)
        painter.restore()

    def sizeHint(self, option: QStyleOptionViewItem, index: QModelIndex) -> QSize:
        return QSize(CELL_PX, CELL_PX)


class SamplesGridView(QTableView):
    """Keys A and B mark the current image, C asks for the A/B view (instead of the table's
    jump-to-text search, which means nothing in a grid of images)."""

    mark_requested = Signal(str)  # "A" | "B"
    compare_requested = Signal()

    def __init__(self, model: SamplesModel, parent: Optional[QWidget] = None):
        super().__init__(parent)
        self.setModel(model)
        self.setItemDelegate(ThumbDelegate(self))
        self.setSelectionMode(QAbstractItemView.ExtendedSelection)  # ctrl-click two cells to compare
        self.setSelectionBehavior(QAbstractItemView.SelectItems)
        self.setVerticalScrollMode(QAbstractItemView.ScrollPerPixel)
        self.setHorizontalScrollMode(QAbstractItemView.ScrollPerPixel)
        for header in (self.horizontalHeader(), self.verticalHeader()):
            header.setDefaultSectionSize(CELL_PX)
            header.setMinimumSectionSize(24)
        self.setShowGrid(False)
        self.setWordWrap(False)

    def current_cell(self) -> Optional[tuple[int, int]]:
        i = self.currentIndex()
        return (i.row(), i.column()) if i.isValid() else None

    def set_current_cell(self, row: int, col: int) -> None:
        self.setCurrentIndex(self.model().index(row, col))

    def selected_cells(self) -> list[tuple[int, int]]:
        return sorted((i.row(), i.column()) for i in self.selectionModel().selectedIndexes())

    def keyPressEvent(self, event: QKeyEvent) -> None:
        if event.modifiers() & ~Qt.KeypadModifier == Qt.NoModifier:
            if event.key() in (Qt.Key_A, Qt.Key_B):
                self.mark_requested.emit("A" if event.key() == Qt.Key_A else "B")
                return
            if event.key() == Qt.Key_C:
                self.compare_requested.emit()
                return
        super().keyPressEvent(event)
