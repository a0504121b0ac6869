"""Student validation images during training: the run's prompt set, rendered with the student's
own timesteps (never the teacher's step count), one PNG per prompt and a meta.json per folder.

Determinism: each item's noise comes from a CPU generator seeded with its prompt-set seed, so
the same weights give the same pixels whichever device trains and however far training got.
"""
from __future__ import annotations

import io
import json
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from dmad.methods.dmd2 import sample_student
from dmad.methods.prediction import NoiseSchedule
from dmad.prompts import PromptSet, item_seed
from dmad.runs import atomic_write_bytes, atomic_write_json


def library_versions() -> dict:
    """What a sample's pixels depend on besides the weights, for meta.json."""
    import diffusers

    return {"torch": torch.__version__, "diffusers": diffusers.__version__}


def latent_shape(vae, width: int, height: int) -> tuple[int, int, int]:
    f = 2 ** (len(vae.config.block_out_channels) - 1)
    return vae.config.latent_channels, height // f, width // f


def decode_to_png(vae, latents: torch.Tensor) -> bytes:
    """(1, C, h, w) latents -> PNG bytes. Decoded in the VAE's dtype, clamped to [-1, 1]."""
    lat = latents.to(next(vae.parameters()).dtype) / vae.config.scaling_factor
    img = vae.decode(lat).sample[0].float().clamp(-1, 1)
    arr = ((img.permute(1, 2, 0).cpu().numpy() + 1.0) * 127.5).round().astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="PNG")
    return buf.getvalue()


@torch.no_grad()
def render_student_samples(out_dir: Path, *, student, vae, encode, schedule: NoiseSchedule, timesteps: list[int],
                           prompt_set: PromptSet, iteration: int, device: torch.device,
                           dtype: torch.dtype, versions: dict) -> list[str]:
    """Render every prompt with the student; returns the written PNG paths. `encode(list[str])`
    gives text embeddings (B, L, D)."""
    t0 = time.time()
    out_dir.mkdir(parents=True, exist_ok=True)
    c, h, w = latent_shape(vae, prompt_set.width, prompt_set.height)
    was_training = student.training
    student.eval()
    paths, items = [], {}
    try:
        for item in prompt_set.items:
            seed = item_seed(prompt_set, item)
            gen = torch.Generator("cpu").manual_seed(seed)
            noise = torch.randn((1, c, h, w), generator=gen).to(device)
            emb = encode([item.prompt]).to(device)

            def x0_fn(x_t, t):
                out = student(x_t.to(dtype), t, emb.to(dtype)).sample
                return schedule.to_x0(x_t.float(), out.float(), t)

            x0 = sample_student(x0_fn, noise.float(), timesteps, schedule, gen)
            path = out_dir / f"{item.id}.png"
            atomic_write_bytes(path, decode_to_png(vae, x0), durable=False)
            paths.append(str(path))
            items[item.id] = {"prompt": item.prompt, "seed": seed, "file": path.name}
    finally:
        student.train(was_training)
    atomic_write_json(out_dir / "meta.json", {
        "source": f"iter_{iteration}", "iter": iteration, "model": "student",
        "prompt_set": prompt_set.name, "prompt_set_version": prompt_set.version,
        "sampler": "student", "steps": len(timesteps), "timesteps": list(timesteps), "cfg": None,
        "resolution": [prompt_set.width, prompt_set.height], "items": items,
        "wall_time_s": round(time.time() - t0, 3), "versions": versions,
    })
    return paths


def read_meta(folder: Path) -> dict:
    return json.loads((folder / "meta.json").read_text(encoding="utf-8"))


# Diffusers scheduler classes for the prompt set's `sampler` names (dmad.prompts.SAMPLERS).
SCHEDULERS = {
    "ddim": ("DDIMScheduler", {}), "ddpm": ("DDPMScheduler", {}), "pndm": ("PNDMScheduler", {}),
    "euler": ("EulerDiscreteScheduler", {}), "euler_a": ("EulerAncestralDiscreteScheduler", {}),
    "heun": ("HeunDiscreteScheduler", {}), "lms": ("LMSDiscreteScheduler", {}),
    "dpmpp_2m": ("DPMSolverMultistepScheduler", {"algorithm_type": "dpmsolver++"}),
    "unipc": ("UniPCMultistepScheduler", {}),
}


def make_scheduler(name: str, base_config):
    """The named sampler, configured from the teacher's own scheduler config (its noise schedule
    and prediction type)."""
    import diffusers

    cls_name, extra = SCHEDULERS[name]
    return getattr(diffusers, cls_name).from_config(base_config, **extra)


def sd_pipeline(modules, scheduler):
    """A StableDiffusionPipeline on already-loaded modules (anything with vae, text_encoder,
    tokenizer and unet: a dmad Teacher or another pipeline) with the given sampler; no safety
    checker, no progress bar."""
    from diffusers import StableDiffusionPipeline

    pipe = StableDiffusionPipeline(vae=modules.vae, text_encoder=modules.text_encoder, tokenizer=modules.tokenizer,
                                   unet=modules.unet, scheduler=scheduler, safety_checker=None,
                                   feature_extractor=None, requires_safety_checker=False)
    pipe.set_progress_bar_config(disable=True)
    return pipe


@torch.no_grad()
def render_teacher_samples(out_dir: Path, *, teacher, prompt_set: PromptSet, versions: dict,
                           device: torch.device | str = "cpu") -> list[str]:
    """The teacher reference images of a prompt set: its sampler, steps and CFG, each item's noise
    drawn exactly as for the student (a CPU generator seeded with the item's seed), so teacher and
    student images of one item start from the same latents. One PNG per item and a meta.json."""
    t0 = time.time()
    out_dir.mkdir(parents=True, exist_ok=True)
    pipe = sd_pipeline(teacher, make_scheduler(prompt_set.sampler, teacher.scheduler.config))
    c, h, w = latent_shape(teacher.vae, prompt_set.width, prompt_set.height)
    dtype = next(teacher.unet.parameters()).dtype
    paths, items = [], {}
    for item in prompt_set.items:
        seed = item_seed(prompt_set, item)
        gen = torch.Generator("cpu").manual_seed(seed)
        latents = torch.randn((1, c, h, w), generator=gen).to(device=device, dtype=dtype)
        image = pipe(item.prompt, negative_prompt=item.negative_prompt or None, latents=latents,
                     num_inference_steps=prompt_set.steps, guidance_scale=prompt_set.cfg, height=prompt_set.height,
                     width=prompt_set.width, generator=gen, output_type="pt").images[0]
        arr = (image.float().permute(1, 2, 0).cpu().numpy() * 255.0).round().clip(0, 255).astype(np.uint8)
        buf = io.BytesIO()
        Image.fromarray(arr).save(buf, format="PNG")
        path = out_dir / f"{item.id}.png"
        atomic_write_bytes(path, buf.getvalue(), durable=False)
        paths.append(str(path))
        items[item.id] = {"prompt": item.prompt, "negative_prompt": item.negative_prompt, "seed": seed, "file": path.name}
    atomic_write_json(out_dir / "meta.json", {
        "source": "teacher", "iter": None, "model": "teacher",
        "prompt_set": prompt_set.name, "prompt_set_version": prompt_set.version,
        "sampler": prompt_set.sampler, "steps": prompt_set.steps, "cfg": prompt_set.cfg,
        "resolution": [prompt_set.width, prompt_set.height], "items": items,
        "wall_time_s": round(time.time() - t0, 3), "versions": versions,
    })
    return paths
