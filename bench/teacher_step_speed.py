"""How fast can `dmad demo make-teacher`'s transformer step go on this machine?

The recipe's step (both CLIP encoders and the SD3 transformer forward and backward on a batch of 32,
clipped AdamW, the EMA) timed as the recipe runs it (eager, foreach AdamW), with fused AdamW, and
with the transformer under torch.compile (inductor) plus fused AdamW: would a faster step let the
60-minute make-teacher budget hold more training? Each mode runs in its own process (a compiled
graph or a warmed allocator must not carry over) on random latents of the teacher's shape, so
nothing trains to a result; only the time is read. The compile mode's warm-up includes inductor's
compile (much shorter on a second run: inductor caches its kernels on disk).

A shared or throttled VM moves a single timing by 15% or more, so `--repeat N` runs the modes N
times, interleaved, and reports each mode's median and range.

    python bench/teacher_step_speed.py [--modes eager,fused,compile] [--repeat 3] [--steps 20] [--warmup 6] [--json OUT]
"""
from __future__ import annotations

import argparse
import copy
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

MODES = ("eager", "fused", "compile")


def time_mode(mode: str, steps: int, warmup: int, layers: int) -> dict:
    import torch

    from dmad.demo import build_teacher
    from dmad.demo import teacher_stages as ts
    from dmad.demo.shapes import attributes_for, caption
    from dmad.models.repeated_tokens import install

    pipe = build_teacher(0, layers=layers)
    tr = pipe.transformer
    install(tr)
    ema = copy.deepcopy(tr).requires_grad_(False)
    text = ts.TextSide(pipe.tokenizer, pipe.text_encoder, pipe.text_encoder_2)
    groups = [{"params": list(tr.parameters()), "lr": 2e-3},
              {"params": list(pipe.text_encoder.parameters()) + list(pipe.text_encoder_2.parameters()), "lr": 2e-3}]
    opt = torch.optim.AdamW(groups, weight_decay=0.01, fused=mode != "eager")
    params = [p for g in groups for p in g["params"]]
    side = tr.config.sample_size
    pool = torch.randn(1024, tr.config.in_channels, side, side)
    captions = [caption(attributes_for(i, 7)) for i in range(512)]
    gen = torch.Generator().manual_seed(1)
    model = torch.compile(tr) if mode == "compile" else tr
    tr.train()

    def step() -> float:
        idx = torch.randint(0, len(pool), (32,), generator=gen)
        emb, pooled = text.encode_ids(text.cached_ids([captions[i % len(captions)] for i in idx.tolist()]))
        loss = ts.flow_step(model, opt, params, pool[idx], emb, pooled, gen, 1.5, 1.0)
        ts.ema_update(ema, tr, 0.999)
        return loss.item()

    t0 = time.time()
    for _ in range(warmup):
        step()
    warm = time.time() - t0
    t0, c0 = time.time(), time.process_time()
    for _ in range(steps):
        step()
    wall, cpu = (time.time() - t0) / steps, (time.process_time() - c0) / steps
    return {"mode": mode, "layers": layers, "warmup_s": round(warm, 1), "s_per_step": round(wall, 4),
            "cpu_s_per_step": round(cpu, 4), "threads": torch.get_num_threads(), "torch": torch.__version__}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=6)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--json", type=Path)
    p.add_argument("--one", help=argparse.SUPPRESS)  # the child process: time this one mode
    a = p.parse_args(argv)
    if a.one:
        print(json.dumps(time_mode(a.one, a.steps, a.warmup, a.layers)))
        return 0
    modes = [m for m in a.modes.split(",") if m]
    bad = [m for m in modes if m not in MODES]
    if bad or not modes or a.repeat < 1:
        print(f"--modes {a.modes} --repeat {a.repeat}: modes from {', '.join(MODES)}, at least one repeat",
              file=sys.stderr)
        return 2
    rows = []
    for mode in modes * a.repeat:
        out = subprocess.run([sys.executable, __file__, "--one", mode, "--steps", str(a.steps), "--warmup",
                              str(a.warmup), "--layers", str(a.layers)], capture_output=True, text=True)
        if out.returncode:
            print(f"{mode}: failed: {out.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
            return 1
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
        r = rows[-1]
        print(f"{mode:8s} {r['s_per_step']:.3f} s/step ({r['cpu_s_per_step']:.3f} s CPU), warm-up {r['warmup_s']} s",
              flush=True)
    summary = {}
    for mode in modes:
        times = sorted(r["s_per_step"] for r in rows if r["mode"] == mode)
        summary[mode] = {"median_s_per_step": statistics.median(times), "min": times[0], "max": times[-1]}
        print(f"{mode:8s} median {summary[mode]['median_s_per_step']:.3f} s/step [{times[0]:.3f}, {times[-1]:.3f}]")
    if a.json:
        a.json.write_text(json.dumps({"runs": rows, "summary": summary}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
