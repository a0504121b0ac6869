"""The SDXL, SD3 and Flux presets of the Config panel (resources/configs/presets) against the engine's
memory ledger: each preset's config, with its placeholder teacher replaced by a configs-only folder
of the published model (tests/engine/real_configs.py), must fit the GPU memory its name promises,
and the figures its description quotes (GPU peak; CPU RAM with teacher_cpu_offload) must be what
the ledger computes now, with 10% of that memory left free. A LoRA/LoRA preset shares one frozen
base (resources.share_frozen_base) and quotes the same run with separate frozen copies. A change to
the ledger or to a preset that moves a figure fails here, so the descriptions the app shows cannot go
stale.

The SD 1.5 presets are sized for SD v1.5 (512 px), the others for the families' 1024 px models.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from dmad.contract.config import load_config
from dmad.contract.jsonfile import read_json_file
from dmad.memory.ledger import config_ledger, ledger_total
from dmad.models.teacher import inspect_teacher
from dmad.contract.paths import resource
from tests.engine.real_configs import write_real_config_folder

INDEX = resource("configs", "presets", "index.json")
# model_family -> the real-config model the family's presets are sized for
REAL_MODEL = {"sd1": "sd-v1-5", "sdxl": "sdxl-base-1.0", "sd3": "sd3-medium", "flux": "flux-dev"}
PLACEHOLDER = {"sd1": "path/to/stable-diffusion-v1-5", "sdxl": "path/to/stable-diffusion-xl-base-1.0", "sd3": "path/to/stable-diffusion-3-medium-diffusers",
               "flux": "path/to/FLUX.1-dev"}
GPU_GB = re.compile(r" \u2014 (\d+) GB")
QUOTED_GPU = re.compile(r"ledger estimate (\d+\.\d) GiB")
QUOTED_CPU = re.compile(r"(\d+\.\d) GiB of CPU RAM")
QUOTED_SEPARATE = re.compile(r"[Ss]eparate frozen copies[^0-9]*(\d+\.\d) GiB")
# a preset leaves this share of the memory its name promises unused by the estimate (the display, other
# processes, and the ledger being a rule of thumb, not a measurement)
HEADROOM = 0.9


def family_presets() -> list[dict]:
    """The index entries whose config names a family with a real-config folder."""
    entries = read_json_file(INDEX, "preset index")["presets"]
    return [e for e in entries
            if load_config(INDEX.parent / e["file"]).identity.model_family in REAL_MODEL]


@pytest.fixture(scope="module")
def infos(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("real")
    return {family: inspect_teacher(str(write_real_config_folder(root / model, model)), family)
            for family, model in REAL_MODEL.items()}


def test_every_family_has_presets():
    families = {load_config(INDEX.parent / e["file"]).identity.model_family for e in family_presets()}
    assert families == set(REAL_MODEL)


@pytest.mark.parametrize("entry", family_presets(), ids=lambda e: e["file"])
def test_preset_fits_its_gpu_and_quotes_the_ledger(entry, infos):
    cfg = load_config(INDEX.parent / entry["file"])
    family = cfg.identity.model_family
    lines = config_ledger(cfg, infos[family], device="cuda")  # a GPU preset: its GPU's figures
    total = ledger_total(lines)
    cpu = sum(line.gib for line in lines if line.scope == "cpu")

    gb = GPU_GB.search(entry["name"])
    assert gb, f"{entry['name']!r} names no GPU memory (' \u2014 N GB')"
    assert total <= HEADROOM * float(gb.group(1)), \
        f"{entry['file']}: ledger {total:.2f} GiB leaves under {1 - HEADROOM:.0%} of {gb.group(1)} GB free"

    quoted = QUOTED_GPU.findall(entry["description"])
    assert len(quoted) == 1, f"{entry['file']}: the description must quote the ledger estimate once"
    assert quoted[0] == f"{total:.1f}", f"{entry['file']}: quotes {quoted[0]} GiB, ledger says {total:.2f}"

    quoted_cpu = QUOTED_CPU.findall(entry["description"])
    if cfg.resources.teacher_cpu_offload:
        assert quoted_cpu == [f"{cpu:.1f}"], \
            f"{entry['file']}: CPU RAM quoted {quoted_cpu}, ledger says {cpu:.2f} GiB"
    else:
        assert cpu == 0 and not quoted_cpu

    assert lines.family == family
    assert cfg.identity.pretrained_model_name_or_path.endswith(PLACEHOLDER[family])
    assert not Path(cfg.identity.pretrained_model_name_or_path).exists()
    assert PLACEHOLDER[family] in entry["description"]
    if family == "sd1":
        assert cfg.resources.resolution == 512
    else:
        assert cfg.resources.resolution == 1024 and cfg.resources.mixed_precision == "bf16"


@pytest.mark.parametrize("entry", family_presets(), ids=lambda e: e["file"])
def test_lora_presets_share_one_frozen_base_and_quote_the_separate_copies(entry, infos):
    """A LoRA/LoRA preset puts both adapters on the teacher's own frozen denoiser (the ledger's one
    shared line), says so, and quotes what the same run would need with separate frozen copies."""
    cfg = load_config(INDEX.parent / entry["file"])
    lines = config_ledger(cfg, infos[cfg.identity.model_family], device="cuda")
    shared = [x for x in lines if x.name.startswith("frozen base")]
    if cfg.identity.student == "lora" and cfg.identity.fake_score == "lora":
        assert cfg.resources.share_frozen_base and len(shared) == 1
        assert "share_frozen_base" in entry["description"] and "shared" in entry["name"]
        separate = config_ledger(cfg.model_copy(update={"resources": cfg.resources.model_copy(
            update={"share_frozen_base": False})}), infos[cfg.identity.model_family], device="cuda")
        assert QUOTED_SEPARATE.findall(entry["description"]) == [f"{ledger_total(separate):.1f}"], entry["file"]
        assert ledger_total(separate) > ledger_total(lines)
    else:
        assert not shared and not QUOTED_SEPARATE.findall(entry["description"])


def test_the_shared_base_presets_of_issue_20():
    """SDXL on 16 and 24 GB cards and FLUX.1-dev on a 48 GB card, LoRA/LoRA on one shared frozen base
    (Flux's stored fp8); every other model preset keeps its card size."""
    entries = {e["name"].split(" (")[0]: load_config(INDEX.parent / e["file"]) for e in family_presets()}
    for name in ("SDXL \u2014 16 GB", "SDXL \u2014 24 GB", "FLUX.1-dev \u2014 48 GB"):
        cfg = entries[name]
        assert (cfg.identity.student, cfg.identity.fake_score, cfg.resources.share_frozen_base) == ("lora", "lora", True)
    assert entries["SDXL \u2014 16 GB"].resources.gradient_checkpointing
    assert entries["FLUX.1-dev \u2014 48 GB"].resources.teacher_precision == "fp8"
    assert entries["FLUX.1-dev \u2014 48 GB"].identity.model_family == "flux"
    assert {"SD 1.5 \u2014 12 GB", "SD 1.5 \u2014 24 GB", "SD 1.5 \u2014 48 GB+", "SDXL \u2014 48 GB+",
            "SD3-medium \u2014 24 GB", "SD3-medium \u2014 48 GB+", "FLUX.1-dev \u2014 80 GB"} <= set(entries)
