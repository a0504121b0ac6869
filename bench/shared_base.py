"""One frozen base vs separate copies: time per iteration and frozen weights held, per family.

    python bench/shared_base.py [--rounds R] [--iters N] [--json OUT]

For each tiny family teacher (dmad.testing.tiny: SD, SDXL, SD3, Flux) the same LoRA/LoRA run
(resources.share_frozen_base true, then false; same seed, data and config otherwise) is trained in
this process, alternating A B A B ... for R rounds so that both sides meet the same machine load.
Per run: the median `step_time_s` of metrics.csv over its iterations after the first two (warm-up).
Reported per family: each side's median over rounds, and the headline ratio shared / separate (the
median of the per-round ratios, with min and max); plus the denoiser weights each side holds (unique
tensor storages of teacher + student + fake score: one base, or three copies).

Cost: ~3 min with the defaults on a 2-core CPU. Train nothing else meanwhile.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def _teachers(root: Path) -> dict[str, Path]:
    from dmad.testing.tiny import (make_tiny_flux_pipeline, make_tiny_sd3_pipeline, make_tiny_sd_pipeline,
                                   make_tiny_sdxl_pipeline)

    builders = {"sd": make_tiny_sd_pipeline, "sdxl": make_tiny_sdxl_pipeline, "sd3": make_tiny_sd3_pipeline,
                "flux": make_tiny_flux_pipeline}
    out = {}
    for name, build in builders.items():
        build(root / name)
        out[name] = root / name
    return out


def _config(root: Path, teacher: Path, data: Path, prompts: Path, name: str, share: bool, iters: int) -> Path:
    cfg = {"config_version": 2,
           "identity": {"pretrained_model_name_or_path": str(teacher), "train_data_dir": str(data),
                        "output_dir": str(root / "runs"), "run_name": name, "student": "lora",
                        "fake_score": "lora", "lora_rank": 4},
           "resources": {"resolution": 32, "train_batch_size": 2, "share_frozen_base": share},
           "optimization": {"max_train_steps": iters},
           "distillation": {"student_steps": 1, "critic_updates_per_generator_update": 1},
           "observation": {"prompt_set": str(prompts), "checkpointing_steps": 10**6, "validation_steps": 10**6,
                           "log_every_steps": 1}}
    path = root / f"{name}.json"
    path.write_text(json.dumps(cfg), encoding="utf-8")
    return path


def _median_step(run: Path) -> float:
    import csv

    with open(run / "metrics.csv", newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    return statistics.median(float(r["step_time_s"]) for r in rows[2:])


def held_bytes(teacher_path: Path, share: bool) -> int:
    """Bytes of the unique tensor storages of teacher denoiser + student + fake score."""
    from dmad.methods.dmd2 import make_networks
    from dmad.models.networks import TeacherCopies
    from dmad.models.teacher import load_teacher

    teacher = load_teacher(str(teacher_path), components=("denoiser",))
    copies = TeacherCopies(teacher.denoiser, lora_rank=4, lora_alpha=None, gradient_checkpointing=False,
                           family=teacher.family, share_frozen_base=share)
    nets = make_networks(copies, student="lora", fake_score="lora", gan_on_teacher=False, ema_decay=None)
    seen, total = set(), 0
    modules = [teacher.denoiser] + ([] if share else [nets.student, nets.fake_score])
    for m in modules:
        for t in list(m.parameters()) + list(m.buffers()):
            key = t.untyped_storage().data_ptr()
            if key not in seen:
                seen.add(key)
                total += t.untyped_storage().nbytes()
    return total


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--iters", type=int, default=40)
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)

    import torch

    from dmad.contract.config import load_config
    from dmad.testing.tiny import make_caption_folder
    from dmad.train.loop import run_training

    t0, c0 = time.perf_counter(), time.process_time()
    out = {"machine": {"cpu": platform.processor() or platform.machine(), "torch": torch.__version__,
                       "threads": torch.get_num_threads()}, "rounds": a.rounds, "iters": a.iters, "families": {}}
    with tempfile.TemporaryDirectory(prefix="dmad-shared-base-") as tmp:
        root = Path(tmp)
        data = make_caption_folder(root / "data", n=8, size=32)
        prompts = root / "prompts.json"
        prompts.write_text(json.dumps({"prompt_set": "bench", "version": "v1", "resolution": [32, 32], "seed": 0,
                                       "steps": 2, "items": [{"id": "a", "topic": "t", "prompt": "a red square"}]}))
        teachers = _teachers(root)
        for fam, teacher in teachers.items():
            times: dict[bool, list[float]] = {True: [], False: []}
            for r in range(a.rounds):
                for share in ((True, False) if r % 2 == 0 else (False, True)):
                    name = f"{fam}-{'shared' if share else 'separate'}-{r}"
                    cfg = load_config(_config(root, teacher, data, prompts, name, share, a.iters))
                    with open(os.devnull, "w") as quiet, contextlib.redirect_stdout(quiet):  # the event stream
                        assert run_training(cfg, run_dir=root / name, resume=None, argv=["dmad", "train"]) == 0
                    times[share].append(_median_step(root / name))
            ratios = [s / c for s, c in zip(times[True], times[False])]
            row = {"shared_s": statistics.median(times[True]), "separate_s": statistics.median(times[False]),
                   "ratio": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios),
                   "held_mb_shared": held_bytes(teacher, True) / 1e6, "held_mb_separate": held_bytes(teacher, False) / 1e6}
            out["families"][fam] = row
            print(f"{fam:5} shared {row['shared_s'] * 1e3:7.1f} ms  separate {row['separate_s'] * 1e3:7.1f} ms  "
                  f"ratio {row['ratio']:.3f} [{row['ratio_min']:.3f}, {row['ratio_max']:.3f}]  denoiser weights held "
                  f"{row['held_mb_shared']:.2f} MB vs {row['held_mb_separate']:.2f} MB", flush=True)
    out["wall_s"], out["cpu_s"] = round(time.perf_counter() - t0, 1), round(time.process_time() - c0, 1)
    print(f"wall {out['wall_s']} s, CPU {out['cpu_s']} s")
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
