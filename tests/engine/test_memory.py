"""Memory readings (scoped, never raising) and the ledger's arithmetic, on CPU."""
from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from dmad import memory
from dmad.memory import LedgerLine, estimate_ledger, format_ledger

REPO = Path(__file__).resolve().parents[2]
BASE = dict(student="full", fake_score="full", lora_rank=64, mixed_precision="bf16", gradient_checkpointing=False,
            train_batch_size=1, resolution=512, optimizer="adamw")


@pytest.fixture(scope="module")
def tiny_info(tmp_path_factory):
    from dmad.models.teacher import inspect_teacher
    from dmad.tiny import make_tiny_sd_pipeline

    path = tmp_path_factory.mktemp("ledger") / "tiny"
    make_tiny_sd_pipeline(path)
    return inspect_teacher(str(path))


@pytest.fixture(scope="module")
def sd15_info(tiny_info):
    """SD 1.5's sizes (860 M UNet, 84 M VAE, 123 M CLIP ViT-L; LoRA per rank counted on its config)."""
    return replace(tiny_info, param_counts={"unet": 859_520_964, "vae": 83_653_863, "text_encoder": 123_060_480},
                   sample_size=64, vae_scale_factor=8, unet_block_out_channels=(320, 640, 1280, 1280),
                   bottleneck_channels=1280, text_hidden_size=768, unet_lora_params_per_rank=199_296)


def ledger(info, **changes) -> dict[str, float]:
    return {line.name: line.gib for line in estimate_ledger(info, **{**BASE, **changes})}


def total(info, **changes) -> float:
    return sum(ledger(info, **changes).values())


def test_lines_positive_and_named(tiny_info):
    lines = estimate_ledger(tiny_info, **BASE)
    assert all(isinstance(line, LedgerLine) and line.gib > 0 and line.assumption for line in lines)
    assert [line.name for line in lines] == [
        "teacher UNet (frozen)", "student (full)", "fake score (full)", "GAN head", "VAE + text encoder (frozen)",
        "activations", "margin"]


def test_total_grows_with_batch_and_resolution(sd15_info):
    assert total(sd15_info, train_batch_size=1) < total(sd15_info, train_batch_size=4)
    assert total(sd15_info, resolution=512) < total(sd15_info, resolution=768)
    acts = [ledger(sd15_info, train_batch_size=b)["activations"] for b in (1, 2)]
    assert acts[1] == pytest.approx(2 * acts[0])


def test_gradient_checkpointing_reduces_activations_only(sd15_info):
    off, on = ledger(sd15_info), ledger(sd15_info, gradient_checkpointing=True)
    assert on["activations"] < off["activations"]
    assert on["student (full)"] == off["student (full)"]


def test_lora_below_full(sd15_info):
    full, lora = ledger(sd15_info), ledger(sd15_info, student="lora", fake_score="lora")
    assert lora["student (LoRA r=64)"] < full["student (full)"]
    assert lora["fake score (LoRA r=64)"] < full["fake score (full)"]
    assert total(sd15_info, student="lora", fake_score="lora") < total(sd15_info)
    assert ledger(sd15_info, student="lora", lora_rank=4)["student (LoRA r=4)"] < lora["student (LoRA r=64)"]


def test_trainable_bytes_per_parameter(sd15_info):
    """fp32 master weight + grad + optimizer states: 16 bytes with Adam(W), 8 with plain SGD."""
    n = sd15_info.param_counts["unet"]
    assert ledger(sd15_info)["student (full)"] == pytest.approx(n * 16 / 2 ** 30)
    assert ledger(sd15_info, optimizer="sgd")["student (full)"] == pytest.approx(n * 8 / 2 ** 30)
    assert ledger(sd15_info, mixed_precision="no")["teacher UNet (frozen)"] == pytest.approx(n * 4 / 2 ** 30)
    assert ledger(sd15_info, mixed_precision="fp16")["teacher UNet (frozen)"] == pytest.approx(n * 2 / 2 ** 30)


def test_format_ledger_has_total(tiny_info):
    lines = estimate_ledger(tiny_info, **BASE)
    text = format_ledger(lines)
    assert all(line.name in text for line in lines)
    last = text.splitlines()[-1].split()
    assert last[0] == "total" and float(last[1]) == pytest.approx(sum(line.gib for line in lines), abs=0.006)


def test_readings_on_cpu_do_not_raise():
    assert memory.framework_peak_gb("cpu") is None
    memory.reset_framework_peak("cpu")
    assert memory.device_used_gb("cpu") == (None, None)
    used, total_gb = memory.device_used_gb("cuda:0")  # no GPU or no NVML here: None, never an exception
    assert all(v is None or isinstance(v, float) for v in (used, total_gb))
    rss, peak = memory.process_rss_gb(), memory.process_peak_rss_gb()
    assert isinstance(rss, float) and isinstance(peak, float) and 0 < rss <= peak * 1.01


def test_readings_name_their_scope():
    for fn in (memory.framework_peak_gb, memory.reset_framework_peak, memory.device_used_gb,
               memory.process_rss_gb, memory.process_peak_rss_gb):
        assert any(s in fn.__doc__ for s in ("Framework scope", "Device-wide scope", "Process scope")), fn.__name__


def test_import_is_light():
    code = "import sys, dmad.memory; print(sorted(m for m in ('torch', 'psutil', 'pynvml') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
