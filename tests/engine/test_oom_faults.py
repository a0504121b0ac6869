"""Out of memory, by phase: DMAD_FAULT=oom:<phase> raises torch's real
OutOfMemoryError where a run enters that phase; the run ends with exit 3, an error event with the
phase and the advice, status.json saying why, and a folder that resumes from its last checkpoint."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from dmad.errors import UserInputError
from dmad.train.oom import Phase, advice, parse_fault

torch = pytest.importorskip("torch")


def _train(write_config, run: Path, extra: dict | None = None, resume: str | None = None) -> int:
    from dmad.contract.config import load_config
    from dmad.train.loop import run_training

    base = {"optimization": {"max_train_steps": 4}, "observation": {"checkpointing_steps": 2, "log_every_steps": 1},
            "resources": {"train_batch_size": 2, "gradient_accumulation_steps": 1}}
    cfg = load_config(write_config({**base, **(extra or {})}))
    return run_training(cfg, run_dir=run, resume=resume, argv=["dmad", "train"])


def _events(run: Path) -> list:
    from dmad.contract.events import read_events

    return list(read_events(run / "events.jsonl"))


@pytest.mark.parametrize("phase", ["loading", "sampling", "vae-encode", "first-forward", "first-backward", "step-3"])
def test_each_phase_is_classified_with_advice(phase, write_config, tmp_path, monkeypatch):
    monkeypatch.setenv("DMAD_FAULT", f"oom:{phase}")
    run = tmp_path / "run"
    assert _train(write_config, run) == 3
    errors = [e for e in _events(run) if e.kind == "error"]
    assert len(errors) == 1
    err = errors[0].data
    assert err["cause"] == "out_of_memory" and err["phase"] == phase and err["exit_code"] == 3
    assert err["reason"].startswith(f"out of memory during {phase}: CUDA out of memory")
    assert err["advice"] and "\n" not in err["advice"]
    status = json.loads((run / "status.json").read_text())
    assert status["state"] == "failed" and status["exit_code"] == 3
    assert status["failure_reason"] == err["reason"] and status["advice"] == err["advice"]
    assert (run / "config.json").is_file() and not list(run.rglob("*.tmp*"))
    if phase == "step-3":  # iterations 1-2 ran and were checkpointed
        assert err["last_checkpoint"] == 2 and (run / "checkpoints" / "iter_2").is_dir()
    else:
        assert err["last_checkpoint"] is None


def test_a_run_that_ran_out_resumes_from_its_last_checkpoint(write_config, tmp_path, monkeypatch):
    run = tmp_path / "run"
    monkeypatch.setenv("DMAD_FAULT", "oom:step-3")
    assert _train(write_config, run) == 3
    monkeypatch.delenv("DMAD_FAULT")
    assert _train(write_config, run, resume=str(run / "checkpoints" / "iter_2")) == 0
    status = json.loads((run / "status.json").read_text())
    assert status["state"] == "finished" and status["iter"] == 4
    assert "advice" not in status and "failure_reason" not in status
    rows = (run / "metrics.csv").read_text().splitlines()[1:]
    assert [int(r.split(",")[0]) for r in rows] == [1, 2, 3, 4]  # each iteration exactly once


def test_advice_follows_the_triage_order():
    from dmad.contract.config import Resources

    r = Resources(train_batch_size=4, gradient_accumulation_steps=2, resolution=768)
    text = advice("first-backward", r)
    assert text.index("gradient_checkpointing") < text.index("train_batch_size to 1") < text.index("resolution")
    assert "gradient_accumulation_steps to 8" in text and "e.g. 576" in text
    done = advice("first-backward", Resources(gradient_checkpointing=True, train_batch_size=1, resolution=512))
    assert "gradient_checkpointing" not in done and done.startswith("lower resources.resolution")
    assert "vae_batch_size to 1" in advice("vae-encode", r)
    assert "bf16" in advice("loading", r)
    assert "expandable_segments" in advice("step-9", r)


def test_fault_values(monkeypatch):
    assert parse_fault(None) is None and parse_fault("oom:step-12") == ("oom", "step-12")
    monkeypatch.delenv("RANK", raising=False)
    assert parse_fault("crash:step-2@rank1") is None and parse_fault("crash:step-2@rank0") == ("crash", "step-2")
    monkeypatch.setenv("RANK", "1")
    assert parse_fault("crash:step-2@rank1") == ("crash", "step-2")
    for bad in ("oom", "oom:step-0", "oom:backward", "boom:loading", "oom:loading@1"):
        with pytest.raises(UserInputError, match="DMAD_FAULT"):
            parse_fault(bad)
    p = Phase(fault="first-forward")
    p.set("vae-encode")
    with pytest.raises(torch.OutOfMemoryError):
        p.set("first-forward")
    p.set("first-forward")  # once per process


def test_the_cli_exits_3_with_one_line(write_config, dmad_cli, tmp_path, monkeypatch, capsys):
    from tests.conftest import dmad_captured

    monkeypatch.setenv("DMAD_FAULT", "oom:first-backward")
    config = write_config()
    r = dmad_cli("train", "--config", str(config), "--run-dir", str(tmp_path / "run"))
    assert r.returncode == 3
    lines = r.stderr.strip().splitlines()
    assert lines[-1].startswith("dmad: error: out of memory during first-backward: ")
    monkeypatch.setenv("DMAD_FAULT", "oom:everywhere")  # a bad value: refused before the run folder is made
    code, _, err = dmad_captured(capsys, "train", "--config", str(config), "--run-dir", str(tmp_path / "other"))
    assert code == 2 and "DMAD_FAULT" in err and not (tmp_path / "other").exists()
