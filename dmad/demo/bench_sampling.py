"""How `dmad bench distill` samples: the teacher through its family's own diffusers pipeline (50
steps + CFG, and the few-step baselines), a student through its own few-step sampler as the engine
renders, each from the bench's initial noise so that rows are paired item by item."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Callable, Optional

from dmad.errors import RunFailed, UserInputError


def sample_teacher(teacher, captions: list[str], noise, steps: int, cfg: float, batch: int, trailing: bool = False):
    """(N, 3, H, W) in [-1, 1], through the teacher family's own diffusers pipeline. `trailing`:
    the few-step baseline's spacing (a flow teacher's Euler sampler gets sigmas 1, ..., 1/steps:
    SD3's default spacing ends at 0.001, which makes 2 steps one step and a tiny one; DDIM gets
    "trailing" timesteps, its best setting at so few steps)."""
    import torch
    from diffusers import DDIMScheduler, FlowMatchEulerDiscreteScheduler

    from dmad.models.families import quiet_pipeline_logs
    from dmad.sample.render import sd_pipeline

    family, den = teacher.family, teacher.denoiser
    few = {}
    if family.flow:
        sched = FlowMatchEulerDiscreteScheduler.from_config(teacher.scheduler.config)
        if trailing:
            few = {"sigmas": [1.0 - i / steps for i in range(steps)]}
    else:
        spacing = {"timestep_spacing": "trailing"} if trailing else {}
        sched = DDIMScheduler.from_config(teacher.scheduler.config, **spacing)
    pipe = sd_pipeline(teacher, sched)
    h, w = noise.shape[-2:]
    f = 2 ** (len(teacher.vae.config.block_out_channels) - 1)
    out = []
    with torch.no_grad(), quiet_pipeline_logs():
        for a in range(0, len(captions), batch):
            lat = family.pipe_latents(noise[a:a + batch]).to(next(den.parameters()).dtype)
            kw = dict(latents=lat, num_inference_steps=steps, height=h * f, width=w * f, **few,
                      **family.pipe_call_kwargs(cfg, den), **family.pipe_prompt_kwargs(teacher.modules, captions[a:a + batch]))
            if family.decode_in_pipeline:
                out.append(pipe(output_type="pt", **kw).images.float() * 2 - 1)
            else:
                lat = pipe(output_type="latent", **kw).images
                out.append(family.decode(teacher.vae, family.unpack_pipe_latents(lat, h, w)))
    return torch.cat(out)


def student_timesteps_for(trained: list[int], steps: int) -> list[int]:
    """A `steps`-step schedule taken from the student's trained timesteps: evenly spaced indices
    from the first (999), e.g. 4 trained -> 1: [999], 2: [999, 499], 4: all."""
    if steps > len(trained) or len(trained) % steps:
        raise UserInputError(f"a {len(trained)}-step student cannot sample with {steps} steps "
                             f"(pick a divisor of {len(trained)})")
    return trained[:: len(trained) // steps]


def sample_student(student, teacher, captions: list[str], noise, timesteps: list[int], batch: int, resolution: int):
    """The student's own few-step sampler (dmad.methods.dmd2.sample_student), as the engine renders."""
    import torch

    from dmad.methods.dmd2 import sample_student as sample

    family = teacher.family
    schedule = family.schedule(teacher.scheduler, resolution)
    out = []
    with torch.no_grad():
        for a in range(0, len(captions), batch):
            cond = family.encode(teacher.modules, captions[a:a + batch], "cpu")
            gen = torch.Generator().manual_seed(a)  # re-noising between steps; fixed per batch

            def x0_fn(x_t, t, cond=cond):
                return family.x0(student, x_t, t, cond, schedule).float()

            x0 = sample(x0_fn, noise[a:a + batch].float(), timesteps, schedule, gen,
                        noise_fn=lambda like, gen=gen: family.fresh_noise(like, gen))
            out.append(family.decode(teacher.vae, x0))
    return torch.cat(out)


def load_student(run_dir: Path, teacher, checkpoint: Optional[Path] = None):
    """(student, training state) of a checkpoint of the run (default: its latest), as it samples."""
    from dmad.contract.config import load_config
    from dmad.contract.runs import RunFolder
    from dmad.models.checkpoint import load_student as load_checkpoint_student
    from dmad.models.checkpoint import read_training_state

    folder = RunFolder(run_dir)
    if checkpoint is None:
        latest = folder.latest_checkpoint()
        if latest is None:
            raise RunFailed(f"the distillation run {run_dir} left no checkpoint")
        checkpoint = latest[1]
    cfg = load_config(folder.config_json)
    student, _ = load_checkpoint_student(teacher, cfg.identity, checkpoint)
    return student, read_training_state(checkpoint)


def timed(fn: Callable):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0
