"""Train the built-in demo teacher from scratch on procedural shapes: `dmad demo make-teacher`.

Two stages, both seeded and deterministic on a CPU:
  1. the VAE (AutoencoderKL, 64x64x3 <-> 16x16x4) on reconstruction + a small KL term; then the
     latent scaling factor is set to 1 / std of its latents, as for Stable Diffusion;
  2. the UNet and the byte-level CLIP text encoder together, with the standard epsilon-prediction
     DDPM loss on VAE latents, captions dropped to "" 10% of the time so classifier-free
     guidance works at sampling time.
Images are rendered on the fly by dmad.demo.shapes from an index range of their own (no image
of the shipped dataset or of the evaluator's held-out set is trained on), so there is no
epoch and nothing to overfit. The result is a standard diffusers StableDiffusionPipeline folder
(fp16 safetensors) with its training config and log beside the weights.
"""
from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import numpy as np

TRAIN_INDEX_OFFSET = 10_000_000  # training renders use indices from here on (disjoint from shipped/held-out data)


@dataclass
class TeacherTraining:
    seed: int = 0
    vae_steps: int = 1500
    vae_batch: int = 32
    vae_lr: float = 1e-3
    vae_kl_weight: float = 1e-6
    unet_steps: int = 6000
    unet_batch: int = 32
    unet_lr: float = 3e-4
    text_lr: float = 1e-4
    caption_dropout: float = 0.1
    warmup_steps: int = 200
    image_size: int = 64


def render_batch(start: int, n: int, seed: int, size: int):
    """(n, 3, size, size) float32 in [-1, 1] and the n captions of indices start .. start+n-1."""
    import torch

    from dmad.demo.shapes import attributes_for, caption, render

    imgs, caps = [], []
    for i in range(start, start + n):
        a = attributes_for(TRAIN_INDEX_OFFSET + i, seed)
        imgs.append(np.asarray(render(a, size), dtype=np.float32) / 127.5 - 1.0)
        caps.append(caption(a))
    return torch.from_numpy(np.stack(imgs)).permute(0, 3, 1, 2).contiguous(), caps


def _cosine_lr(step: int, total: int, warmup: int) -> float:
    if step < warmup:
        return (step + 1) / warmup
    return 0.5 * (1 + np.cos(np.pi * (step - warmup) / max(1, total - warmup)))


def train_vae(vae, cfg: TeacherTraining, log: Callable[[dict], None]) -> float:
    """Returns the latent scaling factor (1 / std of the latents of fresh images)."""
    import torch
    import torch.nn.functional as F

    opt = torch.optim.AdamW(vae.parameters(), lr=cfg.vae_lr, weight_decay=0.0)
    vae.train()
    for step in range(cfg.vae_steps):
        for g in opt.param_groups:
            g["lr"] = cfg.vae_lr * _cosine_lr(step, cfg.vae_steps, cfg.warmup_steps)
        x, _ = render_batch(step * cfg.vae_batch, cfg.vae_batch, cfg.seed, cfg.image_size)
        post = vae.encode(x).latent_dist
        rec = vae.decode(post.sample()).sample
        loss_rec = F.l1_loss(rec, x) + F.mse_loss(rec, x)
        loss = loss_rec + cfg.vae_kl_weight * post.kl().mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % 50 == 0 or step == cfg.vae_steps - 1:
            log({"stage": "vae", "step": step, "loss_rec": float(loss_rec)})
    vae.eval()
    with torch.no_grad():
        x, _ = render_batch(10**6, 256, cfg.seed, cfg.image_size)
        z = vae.encode(x).latent_dist.mean
    return float(1.0 / z.std())


def train_unet(pipe, cfg: TeacherTraining, log: Callable[[dict], None]) -> None:
    import torch
    import torch.nn.functional as F

    from dmad.models.teacher import encode_prompts

    unet, te, vae, sched = pipe.unet, pipe.text_encoder, pipe.vae, pipe.scheduler
    vae.requires_grad_(False)
    opt = torch.optim.AdamW([{"params": unet.parameters(), "lr": cfg.unet_lr},
                             {"params": te.parameters(), "lr": cfg.text_lr}], weight_decay=0.01)
    base = [g["lr"] for g in opt.param_groups]
    gen = torch.Generator().manual_seed(cfg.seed)
    alphas = sched.alphas_cumprod
    unet.train()
    te.train()
    for step in range(cfg.unet_steps):
        for g, lr in zip(opt.param_groups, base):
            g["lr"] = lr * _cosine_lr(step, cfg.unet_steps, cfg.warmup_steps)
        x, caps = render_batch(2**24 + step * cfg.unet_batch, cfg.unet_batch, cfg.seed, cfg.image_size)
        drop = torch.rand(len(caps), generator=gen) < cfg.caption_dropout
        caps = ["" if d else c for c, d in zip(caps, drop.tolist())]
        with torch.no_grad():
            z = vae.encode(x).latent_dist.mean * vae.config.scaling_factor
        noise = torch.randn(z.shape, generator=gen)
        t = torch.randint(0, sched.config.num_train_timesteps, (len(caps),), generator=gen)
        a = alphas[t].view(-1, 1, 1, 1)
        z_t = a.sqrt() * z + (1 - a).sqrt() * noise
        emb = encode_prompts(pipe.tokenizer, te, caps, "cpu")
        loss = F.mse_loss(unet(z_t, t, emb).sample, noise)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(unet.parameters()) + list(te.parameters()), 1.0)
        opt.step()
        if step % 50 == 0 or step == cfg.unet_steps - 1:
            log({"stage": "unet", "step": step, "loss": float(loss)})
    unet.eval()
    te.eval()


def make_teacher(out_dir: str | Path, cfg: TeacherTraining, log: Callable[[dict], None] = print) -> Path:
    """Train and save the demo teacher into `out_dir` (a diffusers folder, fp16 weights)."""
    import torch

    from dmad.demo import build_teacher, parameter_counts

    torch.manual_seed(cfg.seed)
    t0 = time.time()
    pipe = build_teacher(cfg.seed)
    scaling = train_vae(pipe.vae, cfg, log)
    pipe.vae.register_to_config(scaling_factor=scaling)
    log({"stage": "vae", "scaling_factor": scaling, "elapsed_s": round(time.time() - t0, 1)})
    train_unet(pipe, cfg, log)
    out = Path(out_dir)
    pipe.to(torch.float16).save_pretrained(str(out), safe_serialization=True)
    (out / "training_config.json").write_text(json.dumps({
        **asdict(cfg), "parameters": parameter_counts(pipe), "torch": torch.__version__,
        "wall_time_s": round(time.time() - t0, 1)}, indent=2) + "\n", encoding="utf-8")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dmad.demo.make_teacher")
    p.add_argument("--out", required=True)
    for name, value in asdict(TeacherTraining()).items():
        p.add_argument(f"--{name.replace('_', '-')}", type=type(value), default=value)
    args = p.parse_args(argv)
    cfg = TeacherTraining(**{k: getattr(args, k) for k in asdict(TeacherTraining())})
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "training_log.jsonl", "a", encoding="utf-8") as f:
        def log(row: dict) -> None:
            f.write(json.dumps(row) + "\n")
            f.flush()
            print(json.dumps(row), flush=True)

        make_teacher(out, cfg, log)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
