"""The Training panel on recorded run folders (events in the engine's own format, dmad.contract.events) and
on engines replaced by small scripts. No torch."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from PySide6.QtCore import Qt

from app.widgets.plots import DEVICE_USED, FRAMEWORK_PEAK, ema
from app.panels.training import TrainingPanel
from dmad.contract.events import make_event
from dmad.contract.runs import RunFolder, atomic_write_json

WAIT_MS = 30_000  # generous: the machine is shared; nothing here is a timing test
LOSSES = ("loss_dm", "loss_g", "loss_c")


def _metric(it: int, scale: float = 1.0, **extra) -> bytes:
    data = {"loss_dm": scale / it, "loss_g": 0.5 + scale / it, "loss_c": 0.07 * scale, "d_real_acc": 0.6,
            "step_time_s": 0.25, "data_time_s": 0.01, "mem_peak_alloc_gb": 1.5 + it / 100,
            "mem_device_used_gb": 3.0, "lr_generator": 1e-4, "max_train_steps": 100, "eta_s": 25.0 * (100 - it)}
    data.update(extra)
    return (make_event("metric", it, **data).to_line() + "\n").encode("utf-8")


def _event(kind: str, it=None, **data) -> bytes:
    return (make_event(kind, it, **data).to_line() + "\n").encode("utf-8")


def write_run(root: Path, name: str, iters=range(1, 11), state: str = "finished", pid: int | None = None,
              tail: bytes = b"", **status) -> RunFolder:
    """A run folder as the engine leaves it: config.json, status.json, events.jsonl, logs/engine.log."""
    run = RunFolder.create(root / name)
    atomic_write_json(run.config_json, {"config_version": 1})
    lines = [_event("started", None, run_dir=str(run.path), max_train_steps=100),
             _event("phase", None, phase="loading", device="cpu"), _event("phase", 0, phase="training")]
    lines += [_metric(i) for i in iters]
    run.events_jsonl.write_bytes(b"".join(lines) + tail)
    run.engine_log.write_text("".join(f"INFO dmad: log line {i}\n" for i in range(20)))
    atomic_write_json(run.status_json, {"state": state, "pid": os.getpid() if pid is None else pid,
                                        "host": socket.gethostname(), "heartbeat": time.time(), **status})
    return run


def append(run: RunFolder, data: bytes) -> None:
    with open(run.events_jsonl, "ab") as f:
        f.write(data)


@pytest.fixture
def panel(qtbot):
    p = TrainingPanel()
    qtbot.addWidget(p)
    p.resize(1000, 700)
    return p


def xs(panel: TrainingPanel, key: str) -> list[float]:
    curve = panel.loss_plot.curve(key)  # any plot's curve, by metric name
    x, _ = curve.getData() if curve is not None else (None, None)
    return [] if x is None else list(x)


def _enabled(panel: TrainingPanel) -> dict[str, bool]:
    return {k: b.isEnabled() for k, b in panel.buttons.items()}


def test_replayed_run_plots_every_series(qtbot, panel, tmp_path, open_and_wait):
    run = write_run(tmp_path, "done", tail=_event("checkpoint", 10, path="x") + _event("finished", 10, elapsed_s=65.0))
    states = []
    panel.run_state_changed.connect(states.append)
    open_and_wait(panel, run.path)
    qtbot.waitUntil(lambda: len(xs(panel, "loss_dm")) == 10, timeout=WAIT_MS)
    assert sorted(panel.loss_plot.loss_keys()) == sorted(LOSSES)  # d_real_acc etc. are not loss terms
    for key in ("loss_g", "loss_c", "mem_peak_alloc_gb", "mem_device_used_gb", "step_time_s", "data_time_s"):
        qtbot.waitUntil(lambda: len(xs(panel, key)) == 10, timeout=WAIT_MS)
    assert xs(panel, "loss_dm") == list(range(1, 11))
    assert states == ["finished"] and panel.run_state.state == "finished" and not panel.run_state.is_live()
    assert panel.numbers.iter_label.text() == "iteration 10 / 100"
    assert panel.numbers.rate_label.text() == "4.00 it/s"
    assert panel.banner.isHidden()
    assert _enabled(panel) == {"start": True, "continue": False, "pause": False, "resume": False, "stop": False,
                               "sample": False, "sample_prompt": False, "checkpoint": False}  # finished: nothing left
    assert "INFO dmad: log line 19" in panel.log_view.toPlainText()


def test_memory_scopes_are_separate_curves_and_the_total_is_a_line(qtbot, panel, tmp_path, open_and_wait):
    run = write_run(tmp_path, "mem", iters=range(1, 4), tail=_metric(4, mem_device_total_gb=80.0))
    open_and_wait(panel, run.path)
    qtbot.waitUntil(lambda: len(xs(panel, "mem_device_used_gb")) == 4, timeout=WAIT_MS)
    labels = panel.memory_plot.legend.labels()
    assert labels == [FRAMEWORK_PEAK, DEVICE_USED]
    _, peak = panel.memory_plot.curve("mem_peak_alloc_gb").getData()
    _, used = panel.memory_plot.curve("mem_device_used_gb").getData()
    assert list(used) == [3.0] * 4 and list(peak) == pytest.approx([1.51, 1.52, 1.53, 1.54])
    assert panel.memory_plot.total_line.isVisible() and panel.memory_plot.total_line.value() == 80.0


def test_step_time_marks_what_was_not_a_training_step(qtbot, panel, tmp_path, open_and_wait):
    # the engine times checkpoints, renders and sample-now as phase spans; a pause is paused -> resumed
    spans = (_event("phase", 4, phase="checkpoint") + _event("phase", 4, phase="training", after="checkpoint", took_s=2.04)
             + _event("phase", 4, phase="validation") + _event("phase", 4, phase="training", after="validation",
                                                                 took_s=5.6)
             + (make_event("paused", 6).to_line() + "\n").encode() + _event("phase", 7, phase="sample-now"))
    resumed = json.loads(make_event("resumed", 6).to_line())
    resumed["t"] += 20.0
    tail = spans + (json.dumps(resumed) + "\n").encode() + _event("phase", 7, phase="training", after="sample-now",
                                                                  took_s=3.0)
    run = write_run(tmp_path, "marks", iters=range(1, 9), tail=tail)
    open_and_wait(panel, run.path)
    qtbot.waitUntil(lambda: len(panel.step_plot.marks()) == 3, timeout=WAIT_MS)
    marks = panel.step_plot.marks()
    assert marks[4] == "checkpoint 2.0 s · validation 5.6 s" and marks[7] == "sample-now 3.0 s"
    assert marks[6].startswith("pause 2") and marks[6].endswith(" s")  # 20 s, give or take the events' own times
    _, steps = panel.step_plot.curve("step_time_s").getData()
    assert list(steps) == [0.25] * 8  # the steps alone; the marks are not points
    panel.step_plot.reset()
    assert panel.step_plot.marks() == {}


def test_smoothing_and_log_scale(qtbot, panel, tmp_path, open_and_wait):
    run = write_run(tmp_path, "smooth", iters=range(1, 31))
    open_and_wait(panel, run.path)
    qtbot.waitUntil(lambda: len(xs(panel, "loss_dm")) == 30, timeout=WAIT_MS)
    raw = 1.0 / np.arange(1, 31)
    panel.loss_plot.spin.setValue(0.9)
    assert panel.loss_plot.slider.value() == 900
    qtbot.waitUntil(lambda: panel.loss_plot.curve("loss_dm").getData()[1][-1] != raw[-1], timeout=WAIT_MS)
    _, y = panel.loss_plot.curve("loss_dm").getData()
    expect = [raw[0]]
    for v in raw[1:]:
        expect.append(0.9 * expect[-1] + 0.1 * v)
    assert list(y) == pytest.approx(expect)
    assert list(ema(raw, 0.9)) == pytest.approx(expect)
    panel.loss_plot.log_y.setChecked(True)
    assert panel.loss_plot.plot_named("generator").getPlotItem().ctrl.logYCheck.isChecked()


def test_reattach_continues_a_live_run_without_duplicates(qtbot, panel, tmp_path, open_and_wait):
    half = _metric(11)
    run = write_run(tmp_path, "live", state="running", tail=half[:25])  # the engine is mid-write
    open_and_wait(panel, run.path)
    qtbot.waitUntil(lambda: len(xs(panel, "loss_dm")) == 10, timeout=WAIT_MS)
    assert panel.run_state.state == "running" and panel.run_state.is_live()
    append(run, half[25:] + b"".join(_metric(i) for i in range(9, 21)))  # 9 and 10 again: a re-read overlap
    qtbot.waitUntil(lambda: len(xs(panel, "loss_dm")) == 20, timeout=WAIT_MS)
    assert xs(panel, "loss_dm") == list(range(1, 21))
    open_and_wait(panel, run.path)  # reopened (the app restarted): history again, nothing doubled
    qtbot.waitUntil(lambda: not panel.lifecycle.replaying, timeout=WAIT_MS)  # the whole history is read
    panel.feed.refresh()  # drawn now, not at the feed's next tick
    assert xs(panel, "loss_dm") == list(range(1, 21))
    status = json.loads(run.status_json.read_text())
    atomic_write_json(run.status_json, {**status, "state": "paused"})  # as the engine does: status, then event
    append(run, _event("paused", 20))
    qtbot.waitUntil(lambda: panel.run_state.state == "paused", timeout=WAIT_MS)
    append(run, _event("stopped", 20, last_checkpoint=20))  # the event alone ends the run here
    qtbot.waitUntil(lambda: panel.run_state.state == "stopped", timeout=WAIT_MS)
    qtbot.waitUntil(lambda: not panel.lifecycle.following, timeout=WAIT_MS)
    assert panel.run_state.state == "stopped" and not panel.run_state.is_live()


def test_resume_truncation_resets_the_plots(qtbot, panel, tmp_path, open_and_wait):
    run = write_run(tmp_path, "resumed", iters=range(1, 21), state="running",
                    tail=_event("stopped", 20, last_checkpoint=10))
    open_and_wait(panel, run.path)
    qtbot.waitUntil(lambda: len(xs(panel, "loss_dm")) == 20, timeout=WAIT_MS)
    assert panel.run_state.state == "running"  # status.json says running: the old "stopped" is history
    run.truncate_after(10)  # `dmad train --resume` from checkpoint 10
    append(run, _event("started", None, run_dir=str(run.path), resume_from="latest")
           + b"".join(_metric(i, scale=2.0) for i in range(11, 16)))
    qtbot.waitUntil(lambda: xs(panel, "loss_dm") == list(range(1, 16)), timeout=WAIT_MS)
    _, y = panel.loss_plot.curve("loss_dm").getData()
    assert y[9] == pytest.approx(1.0 / 10) and y[10] == pytest.approx(2.0 / 11)  # the new stretch
    assert panel.run_state.state == "running"


def test_a_dead_pid_with_status_running_shows_as_failed(qtbot, panel, tmp_path, open_and_wait):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    run = write_run(tmp_path, "killed", state="running", pid=gone.pid)
    open_and_wait(panel, run.path)
    qtbot.waitUntil(lambda: not panel.banner.isHidden(), timeout=WAIT_MS)
    assert panel.run_state.state == "failed" and not panel.run_state.is_live()
    text = panel.banner.text()
    assert f"pid {gone.pid}" in text and "killed or crashed" in text and "log line 19" in text
    assert not panel.buttons["stop"].isEnabled() and panel.buttons["start"].isEnabled()


def test_a_failed_run_reopened_shows_its_cause(qtbot, panel, tmp_path, open_and_wait):
    err = _event("error", 12, reason="loss_dm is NaN at iteration 12; the last good checkpoint is kept",
                 exit_code=1, last_checkpoint=10, term="loss_dm", cause="non_finite_loss")
    run = write_run(tmp_path, "nan", iters=range(1, 12), state="failed", tail=err,
                    failure_reason="loss_dm is NaN", exit_code=1)
    open_and_wait(panel, run.path)
    qtbot.waitUntil(lambda: not panel.banner.isHidden(), timeout=WAIT_MS)
    text = panel.banner.text()
    assert "exit code 1" in text and "NaN or infinite" in text and "iter_10" in text and "loss_dm is NaN" in text


def test_control_buttons_append_commands(qtbot, panel, tmp_path, open_and_wait):
    run = write_run(tmp_path, "ctl", state="running")
    open_and_wait(panel, run.path)
    qtbot.waitUntil(lambda: len(xs(panel, "loss_dm")) == 10, timeout=WAIT_MS)
    cmds = lambda: [json.loads(line)["cmd"] for line in run.control_jsonl.read_text().splitlines()]  # noqa: E731
    assert _enabled(panel) == {"start": False, "continue": False, "pause": True, "resume": False, "stop": True,
                               "sample": True, "sample_prompt": True, "checkpoint": True}
    qtbot.mouseClick(panel.buttons["pause"], Qt.LeftButton)
    assert cmds() == ["pause"] and not panel.buttons["pause"].isEnabled()  # until the engine confirms
    append(run, _event("paused", 10))
    qtbot.waitUntil(lambda: panel.buttons["resume"].isEnabled(), timeout=WAIT_MS)
    qtbot.mouseClick(panel.buttons["resume"], Qt.LeftButton)
    qtbot.mouseClick(panel.buttons["sample"], Qt.LeftButton)
    qtbot.mouseClick(panel.buttons["checkpoint"], Qt.LeftButton)
    qtbot.mouseClick(panel.buttons["stop"], Qt.LeftButton)
    assert cmds() == ["pause", "resume", "sample_now", "checkpoint_now", "stop"]
    assert panel.run_state.state == "stopping" and not panel.buttons["stop"].isEnabled()


def test_start_can_be_disabled_with_a_reason(qtbot, panel):
    assert panel.buttons["start"].isEnabled()
    panel.set_start_enabled(False, "optimization.max_train_steps: Input should be >= 1")
    assert not panel.buttons["start"].isEnabled()
    assert panel.buttons["start"].toolTip() == "optimization.max_train_steps: Input should be >= 1"
    panel.set_start_enabled(True)
    with qtbot.waitSignal(panel.start_requested, timeout=WAIT_MS):
        qtbot.mouseClick(panel.buttons["start"], Qt.LeftButton)


ENGINE = textwrap.dedent(r'''
    import json, sys, time
    from pathlib import Path
    from dmad.contract.events import make_event

    scenario, argv = sys.argv[1], sys.argv[2:]
    key, _, value = argv[argv.index("--set") + 1].partition("=")
    assert key == "identity.output_dir"
    run = Path(json.loads(value)) / "engine-run"  # the panel passes the runs root as a JSON string
    run.mkdir(parents=True)

    def emit(kind, it=None, **data):
        line = make_event(kind, it, **data).to_line() + "\n"
        with open(run / "events.jsonl", "a") as f:
            f.write(line)
        sys.stdout.write(line)
        sys.stdout.flush()

    emit("started", None, run_dir=str(run), max_train_steps=100)
    for i in range(1, 6):
        print(f"INFO dmad: step {i}", file=sys.stderr, flush=True)
        emit("metric", i, loss_dm=1.0 / i, step_time_s=0.5, max_train_steps=100, eta_s=50.0)
    if scenario == "crash":
        emit("error", 5, reason="out of memory during first-forward: CUDA out of memory. Tried to allocate 2.00 GiB",
             exit_code=3, last_checkpoint=None, cause="out_of_memory", phase="first-forward")
        print("dmad: error: out of memory during first-forward", file=sys.stderr, flush=True)
        sys.exit(3)
    while not ((run / "control.jsonl").exists() and "stop" in (run / "control.jsonl").read_text()):
        time.sleep(0.05)
    emit("stopped", 5, last_checkpoint=5)
''')


@pytest.fixture
def engine_panel(qtbot, tmp_path):
    script = tmp_path / "engine.py"
    script.write_text(ENGINE, encoding="utf-8")

    def make(scenario: str) -> TrainingPanel:
        p = TrainingPanel(engine_command=[sys.executable, str(script), scenario])
        qtbot.addWidget(p)
        return p
    return make


def test_own_run_plots_stdout_events_and_stops_gracefully(qtbot, engine_panel, tmp_path):
    panel = engine_panel("ok")
    states = []
    panel.run_state_changed.connect(states.append)
    assert panel.start(tmp_path / "config.json", tmp_path / "runs")
    qtbot.waitUntil(lambda: len(xs(panel, "loss_dm")) == 5, timeout=WAIT_MS)
    assert panel.run_state.run_dir == tmp_path / "runs" / "engine-run"
    assert panel.run_state.state == "running" and not panel.buttons["start"].isEnabled()
    assert "INFO dmad: step 5" in panel.log_view.toPlainText()
    qtbot.mouseClick(panel.buttons["stop"], Qt.LeftButton)
    qtbot.waitUntil(lambda: panel.run_state.state == "stopped", timeout=WAIT_MS)
    assert states == ["starting", "running", "stopping", "stopped"]
    assert panel.banner.isHidden() and panel.buttons["start"].isEnabled()
    run = panel.run_state  # what the window and the Runs panel read
    assert (run.state, run.run_dir, run.iteration) == ("stopped", tmp_path / "runs" / "engine-run", 5)
    qtbot.waitUntil(lambda: run.exit_code == 0, timeout=WAIT_MS)


def test_crashed_engine_shows_the_banner_with_cause_and_exit_code(qtbot, engine_panel, tmp_path):
    panel = engine_panel("crash")
    panel.start(tmp_path / "config.json", tmp_path / "runs")
    qtbot.waitUntil(lambda: panel.run_state.state == "failed" and not panel.engine.is_running(), timeout=WAIT_MS)
    qtbot.waitUntil(lambda: "exit code 3" in panel.banner.text(), timeout=WAIT_MS)
    text = panel.banner.text()
    assert not panel.banner.isHidden()
    assert "out of memory during first-forward: CUDA out of memory" in text
    assert "Cause: out of memory during first-forward" in text
    assert "INFO dmad: step 5" in text and "dmad: error: out of memory during first-forward" in text
    assert len(xs(panel, "loss_dm")) == 5
    run = panel.run_state
    assert (run.state, run.exit_code) == ("failed", 3) and run.message.startswith("out of memory during first-forward")


def test_memory_sampler_events_are_not_iterations(qtbot, panel, tmp_path, open_and_wait):
    """The engine's memory sampler emits metric events (source "sampler", every few seconds):
    they neither move the iteration nor add points to the iteration curves."""
    sampler = _event("metric", 10, source="sampler", scope="device_nvml", mem_used_gb=30.0, mem_total_gb=80.0,
                     utilization_pct=97.0)
    run = write_run(tmp_path, "sampled", tail=sampler + _event("finished", 10, elapsed_s=65.0))
    open_and_wait(panel, run.path)
    qtbot.waitUntil(lambda: len(xs(panel, "loss_dm")) == 10, timeout=WAIT_MS)
    qtbot.waitUntil(lambda: panel.run_state.state == "finished", timeout=WAIT_MS)
    assert panel.numbers.rate_label.text() == "4.00 it/s"  # from the last iteration row, not the sampler's
    assert "mem_used_gb" not in panel.store._series and len(xs(panel, "mem_device_used_gb")) == 10
