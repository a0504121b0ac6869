"""A generated data corpus with files for every check-data category plus clean files
(tests/engine/test_check_data.py). `build_corpus(root)` returns {relative path: category} of the
expected problems; `CLEAN` lists files that must have none."""
from __future__ import annotations

import os
import struct
import zlib
from pathlib import Path

import numpy as np
from PIL import Image

SIZE = 96  # corpus images; tests pass --min-size 64
CLEAN = ["clean_a.png", "clean_b.jpg", "clean_c.png", "clean_d.webp", "clean_a.txt", "clean_b.txt",
         "clean_c.txt", "clean_d.txt", "wide.png", "wide.txt"]


def pattern(seed: int, size: tuple[int, int] = (SIZE, SIZE)) -> Image.Image:
    """A structured image (gradients + blocks) whose dHash differs clearly between seeds."""
    rng = np.random.default_rng(seed)
    w, h = size
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    a = rng.uniform(0.02, 0.2, 3)
    arr = np.stack([127 + 120 * np.sin(a[c] * x + a[(c + 1) % 3] * y + c * seed) for c in range(3)], axis=-1)
    blocks = rng.integers(0, 255, (4, 4, 3)).repeat(h // 4 + 1, 0).repeat(w // 4 + 1, 1)[:h, :w]
    return Image.fromarray(((arr + blocks) / 2).clip(0, 255).astype(np.uint8), "RGB")


def bomb_png(width: int = 100_000, height: int = 100_000) -> bytes:
    """A PNG whose IHDR declares width x height (valid CRC) with a tiny IDAT: a decompression bomb header."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    idat = chunk(b"IDAT", zlib.compress(b"\x00" * 16))
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + idat + chunk(b"IEND", b"")


def _img(root: Path, name: str, img: Image.Image, caption: str | None = "a picture of a thing", **save) -> None:
    img.save(root / name, **save)
    if caption is not None:
        (root / name).with_suffix(".txt").write_text(caption, encoding="utf-8")


def build_corpus(root: Path) -> dict[str, str]:
    """Writes the corpus into `root`; returns {file name: expected category} (one per file)."""
    root.mkdir(parents=True, exist_ok=True)
    _img(root, "clean_a.png", pattern(1), "a red circle on a field")
    _img(root, "clean_b.jpg", pattern(2), "\ufeffa caption with a BOM", quality=95)
    _img(root, "clean_c.png", pattern(3), "  trailing spaces are fine  \n")
    _img(root, "clean_d.webp", pattern(4), "webp is fine")
    _img(root, "wide.png", pattern(5, (SIZE * 3, SIZE)), "a wide one")
    expected = {}
    _img(root, "nocap.png", pattern(10), None)
    expected["nocap.png"] = "image_without_caption"
    (root / "orphan.txt").write_text("a caption alone", encoding="utf-8")
    expected["orphan.txt"] = "caption_without_image"
    _img(root, "empty.png", pattern(11), "  \n\t ")
    expected["empty.txt"] = "empty_caption"
    _img(root, "latin.png", pattern(12), None)
    (root / "latin.txt").write_bytes("caf\u00e9 cr\u00e8me".encode("cp1252"))
    expected["latin.txt"] = "caption_not_utf8"
    _img(root, "utf16.png", pattern(13), None)
    (root / "utf16.txt").write_bytes("hello".encode("utf-16"))
    expected["utf16.txt"] = "caption_not_utf8"
    _img(root, "multi.png", pattern(14), "line one\nline two")
    expected["multi.txt"] = "caption_multiline"
    good = root / "truncated.png"
    pattern(15).save(good)
    good.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    (root / "truncated.txt").write_text("cut in half", encoding="utf-8")
    expected["truncated.png"] = "image_corrupt"
    (root / "garbage.jpg").write_bytes(b"this is not an image at all" * 10)
    (root / "garbage.txt").write_text("junk", encoding="utf-8")
    expected["garbage.jpg"] = "image_corrupt"
    _img(root, "tiny.png", pattern(16, (32, 48)))
    expected["tiny.png"] = "image_too_small"
    _img(root, "solid.png", Image.new("RGB", (SIZE, SIZE), (40, 90, 200)))
    expected["solid.png"] = "image_near_constant"
    (root / "copy_of_a.png").write_bytes((root / "clean_a.png").read_bytes())
    (root / "copy_of_a.txt").write_text("same bytes", encoding="utf-8")
    expected["copy_of_a.png"] = "duplicate_exact"
    _img(root, "near_c.jpg", pattern(3), "a re-encoded copy", quality=80)
    expected["near_c.jpg"] = "duplicate_near"
    _img(root, "twin.png", pattern(17))
    _img(root, "twin.jpg", pattern(18))
    expected["twin.png"] = expected["twin.jpg"] = "stem_two_images"
    _img(root, "cmyk.jpg", pattern(19).convert("CMYK"))
    expected["cmyk.jpg"] = "unusual_mode"
    _img(root, "alpha.png", pattern(20).convert("RGBA"))
    expected["alpha.png"] = "unusual_mode"
    (root / "bomb.png").write_bytes(bomb_png())
    (root / "bomb.txt").write_text("a bomb", encoding="utf-8")
    expected["bomb.png"] = "pixel_limit_exceeded"
    if os.name != "nt":
        _special_files(root, expected)
    return expected


def _special_files(root: Path, expected: dict[str, str]) -> None:
    os.symlink(root / "missing_target.png", root / "dangling.png")
    (root / "dangling.txt").write_text("points nowhere", encoding="utf-8")
    expected["dangling.png"] = "broken_symlink"
    os.symlink("loop_b.png", root / "loop_a.png")
    os.symlink("loop_a.png", root / "loop_b.png")
    for n in ("loop_a", "loop_b"):
        (root / f"{n}.txt").write_text("loops", encoding="utf-8")
        expected[f"{n}.png"] = "symlink_loop"
    (root.parent / "private.txt").write_text("root:secret-hash:19000:0:99999:7:::", encoding="utf-8")
    _img(root, "linked_caption.png", pattern(22), caption=None)
    os.symlink(root.parent / "private.txt", root / "linked_caption.txt")  # never read as a caption
    expected["linked_caption.txt"] = "caption_link_outside"
    os.mkfifo(root / "fifo.png")
    (root / "fifo.txt").write_text("a pipe", encoding="utf-8")
    expected["fifo.png"] = "file_unreadable"
    _img(root, "locked.png", pattern(21))
    os.chmod(root / "locked.png", 0)
    if os.access(root / "locked.png", os.R_OK):  # root ignores permissions: no problem to expect
        os.chmod(root / "locked.png", 0o644)
    else:
        expected["locked.png"] = "file_unreadable"
