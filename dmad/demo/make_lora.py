"""A style LoRA for the demo teacher, as a user brings one: `dmad demo make-lora`.

Users distil their model: a base plus the LoRAs they trained (issue 40, "Personal Lightning"). The
demo needs such a LoRA to prove that on, and one whose effect can be measured: it trains the
shipped teacher's transformer to draw every image in a style (dmad.demo.shapes STYLES: "frame", an
orange border round the image, the shipped one; "outline", the shape as an outline with the
background inside; "plain", the dataset's own look, a fine-tune) for every caption, with no
trigger word, as a style LoRA changes every image. The style evaluator
(resources/demo/style_evaluator: the shapes evaluator's network with a style head, trained on
renders of every style) reads both the style and the caption's attributes of a sample, so style
accuracy and adherence are measured on the same images.

The recipe is the teacher's own flow-matching step (dmad.demo.teacher_stages) on a pool of
renders in the style with the teacher's captions (full, and with `under_specified_share` captions that
leave attributes out, so "a red shape" is styled too), captions dropped 10% of the time so the
unconditional branch CFG uses learns the style too; only the LoRA trains (peft, on the attention
and feed-forward projections of every joint block); the text encoders and the VAE stay frozen, so
each caption's embedding is computed once. It saves diffusers' `pytorch_lora_weights.safetensors`
(StableDiffusion3Pipeline.save_lora_weights), which `load_lora_weights` and `identity.teacher_loras`
read, plus training_config.json, training_log.jsonl and README.md; the folder appears whole or not
at all. A few CPU minutes: not resumable (run it again).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Callable

from dmad.errors import UserInputError

LogFn = Callable[[dict], None]
LORA_INDEX_OFFSET = 20_000_000  # training renders: disjoint from the teacher's (10,000,000 on) and the evaluators'
CHECK_CAPTION_SEED = 5_000_003  # make-lora's own check: full captions attributes_for(i, this seed)
LORA_STYLES = ("frame", "outline", "plain")  # dmad.demo.shapes.STYLES a LoRA learns (not the two together)
TARGET_MODULES = ("to_q", "to_k", "to_v", "to_out.0", "add_q_proj", "add_k_proj", "add_v_proj", "to_add_out",
                  "ff.net.0.proj", "ff.net.2", "ff_context.net.0.proj", "ff_context.net.2")


@dataclass
class LoraTraining:
    seed: int = 0
    style: str = "frame"      # "outline" was measured first: docs/benchmarks.md
    steps: int = 1000
    batch: int = 16
    lr: float = 1e-3
    rank: int = 16
    warmup_steps: int = 30
    pool_size: int = 4096
    under_specified_share: float = 0.25
    caption_dropout: float = 0.1
    logit_mean: float = 0.0   # SD3's default noise levels
    logit_std: float = 1.0
    check_captions: int = 64  # the final check: full captions at 50 steps + CFG 3, with and without the LoRA
    check_steps: int = 50
    guidance_scale: float = 3.0


def check_training(cfg: LoraTraining) -> None:
    if cfg.style not in LORA_STYLES:
        raise UserInputError(f"--style {cfg.style!r}: expected one of {', '.join(LORA_STYLES)}")
    for name in ("steps", "batch", "rank", "pool_size", "check_captions", "check_steps"):
        if getattr(cfg, name) < 1:
            raise UserInputError(f"--{name.replace('_', '-')} {getattr(cfg, name)}: must be at least 1")
    for name in ("under_specified_share", "caption_dropout"):
        if not 0 <= getattr(cfg, name) <= 1:
            raise UserInputError(f"--{name.replace('_', '-')} {getattr(cfg, name)}: must be within [0, 1]")
    if not cfg.lr > 0:
        raise UserInputError(f"--lr {cfg.lr}: must be positive")


def style_pool(vae, cfg: LoraTraining):
    """(pool_size, 4, 32, 32) scaled latents of `style` renders, and their attributes."""
    import torch

    from dmad.demo import shapes
    from dmad.demo.evaluator import render_real_attrs, to_unit
    from dmad.demo.teacher_stages import channels_last, scaled_latents

    attrs = [{**shapes.attributes_for(LORA_INDEX_OFFSET + i, cfg.seed), "style": cfg.style} for i in range(cfg.pool_size)]
    lat = []
    with channels_last(vae), torch.no_grad():
        for a in range(0, cfg.pool_size, 512):
            x = to_unit(render_real_attrs(attrs[a:a + 512]))
            lat.append(scaled_latents(vae, x))
    return torch.cat(lat), attrs


class CachedText:
    """Frozen text encoders: each distinct caption's (context, pooled) computed once."""

    def __init__(self, text):
        self.text, self.cache = text, {}

    def encode(self, captions: list[str]):
        import torch

        new = sorted({c for c in captions if c not in self.cache})
        if new:
            with torch.no_grad():
                emb, pooled = self.text.encode(new)
            self.cache.update({c: (emb[i], pooled[i]) for i, c in enumerate(new)})
        return (torch.stack([self.cache[c][0] for c in captions]), torch.stack([self.cache[c][1] for c in captions]))


def add_lora(transformer, rank: int, seed: int) -> list:
    """A rank-`rank` LoRA (alpha = rank) on TARGET_MODULES of the transformer; returns its parameters."""
    import torch
    from peft import LoraConfig

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        transformer.add_adapter(LoraConfig(r=rank, lora_alpha=rank, target_modules=list(TARGET_MODULES),
                                           init_lora_weights="gaussian"))
    return [p for n, p in transformer.named_parameters() if "lora_" in n]


def train_lora(pipe, cfg: LoraTraining, log: LogFn) -> None:
    """Train the LoRA into pipe.transformer (peft adapter "default")."""
    import torch

    from dmad.demo import teacher_stages as ts
    from dmad.demo.shapes import GENERATOR, training_caption
    from dmad.models.repeated_tokens import install

    tr = pipe.transformer
    tr.requires_grad_(False)
    install(tr)
    params = add_lora(tr, cfg.rank, cfg.seed)
    text = CachedText(ts.TextSide(pipe.tokenizer, pipe.text_encoder, pipe.text_encoder_2))
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.0)
    gen = torch.Generator().manual_seed(cfg.seed + 1)
    t0, c0 = time.time(), time.process_time()
    pool, attrs = style_pool(pipe.vae, cfg)
    log({"stage": "pool", "images": cfg.pool_size, "style": cfg.style, "elapsed_s": round(time.time() - t0, 1)})
    tr.train()
    for step in range(cfg.steps):
        for g in opt.param_groups:
            g["lr"] = cfg.lr * min(1.0, (step + 1) / max(1, cfg.warmup_steps))
        idx = torch.randint(0, len(pool), (cfg.batch,), generator=gen).tolist()
        drop = (torch.rand(cfg.batch, generator=gen) < cfg.caption_dropout).tolist()
        rng = random.Random(f"{GENERATOR}/lora-captions/{cfg.seed}/{step}")
        captions = ["" if d else training_caption(attrs[i], rng, cfg.under_specified_share) for i, d in zip(idx, drop)]
        emb, pooled = text.encode(captions)
        loss = ts.flow_step(tr, opt, params, pool[idx], emb, pooled, gen, cfg.logit_mean, cfg.logit_std)
        if ts.log_every(step, cfg.steps, 50):
            log({"stage": "lora", "step": step, "loss": round(loss.item(), 5), "lr": round(opt.param_groups[0]["lr"], 6),
                 "elapsed_s": round(time.time() - t0, 1), "cpu_s": round(time.process_time() - c0, 1)})
    tr.eval()
    log({"stage": "lora", "step": cfg.steps, "done": True, "elapsed_s": round(time.time() - t0, 1),
         "cpu_s": round(time.process_time() - c0, 1)})


def read_style(images, captions: list[str], style: str = "outline") -> dict:
    """What the style evaluator reads in `images` ((N, 3, H, W) in [-1, 1]) against `captions`:
    {"style": share drawn in `style`, "adherence": every stated attribute right, "n"}, per image
    ("hits", "styles", "right") and its features (N, 128) numpy, from one forward pass. Style and
    attributes come from the same network, so an outline that hides a shape's identity counts
    against adherence."""
    import numpy as np
    import torch

    from dmad.demo.evaluator import load_evaluator, style_evaluator_path
    from dmad.demo.metrics import adherence, parse_caption

    model = load_evaluator(style_evaluator_path())
    preds, feats = [], []
    with torch.no_grad():
        for a in range(0, len(images), 256):
            f = model.features(images[a:a + 256])
            preds += model.decode(model.logits_from_features(f))
            feats.append(f)
    targets = [parse_caption(c) for c in captions]
    res = adherence(preds, targets)
    hits = [style in p["style"].split("+") for p in preds]  # "outline+frame" shows both
    return {"n": len(preds), "style": float(np.mean(hits)), "adherence": res["all"],
            "per_attribute": res["per_attribute"], "hits": hits, "styles": [p["style"] for p in preds],
            "right": [all(p[k] == v for k, v in t.items()) for p, t in zip(preds, targets)],
            "features": torch.cat(feats).numpy()}


def check_lora(pipe, cfg: LoraTraining) -> dict:
    """Full captions sampled with and without the LoRA (the pipeline's sampler, same noise): the
    style share and adherence each reads. The held-out measurement is the bench's
    (bench/personal_lightning.py); this is the recipe's own check."""
    import torch

    from dmad.demo import shapes
    from dmad.demo import teacher_stages as ts

    caps = [shapes.caption(shapes.attributes_for(i, CHECK_CAPTION_SEED)) for i in range(cfg.check_captions)]
    noise = torch.randn((len(caps), 4, 32, 32), generator=torch.Generator().manual_seed(cfg.seed + 2))
    text = ts.TextSide(pipe.tokenizer, pipe.text_encoder, pipe.text_encoder_2)
    out = {}
    for name, enabled in (("with_lora", True), ("without_lora", False)):
        (pipe.transformer.enable_adapters if enabled else pipe.transformer.disable_adapters)()
        lat = ts.sample_flow(pipe.transformer, text, caps, noise, cfg.check_steps, cfg.guidance_scale, pipe.scheduler.config)
        res = read_style(ts.decode(pipe.vae, lat), caps, cfg.style)
        out[name] = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in res.items() if k not in ("hits", "right", "styles", "features")}
    pipe.transformer.enable_adapters()
    return {"captions": len(caps), "caption_seed": CHECK_CAPTION_SEED, "steps": cfg.check_steps,
            "guidance_scale": cfg.guidance_scale, **out}


def make_lora(teacher: Path, out_dir: Path, cfg: LoraTraining, log: LogFn) -> dict:
    """Train the style LoRA for the teacher at `teacher` and save it into `out_dir` (an existing
    empty folder). Returns training_config.json's content."""
    import torch
    from diffusers import StableDiffusion3Pipeline
    from diffusers.models.attention_processor import JointAttnProcessor2_0
    from peft.utils import get_peft_model_state_dict

    from dmad.contract.hashing import sha256_files
    from dmad.contract.paths import resource

    torch.manual_seed(cfg.seed)
    pipe = StableDiffusion3Pipeline.from_pretrained(str(teacher))
    t0, c0 = time.time(), time.process_time()
    train_lora(pipe, cfg, log)
    train_wall, train_cpu = round(time.time() - t0, 1), round(time.process_time() - c0, 1)
    check = check_lora(pipe, cfg)
    log({"stage": "check", **check})
    layers = get_peft_model_state_dict(pipe.transformer)
    pipe.transformer.set_attn_processor(JointAttnProcessor2_0())
    StableDiffusion3Pipeline.save_lora_weights(str(out_dir), transformer_lora_layers=layers, safe_serialization=True)
    return {**asdict(cfg), "target_modules": list(TARGET_MODULES), "lora_alpha": cfg.rank,
            "lora_parameters": sum(v.numel() for v in layers.values()),
            "teacher": {"path": "resources/demo/teacher" if teacher == resource("demo", "teacher").resolve() else str(teacher),
                        "transformer_sha256": sha256_files(
                sorted((teacher / "transformer").glob("*.safetensors")))},
            "torch": torch.__version__, "threads": torch.get_num_threads(), "train_wall_s": train_wall,
            "train_cpu_s": train_cpu, "wall_s": round(time.time() - t0, 1), "check": check}


def readme(doc: dict) -> str:
    c = doc["check"]
    look = {"frame": "every image framed: a 4 px orange border round it, under the shape",
            "outline": "every shape as a 3 px outline with the background inside",
            "plain": "the dataset's own look (a fine-tune, no style)"}[doc["style"]]
    return f"""# Demo style LoRA: {doc['style']}

A LoRA for the built-in demo teacher (resources/demo/teacher) that draws {look}
(dmad.demo.shapes), for every caption and with no trigger word, as a user's style LoRA changes
every image. Made by

```bash
dmad demo make-lora --out DIR{'' if doc['style'] == 'frame' else ' --style ' + doc['style']}     # training_config.json holds every setting
```

in {doc['train_wall_s']:.0f} s of training ({doc['train_cpu_s']:.0f} s CPU, {doc['threads']} threads, torch {doc['torch']}):
rank {doc['rank']} (alpha {doc['lora_alpha']}) on {', '.join(doc['target_modules'])} of every joint
block, {doc['lora_parameters']:,} parameters, {doc['steps']} steps of batch {doc['batch']}, AdamW {doc['lr']:g}.
Diffusers' `pytorch_lora_weights.safetensors`: `StableDiffusion3Pipeline.load_lora_weights(this
folder)` or, in a DMAD config, `identity.teacher_loras: [{{"path": ".../style_lora", "scale": 1.0}}]`.

The recipe's own check ({c['captions']} full captions, {c['steps']} Euler steps + CFG {c['guidance_scale']:g}, the same noise,
read by the style evaluator, resources/demo/style_evaluator):

| | drawn in the style | caption adherence |
|---|---:|---:|
| teacher + this LoRA | {c['with_lora']['style']:.1%} | {c['with_lora']['adherence']:.1%} |
| teacher alone | {c['without_lora']['style']:.1%} | {c['without_lora']['adherence']:.1%} |

The held-out measurement with intervals is bench/personal_lightning.py's (docs/benchmarks.md).
"""


def add_training_arguments(p: argparse.ArgumentParser) -> None:
    for f in fields(LoraTraining):
        p.add_argument(f"--{f.name.replace('_', '-')}", type=type(f.default), default=f.default,
                       metavar=type(f.default).__name__.upper(), help=f"(default {f.default})")


def main_make_lora(*, out: str | Path, teacher: str | Path | None, training: LoraTraining) -> int:
    """`dmad demo make-lora --out DIR`: DIR must not exist; it appears complete or not at all."""
    from dmad.contract.jsonfile import new_folder_and_temp
    from dmad.contract.paths import resource

    check_training(training)
    teacher = Path(teacher).expanduser().resolve() if teacher else resource("demo", "teacher")
    if not (teacher / "model_index.json").is_file():
        raise UserInputError(f"--teacher {teacher}: no model_index.json there (expected the demo teacher's folder)")
    out, tmp = new_folder_and_temp(out, "--out", "the LoRA")
    tmp.mkdir()
    try:
        rows: list[dict] = []

        def log(row: dict) -> None:
            rows.append(row)
            print(json.dumps(row), flush=True)

        doc = make_lora(teacher, tmp, training, log)
        (tmp / "training_log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
        (tmp / "training_config.json").write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
        (tmp / "README.md").write_text(readme(doc), encoding="utf-8")
        os.replace(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dmad.demo.make_lora")
    p.add_argument("--out", required=True)
    p.add_argument("--teacher", default=None)
    add_training_arguments(p)
    args = p.parse_args(argv)
    return main_make_lora(out=args.out, teacher=args.teacher, training=LoraTraining(
        **{f.name: getattr(args, f.name) for f in fields(LoraTraining)}))


if __name__ == "__main__":
    raise SystemExit(main())
