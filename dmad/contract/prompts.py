"""Prompt sets: the fixed prompts, seeds and resolution that every checkpoint is sampled with.

Torch-free (the app imports it). A prompt set is a versioned JSON file; a run keeps an immutable
copy as prompt_set.json, and samples are saved as samples/<iter>/<item id>.png, so item ids, the
set's name and its version must be safe file names on every OS. `steps`, `cfg` and `sampler`
describe the teacher reference images only: the student always samples with its own timesteps.
"""
from __future__ import annotations

import difflib
import json
import re
from pathlib import Path
from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from dmad.errors import UserInputError
from dmad.contract.jsonfile import printable, read_json_file
from dmad.contract.paths import resource

# Names follow the usual UI spellings; each maps to one diffusers scheduler class.
SAMPLERS = ("ddim", "ddpm", "pndm", "euler", "euler_a", "heun", "lms", "dpmpp_2m", "unipc")
_SAFE_CHARS = re.compile(r"[A-Za-z0-9._-]+")
_RESERVED = {"CON", "PRN", "AUX", "NUL"} | {f"{p}{i}" for p in ("COM", "LPT") for i in range(1, 10)}
_SEED = dict(ge=0, le=2**32 - 1)
MAX_HEALTH_SEEDS = 16
HEALTH_SEED_STRIDE = 1_000_003  # seed k of an item: (item seed + k * stride) mod 2**32
HEALTH_FILE_MARK = "~s"  # <id>~s<k>.png: '~' is never in an item id, so no id's file can be taken for one


def safe_name_problem(name: str) -> Optional[str]:
    """Why `name` cannot be a file name on Windows, macOS and Linux alike; None when it can."""
    if not name:
        return "must not be empty"
    if "/" in name or "\\" in name:
        return f"{name!r} must not contain a path separator"
    if ".." in name:
        return f"{name!r} must not contain '..'"
    if not _SAFE_CHARS.fullmatch(name):
        bad = "".join(sorted({c for c in name if not _SAFE_CHARS.fullmatch(c)}))
        return f"{name!r} may only use letters, digits, '.', '_' and '-' (found {bad!r})"
    if name.startswith(".") or name.endswith("."):  # hidden on Unix; Windows drops a trailing dot
        return f"{name!r} must not start or end with '.'"
    if name.split(".")[0].upper() in _RESERVED:
        return f"{name!r} is a reserved device name on Windows"
    if len(name) > 100:
        return f"{name!r} is longer than 100 characters"
    return None


def _safe(v: str) -> str:
    problem = safe_name_problem(v)
    if problem:
        raise ValueError(f"not a safe file name: {problem}")
    return v


class _Strict(BaseModel):
    # strict: "3" is not a seed and true is not a step count; a typo is an error, never a guess.
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class PromptItem(_Strict):
    id: str = Field(..., description="Sample file name stem: letters, digits, '.', '_', '-'.")
    topic: str = Field(..., min_length=1, max_length=200, description="What this prompt probes (groups prompts in the app).")
    prompt: str = Field(..., min_length=1, description="The text prompt.")
    negative_prompt: Optional[str] = Field(None, description="Negative prompt for the teacher's CFG; empty: none.")
    seed: Optional[int] = Field(None, **_SEED, description="Noise seed; empty: the set's seed + the item's index.")

    @field_validator("id")
    @classmethod
    def _id_safe(cls, v: str) -> str:
        return _safe(v)


class PromptSet(_Strict):
    prompt_set: str = Field(..., description="Name of the set (safe file name).")
    version: str = Field(..., description="Version of the set, e.g. v1 (safe file name). Change it when any prompt changes.")
    # list, not tuple: strict mode would refuse a JSON array for a tuple.
    resolution: list[int] = Field(..., min_length=2, max_length=2, description="[width, height] in pixels, multiples of 8.")
    seed: int = Field(0, **_SEED, description="Base noise seed: item i uses seed + i unless it sets its own.")
    sampler: Literal[SAMPLERS] = Field("ddim", description="Teacher reference sampler.")
    steps: int = Field(50, ge=1, le=1000, description="Teacher reference sampling steps.")
    cfg: float = Field(7.5, ge=0.0, le=100.0, description="Teacher reference classifier-free guidance scale.")
    health_seeds: int = Field(
        0, ge=0, le=MAX_HEALTH_SEEDS,
        description="Seeds per prompt for the run's health signals (diversity, colour, detail, distance to the "
                    "teacher): every validation and the teacher reference render each prompt at this many seeds "
                    "(the first is the grid image, the others <id>~s<k>.png). 0: no health signals.")
    items: list[PromptItem] = Field(..., min_length=1, description="The prompts, in display order.")

    @field_validator("prompt_set", "version")
    @classmethod
    def _names_safe(cls, v: str) -> str:
        return _safe(v)

    @field_validator("resolution")
    @classmethod
    def _multiple_of_8(cls, v: list[int]) -> list[int]:
        for side in v:
            if side < 8 or side % 8 or side > 8192:
                raise ValueError(f"each side must be a multiple of 8 in [8, 8192] (the VAE downsamples by 8); got {v}")
        return v

    @model_validator(mode="after")
    def _unique_ids(self) -> "PromptSet":
        """Ids name the PNG files (<id>.png): unique even ignoring case, since 'red' and 'RED' are
        one file on macOS's and Windows' file systems."""
        seen: dict[str, list[str]] = {}
        for it in self.items:
            seen.setdefault(it.id.casefold(), []).append(it.id)
        clashes = [ids for ids in seen.values() if len(ids) > 1]
        if clashes:
            same = [ids[0] for ids in clashes if len(set(ids)) == 1]
            cased = [" and ".join(repr(i) for i in dict.fromkeys(ids)) for ids in clashes if len(set(ids)) > 1]
            if same:
                raise ValueError(f"duplicate item ids: {', '.join(sorted(same))}")
            raise ValueError(f"item ids {cased[0]} differ only in case: they name one file on macOS and Windows")
        return self

    @property
    def name(self) -> str:
        return self.prompt_set

    @property
    def width(self) -> int:
        return self.resolution[0]

    @property
    def height(self) -> int:
        return self.resolution[1]


def _where(loc: tuple, raw: dict) -> tuple[str, str]:
    """('items', 2, 'prompt') -> ("items[2].prompt", " (item id 'cat')") so the user finds the item."""
    path = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc).lstrip(".") or "(top level)"
    items = raw.get("items")
    if len(loc) >= 3 and loc[0] == "items" and loc[2] != "id" and isinstance(items, list) and loc[1] < len(items):
        item_id = items[loc[1]].get("id") if isinstance(items[loc[1]], dict) else None
        if isinstance(item_id, str):
            return path, f" (item id {item_id!r})"
    return path, ""


def _one_line(e: ValidationError, raw: dict, source: str) -> str:
    errs = e.errors()
    err, more = errs[0], (f" (and {len(errs) - 1} more)" if len(errs) > 1 else "")
    where, note = _where(tuple(err["loc"]), raw)
    if err["type"] == "extra_forbidden":
        model = PromptItem if "items" in err["loc"][:-1] else PromptSet
        close = difflib.get_close_matches(str(err["loc"][-1]), list(model.model_fields), n=1)
        hint = f"; did you mean '{close[0]}'?" if close else f"; valid keys: {', '.join(model.model_fields)}"
        return f"{source}: unknown key '{where}'{note}{hint}{more}"
    if err["type"] == "missing":
        return f"{source}: missing required field '{where}'{note}{more}"
    if err["type"] == "too_short" and where == "items":
        return f"{source}: items: the set needs at least one item{more}"
    msg = err["msg"].removeprefix("Value error, ")
    got = err.get("input")
    text = json.dumps(got, default=str)
    text = f"{text[:60]}..." if len(text) > 60 else text
    shown = "" if isinstance(got, (dict, list)) or "got" in msg or "not a safe" in msg else f" (got {text})"
    return f"{source}: {where}{note}: {msg}{shown}{more}"


def validate_prompt_set(raw: object, source: str = "prompt set") -> PromptSet:
    """A parsed JSON value -> PromptSet, or UserInputError with one line naming `source`."""
    if not isinstance(raw, dict):
        raise UserInputError(f"{printable(source)}: a prompt set must be a JSON object, got {type(raw).__name__}")
    try:
        return PromptSet.model_validate(raw)
    except ValidationError as e:
        raise UserInputError(printable(_one_line(e, raw, source))) from None


def load_prompt_set(path: str | Path) -> PromptSet:
    """Read and validate a prompt set file. Raises UserInputError with one line naming the file."""
    p = Path(path)
    return validate_prompt_set(read_json_file(p, "prompt set"), str(p))


def default_prompt_set_path() -> Path:
    return resource("prompt_sets", "demo_v3.json")


def item_seed(ps: PromptSet, item: PromptItem | str) -> int:
    """The item's own seed, else the set's seed + the item's index (wrapped to 32 bits)."""
    item_id = item if isinstance(item, str) else item.id
    for i, it in enumerate(ps.items):
        if it.id == item_id:
            return it.seed if it.seed is not None else (ps.seed + i) % 2**32
    raise KeyError(f"prompt set {ps.prompt_set}-{ps.version} has no item {item_id!r}")


def health_seed_list(ps: PromptSet, item: PromptItem | str) -> list[int]:
    """The seeds an item renders with for the health signals: k = 0 .. health_seeds - 1 (k = 0 is
    the item's own seed, the grid image); just the item's seed when health_seeds is 0."""
    base = item_seed(ps, item)
    return [(base + k * HEALTH_SEED_STRIDE) % 2**32 for k in range(max(1, ps.health_seeds))]


def health_file_name(item_id: str, k: int) -> str:
    """The file of seed k of an item: <id>.png for k = 0 (the grid image), <id>~s<k>.png after."""
    return f"{item_id}.png" if k == 0 else f"{item_id}{HEALTH_FILE_MARK}{k}.png"


def to_json(ps: PromptSet) -> dict:
    """The file form: unset optional fields are left out, so load(to_json(ps)) == ps (health_seeds 0
    too: a set without health signals reads as it did before they existed)."""
    out = ps.model_dump(mode="json", exclude_none=True)
    if not out.get("health_seeds"):
        out.pop("health_seeds", None)
    return out


# --------------------------------------------------------------------------- versions

_VERSION_NUMBER = re.compile(r"v(\d+)")


def file_name(ps: PromptSet) -> str:
    """<name>_<version>.json, the shipped sets' naming (demo_v1.json)."""
    return f"{ps.prompt_set}_{ps.version}.json"


def find_versions(folder: str | Path, name: str) -> dict[str, tuple[Path, PromptSet]]:
    """{version: (file, set)} of every valid prompt set named `name` in `folder` (found by content,
    not file name, so a renamed file still counts). Unreadable or invalid files are skipped."""
    found: dict[str, tuple[Path, PromptSet]] = {}
    for f in sorted(Path(folder).glob("*.json")):
        try:
            ps = load_prompt_set(f)
        except UserInputError:
            continue
        if ps.prompt_set == name:
            found.setdefault(ps.version, (f, ps))
    return found


def _write_new_file(ps: PromptSet, folder: Path) -> Path:
    from dmad.contract.runs import atomic_write_text  # torch-free; imported late to keep this module light

    folder.mkdir(parents=True, exist_ok=True)
    path = folder / file_name(ps)
    if path.exists():
        raise UserInputError(f"{path} exists already; prompt set files are never overwritten")
    atomic_write_text(path, json.dumps(to_json(ps), indent=2, ensure_ascii=False) + "\n")
    return path


def save_prompt_set(raw: object, folder: str | Path) -> Path:
    """Save a set under its own name + version as <folder>/<name>_<version>.json. Versions are
    immutable: if that name + version exists in `folder` with other content, the save is refused
    (use save_new_version); with the same content the existing file is returned untouched."""
    ps = validate_prompt_set(raw)
    existing = find_versions(folder, ps.prompt_set).get(ps.version)
    if existing is not None:
        if existing[1] == ps:
            return existing[0]
        raise UserInputError(f"prompt set {ps.prompt_set}-{ps.version} already exists in {existing[0]} with other "
                             f"content; versions are immutable: save the edit as a new version")
    return _write_new_file(ps, Path(folder))


def next_version(versions: "list[str] | set[str] | dict[str, object]") -> str:
    """v<N+1> after the highest v<N> among `versions` (v2 after v1; v1 when there is none)."""
    numbers = [int(m.group(1)) for v in versions if (m := _VERSION_NUMBER.fullmatch(v))]
    n = max(numbers, default=0) + 1
    while f"v{n}" in versions:
        n += 1
    return f"v{n}"


def save_new_version(raw: object, folder: str | Path, taken: "set[str] | frozenset[str]" = frozenset()) -> Path:
    """Save an edited set as the next version of its name in `folder` (v2 after v1, ...), as a new
    file; every existing file stays byte-for-byte as it was. The version in `raw` is replaced, except
    when the name has no version in `folder` or `taken` yet (then it is kept). `taken`: versions of
    this name in use elsewhere (a run's own copy), so the new one comes after them too. When the
    content equals an existing version's (all fields but the version), that file is returned and
    nothing is written."""
    ps = validate_prompt_set(raw)
    versions = find_versions(folder, ps.prompt_set)
    for path, old in versions.values():
        if old.model_copy(update={"version": ps.version}) == ps:
            return path
    known = set(versions) | set(taken)
    if known:
        ps = ps.model_copy(update={"version": next_version(known)})
    return _write_new_file(ps, Path(folder))
