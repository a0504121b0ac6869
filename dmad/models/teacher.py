"""The teacher, inspected without reading weights and loaded without ever unpickling.

Stable Diffusion 1.x/2.x are read here; SDXL, SD3 and Flux pipelines (dmad.models.pipelines) are
recognised by model_index.json's _class_name and follow the same rules. The family object
(dmad.models.families) then says how to encode prompts and call the denoiser. Reading configs and
safetensors headers, TeacherInfo and LORA_TARGETS are in dmad.models.teacher_files, which the
pipelines share.

Two layouts:
  folder       a diffusers pipeline folder: model_index.json, unet/, vae/, text_encoder/,
               tokenizer/, scheduler/.
  single_file  one .safetensors file in the original LDM/CompVis key layout
               (model.diffusion_model.*, first_stage_model.*, cond_stage_model.*), plus
               teacher_config_dir: a local diffusers folder whose configs and tokenizer describe it.
Weights are only read from .safetensors (use_safetensors=True): .ckpt/.pt/.bin/.pth are refused,
because unpickling runs whatever code the file carries. Nothing is downloaded (local_files_only).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Optional

import torch

from dmad.models.shard_units import largest_unit_params

from dmad.contract.config import COMPUTE_FORMAT, FLOAT_FORMATS
from dmad.contract.jsonfile import check_path, printable
from dmad.errors import UserInputError
from dmad.models.families import FAMILY_NAMES, PIPELINE_FAMILIES, Family, make_family
from dmad.models.pipelines import inspect_pipeline, load_pipeline_modules, scheduler_of
from dmad.models.teacher_files import (LORA_TARGETS, PICKLE_SUFFIXES, TeacherInfo, check_config_values,
                                       check_param_count, check_scheduler_values, lora_linear_params, read_json,
                                       read_safetensors_header, stored_dtype, weight_variant, weights_in_folder)

COMPONENTS = ("unet", "vae", "text_encoder")
# model_index.json entries this engine loads: component -> (library, accepted classes; None: any).
EXPECTED = {
    "unet": ("diffusers", ("UNet2DConditionModel",)),
    "vae": ("diffusers", ("AutoencoderKL",)),
    "text_encoder": ("transformers", ("CLIPTextModel",)),
    "tokenizer": ("transformers", ("CLIPTokenizer", "CLIPTokenizerFast")),
    "scheduler": ("diffusers", None),  # only its config is used (noise schedule, prediction type)
}
CONFIG_FILES = {"unet": "config.json", "vae": "config.json", "text_encoder": "config.json",
                "scheduler": "scheduler_config.json"}
WEIGHT_NAMES = {"unet": "diffusion_pytorch_model", "vae": "diffusion_pytorch_model", "text_encoder": "model"}
LDM_PREFIXES = {"unet": "model.diffusion_model.", "vae": "first_stage_model.", "text_encoder": "cond_stage_model."}


def torch_dtype(precision: str) -> torch.dtype:
    """torch's dtype of a float format ("fp32", "bf16", "fp16") or of a resources.mixed_precision
    ("no", "fp16", "bf16": the format it computes in); dmad.contract.config.FLOAT_FORMATS."""
    return getattr(torch, FLOAT_FORMATS[COMPUTE_FORMAT.get(precision, precision)][1])


class Teacher:
    """Loaded, frozen (requires_grad False) and in eval mode. Components are reached by their
    pipeline names (teacher.unet / .transformer, .vae, .text_encoder[_2|_3], .tokenizer[_2|_3]);
    `denoiser` is the UNet or transformer whatever the family. A component not loaded is None."""

    def __init__(self, modules: dict[str, Any], scheduler: Any, info: TeacherInfo, family: Any):
        object.__setattr__(self, "modules", dict(modules))
        object.__setattr__(self, "scheduler", scheduler)  # DDPM or flow-matching: the training schedule
        object.__setattr__(self, "info", info)
        object.__setattr__(self, "family", family)         # dmad.models.families.Family
        object.__setattr__(self, "loras", [])              # the user's LoRAs fused into it (teacher_loras)

    def __getattr__(self, name: str) -> Any:
        modules = object.__getattribute__(self, "modules")
        if name in modules:
            return modules[name]
        if name in ("unet", "transformer", "text_encoder_2", "text_encoder_3", "tokenizer_2", "tokenizer_3"):
            return None
        raise AttributeError(name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in self.modules or name in ("unet", "transformer"):
            self.modules[name] = value
        else:
            object.__setattr__(self, name, value)

    @property
    def denoiser(self) -> Any:
        return self.modules.get(self.family.denoiser_name)

    @denoiser.setter
    def denoiser(self, value: Any) -> None:
        self.modules[self.family.denoiser_name] = value

    def networks(self) -> list[Any]:
        """The loaded networks: denoiser, VAE, text encoders."""
        return [m for m in self.modules.values() if isinstance(m, torch.nn.Module)]


# --------------------------------------------------------------------------- files and configs

def _read_index(cdir: Path) -> dict:
    """model_index.json; for a StableDiffusionPipeline its components are checked here, the other
    families' in dmad.models.pipelines."""
    f = cdir / "model_index.json"
    if not f.is_file():
        raise UserInputError(f"{cdir}: not a diffusers pipeline folder (no model_index.json)")
    index = read_json(f)
    cls = index.get("_class_name")
    if not isinstance(cls, str) or cls not in PIPELINE_FAMILIES:
        raise UserInputError(f"{f}: unsupported model family ({printable(str(cls))[:80]}): this engine supports "
                             f"{', '.join(PIPELINE_FAMILIES)}")
    if cls != "StableDiffusionPipeline":
        return index
    for name, (lib, classes) in EXPECTED.items():
        entry = index.get(name)
        ok = isinstance(entry, list) and len(entry) == 2 and entry[0] == lib
        if not ok or (classes is not None and entry[1] not in classes):
            want = " or ".join(classes) if classes else "a scheduler"
            raise UserInputError(f"{f}: component '{name}' is {json.dumps(entry)}; expected {lib} {want}")
    return index


def _read_configs(cdir: Path) -> dict[str, dict]:
    for name in ("tokenizer", *CONFIG_FILES):
        if not (cdir / name).is_dir():
            raise UserInputError(f"{cdir}: component folder '{name}/' is missing")
    if not any((cdir / "tokenizer" / n).is_file() for n in ("tokenizer.json", "vocab.json")):
        raise UserInputError(f"{cdir / 'tokenizer'}: no tokenizer files (tokenizer.json or vocab.json + merges.txt)")
    configs = {}
    for name, file in CONFIG_FILES.items():
        f = cdir / name / file
        if not f.is_file():
            raise UserInputError(f"{f}: missing ({name} config)")
        configs[name] = read_json(f)
    return configs


def _check_component_configs(cdir: Path, index: dict) -> None:
    """Every network config and the scheduler config that model_index.json names, checked for
    sizes no network can have (teacher_files.check_config_values) before anything is built from
    them, whatever the family. Names are taken only as plain folder names, never as paths."""
    for name in index:
        if not name.isidentifier():
            continue
        f = cdir / name / "config.json"
        if not f.is_file():
            continue
        cfg = read_json(f)
        check_config_values(cfg, f)
        if name == "unet" and cfg.get("sample_size") is None:  # diffusers' default None: no latent size to train at
            raise UserInputError(f"{f}: sample_size is missing (the latent side the UNet was trained at, e.g. 64)")
    sched = cdir / "scheduler" / CONFIG_FILES["scheduler"]
    if sched.is_file():
        check_scheduler_values(read_json(sched), sched)


def _weights_of_folder(p: Path) -> tuple[dict, dict, tuple[str, ...]]:
    return weights_in_folder(p, WEIGHT_NAMES)


def _single_file_config_dir(p: Path, teacher_config_dir: Optional[str]) -> Path:
    if p.suffix.lower() in PICKLE_SUFFIXES:
        raise UserInputError(f"{p}: pickle checkpoints are never loaded; convert to .safetensors "
                             f"(unpickling can run arbitrary code)")
    if p.suffix.lower() != ".safetensors":
        raise UserInputError(f"{p}: not a teacher: expected a diffusers pipeline folder or a .safetensors file")
    if teacher_config_dir is None:
        raise UserInputError(f"{p}: a single-file teacher needs teacher_config_dir: a local diffusers pipeline "
                             f"folder (model_index.json, component configs, tokenizer) describing the same model")
    cdir = Path(teacher_config_dir).expanduser()
    if not cdir.is_dir():
        raise UserInputError(f"teacher_config_dir not found: {cdir} (needed by the single-file teacher {p})")
    return cdir


def _weights_of_file(p: Path) -> tuple[dict, dict, tuple[str, ...]]:
    header = read_safetensors_header(p)
    headers = {c: [{k: v for k, v in header.items() if k.startswith(pre)}] for c, pre in LDM_PREFIXES.items()}
    files = {c: (p,) if headers[c][0] else () for c in COMPONENTS}
    missing = tuple(f"{c} weights ({LDM_PREFIXES[c]}* keys) in {p}" for c in COMPONENTS if not files[c])
    return files, headers, missing


# --------------------------------------------------------------------------- inspect

def _meta_models(configs: dict[str, dict], cdir: Path) -> dict[str, torch.nn.Module]:
    """The three networks on the meta device: exact parameter counts and resolved configs (every
    default filled in) at no memory cost."""
    from accelerate import init_empty_weights
    from diffusers import AutoencoderKL, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel

    makers: dict[str, Callable[[dict], torch.nn.Module]] = {
        "unet": UNet2DConditionModel.from_config, "vae": AutoencoderKL.from_config,
        "text_encoder": lambda c: CLIPTextModel(CLIPTextConfig.from_dict(c))}
    models = {}
    # include_buffers: under torch.device("meta") every tensor, including the transient CPU one that
    # plain init_empty_weights makes for each parameter before moving it (17 TB for a UNet with
    # block_out_channels [1000000, 1000000]), is created on the meta device: nothing is allocated.
    with init_empty_weights(include_buffers=True):
        for name, make in makers.items():
            try:
                models[name] = make(configs[name])
            except (TypeError, ValueError, KeyError, IndexError, AttributeError, RuntimeError, ZeroDivisionError) as e:
                raise UserInputError(f"{cdir / name / CONFIG_FILES[name]}: invalid {name} config "
                                     f"({e.__class__.__name__}: {e})") from e
    return models


def _family(text_hidden: int, prediction_type: str) -> str:
    # SD 2.x replaced CLIP ViT-L/14 (width 768) by OpenCLIP ViT-H/14 (width 1024), and its 768 px
    # models predict v; SD 1.x is CLIP ViT-L + epsilon. Either signal therefore marks sd2.
    return "sd2" if text_hidden == 1024 or prediction_type == "v_prediction" else "sd1"


def _check_consistent(unet_cfg: Any, vae_cfg: Any, text_hidden: int, cdir: Path) -> None:
    if not unet_cfg.in_channels == unet_cfg.out_channels == vae_cfg.latent_channels:
        raise UserInputError(
            f"{cdir / 'unet'}: UNet in/out channels {unet_cfg.in_channels}/{unet_cfg.out_channels} differ from the "
            f"VAE's {vae_cfg.latent_channels} latent channels: inpainting, depth and upscaling models are not supported")
    if unet_cfg.cross_attention_dim != text_hidden:
        raise UserInputError(f"{cdir / 'unet'}: cross_attention_dim {unet_cfg.cross_attention_dim} does not match "
                             f"the text encoder's hidden size {text_hidden}")


def _check_file_matches(p: Path, header: dict, unet_cfg: Any, text_hidden: int, cdir: Path) -> None:
    """A single file whose shapes contradict teacher_config_dir (an SD 2 file with SD 1 configs, say)
    would fail deep inside diffusers; two header shapes tell it early and plainly."""
    checks = [("model.diffusion_model.input_blocks.0.0.weight", 0, unet_cfg.block_out_channels[0], "UNet width"),
              ("model.diffusion_model.input_blocks.0.0.weight", 1, unet_cfg.in_channels, "UNet input channels"),
              ("cond_stage_model.transformer.text_model.embeddings.position_embedding.weight", -1, text_hidden,
               "text encoder width"),
              ("cond_stage_model.model.positional_embedding", -1, text_hidden, "text encoder width")]
    for key, dim, want, what in checks:
        if key in header and len(header[key]["shape"]) < 2:
            raise UserInputError(f"{p}: tensor {key} has shape {header[key]['shape']}, not a weight matrix")
        if key in header and header[key]["shape"][dim] != want:
            raise UserInputError(f"{p}: {what} is {header[key]['shape'][dim]} in the file but {want} in "
                                 f"teacher_config_dir {cdir}: the configs describe a different model")


def _config_dir(p: Path, teacher_config_dir: Optional[str]) -> Path:
    check_path(p, "teacher")
    if teacher_config_dir is not None:
        check_path(teacher_config_dir, "teacher_config_dir")
    if not p.exists():
        raise UserInputError(f"teacher not found: {p}")
    if p.is_dir():
        if teacher_config_dir is not None:
            raise UserInputError(f"teacher_config_dir is only for a single-file teacher, but {p} is a folder "
                                 f"(remove teacher_config_dir)")
        return p
    return _single_file_config_dir(p, teacher_config_dir)


def inspect_teacher(path: str, model_family: str = "auto", teacher_config_dir: Optional[str] = None) -> TeacherInfo:
    """Read model_index.json, the component configs and the safetensors headers; no weights.
    Raises UserInputError (one line naming the path and the problem). Missing weights are not an
    error here (a dry run estimates memory from configs alone): see `weights_present`."""
    if model_family not in ("auto", *FAMILY_NAMES):
        raise UserInputError(f"model_family '{model_family}' is not one of auto, {', '.join(FAMILY_NAMES)}")
    p = Path(path).expanduser()
    cdir = _config_dir(p, teacher_config_dir)
    index = _read_index(cdir)
    _check_component_configs(cdir, index)
    cls = index.get("_class_name")
    if cls != "StableDiffusionPipeline":
        family = PIPELINE_FAMILIES[cls][0]
        if model_family not in ("auto", family):
            raise UserInputError(f"{p}: model_family is '{model_family}' but the teacher is {family} ({cls}); "
                                 f"set model_family to auto or {family}")
        with torch.device("meta"):  # its meta models: no tensor allocated, whatever the configs' sizes
            info = inspect_pipeline(p, cdir, index, family)
        check_param_count(info.param_counts, cdir)
        return info
    return _inspect_sd(p, cdir, model_family)


def _inspect_sd(p: Path, cdir: Path, model_family: str) -> TeacherInfo:
    """inspect_teacher of a StableDiffusionPipeline (SD 1.x / 2.x): a folder or a single file."""
    files, headers, missing = _weights_of_folder(p) if p.is_dir() else _weights_of_file(p)
    configs = _read_configs(cdir)
    models = _meta_models(configs, cdir)
    params = {c: sum(t.numel() for t in m.parameters()) for c, m in models.items()}
    check_param_count(params, cdir)
    unet_cfg, vae_cfg = models["unet"].config, models["vae"].config
    text_hidden = int(models["text_encoder"].config.hidden_size)
    prediction_type = configs["scheduler"].get("prediction_type", "epsilon")
    if prediction_type not in ("epsilon", "v_prediction"):
        raise UserInputError(f"{cdir / 'scheduler'}: prediction_type '{prediction_type}' is not supported "
                             f"(epsilon or v_prediction)")
    _check_consistent(unet_cfg, vae_cfg, text_hidden, cdir)
    if p.is_file():
        _check_file_matches(p, {k: v for h in headers.values() for k, v in h[0].items()}, unet_cfg, text_hidden, cdir)
    family = _family(text_hidden, prediction_type)
    if model_family not in ("auto", family):
        raise UserInputError(f"{p}: model_family is '{model_family}' but the teacher is {family} (text encoder width "
                             f"{text_hidden}, prediction_type {prediction_type}); set model_family to auto or {family}")
    sample = unet_cfg.sample_size
    return TeacherInfo(
        path=str(p), kind="folder" if p.is_dir() else "single_file", config_dir=str(cdir), family=family,
        prediction_type=prediction_type,
        param_counts=params,
        weights_dtype={c: stored_dtype(headers[c]) for c in COMPONENTS},
        weights_present={c: bool(files[c]) for c in COMPONENTS},
        weights_files={c: tuple(str(f) for f in files[c]) for c in COMPONENTS}, missing_weights=missing,
        sample_size=int(sample if isinstance(sample, int) else sample[0]),
        vae_scale_factor=2 ** (len(vae_cfg.block_out_channels) - 1), latent_channels=int(vae_cfg.latent_channels),
        unet_block_out_channels=tuple(int(c) for c in unet_cfg.block_out_channels),
        bottleneck_channels=int(unet_cfg.block_out_channels[-1]), text_hidden_size=text_hidden,
        unet_lora_params_per_rank=lora_linear_params(models["unet"], LORA_TARGETS),
        ff_lora_params_per_rank=lora_linear_params(models["unet"], Family.ff_lora_targets),
        ff_lora_targets=Family.ff_lora_targets,
        shard_unit_params=largest_unit_params(models["unet"]))


# --------------------------------------------------------------------------- load

def _guarded(what: str, where: str, load: Callable[[], Any]) -> Any:
    """Library errors while reading local files are the user's input problem: one line naming it."""
    from safetensors import SafetensorError

    try:
        return load()
    except (OSError, ValueError, RuntimeError, KeyError, SafetensorError) as e:
        first = (str(e).strip().splitlines() or [""])[0]
        raise UserInputError(f"{where}: cannot load {what} ({e.__class__.__name__}: {first})") from e


def _load_folder(info: TeacherInfo, dtype: torch.dtype,
                 components: tuple[str, ...] = COMPONENTS) -> dict[str, Optional[torch.nn.Module]]:
    from diffusers import AutoencoderKL, UNet2DConditionModel
    from transformers import CLIPTextModel

    classes = {"unet": UNet2DConditionModel, "vae": AutoencoderKL, "text_encoder": CLIPTextModel}
    out: dict[str, Optional[torch.nn.Module]] = {c: None for c in classes}
    for c, cls in classes.items():
        if c not in components:
            continue
        kwargs = dict(subfolder=c, local_files_only=True, use_safetensors=True, dtype=dtype,
                      variant=weight_variant(info.weights_files[c][0]))
        out[c] = _guarded(c, str(Path(info.path) / c), lambda: cls.from_pretrained(info.path, **kwargs))
    return out


def _load_single_file(info: TeacherInfo, tokenizer: Any, dtype: torch.dtype) -> dict[str, torch.nn.Module]:
    from diffusers import StableDiffusionPipeline

    # config= a local folder: diffusers reads every component config from it and never looks for
    # one on the Hub; from_single_file never loads a safety checker.
    def load() -> Any:
        try:
            return StableDiffusionPipeline.from_single_file(
                info.path, config=info.config_dir, local_files_only=True, dtype=dtype, tokenizer=tokenizer,
                safety_checker=None, feature_extractor=None, requires_safety_checker=False)
        except NotImplementedError as e:
            if "meta tensor" not in str(e):
                raise
            # Tensors the file lacks stay on the meta device until diffusers moves the model.
            raise UserInputError(f"{info.path}: weights incomplete: tensors that the configs in teacher_config_dir "
                                 f"{info.config_dir} call for are not in the file; do they describe it?") from e

    pipe = _guarded("the single-file checkpoint", info.path, load)
    return {"unet": pipe.unet, "vae": pipe.vae, "text_encoder": pipe.text_encoder}


def load_identity_teacher(ident: Any, dtype: torch.dtype = torch.float32,
                          components: tuple[str, ...] = COMPONENTS) -> Teacher:
    """The teacher a config's identity group names: its model, family, config folder and LoRAs."""
    return load_teacher(ident.pretrained_model_name_or_path, ident.model_family, ident.teacher_config_dir,
                        dtype=dtype, components=components, loras=tuple(ident.teacher_loras))


def load_teacher(path: str, model_family: str = "auto", teacher_config_dir: Optional[str] = None,
                 dtype: torch.dtype = torch.float32, components: tuple[str, ...] = COMPONENTS,
                 loras: tuple = ()) -> Teacher:
    """Load a frozen teacher on the CPU in `dtype`. Raises UserInputError for missing, corrupt or
    mismatched files. Cost: the file sizes in RAM (SD 1.5 in float32: ~4 GB). `components`: the
    networks to load from a folder teacher ("unet" or "denoiser", "vae", "text_encoder" = every
    text encoder; e.g. VAE and text encoders only for `dmad cache`); the others are None. A
    single-file teacher is always read whole. `loras` (identity.teacher_loras entries) are fused
    into it (dmad.models.teacher_loras), in float32 whatever `dtype`, then it is cast; with LoRAs
    every component loads (the LoRA is checked against the denoiser it was made for), and
    `teacher.loras` records what was applied."""
    if loras:
        teacher = load_teacher(path, model_family, teacher_config_dir, torch.float32)
        from dmad.models.teacher_loras import apply_teacher_loras

        object.__setattr__(teacher, "loras", apply_teacher_loras(teacher, loras))
        if dtype != torch.float32:
            for m in teacher.networks():
                m.to(dtype=dtype)
        return teacher
    from transformers import CLIPTokenizer

    info = inspect_teacher(path, model_family, teacher_config_dir)
    if not info.has_weights:
        raise UserInputError(f"teacher has no weights: missing {'; '.join(info.missing_weights)}")
    cdir = Path(info.config_dir)
    sched_cfg = read_json(cdir / "scheduler" / CONFIG_FILES["scheduler"])
    if info.family in ("sd1", "sd2"):
        tokenizer = _guarded("the tokenizer", str(cdir / "tokenizer"), lambda: CLIPTokenizer.from_pretrained(
            str(cdir), subfolder="tokenizer", local_files_only=True))
        wanted = tuple("unet" if c == "denoiser" else c for c in components)
        modules = (_load_folder(info, dtype, wanted) if info.kind == "folder"
                   else _load_single_file(info, tokenizer, dtype))
        modules["tokenizer"] = tokenizer
    else:
        wanted = {info.denoiser if c in ("unet", "transformer", "denoiser") else c for c in components}
        if "text_encoder" in wanted:
            wanted |= {"text_encoder_2", "text_encoder_3"}
        modules = load_pipeline_modules(info, dtype, tuple(wanted), _guarded)
    for m in modules.values():
        if isinstance(m, torch.nn.Module):
            m.requires_grad_(False).eval()
    family = make_family(info.family, info.vae_scale_factor, info.denoiser_config)
    # Latents are not bounded by [-1, 1]: clip_sample must be off. SD 1.x ships a PNDM config that
    # lacks the key, where DDPMScheduler would default it to True.
    return Teacher(modules, scheduler_of(family, sched_cfg), info, family)
