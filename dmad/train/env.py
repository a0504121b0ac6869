"""env.json: what machine and libraries a run used, so an image can be reproduced a year later."""
from __future__ import annotations

import os
import platform
import sys
from importlib import metadata
from pathlib import Path


def _version(pkg: str) -> str | None:
    try:
        return metadata.version(pkg)
    except metadata.PackageNotFoundError:
        return None


def _gpus() -> list[dict]:
    """Device facts from torch and NVML (driver version); empty on a machine without CUDA."""
    import torch

    if not torch.cuda.is_available():
        return []
    driver = None
    try:
        import pynvml

        pynvml.nvmlInit()
        driver = pynvml.nvmlSystemGetDriverVersion()
        if isinstance(driver, bytes):
            driver = driver.decode()
    except Exception:  # NVML missing or unusable: the driver version is simply unknown
        pass
    out = []
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        out.append({"index": i, "name": p.name, "total_memory_gb": round(p.total_memory / 2**30, 2),
                    "capability": f"{p.major}.{p.minor}", "driver": driver})
    return out


def cpu_name() -> str:
    """The CPU model ("AMD EPYC 7B13"), from /proc/cpuinfo where there is one."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def collect_env() -> dict:
    import torch

    return {
        "os": platform.platform(),
        "python": sys.version.split()[0],
        "cpu": cpu_name(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.cuda.is_available() else None,
        "gpus": _gpus(),
        "packages": {p: _version(p) for p in ("dmad-studio", "torch", "diffusers", "accelerate", "transformers",
                                               "peft", "safetensors", "numpy", "pillow")},
    }
