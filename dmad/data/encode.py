"""Images and captions to what the networks take: VAE posteriors and text embeddings, read from
the cache (dmad.data.latent_cache) when a run has one, encoded and stored when not. Training
(dmad.train.session) and `dmad cache` (dmad.data.cache_command) share these functions, so a warmed cache holds
exactly what training would have stored."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import torch


@dataclass
class Caches:
    """A run's latent and text caches (dmad.data.latent_cache.TensorCache), one folder per dataset,
    with the identities their keys use."""
    text_id: str
    dtype: str
    text: list
    latents: list
    memo: dict = field(default_factory=dict)  # recent text embeddings, in host memory
    counts: dict = field(default_factory=lambda: {"latent_hits": 0, "latent_encoded": 0, "text_hits": 0,
                                                  "text_encoded": 0})

    def remember(self, key: str, value: dict) -> None:
        if key in self.memo:
            return
        if len(self.memo) >= 1024:
            self.memo.pop(next(iter(self.memo)))
        self.memo[key] = value


@torch.no_grad()
def posteriors(batch: Any, vae: Any, device: torch.device, chunk: int,
               caches: Optional[Caches]) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean, std) float32 (B, C, h, w) of a dmad.data.loading.Batch: cached items as loaded, the others
    VAE-encoded `chunk` (vae_batch_size) at a time in the VAE's own dtype and, with caches, stored."""
    post: list[Any] = [None] * len(batch)
    for k, d in batch.cached.items():
        post[k] = (d["mean"], d["std"])
    for c in range(0, len(batch.miss), chunk):
        dist = vae.encode(batch.pixels[c:c + chunk].to(device, next(vae.parameters()).dtype)).latent_dist
        for j, k in enumerate(batch.miss[c:c + chunk]):
            post[k] = (dist.mean[j], dist.std[j])
            if caches is not None and batch.keys[k] is not None:
                caches.latents[batch.datasets[k]].put(batch.keys[k], {"mean": dist.mean[j], "std": dist.std[j]})
    if caches is not None:
        caches.counts["latent_hits"] += len(batch.cached)
        caches.counts["latent_encoded"] += len(batch.miss)
    mean = torch.stack([m.to(device).float() for m, _ in post])
    std = torch.stack([s.to(device).float() for _, s in post])
    return mean, std


@torch.no_grad()
def text_embeddings(captions: list[str], datasets: list[int], teacher: Any, device: torch.device,
                    caches: Optional[Caches]):
    """The text conditioning (a dmad.models.families.Cond: emb (B, L, D), and pooled (B, P) for
    SDXL / SD3 / Flux) of `captions` (dataset index of each in `datasets`: its cache), encoded by
    the teacher's family. A cache entry holds every tensor of one caption."""
    from dmad.models.families import Cond

    encode = teacher.family.encode
    if caches is None:
        return encode(teacher.modules, list(captions), device)
    from dmad.data.latent_cache import text_key

    keys = [text_key(cap, caches.text_id, caches.dtype) for cap in captions]
    found = [caches.memo.get(k) or caches.text[d].get(k) for k, d in zip(keys, datasets)]
    missing = [i for i, f in enumerate(found) if f is None]
    caches.counts["text_hits"] += len(found) - len(missing)
    caches.counts["text_encoded"] += len(missing)
    if missing:
        cond = encode(teacher.modules, [captions[i] for i in missing], device)
        for j, i in enumerate(missing):
            found[i] = cond.item(j)
            caches.text[datasets[i]].put(keys[i], found[i])
    for k, f in zip(keys, found):
        caches.remember(k, {n: v.to("cpu") for n, v in f.items()})
    return Cond.stack(found, device)


def _text_identity(teacher: Any) -> str:
    """Hash of every text encoder and tokenizer of the family, in order (SD: the one CLIP, keyed
    as before)."""
    from dmad.data.latent_cache import _digest, module_identity, tokenizer_identity

    fam = teacher.family
    ids = [module_identity(teacher.modules[e], tokenizer_identity(teacher.modules[tk]))
           for e, tk in zip(fam.text_encoders, fam.tokenizers) if teacher.modules.get(e) is not None]
    return ids[0] if len(ids) == 1 else _digest({"family": fam.name, "encoders": ids})


def make_caches(dataset: Any, teacher: Any, dtype: torch.dtype) -> Caches:
    """The caches of a dmad.data.loading.MixedImages under this teacher: identities hashed from the VAE
    and text encoder weights as loaded (fp32, before any cast: the dtype is a key field of its
    own). Sets the dataset's latent lookup, so its loaders return cached posteriors."""
    from dmad.data.loading import LatentLookup
    from dmad.data.latent_cache import TensorCache, dataset_cache_dir, module_identity

    vae_id = module_identity(teacher.vae)
    text_id = _text_identity(teacher)
    dirs = [dataset_cache_dir(e.id, e.root, e.cache_dir) for e in dataset.entries]
    name = str(dtype).removeprefix("torch.")
    vae_dtype = "float32" if teacher.family.vae_fp32 else name  # SDXL's VAE always encodes in float32
    dataset.latents = LatentLookup(vae_id, vae_dtype, [TensorCache(d / "latents") for d in dirs])
    dataset.cache_dirs = dirs
    return Caches(text_id=text_id, dtype=name, text=[TensorCache(d / "text") for d in dirs],
                  latents=dataset.latents.caches)
