"""Everything the training loop holds, built once: models, optimizers, data, run-folder writers.

Kept apart from dmad/train/loop.py so the loop itself reads top to bottom. Methods here do one
thing each (encode a batch, make the student's input, step an optimizer, save, sample).
"""
from __future__ import annotations

import contextlib
import json
import logging
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import torch

from dmad.memory import readings as memory
from dmad.models.checkpoint import TrainingState, config_fingerprint, read_training_state, save_checkpoint
from dmad.contract.config import TrainConfig
from dmad.errors import DiskFull, UserInputError
from dmad.contract.events import EventWriter
from dmad.methods.dmd2 import backward_simulate, sample_stop_index
from dmad.methods.noise import SampleRNG, iteration_generator
from dmad.methods.prediction import NoiseSchedule
from dmad.train.monitor import device_reading
from dmad.models.networks import Networks, trainable_parameters
from dmad.contract.prompts import PromptSet, default_prompt_set_path, load_prompt_set, to_json
from dmad.contract.runs import CsvAppender, RunFolder
from dmad.train.step import DmadNetworks, NonFiniteLoss

LOSS_COLUMNS = ["loss_dm", "loss_g_gan", "loss_g", "loss_fake", "loss_d_gan", "loss_c",
                "dm_grad_norm", "d_real_acc", "d_fake_acc", "grad_norm_g", "grad_norm_c"]
METRIC_COLUMNS = (["iter"] + LOSS_COLUMNS +
                  ["step_time_s", "data_time_s", "mem_peak_alloc_gb", "mem_device_used_gb", "lr_generator", "lr_critic"])

LIBRARY_LOGGERS = ("diffusers", "transformers", "accelerate", "peft", "torch")


class PipeSafeStream:
    """stderr that outlives its reader. When the app that started the engine exits and leaves the
    run going, the engine's stderr pipe has no reader: a later write (a log line, a library's
    print) would raise BrokenPipeError in the middle of training. Everything also goes to
    logs/engine.log, so once the reader is gone the writes are dropped."""

    def __init__(self, stream):
        self._stream, self.reader_gone = stream, False

    def write(self, text: str) -> int:
        if not self.reader_gone:
            try:
                self._stream.write(text)
            except (BrokenPipeError, ValueError):  # ValueError: the stream was closed
                self.reader_gone = True
        return len(text)

    def flush(self) -> None:
        if not self.reader_gone:
            try:
                self._stream.flush()
            except (BrokenPipeError, ValueError):
                self.reader_gone = True

    def __getattr__(self, name):  # fileno, isatty, encoding ...: those of the wrapped stream
        return getattr(self._stream, name)


class _QuietFileHandler(logging.FileHandler):
    """engine.log on a full disk: the line is lost (stderr still has it), and no 'Logging error'
    traceback is printed for it."""

    def handleError(self, record: logging.LogRecord) -> None:
        pass


def setup_logging(path: Path) -> logging.Logger:
    """Engine log to stderr and logs/engine.log; library chatter at WARNING, never on stdout."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fmt = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    close_logging()
    root = logging.getLogger()
    for h in (_QuietFileHandler(path, encoding="utf-8"), logging.StreamHandler(__import__("sys").stderr)):
        h.setFormatter(fmt)
        h._dmad = True  # type: ignore[attr-defined]
        root.addHandler(h)
    root.setLevel(logging.INFO)
    for name in LIBRARY_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    try:
        from diffusers.utils import logging as dlog
        from transformers.utils import logging as tlog

        dlog.disable_progress_bar()
        tlog.disable_progress_bar()
    except ImportError:
        pass
    return logging.getLogger("dmad")


def close_logging() -> None:
    """Remove and close the engine's log handlers (engine.log stays closed between in-process runs)."""
    root = logging.getLogger()
    for h in list(root.handlers):
        if getattr(h, "_dmad", False):
            root.removeHandler(h)
            h.close()


class StopFlag:
    """SIGTERM / SIGINT ask for a graceful stop (checkpoint, `stopped` event) at the next
    iteration boundary; a second SIGINT interrupts at once."""

    def __init__(self):
        self._event = threading.Event()
        self._old: dict[int, Any] = {}

    def install(self) -> "StopFlag":
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame) -> None:
        if signum == signal.SIGINT and self._event.is_set():
            raise KeyboardInterrupt
        self._event.set()

    def set(self) -> None:
        self._event.set()

    def is_set(self) -> bool:
        return self._event.is_set()

    def uninstall(self) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)
        self._old.clear()


def engine_started_at() -> float:
    """When this engine started (unix s): the launcher's start for a rank of a multi-process run
    (DMAD_STARTED_AT), else this process's own. Control commands stamped earlier were meant for an
    earlier engine (dmad.contract.runlog.ControlReader)."""
    import os

    import psutil

    try:
        return float(os.environ["DMAD_STARTED_AT"])
    except (KeyError, ValueError):
        return psutil.Process().create_time()


def is_disk_full(e: BaseException) -> bool:
    import errno

    return isinstance(e, OSError) and e.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC))


def disk_full(folder: RunFolder, s: Optional["Session"], e: OSError) -> DiskFull:
    """What a full disk leaves: the partial checkpoint removed (it must not keep holding the space),
    and one line naming the folder, the space a checkpoint needs and the space free."""
    import shutil

    folder.clean_temp()
    try:
        free = shutil.disk_usage(folder.path).free
    except OSError:
        free = None
    need = s.checkpoint_bytes() if s is not None else None
    sizes = (f": a checkpoint needs about {need / 1e9:.2f} GB" if need else "") + (
        f", {free / 1e9:.2f} GB free" if free is not None else "")
    return DiskFull(f"out of disk space in {folder.path}{sizes}; nothing complete was lost: free some space, "
                    f"then continue with --resume latest")


def is_oom(e: BaseException) -> bool:
    if isinstance(e, torch.OutOfMemoryError):
        return True
    return isinstance(e, RuntimeError) and ("out of memory" in str(e) or "can't allocate memory" in str(e))


# --------------------------------------------------------------------------- run folder files

def cut_back_to_checkpoint(folder: RunFolder, checkpoint: Path) -> None:
    """Resume: drop leftover temp checkpoints and every metrics row / event after the checkpoint,
    so each iteration appears exactly once."""
    state = read_training_state(checkpoint)
    folder.clean_temp()
    folder.truncate_after(state.iter)


def prepare_folder(folder: RunFolder, cfg: TrainConfig, resume: Optional[str], argv: list[str],
                   events: EventWriter, world: int = 1, reopened: bool = False) -> PromptSet:
    """Writes config.json, prompt_set.json, env.json and command.txt. A resumed run (or one started
    again, `reopened`) keeps its prompt set and appends its command; a changed config is a warning."""
    from dmad.train.env import collect_env

    prompt_set = load_prompt_set(cfg.observation.prompt_set or default_prompt_set_path())
    resolved = cfg.model_dump(mode="json")
    if resume or (reopened and folder.config_json.is_file()):
        changed = _config_changes(folder, resolved)
        if changed:
            events.emit("warning", None, message=f"resuming with a changed config: {', '.join(changed)}")
        prompt_set = _resumed_prompt_set(folder, prompt_set, events)
        command = folder.command_txt.read_text(encoding="utf-8") if folder.command_txt.is_file() else ""
        from dmad.contract.runs import atomic_write_text
        import shlex

        atomic_write_text(folder.command_txt, command + shlex.join(argv) + "\n")
    else:
        folder.write_command(argv)
        folder.write_json("prompt_set.json", to_json(prompt_set))
    folder.write_json("config.json", resolved)
    folder.write_json("env.json", collect_env())
    folder.write_status("running", iter=None, failure_reason=None, exit_code=None, advice=None)
    events.emit("started", None, run_dir=str(folder.path), config_fingerprint=config_fingerprint(resolved),
                resume_from=resume, max_train_steps=cfg.optimization.max_train_steps,
                effective_batch=cfg.effective_batch(world), num_processes=world, prompt_set=f"{prompt_set.name}-{prompt_set.version}")
    return prompt_set


def _resumed_prompt_set(folder: RunFolder, wanted: PromptSet, events: EventWriter) -> PromptSet:
    """On resume the run's own copy wins over an in-place edit of the same name + version
    (versions are immutable); another name or version replaces the copy, with a warning."""
    try:
        own = load_prompt_set(folder.prompt_set_json)
    except UserInputError:
        own = None
    if own is not None and (own.name, own.version) == (wanted.name, wanted.version):
        if own != wanted:
            events.emit("warning", None, message=f"prompt set {wanted.name}-{wanted.version} was edited in place; "
                                                 f"using the run's copy (save an edit as a new version)")
        return own
    if own is not None:
        events.emit("warning", None, message=f"prompt set changed on resume: {own.name}-{own.version} -> "
                                             f"{wanted.name}-{wanted.version}")
    folder.write_json("prompt_set.json", to_json(wanted))
    return wanted


def _config_changes(folder: RunFolder, resolved: dict) -> list[str]:
    try:
        old = json.loads(folder.config_json.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return []
    if not isinstance(old, dict):
        return []
    out = []
    for group, fields in resolved.items():
        if not isinstance(fields, dict):
            continue
        for k, v in fields.items():
            before = old.get(group, {}).get(k) if isinstance(old.get(group), dict) else None
            if before != v and k != "resume_from_checkpoint":
                out.append(f"{group}.{k} {before!r} -> {v!r}")
    return out


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
    dmad: DmadNetworks  # what an iteration calls (prepared networks, teacher, feature tap, schedule)
    opt_g: torch.optim.Optimizer
    opt_c: torch.optim.Optimizer
    sched_g: Any
    sched_c: Any
    timesteps: list[int]  # the student's
    prompt_set: PromptSet
    dataset: Any  # dmad.data.loading.MixedImages
    sampler: Any  # dmad.data.mixing.MixtureBatches: the items and sample positions of each batch
    skip_log: Any  # dmad.data.scan.SkipLog: items the data skipped, as events and status counts
    caches: Any  # dmad.data.encode.Caches when resources.cache_latents, else None
    metrics: CsvAppender
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
                             lr_generator={}, lr_critic={})

    def barrier(self) -> None:
        if self.world > 1:
            self.accelerator.wait_for_everyone()

    def save_checkpoint(self) -> None:
        """Every rank calls it (the weights are the same everywhere); rank 0 writes."""
        if self.last_saved == self.iter:
            return
        for name in ("student", "fake_score", "gan_head"):
            # One pass over the weights per checkpoint, so a saved checkpoint is always a good one
            # (on every rank: the weights are the same, so every rank stops alike).
            params = list(getattr(self.nets, name).parameters())
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
        tensors = [t for net in (self.nets.student, self.nets.fake_score, self.nets.gan_head)
                   for t in net.state_dict().values()]
        if self.nets.ema is not None:
            tensors += list(self.nets.ema.shadow_params)
        for opt in (self.opt_g, self.opt_c):
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

    def render_samples(self) -> None:
        """Validation images with the student's own timesteps (EMA weights when EMA is on). A
        failure here is a warning: sampling never ends training. Rank 0 renders; the others wait."""
        if self.is_main:
            try:
                self._render_samples()
            finally:
                self.barrier()
        else:
            self.barrier()

    def _render_samples(self) -> None:
        from dmad.models.checkpoint import student_weight_files
        from dmad.sample.render import library_versions, render_student_samples, sha256_files

        t = self.teacher
        student = self.nets.student
        params = trainable_parameters(student)
        out = self.folder.samples_dir / f"iter_{self.iter}"
        try:
            # between checkpoints the weights exist only in memory: no checkpoint, no hash
            ckpt = self.folder.checkpoint_path(self.iter) if self.last_saved == self.iter else None
            if self.nets.ema is not None:
                self.nets.ema.store(params)
                self.nets.ema.copy_to(params)
            paths = render_student_samples(
                out, student=student, vae=t.vae, family=t.family,
                encode=lambda p: t.family.encode(t.modules, p, self.device),
                schedule=self.schedule, timesteps=self.timesteps, prompt_set=self.prompt_set, iteration=self.iter,
                device=self.device, dtype=torch.float32, versions=library_versions(),
                checkpoint=ckpt.name if ckpt else None, ema=self.nets.ema is not None,
                weights_sha256=sha256_files(student_weight_files(ckpt)) if ckpt else None)
            self.events.emit("samples", self.iter, folder=str(out), paths=paths, model="student",
                             ema=self.nets.ema is not None)
        except Exception as e:  # noqa: BLE001 - reported, training goes on
            if is_oom(e):
                torch.cuda.empty_cache() if torch.cuda.is_available() else None
            self.log.warning("sampling at iteration %d failed: %r", self.iter, e, exc_info=True)
            self.events.emit("warning", self.iter, message=f"sampling failed: {type(e).__name__}: {e}")
        finally:
            if self.nets.ema is not None:
                self.nets.ema.restore(params)


    def render_teacher_reference(self, between_images: Optional[Any] = None) -> None:
        """samples/teacher/, once per run, before iteration 1 (dmad.sample.render.ensure_teacher_samples);
        rank 0 renders, the others wait. `between_images(collective=False)` runs after each image:
        a stop command ends the phase there (StopRequested)."""
        from dmad.sample.render import ensure_teacher_samples

        if not self.is_main:
            self.barrier()
            return
        check = (lambda: between_images(collective=False)) if between_images is not None else None
        try:
            ensure_teacher_samples(self.folder.samples_dir / "teacher", teacher=self.teacher,
                                   prompt_set=self.prompt_set, device=self.device, events=self.events, log=self.log,
                                   iteration=self.iter, between_images=check)
        finally:
            self.barrier()


def _params(opt: torch.optim.Optimizer) -> list[torch.nn.Parameter]:
    """An optimizer's parameters: the network's trainable ones, listed once at build time (a
    module-tree walk per step costs ~1 ms on a small UNet)."""
    return [p for group in opt.param_groups for p in group["params"]]

