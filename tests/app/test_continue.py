"""Continue: `dmad train --config <run>/config.json --run-dir <run> --resume latest` on a run that is not
live, from the Training panel and from the Runs panel. The engine is a small script that behaves
like it (cuts events.jsonl back to its checkpoint, refuses a folder in use, honours Stop while
loading) and records the arguments it was given. No torch."""
from __future__ import annotations

import json
import os
import socket
import sys
import textwrap
import time
from pathlib import Path

import pytest
from PySide6.QtCore import QSettings, Qt

from app.engine.process import failure_report
from app.models.resume import START_AGAIN_TIP
from app.panels.runs import RunsPanel
from app.panels.training import TrainingPanel
from app.window import MainWindow
from dmad.contract.events import make_event
from dmad.contract.runs import RunFolder, atomic_write_json

WAIT_MS = 30_000  # generous: the machine is shared; nothing here is a timing test
IN_USE = ("dmad: error: run folder {run} is in use by engine pid 4242 on this machine (heartbeat 2 s ago): "
          "one engine writes a run folder at a time")


def _event(kind: str, it=None, **data) -> bytes:
    return (make_event(kind, it, **data).to_line() + "\n").encode("utf-8")


def _metric(it: int, scale: float = 1.0) -> bytes:
    return _event("metric", it, loss_dm=scale / it, loss_g=0.5, step_time_s=0.25, max_train_steps=100, eta_s=10.0)


def write_run(root: Path, name: str, state: str, iters=range(1, 21), checkpoint: int | None = None,
              status_checkpoint: int | None = None) -> RunFolder:
    """A run the engine left in `state` ("created": no status.json) with checkpoints/iter_<checkpoint>
    on disk when given; `status_checkpoint` is what status.json claims (it may disagree with the disk)."""
    run = RunFolder.create(root / name)
    atomic_write_json(run.config_json, {"config_version": 1})
    lines = [_event("started", None, run_dir=str(run.path), max_train_steps=100), _event("phase", 0, phase="training")]
    lines += [_metric(i) for i in iters]
    if state == "stopped":
        lines.append(_event("stopped", iters[-1] if iters else None, last_checkpoint=checkpoint))
    run.events_jsonl.write_bytes(b"".join(lines))
    if checkpoint is not None:
        run.checkpoint_path(checkpoint).mkdir(parents=True)
        atomic_write_json(run.latest_json, {"iter": checkpoint, "path": f"iter_{checkpoint}"})
    if state != "created":
        atomic_write_json(run.status_json, {"state": state, "pid": os.getpid(), "host": socket.gethostname(),
                                            "heartbeat": time.time(), "last_checkpoint": status_checkpoint})
    return run


ENGINE = textwrap.dedent(r'''
    import json, sys, time
    from pathlib import Path
    from dmad.contract.events import make_event
    from dmad.contract.runs import RunFolder, atomic_write_json

    scenario, record, argv = sys.argv[1], Path(sys.argv[2]), sys.argv[3:]
    record.write_text(json.dumps(argv))
    run = RunFolder(Path(argv[argv.index("--run-dir") + 1]))
    if scenario == "refuse":
        print("''' + IN_USE + r'''".format(run=run.path), file=sys.stderr, flush=True)
        sys.exit(2)
    stops_before = run.control_jsonl.read_text().count('"stop"') if run.control_jsonl.exists() else 0

    def emit(kind, it=None, **data):
        line = make_event(kind, it, **data).to_line() + "\n"
        with open(run.events_jsonl, "a") as f:
            f.write(line)
        sys.stdout.write(line)
        sys.stdout.flush()

    def wait_for_stop():
        while not (run.control_jsonl.exists() and run.control_jsonl.read_text().count('"stop"') > stops_before):
            time.sleep(0.05)

    latest = run.latest_checkpoint()
    if latest is not None:
        run.truncate_after(latest[0])  # as the engine's resume does: an atomic replace of events.jsonl
    atomic_write_json(run.status_json, {"state": "running", "pid": __import__("os").getpid()})
    emit("started", None, run_dir=str(run.path), resume_from="latest", max_train_steps=100)
    if scenario == "loading":  # Stop pressed while the teacher is still loading: no iteration ran
        emit("phase", None, phase="loading", device="cpu")
        wait_for_stop()
        atomic_write_json(run.status_json, {"state": "stopped", "iter": 0, "last_checkpoint": None})
        emit("stopped", 0, last_checkpoint=None)  # as the engine does: iteration 0, nothing saved
        sys.exit(0)
    first = latest[0] + 1
    for i in range(first, first + 5):
        emit("metric", i, loss_dm=2.0 / i, loss_g=0.5, step_time_s=0.25, max_train_steps=100, eta_s=10.0)
    wait_for_stop()
    run.checkpoint_path(first + 4).mkdir()
    atomic_write_json(run.latest_json, {"iter": first + 4, "path": f"iter_{first + 4}"})
    atomic_write_json(run.status_json, {"state": "stopped", "last_checkpoint": first + 4})
    emit("stopped", first + 4, last_checkpoint=first + 4)
''')


@pytest.fixture
def fake_engine(tmp_path):
    """(scenario) -> the engine command; the arguments it got land in tmp_path/argv.json."""
    script = tmp_path / "engine.py"
    script.write_text(ENGINE, encoding="utf-8")
    return lambda scenario: [sys.executable, str(script), scenario, str(tmp_path / "argv.json")]


@pytest.fixture
def make_panel(qtbot, fake_engine):
    def make(scenario: str = "resume") -> TrainingPanel:
        p = TrainingPanel(engine_command=fake_engine(scenario))
        qtbot.addWidget(p)
        return p
    return make


def xs(panel: TrainingPanel, key: str = "loss_dm") -> list[float]:
    curve = panel.loss_plot.curve(key)
    x, _ = curve.getData() if curve is not None else (None, None)
    return [] if x is None else list(x)


def continue_button(panel: TrainingPanel):
    return panel.buttons["continue"]


def wait_idle(qtbot, panel: TrainingPanel) -> None:
    qtbot.waitUntil(lambda: not panel.engine.is_running(), timeout=WAIT_MS)
    qtbot.waitUntil(lambda: not panel.lifecycle.following, timeout=WAIT_MS)


# ---------------------------------------------------------------- what the button offers

@pytest.mark.parametrize("state, offered", [("stopped", True), ("failed", True), ("created", True),
                                            ("running", False), ("paused", False), ("stopping", False),
                                            ("finished", False)])
def test_continue_is_offered_only_for_a_run_that_is_not_live_nor_finished(qtbot, make_panel, tmp_path, state,
                                                                          offered, open_and_wait):
    panel = make_panel()
    assert not continue_button(panel).isEnabled()  # nothing shown
    run = write_run(tmp_path, "r", state, checkpoint=10)
    open_and_wait(panel, run.path)
    qtbot.waitUntil(lambda: len(xs(panel)) == 20, timeout=WAIT_MS)
    if offered:
        qtbot.waitUntil(lambda: continue_button(panel).text() == "Continue from iteration 10", timeout=WAIT_MS)
    assert continue_button(panel).isEnabled() is offered
    panel._clear()  # a live run's follower and status poll


def test_the_label_says_start_again_when_no_checkpoint_is_on_disk(qtbot, make_panel, tmp_path, open_and_wait):
    # status.json names checkpoint 10 but its folder is gone: `--resume latest` would start again
    run = write_run(tmp_path, "gone", "failed", status_checkpoint=10)
    panel = make_panel()
    open_and_wait(panel, run.path)
    qtbot.waitUntil(lambda: continue_button(panel).text() == "Start again", timeout=WAIT_MS)
    assert continue_button(panel).isEnabled() and continue_button(panel).toolTip() == START_AGAIN_TIP
    with_checkpoint = write_run(tmp_path, "kept", "failed", checkpoint=20)
    open_and_wait(panel, with_checkpoint.path)
    qtbot.waitUntil(lambda: continue_button(panel).text() == "Continue from iteration 20", timeout=WAIT_MS)
    assert "checkpoints/iter_20" in continue_button(panel).toolTip()


# ---------------------------------------------------------------- continuing

def test_continue_resumes_latest_in_the_run_folder_and_follows_the_cut_back_history(qtbot, make_panel, tmp_path, open_and_wait):
    run = write_run(tmp_path, "r", "stopped", checkpoint=10)
    panel = make_panel("resume")
    panel.processes.setValue(2)
    open_and_wait(panel, run.path)
    qtbot.waitUntil(lambda: continue_button(panel).text() == "Continue from iteration 10", timeout=WAIT_MS)
    states = []
    panel.run_state_changed.connect(states.append)
    qtbot.mouseClick(continue_button(panel), Qt.LeftButton)
    # the old iterations 11..20 are cut back; the continued run writes 11..15 (twice the loss)
    qtbot.waitUntil(lambda: xs(panel) == list(range(1, 16)), timeout=WAIT_MS)
    argv = json.loads((tmp_path / "argv.json").read_text())
    assert argv == ["train", "--config", str(run.path / "config.json"), "--num-processes", "2",
                    "--run-dir", str(run.path.resolve()), "--resume", "latest"]
    _, y = panel.loss_plot.curve("loss_dm").getData()
    assert y[9] == pytest.approx(1.0 / 10) and y[10] == pytest.approx(2.0 / 11)
    # the replayed old "stopped" is history
    assert panel.run_state.state == "running" and panel.run_state.run_dir == run.path
    assert not continue_button(panel).isEnabled() and panel.buttons["stop"].isEnabled()
    qtbot.mouseClick(panel.buttons["stop"], Qt.LeftButton)
    qtbot.waitUntil(lambda: panel.run_state.state == "stopped", timeout=WAIT_MS)
    wait_idle(qtbot, panel)
    assert states == ["starting", "running", "stopping", "stopped"] and panel.run_state.exit_code == 0
    assert panel.note_label.text() == "stopped at iteration 15 (checkpoint iter_15)"
    qtbot.waitUntil(lambda: continue_button(panel).text() == "Continue from iteration 15", timeout=WAIT_MS)
    assert continue_button(panel).isEnabled()


def test_a_refused_continue_shows_the_engines_one_line_and_the_run_as_it_is(qtbot, make_panel, tmp_path, open_and_wait):
    run = write_run(tmp_path, "busy", "stopped", checkpoint=10)
    panel = make_panel("refuse")
    open_and_wait(panel, run.path)
    qtbot.waitUntil(lambda: len(xs(panel)) == 20, timeout=WAIT_MS)
    assert panel.continue_run()
    qtbot.waitUntil(lambda: not panel.banner.isHidden(), timeout=WAIT_MS)
    wait_idle(qtbot, panel)
    line = IN_USE.format(run=run.path.resolve())
    assert panel.banner.text() == f"<b>Could not continue busy - exit code 2 (invalid input)</b><br>{line}"
    # as status.json says: the run is untouched
    assert panel.run_state.state == "stopped" and not panel.run_state.is_live()
    qtbot.waitUntil(lambda: len(xs(panel)) == 20, timeout=WAIT_MS)
    qtbot.waitUntil(lambda: continue_button(panel).text() == "Continue from iteration 10", timeout=WAIT_MS)
    assert continue_button(panel).isEnabled()


def test_stop_while_loading_ends_stopped_and_offers_start_again(qtbot, make_panel, tmp_path, open_and_wait):
    run = write_run(tmp_path, "early", "failed", iters=range(0))  # failed before its first checkpoint
    panel = make_panel("loading")
    open_and_wait(panel, run.path)
    qtbot.waitUntil(lambda: continue_button(panel).text() == "Start again", timeout=WAIT_MS)
    qtbot.mouseClick(continue_button(panel), Qt.LeftButton)
    qtbot.waitUntil(lambda: panel.run_state.state == "running" and panel.buttons["stop"].isEnabled(), timeout=WAIT_MS)
    qtbot.waitUntil(lambda: panel.state_label.text() == "running - loading", timeout=WAIT_MS)  # what it is doing
    qtbot.mouseClick(panel.buttons["stop"], Qt.LeftButton)
    qtbot.waitUntil(lambda: panel.run_state.state != "stopping", timeout=WAIT_MS)
    wait_idle(qtbot, panel)
    assert panel.run_state.state == "stopped" and panel.run_state.exit_code == 0 and panel.banner.isHidden()
    assert panel.note_label.text() == "stopped before the first iteration"
    qtbot.waitUntil(lambda: continue_button(panel).text() == "Start again", timeout=WAIT_MS)
    assert continue_button(panel).isEnabled() and panel.buttons["start"].isEnabled()


# ---------------------------------------------------------------- the Runs panel

def _select(qtbot, panel: RunsPanel, name: str) -> None:
    panel.select_paths([r.path for r in panel.rows() if r.name == name])
    assert [r.name for r in panel.selected_rows()] == [name]


def test_the_runs_panels_continue_follows_the_selected_row(qtbot, tmp_path):
    for name, state, ckpt in (("kept", "stopped", 10), ("early", "failed", None), ("live", "running", 10),
                              ("done", "finished", 20)):
        write_run(tmp_path, name, state, checkpoint=ckpt)
    panel = RunsPanel(tmp_path, refresh_ms=3_600_000)
    qtbot.addWidget(panel)
    qtbot.waitUntil(lambda: len(panel.rows()) == 4, timeout=WAIT_MS)
    button = panel.continue_button
    assert not button.isEnabled()  # nothing selected
    expected = {"kept": (True, "Continue from iteration 10"), "early": (True, "Start again"),
                "live": (False, "Continue"), "done": (False, "Continue")}
    for name, (enabled, text) in expected.items():
        _select(qtbot, panel, name)
        assert (button.isEnabled(), button.text()) == (enabled, text), name
    assert button.toolTip() != START_AGAIN_TIP
    _select(qtbot, panel, "early")
    assert button.toolTip() == START_AGAIN_TIP
    with qtbot.waitSignal(panel.continue_requested, timeout=WAIT_MS) as asked:
        qtbot.mouseClick(button, Qt.LeftButton)
    assert asked.args == [tmp_path / "early"]


def test_continue_in_the_runs_panel_opens_the_run_and_continues_it(qtbot, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    run = write_run(tmp_path / "runs", "kept", "stopped", checkpoint=10)
    settings = QSettings(str(tmp_path / "settings.ini"), QSettings.IniFormat)
    window = MainWindow(settings, runs_root=tmp_path / "runs", load_nvml=lambda: (_ for _ in ()).throw(ImportError()),
                        unsaved_dir=tmp_path / "unsaved")
    qtbot.addWidget(window)
    calls = []
    monkeypatch.setattr(window.training, "continue_run",
                        lambda: calls.append((window.run_state.run_dir, window.run_state.state)) or True)
    window.show_panel("Runs")
    qtbot.waitUntil(lambda: len(window.runs.rows()) == 1, timeout=WAIT_MS)
    _select(qtbot, window.runs, "kept")
    qtbot.mouseClick(window.runs.continue_button, Qt.LeftButton)
    qtbot.waitUntil(lambda: len(calls) > 0, timeout=WAIT_MS)  # the open's reads come from a worker
    assert calls == [(run.path, "stopped")]  # opened first, then continued
    assert window.tabs.currentWidget() is window.training and window.samples.run_dir() == run.path
    window.training._clear()


def test_a_run_out_of_disk_space_says_so_and_how_to_go_on():
    title, lines = failure_report(1, "", {"reason": "no space left on device while saving checkpoint iter_400",
                                          "cause": "disk_full", "phase": "checkpoint", "last_checkpoint": 200}, {})
    assert title == "Training failed - exit code 1 (the run failed)"
    assert lines == ["no space left on device while saving checkpoint iter_400",
                     "Cause: out of disk space during checkpoint",
                     "Advice: free space on the run folder's drive, then Continue the run (Training or Runs tab)",
                     "Last checkpoint: iter_200"]
