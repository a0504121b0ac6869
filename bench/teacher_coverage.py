"""How well a teacher keeps the data's distribution on under-specified captions, against its
guidance scale: a diagnostic on the *tuning* set (dmad.demo.bench_sets), never the held-out one.

    python bench/teacher_coverage.py [--teacher DIR] [--cfg 1,2,3,4] [--steps 50] [--captions 16] [--seeds 64]

For each CFG scale: the teacher's own pipeline (flow-matching Euler) samples every under-specified
caption at `seeds` noise seeds; the shipped evaluator reads the samples; prints stated accuracy,
the mean total-variation distance to the data's conditional (and per left-out attribute), the
share of needed values that appear, and the same measures on as many real renders (the floor).
Guidance sharpens a distribution: this says how much, for the scale the demo distils with.
"""
from __future__ import annotations

import argparse
import json
import time


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--teacher", default=None, help="a teacher folder (default: the shipped demo teacher)")
    ap.add_argument("--cfg", default="1,2,3,4")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--captions", type=int, default=16)
    ap.add_argument("--seeds", type=int, default=64)
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)

    import torch

    from dmad.contract.paths import resource
    from dmad.demo.bench_sampling import sample_teacher
    from dmad.demo.bench_sets import SETS, initial_noise, real_images, under_items
    from dmad.demo.coverage import coverage_summary
    from dmad.demo.evaluator import load_evaluator
    from dmad.models.teacher import load_teacher
    from dmad.sample.render import latent_shape

    torch.set_num_threads(2)
    t0 = time.time()
    teacher = load_teacher(a.teacher or str(resource("demo", "teacher")), "auto", None, dtype=torch.float32)
    sset = SETS["tuning"]
    items = under_items(sset, a.captions, a.seeds)
    caps = [c for c, _, _ in items]
    noise = initial_noise(items, sset.noise_a, latent_shape(teacher.vae, 64, 64))
    clf = load_evaluator()

    def summary(images) -> dict:
        s = coverage_summary(clf.predict(images), caps)
        return {k: s[k] for k in ("stated_accuracy", "tv", "tv_by_attribute", "coverage", "all_covered")}

    real, _ = real_images(list(dict.fromkeys(caps)), a.seeds, sset.real, first=20_000)
    rows = {"real renders (floor)": summary(real)}
    for scale in (float(x) for x in a.cfg.split(",")):
        with torch.no_grad():
            images = sample_teacher(teacher, caps, noise, a.steps, scale, 64)
        rows[f"teacher {a.steps} steps, CFG {scale:g}"] = summary(images)
        print(f"{time.time() - t0:6.0f} s  CFG {scale:g}: {json.dumps(rows[f'teacher {a.steps} steps, CFG {scale:g}'])}",
              flush=True)
    print("| model | stated | TV | TV shape / colour / size / position / background | covered |")
    print("|---|---:|---:|---|---:|")
    for name, r in rows.items():
        per = " / ".join(f"{r['tv_by_attribute'].get(k, float('nan')):.3f}"
                         for k in ("shape", "colour", "size", "position", "background"))
        print(f"| {name} | {r['stated_accuracy']:.1%} | {r['tv']:.3f} | {per} | {r['coverage']:.0%}"
              f"{'' if r['all_covered'] else ' (gaps)'} |")
    if a.json:
        with open(a.json, "w", encoding="utf-8") as f:
            json.dump(rows, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
