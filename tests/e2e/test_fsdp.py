"""resources.distributed fsdp (torch FSDP2) on the CPU with the gloo backend: two processes shard
the networks and step like one process of twice the batch; a rank that crashes ends the run with
one line naming it, and the run resumes from its sharded checkpoint to the weights of an
uninterrupted run; one process continues a two-process checkpoint (re-sharded, with a note); and
`dmad export` / `dmad sample` read sharded checkpoints with no distributed setup.

Tolerances: one SGD update of two sharded processes against one process of batch 2B must agree
as DDP's does (test_multiprocess: 1e-4 relative; measured here 5e-6 for the student and 1e-6 for
the fake score): the gradients are the same numbers summed in another order. A resume continues
the same processes from exactly saved states, so it is held to float rounding (1e-5 relative, as
DDP's resume test)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.conftest import dmad_captured, dmad_in_process, tiny_config_dict

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.slow


def _deep(cfg: dict, extra: dict) -> dict:
    for k, v in extra.items():
        cfg[k] = _deep(cfg.get(k, {}), v) if isinstance(v, dict) else v
    return cfg


@pytest.fixture(scope="module")
def fsdp_root(tmp_path_factory, tiny_teacher, tiny_data, tiny_prompt_set):
    root = tmp_path_factory.mktemp("fsdp")

    def config(name: str, extra: dict) -> Path:
        cfg = _deep(tiny_config_dict(tiny_teacher, tiny_data, tiny_prompt_set, root / "runs"), extra)
        path = root / f"{name}.json"
        path.write_text(json.dumps(cfg), encoding="utf-8")
        return path

    return root, config


def _net(ckpt: Path, name: str, teacher: Path, ema: bool = False) -> dict:
    """A checkpoint's network (sharded or not) read into an ordinary UNet, as export reads it."""
    from diffusers import UNet2DConditionModel

    from dmad.models.checkpoint import load_network
    from dmad.models.sharded_checkpoint import load_ema_sharded

    unet = UNet2DConditionModel.from_pretrained(str(teacher / "unet"))
    load_network(unet, ckpt, name, "full")
    if ema:
        load_ema_sharded(list(unet.parameters()), ckpt)
    return {k: v.detach().clone() for k, v in unet.state_dict().items()}


def _rel(a: dict, b: dict, base: dict) -> float:
    da = torch.cat([(a[k] - base[k]).flatten() for k in sorted(a)])
    db = torch.cat([(b[k] - base[k]).flatten() for k in sorted(a)])
    assert da.norm() > 0, "no update happened"
    return float((da - db).norm() / da.norm())


ONE_UPDATE = {"optimization": {"max_train_steps": 1, "optimizer": "sgd", "generator_lr": 0.5, "critic_lr": 0.5,
                               "max_grad_norm": 0.0, "lr_scheduler": "constant"},
              "observation": {"checkpointing_steps": 1, "log_every_steps": 1}}


def test_two_sharded_processes_step_like_one_process_of_twice_the_batch(fsdp_root, tiny_teacher):
    """The full fake score (with the GAN head: a random init every rank must share) and the frozen
    teacher are sharded, the LoRA student stays replicated, with gradient checkpointing; every rank
    renders the teacher reference (its sharded teacher gathers per call) and rank 0 keeps it."""
    root, config = fsdp_root
    mixed = {"identity": {"student": "lora", "lora_rank": 4}, "resources": {"share_frozen_base": False,
                                                                             "gradient_checkpointing": True}}
    one = config("one", _deep(_deep({}, ONE_UPDATE), {**mixed, "resources": {**mixed["resources"],
                                                                              "train_batch_size": 4}}))
    two = config("two", _deep(_deep({}, ONE_UPDATE), {**mixed, "resources": {
        **mixed["resources"], "train_batch_size": 2, "distributed": "fsdp", "fsdp_shard_teacher": True}}))
    assert dmad_in_process("train", "--config", str(one), "--run-dir", str(root / "one")) == 0
    assert dmad_in_process("train", "--config", str(two), "--run-dir", str(root / "two"), "--num-processes", "2") == 0
    ckpt = root / "two" / "checkpoints" / "iter_1"
    shards = ckpt / "sharded"
    # one file per rank and part: the fake score and the GAN head (SGD keeps no optimizer state)
    assert sorted(p.name for p in shards.glob("*.safetensors")) == [
        f"shard-0000{r}-model-0000{k}-of-00002.safetensors" for r in (1, 2) for k in (1, 2)]
    index = json.loads((shards / "index.json").read_text())
    assert index["world_size"] == 2 and index["networks"] == ["fake_score", "gan_head"]
    assert sorted(index["optimizers"]) == ["critic"]  # the LoRA student's optimizer is replicated
    assert (ckpt / "student_lora.safetensors").is_file() and (ckpt / "optimizer_generator.safetensors").is_file()
    assert not (ckpt / "fake_score").exists() and not (ckpt / "gan_head.safetensors").exists()
    from safetensors.torch import load_file

    from tests.e2e.test_train import _unet_state

    teacher = _unet_state(tiny_teacher / "unet")
    a = _unet_state(root / "one" / "checkpoints" / "iter_1" / "fake_score")
    assert _rel(a, _net(ckpt, "fake_score", tiny_teacher), teacher) < 1e-4
    la = load_file(str(root / "one" / "checkpoints" / "iter_1" / "student_lora.safetensors"))
    lb = load_file(str(ckpt / "student_lora.safetensors"))
    la, lb = ({k: v for k, v in d.items() if ".lora_B." in k} for d in (la, lb))
    zero = {k: torch.zeros_like(v) for k, v in la.items()}  # LoRA B starts at 0: its weights are the update
    assert _rel(la, lb, zero) < 1e-4
    assert sorted(p.name for p in (root / "two" / "samples" / "teacher").glob("*.png")) == ["blue.png", "red.png"]


@pytest.fixture(scope="module")
def whole_and_resumed(fsdp_root):
    """A 2-process fsdp run of 4 iterations (AdamW, EMA) and the same run with rank 1 crashing at
    iteration 3, then resumed from its checkpoint at iteration 2."""
    import os

    root, config = fsdp_root
    cfg = config("adam", {"resources": {"train_batch_size": 2, "distributed": "fsdp"},
                          "optimization": {"max_train_steps": 4, "lr_scheduler": "constant"},
                          "distillation": {"ema_decay": 0.9},
                          "observation": {"checkpointing_steps": 2, "log_every_steps": 1}})
    whole, crashed = root / "whole", root / "crashed"
    assert dmad_in_process("train", "--config", str(cfg), "--run-dir", str(whole), "--num-processes", "2") == 0
    os.environ["DMAD_FAULT"] = "crash:step-3@rank1"  # the ranks inherit it
    try:
        code_crash = dmad_in_process("train", "--config", str(cfg), "--run-dir", str(crashed), "--num-processes", "2")
    finally:
        del os.environ["DMAD_FAULT"]
    status = json.loads((crashed / "status.json").read_text())
    code_resume = dmad_in_process("train", "--config", str(cfg), "--run-dir", str(crashed), "--num-processes", "2",
                                  "--resume", "latest")
    return cfg, whole, crashed, code_crash, status, code_resume


def test_a_crash_ends_the_run_naming_the_rank_and_the_sharded_checkpoint_resumes_exactly(whole_and_resumed,
                                                                                          tiny_teacher):
    cfg, whole, crashed, code_crash, status, code_resume = whole_and_resumed
    assert code_crash == 1 and status["state"] == "failed" and status["failure_reason"].startswith("rank 1: ")
    assert code_resume == 0
    a_ckpt, b_ckpt = whole / "checkpoints" / "iter_4", crashed / "checkpoints" / "iter_4"
    for name in ("student", "fake_score"):
        a, b = _net(a_ckpt, name, tiny_teacher), _net(b_ckpt, name, tiny_teacher)
        for k in a:
            assert torch.allclose(a[k], b[k], rtol=1e-5, atol=1e-7), (name, k)
    a, b = _net(a_ckpt, "student", tiny_teacher, ema=True), _net(b_ckpt, "student", tiny_teacher, ema=True)
    assert all(torch.allclose(a[k], b[k], rtol=1e-5, atol=1e-7) for k in a)  # the EMA, sharded too
    iters = [int(x.split(",")[0]) for x in (crashed / "metrics.csv").read_text().splitlines()[1:]]
    assert iters == [1, 2, 3, 4]


def test_one_process_continues_a_two_process_checkpoint_and_says_what_differs(whole_and_resumed, tmp_path, capsys):
    cfg, whole, *_ = whole_and_resumed
    run = tmp_path / "continued"
    shutil.copytree(whole, run)
    code, _, err = dmad_captured(capsys, "train", "--config", str(cfg), "--run-dir", str(run), "--resume", "latest",
                                 "--set", "optimization.max_train_steps=6")
    assert code == 0, err[-3000:]
    notes = [json.loads(x)["data"]["message"] for x in (run / "events.jsonl").read_text().splitlines()
             if '"warning"' in x]
    assert any(n.startswith("continuing checkpoint iter_4, written by 2 process(es), on 1: its shards were re-split; "
                            "the effective batch is now 2 (it was 4)") for n in notes), notes
    index = json.loads((run / "checkpoints" / "iter_6" / "sharded" / "index.json").read_text())
    assert index["world_size"] == 1


def test_export_and_sample_read_a_sharded_checkpoint_without_a_process_group(whole_and_resumed, tmp_path,
                                                                               tiny_teacher):
    """The exported student is the checkpoint's EMA weights and loads in plain diffusers; dmad
    sample renders it."""
    from diffusers import StableDiffusionPipeline

    _, whole, *_ = whole_and_resumed
    out = tmp_path / "export"
    assert dmad_in_process("export", "--run", str(whole), "--format", "diffusers", "--out", str(out)) == 0
    pipe = StableDiffusionPipeline.from_pretrained(str(out))
    want = _net(whole / "checkpoints" / "iter_4", "student", tiny_teacher, ema=True)
    got = pipe.unet.state_dict()
    assert all(torch.equal(got[k], want[k]) for k in want)
    assert dmad_in_process("sample", "--run", str(whole), "--out", str(tmp_path / "samples")) == 0
    assert sorted(p.name for p in (tmp_path / "samples" / "iter_4").glob("*.png")) == ["blue.png", "red.png"]


@pytest.mark.parametrize("family", ["sdxl", "sd3", "flux"])
def test_fsdp_shards_and_checkpoints_every_family(family, tmp_path, tiny_data, tiny_prompt_set):
    """One process (a process group of one): the transformer and SDXL layouts shard block by block,
    train, save sharded checkpoints and resume from them; export reads them back."""
    from dmad.testing.tiny import make_tiny_flux_pipeline, make_tiny_sd3_pipeline, make_tiny_sdxl_pipeline

    teacher = tmp_path / family
    {"sdxl": make_tiny_sdxl_pipeline, "sd3": make_tiny_sd3_pipeline, "flux": make_tiny_flux_pipeline}[family](teacher)
    cfg = _deep(tiny_config_dict(teacher, tiny_data, tiny_prompt_set, tmp_path / "runs"),
                {"resources": {"distributed": "fsdp"}, "optimization": {"max_train_steps": 2},
                 "observation": {"checkpointing_steps": 1}})
    path = tmp_path / "c.json"
    path.write_text(json.dumps(cfg), encoding="utf-8")
    run = tmp_path / "run"
    assert dmad_in_process("train", "--config", str(path), "--run-dir", str(run)) == 0
    (run / "checkpoints" / "iter_2").rename(tmp_path / "iter_2")  # resume from iteration 1
    (run / "checkpoints" / "latest.json").write_text(json.dumps({"iter": 1, "path": "iter_1"}), encoding="utf-8")
    assert dmad_in_process("train", "--config", str(path), "--run-dir", str(run), "--resume", "latest") == 0
    index = json.loads((run / "checkpoints" / "iter_2" / "sharded" / "index.json").read_text())
    assert index["networks"] == ["fake_score", "gan_head", "student"]
    assert dmad_in_process("export", "--run", str(run), "--format", "single-file", "--out", str(tmp_path / "x")) == 0
    from safetensors.torch import load_file

    exported = load_file(str(next((tmp_path / "x").glob("*.safetensors"))))
    from dmad.models.sharded_checkpoint import stored_shapes

    shapes = stored_shapes(run / "checkpoints" / "iter_2")
    assert {k: tuple(v.shape) for k, v in exported.items()} == {k[len("student."):]: v for k, v in shapes.items()
                                                               if k.startswith("student.")}


def test_bf16_compute_with_a_frozen_first_critic_call_trains(fsdp_root, tmp_path):
    """FSDP2 fixes each unit's gradient dtype at its first forward from what requires grad then; the
    critic's first call is frozen, inside the student's step. With bf16 compute its gradients
    then reached float32 parameters ("attempting to assign a gradient with dtype BFloat16"):
    the engine initialises every sharded network before training. fsdp_cpu_offload on a CPU is
    a no-op (the shards are in host memory already) and says so in the log line."""
    _, config = fsdp_root
    cfg = config("bf16", {"resources": {"distributed": "fsdp", "mixed_precision": "bf16", "fsdp_shard_teacher": True,
                                        "fsdp_cpu_offload": True},
                          "optimization": {"max_train_steps": 2}})
    run = tmp_path / "bf16"
    assert dmad_in_process("train", "--config", str(cfg), "--run-dir", str(run)) == 0
    log = (run / "logs" / "engine.log").read_text()
    assert ("fsdp over 1 process(es): sharded student, fake_score, gan_head, teacher denoiser; shards in CPU "
            "memory; compute torch.bfloat16") in log
    rows = (run / "metrics.csv").read_text().splitlines()
    assert len(rows) == 3
