"""Engine overhead: one `dmad train` iteration vs a bare PyTorch loop doing the same update.

    python bench/engine_overhead.py [--quick] [--json OUT]

Both sides train the same tiny SD-layout teacher (dmad.testing.tiny) on the same captioned folder with
the same update: student_steps 1, K = 5 critic updates per generator update (so one 5-iteration
cycle = 1 generator step + 5 critic steps), batch, resolution, AdamW, grad-norm clipping, DM +
GAN losses (dmad.methods.dmd2, the math both share), GAN head on the fake score's bottleneck.

A  the real engine, as users start it: `python -m dmad train` in a subprocess, with the
   worst-case observation settings (log_every_steps 1: a metrics.csv row, a metric event on
   stdout and in events.jsonl, a memory reading every iteration; control.jsonl polled every
   iteration; the monitor thread running). Checkpoints and validation never fall inside the
   measured window (the only ones come after the last iteration).
B  a bare loop written below: the same networks and losses, one torch.Generator for all noise,
   a plain DataLoader; no accelerate, run folder, events, metrics, per-sample RNG or monitor.

Interleaving. On a shared VM every op can run 15-20 % slower for tens of seconds at a time
(other tenants' load): whole runs of A and B one after the other differ by that much even when
both run the same code. So each round starts one A and one B process, lets both load, and then
lets them take turns one 5-iteration cycle (~1.4 s) at a time, A B A B ... (B A B A ... in odd
rounds): B waits for a token on stdin at each cycle boundary; A is stopped with SIGSTOP as soon
as its metric event for a cycle's last iteration arrives and continued with SIGCONT for its
next turn. Only one of them runs at any moment, and both meet the same load.

Timing: wall time between ends of iterations (A: the `t` of consecutive metric events, written
after everything the engine does per iteration, minus the time it was stopped; B: perf_counter
at the same point). The first cycle of each side is a warm-up. Reported: each side's median
cycle / 5, the median critic-only and generator iteration, and the headline ratio: per round,
the median over its back-to-back cycle pairs of A's cycle / B's cycle; then the median over
rounds (with min and max). Rounds are fresh process pairs because a process can also be a few %
slower than another for its whole life (an A/A run of this harness, engine vs engine, gave
per-round ratios 0.997, 1.002, 1.008; bare vs bare 1.001, 1.068, 0.996). Also A's log-row cost
(event interval minus the engine's own step_time_s, which stops before the row is written).

Cost: --quick ~30 s, full (6 rounds x 8 cycles) ~4 min on a 2-core CPU. POSIX only (SIGSTOP).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# Model size. What matters for an overhead ratio is how long the compute of one iteration takes
# next to the engine's fixed per-iteration Python work. dmad.testing.tiny's test default (UNet (32, 64),
# 0.8 M parameters) is mostly op-dispatch time; UNet (64, 128) channels (3.2 M parameters), text
# width 64, 32 px images (16x16x4 latents) and batch 4 take ~0.25-0.3 s per iteration on a
# 2-core CPU, the order of a real teacher's iteration on a GPU (SD 1.5 at 512 px: hundreds of
# ms), and keep the full run to a few minutes. A larger model would only shrink the ratio.
UNET_CHANNELS = (64, 128)
TEXT_DIM = 64
RESOLUTION = 32
BATCH = 4
K = 5  # critic updates per generator update
N_IMAGES = 32

HYPER = dict(generator_lr=1e-5, critic_lr=1e-5, adam_beta1=0.0, adam_beta2=0.999, adam_epsilon=1e-8,
             adam_weight_decay=0.01, max_grad_norm=10.0, real_guidance_scale=3.0, generator_gan_weight=1e-3,
             critic_gan_weight=1e-2, min_timestep=20, max_timestep=980, seed=0)


# --------------------------------------------------------------------------- setup (parent process)

def make_fixtures(root: Path) -> dict:
    from dmad.testing.tiny import make_caption_folder, make_tiny_sd_pipeline

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


# --------------------------------------------------------------------------- B: the bare loop

def bare_loop(fx: dict, cycles: int) -> None:
    """The same update with nothing but torch, diffusers models and the shared loss math.

    Lockstep protocol with the parent: prints `ready`, then per cycle waits for a line on stdin,
    runs K iterations and prints `cycle <c> <seconds of each iteration>`."""
    import numpy as np
    import torch
    from diffusers import AutoencoderKL, DDPMScheduler, UNet2DConditionModel
    from PIL import Image
    from transformers import CLIPTextModel, CLIPTokenizer

    from dmad.methods.dmd2 import (GanHead, loss_distribution_matching, loss_fake_denoising, loss_gan_critic,
                                   loss_gan_generator)
    from dmad.models.families import FeatureTap
    from dmad.methods.prediction import NoiseSchedule, guide

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
    tap = FeatureTap(fake.mid_block, tokens=False)
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

    data = batches()
    print("ready", torch.get_num_threads(), flush=True)
    for i in range(cycles * K):
        if i % K == 0:
            sys.stdin.readline()
            ends = [time.perf_counter()]
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
                x0_real = schedule.to_x0(x_t, guide(out_u, out_c, h["real_guidance_scale"]), t)
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
        if i % K == K - 1:
            print("cycle", i // K, *(f"{b - a:.6f}" for a, b in zip(ends, ends[1:])), flush=True)


def _trainable_copy(unet):
    import copy

    return copy.deepcopy(unet).float().requires_grad_(True).train()


# --------------------------------------------------------------------------- one round: A and B in lockstep

def _iteration_metric(ev: dict) -> bool:
    """An iteration's metric event, not a memory-sampler reading (dmad.contract.events.is_iteration_metric,
    on the parsed JSON)."""
    return ev["kind"] == "metric" and ev["data"].get("source") != "sampler"


def run_round(fx: dict, root: Path, tag: str, cycles: int, threads: int, a_first: bool, timeout: float) -> dict:
    """Starts A (`python -m dmad train`) and B (the bare loop) and lets them take turns, one
    5-iteration cycle at a time, so both meet the same machine load. B waits for a token at each
    cycle boundary; A is stopped (SIGSTOP) as soon as its metric event for a cycle's last
    iteration arrives and continued (SIGCONT) for its next turn; the stopped time is subtracted
    from the iteration it fell into. Returns per-iteration seconds of both and A's step_time_s."""
    from dmad.contract.paths import engine_argv

    cfg_path = root / f"config_{tag}.json"
    cfg_path.write_text(json.dumps(engine_config(fx, root, cycles * K), indent=2), encoding="utf-8")
    env, here = child_env(threads), str(Path(__file__).resolve())
    with open(root / f"{tag}_A.stderr", "wb") as err_a, open(root / f"{tag}_B.stderr", "wb") as err_b:
        a = subprocess.Popen(engine_argv("train", "--config", str(cfg_path), "--run-dir", str(root / "runs" / tag)),
                             cwd=root, env=env, stdout=subprocess.PIPE,
                             stderr=err_a, text=True, bufsize=1)
        b = subprocess.Popen([sys.executable, here, "--_bare", json.dumps(fx), "--_cycles", str(cycles)], cwd=root,
                             env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err_b, text=True, bufsize=1)
        try:
            events = _events(a, root / f"{tag}_A.stderr")
            _until(events, lambda ev: ev["kind"] == "phase" and ev["data"].get("phase") == "training")
            os.kill(a.pid, signal.SIGSTOP)
            stopped = time.time()
            b_threads = int(_line(b, root / f"{tag}_B.stderr").split()[1])
            ends, step_time, pauses, b_iter = {}, {}, [], []
            for c in range(cycles):
                for side in ("AB" if a_first else "BA"):
                    if side == "A":
                        os.kill(a.pid, signal.SIGCONT)
                        pauses.append(time.time() - stopped)
                        for ev in _until(events, lambda ev: _iteration_metric(ev) and ev["iter"] == (c + 1) * K):
                            if _iteration_metric(ev):  # event of iteration i (0-based) carries iter = i + 1
                                ends[ev["iter"] - 1], step_time[ev["iter"] - 1] = ev["t"], ev["data"]["step_time_s"]
                        os.kill(a.pid, signal.SIGSTOP)
                        stopped = time.time()
                    else:
                        b.stdin.write("go\n")
                        b.stdin.flush()
                        b_iter += [float(x) for x in _line(b, root / f"{tag}_B.stderr").split()[2:]]
            os.kill(a.pid, signal.SIGCONT)
            for _ in events:  # the end-of-run checkpoint and samples, outside the measured window
                pass
            if a.wait(timeout) != 0 or b.wait(timeout) != 0:
                raise SystemExit(f"a child failed (dmad train {a.returncode}, bare loop {b.returncode}); "
                                 f"--keep DIR keeps their stderr")
        finally:
            for p in (a, b):
                if p.poll() is None:
                    os.kill(p.pid, signal.SIGCONT)
                    p.kill()
                    p.wait()
    a_iter = [None] + [ends[i] - ends[i - 1] - (pauses[i // K] if i % K == 0 else 0.0) for i in range(1, cycles * K)]
    return {"A": a_iter, "B": b_iter, "A_step_time_s": [step_time[i] for i in range(cycles * K)], "B_threads": b_threads}


def _events(proc: subprocess.Popen, stderr_path: Path):
    """Parsed events from A's stdout (one JSON object per line)."""
    for line in proc.stdout:
        try:
            yield json.loads(line)
        except ValueError:
            continue
    if proc.wait() != 0:
        raise SystemExit(f"dmad train exited {proc.returncode}; end of its stderr:\n"
                         f"{stderr_path.read_text(errors='replace')[-2000:]}")


def _until(events, done):
    """Events up to and including the first for which done(ev) holds."""
    out = []
    for ev in events:
        out.append(ev)
        if done(ev):
            return out
    raise SystemExit("dmad train ended before the benchmark window did")


def _line(proc: subprocess.Popen, stderr_path: Path) -> str:
    line = proc.stdout.readline()
    if not line:
        raise SystemExit(f"bare loop exited {proc.wait()}; end of its output:\n"
                         f"{stderr_path.read_text(errors='replace')[-2000:]}")
    return line


# --------------------------------------------------------------------------- timing

def round_stats(r: dict, warmup_cycles: int) -> dict:
    """Cycle c = iterations [cK, cK + K): one generator step, then K critic steps. Per side: the
    median cycle / K, the median critic-only and generator iteration; per pair of turns (A's cycle
    c and B's cycle c, run back to back): A / B."""
    n = len(r["B"]) // K
    cyc = {s: [sum(r[s][c * K:(c + 1) * K]) for c in range(warmup_cycles, n)] for s in "AB"}
    pairs = [x / y for x, y in zip(cyc["A"], cyc["B"])]
    out = {"pair_ratios": [round(x, 4) for x in pairs], "ratio": statistics.median(pairs)}
    for s in "AB":
        it = {i: r[s][i] for i in range(warmup_cycles * K, n * K)}
        out[s] = {"median_s": statistics.median(cyc[s]) / K, "mean_s": sum(cyc[s]) / len(cyc[s]) / K,
                  "critic_iter_s": statistics.median(v for i, v in it.items() if i % K),
                  "generator_iter_s": statistics.median(v for i, v in it.items() if i % K == 0),
                  "cycle_times_s": [round(c, 4) for c in cyc[s]]}
    # The engine's step_time_s stops before it reads memory, writes the metrics row and emits the
    # event; wall time between events includes them. Mean difference over iterations that no
    # SIGSTOP fell into: what the log row costs.
    inner = [i for i in range(warmup_cycles * K, n * K) if i % K]
    out["A"]["log_row_s"] = sum(r["A"][i] - r["A_step_time_s"][i] for i in inner) / len(inner)
    return out


def machine() -> dict:
    import torch

    from dmad.train.env import cpu_name

    cpu = cpu_name()
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    return {"cpu": cpu, "cores": os.cpu_count(), "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
            "python": platform.python_version(), "os": platform.platform(), "loadavg_at_start": load}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="1 round of 4 cycles per side (~30 s): a smoke run")
    ap.add_argument("--json", metavar="OUT", help="write the results as JSON")
    ap.add_argument("--rounds", type=int, help="rounds, each a fresh pair of processes (default 6, --quick 1)")
    ap.add_argument("--cycles", type=int, help="measured 5-iteration cycles per side and round (default 8, --quick 4)")
    ap.add_argument("--warmup-cycles", type=int, default=1, help="cycles skipped at the start of each round")
    ap.add_argument("--threads", type=int, help="torch intra-op threads in both children (default: torch's)")
    ap.add_argument("--keep", metavar="DIR", help="work in DIR and keep it (run folders, logs)")
    ap.add_argument("--_bare", help=argparse.SUPPRESS)
    ap.add_argument("--_cycles", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a._bare:
        bare_loop(json.loads(a._bare), a._cycles)
        return 0
    if not hasattr(signal, "SIGSTOP"):
        ap.error("needs a POSIX system: A's turns are made with SIGSTOP / SIGCONT")
    if a.warmup_cycles < 1:
        ap.error("--warmup-cycles must be >= 1 (the first iteration has no start time)")

    import torch

    rounds = a.rounds or (1 if a.quick else 6)
    cycles = a.cycles or (4 if a.quick else 8)
    threads = a.threads or torch.get_num_threads()
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
        per_round = []
        for r in range(rounds):  # A's turn first in even rounds, B's in odd ones
            raw = run_round(fx, root, f"round{r}", a.warmup_cycles + cycles, threads, r % 2 == 0, timeout=600)
            st = round_stats(raw, a.warmup_cycles)
            st.update(round=r, a_first=r % 2 == 0, B_threads=raw["B_threads"])
            per_round.append(st)
            print(f"  round {r}: A {st['A']['median_s'] * 1000:.1f} ms, B {st['B']['median_s'] * 1000:.1f} ms "
                  f"per iteration, A/B {st['ratio']:.3f}", file=sys.stderr, flush=True)
    finally:
        if not a.keep:
            shutil.rmtree(root, ignore_errors=True)
    result = summarize(per_round, info, size, cycles, a, time.time() - t0)
    print(markdown(result))
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=2), encoding="utf-8")
    return 0


def summarize(per_round: list[dict], info: dict, size: dict, cycles: int, a, wall: float) -> dict:
    """Headline: the median over rounds of each round's median A / B cycle pair. Pairs within a
    round share two processes, and a process can be a few % slower than another for its whole
    life (where its memory landed), so rounds, not pairs, are the independent samples."""
    med = {s: statistics.median(r[s]["median_s"] for r in per_round) for s in "AB"}
    kind = {f"{s}_{k}": statistics.median(r[s][k] for r in per_round) for s in "AB"
            for k in ("critic_iter_s", "generator_iter_s")}
    pairs = [x for r in per_round for x in r["pair_ratios"]]
    ratios = [r["ratio"] for r in per_round]
    return {
        "benchmark": "engine_overhead", "quick": a.quick, "rounds": len(per_round), "measured_cycles_per_side": cycles,
        "warmup_cycles": a.warmup_cycles, "iterations_per_cycle": K, "machine": info, "model": size,
        "A_engine_s_per_iter": med["A"], "B_bare_s_per_iter": med["B"], **kind,
        "ratio": statistics.median(ratios), "ratio_all_pairs": statistics.median(pairs), "pairs": len(pairs),
        "ratio_per_round": ratios, "ratio_min": min(ratios), "ratio_max": max(ratios),
        "ratio_of_medians": med["A"] / med["B"],
        "A_log_row_s_per_iter": statistics.median(r["A"]["log_row_s"] for r in per_round),
        "target": 1.05, "per_round": per_round, "wall_s": round(wall, 1),
    }


def markdown(r: dict) -> str:
    m, z = r["machine"], r["model"]

    def ms(x: float) -> str:
        return f"{x * 1000:.1f}"

    each = {s: ", ".join(ms(x[s]["median_s"]) for x in r["per_round"]) for s in "AB"}
    rows = [
        "| | per iteration (ms), median of rounds | each round (ms) | critic-only / generator iteration (ms) |",
        "|---|---|---|---|",
        f"| A `dmad train`, log_every_steps 1 | {ms(r['A_engine_s_per_iter'])} | {each['A']} | "
        f"{ms(r['A_critic_iter_s'])} / {ms(r['A_generator_iter_s'])} |",
        f"| B bare PyTorch loop | {ms(r['B_bare_s_per_iter'])} | {each['B']} | "
        f"{ms(r['B_critic_iter_s'])} / {ms(r['B_generator_iter_s'])} |",
        f"| **A / B** | **{r['ratio']:.3f}** (median of rounds) | "
        f"{', '.join(f'{x:.3f}' for x in r['ratio_per_round'])} (min {r['ratio_min']:.3f}, max {r['ratio_max']:.3f}) | "
        f"{r['A_critic_iter_s'] / r['B_critic_iter_s']:.3f} / {r['A_generator_iter_s'] / r['B_generator_iter_s']:.3f} |",
    ]
    head = (f"Machine: {m['cpu']}, {m['cores']} cores, torch {m['torch']} ({m['torch_threads']} threads), "
            f"Python {m['python']}, {m['os']}.\n"
            f"Model: UNet {tuple(z['unet_channels'])} channels ({z['unet_params'] / 1e6:.2f} M parameters), "
            f"text width {z['text_dim']}, {z['resolution']} px (latents {'x'.join(map(str, z['latent']))}), "
            f"batch {z['batch']}, student_steps 1, K = {z['critic_updates_per_generator_update']}.\n"
            f"{r['rounds']} round(s) x {r['measured_cycles_per_side']} measured cycles of "
            f"{r['iterations_per_cycle']} iterations per side, A and B taking turns cycle by cycle "
            f"(after {r['warmup_cycles']} warm-up cycle); target A/B <= {r['target']}.\n")
    foot = (f"\nEach round's A / B is the median of its {r['measured_cycles_per_side']} back-to-back cycle pairs; "
            f"over all {r['pairs']} pairs: {r['ratio_all_pairs']:.3f}; of the two medians: {r['ratio_of_medians']:.3f}.\n"
            f"A's log row (memory reading + metrics.csv "
            f"row + metric event): {r['A_log_row_s_per_iter'] * 1000:.2f} ms / iteration (event interval - step_time_s).")
    return head + "\n" + "\n".join(rows) + "\n" + foot


if __name__ == "__main__":
    sys.exit(main())
