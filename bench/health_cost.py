"""What the health signals cost a validation, and which diversity feature they use.

    python bench/health_cost.py [--rounds R] [--features] [--keep DIR] [--json OUT]

On the demo teacher (resources/demo/teacher) and the demo prompt set (demo_v4: 14 prompts at
64 px, 4 health seeds), in one process, models loaded once:

1. The teacher reference at 8 seeds per prompt (the prompt set's sampler, steps and CFG).
2. A validation: the prompt set rendered with the student's timesteps (4 steps; the "student" is
   the teacher's own denoiser: a validation's cost does not depend on what the weights learned),
   with health_seeds 4 (what demo_v4 renders) and with 0 (the grid images only, as before).
3. The health computation on those same images (dmad.train.health_check.record_health's work:
   reading the PNGs, the seven signals against the teacher's cached levels, the alert rule, the
   health.csv row), --rounds times; the teacher's levels once (once per run in training).

The table gives the median times and the computation's share of the validation it follows
(target: at most 10%). A training step runs none of this (the health code is called only from
validation), so its cost to a step is 0 by construction.

--features also measures the two candidate diversity features (dmad.sample.health.FEATURES) on the
teacher's renders: seeds 0-3 as the reference, and against it (a) seeds 4-7 (a healthy set:
about 1.0), (b) seed 0 four times with tiny perturbations (1/255 pixel noise; two copies shifted
by one pixel: a collapsed set, about 0), (c) two distinct images of four (half collapsed); over
the prompts whose teacher diversity is above 3x the feature's own floor (one seed of four shifted
by a pixel; a full demo caption has about one right image, so its teacher diversity is noise).
Separation = (healthy mean - collapsed mean) / SD of the healthy per-prompt ratios.
~3 min on 2 CPU cores (most of it the teacher's 112 images at 50 steps).
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def _load():
    import torch

    from dmad.contract.config import load_config
    from dmad.contract.paths import resource
    from dmad.contract.prompts import load_prompt_set
    from dmad.models.teacher import load_identity_teacher

    cfg = load_config(resource("configs", "demo.json"))
    teacher = load_identity_teacher(cfg.identity, dtype=torch.float32)
    return cfg, teacher, load_prompt_set(cfg.observation.prompt_set)


def _render_student(out: Path, cfg, teacher, ps) -> float:
    import torch

    from dmad.sample.render import library_versions, render_student_samples

    t0 = time.perf_counter()
    render_student_samples(out, student=teacher.denoiser, vae=teacher.vae, family=teacher.family,
                           encode=lambda p: teacher.family.encode(teacher.modules, p, "cpu"),
                           schedule=teacher.family.schedule(teacher.scheduler, cfg.resources.resolution),
                           timesteps=cfg.distillation.resolved_student_timesteps(), prompt_set=ps, iteration=1,
                           device=torch.device("cpu"), dtype=torch.float32, versions=library_versions())
    return time.perf_counter() - t0


def _health_once(student_dir: Path, teacher_dir: Path, ps, csv_path: Path, state) -> float:
    """record_health's work, without a run: the images read back, signals, alerts, one CSV row."""
    from dmad.contract.runlog import HEALTH_COLUMNS, CsvAppender, health_row, read_health
    from dmad.sample import health
    from dmad.train.health_check import _teacher, folder_images, last_healthy_checkpoint

    t0 = time.perf_counter()
    _teacher(state, teacher_dir, ps)
    signals = health.health_signals(folder_images(student_dir, ps), state.teacher_images, state.teacher_levels)
    rows = read_health(csv_path)
    alerts = health.alerts_for(signals, 1, health.history_of(rows), str(last_healthy_checkpoint(rows)))
    with CsvAppender(csv_path, HEALTH_COLUMNS) as f:
        f.append(health_row(1, None, signals, [a.signal for a in alerts]))
    return time.perf_counter() - t0


def _features(teacher8: Path, ps8) -> dict:
    import numpy as np

    from dmad.sample import health
    from dmad.train.health_check import folder_images

    images = folder_images(teacher8, ps8)
    ref = {pid: ims[:4] for pid, ims in images.items()}
    healthy = {pid: ims[4:8] for pid, ims in images.items()}
    rng = np.random.default_rng(0)

    def jitter(im, shift=0):
        return np.roll(np.clip(im + rng.normal(0, 1 / 255, im.shape).astype(np.float32), 0, 1), shift, axis=1)

    collapsed = {pid: [jitter(ims[0], s) for s in (0, 0, 1, -1)] for pid, ims in ref.items()}
    shift_one = {pid: [ims[0], ims[0], ims[0], np.roll(ims[0], 1, axis=1)] for pid, ims in ref.items()}
    half = {pid: [ims[0], jitter(ims[0]), ims[1], jitter(ims[1])] for pid, ims in ref.items()}
    out = {}
    for name in health.FEATURES:
        t_levels = health.set_levels(ref, name)
        floor = health.set_levels(shift_one, name)  # the feature's own noise floor, per prompt
        keep = [p for p in ref if t_levels[p].diversity > 3 * floor[p].diversity]

        def ratios(imgs):
            levels = health.set_levels({p: imgs[p] for p in keep}, name)
            return [levels[p].diversity / t_levels[p].diversity for p in keep]

        h, c, hc = ratios(healthy), ratios(collapsed), ratios(half)
        t0 = time.perf_counter()
        for ims in images.values():
            for im in ims:
                health.FEATURES[name](im)
        ms = (time.perf_counter() - t0) / sum(len(v) for v in images.values()) * 1000
        out[name] = {"prompts": keep, "healthy_mean": statistics.mean(h), "healthy_sd": statistics.stdev(h),
                     "healthy_min": min(h), "collapsed_mean": statistics.mean(c), "half_mean": statistics.mean(hc),
                     "separation": (statistics.mean(h) - statistics.mean(c)) / statistics.stdev(h),
                     "shift_floor": [round(floor[p].diversity, 4) for p in ref],
                     "teacher": [round(t_levels[p].diversity, 4) for p in ref], "ms_per_image": ms}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--features", action="store_true", help="also compare the diversity feature candidates")
    ap.add_argument("--keep", type=Path, help="render into this folder and keep it")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    import torch

    from dmad.sample.render import library_versions, render_teacher_samples
    from dmad.train.health_check import HealthState

    torch.set_num_threads(max(1, torch.get_num_threads()))
    root = args.keep or Path(tempfile.mkdtemp(prefix="health_cost_"))
    try:
        cfg, teacher, ps = _load()
        ps8 = ps.model_copy(update={"health_seeds": 8})
        t0 = time.perf_counter()
        render_teacher_samples(root / "teacher", teacher=teacher, prompt_set=ps8, versions=library_versions())
        teacher_s = time.perf_counter() - t0
        ps0 = ps.model_copy(update={"health_seeds": 0})
        render = {"health_seeds_4": [], "health_seeds_0": []}
        for r in range(args.rounds):  # interleaved, so drift on a shared machine hits both alike
            render["health_seeds_4"].append(_render_student(root / f"iter_4_{r}", cfg, teacher, ps))
            render["health_seeds_0"].append(_render_student(root / f"iter_0_{r}", cfg, teacher, ps0))
        state = HealthState()
        t0 = time.perf_counter()
        _health_once(root / "iter_4_0", root / "teacher", ps, root / "health.csv", state)
        first_s = time.perf_counter() - t0
        health_s = [_health_once(root / f"iter_4_{r}", root / "teacher", ps, root / "health.csv", state)
                    for r in range(args.rounds)]
        v4, v0, h = (statistics.median(render["health_seeds_4"]), statistics.median(render["health_seeds_0"]),
                     statistics.median(health_s))
        result = {"prompts": len(ps.items), "health_seeds": ps.health_seeds, "teacher_8_seeds_s": teacher_s,
                  "validation_s": v4, "validation_without_health_seeds_s": v0, "health_s": h,
                  "health_first_s_with_teacher_levels": first_s, "health_share_of_validation": h / v4,
                  "threads": torch.get_num_threads()}
        print(f"demo prompt set, {len(ps.items)} prompts at {ps.width} px, CPU, {torch.get_num_threads()} threads, "
              f"median of {args.rounds}:")
        print(f"  validation render, health_seeds 4 ({len(ps.items) * 4} images): {v4:8.3f} s")
        print(f"  validation render, health_seeds 0 ({len(ps.items)} images):  {v0:8.3f} s")
        print(f"  health computation on the same images:          {h * 1000:8.1f} ms  "
              f"({h / v4:.1%} of the validation; target <= 10%)")
        print(f"  first computation (teacher's levels read once):  {first_s * 1000:8.1f} ms")
        print("  training step: 0 (health runs only inside validation)")
        if args.features:
            result["features"] = _features(root / "teacher", ps8)
            print("diversity features (ratio to the teacher's seeds 0-3, per prompt, mean over prompts):")
            for name, f in result["features"].items():
                print(f"  {name:7s} {len(f['prompts'])} prompts above 3x its one-pixel-shift floor: healthy {f['healthy_mean']:.3f} (SD {f['healthy_sd']:.3f}, min "
                      f"{f['healthy_min']:.3f})  half-collapsed {f['half_mean']:.3f}  collapsed "
                      f"{f['collapsed_mean']:.3f}  separation {f['separation']:.1f} SD  {f['ms_per_image']:.2f} ms/image")
        if args.json:
            args.json.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    finally:
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
