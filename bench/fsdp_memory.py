"""Does fsdp divide what it shards? Per-process memory of a 2-process fsdp run against a 1-process
run, on the CPU (gloo), with the ledger's figures beside (issue 41).

    python bench/fsdp_memory.py --out DIR [--json OUT]

The model: a random UNet with SD 1.5's layout at half its widths (block_out_channels 160, 320,
640, 640; about 200 M parameters) on the tiny VAE and text encoder of the tests, so the trained
state (student + fake score + GAN head, float32 weights, gradients and two AdamW states: 16 bytes
a parameter) dominates each process. Each run trains 6 iterations at 64 px, batch 1 a process,
through `dmad train` (ranks launched by accelerate), while this script samples the resident
memory (RSS) of every rank process every 0.2 s; a rank's figure is its largest RSS from the
first iteration's metric event to the fifth's (training: past the build, whose full float32 copies
exist before fully_shard keeps each rank's slice, and before the final checkpoint's serialisation,
which buffers a rank's shards once more). glibc
is told to return freed blocks of 64 KiB and more (MALLOC_MMAP_THRESHOLD_), in every run alike:
otherwise RSS keeps every transient the run ever had (measured: a 2-process fsdp rank read 9.8
GiB against 7.2 for one process, while its live tensors were about half).

What is compared: the state's share of a process, RSS of the full/full run minus RSS of the same
run with a rank-1 LoRA student and fake score on one shared frozen base (the same teacher, VAE,
text encoder, data, activations and torch runtime, with almost no trained state), at 1 process
(ddp: no sharding) and at 2 processes (fsdp). Target: the 2-process figure per rank <= 0.6x the
1-process one. A 2-process ddp run gives the whole-state figure per rank and, with fsdp's, the
step times of both on this machine (gloo on 2 CPU cores: not what NCCL on GPUs gives).
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

GIB = 2 ** 30
STEPS = 6  # iterations a run trains


def make_teacher(path: Path) -> int:
    """The tiny test pipeline with its UNet replaced by SD 1.5's layout at half width; its parameters."""
    from diffusers import UNet2DConditionModel

    from dmad.testing.tiny import make_tiny_sd_pipeline

    if not (path / "unet").is_dir() or not (path / "done").is_file():
        make_tiny_sd_pipeline(path)
        tiny = UNet2DConditionModel.from_pretrained(str(path / "unet"))
        unet = UNet2DConditionModel(
            sample_size=8, in_channels=4, out_channels=4, layers_per_block=2,
            block_out_channels=(160, 320, 640, 640), attention_head_dim=8,
            down_block_types=("CrossAttnDownBlock2D",) * 3 + ("DownBlock2D",),
            up_block_types=("UpBlock2D",) + ("CrossAttnUpBlock2D",) * 3,
            cross_attention_dim=tiny.config.cross_attention_dim, norm_num_groups=32)
        unet.save_pretrained(str(path / "unet"), safe_serialization=True)
        (path / "done").write_text("ok")
    return sum(p.numel() for p in UNet2DConditionModel.from_pretrained(str(path / "unet")).parameters())


def sample_rss(run_dir: Path, stop: threading.Event, out: dict) -> None:
    """{pid: [(time, rss bytes, training?)]} of the processes whose command line names run_dir."""
    import psutil

    events = run_dir / "events.jsonl"
    while not stop.is_set():
        text = events.read_text(encoding="utf-8", errors="replace") if events.is_file() else ""
        # training: from the first iteration's metric event to the last but one's (the state, not
        # the final checkpoint's serialisation, which buffers a rank's shards once more)
        metrics = len(re.findall(r'"kind":"metric","iter":\d+,"data":\{"(?!source")', text))  # not the sampler's
        training = 1 <= metrics < STEPS - 1
        for p in psutil.process_iter(["pid", "cmdline"]):
            try:
                cmd = " ".join(p.info["cmdline"] or [])
                if str(run_dir) in cmd:  # the engine, accelerate's launcher and the ranks: the ranks hold the most
                    out.setdefault(p.info["pid"], []).append((time.time(), p.memory_info().rss, training, cmd))
            except psutil.Error:
                pass
        time.sleep(0.2)


def step_time(run_dir: Path) -> float:
    """The mean step time of the run's iterations past the first (metrics.csv)."""
    import csv

    with open(run_dir / "metrics.csv", newline="", encoding="utf-8") as f:
        steps = [float(r["step_time_s"]) for r in csv.DictReader(f) if r.get("step_time_s")]
    return round(sum(steps[1:]) / max(1, len(steps) - 1), 3)


def run(out: Path, name: str, config: Path, processes: int, extra: list[str]) -> dict:
    import subprocess

    from dmad.contract.paths import engine_argv

    run_dir = out / "runs" / name
    facts = out / "runs" / f"{name}.json"
    if facts.is_file():
        return {**json.loads(facts.read_text(encoding="utf-8")), "step_time_s": step_time(run_dir)}
    import shutil

    shutil.rmtree(run_dir, ignore_errors=True)
    samples: dict = {}
    stop = threading.Event()
    watcher = threading.Thread(target=sample_rss, args=(run_dir, stop, samples), daemon=True)
    watcher.start()
    argv = engine_argv("train", "--config", str(config), "--run-dir", str(run_dir), "--num-processes", str(processes),
                       *sum((["--set", s] for s in extra), []))
    t0 = time.perf_counter()
    import os

    # glibc keeps freed heap memory resident, so RSS would show every transient the run ever had
    # (the full copies before sharding, the gathered units) rather than what it holds: blocks of
    # 64 KiB and more are mmapped and returned on free (the same setting for every run)
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "65536"}
    proc = subprocess.run(argv, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    stop.set()
    watcher.join()
    if proc.returncode != 0:
        raise SystemExit(f"{name}: dmad train failed ({proc.returncode}): {proc.stderr.strip().splitlines()[-1:]}")
    # the ranks: processes that trained (a launcher waits and holds little); largest RSS while training
    ranks = {pid: max(r for _, r, training, _ in s if training) for pid, s in samples.items()
             if any(training for _, _, training, _ in s)}
    ranks = dict(sorted(ranks.items(), key=lambda kv: -kv[1])[:processes])
    result = {"name": name, "processes": processes, "wall_s": round(wall, 1),
              "rss_gib_per_rank": sorted((round(v / GIB, 3) for v in ranks.values()), reverse=True)}
    facts.parent.mkdir(parents=True, exist_ok=True)
    facts.write_text(json.dumps(result, indent=2), encoding="utf-8")
    result["step_time_s"] = step_time(run_dir)
    print(f"{name}: per-rank RSS while training {result['rss_gib_per_rank']} GiB ({wall:.0f} s)", file=sys.stderr)
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    from dmad.contract.config import load_config
    from dmad.memory.ledger import config_ledger
    from dmad.testing.tiny import make_caption_folder

    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    teacher, data = out / "teacher", out / "data"
    params = make_teacher(teacher)
    if not data.is_dir():
        make_caption_folder(data, n=8, size=64)
    prompts = out / "prompts.json"
    prompts.write_text(json.dumps({"prompt_set": "mem", "version": "v1", "resolution": [64, 64], "seed": 0,
                                   "steps": 1, "items": [{"id": "a", "topic": "t", "prompt": "a red square"}]}))
    config = out / "config.json"
    config.write_text(json.dumps({
        "config_version": 2,
        "identity": {"pretrained_model_name_or_path": str(teacher), "train_data_dir": str(data),
                     "output_dir": str(out / "runs"), "student": "full", "fake_score": "full"},
        "resources": {"resolution": 64, "train_batch_size": 1},
        "optimization": {"max_train_steps": STEPS, "lr_scheduler": "constant"},
        "observation": {"prompt_set": str(prompts), "checkpointing_steps": 100, "log_every_steps": 1}}))
    lora = ["identity.student=lora", "identity.fake_score=lora", "identity.lora_rank=1"]
    rows = {
        "full/full, 1 process": run(out, "full-1", config, 1, []),
        "LoRA r1 shared base, 1 process": run(out, "lora-1", config, 1, lora),
        "full/full fsdp, 2 processes": run(out, "fsdp-2", config, 2, ["resources.distributed=fsdp"]),
        "LoRA r1 shared base, 2 processes": run(out, "lora-2", config, 2, lora),
        "full/full ddp, 2 processes": run(out, "ddp-2", config, 2, []),
    }
    one = rows["full/full, 1 process"]["rss_gib_per_rank"][0] - rows["LoRA r1 shared base, 1 process"]["rss_gib_per_rank"][0]
    two = max(rows["full/full fsdp, 2 processes"]["rss_gib_per_rank"]) - max(
        rows["LoRA r1 shared base, 2 processes"]["rss_gib_per_rank"])
    cfg = load_config(config)
    ledger = {}
    for n, mode in ((1, "ddp"), (2, "fsdp")):
        lines = config_ledger(cfg, processes=n, distributed=mode)
        ledger[n] = sum(x.gib for x in lines if x.name in ("student (full)", "fake score (full)", "GAN head"))
    result = {"unet_params": params, "rows": rows, "state_gib": {"1": round(one, 3), "2": round(two, 3)},
              "ratio": round(two / one, 3), "ledger_state_gib": {"1": round(ledger[1], 3), "2": round(ledger[2], 3)}}
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"UNet: {params / 1e6:.0f} M params")
    print("| run | RSS per rank while training (GiB) | step time s (iterations 2-6) | wall s |\n|---|---|---:|---:|")
    for label, r in rows.items():
        print(f"| {label} | {', '.join(f'{v:.2f}' for v in r['rss_gib_per_rank'])} | {r.get('step_time_s', 0):.2f} | "
              f"{r['wall_s']:.0f} |")
    print(f"\ntrained state per process (full/full minus the LoRA r1 run): 1 process {one:.2f} GiB, 2 processes (fsdp) "
          f"{two:.2f} GiB per rank: {two / one:.2f}x (target <= 0.6x); the ledger's student + fake score + GAN head "
          f"lines: {ledger[1]:.2f} and {ledger[2]:.2f} GiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
