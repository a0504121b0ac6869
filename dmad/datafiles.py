"""Which files make a captioned image folder. Torch-free: preflight checks a folder before
torch is imported, and dmad.data reads the same pairs for training."""
from __future__ import annotations

from pathlib import Path

IMAGE_EXTS = (".png", ".jpg", ".jpeg", ".webp", ".bmp")


def images_in(folder: Path) -> list[Path]:
    """Image files at the top of `folder`, sorted by name."""
    return sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_EXTS and p.is_file())


def caption_of(image: Path) -> Path:
    return image.with_suffix(".txt")
