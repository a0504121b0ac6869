"""A labelled image grid (PIL only): row labels on the left, column labels on top, a title.

Every grid the engine writes is one of these: `dmad sample --sweep` (a setting per row and column)
and the run's samples/grid.png of `dmad demo` (a prompt per row; "teacher", then "iteration N" per
column), so a picture read on its own says what it shows. Cells are scaled up with nearest neighbour
to at least MIN_CELL pixels, so 32-64 px demo images stay readable and keep their exact pixels; the
labels use PIL's built-in scalable font at FONT_PX (readable at 100% zoom), long row labels wrap.
"""
from __future__ import annotations

import io
import textwrap
from pathlib import Path

MIN_CELL = 128
PAD = 6
FONT_PX = 15
ROW_LABEL_CHARS = 28  # a row label wraps at this many characters (a prompt: a few lines)
SHEET = (210, 210, 210)  # the sheet: unlike the demo's backgrounds (black, gray 100, white), so every cell has an edge


def _font(px: int = FONT_PX):
    from PIL import ImageFont

    try:
        return ImageFont.load_default(size=px)  # Pillow >= 10.1 with FreeType: a scalable font
    except (TypeError, OSError, ImportError):  # an older or FreeType-less Pillow: the bitmap font
        return ImageFont.load_default()


def labelled_grid(out: Path, pngs: list[bytes], row_labels: list[str], col_labels: list[str], title: str = "",
                  min_cell: int = MIN_CELL) -> dict[tuple[int, int], tuple[int, int, int, int]]:
    """`pngs` row-major (len(row_labels) x len(col_labels)) -> one PNG at `out`, written atomically.
    Returns each cell's box (x, y, width, height) by (row, column)."""
    from PIL import Image, ImageDraw

    from dmad.contract.runs import atomic_write_bytes

    if len(pngs) != len(row_labels) * len(col_labels):
        raise ValueError(f"{len(pngs)} images for a {len(row_labels)} x {len(col_labels)} grid")
    cells = [Image.open(io.BytesIO(b)).convert("RGB") for b in pngs]
    w, h = cells[0].size
    scale = max(1, -(-min_cell // max(w, h)))  # ceil
    cw, ch = w * scale, h * scale
    font = _font()
    line = int(FONT_PX * 1.35)
    wrapped = ["\n".join(textwrap.wrap(s, ROW_LABEL_CHARS)) or "" for s in row_labels]
    measure = ImageDraw.Draw(Image.new("RGB", (1, 1)))
    text_w = max([measure.multiline_textbbox((0, 0), s, font=font)[2] for s in wrapped if s] + [0])
    left = int(text_w) + 2 * PAD
    top = PAD + (line + PAD if title else 0) + (line + PAD if any(col_labels) else 0)
    width = max(left + len(col_labels) * (cw + PAD) + PAD,
                int(measure.textlength(title, font=font)) + 2 * PAD if title else 0)
    grid = Image.new("RGB", (width, top + len(row_labels) * (ch + PAD) + PAD), SHEET)
    draw = ImageDraw.Draw(grid)
    if title:
        draw.text((PAD, PAD), title, fill=(0, 0, 0), font=font)
    for c, label in enumerate(col_labels):
        x = left + c * (cw + PAD) + max(0, (cw - int(draw.textlength(label, font=font))) // 2)  # centred over it
        draw.text((x, top - line - PAD // 2), label, fill=(0, 0, 0), font=font)
    boxes = {}
    for r, label in enumerate(wrapped):
        y = top + r * (ch + PAD)
        draw.multiline_text((PAD, y + PAD), label, fill=(0, 0, 0), font=font, spacing=3)
        for c in range(len(col_labels)):
            grid.paste(cells[r * len(col_labels) + c].resize((cw, ch), Image.NEAREST), (left + c * (cw + PAD), y))
            boxes[(r, c)] = (left + c * (cw + PAD), y, cw, ch)
    buf = io.BytesIO()
    grid.save(buf, format="PNG")
    atomic_write_bytes(out, buf.getvalue(), durable=False)
    return boxes
