"""Where does a demo teacher decide a shape its caption leaves out, and which way does it lean?

Real renders of n captions (shapes drawn uniformly by dmad.demo.shapes.attributes_for) are encoded,
noised to sigma s with fixed noise, and denoised by the teacher from there (its 50-step Euler
schedule entered at s; s = 1 is plain sampling from noise), once with the shape left out of the
caption ("a large red shape at the top left on a black background") and once with the full
caption. The shipped evaluator reads the results:

- kept: the share whose shape is still the render's. At low s the noisy latent shows the shape
  and any model keeps it; where it falls tells the noise level at which the model decides.
- the share of each shape drawn. The renders' shapes are (close to) uniform, so a model whose
  conditional matches the data's draws them uniformly from any s, even where it does not keep
  them (the flow's marginals are the data's); a share that grows as s rises is the model's lean.

Tuning-side diagnostic (its captions are CAPTION_SEED's, not the bench's held-out set).

    python bench/teacher_decision.py [--teacher DIR] [-n 256] [--cfg 1] [--sigmas 0.2,0.4,0.6,0.8,0.9,1] [--json OUT]

~4 minutes for the defaults on 2 idle CPU cores.
"""
from __future__ import annotations

import argparse
import collections
import json
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
CAPTION_SEED = 4242  # not the evaluator's, the training's, make-teacher's checks' or teacher_errors.py's


def shape_shares(pred: list[dict], shapes: list[str]) -> dict[str, float]:
    counts = collections.Counter(p["shape"] for p in pred)
    return {s: counts.get(s, 0) / len(pred) for s in shapes}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--teacher", default=str(ROOT / "resources/demo/teacher"))
    ap.add_argument("-n", type=int, default=256)
    ap.add_argument("--cfg", type=float, default=1.0)
    ap.add_argument("--sigmas", default="0.2,0.4,0.6,0.8,0.9,1")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    from dmad.demo import teacher_stages as ts
    from dmad.demo.evaluator import load_evaluator, render_real_attrs, to_unit
    from dmad.demo.shapes import ATTRIBUTES, attributes_for, caption
    from dmad.sample.render import latent_shape

    torch.set_num_threads(2)
    pipe, text = ts.open_teacher(args.teacher)
    tr, vae, n = pipe.transformer, pipe.vae, args.n
    evaluator = load_evaluator()
    shapes = list(evaluator.vocab["shape"])
    attrs = [attributes_for(i, CAPTION_SEED) for i in range(n)]
    captions = {"shape left out": [caption(a, tuple(k for k in ATTRIBUTES if k != "shape")) for a in attrs],
                "full caption": [caption(a) for a in attrs]}
    noise = torch.randn((n, *latent_shape(vae, 64, 64)), generator=torch.Generator().manual_seed(3))
    real = to_unit(render_real_attrs(attrs, 64))
    z0 = ts.scaled_latents(vae, real)
    rows = [{"row": "real renders", "kept": 1.0, "drawn": shape_shares(evaluator.predict(real), shapes)}]
    for label, caps in captions.items():
        for s in (float(x) for x in args.sigmas.split(",") if x):
            t0 = time.time()
            images = torch.cat([ts.decode(vae, ts.sample_flow(
                tr, text, caps[b], noise[b], 50, args.cfg, pipe.scheduler.config, None if s >= 1 else z0[b], min(s, 1.0)))
                for b in (slice(a, a + 64) for a in range(0, n, 64))])
            with torch.no_grad():
                pred = evaluator.predict(images)
            kept = sum(p["shape"] == a["shape"] for p, a in zip(pred, attrs)) / n
            rows.append({"row": f"{label}, from sigma {s:g}", "kept": kept, "drawn": shape_shares(pred, shapes),
                         "seconds": round(time.time() - t0, 1)})
            print(json.dumps(rows[-1]), flush=True)
    print(f"\n| {args.teacher}, CFG {args.cfg:g}, n = {n} | kept | " + " | ".join(shapes) + " |")
    print("|---|---:|" + "---:|" * len(shapes))
    for r in rows:
        print(f"| {r['row']} | {r['kept']:.1%} | " + " | ".join(f"{r['drawn'][s]:.0%}" for s in shapes) + " |")
    if args.json:
        Path(args.json).write_text(json.dumps({"teacher": args.teacher, "cfg": args.cfg, "n": n, "rows": rows},
                                              indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
