"""The event protocol (dmad.contract.events): what the engine prints is what the app and users' scripts read."""
from __future__ import annotations

import json
import math

import pytest

from dmad.contract.events import EVENT_VERSION, KINDS, Event, EventWriter, make_event, parse_line, read_events

# A plausible payload per kind; the round trip must not care what is in data.
PAYLOADS = {
    "started": dict(run_dir="/runs/x", resumed_from=None, max_train_steps=100),
    "phase": dict(name="loading_teacher"),
    "metric": dict(loss_dm=0.25, loss_fake=1.5, step_time_s=0.12, mem_peak_alloc_gb=3.2),
    "checkpoint": dict(path="checkpoints/iter_10"),
    "samples": dict(dir="samples/iter_10", images=["samples/iter_10/red.png"]),
    "health": dict(checkpoint="iter_10", folder="/runs/x/samples/iter_10", seeds=4, prompts=2,
                   signals={"diversity": 0.82, "teacher_distance": 0.12}, teacher={"diversity": 0.2}, alerts=[]),
    "warning": dict(message="data: 2 images without captions skipped"),
    "error": dict(message="CUDA out of memory", phase="step-3", exit_code=3),
    "paused": {}, "resumed": {}, "stopped": dict(reason="user"), "finished": dict(elapsed_s=12.5),
}


def test_every_kind_has_a_payload_here():
    assert set(PAYLOADS) == set(KINDS)


@pytest.mark.parametrize("kind", KINDS)
def test_round_trip(kind):
    ev = make_event(kind, 7 if kind == "metric" else None, **PAYLOADS[kind])
    line = ev.to_line()
    assert "\n" not in line  # one event, one line
    raw = json.loads(line)
    assert set(raw) == {"v", "t", "kind", "iter", "data"} and raw["v"] == EVENT_VERSION
    back = parse_line(line)
    assert back == ev
    assert back.t > 0


def test_nan_and_inf_become_null():
    ev = make_event("metric", 3, loss=float("nan"), grad_norm=float("inf"), nested={"x": [1.0, float("-inf")]})
    line = ev.to_line()
    assert "NaN" not in line and "Infinity" not in line
    data = json.loads(line)["data"]  # strict JSON readers (browsers, jq) accept it
    assert data == {"loss": None, "grad_norm": None, "nested": {"x": [1.0, None]}}
    assert not any(isinstance(v, float) and math.isnan(v) for v in parse_line(line).data.values())


def test_unknown_kind_is_rejected():
    with pytest.raises(ValueError, match="unknown event kind 'progress'"):
        make_event("progress", 1)
    line = json.dumps({"v": 1, "t": 1.0, "kind": "progress", "iter": 1, "data": {}})
    assert parse_line(line) is None  # a reader skips what it does not know, never crashes


@pytest.mark.parametrize("line", ["", "\n", "not json", "[1, 2]", '{"kind": "metric", "data": [1]}',
                                  "Loading pipeline components...: 100%", '{"v":1,"t":1.0,"kind":"met'])
def test_foreign_and_torn_lines_parse_to_none(line):
    assert parse_line(line) is None


def test_read_events_skips_a_torn_last_line(tmp_path):
    path = tmp_path / "events.jsonl"
    writer = EventWriter(path, echo=False)
    try:
        writer.emit("started", None, run_dir=str(tmp_path))
        writer.emit("metric", 1, loss=0.5)
    finally:
        writer.close()
    whole = make_event("metric", 2, loss=0.25).to_line()
    with open(path, "a", encoding="utf-8") as f:
        f.write(whole[: len(whole) // 2])  # the engine was killed in the middle of a write
    events = list(read_events(path))
    assert [(e.kind, e.iter) for e in events] == [("started", None), ("metric", 1)]
    assert events[1].data == {"loss": 0.5}


def test_read_events_of_a_missing_file_is_empty(tmp_path):
    assert list(read_events(tmp_path / "nope.jsonl")) == []


def test_writer_echoes_the_same_line(tmp_path):
    import io

    out = io.StringIO()
    writer = EventWriter(tmp_path / "events.jsonl", stream=out)
    try:
        ev = writer.emit("checkpoint", 5, path="checkpoints/iter_5")
    finally:
        writer.close()
    assert out.getvalue() == (tmp_path / "events.jsonl").read_text() == ev.to_line() + "\n"
    assert isinstance(ev, Event)


@pytest.mark.parametrize("ending", ["finished", "stopped", "error"])
def test_nothing_from_the_sampler_follows_the_runs_ending_event(tmp_path, ending):
    """The memory sampler runs until the monitor stops, which is after the loop's last event: its
    readings are dropped once an ending event is written, so a run's events end with it (under a
    busy machine a reading used to land after "finished")."""
    path = tmp_path / "events.jsonl"
    writer = EventWriter(path, echo=False)
    try:
        assert writer.emit_unless_ended("metric", 3, source="sampler", mem_used_gb=0.5) is not None
        writer.emit(ending, 3)
        assert writer.emit_unless_ended("metric", 3, source="sampler", mem_used_gb=0.5) is None
    finally:
        writer.close()
    assert [e.kind for e in read_events(path)] == ["metric", ending]
