"""A picture of a run's health seeds: one row per prompt; the teacher and the chosen checkpoints side
by side, each with its seeds (docs/health*.png were made with it).

    python bench/health_strip.py RUN OUT.png --folders teacher iter_100 iter_200 \\
        --titles "teacher (4 seeds)" "iter 100" "iter 200" --prompts under-red under-large-circle

RUN is a run folder whose prompt set has health_seeds; each folder is one of RUN/samples/.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from PIL import Image, ImageDraw, ImageFont


def strip(run: Path, folders: list[str], titles: list[str], prompts: list[str], out: Path, seeds: int = 4,
          scale: int = 2) -> None:
    first = Image.open(run / "samples" / folders[0] / f"{prompts[0]}.png")
    side = first.width * scale
    label_w, head_h, gap = 200, 28, 14
    img = Image.new("RGB", (label_w + len(folders) * (seeds * side + gap), head_h + len(prompts) * (side + 6)), "white")
    d = ImageDraw.Draw(img)
    try:
        font = ImageFont.truetype("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf", 16)
    except OSError:
        font = ImageFont.load_default()
    for g, (folder, title) in enumerate(zip(folders, titles)):
        x0 = label_w + g * (seeds * side + gap)
        d.text((x0 + 4, 4), title, fill="black", font=font)
        for r, pid in enumerate(prompts):
            y = head_h + r * (side + 6)
            if g == 0:
                d.text((6, y + side // 2 - 8), pid[:22], fill="black", font=font)
            for k in range(seeds):
                path = run / "samples" / folder / (f"{pid}.png" if k == 0 else f"{pid}~s{k}.png")
                im = Image.open(path).convert("RGB").resize((side, side), Image.NEAREST)
                img.paste(im, (x0 + k * side, y))
    tmp = out.with_name(out.name + ".tmp.png")
    img.save(tmp, optimize=True)
    tmp.replace(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--folders", nargs="+", required=True)
    ap.add_argument("--titles", nargs="+")
    ap.add_argument("--prompts", nargs="+", required=True)
    ap.add_argument("--seeds", type=int, default=4)
    args = ap.parse_args()
    titles = args.titles or args.folders
    if len(titles) != len(args.folders):
        print("health_strip: give one title per folder", file=sys.stderr)
        return 2
    try:
        strip(args.run, args.folders, titles, args.prompts, args.out, args.seeds)
    except OSError as e:
        print(f"health_strip: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
