"""The header-only mode of `dmad check-data --fast` (docs/check-data.md): per image, everything that
needs no pixels. The file is read once (SHA-1 for exact duplicates), PIL reads the header (size,
mode, pixel limit, minimum size: the same checks and details as the full pass, dmad.data.check_items),
and truncation and corruption are found from the file's structure instead of by decoding:

- PNG: the chunk list from the signature: every chunk fits in the file and its CRC-32 (over type and
  data) matches, IHDR first, at least one IDAT, and an IEND chunk (bytes after IEND are allowed: PIL
  and training ignore them).
- JPEG: SOI first, every marker segment up to the first SOS fits, and an EOI marker (FF D9) after the
  start of the scan data (searched from the end, so bytes after EOI, as some cameras append, are
  allowed; FF D9 cannot occur inside entropy-coded data, where every FF is stuffed as FF 00).
- WebP: the RIFF size fits in the file (trailing bytes allowed) and every RIFF chunk fits.
- BMP: the pixel data (offset + rows of the declared size and bit depth, or the declared image size
  when compressed) and the declared file size fit in the file.
- Anything else PIL identifies (say a GIF named .png): the header only.

Not found here (said in the summary and the docs): corruption inside the compressed data of a PNG
whose CRCs are valid (a file written damaged), and damage inside a JPEG scan that keeps its length
and EOI; the near-constant and near-duplicate checks need pixels and are skipped (SKIPPED_CHECKS).
Torch-free, and picklable results, like dmad.data.check_items."""
from __future__ import annotations

import struct
import zlib
from pathlib import Path
from typing import Optional

from PIL import Image

from dmad.data.check_items import ImageInfo, Problem, check_header, check_image_with

SKIPPED_CHECKS = ("image_near_constant", "duplicate_near")  # need decoded pixels: not run in fast mode
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def check_image_fast(path: Path, min_size: int, max_pixels: int, sha1: bool = True) -> ImageInfo:
    """check_image_file without decoding: the header checks and a structural walk of the file.
    `sha1` False: no SHA-1 (dmad.data.check passes it for a file whose byte size no other image
    has: it cannot be a byte copy, and hashing is a quarter of the fast mode's time)."""
    return check_image_with(path, min_size, max_pixels, _inspect_fast, sha1)


def _inspect_fast(img: Image.Image, p: str, info: ImageInfo, min_size: int, max_pixels: int, data: bytes) -> None:
    with img:
        if not check_header(img, p, info, min_size, max_pixels):
            return
        fmt = img.format
    walk = _WALKS.get(fmt)
    why = walk(data) if walk else None
    if why:
        info.problems.append(Problem("image_corrupt", p, f"{fmt}: {why}"))


def png_problem(data: bytes) -> Optional[str]:
    """None when the chunk list is whole, else one line saying where it breaks."""
    n, view = len(data), memoryview(data)  # CRCs over views: no copy of the image data
    if data[:8] != PNG_SIGNATURE:
        return "no PNG signature"
    pos, last, idat = 8, "", 0
    crc32, unpack = zlib.crc32, struct.unpack_from
    while True:
        if pos + 8 > n:
            return (f"no IEND chunk: the file ends at byte {n}, after chunk {last or 'none'}" if pos == n
                    else f"truncated in a chunk header at byte {pos}")
        length, = unpack(">I", data, pos)
        kind = data[pos + 4:pos + 8]
        name = kind.decode("latin-1")
        if not kind.isalpha():
            return f"not a chunk type at byte {pos + 4} ({kind!r})"
        if length > 0x7FFFFFFF:
            return f"chunk {name} at byte {pos} declares an invalid length {length}"
        end = pos + 12 + length
        if end > n:
            return f"truncated in chunk {name} at byte {n} (the chunk needs {end - n} more bytes)"
        if not last and kind != b"IHDR":
            return f"the first chunk is {name}, not IHDR"
        last = name
        stored, = unpack(">I", data, end - 4)
        if crc32(view[pos + 4:end - 4]) != stored:
            return f"CRC mismatch in chunk {name} at byte {pos}"
        if kind == b"IDAT":
            idat += 1
        elif kind == b"IEND":
            return None if idat else "no IDAT chunk before IEND"
        pos = end


_STANDALONE = frozenset([0x01, *range(0xD0, 0xD8)])  # TEM, RST0-7: markers without a length


def jpeg_problem(data: bytes) -> Optional[str]:
    n = len(data)
    if n < 4 or data[0] != 0xFF or data[1] != 0xD8:
        return "no SOI marker at the start"
    pos = 2
    while True:
        while pos + 1 < n and data[pos] == 0xFF and data[pos + 1] == 0xFF:
            pos += 1  # fill bytes before a marker
        if pos + 2 > n:
            return f"truncated before the image data (at byte {pos})"
        if data[pos] != 0xFF:
            return f"no marker at byte {pos} (0x{data[pos]:02X})"
        marker = data[pos + 1]
        if marker in _STANDALONE:
            pos += 2
            continue
        if marker == 0xD9:
            return f"EOI at byte {pos} before any image data (no SOS)"
        if pos + 4 > n:
            return f"truncated in marker 0x{marker:02X} at byte {n}"
        length = (data[pos + 2] << 8) | data[pos + 3]
        if length < 2:
            return f"marker 0x{marker:02X} at byte {pos} declares an invalid length {length}"
        end = pos + 2 + length
        if end > n:
            return f"truncated in marker 0x{marker:02X} at byte {n} (the segment needs {end - n} more bytes)"
        if marker == 0xDA:  # SOS: entropy-coded data follows; the file must end with EOI after it
            eoi = data.rfind(b"\xff\xd9", end)
            return None if eoi >= 0 else (f"truncated in the scan data: no EOI marker (FF D9) after it, the file "
                                          f"ends at byte {n}")
        pos = end


def webp_problem(data: bytes) -> Optional[str]:
    n = len(data)
    if n < 12 or data[:4] != b"RIFF" or data[8:12] != b"WEBP":
        return "no RIFF/WEBP header"
    riff_end = 8 + struct.unpack_from("<I", data, 4)[0]
    if riff_end > n:
        return f"truncated: the RIFF header declares {riff_end} bytes, the file has {n}"
    pos = 12
    if pos + 8 > riff_end:
        return "no chunks after the RIFF header"
    while pos + 8 <= riff_end:
        name = data[pos:pos + 4].decode("latin-1")
        size = struct.unpack_from("<I", data, pos + 4)[0]
        end = pos + 8 + size + (size & 1)
        if pos + 8 + size > riff_end:
            return f"truncated in chunk {name!r} at byte {riff_end} (the chunk declares {size} bytes)"
        pos = end
    return None


def bmp_problem(data: bytes) -> Optional[str]:
    n = len(data)
    if n < 26 or data[:2] != b"BM":
        return "no BMP header"
    file_size, offset, dib = struct.unpack_from("<I4xII", data, 2)
    if dib == 12:
        w, h, _, bpp = struct.unpack_from("<HHHH", data, 18)
        compression, image_size = 0, 0
    elif dib >= 40 and n >= 38:
        w, h, _, bpp, compression, image_size = struct.unpack_from("<iiHHII", data, 18)
    else:
        return f"unknown or truncated info header (size {dib})"
    if compression in (0, 3, 6):  # BI_RGB, BI_BITFIELDS, BI_ALPHABITFIELDS: rows of known size
        need = offset + ((bpp * abs(w) + 31) // 32) * 4 * abs(h)
    else:  # RLE, embedded JPEG / PNG: the declared sizes
        need = offset + image_size
    if need > n:
        return f"truncated: the pixel data needs {need} bytes, the file has {n}"
    if compression not in (0, 3, 6) and file_size > n:
        return f"truncated: the header declares {file_size} bytes, the file has {n}"
    return None


_WALKS = {"PNG": png_problem, "JPEG": jpeg_problem, "WEBP": webp_problem, "BMP": bmp_problem}
