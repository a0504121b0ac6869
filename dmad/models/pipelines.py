"""Inspecting and loading SDXL, SD3 and Flux teachers (dmad.models.teacher handles SD 1.x/2.x and
dispatches here on model_index.json's _class_name).

The same rules as for SD: configs and safetensors headers are read without weights (a dry run,
the ledger); weights only from .safetensors; nothing downloaded. Components are the entries of
model_index.json: the denoiser (unet / transformer), the VAE, one to three text encoders and their
tokenizers, the scheduler (its config only). An optional component may be null (SD3 without T5).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Optional

import torch

from dmad.models.shard_units import largest_unit_params

from dmad.errors import UserInputError
from dmad.models.families import FAMILIES, Family
from dmad.models.teacher_files import (TeacherInfo, lora_linear_params, read_json, read_safetensors_header, stored_dtype,
                                       weight_variant, weights_in_folder)

# A single original-layout file (sd_xl_base_1.0.safetensors): each network's key prefix, and one
# tensor per network whose shape must agree with the config folder (key, dim, what, config getter).
SINGLE_FILE_PREFIXES = {"sdxl": {"unet": "model.diffusion_model.", "vae": "first_stage_model.",
                                 "text_encoder": "conditioner.embedders.0.", "text_encoder_2": "conditioner.embedders.1."}}
SINGLE_FILE_CHECKS = {"sdxl": [
    ("model.diffusion_model.input_blocks.0.0.weight", 0, "UNet width", lambda m: m["unet"].config.block_out_channels[0]),
    ("conditioner.embedders.0.transformer.text_model.embeddings.position_embedding.weight", -1,
     "first text encoder width", lambda m: m["text_encoder"].config.hidden_size),
    ("conditioner.embedders.1.model.positional_embedding", -1, "second text encoder width",
     lambda m: m["text_encoder_2"].config.hidden_size)]}


def networks(family: Family) -> tuple[str, ...]:
    return (family.denoiser_name, "vae", *family.text_encoders)


def _entry(index: dict, name: str, f: Path, family: Family) -> Optional[tuple[str, str]]:
    e = index.get(name)
    if (e is None or e == [None, None]) and name in family.optional_components:
        return None
    if not (isinstance(e, list) and len(e) == 2 and e[0] in ("diffusers", "transformers") and isinstance(e[1], str)):
        raise UserInputError(f"{f}: component '{name}' is {json.dumps(e)}; a {family.pipeline_class} needs it")
    return e[0], e[1]


def read_components(cdir: Path, index: dict, family: Family) -> dict[str, tuple[str, str]]:
    """{component: (library, class)} of the pipeline; absent optional components left out."""
    f = cdir / "model_index.json"
    out = {}
    for name in (*networks(family), *family.tokenizers, "scheduler"):
        e = _entry(index, name, f, family)
        if e is None:
            continue
        if not (cdir / name).is_dir():
            raise UserInputError(f"{cdir}: component folder '{name}/' is missing")
        out[name] = e
    return out


def _config(cdir: Path, name: str) -> dict:
    file = "scheduler_config.json" if name == "scheduler" else "config.json"
    f = cdir / name / file
    if not f.is_file():
        raise UserInputError(f"{f}: missing ({name} config)")
    return read_json(f)


def meta_model(cdir: Path, name: str, library: str, cls_name: str) -> torch.nn.Module:
    """The network on the meta device (exact parameter count, resolved config, no memory)."""
    from accelerate import init_empty_weights

    cfg = _config(cdir, name)
    lib = __import__(library)
    cls = getattr(lib, cls_name, None)
    if cls is None:
        raise UserInputError(f"{cdir / 'model_index.json'}: unknown {library} class {cls_name} for '{name}'")
    try:
        with init_empty_weights():
            if library == "diffusers":
                return cls.from_config(cfg)
            return cls(cls.config_class.from_dict(cfg))
    except (TypeError, ValueError, KeyError, IndexError, AttributeError) as e:
        raise UserInputError(f"{cdir / name / 'config.json'}: invalid {name} config ({e.__class__.__name__}: {e})") from e


def param_count(model: torch.nn.Module) -> int:
    """Parameters as loaded: a tied copy (T5's encoder.embed_tokens is shared.weight once loaded,
    transformers' _tied_weights_keys) counts once, although a meta model built from the config
    holds both."""
    tied = getattr(model, "_tied_weights_keys", None) or {}
    names = {n for n, _ in model.named_parameters()}
    skip = {k for k, v in tied.items() if v in names} if isinstance(tied, dict) else set()
    return sum(p.numel() for n, p in model.named_parameters() if n not in skip)


def weights_of_folder(p: Path, comps: dict[str, tuple[str, str]], family: Family):
    return weights_in_folder(p, {c: "diffusion_pytorch_model" if comps[c][0] == "diffusers" else "model"
                                 for c in networks(family) if c in comps})


def weights_of_file(p: Path, family_name: str):
    prefixes = SINGLE_FILE_PREFIXES[family_name]
    header = read_safetensors_header(p)
    headers = {c: [{k: v for k, v in header.items() if k.startswith(pre)}] for c, pre in prefixes.items()}
    files = {c: (p,) if headers[c][0] else () for c in prefixes}
    missing = tuple(f"{c} weights ({prefixes[c]}* keys) in {p}" for c in prefixes if not files[c])
    return files, headers, missing


def inspect_pipeline(p: Path, cdir: Path, index: dict, family_name: str) -> TeacherInfo:
    """TeacherInfo of an SDXL / SD3 / Flux pipeline folder, or of a single SDXL file described by
    the config folder `cdir`."""
    family = FAMILIES[family_name]()
    if p.is_file() and family_name not in SINGLE_FILE_PREFIXES:
        raise UserInputError(f"{p}: a single-file {family_name} teacher is not supported; give its diffusers "
                             f"pipeline folder (model_index.json, {family.denoiser_name}/, vae/, text encoders)")
    comps = read_components(cdir, index, family)
    for tok in family.tokenizers:
        if tok in comps and not any((cdir / tok / n).is_file() for n in
                                    ("tokenizer.json", "vocab.json", "spiece.model", "tokenizer_config.json")):
            raise UserInputError(f"{cdir / tok}: no tokenizer files")
    models = {c: meta_model(cdir, c, *comps[c]) for c in networks(family) if c in comps}
    files, headers, missing = weights_of_file(p, family_name) if p.is_file() else weights_of_folder(p, comps, family)
    if p.is_file():
        header = {k: v for h in headers.values() for k, v in h[0].items()}
        for key, dim, what, want in SINGLE_FILE_CHECKS[family_name]:
            shape = header[key]["shape"] if key in header else None
            if shape is not None and (not shape or shape[dim] != want(models)):  # a 0-d tensor cannot be it either
                raise UserInputError(f"{p}: {what} is {shape[dim] if shape else shape} in the file but {want(models)} in "
                                     f"teacher_config_dir {cdir}: the configs describe a different model")
    den = models[family.denoiser_name].config
    vae = models["vae"].config
    sched = _config(cdir, "scheduler")
    prediction = "flow" if family.flow else sched.get("prediction_type", "epsilon")
    if prediction not in ("epsilon", "v_prediction", "flow"):
        raise UserInputError(f"{cdir / 'scheduler'}: prediction_type '{prediction}' is not supported (epsilon or v_prediction)")
    if family.flow:
        text_hidden = int(den.joint_attention_dim)
        sample = getattr(den, "sample_size", None) or 128
        feature = int(den.num_attention_heads * den.attention_head_dim)
        blocks: tuple[int, ...] = ()
        if family_name == "flux" and den.in_channels != 4 * vae.latent_channels:
            raise UserInputError(f"{cdir / 'transformer'}: in_channels {den.in_channels} is not 4 x the VAE's "
                                 f"{vae.latent_channels} latent channels (Flux packs 2x2 latent patches)")
        if family_name == "sd3" and den.in_channels != vae.latent_channels:
            raise UserInputError(f"{cdir / 'transformer'}: in_channels {den.in_channels} differ from the VAE's "
                                 f"{vae.latent_channels} latent channels")
    else:
        text_hidden = int(den.cross_attention_dim)
        sample = den.sample_size
        blocks = tuple(int(c) for c in den.block_out_channels)
        feature = blocks[-1]
        if not den.in_channels == den.out_channels == vae.latent_channels:
            raise UserInputError(f"{cdir / 'unet'}: UNet in/out channels {den.in_channels}/{den.out_channels} differ "
                                 f"from the VAE's {vae.latent_channels} latent channels: inpainting, depth and "
                                 f"upscaling models are not supported")
    targets, den_net = family.lora_targets, models[family.denoiser_name]
    cfg_dict = {k: (list(v) if isinstance(v, tuple) else v) for k, v in dict(den).items() if not k.startswith("_")}
    text_tokens = sd3_text_tokens(cdir, files, "text_encoder_3" in comps) if family_name == "sd3" else None
    return TeacherInfo(
        path=str(p), kind="folder" if p.is_dir() else "single_file", config_dir=str(cdir), family=family_name,
        prediction_type=prediction,
        param_counts={c: param_count(m) for c, m in models.items()},
        weights_dtype={c: stored_dtype(headers.get(c, [])) for c in models},
        weights_present={c: bool(files.get(c)) for c in models},
        weights_files={c: tuple(str(f) for f in files.get(c, ())) for c in models}, missing_weights=missing,
        sample_size=int(sample if isinstance(sample, int) else sample[0]),
        vae_scale_factor=2 ** (len(vae.block_out_channels) - 1), latent_channels=int(vae.latent_channels),
        unet_block_out_channels=blocks, bottleneck_channels=feature, text_hidden_size=text_hidden,
        unet_lora_params_per_rank=lora_linear_params(den_net, targets),
        ff_lora_params_per_rank=lora_linear_params(den_net, family.ff_lora_targets),
        ff_lora_targets=family.ff_lora_targets, denoiser=family.denoiser_name, denoiser_config=cfg_dict,
        components=tuple(comps), lora_targets=targets,
        text_tokens=text_tokens, shard_unit_params=largest_unit_params(models[family.denoiser_name]))


def sd3_text_tokens(cdir: Path, files: dict, has_t5: bool) -> int:
    """Context tokens an SD3 transformer block computes per sample: the CLIP tokenizer's length, plus
    256 T5 tokens, or 1 where T5's part is exact zeros (no T5, or one whose final norm weight is all
    zero: T5's output is that weight times a normalised vector), which the engine computes as one
    token standing for 256 (dmad/models/repeated_tokens.py). Reads one small tensor, never T5 itself."""
    from safetensors import safe_open

    tok = cdir / "tokenizer" / "tokenizer_config.json"
    length = read_json(tok).get("model_max_length") if tok.is_file() else None
    clip = int(length) if isinstance(length, (int, float)) and 0 < length <= 77 else 77  # none, or 1e30: CLIP's 77
    t5_files = [f for f in files.get("text_encoder_3", ()) if str(f).endswith(".safetensors")]
    for f in t5_files:
        with safe_open(str(f), framework="pt") as h:
            if "encoder.final_layer_norm.weight" in h.keys():
                return clip + (1 if not bool(h.get_tensor("encoder.final_layer_norm.weight").any()) else 256)
    return clip + (256 if has_t5 else 1)  # a T5 whose weights are not here (configs only): assume a real one


def load_pipeline_modules(info, dtype: torch.dtype, components: Optional[tuple[str, ...]],
                          guarded: Callable[[str, str, Callable[[], Any]], Any]) -> dict[str, Any]:
    """{component: module or tokenizer} of an SDXL / SD3 / Flux teacher; networks not in
    `components` (None: all) are None."""
    import diffusers
    import transformers

    family = FAMILIES[info.family]()
    cdir = Path(info.config_dir)
    index = read_json(cdir / "model_index.json")
    comps = read_components(cdir, index, family)
    out: dict[str, Any] = {c: None for c in (*networks(family), *family.tokenizers)}
    for tok in family.tokenizers:
        if tok in comps:
            cls = getattr(transformers, comps[tok][1])
            out[tok] = guarded("the tokenizer", str(cdir / tok), lambda cls=cls, tok=tok: cls.from_pretrained(
                str(cdir), subfolder=tok, local_files_only=True))
    wanted = [c for c in networks(family) if c in comps and (components is None or c in components)]
    if info.kind == "single_file":
        pipe = guarded("the single-file checkpoint", info.path,
                       lambda: _from_single_file(info, family, dtype, {t: out[t] for t in family.tokenizers}))
        for c in wanted:
            out[c] = getattr(pipe, c)
        return out
    for c in wanted:
        lib, cls_name = comps[c]
        cls = getattr(diffusers if lib == "diffusers" else transformers, cls_name)
        kwargs = dict(subfolder=c, local_files_only=True, use_safetensors=True, dtype=dtype)
        if lib == "diffusers":
            kwargs["variant"] = weight_variant(info.weights_files[c][0])
        out[c] = guarded(c, str(Path(info.path) / c), lambda cls=cls, kwargs=kwargs: cls.from_pretrained(
            info.path, **kwargs))
    return out


def _from_single_file(info, family: Family, dtype: torch.dtype, tokenizers: dict) -> Any:
    """The family's pipeline from one original-layout file, its configs from the local config
    folder (diffusers never looks for them on the Hub); every weight must come from the file."""
    import diffusers

    cls = getattr(diffusers, family.pipeline_class)
    try:
        pipe = cls.from_single_file(info.path, config=info.config_dir, local_files_only=True, dtype=dtype,
                                    **tokenizers)
    except NotImplementedError as e:
        if "meta tensor" not in str(e):
            raise
        pipe = None
    if pipe is None or any(p.is_meta for c in networks(family) for p in getattr(pipe, c).parameters()):
        # tensors the file lacks stay on the meta device
        raise UserInputError(f"{info.path}: weights incomplete: tensors that the configs in teacher_config_dir "
                             f"{info.config_dir} call for are not in the file; do they describe it?")
    return pipe


def scheduler_of(family: Family, sched_cfg: dict) -> Any:
    """The training noise schedule's scheduler: DDPM for UNet families (clip_sample off), flow
    matching Euler for SD3 / Flux (shift and dynamic shifting from the teacher's config)."""
    from diffusers import DDPMScheduler, FlowMatchEulerDiscreteScheduler

    if family.flow:
        return FlowMatchEulerDiscreteScheduler.from_config(sched_cfg)
    sched_cfg.setdefault("clip_sample", False)
    return DDPMScheduler.from_config(sched_cfg)
