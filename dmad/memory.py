"""Memory: scoped readings, and a ledger that estimates a run's framework peak before it starts.

Three scopes, never mixed in one figure (DESIGN.md):
  framework    what torch's CUDA caching allocator handed out in this process (max_memory_allocated);
  device-wide  what NVML sees used on the whole GPU: every process, the CUDA context, allocator cache;
  process      host RAM of this process (resident set size).
All sizes are GiB (2**30 bytes); the `_gb` names follow the metrics.csv columns. Every reading
returns None when its scope does not apply (no CUDA, no NVML) and never raises: a missing reading
must not stop a run. torch, psutil and pynvml are imported inside the functions, so
`import dmad.memory` stays light.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

if TYPE_CHECKING:
    from dmad.models.teacher import TeacherInfo

GIB = 2 ** 30
log = logging.getLogger(__name__)


# --------------------------------------------------------------------------- readings

def _cuda_index(device: Any) -> Optional[int]:
    """CUDA ordinal of `device` (torch.device, "cuda", "cuda:1" or int), None for any other device."""
    if isinstance(device, int):
        return device
    text = str(device)
    if not text.startswith("cuda"):
        return None
    if ":" in text:
        return int(text.split(":", 1)[1])
    import torch

    return torch.cuda.current_device()


def framework_peak_gb(device: Any) -> Optional[float]:
    """Framework scope: the peak of torch.cuda.max_memory_allocated on `device` since the last
    reset_framework_peak (live tensors only; the allocator's cache and the CUDA context are not in
    it). None on CPU."""
    try:
        index = _cuda_index(device)
        if index is None:
            return None
        import torch

        return torch.cuda.max_memory_allocated(index) / GIB
    except Exception as e:  # a reading must never stop a run
        log.debug("framework_peak_gb(%s) failed: %s", device, e)
        return None


def reset_framework_peak(device: Any) -> None:
    """Framework scope: start a new peak window for framework_peak_gb on `device` (no-op on CPU)."""
    try:
        index = _cuda_index(device)
        if index is not None:
            import torch

            torch.cuda.reset_peak_memory_stats(index)
    except Exception as e:
        log.debug("reset_framework_peak(%s) failed: %s", device, e)


_nvml_ready = False


def _nvml_handle(index: int) -> Any:
    """NVML numbers GPUs physically; CUDA numbers the visible ones (CUDA_VISIBLE_DEVICES may reorder
    or hide them), so match by UUID. torch is asked only when CUDA is already up in this process,
    since the question would otherwise create a CUDA context (~0.3-0.5 GiB) as a side effect."""
    import pynvml
    import torch

    global _nvml_ready
    if not _nvml_ready:
        pynvml.nvmlInit()
        _nvml_ready = True
    if torch.cuda.is_initialized():
        uuid = str(torch.cuda.get_device_properties(index).uuid)
        return pynvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith(("GPU-", "MIG-")) else "GPU-" + uuid)
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    if visible:
        entry = visible[index]
        return (pynvml.nvmlDeviceGetHandleByIndex(int(entry)) if entry.isdigit()
                else pynvml.nvmlDeviceGetHandleByUUID(entry))
    return pynvml.nvmlDeviceGetHandleByIndex(index)


def device_used_gb(device: Any) -> tuple[Optional[float], Optional[float]]:
    """Device-wide scope: (used, total) GiB of the whole GPU behind `device` as NVML reports it (all
    processes, CUDA contexts, allocator caches). (None, None) on CPU or when NVML is unavailable."""
    try:
        index = _cuda_index(device)
        if index is None:
            return None, None
        import pynvml

        info = pynvml.nvmlDeviceGetMemoryInfo(_nvml_handle(index))
        return info.used / GIB, info.total / GIB
    except Exception as e:
        log.debug("device_used_gb(%s) failed: %s", device, e)
        return None, None


def process_rss_gb() -> Optional[float]:
    """Process scope: resident host RAM of this process now (psutil), GiB."""
    try:
        import psutil

        return psutil.Process().memory_info().rss / GIB
    except Exception as e:
        log.debug("process_rss_gb failed: %s", e)
        return None


def process_peak_rss_gb() -> Optional[float]:
    """Process scope: the highest resident host RAM of this process since it started, GiB
    (getrusage ru_maxrss: KiB on Linux, bytes on macOS; psutil's peak working set on Windows)."""
    try:
        try:
            import resource
        except ImportError:  # Windows
            import psutil

            return psutil.Process().memory_info().peak_wset / GIB
        import sys

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak / GIB if sys.platform == "darwin" else peak * 1024 / GIB
    except Exception as e:
        log.debug("process_peak_rss_gb failed: %s", e)
        return None


def framework_now_gb(device: Any) -> tuple[Optional[float], Optional[float]]:
    """Framework scope: (allocated, reserved) GiB on `device` now: live tensors, and what the
    caching allocator holds from the driver (allocated + its cache). (None, None) on CPU."""
    try:
        index = _cuda_index(device)
        if index is None:
            return None, None
        import torch

        return torch.cuda.memory_allocated(index) / GIB, torch.cuda.memory_reserved(index) / GIB
    except Exception as e:
        log.debug("framework_now_gb(%s) failed: %s", device, e)
        return None, None


def device_utilization_pct(device: Any) -> Optional[float]:
    """Device-wide scope: GPU utilisation (percent of the last sample period a kernel ran), NVML."""
    try:
        index = _cuda_index(device)
        if index is None:
            return None
        import pynvml

        return float(pynvml.nvmlDeviceGetUtilizationRates(_nvml_handle(index)).gpu)
    except Exception as e:
        log.debug("device_utilization_pct(%s) failed: %s", device, e)
        return None


SCOPES = ("framework", "device", "process")


@dataclass(frozen=True)
class Reading:
    """One memory figure with its scope spelled out; outputs use `column` so scopes never share a
    column or a curve."""
    scope: str   # framework | device | process
    name: str    # allocated, reserved, peak | used, total, utilization | rss, peak_rss
    value: Optional[float]
    unit: str    # GiB | %

    @property
    def column(self) -> str:
        return f"{self.scope}_{self.name}_{'pct' if self.unit == '%' else 'gb'}"


def read(scope: str, device: Any = None) -> list[Reading]:
    """Every reading of one scope (values None where the scope does not apply). framework: torch's
    CUDA allocator in this process (allocated, reserved, peak since the last reset); device: NVML,
    the whole GPU (used, total, utilisation; every process and the CUDA context); process: this
    process's host RAM (rss, peak rss)."""
    if scope == "framework":
        allocated, reserved = framework_now_gb(device)
        return [Reading("framework", "allocated", allocated, "GiB"), Reading("framework", "reserved", reserved, "GiB"),
                Reading("framework", "peak", framework_peak_gb(device), "GiB")]
    if scope == "device":
        used, total = device_used_gb(device)
        return [Reading("device", "used", used, "GiB"), Reading("device", "total", total, "GiB"),
                Reading("device", "utilization", device_utilization_pct(device), "%")]
    if scope == "process":
        rss, peak = process_rss_gb(), process_peak_rss_gb()
        if rss is not None and peak is not None:
            peak = max(peak, rss)  # two sources (psutil, getrusage) a few KiB apart
        return [Reading("process", "rss", rss, "GiB"), Reading("process", "peak_rss", peak, "GiB")]
    raise ValueError(f"unknown memory scope {scope!r}; known: {', '.join(SCOPES)}")


# --------------------------------------------------------------------------- ledger

@dataclass(frozen=True)
class LedgerLine:
    name: str
    gib: float
    assumption: str  # how the figure was reached, shown next to it


BYTES = {"no": 4, "fp16": 2, "bf16": 2}
DTYPE_NAME = {"no": "fp32", "fp16": "fp16", "bf16": "bf16"}
# Optimizer state tensors per trainable parameter (dmad.networks.make_optimizer: Adam(W) keeps
# exp_avg and exp_avg_sq; its SGD has no momentum buffer).
OPTIMIZER_STATES = {"adamw": 2, "adam": 2, "sgd": 0}
# Saved activations of one UNet forward with graph, in values per sample per latent pixel per
# base channel (block_out_channels[0]). Measured by summing the tensors autograd saves in SD 1.5's
# UNet (64x64 latents, 77 tokens) with memory-efficient attention (q, k, v, out saved; no
# attention matrix): 405 at 32-128 px latents, i.e. ~2 GiB fp32 at 512 px, batch 1.
ACTIVATION_VALUES = 405
# With gradient checkpointing the same count gave 60 (block inputs only); backward recomputes one
# block at a time on top, so 0.25 is the stated rule.
CHECKPOINTING_FACTOR = 0.25
# UNet graphs alive at the peak: the critic step backpropagates through the fake score on student
# samples and on noised real latents; the student step through the student and the fake score (GAN).
GRAPHS_AT_PEAK = 2
CONTEXT_GIB, FRAGMENTATION = 0.5, 0.10


def _trainable_unet(name: str, mode: str, info: "TeacherInfo", rank: int, optimizer: str) -> LedgerLine:
    n = info.param_counts["unet"]
    per_trainable = 4 * (2 + OPTIMIZER_STATES[optimizer])  # fp32 master + grad + states
    states = f"{OPTIMIZER_STATES[optimizer]} {optimizer} states"
    if mode == "full":
        return LedgerLine(f"{name} (full)", n * per_trainable / GIB,
                          f"{n / 1e6:.0f} M params fp32 + grads + {states}")
    adapter = rank * info.unet_lora_params_per_rank
    return LedgerLine(f"{name} (LoRA r={rank})", (n * 4 + adapter * per_trainable) / GIB,
                      f"frozen fp32 copy of the UNet + {adapter / 1e6:.2f} M adapter params on to_q/k/v/out "
                      f"(rank x (in + out)), fp32 + grads + {states}")


def _gan_head_params(bottleneck_channels: int) -> int:
    import torch

    from dmad.methods.dmd2 import GanHead

    with torch.device("meta"):
        return sum(p.numel() for p in GanHead(bottleneck_channels).parameters())


def estimate_ledger(info: "TeacherInfo", *, student: str, fake_score: str, lora_rank: int, mixed_precision: str,
                    gradient_checkpointing: bool, train_batch_size: int, resolution: int,
                    optimizer: str) -> list[LedgerLine]:
    """Framework-scope estimate of the training peak on one device, line by line with the
    assumption behind each: a rule of thumb for planning, not a measurement (`dmad probe`
    measures). Shapes come from the configs alone (inspect_teacher), so no weights are needed."""
    wb, dt = BYTES[mixed_precision], DTYPE_NAME[mixed_precision]
    unet, frozen = info.param_counts["unet"], info.param_counts["vae"] + info.param_counts["text_encoder"]
    head = _gan_head_params(info.bottleneck_channels)
    latent = resolution // info.vae_scale_factor
    base = info.unet_block_out_channels[0]
    act = (ACTIVATION_VALUES * GRAPHS_AT_PEAK * train_batch_size * latent * latent * base * wb
           * (CHECKPOINTING_FACTOR if gradient_checkpointing else 1.0))
    lines = [
        LedgerLine("teacher UNet (frozen)", unet * wb / GIB, f"{unet / 1e6:.0f} M params in {dt}, no grads"),
        _trainable_unet("student", student, info, lora_rank, optimizer),
        _trainable_unet("fake score", fake_score, info, lora_rank, optimizer),
        LedgerLine("GAN head", head * 4 * (2 + OPTIMIZER_STATES[optimizer]) / GIB,
                   f"{head / 1e6:.1f} M params on {info.bottleneck_channels}-channel bottleneck features, "
                   f"fp32 + grads + optimizer states"),
        LedgerLine("VAE + text encoder (frozen)", frozen * wb / GIB, f"{frozen / 1e6:.0f} M params in {dt}"),
        LedgerLine("activations", act / GIB,
                   f"{ACTIVATION_VALUES} values x batch {train_batch_size} x {latent}x{latent} latent px x "
                   f"{base} base channels x {GRAPHS_AT_PEAK} UNet graphs, {dt}"
                   + (f", x{CHECKPOINTING_FACTOR} for gradient checkpointing" if gradient_checkpointing else "")
                   + "; memory-efficient attention assumed"),
    ]
    subtotal = sum(line.gib for line in lines)
    lines.append(LedgerLine("margin", CONTEXT_GIB + FRAGMENTATION * subtotal,
                            f"CUDA context {CONTEXT_GIB} GiB + {FRAGMENTATION:.0%} allocator fragmentation"))
    return lines


def format_ledger(lines: list[LedgerLine]) -> str:
    """A plain-text table: name, GiB, assumption; then the total."""
    width = max([len(line.name) for line in lines] + [len("total")])
    rows = [f"{'':<{width}}  {'GiB':>7}  assumption"]
    rows += [f"{line.name:<{width}}  {line.gib:>7.2f}  {line.assumption}" for line in lines]
    rows.append(f"{'total':<{width}}  {sum(line.gib for line in lines):>7.2f}")
    return "\n".join(rows)


def config_ledger(cfg: Any, info: "Optional[TeacherInfo]" = None) -> list[LedgerLine]:
    """The ledger of a run config (dmad.config.TrainConfig); the teacher is inspected (configs and
    file headers only) unless `info` is given."""
    if info is None:
        from dmad.models.teacher import inspect_teacher

        ident = cfg.identity
        info = inspect_teacher(ident.pretrained_model_name_or_path, ident.model_family, ident.teacher_config_dir)
    r, ident = cfg.resources, cfg.identity
    return estimate_ledger(info, student=ident.student, fake_score=ident.fake_score, lora_rank=ident.lora_rank,
                           mixed_precision=r.mixed_precision, gradient_checkpointing=r.gradient_checkpointing,
                           train_batch_size=r.train_batch_size, resolution=r.resolution,
                           optimizer=cfg.optimization.optimizer)


def ledger_json(cfg: Any, lines: list[LedgerLine]) -> dict:
    """`dmad ledger --json` (docs/memory.md)."""
    r, ident = cfg.resources, cfg.identity
    return {"scope": "framework peak per device (estimate)",
            "lines": [{"name": x.name, "gib": round(x.gib, 4), "assumption": x.assumption} for x in lines],
            "total_gib": round(sum(x.gib for x in lines), 4),
            "inputs": {"train_batch_size": r.train_batch_size, "resolution": r.resolution,
                       "mixed_precision": r.mixed_precision, "gradient_checkpointing": r.gradient_checkpointing,
                       "student": ident.student, "fake_score": ident.fake_score, "lora_rank": ident.lora_rank,
                       "optimizer": cfg.optimization.optimizer}}
