"""Images decoded off the GUI thread, without Qt's image readers.

Pool workers (thumbnails, the A/B view, the data browser's preview, a one-off sample) decode with
Pillow and hand the pixels to a QImage. Qt's own readers (QImage.fromData, loadFromData,
QImageReader) must not run there: PySide6 keeps the GIL through them, and a reader's format probe
takes Qt's signal-slot mutex (the SVG plugin's isLikelySvg builds a QTextStream, a QObject). When
the GUI thread holds that mutex in a disconnect and waits for the GIL to look for a Python
override, neither ever goes on: the app froze so once in the test suite (2026-12-07, a thumbnail
job in QSvgDocument::isLikelySvg against QObject::disconnect on the GUI thread; the same class of
deadlock as GafferHQ/gaffer#4557, "PySide puts us in a position where we're running pure C++ code
while unwittingly holding the GIL"). Pillow takes no Qt lock, and a QImage made from pixels
touches no QObject.

Images are turned upright by their EXIF orientation, as the engine reads them for training
(dmad.data.loading), so a preview shows what trains.
"""
from __future__ import annotations

import io

from PIL import Image, ImageOps
from PySide6.QtGui import QImage


def _has_alpha(im: Image.Image) -> bool:
    return im.mode in ("RGBA", "LA", "PA", "RGBa", "La") or (im.mode == "P" and "transparency" in im.info)


def decode_image(data: bytes) -> QImage:
    """`data` (an image file's bytes) as an RGB888 QImage, or RGBA8888 when it has transparency;
    a null QImage when Pillow cannot decode it (not an image, truncated, too large to be safe)."""
    try:
        with Image.open(io.BytesIO(data)) as src:
            upright = ImageOps.exif_transpose(src)
            im = upright.convert("RGBA" if _has_alpha(upright) else "RGB")
    except Exception:  # noqa: BLE001 - any file that does not decode is a null image, as Qt's readers give
        return QImage()
    fmt, channels = (QImage.Format_RGBA8888, 4) if im.mode == "RGBA" else (QImage.Format_RGB888, 3)
    pixels = im.tobytes()
    # copy(): the QImage must own its pixels; `pixels` is freed when this returns
    return QImage(pixels, im.width, im.height, channels * im.width, fmt).copy()
