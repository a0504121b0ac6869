"""The Data panel's image browser: every image of the checked dataset as a thumbnail with its caption
below, filtered by the check's findings and by a text search, and the selected image larger with its
findings and a caption editor.

Thousands of images scroll smoothly: the list view lays out uniform grid cells, and only the cells it
paints ask for a thumbnail (app/models/data_browse.py: BrowseModel), decoded in pool workers through
the thumbnail cache (app/models/thumbs.py) once scrolling pauses, for those still on screen. The larger
picture is decoded in a worker too; captions are written atomically in a worker
(data_browse.write_caption), and an edit not saved yet is kept while other images are looked at.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Optional, Sequence

from PySide6.QtCore import QSize, Qt, QTimer, Signal
from PySide6.QtGui import QIcon, QImage, QPixmap
from PySide6.QtWidgets import (QAbstractItemView, QComboBox, QHBoxLayout, QLineEdit, QListView, QListWidget,
                               QPlainTextEdit, QPushButton, QSplitter, QVBoxLayout, QWidget)

from app.engine.background import Task
from app.models.data_browse import (ALL, BrowseFilter, BrowseItem, BrowseModel, BrowseScan, CaptionRead, filter_choices,
                                    read_caption, scan_source, write_caption)
from app.models.data_report import ERROR_COLOR, Problem, placeholder_icon
from app.models.decode import decode_image
from app.models.thumbs import ThumbCache, ThumbLoader, scale_to_thumb
from app.widgets.elided_label import ElidedLabel
from app.widgets.image_preview import ImagePreview
from app.widgets.wheel_guard import guard_wheel
from dmad.contract.regular import read_regular

BROWSE_PX = 96  # thumbnails in the list
PREVIEW_PX = 384  # the selected image, decoded down to this
SEARCH_DELAY_MS = 150
RED = ERROR_COLOR.name()


def _preview(path: Path) -> QImage:
    """Worker side: the image scaled down to PREVIEW_PX (null when it does not decode)."""
    img = decode_image(read_regular(path))
    return scale_to_thumb(img, PREVIEW_PX) if not img.isNull() else img


def _save(item: BrowseItem, text: str, stamp) -> tuple:
    """Worker side: (item, text, "saved" | "changed" | "failed", stamp or (stamp, line) or line)."""
    try:
        return (item, text, *write_caption(item.caption_path, item.image, text, stamp))
    except ValueError as e:
        return item, text, "failed", str(e)


def _recheck_note(item: BrowseItem, message: str) -> str:
    name = Path(item.caption_path or item.image).name
    if message:
        return f"{name} saved; not checked again: {message}"
    n = len(item.findings)
    return f"{name} saved and checked again: " + (f"{n} finding{'s' * (n != 1)}" if n else "no findings")


def icon_view(model: BrowseModel, proxy: BrowseFilter, line_px: int) -> QListView:
    """Thumbnails with one line of caption under each, in uniform grid cells: laying out and
    scrolling thousands costs the same as a few (the view measures one cell, paints what shows)."""
    view = QListView()
    view.setViewMode(QListView.IconMode)
    view.setMovement(QListView.Static)
    view.setResizeMode(QListView.Adjust)
    view.setUniformItemSizes(True)
    view.setWordWrap(False)
    view.setTextElideMode(Qt.ElideRight)
    view.setIconSize(QSize(BROWSE_PX, BROWSE_PX))
    model.cell = QSize(BROWSE_PX + 24, BROWSE_PX + line_px + 8)
    view.setGridSize(model.cell + QSize(4, 6))
    view.setSelectionMode(QAbstractItemView.SingleSelection)
    view.setVerticalScrollMode(QAbstractItemView.ScrollPerPixel)
    view.verticalScrollBar().setSingleStep(24)
    view.setModel(proxy)
    return view


class ImageDetail(QWidget):
    """The selected image larger, its findings, and its caption in an editor with Reload and Save."""

    def __init__(self, parent: Optional[QWidget] = None):
        super().__init__(parent)
        self.preview = ImagePreview()
        self.name = ElidedLabel("", mode=Qt.ElideMiddle)
        self.findings = QListWidget()
        self.findings.setToolTip("The check's findings for this image and its caption")
        self.findings.setMaximumHeight(4 * self.fontMetrics().height() + 8)
        self.findings.setTextElideMode(Qt.ElideRight)
        self.editor = QPlainTextEdit()
        self.editor.setPlaceholderText("The caption of the selected image")
        self.editor.setTabChangesFocus(True)
        self.note = ElidedLabel("")
        self.reload = QPushButton("Reload")
        self.reload.setToolTip("Read the caption file again (an edit not saved is dropped)")
        self.save = QPushButton("Save caption")
        self.save.setToolTip("Write the caption file (atomically) and check this image again")
        side = QVBoxLayout()
        side.setContentsMargins(0, 0, 0, 0)
        side.addWidget(self.name)
        side.addWidget(self.findings)
        side.addWidget(self.editor, 1)
        top = QHBoxLayout()
        top.addWidget(self.preview, 2)
        top.addLayout(side, 3)
        row = QHBoxLayout()  # the note spans the width: a save's outcome is read whole
        row.addWidget(self.note, 1)
        row.addWidget(self.reload)
        row.addWidget(self.save)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addLayout(top, 1)
        lay.addLayout(row)

    def show_findings(self, findings: Sequence[Problem]) -> None:
        self.findings.clear()
        for p in findings:
            self.findings.addItem(f"{p.severity}: {p.category}: {p.detail}")
            it = self.findings.item(self.findings.count() - 1)
            it.setToolTip(f"{p.path}\n{p.detail}")
            if p.severity == "error":
                it.setForeground(ERROR_COLOR)
        if not findings:
            self.findings.addItem("no findings")

    def set_note(self, text: str, error: bool = False) -> None:
        self.note.setStyleSheet(f"color: {RED}" if error else "")
        self.note.setText(text)


class DataBrowser(QWidget):
    """`set_source` lists the images of a checked source; `set_findings` puts the report's findings on
    them; `show_path` selects the image of a finding. `caption_saved(item)` after a caption was written."""

    caption_saved = Signal(object)

    def __init__(self, cache_folder: Optional[Path] = None, parent: Optional[QWidget] = None):
        super().__init__(parent)
        self.model = BrowseModel(BROWSE_PX, self)
        self.proxy = BrowseFilter(self)
        self.proxy.setSourceModel(self.model)
        self.model.thumbs_wanted.connect(self._want)
        self.thumbs = ThumbLoader(ThumbCache(cache_folder, px=BROWSE_PX), self)
        self.thumbs.loaded.connect(self._on_thumbs)
        self._problems: Sequence[Problem] = ()
        self._order: Sequence[str] = ()
        self._entries: dict[str, dict] = {}
        self._drafts: dict[str, str] = {}  # image -> an edit not saved yet
        self._saving: set[str] = set()
        self._current: Optional[BrowseItem] = None
        self._steadying = False  # a filter change moves the view's current row: not the user's choice
        self._scan = Task(self)
        self._scan.done.connect(self._on_scanned)
        self._scan.failed.connect(lambda msg: self.detail.set_note(msg.removeprefix("ValueError: "), error=True))
        self._big = Task(self)
        self._big.done.connect(self._on_preview)
        self._write = Task(self, every_answer=True)  # each save answers, whichever image it was
        self._write.done.connect(self._on_written)
        self._read = Task(self)
        self._read.done.connect(self._on_reloaded)
        self._search = QTimer(self)
        self._search.setSingleShot(True)
        self._search.setInterval(SEARCH_DELAY_MS)
        self._search.timeout.connect(lambda: self._filtered(self.proxy.set_text, self.search.text()))
        self._build()
        self._show(None)

    def _build(self) -> None:
        self.codes = QComboBox()
        self.codes.setToolTip("Show the images with this finding of the check")
        self.codes.currentIndexChanged.connect(lambda _i: self._filtered(self.proxy.set_code, self.codes.currentData()))
        guard_wheel(self.codes)
        self.search = QLineEdit()
        self.search.setPlaceholderText("Search captions")
        self.search.setClearButtonEnabled(True)
        self.search.textChanged.connect(lambda _t: self._search.start())
        self.count = ElidedLabel("")
        bar = QHBoxLayout()
        bar.addWidget(self.codes, 2)
        bar.addWidget(self.search, 2)
        bar.addWidget(self.count, 1)
        self.view = icon_view(self.model, self.proxy, self.fontMetrics().height())
        self.view.selectionModel().currentChanged.connect(lambda cur, _prev: self._on_current(cur))
        self.detail = ImageDetail()
        self.detail.editor.textChanged.connect(self._update_buttons)
        self.detail.save.clicked.connect(self.save)
        self.detail.reload.clicked.connect(self.reload)
        split = QSplitter(Qt.Vertical)
        split.addWidget(self.view)
        split.addWidget(self.detail)
        split.setStretchFactor(0, 3)
        split.setStretchFactor(1, 2)
        split.setChildrenCollapsible(False)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addLayout(bar)
        lay.addWidget(split, 1)

    # ------------------------------------------------------------ what the panel tells it

    def set_source(self, source: str, problems: Sequence[Problem], order: Sequence[str]) -> None:
        """List the images of `source` (a worker) and put the report's findings on them."""
        self._problems, self._order = problems, order
        self.thumbs.reset()
        self._steady(lambda: self.model.set_items([]))  # a new listing (a check): no image shown without its findings
        self.detail.set_note(f"Listing the images of {source} ...")
        self._scan.submit(lambda: scan_source(source))

    def set_findings(self, problems: Sequence[Problem], order: Sequence[str]) -> None:
        self._problems, self._order = problems, order
        self._steady(lambda: self.model.set_findings(problems))
        self._fill_codes()
        if self._current is not None:
            self.detail.show_findings(self._current.findings)

    def options(self, dataset: str) -> dict:
        """The dataset's options for a one-image recheck (data_browse.Rechecker)."""
        return self._entries.get(dataset, {})

    def show_path(self, path: str) -> bool:
        """Select and scroll to the image a finding names (an image or its caption); False when the
        browser has no such image. A filter that hides it is cleared."""
        row = self.model.row_of(path)
        if row < 0:
            return False
        index = self.proxy.mapFromSource(self.model.index(row))
        if not index.isValid():
            self.search.setText("")
            self.proxy.set_text("")
            self.codes.setCurrentIndex(max(self.codes.findData(ALL), 0))
            index = self.proxy.mapFromSource(self.model.index(row))
        self.view.setCurrentIndex(index)
        self.view.scrollTo(index, QAbstractItemView.PositionAtCenter)
        return True

    def current_item(self) -> Optional[BrowseItem]:
        return self._current

    def item_of(self, path: str) -> Optional[BrowseItem]:
        row = self.model.row_of(path)
        return self.model.item(row) if row >= 0 else None

    def busy(self) -> bool:
        return any(t.busy() for t in (self._scan, self._write, self._read, self._big, self.thumbs))

    def unsaved(self) -> int:
        self._keep_draft()
        return len(self._drafts)

    def rechecked(self, image: str, message: str = "") -> None:
        """The panel's word on a recheck: "" when the findings were updated, else why not (one line)."""
        item = self.item_of(image)
        if item is not None and item is self._current:
            self.detail.set_note(_recheck_note(item, message), bool(message))

    # ------------------------------------------------------------ listing and filtering

    def _on_scanned(self, scan: BrowseScan) -> None:
        current = self._current.image if self._current is not None else None
        self._entries = scan.entries
        self.model.set_items(scan.items)
        self.model.set_findings(self._problems)
        self._fill_codes()
        self._show(None)
        if current is not None:
            self.show_path(current)

    def _fill_codes(self) -> None:
        key = self.codes.currentData() or ALL
        choices = filter_choices(self.model.items(), self._order)
        if key not in [k for _, k in choices]:  # the images of a code just fixed leave; the choice stays
            choices.append((f"{key} (0)", key))
        self.codes.blockSignals(True)
        self.codes.clear()
        for label, value in choices:
            self.codes.addItem(label, value)
        self.codes.setCurrentIndex(self.codes.findData(key))
        self.codes.blockSignals(False)
        self._filtered(self.proxy.set_code, key)

    def _filtered(self, setter, value) -> None:
        self._steady(lambda: setter(value or ""))

    def _steady(self, change) -> None:
        """Run a change that may filter images in or out: the image shown stays shown (and selected
        while it is in the view), whatever row the view's selection moved to meanwhile."""
        self._steadying = True
        try:
            change()
            item = self._current
            index = self.proxy.mapFromSource(self.model.index(self.model.row_of(item.image))) if item else None
            if index is not None and index.isValid():
                self.view.setCurrentIndex(index)
            else:
                self.view.selectionModel().clear()
        finally:
            self._steadying = False
        self._update_count()

    def _update_count(self) -> None:
        shown, total = self.proxy.rowCount(), self.model.rowCount()
        drafts = f", {len(self._drafts)} unsaved" if self._drafts else ""
        self.count.setText(f"{shown} of {total} images{drafts}" if shown != total else f"{total} images{drafts}")

    # ------------------------------------------------------------ thumbnails

    def _want(self, rows: list) -> None:
        """Rows painted without a thumbnail: decode those still on screen (the rest ask again when painted)."""
        area = self.view.viewport().rect()
        todo = []
        for row in rows:
            index = self.proxy.mapFromSource(self.model.index(row))
            item = self.model.item(row)
            if index.isValid() and item.file is not None and self.view.visualRect(index).intersects(area):
                todo.append(item.file)
        if todo:
            self.thumbs.request(todo)

    def _on_thumbs(self, result: list) -> None:
        for image, qimage in result:
            self.model.set_thumb(str(image.path), None if qimage.isNull() else QIcon(QPixmap.fromImage(qimage)))

    # ------------------------------------------------------------ the selected image

    def _on_current(self, index) -> None:
        if self._steadying:
            return
        row = self.proxy.mapToSource(index).row() if index.isValid() else -1
        self._show(self.model.item(row) if row >= 0 else None)

    def _keep_draft(self) -> None:
        item = self._current
        if item is not None and item.caption.editable:
            text = self.detail.editor.toPlainText()
            if text != item.caption.text:
                self._drafts[item.image] = text
            else:
                self._drafts.pop(item.image, None)

    def _show(self, item: Optional[BrowseItem]) -> None:
        self._keep_draft()
        self._current = item
        d = self.detail
        d.editor.blockSignals(True)
        d.editor.setPlainText("" if item is None else self._drafts.get(item.image, item.caption.text))
        d.editor.blockSignals(False)
        d.editor.setReadOnly(item is None or not item.caption.editable)
        d.name.setText("" if item is None else item.image)
        d.show_findings(() if item is None else item.findings)
        d.findings.setVisible(item is not None)
        d.preview.set_pixmap(None)
        if item is None:
            d.set_note("Select an image to see it larger and edit its caption.")
        else:
            d.set_note("an edit not saved yet" if item.image in self._drafts else item.caption.note)
            if item.undecodable():
                d.preview.set_pixmap(placeholder_icon(BROWSE_PX).pixmap(BROWSE_PX, BROWSE_PX))
            else:
                path = item.file.path
                self._big.submit(lambda: (path, _preview(path)))
        self._update_buttons()
        self._update_count()

    def _on_preview(self, result) -> None:
        path, img = result
        if self._current is not None and self._current.file is not None and self._current.file.path == path:
            self.detail.preview.set_pixmap(None if img.isNull() else QPixmap.fromImage(img))

    def _update_buttons(self) -> None:
        item, d = self._current, self.detail
        editable = item is not None and item.caption.editable and item.caption_path is not None
        saving = editable and item.image in self._saving
        dirty = editable and d.editor.toPlainText() != item.caption.text
        d.save.setEnabled(editable and not saving and (dirty or item.caption.reencode))
        d.reload.setEnabled(editable and not saving)

    # ------------------------------------------------------------ saving

    def save(self) -> bool:
        """Write the caption shown in the editor (a worker); False when there is nothing to save."""
        item = self._current
        if item is None or not self.detail.save.isEnabled():
            return False
        text = self.detail.editor.toPlainText()
        self._drafts[item.image] = text
        self._saving.add(item.image)
        self._update_buttons()
        self.detail.set_note(f"Saving {Path(item.caption_path).name} ...")
        stamp = item.caption.stamp
        self._write.submit(lambda: _save(item, text, stamp))
        return True

    def _on_written(self, result: tuple) -> None:
        item, text, kind, value = result
        self._saving.discard(item.image)
        here = item is self._current
        if kind == "saved":
            item.caption = CaptionRead(text, stamp=value)
            if self._drafts.get(item.image) == text:
                del self._drafts[item.image]
            self._steady(lambda: self.model.changed(self.model.row_of(item.image)))
            if here:
                self.detail.set_note(f"{Path(item.caption_path).name} saved; checking it again ...")
            self.caption_saved.emit(item)
        elif kind == "changed":  # the next Save writes over what is there now
            item.caption = dataclasses.replace(item.caption, stamp=value[0])
            if here:
                self.detail.set_note(value[1], error=True)
        elif here:
            self.detail.set_note(value, error=True)
        self._update_buttons()
        self._update_count()

    def reload(self) -> None:
        """Read the selected image's caption file again (a worker); an edit not saved is dropped."""
        item = self._current
        if item is None or item.caption_path is None:
            return
        self._read.submit(lambda: (item, read_caption(Path(item.caption_path))))

    def _on_reloaded(self, result: tuple) -> None:
        item, caption = result
        item.caption = caption
        self._drafts.pop(item.image, None)
        self._steady(lambda: self.model.changed(self.model.row_of(item.image)))
        if item is self._current:
            self._current = None  # nothing to keep as a draft: shown afresh
            self._show(item)
