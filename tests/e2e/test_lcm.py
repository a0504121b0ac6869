"""Latent consistency distillation (distillation.method lcm) through the same engine as DMAD: a tiny
teacher's run trains, checkpoints, resumes exactly, samples and exports to a pipeline that plain
diffusers loads and that reproduces the run's samples."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import _deep_update, dmad_captured, dmad_in_process, tiny_config_dict

torch = pytest.importorskip("torch")

from dmad.contract.prompts import item_seed, load_prompt_set  # noqa: E402

# generator_lr high enough that 4 iterations move the weights measurably; guidance as a real run
LCM = {"resources": {"train_batch_size": 2},
       "optimization": {"max_train_steps": 4, "generator_lr": 1e-3, "adam_beta1": 0.9, "max_grad_norm": 1.0},
       "distillation": {"method": "lcm", "student_steps": 4, "real_guidance_scale": 3.0},
       "observation": {"checkpointing_steps": 2, "log_every_steps": 1}}
VARIANTS = {"full": {}, "lora": {"identity": {"student": "lora", "lora_rank": 4, "lora_alpha": 8}}}
STUDENT_FILES = {"full": "student/diffusion_pytorch_model.safetensors", "lora": "student_lora.safetensors"}


def _train(root: Path, name: str, extra: dict, teacher: Path, data: Path, prompts: Path,
           resume: bool = False) -> Path:
    cfg = _deep_update(_deep_update(tiny_config_dict(teacher, data, prompts, root / "runs"), LCM), extra)
    path = root / f"{name}.json"
    path.write_text(json.dumps(cfg), encoding="utf-8")
    run = root / name
    args = ["train", "--config", str(path), "--run-dir", str(run)] + (["--resume", "latest"] if resume else [])
    assert dmad_in_process(*args) == 0
    return run


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def lcm_run(request, tmp_path_factory, tiny_teacher, tiny_data, tiny_prompt_set):
    root = tmp_path_factory.mktemp(f"lcm_{request.param}")
    run = _train(root, request.param, VARIANTS[request.param], tiny_teacher, tiny_data, tiny_prompt_set)
    return request.param, root, run


def test_an_lcm_run_writes_the_run_folder_with_its_own_checkpoint(lcm_run):
    variant, _, run = lcm_run
    ckpt = run / "checkpoints" / "iter_4"
    names = {p.name for p in ckpt.iterdir()}
    assert {"lcm_target.safetensors", "optimizer_generator.safetensors", "rng.safetensors",
            "training_state.json"} <= names
    assert not names & {"fake_score", "fake_score_lora.safetensors", "gan_head.safetensors",
                        "optimizer_critic.safetensors"}  # no critic in LCM
    assert (ckpt / STUDENT_FILES[variant]).is_file()
    state = json.loads((ckpt / "training_state.json").read_text())
    assert state["student_timesteps"] == [999, 759, 499, 259]  # LCMScheduler's 4 steps on the 50-step grid
    assert state["generator_steps"] == 4  # the student steps every iteration
    import csv

    rows = list(csv.DictReader((run / "metrics.csv").read_text().splitlines()))
    assert [int(r["iter"]) for r in rows] == [1, 2, 3, 4]
    assert all(float(r["loss_lcm"]) > 0 and r["loss_dm"] == "" and r["lr_critic"] == "" for r in rows)
    kinds = [json.loads(line)["kind"] for line in (run / "events.jsonl").read_text().splitlines()]
    assert kinds.count("checkpoint") == 2 and kinds[-1] == "finished"
    for it in (2, 4):
        meta = json.loads((run / "samples" / f"iter_{it}" / "meta.json").read_text())
        assert meta["checkpoint"] == f"iter_{it}" and meta["items"] and meta["method"] == "lcm"
    # the target is an EMA of the student (decay 0.95), not the student itself
    from safetensors.torch import load_file

    from dmad.models.checkpoint import load_student
    from dmad.contract.config import load_config
    from dmad.models.teacher import load_teacher

    cfg = load_config(run / "config.json")
    teacher = load_teacher(cfg.identity.pretrained_model_name_or_path, "auto", None, dtype=torch.float32)
    student, _ = load_student(teacher, cfg.identity, ckpt)
    shadow = load_file(str(ckpt / "lcm_target.safetensors"))
    params = [p for p in student.parameters()]
    from dmad.models.networks import make_trainable_copy, trainable_parameters

    trainable = trainable_parameters(make_trainable_copy(teacher.denoiser, variant, 4, 8, False,
                                                         teacher.family.lora_targets))
    assert len(shadow) == len(trainable) and len(params) >= len(trainable)
    moved = sum((shadow[f"shadow.{i}"] - p.detach()).abs().sum().item()
                for i, p in enumerate(trainable_parameters(_trainable_view(student, variant))))
    assert moved > 0


def _trainable_view(student, variant):
    """load_student returns the student with grads off; the trainable set is the same parameters
    (all of them for a full student, the adapter's for LoRA) in the same order."""
    if variant == "full":
        student.requires_grad_(True)
    else:
        for n, p in student.named_parameters():
            p.requires_grad_("lora_" in n)
    return student


def test_an_lcm_run_resumes_exactly(lcm_run, tiny_teacher, tiny_data, tiny_prompt_set):
    """A run killed after its iteration-2 checkpoint (here: the finished run's folder without what
    came later) resumed to iteration 4 ends with the same bytes in every checkpoint file: student,
    EMA target, optimizer, RNG."""
    variant, root, run = lcm_run
    cut = root / f"{variant}_cut"
    shutil.copytree(run, cut)
    shutil.rmtree(cut / "checkpoints" / "iter_4")
    shutil.rmtree(cut / "samples" / "iter_4")
    _train(root, f"{variant}_cut", VARIANTS[variant], tiny_teacher, tiny_data, tiny_prompt_set, resume=True)
    from safetensors.torch import load_file

    a, b = run / "checkpoints" / "iter_4", cut / "checkpoints" / "iter_4"
    for f in (STUDENT_FILES[variant], "lcm_target.safetensors", "optimizer_generator.safetensors", "rng.safetensors"):
        ta, tb = load_file(str(a / f)), load_file(str(b / f))
        assert ta.keys() == tb.keys()
        for k in ta:
            assert torch.equal(ta[k], tb[k]), f"{f}:{k} differs after resume"
    import csv

    assert [int(r["iter"]) for r in csv.DictReader((cut / "metrics.csv").read_text().splitlines())] == [1, 2, 3, 4]
    events = [json.loads(line) for line in (cut / "events.jsonl").read_text().splitlines()]
    restored = [e for e in events if e["kind"] == "phase" and e["data"].get("phase") == "restored"]
    assert [e["iter"] for e in restored] == [2]  # it did resume from iter_2, not start again


def test_resuming_a_dmad_checkpoint_as_lcm_is_refused_in_one_line(lcm_run, tmp_path, tiny_teacher, tiny_data,
                                                                  tiny_prompt_set, capsys):
    variant, root, run = lcm_run
    if variant != "full":
        pytest.skip("one variant is enough")
    cfg = _deep_update(tiny_config_dict(tiny_teacher, tiny_data, tiny_prompt_set, tmp_path / "runs"),
                       {"distillation": {"method": "dmad", "student_steps": 4}})
    path = tmp_path / "dmad.json"
    path.write_text(json.dumps(cfg), encoding="utf-8")
    code, _, err = dmad_captured(capsys, "train", "--config", str(path), "--resume", str(run / "checkpoints" / "iter_4"))
    assert code != 0
    line = err.strip().splitlines()[-1]
    assert "is from an LCM run (distillation.method lcm); this config is method dmad" in line
    assert "Traceback" not in err


def test_an_lcm_student_exports_to_a_pipeline_that_reproduces_its_samples(lcm_run, capsys):
    variant, _, run = lcm_run
    from diffusers import StableDiffusionPipeline
    from PIL import Image

    code, stdout, stderr = dmad_captured(capsys, "export", "--run", str(run), "--format", "diffusers")
    assert code == 0, stderr[-2000:]
    out = Path(stdout.strip().splitlines()[-1])
    doc = json.loads((out / "dmad_export.json").read_text())
    assert doc["student_timesteps"] == [999, 759, 499, 259] and doc["num_inference_steps_gives_timesteps"] is True
    assert doc["method"] == "lcm"
    pipe = StableDiffusionPipeline.from_pretrained(str(out), local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    assert type(pipe.scheduler).__name__ == "LCMScheduler"
    pipe.scheduler.set_timesteps(4)
    assert pipe.scheduler.timesteps.tolist() == [999, 759, 499, 259]
    ps = load_prompt_set(run / "prompt_set.json")
    folder = run / "samples" / "iter_4"
    meta = json.loads((folder / "meta.json").read_text())
    for item in ps.items:
        gen = torch.Generator("cpu").manual_seed(item_seed(ps, item))
        got = np.asarray(pipe(item.prompt, num_inference_steps=4, guidance_scale=1.0, width=ps.width,
                              height=ps.height, generator=gen).images[0])
        want = np.asarray(Image.open(folder / meta["items"][item.id]["file"]).convert("RGB"))
        assert np.array_equal(got, want), item.id
