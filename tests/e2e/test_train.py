"""`dmad train` end to end: the real CLI on a tiny random pipeline, checking what it wrote."""
from __future__ import annotations

import csv
import json
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import dmad_captured, dmad_env, dmad_in_process

torch = pytest.importorskip("torch")

from dmad.contract.events import is_iteration_metric, parse_line, read_events  # noqa: E402
from dmad.contract.methods import METRIC_COLUMNS  # noqa: E402
from dmad.contract.paths import engine_argv  # noqa: E402


def _rows(path: Path) -> list[dict]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def _unet_state(folder: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(folder / "diffusion_pytorch_model.safetensors"))


def _spawn(config: Path, run_dir: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(engine_argv("train", "--config", str(config), "--run-dir", str(run_dir), *extra),
                            cwd=config.parent, env=dmad_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for(predicate, timeout: float = 120.0, what: str = "condition") -> None:
    end = time.time() + timeout
    while time.time() < end:
        if predicate():
            return
        time.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.slow
def test_thirty_steps_write_the_whole_run_folder(write_config, dmad_cli, tmp_path, tiny_teacher):
    cfg = write_config({
        "resources": {"train_batch_size": 2},
        "optimization": {"max_train_steps": 30},
        "distillation": {"student_steps": 2, "ema_decay": 0.9},
        "observation": {"log_every_steps": 1, "checkpointing_steps": 10, "checkpoints_total_limit": 2,
                        "validation_steps": 15, "gpu_mem_interval_s": 0.2},
    })
    run = tmp_path / "run"
    r = dmad_cli("train", "--config", str(cfg), "--run-dir", str(run), timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]

    # stdout is the event stream, nothing else, and events.jsonl holds the same lines
    out_lines = r.stdout.splitlines()
    assert out_lines and all(parse_line(line) is not None for line in out_lines)
    assert out_lines == (run / "events.jsonl").read_text(encoding="utf-8").splitlines()

    for name in ("config.json", "prompt_set.json", "env.json", "command.txt", "status.json", "events.jsonl",
                 "metrics.csv", "gpu_mem.csv", "logs/engine.log", "checkpoints/latest.json"):
        assert (run / name).is_file(), name
    config = json.loads((run / "config.json").read_text())
    assert config["resources"]["train_batch_size"] == 2 and config["optimization"]["lr_scheduler"]  # defaults filled
    assert json.loads((run / "prompt_set.json").read_text())["prompt_set"] == "tiny"
    from importlib import metadata

    torch_recorded = json.loads((run / "env.json").read_text())["packages"]["torch"]  # the wheel's own version
    assert torch_recorded == metadata.version("torch") and torch_recorded.split("+")[0] == torch.__version__.split("+")[0]
    assert "--run-dir" in (run / "command.txt").read_text()
    assert json.loads((run / "status.json").read_text())["state"] == "finished"

    rows = _rows(run / "metrics.csv")
    assert list(rows[0].keys()) == METRIC_COLUMNS
    assert [int(r["iter"]) for r in rows] == list(range(1, 31))
    gen_iters = [int(r["iter"]) for r in rows if r["loss_dm"]]
    assert gen_iters == [1, 6, 11, 16, 21, 26]  # critic every iteration, student every 5th
    assert all(r["loss_fake"] and r["loss_c"] and float(r["step_time_s"]) > 0 for r in rows)
    assert all(float(r["mem_device_used_gb"]) > 0 and r["mem_peak_alloc_gb"] == "" for r in rows)  # CPU: RSS, no framework peak

    events = list(read_events(run / "events.jsonl"))
    kinds = ["iteration" if is_iteration_metric(e) else e.kind for e in events]
    assert kinds[0] == "started" and kinds[-1] == "finished"
    assert [e.iter for e in events if is_iteration_metric(e)] == list(range(1, 31))
    assert [e.iter for e in events if e.kind == "checkpoint"] == [10, 20, 30]
    assert sorted({e.iter for e in events if e.kind == "samples" and e.data["model"] == "student"}) == [10, 15, 20, 30]
    teacher_events = [e for e in events if e.kind == "samples" and e.data["model"] == "teacher"]
    assert len(teacher_events) == 1 and kinds.index("samples") < kinds.index("iteration")  # before iteration 1
    assert kinds.index("phase") < kinds.index("iteration")
    sampler = [e for e in events if e.kind == "metric" and e.data.get("source") == "sampler"]
    assert sampler and all(e.data["scope"] == "process_rss" and e.data["mem_used_gb"] > 0 for e in sampler)

    ckpts = sorted(p.name for p in (run / "checkpoints").iterdir() if p.is_dir())
    assert ckpts == ["iter_20", "iter_30"]  # rotation kept the last 2
    assert json.loads((run / "checkpoints/latest.json").read_text())["iter"] == 30
    state = json.loads((run / "checkpoints/iter_30/training_state.json").read_text())
    assert state["iter"] == 30 and state["generator_steps"] == 6 and state["batches_used"] == 30
    assert state["student_timesteps"] == [999, 499]

    # the checkpoint loads in plain diffusers, and training moved it away from the teacher
    from diffusers import UNet2DConditionModel

    student = UNet2DConditionModel.from_pretrained(str(run / "checkpoints/iter_30/student"))
    teacher = _unet_state(tiny_teacher / "unet")
    moved = sum((p.detach() - teacher[n]).abs().sum().item() for n, p in student.named_parameters())
    assert moved > 0
    assert (run / "checkpoints/iter_30/ema.safetensors").is_file()

    from PIL import Image

    meta = json.loads((run / "samples/iter_30/meta.json").read_text())
    assert meta["timesteps"] == [999, 499] and meta["prompt_set"] == "tiny" and set(meta["items"]) == {"red", "blue"}
    assert meta["checkpoint"] == "iter_30" and meta["ema"] is True and len(meta["weights_sha256"]) == 64
    assert meta["method"] == "dmad"  # which method trained the weights that made these images
    assert json.loads((run / "samples/iter_15/meta.json").read_text())["checkpoint"] is None  # validation only
    assert json.loads((run / "samples/teacher/meta.json").read_text())["checkpoint"] == "teacher"
    with Image.open(run / "samples/iter_30/red.png") as im:
        assert im.size == (32, 32) and im.mode == "RGB"
    assert len(_rows(run / "gpu_mem.csv")) >= 1


def _one_update(write_config, tmp_path, name: str, batch: int, accum: int, steps: int) -> Path:
    cfg = write_config({
        "resources": {"train_batch_size": batch, "gradient_accumulation_steps": accum},
        "optimization": {"max_train_steps": 1, "optimizer": "sgd", "generator_lr": 0.5, "critic_lr": 0.5,
                         "max_grad_norm": 0.0, "lr_scheduler": "constant"},
        "distillation": {"student_steps": steps},
        "observation": {"checkpointing_steps": 1},
    }, name=f"{name}.json")
    run = tmp_path / name
    from dmad.contract.config import load_config
    from dmad.train.loop import run_training

    # in process: the maths of accumulation is under test, not the process boundary
    assert run_training(load_config(cfg), run_dir=run, resume=None, argv=["dmad", "train"]) == 0
    return run / "checkpoints" / "iter_1"


@pytest.mark.parametrize("steps", [1, 2])
def test_gradient_accumulation_matches_a_big_batch(write_config, tmp_path, tiny_teacher, steps):
    """Batch 4 x 1 step and batch 1 x 4 accumulation steps see the same samples and the same
    per-sample noise (dmad.methods.noise), so one SGD update must agree up to float rounding."""
    a = _one_update(write_config, tmp_path, "big", 4, 1, steps)
    b = _one_update(write_config, tmp_path, "accum", 1, 4, steps)
    teacher = _unet_state(tiny_teacher / "unet")
    for net in ("student", "fake_score"):
        sa, sb = _unet_state(a / net), _unet_state(b / net)
        da = torch.cat([(sa[k] - teacher[k]).flatten() for k in sorted(sa)])
        db = torch.cat([(sb[k] - teacher[k]).flatten() for k in sorted(sb)])
        assert da.norm() > 0, f"{net}: no update happened"
        rel = ((da - db).norm() / da.norm()).item()
        assert rel < 1e-4, f"{net}: updates differ by {rel:.2e} (relative)"


RESUMED_FILES = {
    "full": ("student/diffusion_pytorch_model.safetensors", "fake_score/diffusion_pytorch_model.safetensors"),
    # LoRA student and fake score on the teacher's own frozen base (resources.share_frozen_base)
    "shared_base": ("student_lora.safetensors", "fake_score_lora.safetensors"),
}


@pytest.mark.slow
@pytest.mark.parametrize("networks", sorted(RESUMED_FILES))
def test_resume_after_sigkill_gives_the_same_weights(networks, write_config, tmp_path):
    extra = {
        "identity": {"student": "lora", "fake_score": "lora", "lora_rank": 4} if networks == "shared_base" else {},
        "resources": {"train_batch_size": 2},
        # killed after iteration 5, past the checkpoint at 4, with 7 iterations left as the kill's margin
        "optimization": {"max_train_steps": 12},
        "distillation": {"student_steps": 2, "ema_decay": 0.9, "critic_updates_per_generator_update": 3},
        "observation": {"log_every_steps": 1, "checkpointing_steps": 4},
    }
    cfg = write_config(extra)
    straight = tmp_path / "straight"  # in this process: only the killed run needs one of its own
    assert dmad_in_process("train", "--config", str(cfg), "--run-dir", str(straight)) == 0

    killed = tmp_path / "killed"
    proc = _spawn(cfg, killed)
    _wait_for(lambda: (killed / "checkpoints" / "iter_4").is_dir(), what="checkpoint iter_4")
    _wait_for(lambda: any(is_iteration_metric(e) and e.iter >= 5 for e in read_events(killed / "events.jsonl")),
              what="iteration 5")
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    assert max(int(r["iter"]) for r in _rows(killed / "metrics.csv")) > 4  # rows past the checkpoint exist

    assert dmad_in_process("train", "--config", str(cfg), "--run-dir", str(killed), "--resume", "latest") == 0

    from safetensors.torch import load_file

    end_a, end_b = straight / "checkpoints/iter_12", killed / "checkpoints/iter_12"
    # rng.safetensors too: the global RNG stream (dropout in a user's model) goes on as if never stopped
    for f in (*RESUMED_FILES[networks], "gan_head.safetensors", "ema.safetensors", "rng.safetensors"):
        ta, tb = load_file(str(end_a / f)), load_file(str(end_b / f))
        assert ta.keys() == tb.keys()
        for k in ta:
            assert torch.equal(ta[k], tb[k]), f"{f}:{k} differs after resume"
    assert [int(r["iter"]) for r in _rows(killed / "metrics.csv")] == list(range(1, 13))
    metric_iters = [e.iter for e in read_events(killed / "events.jsonl") if is_iteration_metric(e)]
    assert metric_iters == list(range(1, 13))
    assert json.loads((killed / "status.json").read_text())["state"] == "finished"


def test_sigterm_stops_gracefully_with_a_checkpoint(write_config, tmp_path):
    cfg = write_config({"optimization": {"max_train_steps": 100000}, "observation": {"checkpointing_steps": 100000}})
    run = tmp_path / "run"
    proc = _spawn(cfg, run)
    _wait_for(lambda: any(is_iteration_metric(e) and e.iter >= 3 for e in read_events(run / "events.jsonl")),
              what="iteration 3")
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-2000:]
    events = list(read_events(run / "events.jsonl"))
    assert events[-1].kind == "stopped"
    stopped_at = events[-1].iter
    assert stopped_at >= 3 and (run / "checkpoints" / f"iter_{stopped_at}" / "training_state.json").is_file()
    assert json.loads((run / "status.json").read_text())["state"] == "stopped"


def test_a_second_engine_on_a_live_run_is_refused_and_the_first_goes_on(write_config, dmad_cli, tmp_path):
    cfg = write_config({"optimization": {"max_train_steps": 100000}, "observation": {"checkpointing_steps": 2}})
    run = tmp_path / "run"
    proc = _spawn(cfg, run)
    try:
        _wait_for(lambda: (run / "checkpoints" / "latest.json").is_file(), what="a checkpoint")
        second = dmad_cli("train", "--config", str(cfg), "--run-dir", str(run), "--resume", "latest")
        assert second.returncode == 2, second.stderr[-2000:]
        assert second.stderr.strip() == second.stderr.strip().splitlines()[0]
        assert f"is in use by engine pid {proc.pid}" in second.stderr
        n = len(_rows(run / "metrics.csv"))
        _wait_for(lambda: len(_rows(run / "metrics.csv")) > n + 1, what="the first engine going on")
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err[-2000:]
    assert [e.kind for e in read_events(run / "events.jsonl")].count("started") == 1
    iters = [int(r["iter"]) for r in _rows(run / "metrics.csv")]
    assert iters == list(range(1, len(iters) + 1))


def test_control_file_pauses_resumes_and_stops(write_config, tmp_path):
    from dmad.contract.runs import append_control

    cfg = write_config({"optimization": {"max_train_steps": 100000}, "observation": {"checkpointing_steps": 100000}})
    run = tmp_path / "run"
    proc = _spawn(cfg, run)
    try:
        _wait_for(lambda: any(is_iteration_metric(e) for e in read_events(run / "events.jsonl")), what="first metric")
        append_control(run, "pause")
        _wait_for(lambda: any(e.kind == "paused" for e in read_events(run / "events.jsonl")), what="paused")
        assert json.loads((run / "status.json").read_text())["state"] == "paused"
        n = len([e for e in read_events(run / "events.jsonl") if is_iteration_metric(e)])
        time.sleep(1.0)
        assert len([e for e in read_events(run / "events.jsonl") if is_iteration_metric(e)]) == n  # no progress
        append_control(run, "resume")
        _wait_for(lambda: any(is_iteration_metric(e) for e in list(read_events(run / "events.jsonl"))[-3:]), what="progress")
        append_control(run, "stop")
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-2000:]
    kinds = [e.kind for e in read_events(run / "events.jsonl")]
    assert kinds.index("paused") < kinds.index("resumed") < kinds.index("stopped") == len(kinds) - 1


def test_non_finite_loss_stops_with_the_term_and_iteration(write_config, tmp_path, capsys):
    # plain SGD at lr 1 without clipping diverges within a few iterations on the tiny model
    cfg = write_config({"optimization": {"max_train_steps": 200, "optimizer": "sgd", "critic_lr": 1.0,
                                         "generator_lr": 1.0, "max_grad_norm": 0.0},
                        "observation": {"checkpointing_steps": 1}})
    run = tmp_path / "run"
    code, _, stderr = dmad_captured(capsys, "train", "--config", str(cfg), "--run-dir", str(run))
    assert code == 1
    assert "Traceback" not in stderr and "is not finite at iteration" in stderr.splitlines()[-1]
    err = [e for e in read_events(run / "events.jsonl") if e.kind == "error"]
    assert len(err) == 1 and err[0].data["cause"] == "non_finite_loss"
    bad_iter, term = err[0].iter, err[0].data["term"]
    assert term.startswith("loss_") and f"iteration {bad_iter + 1}" in err[0].data["reason"]
    # the last checkpoint is from before the bad update, and it holds finite weights
    last = json.loads((run / "checkpoints/latest.json").read_text())["iter"]
    assert last == bad_iter
    state = _unet_state(run / f"checkpoints/iter_{last}/fake_score")
    assert all(torch.isfinite(t).all() for t in state.values())
    assert json.loads((run / "status.json").read_text())["state"] == "failed"
