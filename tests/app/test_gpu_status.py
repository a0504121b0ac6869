"""The status-bar GPU label: what it shows from NVML, and that a machine without NVML costs nothing."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from app.widgets.gpu_status import GIB, GpuStatusLabel, NvmlProbe


class FakeNvml:
    """The few pynvml calls the label makes, with call counts."""

    def __init__(self, names=(b"NVIDIA GeForce RTX 4090",), used_gib=3.5, total_gib=24.0, util=42,
                 fail_init=False):
        self.names, self.used, self.total, self.util = list(names), used_gib, total_gib, util
        self.fail_init = fail_init
        self.inits = self.memory_queries = 0

    def nvmlInit(self):
        self.inits += 1
        if self.fail_init:
            raise RuntimeError("NVML Shared Library Not Found")

    def nvmlDeviceGetCount(self):
        return len(self.names)

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetName(self, h):
        return self.names[h]

    def nvmlDeviceGetMemoryInfo(self, h):
        self.memory_queries += 1
        return SimpleNamespace(used=int(self.used * GIB), total=int(self.total * GIB), free=0)

    def nvmlDeviceGetUtilizationRates(self, h):
        return SimpleNamespace(gpu=self.util, memory=0)


def test_probe_reads_name_memory_and_utilisation():
    fake = FakeNvml()
    readings = NvmlProbe(lambda: fake).read()
    assert len(readings) == 1
    r = readings[0]
    assert (r.name, round(r.used_gb, 2), round(r.total_gb, 2), r.util_percent) == ("NVIDIA GeForce RTX 4090", 3.5, 24.0, 42)
    assert r.text() == "GPU0 NVIDIA GeForce RTX 4090  3.5 / 24.0 GB  42%"


def test_probe_caches_an_init_failure_and_never_retries():
    fake = FakeNvml(fail_init=True)
    probe = NvmlProbe(lambda: fake)
    assert probe.read() is None and probe.read() is None and probe.read() is None
    assert fake.inits == 1
    assert "NVML Shared Library Not Found" in probe.failed


def test_probe_without_gpus_or_module_shows_nothing():
    assert NvmlProbe(lambda: FakeNvml(names=())).read() is None

    def missing():
        raise ImportError("No module named 'pynvml'")
    probe = NvmlProbe(missing)
    assert probe.read() is None and "pynvml" in probe.failed


def test_label_shows_each_gpu_from_a_fake_nvml(qtbot):
    fake = FakeNvml(names=("A100-SXM4-80GB", "A100-SXM4-80GB"), used_gib=10.0, total_gib=80.0, util=97)
    label = GpuStatusLabel(lambda: fake, interval_ms=50)
    qtbot.addWidget(label)
    assert label.isHidden()  # until NVML answers
    with qtbot.waitSignal(label.readings_received):
        label.start()
    assert not label.isHidden()
    assert label.text() == "GPU0 A100-SXM4-80GB  10.0 / 80.0 GB  97%   GPU1 A100-SXM4-80GB  10.0 / 80.0 GB  97%"
    assert label.toolTip().startswith("GPU0 A100-SXM4-80GB  10.0 / 80.0 GB  97%\nGPU1")  # one GPU a line
    fake.used = 20.0  # the timer keeps polling: the next reading shows the new figure
    qtbot.waitUntil(lambda: "20.0 / 80.0 GB" in label.text(), timeout=10_000)
    label.stop()
    label.wait_idle()


def test_label_with_failing_nvml_stays_hidden_and_stops_polling(qtbot):
    fake = FakeNvml(fail_init=True)
    label = GpuStatusLabel(lambda: fake, interval_ms=10)
    qtbot.addWidget(label)
    label.start()
    qtbot.waitUntil(lambda: label.probe.failed is not None, timeout=10_000)
    label.wait_idle()
    qtbot.waitUntil(lambda: not label._timer.isActive(), timeout=10_000)  # no tick can come: none calls NVML again
    assert fake.inits == 1 and fake.memory_queries == 0
    assert label.isHidden() and label.text() == ""


@pytest.mark.parametrize("name", [b"Tesla T4", "Tesla T4"])
def test_names_as_bytes_or_text(name):
    assert NvmlProbe(lambda: FakeNvml(names=(name,))).read()[0].name == "Tesla T4"
