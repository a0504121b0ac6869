"""control.jsonl during training: stop (a checkpoint and its samples), stop_now (none), sample_now
with a one-off prompt, and status.json's iteration kept fresh by the heartbeat. The real
`dmad train` in process on the tiny teacher; commands are appended at a chosen iteration."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from PIL import Image  # noqa: E402

from dmad.cli import main as dmad  # noqa: E402
from dmad.contract.events import read_events  # noqa: E402
from dmad.contract.runs import RunFolder, append_control  # noqa: E402


def _after_iteration(monkeypatch, send) -> None:
    """Calls send(iteration) at the end of each iteration's optimizer steps (the loop's finiteness
    check), before the next iteration's control commands are read."""
    import dmad.train.loop

    real = dmad.train.loop._check_finite

    def check(tr, logs, it):
        send(it + 1)
        return real(tr, logs, it)

    monkeypatch.setattr(dmad.train.loop, "_check_finite", check)


def _train_sending(write_config, tmp_path, monkeypatch, at: int, **command) -> Path:
    """Trains (up to 100 iterations, no scheduled checkpoint) and appends `command` to
    control.jsonl during iteration `at`."""
    run = tmp_path / "run"
    _after_iteration(monkeypatch, lambda it: append_control(run, **command) if it == at else None)
    cfg = write_config({"optimization": {"max_train_steps": 100}, "observation": {"checkpointing_steps": 1000}})
    assert dmad(["train", "--config", str(cfg), "--run-dir", str(run)]) == 0
    return run


def _stopped(run: Path):
    last = list(read_events(run / "events.jsonl"))[-1]
    assert last.kind == "stopped" and json.loads((run / "status.json").read_text())["state"] == "stopped"
    return last


def test_stop_saves_a_checkpoint_and_renders_its_samples(write_config, tmp_path, monkeypatch):
    run = _train_sending(write_config, tmp_path, monkeypatch, 3, cmd="stop")
    ev = _stopped(run)
    it = ev.iter
    assert ev.data["checkpoint_saved"] is True and ev.data["last_checkpoint"] == it
    assert (run / "checkpoints" / f"iter_{it}" / "training_state.json").is_file()
    meta = json.loads((run / "samples" / f"iter_{it}" / "meta.json").read_text())
    assert meta["checkpoint"] == f"iter_{it}"  # the grid's last column is the stop checkpoint


def test_stop_now_ends_without_a_checkpoint(write_config, tmp_path, monkeypatch):
    run = _train_sending(write_config, tmp_path, monkeypatch, 3, cmd="stop_now")
    ev = _stopped(run)
    assert ev.iter == 3 and ev.data["checkpoint_saved"] is False and ev.data["last_checkpoint"] is None
    assert RunFolder(run).list_checkpoints() == []


def test_sample_now_with_a_one_off_prompt(write_config, tmp_path, monkeypatch):
    run = tmp_path / "run"

    def send(it):
        if it == 2:
            append_control(run, "sample_now", prompt="a large red circle", seed=5)
            append_control(run, "sample_now", prompt="a large red circle", seed=5)
            with open(run / "control.jsonl", "a") as f:  # by hand: not a prompt; a lone surrogate (issue 43, T6)
                f.write(json.dumps({"cmd": "sample_now", "prompt": 123}) + "\n")
                f.write(json.dumps({"cmd": "sample_now", "prompt": "a \ud800 circle"}) + "\n")
        if it == 4:
            append_control(run, "stop_now")

    _after_iteration(monkeypatch, send)
    cfg = write_config({"optimization": {"max_train_steps": 100}, "observation": {"checkpointing_steps": 1000}})
    assert dmad(["train", "--config", str(cfg), "--run-dir", str(run)]) == 0
    oneoff = run / "samples" / "oneoff"
    assert sorted(p.name for p in oneoff.iterdir()) == ["iter_2-1.json", "iter_2-1.png", "iter_2-2.json",
                                                          "iter_2-2.png"]
    meta = json.loads((oneoff / "iter_2-1.json").read_text())
    assert meta["one_off"] is True and meta["iter"] == 2 and meta["items"]["oneoff"]["seed"] == 5
    assert meta["items"]["oneoff"]["prompt"] == "a large red circle" and meta["items"]["oneoff"]["file"] == "iter_2-1.png"
    a, b = (Image.open(oneoff / f"iter_2-{k}.png") for k in (1, 2))
    assert a.size == tuple(meta["resolution"]) and a.tobytes() == b.tobytes()  # same prompt, seed, weights
    events = list(read_events(run / "events.jsonl"))
    shown = [e for e in events if e.kind == "samples" and e.data.get("one_off")]
    assert [Path(e.data["paths"][0]).name for e in shown] == ["iter_2-1.png", "iter_2-2.png"]
    assert shown[0].data["prompt"] == "a large red circle" and shown[0].data["seed"] == 5
    assert any(e.kind == "warning" and "prompt must be non-empty text" in e.data["message"] for e in events)
    assert any(e.kind == "warning" and "not valid Unicode" in e.data["message"] for e in events)
    assert "Traceback" not in (run / "logs" / "engine.log").read_text()


def test_append_control_refuses_what_the_engine_would_not_render(tmp_path):
    for bad in ({"prompt": ""}, {"prompt": "x" * 1001}, {"prompt": "ok", "seed": -1}, {"prompt": "ok", "seed": True},
                {"prompt": "a \ud800 circle"}):
        with pytest.raises(ValueError, match="sample_now"):
            append_control(tmp_path, "sample_now", **bad)
    with pytest.raises(ValueError, match="only sample_now"):
        append_control(tmp_path, "stop", prompt="x")
    assert not (tmp_path / "control.jsonl").exists()


def test_the_heartbeat_keeps_the_iteration_fresh(tmp_path):
    run = RunFolder.create(tmp_path / "r")
    run.write_status("paused", iter=3)
    run.note(iter=20)
    run.heartbeat()
    assert run.read_status()["iter"] == 20 and run.read_status()["state"] == "paused"
