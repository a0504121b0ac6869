"""Which files make a captioned image folder. Torch-free: preflight checks a folder before
torch is imported, and dmad.data.loading reads the same pairs for training."""
from __future__ import annotations

from pathlib import Path

IMAGE_EXTS = (".png", ".jpg", ".jpeg", ".webp", ".bmp")


def images_in(folder: Path) -> list[Path]:
    """Image files at the top of `folder`, sorted by name."""
    return sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_EXTS and p.is_file())


def caption_of(image: Path) -> Path:
    return image.with_suffix(".txt")


def filename_caption(image: Path) -> str:
    """caption_strategy 'filename': the stem, with _ and - read as spaces."""
    return " ".join(image.stem.replace("_", " ").replace("-", " ").split())


def caption_lines(text: str) -> list[str]:
    """The non-empty lines of a caption, each with its whitespace runs made one space."""
    return [line for line in (" ".join(raw.split()) for raw in text.splitlines()) if line]


def normalize_caption(text: str, mode: str = "join", pick: int = 0) -> str:
    """The one-line caption training uses (documented in docs/datasets.md). join: every line,
    joined with single spaces (tabs and whitespace runs become one space); first: the first
    non-empty line; random: line `pick` modulo the number of lines (the caller draws `pick`)."""
    lines = caption_lines(text)
    if not lines:
        return ""
    if mode == "first":
        return lines[0]
    if mode == "random":
        return lines[pick % len(lines)]
    return " ".join(lines)
