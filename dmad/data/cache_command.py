"""`dmad cache --config FILE`: warm the latent and text-embedding cache of a run config ahead of
training, so the first iterations are not VAE-bound and a run that caches latents never encodes an
image twice.

It scans the datasets exactly as training does (the same usable items, buckets, crops), loads the
teacher's VAE and text encoder, and for every usable image reads its cached posterior or encodes
it, `vae_batch_size` images of one bucket per VAE call; every caption (each line of a
caption_lines 'random' file) likewise. Entries are keyed as in training (dmad.data.latent_cache), so a
warmed cache is exactly what training reads, and nothing already cached is encoded again.
Progress goes to stderr ("progress <done> <total>" with --progress), the summary to stdout.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Sequence

import torch

from dmad.contract.config import TrainConfig


def warm_cache(cfg: TrainConfig, progress: bool = False) -> dict:
    """Fill the cache of `cfg`'s datasets; the counts of what was found and encoded."""
    from dmad.data.loading import MixedImages, collate, load_datasets
    from dmad.data.encode import make_caches, posteriors, text_embeddings
    from dmad.models.teacher import load_identity_teacher, torch_dtype

    ident, res = cfg.identity, cfg.resources
    sets, groups = load_datasets(ident.train_data_dir, res.resolution, res.train_batch_size, 1)
    dataset = MixedImages(sets, groups, res.seed, ident.train_data_dir)
    # the denoiser is not needed (with teacher_loras it loads too: each LoRA is checked against it)
    teacher = load_identity_teacher(ident, dtype=torch.float32, components=("vae", "text_encoder"))
    dtype = torch_dtype(res.mixed_precision)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    caches = make_caches(dataset, teacher, dtype)
    for m in teacher.networks():  # the VAE and every text encoder, as training places them
        m.requires_grad_(False).eval().to(device, dtype=torch.float32 if m is teacher.vae and teacher.family.vae_fp32
                                          else dtype)
    total, done, skipped, t_last = len(dataset), 0, [], 0.0
    chunk = res.vae_batch_size
    for g in groups:
        for c in range(0, len(g.items), chunk):
            items = [dataset[i, 0] for i in g.items[c:c + chunk]]
            batch = collate(items)
            skipped += batch.skips
            posteriors(batch, teacher.vae, device, chunk, caches)
            captions, owners = [], []
            for i in g.items[c:c + chunk]:
                try:
                    found = dataset.all_captions(i)
                except (OSError, ValueError):  # reported through the item's skips
                    continue
                captions += found
                owners += [dataset.dataset_of[i]] * len(found)
            for t in range(0, len(captions), chunk):
                text_embeddings(captions[t:t + chunk], owners[t:t + chunk], teacher, device, caches)
            done += len(items)
            if progress and (time.monotonic() - t_last > 0.5 or done == total):
                print(f"progress {done} {total}", file=sys.stderr, flush=True)
                t_last = time.monotonic()
    return {**caches.counts, "images": total, "skipped": sorted({s.path for s in skipped}),
            "folders": [str(d) for d in dataset.cache_dirs]}


def main_cache(*, config: str | Path, overrides: Sequence[str] = (), progress: bool = False) -> int:
    """`dmad cache`: warm the cache of the config file `config` with its --set `overrides`; a
    summary line on stdout, "progress <done> <total>" lines on stderr when `progress`."""
    from dmad.contract.config import load_config

    cfg = load_config(config, list(overrides))
    counts = warm_cache(cfg, progress=progress)
    skipped = counts["skipped"]
    print(f"latents: {counts['latent_encoded']} encoded, {counts['latent_hits']} already cached; "
          f"captions: {counts['text_encoded']} encoded, {counts['text_hits']} already cached"
          + (f"; {len(skipped)} unreadable item(s) skipped (`dmad check-data` names them)" if skipped else "")
          + f"; in {', '.join(counts['folders'])}")
    return 0
