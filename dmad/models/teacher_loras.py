"""The user's LoRAs on the teacher (identity.teacher_loras): base + LoRAs is the model the student
learns.

Each LoRA is read by diffusers' own loader (the family pipeline's `load_lora_weights`, with its
converters: diffusers, kohya / A1111 and the other layouts it knows), checked to fit the teacher,
weighted at its scale (`set_adapters`), then fused into the teacher's weights (`fuse_lora`) and the
adapter layers removed (`unload_lora_weights`). That happens once, in float32, right after the
teacher loads and before anything is copied from it. So:

- the real score, the student's initialisation and the fake score's (full copies, or adapters on
  the shared base) all see base + LoRAs, and so do the text encoders (training's text embeddings,
  the latent cache, whose keys hash the fused weights, and the samples);
- nothing is added per step: no adapter layers, no extra memory once loaded (the file's tensors
  are held only while loading);
- in float32 it computes what diffusers' unfused adapters compute, within float32 re-association
  (1.4e-5); in bf16 it is at bf16's own level for the bare teacher, while adapters kept in bf16
  measured a little closer (bench/teacher_loras.py, docs/benchmarks.md).

Checks, each one line (UserInputError): a missing file; a folder without
pytorch_lora_weights.safetensors; not .safetensors (pickle formats are refused, as everywhere);
no LoRA tensors in a layout diffusers reads (LoHa, LoKr, a full checkpoint); layers that match no
layer of this teacher (a LoRA for another family); shapes that do not fit (another model size or
text-encoder width). A scale must be finite (the config refuses it).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, Sequence

from dmad.contract.exports import LORA_WEIGHT_NAME
from dmad.contract.hashing import sha256_files
from dmad.contract.jsonfile import printable, read_json_or_problem
from dmad.errors import UserInputError

WHERE = "identity.teacher_loras"
# The down / A matrix of one LoRA layer, in every key layout diffusers' converters read or produce.
_DOWN = ("lora_A.", "lora.down.", "lora_down.", ".lora_linear_layer.down.")


def adapter_name(i: int) -> str:
    return f"user_lora_{i}"


def lora_path(path: str) -> Path:
    """Where a teacher_loras entry's tensors are: the file itself, or a diffusers LoRA folder's
    pytorch_lora_weights.safetensors (not checked)."""
    p = Path(path).expanduser()
    return p / LORA_WEIGHT_NAME if p.is_dir() else p


def lora_file(path: str, where: str) -> Path:
    """The .safetensors file of a teacher_loras entry (a file, or a diffusers LoRA folder), checked
    readable (its header parses and the file is as long as the header says) and holding LoRA layers."""
    from dmad.models.teacher_files import read_safetensors_header

    p = lora_path(path)
    if p.parent == Path(path).expanduser() and not p.is_file():
        raise UserInputError(f"{where}: {printable(str(p.parent))} is a folder without {LORA_WEIGHT_NAME}")
    if not p.exists():
        raise UserInputError(f"{where}: {printable(str(p))}: no such file")
    if p.suffix.lower() != ".safetensors":
        raise UserInputError(f"{where}: {printable(str(p))}: not a .safetensors file (pickle formats such as .ckpt, .pt "
                             f"and .bin are refused: they can run code when read)")
    try:
        header = read_safetensors_header(p)
    except UserInputError as e:  # unreadable, truncated: the header check's own words, placed
        raise UserInputError(f"{where}: {e}") from e
    if not any(_is_down(k) for k in header):
        raise UserInputError(f"{where}: {printable(str(p))}: no LoRA layers in a layout diffusers reads (diffusers or "
                             f"kohya / A1111 lora_down / lora_up; LoHa, LoKr and full checkpoints are not LoRAs it loads)")
    return p


def check_teacher_loras(loras: Sequence[Any]) -> None:
    """The entries' files, checked without loading a tensor (preflight, so the dry run too)."""
    for i, lora in enumerate(loras):
        lora_file(lora.path, f"{WHERE}[{i}].path")


def _is_down(key: str) -> bool:
    return key.endswith(".weight") and any(d in key for d in _DOWN)


def _adapter_layers(modules: Iterable[tuple[str, Any]], name: str) -> dict[str, int]:
    """{component: how many of its layers hold adapter `name`}."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    out = {}
    for comp, module in modules:
        n = sum(1 for m in module.modules() if isinstance(m, BaseTunerLayer) and name in getattr(m, "lora_A", {}))
        if n:
            out[comp] = n
    return out


def _pipeline(teacher: Any) -> tuple[Any, list[tuple[str, Any]]]:
    """The family pipeline on the teacher's own modules (diffusers' LoRA loader lives there), and its
    loaded LoRA-loadable components [(name, module)]."""
    pipe = teacher.family.pipeline(teacher.modules, teacher.scheduler)
    return pipe, [(c, getattr(pipe, c)) for c in pipe._lora_loadable_modules if getattr(pipe, c, None) is not None]


def apply_teacher_loras(teacher: Any, loras: Sequence[Any]) -> list[dict]:
    """Fuse `loras` (identity.teacher_loras entries) into the loaded float32 `teacher`, in order, at
    their scales. Returns what was applied, for the run folder's provenance: [{path, scale, sha256,
    layers: {component: n}}]."""
    import torch
    from safetensors import SafetensorError

    from dmad.models.families import quiet_pipeline_logs

    family = teacher.family
    pipe, loadable = _pipeline(teacher)
    names, records = [], []
    for i, lora in enumerate(loras):
        where = f"{WHERE}[{i}].path"
        f = lora_file(lora.path, where)
        name = adapter_name(i)
        try:
            converted = pipe.lora_state_dict(str(f))
            state = converted[0] if isinstance(converted, tuple) else converted
            expected = sum(1 for k in state if _is_down(k))
            with quiet_pipeline_logs():  # "no LoRA keys for the text encoder": a LoRA of the denoiser alone
                pipe.load_lora_weights(str(f.parent), weight_name=f.name, adapter_name=name)
        except (ValueError, RuntimeError, KeyError, IndexError, TypeError, AttributeError, SafetensorError) as e:
            first = (str(e).strip().splitlines() or [e.__class__.__name__])[0]
            raise UserInputError(f"{where}: {printable(str(f))} does not fit the {family.name} teacher "
                                 f"({e.__class__.__name__}: {printable(first)[:300]})") from e
        layers = _adapter_layers(loadable, name)
        found = sum(layers.values())
        if found == 0 or found < expected:
            raise UserInputError(f"{where}: {printable(str(f))}: {expected - found} of its {expected} LoRA layers match no "
                                 f"layer of the {family.name} teacher (a LoRA for another model?)")
        names.append(name)
        records.append({"path": str(f), "scale": float(lora.scale), "sha256": sha256_files([f]), "layers": layers})
    if not names:
        return []
    pipe.set_adapters(names, adapter_weights=[float(lora.scale) for lora in loras])
    with torch.no_grad():
        pipe.fuse_lora(components=[c for c, m in loadable if any(c in r["layers"] for r in records)], adapter_names=names)
        pipe.unload_lora_weights()
    for _, module in loadable:
        module.requires_grad_(False).eval()
    return records


def user_lora_layers(teacher: Any) -> dict[tuple[str, str], list[tuple[Any, Any]]]:
    """The LoRAs fused into `teacher` (teacher.loras) read again from their files, as diffusers loads
    them: {(component, module path): [(down, up with its scale multiplied in), ...]}, float32. Each is
    put on the teacher as an adapter, read, and removed unfused: the teacher's weights are not changed.
    For `dmad export --merge-user-loras`."""
    from peft.tuners.lora import LoraLayer

    from dmad.models.families import quiet_pipeline_logs

    pipe, loadable = _pipeline(teacher)
    names = []
    for i, record in enumerate(teacher.loras):
        f = Path(record["path"])
        with quiet_pipeline_logs():
            pipe.load_lora_weights(str(f.parent), weight_name=f.name, adapter_name=f"merge_{i}")
        names.append(f"merge_{i}")
    if not names:
        return {}
    pipe.set_adapters(names, adapter_weights=[float(r["scale"]) for r in teacher.loras])
    out: dict[tuple[str, str], list[tuple[Any, Any]]] = {}
    for comp, module in loadable:
        for path, layer in module.named_modules():
            if not isinstance(layer, LoraLayer):
                continue
            for name in names:
                if name in layer.lora_A:
                    down = layer.lora_A[name].weight.detach().float().clone()
                    up = layer.lora_B[name].weight.detach().float() * float(layer.scaling[name])
                    out.setdefault((comp, path), []).append((down, up))
    pipe.unload_lora_weights()
    return out


def changes_since_start(teacher: Any, run_dir: Path) -> list[str]:
    """What differs between the LoRAs fused into `teacher` now and those the run at `run_dir` started
    with (its samples/teacher/meta.json records path, scale and sha256): one line each, [] when the
    same or when the run has no such record. A resume warns with them, as with a changed config."""
    meta, _ = read_json_or_problem(run_dir / "samples" / "teacher" / "meta.json")  # a FIFO there is not waited on
    recorded = meta.get("teacher_loras") if isinstance(meta, dict) else None
    if not isinstance(recorded, list):
        return []
    then = [(x.get("sha256"), x.get("scale")) if isinstance(x, dict) else (None, None) for x in recorded]
    now = [(r["sha256"], r["scale"]) for r in teacher.loras]
    if len(then) != len(now):
        return [f"{WHERE}: the run started with {len(then)} teacher LoRA(s), the config now names {len(now)}: "
                f"the teacher is not the one it started with"]
    out = []
    for i, ((sha0, scale0), (sha1, scale1), record) in enumerate(zip(then, now, teacher.loras)):
        if sha0 != sha1:
            out.append(f"{WHERE}[{i}]: {printable(record['path'])} changed since the run started (sha256 now "
                       f"{sha1[:12]}..., the run's {str(sha0)[:12]}...): the teacher is not the one it started with")
        elif scale0 != scale1:
            out.append(f"{WHERE}[{i}]: scale {scale1:g}, the run started with {scale0}")
    return out
