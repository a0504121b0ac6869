"""`dmad export`: a checkpoint's student, in the forms the rest of the ecosystem loads.

diffusers  a complete pipeline folder of the teacher's family (StableDiffusionPipeline,
           StableDiffusionXLPipeline, StableDiffusion3Pipeline, FluxPipeline): the teacher's VAE,
           text encoders and tokenizers, the student's denoiser (UNet or transformer; a LoRA
           student fused into the base weights), safetensors only, and a scheduler that
           reproduces the student's own sampler.
lora       for LoRA students: pytorch_lora_weights.safetensors (diffusers' LoRA format for the
           family, written by peft + diffusers' own routines) that `pipe.load_lora_weights` puts
           on the teacher, plus the same scheduler config.
lora-single-file
           for LoRA students: one .safetensors in the key layout ComfyUI, Forge and A1111 load
           (kohya's lora_unet_* names for UNet families, diffusers' transformer.* names for SD3
           and Flux; dmad.sample.lora_file), with metadata naming the base model, the family, the
           student's steps and the suggested sampler, scheduler and CFG; diffusers'
           load_lora_weights reads it too. Plus the scheduler config.
single-file
           any student (a LoRA student fused into its base): the student's denoiser as one
           .safetensors in diffusers' key names, which ComfyUI's "Load Diffusion Model" node
           reads for SD 1.x / 2.x / XL UNets and SD3 / Flux transformers (comfy/sd.py
           load_diffusion_model_state_dict converts diffusers UNet, MMDiT and Flux keys), with
           the base model's text encoders and VAE; in diffusers, `pipe.<denoiser>.
           load_state_dict(load_file(...))` on the base pipeline. The user's LoRAs are in it
           (the student was distilled from base + them). Same metadata and scheduler.
--dtype    fp32 (default: the trained weights as they are), fp16 or bf16 for what is saved.
Each output folder also has README.md (how to load it, exact lines) and dmad_export.json
(run, checkpoint, weights, timesteps, scheduler). Output is complete or absent: it is written to
a temp folder beside --out, then renamed.

Why LCMScheduler reproduces the student exactly. The student samples (dmad.methods.dmd2.
sample_student) from x = noise at timesteps[0]; at each step x0 = to_x0(x, t), then
x = sqrt(a_next) x0 + sqrt(1 - a_next) z with fresh z from the same CPU generator; the last x0
is decoded. LCMScheduler.step does the same arithmetic (the same float32 alphas_cumprod, the same
x0 formula per prediction type, the same randn draw from the generator the pipeline passes),
except for LCM's boundary condition: denoised = c_out x0 + c_skip x, with
c_skip = 0.25 / (s^2 + 0.25), c_out = s / sqrt(s^2 + 0.25), s = t * timestep_scaling. With
timestep_scaling = 1e9, c_out is exactly 1.0 in float32 and c_skip <= 2.5e-19 for every t >= 1,
so denoised == x0 (below float32 resolution). Timesteps: LCM picks
floor(linspace(0, N, n, endpoint=False)) from its N = original_inference_steps training
timesteps [N k - 1, ..., k - 1], k = 1000 // N; we search N so that set_timesteps(n) gives the
student's timesteps (N = n for [999, 749, 499, 249], [999, 499], [999]; N = 1000 for
[999, 666, 333]). Timesteps no N reproduces are still exact when passed as `timesteps=`.
SDXL (a UNet family) uses the same LCMScheduler, configured from its Euler scheduler's noise schedule.

Flow families (SD3, Flux). The student's step is x0 = x - s v, then x = (1 - s_next) x0 + s_next z,
which is FlowMatchEulerDiscreteScheduler.step with stochastic_sampling=True (final s_next = 0
gives x0). set_timesteps(sigmas=...) shifts the sigmas it is given (shift, or Flux's dynamic
shift with the pipeline's mu), so the exported scheduler has shift=1.0 and
use_dynamic_shifting=False: the sigmas the usage lines pass, the engine's s(t_k) (already
shifted, FlowSchedule), are then used unchanged, and the timesteps are s * 1000 as the
engine's. Both pipelines call scheduler.step without the generator, so its re-noising would
come from torch's global generator on the pipeline's device (CUDA's on a GPU: other numbers);
the usage lines wrap scheduler.step to pass the item's CPU generator, whose next draws after the
initial latents are the engine's (randn_tensor draws on the CPU and moves them to the device).
Flux draws its re-noising in the packed (B, h/2 * w/2, 4C) layout, and so does the engine's
sampler for Flux (Family.fresh_noise), so both flow families reproduce the student exactly on a
CPU, and within float round-off on a GPU.
"""
from __future__ import annotations

import errno
import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from dmad.contract.exports import DTYPES, FORMATS, LORA_FORMATS, LORA_WEIGHT_NAME
from dmad.contract.diskspace import missing_folders, remove_made, reporting_disk_full
from dmad.contract.jsonfile import check_output_folder, check_path, make_output_folder, printable
from dmad.contract.runs import RunFolder
from dmad.errors import UserInputError
from dmad.sample.command import ITERATION, usable_checkpoint
TIMESTEP_SCALING = 1e9  # makes LCM's c_out exactly 1 and c_skip negligible (module docstring)


@dataclass
class ExportSource:
    """What is exported: the run, its config and one complete checkpoint."""

    run: Path
    cfg: object            # dmad.contract.config.TrainConfig of the run
    iter: int
    checkpoint: Path


def resolve_source(run_dir: str, checkpoint: str, fmt: Optional[str] = None, out: Optional[Path] = None) -> ExportSource:
    """The run folder and checkpoint named on the command line, the checkpoint's files verified
    (headers, and the student's weights finite); UserInputError for anything missing or damaged,
    before any model loads."""
    from dmad.contract.config import load_config
    folder = RunFolder.open(check_path(run_dir, "--run").expanduser().resolve())
    cfg = load_config(folder.config_json)
    if checkpoint == "latest":
        candidates = folder.checkpoints_from_latest()
        if not candidates:
            raise UserInputError(f"no complete checkpoint in {folder.checkpoints_dir}")
    else:
        if not ITERATION.fullmatch(checkpoint):
            raise UserInputError(f"--checkpoint {printable(checkpoint)[:40]!r}: expected 'latest' or an iteration "
                                 f"number")
        found = dict(folder.list_checkpoints())
        if int(checkpoint) not in found:
            have = ", ".join(str(i) for i in sorted(found)) or "none"
            raise UserInputError(f"--checkpoint {int(checkpoint)}: no checkpoint iter_{int(checkpoint)} in "
                                 f"{folder.checkpoints_dir} (complete checkpoints: {have})")
        candidates = [(int(checkpoint), found[int(checkpoint)])]
    check_format(folder.path, cfg, fmt)  # a request that cannot be met needs no checkpoint read
    if out is not None:
        check_output_folder(out, "--out")
    it, path = usable_checkpoint(candidates, cfg, checkpoint)
    return ExportSource(run=folder.path, cfg=cfg, iter=it, checkpoint=path)


def default_out(src: ExportSource, fmt: str) -> Path:
    return src.run / "export" / f"iter_{src.iter}-{fmt}"


def check_format(run: Path, cfg, fmt: Optional[str]) -> None:
    if fmt is None:
        return
    if fmt not in FORMATS:
        raise UserInputError(f"--format {fmt!r}: expected one of {', '.join(FORMATS)}")
    if fmt in LORA_FORMATS and cfg.identity.student != "lora":
        raise UserInputError(f"--format {fmt}: the student of {run} is a full UNet (identity.student "
                             f"'{cfg.identity.student}'), not a LoRA; use --format diffusers")


def check_request(src: ExportSource, fmt: str, out: Path, merge_user_loras: bool = False) -> None:
    check_format(src.run, src.cfg, fmt)
    if merge_user_loras and fmt != "lora-single-file":
        raise UserInputError(f"--merge-user-loras: only with --format lora-single-file (not {fmt})")
    if merge_user_loras and not src.cfg.identity.teacher_loras:
        raise UserInputError(f"--merge-user-loras: the teacher of {src.run} had no LoRAs (identity.teacher_loras is empty)")
    check_output_folder(out, "--out")  # below a file, unwritable, taken: found before the models load


# --------------------------------------------------------------------------- the student

def load_student(src: ExportSource, user_layers: Optional[dict] = None):
    """(teacher, student UNet in float32 eval mode, training state). The student holds the weights
    the run's samples were rendered with: the EMA weights when the checkpoint has them. With a
    `user_layers` dict, the teacher's LoRAs are read into it first (user_lora_layers)."""
    import torch

    from dmad.models.checkpoint import load_student as load_checkpoint_student
    from dmad.models.checkpoint import read_training_state
    from dmad.models.teacher import load_identity_teacher

    ident = src.cfg.identity
    state = read_training_state(src.checkpoint)
    teacher = load_identity_teacher(ident, dtype=torch.float32)
    if user_layers is not None:
        from dmad.models.teacher_loras import user_lora_layers

        user_layers.update(user_lora_layers(teacher))
    student, _ = load_checkpoint_student(teacher, ident, src.checkpoint)
    teacher.denoiser = None  # not exported: frees its memory (SD 1.5 in float32: 3.4 GB)
    # the embedded guidance a guidance-distilled (Flux dev) student was trained and sampled with
    teacher.family.guidance = src.cfg.distillation.real_guidance_scale
    return teacher, student, state


def fused_unet(student, mode: str):
    """A plain denoiser (UNet2DConditionModel or the family's transformer): the full student as
    is; a LoRA student merged into its base weights by peft (diffusers' fuse_lora, which UNets and
    transformers have through PeftAdapterMixin) and stripped of the adapter layers (unload_lora)."""
    if mode == "lora":
        student.fuse_lora(lora_scale=1.0, safe_fusing=True)
        student.unload_lora()
    return student


# --------------------------------------------------------------------------- the scheduler

def student_scheduler(teacher_scheduler_config: dict, timesteps: list[int]):
    """(LCMScheduler, reproduces) where reproduces says whether set_timesteps(len(timesteps))
    gives exactly `timesteps`. Same noise schedule and prediction type as the teacher."""
    import inspect

    from diffusers import LCMScheduler

    accepted = set(inspect.signature(LCMScheduler.__init__).parameters) - {"self"}
    base = {k: v for k, v in dict(teacher_scheduler_config).items() if k in accepted}
    base.update(timestep_scaling=TIMESTEP_SCALING, clip_sample=False, thresholding=False)
    n = len(timesteps)
    probe = LCMScheduler.from_config(base)
    chosen = None
    for steps in [n, *range(n + 1, probe.config.num_train_timesteps + 1)]:  # < 0.1 s in all
        probe.set_timesteps(n, original_inference_steps=steps)
        if probe.timesteps.tolist() == list(timesteps):
            chosen = steps
            break
    sched = LCMScheduler.from_config(base, original_inference_steps=chosen or probe.config.num_train_timesteps)
    return sched, chosen is not None


def check_scheduler_matches(sched, schedule, timesteps: list[int]) -> None:
    """The exported scheduler's arithmetic is the engine's: same alphas_cumprod, prediction type,
    and an LCM boundary condition that is the identity at every student timestep."""
    import torch

    if not torch.equal(sched.alphas_cumprod.float(), schedule.alphas_cumprod):
        raise RuntimeError("LCMScheduler's alphas_cumprod differ from the teacher's noise schedule")
    if sched.config.prediction_type != schedule.prediction_type:
        raise RuntimeError(f"prediction_type {sched.config.prediction_type} != {schedule.prediction_type}")
    for t in timesteps:
        c_skip, c_out = sched.get_scalings_for_boundary_condition_discrete(torch.tensor(t))
        if t > 0 and not (float(c_out) == 1.0 and float(c_skip) < 1e-15):
            raise RuntimeError(f"LCM boundary condition at t={t} is not the identity (c_out {float(c_out)})")


# flow families: what the exported FlowMatchEulerDiscreteScheduler must have for the sigmas the
# usage lines pass to be used unchanged (module docstring)
FLOW_SCHEDULER_CONFIG = dict(shift=1.0, use_dynamic_shifting=False, stochastic_sampling=True, shift_terminal=None,
                             use_karras_sigmas=False, use_exponential_sigmas=False, use_beta_sigmas=False,
                             invert_sigmas=False)


def flow_student_scheduler(teacher_scheduler_config: dict):
    """FlowMatchEulerDiscreteScheduler for a flow family's student: the teacher's config with
    stochastic sampling (the student's re-noising) and no shift of its own (the usage lines pass
    the engine's already shifted sigmas)."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    return FlowMatchEulerDiscreteScheduler.from_config(dict(teacher_scheduler_config), **FLOW_SCHEDULER_CONFIG)


def student_sigmas(schedule, timesteps: list[int]) -> list[float]:
    """The engine's sigmas s(t_k) of the student timesteps (float32 values, as python floats)."""
    import torch

    return [float(s) for s in schedule.sigma_of(torch.tensor(list(timesteps), dtype=torch.long))]


def check_flow_scheduler_matches(sched, schedule, timesteps: list[int]) -> None:
    """The exported flow scheduler, given the usage lines' sigmas, steps through exactly the
    engine's sigmas (float32 equality), timesteps s * T, ends at sigma 0 (the last step returns
    x0) and re-noises (stochastic_sampling)."""
    import copy

    import torch

    if not sched.config.stochastic_sampling:
        raise RuntimeError("the flow scheduler does not re-noise (stochastic_sampling is off)")
    if sched.config.num_train_timesteps != schedule.num_train_timesteps:
        raise RuntimeError(f"num_train_timesteps {sched.config.num_train_timesteps} != "
                           f"{schedule.num_train_timesteps}")
    probe = copy.deepcopy(sched)
    probe.set_timesteps(sigmas=student_sigmas(schedule, timesteps), mu=0.0)
    want = schedule.sigma_of(torch.tensor(list(timesteps), dtype=torch.long)).float()
    if not torch.equal(probe.sigmas[:-1].float(), want) or float(probe.sigmas[-1]) != 0.0:
        raise RuntimeError(f"the flow scheduler's sigmas {probe.sigmas.tolist()} differ from the student's "
                           f"{want.tolist()}")
    if not torch.equal(probe.timesteps.float(), want * schedule.num_train_timesteps):
        raise RuntimeError(f"the flow scheduler's timesteps {probe.timesteps.tolist()} are not sigma * "
                           f"{schedule.num_train_timesteps}")


def make_student_scheduler(teacher, timesteps: list[int]):
    """(LCMScheduler, reproduces) for a UNet family (SD, SDXL), checked against the engine's
    noise schedule; reproduces: num_inference_steps gives the student's timesteps."""
    sched, reproduces = student_scheduler(teacher.scheduler.config, timesteps)
    check_scheduler_matches(sched, teacher.family.schedule(teacher.scheduler), timesteps)
    return sched, reproduces


# --------------------------------------------------------------------------- writers

def _pipeline(teacher, denoiser, scheduler):
    """The teacher family's diffusers pipeline on the teacher's VAE, text encoders and tokenizers
    (SD3 without T5: text_encoder_3 / tokenizer_3 None) and the given denoiser."""
    family = teacher.family
    return family.pipeline(teacher.modules, scheduler, **{family.denoiser_name: denoiser})


def write_diffusers(tmp: Path, teacher, student, mode: str, scheduler, dtype: str = "fp32") -> None:
    from dmad.sample.lora_file import torch_dtype

    pipe = _pipeline(teacher, fused_unet(student, mode), scheduler)
    if dtype != "fp32":
        pipe.to(dtype=torch_dtype(dtype))
        if teacher.family.vae_fp32:  # SDXL's VAE overflows in fp16 / bf16: it stays float32, as in training
            pipe.vae.to(dtype=torch_dtype("fp32"))
    pipe.save_pretrained(str(tmp), safe_serialization=True)


def write_single_file(path: Path, student, mode: str, scheduler, dtype: str, metadata: dict) -> None:
    """The student's denoiser (a LoRA student fused into its base) as one .safetensors in diffusers'
    key names, and the scheduler."""
    from safetensors.torch import save_file

    from dmad.sample.lora_file import torch_dtype

    tensors = {k: v.detach().to(torch_dtype(dtype)).contiguous() for k, v in fused_unet(student, mode).state_dict().items()}
    save_file(tensors, str(path), metadata=metadata)
    scheduler.save_pretrained(str(path.parent / "scheduler"))


def write_lora_single_file(path: Path, student, scheduler, family, dtype: str, metadata: dict,
                           user_layers: Optional[dict] = None) -> None:
    """One .safetensors in the family's single-file layout (dmad.sample.lora_file), and the scheduler;
    with `user_layers`, the user's LoRAs merged into it."""
    from safetensors.torch import save_file

    from dmad.sample.lora_file import single_file_tensors, torch_dtype

    save_file(single_file_tensors(student, family.denoiser_name, torch_dtype(dtype), family.name, user_layers),
              str(path), metadata=metadata)
    scheduler.save_pretrained(str(path.parent / "scheduler"))


def _file_metadata(doc: dict, student) -> dict:
    from dmad.sample.lora_file import ARCHITECTURE, adapter_rank, single_file_metadata

    if doc["format"] == "single-file":  # a whole denoiser: no network rank; the user's LoRAs are in it
        meta = single_file_metadata(
            family=doc["family"], base_model=doc["teacher_name"], rank=0, dtype=doc["dtype"],
            steps=doc["num_inference_steps"], timesteps=doc["student_timesteps"], sampler="lcm",
            scheduler="sgm_uniform", guidance=doc["guidance_scale"],
            user_loras=[{**x, "merged_into_this_file": True} for x in doc["teacher_loras"]], run=doc["run_name"],
            checkpoint=doc["checkpoint"])
        meta = {k: v for k, v in meta.items() if not k.startswith("ss_")}
        meta.update({"dmad_format": "single-file", "dmad_key_layout": f"diffusers {doc['denoiser']}",
                     "modelspec.architecture": ARCHITECTURE.get(doc["family"], doc["family"]).removesuffix("/lora")})
        return meta
    return single_file_metadata(
        family=doc["family"], base_model=doc["teacher_name"], rank=adapter_rank(student), dtype=doc["dtype"],
        steps=doc["num_inference_steps"], timesteps=doc["student_timesteps"], sampler="lcm",
        scheduler="sgm_uniform", guidance=doc["guidance_scale"],
        user_loras=[{**x, "merged_into_this_file": bool(doc.get("user_loras_merged"))} for x in doc["teacher_loras"]],
        run=doc["run_name"],
        checkpoint=doc["checkpoint"])


def write_lora(tmp: Path, student, scheduler, family=None, dtype: str = "fp32") -> None:
    """peft's adapter state dict in the family's diffusers key layout, saved by the family
    pipeline's save_lora_weights with the adapter's LoraConfig as metadata (so lora_alpha != rank
    loads with the right scale). UNet families: converted to diffusers' UNet LoRA keys (as
    diffusers' SD/SDXL LoRA training scripts save); transformer families: peft's keys, saved as
    transformer_lora_layers (as diffusers' SD3/Flux LoRA training scripts save)."""
    import diffusers
    from diffusers.utils import convert_state_dict_to_diffusers
    from peft.utils import get_peft_model_state_dict

    from dmad.models.families import Family
    from dmad.sample.lora_file import torch_dtype

    family = family or Family()
    cls = getattr(diffusers, family.pipeline_class)
    metadata = student.peft_config["default"].to_dict()

    def cast(layers: dict) -> dict:
        return {k: v.to(torch_dtype(dtype)) for k, v in layers.items()}

    if family.denoiser_name == "unet":
        layers = cast(convert_state_dict_to_diffusers(get_peft_model_state_dict(student)))
        cls.save_lora_weights(str(tmp), unet_lora_layers=layers, weight_name=LORA_WEIGHT_NAME,
                              safe_serialization=True, unet_lora_adapter_metadata=metadata)
    else:
        layers = cast(get_peft_model_state_dict(student))
        cls.save_lora_weights(str(tmp), transformer_lora_layers=layers, weight_name=LORA_WEIGHT_NAME,
                              safe_serialization=True, transformer_lora_adapter_metadata=metadata)
    scheduler.save_pretrained(str(tmp / "scheduler"))


def _load_kwargs(teacher) -> str:
    """Extra from_pretrained arguments the family's folder needs: SD3 without T5 names its absent
    encoder (diffusers would otherwise look for it); SDXL without the invisible watermark (the
    engine's samples have none)."""
    family = teacher.family
    extra = ""
    for name in family.optional_components:
        if teacher.modules.get(name) is None:
            extra += f", {name}=None"
    if family.name == "sdxl":
        extra += ", add_watermarker=False"
    return extra


def _teacher_lines(teacher) -> list[str]:
    info, cls = teacher.info, teacher.family.pipeline_class
    if info.kind == "folder":
        return [f"pipe = {cls}.from_pretrained({info.path!r}{_load_kwargs(teacher)}, local_files_only=True)"]
    # as dmad.models.teacher loads it: configs and tokenizers from the local config folder, no Hub
    toks = teacher.family.tokenizers
    lines = ["from transformers import CLIPTokenizer"]
    for tok in toks:
        lines.append(f"{tok} = CLIPTokenizer.from_pretrained({info.config_dir!r}, subfolder={tok!r}, "
                     "local_files_only=True)")
    passed = ", ".join(f"{tok}={tok}" for tok in toks)
    if teacher.family.name in ("sd1", "sd2"):
        return lines + [f"pipe = {cls}.from_single_file({info.path!r}, config={info.config_dir!r},",
                        f"    {passed}, local_files_only=True, safety_checker=None, feature_extractor=None,",
                        "    requires_safety_checker=False)"]
    return lines + [f"pipe = {cls}.from_single_file({info.path!r}, config={info.config_dir!r},",
                    f"    {passed}{_load_kwargs(teacher)}, local_files_only=True)"]


@dataclass
class Example:
    """The README's example call: the run's first prompt with its seed, so the image it gives can
    be compared with samples/iter_<N>/<id>.png."""

    id: str
    prompt: str
    seed: int
    width: int
    height: int


def example_item(src: ExportSource) -> Example:
    from dmad.contract.prompts import item_seed, load_prompt_set

    try:
        ps = load_prompt_set(src.run / "prompt_set.json")
    except UserInputError:
        r = src.cfg.resources.resolution
        return Example("example", "a photo of a cat", 0, int(r), int(r))
    item = ps.items[0]
    return Example(item.id, item.prompt, item_seed(ps, item), ps.width, ps.height)


def student_guidance(teacher, student) -> float:
    """The pipeline's guidance_scale that samples the student as trained: the embedded guidance of
    a guidance-distilled (Flux dev) student, else 1.0 (no classifier-free guidance)."""
    family = teacher.family
    return float(family.guidance) if family.guidance_embedded(student) else 1.0


@dataclass
class Sampling:
    """How the exported scheduler is driven: LCM's step count or timesteps (UNet families), or the
    student's sigmas (flow families); the guidance_scale; the latent shape (flow families)."""

    timesteps: list
    reproduces: bool
    guidance: float = 1.0
    sigmas: Optional[list] = None
    latent_shape: Optional[tuple] = None  # (C, h, w) of the item noise


def _call_lines(teacher, s: Sampling, ex: Example) -> list[str]:
    family = teacher.family
    if not family.flow:
        steps = f"num_inference_steps={len(s.timesteps)}" if s.reproduces else f"timesteps={list(s.timesteps)}"
        return [f"generator = torch.Generator('cpu').manual_seed({ex.seed})  # CPU generator, on any device",
                f"image = pipe({ex.prompt!r}, {steps}, guidance_scale={s.guidance!r},",
                f"             width={ex.width}, height={ex.height}, generator=generator).images[0]"]
    c, h, w = s.latent_shape
    lines = [f"generator = torch.Generator('cpu').manual_seed({ex.seed})  # CPU generator, on any device",
             f"latents = torch.randn((1, {c}, {h}, {w}), generator=generator)  # the student's initial noise"]
    if family.name == "flux":
        lines.append(f"latents = {family.pipeline_class}._pack_latents(latents, 1, {c}, {h}, {w})  "
                     "# Flux's 2x2 packed layout")
    lines += ["# the pipeline calls scheduler.step without a generator (re-noising from torch's global one,",
              "# on the pipeline's device): hand it the item's, so the draws are the run's on any device",
              "step = pipe.scheduler.step",
              "pipe.scheduler.step = lambda *args, **kwargs: step(*args, **kwargs, generator=generator)",
              f"image = pipe({ex.prompt!r}, sigmas={list(s.sigmas)!r}, guidance_scale={s.guidance!r},",
              f"             width={ex.width}, height={ex.height}, latents=latents, generator=generator).images[0]"]
    return lines


def single_file_name(src: ExportSource, steps: int) -> str:
    """The single-file LoRA's name: run, checkpoint and steps, in characters every tool accepts."""
    import re

    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", f"{src.run.name}-iter_{src.iter}-{steps}step").strip("._") or "student"
    return f"{stem}.safetensors"


def usage_lines(fmt: str, out: Path, teacher, s: Sampling, ex: Example, weight_name: str = LORA_WEIGHT_NAME,
                merged: bool = False) -> list[str]:
    """The exact python that samples the student with plain diffusers."""
    family = teacher.family
    cls = family.pipeline_class
    sched_cls = "FlowMatchEulerDiscreteScheduler" if family.flow else "LCMScheduler"
    lines = ["import torch", f"from diffusers import {sched_cls}, {cls}", ""]
    if fmt == "diffusers":
        lines += [f"pipe = {cls}.from_pretrained({str(out)!r}{_load_kwargs(teacher)}, local_files_only=True)"]
    elif fmt == "single-file":  # the base pipeline, the user's LoRAs fused as the engine fused them, the student's denoiser
        lines = ["import torch", "from safetensors.torch import load_file",
                 f"from diffusers import {sched_cls}, {cls}", ""] + _teacher_lines(teacher)
        if teacher.loras:
            names = [f"user_{i}" for i in range(len(teacher.loras))]
            for name, lora in zip(names, teacher.loras):
                f = Path(lora["path"])
                lines.append(f"pipe.load_lora_weights({str(f.parent)!r}, weight_name={f.name!r}, adapter_name={name!r})")
            lines += [f"pipe.set_adapters({names!r}, adapter_weights={[float(x['scale']) for x in teacher.loras]!r})",
                      "pipe.fuse_lora(adapter_names=" + repr(names) + ")  # as the engine fused them into the teacher "
                      "(its text encoders too)", "pipe.unload_lora_weights()"]
        lines += [f"pipe.{family.denoiser_name}.load_state_dict(load_file({str(out / weight_name)!r}))  "
                  "# the student (your LoRAs are in it)",
                  f"pipe.scheduler = {sched_cls}.from_pretrained({str(out)!r}, subfolder='scheduler')"]
    elif not teacher.loras or merged:  # merged: the one file holds the user's LoRAs too
        lines += _teacher_lines(teacher) + [
            f"pipe.scheduler = {sched_cls}.from_pretrained({str(out)!r}, subfolder='scheduler')",
            f"pipe.load_lora_weights({str(out)!r}, weight_name={weight_name!r})"]
    else:  # the student was distilled from base + these LoRAs: it goes on top of them, at their scales
        lines += _teacher_lines(teacher) + [
            f"pipe.scheduler = {sched_cls}.from_pretrained({str(out)!r}, subfolder='scheduler')"]
        names = []
        for i, lora in enumerate(teacher.loras):
            f = Path(lora["path"])
            names.append(f"user_{i}")
            lines.append(f"pipe.load_lora_weights({str(f.parent)!r}, weight_name={f.name!r}, adapter_name='user_{i}')  "
                         f"# distilled with it")
        lines += [f"pipe.load_lora_weights({str(out)!r}, weight_name={weight_name!r}, adapter_name='student')",
                  f"pipe.set_adapters({[*names, 'student']!r}, "
                  f"adapter_weights={[float(x['scale']) for x in teacher.loras] + [1.0]!r})"]
    return lines + _call_lines(teacher, s, ex)


def _readme(doc: dict, lines: list[str], ex: Example) -> str:
    cls, den = doc["pipeline_class"], doc["denoiser"]
    den_word = "UNet" if den == "unet" else "transformer"
    encoders = ("VAE, text encoder and tokenizer" if doc["family"] in ("sd1", "sd2")
                else "VAE, text encoders and tokenizers")
    what = (f"a complete {cls} folder (teacher {encoders}; the student's {den_word}"
            + (f", its LoRA fused into the base {den_word}" if doc["student"] == "lora" else "") + ")"
            if doc["format"] == "diffusers" else
            f"the student's LoRA ({LORA_WEIGHT_NAME}, diffusers format) for the teacher pipeline, and the scheduler"
            if doc["format"] == "lora" else
            f"the student's {den_word} as one file, `{doc['lora_weight_name']}` (diffusers key names"
            + (", its LoRA fused into the base weights" if doc["student"] == "lora" else "")
            + "), for ComfyUI's Load Diffusion Model node and for diffusers, and the scheduler"
            if doc["format"] == "single-file" else
            f"the student's LoRA as one file, `{doc['lora_weight_name']}` ({doc['single_file_layout']}), for ComfyUI, "
            "Forge, A1111 and diffusers, and the scheduler")
    same = ("the same pixels" if doc["student"] == "full" else
            "the same image within one 8-bit code value (diffusers' LoRA layers, or fused weights, round "
            "differently from dmad's adapter)")
    if doc["student"] == "lora" and doc["teacher_loras"] and doc["format"] not in ("diffusers", "single-file"):
        same = ("the same image within two 8-bit code values (the engine fused your LoRAs into the teacher; "
                "diffusers keeps them, and the student, as adapters, which round differently)")
    if doc["dtype"] != "fp32":
        same = (f"nearly the same image (the weights were saved in {doc['dtype']}, so they differ from the "
                "trained float32 ones by its rounding)")
    if doc["flow"]:
        how = (f"The student samples in {len(doc['student_timesteps'])} step(s) at sigmas {doc['student_sigmas']} "
               f"(timesteps {doc['student_timesteps']} of its flow schedule): it predicts x0, then re-noises it "
               "with fresh noise to the next sigma. The FlowMatchEulerDiscreteScheduler in `scheduler/` does "
               "exactly this (stochastic_sampling; shift 1.0 and no dynamic shifting, so the sigmas passed are "
               "used as given).")
        how += (f" The student was trained with embedded guidance {doc['guidance_scale']}: keep "
                f"guidance_scale={doc['guidance_scale']}." if doc["guidance_embedded"] else
                " The student is sampled without classifier-free guidance: keep guidance_scale=1.0.")
        exact = (f"This renders prompt `{ex.id}` of the run's prompt set with its seed: on a CPU, {same} as "
                 f"`samples/{doc['checkpoint']}/{ex.id}.png` and `dmad sample` (same latents, same re-noising "
                 "draws, which the wrapped scheduler.step takes from the item's CPU generator); on a GPU the "
                 "same draws, within float round-off (one code value on an NVIDIA H200).")
    else:
        how = (f"The student samples in {len(doc['student_timesteps'])} step(s) at timesteps "
               f"{doc['student_timesteps']}: it predicts x0, then re-noises it with fresh noise to the next "
               "timestep. The LCMScheduler in `scheduler/` does exactly this (timestep_scaling 1e9 turns LCM's "
               "boundary condition into the identity). The student is sampled without classifier-free guidance: "
               "keep guidance_scale=1.0.")
        exact = (f"This renders prompt `{ex.id}` of the run's prompt set with its seed: on a CPU, {same} as "
                 f"`samples/{doc['checkpoint']}/{ex.id}.png` and `dmad sample` (same latents, same re-noising draws)"
                 + ("." if doc["exact"] else ", except at timestep 0, where LCMScheduler returns the sample itself "
                    "instead of the student's x0 prediction (a difference of sqrt(1 - alphas_cumprod[0]) of the "
                    "noise)."))
    return "\n".join([
        f"# DMAD student export: {doc['run_name']} {doc['checkpoint']}", "",
        f"This folder holds {what}, written by `dmad export` from run `{doc['run']}`, checkpoint "
        f"`{doc['checkpoint']}` ({doc['weights']} weights).", "",
        how, "",
        "```python", *lines, "```", "",
        exact,
        "Use your own prompt and any seed the same way.", "", *_tools_section(doc)])


def _tools_section(doc: dict) -> list[str]:
    """For the single files: how to use them where users generate (ComfyUI, Forge, A1111)."""
    if doc["format"] not in ("lora-single-file", "single-file"):
        return []
    steps = doc["num_inference_steps"]
    guidance = (f"CFG 1 and Flux guidance {doc['guidance_scale']:g} (the embedded guidance it was trained with)"
                if doc["guidance_embedded"] else "CFG 1 (no classifier-free guidance)")
    sampling = (f"sample with {steps} step(s), {guidance}, the `lcm` sampler (predict, then re-noise to the next "
                f"noise level, as the student was trained to sample) and the `sgm_uniform` scheduler. Those tools' "
                f"schedules put the steps close to, not exactly at, the student's timesteps {doc['student_timesteps']}, "
                "so their images are close to the run's samples, not the same pixels; the diffusers lines above are exact.")
    if doc["format"] == "single-file":
        users = ("" if not doc["teacher_loras"] else
                 " Your LoRAs (" + ", ".join(f"`{x['name']}` at {x['scale']:g}" for x in doc["teacher_loras"])
                 + ") are in the file's weights: do not load them on the model again; if one also changes the text "
                 "encoder, load it with a LoRA loader at model strength 0 and its clip strength at that scale.")
        return ["## In ComfyUI", "",
                f"Copy `{doc['lora_weight_name']}` into `models/diffusion_models` and load it with the Load "
                f"Diffusion Model node (ComfyUI reads diffusers' {doc['denoiser']} key names: comfy/sd.py "
                "load_diffusion_model_state_dict); take the text encoders and the VAE from the base model "
                f"`{doc['teacher_name']}`; then {sampling}{users}", "",
                "The file's metadata (any safetensors viewer) names the base model, the family, the steps, the "
                "suggested sampler, scheduler and CFG, and the user LoRAs in it.", ""]
    return ["## In ComfyUI, Forge or A1111", "",
            f"Copy `{doc['lora_weight_name']}` into the tool's LoRA folder (ComfyUI: `models/loras`; Forge and "
            f"A1111: `models/Lora`), load it on the base model `{doc['teacher_name']}` at strength 1.0, and "
            f"{sampling}",
            "", "The file's metadata (any safetensors viewer) names the base model, the family, the steps and "
            "the suggested sampler, scheduler and CFG.", ""]


def lora_name(path: str) -> str:
    """How a user LoRA is named in the export: its file name, or for a diffusers LoRA folder the
    folder's name (every such folder's file is pytorch_lora_weights.safetensors)."""
    f = Path(path)
    return f"{f.parent.name}/{f.name}" if f.name == LORA_WEIGHT_NAME else f.name


def _doc(fmt: str, src: ExportSource, teacher, state, s: Sampling, sched, guidance_embedded: bool,
         dtype: str = "fp32", weight_name: Optional[str] = None) -> dict:
    import diffusers
    import torch

    family = teacher.family
    if family.flow:
        scheduler = {"class": type(sched).__name__,
                     **{k: sched.config[k] for k in ("shift", "use_dynamic_shifting", "stochastic_sampling")}}
    else:
        scheduler = {"class": "LCMScheduler", "original_inference_steps": sched.config.original_inference_steps,
                     "timestep_scaling": sched.config.timestep_scaling}
    doc = {"format": fmt, "run": str(src.run), "run_name": src.run.name, "checkpoint": src.checkpoint.name,
           "iter": src.iter, "student": src.cfg.identity.student, "method": src.cfg.distillation.method,
           "weights": "ema" if (src.checkpoint / "ema.safetensors").is_file() else "trained",
           "teacher": teacher.info.path, "family": family.name, "pipeline_class": family.pipeline_class,
           "denoiser": family.denoiser_name, "flow": family.flow, "prediction_type": state.prediction_type,
           "student_timesteps": list(state.student_timesteps), "num_inference_steps": len(state.student_timesteps),
           "num_inference_steps_gives_timesteps": s.reproduces, "guidance_scale": s.guidance,
           "guidance_embedded": guidance_embedded,
           # LCM's boundary condition at t = 0 returns the sample itself, not the x0 prediction
           "exact": (0 not in state.student_timesteps) if not family.flow else True,
           "scheduler": scheduler,
           "lora_weight_name": (weight_name or LORA_WEIGHT_NAME) if fmt in (*LORA_FORMATS, "single-file") else None,
           "dtype": dtype, "teacher_name": Path(teacher.info.path).name,
           # the user's LoRAs fused into the teacher (identity.teacher_loras): a LoRA student is meant for
           # base + these at these scales
           "teacher_loras": [{"name": lora_name(x["path"]), "scale": x["scale"], "sha256": x["sha256"]}
                             for x in teacher.loras],
           "versions": {"torch": torch.__version__, "diffusers": diffusers.__version__},
           "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    if fmt == "lora-single-file":
        doc["single_file_layout"] = ("kohya (lora_unet_*)" if family.denoiser_name == "unet"
                                     else f"diffusers ({family.denoiser_name}.*)")
    if family.flow:
        doc["student_sigmas"] = list(s.sigmas)
        doc["latent_shape"] = list(s.latent_shape)
    return doc


def export(src: ExportSource, fmt: str, out: Path, dtype: str = "fp32", merge_user_loras: bool = False) -> Path:
    """Write the export to a temp folder beside `out`, then rename it to `out`."""
    import torch

    from dmad.sample.render import latent_shape

    check_request(src, fmt, out, merge_user_loras)
    user_layers: Optional[dict] = {} if merge_user_loras else None
    teacher, student, state = load_student(src, user_layers)
    family = teacher.family
    timesteps = list(state.student_timesteps)
    ex = example_item(src)
    embedded = family.guidance_embedded(student)
    guidance = student_guidance(teacher, student)
    if family.flow:
        schedule = family.schedule(teacher.scheduler, src.cfg.resources.resolution)
        sched = flow_student_scheduler(teacher.scheduler.config)
        check_flow_scheduler_matches(sched, schedule, timesteps)
        sampling = Sampling(timesteps, True, guidance, student_sigmas(schedule, timesteps),
                            latent_shape(teacher.vae, ex.width, ex.height))
    else:
        sched, reproduces = make_student_scheduler(teacher, timesteps)
        sampling = Sampling(timesteps, reproduces, guidance)

    weight_name = single_file_name(src, len(timesteps)) if fmt in ("lora-single-file", "single-file") else LORA_WEIGHT_NAME

    def write(tmp: Path) -> None:
        doc = _doc(fmt, src, teacher, state, sampling, sched, embedded, dtype, weight_name)
        doc["user_loras_merged"] = merge_user_loras
        with torch.no_grad():
            if fmt == "diffusers":
                write_diffusers(tmp, teacher, student, src.cfg.identity.student, sched, dtype)
            elif fmt == "lora":
                write_lora(tmp, student, sched, family, dtype)
            elif fmt == "single-file":
                write_single_file(tmp / weight_name, student, src.cfg.identity.student, sched, dtype,
                                  _file_metadata(doc, student))
            else:
                write_lora_single_file(tmp / weight_name, student, sched, family, dtype, _file_metadata(doc, student),
                                       user_layers)
        (tmp / "dmad_export.json").write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
        lines = usage_lines(fmt, out, teacher, sampling, ex, weight_name, merged=merge_user_loras)
        (tmp / "README.md").write_text(_readme(doc, lines, ex), encoding="utf-8")

    write_complete(out, write, needed=lambda: export_bytes(teacher, student, fmt, dtype))
    return out


def write_complete(out: Path, write: Callable[[Path], None], needed: Callable[[], int]) -> None:
    """`write(tmp)` into a temp folder beside `out`, then renamed to `out`: complete or absent. On any
    failure the temp folder and the parents made for it are removed; a full disk is one line (what,
    about how much it needs, what is free), and so is an `out` that another export made meanwhile."""
    tmp = out.parent / f".tmp-{out.name}-{os.getpid()}"
    made = [tmp, *missing_folders(out.parent)]
    try:
        with reporting_disk_full(f"the export {out.name}", out.parent, needed):
            make_output_folder(out.parent, f"--out {out}")
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir()
            write(tmp)
            _publish(tmp, out)
    except BaseException:
        remove_made(made)
        raise


def _publish(tmp: Path, out: Path) -> None:
    """Rename the finished folder to `out`. Another export to the same --out that finished first
    keeps its complete folder (a folder is never renamed over a non-empty one)."""
    try:
        os.rename(tmp, out)
    except OSError as e:
        if e.errno in (errno.ENOTEMPTY, errno.EEXIST) or out.exists():
            raise UserInputError(f"--out {printable(str(out))} was created by another export while this one ran "
                                 f"(that one is kept; this one was removed)") from None
        raise


def export_bytes(teacher, student, fmt: str, dtype: str = "fp32") -> int:
    """About what the export takes on disk: the tensors it saves (a LoRA's adapter weights, or every
    network of the pipeline), in their own dtypes, or 2 bytes a value in fp16 / bf16."""
    if fmt in LORA_FORMATS:
        tensors = [p for name, p in student.named_parameters() if "lora_" in name]
    elif fmt == "single-file":
        tensors = [t for name, t in student.state_dict().items() if "lora_" not in name]
    else:
        nets = [m for m in teacher.networks() if m is not student] + [student]
        tensors = [t for m in nets for t in m.state_dict().values()]
    return sum(t.numel() * (t.element_size() if dtype == "fp32" else min(2, t.element_size())) for t in tensors)


def main(run: str, checkpoint: str, fmt: str, out: Optional[str], dtype: str = "fp32",
         merge_user_loras: bool = False) -> int:
    """The `dmad export` command: prints the output folder on stdout."""
    given = Path(out).expanduser().resolve() if out else None
    src = resolve_source(run, checkpoint, fmt, given)
    target = given or default_out(src, fmt)
    if not out:  # into the run folder: never through a link that leaves it
        RunFolder(src.run).check_confined()
    check_request(src, fmt, target, merge_user_loras)  # before torch is imported: bad requests answer fast
    if dtype not in DTYPES:
        raise UserInputError(f"--dtype {printable(dtype)[:20]!r}: expected one of {', '.join(DTYPES)}")
    print(export(src, fmt, target, dtype, merge_user_loras), flush=True)
    return 0
