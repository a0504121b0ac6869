"""Where a demo teacher gets its captions wrong, and at which noise level the error is made.

1. Samples of N fresh captions (Euler 50 steps, CFG per --cfg), read by the shipped evaluator:
   all-attribute adherence, shape and size accuracy, the accuracy of every shape x size cell and
   the most frequent confusions (true -> read).
2. "Start from the truth": each caption's own real render is encoded, noised to sigma s and
   denoised by the teacher from there (the same 50-step schedule, entered at s, CFG 3). If the
   teacher still gets a shape wrong from s = 0.5, where the noisy latent already shows the shape,
   the error is in its low-noise refinement, not its layout decisions at high noise.

Same captions, noise and seeds for every row, so rows compare directly.

    python bench/teacher_errors.py [--teacher DIR] [-n 320] [--cfg 3,4] [--sigmas 0.5,0.7,0.85,0.95] [--json OUT]
                                   [--phase] [--shapes circle,square,...]

--phase adds, to the rows that start from real renders, the small shapes' accuracy by where their
edge falls inside a transformer token (a test of "the token grid loses small outlines").
--shapes circle,square,... scores only captions of those shapes, with the evaluator's other shape
logits masked: what the teacher would score in a domain without the rest (it chose the demo's
four shapes; docs/benchmarks.md).

~7 minutes for the defaults on 2 idle CPU cores.
"""
from __future__ import annotations

import argparse
import collections
import itertools
import json
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
CAPTION_SEED = 777  # not the evaluator's, the training's or make-teacher's check captions


def phase_cells(pred: list[dict], attrs: list[dict], side: int, token_px: float, bins: int = 4) -> dict:
    """Small shapes' shape-and-size accuracy by where the shape's left (top) edge falls inside a
    transformer token: phase 0 = on a token boundary, bins of token_px / bins pixels. Only for
    rows that start from the caption's own render (the offset is the render's): a flat profile
    says the token grid is not what loses small outlines."""
    from dmad.demo.shapes import shape_box

    out = {}
    for axis in (0, 1):
        good, total = [0] * bins, [0] * bins
        for p, a in zip(pred, attrs):
            if a["size"] != "small":
                continue
            edge = shape_box(a, side)[axis] - shape_box(a, side)[2]
            b = min(int((edge % token_px) / token_px * bins), bins - 1)
            total[b] += 1
            good[b] += p["shape"] == a["shape"] and p["size"] == a["size"]
        out["x" if axis == 0 else "y"] = [[g, t] for g, t in zip(good, total)]
    return out


def score(pred: list[dict], attrs: list[dict]) -> dict:
    from dmad.demo.metrics import adherence

    res = adherence(pred, attrs)
    cells, good, confusions = collections.Counter(), collections.Counter(), collections.Counter()
    for p, a in zip(pred, attrs):
        cell = f"{a['size']} {a['shape']}"
        cells[cell] += 1
        good[cell] += p["shape"] == a["shape"] and p["size"] == a["size"]
        for k in ("shape", "size"):
            if p[k] != a[k]:
                confusions[f"{a['size']} {a['shape']}: {k} read as {p[k]}"] += 1
    return {"all": res["all"], **res["per_attribute"],
            "cells": {c: [good[c], cells[c]] for c in sorted(cells)},
            "confusions": dict(confusions.most_common(8))}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--teacher", default=str(ROOT / "resources/demo/teacher"))
    ap.add_argument("-n", type=int, default=320)
    ap.add_argument("--cfg", default="3,4")
    ap.add_argument("--sigmas", default="0.5,0.7,0.85,0.95")
    ap.add_argument("--json")
    ap.add_argument("--phase", action="store_true",
                    help="also break the rows that start from real renders down by the small shapes' edge "
                         "position inside a transformer token")
    ap.add_argument("--shapes", default="",
                    help="only captions of these shapes (comma-separated), read by the evaluator with the other "
                         "shapes' logits masked: what the teacher scores in a domain without the rest")
    args = ap.parse_args(argv)
    from dmad.demo import teacher_stages as ts
    from dmad.demo.evaluator import load_evaluator, render_real_attrs, to_unit
    from dmad.demo.shapes import attributes_for, caption

    torch.set_num_threads(2)
    pipe, text = ts.open_teacher(args.teacher)
    tr, vae, n = pipe.transformer, pipe.vae, args.n
    evaluator = load_evaluator()
    shapes = evaluator.vocab["shape"]
    keep = [x.strip() for x in args.shapes.split(",") if x.strip()] or shapes
    if unknown := sorted(set(keep) - set(shapes)):
        ap.error(f"--shapes: {', '.join(unknown)} not among the evaluator's shapes {shapes}")
    every = (attributes_for(i, CAPTION_SEED) for i in itertools.count())
    attrs = list(itertools.islice((a for a in every if a["shape"] in keep), n))  # the first n of those shapes
    masked = [j for j, s in enumerate(shapes) if s not in keep]

    def read(images):  # the left-out shapes' logits never win
        logits = evaluator(images)
        logits["shape"][:, masked] = float("-inf")
        return evaluator.decode(logits)

    caps = [caption(a) for a in attrs]
    side = vae.config.sample_size
    from dmad.sample.render import latent_shape

    noise = torch.randn((n, *latent_shape(vae, side, side)), generator=torch.Generator().manual_seed(1))

    token_px = side / (latent_shape(vae, side, side)[-1] / tr.config.patch_size)

    def row(name: str, make, phase: bool = False) -> dict:
        t0 = time.time()
        images = torch.cat([make(slice(a, a + 64)) for a in range(0, n, 64)])
        with torch.no_grad():
            pred = read(images)
        res = {"row": name, **score(pred, attrs)}
        if phase:
            res["small_by_edge_phase"] = {"token_px": token_px, **phase_cells(pred, attrs, side, token_px)}
        res["seconds"] = round(time.time() - t0, 1)
        print(json.dumps(res), flush=True)
        return res

    real = to_unit(render_real_attrs(attrs, side))
    z0 = ts.scaled_latents(vae, real)
    rows = [row("real renders", lambda sl: real[sl]),
            row("VAE reconstruction", lambda sl: ts.decode(vae, z0[sl]), args.phase)]
    for cfg in (float(c) for c in args.cfg.split(",") if c):
        rows.append(row(f"50 steps, CFG {cfg:g}", lambda sl, cfg=cfg: ts.decode(
            vae, ts.sample_flow(tr, text, caps[sl], noise[sl], 50, cfg, pipe.scheduler.config))))
    for s in (float(c) for c in args.sigmas.split(",") if c):
        rows.append(row(f"real latent noised to sigma {s:g}, then 50-step schedule, CFG 3",
                        lambda sl, s=s: ts.decode(vae, ts.sample_flow(tr, text, caps[sl], noise[sl], 50, 3.0,
                                                                       pipe.scheduler.config, z0[sl], s)), args.phase))
    if args.json:
        Path(args.json).write_text(json.dumps({"teacher": args.teacher, "n": n, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
