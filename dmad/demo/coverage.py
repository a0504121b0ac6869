"""Does a model keep the data's *distribution*, not just its best image? Measures for captions that
leave attributes out (dmad.demo.shapes.caption with `stated`), where the right answer is a
distribution: the generator's conditional of what the caption leaves out (shapes.conditional).

For each under-specified caption, many samples (one per seed), each read by the shipped
evaluator (dmad.demo.evaluator):
- stated accuracy: the share of samples whose every stated attribute is right;
- total-variation distance, per left-out attribute: TV(p, q) = 1/2 sum_v |p(v) - q(v)| between
  the evaluator's reading of the samples (empirical) and the data's conditional, in [0, 1]. A
  finite sample of the data itself is above 0 (the sampling floor: the same measure on the same
  number of real renders, read by the same evaluator: `tv_floor`);
- coverage: the share of the values with data probability >= MIN_PROBABILITY that appear at all;
  a collapsed model draws one value and misses the rest;
- precision and recall in evaluator features against real renders of the same captions
  (Kynkäänniemi et al. 2019, k-NN manifolds, k = 3): precision, how many samples fall inside
  the real images' manifold (quality); recall, how many real images fall inside the samples'
  manifold (coverage of the real variety).

Pure numpy on evaluator outputs; cost O(N^2 D) for precision/recall (N = 1,024, D = 128: ~50 ms).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from dmad.demo import shapes

MIN_PROBABILITY = 0.05  # values the data draws at least this often must appear (the coverage)
PR_NEIGHBOURS = 3       # k of the k-NN manifolds (Kynkäänniemi et al. use 3)


def total_variation(values: Sequence[str], target: dict[str, float]) -> float:
    """TV between the empirical distribution of `values` and `target` (value -> probability); a
    value outside `target` counts as mass on a value the data never draws."""
    if not values:
        raise ValueError("total_variation needs at least one value")
    counts: dict[str, int] = {}
    for v in values:
        counts[v] = counts.get(v, 0) + 1
    keys = set(counts) | set(target)
    return 0.5 * sum(abs(counts.get(k, 0) / len(values) - target.get(k, 0.0)) for k in keys)


def caption_report(preds: Sequence[dict], stated: dict) -> dict:
    """One under-specified caption's samples (the evaluator's readings, attribute -> value) against
    the data's conditional given `stated`: {"n", "stated_accuracy", "tv": {attribute: TV},
    "covered": {attribute: [share of values with probability >= MIN_PROBABILITY that appear]},
    "missing": {attribute: [values never drawn]}}."""
    target = shapes.conditional(stated)
    ok = [all(p.get(k) == v for k, v in stated.items()) for p in preds]
    out = {"n": len(preds), "stated_accuracy": float(np.mean(ok)) if stated else 1.0, "tv": {}, "covered": {},
           "missing": {}}
    for attribute, dist in target.items():
        drawn = [p[attribute] for p in preds]
        needed = [v for v, q in dist.items() if q >= MIN_PROBABILITY]
        missing = [v for v in needed if v not in drawn]
        out["tv"][attribute] = total_variation(drawn, dist)
        out["covered"][attribute] = 1.0 - len(missing) / len(needed) if needed else 1.0
        out["missing"][attribute] = missing
    return out


def coverage_summary(preds: Sequence[dict], captions: Sequence[str]) -> dict:
    """Every under-specified caption of `captions` (one entry per sample; a caption's samples need
    not be adjacent): per-caption reports, and their means: "tv" (over every left-out attribute
    of every caption), "tv_by_attribute", "stated_accuracy" (over captions that state anything),
    "coverage" (share of needed values that appear, over all), "all_covered" (every needed value
    of every caption appears)."""
    from dmad.demo.metrics import parse_caption

    groups: dict[str, list[dict]] = {}
    for p, c in zip(preds, captions):
        groups.setdefault(c, []).append(p)
    per = {c: caption_report(ps, parse_caption(c)) for c, ps in groups.items()}
    tvs = [(a, v) for r in per.values() for a, v in r["tv"].items()]
    by_attr: dict[str, list[float]] = {}
    for a, v in tvs:
        by_attr.setdefault(a, []).append(v)
    stated = [r["stated_accuracy"] for c, r in per.items() if parse_caption(c)]
    covered = [v for r in per.values() for v in r["covered"].values()]
    return {"captions": len(per), "per_caption": per,
            "tv": float(np.mean([v for _, v in tvs])) if tvs else 0.0,
            "tv_by_attribute": {a: float(np.mean(v)) for a, v in by_attr.items()},
            "stated_accuracy": float(np.mean(stated)) if stated else 1.0,
            "coverage": float(np.mean(covered)) if covered else 1.0,
            "all_covered": all(not m for r in per.values() for m in r["missing"].values())}


def _pairwise(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Euclidean distances (len(a), len(b)), float64."""
    sq = (a * a).sum(1)[:, None] + (b * b).sum(1)[None, :] - 2 * a @ b.T
    return np.sqrt(np.clip(sq, 0, None))


def _radii(x: np.ndarray, k: int) -> np.ndarray:
    """Distance of each point to its k-th nearest other point of the same set."""
    d = _pairwise(x, x)
    return np.sort(d, axis=1)[:, k]  # column 0 is the point itself


def precision_recall(fake, real, k: int = PR_NEIGHBOURS) -> tuple[float, float]:
    """Kynkäänniemi et al. (2019): precision = share of `fake` features inside the union of real
    k-NN balls; recall = share of `real` features inside the union of fake k-NN balls. Features
    (N, D) in any array type."""
    f, r = np.asarray(fake, dtype=np.float64), np.asarray(real, dtype=np.float64)
    if len(f) <= k or len(r) <= k:
        raise ValueError(f"precision/recall with k={k} needs more than {k} samples per side; got {len(f)}, {len(r)}")
    d = _pairwise(f, r)
    precision = float((d <= _radii(r, k)[None, :]).any(axis=1).mean())
    recall = float((d.T <= _radii(f, k)[None, :]).any(axis=1).mean())
    return precision, recall
