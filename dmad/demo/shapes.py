"""The built-in demo dataset: flat coloured shapes, and captions that state what they show.

"a small red circle at the top left on a black background": shape, colour, size, position and
background are each easy to see in a 64 px image and to check by eye in a sample grid, which is
what a CPU demo of distillation needs. Everything is a pure function of (index, seed) — the
per-image RNG is seeded from a string, which Python hashes with SHA-512, so it does not depend
on PYTHONHASHSEED or the platform — and resources/demo/shapes/ is exactly
write_dataset(out, n=256, size=64, seed=0). Pillow only; no torch.

A caption may also leave attributes out ("a red shape", "a large circle", "a shape on a white
background": caption(attrs, stated)). It then means the generator's conditional distribution of
the attributes it leaves out given those it states, which `conditional` gives in closed form: a
distribution to match, where a full caption has essentially one right image.

Shapes sit on whole pixels (shape_box rounds the centre), so an image's `lattice_parity`, the
parity of its centre's x + y, splits every caption's renders into two disjoint halves that never
share a pixel-identical image: the evaluator trains on one, the bench's real references come from
the other (dmad.demo.evaluator).
"""
from __future__ import annotations

import io
import json
import os
import random
import re
from pathlib import Path

from PIL import Image, ImageDraw, ImageFilter

GENERATOR = "dmad.demo.shapes"
SHAPES = ("circle", "square", "triangle", "diamond")  # no cross since 2026-12-03: its arms, 3.4 latent
# pixels wide at the small size, were the one outline the demo teacher (patch-4 MMDiT on the 2x VAE's
# latents) could not draw; docs/benchmarks.md, "Where the teacher's errors are"
COLOURS = {  # far apart in RGB so each name is unambiguous at a glance
    "red": (220, 40, 40), "green": (40, 190, 70), "blue": (50, 90, 235),
    "yellow": (245, 220, 40), "white": (245, 245, 245), "purple": (160, 70, 210),
}
BACKGROUNDS = {"black": (0, 0, 0), "gray": (100, 100, 100), "white": (255, 255, 255)}
SIZES = {"small": 0.32, "large": 0.45}  # shape extent as a fraction of the image side (small was 0.25:
# 16 px shapes, which the 2x latent VAE and a patch-4 transformer drew as blobs)
POSITIONS = {  # shape centre as fractions of the side; corners are quadrant centres
    "top left": (0.25, 0.25), "top right": (0.75, 0.25), "bottom left": (0.25, 0.75),
    "bottom right": (0.75, 0.75), "center": (0.5, 0.5),
}
STYLES = ("plain", "outline", "frame", "outline+frame")  # how an image is drawn: as the dataset draws
# it; the shape as an outline OUTLINE_WIDTH wide with the background inside; framed: a border
# FRAME_WIDTH wide around the whole image in FRAME_COLOUR, under the shape, like a photo-print
# frame; or both (what two style LoRAs stacked should draw). Not in any caption: a
# style LoRA changes the look of every caption, as a user's style LoRA does (dmad demo make-lora;
# the shipped one is "frame": the demo teacher, a patch-4 transformer that already drew small
# shapes as blobs, did not learn small outlines in a few CPU minutes: docs/benchmarks.md).
OUTLINE_WIDTH = 3 / 64  # of the image side: 3 px at 64 px
FRAME_WIDTH = 4 / 64    # 4 px at 64 px: one latent token is 8 px, so the frame is half a token row
FRAME_COLOUR = (255, 128, 0)  # orange: at least 100 from every shape colour and background in RGB
MIN_CONTRAST = 100.0  # Euclidean RGB distance between a shape colour and its background
ATTRIBUTES = ("shape", "colour", "size", "position", "background")


def contrast(a: tuple[int, int, int], b: tuple[int, int, int]) -> float:
    return sum((x - y) ** 2 for x, y in zip(a, b)) ** 0.5


def colours_on(background: str) -> list[str]:
    """Shape colours allowed on `background`: never its own colour, never low contrast."""
    bg = BACKGROUNDS[background]
    return [c for c, rgb in COLOURS.items() if c != background and contrast(rgb, bg) >= MIN_CONTRAST]


def attributes_for(index: int, seed: int) -> dict:
    """The attributes of image `index` of the dataset with `seed`. `offset` ([-1, 1] per axis) moves
    the shape within its slot without leaving it, so the stated position stays true."""
    rng = random.Random(f"{GENERATOR}/{seed}/{index}")
    background = rng.choice(sorted(BACKGROUNDS))
    return {
        "shape": rng.choice(SHAPES),
        "colour": rng.choice(colours_on(background)),
        "size": rng.choice(sorted(SIZES)),
        "position": rng.choice(list(POSITIONS)),
        "background": background,
        "offset": [round(rng.uniform(-1, 1), 2), round(rng.uniform(-1, 1), 2)],
    }


def caption(attrs: dict, stated=ATTRIBUTES) -> str:
    """The caption of `attrs` stating the attributes in `stated` (default: all of them), in one
    fixed order: "a [size] [colour] <shape or 'shape'> [at the <position> | in the center] [on a
    <background> background]". The full caption is the dataset's."""
    words = ["a"] + [attrs[k] for k in ("size", "colour") if k in stated]
    words.append(attrs["shape"] if "shape" in stated else "shape")
    if "position" in stated:
        words.append("in the center" if attrs["position"] == "center" else f"at the {attrs['position']}")
    if "background" in stated:
        words.append(f"on a {attrs['background']} background")
    return " ".join(words)


def shape_box(attrs: dict, size: int) -> tuple[float, float, float]:
    """(cx, cy, r) in pixels: the shape's centre, on a whole pixel, and half its extent."""
    r = SIZES[attrs["size"]] * size / 2
    slack = max(0.0, size / 4 - r - 1)  # room left in a quadrant slot, 1 px margin
    fx, fy = POSITIONS[attrs["position"]]
    ox, oy = attrs.get("offset", (0.0, 0.0))
    return float(round(fx * size + ox * slack)), float(round(fy * size + oy * slack)), r


def lattice_parity(attrs: dict, size: int = 64) -> int:
    """0 or 1: the parity of the shape centre's x + y in pixels. Two renders of other parities
    differ at least by a one-pixel shift of the shape, so they are never pixel-identical."""
    cx, cy, _ = shape_box(attrs, size)
    return int(cx + cy) % 2


# ------------------------------------------------------------------ what a caption means

def _colour_background() -> dict[tuple[str, str], float]:
    """The generator's joint P(background, colour): background uniform, then colour uniform over
    the colours allowed on it (colours_on)."""
    return {(bg, c): 1 / len(BACKGROUNDS) / len(colours_on(bg)) for bg in BACKGROUNDS for c in colours_on(bg)}


def conditional(stated: dict) -> dict[str, dict[str, float]]:
    """The data's distribution of each attribute a caption leaves out, given those it states
    (`stated`: attribute -> value): {attribute: {value: probability}}, exact. Shape, size and
    position are uniform and independent of everything; background and colour are tied by the
    contrast rule (a white shape is never on a white background). Raises ValueError for a
    statement the generator never makes (a value that does not exist, or a colour not allowed on
    the stated background)."""
    for k, v in stated.items():
        if k not in ATTRIBUTES or v not in _values(k):
            raise ValueError(f"not a shapes attribute: {k}={v!r}")
    joint = {(bg, c): p for (bg, c), p in _colour_background().items()
             if stated.get("background", bg) == bg and stated.get("colour", c) == c}
    if not joint:
        raise ValueError(f"no shapes image is {stated['colour']} on a {stated['background']} background")
    total = sum(joint.values())
    out: dict[str, dict[str, float]] = {}
    for k in ATTRIBUTES:
        if k in stated:
            continue
        if k in ("background", "colour"):
            marginal: dict[str, float] = {}
            for (bg, c), p in joint.items():
                key = bg if k == "background" else c
                marginal[key] = marginal.get(key, 0.0) + p / total
            out[k] = marginal
        else:
            out[k] = {v: 1 / len(_values(k)) for v in _values(k)}
    return out


def _values(attribute: str) -> list[str]:
    return {"shape": list(SHAPES), "colour": list(COLOURS), "size": list(SIZES), "position": list(POSITIONS),
            "background": list(BACKGROUNDS)}[attribute]


def sample_given(stated: dict, rng: random.Random) -> dict:
    """One image's attributes drawn from the data's distribution given `stated`: the left-out ones
    from `conditional` (background and colour jointly), the offset as the generator draws it."""
    joint = [(bg_c, p) for bg_c, p in _colour_background().items()
             if stated.get("background", bg_c[0]) == bg_c[0] and stated.get("colour", bg_c[1]) == bg_c[1]]
    bg, colour = rng.choices([bc for bc, _ in joint], weights=[p for _, p in joint])[0]
    out = {"background": bg, "colour": colour}
    for k in ("shape", "size", "position"):
        out[k] = stated[k] if k in stated else rng.choice(_values(k))
    out["offset"] = [round(rng.uniform(-1, 1), 2), round(rng.uniform(-1, 1), 2)]
    return out


def fewer_than_all(rng: random.Random) -> tuple[str, ...]:
    """Attributes to state, each left out with probability 1/2, drawn again until at least one is
    left out (all five stated is a full caption): every strict subset equally likely."""
    while True:
        stated = tuple(k for k in ATTRIBUTES if rng.random() < 0.5)
        if len(stated) < len(ATTRIBUTES):
            return stated


def under_specified(index: int, seed: int) -> tuple[dict, tuple[str, ...]]:
    """An under-specified caption of the generator's own: image `index`'s attributes and a subset
    of them to state (fewer_than_all). Returns (attributes, stated names)."""
    return attributes_for(index, seed), fewer_than_all(random.Random(f"{GENERATOR}/stated/{seed}/{index}"))


def training_caption(attrs: dict, rng: random.Random, under_specified_share: float) -> str:
    """What a model trains on for an image with `attrs`: its full caption, or with probability
    `under_specified_share` a caption that leaves some attributes out (fewer_than_all), so the
    model learns what each word fixes and, for a caption without it, the data's conditional."""
    if rng.random() < under_specified_share:
        return caption(attrs, fewer_than_all(rng))
    return caption(attrs)


def render(attrs: dict, size: int = 64) -> Image.Image:
    """An RGB image, size x size, of flat colours (no anti-aliasing: two colours per image). With
    attrs["style"] == "outline" the shape is an outline OUTLINE_WIDTH wide, its inside the
    background (the shape's mask eroded by a square of that half-width); with "frame" a border
    FRAME_WIDTH wide in FRAME_COLOUR runs round the image, under the shape (a corner shape keeps a
    1 px margin in its slot, so it reaches into the frame and stays whole); "outline+frame" both."""
    background = BACKGROUNDS[attrs["background"]]
    img = Image.new("RGB", (size, size), background)
    draw, fill = ImageDraw.Draw(img), COLOURS[attrs["colour"]]
    cx, cy, r = shape_box(attrs, size)
    style = attrs.get("style", "plain")
    if style not in STYLES:
        raise ValueError(f"unknown style {style!r}; known: {', '.join(STYLES)}")
    if "frame" in style:  # under the shape: a corner shape that reaches the frame stays whole
        draw.rectangle([0, 0, size - 1, size - 1], outline=FRAME_COLOUR, width=max(1, round(FRAME_WIDTH * size)))
    draw_shape(draw, attrs["shape"], cx, cy, r, fill)
    if "outline" in style:
        mask = Image.new("L", (size, size), 0)
        draw_shape(ImageDraw.Draw(mask), attrs["shape"], cx, cy, r, 255)
        inside = mask.filter(ImageFilter.MinFilter(2 * max(1, round(OUTLINE_WIDTH * size)) + 1))
        img.paste(background, mask=inside)
    return img


def draw_shape(draw: ImageDraw.ImageDraw, shape: str, cx: float, cy: float, r: float, fill) -> None:
    """One flat shape of half-extent r centred at (cx, cy)."""
    if shape == "circle":
        draw.ellipse([cx - r, cy - r, cx + r, cy + r], fill=fill)
    elif shape == "square":
        draw.rectangle([cx - r, cy - r, cx + r, cy + r], fill=fill)
    elif shape == "triangle":
        draw.polygon([(cx, cy - r), (cx + r, cy + r), (cx - r, cy + r)], fill=fill)
    elif shape == "diamond":
        draw.polygon([(cx, cy - r), (cx + r, cy), (cx, cy + r), (cx - r, cy)], fill=fill)
    else:
        raise ValueError(f"unknown shape {shape!r}; known: {', '.join(SHAPES)}")


def render_mosaic(index: int, seed: int, size: int = 64) -> Image.Image:
    """A denser image for training the demo VAE: 2-8 shapes of any palette colour (or a random
    RGB one), any size and place, overlapping, on a background of any colour. The captioned images
    are ~90% background, so an autoencoder trained on them alone learns the background first and
    shape colours late; these put colour edges everywhere. No caption: the VAE needs none."""
    rng = random.Random(f"{GENERATOR}/mosaic/{seed}/{index}")
    palette = list(COLOURS.values()) + list(BACKGROUNDS.values())

    def colour() -> tuple[int, int, int]:
        return rng.choice(palette) if rng.random() < 0.8 else tuple(rng.randrange(256) for _ in range(3))

    img = Image.new("RGB", (size, size), colour())
    draw = ImageDraw.Draw(img)
    for _ in range(rng.randint(2, 8)):
        r = rng.uniform(size / 16, size / 4)
        draw_shape(draw, rng.choice(SHAPES), rng.uniform(0, size), rng.uniform(0, size), r, colour())
    return img


def png_bytes(img: Image.Image) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="PNG", compress_level=9)  # Pillow writes no timestamp: same pixels, same bytes
    return buf.getvalue()


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def image_name(i: int) -> str:
    return f"img_{i:04d}"


def _remove_stale(out: Path, n: int) -> None:
    """Regenerating with a smaller n must not leave old images behind; only our own earlier
    output (a folder whose dataset.json names this generator) is touched."""
    try:
        meta = json.loads((out / "dataset.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    if not isinstance(meta, dict) or meta.get("generator") != GENERATOR:
        return
    for f in out.iterdir():
        m = re.fullmatch(r"img_(\d+)\.(png|txt)", f.name)
        if m and int(m.group(1)) >= n:
            f.unlink()


def dataset_caption(attrs: dict, index: int, seed: int, under_specified_share: float) -> str:
    """The caption file of image `index`: its full caption, or with probability
    `under_specified_share` one that leaves some attributes out (training_caption); a pure function
    of (index, seed), as the image is."""
    return training_caption(attrs, random.Random(f"{GENERATOR}/captions/{seed}/{index}"), under_specified_share)


def write_dataset(out_dir: str | Path, n: int, size: int = 64, seed: int = 0,
                  under_specified_share: float = 0.0, style: str = "plain") -> Path:
    """Write img_<i>.png + img_<i>.txt (caption, one UTF-8 line) for i < n, and dataset.json.
    Each file is written to a temp name and renamed, so a reader never sees half a file.
    `under_specified_share`: the share of captions that leave attributes out (dataset_caption); a
    model distilled on the data sees such prompts only if its data holds them. `style`: every
    image drawn in that STYLES entry (no caption names it): the same shapes and captions as a
    style LoRA's look, the real images a distillation's GAN compares with when it distils teacher
    + that LoRA (`dmad demo make-data --style`).
    Cost: ~1 ms per 64 px image."""
    if n < 1 or size < 8:
        raise ValueError(f"need n >= 1 and size >= 8; got n={n}, size={size}")
    if not 0.0 <= under_specified_share <= 1.0:
        raise ValueError(f"need 0 <= under_specified_share <= 1; got {under_specified_share}")
    if style not in STYLES:
        raise ValueError(f"unknown style {style!r}; known: {', '.join(STYLES)}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    _remove_stale(out, n)
    for i in range(n):
        attrs = attributes_for(i, seed)
        _atomic_write(out / f"{image_name(i)}.png", png_bytes(render(dict(attrs, style=style), size)))
        text = dataset_caption(attrs, i, seed, under_specified_share)
        _atomic_write(out / f"{image_name(i)}.txt", (text + "\n").encode("utf-8"))
    meta = {"id": "shapes", "type": "local", "instance_data_dir": ".", "caption_strategy": "textfile",
            "resolution": size, "count": n, "seed": seed, "under_specified_share": under_specified_share,
            "generator": GENERATOR, **({"style": style} if style != "plain" else {})}
    _atomic_write(out / "dataset.json", (json.dumps(meta, indent=2) + "\n").encode("utf-8"))
    return out
