"""A labelled image grid (PIL only): row labels on the left, column labels on top, a title.

Used by `dmad sample --sweep`. Cells are scaled up with nearest neighbour to at least MIN_CELL
pixels, so 32-64 px demo images stay readable and keep their exact pixels.
"""
from __future__ import annotations

import io
from pathlib import Path

MIN_CELL = 128
PAD = 4


def labelled_grid(out: Path, pngs: list[bytes], row_labels: list[str], col_labels: list[str], title: str = "") -> Path:
    """`pngs` row-major (len(row_labels) x len(col_labels)) -> one PNG at `out`."""
    from PIL import Image, ImageDraw, ImageFont

    from dmad.contract.runs import atomic_write_bytes

    if len(pngs) != len(row_labels) * len(col_labels):
        raise ValueError(f"{len(pngs)} images for a {len(row_labels)} x {len(col_labels)} grid")
    cells = [Image.open(io.BytesIO(b)).convert("RGB") for b in pngs]
    w, h = cells[0].size
    scale = max(1, -(-MIN_CELL // max(w, h)))  # ceil
    cw, ch = w * scale, h * scale
    font = ImageFont.load_default()
    measure = ImageDraw.Draw(Image.new("RGB", (1, 1)))
    text_w = max([measure.textlength(s, font=font) for s in row_labels] + [0])
    left, line = int(text_w) + 2 * PAD, 14
    top = (line + PAD) * (2 if title else 1) + PAD
    grid = Image.new("RGB", (left + len(col_labels) * (cw + PAD), top + len(row_labels) * (ch + PAD)), (255, 255, 255))
    draw = ImageDraw.Draw(grid)
    if title:
        draw.text((PAD, PAD), title, fill=(0, 0, 0), font=font)
    for c, label in enumerate(col_labels):
        draw.text((left + c * (cw + PAD), top - line - PAD // 2), label, fill=(0, 0, 0), font=font)
    for r, label in enumerate(row_labels):
        draw.text((PAD, top + r * (ch + PAD) + ch // 2 - line // 2), label, fill=(0, 0, 0), font=font)
        for c in range(len(col_labels)):
            img = cells[r * len(col_labels) + c].resize((cw, ch), Image.NEAREST)
            grid.paste(img, (left + c * (cw + PAD), top + r * (ch + PAD)))
    buf = io.BytesIO()
    grid.save(buf, format="PNG")
    atomic_write_bytes(out, buf.getvalue(), durable=False)
    return out
