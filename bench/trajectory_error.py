"""How far a student's one-step prediction lands from the teacher's guided ODE, by timestep: the
quantity consistency distillation (LCM) trains, measured for any run (LCM or DMAD) and beside the
teacher's own few-step Euler.

1. The teacher's reference trajectories: its guided ODE (CFG as the run's real_guidance_scale),
   Euler / DDIM steps on LCM's 50-point skipping grid (999, 979, ..., 19, then 0) with the students'
   timesteps added, from the demo bench's initial noise and prompts. x_t is kept at every student
   timestep; the trajectory's end x_0 is the reference.
2. For each checkpoint and timestep t: the student's x0 prediction f(x_t, t), one network call.
   - error: mean((f - x_0)^2) over the latents (the latents' variance is printed for scale);
   - sharpness: the decoded image's mean absolute gradient over that of the decoded x_0 (1.0 = as
     sharp as the teacher's 50-step images; below 1: blur, the regression-to-the-mean error a
     trajectory-matching student makes where it cannot tell the endpoint).
3. The teacher's own 1 / 2 / 4-step Euler from the same noise (trailing timesteps 999, 749, ...:
   sigmas 1 .. 1/k at shift 1, the bench's baseline), scored the same way against its 50-step end.

Same prompts, noise and seeds for every row, so rows compare directly.

    python bench/trajectory_error.py RUN [RUN ...] [--checkpoints 400,800] [--prompts 32] [--seeds 4] [--json OUT]

~1 minute per 8 checkpoints plus ~40 s for the reference at the defaults, on 2 idle CPU cores.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def sharpness(img: torch.Tensor) -> torch.Tensor:
    """(B,) mean absolute horizontal + vertical difference of (B, 3, H, W) images in [-1, 1]."""
    dx = (img[..., :, 1:] - img[..., :, :-1]).abs().mean(dim=(1, 2, 3))
    dy = (img[..., 1:, :] - img[..., :-1, :]).abs().mean(dim=(1, 2, 3))
    return dx + dy


def euler(fam, teacher, x: torch.Tensor, grid: list[int], cond, uncond, scale: float, schedule,
          keep: set[int] = frozenset()) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
    """The teacher's guided DDIM (= flow Euler) along `grid` (descending, ending at 0); the states at `keep`."""
    from dmad.methods.prediction import ddim_step

    states = {}
    for t, t_next in zip(grid[:-1], grid[1:]):
        if t in keep:
            states[t] = x.clone()
        tt = torch.full((x.shape[0],), t, dtype=torch.long)
        x0 = fam.guided_x0(teacher.denoiser, x, tt, cond, uncond, scale, schedule)
        x = ddim_step(x, x0, tt, torch.full_like(tt, t_next), schedule)
    return x, states


def row(name: str, preds: dict, end: torch.Tensor, decode) -> dict:
    ref = sharpness(decode(end)).mean().item()
    out = {"model": name}
    for key, x0 in preds.items():
        out[f"err@{key}"] = ((x0 - end) ** 2).mean().item()
        out[f"sharp@{key}"] = sharpness(decode(x0)).mean().item() / ref
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path, help="run folders (DMAD or LCM) of the same teacher")
    ap.add_argument("--checkpoints", default="", help="iterations to score, comma-separated (default: all)")
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--seeds", type=int, default=4)
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args(argv)
    torch.set_num_threads(2)

    from dmad.contract.config import load_config
    from dmad.contract.runs import RunFolder
    from dmad.demo.bench_sampling import load_student
    from dmad.demo.bench_sets import SETS, full_items, initial_noise
    from dmad.methods.lcm import solver_grid
    from dmad.models.teacher import load_identity_teacher
    from dmad.sample.render import latent_shape

    t0 = time.time()
    cfgs = [load_config(RunFolder(r).config_json) for r in a.runs]
    ident = cfgs[0].identity
    teacher = load_identity_teacher(ident, dtype=torch.float32)
    fam, res, scale = teacher.family, cfgs[0].resources.resolution, cfgs[0].distillation.real_guidance_scale
    schedule = fam.schedule(teacher.scheduler, res)
    items = full_items(SETS["tuning"], a.prompts, a.seeds)  # a diagnostic: the tuning set's items
    caps = [c for c, _, _ in items]
    noise = initial_noise(items, SETS["tuning"].noise_a, latent_shape(teacher.vae, res, res)).float()
    cond, uncond = fam.encode(teacher.modules, caps, "cpu"), fam.uncond(teacher.modules, "cpu")

    timesteps: set[int] = set()
    runs = []
    want = {int(x) for x in a.checkpoints.split(",") if x}
    for run in a.runs:
        for it, ck in RunFolder(run).list_checkpoints():
            if not want or it in want:
                st = json.loads((ck / "training_state.json").read_text(encoding="utf-8"))
                timesteps |= set(st["student_timesteps"])
                runs.append((run, it, ck, st["student_timesteps"]))
    grid = sorted(set(solver_grid(50).tolist()) | timesteps | {0}, reverse=True)

    def decode(x):
        with torch.no_grad():
            return torch.cat([fam.decode(teacher.vae, x[i:i + 64]) for i in range(0, len(x), 64)]).float()

    with torch.no_grad():
        end, states = euler(fam, teacher, noise.clone(), grid, cond, uncond, scale, schedule, timesteps)
        rows, baselines = [], {}
        n = schedule.num_train_timesteps
        for k in (1, 2, 4):  # trailing timesteps 999, 749, ...: sigmas 1 .. 1/k at shift 1, the bench's baseline
            ts = [n - 1 - i * n // k for i in range(k)] + [0]
            baselines[f"{k} steps"] = euler(fam, teacher, noise.clone(), ts, cond, uncond, scale, schedule)[0]
        rows.append(row("teacher Euler + CFG", baselines, end, decode))
        print(f"reference: {len(caps)} images, {len(grid) - 1} guided steps; latent variance {end.var().item():.4f}; "
              f"{time.time() - t0:.0f} s", flush=True)
        for run, it, ck, ts in runs:
            student, _ = load_student(run, teacher, ck)
            preds = {}
            for t in ts:
                tt = torch.full((noise.shape[0],), t, dtype=torch.long)
                preds[f"t={t}"] = fam.x0(student, states[t], tt, cond, schedule).float()
            method = load_config(RunFolder(run).config_json).distillation.method
            rows.append(row(f"{run.name} ({method}) iter {it}", preds, end, decode))
            print(json.dumps(rows[-1]), flush=True)

    print("\n| model | input | error vs the 50-step end | sharpness vs the 50-step end |\n|---|---|---:|---:|")
    for r in rows:
        for key in (k[4:] for k in r if k.startswith("err@")):
            print(f"| {r['model']} | {key} | {r['err@' + key]:.4f} | {r['sharp@' + key]:.3f} |")
    if a.json:
        a.json.write_text(json.dumps({"rows": rows, "latent_variance": end.var().item(), "images": len(caps),
                                      "grid_steps": len(grid) - 1, "wall_s": time.time() - t0}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
