"""Memory readings in three scopes, never mixed in one figure (DESIGN.md):
  framework    what torch's CUDA caching allocator handed out in this process (max_memory_allocated);
  device-wide  what NVML sees used on the whole GPU: every process, the CUDA context, allocator cache;
  process      host RAM of this process (resident set size).
All sizes are GiB (2**30 bytes); the `_gb` names follow the metrics.csv columns. Every reading
returns None when its scope does not apply (no CUDA, no NVML) and never raises: a missing reading
must not stop a run. torch, psutil and pynvml are imported inside the functions, so
`import dmad.memory.readings` stays light.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any, Optional

GIB = 2 ** 30
log = logging.getLogger(__name__)


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
        return (pynvml.nvmlDeviceGetHandleByIndex(int(entry)) if entry.isascii() and entry.isdigit()
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
