"""What a checkpoint holds, and how it is written and read back exactly.

checkpoints/iter_<N>/
  student/                 full student: a diffusers UNet folder (config.json + safetensors),
                           loadable by UNet2DConditionModel.from_pretrained
  student_lora.safetensors LoRA student: the adapter's trainable weights (peft names)
  fake_score/ | fake_score_lora.safetensors      the same for the fake score
  ema.safetensors          the student's EMA (when EMA is on): shadow.<i>, in the order of the
                           student's trainable parameters
  the method's own files   its unit names them (dmad.methods: DMAD's gan_head.safetensors; the peer
                           method's EMA target); a method without a fake score saves none
  optimizer_generator.safetensors, optimizer_critic.safetensors, grad_scaler.json (fp16 only)
                           one per optimizer of the method (generator: the student's; critic: DMAD's
                           fake score + GAN head)
                           optimizer states as tensors + JSON (dmad.models.optim_state); checkpoints
                           of format 1 have optimizer_*.pt / grad_scaler.pt instead, torch.save files
                           read back with weights_only=True
  rng.safetensors          torch CPU/CUDA RNG states (training noise itself is per-sample, dmad.methods.noise)
  sharded/                 a resources.distributed fsdp run's sharded networks, EMA and optimizer
                           states (dmad.models.sharded_checkpoint: each rank's shards as safetensors,
                           index.json); what is there is absent above (the full student's folder,
                           fake_score/, gan_head.safetensors, ema.safetensors, optimizer_<name>)
  training_state.json      iteration, generator steps, data batches consumed, student timesteps,
                           lr schedulers, the config fingerprint

The folder is assembled under a temp name and renamed by RunFolder.commit_checkpoint, so a
kill at any moment leaves a complete checkpoint or none. Nothing here unpickles.
"""
from __future__ import annotations

import hashlib
import json
import pickle
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Optional

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from dmad.contract.regular import read_regular
from dmad.errors import CheckpointMismatch, CheckpointUnusable
from dmad.methods.unit import CheckpointLayout, Stepper, read_shadow
from dmad.models.optim_state import read_optimizer, read_scaler, save_optimizer, save_scaler
from dmad.models.sharded_checkpoint import (finite_on_every_rank, index_or_none, load_ema_sharded, load_network_sharded,
                                            load_optimizer_sharded, read_index, shard_files, sharded_networks,
                                            stored_shapes)
from dmad.models.teacher_files import ATTENTION, WITH_FF

FORMAT_VERSION = 2  # 1: optimizer states as torch.save .pt files (still read, weights_only=True)
READABLE_FORMATS = (1, 2)


def config_fingerprint(config: dict) -> str:
    return hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:16]


def _trainable_state(module: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().contiguous().cpu() for n, p in module.named_parameters() if p.requires_grad}


def save_network(module: nn.Module, out: Path, name: str, mode: str) -> None:
    """Full networks as a diffusers folder (users can load them as is); LoRA as adapter weights."""
    if mode == "full":
        module.save_pretrained(str(out / name), safe_serialization=True)
    else:
        save_file(_trainable_state(module), str(out / f"{name}_lora.safetensors"))


def load_network(module: nn.Module, ckpt: Path, name: str, mode: str) -> None:
    if mode == "full" and name in sharded_networks(ckpt):
        load_network_sharded(module, ckpt, name)
        bad = finite_on_every_rank(module.state_dict())
        if bad is not None:
            raise CheckpointUnusable(f"checkpoint {ckpt}: its {name} weights have NaN or Inf values ({bad[:80]})")
        return
    if mode == "full" and _is_sharded_module(module):
        raise CheckpointMismatch(f"checkpoint {ckpt} holds a whole {name} (trained with resources.distributed ddp); "
                                 f"this run shards it (fsdp): resume it with ddp, or start fresh")
    if mode == "full":
        files = sorted((ckpt / name).glob("*.safetensors"))
        if not files:
            raise CheckpointUnusable(f"checkpoint {ckpt} has no {name} weights (expected {ckpt / name}/*.safetensors)")
        state = {}
        for f in files:
            state.update(load_file(str(f)))
        _require_finite(state, ckpt, f"its {name} weights")
        module.load_state_dict(state, strict=True)
        return
    state = load_file(str(ckpt / f"{name}_lora.safetensors"))
    _require_finite(state, ckpt, f"its {name} LoRA weights")
    result = module.load_state_dict(state, strict=False)
    expected = {n for n, p in module.named_parameters() if p.requires_grad}
    if result.unexpected_keys or expected - set(state):
        raise CheckpointUnusable(f"checkpoint {ckpt}: {name} LoRA weights do not match this config "
                                 f"(lora_rank or targets changed?)")


def student_weight_files(ckpt: Path) -> list[Path]:
    """The files the student's sampling weights come from, in a fixed order: the full student's
    safetensors (or the LoRA adapter; a sharded checkpoint's shards), then ema.safetensors when
    the run kept an EMA (samples use the EMA weights). What meta.json's weights_sha256 covers."""
    if "student" in sharded_networks(ckpt):
        return shard_files(ckpt)
    files = sorted((ckpt / "student").glob("*.safetensors")) or sorted(ckpt.glob("student_lora.safetensors"))
    return files + ([ckpt / "ema.safetensors"] if (ckpt / "ema.safetensors").is_file() else [])


def _save_ema(ema, path: Path) -> None:
    tensors = {f"shadow.{i}": t.detach().contiguous().cpu() for i, t in enumerate(ema.shadow_params)}
    meta = {"decay": str(ema.decay), "optimization_step": str(ema.optimization_step)}
    save_file(tensors, str(path), metadata=meta)


def _load_ema(ema, path: Path) -> None:
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata()
        for i, t in enumerate(ema.shadow_params):
            t.copy_(f.get_tensor(f"shadow.{i}"))
    _require_finite({f"shadow.{i}": t for i, t in enumerate(ema.shadow_params)}, path.parent, "its EMA weights")
    ema.optimization_step = int(meta["optimization_step"])


def load_student(teacher, identity, ckpt: Path) -> tuple[nn.Module, bool]:
    """The checkpoint's student as it is sampled (training's validation samples, `dmad sample`,
    `dmad export`, the demo bench): a copy of the teacher's denoiser (dmad.models.teacher.Teacher), full or LoRA as identity.student
    says, with the checkpoint's weights, then its EMA weights when it has them. Eval mode, no
    grads. Returns (student, whether EMA weights were used)."""
    try:
        return _load_student(teacher, identity, ckpt)
    except CheckpointUnusable:
        raise
    except Exception as e:  # noqa: BLE001 - a file that does not fit this student: one reason, no traceback
        raise CheckpointUnusable(f"checkpoint {ckpt} does not fit this run's student: {type(e).__name__}: "
                                 f"{_first_line(e)}") from None


def _load_student(teacher, identity, ckpt: Path) -> tuple[nn.Module, bool]:
    from dmad.models.networks import make_trainable_copy, trainable_parameters

    student = make_trainable_copy(teacher.denoiser, identity.student, identity.lora_rank, identity.lora_alpha, False,
                                  teacher.family.lora_modules(identity.lora_targets))
    load_network(student, ckpt, "student", identity.student)
    ema = ckpt / "ema.safetensors"
    if _sharded_ema(ckpt):
        params = trainable_parameters(student)
        load_ema_sharded(params, ckpt)
        _require_finite({f"shadow.{i}": t for i, t in enumerate(params)}, ckpt, "its EMA weights")
        student.requires_grad_(False).eval()
        return student, True
    if ema.is_file():  # shadow.<i> follow trainable_parameters(student) (_save_ema)
        params = trainable_parameters(student)
        found = read_shadow(ema, params)
        if found is not None:
            raise CheckpointUnusable(f"{ema}: {found} EMA tensors for {len(params)} student parameters")
        _require_finite({f"shadow.{i}": t for i, t in enumerate(params)}, ckpt, "its EMA weights")
    student.requires_grad_(False).eval()
    return student, ema.is_file()


def _rng_state() -> dict[str, torch.Tensor]:
    # Training noise comes from per-sample generators (dmad.methods.noise) and needs no state; the global
    # RNGs are saved for anything else that draws (dropout in a user's model, say).
    state = {"torch_cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            state[f"torch_cuda_{i}"] = s
    return state


def _restore_rng(state: dict[str, torch.Tensor]) -> None:
    torch.set_rng_state(state["torch_cpu"])
    if torch.cuda.is_available():
        cuda = [state[k] for k in sorted(k for k in state if k.startswith("torch_cuda_"))]
        if len(cuda) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda)


@dataclass
class TrainingState:
    """The loop counters that, with the weights, optimizer and RNG states, make resume exact."""

    iter: int
    generator_steps: int
    batches_used: int
    student_timesteps: list[int]
    prediction_type: str
    config_fingerprint: str
    lr_generator: dict
    lr_critic: dict
    network_passes: dict = field(default_factory=dict)  # dmad.train.passes.PassCounter.state(); {} before 2026-12


def save_checkpoint(out: Path, layout: CheckpointLayout, *, modules: Mapping[str, nn.Module], ema: Optional[Any],
                    save_files: Callable[[Path], None], optimizers: Mapping[str, Stepper], scaler,
                    state: TrainingState, sharded: frozenset = frozenset()) -> None:
    """Write every file of a checkpoint into `out` (a fresh temp folder): the layout's networks
    (`modules` by name, unwrapped), the method's own files (save_files(out)), the EMA, the
    optimizers (their schedules in training_state.json), the grad scaler and the RNG states.
    `sharded`: what the ranks already wrote into out/sharded/ (network names, "ema",
    "optimizer_<name>"; dmad.models.sharded_checkpoint.save_sharded), skipped here."""
    for name, mode in layout.networks:
        if name not in sharded:
            save_network(modules[name], out, name, mode)
    save_files(out)
    if ema is not None and "ema" not in sharded:
        _save_ema(ema, out / "ema.safetensors")
    for name in layout.optimizers:
        if f"optimizer_{name}" not in sharded:
            save_optimizer(optimizers[name].opt, out / f"optimizer_{name}.safetensors")
    if scaler is not None:
        save_scaler(scaler, out / "grad_scaler.json")
    save_file(_rng_state(), str(out / "rng.safetensors"))
    doc = {"format_version": FORMAT_VERSION, **state.__dict__}
    for name in layout.optimizers:  # lr_generator, lr_critic ({} where the method has no such optimizer)
        doc[f"lr_{name}"] = _jsonable(optimizers[name].sched.state_dict())
    (out / "training_state.json").write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")


def _jsonable(d: dict) -> dict:
    # LambdaLR keeps its lambdas out of state_dict ("lr_lambdas": [None]); the rest is numbers.
    return json.loads(json.dumps(d, default=lambda o: None))


_STATE_TYPES = {"iter": int, "generator_steps": int, "batches_used": int, "student_timesteps": list,
                "prediction_type": str, "config_fingerprint": str, "lr_generator": dict, "lr_critic": dict}
_OPTIONAL_STATE = {"network_passes": dict}  # absent in checkpoints written before it was counted


def read_training_state(ckpt: Path) -> TrainingState:
    """training_state.json, every field of the type it must have (CheckpointUnusable otherwise)."""
    path = ckpt / "training_state.json"
    try:
        doc = json.loads(read_regular(path).decode("utf-8"))  # a FIFO there: refused, never waited on
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:
        raise CheckpointUnusable(f"checkpoint {ckpt} is not readable: {path.name}: {_first_line(e)}") from None
    if not isinstance(doc, dict):
        raise CheckpointUnusable(f"checkpoint {ckpt}: {path.name} is not a JSON object")
    if doc.get("format_version") not in READABLE_FORMATS:
        raise CheckpointUnusable(f"checkpoint {ckpt}: format_version {doc.get('format_version')!r} is not supported")
    doc = {k: v for k, v in doc.items() if k != "format_version"}
    if not set(_STATE_TYPES) <= set(doc) <= set(_STATE_TYPES) | set(_OPTIONAL_STATE):
        raise CheckpointUnusable(f"checkpoint {ckpt}: {path.name} has fields {sorted(doc)}, expected {sorted(_STATE_TYPES)}"
                                 f" (and optionally {sorted(_OPTIONAL_STATE)})")
    for k, kind in _OPTIONAL_STATE.items():
        if k in doc and not isinstance(doc[k], kind):
            raise CheckpointUnusable(f"checkpoint {ckpt}: {path.name}: {k} must be a {kind.__name__}")
    for k, kind in _STATE_TYPES.items():
        v = doc[k]
        ok = isinstance(v, kind) and not isinstance(v, bool) and (kind is not int or v >= 0)
        if kind is list:
            ok = ok and all(isinstance(t, int) and not isinstance(t, bool) for t in v)
        if not ok:
            raise CheckpointUnusable(f"checkpoint {ckpt}: {path.name}: {k} must be a{'n' if kind is int else ''} "
                                     f"{kind.__name__}{' >= 0' if kind is int else ''}, got {json.dumps(v)[:60]}")
    _check_ranges(ckpt, path.name, doc)
    return TrainingState(**doc)


def _check_ranges(ckpt: Path, name: str, doc: dict) -> None:
    """Counters a run could have reached: the iteration its folder is named for (iter_<N>) and
    within max_train_steps' bound, at most one generator step and one accumulation's batches per
    iteration. A value beyond them (batches_used 10**30 would be skipped through for hours; an
    iter of 999 in iter_4 would end the run at once) makes the checkpoint unusable."""
    from dmad.contract.config import field_most

    named = ckpt.name[len("iter_"):] if ckpt.name.startswith("iter_") else ""
    most_iter = field_most("optimization", "max_train_steps")
    bounds = {"iter": (int(named) if named.isascii() and named.isdigit() else None, most_iter),
              "generator_steps": (None, doc["iter"]),
              "batches_used": (None, doc["iter"] * field_most("resources", "gradient_accumulation_steps"))}
    for key, (exact, most) in bounds.items():
        v = doc[key]
        if exact is not None and v != exact:
            raise CheckpointUnusable(f"checkpoint {ckpt}: {name}: {key} is {str(v)[:20]}, not the {exact} its "
                                     f"folder is named for")
        if most is not None and v > most:
            raise CheckpointUnusable(f"checkpoint {ckpt}: {name}: {key} {str(v)[:20]} is more than a run at "
                                     f"iteration {doc['iter']} can have reached (at most {most})")


def _require_finite(tensors: Mapping[str, torch.Tensor], ckpt: Path, what: str) -> None:
    """NaN or Inf weights make a checkpoint unusable: a resume would fail at its next iteration
    and a sample would be noise, so a resume of latest passes over it to an older one."""
    for key, t in tensors.items():
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise CheckpointUnusable(f"checkpoint {ckpt}: {what} has NaN or Inf values ({key[:80]})")


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:300]


def _require_inside(path: Path, ckpt: Path) -> None:
    """The file is there and, links followed, inside the checkpoint."""
    if not path.is_file():
        raise CheckpointUnusable(f"checkpoint {ckpt}: {path.relative_to(ckpt)} is missing")
    if not path.resolve().is_relative_to(ckpt.resolve()):
        raise CheckpointUnusable(f"checkpoint {ckpt}: {path.relative_to(ckpt)} links outside the checkpoint")


def _check_safetensors(path: Path, ckpt: Path) -> None:
    """Present, inside the checkpoint, and a whole safetensors file: the header parses and its
    tensors cover the file exactly (a truncated file fails here). Reads the header only."""
    from safetensors import safe_open

    _require_inside(path, ckpt)
    try:
        with safe_open(str(path), framework="pt") as f:
            f.keys()
    except Exception as e:  # noqa: BLE001 - SafetensorError and friends: the file is not usable
        raise CheckpointUnusable(f"checkpoint {ckpt}: {path.relative_to(ckpt)} is damaged: {_first_line(e)}") from None


def _load_plain(path: Path, ckpt: Path, mmap: bool = False) -> dict:
    """A torch.save'd state dict, read with weights_only=True: tensors, numbers, strings and
    containers only. A file that holds anything else is refused, never unpickled another way."""
    _require_inside(path, ckpt)
    try:
        state = torch.load(path, weights_only=True, map_location="cpu", mmap=mmap)
    except Exception as e:  # noqa: BLE001 - a truncated or garbled zip, or a refused pickle
        if isinstance(e, pickle.UnpicklingError) or "weights_only" in str(e):
            # torch's own message suggests weights_only=False: never pass that advice on
            raise CheckpointUnusable(f"checkpoint {ckpt}: {path.name} holds objects other than tensors and numbers; "
                                     f"it is refused, since loading it could run code from the file") from None
        raise CheckpointUnusable(f"checkpoint {ckpt}: {path.name} is damaged: {_first_line(e)}") from None
    if not isinstance(state, dict):
        raise CheckpointUnusable(f"checkpoint {ckpt}: {path.name} is not a state dict")
    return state


@dataclass(frozen=True)
class Expected:
    """What a config needs of a checkpoint it continues, beyond its files (check_fits)."""

    ema: bool  # distillation.ema_decay is set
    lora_rank: int  # identity.lora_rank, for the LoRA networks
    timesteps: list[int]  # the config's student timesteps
    lora_targets: str = ATTENTION  # identity.lora_targets


def verify_checkpoint(ckpt: Path, layout: CheckpointLayout, expected: Optional[Expected] = None) -> TrainingState:
    """Before a resume picks `ckpt`: every file load_checkpoint reads for `layout` (the config's
    method and network modes: dmad.methods.unit.Method.layout) is present, inside the checkpoint
    and whole (safetensors headers and coverage; optimizer states memory-mapped, so their tensors
    are not read), and training_state.json is well typed. Shapes are checked when the weights load
    (load_checkpoint). Raises CheckpointUnusable naming the first problem, or CheckpointMismatch
    when the checkpoint is whole but was trained in a way this config cannot continue (another
    method, and with `expected` the rest of check_fits)."""
    state = read_training_state(ckpt)
    _check_method(ckpt, layout)
    if expected is not None:
        _check_modes(ckpt, layout.networks)
    index = _verify_sharded(ckpt)
    in_shards = set(index["networks"]) if index else set()
    for name, mode in layout.networks:
        if mode == "full" and name in in_shards:
            continue
        files = sorted((ckpt / name).glob("*.safetensors")) if mode == "full" else [ckpt / f"{name}_lora.safetensors"]
        if not files:
            raise CheckpointUnusable(f"checkpoint {ckpt} has no {name} weights (expected {ckpt / name}/*.safetensors)")
        for f in files:
            _check_safetensors(f, ckpt)
    for name in ("rng.safetensors", *(() if _files_sharded(in_shards) else layout.files)):
        _check_safetensors(ckpt / name, ckpt)
    if (ckpt / "ema.safetensors").exists():
        _check_safetensors(ckpt / "ema.safetensors", ckpt)
    for name in layout.optimizers:
        if not (index and name in index["optimizers"]):
            _optimizer_state(ckpt, name, header_only=True)
    if expected is not None:
        check_fits(ckpt, state, layout, expected)
    return state


@dataclass(frozen=True)
class Picked:
    """The checkpoint a command uses, what it passed over to get there and what is left to fall
    back to should this one fail to load."""

    iteration: int
    path: Path
    skipped: tuple[str, ...] = ()  # newer checkpoints passed over, and why
    fallbacks: tuple[Path, ...] = ()  # older checkpoints, newest first


def pick_checkpoint(candidates: list[tuple[int, Path]], layout: CheckpointLayout, expected: Optional[Expected] = None,
                    finite: tuple[str, ...] = (), named: bool = False) -> Picked:
    """The first of `candidates` that verifies (verify_checkpoint; with `finite`, those networks'
    weights are also read and must hold no NaN or Inf): for "latest" the list is
    RunFolder.checkpoints_from_latest(), the rule resume, sample, export and the app share, and a
    damaged checkpoint is passed over for an older one. A checkpoint the user `named` (the only
    candidate) is used as it is or refused with its own reason. A CheckpointMismatch is raised at once: the run's older
    checkpoints were trained the same way."""
    skipped: list[str] = []
    for k, (it, ckpt) in enumerate(candidates):
        try:
            verify_checkpoint(ckpt, layout, expected)
            for name in finite:
                _check_finite_files(ckpt, name, dict(layout.networks)[name])
        except CheckpointMismatch:
            raise
        except CheckpointUnusable as e:
            if named:
                raise
            skipped.append(str(e))
            continue
        return Picked(it, ckpt, tuple(skipped), tuple(p for _, p in candidates[k + 1:]))
    if not candidates:
        raise CheckpointUnusable("no complete checkpoint")
    raise CheckpointUnusable(f"no usable checkpoint in {candidates[0][1].parent} ({len(candidates)} damaged; "
                             f"newest: {skipped[0]})")


def _check_finite_files(ckpt: Path, name: str, mode: str) -> None:
    """A network's weights (and the EMA of the student's) hold no NaN or Inf: read one tensor at a
    time, so a large model is checked without a second copy in memory."""
    from safetensors import safe_open

    if mode == "full" and name in sharded_networks(ckpt):
        prefixes = (f"{name}.",) + (("ema.shadow.",) if name == "student" else ())
        for f in shard_files(ckpt):  # each rank's shards, one tensor at a time
            with safe_open(str(f), framework="pt") as h:
                for key in h.keys():
                    if key.startswith(prefixes):
                        _require_finite({key: h.get_tensor(key)}, ckpt, f.relative_to(ckpt).as_posix())
        return
    files = sorted((ckpt / name).glob("*.safetensors")) if mode == "full" else [ckpt / f"{name}_lora.safetensors"]
    if name == "student" and (ckpt / "ema.safetensors").is_file():
        files.append(ckpt / "ema.safetensors")
    for f in files:
        with safe_open(str(f), framework="pt") as h:
            for key in h.keys():
                _require_finite({key: h.get_tensor(key)}, ckpt, f.relative_to(ckpt).as_posix())


def _check_method(ckpt: Path, layout: CheckpointLayout) -> None:
    """CheckpointMismatch when `ckpt` holds another method's own files and none of this one's."""
    from dmad.methods import UNITS

    if any((ckpt / f).exists() for f in layout.files) or _files_sharded(set(sharded_networks(ckpt))):
        return
    for unit in UNITS.values():
        if unit.info.name != layout.info.name and all((ckpt / f).exists() for f in unit.files):
            raise CheckpointMismatch(f"checkpoint {ckpt} is from {unit.info.a_run()} (distillation.method "
                                     f"{unit.info.name}); this config is method {layout.info.name}")


def check_fits(ckpt: Path, state: TrainingState, layout: CheckpointLayout, expected: Expected) -> None:
    """CheckpointMismatch when the config cannot continue this checkpoint: a full network where it
    has a LoRA (or the reverse), EMA asked for where it kept none, another LoRA rank, other
    student timesteps. Reads safetensors headers only."""
    _check_modes(ckpt, layout.networks)
    for name, mode in layout.networks:
        lora = ckpt / f"{name}_lora.safetensors"
        rank, scope = _lora_rank_and_scope(lora) if mode == "lora" and lora.exists() else (None, None)
        if rank is not None and rank != expected.lora_rank:
            raise CheckpointMismatch(f"checkpoint {ckpt}: its {name} LoRA has rank {rank}; this config has "
                                     f"identity.lora_rank {expected.lora_rank}")
        if scope is not None and scope != expected.lora_targets:
            raise CheckpointMismatch(f"checkpoint {ckpt}: its {name} LoRA adapts the {SCOPE_WORDS[scope]}; this "
                                     f"config has identity.lora_targets {expected.lora_targets}")
    if expected.ema and not (ckpt / "ema.safetensors").exists() and not _sharded_ema(ckpt):
        raise CheckpointMismatch(f"checkpoint {ckpt} has no EMA weights (it was trained without "
                                 f"distillation.ema_decay); this config sets distillation.ema_decay")
    if state.student_timesteps != list(expected.timesteps):
        raise CheckpointMismatch(f"checkpoint {ckpt} was trained with student timesteps {state.student_timesteps}; "
                                 f"this config asks for {list(expected.timesteps)} (distillation.student_steps / "
                                 f"student_timesteps)")


def _check_modes(ckpt: Path, networks) -> None:
    """A full network folder where the config trains a LoRA, or the reverse (before the file
    checks: the files are not missing, they are another kind)."""
    for name, mode in networks:
        full = (ckpt / name).is_dir() or name in sharded_networks(ckpt)
        lora = (ckpt / f"{name}_lora.safetensors").exists()
        if mode == "full" and lora and not full:
            raise CheckpointMismatch(f"checkpoint {ckpt} has a LoRA {name}; this config trains a full one "
                                     f"(identity.{name}: full)")
        if mode == "lora" and full and not lora:
            raise CheckpointMismatch(f"checkpoint {ckpt} has a full {name}; this config trains a LoRA "
                                     f"(identity.{name}: lora)")


SCOPE_WORDS = {ATTENTION: "attention projections only (identity.lora_targets attention)",
               WITH_FF: "feed-forward layers too (identity.lora_targets attention+ff)"}


def _lora_rank_and_scope(path: Path) -> tuple[Optional[int], Optional[str]]:
    """A LoRA adapter file's rank (the first dimension of its first lora_A weight: peft's [rank,
    in_features] layout) and identity.lora_targets ("attention+ff" when it adapts any family's
    feed-forward layers, Family.ff_lora_targets; else "attention"), from one read of its header;
    (None, None) when the file has no adapter or cannot be read (verify says why)."""
    from safetensors import safe_open

    from dmad.models.families import FAMILIES

    try:
        with safe_open(str(path), framework="pt") as f:
            keys = sorted(k for k in f.keys() if ".lora_A." in k)
            rank = f.get_slice(keys[0]).get_shape()[0] if keys else None
    except Exception:  # noqa: BLE001 - a damaged file: _check_safetensors names it
        return None, None
    if not keys:
        return None, None
    ff = {t for fam in FAMILIES.values() for t in fam.ff_lora_targets}
    modules = {k.split(".lora_A.")[0] for k in keys}
    wide = any(m == t or m.endswith("." + t) for m in modules for t in ff)
    return rank, WITH_FF if wide else ATTENTION


def _format(ckpt: Path) -> int:
    return 1 if (ckpt / "optimizer_generator.pt").exists() and not (ckpt / "optimizer_generator.safetensors").exists() \
        else 2


def _optimizer_state(ckpt: Path, name: str, header_only: bool = False) -> dict:
    """optimizer_<name>.safetensors (format 2), or the .pt file of a format 1 checkpoint."""
    if _format(ckpt) == 1:
        state = _load_plain(ckpt / f"optimizer_{name}.pt", ckpt, mmap=header_only)
    else:
        path = ckpt / f"optimizer_{name}.safetensors"
        _check_safetensors(path, ckpt)
        try:
            state = read_optimizer(path, tensors=not header_only)
        except Exception as e:  # noqa: BLE001 - metadata that is not ours
            raise CheckpointUnusable(f"checkpoint {ckpt}: {path.name} is damaged: {_first_line(e)}") from None
    if not header_only and isinstance(state.get("state"), dict):
        _require_finite({f"{i}.{k}": v for i, d in state["state"].items() if isinstance(d, dict)
                         for k, v in d.items() if isinstance(v, torch.Tensor)}, ckpt, f"its {name} optimizer state")
    return state


def _scaler_state(ckpt: Path) -> dict | None:
    if (ckpt / "grad_scaler.json").is_file():
        try:
            return read_scaler(ckpt / "grad_scaler.json")
        except (OSError, ValueError, RecursionError) as e:
            raise CheckpointUnusable(f"checkpoint {ckpt}: grad_scaler.json is damaged: {_first_line(e)}") from None
    if (ckpt / "grad_scaler.pt").is_file():
        return _load_plain(ckpt / "grad_scaler.pt", ckpt)
    return None


def load_checkpoint(ckpt: Path, layout: CheckpointLayout, *, modules: Mapping[str, nn.Module], ema: Optional[Any],
                    load_files: Callable[[Path], None], optimizers: Mapping[str, Stepper], scaler) -> TrainingState:
    """Restore everything save_checkpoint wrote, into already-built (unwrapped) networks. Any
    problem (a missing or damaged file, a shape or key that does not match these networks) is a
    CheckpointUnusable naming the checkpoint; a resume of 'latest' then tries an older one."""
    try:
        return _load_checkpoint(ckpt, layout, modules=modules, ema=ema, load_files=load_files, optimizers=optimizers,
                                scaler=scaler)
    except CheckpointUnusable:
        raise
    except Exception as e:  # noqa: BLE001 - every way a file can fail to fit: one reason, no traceback
        raise CheckpointUnusable(f"checkpoint {ckpt} does not fit this run: {type(e).__name__}: {_first_line(e)}") from None


def _load_checkpoint(ckpt: Path, layout: CheckpointLayout, *, modules, ema, load_files, optimizers,
                     scaler) -> TrainingState:
    # Preflight verified the files (verify_checkpoint); each load below fails on its own file anyway.
    state = read_training_state(ckpt)
    index = read_index(ckpt)
    in_shards = set(index["networks"]) if index else set()
    for name, mode in layout.networks:
        load_network(modules[name], ckpt, name, mode)
    if _files_sharded(in_shards):
        load_network(modules["gan_head"], ckpt, "gan_head", "full")
    else:
        load_files(ckpt)
    if ema is not None:
        if index and index.get("ema"):
            load_ema_sharded(ema.shadow_params, ckpt)
            ema.optimization_step = int(index["ema"]["optimization_step"])
        elif not (ckpt / "ema.safetensors").is_file():
            raise CheckpointUnusable(f"checkpoint {ckpt} has no EMA weights but this config has ema_decay set")
        else:
            _load_ema(ema, ckpt / "ema.safetensors")
    shapes = stored_shapes(ckpt) if index else {}
    for name in layout.optimizers:
        if index and name in index["optimizers"]:
            load_optimizer_sharded(optimizers[name].opt, ckpt, name, index, shapes)
        else:
            optimizers[name].opt.load_state_dict(_optimizer_state(ckpt, name))
    scaler_state = _scaler_state(ckpt)
    if scaler is not None and scaler_state is not None:
        scaler.load_state_dict(scaler_state)
    for name in layout.optimizers:
        optimizers[name].sched.load_state_dict(getattr(state, f"lr_{name}"))
    _restore_rng(load_file(str(ckpt / "rng.safetensors")))
    return state


def _is_sharded_module(module: nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(module, FSDPModule)


def _files_sharded(in_shards: set) -> bool:
    """DMAD's own file (gan_head.safetensors) is in the shards: its GAN head is sharded with a
    full fake score."""
    return "gan_head" in in_shards


def _sharded_ema(ckpt: Path) -> bool:
    index = index_or_none(ckpt)
    return bool(index and index.get("ema"))


def _verify_sharded(ckpt: Path) -> Optional[dict]:
    """The sharded part's index, every shard a whole safetensors file and every network it names
    present in them (headers only); None without a sharded part."""
    try:
        index = read_index(ckpt)
    except (OSError, ValueError, UnicodeDecodeError, RecursionError) as e:
        raise CheckpointUnusable(f"checkpoint {ckpt}: its sharded part is not readable: {_first_line(e)}") from None
    if index is None:
        return None
    files = shard_files(ckpt)
    if not files:
        raise CheckpointUnusable(f"checkpoint {ckpt} has no shards in sharded/")
    for f in files:
        _check_safetensors(f, ckpt)
    try:
        keys = stored_shapes(ckpt)
    except Exception as e:  # noqa: BLE001 - a header that is not DCP's
        raise CheckpointUnusable(f"checkpoint {ckpt}: its shards are damaged: {_first_line(e)}") from None
    for name in index["networks"]:
        if not any(k.startswith(f"{name}.") for k in keys):
            raise CheckpointUnusable(f"checkpoint {ckpt}: sharded/index.json names {name} but no shard holds it")
    return index
