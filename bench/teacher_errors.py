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

~7 minutes for the defaults on 2 idle CPU cores.
"""
from __future__ import annotations

import argparse
import collections
import json
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
CAPTION_SEED = 777  # not the evaluator's, the training's or make-teacher's check captions


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
    args = ap.parse_args(argv)
    from diffusers import StableDiffusion3Pipeline

    from dmad.demo import teacher_stages as ts
    from dmad.demo.evaluator import load_evaluator, render_real_attrs, to_unit
    from dmad.demo.shapes import attributes_for, caption

    torch.set_num_threads(2)
    pipe = StableDiffusion3Pipeline.from_pretrained(args.teacher)
    tr, vae, n = pipe.transformer.eval(), pipe.vae, args.n
    text = ts.TextSide(pipe.tokenizer, pipe.text_encoder, pipe.text_encoder_2)
    evaluator = load_evaluator()
    attrs = [attributes_for(i, CAPTION_SEED) for i in range(n)]
    caps = [caption(a) for a in attrs]
    side = vae.config.sample_size
    from dmad.sample.render import latent_shape

    noise = torch.randn((n, *latent_shape(vae, side, side)), generator=torch.Generator().manual_seed(1))

    def row(name: str, make) -> dict:
        t0 = time.time()
        images = torch.cat([make(slice(a, a + 64)) for a in range(0, n, 64)])
        with torch.no_grad():
            res = {"row": name, **score(evaluator.predict(images), attrs), "seconds": round(time.time() - t0, 1)}
        print(json.dumps(res), flush=True)
        return res

    real = to_unit(render_real_attrs(attrs, side))
    z0 = (ts.encode_latents(vae, real) - vae.config.shift_factor) * vae.config.scaling_factor
    rows = [row("real renders", lambda sl: real[sl]), row("VAE reconstruction", lambda sl: ts.decode(vae, z0[sl]))]
    for cfg in (float(c) for c in args.cfg.split(",")):
        rows.append(row(f"50 steps, CFG {cfg:g}", lambda sl, cfg=cfg: ts.decode(
            vae, ts.sample_flow(tr, text, caps[sl], noise[sl], 50, cfg, pipe.scheduler.config))))
    for s in (float(c) for c in args.sigmas.split(",")):
        rows.append(row(f"real latent noised to sigma {s:g}, then 50-step schedule, CFG 3",
                        lambda sl, s=s: ts.decode(vae, ts.sample_flow(tr, text, caps[sl], noise[sl], 50, 3.0,
                                                                       pipe.scheduler.config, z0[sl], s))))
    if args.json:
        Path(args.json).write_text(json.dumps({"teacher": args.teacher, "n": n, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
