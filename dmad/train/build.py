"""Building a training session: accelerator, teacher, the three networks, optimizers, data; and
restoring one from a checkpoint."""
from __future__ import annotations

import datetime
import logging
import math
from pathlib import Path
from typing import Callable, Optional

import torch

from dmad.models.checkpoint import load_checkpoint
from dmad.contract.config import TrainConfig
from dmad.errors import UserInputError
from dmad.contract.events import EventWriter
from dmad.train.monitor import Monitor
from dmad.models.networks import build_networks, make_lr_scheduler, make_optimizer, trainable_parameters
from dmad.contract.prompts import PromptSet
from dmad.train.passes import PassCounter
from dmad.train.ranks import NullCsv
from dmad.contract.runs import CsvAppender, RunFolder
from dmad.models.teacher import DTYPES
from dmad.train.session import METRIC_COLUMNS, Session
from dmad.train.step import DmadNetworks, LcmNetworks, RealScore, TimestepRange



def make_accelerator(mixed_precision: str):
    from accelerate import Accelerator
    from accelerate.utils import InitProcessGroupKwargs

    from dmad.train.preflight import check_precision_here

    check_precision_here(mixed_precision)
    cuda = torch.cuda.is_available()
    # Accumulation is done by the loop itself (explicit loss scaling, no_sync on inner
    # micro-steps), so accelerate's own counter stays at 1.
    # Rank 0 renders samples and writes checkpoints while the others wait in a collective: allow hours.
    timeout = InitProcessGroupKwargs(timeout=datetime.timedelta(hours=6))
    return Accelerator(mixed_precision=mixed_precision, cpu=not cuda, gradient_accumulation_steps=1,
                       kwargs_handlers=[timeout])


def _encode_uncond(teacher, device):
    """The family's unconditional embedding (batch 1), or None for a guidance-embedding teacher."""
    if teacher.family.guidance_embedded(teacher.denoiser):
        return None
    with torch.no_grad():
        return teacher.family.uncond(teacher.modules, device)


TEACHER_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


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
                shared.cast_frozen(TEACHER_DTYPES.get(precision, wdtype))
            else:
                m.to(dtype=TEACHER_DTYPES.get(precision, wdtype))
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


def build_session(cfg: TrainConfig, folder: RunFolder, prompt_set: PromptSet, events: EventWriter,
                  log: logging.Logger, monitor: Monitor, acc=None, resume: Optional[str] = None,
                  between_phases: Callable[[], None] = lambda: None,
                  loaded: Callable[[int], None] = lambda iteration: None) -> Session:
    """Everything the loop holds, in one go: data, teacher, networks, optimizers; restored from the
    checkpoint `resume` (exact resume), with the data stream starting at the batch it reached.
    `between_phases()` runs after each long step (control commands: a stop ends the build there);
    `loaded(iteration)` once everything has loaded, before the run's logs are opened for writing
    (the run commits to continuing from there: dmad.train.run_open.OpenRun.commit)."""
    from accelerate.utils import set_seed

    from dmad.data.loading import open_dataset
    from dmad.data.mixing import MixtureBatches
    from dmad.models.teacher import load_teacher

    ident, res, opt, dist = cfg.identity, cfg.resources, cfg.optimization, cfg.distillation
    acc = acc or make_accelerator(res.mixed_precision)
    set_seed(res.seed + acc.process_index)  # seeds differ per rank for data and noise
    wdtype = DTYPES[res.mixed_precision]
    monitor.device = acc.device
    # the data first: too few usable images must stop the run before any model loads
    dataset, groups, skip_log = open_dataset(ident.train_data_dir, res.resolution, res.train_batch_size,
                                             cfg.effective_batch(acc.num_processes), res.seed, events, folder, log)
    events.emit("phase", None, phase="loading", device=str(acc.device))
    between_phases()
    teacher = load_teacher(ident.pretrained_model_name_or_path, ident.model_family, ident.teacher_config_dir,
                           dtype=torch.float32)
    between_phases()
    family = teacher.family
    family.guidance = dist.real_guidance_scale  # what a guidance-embedding student and fake score are given
    lcm = dist.method == "lcm"
    nets = build_networks(teacher.denoiser, student=ident.student, fake_score=ident.fake_score,
                          lora_rank=ident.lora_rank, lora_alpha=ident.lora_alpha,
                          gradient_checkpointing=res.gradient_checkpointing, ema_decay=dist.ema_decay,
                          gan_on_teacher=dist.gan_head_placement == "teacher_bottleneck", family=family,
                          base_dtype=wdtype, share_frozen_base=res.share_frozen_base,
                          lcm_target_decay=dist.lcm_target_ema_decay if lcm else None)
    check_buckets(groups, teacher, ident.train_data_dir)
    caches = None
    if res.cache_latents:
        from dmad.data.encode import make_caches

        caches = make_caches(dataset, teacher, wdtype)
        log.info("latent cache: %s", ", ".join(map(str, dataset.cache_dirs)))
    log.info(place_teacher(teacher, acc.device, wdtype, res.teacher_precision, res.teacher_cpu_offload, nets.shared))
    betas = (opt.adam_beta1, opt.adam_beta2)
    opt_g = make_optimizer(trainable_parameters(nets.student), opt.optimizer, opt.generator_lr, betas,
                           opt.adam_epsilon, opt.adam_weight_decay)
    schedule = family.schedule(teacher.scheduler, res.resolution)
    teacher_net = nets.teacher if nets.teacher is not None else teacher.denoiser  # shared base: adapters off
    real = RealScore(teacher_net, _encode_uncond(teacher, acc.device), dist.real_guidance_scale, family)
    if lcm:  # the student steps every iteration; no critic
        opt_c = sched_c = None
        sched_g = make_lr_scheduler(opt_g, opt.lr_scheduler, opt.lr_warmup_steps, opt.max_train_steps)
        student, opt_g = acc.prepare(nets.student, opt_g)
        nets.target.to(acc.device)
        method_nets = LcmNetworks(student=student, student_bare=nets.student, real=real, target=nets.target,
                                  family=family, schedule=schedule, num_ddim_timesteps=dist.lcm_ddim_timesteps,
                                  huber_c=dist.lcm_huber_c, loss_type=dist.lcm_loss_type)
    else:
        opt_g, opt_c, sched_g, sched_c, method_nets = _dmad_networks(cfg, acc, nets, opt_g, real, teacher_net,
                                                                     family, schedule)
    if nets.ema is not None:
        nets.ema.to(acc.device)
    timesteps = dist.resolved_student_timesteps()
    between_phases()
    state = _load_checkpoint(cfg, resume, nets, opt_g, opt_c, sched_g, sched_c, acc, timesteps) if resume else None
    loaded(state.iter if state else 0)
    if state is not None:
        events.emit("phase", state.iter, phase="restored", checkpoint=str(resume))
    batches_used = state.batches_used if state else 0
    sampler = MixtureBatches(groups, res.train_batch_size, res.seed, acc.process_index, acc.num_processes,
                             consumed=batches_used)
    metrics = CsvAppender(folder.metrics_csv, METRIC_COLUMNS) if acc.is_main_process else NullCsv(METRIC_COLUMNS)
    passes = PassCounter({"teacher": teacher_net, "student": nets.student, "fake_score": nets.fake_score,
                          "gan_head": nets.gan_head}, reference=teacher.denoiser,
                         start=state.network_passes if state else None)
    s = Session(cfg=cfg, folder=folder, events=events, log=log, accelerator=acc, weight_dtype=wdtype, teacher=teacher,
                nets=nets, dmad=method_nets, opt_g=opt_g, opt_c=opt_c, sched_g=sched_g, sched_c=sched_c, timesteps=timesteps,
                prompt_set=prompt_set, dataset=dataset, sampler=sampler, skip_log=skip_log, caches=caches,
                metrics=metrics, passes=passes, iter=state.iter if state else 0,
                generator_steps=state.generator_steps if state else 0, batches_used=batches_used)
    log.info("loaded teacher %s (%s, %s); student %s, fake score %s; device %s, %s",
             ident.pretrained_model_name_or_path, teacher.info.family, schedule.prediction_type,
             ident.student, "none (lcm)" if lcm else ident.fake_score, acc.device, res.mixed_precision)
    return s


def _dmad_networks(cfg: TrainConfig, acc, nets, opt_g, real: RealScore, teacher_net, family, schedule):
    """DMAD's critic (fake score + GAN head) optimizer, both schedules, the prepared networks and the
    DmadNetworks an iteration calls."""
    opt, dist = cfg.optimization, cfg.distillation
    betas = (opt.adam_beta1, opt.adam_beta2)
    critic_params = trainable_parameters(nets.fake_score) + trainable_parameters(nets.gan_head)
    opt_c = make_optimizer(critic_params, opt.optimizer, opt.critic_lr, betas, opt.adam_epsilon, opt.adam_weight_decay)
    k = dist.critic_updates_per_generator_update
    sched_g = make_lr_scheduler(opt_g, opt.lr_scheduler, math.ceil(opt.lr_warmup_steps / k),
                                math.ceil(opt.max_train_steps / k))
    sched_c = make_lr_scheduler(opt_c, opt.lr_scheduler, opt.lr_warmup_steps, opt.max_train_steps)
    student, fake, head, opt_g, opt_c = acc.prepare(nets.student, nets.fake_score, nets.gan_head, opt_g, opt_c)
    on_teacher = dist.gan_head_placement == "teacher_bottleneck"
    gan_net = teacher_net if on_teacher else nets.fake_score
    dmad = DmadNetworks(student=student, fake_score=fake, fake_score_bare=nets.fake_score, gan_head=head, real=real,
                        gan_net=gan_net, tap=family.tap(gan_net), head_on_teacher=on_teacher, family=family,
                        schedule=schedule, trange=TimestepRange(dist.min_timestep, dist.max_timestep))
    return opt_g, opt_c, sched_g, sched_c, dmad


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


def _load_checkpoint(cfg: TrainConfig, resume: str, nets, opt_g, opt_c, sched_g, sched_c, acc, timesteps):
    ident = cfg.identity
    state = load_checkpoint(Path(resume), nets=nets, student_mode=ident.student, fake_mode=ident.fake_score,
                            opt_g=opt_g, opt_c=opt_c, sched_g=sched_g, sched_c=sched_c, scaler=acc.scaler)
    if state.student_timesteps != timesteps:
        raise UserInputError(f"checkpoint {resume} was trained with student timesteps {state.student_timesteps}, "
                             f"the config asks for {timesteps}")
    return state
