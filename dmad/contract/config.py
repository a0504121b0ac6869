"""The run config: typed, grouped as users think of it, every field described and bounded.

Torch-free (the app imports it for form generation and validation as you type).
Field names follow diffusers' training scripts (train_batch_size, gradient_accumulation_steps,
checkpointing_steps, ...) and DMD2's reference code (real_guidance_scale) where such a name exists.
Unknown keys are errors (extra="forbid"), never silently ignored. Older files (config_version) are
brought up to date by migrate() before validation.
"""
from __future__ import annotations

import difflib
import json
from pathlib import Path
from typing import Annotated, Any, Literal, Optional, get_args, get_origin

from pydantic import AfterValidator, BaseModel, Field, ValidationError, field_validator, model_validator

from dmad.errors import UserInputError
from dmad.contract.group import Group
from dmad.contract.jsonfile import JsonSyntaxError, check_path, loads_json, path_problem, printable, read_json_file
from dmad.contract.methods import Distillation
from dmad.contract.paths import resources_dir

CONFIG_VERSION = 2  # migrate() brings older files up to it

# The floating-point formats weights and activations are held in: bytes per value and torch's dtype
# name (the one table; the ledger and the engine's casts read it). resources.mixed_precision names
# the format it computes in; resources.teacher_precision names one directly (or auto, int8, fp8).
FLOAT_FORMATS = {"fp32": (4, "float32"), "bf16": (2, "bfloat16"), "fp16": (2, "float16")}
COMPUTE_FORMAT = {"no": "fp32", "fp16": "fp16", "bf16": "bf16"}


def _usable_path(v: str) -> str:
    problem = path_problem(v)
    if problem:
        raise ValueError(problem)
    return v


# A path field: refused here (one line naming the field) when no OS call could take it, instead
# of a ValueError / ENAMETOOLONG deep in preflight.
PathStr = Annotated[str, AfterValidator(_usable_path)]


class TeacherLora(Group):
    """One of the user's LoRAs, applied to the frozen teacher at its scale."""

    path: PathStr = Field(..., min_length=1, description="A local LoRA .safetensors in any key layout diffusers' "
                                                         "load_lora_weights reads (diffusers, kohya / A1111), or a folder "
                                                         "holding pytorch_lora_weights.safetensors. Pickle formats are refused.")
    scale: float = Field(1.0, ge=-16.0, le=16.0, allow_inf_nan=False,
                         description="Its weight, as in set_adapters / a LoRA loader's strength (1.0: as trained).")


class Identity(Group):
    """What run: which teacher, which data, what kind of student."""

    run_name: Optional[str] = Field(
        None, min_length=1, max_length=200, pattern=r"^[A-Za-z0-9][A-Za-z0-9._+-]*$",
        description="Run folder name under output_dir. Empty: dmad_<YYYYMMDD-HHMM>_<dataset id>_<prompt set>-<version>.")
    output_dir: PathStr = Field("runs", min_length=1, description="Folder that holds the run folders.")
    pretrained_model_name_or_path: PathStr = Field(
        ..., min_length=1,
        description="The teacher: a local diffusers pipeline folder, or a single-file .safetensors checkpoint "
                    "(then teacher_config_dir gives its configs). Nothing is ever downloaded.")
    teacher_config_dir: Optional[PathStr] = Field(
        None, description="For a single-file teacher: a local diffusers pipeline folder whose configs and tokenizer describe it.")
    teacher_loras: list[TeacherLora] = Field(
        default_factory=list, max_length=16,
        description="The user's LoRAs on the teacher (base + LoRAs is what the student learns): each fused into the frozen "
                    "teacher's weights at its scale when it loads, so the real score, the student and the fake score all "
                    "start from base + LoRAs, at no memory or time per step. Empty: the bare teacher.")
    model_family: Literal["auto", "sd1", "sd2", "sdxl", "sd3", "flux"] = Field(
        "auto", description="Teacher family. auto: read from model_index.json. sd1/sd2: Stable Diffusion 1.x/2.x "
                            "(UNet + CLIP; epsilon or v-prediction); sdxl: SDXL (UNet + two CLIP encoders, pooled "
                            "embeddings, size/crop conditioning); sd3: Stable Diffusion 3.x (MMDiT transformer, flow "
                            "matching, true CFG); flux: FLUX.1 (transformer, flow matching, guidance embedding).")
    train_data_dir: PathStr = Field(
        ..., min_length=1, description="The training images: a captioned folder (each image with a .txt caption of the same "
                                       "stem), or a dataset list JSON (several folders mixed by weight, caption strategies, "
                                       "buckets and crops per folder: docs/datasets.md).")
    student: Literal["full", "lora"] = Field("full", description="Train all student weights, or a LoRA adapter on the teacher's.")
    fake_score: Literal["full", "lora"] = Field("full", description="Train all fake-score weights, or a LoRA adapter.")
    lora_rank: int = Field(64, ge=1, le=1024, description="LoRA rank (r) for LoRA students / fake scores.")
    lora_alpha: Optional[int] = Field(None, ge=1, le=4096, description="LoRA alpha; empty: equal to lora_rank.")
    lora_targets: Literal["attention", "attention+ff"] = Field(
        "attention", description="The layers a LoRA student and fake score adapt. attention: the attention "
                                 "projections (q, k, v, out; a transformer's joint-attention text projections too), as "
                                 "diffusers' LoRA scripts and DMD2. attention+ff: those and every transformer block's "
                                 "feed-forward layers (Flux: the single blocks' MLP input too): 1.8-2.2 times the "
                                 "adapter, and the layers a style LoRA usually changes as well.")


class Resources(Group):
    """Will it fit: precision, batch, resolution, memory savers."""

    mixed_precision: Literal["no", "fp16", "bf16"] = Field(
        "no", description="Autocast precision. Trainable weights stay fp32 (master weights); the frozen teacher is cast to it.")
    gradient_checkpointing: bool = Field(False, description="Recompute activations in backward (student and fake score): "
                                                            "less memory, ~30% slower.")
    teacher_precision: Literal["auto", "fp32", "bf16", "fp16", "int8", "fp8"] = Field(
        "auto", description="Weights of the frozen teacher denoiser. auto: the mixed_precision dtype (fp32 when "
                            "no). int8 / fp8: its linear layers stored weight-only in int8 or float8_e4m3fn with "
                            "per-channel scales (1 byte per weight), the rest in bf16, computing in bf16. The "
                            "student and fake score are copied from the full-precision teacher before it is cast.")
    share_frozen_base: bool = Field(
        True, description="With a LoRA student and a LoRA fake score: both adapters sit on the teacher's own frozen "
                          "denoiser (held once, in teacher_precision) instead of on two frozen copies of it. Same "
                          "numbers, a third of the frozen weights. false: separate copies. Full networks are always "
                          "their own copies.")
    teacher_cpu_offload: bool = Field(
        False, description="Keep the frozen teacher (denoiser and text encoders) in CPU memory and move each "
                           "network to the GPU only for its own calls: frees its weights from the GPU between "
                           "calls, at the cost of a host-to-device copy per call.")
    distributed: Literal["ddp", "fsdp"] = Field(
        "ddp", description="With several processes: ddp keeps a whole copy of every network on each GPU and averages "
                           "gradients (fastest while the model fits); fsdp shards the full student, the full fake score "
                           "and the GAN head over the processes per block (torch FSDP2: weights, gradients and "
                           "optimizer states divided by the number of processes) and saves sharded checkpoints. LoRA "
                           "networks stay replicated.")
    fsdp_shard_teacher: bool = Field(
        False, description="With fsdp: shard the frozen teacher's denoiser too (its weights divided by the number of "
                           "processes, gathered block by block for each call). Not with share_frozen_base, whose base "
                           "carries the LoRA adapters.")
    fsdp_cpu_offload: bool = Field(
        False, description="With fsdp: keep the sharded weights, gradients and optimizer states in CPU memory, the "
                           "optimizer stepping on the CPU; the GPU holds a block's gathered weights only while it "
                           "computes. Least GPU memory, much slower.")
    train_batch_size: int = Field(1, ge=1, le=4096, description="Images per process per micro-step.")
    gradient_accumulation_steps: int = Field(1, ge=1, le=1024, description="Micro-steps per optimizer step.")
    resolution: int = Field(512, ge=8, le=8192, description="Training and sampling side length in pixels (multiple of 8).")
    vae_batch_size: int = Field(4, ge=1, le=1024, description="Images per VAE encode call (training and `dmad cache`).")
    cache_latents: bool = Field(
        False, description="Encode each image (VAE) and caption (text encoder) once and read them back from a cache on "
                           "disk; `dmad cache` fills it ahead. Keyed by file, size, mtime, bucket and model identity: "
                           "never stale.")
    seed: int = Field(0, ge=0, le=2**32 - 1, description="Seed for weights init, data order and noise.")
    dataloader_num_workers: int = Field(0, ge=0, le=64, description="Data loading worker processes (0: in the main process).")

    @field_validator("resolution")
    @classmethod
    def _multiple_of_8(cls, v: int) -> int:
        if v % 8:
            raise ValueError(f"must be a multiple of 8 (the VAE downsamples by 8); got {v}, nearest {max(8, round(v / 8) * 8)}")
        return v


class Optimization(Group):
    """Will it learn: optimizers and schedules for the generator (student) and critic (fake score + GAN head)."""

    generator_lr: float = Field(1e-5, gt=0, le=1.0, description="Student learning rate.")
    critic_lr: float = Field(1e-5, gt=0, le=1.0, description="Fake score and GAN head learning rate.")
    optimizer: Literal["adamw", "adam", "sgd"] = Field("adamw", description="Optimizer for both networks.")
    adam_beta1: float = Field(0.0, ge=0.0, lt=1.0, description="Adam beta1 (DMD2 uses 0 for GAN stability).")
    adam_beta2: float = Field(0.999, ge=0.0, lt=1.0, description="Adam beta2.")
    adam_epsilon: float = Field(1e-8, gt=0, le=1.0, description="Adam epsilon.")
    adam_weight_decay: float = Field(0.01, ge=0.0, le=1.0, description="Decoupled weight decay (adamw).")
    max_grad_norm: float = Field(10.0, ge=0.0, le=1e6, description="Clip gradient norm per network; 0: no clipping.")
    lr_scheduler: Literal["constant", "constant_with_warmup", "linear", "cosine"] = Field(
        "constant_with_warmup", description="Learning-rate schedule (diffusers get_scheduler), stepped once per optimizer step.")
    lr_warmup_steps: int = Field(0, ge=0, le=10**7, description="Warm-up length in iterations (the critic's optimizer steps); the student, "
                                                             "stepping every K-th iteration, warms up over the same iterations.")
    max_train_steps: int = Field(1000, ge=1, le=10**8, description="Iterations (critic optimizer steps) to train.")


class Health(Group):
    """What the run's health signals do (they are computed when the prompt set has health_seeds)."""

    alerts: bool = Field(True, description="Raise an alert (a warning event, shown by the app) when a health signal "
                                           "crosses its threshold.")
    stop_on_alert: bool = Field(
        False, description="Stop the run after a validation that raised an alert, without a new checkpoint; the last "
                           "checkpoint that raised no alert is never removed by checkpoints_total_limit.")


class Observation(Group):
    """How we know it is learning: logging, checkpoints, validation samples, resume."""

    log_every_steps: int = Field(1, ge=1, le=10**6, description="One metrics.csv row and metric event every N iterations.")
    checkpointing_steps: int = Field(500, ge=1, le=10**8, description="Save a checkpoint every N iterations (and at the end).")
    checkpoints_total_limit: Optional[int] = Field(
        None, ge=1, le=10**6, description="Keep at most this many checkpoints (oldest removed); empty: keep all.")
    validation_steps: Optional[int] = Field(
        None, ge=1, le=10**8, description="Render the prompt set with the student every N iterations; empty: only at checkpoints.")
    prompt_set: Optional[PathStr] = Field(None, description="Prompt set file (JSON); empty: the built-in demo prompt set.")
    resume_from_checkpoint: Optional[PathStr] = Field(
        None, description="'latest' or a checkpoint folder to resume from; empty: start fresh.")
    gpu_mem_interval_s: float = Field(5.0, gt=0.0, le=3600.0, description="Seconds between device-wide memory samples (gpu_mem.csv).")
    report_to: Literal["none", "tensorboard", "wandb"] = Field(
        "none", description="Also send every metrics.csv row and the health signals to an experiment tracker (through "
                            "accelerate, as diffusers' training scripts do); the run folder's own files stay the "
                            "record. tensorboard: event files in <run>/logs/tensorboard. wandb: under <run>/logs/wandb, "
                            "offline (nothing sent) unless wandb is set up on this machine (WANDB_MODE, WANDB_API_KEY "
                            "or `wandb login`). Needs that package installed (pip install tensorboard / wandb). none: "
                            "only the run folder's files.")
    health: Health = Field(default_factory=Health, description="Health signals' alerts (the prompt set's health_seeds "
                                                               "turns the signals on).")


class TrainConfig(Group):
    config_version: int = Field(CONFIG_VERSION, ge=1, le=CONFIG_VERSION, description="Config file format version.")
    identity: Identity
    resources: Resources = Field(default_factory=Resources)
    optimization: Optimization = Field(default_factory=Optimization)
    distillation: Distillation = Field(default_factory=Distillation)
    observation: Observation = Field(default_factory=Observation)

    def effective_batch(self, num_processes: int = 1) -> int:
        return self.resources.train_batch_size * self.resources.gradient_accumulation_steps * num_processes

    @model_validator(mode="after")
    def _offload_and_gan(self) -> "TrainConfig":
        if self.resources.teacher_cpu_offload and self.distillation.gan_head_placement == "teacher_bottleneck":
            raise ValueError("resources.teacher_cpu_offload cannot be used with distillation.gan_head_placement "
                             "teacher_bottleneck: the GAN loss backpropagates through the teacher, whose weights "
                             "offload moves off the GPU after each call; use fake_score_bottleneck")
        return self

    @model_validator(mode="after")
    def _sharding(self) -> "TrainConfig":
        res, ident = self.resources, self.identity
        if res.distributed != "fsdp" and (res.fsdp_shard_teacher or res.fsdp_cpu_offload):
            on = "fsdp_shard_teacher" if res.fsdp_shard_teacher else "fsdp_cpu_offload"
            raise ValueError(f"resources.{on} needs resources.distributed fsdp (it is {res.distributed})")
        if res.distributed == "fsdp" and res.mixed_precision == "fp16":
            raise ValueError("resources.distributed fsdp trains in bf16 or fp32: fp16 needs a gradient scaler over "
                             "sharded gradients, which this engine does not have; set mixed_precision bf16")
        if res.distributed == "fsdp" and self.distillation.method != "dmad":
            raise ValueError(f"resources.distributed fsdp trains distillation.method dmad; "
                             f"{self.distillation.method} runs with ddp")
        shared = res.share_frozen_base and ident.student == "lora" and ident.fake_score == "lora"
        if res.fsdp_shard_teacher and shared:
            raise ValueError("resources.fsdp_shard_teacher cannot shard a shared frozen base (the LoRA student's and "
                             "fake score's adapters sit on it): set share_frozen_base false, or leave the teacher "
                             "replicated")
        if res.fsdp_shard_teacher and res.teacher_cpu_offload:
            raise ValueError("resources.fsdp_shard_teacher and teacher_cpu_offload both place the teacher: use "
                             "fsdp_cpu_offload to keep sharded weights in CPU memory")
        if res.fsdp_shard_teacher and res.teacher_precision in ("int8", "fp8"):
            raise ValueError(f"resources.fsdp_shard_teacher cannot shard a {res.teacher_precision} teacher (quantised "
                             f"weights are not sharded): use teacher_precision bf16 or auto")
        return self


# --------------------------------------------------------------------------- loading with clear errors

def field_most(section: str, name: str) -> Optional[int]:
    """The config's own upper bound of `section`.`name` (resources.train_batch_size: 4096), for
    numbers read from elsewhere (a command line, a checkpoint) that must stay within what a config
    may say; None when the field has none."""
    group = TrainConfig.model_fields[section].annotation
    field = group.model_fields.get(name)
    return next((m.le for m in field.metadata if getattr(m, "le", None) is not None), None) if field else None


def _field_names(model: type[BaseModel], loc: tuple) -> list[str]:
    """The valid keys at `loc` (the parent of an unknown key), for did-you-mean."""
    cur: Any = model
    for part in loc:
        fields = getattr(cur, "model_fields", None)
        if fields is None or part not in fields:
            return []
        cur = fields[part].annotation
    return list(getattr(cur, "model_fields", {}).keys())


def _override_keys(item: str) -> list[str]:
    return item.partition("=")[0].strip().split(".")


def _override_label(item: str) -> str:
    """'--set key=value' for messages: one line, and a 200 KB value cut short."""
    shown = printable(item)
    return f"--set {shown[:80]}..." if len(shown) > 80 else f"--set {shown}"


def _override_source(loc: tuple, overrides: list[str]) -> str | None:
    """The --set item that put the bad value at `loc` (the last one wins, as when applied)."""
    for item in reversed(overrides):
        keys = _override_keys(item)
        if [str(p) for p in loc[:len(keys)]] == keys:
            return _override_label(item)
    return None


def _shown_value(got: Any) -> str:
    text = json.dumps(got, default=str)
    return f"{text[:60]}..." if len(text) > 60 else text


def format_validation_error(e: ValidationError, source: str, overrides: list[str] | None = None) -> str:
    """One line naming the first problem: file (or the --set item), dotted field path, what is wrong."""
    err = e.errors()[0]
    loc = tuple(err["loc"])
    path = printable(".".join(str(p) for p in loc)) or "(top level)"
    source = _override_source(loc, overrides or []) or printable(source)
    more = f" (and {len(e.errors()) - 1} more)" if len(e.errors()) > 1 else ""
    if err["type"] == "extra_forbidden":
        valid = _field_names(TrainConfig, loc[:-1])
        close = difflib.get_close_matches(str(loc[-1]), valid, n=1)
        hint = f"; did you mean '{close[0]}'?" if close else (f"; valid keys: {', '.join(valid)}" if valid else "")
        return f"{source}: unknown key '{path}'{hint}{more}"
    if err["type"] == "missing":
        return f"{source}: missing required field '{path}'{more}"
    msg = printable(err["msg"].removeprefix("Value error, "))
    got = err.get("input")
    shown = "" if isinstance(got, (dict, list)) or got is None or "got" in msg else f" (got {_shown_value(got)})"
    return f"{source}: {path}: {msg}{shown}{more}"


def _v1_to_v2(raw: dict) -> dict:
    """Version 2 drops distillation.backward_simulation. Multi-step students always train on their
    own rollouts (backward simulation), so the field was never read; a version 1 file that turned it
    off for a multi-step student was refused then and still is."""
    dist = raw.get("distillation")
    if not isinstance(dist, dict) or "backward_simulation" not in dist:
        return raw
    dist = dict(dist)
    on = dist.pop("backward_simulation")
    steps = dist.get("student_steps", 1)
    if on is False and isinstance(steps, int) and steps > 1:
        raise UserInputError("distillation.backward_simulation must be true for student_steps > 1 (multi-step "
                             "inputs come from the student's own rollouts, never from noised real images); "
                             "since config_version 2 the field is gone: remove it")
    return {**raw, "distillation": dist}


# config_version N -> the step that turns a version N file into version N + 1
_MIGRATIONS = {1: _v1_to_v2}


def migrate(raw: dict) -> dict:
    """Bring an older config file up to CONFIG_VERSION, one version at a time (_MIGRATIONS); files
    without a version are taken as version 1. The input is never modified."""
    v = raw.get("config_version", 1)
    if not isinstance(v, int) or isinstance(v, bool) or v < 1 or v > CONFIG_VERSION:
        raise UserInputError(f"config_version {_shown_value(v)} is not supported (this engine reads 1..{CONFIG_VERSION})")
    raw = dict(raw)
    for version in range(v, CONFIG_VERSION):
        raw = _MIGRATIONS[version](raw)
    raw["config_version"] = CONFIG_VERSION
    return raw


def _wants_text(annotation: Any) -> bool:
    """The field takes free text (str, Optional[str], a path), not a Literal of fixed words."""
    if annotation is str:
        return True
    return get_origin(annotation) is not Literal and any(_wants_text(a) for a in get_args(annotation))


def _is_text_field(keys: list[str]) -> bool:
    cur: Any = TrainConfig
    for k in keys:
        fields = getattr(cur, "model_fields", None)
        if not fields or k not in fields:
            return False
        cur = fields[k].annotation
    return _wants_text(cur)


def parse_override(item: str) -> tuple[list[str], Any]:
    """'optimization.generator_lr=1e-5' -> (['optimization', 'generator_lr'], 1e-5). Values are JSON
    when they parse as JSON (numbers, true/false/null, lists), otherwise plain strings; a text field
    takes the text as typed (identity.run_name=123 is the name "123"), or a JSON string or null."""
    key, sep, value = item.partition("=")
    if not sep or not key.strip():
        raise UserInputError(f"{_override_label(item)}: expected key=value with a dotted key, "
                             f"e.g. resources.train_batch_size=2")
    keys = key.strip().split(".")
    if _is_text_field(keys):
        try:
            parsed = loads_json(value, _override_label(item))
        except UserInputError:
            return keys, value
        return keys, parsed if parsed is None or isinstance(parsed, str) else value
    try:
        return keys, loads_json(value, _override_label(item))
    except JsonSyntaxError:
        return keys, value


def apply_overrides(raw: dict, overrides: list[str]) -> dict:
    raw = json.loads(json.dumps(raw))  # a deep copy; read_json_file bounded its depth
    for item in overrides:
        keys, value = parse_override(item)
        node = raw
        for k in keys[:-1]:
            if not isinstance(node.setdefault(k, {}), dict):
                raise UserInputError(f"{_override_label(item)}: '{printable(k)}' is not a group")
            node = node[k]
        node[keys[-1]] = value
    return raw


def load_config(path: str | Path, overrides: list[str] | None = None) -> TrainConfig:
    """Read, migrate, override and validate a config file. Raises UserInputError with one line."""
    p = Path(path)
    raw = read_json_file(p, "config")
    if not isinstance(raw, dict):
        raise UserInputError(f"{printable(str(p))}: the config must be a JSON object, got {type(raw).__name__}")
    raw = apply_overrides(migrate(raw), overrides or [])
    return validate_config(raw, str(p), base_dir=p.parent, overrides=overrides)


def validate_config(raw: dict, source: str = "config", base_dir: Path | None = None,
                    overrides: list[str] | None = None) -> TrainConfig:
    """The config `raw` describes, of any supported config_version (migrated here, so a version 1
    document validates to what load_config reads from its file). Raises UserInputError with one line."""
    try:
        cfg = TrainConfig.model_validate(migrate(raw) if isinstance(raw, dict) else raw)
    except ValidationError as e:
        raise UserInputError(format_validation_error(e, source, overrides)) from None
    return resolve_paths(cfg, base_dir, source) if base_dir is not None else cfg


# The fields resolve_paths makes absolute, as (group, field); the app keeps the same fields meaningful
# when a config moves (app.models.config_doc.rebase_paths, materialized).
PATH_FIELDS: tuple[tuple[str, str], ...] = (
    ("identity", "output_dir"), ("identity", "pretrained_model_name_or_path"), ("identity", "teacher_config_dir"),
    ("identity", "train_data_dir"), ("observation", "prompt_set"), ("observation", "resume_from_checkpoint"))


def _resolved(v: Optional[str], base_dir: Path, where: str) -> Optional[str]:
    if v is None or v == "latest":
        return v
    try:  # ~ without a home folder (RuntimeError), a path the OS refuses
        out = str((base_dir / Path(v).expanduser()).resolve())
    except (OSError, RuntimeError, ValueError) as e:
        raise UserInputError(f"{where}: cannot resolve {printable(v)!r} ({e.__class__.__name__}: "
                             f"{printable(str(e))})") from None
    check_path(out, f"{where} (resolved against {printable(str(base_dir))})")  # the joined path can be too long
    return out


def resolve_paths(cfg: TrainConfig, base_dir: Path, source: str = "config") -> TrainConfig:
    """Relative paths in a config file are relative to the file, so configs can be moved with their
    data. The resolved config (written to the run folder) holds absolute paths."""
    groups = {}
    for group in dict.fromkeys(g for g, _ in PATH_FIELDS):  # identity, observation: in PATH_FIELDS' order
        g = getattr(cfg, group)
        where = f"{printable(source)}: {group}."
        groups[group] = g.model_copy(update={n: _resolved(getattr(g, n), base_dir, where + n)
                                             for grp, n in PATH_FIELDS if grp == group})
    loras = [x.model_copy(update={"path": _resolved(x.path, base_dir, f"{printable(source)}: identity.teacher_loras[{i}].path")})
             for i, x in enumerate(cfg.identity.teacher_loras)]  # a list of paths: each relative to the file too
    groups["identity"] = groups["identity"].model_copy(update={"teacher_loras": loras})
    return cfg.model_copy(update=groups)


def json_schema() -> dict:
    schema = TrainConfig.model_json_schema()
    schema["$id"] = "dmad-studio/config.schema.json"
    schema["title"] = "DMAD Studio run config"
    return schema


SCHEMA_PATH = resources_dir() / "config.schema.json"


def export_schema(path: Path = SCHEMA_PATH) -> None:
    from dmad.contract.runs import atomic_write_text
    atomic_write_text(path, json.dumps(json_schema(), indent=2, sort_keys=True) + "\n")


if __name__ == "__main__":  # python -m dmad.contract.config: refresh resources/config.schema.json
    export_schema()
    print(SCHEMA_PATH)
