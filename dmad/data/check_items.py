"""Per-file checks of `dmad check-data` (dmad.data.check): what one image or one caption says about
itself, without looking at any other file. Torch-free (stdlib, PIL, numpy), thread-safe and
picklable (ImageInfo): the checks run in forked worker processes or in a thread pool, where PIL
and hashlib release the GIL while they decode and hash.

Nothing here may crash or hang on any file: a path is lstat'ed before it is opened, so symlink
loops, dangling links, FIFOs and device files are reported, never opened."""
from __future__ import annotations

import errno
import hashlib
import io
import os
import re
import stat
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np
from PIL import Image, UnidentifiedImageError

from dmad.contract.jsonfile import printable


DEFAULT_MAX_PIXELS = 89_478_485  # PIL's default limit (a 1 GB RGBA image / 4 / 3)
NEAR_CONSTANT_STD = 2.0  # largest per-channel std (0-255) of a 32 x 32 downscale below which an image is "near-constant"
# JPEGs decode at 1/2..1/8 scale (DCT scaling), not below the 32 px thumbnail; the whole stream is
# still decoded, so truncation is found.
DRAFT_SIZE = (32, 32)
UNUSUAL_MODES = {"CMYK": "CMYK", "I;16": "16-bit", "I;16B": "16-bit", "I;16L": "16-bit", "I": "32-bit integer",
                 "F": "32-bit float", "RGBA": "alpha channel", "LA": "alpha channel", "PA": "palette with alpha",
                 "P": "palette", "1": "1-bit", "YCbCr": "YCbCr", "LAB": "LAB", "HSV": "HSV"}


@dataclass
class Problem:
    category: str
    path: str
    detail: str
    related: list[str] = field(default_factory=list)


# Stable ids (the JSON report and the app use them) -> (severity, one-line description). Errors make
# an image unusable; warnings do not.
CATEGORIES: dict[str, tuple[str, str]] = {
    "image_without_caption": ("error", "image without a caption file"),
    "caption_without_image": ("warning", "caption file without an image"),
    "empty_caption": ("error", "empty or whitespace-only caption"),
    "caption_not_utf8": ("error", "caption is not valid UTF-8"),
    "caption_multiline": ("warning", "newline or tab inside a caption"),
    "image_corrupt": ("error", "unreadable, corrupt or truncated image"),
    "image_too_small": ("error", "image below the minimum size"),
    "image_near_constant": ("warning", "solid or near-constant image"),
    "duplicate_exact": ("warning", "byte-identical to another image"),
    "duplicate_near": ("warning", "near duplicate of another image (perceptual hash)"),
    "stem_two_images": ("error", "one stem, two image extensions: the caption is ambiguous"),
    "unusual_mode": ("warning", "unusual mode: CMYK, 16-bit, alpha or palette"),
    "pixel_limit_exceeded": ("error", "declared dimensions beyond the safe pixel limit, refused without decoding"),
    "file_unreadable": ("error", "file cannot be read (permissions, or not a regular file)"),
    "broken_symlink": ("error", "symbolic link to a missing file"),
    "symlink_loop": ("error", "symbolic link loop"),
    "caption_link_outside": ("error", "caption is a symbolic link to a file outside its folder: not read"),
    "no_images": ("error", "no images in the folder"),
}


def severity(category: str) -> str:
    return CATEGORIES[category][0]


@dataclass
class ImageInfo:
    """What the pass learns about one image: its problems and, when readable, what the
    cross-file checks (duplicates, buckets) need."""

    problems: list[Problem] = field(default_factory=list)
    size: Optional[tuple[int, int]] = None  # from the header
    sha1: Optional[str] = None  # None: not read, or (fast mode) no other image has its byte size
    dhash: Optional[int] = None  # None for near-constant or undecodable images
    colour: Optional[np.ndarray] = None  # (48,) uint8: a 4 x 4 RGB thumbnail, set with dhash
    decoded: bool = False
    read: bool = False  # the bytes were read: the result depends only on them (cacheable)


def info_to_json(info: ImageInfo) -> dict:
    """The cacheable part of an ImageInfo (dmad.data.check's fingerprint cache): problem paths are
    left out because the cache is keyed by the path, and put back by info_from_json."""
    return {"problems": [[p.category, p.detail] for p in info.problems],
            "size": list(info.size) if info.size else None, "sha1": info.sha1, "dhash": info.dhash,
            "colour": info.colour.tobytes().hex() if info.colour is not None else None, "decoded": info.decoded}


def info_from_json(obj: dict, path: str, categories) -> Optional[ImageInfo]:
    """The ImageInfo info_to_json saved, or None when `obj` is not one (a damaged or foreign cache
    entry is a miss, never an error). `categories`: the known problem ids."""
    try:
        problems = [Problem(str(c), path, str(d)) for c, d in obj["problems"]]
        size, sha1, dhash, colour = obj["size"], obj["sha1"], obj["dhash"], obj["colour"]
        ok = (all(p.category in categories for p in problems)
              and (sha1 is None or (isinstance(sha1, str) and len(sha1) == 40))
              and (size is None or (len(size) == 2 and all(type(v) is int and v >= 0 for v in size)))
              and (dhash is None or (type(dhash) is int and 0 <= dhash < 1 << 64))
              and (colour is None or (isinstance(colour, str) and len(colour) == 96))
              and isinstance(obj["decoded"], bool))
        if not ok:
            return None
        arr = None if colour is None else np.frombuffer(bytes.fromhex(colour), dtype=np.uint8).copy()
        if (arr is None) != (dhash is None):
            return None
        return ImageInfo(problems=problems, size=tuple(size) if size else None, sha1=sha1, dhash=dhash,
                         colour=arr, decoded=obj["decoded"], read=True)
    except (KeyError, TypeError, ValueError):
        return None


def quiet_bomb_warnings() -> None:
    """PIL's own bomb check (a warning above Image.MAX_IMAGE_PIXELS, an error above twice that)
    runs inside Image.open; we refuse above `max_pixels` from the header ourselves, so the warning
    would only repeat that on stderr (the error is caught). Called by each entry point, from the
    calling thread, because warning filters are process-wide and callers (pytest) may reset them."""
    warnings.filterwarnings("ignore", category=Image.DecompressionBombWarning)


def path_problem(path: Path) -> Optional[Problem]:
    """A problem when `path` cannot be opened as a regular file, checked without opening it."""
    return stat_regular(path)[1]


def stat_regular(path: Path) -> tuple[Optional[os.stat_result], Optional[Problem]]:
    """(the stat of the file `path` names, symlinks followed; None) for a regular file, else (None,
    the problem), without opening it. The fingerprint cache keys results on this stat, so a warm
    re-check costs one lstat per image (two for a symlink) and no read."""
    p = str(path)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None, Problem("file_unreadable", p, "the file disappeared during the check")
    except OSError as e:
        return None, Problem("file_unreadable", p, f"cannot stat: {e.strerror or e}")
    if stat.S_ISLNK(st.st_mode):
        try:
            st = os.stat(path)
        except OSError as e:
            if e.errno == errno.ELOOP:
                return None, Problem("symlink_loop", p, "the symbolic link points back into itself (a loop)")
            if e.errno in (errno.ENOENT, errno.ENOTDIR):
                return None, Problem("broken_symlink", p,
                                     f"the symbolic link points to a missing file: {_target(path)}")
            return None, Problem("file_unreadable", p, f"cannot follow the symbolic link: {e.strerror or e}")
    if not stat.S_ISREG(st.st_mode):
        return None, Problem("file_unreadable", p, "not a regular file (a folder, FIFO, socket or device): not opened")
    return st, None


def _target(path: Path) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return "?"


def read_bytes(path: Path) -> tuple[Optional[bytes], Optional[Problem]]:
    # O_NONBLOCK: if a regular file was swapped for a FIFO since the lstat, open must not block.
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)
    try:
        fd = os.open(path, flags)
    except OSError as e:
        return None, Problem("file_unreadable", str(path), f"cannot open: {e.strerror or e}")
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None, Problem("file_unreadable", str(path), "not a regular file: not read")
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read(), None
    except OSError as e:
        return None, Problem("file_unreadable", str(path), f"cannot read: {e.strerror or e}")
    finally:
        os.close(fd)


def check_image_file(path: Path, min_size: int, max_pixels: int) -> ImageInfo:
    return check_image_with(path, min_size, max_pixels, _inspect)


def check_image_with(path: Path, min_size: int, max_pixels: int, inspect, sha1: bool = True) -> ImageInfo:
    """Read the file once, hash it (unless not `sha1`), open it with PIL (header only) and run
    `inspect(img, path, info, min_size, max_pixels, data)`: the full check decodes (_inspect), the
    fast one walks the file's structure (dmad.data.check_fast). Any failure is a problem of the
    image, never an exception."""
    info = ImageInfo()
    bad = path_problem(path)
    if bad is None:
        data, bad = read_bytes(path)
    if bad is not None:
        info.problems.append(bad)
        return info
    info.read = True
    if sha1:
        info.sha1 = hashlib.sha1(data).hexdigest()
    try:
        inspect(Image.open(io.BytesIO(data)), str(path), info, min_size, max_pixels, data)
    except Image.DecompressionBombError as e:  # PIL's own hard limit, hit inside Image.open
        found = re.search(r"\((\d+) pixels\)", str(e))
        declared = f"declares {found.group(1)} pixels" if found else "declares too many pixels"
        info.problems.append(Problem("pixel_limit_exceeded", str(path), f"{declared}, above the limit of "
                                                                        f"{max_pixels}: refused without decoding"))
    except UnidentifiedImageError:
        info.problems.append(Problem("image_corrupt", str(path),
                                     "not an image PIL can read (unknown or damaged header)"))
    except Exception as e:  # noqa: BLE001 - any decoder failure is a corrupt image, never a crash
        info.problems.append(Problem("image_corrupt", str(path), _one_line(f"{type(e).__name__}: {e}")))
    return info


def check_header(img: Image.Image, p: str, info: ImageInfo, min_size: int, max_pixels: int) -> bool:
    """The checks of the header alone (size, pixel limit, minimum size, mode); False when the image
    must not be decoded (beyond the pixel limit)."""
    w, h = img.size
    info.size = (w, h)
    if w * h > max_pixels:
        info.problems.append(Problem("pixel_limit_exceeded", p, f"declares {w}x{h} = {w * h} pixels, above the "
                                                                f"limit of {max_pixels}: refused without decoding"))
        return False
    if min(w, h) < min_size:
        info.problems.append(Problem("image_too_small", p, f"{w}x{h}: shorter side below --min-size {min_size}"))
    mode = _unusual_mode(img)
    if mode:
        info.problems.append(Problem("unusual_mode", p, f"mode {img.mode} ({mode}): converted to RGB for training"))
    return True


def _inspect(img: Image.Image, p: str, info: ImageInfo, min_size: int, max_pixels: int, data: bytes = b"") -> None:
    with img:
        if not check_header(img, p, info, min_size, max_pixels):
            return
        if img.format == "JPEG":
            img.draft("RGB", DRAFT_SIZE)
        img.load()  # decodes everything: truncation and corruption raise here
        info.decoded = True
        _fingerprint(img, p, info)


def _unusual_mode(img: Image.Image) -> str:
    if img.mode in ("RGB", "L"):
        return "transparency" if "transparency" in img.info else ""
    return UNUSUAL_MODES.get(img.mode, "unusual")


def _fingerprint(img: Image.Image, p: str, info: ImageInfo) -> None:
    """Near-constant test and a 64-bit difference hash (dHash), both from one 32 x 32 grey
    thumbnail: a single box downscale of the decoded image, so the full-size pixels are walked once."""
    if img.mode not in ("RGB", "L"):
        img = _grey_wide(img) if img.mode in ("I;16", "I;16B", "I;16L", "I", "F") else img.convert("RGB")
    thumb = img.resize((32, 32), Image.BOX).convert("RGB")
    # per-channel spread: a red shape on a grey of the same luminance is not "constant"
    spread = float(np.asarray(thumb, dtype=np.float32).reshape(-1, 3).std(axis=0).max())
    if spread < NEAR_CONSTANT_STD:
        info.problems.append(Problem("image_near_constant", p, f"solid or near-constant (colour std {spread:.2f})"))
        return
    d = np.asarray(thumb.convert("L").resize((9, 8), Image.BOX), dtype=np.int16)
    bits = (d[:, 1:] > d[:, :-1]).ravel()
    info.dhash = int(np.packbits(bits).view(">u8")[0])
    # dHash is luminance gradients only: flat images with a small shape share most of their bits
    # whatever the colours, so near duplicates must also agree on a 4 x 4 colour layout
    info.colour = np.asarray(thumb.resize((4, 4), Image.BOX), dtype=np.uint8).ravel()


def _grey_wide(img: Image.Image) -> Image.Image:
    arr = np.asarray(img, dtype=np.float64)
    span = float(arr.max() - arr.min()) or 1.0
    return Image.fromarray(((arr - arr.min()) * (255.0 / span)).astype(np.uint8), "L")


def _one_line(text: str) -> str:
    return " ".join(text.split())[:300] or "unknown error"


def guess_encoding(data: bytes) -> str:
    """The likely encoding of caption bytes that are not UTF-8 (a heuristic, said as such)."""
    if data.startswith((b"\xff\xfe", b"\xfe\xff")) or b"\x00" in data:
        return "UTF-16"
    try:
        data.decode("cp1252")
        return "Windows-1252 (cp1252)"
    except UnicodeDecodeError:
        return "Latin-1 (ISO-8859-1)"


def check_caption_file(path: Path) -> tuple[list[Problem], Optional[str]]:
    """Problems of one caption file, and its text when it can be used. A caption linked to a file
    outside its own folder is not read: a link to /etc/shadow must not become a caption (shown in
    the report, trained on)."""
    bad = _link_outside(path) or path_problem(path)
    data = None
    if bad is None:
        data, bad = read_bytes(path)
    if bad is not None:
        return [bad], None
    return check_caption_bytes(data, str(path))


def _link_outside(path: Path) -> Optional[Problem]:
    if not os.path.islink(path):
        return None
    target, folder = os.path.realpath(path), os.path.realpath(path.parent)
    if os.path.commonpath([target, folder]) == folder:
        return None
    return Problem("caption_link_outside", str(path), f"a symbolic link to {printable(target)}, outside "
                                                      f"{printable(folder)}: not read (copy the file in instead)")


def check_caption_bytes(data: bytes, p: str) -> tuple[list[Problem], Optional[str]]:
    if data.startswith((b"\xff\xfe", b"\xfe\xff")) or b"\x00" in data:
        return [Problem("caption_not_utf8", p, "not UTF-8: likely UTF-16; save it as UTF-8")], None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        return [Problem("caption_not_utf8", p, f"not UTF-8 (byte {e.start}): likely {guess_encoding(data)}; "
                                               "save it as UTF-8")], None
    if not text.strip():
        return [Problem("empty_caption", p, "empty or whitespace-only")], None
    inner = text.strip()
    if any(c in inner for c in "\n\r\t"):
        return [Problem("caption_multiline", p, "newline or tab inside: joined into one line with spaces")], inner
    return [], inner
