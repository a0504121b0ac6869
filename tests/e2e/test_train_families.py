"""`dmad train` on tiny random SDXL, SD3 and Flux pipelines, through the real CLI: distillation
steps run, checkpoints save and resume exactly, samples render (and `dmad sample` re-renders them
pixel for pixel), and the memory options (teacher precision, CPU offload, LoRA fake score,
gradient checkpointing) run in each family."""
from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest

from tests.conftest import dmad_in_process, run_dmad

torch = pytest.importorskip("torch")

from dmad.contract.events import read_events  # noqa: E402
from dmad.contract.runlog import read_health  # noqa: E402
from dmad.testing.tiny import make_tiny_flux_pipeline, make_tiny_sd3_pipeline, make_tiny_sdxl_pipeline  # noqa: E402

FAMILIES = {
    "sdxl": lambda p: make_tiny_sdxl_pipeline(p),
    "sd3": lambda p: make_tiny_sd3_pipeline(p),
    "sd3_t5": lambda p: make_tiny_sd3_pipeline(p, with_t5=True),
    "flux": lambda p: make_tiny_flux_pipeline(p),
    "flux_cfg": lambda p: make_tiny_flux_pipeline(p, guidance_embeds=False),
}


@pytest.fixture(scope="module")
def family_teachers(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("family_teachers")
    for name, build in FAMILIES.items():
        build(root / name)
    return {name: root / name for name in FAMILIES}


def _config(tmp: Path, teacher: Path, data: Path, prompts: Path, name: str, extra: dict) -> Path:
    cfg = {"config_version": 1,
           "identity": {"pretrained_model_name_or_path": str(teacher), "train_data_dir": str(data),
                        "output_dir": str(tmp / "runs"), "run_name": name},
           "resources": {"resolution": 32, "train_batch_size": 2},
           "optimization": {"max_train_steps": 4},
           "distillation": {"student_steps": 2},
           "observation": {"prompt_set": str(prompts), "checkpointing_steps": 2, "validation_steps": 2}}
    for group, fields in extra.items():
        cfg[group].update(fields)
    path = tmp / f"{name}.json"
    path.write_text(json.dumps(cfg), encoding="utf-8")
    return path


def _rows(run: Path) -> list[dict]:
    with open(run / "metrics.csv", newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def _finite_losses(rows: list[dict]) -> None:
    for r in rows:
        for k in ("loss_fake", "loss_d_gan", "loss_c"):
            assert math.isfinite(float(r[k])), (k, r)
    dm = [float(r["loss_dm"]) for r in rows if r["loss_dm"]]
    assert dm and all(math.isfinite(v) for v in dm)


def _pngs(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.glob("*.png"))}


@pytest.mark.slow
@pytest.mark.parametrize("family", ["sdxl", "sd3", "flux"])
def test_family_trains_checkpoints_samples_and_resumes(family, family_teachers, tiny_data, health_prompt_set, tmp_path):
    cfg = _config(tmp_path, family_teachers[family], tiny_data, health_prompt_set, family, {})
    assert dmad_in_process("train", "--config", str(cfg)) == 0
    run = tmp_path / "runs" / family
    rows = _rows(run)
    assert [int(x["iter"]) for x in rows] == [1, 2, 3, 4]
    _finite_losses(rows)
    assert sorted(p.name for p in (run / "checkpoints").glob("iter_*")) == ["iter_2", "iter_4"]
    teacher_meta = json.loads((run / "samples" / "teacher" / "meta.json").read_text())
    flow = family != "sdxl"
    assert teacher_meta["sampler"] == ("flow_match_euler" if flow else "ddim")
    assert set(_pngs(run / "samples" / "teacher")) == {"red.png", "blue.png", "red~s1.png", "blue~s1.png"}
    health = [e for e in read_events(run / "events.jsonl") if e.kind == "health"]  # the family's health signals
    assert [(e.iter, e.data["checkpoint"]) for e in health] == [(2, "iter_2"), (4, "iter_4")]
    assert {"diversity", "teacher_distance"} <= set(health[-1].data["signals"])
    student_meta = json.loads((run / "samples" / "iter_4" / "meta.json").read_text())
    assert student_meta["timesteps"] == [999, 499]
    log = (run / "logs" / "engine.log").read_text()
    assert f"({family}, {'flow' if flow else 'epsilon'})" in log
    for png in _pngs(run / "samples" / "iter_4").values():  # decoded images, not a constant
        from io import BytesIO

        import numpy as np
        from PIL import Image

        assert np.asarray(Image.open(BytesIO(png))).std() > 1

    # resume to 6: every iteration exactly once, the checkpoint's state carried over
    cfg6 = _config(tmp_path, family_teachers[family], tiny_data, health_prompt_set, family,
                   {"optimization": {"max_train_steps": 6}})
    assert dmad_in_process("train", "--config", str(cfg6), "--resume", "latest") == 0
    rows = _rows(run)
    assert [int(x["iter"]) for x in rows] == [1, 2, 3, 4, 5, 6]
    _finite_losses(rows)
    assert any(e.kind == "phase" and e.data.get("phase") == "restored" for e in read_events(run / "events.jsonl"))
    assert [r["iter"] for r in read_health(run / "health.csv")] == [2, 4, 6]

    # `dmad sample` re-renders the checkpoint's images exactly (same weights, noise, sampler)
    assert dmad_in_process("sample", "--run", str(run), "--checkpoint", "6", "--out", str(tmp_path / "again")) == 0
    assert _pngs(tmp_path / "again" / "iter_6") == _pngs(run / "samples" / "iter_6")
    # torch's deterministic switch is process-wide: the command sets it for itself only
    assert not torch.are_deterministic_algorithms_enabled()


VARIANTS = {
    # LoRA student and fake score on the joint-attention projections, weight-only int8 teacher,
    # gradient checkpointing, GAN head on the frozen (quantised) teacher's tokens
    "sd3_lora_int8": ("sd3", {"identity": {"student": "lora", "fake_score": "lora", "lora_rank": 4},
                              "resources": {"teacher_precision": "int8", "gradient_checkpointing": True},
                              "distillation": {"gan_head_placement": "teacher_bottleneck", "student_steps": 1}}),
    # T5 present; bf16 autocast with an fp8 teacher; latent + text caches (pooled embeddings cached too)
    "sd3_t5_fp8_cache": ("sd3_t5", {"resources": {"teacher_precision": "fp8", "mixed_precision": "bf16",
                                                   "cache_latents": True}}),
    # Flux without a guidance embedding: true CFG on the empty prompt; LoRA fake score; bf16 teacher
    "flux_cfg_lora_fake": ("flux_cfg", {"identity": {"fake_score": "lora", "lora_rank": 4},
                                        "resources": {"teacher_precision": "bf16"}}),
    # SDXL under bf16 with CPU offload asked for (a no-op on a CPU device) and the VAE kept float32
    "sdxl_bf16_offload": ("sdxl", {"resources": {"mixed_precision": "bf16", "teacher_cpu_offload": True}}),
}


@pytest.mark.slow
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_memory_options_run_in_each_family(variant, family_teachers, tiny_data, tiny_prompt_set, tmp_path):
    family, extra = VARIANTS[variant]
    extra = {g: dict(v) for g, v in extra.items()}
    extra.setdefault("optimization", {})["max_train_steps"] = 2
    extra.setdefault("observation", {}).update(checkpointing_steps=2, validation_steps=2)
    cfg = _config(tmp_path, family_teachers[family], tiny_data, tiny_prompt_set, variant, extra)
    assert dmad_in_process("train", "--config", str(cfg)) == 0  # in this process: a CLI start is ~7 s of imports
    run = tmp_path / "runs" / variant
    _finite_losses(_rows(run))
    assert (run / "checkpoints" / "iter_2").is_dir() and _pngs(run / "samples" / "iter_2")
    log = (run / "logs" / "engine.log").read_text()
    precision = extra["resources"].get("teacher_precision")
    if precision in ("int8", "fp8"):
        assert f"denoiser {precision} (" in log and "M linear weights, the rest bf16)" in log
    elif precision == "bf16":
        assert "denoiser bfloat16" in log
    if family == "sdxl":
        assert "VAE float32" in log  # SDXL's VAE is never cast down
    if extra["resources"].get("cache_latents"):
        import re

        m = re.search(r"cache: latents (\d+) read, (\d+) encoded; captions (\d+) read, (\d+) encoded", log)
        assert m and int(m[2]) > 0 and int(m[4]) > 0, log[-2000:]
    warnings = [e for e in read_events(run / "events.jsonl") if e.kind == "warning"]
    assert not warnings, [w.data for w in warnings]


@pytest.mark.slow
def test_two_processes_train_a_transformer_family(family_teachers, tiny_data, tiny_prompt_set, tmp_path):
    """accelerate's multi-process launch (gloo on a CPU): the family reaches through DDP's wrapper
    for the transformer's config and the GAN tap on the fake score."""
    cfg = _config(tmp_path, family_teachers["flux"], tiny_data, tiny_prompt_set, "flux_2p",
                  {"optimization": {"max_train_steps": 2}, "resources": {"train_batch_size": 1}})
    r = run_dmad("train", "--config", str(cfg), "--num-processes", "2", cwd=tmp_path, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    run = tmp_path / "runs" / "flux_2p"
    rows = _rows(run)
    assert [int(x["iter"]) for x in rows] == [1, 2]
    _finite_losses(rows)
    started = next(e for e in read_events(run / "events.jsonl") if e.kind == "started")
    assert started.data["num_processes"] == 2 and started.data["effective_batch"] == 2
    assert (run / "checkpoints" / "iter_2").is_dir()


@pytest.mark.slow
def test_sdxl_trains_from_a_single_file(tiny_data, tiny_prompt_set, tmp_path):
    """An SDXL teacher as one original-layout .safetensors file plus identity.teacher_config_dir."""
    import sys

    from safetensors.torch import save_file

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "engine"))
    from ldm_keys import sdxl_pipeline_to_ldm

    pipe = make_tiny_sdxl_pipeline(tmp_path / "configs", text_dim_2=48)
    f = tmp_path / "tiny_sdxl.safetensors"
    save_file({k: v.contiguous() for k, v in sdxl_pipeline_to_ldm(pipe.unet, pipe.vae, pipe.text_encoder,
                                                                   pipe.text_encoder_2).items()}, str(f))
    cfg = _config(tmp_path, f, tiny_data, tiny_prompt_set, "sdxl_file",
                  {"identity": {"teacher_config_dir": str(tmp_path / "configs")},
                   "optimization": {"max_train_steps": 2}})
    assert dmad_in_process("train", "--config", str(cfg)) == 0
    run = tmp_path / "runs" / "sdxl_file"
    _finite_losses(_rows(run))
    assert _pngs(run / "samples" / "teacher") and (run / "checkpoints" / "iter_2").is_dir()
