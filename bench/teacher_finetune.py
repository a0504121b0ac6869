"""Probe: fine-tune the shipped demo teacher with some shape x size cells drawn more often, to see
whether the cells it loses (small crosses and diamonds, docs/benchmarks.md) are a matter of how
often training shows them. Writes a plain diffusers pipeline folder (the EMA transformer) that
bench/teacher_errors.py reads with --teacher.

The recipe's transformer stage (dmad.demo.make_teacher.train_transformer) from the shipped weights:
flow loss on a pool of encoded captioned renders, logit-normal sigmas (the recipe's mean 1.5, std
1), 10% caption dropout, AdamW on the transformer and both text encoders at one constant rate,
gradient clipping at 1, an EMA of the transformer. What differs is the draw: a cell named in
--boost is drawn with that weight (1 for the rest).

    python bench/teacher_finetune.py --out DIR [--steps 800] [--lr 4e-4] [--boost "small diamond=3,small square=2"]
                                     [--under-share S] [--add-layers K]

--under-share S trains on captions that leave attributes out with probability S (the recipe's
dmad.demo.shapes.training_caption; the recipe ends its ramp at 0.5 and averages 0.25): is more
exposure to such captions what the teacher's distance to the data's conditional needs (issue 37)?

--under-logit-mean M draws the noise levels of the captions that leave attributes out from
logit-normal(M, 1) (full captions keep the recipe's 1.5): such a caption leaves the choice of shape
to the noise, which is made where the image's own content shows it (mid noise), and the recipe's
median sigma 0.82 trains little there.

--difference-share S gives the latent pixels where the four shapes differ, at each render's place
and size (teacher_stages.shape_difference_masks), the share S of each image's flow loss. A weighting
per pixel leaves the best prediction where it was (each pixel's posterior mean) and moves where the
model spends its fit: at high noise, with the shape left out, only those pixels carry which shape
is coming, and a few per cent of the plain mean.

--add-layers K first inserts K joint blocks that start as the identity (deepen), to ask whether
depth is what the teacher lacks.

--fresh-layers N trains a new transformer of N joint blocks from scratch (diffusers' initialisation,
seeded) against the teacher's own text encoders, which stay frozen, with --warmup steps of linear
warm-up: a smaller, shorter-trained model of the same data and the same embeddings, the "bad
version of itself" that autoguidance (Karras et al. 2024; bench/teacher_coverage.py --autoguide)
guides away from.

~6 minutes for 800 steps on 2 idle cores (a step ~0.3 s, the pool ~1 minute); run it alone.
"""
from __future__ import annotations

import argparse
import copy
import json
import random
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent


def cell_of(caption: str) -> str:
    """'small cross' of 'a small red cross at the top left on a black background'."""
    words = caption.split()
    return f"{words[1]} {words[3]}"


def deepen(tr, k: int):
    """The transformer with k more joint blocks, inserted before its last (context-pre-only) block
    and starting as the identity: their adaLN modulations are zero, so every gate is 0 (DiT's
    adaLN-Zero) and the deeper model computes exactly what the shipped one does until trained. A
    plain SD3Transformer2DModel (num_layers + k) that diffusers loads like the shipped one."""
    from diffusers import SD3Transformer2DModel

    n = tr.config.num_layers
    new = SD3Transformer2DModel.from_config({**tr.config, "num_layers": n + k})
    state = {}
    for key, v in tr.state_dict().items():
        if key.startswith("transformer_blocks."):
            _, i, rest = key.split(".", 2)
            i = int(i)
            key = f"transformer_blocks.{i if i < n - 1 else i + k}.{rest}"
        state[key] = v
    missing, unexpected = new.load_state_dict(state, strict=False)
    assert not unexpected and all(m.startswith(tuple(f"transformer_blocks.{j}." for j in range(n - 1, n - 1 + k)))
                                  for m in missing), (missing, unexpected)
    with torch.no_grad():
        for j in range(n - 1, n - 1 + k):
            for lin in (new.transformer_blocks[j].norm1.linear, new.transformer_blocks[j].norm1_context.linear):
                lin.weight.zero_()
                lin.bias.zero_()
    return new


def fresh(tr, layers: int, seed: int):
    """A new SD3Transformer2DModel like `tr` but with `layers` joint blocks, initialised as diffusers
    does (seeded)."""
    from diffusers import SD3Transformer2DModel

    torch.manual_seed(seed)
    return SD3Transformer2DModel.from_config({**tr.config, "num_layers": layers})


def encoded_pool(vae, n: int, seed: int) -> tuple[list[torch.Tensor], list[dict]]:
    """Latent chunks and attributes of n renders the recipe never trained on (its pool starts at 2**24)."""
    from dmad.demo import teacher_stages as ts

    lat, attrs = [], []
    with torch.no_grad():
        for a in range(0, n, 1024):
            x, at = ts.render_batch(2**25 + a, min(1024, n - a), seed, vae.config.sample_size, attributes=True)
            lat.append(ts.scaled_latents(vae, x))
            attrs += at
    return lat, attrs


def trained_parameters(pipe, frozen_text: bool) -> list:
    """The transformer's parameters, and both text encoders' unless they stay frozen (--fresh-layers)."""
    params = list(pipe.transformer.parameters())
    for enc in (pipe.text_encoder, pipe.text_encoder_2):
        enc.requires_grad_(not frozen_text)
        params += [] if frozen_text else list(enc.parameters())
    return params


def save_ema(pipe, ema, trained, out: str) -> None:
    """The pipeline with the EMA transformer, as a plain diffusers folder at `out`; the pipeline
    keeps training `trained` afterwards."""
    pipe.transformer = ema
    pipe.save_pretrained(out)
    pipe.transformer = trained


RECIPE_LOGIT_MEAN = 1.5  # make_teacher.TeacherTraining.logit_mean


def noise_means(drawn: list[str], full: list[str], under_mean: float | None) -> float | torch.Tensor:
    """The logit-normal mean of each sample's noise level: the recipe's for all (under_mean None),
    or under_mean for a caption that leaves attributes out (drawn differs from the image's full
    caption) and the recipe's for the rest."""
    if under_mean is None:
        return RECIPE_LOGIT_MEAN
    under = torch.tensor([d != f for d, f in zip(drawn, full)])
    return torch.where(under, under_mean, RECIPE_LOGIT_MEAN)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--teacher", default=str(ROOT / "resources/demo/teacher"))
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=800)
    ap.add_argument("--lr", type=float, default=4e-4)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--ema", type=float, default=0.995)
    ap.add_argument("--pool", type=int, default=8192)
    ap.add_argument("--boost", default="", help="CELL=WEIGHT,... ('' for none)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--under-share", type=float, default=0.0,
                    help="the share of captions that leave attributes out (shapes.training_caption; 0: full captions only)")
    ap.add_argument("--under-logit-mean", type=float, default=None,
                    help="noise levels of the captions that leave attributes out: logit-normal(M, 1) instead of the "
                         "recipe's mean 1.5 (do such captions need training where an image's own content decides?)")
    ap.add_argument("--difference-share", type=float, default=0.0,
                    help="give the latent pixels where the four shapes differ (at each render's place and size) this "
                         "share of each image's loss (0: the plain mean)")
    ap.add_argument("--save-every", type=int, default=0,
                    help="also write the EMA pipeline every this many steps, to OUT/step-N (0: only at the end)")
    ap.add_argument("--fresh-layers", type=int, default=0,
                    help="train a new transformer of this many blocks from scratch, text encoders frozen (0: fine-tune)")
    ap.add_argument("--warmup", type=int, default=0, help="linear warm-up steps of the rate")
    ap.add_argument("--add-layers", type=int, default=0,
                    help="insert this many joint blocks, starting as the identity (is it depth it lacks?)")
    args = ap.parse_args(argv)
    from dmad.demo import teacher_stages as ts
    from dmad.demo.shapes import caption, training_caption
    from dmad.models.repeated_tokens import install

    torch.set_num_threads(2)
    boost = {k.strip(): float(v) for k, v in (x.split("=") for x in args.boost.split(",") if x)}
    pipe, text = ts.open_teacher(args.teacher)
    if args.add_layers:
        pipe.transformer = deepen(pipe.transformer, args.add_layers)
    if args.fresh_layers:
        pipe.transformer = fresh(pipe.transformer, args.fresh_layers, args.seed)
    tr, vae = pipe.transformer, pipe.vae
    install(tr)
    ema = copy.deepcopy(tr).requires_grad_(False)
    t0, c0 = time.time(), time.process_time()
    lat, attrs = encoded_pool(vae, args.pool, args.seed)
    caps = [caption(a) for a in attrs]
    diff = (ts.shape_difference_masks(attrs, vae.config.sample_size, tuple(lat[0].shape[-2:]))
            if args.difference_share else None)
    pool, empty = torch.cat(lat), text.ids([""])[0]
    weights = torch.tensor([boost.get(cell_of(c), 1.0) for c in caps])
    shown = {k: round(float(weights[[cell_of(c) == k for c in caps]].sum() / weights.sum()), 3) for k in boost}
    print(json.dumps({"pool": len(caps), "under_share": args.under_share, "share_of_draws": shown, "pool_s": round(time.time() - t0, 1)}), flush=True)
    params = trained_parameters(pipe, frozen_text=bool(args.fresh_layers))
    opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.01)
    gen = torch.Generator().manual_seed(args.seed + 1)
    tr.train()
    for step in range(args.steps):
        for g in opt.param_groups:
            g["lr"] = args.lr * min(1.0, (step + 1) / args.warmup) if args.warmup else args.lr
        idx = torch.multinomial(weights, args.batch, replacement=True, generator=gen)
        drop = torch.rand(args.batch, generator=gen) < 0.1
        rng = random.Random(f"finetune-captions/{args.seed}/{step}")
        drawn = [training_caption(attrs[i], rng, args.under_share) for i in idx.tolist()]
        ids = text.cached_ids(drawn)
        emb, pooled = text.encode_ids(torch.where(drop[:, None], empty[None], ids))
        mean = noise_means(drawn, [caps[i] for i in idx.tolist()], args.under_logit_mean)
        weight = None if diff is None else ts.shape_weights(diff[idx], args.difference_share)
        loss = ts.flow_step(tr, opt, params, pool[idx], emb, pooled, gen, mean, 1.0, weight)
        ts.ema_update(ema, tr, args.ema)
        if args.save_every and (step + 1) % args.save_every == 0 and step + 1 < args.steps:
            save_ema(pipe, ema, tr, f"{args.out}/step-{step + 1}")
        if step % 100 == 0 or step == args.steps - 1:
            print(json.dumps({"step": step, "loss": round(loss.item(), 5), "elapsed_s": round(time.time() - t0, 1)}),
                  flush=True)
    save_ema(pipe, ema, tr, args.out)
    print(json.dumps({"out": args.out, "steps": args.steps, "wall_s": round(time.time() - t0, 1),
                      "cpu_s": round(time.process_time() - c0, 1)}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
