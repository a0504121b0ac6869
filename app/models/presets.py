"""Config presets: the CPU demos (DMAD, and the peer method) and model configs named by the GPU
memory they target.

resources/configs/presets/index.json lists them (name, file, distillation method, and what the
settings were chosen for); each file is a plain engine config that `dmad train --config` reads as
it is. A preset opens as an untitled config whose relative paths mean what they mean beside its
file. The index says the method so the chooser can show it without reading every config (a test
checks that each file's distillation.method agrees).

The user's own presets ("Save as preset…") live in the app's data folder, in the same layout: an
index.json and one config file each, written atomically with absolute paths (a preset means the same
wherever it is opened from). They are listed after the shipped ones and can be deleted; a shipped
preset cannot be replaced or deleted.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from app.models.methods import LABELS, WHAT, short_name
from dmad.errors import UserInputError
from dmad.contract.jsonfile import read_json_file
from dmad.contract.paths import resource
from dmad.contract.runs import atomic_write_json, atomic_write_text

INDEX = ("configs", "presets", "index.json")


@dataclass(frozen=True)
class Preset:
    name: str
    path: Path          # the config file; relative paths inside it are relative to path.parent
    description: str    # what it was chosen for: shown as the tooltip
    method: str         # distillation.method of its config (dmad.contract.methods.METHODS)
    user: bool = False  # one of the user's own (their data folder), not shipped

    def menu_text(self) -> str:
        """The chooser's line: the name and the method ("CPU demo · DMAD")."""
        return f"{self.name} \u00b7 {short_name(self.method)}"

    def tooltip_for_user(self) -> str:
        return self.tooltip() + "\n\nYour own preset: " + str(self.path)

    def tooltip(self) -> str:
        return f"Method: {LABELS[self.method]}, {WHAT[self.method]}.\n\n{self.description}"

    def load_raw(self) -> dict:
        """The preset's config as written (not validated: the panel shows the engine's verdict)."""
        raw = read_json_file(self.path, "config")
        if not isinstance(raw, dict):
            raise UserInputError(f"{self.path}: the config must be a JSON object, got {type(raw).__name__}")
        return raw


def index_path() -> Path:
    return resource(*INDEX)


def presets(index: Path | None = None) -> list[Preset]:
    """The presets in index order. Raises UserInputError (one line) for a broken index."""
    index = index or index_path()
    data = read_json_file(index, "preset index")
    try:
        found = [Preset(name=e["name"], path=(index.parent / e["file"]).resolve(), description=e["description"],
                        method=e["method"]) for e in data["presets"]]
    except (KeyError, TypeError) as e:
        raise UserInputError(f"{index}: each preset needs name, file, description and method "
                             f"({e!r} is wrong)") from None
    for p in found:
        if p.method not in LABELS:
            raise UserInputError(f"{index}: preset {p.name!r} has method {p.method!r}; "
                                 f"expected one of {', '.join(LABELS)}")
    return found


# ------------------------------------------------------------------ the user's own presets

MAX_NAME = 80
USER_INDEX = "index.json"


def user_presets(folder: Path) -> tuple[list[Preset], str]:
    """(the user's presets in `folder`, one line when its index could not be read or ""): a missing
    folder is no presets; a broken index is said, never raised (the shipped presets still load)."""
    index = Path(folder) / USER_INDEX
    if not index.exists():
        return [], ""
    try:
        found = presets(index)
    except UserInputError as e:
        return [], f"your presets could not be read: {e}"
    return [Preset(p.name, p.path, p.description, p.method, user=True) for p in found], ""


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-.").lower()[:40] or "preset"


def check_preset_name(name: str, shipped: list[Preset]) -> str:
    """Why `name` cannot name a new preset ("" when it can)."""
    name = name.strip()
    if not name:
        return "a preset needs a name"
    if len(name) > MAX_NAME:
        return f"a preset's name has at most {MAX_NAME} characters"
    if any(p.name == name for p in shipped):
        return f"{name!r} is a shipped preset: choose another name"
    return ""


def save_user_preset(folder: Path, name: str, description: str, raw: dict) -> Preset:
    """Write `raw` (a config with absolute paths) as the user's preset `name` (one of the same name
    is replaced); the index last, so a kill leaves the old list or the new one."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    mine, _ = user_presets(folder)
    name = name.strip()
    old = next((p for p in mine if p.name == name), None)
    taken = {p.path.name for p in mine if p is not old}
    stem, k, file = _slug(name), 1, None
    while file is None or file in taken:
        file = f"{stem}.json" if k == 1 else f"{stem}-{k}.json"
        k += 1
    method = str(((raw.get("distillation") or {}).get("method")) or "dmad")
    atomic_write_text(folder / file, json.dumps(raw, indent=2) + "\n")
    entries = [{"name": p.name, "file": p.path.name, "method": p.method, "description": p.description}
               for p in mine if p is not old]
    entries.append({"name": name, "file": file, "method": method if method in LABELS else "dmad",
                    "description": description.strip() or "Your own preset."})
    atomic_write_json(folder / USER_INDEX, {"about": "The user's own presets (DMAD Studio: Save as preset)",
                                            "presets": entries})
    if old is not None and old.path.name != file:
        old.path.unlink(missing_ok=True)
    return Preset(name, (folder / file).resolve(), entries[-1]["description"], entries[-1]["method"], user=True)


def delete_user_preset(folder: Path, name: str) -> Optional[Preset]:
    """Remove the user's preset `name` (the index first, then its file); None when there is none."""
    folder = Path(folder)
    mine, _ = user_presets(folder)
    gone = next((p for p in mine if p.name == name), None)
    if gone is None:
        return None
    entries = [{"name": p.name, "file": p.path.name, "method": p.method, "description": p.description}
               for p in mine if p is not gone]
    atomic_write_json(folder / USER_INDEX, {"about": "The user's own presets (DMAD Studio: Save as preset)",
                                            "presets": entries})
    gone.path.unlink(missing_ok=True)
    return gone
