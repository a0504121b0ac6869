"""The latent and text-embedding cache: each image is VAE-encoded and each
caption text-encoded once, then read back, and a cached entry can never be stale.

Keys. A latent is keyed by everything that decides it: the image file (absolute path, size,
mtime_ns), how it was fitted (bucket, resize size, crop box), the VAE's identity (a hash of its
config and every weight) and the dtype it ran in. A text embedding is keyed by the caption, the
text encoder's identity (config and weights) and the tokenizer's (class, vocabulary, length).
Changing the resolution, the bucket rules, the file or the model changes the key, so the old
entry is simply never asked for again.

What is stored: the VAE's posterior (mean and std, as the VAE returned them), not a sample: the
training loop draws the posterior sample with the same per-sample noise as without a cache, so a
run with the cache computes exactly what a run without it does. Files are safetensors (never a
pickle), written to a temp name and renamed into place: a kill leaves an entry complete or absent,
and two processes writing the same entry both write the same bytes.

Where: a dataset's `cache_dir`, else <cache root>/datasets/<id>-<hash of its folder>, with the
cache root $DMAD_CACHE_DIR, else $XDG_CACHE_HOME/dmad, else ~/.cache/dmad.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Optional

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from dmad.contract.paths import cache_root

CACHE_VERSION = 1
# config keys that say where or with which library version a model was loaded, not what it computes
_NOT_IDENTITY = {"_name_or_path", "_diffusers_version", "transformers_version", "_commit_hash", "torch_dtype",
                 "_use_default_values"}


def dataset_cache_dir(entry_id: str, root: Path, cache_dir: Optional[str]) -> Path:
    if cache_dir:
        return Path(cache_dir)
    tag = hashlib.blake2b(str(root).encode("utf-8"), digest_size=4).hexdigest()
    safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in entry_id)[:60]
    return cache_root() / "datasets" / f"{safe}-{tag}"


def module_identity(module: torch.nn.Module, extra: Any = None) -> str:
    """A hash of a model's class, config and every weight (names, dtypes, shapes, bytes): two
    models share it only when they compute the same function. ~1 s per GB of weights."""
    h = hashlib.blake2b(digest_size=16)
    config = getattr(module, "config", None)
    config = config.to_dict() if hasattr(config, "to_dict") else dict(config or {})
    h.update(type(module).__name__.encode())
    h.update(json.dumps(_jsonable(config), sort_keys=True, default=str).encode())
    h.update(json.dumps(_jsonable(extra), sort_keys=True, default=str).encode())
    for name, t in sorted(module.state_dict().items()):
        t = t.detach().to("cpu").contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def tokenizer_identity(tokenizer: Any) -> dict:
    """What decides a tokenizer's output, for the text key."""
    vocab = tokenizer.get_vocab()
    digest = hashlib.blake2b(json.dumps(sorted(vocab.items())).encode("utf-8"), digest_size=16).hexdigest()
    return {"class": type(tokenizer).__name__, "vocab": digest, "max_length": tokenizer.model_max_length}


def _jsonable(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items() if str(k) not in _NOT_IDENTITY}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    return x


def _digest(fields: dict) -> str:
    return hashlib.blake2b(json.dumps(fields, sort_keys=True).encode("utf-8"), digest_size=20).hexdigest()


def latent_key(image: Path, bucket: tuple[int, int], resize: tuple[int, int], box: tuple[int, int, int, int],
               vae_id: str, dtype: str) -> Optional[str]:
    """The key of one image's latent, or None when the file cannot be stat'ed (it is then loaded
    and reported as the loader finds it)."""
    try:
        st = os.stat(image)
    except OSError:
        return None
    return _digest({"v": CACHE_VERSION, "kind": "latent", "path": str(Path(image).resolve()), "size": st.st_size,
                    "mtime_ns": st.st_mtime_ns, "bucket": list(bucket), "resize": list(resize), "box": list(box),
                    "vae": vae_id, "dtype": dtype})


def text_key(caption: str, encoder_id: str, dtype: str) -> str:
    return _digest({"v": CACHE_VERSION, "kind": "text", "caption": caption, "encoder": encoder_id, "dtype": dtype})


class TensorCache:
    """Named tensors per key under `folder` (two-character fan-out), safetensors files written
    temp-then-rename. A missing, truncated or unreadable entry is a miss, never an error."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)

    def path(self, key: str) -> Path:
        return self.folder / key[:2] / f"{key}.safetensors"

    def get(self, key: Optional[str]) -> Optional[dict[str, torch.Tensor]]:
        if key is None:
            return None
        path = self.path(key)
        try:
            return load_file(str(path))
        except (OSError, SafetensorError, ValueError, RuntimeError):
            return None

    def put(self, key: str, tensors: dict[str, torch.Tensor], meta: Optional[dict[str, str]] = None) -> None:
        path = self.path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{key[:8]}-", suffix=".tmp", dir=path.parent)
        os.close(fd)
        try:
            save_file({k: v.detach().to("cpu").contiguous() for k, v in tensors.items()}, tmp, metadata=meta)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
