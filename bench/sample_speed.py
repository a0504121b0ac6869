"""Time per image: the teacher (the prompt set's sampler, steps and CFG) vs the distilled student
(its own timesteps), both through `dmad sample` on the built-in demo.

    python bench/sample_speed.py [--run DIR] [--iters N] [--rounds R] [--device cpu|cuda|auto] [--json OUT]

Without --run it first makes a short demo run (resources/configs/demo.json, the shipped shapes
teacher, --iters iterations, one checkpoint at the end) in a temp folder. Each model is then
rendered --rounds times with `dmad sample` (the demo prompt set: 10 prompts at 64 px); the table
gives the median render time per image as `dmad sample` measures it (models loaded, so loading
is not counted) and the median wall time of the whole command (process start, imports, loading).
~2 min on 2 CPU cores with the defaults. Paste the table into docs/benchmarks.md with the machine.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from dmad.contract.paths import engine_argv  # noqa: E402


def _env() -> dict:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    return env


def _dmad(*args: str) -> tuple[str, float]:
    t0 = time.perf_counter()
    r = subprocess.run(engine_argv(*args), capture_output=True, text=True, env=_env())
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        sys.exit(f"dmad {' '.join(args[:3])} ... failed ({r.returncode}): {r.stderr.strip().splitlines()[-1:]}")
    return r.stdout, wall


def make_run(root: Path, iters: int) -> Path:
    run = root / "run"
    print(f"making a {iters}-iteration demo run in {run} ...", file=sys.stderr, flush=True)
    _dmad("train", "--config", str(REPO / "resources" / "configs" / "demo.json"), "--run-dir", str(run),
          "--set", f"optimization.max_train_steps={iters}", "--set", f"observation.checkpointing_steps={iters}",
          "--set", "observation.validation_steps=null")
    return run


def time_model(run: Path, checkpoint: str, rounds: int, out: Path, device: str) -> dict:
    per_image, walls, event = [], [], {}
    for _ in range(rounds):
        stdout, wall = _dmad("sample", "--run", str(run), "--checkpoint", checkpoint, "--out", str(out),
                             "--device", device)
        event = json.loads(stdout.strip().splitlines()[-1])["data"]
        per_image.append(event["s_per_image"])
        walls.append(wall)
    meta = json.loads((Path(event["folder"]) / "meta.json").read_text(encoding="utf-8"))
    nfe = meta["steps"] * (2 if meta.get("cfg") not in (None, 0, 1) else 1)  # CFG: two UNet passes per step
    label = (f"teacher {meta['sampler']} {meta['steps']} steps + CFG {meta['cfg']}" if meta["model"] == "teacher"
             else f"student {meta['checkpoint']} ({meta['steps']} step{'s' if meta['steps'] > 1 else ''})")
    return {"model": meta["model"], "label": label, "steps": meta["steps"], "nfe": nfe, "images": event["images"],
            "resolution": meta["resolution"], "s_per_image": statistics.median(per_image),
            "command_wall_s": statistics.median(walls), "device": event["device"], "rounds": rounds}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--run", help="an existing run folder (default: make a short demo run)")
    p.add_argument("--iters", type=int, default=2, help="iterations of the short demo run (default 2)")
    p.add_argument("--rounds", type=int, default=3, help="renders per model; the median is reported (default 3)")
    p.add_argument("--device", default="cpu", choices=("auto", "cpu", "cuda"))
    p.add_argument("--json", help="also write the results as JSON")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="dmad-sample-speed-") as tmp:
        run = Path(args.run).resolve() if args.run else make_run(Path(tmp), args.iters)
        rows = [time_model(run, c, args.rounds, Path(tmp) / "out", args.device) for c in ("teacher", "latest")]
    teacher = rows[0]["s_per_image"]
    lines = [f"`dmad sample` on the demo prompt set ({rows[0]['images']} prompts, "
             f"{rows[0]['resolution'][0]} px), {rows[0]['device']}, median of {args.rounds}; "
             f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, torch threads "
             f"{os.environ.get('OMP_NUM_THREADS', 'default')}",
             "",
             "| model | UNet evals / image | s / image (render) | speed-up | `dmad sample` wall (s) |",
             "|---|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['label']} | {r['nfe']} | {r['s_per_image']:.4f} | {teacher / r['s_per_image']:.1f}x "
                     f"| {r['command_wall_s']:.1f} |")
    print("\n".join(lines))
    if args.json:
        Path(args.json).write_text(json.dumps({"run": str(run), "rows": rows}, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
