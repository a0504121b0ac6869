"""sha256 of weight files: what names the weights behind an image (meta.json weights_sha256) and
the user's LoRAs a teacher had (teacher_loras). Torch-free."""
from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Optional, Sequence


def sha256_files(paths: Sequence[Path]) -> Optional[str]:
    """sha256 over the bytes of `paths` in the given order (streamed, 1 MiB at a time: ~1 s per GB);
    None for no files."""
    if not paths:
        return None
    h = hashlib.sha256()
    for path in paths:
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()
