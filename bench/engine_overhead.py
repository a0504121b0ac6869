"""Engine overhead: one `dmad train` iteration vs a bare PyTorch loop doing the same update.

    python bench/engine_overhead.py [--quick] [--json OUT]

Both sides train the same tiny SD-layout teacher (dmad.tiny) on the same captioned folder with
the same update: student_steps 1, K = 5 critic updates per generator update (so one 5-iteration
cycle = 1 generator step + 5 critic steps), batch, resolution, AdamW, grad-norm clipping, DM +
GAN losses (dmad.methods.dmd2, the math both share), GAN head on the fake score's bottleneck.

A  the real engine, as users start it: `python -m dmad train` in a subprocess, with the
   worst-case observation settings (log_every_steps 1: a metrics.csv row, a metric event on
   stdout and in events.jsonl, a memory reading every iteration; control.jsonl polled every
   iteration; the monitor thread running). Checkpoints and validation never fall inside the
   measured window (the only ones are after the last iteration). Stdout goes to a file.
B  a bare loop written below: the same networks and losses, one torch.Generator for all noise,
   a plain DataLoader; no accelerate, run folder, events, metrics, per-sample RNG or monitor.

Timing: wall time between ends of iterations (A: the `t` of consecutive metric events, which is
written after everything the engine does per iteration; B: perf_counter at the same point).
Per run, the first `--warmup-cycles` 5-iteration cycles are skipped and the per-iteration
time is the median cycle time / 5 (a median so a burst of load from other processes on a
shared machine does not move it). A and B run in fresh processes, alternated
A B, B A, A B, ... (counterbalanced against drift in machine load); the report gives the
median over rounds of each side and the ratio A/B (ratio of medians, and min/max of the
per-round ratios, each A paired with the B run next to it).

Cost: --quick ~45 s, full ~3-4 min on a 2-core CPU (most of it process start-up and imports).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# Model size. dmad.tiny's default UNet (32, 64) runs a 5-iteration cycle in a few tens of ms, so
# fixed Python costs would be weighted far more than on a real teacher (SD 1.5 at 512 px: ~1 s
# per iteration on a GPU). (64, 128) channels, text width 64, 64 px images (32x32x4 latents) and
# batch 4 give ~0.2-0.3 s per iteration on a 2-core CPU: still tiny, but compute-dominated.
UNET_CHANNELS = (64, 128)
TEXT_DIM = 64
RESOLUTION = 64
BATCH = 4
K = 5  # critic updates per generator update
N_IMAGES = 32

HYPER = dict(generator_lr=1e-5, critic_lr=1e-5, adam_beta1=0.0, adam_beta2=0.999, adam_epsilon=1e-8,
             adam_weight_decay=0.01, max_grad_norm=10.0, real_guidance_scale=3.0, generator_gan_weight=1e-3,
             critic_gan_weight=1e-2, min_timestep=20, max_timestep=980, seed=0)


# --------------------------------------------------------------------------- setup (parent process)

def make_fixtures(root: Path) -> dict:
    from dmad.tiny import make_caption_folder, make_tiny_sd_pipeline

    teacher = root / "teacher"
    make_tiny_sd_pipeline(teacher, unet_channels=UNET_CHANNELS, text_dim=TEXT_DIM)
    data = make_caption_folder(root / "data", n=N_IMAGES, size=RESOLUTION)
    prompts = root / "prompts.json"  # one prompt, one step: the end-of-run samples cost little
    prompts.write_text(json.dumps({
        "prompt_set": "bench", "version": "v1", "resolution": [RESOLUTION, RESOLUTION], "seed": 0, "steps": 1,
        "items": [{"id": "red", "topic": "colour", "prompt": "a red square on a black background"}]}), encoding="utf-8")
    return {"teacher": str(teacher), "data": str(data), "prompts": str(prompts)}


def unet_parameters(teacher: str) -> int:
    from safetensors.torch import load_file

    path = next((Path(teacher) / "unet").glob("*.safetensors"))
    return sum(t.numel() for t in load_file(str(path)).values())


def engine_config(fx: dict, root: Path, iters: int) -> dict:
    h = HYPER
    return {
        "config_version": 1,
        "identity": {"pretrained_model_name_or_path": fx["teacher"], "train_data_dir": fx["data"],
                     "output_dir": str(root / "runs"), "student": "full", "fake_score": "full"},
        "resources": {"mixed_precision": "no", "train_batch_size": BATCH, "gradient_accumulation_steps": 1,
                      "resolution": RESOLUTION, "seed": h["seed"], "dataloader_num_workers": 0,
                      "gradient_checkpointing": False},
        "optimization": {"generator_lr": h["generator_lr"], "critic_lr": h["critic_lr"], "optimizer": "adamw",
                         "adam_beta1": h["adam_beta1"], "adam_beta2": h["adam_beta2"],
                         "adam_epsilon": h["adam_epsilon"], "adam_weight_decay": h["adam_weight_decay"],
                         "max_grad_norm": h["max_grad_norm"], "lr_scheduler": "constant", "lr_warmup_steps": 0,
                         "max_train_steps": iters},
        "distillation": {"student_steps": 1, "critic_updates_per_generator_update": K,
                         "real_guidance_scale": h["real_guidance_scale"],
                         "generator_gan_weight": h["generator_gan_weight"],
                         "critic_gan_weight": h["critic_gan_weight"], "gan_head_placement": "fake_score_bottleneck",
                         "min_timestep": h["min_timestep"], "max_timestep": h["max_timestep"], "ema_decay": None},
        "observation": {"log_every_steps": 1, "checkpointing_steps": 10**8, "validation_steps": None,
                        "prompt_set": fx["prompts"]},
    }


def child_env(threads: int) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    # Same intra-op thread count in both children (torch reads OMP_NUM_THREADS at start-up).
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONIOENCODING="utf-8", OMP_NUM_THREADS=str(threads))
    return env


# --------------------------------------------------------------------------- A: the engine

def run_engine(fx: dict, root: Path, tag: str, iters: int, threads: int, timeout: float) -> dict:
    cfg_path = root / f"config_{tag}.json"
    cfg_path.write_text(json.dumps(engine_config(fx, root, iters), indent=2), encoding="utf-8")
    run_dir = root / "runs" / tag
    out, err = root / f"{tag}.stdout", root / f"{tag}.stderr"
    with open(out, "wb") as fo, open(err, "wb") as fe:  # a file, never an unread pipe that could fill up
        p = subprocess.run([sys.executable, "-m", "dmad", "train", "--config", str(cfg_path), "--run-dir", str(run_dir)],
                           cwd=root, env=child_env(threads), stdout=fo, stderr=fe, timeout=timeout)
    if p.returncode != 0:
        raise SystemExit(f"dmad train exited {p.returncode}; see {err}:\n{err.read_text()[-2000:]}")
    ends, step_time = {}, {}
    for line in (run_dir / "events.jsonl").read_text(encoding="utf-8").splitlines():
        ev = json.loads(line)
        if ev["kind"] == "metric":
            ends[ev["iter"] - 1] = ev["t"]  # event of iteration i (0-based) carries iter = i + 1
            step_time[ev["iter"] - 1] = ev["data"]["step_time_s"]
    return {"ends": [ends[i] for i in range(iters)], "step_time_s": [step_time[i] for i in range(iters)]}


# --------------------------------------------------------------------------- B: the bare loop

def bare_loop(fx: dict, iters: int, out_path: str) -> None:
    """The same update with nothing but torch, diffusers models and the shared loss math."""
    import numpy as np
    import torch
    from diffusers import AutoencoderKL, DDPMScheduler, UNet2DConditionModel
    from PIL import Image
    from transformers import CLIPTextModel, CLIPTokenizer

    from dmad.methods.dmd2 import (BottleneckTap, GanHead, loss_distribution_matching, loss_fake_denoising,
                                   loss_gan_critic, loss_gan_generator)
    from dmad.methods.prediction import NoiseSchedule, cfg

    h = HYPER
    torch.manual_seed(h["seed"])
    root = Path(fx["teacher"])
    unet = UNet2DConditionModel.from_pretrained(root, subfolder="unet").requires_grad_(False).eval()
    vae = AutoencoderKL.from_pretrained(root, subfolder="vae").requires_grad_(False).eval()
    text_encoder = CLIPTextModel.from_pretrained(root, subfolder="text_encoder").requires_grad_(False).eval()
    tokenizer = CLIPTokenizer.from_pretrained(root, subfolder="tokenizer")
    schedule = NoiseSchedule.from_scheduler(DDPMScheduler.from_pretrained(root, subfolder="scheduler"))
    student = _trainable_copy(unet)
    fake = _trainable_copy(unet)
    head = GanHead(int(unet.config.block_out_channels[-1]))
    tap = BottleneckTap(fake)
    betas = (h["adam_beta1"], h["adam_beta2"])
    opt_g = torch.optim.AdamW(student.parameters(), lr=h["generator_lr"], betas=betas, eps=h["adam_epsilon"],
                              weight_decay=h["adam_weight_decay"])
    critic_params = list(fake.parameters()) + list(head.parameters())
    opt_c = torch.optim.AdamW(critic_params, lr=h["critic_lr"], betas=betas, eps=h["adam_epsilon"],
                              weight_decay=h["adam_weight_decay"])
    gen = torch.Generator().manual_seed(h["seed"])
    lo, hi, t_student = h["min_timestep"], h["max_timestep"] + 1, schedule.num_train_timesteps - 1

    def encode_text(captions):
        ids = tokenizer(list(captions), padding="max_length", max_length=tokenizer.model_max_length,
                        truncation=True, return_tensors="pt").input_ids
        return text_encoder(ids)[0]

    with torch.no_grad():
        uncond = encode_text([""])

    pairs = sorted(Path(fx["data"]).glob("*.png"))

    class Folder(torch.utils.data.Dataset):
        def __len__(self):
            return len(pairs)

        def __getitem__(self, i):
            with Image.open(pairs[i]) as im:
                im = im.convert("RGB").resize((RESOLUTION, RESOLUTION), Image.BICUBIC)
                x = torch.from_numpy(np.asarray(im, dtype=np.float32) / 127.5 - 1.0).permute(2, 0, 1)
            return x, pairs[i].with_suffix(".txt").read_text(encoding="utf-8").strip()

    loader = torch.utils.data.DataLoader(Folder(), batch_size=BATCH, shuffle=True, drop_last=True,
                                         generator=torch.Generator().manual_seed(h["seed"]))

    def batches():
        while True:
            yield from loader

    def noised(x0, t):
        return schedule.add_noise(x0, torch.randn(x0.shape, generator=gen), t)

    def timesteps(b):
        return torch.randint(lo, hi, (b,), generator=gen)

    data, ends = batches(), []
    for i in range(iters):
        images, captions = next(data)
        gen_step = i % K == 0
        with torch.no_grad():
            dist = vae.encode(images).latent_dist
            latents = (dist.mean + dist.std * torch.randn(dist.mean.shape, generator=gen)) * vae.config.scaling_factor
            emb = encode_text(captions)
        b = latents.shape[0]
        z = torch.randn(latents.shape, generator=gen)
        t_z = torch.full((b,), t_student, dtype=torch.long)
        with torch.set_grad_enabled(gen_step):
            x0 = schedule.to_x0(z, student(z, t_z, emb).sample, t_z).float()
        if gen_step:  # student: DM + w_g * GAN, critic frozen (gradients only pass through it)
            fake.requires_grad_(False)
            head.requires_grad_(False)
            t = timesteps(b)
            x_t = noised(x0.detach(), t)
            with torch.no_grad():
                out_u, out_c = unet(torch.cat([x_t, x_t]), torch.cat([t, t]),
                                    torch.cat([uncond.expand(b, -1, -1), emb])).sample.chunk(2)
                x0_real = schedule.to_x0(x_t, cfg(out_u, out_c, h["real_guidance_scale"]), t)
                x0_fake = schedule.to_x0(x_t, fake(x_t, t, emb).sample, t)
            loss, _ = loss_distribution_matching(x0, x0_real, x0_fake)
            t_g = timesteps(b)
            fake(noised(x0, t_g), t_g, emb)
            loss_g, _ = loss_gan_generator(head(tap.features))
            (loss + h["generator_gan_weight"] * loss_g).backward()
            fake.requires_grad_(True)
            head.requires_grad_(True)
            torch.nn.utils.clip_grad_norm_(student.parameters(), h["max_grad_norm"])
            opt_g.step()
            opt_g.zero_grad(set_to_none=True)
        # critic: fake-score denoising on the detached sample + w_d * GAN (real vs student)
        x0 = x0.detach()
        t = timesteps(b)
        noise = torch.randn(x0.shape, generator=gen)
        x_t = schedule.add_noise(x0, noise, t)
        loss, _ = loss_fake_denoising(fake(x_t, t, emb).sample, schedule.target(x0, noise, t))
        feats_fake = tap.features
        t_r = timesteps(b)
        fake(noised(latents, t_r), t_r, emb)
        loss_d, _ = loss_gan_critic(head(feats_fake), head(tap.features))
        (loss + h["critic_gan_weight"] * loss_d).backward()
        torch.nn.utils.clip_grad_norm_(critic_params, h["max_grad_norm"])
        opt_c.step()
        opt_c.zero_grad(set_to_none=True)
        ends.append(time.perf_counter())
    Path(out_path).write_text(json.dumps({"ends": ends, "torch_threads": torch.get_num_threads()}), encoding="utf-8")


def _trainable_copy(unet):
    import copy

    return copy.deepcopy(unet).float().requires_grad_(True).train()


def run_bare(fx: dict, root: Path, tag: str, iters: int, threads: int, timeout: float) -> dict:
    out = root / f"{tag}.json"
    err = root / f"{tag}.stderr"
    with open(err, "wb") as fe:
        p = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--_bare", json.dumps(fx),
                            "--_iters", str(iters), "--_out", str(out)],
                           cwd=root, env=child_env(threads), stdout=fe, stderr=subprocess.STDOUT, timeout=timeout)
    if p.returncode != 0:
        raise SystemExit(f"bare loop exited {p.returncode}; see {err}:\n{err.read_text()[-2000:]}")
    return json.loads(out.read_text(encoding="utf-8"))


# --------------------------------------------------------------------------- timing

def per_iteration(ends: list[float], warmup_cycles: int) -> dict:
    """Cycle c = iterations [cK, cK + K) (one generator step, then K critic steps). Cycle times
    from the end of iteration cK - 1 to the end of iteration cK + K - 1."""
    n_cycles = len(ends) // K
    cycles = [ends[c * K + K - 1] - ends[c * K - 1] for c in range(max(1, warmup_cycles), n_cycles)]
    return {"median_s": statistics.median(cycles) / K, "mean_s": sum(cycles) / len(cycles) / K,
            "cycles": len(cycles), "cycle_times_s": [round(c, 4) for c in cycles]}


def machine() -> dict:
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    return {"cpu": cpu, "cores": os.cpu_count(), "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
            "python": platform.python_version(), "os": platform.platform(), "loadavg_at_start": load}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="1 round of A and B, 4 measured cycles each (< 1 min)")
    ap.add_argument("--json", metavar="OUT", help="write the results as JSON")
    ap.add_argument("--rounds", type=int, help="A/B rounds (default 3, --quick 1)")
    ap.add_argument("--cycles", type=int, help="measured 5-iteration cycles per run (default 8, --quick 4)")
    ap.add_argument("--warmup-cycles", type=int, default=1, help="cycles skipped at the start of each run")
    ap.add_argument("--threads", type=int, help="torch intra-op threads in both children (default: torch's)")
    ap.add_argument("--keep", metavar="DIR", help="work in DIR and keep it (run folders, logs)")
    ap.add_argument("--_bare", help=argparse.SUPPRESS)
    ap.add_argument("--_iters", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--_out", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a._bare:
        bare_loop(json.loads(a._bare), a._iters, a._out)
        return 0

    import torch

    rounds = a.rounds or (1 if a.quick else 3)
    cycles = a.cycles or (4 if a.quick else 8)
    threads = a.threads or torch.get_num_threads()
    iters = (a.warmup_cycles + cycles) * K
    info = machine()
    info["torch_threads"] = threads
    root = Path(a.keep) if a.keep else Path(tempfile.mkdtemp(prefix="dmad-bench-engine-"))
    root.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    try:
        fx = make_fixtures(root)
        size = {"unet_channels": list(UNET_CHANNELS), "text_dim": TEXT_DIM, "unet_params": unet_parameters(fx["teacher"]),
                "resolution": RESOLUTION, "latent": [4, RESOLUTION // 2, RESOLUTION // 2], "batch": BATCH,
                "critic_updates_per_generator_update": K, "student_steps": 1}
        timeout = 600
        runs = {"A": [], "B": []}
        for r in range(rounds):
            for side in ("AB" if r % 2 == 0 else "BA"):
                tag = f"{side}{r}"
                if side == "A":
                    res = run_engine(fx, root, tag, iters, threads, timeout)
                    st = res["step_time_s"][a.warmup_cycles * K:]
                    entry = per_iteration(res["ends"], a.warmup_cycles)
                    entry["engine_step_time_s_mean"] = sum(st) / len(st)  # the engine's own figure (excludes the log row)
                else:
                    res = run_bare(fx, root, tag, iters, threads, timeout)
                    entry = per_iteration(res["ends"], a.warmup_cycles)
                    entry["torch_threads"] = res["torch_threads"]
                entry["round"] = r
                runs[side].append(entry)
                print(f"  round {r} {side}: {entry['median_s'] * 1000:.1f} ms/iteration "
                      f"(median of {entry['cycles']} cycles)", file=sys.stderr, flush=True)
    finally:
        if not a.keep:
            shutil.rmtree(root, ignore_errors=True)
    result = summarize(runs, info, size, rounds, cycles, a, time.time() - t0)
    print(markdown(result))
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=2), encoding="utf-8")
    return 0


def summarize(runs: dict, info: dict, size: dict, rounds: int, cycles: int, a, wall: float) -> dict:
    med = {s: statistics.median(e["median_s"] for e in runs[s]) for s in "AB"}
    per_round = [runs["A"][r]["median_s"] / runs["B"][r]["median_s"] for r in range(rounds)]
    return {
        "benchmark": "engine_overhead", "quick": a.quick, "rounds": rounds, "measured_cycles_per_run": cycles,
        "warmup_cycles": a.warmup_cycles, "iterations_per_cycle": K, "machine": info, "model": size,
        "A_engine_s_per_iter": med["A"], "B_bare_s_per_iter": med["B"], "ratio": med["A"] / med["B"],
        "ratio_per_round": per_round, "ratio_min": min(per_round), "ratio_max": max(per_round),
        "target": 1.05, "runs": runs, "wall_s": round(wall, 1),
    }


def _ms(entries: list[dict]) -> str:
    return ", ".join(f"{e['median_s'] * 1000:.1f}" for e in entries)


def markdown(r: dict) -> str:
    m, z = r["machine"], r["model"]
    rows = [
        "| | per iteration (median of rounds) | rounds (ms) |",
        "|---|---|---|",
        f"| A `dmad train` (log every iteration) | {r['A_engine_s_per_iter'] * 1000:.1f} ms | "
        f"{_ms(r['runs']['A'])} |",
        f"| B bare PyTorch loop | {r['B_bare_s_per_iter'] * 1000:.1f} ms | "
        f"{_ms(r['runs']['B'])} |",
        f"| **A / B** | **{r['ratio']:.3f}** | per round {', '.join(f'{x:.3f}' for x in r['ratio_per_round'])} "
        f"(min {r['ratio_min']:.3f}, max {r['ratio_max']:.3f}) |",
    ]
    head = (f"Machine: {m['cpu']}, {m['cores']} cores, torch {m['torch']} ({m['torch_threads']} threads), "
            f"Python {m['python']}.\n"
            f"Model: UNet {tuple(z['unet_channels'])} channels ({z['unet_params'] / 1e6:.2f} M parameters), "
            f"text width {z['text_dim']}, {z['resolution']} px (latents {'x'.join(map(str, z['latent']))}), "
            f"batch {z['batch']}, student_steps 1, K = {z['critic_updates_per_generator_update']}.\n"
            f"{r['rounds']} round(s) x {r['measured_cycles_per_run']} measured cycles of "
            f"{r['iterations_per_cycle']} iterations (after {r['warmup_cycles']} warm-up cycle); target A/B <= "
            f"{r['target']}.\n")
    return head + "\n" + "\n".join(rows)


if __name__ == "__main__":
    sys.exit(main())
