"""Config presets: the CPU demos (DMAD, and the peer method) and model configs named by the GPU
memory they target.

resources/configs/presets/index.json lists them (name, file, distillation method, and what the
settings were chosen for); each file is a plain engine config that `dmad train --config` reads as
it is. A preset opens as an untitled config whose relative paths mean what they mean beside its
file. The index says the method so the chooser can show it without reading every config (a test
checks that each file's distillation.method agrees).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from app.models.methods import LABELS, WHAT, short_name
from dmad.errors import UserInputError
from dmad.contract.jsonfile import read_json_file
from dmad.contract.paths import resource

INDEX = ("configs", "presets", "index.json")


@dataclass(frozen=True)
class Preset:
    name: str
    path: Path          # the config file; relative paths inside it are relative to path.parent
    description: str    # what it was chosen for: shown as the tooltip
    method: str         # distillation.method of its config (dmad.contract.methods.METHODS)

    def menu_text(self) -> str:
        """The chooser's line: the name and the method ("CPU demo · DMAD")."""
        return f"{self.name} \u00b7 {short_name(self.method)}"

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
