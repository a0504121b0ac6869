"""Worker-side image decoding without Qt's image readers (app/models/decode.py): the same pixels
as Qt's reader, transparency kept, EXIF orientation applied as the engine applies it, a null
image for bytes that are not one; and no app module calls a Qt image reader, whose GIL-held format
probe deadlocked the GUI thread once (the module's docstring)."""
from __future__ import annotations

import ast
import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from PySide6.QtGui import QImage

from app.models.decode import decode_image

APP = Path(__file__).resolve().parents[2] / "app"


def _png(im: Image.Image, **kw) -> bytes:
    buf = io.BytesIO()
    im.save(buf, format="PNG", **kw)
    return buf.getvalue()


def _pixels(img: QImage, fmt=QImage.Format_RGBA8888) -> np.ndarray:
    img = img.convertToFormat(fmt)
    arr = np.frombuffer(bytes(img.constBits()), np.uint8).reshape(img.height(), img.bytesPerLine())
    return arr[:, : img.width() * 4].reshape(img.height(), img.width(), 4).copy()


@pytest.mark.parametrize("mode", ["RGB", "L", "P", "RGBA"])
def test_the_pixels_are_qts_own(mode):
    rng = np.random.default_rng(0)
    rgba = rng.integers(0, 256, (13, 21, 4), dtype=np.uint8)
    im = Image.fromarray(rgba, "RGBA")
    im = im.convert(mode) if mode != "P" else im.convert("RGB").quantize(17)
    data = _png(im)
    got, want = decode_image(data), QImage.fromData(data)
    assert not got.isNull() and (got.width(), got.height()) == (21, 13)
    assert got.format() == (QImage.Format_RGBA8888 if mode == "RGBA" else QImage.Format_RGB888)
    assert np.array_equal(_pixels(got), _pixels(want))


def test_transparency_is_kept():
    im = Image.new("RGBA", (4, 3), (10, 20, 30, 0))
    im.putpixel((1, 1), (200, 100, 50, 128))
    got = _pixels(decode_image(_png(im)))
    assert got[1, 1].tolist() == [200, 100, 50, 128] and got[0, 0, 3] == 0
    palette = Image.new("P", (2, 2), 0)
    palette.putpalette([0, 0, 0, 255, 0, 0] + [0] * 762)
    palette.info["transparency"] = 0
    assert decode_image(_png(palette, transparency=0)).format() == QImage.Format_RGBA8888


def test_exif_orientation_turns_the_image_upright_as_training_reads_it():
    im = Image.new("RGB", (6, 2), (0, 0, 255))
    im.putpixel((0, 0), (255, 0, 0))
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise to view
    buf = io.BytesIO()
    im.save(buf, format="PNG", exif=exif)
    got = decode_image(buf.getvalue())
    assert (got.width(), got.height()) == (2, 6)
    assert _pixels(got)[0, 1, :3].tolist() == [255, 0, 0]  # the top-left pixel went to the top right


@pytest.mark.parametrize("data", [b"", b"not an image", b"\x89PNG\r\n\x1a\n" + b"\0" * 40])
def test_bytes_that_are_not_an_image_give_a_null_image(data):
    assert decode_image(data).isNull()


def test_a_truncated_png_gives_a_null_image():
    data = _png(Image.new("RGB", (64, 64), (1, 2, 3)))
    assert decode_image(data[: len(data) // 2]).isNull()


def test_no_app_module_calls_a_qt_image_reader():
    readers = {"fromData", "loadFromData", "QImageReader"}
    found = []
    for path in sorted(APP.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else None
            if name in readers:
                found.append(f"{path.relative_to(APP.parent)}:{node.lineno} {name}")
    assert not found, found
