"""The config's paths checked as the user types, before Start: each exists and is the right kind.

The schema (config_doc.check) says whether a config is well formed; it never touches a file. The
engine's preflight reads the files when the run starts, ~15 s later (torch and diffusers import
first), and a GPU preset's placeholder `path/to/...` then fails with exit 2. These checks are the
file-system half of that preflight, done ahead: cheap stats and one `model_index.json` lookup, no
file is read. They run off the GUI thread (a network path can hang a stat; app.engine.background).
Each problem is one line that names the field and the path, keyed by the form's field.

What is checked (relative paths against the config's folder, as the engine resolves them):
- identity.pretrained_model_name_or_path: a diffusers pipeline folder (model_index.json) or one
  .safetensors file (pickle formats are refused, as the engine refuses them);
- identity.teacher_config_dir: a pipeline folder (model_index.json);
- identity.teacher_loras[i].path: a .safetensors file, or a diffusers LoRA folder holding one;
- identity.train_data_dir: a folder of captioned images or a dataset list (.json);
- observation.prompt_set: a .json file; observation.resume_from_checkpoint: a folder ("latest" is
  resolved by the engine).
identity.output_dir is not checked: the app puts runs in the Runs tab's folder (run_target.py).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Optional

from app.models.config_doc import Key
from dmad.contract.exports import LORA_WEIGHT_NAME
from dmad.contract.paths import PICKLE_SUFFIXES

PLACEHOLDER = "path/to/"  # the GPU presets' stand-in for the user's own model and data

Check = Callable[[Path], str]  # "" when the path is the right kind, else what it is instead


def _pipeline_folder(p: Path) -> str:
    if not p.is_dir():
        return "not a folder"
    return "" if (p / "model_index.json").is_file() else "not a diffusers pipeline folder (no model_index.json)"


def _safetensors_file(p: Path, otherwise: str) -> str:
    """A .safetensors file: "", a pickle: why it is refused, anything else: `otherwise`."""
    if p.suffix.lower() in PICKLE_SUFFIXES:
        return f"a pickle file ({p.suffix}): convert it to .safetensors (pickles are never loaded)"
    return "" if p.suffix.lower() == ".safetensors" else otherwise


def _teacher(p: Path) -> str:
    if p.is_dir():
        return _pipeline_folder(p)
    return _safetensors_file(p, "neither a pipeline folder nor a .safetensors file")


def _lora(p: Path) -> str:
    if p.is_dir():  # a diffusers LoRA folder, as the engine reads it (dmad.models.teacher_loras.lora_path)
        return "" if (p / LORA_WEIGHT_NAME).is_file() else f"a folder without {LORA_WEIGHT_NAME}"
    return _safetensors_file(p, "not a .safetensors file")


def _data(p: Path) -> str:
    if p.is_dir() or p.suffix.lower() == ".json":
        return ""
    return "neither a folder of captioned images nor a dataset list (.json)"


def _json_file(p: Path) -> str:
    if p.is_dir():
        return "a folder, not a .json file"
    return "" if p.suffix.lower() == ".json" else "not a .json file"


def _folder(p: Path) -> str:
    return "" if p.is_dir() else "not a folder"


# (group, field) -> what it must be, in words for the message, and its check
CHECKS: dict[Key, tuple[str, Check]] = {
    ("identity", "pretrained_model_name_or_path"): ("the teacher", _teacher),
    ("identity", "teacher_config_dir"): ("the teacher's configs", _pipeline_folder),
    ("identity", "train_data_dir"): ("the training data", _data),
    ("observation", "prompt_set"): ("the prompt set", _json_file),
    ("observation", "resume_from_checkpoint"): ("the checkpoint to resume", _folder),
}


def _resolve(value: str, base_dir: Path) -> Optional[Path]:
    try:
        return (Path(base_dir) / Path(value).expanduser()).resolve()
    except (OSError, RuntimeError, ValueError):  # the schema's own check words these
        return None


def check_path(key: Key, value: Any, base_dir: Path, what: str, kind: Check) -> str:
    """One field's problem as a line naming the field, or ""."""
    if not isinstance(value, str) or not value.strip() or value == "latest":
        return ""  # absent or empty: the schema says whether that is allowed
    where = ".".join(key)
    if PLACEHOLDER in value.replace("\\", "/"):
        return f"{where}: {value!r} is a placeholder: choose {what} on this machine"
    p = _resolve(value, base_dir)
    if p is None:
        return ""
    try:
        if not p.exists():
            return f"{where}: not found: {p}"
        problem = kind(p)
    except OSError as e:  # permission denied, a dead mount
        return f"{where}: cannot read {p} ({e.strerror or type(e).__name__})"
    return f"{where}: {p} is {problem}" if problem else ""


def path_problems(raw: dict, base_dir: Path) -> dict[Key, str]:
    """Every path field of `raw` that is missing or of the wrong kind, keyed by form field."""
    out: dict[Key, str] = {}
    for key, (what, kind) in CHECKS.items():
        group = raw.get(key[0]) if isinstance(raw, dict) else None
        value = group.get(key[1]) if isinstance(group, dict) else None
        line = check_path(key, value, base_dir, what, kind)
        if line:
            out[key] = line
    identity = raw.get("identity") if isinstance(raw, dict) else None
    loras = identity.get("teacher_loras") if isinstance(identity, dict) else None
    for i, lora in enumerate(loras if isinstance(loras, list) else []):
        value = lora.get("path") if isinstance(lora, dict) else None
        line = check_path(("identity", f"teacher_loras[{i}].path"), value, base_dir, "a LoRA file", _lora)
        if line:
            out.setdefault(("identity", "teacher_loras"), line)
    return out
