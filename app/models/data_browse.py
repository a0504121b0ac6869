"""The Data panel's image browser without widgets: every image of the checked dataset with its
caption and the check's findings, the list model and its filter, the caption file's read and atomic
write, and the recheck of one image after its caption was saved.

The check-data report lists problems only, so the images come from listing the report's source
again (dmad.contract.datasets, as the engine lists it: top level, IMAGE_EXTS) in a worker; captions
are read there too (the text search needs them all). A caption is read as the engine reads it, never
through a symbolic link that leaves its folder, never from a FIFO or a file over MAX_CAPTION_BYTES.

Only `<stem>.txt` captions (caption_strategy textfile) are editable: a `filename` caption is the
file's name (renaming images is not this panel's job) and an `instanceprompt` caption is one text of
the dataset list shared by every image of that dataset, not this image's caption.

The recheck runs the engine's own `dmad check-data` (the app does not import dmad.data) on a
one-image dataset list in a temporary folder: the image linked in, the saved caption copied, the
dataset's options (minimum size, buckets) kept. Its per-file findings replace the image's; the
cross-file ones (duplicates, one stem with two images) stay as the full check found them.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

from PySide6.QtCore import QAbstractListModel, QModelIndex, QObject, QSize, QSortFilterProxyModel, Qt, QTimer, Signal
from PySide6.QtGui import QIcon

from app.engine.background import Task
from app.engine.command import DmadCommand
from app.models.data_report import ERROR_COLOR, UNDECODABLE, DataReport, Problem, placeholder_icon
from app.models.sample_index import ImageFile
from dmad.contract.datafiles import IMAGE_EXTS, caption_lines, filename_caption
from dmad.contract.datasets import load_dataset_list
from dmad.contract.regular import read_regular
from dmad.contract.runs import atomic_write_text
from dmad.errors import DmadError

MAX_CAPTION_BYTES = 1 << 20  # a caption file larger than this is not loaded (nor editable)
# Findings that compare an image with others: a one-image recheck cannot find them, so they are kept.
CROSS_FILE = frozenset({"duplicate_exact", "duplicate_near", "stem_two_images", "caption_without_image", "no_images"})
ALL, ANY, NONE = "", "*", "-"  # filter keys besides the finding codes
WANT_DELAY_MS = 60  # painted items ask for thumbnails; asked once the view pauses


@dataclass(frozen=True)
class CaptionRead:
    text: str
    note: str = ""  # why it is not editable, or how it was read ("" when it is plain UTF-8)
    editable: bool = True
    stamp: Optional[tuple[int, int]] = None  # (size, mtime_ns) when read; None: there is no file
    reencode: bool = False  # not UTF-8: Save writes it as UTF-8 even unchanged


@dataclass
class BrowseItem:
    image: str  # the path as the report names it
    dataset: str
    caption_path: Optional[str]  # the .txt beside it (textfile); None for filename / instanceprompt
    caption: CaptionRead
    file: Optional[ImageFile]  # for the thumbnail; None: not a regular file (never decoded)
    findings: tuple[Problem, ...] = ()

    @property
    def name(self) -> str:
        return Path(self.image).name

    def line(self) -> str:
        """The caption on one line, as training joins it."""
        return " ".join(caption_lines(self.caption.text))

    def codes(self) -> set[str]:
        return {p.category for p in self.findings}

    def undecodable(self) -> bool:
        return self.file is None or bool(self.codes() & UNDECODABLE)


@dataclass(frozen=True)
class BrowseScan:
    items: list[BrowseItem]
    entries: dict[str, dict]  # dataset id -> its options for a one-image recheck list


def _decode(data: bytes) -> tuple[str, str]:
    """(text, note): UTF-8 (a BOM tolerated), else the engine's guess of the encoding, said."""
    try:
        return data.decode("utf-8-sig"), ""
    except UnicodeDecodeError:
        pass
    if data.startswith((b"\xff\xfe", b"\xfe\xff")) or b"\x00" in data:
        text, enc = data.decode("utf-16", "replace"), "UTF-16"
    else:
        try:
            text, enc = data.decode("cp1252"), "Windows-1252"
        except UnicodeDecodeError:
            text, enc = data.decode("latin-1"), "Latin-1"
    return text, f"not UTF-8 (read as {enc}): Save writes it as UTF-8"


def read_caption(path: Path) -> CaptionRead:
    """The caption file beside an image, read safely (worker side)."""
    name = path.name
    if not os.path.lexists(path):
        return CaptionRead("", f"no caption file: Save writes {name}")
    if os.path.islink(path):
        target, folder = os.path.realpath(path), os.path.realpath(path.parent)
        if os.path.commonpath([target, folder]) != folder:
            return CaptionRead("", f"{name} links outside its folder: not read, not editable", editable=False)
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            return CaptionRead("", f"{name} is not a regular file: not read", editable=False)
        if st.st_size > MAX_CAPTION_BYTES:
            return CaptionRead("", f"{name} is over {MAX_CAPTION_BYTES >> 20} MiB: not loaded", editable=False)
        data = read_regular(path, MAX_CAPTION_BYTES + 1)
    except OSError as e:
        return CaptionRead("", f"cannot read {name}: {e.strerror or e}", editable=False)
    text, note = _decode(data)
    return CaptionRead(text, note, stamp=(st.st_size, st.st_mtime_ns), reencode=bool(note))


def _image_file(path: Path) -> Optional[ImageFile]:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return ImageFile(path, st.st_size, st.st_mtime_ns) if stat.S_ISREG(st.st_mode) else None


def _recheck_options(entry) -> dict:
    """The entry's options that shape the per-image checks and its bucket, for a one-image list."""
    raw = entry.model_dump(mode="json", exclude_none=True, exclude={"id", "instance_data_dir", "cache_dir"})
    raw.update(caption_strategy="textfile", probability=1.0, repeats=0)
    raw.pop("instance_prompt", None)
    return raw


def scan_source(source: str) -> BrowseScan:
    """Every image of the report's source with its caption (worker side). ValueError, one line,
    when the source cannot be read any more."""
    try:
        entries = load_dataset_list(source)
    except (DmadError, OSError) as e:
        raise ValueError(f"cannot list the images of {source}: {e}") from None
    items: list[BrowseItem] = []
    for entry in entries:
        try:
            names = sorted(os.listdir(entry.root))
        except OSError:
            continue  # the check reported the folder
        for name in names:
            if os.path.splitext(name)[1].lower() not in IMAGE_EXTS:
                continue
            image = entry.root / name
            items.append(BrowseItem(str(image), entry.id, *_caption_of(entry, image), _image_file(image)))
    return BrowseScan(items, {e.id: _recheck_options(e) for e in entries})


def _caption_of(entry, image: Path) -> tuple[Optional[str], CaptionRead]:
    if entry.caption_strategy == "filename":
        return None, CaptionRead(filename_caption(image), "the caption is the file name (caption_strategy "
                                                         "filename): rename the image to change it", editable=False)
    if entry.caption_strategy == "instanceprompt":
        return None, CaptionRead(entry.instance_prompt or "", "the dataset's instance_prompt, shared by all its "
                                                             "images: edit it in the dataset list", editable=False)
    caption = image.with_suffix(".txt")
    return str(caption), read_caption(caption)


def write_caption(caption: str, image: str, text: str, stamp: Optional[tuple[int, int]]) -> tuple[str, Any]:
    """Worker side. ("saved", the new stamp), or ("changed", (the stamp now on disk, one line)) when
    the file changed or went since it was read (Save again writes it anyway). ValueError, one line,
    when it cannot be written; nothing is written then."""
    name = Path(caption).name
    if not os.path.lexists(image):
        raise ValueError(f"{Path(image).name} is gone: {name} not written")
    path = _write_target(Path(caption))
    try:
        st = os.stat(path)
    except FileNotFoundError:
        st = None
    except OSError as e:
        raise ValueError(f"cannot save {name}: {e.strerror or e}") from None
    now = None if st is None else (st.st_size, st.st_mtime_ns)
    if now != stamp:
        why = "was deleted" if now is None else "changed on disk"
        return "changed", (now, f"{name} {why} since it was read: not written; Save again to write it anyway")
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise ValueError(f"{name} is not a regular file: not written")
    # the mode bits too: os.access says yes to root, and a rename would replace the file regardless
    if st is not None and (not os.access(path, os.W_OK) or not st.st_mode & 0o222):
        raise ValueError(f"{name} is read-only: not written")
    try:
        atomic_write_text(path, text)
        st = os.stat(path)
    except OSError as e:
        raise ValueError(f"cannot save {name}: {e.strerror or e}") from None
    return "saved", (st.st_size, st.st_mtime_ns)


def _write_target(path: Path) -> Path:
    """A caption that is a link inside its folder (the engine reads those) is written at its target:
    a rename onto the link would replace the link with a file."""
    if not os.path.islink(path):
        return path
    target, folder = os.path.realpath(path), os.path.realpath(path.parent)
    if os.path.commonpath([target, folder]) != folder:
        raise ValueError(f"{path.name} links outside its folder: not written")
    return Path(target)


# ---------------------------------------------------------------- the list model and its filter

class BrowseModel(QAbstractListModel):
    """One row per image: its one-line caption under its thumbnail. Painted rows without a thumbnail
    are collected and `thumbs_wanted(rows)` asks for them once the view pauses."""

    thumbs_wanted = Signal(list)

    def __init__(self, thumb_px: int, parent: Optional[QObject] = None):
        super().__init__(parent)
        self._items: list[BrowseItem] = []
        self._rows: dict[str, int] = {}  # image or caption path -> row
        self._icons: dict[str, QIcon] = {}
        self._wanted: set[int] = set()
        self._placeholder = placeholder_icon(thumb_px)
        self.cell = QSize(thumb_px, thumb_px)  # every item's size (uniform: the view measures one)
        self._timer = QTimer(self)
        self._timer.setSingleShot(True)
        self._timer.setInterval(WANT_DELAY_MS)
        self._timer.timeout.connect(self._ask)

    def set_items(self, items: list[BrowseItem]) -> None:
        self.beginResetModel()
        self._items = items
        self._rows = {}
        for row, item in enumerate(items):
            self._rows[item.image] = row
            if item.caption_path:
                self._rows[item.caption_path] = row
        self._icons.clear()
        self._wanted.clear()
        self.endResetModel()

    def items(self) -> list[BrowseItem]:
        return self._items

    def item(self, row: int) -> BrowseItem:
        return self._items[row]

    def row_of(self, path: str) -> int:
        """The row of an image, or of the image a caption belongs to; -1 when none."""
        return self._rows.get(path, -1)

    def set_findings(self, problems: Sequence[Problem]) -> None:
        by_row: dict[int, list[Problem]] = {}
        for p in problems:
            row = self._rows.get(p.path, -1)
            if row >= 0:
                by_row.setdefault(row, []).append(p)
        for row, item in enumerate(self._items):
            item.findings = tuple(by_row.get(row, ()))
        if self._items:
            self.dataChanged.emit(self.index(0), self.index(len(self._items) - 1))

    def changed(self, row: int) -> None:
        if 0 <= row < len(self._items):
            i = self.index(row)
            self.dataChanged.emit(i, i)

    def set_thumb(self, path: str, icon: Optional[QIcon]) -> None:
        row = self._rows.get(path, -1)
        self._icons[path] = icon if icon is not None else self._placeholder
        if row >= 0:
            i = self.index(row)
            self.dataChanged.emit(i, i, [Qt.DecorationRole])

    def has_thumb(self, row: int) -> bool:
        return self._items[row].image in self._icons

    def rowCount(self, parent: QModelIndex = QModelIndex()) -> int:  # noqa: N802
        return 0 if parent.isValid() else len(self._items)

    def data(self, index: QModelIndex, role: int = Qt.DisplayRole) -> Any:
        if not index.isValid():
            return None
        item = self._items[index.row()]
        if role == Qt.DisplayRole:
            return item.line() or "(no caption)"
        if role == Qt.ToolTipRole:
            found = "".join(f"\n{p.severity}: {p.category}: {p.detail}" for p in item.findings)
            return f"{item.name}\n{item.line() or '(no caption)'}{found}"
        if role == Qt.SizeHintRole:
            return self.cell
        if role == Qt.DecorationRole:
            if item.undecodable():
                return self._placeholder
            icon = self._icons.get(item.image)
            if icon is None:
                self._wanted.add(index.row())
                self._timer.start()
            return icon
        if role == Qt.ForegroundRole and any(p.severity == "error" for p in item.findings):
            return ERROR_COLOR
        return None

    def _ask(self) -> None:
        rows = sorted(r for r in self._wanted if r < len(self._items) and not self.has_thumb(r))
        self._wanted.clear()
        if rows:
            self.thumbs_wanted.emit(rows)


class BrowseFilter(QSortFilterProxyModel):
    """Images with one finding code (ANY: some finding, NONE: none, ALL: every image) whose caption
    or file name holds the search text (case-insensitive)."""

    def __init__(self, parent: Optional[QObject] = None):
        super().__init__(parent)
        self._code = ALL
        self._text = ""

    def set_code(self, code: str) -> None:
        self.beginFilterChange()
        self._code = code
        self.endFilterChange(QSortFilterProxyModel.Direction.Rows)

    def set_text(self, text: str) -> None:
        self.beginFilterChange()
        self._text = " ".join(text.split()).casefold()
        self.endFilterChange(QSortFilterProxyModel.Direction.Rows)

    def code(self) -> str:
        return self._code

    def filterAcceptsRow(self, row: int, parent: QModelIndex) -> bool:  # noqa: N802
        item = self.sourceModel().item(row)
        codes = item.codes()
        if self._code == ANY and not codes or self._code == NONE and codes:
            return False
        if self._code not in (ALL, ANY, NONE) and self._code not in codes:
            return False
        return not self._text or self._text in f"{item.line()}\n{item.name}".casefold()


def filter_choices(items: Sequence[BrowseItem], order: Sequence[str]) -> list[tuple[str, str]]:
    """(label, key) of the filter box: all, with / without findings, then each code found, with the
    number of images it is on, in the engine's order (`order`: the report's counts)."""
    per_code: dict[str, int] = {}
    with_any = 0
    for item in items:
        codes = item.codes()
        with_any += bool(codes)
        for c in codes:
            per_code[c] = per_code.get(c, 0) + 1
    rank = {c: i for i, c in enumerate(order)}
    out = [(f"All images ({len(items)})", ALL), (f"With findings ({with_any})", ANY),
           (f"No findings ({len(items) - with_any})", NONE)]
    return out + [(f"{c} ({n})", c) for c, n in sorted(per_code.items(), key=lambda cn: (rank.get(cn[0], 1e9), cn[0]))]


# ---------------------------------------------------------------- the recheck of one image

@dataclass(frozen=True)
class Recheck:
    """What the engine found for one image alone: its per-file findings and its bucket."""
    image: str
    caption: Optional[str]
    dataset: str
    problems: tuple[Problem, ...]
    bucket: Optional[tuple[int, int]]


def _prepare(item: BrowseItem, options: dict) -> tuple[str, str]:
    """Worker side: a temporary folder with a one-image dataset list; (folder, list file)."""
    tmp = tempfile.mkdtemp(prefix="dmad-recheck-")
    try:
        folder = Path(tmp) / "item"
        folder.mkdir()
        link = folder / item.name
        try:
            os.symlink(item.image, link)
        except OSError:  # no symlinks (Windows without the privilege): a copy checks the same bytes
            shutil.copyfile(item.image, link)
        if item.caption_path and os.path.lexists(item.caption_path):
            (folder / Path(item.caption_path).name).write_bytes(read_regular(item.caption_path, MAX_CAPTION_BYTES + 1))
        listing = Path(tmp) / "list.json"
        listing.write_text(json.dumps([{**options, "id": item.dataset, "instance_data_dir": "item"}]), encoding="utf-8")
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise ValueError(f"cannot check {item.name} again: {e.strerror or e}") from None
    return tmp, str(listing)


def _read_recheck(tmp: str, item: BrowseItem) -> Recheck:
    """Worker side: the one-image report, its paths put back to the real files; the folder removed."""
    try:
        raw = json.loads((Path(tmp) / "report.json").read_text(encoding="utf-8"))
        names = {item.name: item.image}
        if item.caption_path:
            names[Path(item.caption_path).name] = item.caption_path
        problems = tuple(Problem(str(p["category"]), str(p["severity"]), names[Path(p["path"]).name], item.dataset,
                                 str(p.get("detail", "")), ())
                         for p in raw["problems"] if p["category"] not in CROSS_FILE and Path(p["path"]).name in names)
        buckets = raw["summary"].get("buckets") or ()
        bucket = (int(buckets[0]["width"]), int(buckets[0]["height"])) if buckets else None
    except (OSError, ValueError, KeyError, TypeError, IndexError) as e:
        raise ValueError(f"cannot read the recheck of {item.name}: {e}") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return Recheck(item.image, item.caption_path, item.dataset, problems, bucket)


class Rechecker(QObject):
    """`recheck(item, options, flags)` runs check-data on that image alone; one at a time, in order.
    `done(Recheck)` or `failed(image, one line)` answers each."""

    done = Signal(object)
    failed = Signal(str, str)

    def __init__(self, parent: Optional[QObject] = None, program: Optional[Sequence[str]] = None):
        super().__init__(parent)
        self._dmad = DmadCommand(self, program=program, label="dmad check-data (one image)")
        self._dmad.finished.connect(self._on_finished)
        self._queue: list[tuple[BrowseItem, dict, list[str]]] = []
        self._current: Optional[BrowseItem] = None
        self._stale = False  # reset() while the current one ran: its answer is not wanted
        self._flags: list[str] = []
        self._tmp = ""
        self._step = Task(self)
        self._step.done.connect(self._on_step)
        self._step.failed.connect(lambda msg: self._end(None, msg.removeprefix("ValueError: ")))
        self._cleanup = Task(self, every_answer=True)  # a failed command's folder, removed off the GUI thread

    def busy(self) -> bool:
        return self._current is not None or bool(self._queue)

    def reset(self) -> None:
        """A new report: the rechecks asked for the old one are dropped (the running one ends unheard)."""
        self._queue.clear()
        self._stale = self._current is not None

    def recheck(self, item: BrowseItem, options: dict, flags: Sequence[str]) -> None:
        """`flags`: the full check's --resolution / --min-size / --fast, so the image is judged alike."""
        self._queue = [q for q in self._queue if q[0].image != item.image]
        self._queue.append((item, options, list(flags)))
        self._next()

    def _next(self) -> None:
        if self._current is not None or not self._queue:
            return
        item, options, self._flags = self._queue.pop(0)
        self._current = item
        self._step.submit(lambda: _prepare(item, options))

    def _on_step(self, result) -> None:
        if isinstance(result, Recheck):
            self._end(result, "")
            return
        self._tmp, listing = result
        self._dmad.start(["check-data", listing, "--json", str(Path(self._tmp) / "report.json"), "--no-cache",
                          *self._flags])

    def _on_finished(self, code: int, line: str) -> None:
        item, tmp = self._current, self._tmp
        if item is None:
            return
        if code not in (0, 1):
            self._cleanup.submit(lambda: shutil.rmtree(tmp, ignore_errors=True))
            self._end(None, line or f"dmad check-data exited with code {code}")
            return
        self._step.submit(lambda: _read_recheck(tmp, item))

    def _end(self, found: Optional[Recheck], message: str) -> None:
        item, self._current, self._tmp = self._current, None, ""
        stale, self._stale = self._stale, False
        if found is not None and not stale:
            self.done.emit(found)
        elif item is not None and not stale:
            self.failed.emit(item.image, message)
        self._next()


def merge_recheck(report: DataReport, found: Recheck) -> DataReport:
    """The report with one image's per-file findings replaced by a recheck's: counts, errors,
    warnings, usable images (overall, its dataset's, its bucket's) and captioned images follow."""
    paths = {found.image, found.caption} - {None}
    old = [p for p in report.problems if p.path in paths]
    new = [p for p in old if p.category in CROSS_FILE] + list(found.problems)
    at = next((i for i, p in enumerate(report.problems) if p.path in paths), len(report.problems))
    rest = [p for p in report.problems if p.path not in paths]
    problems = rest[:at] + new + rest[at:]  # where the image's findings were (the engine sorts by path)
    counts = dict.fromkeys(report.counts, 0)
    for p in problems:
        counts[p.category] = counts.get(p.category, 0) + 1
    usable = _usable(new) - _usable(old)
    captions = _captioned(new, found.caption) - _captioned(old, found.caption)
    datasets = tuple({**d, "usable": d.get("usable", 0) + usable, "captions": d.get("captions", 0) + captions}
                     if d.get("id") == found.dataset else d for d in report.datasets)
    buckets = tuple(_bucket_after(b, found.bucket, usable, report.batch) for b in report.buckets)
    errors = sum(1 for p in problems if p.severity == "error")
    return dataclasses.replace(report, problems=tuple(problems), counts=counts, errors=errors,
                               warnings=len(problems) - errors, usable=report.usable + usable, datasets=datasets,
                               buckets=buckets, clean=not problems)


def _usable(problems: Sequence[Problem]) -> int:
    return int(not any(p.severity == "error" for p in problems))


def _captioned(problems: Sequence[Problem], caption: Optional[str]) -> int:
    """The engine counts a caption when it could be read as one (dmad.data.check_items)."""
    return int(not any(p.category == "image_without_caption" or (p.path == caption and p.severity == "error")
                       for p in problems))


def _bucket_after(bucket: dict, mine: Optional[tuple[int, int]], usable: int, batch: Optional[int]) -> dict:
    if not usable or mine is None or (bucket.get("width"), bucket.get("height")) != mine:
        return bucket
    n = bucket.get("usable", 0) + usable
    return {**bucket, "usable": n, "full_batches": (n // batch) if batch else bucket.get("full_batches")}
