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


def test_step_time_is_training_steps_only_and_boundaries_are_phases(write_config, tmp_path, monkeypatch):
    """A pause, a scheduled checkpoint and a sample-now each take 'an hour' (a clock moved on at those
    moments): step_time_s stays a training step's time, the ETA ignores the pause, and each of them is
    a phase span in the events (issue 42 item 6)."""
    import time as real_time

    import dmad.train.loop as loop
    from dmad.train import control as control_module

    hour = {"offset": 0.0}
    clock = type("Clock", (), {"perf_counter": staticmethod(lambda: real_time.perf_counter() + hour["offset"]),
                               "time": staticmethod(real_time.time)})
    monkeypatch.setattr(loop, "time", clock)
    real_save = loop.save_checkpoint

    def slow_save(s, tr):
        hour["offset"] += 3600.0
        return real_save(s, tr)

    monkeypatch.setattr(loop, "save_checkpoint", slow_save)
    real_handle = control_module.handle_control

    def handle(poll, announce, run):  # the pause the user held for an hour
        commands, _ = poll()
        if any(c.get("cmd") == "pause" for c in commands):
            hour["offset"] += 3600.0
            announce("paused", "paused")
            announce("running", "resumed")
            commands = [c for c in commands if c.get("cmd") != "pause"]
        return real_handle(lambda: (commands, None), announce, run)

    monkeypatch.setattr(loop, "handle_control", handle)
    run = tmp_path / "run"

    def send(it):
        if it == 2:
            append_control(run, "pause")
        if it == 4:
            append_control(run, "sample_now", prompt="a large red circle", seed=1)

    _after_iteration(monkeypatch, send)
    cfg = write_config({"optimization": {"max_train_steps": 6},
                        "observation": {"checkpointing_steps": 3, "log_every_steps": 1}})
    assert dmad(["train", "--config", str(cfg), "--run-dir", str(run)]) == 0
    events = list(read_events(run / "events.jsonl"))
    metrics = [e for e in events if e.kind == "metric" and e.data.get("source") != "sampler"]  # not gpu_mem readings
    assert len(metrics) == 6 and all(e.data["step_time_s"] < 600 for e in metrics), [e.data["step_time_s"] for e in metrics]
    assert all(e.data["eta_s"] < 3600 * 2 + 600 * (6 - e.iter) for e in metrics)  # 2 more checkpoints, never the pause
    spans = [(e.iter, e.data["phase"], e.data.get("after"), e.data.get("took_s")) for e in events if e.kind == "phase"]
    ends = [(it, after) for it, phase, after, took in spans if after is not None]
    assert (3, "checkpoint") in ends and (3, "validation") in ends and (4, "sample-now") in ends, spans
    assert all(took >= 3600 for it, phase, after, took in spans if after == "checkpoint")
    kinds = [e.kind for e in events]
    assert "paused" in kinds and kinds.index("resumed") > kinds.index("paused")
