"""The Runs panel on fixture run folders written in the engine's own formats. No torch."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QDesktopServices

from app.dialogs.config_diff import ConfigDiffDialog
from app.engine.process import event_dict
from app.models.lifecycle import RunLifecycle
from app.models.run_scan import NOT_A_RUN, TAIL_BYTES, ScanCache
from app.models.run_state import RunState
from app.panels.runs import COLUMNS, RunsPanel
from dmad.contract.config import TrainConfig
from dmad.contract.events import Event, make_event
from dmad.contract.runs import CsvAppender, atomic_write_json

METRIC_COLUMNS = ["iter", "loss_dm", "loss_g_gan", "loss_g", "loss_fake", "loss_c", "step_time_s",
                  "mem_peak_alloc_gb", "mem_device_used_gb", "lr_generator", "lr_critic"]


def _config(**groups) -> dict:
    raw = {"identity": {"pretrained_model_name_or_path": "/models/demo/teacher",
                        "train_data_dir": "/data/shapes"},
           "optimization": {"max_train_steps": 1000, "generator_lr": 1e-4, "critic_lr": 2e-5},
           "resources": {"train_batch_size": 4, "gradient_accumulation_steps": 2},
           "distillation": {"student_steps": 2}}
    for group, fields in groups.items():
        raw.setdefault(group, {}).update(fields)
    return TrainConfig.model_validate(raw).model_dump(mode="json")


def _metric(it: int) -> dict:
    return {"iter": it, "loss_dm": 1.0 / it, "loss_g_gan": 0.6, "loss_g": 0.5 + 1.0 / it, "loss_fake": 0.05,
            "loss_c": 0.07, "step_time_s": 0.8, "mem_peak_alloc_gb": None, "mem_device_used_gb": 0.83,
            "lr_generator": 1e-4, "lr_critic": 2e-5}


def write_run(root: Path, name: str, state: str = "finished", iters=(10, 20), started_t: float = 1.7e9,
              metrics_csv: bool = True, config: dict | None = None, **status) -> Path:
    """A run folder as the engine leaves it: config.json, prompt_set.json, status.json, events, metrics."""
    run = root / name
    run.mkdir(parents=True)
    (run / "config.json").write_text(json.dumps(config or _config(), indent=2))
    (run / "prompt_set.json").write_text(json.dumps({"prompt_set": "demo", "version": "v1", "items": []}))
    lines = [Event("started", None, {"run_dir": str(run), "max_train_steps": 1000}, t=started_t).to_line(),
             make_event("phase", 0, phase="training").to_line()]
    lines += [make_event("metric", it, **{k: v for k, v in _metric(it).items() if k != "iter"}).to_line()
              for it in iters]
    (run / "events.jsonl").write_text("".join(line + "\n" for line in lines))
    if metrics_csv:
        with CsvAppender(run / "metrics.csv", METRIC_COLUMNS) as csv_out:
            for it in iters:
                csv_out.append(_metric(it))
    fields = {"state": state, "pid": os.getpid(), "host": socket.gethostname(), "heartbeat": time.time(),
              "iter": iters[-1] if iters else None, "max_train_steps": 1000}
    fields.update(status)
    atomic_write_json(run / "status.json", {k: v for k, v in fields.items() if v is not None})
    return run


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def open_panel(qtbot, root: Path, cache: ScanCache | None = None, **kw) -> RunsPanel:
    panel = RunsPanel(root, cache=cache, **kw)
    qtbot.addWidget(panel)
    with qtbot.waitSignal(panel.runs_scanned):
        pass  # the first scan started in the constructor; its result is queued to this thread
    return panel


def rescan(qtbot, panel: RunsPanel) -> None:
    with qtbot.waitSignal(panel.runs_scanned):
        panel.refresh()


def by_name(panel: RunsPanel) -> dict:
    return {r.name: r for r in panel.rows()}


def cell(panel: RunsPanel, name: str, column: str, role=Qt.ItemDataRole.DisplayRole):
    model = panel.model
    row = [r.name for r in model.rows()].index(name)
    return model.data(model.index(row, COLUMNS.index(column)), role)


def test_rows_show_state_fields_and_last_metrics(qtbot, tmp_path):
    write_run(tmp_path, "done", "finished", iters=(10, 20), last_checkpoint=20)
    write_run(tmp_path, "live", "running", iters=(10,))  # our own pid, fresh heartbeat: really running
    write_run(tmp_path, "held", "paused", iters=(10,))
    panel = open_panel(qtbot, tmp_path)
    rows = by_name(panel)
    assert {n: r.state for n, r in rows.items()} == {"done": "finished", "live": "running", "held": "paused"}
    assert cell(panel, "done", "Iteration") == "20 / 1000"
    assert cell(panel, "done", "Last checkpoint") == "iter 20"
    assert cell(panel, "done", "Teacher") == "demo/teacher"
    assert cell(panel, "done", "Dataset") == "shapes"
    assert cell(panel, "done", "Prompt set") == "demo-v1"
    assert cell(panel, "done", "Student steps") == "2"
    assert cell(panel, "done", "Batch") == "8"  # 4 per step x 2 accumulation
    assert cell(panel, "done", "Learning rates (G / C)") == "0.0001 / 2e-05"
    assert rows["done"].metrics["iter"] == 20 and rows["done"].metrics["loss_dm"] == pytest.approx(1 / 20)
    assert "dm 0.05" in cell(panel, "done", "Last losses")
    assert rows["done"].started == pytest.approx(1.7e9)
    assert cell(panel, "done", "Updated").endswith("s ago")
    assert panel.message.text().startswith("3 runs · 2 live · 0 failed")


def test_running_with_a_dead_pid_shows_failed_with_reason(qtbot, tmp_path):
    pid = dead_pid()
    write_run(tmp_path, "killed", "running", pid=pid)
    panel = open_panel(qtbot, tmp_path)
    assert by_name(panel)["killed"].state == "failed"
    tooltip = cell(panel, "killed", "Status", Qt.ItemDataRole.ToolTipRole)
    assert f"pid {pid}" in tooltip and "was running" in tooltip


def test_stale_heartbeat_on_another_host_shows_failed(qtbot, tmp_path):
    # On another machine the pid means nothing (ours is alive here): only the heartbeat counts.
    write_run(tmp_path, "remote-dead", "running", host="other-machine", heartbeat=time.time() - 600)
    write_run(tmp_path, "remote-live", "running", host="other-machine", pid=dead_pid())
    panel = open_panel(qtbot, tmp_path)
    rows = by_name(panel)
    assert rows["remote-dead"].state == "failed"
    assert "no heartbeat" in rows["remote-dead"].reason and "other-machine" in rows["remote-dead"].reason
    assert rows["remote-live"].state == "running"


def test_failed_run_shows_its_own_reason(qtbot, tmp_path):
    write_run(tmp_path, "oom", "failed", failure_reason="out of memory while training", exit_code=3)
    panel = open_panel(qtbot, tmp_path)
    assert cell(panel, "oom", "Status") == "failed"
    assert cell(panel, "oom", "Status", Qt.ItemDataRole.ToolTipRole) == "out of memory while training (exit code 3)"


def test_corrupt_status_and_foreign_folders_become_rows_and_the_scan_goes_on(qtbot, tmp_path):
    write_run(tmp_path, "good", "finished")
    bad = write_run(tmp_path, "bad", "finished")
    (bad / "status.json").write_text('{"state": "runn')
    (tmp_path / "holiday-photos").mkdir()
    (tmp_path / "holiday-photos" / "a.txt").write_text("x")
    panel = open_panel(qtbot, tmp_path)
    rows = by_name(panel)
    assert rows["good"].state == "finished"
    assert rows["bad"].state == "error" and "status.json is not valid JSON (line 1" in rows["bad"].reason
    assert rows["bad"].config is not None  # what could be read is still shown
    assert rows["holiday-photos"].reason == NOT_A_RUN and not rows["holiday-photos"].is_run
    assert cell(panel, "holiday-photos", "Status") == "not a run"
    assert "2 runs · 0 live · 0 failed · 1 unreadable" in panel.message.text()
    assert "1 other folder (not runs)" in panel.message.text()


def test_last_metrics_come_from_the_tail_of_a_long_file(qtbot, tmp_path):
    run = write_run(tmp_path, "long", "finished", iters=tuple(range(1, 30001)))
    with open(run / "metrics.csv", "a", encoding="utf-8") as f:
        f.write("30001,0.1,0.2")  # a torn row: the engine is mid-write
    size = (run / "metrics.csv").stat().st_size
    assert size > 20 * TAIL_BYTES
    cache = ScanCache()
    panel = open_panel(qtbot, tmp_path, cache=cache)
    row = by_name(panel)["long"]
    assert row.metrics["iter"] == 30000 and row.metrics["loss_dm"] == pytest.approx(1 / 30000)
    # header + one tail + the first line of events.jsonl: far less than the file
    assert cache.bytes_read < 3 * TAIL_BYTES


def test_last_metrics_fall_back_to_the_last_metric_event(qtbot, tmp_path):
    write_run(tmp_path, "no-csv", "stopped", iters=(5, 15), metrics_csv=False)
    panel = open_panel(qtbot, tmp_path)
    assert by_name(panel)["no-csv"].metrics["iter"] == 15
    assert "dm 0.06667" in cell(panel, "no-csv", "Last losses")


def test_refresh_rereads_only_changed_files(qtbot, tmp_path):
    for name in ("a", "b", "c"):
        write_run(tmp_path, name, "finished")
    cache = ScanCache()
    panel = open_panel(qtbot, tmp_path, cache=cache)
    first = dict(cache.reads)
    assert first["status"] == 3 and first["config"] == 3 and first["metrics"] == 3
    rescan(qtbot, panel)
    assert dict(cache.reads) == first  # nothing changed: nothing re-read
    status = json.loads((tmp_path / "b" / "status.json").read_text())
    atomic_write_json(tmp_path / "b" / "status.json", {**status, "heartbeat": time.time() + 1})
    rescan(qtbot, panel)
    assert cache.reads["status"] == first["status"] + 1
    assert {k: v for k, v in cache.reads.items() if k != "status"} == {k: v for k, v in first.items()
                                                                       if k != "status"}


def test_state_is_recomputed_without_any_file_change(qtbot, tmp_path):
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    write_run(tmp_path, "r", "running", pid=child.pid)
    panel = open_panel(qtbot, tmp_path)
    assert by_name(panel)["r"].state == "running"
    child.communicate(b"")  # the engine dies; status.json still says running
    rescan(qtbot, panel)
    assert by_name(panel)["r"].state == "failed"


def test_double_click_and_open_emit_run_opened(qtbot, tmp_path):
    run = write_run(tmp_path, "only", "finished")
    panel = open_panel(qtbot, tmp_path)
    panel.show()
    qtbot.waitExposed(panel)
    rect = panel.table.visualRect(panel.proxy.index(0, 0))
    with qtbot.waitSignal(panel.run_opened) as opened:
        # A real double click starts with a press: the view opens only the item pressed first.
        qtbot.mouseClick(panel.table.viewport(), Qt.MouseButton.LeftButton, pos=rect.center())
        qtbot.mouseDClick(panel.table.viewport(), Qt.MouseButton.LeftButton, pos=rect.center())
    assert opened.args == [run]
    panel.select_paths([run])
    with qtbot.waitSignal(panel.run_opened) as opened:
        qtbot.mouseClick(panel.open_button, Qt.MouseButton.LeftButton)
    assert opened.args == [run]


def test_compare_two_selected_runs_opens_the_diff(qtbot, tmp_path):
    a = write_run(tmp_path, "a", "finished", config=_config(optimization={"generator_lr": 1e-5}))
    b = write_run(tmp_path, "b", "finished", config=_config(distillation={"student_steps": 4}))
    write_run(tmp_path, "c", "finished")
    panel = open_panel(qtbot, tmp_path)
    panel.select_paths([a])
    assert not panel.compare_button.isEnabled()
    panel.select_paths([a, b])
    assert panel.compare_button.isEnabled() and not panel.open_button.isEnabled()
    qtbot.mouseClick(panel.compare_button, Qt.MouseButton.LeftButton)
    dialog = panel.findChild(ConfigDiffDialog)
    assert dialog is not None
    assert sorted(r[0] for r in dialog.rows()) == ["distillation.student_steps", "optimization.generator_lr"]


def test_reveal_opens_the_selected_folder(qtbot, tmp_path, monkeypatch):
    run = write_run(tmp_path, "r", "finished")
    opened = []
    monkeypatch.setattr(QDesktopServices, "openUrl", lambda url: opened.append(url.toLocalFile()) or True)
    panel = open_panel(qtbot, tmp_path)
    panel.select_paths([run])
    qtbot.mouseClick(panel.reveal_button, Qt.MouseButton.LeftButton)
    assert opened == [str(run)]


def test_set_root_rescans_and_a_missing_root_says_so(qtbot, tmp_path):
    write_run(tmp_path / "one", "r1", "finished")
    write_run(tmp_path / "two", "r2", "stopped")
    panel = open_panel(qtbot, tmp_path / "one")
    assert [r.name for r in panel.rows()] == ["r1"]
    with qtbot.waitSignal(panel.root_changed) as changed, qtbot.waitSignal(panel.runs_scanned):
        panel.set_root(tmp_path / "two")
    assert changed.args == [tmp_path / "two"] and panel.root() == tmp_path / "two"
    assert [r.name for r in panel.rows()] == ["r2"]
    with qtbot.waitSignal(panel.runs_scanned):
        panel.set_root(tmp_path / "nowhere")
    assert panel.rows() == [] and panel.message.text() == f"runs folder not found: {tmp_path / 'nowhere'}"


def test_the_timer_picks_up_a_new_run_while_visible(qtbot, tmp_path):
    write_run(tmp_path, "old", "finished")
    panel = open_panel(qtbot, tmp_path, refresh_ms=50)
    panel.show()
    write_run(tmp_path, "new", "running")
    qtbot.waitUntil(lambda: "new" in by_name(panel))
    panel.hide()
    assert not panel._timer.isActive()


def test_the_shown_runs_state_changes_rescan_and_its_progress_does_not(qtbot, tmp_path, monkeypatch):
    write_run(tmp_path, "r1", "running")
    panel = open_panel(qtbot, tmp_path)
    lifecycle = RunLifecycle()
    state = RunState(lifecycle)
    panel.watch(state)
    with qtbot.waitSignal(panel.runs_scanned):
        lifecycle.open(tmp_path / "r1", {"state": "running"})  # a run opened in the Training panel
    lifecycle.file_caught_up()  # its history is read: what follows is live
    refreshes = []
    refresh = panel.refresh
    monkeypatch.setattr(panel, "refresh", lambda: refreshes.append(lifecycle.state) or refresh())
    lifecycle.file_event(event_dict(make_event("metric", 11, loss_dm=0.5, max_train_steps=1000)))
    assert lifecycle.iteration == 11 and refreshes == []  # an iteration changes no state: the timer picks it up
    write_run(tmp_path, "r2", "finished")
    with qtbot.waitSignal(panel.runs_scanned):
        lifecycle.file_event(event_dict(make_event("finished", 1000)))
    assert refreshes == ["finished"]
    assert sorted(by_name(panel)) == ["r1", "r2"]


def test_the_last_iteration_is_not_a_memory_sampler_reading(tmp_path):
    from app.models.run_scan import events_tail

    path = tmp_path / "events.jsonl"
    path.write_text(make_event("metric", 7, loss_dm=0.5, step_time_s=0.2).to_line() + "\n"
                    + make_event("metric", 7, source="sampler", scope="process_rss", mem_used_gb=1.5).to_line() + "\n")
    assert events_tail(ScanCache(), path) == {"iter": 7, "loss_dm": 0.5, "step_time_s": 0.2}
