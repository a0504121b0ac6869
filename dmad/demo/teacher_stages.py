"""The pieces of `dmad demo make-teacher`: data, the VAE stage, the text + transformer step, exact
sampling, the diagnostics that make the learning curve visible, and an interrupted run's state on
disk (safetensors and JSON only: never a pickle).

Shapes and units: images (B, 3, 64, 64) in [-1, 1]; latents (B, 4, 32, 32), scaled as the
pipeline scales them ((z - shift) * scale, unit variance); token ids (B, 32); context
(B, 33, 128): the two CLIP encoders' penultimate states side by side plus one token standing
for SD3's 256 zero tokens (dmad.models.repeated_tokens); pooled (B, 128). Flow matching as SD3:
x_sigma = (1 - sigma) x0 + sigma eps, the transformer predicts v = eps - x0 at timestep
sigma * 1000.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from dmad.contract.jsonfile import read_json_file
from dmad.demo import SD3_ZERO_TOKENS
from dmad.errors import UserInputError
from dmad.models.teacher_files import read_safetensors_header

TRAIN_INDEX_OFFSET = 10_000_000  # training renders use indices from here on (disjoint from shipped/held-out data)
EVAL_CAPTION_SEED = 5_000_001    # captions of the adherence checks: attributes_for(i, EVAL_CAPTION_SEED)
SWAP_SIGMAS = (0.5, 0.8, 0.95)   # noise levels of the word-swap diagnostic
STATE_FILE, STATE_JSON = "state.safetensors", "state.json"  # an interrupted run's progress, in its work folder


# ------------------------------------------------------------------------------------- data

def render_attrs(attrs: list[dict], size: int) -> torch.Tensor:
    """(N, 3, size, size) in [-1, 1]: the evaluator's real renders (dmad.demo.evaluator)."""
    from dmad.demo.evaluator import render_real_attrs, to_unit

    return to_unit(render_real_attrs(attrs, size)) if attrs else torch.empty((0, 3, size, size))


def render_batch(start: int, n: int, seed: int, size: int, attributes: bool = False) -> tuple[torch.Tensor, list]:
    """(n, 3, size, size) in [-1, 1] and the captions (or with `attributes`, the attribute dicts)
    of training indices start .. start+n-1."""
    from dmad.demo.shapes import attributes_for, caption

    attrs = [attributes_for(TRAIN_INDEX_OFFSET + i, seed) for i in range(start, start + n)]
    return render_attrs(attrs, size), attrs if attributes else [caption(a) for a in attrs]


def render_mosaics(start: int, n: int, seed: int, size: int) -> torch.Tensor:
    from dmad.demo.shapes import render_mosaic

    arr = np.stack([np.asarray(render_mosaic(i, seed, size), dtype=np.float32) for i in range(start, start + n)])
    return torch.from_numpy(arr / 127.5 - 1.0).permute(0, 3, 1, 2).contiguous()


def lr_factor(step: int, total: int, warmup: int, floor: float = 0.0) -> float:
    """Linear warmup, then cosine down to `floor` x the base rate."""
    if step < warmup:
        return (step + 1) / warmup
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, total - warmup)))


# ------------------------------------------------------------------------------------- VAE

def _balanced_weights(x: torch.Tensor, n_mosaic: int) -> torch.Tensor:
    """Per-pixel loss weights (B, 1, H, W): on a captioned image the shape (pixels unlike the
    top-left corner, which is always background) and the background each get half the weight,
    so a shape covering 5% of the image counts as much as its background; mosaics weigh 1."""
    w = shape_weights((x - x[:, :, :1, :1]).abs().amax(1, keepdim=True) > 0.05, 0.5)
    w[:n_mosaic] = 1.0
    return w


def reconstruction_loss(rec: torch.Tensor, x: torch.Tensor, n_mosaic: int) -> torch.Tensor:
    """L1 + L2 per pixel, weighted by _balanced_weights, averaged."""
    err = (rec - x).abs() + (rec - x) ** 2
    return (err * _balanced_weights(x, n_mosaic)).mean()


def vae_step(vae, opt, step: int, cfg) -> float:
    """One VAE step on a batch of mosaics + captioned renders (both pure functions of step)."""
    n_mosaic = round(cfg.vae_batch * cfg.vae_mosaic_fraction)
    for g in opt.param_groups:
        g["lr"] = cfg.vae_lr * lr_factor(step, cfg.vae_steps, cfg.warmup_steps)
    x, _ = render_batch(step * cfg.vae_batch, cfg.vae_batch - n_mosaic, cfg.seed, cfg.image_size)
    if n_mosaic:
        x = torch.cat([render_mosaics(step * cfg.vae_batch, n_mosaic, cfg.seed, cfg.image_size), x])
    post = vae.encode(x.contiguous(memory_format=torch.channels_last)).latent_dist
    loss_rec = reconstruction_loss(vae.decode(post.mode()).sample, x, n_mosaic)
    loss = loss_rec + cfg.vae_kl_weight * post.kl().mean()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return loss_rec.item()


def heldout_renders(n: int, size: int) -> tuple[torch.Tensor, list[str]]:
    """Held-out real renders (the evaluator's held-out seed), never trained on."""
    from dmad.demo.evaluator import HELDOUT_DATA_SEED, render_real, to_unit
    from dmad.demo.shapes import caption

    images, attrs = render_real(range(n), HELDOUT_DATA_SEED, size)
    return to_unit(images), [caption(a) for a in attrs]


@contextlib.contextmanager
def channels_last(vae):
    """The VAE's convolutions in channels-last layout inside the block (fp32 all the same: 1.12x per
    training step and 1.33x per encode on 2 AMD EPYC cores), back to the default layout after, which
    safetensors saves."""
    vae.to(memory_format=torch.channels_last)
    try:
        yield vae
    finally:
        vae.to(memory_format=torch.contiguous_format)


@torch.no_grad()
def encode_latents(vae, images: torch.Tensor, batch: int = 256) -> torch.Tensor:
    """Posterior means, unscaled."""
    return torch.cat([vae.encode(images[a:a + batch].contiguous(memory_format=torch.channels_last)).latent_dist.mean
                      .contiguous() for a in range(0, len(images), batch)])


def scaled_latents(vae, images: torch.Tensor) -> torch.Tensor:
    """What the transformer trains and samples on: posterior means, shifted and scaled by the VAE's
    config (as SD3's pipeline does)."""
    return (encode_latents(vae, images) - vae.config.shift_factor) * vae.config.scaling_factor


def open_teacher(path: str):
    """(pipeline, TextSide) of a demo teacher folder, its transformer in eval mode: what the
    teacher diagnostics in bench/ sample with."""
    from diffusers import StableDiffusion3Pipeline

    pipe = StableDiffusion3Pipeline.from_pretrained(path)
    pipe.transformer.eval()
    return pipe, TextSide(pipe.tokenizer, pipe.text_encoder, pipe.text_encoder_2)


@torch.no_grad()
def reconstruction_adherence(vae, n: int, size: int) -> dict:
    x, caps = heldout_renders(n, size)
    rec = torch.cat([vae.decode(z).sample for z in encode_latents(vae, x).split(256)])
    return adherence_of(rec.clamp(-1, 1), caps)


def adherence_of(images: torch.Tensor, captions: list[str]) -> dict:
    from dmad.demo.evaluator import load_evaluator
    from dmad.demo.metrics import evaluate_images

    res = evaluate_images(load_evaluator(), images, captions)["adherence"]
    return {"all": round(res["all"], 4), **{k: round(v, 4) for k, v in res["per_attribute"].items()}}


# ------------------------------------------------------------------------------------- text + transformer

class TextSide:
    """The two CLIP encoders as SD3's pipeline uses them (penultimate hidden states side by side,
    text_embeds concatenated), with SD3's zero tokens collapsed to one."""

    def __init__(self, tokenizer, te1, te2):
        self.tokenizer, self.te1, self.te2 = tokenizer, te1, te2

    def cached_ids(self, captions: list[str]) -> torch.Tensor:
        """ids() through a cache: a training run draws a few thousand distinct captions, and
        tokenizing 32 of them costs ~15 ms, 2 minutes over 7,000 steps."""
        cache = self.__dict__.setdefault("_cache", {})
        new = sorted({c for c in captions if c not in cache})
        if new:
            cache.update(zip(new, self.ids(new)))
        return torch.stack([cache[c] for c in captions])

    def ids(self, captions: list[str]) -> torch.Tensor:
        return self.tokenizer(captions, padding="max_length", max_length=self.tokenizer.model_max_length,
                              truncation=True, return_tensors="pt").input_ids

    def encode_ids(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        o1 = self.te1(ids, output_hidden_states=True)
        o2 = self.te2(ids, output_hidden_states=True)
        emb = torch.cat([o1.hidden_states[-2], o2.hidden_states[-2]], -1)
        emb = torch.cat([emb, emb.new_zeros((emb.shape[0], 1, emb.shape[2]))], 1)  # the 256 zeros, as one
        return emb, torch.cat([o1.text_embeds, o2.text_embeds], -1)

    def encode(self, captions: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        return self.encode_ids(self.ids(captions))


def velocity(transformer, x: torch.Tensor, sigma: torch.Tensor, emb: torch.Tensor, pooled: torch.Tensor):
    """v (B, C, h, w) for a context whose last token stands for SD3's 256 zero tokens."""
    from dmad.models.repeated_tokens import install

    install(transformer)
    return transformer(hidden_states=x, timestep=sigma * 1000, encoder_hidden_states=emb, pooled_projections=pooled,
                       joint_attention_kwargs={"repeated_last": SD3_ZERO_TOKENS}).sample


def flow_loss(transformer, z0, emb, pooled, sigma, noise, weight: torch.Tensor | None = None) -> torch.Tensor:
    """Per-sample MSE of the velocity (B,); `weight` (B, 1, h, w), mean 1 per image, weighs latent
    pixels (shape_weights)."""
    s = sigma.view(-1, 1, 1, 1)
    pred = velocity(transformer, (1 - s) * z0 + s * noise, sigma, emb, pooled)
    err = (pred - (noise - z0)).pow(2)
    return (err if weight is None else err * weight).mean((1, 2, 3))


def flow_step(transformer, opt, params, z0, emb, pooled, gen: torch.Generator, logit_mean: float | torch.Tensor,
              logit_std: float, weight: torch.Tensor | None = None) -> torch.Tensor:
    """One optimizer step of the flow-matching loss on scaled latents `z0` (B, C, h, w): noise
    levels logit-normal(logit_mean, logit_std) (`logit_mean` one for all, or (B,) one per sample)
    and noise drawn from `gen` in that order, `weight` as flow_loss's, gradient norm clipped to 1
    over `params`. Returns the batch loss (detached use: .item())."""
    sigma = logit_normal_sigmas(len(z0), gen, logit_mean, logit_std)
    noise = torch.randn(z0.shape, generator=gen)
    loss = flow_loss(transformer, z0, emb, pooled, sigma, noise, weight).mean()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    opt.step()
    return loss


def shape_masks(images: torch.Tensor, latent_hw: tuple[int, int], dilate: int = 1) -> torch.Tensor:
    """(B, 1, h, w) bool: the latent pixels a captioned render's shape touches, grown by `dilate`
    latent pixels so its edges count as shape. A render's pixel (0, 0) is always background
    (shapes keep a 1 px margin inside their slot)."""

    mask = ((images - images[..., :1, :1]).abs().amax(1, keepdim=True) > 0).float()
    m = F.adaptive_max_pool2d(mask, latent_hw)
    if dilate:
        m = F.max_pool2d(m, 2 * dilate + 1, stride=1, padding=dilate)
    return m > 0


def shape_difference_masks(attrs: list[dict], size: int, latent_hw: tuple[int, int]) -> torch.Tensor:
    """(N, 1, h, w) bool: the latent pixels where the shapes differ at each render's place and size:
    inside some of the four shapes (dmad.demo.shapes.SHAPES) drawn there, not inside all of them.
    Where a caption leaves the shape out, only these pixels say which shape is coming."""
    from dmad.demo.shapes import SHAPES

    masks = torch.stack([shape_masks(render_attrs([{**a, "shape": s} for a in attrs], size), (size, size), dilate=0)
                         for s in SHAPES])
    union, common = masks.any(0), masks.all(0)
    return F.adaptive_max_pool2d((union & ~common).float(), latent_hw) > 0


def shape_weights(masks: torch.Tensor, shape_share: float) -> torch.Tensor:
    """Per-latent-pixel loss weights, mean 1 per image, that give the shape's pixels `shape_share`
    of each image's loss and the background the rest (0 < share < 1; the plain mean gives a small
    shape ~5-10%). A captioned render is ~90% background, which the caption fixes with one word;
    the shape's outline is what the teacher learns last."""
    m = masks.float()
    frac = m.mean((2, 3), keepdim=True).clamp(1e-3, 1 - 1e-3)
    return shape_share * m / frac + (1 - shape_share) * (1 - m) / (1 - frac)


@torch.no_grad()
def sample_flow(transformer, text: TextSide, captions: list[str], noise: torch.Tensor, steps: int,
                guidance: float, scheduler_config, x0: torch.Tensor | None = None,
                enter_at: float = 1.0) -> torch.Tensor:
    """The pipeline's own sampler (FlowMatchEulerDiscreteScheduler + CFG on "") on latents, with
    the zero tokens collapsed: the same numbers as StableDiffusion3Pipeline, ~5x faster here.
    With `x0` (scaled latents), the same schedule entered at its first step at or below sigma
    `enter_at`, from x0 noised to that step's sigma with `noise` (SDEdit-style)."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    sched = FlowMatchEulerDiscreteScheduler.from_config(scheduler_config)
    sched.set_timesteps(steps)
    emb, pooled = text.encode(captions)
    uemb, upooled = text.encode([""] * len(captions))
    timesteps, x = sched.timesteps, noise.clone()
    if x0 is not None:
        timesteps = [t for t in sched.timesteps if float(t) / 1000 <= enter_at + 1e-6]
        sched.set_begin_index(len(sched.timesteps) - len(timesteps))
        s0 = float(timesteps[0]) / 1000
        x = (1 - s0) * x0 + s0 * noise
    for t in timesteps:
        sigma = torch.full((len(x),), float(t) / 1000)
        if guidance == 1.0:
            v = velocity(transformer, x, sigma, emb, pooled)
        else:
            vv = velocity(transformer, torch.cat([x, x]), torch.cat([sigma, sigma]), torch.cat([uemb, emb]),
                          torch.cat([upooled, pooled]))
            v = vv[: len(x)] + guidance * (vv[len(x):] - vv[: len(x)])
        x = sched.step(v, t, x).prev_sample
    return x


def decode(vae, latents: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return vae.decode(latents / vae.config.scaling_factor + vae.config.shift_factor).sample.clamp(-1, 1)


# ------------------------------------------------------------------------------------- diagnostics

def swap_attribute(attrs: dict, attribute: str, rng) -> dict:
    """The same attributes with one changed to another value of that attribute."""
    from dmad.demo.evaluator import vocabulary

    other = [v for v in vocabulary()[attribute] if v != attrs[attribute]]
    return {**attrs, attribute: rng.choice(other)}


@torch.no_grad()
def word_swap_rise(transformer, text: TextSide, vae, n: int, size: int, seed: int = 0) -> dict:
    """How much the denoising loss rises when one caption word is swapped: {attribute: {sigma: rise}}.
    Same images, same noise; a rise near 0 means the model ignores that word."""
    import random

    from dmad.demo.evaluator import HELDOUT_DATA_SEED
    from dmad.demo.metrics import ATTRIBUTES
    from dmad.demo.shapes import attributes_for, caption

    attrs = [attributes_for(10**6 + i, HELDOUT_DATA_SEED) for i in range(n)]
    z0 = (encode_latents(vae, render_attrs(attrs, size)) - vae.config.shift_factor) * vae.config.scaling_factor
    gen = torch.Generator().manual_seed(seed)
    noise = torch.randn(z0.shape, generator=gen)
    rng = random.Random(seed)
    out = {}
    base = {s: flow_loss(transformer, z0, *text.encode([caption(a) for a in attrs]), torch.full((n,), s), noise)
            for s in SWAP_SIGMAS}
    for attribute in ATTRIBUTES:
        swapped = text.encode([caption(swap_attribute(a, attribute, rng)) for a in attrs])
        out[attribute] = {str(s): round((flow_loss(transformer, z0, *swapped, torch.full((n,), s), noise)
                                         - base[s]).mean().item(), 5) for s in SWAP_SIGMAS}
    return out


def quick_adherence(transformer, text: TextSide, vae, scheduler_config, n: int, steps: int, guidance: float,
                    seed: int = 0) -> dict:
    from dmad.demo.shapes import attributes_for, caption

    caps = [caption(attributes_for(i, EVAL_CAPTION_SEED)) for i in range(n)]
    from dmad.sample.render import latent_shape

    side = vae.config.sample_size
    noise = torch.randn((n, *latent_shape(vae, side, side)), generator=torch.Generator().manual_seed(seed))
    images = torch.cat([decode(vae, sample_flow(transformer, text, caps[a:a + 64], noise[a:a + 64], steps, guidance,
                                                scheduler_config)) for a in range(0, n, 64)])
    return adherence_of(images, caps)


COVERAGE_CAPTION_SEED = 5_000_002  # the learning curve's under-specified captions


def quick_coverage(transformer, text: TextSide, vae, scheduler_config, steps: int, guidance: float,
                   captions: int = 8, seeds: int = 16, seed: int = 0) -> dict:
    """The learning curve's look at distributions: `captions` under-specified captions
    (shapes.under_specified of COVERAGE_CAPTION_SEED) at `seeds` seeds each, quick samples read
    by the evaluator: stated accuracy, mean total-variation distance to the data's conditional,
    and the share of needed values that appear (dmad.demo.coverage). At 16 samples a caption the
    TV of the data itself is ~0.2: a trend, not the bench's number."""
    from dmad.demo.coverage import coverage_summary
    from dmad.demo.evaluator import load_evaluator
    from dmad.demo.shapes import caption, under_specified
    from dmad.sample.render import latent_shape

    caps = [caption(*under_specified(i, COVERAGE_CAPTION_SEED)) for i in range(captions) for _ in range(seeds)]
    side = vae.config.sample_size
    noise = torch.randn((len(caps), *latent_shape(vae, side, side)), generator=torch.Generator().manual_seed(seed))
    images = torch.cat([decode(vae, sample_flow(transformer, text, caps[a:a + 64], noise[a:a + 64], steps, guidance,
                                                scheduler_config)) for a in range(0, len(caps), 64)])
    s = coverage_summary(load_evaluator().predict(images), caps)
    return {k: round(s[k], 4) for k in ("stated_accuracy", "tv", "coverage")}


def ema_update(ema: torch.nn.Module, model: torch.nn.Module, decay: float) -> None:
    with torch.no_grad():
        for e, p in zip(ema.parameters(), model.parameters()):
            e.lerp_(p, 1 - decay)


def logit_normal_sigmas(n: int, gen: torch.Generator, mean: float | torch.Tensor, std: float) -> torch.Tensor:
    """SD3's training noise levels: sigmoid of a normal, dense around the middle."""
    return torch.sigmoid(mean + std * torch.randn(n, generator=gen))


def log_every(step: int, total: int, every: int) -> bool:
    return step % every == 0 or step == total - 1


# ------------------------------------------------------------------------------------- state on disk

def save_state(work: Path, tensors: dict, meta: dict) -> None:
    """Both files written to temp names and renamed; state.json last, so it never names weights
    that are not there."""
    from safetensors.torch import save_file

    tmp = work / f".{STATE_FILE}.tmp"
    save_file({k: v.detach().contiguous() for k, v in tensors.items()}, str(tmp))
    os.replace(tmp, work / STATE_FILE)
    tmp_json = work / f".{STATE_JSON}.tmp"
    tmp_json.write_text(json.dumps(meta, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp_json, work / STATE_JSON)


def module_tensors(prefix: str, module) -> dict:
    return {f"{prefix}.{k}": v for k, v in module.state_dict().items()}


def load_module(module, prefix: str, tensors: dict) -> None:
    n = len(prefix) + 1
    module.load_state_dict({k[n:]: v for k, v in tensors.items() if k.startswith(prefix + ".")})


def optimizer_tensors(opt) -> tuple[dict, list]:
    sd = opt.state_dict()
    flat = {f"opt.{i}.{k}": v for i, st in sd["state"].items() for k, v in st.items()}
    return flat, sd["param_groups"]


def load_optimizer(opt, tensors: dict, groups: list) -> None:
    state: dict = {}
    for key, v in tensors.items():
        if key.startswith("opt."):
            _, i, name = key.split(".", 2)
            state.setdefault(int(i), {})[name] = v
    opt.load_state_dict({"state": state, "param_groups": groups})


def read_resume(work: Path, cfg) -> dict:
    """{} for a fresh start; else the saved tensors and meta of an interrupted run of the same recipe.
    Only state.json and state.safetensors are read (never a pickle), each checked first."""
    if not (work / STATE_JSON).is_file():
        return {}
    meta = read_json_file(work / STATE_JSON, "make-teacher state")
    if not isinstance(meta, dict) or not isinstance(meta.get("stage_done"), int):
        raise UserInputError(f"{work / STATE_JSON}: not a make-teacher state (no stage_done); remove {work} to "
                             f"start over")
    if meta.get("recipe") != asdict(cfg):
        changed = sorted(k for k, v in asdict(cfg).items() if (meta.get("recipe") or {}).get(k) != v)
        raise UserInputError(f"{work}: an interrupted make-teacher with other settings ({', '.join(changed)}) is "
                             f"there; run it again with its settings or remove that folder to start over")
    return {"meta": meta, "tensors": _state_tensors(work / STATE_FILE), "stage_done": meta["stage_done"]}


def _state_tensors(f: Path) -> dict:
    """The tensors of state.safetensors, its header checked first (a truncated or foreign file is
    the user's to remove, exit 2, not a crash in the middle of loading)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    if not f.is_file():
        raise UserInputError(f"{f}: missing (the state.json beside it names it); remove {f.parent} to start over")
    read_safetensors_header(f)
    try:
        return load_file(str(f))
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        raise UserInputError(f"{f}: cannot read ({e.__class__.__name__}: {e}); remove {f.parent} to start over") from e


def log_rows(f: Path) -> list[dict]:
    """The rows of training_log.jsonl; a line torn by an interruption (and whatever the resumed run
    appended to it) is skipped, never a crash at the end of training."""
    rows = []
    for line in f.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            row = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows


def open_log(work: Path):
    """training_log.jsonl for appending, on a fresh line: an interrupted run may have left its last
    row half written."""
    f = open(work / "training_log.jsonl", "a+b")
    f.seek(0, os.SEEK_END)
    if f.tell():
        f.seek(-1, os.SEEK_END)
        torn = f.read(1) != b"\n"
        f.seek(0, os.SEEK_END)
        if torn:
            f.write(b"\n")
    f.close()
    return open(work / "training_log.jsonl", "a", encoding="utf-8")
