"""The same loop under each option a user can pick: LoRA, bf16 autocast, gradient checkpointing,
GAN head on the teacher, v-prediction teachers, 4-step students; and the independence of the
student's training inputs from real images."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.conftest import dmad_in_process

torch = pytest.importorskip("torch")

from dmad.contract.events import is_iteration_metric, read_events  # noqa: E402


def _train(cfg: Path, run: Path, *extra: str) -> None:
    """The CLI's main() in this process (a CLI start is ~7 s of imports); a run leaves no accelerate
    state behind, so the bf16 run after a full-precision one gets its own precision (checked below)."""
    assert dmad_in_process("train", "--config", str(cfg), "--run-dir", str(run), *extra) == 0


def _load(path: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(path))


VARIANTS = {
    "lora": ({"identity": {"student": "lora", "fake_score": "lora", "lora_rank": 4}}, ["student_lora.safetensors",
                                                                                      "fake_score_lora.safetensors"]),
    "bf16": ({"resources": {"mixed_precision": "bf16"}}, ["student/config.json"]),
    "gradient_checkpointing": ({"resources": {"gradient_checkpointing": True,
                                              "gradient_accumulation_steps": 2}}, ["student/config.json"]),
    "gan_on_teacher": ({"distillation": {"gan_head_placement": "teacher_bottleneck"}}, ["gan_head.safetensors"]),
    "four_steps": ({"distillation": {"student_steps": 4, "critic_updates_per_generator_update": 1}},
                   ["student/config.json"]),
}


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_variant_trains_and_checkpoints(name, write_config, tmp_path):
    extra, files = VARIANTS[name]
    extra = json.loads(json.dumps(extra))
    extra.setdefault("optimization", {})["max_train_steps"] = 3
    extra.setdefault("observation", {})["checkpointing_steps"] = 3
    run = tmp_path / "run"
    _train(write_config(extra), run)
    ckpt = run / "checkpoints" / "iter_3"
    for f in files:
        assert (ckpt / f).is_file(), f
    metrics = [e for e in read_events(run / "events.jsonl") if is_iteration_metric(e)]
    assert [e.iter for e in metrics] == [1, 2, 3]
    assert all(e.data["loss_fake"] is not None for e in metrics)
    if name == "lora":
        assert not (ckpt / "student").exists()
        state = _load(ckpt / "student_lora.safetensors")
        assert state and all("lora" in k for k in state)
    if name == "four_steps":
        assert json.loads((ckpt / "training_state.json").read_text())["student_timesteps"] == [999, 749, 499, 249]
    # each run in this process trained with its own precision: none inherited the one before it
    precision = extra.get("resources", {}).get("mixed_precision", "no")
    assert f"device cpu, {precision}\n" in (run / "logs" / "engine.log").read_text()


def test_runs_of_two_precisions_in_one_process(write_config, tmp_path):
    """A run leaves no accelerate state behind: a bf16 run after a full-precision one in the same
    process (a script calling run_training twice) trains in bf16 instead of failing with
    "AcceleratorState has already been initialized"."""
    for i, precision in enumerate(("no", "bf16", "no")):
        run = tmp_path / f"run{i}"
        _train(write_config({"resources": {"mixed_precision": precision}, "optimization": {"max_train_steps": 1}},
                            name=f"{i}.json"), run)
        assert f"device cpu, {precision}\n" in (run / "logs" / "engine.log").read_text()


def test_v_prediction_teacher_trains(tmp_path, write_config):
    from dmad.testing.tiny import make_tiny_sd_pipeline

    teacher = tmp_path / "v_teacher"
    make_tiny_sd_pipeline(teacher, prediction_type="v_prediction")
    run = tmp_path / "run"
    _train(write_config({"identity": {"pretrained_model_name_or_path": str(teacher)}}), run)
    assert "v_prediction" in (run / "logs" / "engine.log").read_text()
    state = json.loads((run / "checkpoints" / "iter_2" / "training_state.json").read_text())
    assert state["prediction_type"] == "v_prediction"


@pytest.mark.slow
def test_lora_resume_continues_exactly(write_config, tmp_path):
    base = {"identity": {"student": "lora", "fake_score": "lora", "lora_rank": 4},
            "distillation": {"critic_updates_per_generator_update": 2, "ema_decay": 0.8},
            "observation": {"checkpointing_steps": 2}}
    straight = tmp_path / "straight"
    _train(write_config({**base, "optimization": {"max_train_steps": 4}}, name="a.json"), straight)
    split = tmp_path / "split"
    _train(write_config({**base, "optimization": {"max_train_steps": 2}}, name="b.json"), split)
    _train(write_config({**base, "optimization": {"max_train_steps": 4}}, name="c.json"), split,
           "--resume", "latest")
    for f in ("student_lora.safetensors", "fake_score_lora.safetensors", "gan_head.safetensors", "ema.safetensors"):
        a, b = _load(straight / "checkpoints/iter_4" / f), _load(split / "checkpoints/iter_4" / f)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), f
    warnings = [e for e in read_events(split / "events.jsonl") if e.kind == "warning"]
    assert any("max_train_steps 2 -> 4" in e.data["message"] for e in warnings)


def _seed_with_rollout(steps: int) -> int:
    """A seed whose first iteration trains a later student step (so backward simulation runs)."""
    from dmad.methods.dmd2 import sample_stop_index
    from dmad.methods.noise import iteration_generator

    return next(s for s in range(100) if sample_stop_index(steps, iteration_generator(s, 0)) >= 2)


def test_student_inputs_never_depend_on_real_images(write_config, tmp_path, tiny_data):
    """The first student update happens before the critic has seen any real image, so with the
    same captions it must be bit-identical whatever the images are; a multi-step student's
    training input comes from its own rollout. The critic, which does see images, must differ."""
    from PIL import Image

    noise_data = tmp_path / "noise_images"
    shutil.copytree(tiny_data, noise_data)
    rng = torch.Generator().manual_seed(1)
    for png in noise_data.glob("*.png"):
        arr = (torch.rand((32, 32, 3), generator=rng) * 255).to(torch.uint8).numpy()
        Image.fromarray(arr).save(png)
    steps = 4
    extra = {"resources": {"seed": _seed_with_rollout(steps), "train_batch_size": 2},
             "optimization": {"max_train_steps": 1}, "distillation": {"student_steps": steps},
             "observation": {"checkpointing_steps": 1}}
    a, b = tmp_path / "real", tmp_path / "noise"
    _train(write_config(extra, name="a.json"), a)
    extra["identity"] = {"train_data_dir": str(noise_data)}
    _train(write_config(extra, name="b.json"), b)
    sa = _load(a / "checkpoints/iter_1/student/diffusion_pytorch_model.safetensors")
    sb = _load(b / "checkpoints/iter_1/student/diffusion_pytorch_model.safetensors")
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    fa = _load(a / "checkpoints/iter_1/fake_score/diffusion_pytorch_model.safetensors")
    fb = _load(b / "checkpoints/iter_1/fake_score/diffusion_pytorch_model.safetensors")
    assert any(not torch.equal(fa[k], fb[k]) for k in fa)
