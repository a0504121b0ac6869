"""dmad train: one linear DMAD training loop inside a run folder.

Per iteration (= one critic optimizer step):
  1. draw gradient_accumulation_steps batches (data time is measured here);
  2. per micro-batch: encode images (VAE) and captions, make the student's input (pure noise, or
     for multi-step students a backward-simulated rollout), run the student;
     every K-th iteration also backpropagate the student loss (DM + GAN) through it;
  3. student optimizer step (every K-th iteration), then the critic's micro-batches on the
     detached student samples and its optimizer step;
  4. log / checkpoint / validation samples / control commands at iteration boundaries.
Stdout carries only events (DESIGN.md); everything else goes to stderr and logs/engine.log.
"""
from __future__ import annotations

import contextlib
import math
import sys
import time
import traceback
from pathlib import Path
from typing import Optional

import torch

from dmad.contract.config import TrainConfig
from dmad.errors import DmadError
from dmad.contract.events import EventWriter
from dmad.train.monitor import Monitor
from dmad.train.launch import world_rank
from dmad.train.oom import Phase, advice, classify
from dmad.contract.prompts import load_prompt_set
from dmad.train.ranks import NullEvents, NullMonitor, ReadOnlyFolder, any_rank, broadcast, mean_logs, record_failure
from dmad.contract.runs import ControlReader, RunFolder
from dmad.train.build import build_session, make_accelerator, restore
from dmad.train.session import (METRIC_COLUMNS, NonFiniteLoss, Session, StopFlag, cut_back_to_checkpoint,
                          PipeSafeStream, is_oom, prepare_folder, setup_logging)
from dmad.train.step import critic_loss, generator_loss



def run_training(cfg: TrainConfig, run_dir: Path, resume: Optional[str], argv: list[str],
                 probe: Optional[str] = None) -> int:
    """Creates (or reopens, to resume) the run folder, trains, and returns the exit code.
    `probe` (dmad.train.probe): "train" measures training iterations, "inference" forward passes only;
    neither renders samples nor saves checkpoints."""
    phase = Phase()  # a bad DMAD_FAULT is refused before the run folder is touched
    rank, world = world_rank()
    acc = make_accelerator(cfg.resources.mixed_precision) if world > 1 else None  # joins the process group
    main = rank == 0
    if main:
        folder = RunFolder.open(run_dir) if resume else RunFolder.create(run_dir)
        if resume:  # before any writer opens events.jsonl / metrics.csv (they are rewritten, not edited)
            cut_back_to_checkpoint(folder, Path(resume))
    if acc is not None:
        acc.wait_for_everyone()  # rank 0 made the folder
    if not main:
        folder = ReadOnlyFolder(run_dir)
    real_stderr, sys.stderr = sys.stderr, PipeSafeStream(sys.stderr)  # before logging takes its handle
    log = setup_logging(folder.engine_log if main else folder.logs_dir / f"rank_{rank}.log")
    real_stdout, sys.stdout = sys.stdout, sys.stderr  # library print()s must never reach the event stream
    events = EventWriter(folder.events_jsonl, stream=real_stdout) if main else NullEvents()
    stop = StopFlag().install()
    s: Optional[Session] = None
    session: list[Optional[Session]] = [None]  # the sampler's events carry the iteration once there is one

    def sampled(row: dict) -> None:
        it = session[0].iter if session[0] is not None else None
        events.emit("metric", it, source="sampler", **{k: v for k, v in row.items() if k != "t"})

    monitor = Monitor(folder, None, cfg.observation.gpu_mem_interval_s, on_sample=sampled) if main else NullMonitor()
    try:
        if main:
            prompt_set = prepare_folder(folder, cfg, resume, argv, events, world)
        if acc is not None:
            acc.wait_for_everyone()  # rank 0 wrote the run's prompt set
        if not main:
            prompt_set = load_prompt_set(folder.prompt_set_json)
        monitor.start()
        phase.set("loading")
        s = session[0] = build_session(cfg, folder, prompt_set, events, log, monitor, acc)
        restore(s, resume)
        s.probe = probe is not None
        if probe == "inference":
            from dmad.train.probe_point import inference_loop

            return inference_loop(s, phase)
        if not s.probe:
            phase.set("sampling")
            s.render_teacher_reference()  # before iteration 1; a no-op on resume
        return train_loop(s, stop, phase)
    except NonFiniteLoss as e:
        return _fail(folder, events, s, f"{e}; the last good checkpoint is kept", 1, term=e.term, cause="non_finite_loss")
    except DmadError as e:
        _fail(folder, events, s, str(e), e.exit_code, cause=type(e).__name__, quiet=True)
        raise
    except BaseException as e:
        if is_oom(e):
            where = classify(phase.name)
            tip = advice(where, cfg.resources)
            folder.write_status("failed", advice=tip)
            return _fail(folder, events, s, f"out of memory during {where}: {str(e).splitlines()[0][:200]}", 3,
                         cause="out_of_memory", phase=where, advice=tip)
        if isinstance(e, KeyboardInterrupt):
            _fail(folder, events, s, "interrupted", 130, cause="interrupted", quiet=True)
            raise
        log.error("unexpected failure in phase %s\n%s", phase.name, traceback.format_exc())
        if not main:
            record_failure(folder, rank, f"{type(e).__name__}: {e} (in {phase.name})")
        _fail(folder, events, s, f"{type(e).__name__}: {e} (in {phase.name}; details in {folder.engine_log})", 1,
              cause="exception", quiet=True)
        raise DmadError(f"{type(e).__name__}: {e} (details in {folder.engine_log})") from None
    finally:
        stop.uninstall()
        monitor.stop()
        if s is not None:
            s.metrics.close()
        events.close()
        sys.stdout, sys.stderr = real_stdout, real_stderr


def _fail(folder: RunFolder, events: EventWriter, s: Optional[Session], reason: str, code: int,
          quiet: bool = False, **data) -> int:
    """Error event + failed status; one line on stderr unless the CLI prints the exception itself."""
    last = folder.latest_checkpoint()
    it = s.iter if s is not None else None
    events.emit("error", it, reason=reason, exit_code=code, last_checkpoint=last[0] if last else None, **data)
    folder.write_status("failed", failure_reason=reason, exit_code=code)
    if not quiet:
        print(f"dmad: error: {reason}", file=sys.stderr, flush=True)
    return code


# --------------------------------------------------------------------------- the loop

def train_loop(s: Session, stop: "StopFlag", phase: Phase) -> int:
    cfg, acc = s.cfg, s.accelerator
    accum = cfg.resources.gradient_accumulation_steps
    k_gen = cfg.distillation.critic_updates_per_generator_update
    control = ControlReader(s.folder.control_jsonl)
    window = _Window()
    s.folder.write_status("running", iter=s.iter, max_train_steps=cfg.optimization.max_train_steps)
    s.events.emit("phase", s.iter, phase="training")
    while s.iter < cfg.optimization.max_train_steps:
        if _handle_control(s, control, stop):
            return _stop(s)
        t_iter = time.perf_counter()
        first_batch = s.batches_used
        batches = [next(s.data) for _ in range(accum)]
        s.batches_used += accum
        window.data_time += time.perf_counter() - t_iter
        first = s.iter == s.start_iter
        gen_step = s.iter % k_gen == 0
        samples, logs = [], _LogSum(defer=s.world > 1)
        for m, batch in enumerate(batches):
            phase.set("vae-encode" if first else f"step-{s.iter + 1}")
            rng = s.rng(first_batch + m)
            latents, emb = s.encode_batch(batch, rng)
            phase.set("first-forward" if first else phase.name)
            x_t, t = s.student_input(latents.shape, emb, s.iter, rng)
            sync = acc.no_sync(s.student) if m < accum - 1 else contextlib.nullcontext()
            with sync, acc.autocast(), torch.set_grad_enabled(gen_step):
                x0 = s.student_x0(x_t, t, emb)
                if gen_step:
                    with s.critic_frozen():  # backward too: checkpointed recomputation must see the same graph
                        loss, lg = generator_loss(x0, emb, gen=rng, **s.generator_kwargs)
                        phase.set("first-backward" if first else phase.name)
                        acc.backward(loss / accum)
                    logs.add(lg, s.iter + 1)
            samples.append((x0.detach(), latents, emb, rng))
        if gen_step:
            logs.add({"grad_norm_g": s.step_generator()}, s.iter + 1)
        for m, (x0, latents, emb, rng) in enumerate(samples):
            phase.set("first-forward" if first else phase.name)
            sync = acc.no_sync(s.fake_score) if m < accum - 1 else contextlib.nullcontext()
            with sync, acc.autocast():
                loss, lc = critic_loss(x0, latents, emb, gen=rng, **s.critic_kwargs)
            phase.set("first-backward" if first else phase.name)
            acc.backward(loss / accum)
            logs.add(lc, s.iter + 1)
        logs.add({"grad_norm_c": s.step_critic()}, s.iter + 1)
        _check_finite(s, logs)
        s.iter += 1
        window.add(logs)
        if s.iter % cfg.observation.log_every_steps == 0 or s.iter == cfg.optimization.max_train_steps:
            _log_row(s, window)
        _after_iteration(s)
    return _finish(s)


def _after_iteration(s: Session) -> None:
    if s.probe:  # a memory probe measures iterations only
        return
    cfg = s.cfg
    last = s.iter == cfg.optimization.max_train_steps
    if s.iter % cfg.observation.checkpointing_steps == 0 or last:
        s.save_checkpoint()
    v = cfg.observation.validation_steps
    if (v and s.iter % v == 0) or s.iter % cfg.observation.checkpointing_steps == 0 or last:
        s.render_samples()


def _cache_counts(s: Session) -> dict:
    """What the latent/text cache gave this process (status.json `cache`), when the run has one."""
    if s.caches is None:
        return {}
    c = s.caches.counts
    s.log.info("cache: latents %d read, %d encoded; captions %d read, %d encoded", c["latent_hits"],
               c["latent_encoded"], c["text_hits"], c["text_encoded"])
    return {"cache": dict(c)}


def _finish(s: Session) -> int:
    s.folder.write_status("finished", iter=s.iter, **_cache_counts(s))
    s.events.emit("finished", s.iter, elapsed_s=round(time.time() - s.t_start, 3))
    return 0


def _stop(s: Session) -> int:
    s.folder.write_status("stopping", iter=s.iter)
    if s.last_saved != s.iter:
        s.save_checkpoint()
    s.folder.write_status("stopped", iter=s.iter, **_cache_counts(s))
    s.events.emit("stopped", s.iter, last_checkpoint=s.last_saved)
    return 0


def _handle_control(s: Session, control: ControlReader, stop: "StopFlag") -> bool:
    """Applies control.jsonl commands; returns True when the run must stop. Pausing blocks here
    (models stay loaded; the monitor thread keeps the heartbeat fresh). Rank 0 reads the commands
    and its stop flag; every rank applies them (checkpoints and samples are collective)."""
    paused = False
    while True:
        commands, stopping = _poll_control(s, control, stop)
        for cmd in commands:
            if cmd == "stop":
                stopping = True
            elif cmd == "pause" and not paused:
                paused = True
                s.folder.write_status("paused", iter=s.iter)
                s.events.emit("paused", s.iter)
            elif cmd == "resume" and paused:
                paused = False
                s.folder.write_status("running", iter=s.iter)
                s.events.emit("resumed", s.iter)
            elif cmd == "sample_now":
                s.render_samples()
            elif cmd == "checkpoint_now":
                s.save_checkpoint()
        if stopping:
            stop.set()
            return True
        if not paused:
            return False
        time.sleep(0.2)


def _check_finite(s: Session, logs: "_LogSum") -> None:
    if s.world > 1 and any_rank(s.accelerator, logs.bad is not None):
        term, it = logs.bad or ("loss on another rank", s.iter + 1)
        raise NonFiniteLoss(term, it)


def _poll_control(s: Session, control: ControlReader, stop: "StopFlag") -> tuple[list, bool]:
    commands = [c.get("cmd") for c in control.poll()] if s.is_main else []
    stopping = stop.is_set() if s.is_main else False
    if s.world > 1:
        commands, stopping = broadcast(s.accelerator, (commands, stopping))
    return commands, stopping


class _LogSum:
    """Sums of per-micro-step logs for one iteration (means are taken over the log window). A
    non-finite loss raises at once in a single process; with several, it is noted and every rank
    raises together at the end of the iteration (`_check_finite`), so none waits on a dead peer."""

    def __init__(self, defer: bool = False):
        self.sums: dict[str, float] = {}
        self.counts: dict[str, int] = {}
        self.defer = defer
        self.bad: Optional[tuple[str, int]] = None

    def add(self, logs: dict, iteration: int) -> None:
        for k, v in logs.items():
            if v is None:
                continue
            if k.startswith("loss_") and not math.isfinite(v):
                if not self.defer:
                    raise NonFiniteLoss(k, iteration)
                self.bad = self.bad or (k, iteration)
            self.sums[k] = self.sums.get(k, 0.0) + v
            self.counts[k] = self.counts.get(k, 0) + 1


class _Window(_LogSum):
    def __init__(self):
        super().__init__()
        self.reset()

    def reset(self) -> None:
        self.sums, self.counts, self.iters, self.data_time = {}, {}, 0, 0.0
        self.t0 = time.perf_counter()

    def add(self, logs: _LogSum, iteration: int = 0) -> None:  # type: ignore[override]
        for k, v in logs.sums.items():
            self.sums[k] = self.sums.get(k, 0.0) + v
            self.counts[k] = self.counts.get(k, 0) + logs.counts[k]
        self.iters += 1


def _log_row(s: Session, w: _Window) -> None:
    if w.iters == 0:
        return
    s.sync_device()  # so the window's wall time covers queued GPU work (one sync per log row)
    elapsed = time.perf_counter() - w.t0
    if s.world > 1:  # the row is the mean over every process's samples; rank 0 writes it
        w.sums, w.counts = mean_logs(s.accelerator, w.sums, w.counts)
        if not s.is_main:
            w.reset()
            return
    row = {k: w.sums[k] / w.counts[k] for k in w.sums}
    row.update(s.memory_row())
    row.update(iter=s.iter, step_time_s=elapsed / w.iters, data_time_s=w.data_time / w.iters,
               lr_generator=s.sched_g.get_last_lr()[0], lr_critic=s.sched_c.get_last_lr()[0])
    s.metrics.append({k: row.get(k) for k in METRIC_COLUMNS})
    remaining = s.cfg.optimization.max_train_steps - s.iter
    s.events.emit("metric", s.iter, **{k: v for k, v in row.items() if k != "iter"},
                  max_train_steps=s.cfg.optimization.max_train_steps,
                  eta_s=round(remaining * elapsed / w.iters, 1))
    w.reset()
