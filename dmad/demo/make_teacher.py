"""Train the built-in demo teacher from scratch on procedural shapes: `dmad demo make-teacher`.

Two stages, both seeded and deterministic on a CPU (same torch build and thread count):
  1. the VAE (AutoencoderKL, 64x64x3 <-> 16x16x8 latents) as an autoencoder on its posterior
     mean, plus a small KL term. Captioned images are ~90% background, and an autoencoder trained
     on them plainly learns shape colours last (after 500 steps its reconstructions still had the
     wrong colour 70% of the time): so three quarters of each batch are dense "mosaics" of random
     shapes and colours (dmad.demo.shapes.render_mosaic), and on captioned images the shape and
     the background each carry half of the loss. The latent scaling factor is then set to
     1 / std of the latents of captioned images, as for SD.
  2. the UNet and the CLIP text encoder together (word-level tokens, dmad.demo.demo_vocab), with
     the v-prediction DDPM loss (SD 2.x) on the VAE's latents, captions dropped to ""
     10% of the time so classifier-free guidance works at sampling time, and offset noise (0.1
     per sample and channel). Offset noise matters here: with SD's schedule a 16x16 latent keeps
     its mean visible through the noise even at t = 999 (signal 0.068 against noise 1/16 for the
     mean), so a model trained without it reads the background from the noise instead of the
     caption and, sampling from pure noise, picks it at random (measured: background and every
     other attribute at chance after 500 steps). Offset noise hides that mean.
     v-prediction matters too: with epsilon prediction, at high noise predicting eps ~ x_t is
     nearly free whatever the caption says, so the caption gets almost no gradient; v asks for
     the clean image there. (With epsilon prediction, offset noise and word tokens, adherence was
     still at chance after 500 steps.)
Captioned images are rendered on the fly from an index range of their own (no image of the
shipped dataset or of the evaluator's held-out set is trained on), so there is no epoch and
nothing to overfit. Every `eval_every` UNet steps the log gets the prompt adherence of a quick
sample (DDIM 20 steps + CFG, measured by the shipped evaluator); at the end the 50-step + CFG
adherence is measured on fresh captions and written to training_config.json.

The output is a standard diffusers StableDiffusionPipeline folder (fp16 safetensors) with
training_config.json and training_log.jsonl beside the weights. It is assembled in a temp
folder beside --out and renamed into place, so --out is either complete or absent.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Callable

TRAIN_INDEX_OFFSET = 10_000_000  # training renders use indices from here on (disjoint from shipped/held-out data)
EVAL_CAPTION_SEED = 5_000_001    # captions of the adherence checks: attributes_for(i, EVAL_CAPTION_SEED)


@dataclass
class TeacherTraining:
    seed: int = 0
    vae_steps: int = 800
    vae_batch: int = 16
    vae_lr: float = 2e-3
    vae_kl_weight: float = 1e-6
    vae_mosaic_fraction: float = 0.75
    unet_steps: int = 1500
    decoder_steps: int = 800
    decoder_batch: int = 16
    decoder_lr: float = 5e-4
    unet_batch: int = 32
    unet_lr: float = 5e-4
    text_lr: float = 5e-4
    caption_dropout: float = 0.1
    offset_noise: float = 0.1
    warmup_steps: int = 50
    image_size: int = 64
    eval_every: int = 500
    eval_prompts: int = 64
    final_eval_prompts: int = 128
    guidance_scale: float = 3.0


def render_batch(start: int, n: int, seed: int, size: int):
    """(n, 3, size, size) float32 in [-1, 1] and the n captions of training indices start .. start+n-1."""
    import numpy as np
    import torch

    from dmad.demo.shapes import attributes_for, caption, render

    imgs, caps = [], []
    for i in range(start, start + n):
        a = attributes_for(TRAIN_INDEX_OFFSET + i, seed)
        imgs.append(np.asarray(render(a, size), dtype=np.float32) / 127.5 - 1.0)
        caps.append(caption(a))
    if not imgs:
        return torch.empty((0, 3, size, size)), caps
    return torch.from_numpy(np.stack(imgs)).permute(0, 3, 1, 2).contiguous(), caps


def render_mosaics(start: int, n: int, seed: int, size: int):
    import numpy as np
    import torch

    from dmad.demo.shapes import render_mosaic

    imgs = [np.asarray(render_mosaic(i, seed, size), dtype=np.float32) / 127.5 - 1.0 for i in range(start, start + n)]
    return torch.from_numpy(np.stack(imgs)).permute(0, 3, 1, 2).contiguous()


def _lr_factor(step: int, total: int, warmup: int) -> float:
    """Linear warmup, then cosine to zero."""
    import math

    if step < warmup:
        return (step + 1) / warmup
    return 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, total - warmup)))


def _balanced_weights(x, n_mosaic: int):
    """Per-pixel loss weights (B, 1, H, W): on a captioned image the shape (pixels unlike the
    top-left corner, which is always background) and the background each get half the weight,
    so a shape covering 5% of the image counts as much as its background; mosaics weigh 1."""
    fg = ((x - x[:, :, :1, :1]).abs().amax(1, keepdim=True) > 0.05).float()
    frac = fg.mean((1, 2, 3), keepdim=True).clamp(1e-3, 1 - 1e-3)
    w = fg * 0.5 / frac + (1 - fg) * 0.5 / (1 - frac)
    w[:n_mosaic] = 1.0
    return w


def _reconstruction_loss(rec, x, n_mosaic: int):
    """L1 + L2 per pixel, weighted by _balanced_weights, averaged."""
    err = (rec - x).abs() + (rec - x) ** 2
    return (err * _balanced_weights(x, n_mosaic)).mean()


def train_vae(vae, cfg: TeacherTraining, log: Callable[[dict], None]) -> float:
    """Returns the latent scaling factor (1 / std of the latents of fresh captioned images)."""
    import torch

    opt = torch.optim.AdamW(vae.parameters(), lr=cfg.vae_lr, weight_decay=0.0)
    n_mosaic = round(cfg.vae_batch * cfg.vae_mosaic_fraction)
    vae.train()
    for step in range(cfg.vae_steps):
        for g in opt.param_groups:
            g["lr"] = cfg.vae_lr * _lr_factor(step, cfg.vae_steps, cfg.warmup_steps)
        x, _ = render_batch(step * cfg.vae_batch, cfg.vae_batch - n_mosaic, cfg.seed, cfg.image_size)
        if n_mosaic:
            x = torch.cat([render_mosaics(step * cfg.vae_batch, n_mosaic, cfg.seed, cfg.image_size), x])
        post = vae.encode(x).latent_dist
        rec = vae.decode(post.mode()).sample
        loss_rec = _reconstruction_loss(rec, x, n_mosaic)
        loss = loss_rec + cfg.vae_kl_weight * post.kl().mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % 50 == 0 or step == cfg.vae_steps - 1:
            log({"stage": "vae", "step": step, "loss_rec": round(loss_rec.item(), 5)})
    vae.eval()
    with torch.no_grad():
        x, _ = render_batch(10**6, 256, cfg.seed, cfg.image_size)
        z = vae.encode(x).latent_dist.mean
        rec = vae.decode(z).sample.clamp(-1, 1)
    log({"stage": "vae", "reconstruction_adherence": _adherence_of(rec, render_batch(10**6, 256, cfg.seed,
                                                                                      cfg.image_size)[1])})
    return float(1.0 / z.std())


def _adherence_of(images, captions) -> dict:
    from dmad.demo.evaluator import load_evaluator
    from dmad.demo.metrics import evaluate_images

    res = evaluate_images(load_evaluator(), images, captions)["adherence"]
    return {"all": round(res["all"], 4), **{k: round(v, 4) for k, v in res["per_attribute"].items()}}


def measure_adherence(pipe, n: int, steps: int, guidance: float, size: int, seed: int = 0) -> dict:
    """Sample n fresh captions with DDIM `steps` + CFG and score them with the shipped evaluator."""
    import torch
    from diffusers import DDIMScheduler

    from dmad.demo.shapes import attributes_for, caption
    from dmad.sampling import sd_pipeline

    caps = [caption(attributes_for(i, EVAL_CAPTION_SEED)) for i in range(n)]
    sampler = sd_pipeline(pipe, DDIMScheduler.from_config(pipe.scheduler.config))
    was = pipe.unet.training, pipe.text_encoder.training
    pipe.unet.eval()
    pipe.text_encoder.eval()
    try:
        with torch.no_grad():
            images = [sampler(caps[a:a + 64], num_inference_steps=steps, guidance_scale=guidance, height=size,
                              width=size, generator=torch.Generator().manual_seed(seed + a), output_type="pt").images
                      for a in range(0, n, 64)]
    finally:
        pipe.unet.train(was[0])
        pipe.text_encoder.train(was[1])
    return _adherence_of(torch.cat(images) * 2 - 1, caps)


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
    t0 = time.time()
    for step in range(cfg.unet_steps):
        for g, lr in zip(opt.param_groups, base):
            g["lr"] = lr * _lr_factor(step, cfg.unet_steps, cfg.warmup_steps)
        x, caps = render_batch(2**24 + step * cfg.unet_batch, cfg.unet_batch, cfg.seed, cfg.image_size)
        drop = torch.rand(len(caps), generator=gen) < cfg.caption_dropout
        caps = ["" if d else c for c, d in zip(caps, drop.tolist())]
        with torch.no_grad():
            z = vae.encode(x).latent_dist.mean * vae.config.scaling_factor
        noise = torch.randn(z.shape, generator=gen)
        noise = noise + cfg.offset_noise * torch.randn((*z.shape[:2], 1, 1), generator=gen)
        t = torch.randint(0, sched.config.num_train_timesteps, (len(caps),), generator=gen)
        a = alphas[t].view(-1, 1, 1, 1)
        z_t = a.sqrt() * z + (1 - a).sqrt() * noise
        emb = encode_prompts(pipe.tokenizer, te, caps, "cpu")
        target = a.sqrt() * noise - (1 - a).sqrt() * z  # v-prediction (SD 2.x)
        loss = F.mse_loss(unet(z_t, t, emb).sample, target)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(unet.parameters()) + list(te.parameters()), 1.0)
        opt.step()
        if step % 50 == 0 or step == cfg.unet_steps - 1:
            log({"stage": "unet", "step": step, "loss": round(loss.item(), 5), "elapsed_s": round(time.time() - t0, 1)})
        if cfg.eval_every and step and step % cfg.eval_every == 0:
            log({"stage": "unet", "step": step, "check": "ddim 20 + cfg",
                 "adherence": measure_adherence(pipe, cfg.eval_prompts, 20, cfg.guidance_scale, cfg.image_size)})
    unet.eval()
    te.eval()


def finetune_decoder(vae, cfg: TeacherTraining, log: Callable[[dict], None]) -> None:
    """Stage 3: sharpen the VAE decoder on captioned images with the encoder frozen. The latent
    space the UNet learned stays exactly as it was (as Stable Diffusion's ft-MSE decoder did);
    only the drawing of shapes from latents improves."""
    import torch

    for module in (vae.encoder, vae.quant_conv):
        if module is not None:
            module.requires_grad_(False)
    params = [p for m in (vae.post_quant_conv, vae.decoder) if m is not None for p in m.parameters()]
    for p in params:
        p.requires_grad_(True)
    opt = torch.optim.AdamW(params, lr=cfg.decoder_lr, weight_decay=0.0)
    captions_eval = render_batch(10**6, 256, cfg.seed, cfg.image_size)

    def recon_adherence() -> dict:
        vae.eval()
        with torch.no_grad():
            rec = vae.decode(vae.encode(captions_eval[0]).latent_dist.mean).sample.clamp(-1, 1)
        vae.train()
        return _adherence_of(rec, captions_eval[1])

    log({"stage": "decoder", "step": 0, "reconstruction_adherence": recon_adherence()})
    vae.train()
    for step in range(cfg.decoder_steps):
        for g in opt.param_groups:
            g["lr"] = cfg.decoder_lr * _lr_factor(step, cfg.decoder_steps, cfg.warmup_steps)
        x, _ = render_batch(3 * 2**24 + step * cfg.decoder_batch, cfg.decoder_batch, cfg.seed, cfg.image_size)
        with torch.no_grad():
            z = vae.encode(x).latent_dist.mean
        rec = vae.decode(z).sample
        loss = _reconstruction_loss(rec, x, 0)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % 50 == 0 or step == cfg.decoder_steps - 1:
            log({"stage": "decoder", "step": step, "loss_rec": round(loss.item(), 5)})
    vae.eval()
    vae.requires_grad_(False)
    log({"stage": "decoder", "step": cfg.decoder_steps, "reconstruction_adherence": recon_adherence()})


def make_teacher(out_dir: str | Path, cfg: TeacherTraining, log: Callable[[dict], None] = print,
                 continue_from: Path | None = None) -> dict:
    """Train the demo teacher and save it into `out_dir` (an existing empty folder): a diffusers
    folder with fp16 weights and training_config.json. Returns the final measurements.

    Stages: VAE, UNet + text encoder, decoder fine-tune. Between the UNet and the decoder stage the
    weights are rounded to fp16 (what is saved), so `continue_from` a folder written with
    decoder_steps 0 (stages 1-2) gives exactly the weights of one run of all three stages."""
    import torch

    from dmad.demo import build_teacher, parameter_counts

    t0 = time.time()
    if continue_from is None:
        torch.manual_seed(cfg.seed)
        pipe = build_teacher(cfg.seed)
        scaling = train_vae(pipe.vae, cfg, log)
        pipe.vae.register_to_config(scaling_factor=scaling)
        log({"stage": "vae", "scaling_factor": scaling, "elapsed_s": round(time.time() - t0, 1)})
        train_unet(pipe, cfg, log)
        pipe.to(torch.float16).to(torch.float32)
    else:
        from diffusers import StableDiffusionPipeline

        pipe = StableDiffusionPipeline.from_pretrained(str(continue_from), local_files_only=True, safety_checker=None,
                                                       requires_safety_checker=False, torch_dtype=torch.float32)
        pipe.unet.eval()
        pipe.text_encoder.eval()
    if cfg.decoder_steps:
        torch.manual_seed(cfg.seed + 3)
        finetune_decoder(pipe.vae, cfg, log)
    train_s = time.time() - t0
    pipe.to(torch.float16)
    out = Path(out_dir)
    pipe.save_pretrained(str(out), safe_serialization=True)
    pipe.to(torch.float32)  # measure what ships: fp16 weights, run in fp32 as on a CPU
    final = measure_adherence(pipe, cfg.final_eval_prompts, 50, cfg.guidance_scale, cfg.image_size, seed=1)
    log({"stage": "final", "check": "ddim 50 + cfg", "adherence": final})
    doc = {**asdict(cfg), "parameters": parameter_counts(pipe), "torch": torch.__version__,
           "threads": torch.get_num_threads(), "train_time_s": round(train_s, 1),
           "final_adherence_ddim50_cfg": final, "eval_caption_seed": EVAL_CAPTION_SEED}
    if continue_from is not None:
        earlier = json.loads((continue_from / "training_config.json").read_text(encoding="utf-8"))
        doc["continued_from"] = {k: earlier.get(k) for k in ("train_time_s", "final_adherence_ddim50_cfg",
                                                               "vae_steps", "unet_steps", "decoder_steps")}
        doc["train_time_s"] = round(train_s + float(earlier.get("train_time_s", 0.0)), 1)
    (out / "training_config.json").write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    return doc


def add_training_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--continue-from", metavar="DIR",
                   help="skip stages 1-2: start from a teacher written by make-teacher with --decoder-steps 0")
    for f in fields(TeacherTraining):
        default = f.default
        p.add_argument(f"--{f.name.replace('_', '-')}", type=type(default), default=default, metavar=type(default).__name__.upper(),
                       help=f"(default {default})")


def main_from_args(args: argparse.Namespace) -> int:
    """`dmad demo make-teacher --out DIR [...]`: DIR must not exist; it appears complete or not at all."""
    from dmad.errors import UserInputError

    cfg = TeacherTraining(**{f.name: getattr(args, f.name) for f in fields(TeacherTraining)})
    continue_from = getattr(args, "continue_from", None)
    if continue_from is not None:
        continue_from = Path(continue_from).expanduser().resolve()
        if not (continue_from / "training_config.json").is_file():
            raise UserInputError(f"--continue-from {continue_from}: not a make-teacher folder (no training_config.json)")
    out = Path(args.out).expanduser().resolve()
    if out.exists():
        raise UserInputError(f"--out {out}: already exists; choose a new folder (the teacher is written whole)")
    if not out.parent.is_dir():
        raise UserInputError(f"--out {out}: parent folder {out.parent} does not exist")
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    tmp.mkdir()
    try:
        with open(tmp / "training_log.jsonl", "w", encoding="utf-8") as f:
            if continue_from is not None:  # the earlier stages' log first: one log for the whole recipe
                f.write((continue_from / "training_log.jsonl").read_text(encoding="utf-8"))

            def log(row: dict) -> None:
                f.write(json.dumps(row) + "\n")
                f.flush()
                print(json.dumps(row), flush=True)

            make_teacher(tmp, cfg, log, continue_from)
        os.replace(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dmad.demo.make_teacher")
    p.add_argument("--out", required=True)
    add_training_arguments(p)
    return main_from_args(p.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
