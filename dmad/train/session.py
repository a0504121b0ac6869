"""Everything the training loop holds, built once: models, optimizers, data, run-folder writers.

Kept apart from dmad/train/loop.py so the loop itself reads top to bottom. Methods here do one
thing each (encode a batch, make the student's input, step an optimizer, save, sample).
"""
from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from dmad.memory import readings as memory
from dmad.models.checkpoint import TrainingState, config_fingerprint, save_checkpoint
from dmad.contract.config import TrainConfig
from dmad.contract.events import EventWriter
from dmad.methods.dmd2 import backward_simulate, sample_stop_index
from dmad.methods.noise import SampleRNG, iteration_generator
from dmad.methods.prediction import NoiseSchedule
from dmad.train.monitor import device_reading
from dmad.models.networks import Networks
from dmad.contract.prompts import PromptSet
from dmad.contract.runs import CsvAppender, RunFolder
from dmad.train.step import DmadNetworks, NonFiniteLoss

LOSS_COLUMNS = ["loss_dm", "loss_g_gan", "loss_g", "loss_fake", "loss_d_gan", "loss_c",
                "dm_grad_norm", "d_real_acc", "d_fake_acc", "grad_norm_g", "grad_norm_c",
                "loss_lcm"]  # the last: latent consistency distillation (the others stay empty in its rows)
METRIC_COLUMNS = (["iter"] + LOSS_COLUMNS +
                  ["step_time_s", "data_time_s", "mem_peak_alloc_gb", "mem_device_used_gb", "lr_generator", "lr_critic"])

# --------------------------------------------------------------------------- the session

@dataclass
class Session:
    """What the loop works with, built once by dmad.train.build.build_session (already restored from
    a checkpoint when resuming): nothing is filled in later."""

    cfg: TrainConfig
    folder: RunFolder
    events: EventWriter
    log: logging.Logger
    accelerator: Any  # accelerate.Accelerator: device, mixed precision, processes
    weight_dtype: torch.dtype
    teacher: Any  # dmad.models.teacher.Teacher (frozen denoiser, VAE, text encoders, tokenizers; its family)
    nets: Networks  # unwrapped student, fake score, GAN head and the student's EMA (checkpoints, samples)
    dmad: Any  # what an iteration calls: DmadNetworks (prepared networks, teacher, feature tap, schedule) or LcmNetworks
    opt_g: torch.optim.Optimizer
    opt_c: Optional[torch.optim.Optimizer]  # the critic's; None for LCM
    sched_g: Any
    sched_c: Any
    timesteps: list[int]  # the student's
    prompt_set: PromptSet
    dataset: Any  # dmad.data.loading.MixedImages
    sampler: Any  # dmad.data.mixing.MixtureBatches: the items and sample positions of each batch
    skip_log: Any  # dmad.data.scan.SkipLog: items the data skipped, as events and status counts
    caches: Any  # dmad.data.encode.Caches when resources.cache_latents, else None
    metrics: CsvAppender
    passes: Any  # dmad.train.passes.PassCounter: network passes of training (not of samples)
    iter: int = 0  # completed iterations (the checkpoint's, when resuming)
    generator_steps: int = 0
    batches_used: int = 0
    t_start: float = field(default_factory=time.time)

    def __post_init__(self):
        from dmad.data.loading import make_loader
        from dmad.data.scan import report_skips

        self.start_iter = self.iter
        self.last_saved: Optional[int] = self.iter if self.iter else None
        loader = iter(make_loader(self.dataset, self.sampler, self.cfg.resources.dataloader_num_workers))
        self.data = report_skips(loader, lambda skips: self.skip_log.loaded(self.iter, skips))

    @property
    def device(self) -> torch.device:
        return self.accelerator.device

    @property
    def schedule(self) -> NoiseSchedule:
        return self.dmad.schedule

    @property
    def is_main(self) -> bool:
        """Rank 0 (the only writer) of a multi-process run, or the only process."""
        return self.accelerator.is_main_process

    @property
    def world(self) -> int:
        return self.accelerator.num_processes

    # ---- per micro-step
    def rng(self, batch_number: int) -> SampleRNG:
        return SampleRNG(self.cfg.resources.seed, self.sampler.positions(batch_number), self.device)

    def encode_batch(self, batch: Any, rng: SampleRNG) -> tuple[torch.Tensor, torch.Tensor]:
        """A dmad.data.loading.Batch -> latents (B, C, H/f, W/f) float32, a posterior sample drawn with the
        per-sample noise (the same whether the posterior came from the cache or the VAE), in the
        family's latent space (scaled, shifted), and the text conditioning (a Cond)."""
        from dmad.data.encode import posteriors, text_embeddings

        t = self.teacher
        mean, std = posteriors(batch, t.vae, self.device, self.cfg.resources.vae_batch_size, self.caches)
        latents = t.family.latents(t.vae, mean + std * rng.randn_like(mean))
        emb = text_embeddings(batch.captions, batch.datasets, t, self.device, self.caches)
        return latents, emb

    def student_input(self, shape: torch.Size, emb: torch.Tensor, iteration: int,
                      rng: SampleRNG) -> tuple[torch.Tensor, torch.Tensor]:
        """Pure noise at the first student timestep; for multi-step students, the student's own
        rollout to a step index drawn from (seed, iteration): the same for every micro-batch and
        on every process, without communication."""
        noise = rng.randn(tuple(shape[1:]))
        if len(self.timesteps) == 1:
            return noise, torch.full((shape[0],), self.timesteps[0], dtype=torch.long, device=self.device)
        k = sample_stop_index(len(self.timesteps), iteration_generator(self.cfg.resources.seed, iteration))
        if self.world > 1:  # the same on every rank by construction; rank 0's value, to be certain
            from dmad.train.ranks import broadcast

            k = broadcast(self.accelerator, k)
        student = self.nets.student

        def x0_fn(x_t, t):
            with self.accelerator.autocast():
                return self.teacher.family.x0(student, x_t, t, emb, self.schedule)

        return backward_simulate(x0_fn, noise, self.timesteps, k, self.schedule, rng)

    @contextlib.contextmanager
    def critic_frozen(self):
        """During the student's update the critic only passes gradients through to the student."""
        params = _params(self.opt_c)
        for p in params:
            p.requires_grad_(False)
        try:
            yield
        finally:
            for p in params:
                p.requires_grad_(True)

    # ---- optimizer steps
    def _step(self, opt, sched) -> Optional[float]:
        norm = None
        max_norm = self.cfg.optimization.max_grad_norm
        if max_norm > 0:
            norm = float(self.accelerator.clip_grad_norm_(_params(opt), max_norm))
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        return norm

    def step_generator(self) -> Optional[float]:
        norm = self._step(self.opt_g, self.sched_g)
        if self.nets.ema is not None:
            self.nets.ema.step(_params(self.opt_g))
        self.generator_steps += 1
        return norm

    def generator_params(self) -> list[torch.nn.Parameter]:
        """The student's trainable parameters, in the optimizer's (and the LCM target's) order."""
        return _params(self.opt_g)

    def step_critic(self) -> Optional[float]:
        return self._step(self.opt_c, self.sched_c)

    # ---- observation
    def sync_device(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def memory_row(self) -> dict:
        """Framework peak since the previous row (then reset) and device-wide use (NVML; process
        RSS on a CPU machine): two scopes, two columns, never mixed."""
        peak = memory.framework_peak_gb(self.device)
        memory.reset_framework_peak(self.device)
        _, used, total, _ = device_reading(self.device)
        # the total rides on the metric event only (the app draws it as a line), not in metrics.csv
        return {"mem_peak_alloc_gb": peak, "mem_device_used_gb": used, "mem_device_total_gb": total}

    def training_state(self) -> TrainingState:
        return TrainingState(iter=self.iter, generator_steps=self.generator_steps, batches_used=self.batches_used,
                             student_timesteps=self.timesteps, prediction_type=self.schedule.prediction_type,
                             config_fingerprint=config_fingerprint(self.cfg.model_dump(mode="json")),
                             lr_generator={}, lr_critic={}, network_passes=self.passes.state())

    def barrier(self) -> None:
        if self.world > 1:
            self.accelerator.wait_for_everyone()

    def save_checkpoint(self) -> None:
        """Every rank calls it (the weights are the same everywhere); rank 0 writes."""
        if self.last_saved == self.iter:
            return
        for name, net in self.nets.trained():
            # One pass over the weights per checkpoint, so a saved checkpoint is always a good one
            # (on every rank: the weights are the same, so every rank stops alike).
            params = list(net.parameters())
            if not all(torch.isfinite(p).all() for p in params):
                raise NonFiniteLoss(f"{name} weights", self.iter)
        self.barrier()
        if not self.is_main:
            self.last_saved = self.iter
            self.barrier()
            return
        try:
            self._save_checkpoint()
        finally:
            self.barrier()

    def checkpoint_bytes(self) -> int:
        """About what a checkpoint takes on disk: the saved weights and the optimizer states."""
        tensors = [t for _, net in self.nets.trained() for t in net.state_dict().values()]
        if self.nets.ema is not None:
            tensors += list(self.nets.ema.shadow_params)
        if self.nets.target is not None:
            tensors += list(self.nets.target.shadow)
        for opt in (o for o in (self.opt_g, self.opt_c) if o is not None):
            tensors += [v for st in opt.state.values() for v in st.values() if isinstance(v, torch.Tensor)]
        return sum(t.numel() * t.element_size() for t in tensors)

    def _save_checkpoint(self) -> None:
        ident = self.cfg.identity
        tmp = self.folder.begin_checkpoint(self.iter)
        try:
            save_checkpoint(tmp, nets=self.nets, student_mode=ident.student, fake_mode=ident.fake_score,
                            opt_g=self.opt_g, opt_c=self.opt_c, sched_g=self.sched_g, sched_c=self.sched_c,
                            scaler=self.accelerator.scaler, state=self.training_state())
        except BaseException:
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)  # a partial checkpoint (a full disk) must not hold the space
            raise
        path = self.folder.commit_checkpoint(self.iter, tmp, self.cfg.observation.checkpoints_total_limit)
        self.last_saved = self.iter
        self.folder.write_status(self.folder.read_status().get("state", "running"), last_checkpoint=self.iter)
        self.events.emit("checkpoint", self.iter, path=str(path), student_timesteps=self.timesteps)

    def render_samples(self, prompt: Optional[str] = None, seed: Optional[int] = None) -> None:
        """Validation images of the prompt set (or one image of `prompt`: sample_now with a prompt),
        dmad.train.validation. Every rank calls it; rank 0 renders, the others wait."""
        from dmad.train.validation import render_one_off, render_prompt_set

        if self.is_main:
            try:
                with self.own_rng():
                    render_one_off(self, prompt, seed) if prompt else render_prompt_set(self)
            finally:
                self.barrier()
        else:
            self.barrier()

    def own_rng(self):
        """Rendering inside its own copy of the global RNGs: whatever a sampler draws from them never
        reaches training's stream, so that stream (saved in each checkpoint's rng.safetensors, for
        dropout in a user's model say) is the same whether samples were rendered or not, how often
        (a resumed run does not render its checkpoint's samples again; Sample now adds some) and on
        which rank (only rank 0 renders)."""
        cuda = self.device.type == "cuda"
        devices = [self.device.index if self.device.index is not None else torch.cuda.current_device()] if cuda else []
        return torch.random.fork_rng(devices=devices)

    def render_teacher_reference(self, between_images: Optional[Any] = None) -> None:
        """samples/teacher/, once per run, before iteration 1 (dmad.train.validation); rank 0 renders,
        the others wait. `between_images(collective=False)` runs after each image."""
        from dmad.train.validation import render_teacher_reference

        if self.is_main:
            try:
                with self.own_rng():
                    render_teacher_reference(self, between_images)
            finally:
                self.barrier()
        else:
            self.barrier()


def _params(opt: torch.optim.Optimizer) -> list[torch.nn.Parameter]:
    """An optimizer's parameters: the network's trainable ones, listed once at build time (a
    module-tree walk per step costs ~1 ms on a small UNet)."""
    return [p for group in opt.param_groups for p in group["params"]]

