"""How a busy CPU slows the engine, and what OpenMP's wait policy changes: the default, PASSIVE,
and a 10,000-round spin (what `dmad` sets unless the environment sets either; dmad/cli.py).

    python bench/contention.py [--seconds S] [--json OUT]

The workload is the demo teacher's denoiser (resources/demo/teacher, the SD3 transformer), one
forward pass of a batch of 2 at 64 px as a teacher sample with CFG makes it, repeated for S
seconds in a child process; the table gives passes per second and CPU seconds per pass. The
competitor is the same workload in a second process (what a test run or a second engine beside
the app is). Each child uses torch's default thread count (one per core). OpenMP's default wait
policy spins a waiting thread for a while before it sleeps; with two processes of two threads on
two cores, each one's spinning threads take the cores the other one's working threads need.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def worker(seconds: float) -> None:
    import torch
    from diffusers import SD3Transformer2DModel

    tr = SD3Transformer2DModel.from_pretrained(str(REPO / "resources" / "demo" / "teacher" / "transformer")).eval()
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 4, 32, 32, generator=gen)
    ctx, pooled = torch.randn(2, 33 + 256, 128, generator=gen), torch.randn(2, 128, generator=gen)
    t = torch.full((2,), 500.0)
    with torch.no_grad():
        tr(hidden_states=x, timestep=t, encoder_hidden_states=ctx, pooled_projections=pooled)  # warm-up
        n, t0, c0 = 0, time.perf_counter(), time.process_time()
        while time.perf_counter() - t0 < seconds:
            tr(hidden_states=x, timestep=t, encoder_hidden_states=ctx, pooled_projections=pooled)
            n += 1
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    print(json.dumps({"passes": n, "wall_s": wall, "cpu_s": cpu, "threads": torch.get_num_threads()}), flush=True)


POLICIES = {  # what each setting puts in the child's environment
    "default": {},
    "PASSIVE": {"OMP_WAIT_POLICY": "PASSIVE"},
    "spin 10k": {"GOMP_SPINCOUNT": "10000"},  # libgomp spins 300,000 rounds by default before sleeping
}


def child(seconds: float, policy: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    env.update(POLICIES[policy])
    return subprocess.Popen([sys.executable, __file__, "--worker", str(seconds)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)


def measure(seconds: float, policy: str, competitor: str | None) -> dict:
    """competitor: None, or the wait policy of the same workload in a second process."""
    rival = child(seconds + 30, competitor) if competitor else None
    if rival:
        time.sleep(8)  # let it load and start working
    try:
        me = child(seconds, policy)
        out, _ = me.communicate()
    finally:
        if rival:
            rival.kill()
            rival.wait()
    r = json.loads(out.strip().splitlines()[-1])
    return {"policy": policy, "competitor": competitor or "none",
            "passes_per_s": r["passes"] / r["wall_s"], "cpu_s_per_pass": r["cpu_s"] / max(r["passes"], 1),
            "threads": r["threads"]}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--json")
    p.add_argument("--worker", type=float, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker is not None:
        worker(a.worker)
        return 0
    rows = [measure(a.seconds, policy, comp) for policy, comp in
            (("default", None), ("PASSIVE", None), ("spin 10k", None), ("default", "default"),
             ("PASSIVE", "default"), ("spin 10k", "default"), ("PASSIVE", "PASSIVE"))]
    print(f"{os.cpu_count()} cores; one forward pass of the demo teacher's transformer (batch 2, 64 px) per call")
    print("| this process | beside | passes / s | CPU s / pass |\n|---|---|---:|---:|")
    for r in rows:
        print(f"| {r['policy']} | {r['competitor']} | {r['passes_per_s']:.1f} | {r['cpu_s_per_pass']:.4f} |")
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
