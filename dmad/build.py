"""Building a training session: accelerator, teacher, the three networks, optimizers, data; and
restoring one from a checkpoint."""
from __future__ import annotations

import datetime
import logging
import math
from pathlib import Path
from typing import Optional

import torch

from dmad.checkpoint import load_checkpoint
from dmad.config import TrainConfig
from dmad.errors import UserInputError
from dmad.events import EventWriter
from dmad.methods.dmd2 import BottleneckTap
from dmad.methods.prediction import NoiseSchedule
from dmad.monitor import Monitor
from dmad.networks import build_networks, make_lr_scheduler, make_optimizer, trainable_parameters
from dmad.prompts import PromptSet
from dmad.ranks import NullCsv
from dmad.runs import CsvAppender, RunFolder
from dmad.session import METRIC_COLUMNS, Session
from dmad.step import RealScore, TimestepRange

DTYPES = {"no": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def make_accelerator(mixed_precision: str):
    from accelerate import Accelerator
    from accelerate.utils import InitProcessGroupKwargs

    cuda = torch.cuda.is_available()
    if mixed_precision == "fp16" and not cuda:
        raise UserInputError("resources.mixed_precision: fp16 needs a CUDA GPU; use bf16 or no on a CPU")
    # Accumulation is done by the loop itself (explicit loss scaling, no_sync on inner
    # micro-steps), so accelerate's own counter stays at 1.
    # Rank 0 renders samples and writes checkpoints while the others wait in a collective: allow hours.
    timeout = InitProcessGroupKwargs(timeout=datetime.timedelta(hours=6))
    return Accelerator(mixed_precision=mixed_precision, cpu=not cuda, gradient_accumulation_steps=1,
                       kwargs_handlers=[timeout])


def _encode_uncond(teacher, device) -> torch.Tensor:
    from dmad.models.teacher import encode_prompts

    with torch.no_grad():
        return encode_prompts(teacher.tokenizer, teacher.text_encoder, [""], device)


def build_session(cfg: TrainConfig, folder: RunFolder, prompt_set: PromptSet, events: EventWriter,
                  log: logging.Logger, monitor: Monitor, acc=None) -> Session:
    from accelerate.utils import set_seed

    from dmad.data import open_dataset
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
    teacher = load_teacher(ident.pretrained_model_name_or_path, ident.model_family, ident.teacher_config_dir,
                           dtype=torch.float32)
    nets = build_networks(teacher.unet, student=ident.student, fake_score=ident.fake_score, lora_rank=ident.lora_rank,
                          lora_alpha=ident.lora_alpha, gradient_checkpointing=res.gradient_checkpointing,
                          ema_decay=dist.ema_decay, gan_on_teacher=dist.gan_head_placement == "teacher_bottleneck")
    check_buckets(groups, teacher, ident.train_data_dir)
    caches = None
    if res.cache_latents:
        from dmad.encode import make_caches

        caches = make_caches(dataset, teacher, wdtype)
        log.info("latent cache: %s", ", ".join(map(str, dataset.cache_dirs)))
    for m in (teacher.unet, teacher.vae, teacher.text_encoder):
        m.requires_grad_(False)
        m.eval()
        m.to(acc.device) if wdtype == torch.float32 else m.to(acc.device, dtype=wdtype)
    betas = (opt.adam_beta1, opt.adam_beta2)
    opt_g = make_optimizer(trainable_parameters(nets.student), opt.optimizer, opt.generator_lr, betas,
                           opt.adam_epsilon, opt.adam_weight_decay)
    critic_params = trainable_parameters(nets.fake_score) + trainable_parameters(nets.gan_head)
    opt_c = make_optimizer(critic_params, opt.optimizer, opt.critic_lr, betas, opt.adam_epsilon, opt.adam_weight_decay)
    k = dist.critic_updates_per_generator_update
    sched_g = make_lr_scheduler(opt_g, opt.lr_scheduler, math.ceil(opt.lr_warmup_steps / k),
                                math.ceil(opt.max_train_steps / k))
    sched_c = make_lr_scheduler(opt_c, opt.lr_scheduler, opt.lr_warmup_steps, opt.max_train_steps)
    student, fake, head, opt_g, opt_c = acc.prepare(nets.student, nets.fake_score, nets.gan_head, opt_g, opt_c)
    if nets.ema is not None:
        nets.ema.to(acc.device)
    schedule = NoiseSchedule.from_scheduler(teacher.scheduler)
    real = RealScore(teacher.unet, _encode_uncond(teacher, acc.device), dist.real_guidance_scale, wdtype)
    trange = TimestepRange(dist.min_timestep, dist.max_timestep)
    s = Session(cfg=cfg, folder=folder, events=events, accelerator=acc, device=acc.device, weight_dtype=wdtype,
                teacher=teacher, schedule=schedule, nets=nets, student=student, fake_score=fake, gan_head=head,
                opt_g=opt_g, opt_c=opt_c, sched_g=sched_g, sched_c=sched_c, real=real, trange=trange,
                timesteps=dist.resolved_student_timesteps(), sampler=None, prompt_set=prompt_set,
                dataset=dataset, groups=groups, skip_log=skip_log, caches=caches,
                metrics=CsvAppender(folder.metrics_csv, METRIC_COLUMNS) if acc.is_main_process else NullCsv(METRIC_COLUMNS),
                log=log, is_main=acc.is_main_process, world=acc.num_processes)
    _wire_losses(s, dist.gan_head_placement, dist.generator_gan_weight, dist.critic_gan_weight)
    log.info("loaded teacher %s (%s, %s); student %s, fake score %s; device %s, %s",
             ident.pretrained_model_name_or_path, teacher.info.family, schedule.prediction_type,
             ident.student, ident.fake_score, acc.device, res.mixed_precision)
    return s


def size_step(teacher) -> int:
    """Pixel sides the teacher takes: a multiple of VAE factor x UNet downsampling (64 for SD)."""
    vae_factor = 2 ** (len(teacher.vae.config.block_out_channels) - 1)
    return vae_factor * 2 ** (len(teacher.unet.config.block_out_channels) - 1)


def check_buckets(groups, teacher, source) -> None:
    step = size_step(teacher)
    for g in groups:
        if g.bucket[0] % step or g.bucket[1] % step:
            raise UserInputError(f"train_data_dir {source}: bucket {g.bucket[0]}x{g.bucket[1]} is not a multiple of "
                                 f"{step} pixels, which this teacher needs: set bucket_step to a multiple of {step} "
                                 f"in the dataset list")


def _wire_losses(s: Session, placement: str, w_gen: float, w_critic: float) -> None:
    """The keyword arguments of generator_loss / critic_loss that stay fixed for the run."""
    fake_unwrapped = s.nets.fake_score
    on_teacher = placement == "teacher_bottleneck"
    gan_unet = s.teacher.unet if on_teacher else fake_unwrapped
    tap = BottleneckTap(gan_unet)
    common = dict(schedule=s.schedule, trange=s.trange, head=s.gan_head)
    s.generator_kwargs = dict(real=s.real, fake=fake_unwrapped, gan_unet=gan_unet, gan_tap=tap,
                              gan_weight=w_gen, **common)
    s.critic_kwargs = dict(fake=s.fake_score, fake_tap=None if on_teacher else tap, teacher=s.teacher.unet,
                           teacher_tap=tap if on_teacher else None, gan_weight=w_critic, **common)


def restore(s: Session, resume: Optional[str]) -> None:
    """Load a checkpoint (exact resume) and start the data stream at the batch it reached."""
    from dmad.data import make_loader
    from dmad.mixing import MixtureBatches
    from dmad.data_checks import report_skips

    if resume:
        ident = s.cfg.identity
        state = load_checkpoint(Path(resume), nets=s.nets, student_mode=ident.student, fake_mode=ident.fake_score,
                                opt_g=s.opt_g, opt_c=s.opt_c, sched_g=s.sched_g, sched_c=s.sched_c,
                                scaler=s.accelerator.scaler)
        if state.student_timesteps != s.timesteps:
            raise UserInputError(f"checkpoint {resume} was trained with student timesteps {state.student_timesteps}, "
                                 f"the config asks for {s.timesteps}")
        s.iter = s.start_iter = s.last_saved = state.iter
        s.generator_steps, s.batches_used = state.generator_steps, state.batches_used
        s.events.emit("phase", s.iter, phase="restored", checkpoint=str(resume))
    acc, res = s.accelerator, s.cfg.resources
    sampler = MixtureBatches(s.groups, res.train_batch_size, res.seed, acc.process_index, acc.num_processes,
                             consumed=s.batches_used)
    s.sampler = sampler
    loader = iter(make_loader(s.dataset, sampler, res.dataloader_num_workers))
    s.data = report_skips(loader, lambda skips: s.skip_log.loaded(s.iter, skips))
