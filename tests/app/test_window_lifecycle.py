"""The window's side of a run's lifecycle: an opened run's own config shown read-only, the question
when Start is pressed while a run is open, one folder for Dry run and Start, the close question about
unsaved config edits, and the notification when a run ends. Runs are the recorded demo run
(tests/app/fixtures/demo_run) or written here; engines are small scripts. No torch."""
from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest
from PySide6.QtCore import QSettings, Qt
from PySide6.QtWidgets import QMessageBox, QSystemTrayIcon

import app.engine.process as engine_process
from app.models.run_target import AUTO_NAME
from app.screenshots import RECORDED_RUN, prepare_recorded_run
from app.window import MainWindow
from dmad.contract.runs import RunFolder, atomic_write_json

WAIT_MS = 30_000


def no_nvml():
    raise ImportError("no NVML in tests")


@pytest.fixture
def make_window(qtbot, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    made = []

    def make() -> MainWindow:
        settings = QSettings(str(tmp_path / "settings.ini"), QSettings.IniFormat)
        w = MainWindow(settings, runs_root=tmp_path / "runs", load_nvml=no_nvml, unsaved_dir=tmp_path / "unsaved")
        qtbot.addWidget(w)
        made.append(w)
        return w
    yield make
    for w in made:
        w.training._clear()


@pytest.fixture
def stopped_run(tmp_path) -> Path:
    run = prepare_recorded_run(RECORDED_RUN, tmp_path / "runs")
    status = json.loads((run / "status.json").read_text())
    atomic_write_json(run / "status.json", {**status, "state": "stopped", "iter": 60, "last_checkpoint": 60})
    folder = RunFolder(run)
    folder.checkpoint_path(60).mkdir(parents=True)  # the recorded run's weights are left out: a stand-in
    atomic_write_json(folder.latest_json, {"iter": 60, "path": "iter_60"})
    return run


def _click(monkeypatch, text: str) -> list[str]:
    """QMessageBox.exec clicks the button whose label starts with `text`; returns each box's words and buttons."""
    asked = []

    def exec_(box):
        labels = [b.text() for b in box.buttons()]
        asked.append("\n".join([box.text(), box.informativeText()] + labels))
        found = [b for b in box.buttons() if b.text().replace("&", "").startswith(text)]
        assert found, f"no button {text!r} in {labels}"
        button = found[0]
        button.click()
        return box.standardButton(button)
    monkeypatch.setattr(QMessageBox, "exec", exec_)
    return asked


# ---------------------------------------------------------------- an opened run's config

def test_opening_a_run_shows_its_own_config_read_only(qtbot, make_window, stopped_run, open_and_wait):
    window = make_window()
    window.show()
    assert not window.config.is_read_only()
    open_and_wait(window, stopped_run)
    qtbot.waitUntil(window.config.is_read_only, timeout=WAIT_MS)
    config = window.config
    assert config.config() == json.loads((stopped_run / "config.json").read_text())
    assert not config.run_banner.isHidden() and config.shown_run() == stopped_run
    assert config.run_banner.line.full_text() == f"Showing run {stopped_run.name}'s config (read-only)"
    assert not config.form.isEnabled() and config.json.edit.isReadOnly()
    assert not config.toolbar_buttons["Save"].isEnabled() and not config.dry_run_button.isEnabled()
    assert "preset" in config.run_banner.back_button.toolTip()
    qtbot.mouseClick(config.run_banner.back_button, Qt.LeftButton)  # the preset, as it was
    demo = json.loads((Path(__file__).parents[2] / "resources" / "configs" / "demo.json").read_text())
    assert not config.is_read_only() and config.config()["optimization"] == demo["optimization"]
    assert config.run_banner.isHidden()


def test_new_run_from_this_config_is_an_editable_unsaved_copy_without_the_run_name(qtbot, make_window, stopped_run, open_and_wait):
    window = make_window()
    window.show()
    raw = json.loads((stopped_run / "config.json").read_text())
    raw["identity"]["run_name"] = stopped_run.name  # a run named by hand: its copy must not reuse the folder
    atomic_write_json(stopped_run / "config.json", raw)
    open_and_wait(window, stopped_run)
    qtbot.waitUntil(window.config.is_read_only, timeout=WAIT_MS)
    qtbot.mouseClick(window.config.run_banner.new_run_button, Qt.LeftButton)
    config = window.config
    assert not config.is_read_only() and config.form.isEnabled() and not config.json.edit.isReadOnly()
    assert config.config()["identity"]["run_name"] is None
    assert config.config()["optimization"] == raw["optimization"]
    assert config.file_label.full_text() == f"untitled (from run {stopped_run.name})"  # unsaved, like a preset
    config.apply_changes({"resources.train_batch_size": 2})
    assert config.has_unsaved_changes() and config.file_label.full_text().endswith("— modified")
    config.set_config(config.config())  # closing the window would ask about the edit


def test_start_while_a_run_is_open_asks_and_cancel_starts_nothing(qtbot, make_window, stopped_run, monkeypatch, open_and_wait):
    window = make_window()
    started, continued = [], []
    monkeypatch.setattr(window.training, "start", lambda path, root: started.append(path) or True)
    monkeypatch.setattr(window.training, "continue_run", lambda: continued.append(True) or True)
    open_and_wait(window, stopped_run)
    qtbot.waitUntil(window.config.is_read_only, timeout=WAIT_MS)
    qtbot.waitUntil(lambda: window.training.buttons["continue"].text() == "Continue from iteration 60",
                    timeout=WAIT_MS)
    asked = _click(monkeypatch, "Cancel")
    qtbot.mouseClick(window.training.buttons["start"], Qt.LeftButton)
    assert started == [] and continued == [] and len(asked) == 1
    assert f"{stopped_run.name} is open. Start makes a new run in a new folder." in asked[0]
    assert "Continue this run from iteration 60" in asked[0] and "Start a new run" in asked[0]
    assert f"{stopped_run.name}'s config (run_name cleared)" in asked[0]
    _click(monkeypatch, "Continue this run")
    qtbot.mouseClick(window.training.buttons["start"], Qt.LeftButton)
    assert started == [] and continued == [True]
    _click(monkeypatch, "Start a new run")
    qtbot.mouseClick(window.training.buttons["start"], Qt.LeftButton)
    (path,) = started
    assert json.loads(path.read_text())["identity"]["run_name"] is None
    assert not window.config.is_read_only()  # the new run's config is an editable document now


def test_start_with_nothing_open_asks_nothing(qtbot, make_window, monkeypatch):
    window = make_window()
    started = []
    monkeypatch.setattr(window.training, "start", lambda path, root: started.append(path) or True)
    monkeypatch.setattr(QMessageBox, "exec", lambda box: pytest.fail(f"asked: {box.text()}"))
    qtbot.mouseClick(window.training.buttons["start"], Qt.LeftButton)
    assert len(started) == 1


# ---------------------------------------------------------------- one folder for Dry run and Start

ENGINE = textwrap.dedent(r'''
    import json, sys
    from pathlib import Path
    from dmad.contract.events import make_event

    argv = sys.argv[1:]
    raw = json.loads(Path(argv[argv.index("--config") + 1]).read_text())
    out = raw["identity"]["output_dir"]  # the app hands the engine absolute paths
    for i, arg in enumerate(argv):
        if arg == "--set" and argv[i + 1].startswith("identity.output_dir="):
            out = json.loads(argv[i + 1].split("=", 1)[1])
    folder = Path(out) / "the-run"
    if "--dry-run" in argv:
        print("Resolved config:\n{}\n")
        print(f"Run folder:  {folder} (will be created)")
        sys.exit(0)
    folder.mkdir(parents=True)
    for kind, it, data in (("started", None, {"run_dir": str(folder), "max_train_steps": 1}), ("finished", 1, {})):
        print(make_event(kind, it, **data).to_line(), flush=True)
''')


def test_dry_run_and_start_name_the_same_folder(qtbot, make_window, tmp_path, monkeypatch):
    script = tmp_path / "engine.py"
    script.write_text(ENGINE, encoding="utf-8")
    monkeypatch.setattr(engine_process, "engine_argv", lambda: [sys.executable, str(script)])
    window = make_window()
    root = (tmp_path / "runs").resolve()
    start = window.training.buttons["start"]
    assert start.toolTip().startswith(f"Start a new run in {root / AUTO_NAME}")
    assert "identity.output_dir (../../runs) is replaced by the Runs tab's folder" in start.toolTip()
    assert window.training.state_label.full_text() == f"idle - Start makes a new run in {root / AUTO_NAME}"
    # no silent override: the form shows the config's output_dir read-only, with where runs go under it
    row = window.config.form.rows[("identity", "output_dir")]
    assert row.editor.line.isReadOnly() and not row.editor.browse.isVisibleTo(row)
    assert row.note.full_text().startswith(f"Not used by the app: runs started here go to the Runs tab's folder, {root}")
    window.config.apply_changes({"identity.output_dir": str(root)})
    assert row.note.full_text().startswith(f"The Runs tab's folder, {root} (change it on the Runs tab)")
    assert "is replaced" not in start.toolTip()
    window.config.apply_changes({"identity.output_dir": "../../runs"})
    with qtbot.waitSignal(window.config._engine.dry_run_finished, timeout=WAIT_MS):
        assert window.config.dry_run()
    report = window.config.dry_run_view.toPlainText()
    said = next(line for line in report.splitlines() if line.startswith("Run folder:"))
    qtbot.mouseClick(start, Qt.LeftButton)
    qtbot.waitUntil(lambda: window.training.run_state.state == "finished", timeout=WAIT_MS)
    assert said == f"Run folder:  {window.training.run_state.run_dir} (will be created)"
    assert window.training.run_state.run_dir == root / "the-run"


# ---------------------------------------------------------------- closing with unsaved config edits

def test_close_asks_about_unsaved_config_edits(qtbot, make_window, monkeypatch, tmp_path):
    window = make_window()
    window.show()
    assert window.config.save_to(tmp_path / "mine.json")
    window.config.apply_changes({"resources.train_batch_size": 2})
    asked = _click(monkeypatch, "Cancel")
    assert not window.close() and window.isVisible()
    assert f"The config \u201c{tmp_path / 'mine.json'}\u201d has unsaved changes. Save them before closing?" in asked[0]
    _click(monkeypatch, "Save")
    assert window.close() and not window.isVisible()
    assert json.loads((tmp_path / "mine.json").read_text())["resources"]["train_batch_size"] == 2


def test_discard_closes_and_edits_waiting_behind_a_run_view_count_too(qtbot, make_window, monkeypatch, stopped_run, open_and_wait):
    window = make_window()
    window.show()
    window.config.apply_changes({"resources.train_batch_size": 2})  # the preset, edited
    open_and_wait(window, stopped_run)
    qtbot.waitUntil(window.config.is_read_only, timeout=WAIT_MS)
    assert not window.config.doc.is_modified() and window.config.has_unsaved_changes()
    asked = _click(monkeypatch, "Discard")
    assert window.close() and "untitled (preset CPU demo)" in asked[0]


def test_unsaved_edits_and_a_live_run_ask_both_questions_in_turn(qtbot, make_window, monkeypatch, tmp_path):
    window = make_window()
    window.show()
    window.config.apply_changes({"resources.train_batch_size": 2})
    calls = []
    monkeypatch.setattr(window.training, "leave_running", lambda: calls.append("leave"))
    window.training.lifecycle.open(tmp_path / "runs" / "live", {"state": "running"})  # a live run shown
    asked = _click(monkeypatch, "Discard")
    monkeypatch.setattr("app.dialogs.close.ask_close_during_run", lambda *a: asked.append("run") or "leave")
    assert window.close()
    assert asked[0].startswith("The config") and asked[1] == "run" and calls == ["leave"]


# ---------------------------------------------------------------- notifications

def _run_to(qtbot, window: MainWindow, tmp_path: Path, end: str, message: str) -> None:
    """Our engine's run r1 ends: failed by its exit code, or finished as its status.json says (the engine
    exited 0 before its final event was seen: the panel reads the file in a worker)."""
    lifecycle, run = window.training.lifecycle, RunFolder.create(tmp_path / "runs" / "r1")
    window.training.source.clear()  # as TrainingPanel.start does first: the run shown before is not read
    lifecycle.start("", now=0.0)
    lifecycle.set_run_dir(run.path)
    lifecycle.engine_event({"v": 1, "t": 1.0, "kind": "started", "iter": None, "data": {}})
    atomic_write_json(run.status_json, {"state": end})
    lifecycle.engine_finished(0 if end == "finished" else 1, message, (), killed=False)
    qtbot.waitUntil(lambda: window.run_state.state == end, timeout=WAIT_MS)


def test_a_run_that_ends_is_announced_in_the_status_bar_without_a_tray(qtbot, make_window, tmp_path):
    window = make_window()
    assert not QSystemTrayIcon.isSystemTrayAvailable()  # offscreen: no tray, no crash
    _run_to(qtbot, window, tmp_path, "failed", "loss_dm is NaN at iteration 12")
    assert window.statusBar().currentMessage() == "Run failed: r1 failed: loss_dm is NaN at iteration 12"


def test_a_run_that_ends_shows_a_tray_message_where_there_is_a_tray(qtbot, make_window, tmp_path, monkeypatch,
                                                                    stopped_run, open_and_wait):
    shown = []
    monkeypatch.setattr(QSystemTrayIcon, "isSystemTrayAvailable", staticmethod(lambda: True))
    monkeypatch.setattr(QSystemTrayIcon, "supportsMessages", staticmethod(lambda: True))
    monkeypatch.setattr(QSystemTrayIcon, "showMessage", lambda self, title, text, *a: shown.append((title, text)))
    window = make_window()
    open_and_wait(window, stopped_run)  # an ended run opened: nothing happened now, nothing to announce
    assert shown == []
    _run_to(qtbot, window, tmp_path, "finished", "finished 120 iterations in 65 s")
    assert shown == [("Run finished", "r1 finished: finished 120 iterations in 65 s")]
    assert window.notifier._tray is not None and not window.notifier._tray.icon().isNull()


# ---------------------------------------------------------------- a shown run deleted or renamed

def test_deleting_the_shown_run_empties_every_run_tab(qtbot, make_window, tmp_path, open_and_wait):
    window = make_window()
    run = prepare_recorded_run(RECORDED_RUN, tmp_path / "runs")
    open_and_wait(window, run)
    qtbot.waitUntil(lambda: window.samples.run_dir() == run and window.config.is_read_only(), timeout=WAIT_MS)
    window.samples.render_status.setText(f"Exported to {run / 'export'}")
    spelled = Path(str(tmp_path / "runs" / ".." / "runs" / run.name))  # the Runs tab may spell it otherwise
    window.runs.run_deleted.emit(spelled)
    qtbot.waitUntil(lambda: window.training.run_state.state == "idle", timeout=WAIT_MS)
    assert window.run_dir() is None and window.samples.run_dir() is None and window.playground._run is None
    assert window.samples.render_status.text() == "" and not window.config.is_read_only()
    assert window.windowTitle() == "DMAD Studio"


def test_close_asks_about_unsaved_caption_edits(qtbot, make_window, monkeypatch):
    window = make_window()
    window.show()
    monkeypatch.setattr(window.data.browser, "unsaved", lambda: 2)
    asked = []
    monkeypatch.setattr(QMessageBox, "question", lambda *a, **k: asked.append(a[2]) or QMessageBox.Cancel)
    assert not window.close() and window.isVisible()
    assert asked == ["2 caption edits are not saved (Data tab). Close without saving them?"]
    monkeypatch.setattr(QMessageBox, "question", lambda *a, **k: QMessageBox.Discard)
    assert window.close()
