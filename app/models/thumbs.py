"""Sample thumbnails: decoded in pool workers, cached on disk, delivered to the GUI thread in batches.

A thumbnail is keyed by the source's path, byte size and mtime plus the thumbnail size, so a
re-rendered image gets a new thumbnail and a stale one is never shown. Cache files are raw RGB888
pixels behind a 16-byte header (at most 48 KiB for 128 px): reading one costs ~0.05 ms, where
decoding a cached PNG took ~1 ms for a detailed 128 px image and decoding and scaling the sample
itself several ms; that is what makes a reopened 50 x 20 grid fill in well under a second. Files
are written to a temporary name and renamed, so a crash never leaves half a thumbnail under a key.

Only QImage is used off the GUI thread (QPixmap is GUI-thread only); the view makes pixmaps.
"""
from __future__ import annotations

import hashlib
import os
import struct
import threading
from pathlib import Path
from typing import Iterable, Optional

from PySide6.QtCore import QObject, QStandardPaths, Qt, QThreadPool, Signal
from PySide6.QtGui import QImage

from app.engine.background import Task
from app.models.decode import decode_image
from app.models.sample_index import ImageFile
from dmad.contract.regular import read_regular

THUMB_PX = 128
_MAGIC = b"DMTH"
_HEADER = struct.Struct("<4sIII")  # magic, width, height, bytes per line
BATCH = 48  # images per worker job: small enough that the grid fills in visibly, large enough to be cheap


def default_cache_dir() -> Path:
    base = QStandardPaths.writableLocation(QStandardPaths.CacheLocation) or str(Path.home() / ".cache" / "dmad-studio")
    return Path(base) / "thumbs"


def cache_key(image: ImageFile, px: int) -> str:
    raw = f"{os.path.abspath(image.path)}|{image.size}|{image.mtime_ns}|{px}"
    return hashlib.sha1(raw.encode("utf-8")).hexdigest()


def scale_to_thumb(img: QImage, px: int) -> QImage:
    """Larger images are scaled down smoothly; smaller ones are kept as they are (the view enlarges
    them without smoothing, so a 64 px render keeps its pixels)."""
    if max(img.width(), img.height()) <= px:
        return img
    return img.scaled(px, px, Qt.KeepAspectRatio, Qt.SmoothTransformation)


class ThumbCache:
    """Thread-safe: workers call `load`. `decodes` counts source images decoded, `hits` cache reads."""

    def __init__(self, folder: Optional[Path] = None, px: int = THUMB_PX):
        self.folder = Path(folder) if folder is not None else default_cache_dir()
        self.px = px
        self.decodes = 0
        self.hits = 0
        self._lock = threading.Lock()

    def _path(self, image: ImageFile) -> Path:
        key = cache_key(image, self.px)
        return self.folder / key[:2] / f"{key}.rgb"

    def load(self, image: ImageFile) -> QImage:
        """The thumbnail of `image` (a null QImage when the source cannot be decoded)."""
        cached = self._path(image)
        if cached.is_file():
            thumb = _read_raw(cached)
            if thumb is not None:
                with self._lock:
                    self.hits += 1
                return thumb
        src = decode_image(read_regular(image.path))  # a FIFO swapped in is refused, never waited on
        with self._lock:
            self.decodes += 1
        if src.isNull():
            return src
        thumb = scale_to_thumb(src, self.px).convertToFormat(QImage.Format_RGB888)
        self._store(cached, thumb)
        return thumb

    def _store(self, path: Path, thumb: QImage) -> None:
        # A cache that cannot be written (read-only home, full disk) only costs speed.
        tmp = path.with_name(f"{path.stem}.{os.getpid()}.{threading.get_ident()}.tmp")
        h, bpl = thumb.height(), thumb.bytesPerLine()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(tmp, "wb") as f:
                f.write(_HEADER.pack(_MAGIC, thumb.width(), h, bpl))
                f.write(bytes(thumb.constBits())[: h * bpl])
            os.replace(tmp, path)
        except OSError:
            try:
                tmp.unlink()
            except OSError:
                pass


def _read_raw(path: Path) -> Optional[QImage]:
    """A cached thumbnail; None when the file is not one (truncated, another format)."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    if len(data) < _HEADER.size:
        return None
    magic, w, h, bpl = _HEADER.unpack_from(data)
    if magic != _MAGIC or w == 0 or h == 0 or bpl < 3 * w or len(data) != _HEADER.size + h * bpl:
        return None
    # copy(): the QImage must own its pixels, `data` is freed when this returns
    return QImage(data[_HEADER.size:], w, h, bpl, QImage.Format_RGB888).copy()


def _decode_batch(cache: ThumbCache, images: list[ImageFile]) -> list[tuple[ImageFile, QImage]]:
    """Worker side: each image's thumbnail; a null QImage for one that cannot be read."""
    out = []
    for image in images:
        try:
            out.append((image, cache.load(image)))
        except Exception:  # one unreadable file must not lose the batch
            out.append((image, QImage()))
    return out


class ThumbLoader(QObject):
    """`request(images)` decodes in the pool; `loaded([(ImageFile, QImage)])` comes back on the GUI
    thread. `reset()` (a new run) drops the answers of jobs still running for the old one."""

    loaded = Signal(object)

    def __init__(self, cache: ThumbCache, parent: Optional[QObject] = None, pool: Optional[QThreadPool] = None):
        super().__init__(parent)
        self.cache = cache
        self._task = Task(self, pool, every_answer=True)
        self._task.done.connect(self._deliver)
        self._inflight: set[ImageFile] = set()  # a rescan during a slow cold fill asks again: skipped

    def reset(self) -> None:
        self._task.reset()
        self._inflight.clear()

    def request(self, images: Iterable[ImageFile]) -> None:
        images = [img for img in images if img not in self._inflight]
        self._inflight.update(images)
        for i in range(0, len(images), BATCH):
            batch = images[i:i + BATCH]
            self._task.submit(lambda cache=self.cache, batch=batch: _decode_batch(cache, batch))

    def busy(self) -> bool:
        return self._task.busy()

    def _deliver(self, result: list) -> None:
        self._inflight.difference_update(image for image, _ in result)
        self.loaded.emit(result)
