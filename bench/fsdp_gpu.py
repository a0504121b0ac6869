"""Issue 41's device check, prepared to run once on a lent GPU (works on a CPU too, for a dry run):
an fsdp run at world size 1 on the device for a few iterations, checkpoint and exact resume, CPU
offload, the peak memory against the ledger, and the step time of fsdp against ddp.

    python bench/fsdp_gpu.py --out DIR [--small] [--json OUT]

The model is bench/fsdp_memory.py's (SD 1.5's layout at half width, 211 M parameters; `--small`:
the tiny test UNet, for a quick dry run on a CPU). Every run is `dmad train` in a process of its
own, bf16 on a GPU (fp32 on a CPU), batch 2, 256 px on a GPU (64 px on a CPU, 32 with --small);
the peak is the engine's own reading (metrics.csv mem_peak_alloc_gb: torch's allocator, the
ledger's scope). A dry run on the CPU (--small, 2026-12-07): 79 s, the resume exact.

Rows: ddp (one process, nothing sharded) and fsdp, 6 iterations each; fsdp stopped at iteration 3
and resumed to 6 (its final student and fake score must equal the uninterrupted fsdp run's);
fsdp with fsdp_cpu_offload, 3 iterations.
"""
from __future__ import annotations

import argparse
import csv
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))


def train(out: Path, config: Path, name: str, sets: list[str], resume: bool = False) -> dict:
    from dmad.contract.paths import engine_argv

    run_dir = out / name
    argv = engine_argv("train", "--config", str(config), "--run-dir", str(run_dir),
                       *sum((["--set", s] for s in sets), []), *(["--resume", "latest"] if resume else []))
    t0 = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        tail = proc.stderr.strip().splitlines()[-1:] or ["(no output)"]
        raise SystemExit(f"{name}: dmad train failed ({proc.returncode}): {tail[0]}")
    with open(run_dir / "metrics.csv", newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    steps = [float(r["step_time_s"]) for r in rows if r.get("step_time_s")]
    peaks = [float(r["mem_peak_alloc_gb"]) for r in rows if r.get("mem_peak_alloc_gb")]
    return {"name": name, "wall_s": round(wall, 1), "iterations": len(rows),
            "step_time_s": round(sum(steps[1:]) / max(1, len(steps) - 1), 4),
            "peak_alloc_gib": round(max(peaks), 3) if peaks else None}


def ledger_total(config: Path, sets: list[str]) -> float:
    from dmad.contract.paths import engine_argv

    argv = engine_argv("ledger", "--config", str(config), "--json", *sum((["--set", s] for s in sets), []))
    return float(json.loads(subprocess.run(argv, capture_output=True, text=True, check=True).stdout)["total_gib"])


def same_networks(a: Path, b: Path, teacher: Path) -> dict:
    """The largest relative difference per network between two checkpoints (sharded or not)."""
    import torch
    from diffusers import UNet2DConditionModel

    from dmad.models.checkpoint import load_network

    out = {}
    for name in ("student", "fake_score"):
        nets = []
        for ckpt in (a, b):
            unet = UNet2DConditionModel.from_pretrained(str(teacher / "unet"))
            load_network(unet, ckpt, name, "full")
            nets.append(torch.cat([p.detach().flatten().float() for p in unet.state_dict().values()]))
        out[name] = float((nets[0] - nets[1]).abs().max() / nets[0].abs().max())
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--small", action="store_true", help="the tiny test UNet (a dry run on a CPU)")
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    import torch

    from dmad.testing.tiny import make_caption_folder, make_tiny_sd_pipeline

    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    teacher, data = out / "teacher", out / "data"
    if args.small:
        if not (teacher / "unet").is_dir():
            make_tiny_sd_pipeline(teacher)
    else:
        from fsdp_memory import make_teacher

        make_teacher(teacher)
    cuda = torch.cuda.is_available()
    res = 256 if cuda and not args.small else (32 if args.small else 64)
    if not data.is_dir():
        make_caption_folder(data, n=8, size=res)
    prompts = out / "prompts.json"
    prompts.write_text(json.dumps({"prompt_set": "gpu", "version": "v1", "resolution": [res, res], "seed": 0,
                                   "steps": 1, "items": [{"id": "a", "topic": "t", "prompt": "a red square"}]}))
    config = out / "config.json"
    config.write_text(json.dumps({
        "config_version": 2,
        "identity": {"pretrained_model_name_or_path": str(teacher), "train_data_dir": str(data),
                     "output_dir": str(out), "student": "full", "fake_score": "full"},
        "resources": {"resolution": res, "train_batch_size": 2, "mixed_precision": "bf16" if cuda else "no"},
        "optimization": {"max_train_steps": 6, "lr_scheduler": "constant"},
        "observation": {"prompt_set": str(prompts), "checkpointing_steps": 3, "log_every_steps": 1}}))
    fsdp = ["resources.distributed=fsdp"]
    for name in ("ddp", "fsdp", "fsdp-resumed", "fsdp-offload"):
        shutil.rmtree(out / name, ignore_errors=True)
    rows = {"ddp": train(out, config, "ddp", []), "fsdp": train(out, config, "fsdp", fsdp)}
    # stopped at 3, resumed to 6: a copy of the fsdp run cut back to its iteration-3 checkpoint
    shutil.copytree(out / "fsdp", out / "fsdp-resumed")
    shutil.rmtree(out / "fsdp-resumed" / "checkpoints" / "iter_6")
    (out / "fsdp-resumed" / "checkpoints" / "latest.json").write_text(json.dumps({"iter": 3, "path": "iter_3"}))
    rows["fsdp resumed at 3"] = train(out, config, "fsdp-resumed", fsdp, resume=True)
    rows["fsdp + cpu offload"] = train(out, config, "fsdp-offload", fsdp + ["resources.fsdp_cpu_offload=true",
                                                                           "optimization.max_train_steps=3"])
    diff = same_networks(out / "fsdp" / "checkpoints" / "iter_6", out / "fsdp-resumed" / "checkpoints" / "iter_6",
                         teacher)
    ledgers = {"ddp": ledger_total(config, []), "fsdp": ledger_total(config, fsdp),
               "fsdp + cpu offload": ledger_total(config, fsdp + ["resources.fsdp_cpu_offload=true"])}
    device = torch.cuda.get_device_name(0) if cuda else "cpu"
    result = {"device": device, "resolution": res, "rows": rows, "resume_max_rel_diff": diff, "ledger_gib": ledgers}
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"device: {device}, {res} px, batch 2, world size 1")
    print("| run | iterations | step time s | peak allocated GiB | ledger GiB |\n|---|---:|---:|---:|---:|")
    for label, r in rows.items():
        print(f"| {label} | {r['iterations']} | {r['step_time_s']:.3f} | {r['peak_alloc_gib']} | "
              f"{ledgers.get(label, ledgers['fsdp'] if label.startswith('fsdp resumed') else '-')} |")
    print(f"resume: largest relative difference to the uninterrupted run {diff}")
    print(f"fsdp / ddp step time at world size 1: {rows['fsdp']['step_time_s'] / rows['ddp']['step_time_s']:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
