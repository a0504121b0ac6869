"""A Stop that takes long (Stop now, then Kill), "Sample prompt…" and its one-off image, the smoothed
ETA. The engine is a small script that behaves like it in each situation: an iteration that never
ends (only stop_now reaches it), an engine that reads nothing (only a kill ends it), an engine that
renders a one-off prompt. No torch."""
from __future__ import annotations

import dataclasses
import json
import os
import random
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QDialogButtonBox, QMessageBox

from app.dialogs.one_off_view import OneOffViewer
from app.dialogs.sample_prompt import SamplePromptDialog
from app.models.eta import EtaSmoother
from app.models.lifecycle import KILLED
from app.models.stopping import KILL_AFTER_S, StopEscalation
from app.panels.training import TrainingPanel
from dmad.contract.events import make_event
from dmad.contract.runs import RunFolder, atomic_write_json, pid_alive

WAIT_MS = 30_000  # generous: the machine is shared; nothing here is a timing test
PNG = next((Path(__file__).parent / "fixtures" / "demo_run" / "samples" / "teacher").glob("*.png"))

ENGINE = textwrap.dedent(r'''
    import json, os, shutil, socket, subprocess, sys, time
    from pathlib import Path
    from dmad.contract.events import make_event
    from dmad.contract.runs import RunFolder, atomic_write_json

    scenario, png, argv = sys.argv[1], sys.argv[2], sys.argv[3:]
    if scenario == "quiet":  # torch and diffusers still importing: nothing said, no folder yet
        time.sleep(600)
    key, _, value = argv[argv.index("--set") + 1].partition("=")
    run = RunFolder.create(Path(json.loads(value)) / "engine-run")

    def emit(kind, it=None, **data):
        line = make_event(kind, it, **data).to_line() + "\n"
        with open(run.events_jsonl, "a") as f:
            f.write(line)
        sys.stdout.write(line)
        sys.stdout.flush()

    def status(state, **more):
        atomic_write_json(run.status_json, {"state": state, "pid": os.getpid(), "host": socket.gethostname(),
                                            "heartbeat": time.time(), "iter": 5, "last_checkpoint": 3, **more})

    def commands():
        text = run.control_jsonl.read_text() if run.control_jsonl.exists() else ""
        return [json.loads(line) for line in text.splitlines()]

    # a worker of the engine's own (a data loader, an accelerate rank): a kill must end it too
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    (run.path / "child.pid").write_text(str(child.pid))
    status("running")
    emit("started", None, run_dir=str(run.path), max_train_steps=100)
    emit("checkpoint", 3, path=str(run.path / "checkpoints" / "iter_3"))
    for i in range(1, 6):
        emit("metric", i, loss_dm=1.0 / i, step_time_s=0.5, max_train_steps=100, eta_s=50.0)
    rendered = 0
    while True:
        cmds = commands()
        names = [c["cmd"] for c in cmds]
        if scenario == "slow" and "stop_now" in names:  # the iteration ends; no checkpoint is written
            status("stopped")
            emit("stopped", 5, last_checkpoint=3, checkpoint_saved=False)
            child.kill()
            sys.exit(0)
        if scenario == "oneoff":
            one_offs = [c for c in cmds if c["cmd"] == "sample_now" and "prompt" in c]
            for k, c in enumerate(one_offs[rendered:], start=rendered + 1):
                out = run.path / "samples" / "oneoff" / f"iter_5-{k}.png"
                out.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(png, out)
                out.with_suffix(".json").write_text(json.dumps({"prompt": c["prompt"], "seed": c.get("seed")}))
                emit("samples", 5, folder=str(out.parent), paths=[str(out)], model="student", one_off=True,
                     prompt=c["prompt"], seed=c.get("seed"))
            rendered = len(one_offs)
            if "stop" in names:
                status("stopped")
                emit("stopped", 5, last_checkpoint=5, checkpoint_saved=True)
                child.kill()
                sys.exit(0)
        time.sleep(0.05)  # "hung" reads nothing: only a kill ends it
''')


@pytest.fixture
def engine_panel(qtbot, tmp_path):
    script = tmp_path / "engine.py"
    script.write_text(ENGINE, encoding="utf-8")
    panels = []

    def make(scenario: str) -> TrainingPanel:
        p = TrainingPanel(engine_command=[sys.executable, str(script), scenario, str(PNG)])
        qtbot.addWidget(p)
        panels.append(p)
        return p
    yield make
    for p in panels:  # never leave an engine (and its sleeping child) behind a failed test
        p.engine.kill()
        qtbot.waitUntil(lambda: not p.engine.is_running(), timeout=WAIT_MS)
        p._clear()


def _answer(monkeypatch, button) -> list[str]:
    """QMessageBox.exec answers `button`; returns what each box said."""
    asked = []

    def exec_(box):
        asked.append(box.text() + "\n" + box.informativeText())
        return button
    monkeypatch.setattr(QMessageBox, "exec", exec_)
    return asked


def _start_running(qtbot, panel: TrainingPanel, tmp_path: Path) -> Path:
    assert panel.start(tmp_path / "config.json", tmp_path / "runs")
    qtbot.waitUntil(lambda: panel.run_state.state == "running" and panel.run_state.iteration == 5, timeout=WAIT_MS)
    return tmp_path / "runs" / "engine-run"


def _controls(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "control.jsonl").read_text().splitlines()]


# ---------------------------------------------------------------- stopping

def test_stop_is_offered_the_moment_the_engine_starts(qtbot, engine_panel, tmp_path):
    # before its first word (imports take 8-10 s on a real start) Stop already reaches the engine: SIGTERM
    panel = engine_panel("quiet")
    assert panel.start(tmp_path / "config.json", tmp_path / "runs")
    assert panel.run_state.state == "starting" and panel.engine.is_running()
    assert panel.buttons["stop"].isEnabled()
    qtbot.mouseClick(panel.buttons["stop"], Qt.LeftButton)
    qtbot.waitUntil(lambda: not panel.engine.is_running(), timeout=WAIT_MS)
    assert not (tmp_path / "runs" / "engine-run").exists()


def test_a_slow_stop_offers_stop_now_which_stops_without_a_checkpoint(qtbot, engine_panel, tmp_path):
    panel = engine_panel("slow")
    panel.show()
    run = _start_running(qtbot, panel, tmp_path)
    assert panel.stop_bar.isHidden()
    qtbot.mouseClick(panel.buttons["stop"], Qt.LeftButton)
    assert panel.run_state.state == "stopping" and panel.state_label.text().startswith("stopping")
    bar = panel.stop_bar
    assert bar.isVisible() and bar.stop_now_button.isEnabled() and not bar.kill_button.isEnabled()
    assert "WITHOUT saving a checkpoint" in bar.stop_now_button.toolTip()
    assert "since checkpoint iter_3 are lost" in bar.stop_now_button.toolTip()
    assert "saves a checkpoint at the next iteration boundary" in bar.line.full_text()
    qtbot.mouseClick(bar.stop_now_button, Qt.LeftButton)
    assert [c["cmd"] for c in _controls(run)] == ["stop", "stop_now"]
    assert not bar.stop_now_button.isEnabled() and bar.kill_button.isEnabled()  # the next step is offered at once
    assert "lost" in bar.kill_button.toolTip()
    qtbot.waitUntil(lambda: panel.run_state.state == "stopped" and not panel.engine.is_running(), timeout=WAIT_MS)
    assert panel.note_label.text() == "stopped at iteration 5 without a checkpoint (the newest is iter_3)"
    assert bar.isHidden() and panel.banner.isHidden()


def test_kill_ends_an_engine_that_reads_nothing_and_its_workers_after_a_confirmation(qtbot, engine_panel,
                                                                                     tmp_path, monkeypatch):
    panel = engine_panel("hung")
    panel.show()
    run = _start_running(qtbot, panel, tmp_path)
    child = int((run / "child.pid").read_text())
    qtbot.mouseClick(panel.buttons["stop"], Qt.LeftButton)
    qtbot.mouseClick(panel.stop_bar.stop_now_button, Qt.LeftButton)
    asked = _answer(monkeypatch, QMessageBox.StandardButton.Cancel)
    qtbot.mouseClick(panel.stop_bar.kill_button, Qt.LeftButton)
    assert len(asked) == 1 and "keeps checkpoint iter_3; everything after it is lost" in asked[0]
    assert panel.engine.is_running() and panel.run_state.state == "stopping"  # cancelled: nothing happened
    asked = _answer(monkeypatch, QMessageBox.StandardButton.Yes)
    qtbot.mouseClick(panel.stop_bar.kill_button, Qt.LeftButton)
    qtbot.waitUntil(lambda: panel.run_state.state == "failed", timeout=WAIT_MS)
    assert not panel.engine.is_running() and panel.run_state.message == KILLED
    assert "killed from the app while stopping" in panel.banner.text()
    qtbot.waitUntil(lambda: not pid_alive(child), timeout=WAIT_MS)  # the whole process group went


def test_kill_is_offered_after_a_while_without_stop_now():
    stopping = StopEscalation()
    stopping.requested(1000.0)
    early = stopping.offer(True, 1005.0, has_run_dir=True, kill_problem="", checkpoint=7)
    late = stopping.offer(True, 1000.0 + KILL_AFTER_S, has_run_dir=True, kill_problem="", checkpoint=7)
    assert (early.stop_now, early.kill) == (True, False) and (late.stop_now, late.kill) == (True, True)
    assert "since checkpoint iter_7" in late.kill_tip
    remote = stopping.offer(True, 2000.0, has_run_dir=True, kill_problem="the engine runs on gpu-7", checkpoint=7)
    assert not remote.kill and remote.kill_tip == "the engine runs on gpu-7"
    nothing_yet = StopEscalation().offer(True, 0.0, has_run_dir=False, kill_problem="", checkpoint=None)
    assert nothing_yet.kill and not nothing_yet.stop_now  # before a run folder there is nothing to lose
    assert not StopEscalation().offer(False, 0.0, True, "", None).visible
    loading = StopEscalation().offer(True, 0.0, has_run_dir=True, kill_problem="", checkpoint=None, iteration=None)
    assert loading.line.startswith("Stopping before the first iteration: there is nothing to save yet")
    assert "saves a checkpoint" in stopping.offer(True, 1005.0, True, "", 7, iteration=12).line


REATTACHED = textwrap.dedent(r'''
    import os, socket, sys, time
    from pathlib import Path
    from dmad.contract.runs import atomic_write_json
    run = Path(sys.argv[1])
    while True:  # an engine from an earlier app session, stuck: it beats but never reads control.jsonl
        atomic_write_json(run / "status.json", {"state": "running", "pid": os.getpid(), "host": socket.gethostname(),
                                                "heartbeat": time.time(), "iter": 20, "last_checkpoint": 10})
        time.sleep(0.5)
''')


def test_a_reattached_run_stays_stopping_and_can_be_killed_by_its_pid(qtbot, tmp_path, monkeypatch, open_and_wait):
    run = RunFolder.create(tmp_path / "stuck")
    atomic_write_json(run.config_json, {"config_version": 1})
    run.events_jsonl.write_text(make_event("started", None, run_dir=str(run.path)).to_line() + "\n")
    script = tmp_path / "stuck.py"
    script.write_text(REATTACHED, encoding="utf-8")
    engine = subprocess.Popen([sys.executable, str(script), str(run.path)], start_new_session=True)
    try:
        qtbot.waitUntil(lambda: run.status_json.exists(), timeout=WAIT_MS)
        panel = TrainingPanel()
        qtbot.addWidget(panel)
        open_and_wait(panel, run.path)
        assert panel.run_state.state == "running"
        qtbot.mouseClick(panel.buttons["stop"], Qt.LeftButton)
        with qtbot.waitSignal(panel.source.status_reads.done, timeout=WAIT_MS):
            panel.source.poll()  # status.json still says running: the Stop is not undone
        assert panel.run_state.state == "stopping" and panel.lifecycle.status["state"] == "running"
        qtbot.mouseClick(panel.stop_bar.stop_now_button, Qt.LeftButton)
        assert [c["cmd"] for c in _controls(run.path)] == ["stop", "stop_now"]
        _answer(monkeypatch, QMessageBox.StandardButton.Yes)
        qtbot.mouseClick(panel.stop_bar.kill_button, Qt.LeftButton)
        assert engine.wait(timeout=30) == -signal.SIGKILL
        qtbot.waitUntil(lambda: panel.run_state.state == "failed", timeout=WAIT_MS)
        assert "killed from the app while stopping" in panel.banner.text()
        panel._clear()
    finally:
        if engine.poll() is None:
            engine.kill()


# ---------------------------------------------------------------- Sample prompt…

def _fill_prompt_dialog(qtbot, panel: TrainingPanel, prompt: str, seed: str | None) -> SamplePromptDialog:
    qtbot.mouseClick(panel.buttons["sample_prompt"], Qt.LeftButton)
    dialog = panel.findChild(SamplePromptDialog)
    assert dialog is not None and dialog.isVisible()
    dialog.prompt.setText(prompt)
    if seed is not None:
        dialog.use_seed.setChecked(True)
        dialog.seed.setText(seed)
    return dialog


def test_sample_prompt_sends_the_prompt_and_shows_the_one_off_image(qtbot, engine_panel, tmp_path):
    panel = engine_panel("oneoff")
    panel.show()
    run = _start_running(qtbot, panel, tmp_path)
    assert panel.buttons["sample_prompt"].isEnabled()
    dialog = _fill_prompt_dialog(qtbot, panel, "", None)
    ok = dialog.buttons.button(QDialogButtonBox.StandardButton.Ok)
    assert ok.text() == "Render"
    qtbot.mouseClick(ok, Qt.LeftButton)  # no prompt: refused, in the engine's words
    assert dialog.isVisible() and dialog.problem.full_text() == "sample_now: the prompt must be non-empty text"
    dialog.prompt.setText("a small blue square")
    dialog.use_seed.setChecked(True)
    dialog.seed.setText("7")
    qtbot.mouseClick(ok, Qt.LeftButton)
    assert _controls(run)[-1] | {"t": 0} == {"cmd": "sample_now", "prompt": "a small blue square", "seed": 7, "t": 0}
    qtbot.waitUntil(lambda: panel.findChild(OneOffViewer) is not None, timeout=WAIT_MS)
    viewer = panel.findChild(OneOffViewer)
    qtbot.waitUntil(viewer.has_image, timeout=WAIT_MS)
    assert viewer.isVisible() and viewer.shown_path() == run / "samples" / "oneoff" / "iter_5-1.png"
    assert viewer.caption.full_text() == "\u201ca small blue square\u201d - seed 7, iteration 5"
    assert viewer.image.pixmap().width() >= 256  # a 64 px image is enlarged, not a speck
    assert "sampling requested" not in panel.state_label.text()  # the engine answered
    qtbot.mouseClick(panel.buttons["stop"], Qt.LeftButton)
    qtbot.waitUntil(lambda: panel.run_state.state == "stopped" and not panel.engine.is_running(), timeout=WAIT_MS)


def test_a_one_off_in_the_replayed_history_opens_nothing(qtbot, tmp_path, open_and_wait):
    run = RunFolder.create(tmp_path / "old")
    atomic_write_json(run.config_json, {"config_version": 1})
    lines = [make_event("started", None, run_dir=str(run.path)), make_event("samples", 5, folder="x", paths=[str(PNG)],
                                                                           one_off=True, prompt="p", seed=None),
             make_event("finished", 5)]
    run.events_jsonl.write_text("".join(ev.to_line() + "\n" for ev in lines))
    atomic_write_json(run.status_json, {"state": "finished"})
    panel = TrainingPanel()
    qtbot.addWidget(panel)
    open_and_wait(panel, run.path)
    qtbot.waitUntil(lambda: not panel.lifecycle.following, timeout=WAIT_MS)
    assert panel.findChild(OneOffViewer) is None


# ---------------------------------------------------------------- ETA

def _steady_events(seed: int, stall_every: int = 0, stall_s: float = 0.0):
    """(t, iter) of metric events every 10 iterations at ~1 s per iteration (+-20 % per window), with a
    stall (a checkpoint save, a sample render) of `stall_s` every `stall_every` iterations."""
    rng, t = random.Random(seed), 1.7e9
    for it in range(10, 2001, 10):
        t += 10 * rng.uniform(0.8, 1.2) + (stall_s if stall_every and it % stall_every == 0 else 0.0)
        yield t, it


@pytest.mark.parametrize("stall_every, stall_s", [(0, 0.0), (100, 15.0)])
def test_the_eta_stays_within_ten_percent_under_steady_step_times(stall_every, stall_s):
    eta = EtaSmoother()
    pace = 1.0 + (stall_s / stall_every if stall_every else 0.0)  # what each iteration really costs, saves included
    for t, it in _steady_events(1, stall_every, stall_s):
        eta.add(t, it, step_time_s=1.0, max_steps=2000)
        if (400 if stall_every else 200) <= it <= 1800:  # once a few stalls are in; near the end seconds are a lot
            true_left = (2000 - it) * pace
            assert eta.eta(now=t) == pytest.approx(true_left, rel=0.10), it


def test_the_eta_counts_down_between_events_and_not_while_paused():
    eta = EtaSmoother()
    for t, it in ((0.0, 10), (10.0, 20), (20.0, 30)):
        eta.add(t, it, max_steps=100)
    assert eta.eta(now=20.0) == pytest.approx(70.0)
    assert eta.eta(now=25.0) == pytest.approx(65.0)
    eta.hold(25.0)
    assert eta.eta(now=500.0) == pytest.approx(65.0)  # paused: the clock stops
    eta.release(500.0)
    assert eta.eta(now=505.0) == pytest.approx(60.0)
    eta.add(510.0, 40)  # the gap across the pause is no pace
    assert eta.seconds_per_iter() == pytest.approx(1.0)


def test_the_training_panel_shows_the_smoothed_eta_not_the_engines_jumps(qtbot, tmp_path, open_and_wait):
    """The engine's eta_s jumps between 4 and 22 minutes (a window that held a save); the pace does not."""
    run = RunFolder.create(tmp_path / "live")
    atomic_write_json(run.config_json, {"config_version": 1})
    now = time.time()
    events = [make_event("started", None, run_dir=str(run.path), max_train_steps=1000)]
    events += [make_event("metric", it, loss_dm=1.0, step_time_s=1.0, max_train_steps=1000,
                          eta_s=240.0 if (it // 10) % 2 else 1320.0) for it in range(10, 401, 10)]
    # 10 s per 10 iterations, the last one now: the 600 iterations left are 10 minutes
    events = [dataclasses.replace(ev, t=now - 400 + 10 * i) for i, ev in enumerate(events)]
    run.events_jsonl.write_text("".join(ev.to_line() + "\n" for ev in events))
    atomic_write_json(run.status_json, {"state": "running", "pid": os.getpid(), "host": socket.gethostname(),
                                        "heartbeat": time.time(), "iter": 400})
    panel = TrainingPanel()
    qtbot.addWidget(panel)
    open_and_wait(panel, run.path)
    qtbot.waitUntil(lambda: panel.run_state.iteration == 400, timeout=WAIT_MS)
    shown = panel.eta.eta(now=events[-1].t)
    assert shown == pytest.approx(600.0, rel=0.05)
    assert panel.numbers.eta_label.text() in {f"ETA 0:{m:02d}:{s:02d}" for m in (9, 10) for s in range(60)}
    panel._clear()
