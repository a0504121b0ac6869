"""Student validation images during training: the run's prompt set, rendered with the student's
own timesteps (never the teacher's step count), one PNG per prompt and a meta.json per folder.

Determinism: each item's noise comes from a CPU generator seeded with its prompt-set seed, so
the same weights give the same pixels whichever device trains and however far training got.
"""
from __future__ import annotations

import contextlib
import io
import json
import time
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np
import torch
from PIL import Image

from dmad.methods.dmd2 import sample_student
from dmad.methods.prediction import NoiseSchedule
from dmad.contract.diskspace import complete_or_absent
from dmad.contract.hashing import sha256_files
from dmad.contract.prompts import PromptSet, health_file_name, health_seed_list, item_seed
from dmad.contract.runs import SAMPLES_META, atomic_write_bytes, atomic_write_json
from dmad.errors import StopRequested


def library_versions() -> dict:
    """What a sample's pixels depend on besides the weights, for meta.json."""
    import platform

    import diffusers
    import PIL
    import transformers

    return {"python": platform.python_version(), "torch": torch.__version__, "diffusers": diffusers.__version__,
            "transformers": transformers.__version__, "numpy": np.__version__, "pillow": PIL.__version__}


def provenance(device: torch.device | str, checkpoint: Optional[str], weights_sha256: Optional[str],
               versions: dict, teacher_loras: Sequence[dict] = ()) -> dict:
    """The meta.json fields shared by teacher and student folders. `teacher_loras`: the user's LoRAs
    fused into the teacher (Teacher.loras): the teacher's images are base + them, and a student's
    LoRA is meant for base + them."""
    return {"checkpoint": checkpoint, "weights_sha256": weights_sha256,
            "teacher_loras": [{k: x[k] for k in ("path", "scale", "sha256")} for x in teacher_loras],
            "device": str(device),
            "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(), "versions": versions,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


def latent_shape(vae, width: int, height: int) -> tuple[int, int, int]:
    f = 2 ** (len(vae.config.block_out_channels) - 1)
    return vae.config.latent_channels, height // f, width // f


def _png(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="PNG")
    return buf.getvalue()


def health_meta(prompt_set: PromptSet, item_id: str, seeds: list[int]) -> dict:
    """An item's meta.json fields for its health seeds (none when the set has no health_seeds):
    health_files (the files of seeds k = 1..N-1) and health_seeds (all N seeds)."""
    if not prompt_set.health_seeds:
        return {}
    return {"health_files": [health_file_name(item_id, k) for k in range(1, len(seeds))], "health_seeds": list(seeds)}


def decode_to_png(vae, latents: torch.Tensor, family=None) -> bytes:
    """(1, C, h, w) latents -> PNG bytes. Decoded in the VAE's dtype (the family undoes its latent
    scale and shift; None: SD), clamped to [-1, 1]."""
    from dmad.models.families import Family

    img = (family or Family()).decode(vae, latents)[0]
    return _png(((img.permute(1, 2, 0).cpu().numpy() + 1.0) * 127.5).round().astype(np.uint8))


def item_noise(seed: int, shape: tuple[int, int, int]) -> tuple[torch.Tensor, torch.Generator]:
    """(1, C, h, w) float32 CPU noise of an item and the generator, which then drives any later
    draw (the student's re-noising): the same numbers on every device."""
    gen = torch.Generator("cpu").manual_seed(seed)
    return torch.randn((1, *shape), generator=gen), gen


@torch.no_grad()
def student_png(*, student, vae, emb, schedule: NoiseSchedule, timesteps: list[int], seed: int,
                device: torch.device, dtype: torch.dtype, cfg: Optional[float] = None,
                uncond=None, size: tuple[int, int], family=None) -> bytes:
    """One student image. `emb`: the prompt's conditioning (a Cond, or a (1, L, D) tensor for SD);
    cfg > 1 (with `uncond`) guides the student's own prediction, u + cfg (c - u), at twice the
    cost; None or 1: the plain student, as trained. `family`: the teacher's (None: SD)."""
    return student_pngs(student=student, vae=vae, emb=emb, schedule=schedule, timesteps=timesteps, seeds=[seed],
                        device=device, dtype=dtype, cfg=cfg, uncond=uncond, size=size, family=family)[0]


@torch.no_grad()
def student_pngs(*, student, vae, emb, schedule: NoiseSchedule, timesteps: list[int], seeds: list[int],
                 device: torch.device, dtype: torch.dtype, cfg: Optional[float] = None,
                 uncond=None, size: tuple[int, int], family=None) -> list[bytes]:
    """One prompt's student images at `seeds`, as one batch (student_png is the batch of one). Each
    image's noise and re-noising come from its own seed's generator, as in student_png; a batch's
    floats may differ from single renders in the last bits (batched matrix products)."""
    from dmad.models.families import Family, as_cond

    family = family or Family()
    drawn = [item_noise(seed, latent_shape(vae, *size)) for seed in seeds]
    noise, gens = torch.cat([n for n, _ in drawn]), [g for _, g in drawn]
    guided = cfg is not None and cfg != 1.0 and uncond is not None
    cond = as_cond(emb).to(device).expand(len(seeds))
    uncond = as_cond(uncond).to(device).expand(len(seeds)) if guided else None

    def x0_fn(x_t, t):
        if guided:
            return family.guided_x0(student, x_t.to(dtype), t, cond, uncond, cfg, schedule).float()
        return family.x0(student, x_t.to(dtype), t, cond, schedule).float()

    def fresh(like):
        return torch.cat([family.fresh_noise(like[i:i + 1], g) for i, g in enumerate(gens)])

    x0 = sample_student(x0_fn, noise.to(device), timesteps, schedule, noise_fn=fresh)
    return [decode_to_png(vae, x0[i:i + 1], family) for i in range(len(seeds))]


@torch.no_grad()
def render_student_samples(out_dir: Path, *, student, vae, encode, schedule: NoiseSchedule, timesteps: list[int],
                           prompt_set: PromptSet, iteration: int, device: torch.device,
                           dtype: torch.dtype, versions: dict, checkpoint: Optional[str] = None,
                           weights_sha256: Optional[str] = None, ema: bool = False, family=None,
                           method: Optional[str] = None, teacher_loras: Sequence[dict] = ()) -> list[str]:
    """Render every prompt with the student (at each of the prompt set's health seeds, when it has
    them: <id>~s<k>.png, listed in meta.json); returns the paths of the grid images (<id>.png). `encode(list[str])`
    gives text embeddings (B, L, D). `checkpoint` / `weights_sha256`: the checkpoint folder name and
    the hash of its weight files the student holds (None for a validation render between checkpoints).
    `method`: the distillation method that trained it (distillation.method), for meta.json."""
    t0 = time.time()
    with complete_or_absent(out_dir):  # a failed render (a full disk) leaves no folder of some images
        out_dir.mkdir(parents=True, exist_ok=True)
        was_training = student.training
        student.eval()
        paths, items = [], {}
        try:
            for item in prompt_set.items:
                emb = encode([item.prompt]).to(device)
                seeds = health_seed_list(prompt_set, item)
                # the grid image alone (its bytes as ever), then the health seeds as one batch
                for first, group in ((0, seeds[:1]), (1, seeds[1:])):
                    pngs = student_pngs(student=student, vae=vae, emb=emb, schedule=schedule, timesteps=timesteps,
                                        seeds=group, device=device, dtype=dtype,
                                        size=(prompt_set.width, prompt_set.height), family=family) if group else []
                    for k, png in enumerate(pngs, start=first):
                        atomic_write_bytes(out_dir / health_file_name(item.id, k), png, durable=False)
                paths.append(str(out_dir / health_file_name(item.id, 0)))
                items[item.id] = {"prompt": item.prompt, "seed": seeds[0], "file": health_file_name(item.id, 0),
                                  **health_meta(prompt_set, item.id, seeds)}
        finally:
            student.train(was_training)
        atomic_write_json(out_dir / SAMPLES_META, {
            "source": f"iter_{iteration}", "iter": iteration, "model": "student", "method": method, "ema": ema,
            "prompt_set": prompt_set.name, "prompt_set_version": prompt_set.version,
            "sampler": "student", "steps": len(timesteps), "timesteps": list(timesteps), "cfg": None,
            "resolution": [prompt_set.width, prompt_set.height], "items": items,
            "wall_time_s": round(time.time() - t0, 3),
            **provenance(device, checkpoint, weights_sha256, versions, teacher_loras),
        })
    return paths


# Diffusers scheduler classes for the prompt set's `sampler` names (dmad.contract.prompts.SAMPLERS).
SCHEDULERS = {
    "ddim": ("DDIMScheduler", {}), "ddpm": ("DDPMScheduler", {}), "pndm": ("PNDMScheduler", {}),
    "euler": ("EulerDiscreteScheduler", {}), "euler_a": ("EulerAncestralDiscreteScheduler", {}),
    "heun": ("HeunDiscreteScheduler", {}), "lms": ("LMSDiscreteScheduler", {}),
    "dpmpp_2m": ("DPMSolverMultistepScheduler", {"algorithm_type": "dpmsolver++"}),
    "unipc": ("UniPCMultistepScheduler", {}),
}


FLOW_SAMPLER = "flow_match_euler"  # what a flow-matching teacher samples with, whatever the prompt set names


def make_scheduler(name: str, base_config, family=None):
    """The named sampler, configured from the teacher's own scheduler config (its noise schedule
    and prediction type). A flow-matching family (SD3, Flux) has one sampler, its own
    FlowMatchEulerDiscreteScheduler (shift and dynamic shifting from the config)."""
    import diffusers

    if family is not None and family.flow:
        return diffusers.FlowMatchEulerDiscreteScheduler.from_config(base_config)
    cls_name, extra = SCHEDULERS[name]
    return getattr(diffusers, cls_name).from_config(base_config, **extra)


def sampler_name(name: str, family=None) -> str:
    return FLOW_SAMPLER if family is not None and family.flow else name


def sd_pipeline(modules, scheduler):
    """The family's diffusers pipeline (StableDiffusion / XL / 3 / Flux) on already-loaded modules
    (a dmad Teacher, or another pipeline's components with unet/vae/text_encoder/tokenizer) with
    the given sampler; no safety checker, no progress bar."""
    family = getattr(modules, "family", None)
    if family is None:
        from dmad.models.families import Family

        family = Family()
        parts = {k: getattr(modules, k) for k in family.pipeline_components()}
    else:
        parts = modules.modules
    return family.pipeline(parts, scheduler)


def teacher_weight_files(teacher) -> list[Path]:
    """The teacher denoiser's weight files (the whole file for a single-file teacher): what the
    teacher's weights_sha256 covers."""
    return [Path(f) for f in teacher.info.weights_files[teacher.info.denoiser]]


@torch.no_grad()
def teacher_png(pipe, *, prompt: str, negative_prompt: Optional[str], seed: int, steps: int, cfg: float,
                size: tuple[int, int], device: torch.device | str = "cpu", family=None) -> bytes:
    """One teacher image from `pipe` (sd_pipeline), its noise drawn exactly as for the student (a
    CPU generator seeded with the item's seed), so teacher and student images of one item start
    from the same latents. `family`: the teacher's (None: SD): its guidance arguments and latent layout."""
    from dmad.models.families import Family, quiet_pipeline_logs

    family = family or Family()
    with quiet_pipeline_logs():
        return _teacher_png(pipe, prompt, negative_prompt, seed, steps, cfg, size, device, family)


def _teacher_png(pipe, prompt, negative_prompt, seed, steps, cfg, size, device, family) -> bytes:
    denoiser = getattr(pipe, family.denoiser_name)
    noise, gen = item_noise(seed, latent_shape(pipe.vae, *size))
    latents = family.pipe_latents(noise).to(device=device, dtype=next(denoiser.parameters()).dtype)
    kwargs = {**family.pipe_call_kwargs(cfg, denoiser), **family.pipe_prompt_kwargs(_pipe_modules(pipe), [prompt],
                                                                                     negative_prompt)}
    if not family.decode_in_pipeline:
        out = pipe(latents=latents, num_inference_steps=steps, height=size[1], width=size[0], generator=gen,
                   output_type="latent", **kwargs).images
        return decode_to_png(pipe.vae, family.unpack_pipe_latents(out, *noise.shape[-2:]), family)
    image = pipe(latents=latents, num_inference_steps=steps, height=size[1], width=size[0], generator=gen,
                 output_type="pt", **kwargs).images[0]
    return _png((image.float().permute(1, 2, 0).cpu().numpy() * 255.0).round().clip(0, 255).astype(np.uint8))


def _pipe_modules(pipe) -> dict:
    return {k: v for k, v in pipe.components.items() if v is not None}


@contextlib.contextmanager
def inputs_in_own_dtype(net: torch.nn.Module):
    """While rendering with a diffusers pipeline: cast the floating inputs of `net` to its own
    dtype. A pipeline assumes one dtype for all its modules; training may hold the denoiser in
    another (teacher_precision bf16 / int8 / fp8 beside float32 text encoders)."""
    from dmad.models.families import net_dtype

    dtype = net_dtype(net)

    def cast(x):
        return x.to(dtype) if isinstance(x, torch.Tensor) and x.is_floating_point() else x

    def pre(module, args, kwargs):
        return tuple(cast(a) for a in args), {k: cast(v) for k, v in kwargs.items()}

    handle = net.register_forward_pre_hook(pre, with_kwargs=True)
    try:
        yield
    finally:
        handle.remove()


def _teacher_image(pipe, teacher, prompt_set: PromptSet, item, seed: int, device) -> bytes:
    with inputs_in_own_dtype(teacher.denoiser):
        return teacher_png(pipe, prompt=item.prompt, negative_prompt=item.negative_prompt, seed=seed,
                           steps=prompt_set.steps, cfg=prompt_set.cfg, size=(prompt_set.width, prompt_set.height),
                           device=device, family=teacher.family)


def _teacher_pipe(teacher, prompt_set: PromptSet):
    return sd_pipeline(teacher, make_scheduler(prompt_set.sampler, teacher.scheduler.config, teacher.family))


@torch.no_grad()
def render_teacher_samples(out_dir: Path, *, teacher, prompt_set: PromptSet, versions: dict,
                           device: torch.device | str = "cpu", weights_sha256: Optional[str] = None,
                           progress: Optional[Callable[[int, int], None]] = None, health: bool = True) -> list[str]:
    """The teacher reference images of a prompt set: its sampler, steps and CFG. One PNG per item
    and a meta.json (weights_sha256: of the teacher's UNet files, computed here when not given);
    then, with `health`, the prompt set's health seeds (add_teacher_health_seeds). Returns the grid
    images' paths. `progress(done, total)` after each image."""
    t0 = time.time()
    with complete_or_absent(out_dir):  # a failed render leaves no folder it made
        out_dir.mkdir(parents=True, exist_ok=True)
        family = teacher.family
        pipe = _teacher_pipe(teacher, prompt_set)
        paths, items = [], {}
        total = len(prompt_set.items) + (len(missing_health_seeds(out_dir, prompt_set)) if health else 0)
        for item in prompt_set.items:
            seed = item_seed(prompt_set, item)
            png = _teacher_image(pipe, teacher, prompt_set, item, seed, device)
            path = out_dir / f"{item.id}.png"
            atomic_write_bytes(path, png, durable=False)
            paths.append(str(path))
            items[item.id] = {"prompt": item.prompt, "negative_prompt": item.negative_prompt, "seed": seed, "file": path.name}
            if progress is not None:
                progress(len(paths), total)
        if weights_sha256 is None:
            weights_sha256 = sha256_files(teacher_weight_files(teacher))
        atomic_write_json(out_dir / SAMPLES_META, {
            "source": "teacher", "iter": None, "model": "teacher",
            "prompt_set": prompt_set.name, "prompt_set_version": prompt_set.version,
            "sampler": sampler_name(prompt_set.sampler, family), "steps": prompt_set.steps, "cfg": prompt_set.cfg,
            "resolution": [prompt_set.width, prompt_set.height], "items": items,
            "wall_time_s": round(time.time() - t0, 3),
            **provenance(device, "teacher", weights_sha256, versions, getattr(teacher, "loras", ())),
        })
        if health:
            done = len(paths)
            add_teacher_health_seeds(out_dir, teacher=teacher, prompt_set=prompt_set, device=device, pipe=pipe,
                                     progress=None if progress is None else lambda d, t: progress(done + d, total))
    return paths


def missing_health_seeds(out_dir: Path, prompt_set: PromptSet) -> list[tuple[str, int]]:
    """(item id, k) of each health seed (k >= 1) a teacher folder lacks: not listed in its meta.json
    (an item without health_files, a folder rendered before the set had health seeds, or one whose
    health seeds a stop cut short), or listed with its file gone."""
    if prompt_set.health_seeds < 2:
        return []
    try:
        items = json.loads((out_dir / SAMPLES_META).read_text(encoding="utf-8")).get("items")
    except (OSError, ValueError, AttributeError, RecursionError):
        items = None
    items = items if isinstance(items, dict) else {}
    missing = []
    for item in prompt_set.items:
        entry = items.get(item.id)
        listed = entry.get("health_files") if isinstance(entry, dict) else None
        for k in range(1, prompt_set.health_seeds):
            name = health_file_name(item.id, k)
            if not (isinstance(listed, list) and name in listed and (out_dir / name).is_file()):
                missing.append((item.id, k))
    return missing


@torch.no_grad()
def add_teacher_health_seeds(out_dir: Path, *, teacher, prompt_set: PromptSet, device: torch.device | str = "cpu",
                             pipe=None, progress: Optional[Callable[[int, int], None]] = None) -> int:
    """Complete a teacher folder (its grid images and meta.json written) with the prompt set's
    health seeds it lacks (missing_health_seeds), then list every item's health files and seeds in
    meta.json. Only what is missing is rendered: a folder whose health seeds a stop cut short is
    completed, never rendered again whole. Returns the number of images rendered."""
    missing = missing_health_seeds(out_dir, prompt_set)
    if not missing and prompt_set.health_seeds < 1:
        return 0
    pipe = pipe if pipe is not None else (_teacher_pipe(teacher, prompt_set) if missing else None)
    by_id = {item.id: item for item in prompt_set.items}
    meta = json.loads((out_dir / SAMPLES_META).read_text(encoding="utf-8"))
    for n, (item_id, k) in enumerate(missing, start=1):
        seed = health_seed_list(prompt_set, item_id)[k]
        name = health_file_name(item_id, k)
        atomic_write_bytes(out_dir / name, _teacher_image(pipe, teacher, prompt_set, by_id[item_id], seed, device),
                           durable=False)
        entry = meta["items"][item_id]  # listed as soon as written: a stop later keeps it
        listed = {name, *(entry["health_files"] if isinstance(entry.get("health_files"), list) else [])}
        entry["health_files"] = [f for j in range(1, prompt_set.health_seeds)
                                 if (f := health_file_name(item_id, j)) in listed]
        atomic_write_json(out_dir / SAMPLES_META, meta)
        if progress is not None:
            progress(n, len(missing))
    for item in prompt_set.items:
        if isinstance(meta["items"].get(item.id), dict):
            meta["items"][item.id].update(health_meta(prompt_set, item.id, health_seed_list(prompt_set, item)))
    atomic_write_json(out_dir / SAMPLES_META, meta)
    return len(missing)


def ensure_teacher_samples(out: Path, *, teacher, prompt_set: PromptSet, device, events, log,
                           iteration: Optional[int], between_images: Optional[Callable[[], None]] = None) -> None:
    """Render the teacher reference into `out` unless its meta.json already names this prompt set
    + version (a resumed run: rendered once per run); then its health seeds, of which a folder
    whose seeds a stop cut short gets only the missing ones. A failure is a warning event, never
    the end of training. Events: phase `teacher-samples` with done/total (0/N, then after each
    image), then `samples` (model teacher, iter null) once something was rendered."""
    try:
        meta = json.loads((out / SAMPLES_META).read_text(encoding="utf-8"))
        rendered = (meta.get("prompt_set"), meta.get("prompt_set_version")) == (prompt_set.name, prompt_set.version)
    except (OSError, ValueError, AttributeError, RecursionError):
        rendered = False  # absent or unreadable: render
    missing = len(missing_health_seeds(out, prompt_set)) if rendered else 0
    if rendered and not missing:
        return
    total = missing if rendered else len(prompt_set.items) * max(1, prompt_set.health_seeds)

    def progress(done: int, _total: int = 0) -> None:
        events.emit("phase", iteration, phase="teacher-samples", done=done, total=total)
        if between_images is not None and done < total:
            between_images()  # a stop command ends the phase here (StopRequested)

    progress(0)
    try:
        if not rendered:
            render_teacher_samples(out, teacher=teacher, prompt_set=prompt_set, versions=library_versions(),
                                   device=device, progress=progress, health=False)
        first = 0 if rendered else len(prompt_set.items)
        add_teacher_health_seeds(out, teacher=teacher, prompt_set=prompt_set, device=device,
                                 progress=lambda done, _t: progress(first + done))
        paths = [str(out / f"{item.id}.png") for item in prompt_set.items]
        events.emit("samples", None, folder=str(out), paths=paths, model="teacher")
    except StopRequested:
        raise
    except Exception as e:  # noqa: BLE001 - reported, training goes on
        if torch.cuda.is_available():
            torch.cuda.empty_cache()  # an OOM here must not leave the cache full for training
        log.warning("teacher reference samples failed: %r", e, exc_info=True)
        events.emit("warning", iteration, message=f"teacher samples failed: {type(e).__name__}: {e}")
