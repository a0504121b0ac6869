"""Aspect-ratio buckets (issue 6). Torch-free: `dmad check-data` counts images per bucket.

The rule, for a source of w x h pixels and a target `resolution`:
1. Scale the source to about resolution**2 pixels at its own aspect ratio, but never up: the
   scale is min(1, sqrt(resolution**2 / (w * h))).
2. Round each scaled side DOWN to a multiple of `step` (64 by default), so the bucket fits inside
   the scaled source and the image is only ever cropped, never stretched or upscaled.
3. A side shorter than `step` after scaling keeps its length rounded down to a multiple of 8 (the
   VAE's factor), at least 8: tiny sources get a tiny bucket rather than an upscaled one.
Images of the same bucket batch together; rounding down costs at most `step - 1` pixels of crop
per side.
"""
from __future__ import annotations

import math

VAE_FACTOR = 8


def _round_side(side: float, step: int) -> int:
    if side >= step:
        return int(side // step) * step
    return max(VAE_FACTOR, int(side // VAE_FACTOR) * VAE_FACTOR)


def bucket_for(width: int, height: int, resolution: int, step: int = 64) -> tuple[int, int]:
    """(bucket width, bucket height) for a width x height source; see the module docstring."""
    if width <= 0 or height <= 0 or resolution <= 0 or step <= 0:
        raise ValueError(f"bucket_for needs positive sizes, got {width}x{height}, resolution {resolution}, step {step}")
    scale = min(1.0, math.sqrt(resolution * resolution / (width * height)))
    # The tiny epsilon keeps exact multiples (512 * 1.0) from flooring to the step below.
    return _round_side(width * scale + 1e-6, step), _round_side(height * scale + 1e-6, step)
