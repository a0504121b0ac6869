"""One point of `dmad probe` (dmad/train/probe.py), in a process of its own so no allocator state carries
over from another point: the run config at one (batch, resolution), trained for warmup + steps
iterations (kind "train") or put through the same networks without any backward (kind
"baseline"), in a throwaway run folder; then the measurements as one JSON file.

The point opens its run folder with dmad.train.run_open.open_run and trains with train_loop itself (with no
samples and no checkpoints after each iteration), so the phases, the out-of-memory classification (loading, vae-encode, first-forward,
first-backward, step-N) and DMAD_FAULT are exactly those of a real run.
"""
from __future__ import annotations

import csv
import os
import statistics
import time
from pathlib import Path
from typing import Any, Optional, Sequence

import torch

from dmad.memory import readings as memory
from dmad.contract.regular import fopen_regular
from dmad.contract.runs import atomic_write_json
from dmad.methods.dmd2 import FAKE_GUIDANCE, student_input
from dmad.methods.unit import Stages
from dmad.train.loop import memory_row, train_loop
from dmad.train.run_open import open_run
from dmad.train.session import Session
from dmad.train.trainer import Trainer


def run_point(cfg: Any, run_dir: Path, baseline: bool) -> int:
    """The point's run: the training loop with nothing after each iteration (no checkpoints, no
    samples, no teacher reference), or the inference baseline; the exit code of a real run."""
    with open_run(cfg, run_dir, None, ["dmad", "probe-point"]) as run:
        s, tr = run.build()
        run.exit_code = inference_loop(s, tr, run.phase) if baseline else \
            train_loop(s, tr, run.stop, run.phase, run.control, after_iteration=lambda s, tr: None)
    return run.exit_code


def inference_loop(s: Session, tr: Trainer, phase: Any) -> int:
    """The baseline: per iteration, one batch encoded (VAE, text encoder), the student's prediction
    (from its input as training makes it) and the teacher's guided prediction and, for a method with
    one (DMAD), the fake score's, all without autograd; one metrics row per iteration (the same
    columns as training)."""
    cfg, p, files, nets = tr.cfg, s.progress, s.files, tr.nets
    files.folder.write_status("running", iter=p.iter, max_train_steps=cfg.optimization.max_train_steps)
    files.events.emit("phase", p.iter, phase="inference-probe")
    while p.iter < cfg.optimization.max_train_steps:
        stages = Stages(phase, p.iter, first=p.iter == 0)
        t0 = time.perf_counter()
        [mb] = s.data.take(p.batches_used, 1)
        t_data = time.perf_counter() - t0
        p.batches_used += 1
        with torch.no_grad():
            stages.encode()
            latents, emb = mb.encode()
            stages.forward()
            with tr.accelerator.autocast():
                x_t, t = student_input(nets, latents.shape, emb, p.iter, cfg.resources.seed, mb.rng, tr.accelerator)
                x0 = nets.family.x0(nets.student, x_t, t, emb, nets.schedule)
                nets.real.x0(nets.schedule, x0, t, emb)
                fake = getattr(nets, "fake_score", None)  # DMAD's third network
                if fake is not None:
                    nets.family.predict(fake, x0.to(tr.weight_dtype), t, emb, nets.schedule, guidance=FAKE_GUIDANCE)
        tr.sync_device()
        p.iter += 1
        row = {"iter": p.iter, "step_time_s": time.perf_counter() - t0, "data_time_s": t_data}
        row.update(memory_row(tr.device))
        files.metrics.append({k: row.get(k) for k in files.metrics.columns})
        files.events.emit("metric", p.iter, **{k: v for k, v in row.items() if k != "iter"})
    files.folder.write_status("finished", iter=p.iter)
    files.events.emit("finished", p.iter)
    return 0


def _rows(path: Path) -> list[dict]:
    try:
        with fopen_regular(path, "r", newline="", encoding="utf-8") as f:
            return list(csv.DictReader(f))
    except OSError:
        return []


def _floats(rows: list[dict], key: str) -> list[float]:
    out = []
    for r in rows:
        try:
            out.append(float(r[key]))
        except (KeyError, TypeError, ValueError):
            pass
    return out


def _error_event(run_dir: Path) -> Optional[dict]:
    from dmad.contract.events import read_events

    errors = [e.data for e in read_events(run_dir / "events.jsonl") if e.kind == "error"]
    return errors[-1] if errors else None


def measure(run_dir: Path, warmup: int, code: int) -> dict:
    """The point's figures from its run folder: step times after warm-up (data vs compute), the
    framework peak (max over the metrics rows), the device peak (NVML samples of gpu_mem.csv) and
    this process's peak RSS; status and out-of-memory phase from the exit code and error event."""
    rows = _rows(run_dir / "metrics.csv")
    timed = [r for r in rows if int(float(r.get("iter") or 0)) > warmup] or rows
    steps, data = _floats(timed, "step_time_s"), _floats(timed, "data_time_s")
    framework = _floats(rows, "mem_peak_alloc_gb")
    nvml = [r for r in _rows(run_dir / "gpu_mem.csv") if r.get("scope") == "device_nvml"]
    device, total = _floats(nvml, "mem_used_gb"), _floats(nvml, "mem_total_gb")
    err = _error_event(run_dir) if code else None
    status = "ok" if code == 0 else ("oom" if code == 3 else "error")
    step = statistics.fmean(steps) if steps else None
    data_t = statistics.fmean(data) if data else None
    return {"status": status, "oom_phase": (err or {}).get("phase", "none") if status == "oom" else "none",
            "error": None if code == 0 else (err or {}).get("reason", f"exit code {code}"),
            "framework_peak_gb": max(framework) if framework else None,
            "device_peak_gb": max(device) if device else None,
            "device_total_gb": max(total) if total else None,
            "process_peak_rss_gb": memory.process_peak_rss_gb(),
            "step_time_s": step, "data_time_s": data_t,
            "compute_time_s": (step - data_t) if step is not None and data_t is not None else None,
            "iterations": len(rows)}


def main_probe_point(*, config: str, kind: str, batch: int, resolution: int, steps: int, warmup: int, run_dir: str,
                     result_path: str, overrides: Sequence[str] = ()) -> int:
    """`dmad probe-point` (internal; `dmad probe` starts it): writes `result_path` (--result), exits 0
    unless the point could not even be set up."""
    from dmad.contract.config import load_config
    from dmad.errors import DmadError

    sets = [*overrides, f"resources.train_batch_size={batch}", f"resources.resolution={resolution}",
            f"optimization.max_train_steps={warmup + steps}", "observation.log_every_steps=1",
            "observation.gpu_mem_interval_s=0.5",
            "optimization.lr_warmup_steps=0"]
    cfg = load_config(config, sets)
    import diffusers  # noqa: F401 - the libraries in memory before the models: not part of the point's cost
    import transformers  # noqa: F401

    rss_before = memory.process_rss_gb()
    run_dir = Path(run_dir)
    try:
        code = run_point(cfg, run_dir, baseline=kind == "baseline")
    except DmadError as e:
        code = e.exit_code
        if not (run_dir / "events.jsonl").exists():
            atomic_write_json(Path(result_path), {"status": "error", "oom_phase": "none", "error": str(e),
                                                  "pid": os.getpid()})
            return 0
    result = measure(run_dir, warmup, code)
    result["pid"] = os.getpid()
    result["process_rss_before_gb"] = rss_before  # host RAM before the models loaded (CPU comparisons)
    atomic_write_json(Path(result_path), result)
    return 0
