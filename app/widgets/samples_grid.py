"""The samples grid: one row per prompt id, one column per checkpoint (teacher first, each re-render
right after its checkpoint), as a QTableView over a table model with a painting delegate.

No widget per image: a 50 x 20 grid is one view that paints the visible cells from a dict of
thumbnail pixmaps, so opening, scrolling and live updates stay cheap. Arrow keys are the view's own
navigation: up/down moves along prompts, left/right along checkpoints.

Under each checkpoint's name its health figures (issue 39, from <run>/health.csv read with the
listing): "div 82% · sat 105% · detail 93%", two a line, one where the thumbnails are narrow, none
(its tooltip) where not even one fits; a warning mark and red when that checkpoint raised an
alert; the teacher column is the "reference". The columns can be ordered by a health signal (teacher
first; best = closest to the teacher's level, or lowest distance to the teacher).

Columns say what they are: a checkpoint on disk with no samples yet gets a column that offers
Render; a folder without meta.json is "rendering" while a render or the run is live and otherwise
a render that stopped (its missing images read "not rendered"; a folder of none is hidden and the
panel's header says so).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Optional

from PySide6.QtCore import QAbstractTableModel, QEvent, QModelIndex, QRect, QSize, Qt, Signal
from PySide6.QtGui import QColor, QFontMetrics, QImage, QKeyEvent, QPainter, QPixmap
from PySide6.QtWidgets import QAbstractItemView, QStyle, QStyledItemDelegate, QStyleOptionViewItem, QTableView, QWidget

from app.models.health import (SIGNALS, HealthRow, all_figures, badness, header_figures, read_health_csv)
from app.models.sample_index import (TEACHER, Checkpoint, ImageFile, SamplesIndex, checkpoint_of, checkpoint_order,
                                     column_title, provenance_text, scan_samples, teacher_loras)
from app.models.thumbs import THUMB_PX
from dmad.contract.runs import LIVE_STATES, RunFolder, effective_state

CELL_PX = 120
CELL_RANGE = (48, 256)  # the thumbnail size control's range, px (thumbnails are cached at THUMB_PX)
STATE_ROLE = Qt.UserRole + 1   # "ok" | "loading" | "broken" | "missing" | "rendering" | "failed" | "no-samples"
MARK_ROLE = Qt.UserRole + 2    # "A" | "B" | "A/B" | ""
NO_SAMPLES = "no samples at this checkpoint"
NO_META = "no meta.json"  # sample_index's note for a folder without one: written when a render ends
CELL_TEXT = {"loading": "...", "broken": "unreadable", "missing": "-", "rendering": "rendering…",
             "failed": "not rendered", "no-samples": f"{NO_SAMPLES} — Render"}
RED = QColor(192, 57, 43)
ALERT_MARK = "\u26a0"  # ⚠ before the name of a checkpoint that raised a health alert


# ---------------------------------------------------------------- the listing (worker side)

@dataclass(frozen=True)
class GridListing:
    """What the grid shows of one run: its samples, plus what the run folder says about them."""
    index: SamplesIndex
    checkpoints: tuple[int, ...] = ()   # complete checkpoints on disk (exportable, renderable)
    live: bool = False                  # the engine is running: folders without meta.json are rendering
    student: str = "full"               # identity.student of the run's config: "full" | "lora"
    health: tuple[tuple[str, HealthRow], ...] = ()  # (checkpoint "iter_<N>", its last health.csv row)
    health_note: str = ""               # why health.csv (or part of it) was not used, one line
    model_family: str = "auto"          # identity.model_family of the run's config ("auto": found at run time)

    def teacher_meta(self) -> dict:
        """The teacher samples' meta.json (what the teacher rendered with: its own folder's, else a
        re-render's); {} before any is written."""
        return next((c.meta for c in self.index.columns if checkpoint_of(c.name) == TEACHER and c.meta), {})


def _identity(run: RunFolder) -> dict:
    """identity of the run's config.json; {} when it is missing or unreadable."""
    try:
        ident = run.read_json(run.config_json.name).get("identity") or {}
    except (OSError, ValueError, AttributeError):
        return {}
    return ident if isinstance(ident, dict) else {}


def scan_grid(run_dir: Optional[Path]) -> GridListing:
    """Worker side: the samples listing plus one empty column per checkpoint that has no sample folder
    (the final checkpoint of a stopped run often has none)."""
    index = scan_samples(run_dir)
    if run_dir is None:
        return GridListing(index)
    run = RunFolder(run_dir)
    iters = tuple(i for i, _ in run.list_checkpoints())
    rendered = {checkpoint_of(c.name) for c in index.columns}
    extra = [Checkpoint(f"iter_{i}", {}, {}, NO_SAMPLES) for i in iters if str(i) not in rendered]
    columns = tuple(sorted(index.columns + tuple(extra), key=lambda c: checkpoint_order(c.name)))
    index = replace(index, columns=columns)
    live = effective_state(run.read_status()) in LIVE_STATES
    health = read_health_csv(run_dir)
    ident = _identity(run)
    family = ident.get("model_family")
    return GridListing(index, iters, live, "lora" if ident.get("student") == "lora" else "full",
                       tuple(sorted(health.by_checkpoint().items())), health.problem,
                       family if isinstance(family, str) else "auto")


# ---------------------------------------------------------------- A/B marks

@dataclass(frozen=True)
class Mark:
    """An image marked A or B; it keeps its run, so A and B may come from two runs."""
    run_dir: Optional[Path]
    prompt_id: str
    checkpoint: str
    path: Path = field(compare=False)

    def label(self, other: Optional["Mark"] = None) -> str:
        """"iter_60 / shape-circle", with the run's name when `other` is from another run."""
        text = f"{self.checkpoint} / {self.prompt_id}"
        if other is not None and other.run_dir != self.run_dir and self.run_dir is not None:
            return f"{self.run_dir.name}: {text}"
        return text


# ---------------------------------------------------------------- the model

class SamplesModel(QAbstractTableModel):
    def __init__(self, parent=None):
        super().__init__(parent)
        self.listing = GridListing(SamplesIndex(None, (), ()))
        self._pixmaps: dict[ImageFile, Optional[QPixmap]] = {}  # None: the file could not be decoded
        self._where: dict[ImageFile, tuple[int, int]] = {}
        self._marks: dict[str, Mark] = {}
        self._rendering: set[str] = set()  # checkpoints (teacher | N) a `dmad sample` of ours renders now
        self._health: dict[str, HealthRow] = {}
        self.sort_signal = ""  # the health signal the header's figures add, when the columns are sorted by it
        self.header_fits: Callable[[str], bool] = lambda text: True  # does a header line fit the column (the view's)

    @property
    def index_(self) -> SamplesIndex:
        return self.listing.index

    # ------------------------------------------------------------ content

    def set_listing(self, listing: GridListing) -> list[ImageFile]:
        """Show `listing`; returns the images that still need a thumbnail. Thumbnails of images that
        did not change (same path, size, mtime) are kept."""
        old_cols = [c.name for c in self.index_.columns]
        new_cols = [c.name for c in listing.index.columns]
        # A live run appends columns (a new checkpoint) or images: no reset, so the view keeps its
        # scroll position and selection. Anything else (new prompts, a re-render column) resets.
        grows = bool(old_cols) and listing.index.rows == self.index_.rows and new_cols[:len(old_cols)] == old_cols
        if not grows:
            self.beginResetModel()
        elif len(new_cols) > len(old_cols):
            self.beginInsertColumns(QModelIndex(), len(old_cols), len(new_cols) - 1)
        self.listing = listing
        self._health = dict(listing.health)
        index = listing.index
        self._where = {img: (r, c) for c, col in enumerate(index.columns) for r, rid in enumerate(index.rows)
                       if (img := col.images.get(rid)) is not None}
        self._pixmaps = {img: pm for img, pm in self._pixmaps.items() if img in self._where}
        if not grows:
            self.endResetModel()
        else:
            if len(new_cols) > len(old_cols):
                self.endInsertColumns()
            self._all_changed(len(old_cols))
        return [img for img in self._where if img not in self._pixmaps]

    def _all_changed(self, columns: Optional[int] = None) -> None:
        cols = self.columnCount() if columns is None else columns
        if self.rowCount() and cols:
            self.dataChanged.emit(self.index(0, 0), self.index(self.rowCount() - 1, cols - 1))

    def set_rendering(self, checkpoints: set[str]) -> None:
        """The checkpoints (teacher | N) our own `dmad sample` is rendering now."""
        if checkpoints != self._rendering:
            self._rendering = set(checkpoints)
            self._all_changed()
            self.headerDataChanged.emit(Qt.Horizontal, 0, max(0, self.columnCount() - 1))

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

    # ------------------------------------------------------------ column states

    def column_state(self, col: int) -> str:
        """"ok" | "no-samples" | "rendering" (no meta.json yet, a render is live) | "failed" (no
        meta.json and nothing renders: the render stopped)."""
        c = self.index_.columns[col]
        if c.meta_note == NO_SAMPLES:
            return "no-samples"
        if c.meta or c.meta_note != NO_META:
            return "ok"  # meta.json is there, or unreadable: the images are what they are
        rendering = self.listing.live or checkpoint_of(c.name) in self._rendering
        return "rendering" if rendering else "failed"

    def empty_failed_columns(self) -> list[int]:
        """Folders of a render that stopped before its first image: nothing to show."""
        return [c for c, col in enumerate(self.index_.columns)
                if not col.images and self.column_state(c) == "failed"]

    # ------------------------------------------------------------ health (issue 39)

    def health_of(self, col: int) -> Optional[HealthRow]:
        """The health row of a checkpoint column (not of a re-render: its images are not the ones measured)."""
        return self._health.get(self.index_.columns[col].name)

    def health_order(self, signal: str) -> list[int]:
        """Column indices: the teacher's first, then the checkpoints best first by `signal` (closest to
        the teacher's level; the lowest distance), then those without a figure in checkpoint order."""
        cols = range(len(self.index_.columns))
        teacher = [c for c in cols if self._is_teacher(c)]
        rest = sorted((c for c in cols if not self._is_teacher(c)),
                      key=lambda c: badness(signal, self._value(c, signal)))  # stable: ties keep their order
        return teacher + rest

    def best_column(self, signal: str) -> Optional[int]:
        ranked = [c for c in self.health_order(signal) if self._value(c, signal) is not None]
        return ranked[0] if ranked else None

    def set_sort_signal(self, signal: str) -> None:
        self.sort_signal = signal if signal in SIGNALS else ""
        self.headerDataChanged.emit(Qt.Horizontal, 0, max(0, self.columnCount() - 1))

    def _is_teacher(self, col: int) -> bool:
        return checkpoint_of(self.index_.columns[col].name) == TEACHER

    def _value(self, col: int, signal: str) -> Optional[float]:
        row = self.health_of(col)
        return None if row is None else row.value(signal)

    def header_text(self, col: int) -> str:
        """The column's name, then its health figures, two a line where they fit the column, else one,
        else none (the tooltip has them all); "reference" for the teacher."""
        name = column_title(self.index_.columns[col])
        row = self.health_of(col)
        if self._is_teacher(col):
            return f"{name}\nreference" if self._health and self.header_fits("reference") else name
        if row is None:
            return name
        first = f"{ALERT_MARK} {name}" if row.alerts else name
        parts = header_figures(row, self.sort_signal).split(" · ")
        for n in (2, 1):
            lines = [" · ".join(parts[i:i + n]) for i in range(0, len(parts), n)]
            if all(self.header_fits(line) for line in lines):
                return "\n".join([first] + lines)
        return first

    def set_header_fits(self, fits: Callable[[str], bool]) -> None:
        self.header_fits = fits
        self.headerDataChanged.emit(Qt.Horizontal, 0, max(0, self.columnCount() - 1))

    # ------------------------------------------------------------ A/B marks

    def set_mark(self, which: str, row: int, col: int) -> Optional[Mark]:
        image = self.image(row, col)
        if image is None:
            return None
        old = self._marks.get(which)
        self._marks[which] = Mark(self.index_.run_dir, *self.key(row, col), image.path)
        for mark in (old, self._marks[which]):
            pos = self._cell_of_mark(mark)
            if pos:
                self.dataChanged.emit(self.index(*pos), self.index(*pos), [MARK_ROLE])
        return self._marks[which]

    def mark(self, which: str) -> Optional[Mark]:
        return self._marks.get(which)

    def _cell_of_mark(self, mark: Optional[Mark]) -> Optional[tuple[int, int]]:
        if mark is None or mark.run_dir != self.index_.run_dir:
            return None
        return self.cell_of(mark.prompt_id, mark.checkpoint)

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
            return self._state(image, c)
        if role == Qt.ToolTipRole:
            return provenance_text(self.index_, r, c)
        if role == MARK_ROLE:
            key = (self.index_.run_dir, *self.key(r, c))
            return "/".join(m for m in ("A", "B") if m in self._marks
                            and (self._marks[m].run_dir, self._marks[m].prompt_id, self._marks[m].checkpoint) == key)
        return None

    def _state(self, image: Optional[ImageFile], col: int) -> str:
        if image is not None:
            if image not in self._pixmaps:
                return "loading"
            return "ok" if self._pixmaps[image] is not None else "broken"
        state = self.column_state(col)
        return "missing" if state == "ok" else state

    def headerData(self, section: int, orientation: Qt.Orientation, role: int = Qt.DisplayRole):
        if orientation == Qt.Horizontal and section < len(self.index_.columns):
            return self._column_header(section, role)
        if orientation == Qt.Vertical and section < len(self.index_.rows):
            rid = self.index_.rows[section]
            if role == Qt.DisplayRole:
                return rid
            if role == Qt.ToolTipRole:
                items = self.index_.prompt_set.get("items") or []
                return next((str(it.get("prompt")) for it in items
                             if isinstance(it, dict) and it.get("id") == rid), None)
        return None

    def _column_header(self, section: int, role: int):
        name = self.index_.columns[section].name
        if role == Qt.DisplayRole:
            return self.header_text(section)
        if role == Qt.ToolTipRole:
            state = self.column_state(section)
            base = checkpoint_of(name)
            what = ("the teacher" if base == "teacher" else f"checkpoint iter_{base}")
            lines = [f"samples/{name}: " + (f"rendered again from {what}" if "-r" in name else what)]
            loras = teacher_loras(self.index_.columns[section].meta)
            if loras:
                lines.append(("the teacher is" if base == "teacher" else "distilled from") + " base + "
                             + ", ".join(f"{Path(str(x.get('path', '?'))).name} at {x.get('scale', '?')}" for x in loras))
            if state != "ok":
                lines.append({"no-samples": f"{NO_SAMPLES}: Render renders the run's prompt set with it",
                              "rendering": "rendering… (meta.json is written when the render ends)",
                              "failed": "no meta.json: a render that stopped before it finished?"}[state])
            lines += self._health_tip(section)
            return "\n".join(lines)
        if role == Qt.ForegroundRole and self.column_state(section) in ("no-samples", "failed"):
            return QColor(130, 130, 130)
        if role == Qt.ForegroundRole and (row := self.health_of(section)) is not None and row.alerts:
            return RED
        return None


    def _health_tip(self, section: int) -> list[str]:
        row = self.health_of(section)
        if self._is_teacher(section) and self._health:
            return ["health: the reference (the student's figures are relative to the teacher's)"]
        if row is None:
            return []
        alerts = f"; alert: {', '.join(row.alerts)}" if row.alerts else ""
        return [f"health at iteration {row.iter:,} (1.0 = the teacher's level){alerts}"] + all_figures(row)


# ---------------------------------------------------------------- painting

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
            # A thumbnail at the cache's size was reduced from a larger image: enlarging it smoothly
            # is closer to that image; a small render below it keeps its pixels
            reduced = max(pm.width(), pm.height()) >= THUMB_PX
            painter.setRenderHint(QPainter.SmoothPixmapTransform, size.width() < pm.width() or reduced)
            painter.drawPixmap(target, pm)
        else:
            state = index.data(STATE_ROLE)
            painter.setPen(RED if state in ("failed", "broken") else QColor(140, 140, 140))
            painter.drawText(rect, int(Qt.AlignCenter | Qt.TextWordWrap), CELL_TEXT.get(state, "-"))
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
            header.setMinimumSectionSize(24)
        # Qt draws the current column's header bold, ~10% wider than the widths measured here: a name or
        # a figure line that fits would be clipped in that one column (the cell's frame marks it).
        self.horizontalHeader().setHighlightSections(False)
        self._px = CELL_PX
        # New columns (a live run's checkpoint, another run) and new names start at px: widen them too.
        for signal in (model.modelReset, model.columnsInserted, model.headerDataChanged):
            signal.connect(self._fit_column_widths)
        self.set_cell_px(CELL_PX)
        self.setShowGrid(False)
        self.setWordWrap(False)

    def set_cell_px(self, px: int) -> None:
        """Every cell px x px: the thumbnail size control. A column whose name is wider than px is as
        wide as its name (at 48 px "teacher" and "iter_1000" were clipped); the header's health
        figures take as many a line as px holds (two, one, or none: then its tooltip)."""
        px = max(CELL_RANGE[0], min(CELL_RANGE[1], int(px)))
        self._px = px
        for header in (self.horizontalHeader(), self.verticalHeader()):
            header.setDefaultSectionSize(px)
        rows = self.verticalHeader()
        for i in range(rows.count()):
            rows.resizeSection(i, px)
        model = self.model()
        if isinstance(model, SamplesModel):  # asked for every header line at every paint: measured once
            metrics, margin = self._header_measure()
            model.set_header_fits(lambda text: metrics.horizontalAdvance(text) + 2 * margin <= px)
        self._fit_column_widths()

    def _header_measure(self) -> tuple[QFontMetrics, int]:
        """The header's font metrics and the style's header margin (each side): a line of width w draws
        unclipped in a section of w + 2 margins, as QHeaderView sizes a section to its contents."""
        header = self.horizontalHeader()
        return QFontMetrics(header.font()), header.style().pixelMetric(QStyle.PixelMetric.PM_HeaderMargin, None, header)

    def changeEvent(self, event: QEvent) -> None:
        super().changeEvent(event)
        if event.type() in (QEvent.Type.FontChange, QEvent.Type.StyleChange) and hasattr(self, "_px"):
            self.set_cell_px(self._px)  # the header's text measures changed

    def _fit_column_widths(self, *_args) -> None:
        """Each column px wide, or its name's width (the header's first line) when that is wider."""
        model, header = self.model(), self.horizontalHeader()
        metrics, margin = self._header_measure()
        for i in range(min(header.count(), model.columnCount())):
            name = str(model.headerData(i, Qt.Orientation.Horizontal) or "").split("\n")[0]
            width = max(self._px, metrics.horizontalAdvance(name) + 2 * margin)
            if header.sectionSize(i) != width:
                header.resizeSection(i, width)

    def set_column_order(self, order: list[int]) -> None:
        """Show the columns (model indices) in this order, left to right."""
        header = self.horizontalHeader()
        for visual, logical in enumerate(order):
            current = header.visualIndex(logical)
            if current != visual:
                header.moveSection(current, visual)

    def column_order(self) -> list[int]:
        header = self.horizontalHeader()
        return [header.logicalIndex(v) for v in range(header.count())]

    def hide_columns(self, columns: list[int]) -> None:
        hidden = set(columns)
        for c in range(self.model().columnCount()):
            self.setColumnHidden(c, c in hidden)

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
