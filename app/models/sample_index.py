"""What a run's samples/ folder holds, as a prompts x checkpoints table, and the provenance of each image.

Worker side (plain files, no widgets): `scan_samples(run_dir)` lists samples/teacher and
samples/iter_<N> (teacher first, then iterations ascending; `dmad sample` re-renders, <name>-r<K>,
right after their checkpoint) and reads each folder's meta.json and
the run's prompt_set.json, whose item order is the row order. Nothing is decoded here; a listing of
50 prompts x 20 checkpoints is ~1,000 directory entries (a few ms). Each image carries its size and
mtime, so a re-rendered image (same name) is seen as new and its thumbnail is redone.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from app.models.methods import label, read_method
from dmad.contract.jsonfile import read_json_or_problem
from dmad.contract.prompts import HEALTH_FILE_MARK
from dmad.contract.runs import SAMPLES_META, RunFolder

IMAGE_EXTS = (".png", ".jpg", ".jpeg", ".webp")
TEACHER = "teacher"
NO_PROMPT_SET = "no prompt_set.json"  # the index's prompt_note when the run has none
# teacher | iter_<N>, and `dmad sample`'s re-renders beside them: <name>-r2, -r3, ... (never replaced)
_FOLDER = re.compile(r"^(?:teacher|iter_(\d+))(?:-r(\d+))?$")


@dataclass(frozen=True)
class ImageFile:
    path: Path
    size: int
    mtime_ns: int


@dataclass(frozen=True)
class Checkpoint:
    name: str                                # "teacher", "iter_<N>", or a re-render "<that>-r<K>"
    images: dict[str, ImageFile]             # prompt id (file stem) -> image
    meta: dict = field(default_factory=dict)  # the folder's meta.json ({} when missing or corrupt)
    meta_note: str = ""                      # why meta is empty: missing / unreadable meta.json


@dataclass(frozen=True)
class SamplesIndex:
    run_dir: Optional[Path]
    rows: tuple[str, ...]                    # prompt ids, prompt-set order, then ids only found on disk
    columns: tuple[Checkpoint, ...]
    prompt_set: dict = field(default_factory=dict)  # the run's prompt_set.json ({} when absent)
    prompt_note: str = ""
    method: str = ""                         # the run's distillation.method ("" when config.json is unreadable)

    def image(self, row: int, col: int) -> Optional[ImageFile]:
        return self.columns[col].images.get(self.rows[row])

    def image_count(self) -> int:
        return sum(len(c.images) for c in self.columns)


def checkpoint_order(name: str) -> tuple:
    """teacher, teacher-r2, ..., then iter_<N> by N, each followed by its re-renders; others last."""
    m = _FOLDER.match(name)
    if m is None:
        return (2, 0, 0, name)
    rerender = int(m.group(2)) if m.group(2) else 1
    return (0, 0, rerender, "") if m.group(1) is None else (1, int(m.group(1)), rerender, "")


def is_checkpoint_folder(name: str) -> bool:
    return _FOLDER.match(name) is not None


def checkpoint_of(name: str) -> str:
    """A sample folder's checkpoint, as `dmad sample --checkpoint` takes it: teacher | N."""
    m = _FOLDER.match(name)
    if m is None:
        raise ValueError(f"{name!r} is not a sample folder name (teacher, iter_<N>, with an optional -r<K>)")
    return TEACHER if m.group(1) is None else m.group(1)


def _read_json(path: Path, what: str) -> tuple[dict, str]:
    if not path.exists():
        return {}, f"no {what}"
    value, problem = read_json_or_problem(path)
    if problem:
        return {}, problem  # names the file: "meta.json is not valid JSON (line 1, column 3: ...)"
    if not isinstance(value, dict):
        return {}, f"{what} is not a JSON object"
    return value, ""


def _list_images(folder: Path) -> dict[str, ImageFile]:
    out = {}
    with os.scandir(folder) as it:
        for e in it:
            stem, ext = os.path.splitext(e.name)
            if HEALTH_FILE_MARK in stem:  # <id>~s<k>.png: a health seed, not a row of the grid
                continue
            if ext.lower() in IMAGE_EXTS and e.is_file():
                st = e.stat()
                out[stem] = ImageFile(Path(e.path), st.st_size, st.st_mtime_ns)
    return dict(sorted(out.items()))


def scan_samples(run_dir: Optional[Path]) -> SamplesIndex:
    if run_dir is None:
        return SamplesIndex(None, (), ())
    run_dir = Path(run_dir)
    run = RunFolder(run_dir)
    prompt_set, note = _read_json(run.prompt_set_json, run.prompt_set_json.name)
    root = run.samples_dir
    folders = sorted((p for p in root.iterdir() if p.is_dir() and is_checkpoint_folder(p.name)),
                     key=lambda p: checkpoint_order(p.name)) if root.is_dir() else []
    columns = []
    for folder in folders:
        meta, meta_note = _read_json(folder / SAMPLES_META, SAMPLES_META)
        columns.append(Checkpoint(folder.name, _list_images(folder), meta, meta_note))
    items = prompt_set.get("items") if isinstance(prompt_set.get("items"), list) else []
    rows = [str(it["id"]) for it in items if isinstance(it, dict) and isinstance(it.get("id"), str)]
    known = set(rows)
    extra = sorted({stem for c in columns for stem in c.images} - known)
    return SamplesIndex(run_dir, tuple(rows + extra), tuple(columns), prompt_set, note,
                        read_method(run.config_json) or "")


# ---------------------------------------------------------------- provenance

def _item(index: SamplesIndex, col: Checkpoint, prompt_id: str) -> tuple[dict, dict]:
    """(meta.json's entry for the image, prompt_set.json's item) for one prompt id; {} when absent."""
    items = col.meta.get("items")
    meta_item = items.get(prompt_id) if isinstance(items, dict) else None
    set_items = index.prompt_set.get("items") if isinstance(index.prompt_set.get("items"), list) else []
    set_item = next((it for it in set_items if isinstance(it, dict) and it.get("id") == prompt_id), {})
    return (meta_item if isinstance(meta_item, dict) else {}), set_item


def _inference(meta: dict) -> str:
    timesteps = meta.get("timesteps")
    if meta.get("model") == "student" or isinstance(timesteps, list):
        ts = ", ".join(str(t) for t in timesteps) if isinstance(timesteps, list) else "?"
        return f"student timesteps [{ts}] ({meta.get('steps', len(timesteps or []))} steps)"
    cfg = meta.get("cfg")
    return f"{meta.get('sampler', '?')}, {meta.get('steps', '?')} steps, CFG {cfg if cfg is not None else '-'}"


def provenance(index: SamplesIndex, row: int, col: int) -> list[tuple[str, str]]:
    """(label, value) lines for one cell, from the checkpoint folder's meta.json. Without a usable
    meta.json the lines say so; the prompt then comes from the run's prompt_set.json, labelled."""
    c, prompt_id = index.columns[col], index.rows[row]
    meta_item, set_item = _item(index, c, prompt_id)
    image = c.images.get(prompt_id)
    lines = [("checkpoint", c.name + (f" ({c.meta['model']})" if c.meta.get("model") else ""))]
    method = c.meta.get("method") or index.method  # meta.json's word when it has one, else the run's config
    if method and checkpoint_of(c.name) != TEACHER:
        lines.append(("distilled by", label(method)))
    lines.append(("prompt id", prompt_id))
    if not c.meta:
        lines.append(("meta.json", f"samples/{c.name}: {c.meta_note or 'empty'}; provenance unknown"))
        if set_item.get("prompt"):
            lines.append(("prompt", f"{set_item['prompt']} (from the run's prompt_set.json)"))
    else:
        if "prompt" in meta_item:
            lines.append(("prompt", str(meta_item["prompt"])))
        elif not meta_item:
            lines.append(("meta.json", f"samples/{c.name}/meta.json has no entry for {prompt_id!r}"))
        if meta_item.get("negative_prompt"):
            lines.append(("negative prompt", str(meta_item["negative_prompt"])))
        lines.append(("prompt set", f"{c.meta.get('prompt_set', '?')} {c.meta.get('prompt_set_version', '?')}"))
        lines.append(("seed", str(meta_item.get("seed", "?"))))
        lines.append(("sampling", _inference(c.meta)))
        res = c.meta.get("resolution")
        lines.append(("resolution", f"{res[0]}x{res[1]} px" if isinstance(res, list) and len(res) == 2 else "?"))
        for key in ("weights_hash", "weights_sha256", "deterministic"):
            if key in c.meta:
                lines.append((key.replace("_", " "), str(c.meta[key])))
        for lora in teacher_loras(c.meta):  # the user's LoRAs fused into the teacher (identity.teacher_loras)
            lines.append(("teacher LoRA", f"{lora.get('path', '?')} at scale {lora.get('scale', '?')}, "
                                          f"sha256 {lora.get('sha256', '?')}"))
    lines.append(("file", str(image.path) if image else f"missing: samples/{c.name}/{prompt_id}.png"))
    return lines


def teacher_loras(meta: dict) -> list[dict]:
    """meta.json's teacher_loras (the user's LoRAs the teacher had), [] when absent or malformed."""
    loras = meta.get("teacher_loras")
    return [x for x in loras if isinstance(x, dict)] if isinstance(loras, list) else []


def column_title(c: Checkpoint) -> str:
    """The column's name; the teacher's says when it is base + the user's LoRAs."""
    n = len(teacher_loras(c.meta)) if checkpoint_of(c.name) == TEACHER else 0
    return f"{c.name} + {n} LoRA{'s' if n > 1 else ''}" if n else c.name


def provenance_text(index: SamplesIndex, row: int, col: int) -> str:
    return "\n".join(f"{label}: {value}" for label, value in provenance(index, row, col))
