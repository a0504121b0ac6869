"""What `dmad bench distill` measures on: two disjoint sets of captions, seeds and real references.

The protocol (docs/benchmarks.md): every default (the demo configs of each method, learning rates,
ratios) is chosen on the *tuning* set; results are reported on the *held-out* set, whose captions,
initial noise and real renders come from seeds nothing was ever tuned on. Each set has

- full captions (all five attributes stated): `prompts` captions x `seeds_per_prompt` samples:
  FD to real renders of the same captions, prompt adherence, per-caption diversity;
- under-specified captions (some attributes left out: dmad.demo.shapes.under_specified), distinct,
  `under_captions` x `under_seeds` samples: how well a model keeps the data's conditional
  distribution (dmad.demo.coverage);
- real references of both, rendered from the data's distribution given each caption, of the
  evaluator's reference lattice half (never pixel-identical to its training renders).

Every item's initial noise is a function of (set, caption index, seed index) alone, so every model
and every training seed sees the same noise per item: rows are paired item by item.
"""
from __future__ import annotations

from dataclasses import dataclass

UNDER_INDEX = 100_000  # noise index offset of the under-specified items (full items use 0 .. prompts - 1)


@dataclass(frozen=True)
class SeedSet:
    name: str
    captions: int      # full captions: shapes.attributes_for(i, captions)
    under: int         # under-specified captions: shapes.under_specified(i, under)
    noise_a: int       # initial noise of item (i, j): noise_a + i * 1000 + j
    noise_b: int       # the teacher's second noise set (the noise floor)
    real: int          # real references: evaluator.real_attrs_for_captions(..., real, ...)


# The tuning set reuses the seeds of the bench before 2026-12 (the defaults were tuned on them);
# the held-out seeds were drawn for this protocol and never used to choose anything.
SETS = {
    "tuning": SeedSet("tuning", captions=2_000_001, under=2_000_003, noise_a=3_000_000, noise_b=4_000_000,
                      real=1_000_002),
    "heldout": SeedSet("heldout", captions=7_000_001, under=7_000_003, noise_a=8_000_000, noise_b=9_000_000,
                       real=7_000_002),
}

Item = tuple[str, int, int]  # (caption, caption index for the noise, seed index)


def full_items(s: SeedSet, prompts: int, seeds: int) -> list[Item]:
    """(caption, i, j) for every full-caption image, prompt-major."""
    from dmad.demo.shapes import attributes_for, caption

    caps = [caption(attributes_for(i, s.captions)) for i in range(prompts)]
    return [(caps[i], i, j) for i in range(prompts) for j in range(seeds)]


def under_captions(s: SeedSet, n: int) -> list[str]:
    """`n` distinct under-specified captions of the set (drawn in index order, repeats passed over)."""
    from dmad.demo.shapes import caption, under_specified

    out: list[str] = []
    i = 0
    while len(out) < n:
        c = caption(*under_specified(i, s.under))
        if c not in out:
            out.append(c)
        i += 1
    return out


def under_items(s: SeedSet, captions: int, seeds: int) -> list[Item]:
    caps = under_captions(s, captions)
    return [(caps[i], UNDER_INDEX + i, j) for i in range(captions) for j in range(seeds)]


def groups_of(items: list[Item]) -> list[list[int]]:
    """The item indices of each caption, in first-seen order: the strata of a seed bootstrap."""
    by: dict[str, list[int]] = {}
    for k, (c, _, _) in enumerate(items):
        by.setdefault(c, []).append(k)
    return list(by.values())


def initial_noise(items: list[Item], base: int, shape: tuple[int, int, int]):
    """(N, C, h, w) float32: each item's noise from its own CPU generator, so any batch split or
    model sees the same numbers."""
    import torch

    out = torch.empty((len(items), *shape))
    for k, (_, i, j) in enumerate(items):
        out[k] = torch.randn(shape, generator=torch.Generator().manual_seed(base + i * 1000 + j))
    return out


def real_images(captions: list[str], per_caption: int, seed: int, first: int = 0):
    """(N, 3, 64, 64) in [-1, 1] and the caption of each: `per_caption` real renders of every
    caption (caption-major) drawn from the data's distribution given what it states, of the
    evaluator's reference lattice half (never pixel-identical to its training renders)."""
    from dmad.demo.evaluator import REFERENCE_PARITY, real_attrs_for_captions, render_real_attrs, to_unit

    attrs = real_attrs_for_captions(captions, per_caption, seed, first, REFERENCE_PARITY)
    return to_unit(render_real_attrs(attrs)), [c for c in captions for _ in range(per_caption)]
