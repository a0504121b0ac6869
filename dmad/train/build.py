"""Building a training run: accelerator, data, teacher, the method's networks and optimizers
(dmad.methods: its unit decides which), restored from a checkpoint when resuming; and placing the
frozen teacher (cast, quantised, offloaded)."""
from __future__ import annotations

import datetime
import logging
from pathlib import Path
from typing import Callable, Optional

import torch

from dmad.contract.config import FLOAT_FORMATS, TrainConfig
from dmad.contract.events import EventWriter
from dmad.contract.methods import METRIC_COLUMNS
from dmad.contract.prompts import PromptSet
from dmad.contract.runs import CsvAppender, RunFolder
from dmad.errors import UserInputError
from dmad.methods import method_unit
from dmad.methods.unit import Method, RealScore, Trainables
from dmad.models.networks import TeacherCopies
from dmad.models.teacher import torch_dtype
from dmad.train.monitor import Monitor
from dmad.train.passes import PassCounter
from dmad.train.ranks import NullCsv
from dmad.train.saving import checkpoint_bytes, restore
from dmad.train.session import DataStream, Progress, RunFiles, Session
from dmad.train.trainer import Trainer


def make_accelerator(mixed_precision: str, report_to: str = "none", run_dir: Optional[Path] = None):
    """`report_to` (observation.report_to) and the run folder: the trackers accelerate logs to
    (dmad.train.trackers), started by the loop."""
    from accelerate import Accelerator
    from accelerate.utils import InitProcessGroupKwargs

    from dmad.train.preflight import check_precision_here
    from dmad.train.trackers import accelerator_args

    check_precision_here(mixed_precision)
    cuda = torch.cuda.is_available()
    # Accumulation is done by the loop itself (explicit loss scaling, no_sync on inner
    # micro-steps), so accelerate's own counter stays at 1.
    # Rank 0 renders samples and writes checkpoints while the others wait in a collective: allow hours.
    timeout = InitProcessGroupKwargs(timeout=datetime.timedelta(hours=6))
    return Accelerator(mixed_precision=mixed_precision, cpu=not cuda, gradient_accumulation_steps=1,
                       kwargs_handlers=[timeout], **accelerator_args(report_to, run_dir))


def _encode_uncond(teacher, device):
    """The family's unconditional embedding (batch 1), or None for a guidance-embedding teacher."""
    if teacher.family.guidance_embedded(teacher.denoiser):
        return None
    with torch.no_grad():
        return teacher.family.uncond(teacher.modules, device)


def quantize_teacher(net: torch.nn.Module, precision: str, shared=None) -> int:
    """Weight-only int8 / fp8 of the frozen denoiser's linear layers (dmad.models.quant), computing
    in bf16. Returns the number of weights stored in 1 byte. `shared` (a SharedBase on `net`): its
    adapters' own layers stay float32 and trainable."""
    from dmad.models.quant import quantize_linears

    return quantize_linears(net, precision, shared)


def offload_between_calls(net: torch.nn.Module, device: torch.device, shared=None) -> None:
    """Keep `net` in CPU memory and on `device` only during its own forward calls (forward hooks).
    A graph that backpropagates through it keeps the device copy of the weights it saved alive until
    backward; the next call copies the weights up again. `shared` (a SharedBase on `net`): only the
    frozen base moves; the adapters, trained every iteration, stay on `device`."""
    if shared is not None:
        shared.offload_device = device  # a checkpointed block's recompute in backward brings its own weights up

        def up(module, args, kwargs):
            shared.move_frozen(device)

        def down(module, args, kwargs, output):
            shared.move_frozen("cpu")
    else:
        def up(module, args, kwargs):
            module.to(device)

        def down(module, args, kwargs, output):
            module.to("cpu")

    net.register_forward_pre_hook(up, with_kwargs=True)
    net.register_forward_hook(down, with_kwargs=True)


def place_teacher(teacher, device: torch.device, wdtype: torch.dtype, precision: str, offload: bool,
                  shared=None) -> str:
    """Cast, quantise and move the frozen teacher. The denoiser gets resources.teacher_precision
    (auto: the mixed-precision dtype); the text encoders the mixed-precision dtype; the VAE too,
    except for a family whose VAE must stay float32 (SDXL). With offload, the denoiser and the
    text encoders live in CPU memory between their calls. `shared` (dmad.models.shared_base): the
    denoiser is also the student's and fake score's frozen base; their adapters stay float32,
    trainable and on the device. Returns a line for the engine log."""
    fam = teacher.family
    den = teacher.denoiser
    quantized = 0
    for m in teacher.networks():
        if m is not den or shared is None:
            m.requires_grad_(False)
        m.eval()
        if m is den:
            if precision in ("int8", "fp8"):
                quantized = quantize_teacher(m, precision, shared)
            elif shared is not None:
                shared.cast_frozen(torch_dtype(precision) if precision in FLOAT_FORMATS else wdtype)
            else:
                m.to(dtype=torch_dtype(precision) if precision in FLOAT_FORMATS else wdtype)
        elif m is teacher.vae:
            m.to(dtype=torch.float32 if fam.vae_fp32 else wdtype)
        else:
            m.to(dtype=wdtype)
        if offload and m is not teacher.vae and device.type != "cpu":
            if m is den and shared is not None:
                m.to(device)  # the adapters
                shared.move_frozen("cpu")
                offload_between_calls(m, device, shared)
            else:
                m.to("cpu")
                offload_between_calls(m, device)
        else:
            m.to(device)
    den_dtype = f"{precision} ({quantized / 1e6:.1f} M linear weights, the rest bf16)" if quantized else \
        str(next(den.parameters()).dtype).removeprefix("torch.")
    vae_dtype = str(next(teacher.vae.parameters()).dtype).removeprefix("torch.")
    where = "CPU memory, on the device per call" if offload and device.type != "cpu" else str(device)
    base = "; one frozen base with the student and fake-score adapters on it" if shared is not None else ""
    return f"teacher {fam.name}: denoiser {den_dtype}, VAE {vae_dtype}; frozen networks in {where}{base}"


def build(cfg: TrainConfig, folder: RunFolder, prompt_set: PromptSet, events: EventWriter, log: logging.Logger,
          monitor: Monitor, acc=None, resume: Optional[str] = None, between_phases: Callable[[], None] = lambda: None,
          loaded: Callable[[int], None] = lambda iteration: None) -> tuple[Session, Trainer]:
    """Everything a run holds, in one go: data, teacher, the method's networks and optimizers;
    restored from the checkpoint `resume` (exact resume), with the data stream starting at the
    batch it reached. `between_phases()` runs after each long step (control commands: a stop ends
    the build there); `loaded(iteration)` once everything has loaded, before the run's logs are
    opened for writing (the run commits to continuing from there: dmad.train.run_open.OpenRun.commit)."""
    from accelerate.utils import set_seed

    from dmad.data.loading import open_dataset
    from dmad.models.teacher import load_identity_teacher

    ident, res = cfg.identity, cfg.resources
    acc = acc or make_accelerator(res.mixed_precision, cfg.observation.report_to, folder.path)
    set_seed(res.seed + acc.process_index)  # seeds differ per rank for data and noise
    monitor.device = acc.device
    # the data first: too few usable images must stop the run before any model loads
    dataset, groups, skip_log = open_dataset(ident.train_data_dir, res.resolution, res.train_batch_size,
                                             cfg.effective_batch(acc.num_processes), res.seed, events, folder, log)
    events.emit("phase", None, phase="loading", device=str(acc.device))
    between_phases()
    teacher = load_identity_teacher(ident, dtype=torch.float32)
    if resume:  # the user's LoRAs are files: one edited in place since the start changes the teacher
        from dmad.models.teacher_loras import changes_since_start

        for message in changes_since_start(teacher, folder.path):
            log.warning("%s", message)
            events.emit("warning", None, message=message)
    between_phases()
    method = method_unit(cfg.distillation.method)
    trained = _copies(cfg, teacher, method)  # from the float32 teacher, before it is cast
    check_buckets(groups, teacher, ident.train_data_dir)
    caches = _caches(dataset, teacher, res, log)
    tr = _trainer(cfg, acc, teacher, method, trained, log)
    between_phases()
    state = restore(tr, resume) if resume else None
    loaded(state.iter if state else 0)
    if state is not None:
        events.emit("phase", state.iter, phase="restored", checkpoint=str(resume))
        if res.distributed == "fsdp":
            from dmad.train.sharding import world_size_note

            note = world_size_note(resume, acc.num_processes, cfg)
            if note:
                log.warning("%s", note)
                events.emit("warning", state.iter, message=note)
    # a run an older engine started keeps its metrics.csv header (columns are only added at the end)
    metrics = CsvAppender.continued(folder.metrics_csv, METRIC_COLUMNS) if acc.is_main_process else NullCsv(METRIC_COLUMNS)
    progress = Progress(iter=state.iter if state else 0, batches_used=state.batches_used if state else 0)
    data = _data_stream(dataset, groups, skip_log, caches, teacher, res, acc, progress)
    log.info("loaded teacher %s (%s, %s); student %s, fake score %s; device %s, %s",
             ident.pretrained_model_name_or_path, teacher.info.family, tr.schedule.prediction_type, ident.student,
             ident.fake_score if "fake_score" in tr.method.networks else f"none ({tr.method.info.name})",
             acc.device, res.mixed_precision)
    files = RunFiles(folder, events, log, metrics, prompt_set)
    return Session(files, data, progress, checkpoint_bytes=lambda: checkpoint_bytes(tr)), tr


def _copies(cfg: TrainConfig, teacher, method: Method) -> Trainables:
    """What the method trains, made from the float32 teacher (copies, LoRA adapters, the shared base)."""
    ident, res = cfg.identity, cfg.resources
    family = teacher.family
    family.guidance = cfg.distillation.real_guidance_scale  # what a guidance-embedding student and fake score get
    copies = TeacherCopies(teacher.denoiser, ident.lora_rank, ident.lora_alpha, res.gradient_checkpointing, family,
                           base_dtype=torch_dtype(res.mixed_precision), share_frozen_base=res.share_frozen_base,
                           lora_targets=family.lora_modules(ident.lora_targets))
    return method.trainables(copies, ident, cfg.distillation)


def _trainer(cfg: TrainConfig, acc, teacher, method: Method, trained: Trainables, log: logging.Logger) -> Trainer:
    """The teacher cast, quantised and placed (with the shared base its adapters sit on, if the
    method's networks do); the guided teacher; the method's optimizers and prepared networks."""
    res, dist = cfg.resources, cfg.distillation
    wdtype = torch_dtype(res.mixed_precision)
    log.info(place_teacher(teacher, acc.device, wdtype, res.teacher_precision, res.teacher_cpu_offload, trained.shared))
    if res.distributed == "fsdp":
        from dmad.train.sharding import shard_run

        log.info(shard_run(cfg, trained, teacher, method, acc.device))
    schedule = teacher.family.schedule(teacher.scheduler, res.resolution)
    teacher_net = trained.teacher_view if trained.teacher_view is not None else teacher.denoiser  # adapters off
    real = RealScore(teacher_net, _encode_uncond(teacher, acc.device), dist.real_guidance_scale, teacher.family)
    timesteps = dist.resolved_student_timesteps()
    nets, optimizers = method.prepare(trained, cfg, acc, real, schedule, timesteps)
    if trained.ema is not None:
        trained.ema.to(acc.device)
    passes = PassCounter({"teacher": teacher_net, **dict(method.modules(trained))}, reference=teacher.denoiser)
    return Trainer(cfg=cfg, accelerator=acc, teacher=teacher, weight_dtype=wdtype, method=method, trainables=trained,
                   nets=nets, optimizers=optimizers, schedule=schedule, timesteps=timesteps, passes=passes)


def _caches(dataset, teacher, res, log: logging.Logger):
    """The latent / text cache of resources.cache_latents (None without)."""
    if not res.cache_latents:
        return None
    from dmad.data.encode import make_caches

    caches = make_caches(dataset, teacher, torch_dtype(res.mixed_precision))
    log.info("latent cache: %s", ", ".join(map(str, dataset.cache_dirs)))
    return caches


def _data_stream(dataset, groups, skip_log, caches, teacher, res, acc, progress: Progress) -> DataStream:
    """The batches from `progress.batches_used` on; skipped items are reported at the iteration
    they are met."""
    from dmad.data.loading import make_loader
    from dmad.data.mixing import MixtureBatches
    from dmad.data.scan import report_skips

    sampler = MixtureBatches(groups, res.train_batch_size, res.seed, acc.process_index, acc.num_processes,
                             consumed=progress.batches_used)
    loader = iter(make_loader(dataset, sampler, res.dataloader_num_workers))
    batches = report_skips(loader, lambda skips: skip_log.loaded(progress.iter, skips))
    return DataStream(dataset, sampler, skip_log, caches, teacher, acc.device, res.seed, res.vae_batch_size, batches)


def size_step(teacher) -> int:
    """Pixel sides the teacher takes: VAE factor x UNet downsampling (64 for SD), or VAE factor x
    patch size (16 for SD3 and Flux)."""
    return teacher.family.size_step(teacher.denoiser.config)


def check_buckets(groups, teacher, source) -> None:
    step = size_step(teacher)
    for g in groups:
        if g.bucket[0] % step or g.bucket[1] % step:
            raise UserInputError(f"train_data_dir {source}: bucket {g.bucket[0]}x{g.bucket[1]} is not a multiple of "
                                 f"{step} pixels, which this teacher needs: set bucket_step to a multiple of {step} "
                                 f"in the dataset list")
