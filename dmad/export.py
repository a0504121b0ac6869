"""`dmad export`: a checkpoint's student, in the forms the rest of the ecosystem loads.

diffusers  a complete StableDiffusionPipeline folder: the teacher's VAE, text encoder and
           tokenizer, the student's UNet (a LoRA student fused into the base UNet), safetensors
           only, and a scheduler that reproduces the student's own sampler.
lora       for LoRA students: pytorch_lora_weights.safetensors (diffusers' LoRA format, written
           by peft + diffusers' own routines) that `pipe.load_lora_weights` puts on the teacher,
           plus the same scheduler config.
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
"""
from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from dmad.errors import UserInputError

FORMATS = ("diffusers", "lora")
TIMESTEP_SCALING = 1e9  # makes LCM's c_out exactly 1 and c_skip negligible (module docstring)
LORA_WEIGHT_NAME = "pytorch_lora_weights.safetensors"  # diffusers' default name for load_lora_weights


@dataclass
class ExportSource:
    """What is exported: the run, its config and one complete checkpoint."""

    run: Path
    cfg: object            # dmad.config.TrainConfig of the run
    iter: int
    checkpoint: Path


def resolve_source(run_dir: str, checkpoint: str) -> ExportSource:
    """The run folder and checkpoint named on the command line; UserInputError for anything missing.
    Torch-free: the CLI answers these errors in a fraction of a second."""
    from dmad.config import load_config
    from dmad.runs import RunFolder

    folder = RunFolder.open(Path(run_dir).expanduser().resolve())
    cfg = load_config(folder.config_json)
    if checkpoint == "latest":
        latest = folder.latest_checkpoint()
        if latest is None:
            raise UserInputError(f"no complete checkpoint in {folder.checkpoints_dir}")
        it, path = latest
    else:
        try:
            it = int(checkpoint)
        except ValueError:
            raise UserInputError(f"--checkpoint {checkpoint!r}: expected 'latest' or an iteration number") from None
        found = dict(folder.list_checkpoints())
        if it not in found:
            have = ", ".join(str(i) for i in sorted(found)) or "none"
            raise UserInputError(f"--checkpoint {it}: no checkpoint iter_{it} in {folder.checkpoints_dir} "
                                 f"(complete checkpoints: {have})")
        path = found[it]
    if not (path / "training_state.json").is_file():
        raise UserInputError(f"checkpoint {path} is incomplete (no training_state.json)")
    return ExportSource(run=folder.path, cfg=cfg, iter=it, checkpoint=path)


def default_out(src: ExportSource, fmt: str) -> Path:
    return src.run / "export" / f"iter_{src.iter}-{fmt}"


def check_request(src: ExportSource, fmt: str, out: Path) -> None:
    if fmt not in FORMATS:
        raise UserInputError(f"--format {fmt!r}: expected one of {', '.join(FORMATS)}")
    if fmt == "lora" and src.cfg.identity.student != "lora":
        raise UserInputError(f"--format lora: the student of {src.run} is a full UNet (identity.student "
                             f"'{src.cfg.identity.student}'), not a LoRA; use --format diffusers")
    if out.exists():
        raise UserInputError(f"--out {out} already exists (choose another folder or remove it)")


# --------------------------------------------------------------------------- the student

def load_student(src: ExportSource):
    """(teacher, student UNet in float32 eval mode, training state). The student holds the weights
    the run's samples were rendered with: the EMA weights when the checkpoint has them."""
    import torch

    from dmad.checkpoint import load_student as load_checkpoint_student
    from dmad.checkpoint import read_training_state
    from dmad.models.teacher import load_teacher

    ident = src.cfg.identity
    state = read_training_state(src.checkpoint)
    teacher = load_teacher(ident.pretrained_model_name_or_path, ident.model_family, ident.teacher_config_dir,
                           dtype=torch.float32)
    student, _ = load_checkpoint_student(teacher, ident, src.checkpoint)
    teacher.unet = None  # not exported: frees its memory (SD 1.5 in float32: 3.4 GB)
    return teacher, student, state


def fused_unet(student, mode: str):
    """A plain UNet2DConditionModel: the full student as is; a LoRA student merged into its base
    weights by peft (diffusers' fuse_lora) and stripped of the adapter layers (unload_lora)."""
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


# --------------------------------------------------------------------------- writers

def _pipeline(teacher, unet, scheduler):
    from diffusers import StableDiffusionPipeline

    return StableDiffusionPipeline(vae=teacher.vae, text_encoder=teacher.text_encoder, tokenizer=teacher.tokenizer,
                                   unet=unet, scheduler=scheduler, safety_checker=None, feature_extractor=None,
                                   requires_safety_checker=False)


def write_diffusers(tmp: Path, teacher, student, mode: str, scheduler) -> None:
    _pipeline(teacher, fused_unet(student, mode), scheduler).save_pretrained(str(tmp), safe_serialization=True)


def write_lora(tmp: Path, student, scheduler) -> None:
    """peft's adapter state dict in diffusers' key layout, saved by diffusers with the adapter's
    LoraConfig as metadata (so lora_alpha != rank loads with the right scale)."""
    from diffusers import StableDiffusionPipeline
    from diffusers.utils import convert_state_dict_to_diffusers
    from peft.utils import get_peft_model_state_dict

    layers = convert_state_dict_to_diffusers(get_peft_model_state_dict(student))
    StableDiffusionPipeline.save_lora_weights(str(tmp), unet_lora_layers=layers, weight_name=LORA_WEIGHT_NAME,
                                              safe_serialization=True,
                                              unet_lora_adapter_metadata=student.peft_config["default"].to_dict())
    scheduler.save_pretrained(str(tmp / "scheduler"))


def _teacher_lines(teacher) -> list[str]:
    info = teacher.info
    if info.kind == "folder":
        return [f"pipe = StableDiffusionPipeline.from_pretrained({info.path!r}, local_files_only=True)"]
    # as dmad.models.teacher loads it: configs and tokenizer from the local config folder, no Hub
    return ["from transformers import CLIPTokenizer",
            f"tokenizer = CLIPTokenizer.from_pretrained({info.config_dir!r}, subfolder='tokenizer', "
            "local_files_only=True)",
            f"pipe = StableDiffusionPipeline.from_single_file({info.path!r}, config={info.config_dir!r},",
            "    tokenizer=tokenizer, local_files_only=True, safety_checker=None, feature_extractor=None,",
            "    requires_safety_checker=False)"]


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
    from dmad.prompts import item_seed, load_prompt_set

    try:
        ps = load_prompt_set(src.run / "prompt_set.json")
    except UserInputError:
        r = src.cfg.resources.resolution
        return Example("example", "a photo of a cat", 0, int(r), int(r))
    item = ps.items[0]
    return Example(item.id, item.prompt, item_seed(ps, item), ps.width, ps.height)


def usage_lines(fmt: str, out: Path, teacher, timesteps: list[int], reproduces: bool, ex: Example) -> list[str]:
    """The exact python that samples the student with plain diffusers."""
    steps = f"num_inference_steps={len(timesteps)}" if reproduces else f"timesteps={list(timesteps)}"
    lines = ["import torch", "from diffusers import LCMScheduler, StableDiffusionPipeline", ""]
    if fmt == "diffusers":
        lines += [f"pipe = StableDiffusionPipeline.from_pretrained({str(out)!r}, local_files_only=True)"]
    else:
        lines += _teacher_lines(teacher) + [
            f"pipe.scheduler = LCMScheduler.from_pretrained({str(out)!r}, subfolder='scheduler')",
            f"pipe.load_lora_weights({str(out)!r}, weight_name={LORA_WEIGHT_NAME!r})"]
    lines += [f"generator = torch.Generator('cpu').manual_seed({ex.seed})  # CPU generator, on any device",
              f"image = pipe({ex.prompt!r}, {steps}, guidance_scale=1.0,",
              f"             width={ex.width}, height={ex.height}, generator=generator).images[0]"]
    return lines


def _readme(doc: dict, lines: list[str], ex: Example) -> str:
    what = ("a complete StableDiffusionPipeline folder (teacher VAE, text encoder and tokenizer; the student's UNet"
            + (", its LoRA fused into the base UNet" if doc["student"] == "lora" else "") + ")"
            if doc["format"] == "diffusers" else
            f"the student's LoRA ({LORA_WEIGHT_NAME}, diffusers format) for the teacher pipeline, and the scheduler")
    same = ("the same pixels" if doc["student"] == "full" else
            "the same image within one 8-bit code value (diffusers' LoRA layers, or fused weights, round "
            "differently from dmad's adapter)")
    return "\n".join([
        f"# DMAD student export: {doc['run_name']} {doc['checkpoint']}", "",
        f"This folder holds {what}, written by `dmad export` from run `{doc['run']}`, checkpoint "
        f"`{doc['checkpoint']}` ({doc['weights']} weights).", "",
        f"The student samples in {len(doc['student_timesteps'])} step(s) at timesteps {doc['student_timesteps']}: "
        "it predicts x0, then re-noises it with fresh noise to the next timestep. The LCMScheduler in "
        "`scheduler/` does exactly this (timestep_scaling 1e9 turns LCM's boundary condition into the identity). "
        "The student is sampled without classifier-free guidance: keep guidance_scale=1.0.", "",
        "```python", *lines, "```", "",
        f"This renders prompt `{ex.id}` of the run's prompt set with its seed: on a CPU, {same} as "
        f"`samples/{doc['checkpoint']}/{ex.id}.png` and `dmad sample` (same latents, same re-noising draws)"
        + ("." if doc["exact"] else ", except at timestep 0, where LCMScheduler returns the sample itself "
           "instead of the student's x0 prediction (a difference of sqrt(1 - alphas_cumprod[0]) of the noise)."),
        "Use your own prompt and any seed the same way.", ""])


def _doc(fmt: str, src: ExportSource, teacher, state, reproduces: bool, sched) -> dict:
    import diffusers
    import torch

    return {"format": fmt, "run": str(src.run), "run_name": src.run.name, "checkpoint": src.checkpoint.name,
            "iter": src.iter, "student": src.cfg.identity.student,
            "weights": "ema" if (src.checkpoint / "ema.safetensors").is_file() else "trained",
            "teacher": teacher.info.path, "prediction_type": state.prediction_type,
            "student_timesteps": list(state.student_timesteps), "num_inference_steps": len(state.student_timesteps),
            "num_inference_steps_gives_timesteps": reproduces, "guidance_scale": 1.0,
            # LCM's boundary condition at t = 0 returns the sample itself, not the x0 prediction
            "exact": 0 not in state.student_timesteps,
            "scheduler": {"class": "LCMScheduler", "original_inference_steps": sched.config.original_inference_steps,
                          "timestep_scaling": sched.config.timestep_scaling},
            "lora_weight_name": LORA_WEIGHT_NAME if fmt == "lora" else None,
            "versions": {"torch": torch.__version__, "diffusers": diffusers.__version__},
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


def export(src: ExportSource, fmt: str, out: Path) -> Path:
    """Write the export to a temp folder beside `out`, then rename it to `out`."""
    import torch

    from dmad.methods.prediction import NoiseSchedule

    check_request(src, fmt, out)
    teacher, student, state = load_student(src)
    timesteps = list(state.student_timesteps)
    sched, reproduces = student_scheduler(teacher.scheduler.config, timesteps)
    check_scheduler_matches(sched, NoiseSchedule.from_scheduler(teacher.scheduler), timesteps)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".tmp-{out.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        with torch.no_grad():
            if fmt == "diffusers":
                write_diffusers(tmp, teacher, student, src.cfg.identity.student, sched)
            else:
                write_lora(tmp, student, sched)
        doc = _doc(fmt, src, teacher, state, reproduces, sched)
        ex = example_item(src)
        (tmp / "dmad_export.json").write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
        lines = usage_lines(fmt, out, teacher, timesteps, reproduces, ex)
        (tmp / "README.md").write_text(_readme(doc, lines, ex), encoding="utf-8")
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def main(run: str, checkpoint: str, fmt: str, out: Optional[str]) -> int:
    """The `dmad export` command: prints the output folder on stdout."""
    src = resolve_source(run, checkpoint)
    target = Path(out).expanduser().resolve() if out else default_out(src, fmt)
    check_request(src, fmt, target)  # before torch is imported: bad requests answer fast
    print(export(src, fmt, target), flush=True)
    return 0
