"""Several processes through accelerate, on the CPU with the gloo backend: two
processes of batch B make the same optimizer step as one of batch 2B; a run whose rank 1 crashes
ends with a clear error and no process left behind, and resumes to exactly the weights of an
uninterrupted run; only rank 0 writes the run folder."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from dmad.contract.events import read_events
from dmad.contract.runlog import read_health
from tests.conftest import dmad_captured, dmad_in_process

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.slow


def _weights(run: Path, it: int) -> dict:
    from safetensors.torch import load_file

    folder = run / "checkpoints" / f"iter_{it}" / "student"
    return load_file(str(next(folder.glob("*.safetensors"))))


def _config(write_config, name: str, batch: int, steps: int) -> Path:
    return write_config({"resources": {"train_batch_size": batch}, "optimization": {"max_train_steps": steps},
                         "observation": {"checkpointing_steps": 2 if steps > 1 else 1, "log_every_steps": 1}},
                        name=name)


def _leftovers(run: Path) -> list:
    import psutil

    time.sleep(0.5)
    found = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if str(run) in " ".join(p.info["cmdline"] or []):
                found.append(p)
        except psutil.Error:
            pass
    return found


def _one_update(write_config, tmp_path, name: str, batch: int, processes: int,
                identity: dict | None = None, prompt_set: Path | None = None) -> Path:
    cfg = write_config({
        "identity": identity or {},
        "observation": {"checkpointing_steps": 1, "log_every_steps": 1,
                        **({"prompt_set": str(prompt_set)} if prompt_set else {})},
        "resources": {"train_batch_size": batch},
        "optimization": {"max_train_steps": 1, "optimizer": "sgd", "generator_lr": 0.5, "critic_lr": 0.5,
                         "max_grad_norm": 0.0, "lr_scheduler": "constant"}}, name=f"{name}.json")
    run = tmp_path / name
    # in this process: the reference run, and the launcher of a multi-process run (its ranks are
    # processes of their own, started by accelerate launch); a CLI start is ~7 s of imports
    assert dmad_in_process("train", "--config", str(cfg), "--run-dir", str(run), "--num-processes", str(processes)) == 0
    return run


def test_two_processes_of_batch_b_step_like_one_of_batch_2b(write_config, tmp_path, tiny_teacher, health_prompt_set):
    """Rank r takes the samples (and per-sample noise) at global positions r*B ... (r+1)*B - 1, so
    two ranks of batch 2 see what one process of batch 4 sees; DDP averages the gradients: one SGD
    update must agree up to float rounding."""
    from tests.e2e.test_train import _unet_state

    one = _one_update(write_config, tmp_path, "one", 4, 1)
    two = _one_update(write_config, tmp_path, "two", 2, 2, prompt_set=health_prompt_set)
    teacher = _unet_state(tiny_teacher / "unet")
    for net in ("student", "fake_score"):
        sa = _unet_state(one / "checkpoints" / "iter_1" / net)
        sb = _unet_state(two / "checkpoints" / "iter_1" / net)
        da = torch.cat([(sa[k] - teacher[k]).flatten() for k in sorted(sa)])
        db = torch.cat([(sb[k] - teacher[k]).flatten() for k in sorted(sb)])
        assert da.norm() > 0, f"{net}: no update happened"
        rel = ((da - db).norm() / da.norm()).item()
        assert rel < 1e-4, f"{net}: updates differ by {rel:.2e} (relative)"
    started = [json.loads(x) for x in (two / "events.jsonl").read_text().splitlines()][0]["data"]
    assert started["effective_batch"] == 4 and started["num_processes"] == 2
    assert sorted(p.name for p in (two / "logs").iterdir()) == ["engine.log", "rank_1.log"]
    one_rows = (one / "metrics.csv").read_text().splitlines()
    two_rows = (two / "metrics.csv").read_text().splitlines()
    assert len(two_rows) == 2  # one row, written once (rank 0): the mean over both ranks
    loss = one_rows[0].split(",").index("loss_fake")
    assert float(two_rows[1].split(",")[loss]) == pytest.approx(float(one_rows[1].split(",")[loss]), rel=1e-4)
    # one health row and event for the one validation (iteration 1), rank 0's
    assert [(r["iter"], r["checkpoint"]) for r in read_health(two / "health.csv")] == [(1, "iter_1")]
    assert [e.iter for e in read_events(two / "events.jsonl") if e.kind == "health"] == [1]


def test_shared_base_adapters_step_alike_in_two_processes(write_config, tmp_path):
    """LoRA student and fake score on one frozen base (resources.share_frozen_base): DDP wraps each
    adapter view, whose parameters are its adapter's only; two ranks of batch 2 update both adapters
    as one process of batch 4 does."""
    from safetensors.torch import load_file

    lora = {"student": "lora", "fake_score": "lora", "lora_rank": 4}
    one = _one_update(write_config, tmp_path, "one", 4, 1, lora)
    two = _one_update(write_config, tmp_path, "two", 2, 2, lora)
    for run in (one, two):
        assert "one frozen base" in (run / "logs" / "engine.log").read_text()
    for net in ("student", "fake_score"):
        a, b = (load_file(str(r / "checkpoints" / "iter_1" / f"{net}_lora.safetensors")) for r in (one, two))
        assert set(a) == set(b)
        da = torch.cat([a[k].flatten() for k in sorted(a) if "lora_B" in k])  # B starts at zero: B is the update
        db = torch.cat([b[k].flatten() for k in sorted(b) if "lora_B" in k])
        assert da.norm() > 0, f"{net}: no update happened"
        rel = ((da - db).norm() / da.norm()).item()
        assert rel < 1e-4, f"{net}: updates differ by {rel:.2e} (relative)"


def test_a_crash_in_one_rank_ends_the_run_cleanly_and_it_resumes_exactly(write_config, capsys, tmp_path,
                                                                        monkeypatch):
    """The launcher runs in this process (test_train_families starts one as a user does); the
    ranks are accelerate's processes."""
    config = _config(write_config, "c.json", 2, 4)
    whole, crashed = tmp_path / "whole", tmp_path / "crashed"
    code, _, err = dmad_captured(capsys, "train", "--config", str(config), "--run-dir", str(whole), "--num-processes", "2")
    assert code == 0, err[-3000:]
    monkeypatch.setenv("DMAD_FAULT", "crash:step-3@rank1")  # the ranks inherit it
    code, _, err = dmad_captured(capsys, "train", "--config", str(config), "--run-dir", str(crashed),
                                 "--num-processes", "2")
    assert code == 1
    last = err.strip().splitlines()[-1]
    assert last.startswith("dmad: error: rank 1: RuntimeError: injected crash (DMAD_FAULT) in phase step-3"), last
    assert not _leftovers(crashed)
    status = json.loads((crashed / "status.json").read_text())
    assert status["state"] == "failed" and status["failure_reason"].startswith("rank 1: ")
    errors = [json.loads(x) for x in (crashed / "events.jsonl").read_text().splitlines() if '"error"' in x]
    assert errors[-1]["data"]["cause"] == "rank_failed" and errors[-1]["data"]["last_checkpoint"] == 2
    monkeypatch.delenv("DMAD_FAULT")
    code, _, err = dmad_captured(capsys, "train", "--config", str(config), "--run-dir", str(crashed),
                                 "--num-processes", "2", "--resume", "latest")
    assert code == 0, err[-3000:]
    a, b = _weights(whole, 4), _weights(crashed, 4)
    for k in a:
        assert torch.allclose(a[k], b[k], rtol=1e-5, atol=1e-7), k
    iters = [int(x.split(",")[0]) for x in (crashed / "metrics.csv").read_text().splitlines()[1:]]
    assert iters == [1, 2, 3, 4]


# ---------------------------------------------------------------- Stop and Kill as the app sends them

WAIT_MS = 600_000  # a hang guard for a loaded 2-core machine, not a performance target
GONE_S = 60.0  # how long the processes of a killed run may take to go (a hang guard too)


def _start_two_processes(qtbot, write_config, tmp_path):
    """A long 2-process run started as the app starts it (its engine command, in a session of its
    own), once it trains: (the engine bridge, the run folder, the iterations it sent)."""
    from app.engine.process import EngineProcess

    config = write_config({"optimization": {"max_train_steps": 100_000},
                           "observation": {"checkpointing_steps": 100_000, "log_every_steps": 1}}, name="long.json")
    run = tmp_path / "long"
    eng, iters = EngineProcess(), []
    eng.event_received.connect(lambda e: iters.append(e["iter"]) if e["kind"] == "metric" and e["iter"] else None)
    eng.start_train(config, run_dir=run, num_processes=2)
    qtbot.waitUntil(lambda: len(iters) >= 2 or not eng.is_running(), timeout=WAIT_MS)
    assert eng.is_running(), eng.last_log_lines()
    return eng, run, iters


def _gone_within(run: Path, seconds: float) -> list:
    """The processes of the run still there after `seconds` (polled; [] as soon as none is)."""
    deadline = time.monotonic() + seconds
    while (left := _leftovers(run)) and time.monotonic() < deadline:
        pass
    return left


def test_the_apps_stop_ends_every_process_of_a_two_process_run(qtbot, write_config, tmp_path):
    """Stop (control "stop", read by rank 0 and broadcast): both ranks stop at one boundary with a
    checkpoint, and the launcher and the engine end with exit 0."""
    eng, run, iters = _start_two_processes(qtbot, write_config, tmp_path)
    with qtbot.waitSignal(eng.finished, timeout=WAIT_MS) as done:
        eng.terminate_gracefully()
    code, summary = done.args
    assert code == 0 and summary.startswith("stopped at iteration") and "checkpoint iter_" in summary, done.args
    assert not _gone_within(run, GONE_S)
    assert json.loads((run / "status.json").read_text())["state"] == "stopped"


def test_the_apps_kill_ends_every_process_of_a_two_process_run(qtbot, write_config, tmp_path):
    """SIGKILL to the engine's process group (what the app's Kill ends with): `accelerate launch`
    (in that group) and both ranks (in sessions of their own, dying with their parent) go too, the
    iterations stop, and the run no longer reads as running."""
    import signal

    from dmad.contract.runs import effective_state

    eng, run, iters = _start_two_processes(qtbot, write_config, tmp_path)
    assert len(_leftovers(run)) >= 4  # the engine, accelerate launch, rank 0, rank 1
    with qtbot.waitSignal(eng.finished, timeout=WAIT_MS):
        os.killpg(eng.process_id(), signal.SIGKILL)
    assert not _gone_within(run, GONE_S)  # so no iteration follows
    status = json.loads((run / "status.json").read_text())
    assert status["state"] == "running" and effective_state(status) == "failed"  # killed: nobody wrote its end
