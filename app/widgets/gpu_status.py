"""GPU name, memory used / total and utilisation in the status bar, from NVML.

NVML (pynvml, from nvidia-ml-py) is initialised and queried in a worker thread every 2 s: an
nvmlInit on a machine with a wedged driver can take seconds. When NVML is missing or finds no
GPU, the failure is remembered and nothing more is done: no label, no timer, no retries.
The numbers are device-wide (every process on the GPU), as nvidia-smi shows them.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Callable, Optional

from PySide6.QtCore import QThreadPool, QTimer, Signal
from PySide6.QtWidgets import QLabel, QWidget

from app.engine.background import Task
from app.widgets.elided_label import ElidedLabel

GIB = 1024 ** 3
POLL_MS = 2000


@dataclass(frozen=True)
class GpuReading:
    index: int
    name: str
    used_gb: float   # device-wide, GiB
    total_gb: float  # GiB
    util_percent: Optional[int]  # None when the driver does not report it (some MIG setups)

    def text(self) -> str:
        util = f"  {self.util_percent}%" if self.util_percent is not None else ""
        return f"GPU{self.index} {self.name}  {self.used_gb:.1f} / {self.total_gb:.1f} GB{util}"


def import_pynvml() -> ModuleType:
    """NVML's Python module, as the window and NvmlProbe load it (`load_nvml`: tests give a stand-in)."""
    import pynvml  # nvidia-ml-py; imported lazily: the import itself loads no driver

    return pynvml


class NvmlProbe:
    """Thread-confined NVML access. `read()` returns readings, or None forever once init failed."""

    def __init__(self, load_nvml: Callable[[], Any] = import_pynvml):
        self._load = load_nvml
        self._nvml: Any = None
        self._handles: list = []
        self._names: list[str] = []
        self.failed: Optional[str] = None  # why NVML is unavailable; cached, never retried
        self._lock = threading.Lock()  # one query at a time even if ticks overlap

    def read(self) -> Optional[list[GpuReading]]:
        with self._lock:
            if self.failed is not None:
                return None
            if self._nvml is None and not self._init():
                return None
            try:
                return [self._reading(i) for i in range(len(self._handles))]
            except Exception as e:  # a GPU fell off the bus: stop asking, show nothing
                self.failed = f"NVML query failed: {e}"
                return None

    def _init(self) -> bool:
        try:
            nvml = self._load()
            nvml.nvmlInit()
            count = nvml.nvmlDeviceGetCount()
            self._handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
            self._names = [_text(nvml.nvmlDeviceGetName(h)) for h in self._handles]
        except Exception as e:  # no module, no driver, no permission: all mean "no GPU shown"
            self.failed = f"NVML unavailable: {e}"
            return False
        if not self._handles:
            self.failed = "NVML found no GPU"
            return False
        self._nvml = nvml
        return True

    def _reading(self, i: int) -> GpuReading:
        nvml, h = self._nvml, self._handles[i]
        mem = nvml.nvmlDeviceGetMemoryInfo(h)  # bytes
        try:
            util: Optional[int] = int(nvml.nvmlDeviceGetUtilizationRates(h).gpu)
        except Exception:
            util = None
        return GpuReading(i, self._names[i], mem.used / GIB, mem.total / GIB, util)


def _text(name: Any) -> str:
    return name.decode("utf-8", "replace") if isinstance(name, bytes) else str(name)


class GpuStatusLabel(ElidedLabel):
    """A status-bar label; hidden until NVML answers with at least one GPU. Elided: eight GPUs'
    readings are wider than a 1,280 px window, and a status bar never shrinks below its widgets."""

    readings_received = Signal(list)

    def __init__(self, load_nvml: Callable[[], Any] = import_pynvml, interval_ms: int = POLL_MS,
                 parent: Optional[QWidget] = None):
        super().__init__("", parent)
        self.probe = NvmlProbe(load_nvml)
        self._pool = QThreadPool(self)
        self._pool.setMaxThreadCount(1)  # NVML calls never pile up
        self._poll = Task(self, self._pool)
        self._poll.done.connect(self._on_polled)
        self._poll.failed.connect(lambda _message: self._on_polled(None))  # NvmlProbe.read raised: as no GPU
        self._timer = QTimer(self)
        self._timer.setInterval(interval_ms)
        self._timer.timeout.connect(self.poll)
        self.hide()

    def setText(self, text: str) -> None:  # noqa: N802 - Qt's name
        # Readings are one line already, and their runs of spaces separate the figures: kept as they
        # are (ElidedLabel.setText folds whitespace); still elided to the width the status bar gives
        QLabel.setText(self, text)
        self.update()

    def start(self) -> None:
        self.poll()
        self._timer.start()

    def stop(self) -> None:
        self._timer.stop()

    def poll(self) -> None:
        if self._poll.busy() or self.probe.failed is not None:
            return
        self._poll.submit(self.probe.read)

    def _on_polled(self, readings: Optional[list[GpuReading]]) -> None:
        if not readings:
            self._timer.stop()  # failure is cached in the probe: no more ticks
            self.hide()
            return
        self.setText("   ".join(r.text() for r in readings))
        self.setToolTip("\n".join(r.text() for r in readings)
                        + "\n\nDevice-wide memory (all processes, NVML) and utilisation, every 2 s")
        self.show()
        self.readings_received.emit(readings)

    def wait_idle(self, msecs: int = -1) -> bool:
        """For shutdown and tests: wait for a query in flight to finish."""
        return self._pool.waitForDone(msecs)
