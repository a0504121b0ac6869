"""A background thread that keeps status.json's heartbeat fresh and samples device-wide memory
into gpu_mem.csv (every observation.gpu_mem_interval_s, default 5 s), so a long step (or model
loading) never makes a live run look dead, and memory is recorded even between log rows. Each
sample is also handed to `on_sample` (training emits it as a `metric` event with
source "sampler").

Scope: with a GPU the samples are NVML device-wide figures (all processes, CUDA context
included) and the GPU utilisation; on a CPU machine they are this process's RSS (no total, no
utilisation). The `scope` column says which.
"""
from __future__ import annotations

import threading
import time
from typing import Callable, Optional

from dmad.contract.runs import CsvAppender, RunFolder

GPU_MEM_COLUMNS = ["t", "scope", "mem_used_gb", "mem_total_gb", "utilization_pct"]


def device_reading(device) -> tuple[str, Optional[float], Optional[float], Optional[float]]:
    """(scope, used GiB, total GiB, utilisation %): NVML for a CUDA device, else process RSS
    (total and utilisation unknown)."""
    from dmad.memory import readings as memory
    if getattr(device, "type", str(device)) == "cuda":
        used, total = memory.device_used_gb(device)
        return "device_nvml", used, total, memory.device_utilization_pct(device)
    return "process_rss", memory.process_rss_gb(), None, None


def _appender(path) -> CsvAppender:
    """gpu_mem.csv; a run started by an older engine (fewer columns) keeps its own header."""
    return CsvAppender.continued(path, GPU_MEM_COLUMNS)


class Monitor:
    """Started before the models load (loading a large teacher can take minutes); memory
    sampling begins once `device` is set."""

    def __init__(self, folder: RunFolder, device: Optional[object], interval_s: float, heartbeat_s: float = 2.0,
                 on_sample: Optional[Callable[[dict], None]] = None):
        self.folder, self.device = folder, device
        self.interval_s, self.heartbeat_s = interval_s, heartbeat_s
        self.on_sample = on_sample
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="dmad-monitor", daemon=True)
        self._csv = _appender(folder.gpu_mem_csv)

    def start(self) -> "Monitor":
        self._thread.start()
        return self

    def sample(self) -> dict:
        scope, used, total, util = device_reading(self.device)
        row = {"t": round(time.time(), 3), "scope": scope, "mem_used_gb": used, "mem_total_gb": total,
               "utilization_pct": util}
        self._csv.append({k: v for k, v in row.items() if k in self._csv.columns})
        return row

    def _run(self) -> None:
        next_sample = 0.0
        while not self._stop.wait(min(self.heartbeat_s, self.interval_s)):
            now = time.time()
            try:
                self.folder.heartbeat()  # RunFolder locks status.json against the loop's writes
                if self.device is not None and now >= next_sample:  # device known once loading picked it
                    row = self.sample()
                    next_sample = now + self.interval_s
                    if self.on_sample is not None:
                        self.on_sample(row)
            except OSError:
                pass  # a full disk or a removed folder must not kill training; the loop will notice

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        self._csv.close()
