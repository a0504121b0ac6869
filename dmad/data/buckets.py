"""Aspect-ratio buckets: which size an image is trained at. Torch-free: training's scan
and `dmad check-data` both use `training_bucket` (docs/datasets.md).

The rule, for a source of w x h pixels and a target `resolution`:
1. Scale the source, never up: to about resolution**2 pixels at its own aspect ratio
   (pixel_area), or so that its shorter side is resolution (pixel), or take a square of its
   shorter side (crop_aspect 'square').
2. Round each scaled side to a multiple of `step` (64 by default): to the nearest multiple that
   does not exceed the source (the default: closest aspect and area), or down (the bucket always
   fits inside the scaled source: more crop, never a stretch).
3. A side shorter than `step` after scaling keeps its length rounded down to a multiple of 8 (the
   VAE's factor), at least 8: tiny sources get a tiny bucket rather than an upscaled one, and
   training refuses such images.
Images of the same bucket batch together.
"""
from __future__ import annotations

import math

VAE_FACTOR = 8


def _round_side(side: float, step: int) -> int:
    """Down to a multiple of `step` (of 8 below it). Callers add a tiny epsilon, so exact
    multiples (512 * 1.0) do not floor to the step below."""
    if side >= step:
        return int(side // step) * step
    return max(VAE_FACTOR, int(side // VAE_FACTOR) * VAE_FACTOR)


def _fit_side(side: float, source: int, step: int, rounding: str) -> int:
    """A scaled side made a multiple of `step`: down, or to the nearest multiple that does not
    exceed the source (never an upscale)."""
    if rounding == "nearest" and side >= step:
        return min(int(round(side / step)) * step, _round_side(source + 1e-6, step))
    return _round_side(side + 1e-6, step)


def training_bucket(width: int, height: int, resolution: int, step: int, resolution_type: str = "pixel_area",
                    square: bool = False, rounding: str = "nearest") -> tuple[int, int]:
    """The bucket a dataset entry puts a width x height image in (dmad.contract.datasets.DatasetEntry):
    pixel_area scales to about resolution**2 pixels; pixel scales the shorter side to
    resolution; square (crop_aspect 'square') takes a square of the shorter side. Never upscaled;
    sides rounded to `step`, to the nearest multiple (the aspect and area stay closest; never past
    the source) or down (the bucket always inside the scaled image). A side below `step` stays
    below it: training refuses those."""
    if width <= 0 or height <= 0 or resolution <= 0 or step <= 0:
        raise ValueError(f"buckets need positive sizes, got {width}x{height}, resolution {resolution}, step {step}")
    if square:
        side = _fit_side(min(resolution, width, height), min(width, height), step, rounding)
        return side, side
    if resolution_type == "pixel":
        scale = min(1.0, resolution / min(width, height))
    else:
        scale = min(1.0, math.sqrt(resolution * resolution / (width * height)))
    return (_fit_side(width * scale, width, step, rounding), _fit_side(height * scale, height, step, rounding))


def crop_box(width: int, height: int, bucket: tuple[int, int], crop: bool, style: str,
             key: int = 0) -> tuple[tuple[int, int], tuple[int, int, int, int]]:
    """How a width x height image becomes a bucket: ((resize w, resize h), (left, top, right,
    bottom) of the crop in the resized image). crop False: resized to the bucket exactly (the
    aspect changes by at most the rounding). crop True: scaled to cover the bucket at its own
    aspect, then cropped at the centre, the top-left corner, or at an offset drawn from `key`
    (random: a pure function of the image, so a cached latent and a fresh load agree)."""
    bw, bh = bucket
    if not crop:
        return (bw, bh), (0, 0, bw, bh)
    scale = max(bw / width, bh / height)
    rw, rh = max(bw, round(width * scale)), max(bh, round(height * scale))
    if style == "corner":
        left = top = 0
    elif style == "random":
        left, top = key % (rw - bw + 1), (key // 65_537) % (rh - bh + 1)
    else:
        left, top = (rw - bw) // 2, (rh - bh) // 2
    return (rw, rh), (left, top, left + bw, top + bh)
