"""The demo's evaluator: a small CNN that reads every attribute of a shapes image back.

No Inception or CLIP weights can be fetched on the machines the demo must run on, so the demo
measures distillation with its own classifier, trained here on procedurally rendered real shapes
(dmad.demo.shapes) and shipped in resources/demo/evaluator/ (safetensors + config + training log +
held-out report). dmad.demo.metrics turns its outputs into prompt adherence, per-attribute
accuracy, Fréchet distance on its penultimate features and per-prompt diversity.

Data never overlaps: the shipped dataset (resources/demo/shapes) is shapes seed 0; the evaluator
trains on seed TRAIN_DATA_SEED and is scored on seed HELDOUT_DATA_SEED, both reserved for it. `seed` (init, batch order, augmentation) is separate from the data seeds.
Nor do the pixels: the evaluator trains only on renders of lattice parity TRAIN_PARITY (the parity
of the shape centre's x + y, dmad.demo.shapes.lattice_parity), and everything it is scored on or
compared against (its held-out set, the bench's real references: real_attrs_for_captions) has the
other parity, so no reference image is pixel-identical to a training image. (Before, 73% of the
references were: 64 px renders repeat, a large shape has about one pixel of play.)

    python -m dmad.demo.evaluator train --out resources/demo/evaluator [--seed 0]

reproduces the shipped files: bit-identical weights on the same machine and thread count
(oneDNN's reduction order depends on both), the same accuracies within a few images elsewhere.
Cost: ~0.1 s per step of 64 images on 2 CPU cores; the default 3000 steps took 281 s.
"""
from __future__ import annotations

import argparse
import io
import json
import math
import os
import platform
import sys
import time
from pathlib import Path
from typing import Callable, Optional

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from safetensors.torch import load_file, save
from torch import nn

from dmad.demo import shapes
from dmad.demo.metrics import ATTRIBUTES, adherence, evaluate_images, frechet_distance, parse_caption
from dmad.errors import UserInputError
from dmad.contract.paths import resource
from dmad.contract.runs import atomic_write_bytes, atomic_write_json, atomic_write_text

FORMAT = "dmad-shapes-evaluator"
FORMAT_VERSION = 1
IMAGE_SIZE = 64
TRAIN_DATA_SEED = 1_000_001  # shapes seeds reserved for the evaluator: never the shipped dataset's 0
HELDOUT_DATA_SEED = 1_000_002
# Lattice halves: what the evaluator learns from, and what it is scored and compared on. A large
# shape has about one pixel of play, so 72% of large renders are centred on even (x + y): the
# references keep that typical half; the evaluator learns from the shifted one.
TRAIN_PARITY, REFERENCE_PARITY = 1, 0
WIDTHS = (32, 64, 96, 64)  # 64 -> 32 -> 16 -> 8 -> 4 px; the last width keeps the flatten at 1024
FEATURE_DIM = 128


def vocabulary(style: bool = False) -> dict[str, list[str]]:
    """Attribute -> its values, in the order of the classifier's logits. With `style`, also how the
    shape is drawn (dmad.demo.shapes.STYLES): the style evaluator's extra head."""
    vocab = {"shape": list(shapes.SHAPES), "colour": list(shapes.COLOURS), "size": list(shapes.SIZES),
             "position": list(shapes.POSITIONS), "background": list(shapes.BACKGROUNDS)}
    return {**vocab, "style": list(shapes.STYLES)} if style else vocab


def default_path() -> Path:
    return resource("demo", "evaluator")


def style_evaluator_path() -> Path:
    """The style evaluator: the same network trained on plain and styled renders (every style of
    dmad.demo.shapes.STYLES), with a style head. It reads the demo style LoRA's samples (dmad.demo.make_lora); the bench's FD features stay
    the plain evaluator's."""
    return resource("demo", "style_evaluator")


def style_of(index: int, seed: int, share: float) -> str:
    """The style of training image `index` of the style evaluator: with probability `share` one of
    the styles other than plain (equally likely), a pure function of (index, seed)."""
    import random

    if share <= 0:
        return "plain"
    rng = random.Random(f"{shapes.GENERATOR}/style/{seed}/{index}")
    return rng.choice(shapes.STYLES[1:]) if rng.random() < share else "plain"


# ---------------------------------------------------------------- real images

def render_real_attrs(attrs: list[dict], size: int = IMAGE_SIZE) -> torch.Tensor:
    """(N, 3, size, size) uint8 renders of given attribute dicts."""
    pixels = np.stack([np.asarray(shapes.render(a, size)) for a in attrs])
    return torch.from_numpy(pixels).permute(0, 3, 1, 2).contiguous()


def render_real(indices, seed: int, size: int = IMAGE_SIZE) -> tuple[torch.Tensor, list[dict]]:
    """Images `indices` of the shapes dataset with `seed`: ((N, 3, size, size) uint8, attributes).
    ~0.06 ms per 64 px image."""
    attrs = [shapes.attributes_for(int(i), seed) for i in indices]
    return render_real_attrs(attrs, size), attrs


def indices_of_parity(n: int, seed: int, parity: int, start: int = 0) -> list[int]:
    """The first `n` indices from `start` of shapes seed `seed` whose image has lattice parity
    `parity` (about every other index; attributes only, nothing rendered)."""
    out, i = [], start
    while len(out) < n:
        if shapes.lattice_parity(shapes.attributes_for(i, seed)) == parity:
            out.append(i)
        i += 1
    return out


def real_attrs_for_captions(captions: list[str], per_caption: int, seed: int, first: int = 0,
                            parity: Optional[int] = REFERENCE_PARITY) -> list[dict]:
    """Attributes of `per_caption` real renders of each caption (caption-major), drawn from the
    data's distribution given what the caption states (dmad.demo.shapes.sample_given: the
    attributes it leaves out, and the shape's offset in its slot), seeded by (seed, caption index,
    k) for k in [first, first + per_caption), so disjoint k give other images. Only renders of
    lattice `parity` are kept (the reference half: never pixel-identical to the evaluator's
    training renders); None keeps every draw.

    The real reference of a conditional FD must share the samples' captions: renders of the bench's
    64 captions sit at FD 124 from renders of random captions, against 1.0 from other renders of
    the same 64 (measured at N = 512 on the shipped evaluator)."""
    import random

    out = []
    for i, cap in enumerate(captions):
        stated = parse_caption(cap)
        for k in range(first, first + per_caption):
            rng = random.Random(f"{shapes.GENERATOR}/real-for-caption/{seed}/{i}/{k}")
            while True:  # about two draws: half the offsets of a caption land on each parity
                attrs = shapes.sample_given(stated, rng)
                if parity is None or shapes.lattice_parity(attrs) == parity:
                    break
            out.append(attrs)
    return out


def to_unit(images: torch.Tensor) -> torch.Tensor:
    """uint8 [0, 255] -> float32 [-1, 1], the range of a diffusion pipeline's decoded output."""
    return images.float().div(127.5).sub(1.0)


def label_tensor(attrs: list[dict], vocab: dict[str, list[str]]) -> torch.Tensor:
    """(N, len(vocab)) long: the index of each attribute's value in `vocab` (a render without a
    style is plain)."""
    return torch.tensor([[vocab[k].index(a.get(k, "plain") if k == "style" else a[k]) for k in vocab]
                         for a in attrs], dtype=torch.long)


# ---------------------------------------------------------------- the network

def _block(c_in: int, c_out: int, kernel: int, stride: int) -> list[nn.Module]:
    return [nn.Conv2d(c_in, c_out, kernel, stride=stride, padding=1), nn.GroupNorm(8, c_out), nn.SiLU()]


class ShapesClassifier(nn.Module):
    """(B, 3, H, W) in [-1, 1] -> one logit vector per attribute, and FEATURE_DIM penultimate features.

    Strided 4x4 convolutions halve the side four times (64 -> 4 px) and the 4x4 map is flattened,
    not pooled, so where the shape is survives to the heads. GroupNorm rather than BatchNorm: no
    running statistics, so train and eval mode compute the same thing. ~0.41 M parameters."""

    def __init__(self, vocab: Optional[dict[str, list[str]]] = None, widths: tuple[int, ...] = WIDTHS,
                 feature_dim: int = FEATURE_DIM, image_size: int = IMAGE_SIZE):
        super().__init__()
        self.vocab = {k: list(v) for k, v in (vocab or vocabulary()).items()}
        self.widths, self.feature_dim, self.image_size = tuple(widths), feature_dim, image_size
        w1, w2, w3, w4 = widths
        self.trunk = nn.Sequential(*_block(3, w1, 4, 2), *_block(w1, w2, 4, 2), *_block(w2, w2, 3, 1),
                                   *_block(w2, w3, 4, 2), *_block(w3, w4, 4, 2), nn.Flatten())
        flat = w4 * (image_size // 16) ** 2
        self.neck = nn.Sequential(nn.Linear(flat, feature_dim), nn.SiLU())
        self.heads = nn.ModuleDict({k: nn.Linear(feature_dim, len(self.vocab[k])) for k in self.vocab})

    def _prepare(self, x: torch.Tensor) -> torch.Tensor:
        if x.ndim != 4 or x.shape[1] != 3:
            raise ValueError(f"expected images (B, 3, H, W) in [-1, 1], got shape {tuple(x.shape)}")
        x = x.to(dtype=self.neck[0].weight.dtype, device=self.neck[0].weight.device)
        if x.shape[-2:] != (self.image_size, self.image_size):
            # antialias: a 512 px sample shrunk without it would alias the shape's edges
            x = F.interpolate(x, size=(self.image_size, self.image_size), mode="bilinear",
                              align_corners=False, antialias=True)
        return x

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """(B, FEATURE_DIM) penultimate features (after the SiLU, the heads' input): what FD compares."""
        return self.neck(self.trunk(self._prepare(x)))

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return self.logits_from_features(self.features(x))

    def logits_from_features(self, feats: torch.Tensor) -> dict[str, torch.Tensor]:
        return {k: head(feats) for k, head in self.heads.items()}

    def decode(self, logits: dict[str, torch.Tensor]) -> list[dict]:
        """Logits -> one attribute dict per image (argmax per head)."""
        idx = {k: v.argmax(dim=1).tolist() for k, v in logits.items()}
        n = len(next(iter(idx.values())))
        return [{k: self.vocab[k][idx[k][i]] for k in self.vocab} for i in range(n)]

    @torch.no_grad()
    def predict(self, x: torch.Tensor) -> list[dict]:
        return self.decode(self(x))

    def architecture(self) -> dict:
        return {"class": type(self).__name__, "image_size": self.image_size, "widths": list(self.widths),
                "feature_dim": self.feature_dim, "parameters": sum(p.numel() for p in self.parameters()),
                "input": "RGB in [-1, 1]; other sizes are resized (bilinear, antialiased)"}


# ---------------------------------------------------------------- training

# Light on purpose: enough that a VAE's soft edges and grain do not flip a label, no more. Every
# invariance trained in is a difference FD stops seeing: a 1.5 px blur moves FD to 1.6x the
# real-vs-real floor with these settings, 1.45x with sigma up to 1.0 and noise up to 0.05, 2.2x with
# no augmentation (which then read JPEG-30 images less well). resources/demo/evaluator/README.md.
# Rounded corners (p_round): a latent autoencoder draws a small shape with crisp edges but rounded
# corners; the evaluator trained without it read 87 of 107 such small diamonds (a person reads
# them as diamonds) as crosses.
AUGMENT = {"p_round": 0.3, "round_sigma": [0.6, 1.4], "p_blur": 0.3, "blur_sigma": [0.3, 0.7], "p_noise": 0.5,
           "noise_std_max": 0.03, "gain": 0.04, "shift": 0.03}  # noise and shift in [-1, 1] units


def _gaussian_blur(x: torch.Tensor, sigma: float, radius: int = 2) -> torch.Tensor:
    t = torch.arange(-radius, radius + 1, dtype=x.dtype)
    k = torch.exp(-t ** 2 / (2 * sigma ** 2))
    k = k / k.sum()
    c = x.shape[1]
    x = F.pad(x, (radius, radius, radius, radius), mode="replicate")
    x = F.conv2d(x, k.view(1, 1, 1, -1).expand(c, 1, 1, -1), groups=c)
    return F.conv2d(x, k.view(1, 1, -1, 1).expand(c, 1, -1, 1), groups=c)


def round_corners(x: torch.Tensor, sigma: float) -> torch.Tensor:
    """A flat two-colour render (1, 3, H, W) in [-1, 1] with its shape's corners rounded (radius
    ~sigma px) and its edges kept nearly sharp: the shape's mask is blurred, then re-thresholded
    with a ramp ~sigma/2 px wide. Convex corners round off, concave ones fill in a little, outlines
    and areas stay. Pixel (0, 0) is background (shapes keep a margin inside their slot)."""
    bg = x[..., :1, :1]
    dist = (x - bg).abs().sum(1, keepdim=True)
    far = dist.flatten(1).argmax(1)
    fg = x.flatten(2)[..., far].view(1, 3, 1, 1)
    alpha = dist / (fg - bg).abs().sum(1, keepdim=True).clamp_min(1e-6)
    soft = _gaussian_blur(alpha, sigma, radius=max(2, math.ceil(3 * sigma)))
    alpha = ((soft - 0.5) * 3 + 0.5).clamp(0, 1)
    return bg + alpha * (fg - bg)


def augment(x: torch.Tensor, gen: torch.Generator, cfg: dict = AUGMENT,
            roundable: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Label-preserving corruptions like those of a VAE-decoded sample: rounded corners, soft
    edges, slight colour cast, grain. Small enough that no colour, background or shape changes
    name. x: (B, 3, H, W) clean renders. `roundable` (B,) bool: the images round_corners may take
    (two colours, pixel (0, 0) background: not a framed one); default all. The random draws are
    the same either way."""
    b = x.shape[0]
    rsigma = torch.empty(b).uniform_(*cfg["round_sigma"], generator=gen)
    rounded = torch.rand(b, generator=gen) < cfg["p_round"]
    if roundable is not None:
        rounded &= roundable
    for i in rounded.nonzero().flatten().tolist():
        x[i:i + 1] = round_corners(x[i:i + 1], float(rsigma[i]))
    sigma = torch.empty(b).uniform_(*cfg["blur_sigma"], generator=gen)
    blur = torch.rand(b, generator=gen) < cfg["p_blur"]
    for i in blur.nonzero().flatten().tolist():
        x[i:i + 1] = _gaussian_blur(x[i:i + 1], float(sigma[i]))
    gain = 1 + (torch.rand(b, 3, 1, 1, generator=gen) * 2 - 1) * cfg["gain"]
    shift = (torch.rand(b, 3, 1, 1, generator=gen) * 2 - 1) * cfg["shift"]
    std = torch.rand(b, 1, 1, 1, generator=gen) * cfg["noise_std_max"]
    std = std * (torch.rand(b, 1, 1, 1, generator=gen) < cfg["p_noise"])
    x = x * gain + shift + std * torch.randn(x.shape, generator=gen)
    return x.clamp(-1, 1)


def _lr_at(step: int, steps: int, lr: float, warmup: int) -> float:
    """Linear warmup, then cosine to zero."""
    if step < warmup:
        return lr * (step + 1) / warmup
    return lr * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup)))


@torch.no_grad()
def evaluate_heldout(model: ShapesClassifier, n: int, seed: int = HELDOUT_DATA_SEED,
                     batch_size: int = 500, style: str = "plain") -> dict:
    """Accuracy on `n` clean real renders of shapes seed `seed` of the reference lattice half (the
    first n such indices): pixel configurations the evaluator never trained on. `style`: how they
    are drawn; a model with a style head also gets "style_accuracy"."""
    preds, targets = [], []
    indices = indices_of_parity(n, seed, REFERENCE_PARITY)
    for start in range(0, n, batch_size):
        attrs = [{**shapes.attributes_for(int(i), seed), "style": style} for i in indices[start:start + batch_size]]
        preds += model.predict(to_unit(render_real_attrs(attrs)))
        targets += attrs
    report = adherence(preds, targets)
    if "style" in model.vocab:
        report["style_accuracy"] = float(np.mean([p["style"] == style for p in preds]))
    report["errors"] = [{"index": i, "caption": shapes.caption(t), "predicted": p}
                        for i, (p, t) in enumerate(zip(preds, targets))
                        if any(p[k] != t[k] for k in ATTRIBUTES)][:20]
    return report


def train_evaluator(out_dir, seed: int = 0, n_train: int = 200_000, n_val: int = 2000, steps: int = 3000,
                    batch_size: int = 64, lr: float = 2e-3, weight_decay: float = 0.01, warmup: int = 100,
                    log_every: int = 50, log: Callable[[str], None] = print, style_share: float = 0.0) -> dict:
    """Train the evaluator from scratch and write evaluator.safetensors, config.json,
    training_log.jsonl and report.json into out_dir (each atomically; report.json last).

    Training images are those of indices 0..n_train-1 of TRAIN_DATA_SEED whose lattice parity is
    TRAIN_PARITY (about half), visited in a seeded random order and rendered as needed (no pool in
    memory); the held-out set is n_val clean renders of HELDOUT_DATA_SEED of the other parity.
    Deterministic on the CPU for a given seed and thread count.

    `style_share` > 0 trains the style evaluator: that share of the training renders is outlined
    (style_of), and a style head learns which; its report adds the held-out renders outlined."""
    t0 = time.time()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    vocab = vocabulary(style=style_share > 0)
    gen = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)  # parameter init only; the caller's global RNG is left as it was
        model = ShapesClassifier(vocab)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    pool = torch.tensor([i for i in range(n_train)
                         if shapes.lattice_parity(shapes.attributes_for(i, TRAIN_DATA_SEED)) == TRAIN_PARITY])
    order, cursor, records = pool[torch.randperm(len(pool), generator=gen)], 0, []
    model.train()
    for step in range(steps):
        if cursor + batch_size > len(pool):  # next epoch: a fresh permutation
            order, cursor = pool[torch.randperm(len(pool), generator=gen)], 0
        batch = order[cursor:cursor + batch_size].tolist()
        attrs = [{**shapes.attributes_for(i, TRAIN_DATA_SEED), "style": style_of(i, TRAIN_DATA_SEED, style_share)}
                 for i in batch]
        images = render_real_attrs(attrs)
        cursor += batch_size
        roundable = torch.tensor(["frame" not in a["style"] for a in attrs])  # a frame is a third colour
        x, y = augment(to_unit(images), gen, roundable=roundable), label_tensor(attrs, vocab)
        logits = model(x)
        losses = {k: F.cross_entropy(logits[k], y[:, j]) for j, k in enumerate(vocab)}
        loss = sum(losses.values())
        for group in opt.param_groups:
            group["lr"] = _lr_at(step, steps, lr, warmup)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % log_every == 0 or step == steps - 1:
            right = torch.stack([logits[k].argmax(1) == y[:, j] for j, k in enumerate(vocab)], dim=1)
            records.append({"step": step, "loss": round(loss.item(), 6), "lr": opt.param_groups[0]["lr"],
                            **{f"loss_{k}": round(v.item(), 6) for k, v in losses.items()},
                            "batch_accuracy_all": round(right.all(dim=1).float().mean().item(), 4),
                            "elapsed_s": round(time.time() - t0, 2)})
            log(f"step {step:5d}/{steps}  loss {loss.item():.4f}  {time.time() - t0:6.1f} s")
    train_s = time.time() - t0
    model.eval()
    held = evaluate_heldout(model, n_val)
    styled = {s: evaluate_heldout(model, n_val, style=s) for s in shapes.STYLES[1:]} if style_share > 0 else {}
    settings = {"seed": seed, "n_train": n_train, "n_val": n_val, "steps": steps, "batch_size": batch_size,
                "optimizer": "AdamW", "lr": lr, "weight_decay": weight_decay, "warmup": warmup,
                "schedule": "linear warmup, cosine to 0", "augment": AUGMENT, "train_data_seed": TRAIN_DATA_SEED,
                "heldout_data_seed": HELDOUT_DATA_SEED, "generator": shapes.GENERATOR,
                "train_parity": TRAIN_PARITY, "reference_parity": REFERENCE_PARITY,
                **({"style_share": style_share} if style_share > 0 else {})}
    report = {"n": n_val, "seed": seed, "heldout_data_seed": HELDOUT_DATA_SEED,
              "per_attribute": held["per_attribute"], "all_attributes": held["all"], "errors": held["errors"],
              "train_time_s": round(train_s, 1), "wall_time_s": round(time.time() - t0, 1),
              "parameters": model.architecture()["parameters"], "torch": torch.__version__,
              "threads": torch.get_num_threads(), "cpu_count": os.cpu_count(), "python": platform.python_version(),
              "machine": platform.machine(), "system": platform.system()}
    if styled:
        report["style_accuracy_plain"] = held["style_accuracy"]
        for name, r in styled.items():
            report[name] = {"per_attribute": r["per_attribute"], "all_attributes": r["all"],
                            "style_accuracy": r["style_accuracy"], "errors": r["errors"]}
    _write_outputs(out, model, settings, records, report)
    log(f"held-out ({n_val}): all attributes {held['all']:.4f}; "
        + ", ".join(f"{k} {v:.4f}" for k, v in held["per_attribute"].items()) + f"; {train_s:.0f} s training")
    return report


def _write_outputs(out: Path, model: ShapesClassifier, settings: dict, records: list[dict], report: dict) -> None:
    tensors = {k: v.detach().float().contiguous() for k, v in model.state_dict().items()}
    atomic_write_bytes(out / "evaluator.safetensors", save(tensors, metadata={"format": FORMAT}))
    config = {"format": FORMAT, "format_version": FORMAT_VERSION, "architecture": model.architecture(),
              "vocab": model.vocab, "attributes": list(ATTRIBUTES),
              "features": f"{model.feature_dim}-d penultimate activations (after SiLU)", "training": settings}
    atomic_write_json(out / "config.json", config)
    atomic_write_text(out / "training_log.jsonl", "".join(json.dumps(r) + "\n" for r in records))
    atomic_write_json(out / "report.json", report)


# ---------------------------------------------------------------- what the metrics can see

def _jpeg(images: torch.Tensor, quality: int) -> torch.Tensor:
    out = []
    for img in images.permute(0, 2, 3, 1).numpy():
        buf = io.BytesIO()
        Image.fromarray(img).save(buf, format="JPEG", quality=quality)
        out.append(np.asarray(Image.open(buf).convert("RGB")))
    return torch.from_numpy(np.stack(out)).permute(0, 3, 1, 2)


def _centred(attrs: list[dict]) -> torch.Tensor:
    return render_real_attrs([{**a, "offset": [0.0, 0.0]} for a in attrs])


# name -> (uint8 images, attributes, generator) -> images in [-1, 1]
CORRUPTIONS = {
    "blur 0.7 px": lambda u, a, g: _gaussian_blur(to_unit(u), 0.7),
    "blur 1.5 px": lambda u, a, g: _gaussian_blur(to_unit(u), 1.5),
    "corners rounded 1.2 px": lambda u, a, g: torch.cat([round_corners(x[None], 1.2) for x in to_unit(u)]),
    "noise std 0.2": lambda u, a, g: (to_unit(u) + 0.2 * torch.randn(u.shape, generator=g)).clamp(-1, 1),
    "jpeg quality 30": lambda u, a, g: to_unit(_jpeg(u, 30)),
    "colours x0.9": lambda u, a, g: (to_unit(u) * 0.9).clamp(-1, 1),
    "no offsets (every shape centred in its slot)": lambda u, a, g: to_unit(_centred(a)),
}


@torch.no_grad()
def corruption_check(model: ShapesClassifier, n: int = 1000, seed: int = HELDOUT_DATA_SEED) -> dict:
    """Adherence and FD of corrupted real renders, FD as a multiple of the floor (FD between two
    disjoint clean sets of n): how much of each kind of damage the metrics notice. ~20 s at n=1000."""
    indices = indices_of_parity(2 * n, seed, REFERENCE_PARITY)
    images, attrs = render_real(indices[:n], seed)
    reference = model.features(to_unit(render_real(indices[n:], seed)[0]))
    captions, gen = [shapes.caption(a) for a in attrs], torch.Generator().manual_seed(0)
    floor = frechet_distance(model.features(to_unit(images)), reference)
    rows = {}
    for name, corrupt in {"none": lambda u, a, g: to_unit(u), **CORRUPTIONS}.items():
        result = evaluate_images(model, corrupt(images, attrs, gen), captions)
        fd = frechet_distance(result["features"], reference)
        rows[name] = {"adherence": result["adherence"]["all"], "fd": round(fd, 3), "fd_over_floor": round(fd / floor, 3)}
    return {"n": n, "seed": seed, "fd_floor": round(floor, 3), "corruptions": rows}


# ---------------------------------------------------------------- loading

def load_evaluator(path=None) -> ShapesClassifier:
    """The evaluator in `path` (default: the shipped resources/demo/evaluator), in eval mode, fp32,
    on the CPU. Safetensors only: no pickle is ever loaded."""
    folder = Path(path) if path is not None else default_path()
    cfg_path, weights = folder / "config.json", folder / "evaluator.safetensors"
    for f in (cfg_path, weights):
        if not f.is_file():
            raise UserInputError(f"evaluator file missing: {f} (python -m dmad.demo.evaluator train --out {folder})")
    cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    if cfg.get("format") != FORMAT or cfg.get("format_version") != FORMAT_VERSION:
        raise UserInputError(f"{cfg_path} is not a {FORMAT} v{FORMAT_VERSION} config")
    if cfg["vocab"] not in (vocabulary(), vocabulary(style=True)):
        raise UserInputError(f"the evaluator in {folder} was trained for other shapes attributes than "
                             f"dmad.demo.shapes now has; retrain it: python -m dmad.demo.evaluator train --out {folder}")
    arch = cfg["architecture"]
    model = ShapesClassifier(cfg["vocab"], tuple(arch["widths"]), arch["feature_dim"], arch["image_size"])
    model.load_state_dict(load_file(str(weights)), strict=True)
    return model.eval().requires_grad_(False)


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dmad.demo.evaluator", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train", help="train the evaluator and write its files")
    t.add_argument("--out", default=str(default_path()), help="output folder (default: the shipped one)")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--steps", type=int, default=3000)
    t.add_argument("--n-val", type=int, default=2000)
    t.add_argument("--style-share", type=float, default=0.0,
                   help="train the style evaluator: this share of renders styled, and a style head (2/3 ships)")
    c = sub.add_parser("check", help="adherence and FD under controlled corruptions of real renders")
    c.add_argument("--path", default=str(default_path()), help="evaluator folder (default: the shipped one)")
    c.add_argument("--n", type=int, default=1000)
    c.add_argument("--json", help="also write the result to this file")
    args = p.parse_args(argv)
    if args.command == "train":
        report = train_evaluator(args.out, seed=args.seed, steps=args.steps, n_val=args.n_val,
                                 log=lambda m: print(m, flush=True), style_share=args.style_share)
        print(json.dumps({k: report[k] for k in ("n", "all_attributes", "per_attribute", "wall_time_s")}))
        return 0
    result = corruption_check(load_evaluator(args.path), n=args.n)
    if args.json:
        atomic_write_json(args.json, result)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
