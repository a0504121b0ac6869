"""The main window: its six places, the wiring between panels, closing during a run, the tabs the
shell owns (Samples, Memory, Data), `dmad-studio` arguments and --screenshots.

Runs are replayed from tests/app/fixtures/demo_run (a real `dmad demo` run, weights left out;
see its README.md), copied to tmp_path with its event paths rewritten. No torch here.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError
from PySide6.QtCore import QObject, QSettings, Signal
from PySide6.QtGui import QFontMetrics, QImage
from PySide6.QtWidgets import QMessageBox

from app.dialogs import close as close_dialog
from app.main import _BadInput, main, parse_args
from app.panels.memory import MemoryTab, ledger_part, read_gpu_mem
from app.panels.samples import SamplesPanel
from app.screenshots import RECORDED_RUN, prepare_recorded_run
from app.window import PANELS, ROOT_KEY, MainWindow
from dmad.contract.config import TrainConfig, format_validation_error
from tests.conftest import REPO, dmad_env


def no_nvml():
    raise ImportError("no NVML in tests")


@pytest.fixture
def recorded_run(tmp_path) -> Path:
    return prepare_recorded_run(RECORDED_RUN, tmp_path / "runs")


@pytest.fixture
def window(qtbot, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # thumbnails: not the user's cache
    settings = QSettings(str(tmp_path / "settings.ini"), QSettings.IniFormat)
    w = MainWindow(settings, runs_root=tmp_path / "runs", load_nvml=no_nvml, unsaved_dir=tmp_path / "unsaved")
    qtbot.addWidget(w)
    yield w
    w.training._clear()  # stop followers and timers before the widgets go


# ---------------------------------------------------------------- places

def test_window_has_the_eight_places_in_order(window):
    assert [window.tabs.tabText(i) for i in range(window.tabs.count())] == list(PANELS)
    assert list(PANELS) == ["Config", "Data", "Training", "Samples", "Playground", "Runs", "Queue", "Memory"]
    assert window.panel("Queue") is window.queue and window.panel("Playground") is window.playground
    assert window.panel("Config") is window.config and window.panel("Runs") is window.runs
    assert window.panel("Training") is window.training and window.panel("Memory") is window.memory


def test_the_run_state_drives_the_title_and_the_run_bound_tabs(window, recorded_run, open_and_wait):
    open_and_wait(window, recorded_run)
    state = window.run_state
    assert state is window.training.run_state and state.state == "finished" and state.run_dir == recorded_run
    assert window.windowTitle() == f"{recorded_run.name} [finished] - DMAD Studio"
    runs = []
    window.run_changed.connect(runs.append)
    lifecycle = window.training.lifecycle  # fed here as the Training panel feeds it when Start is pressed
    window.training.source.clear()  # as TrainingPanel.start does first: the old run is not read any more
    lifecycle.start("", now=0.0)  # the old run's tabs go blank
    assert runs == [None] and window.samples.run_dir() is None and window.windowTitle() == "DMAD Studio"
    lifecycle.set_run_dir(recorded_run)
    lifecycle.engine_event({"v": 1, "t": 1.0, "kind": "started", "iter": None, "data": {}})
    assert runs == [None, recorded_run] and window.samples.run_dir() == recorded_run
    assert window.windowTitle() == f"{recorded_run.name} [running] - DMAD Studio"
    lifecycle.engine_event({"v": 1, "t": 2.0, "kind": "finished", "iter": 120, "data": {}})
    lifecycle.engine_finished(0, "finished 120 iterations", (), killed=False)
    assert (state.exit_code, state.message) == (0, "finished 120 iterations")
    assert window.windowTitle() == f"{recorded_run.name} [finished] - DMAD Studio"


# ---------------------------------------------------------------- wiring

def test_the_config_panel_starts_on_the_cpu_demo_and_start_is_enabled(window):
    assert window.config.is_valid()
    assert window.config.config()["identity"]["train_data_dir"] == "../demo/shapes"
    assert window.training.buttons["start"].isEnabled()
    assert window.data.source() == (REPO / "resources" / "demo" / "shapes").resolve()


def test_an_invalid_field_disables_start_with_the_engines_message(window):
    raw = window.config.config()
    raw["resources"]["resolution"] = 100
    window.config.set_config(raw, window.config.base_dir())
    start = window.training.buttons["start"]
    assert not start.isEnabled()
    with pytest.raises(ValidationError) as e:
        TrainConfig.model_validate(raw)
    engine_words = format_validation_error(e.value, "config").split(": ", 1)[1]  # minus the source name
    assert "multiple of 8" in engine_words and engine_words in start.toolTip()
    raw["resources"]["resolution"] = 64
    window.config.set_config(raw, window.config.base_dir())
    assert start.isEnabled() and start.toolTip().startswith("Start a new run in ")  # where, said before Start


def test_start_materializes_the_config_and_starts_under_the_runs_root(window, tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(window.training, "start", lambda path, root: calls.append((path, root)) or True)
    window.show_panel("Config")
    window.training.start_requested.emit()
    (path, root), = calls
    assert root == tmp_path / "runs"
    assert path.parent == tmp_path / "unsaved" and json.loads(path.read_text())["resources"]["resolution"] == 64
    assert window.tabs.currentWidget() is window.training


def test_start_with_an_invalid_config_says_why_and_starts_nothing(window, monkeypatch):
    calls = []
    monkeypatch.setattr(window.training, "start", lambda *a: calls.append(a))
    raw = window.config.config()
    raw["optimization"]["max_train_steps"] = 0
    window.config.set_config(raw, window.config.base_dir())
    window.training.start_requested.emit()
    assert calls == [] and "max_train_steps" in window.statusBar().currentMessage()


def test_opening_a_run_from_the_runs_panel_fills_training_samples_memory_and_title(window, recorded_run, qtbot):
    window.show_panel("Runs")
    window.runs.run_opened.emit(recorded_run)
    assert window.tabs.currentWidget() is window.training
    assert window.samples.run_dir() == recorded_run  # told at once; each tab reads the folder in a worker
    assert window.training.opening() == recorded_run and window.training.run_state.run_dir is None
    qtbot.waitUntil(lambda: window.training.opening() is None, timeout=10_000)  # the Training panel's reads
    assert window.training.run_state.run_dir == recorded_run
    assert recorded_run.name in window.windowTitle() and "finished" in window.windowTitle()
    qtbot.waitUntil(lambda: window.memory.readings.rowCount() == 1, timeout=10_000)
    assert isinstance(window.samples, SamplesPanel)
    qtbot.waitUntil(lambda: window.samples.model.rowCount() == 10 and window.samples.model.columnCount() == 3,
                    timeout=10_000)


def test_the_runs_root_is_remembered(qtbot, tmp_path):
    path = str(tmp_path / "settings.ini")
    w = MainWindow(QSettings(path, QSettings.IniFormat), runs_root=tmp_path / "a", load_nvml=no_nvml,
                   unsaved_dir=tmp_path / "u")
    qtbot.addWidget(w)
    w.runs.set_root(tmp_path / "b")
    settings = QSettings(path, QSettings.IniFormat)
    assert Path(settings.value(ROOT_KEY)) == tmp_path / "b"
    w2 = MainWindow(settings, load_nvml=no_nvml, unsaved_dir=tmp_path / "u")
    qtbot.addWidget(w2)
    assert w2.runs.root() == tmp_path / "b"


def test_status_bar_shows_the_gpu_from_a_fake_nvml_and_nothing_without_one(qtbot, tmp_path):
    from tests.app.test_gpu_status import FakeNvml

    settings = QSettings(str(tmp_path / "s.ini"), QSettings.IniFormat)
    w = MainWindow(settings, runs_root=tmp_path, load_nvml=lambda: FakeNvml(names=("NVIDIA L4",), used_gib=1.5,
                                                                             total_gib=22.5, util=7),
                   unsaved_dir=tmp_path / "u")
    qtbot.addWidget(w)
    w.show()
    qtbot.waitUntil(lambda: w.gpu.isVisible(), timeout=10_000)
    assert w.gpu.text() == "GPU0 NVIDIA L4  1.5 / 22.5 GB  7%"
    w.close()

    w2 = MainWindow(settings, runs_root=tmp_path, load_nvml=no_nvml, unsaved_dir=tmp_path / "u")
    qtbot.addWidget(w2)
    w2.show()
    qtbot.waitUntil(lambda: w2.gpu.probe.failed is not None, timeout=10_000)
    w2.gpu.wait_idle()
    qtbot.waitUntil(lambda: not w2.gpu._timer.isActive(), timeout=10_000)
    assert not w2.gpu.isVisible() and w2.gpu.text() == ""


# ---------------------------------------------------------------- closing during a run

class _LiveRun:
    """A live run in the Training panel's RunState, whose stop / leave methods only record the
    choice: the choice is what is tested here."""

    def __init__(self, monkeypatch, training, run_dir: Path):
        self.calls = []
        training.lifecycle.open(run_dir, {"state": "running"})  # reattached: status.json says running
        training.lifecycle.file_caught_up()  # its history is read: what follows is live
        monkeypatch.setattr(training, "stop_run", lambda: self.calls.append("stop"))
        monkeypatch.setattr(training, "leave_running", lambda: self.calls.append("leave"))


def _answer(monkeypatch, button):
    asked = []

    def exec_(box):
        asked.append([b.text() for b in box.buttons()] + [box.text()])
        return button
    monkeypatch.setattr(QMessageBox, "exec", exec_)
    return asked


def test_close_during_a_run_cancel_keeps_the_window(window, monkeypatch, tmp_path):
    run = _LiveRun(monkeypatch, window.training, tmp_path / "runs" / "my-run")
    asked = _answer(monkeypatch, QMessageBox.Cancel)
    window.show()
    assert not window.close()
    assert window.isVisible() and run.calls == []
    assert {"Stop the run (save a checkpoint)", "Leave it running", "Cancel"} <= set(asked[0])
    assert "my-run is still training. What should happen to it?" in asked[0]


def test_close_during_a_run_leave_it_running_detaches_and_closes(window, monkeypatch, tmp_path):
    run = _LiveRun(monkeypatch, window.training, tmp_path / "runs" / "my-run")
    _answer(monkeypatch, QMessageBox.No)
    window.show()
    assert window.close()
    assert run.calls == ["leave"] and not window.isVisible()


def test_close_during_a_run_stop_waits_for_the_checkpoint_then_closes(window, monkeypatch, qtbot, tmp_path):
    run = _LiveRun(monkeypatch, window.training, tmp_path / "runs" / "my-run")
    _answer(monkeypatch, QMessageBox.Yes)
    window.show()
    assert not window.close()  # the engine is still saving its checkpoint
    assert run.calls == ["stop"] and window.isVisible()
    assert "saving a checkpoint" in window.statusBar().currentMessage()
    lifecycle = window.training.lifecycle
    lifecycle.stop_requested()
    assert window.isVisible()
    lifecycle.file_event({"v": 1, "t": 1.0, "kind": "stopped", "iter": 3, "data": {"last_checkpoint": 3}})
    assert not window.isVisible()


def test_close_without_a_live_run_asks_nothing(window, monkeypatch):
    monkeypatch.setattr(close_dialog, "ask_close_during_run", lambda *a: pytest.fail("asked"))
    window.show()
    assert window.close()


# ---------------------------------------------------------------- Memory tab

class FakeEngine(QObject):
    dry_run_finished = Signal(int, str)

    def __init__(self, code: int, text: str):
        super().__init__()
        self.code, self.text, self.started = code, text, []

    def start_dry_run(self, path, overrides=()):
        self.started.append(path)
        self.overrides = list(overrides)
        self.dry_run_finished.emit(self.code, self.text)


DRY_RUN = """Resolved config:
{
  "config_version": 1
}

Run folder:  /runs/x (will be created)
Resume from: (fresh start)
Memory ledger (estimate, framework peak per device):
                      GiB  assumption
student weights      0.04  fp32
total                0.05"""


def test_estimate_memory_shows_the_engines_ledger_in_monospace(qtbot, tmp_path):
    engine = FakeEngine(0, DRY_RUN)
    tab = MemoryTab(lambda: tmp_path / "c.json", lambda: engine, lambda: ["identity.output_dir=\"/r\""])
    qtbot.addWidget(tab)
    tab.estimate_button.click()
    assert engine.started == [tmp_path / "c.json"] and engine.overrides == ['identity.output_dir="/r"']
    assert tab.ledger.toPlainText().startswith("Run folder:") and "student weights      0.04" in tab.ledger.toPlainText()
    assert "config_version" not in tab.ledger.toPlainText()  # the Config panel shows the resolved config
    # the ledger's columns line up: every character is as wide as any other (QFontInfo.fixedPitch
    # is not used: fontconfig leaves some monospace fonts, Noto Sans Mono among them, unflagged)
    metrics = QFontMetrics(tab.ledger.font())
    assert metrics.horizontalAdvance("i" * 20) == metrics.horizontalAdvance("W" * 20) == metrics.horizontalAdvance("0" * 20)


def test_estimate_memory_failures_are_one_line(qtbot):
    engine = FakeEngine(2, "dmad: error: train_data_dir not found: /nope")
    tab = MemoryTab(lambda: Path("c.json"), lambda: engine)
    qtbot.addWidget(tab)
    tab.estimate()
    assert tab.estimate_status.text() == "Dry run failed (exit 2): dmad: error: train_data_dir not found: /nope"

    def invalid():
        raise ValueError("config: resources.resolution: must be a multiple of 8")
    tab2 = MemoryTab(invalid, lambda: pytest.fail("no engine for an invalid config"))
    qtbot.addWidget(tab2)
    tab2.estimate()
    assert "multiple of 8" in tab2.estimate_status.text()


def test_gpu_mem_readings_keep_their_scopes_apart(qtbot, tmp_path):
    (tmp_path / "gpu_mem.csv").write_text(
        "t,scope,mem_used_gb,mem_total_gb\n"
        "100.0,device_nvml,5.0,24.0\n"
        "101.0,process_rss,1.25,\n"
        "102.0,device_nvml,7.5,24.0\n"
        "103.0,device_nvml,6.0,24.0\n"
        "104.0,device_nv", encoding="utf-8")  # a torn last row: ignored
    readings = {r.scope: r for r in read_gpu_mem(tmp_path / "gpu_mem.csv")}
    assert set(readings) == {"device_nvml", "process_rss"}
    nvml, rss = readings["device_nvml"], readings["process_rss"]
    assert (nvml.last_used_gb, nvml.total_gb, nvml.peak_used_gb, nvml.samples) == (6.0, 24.0, 7.5, 3)
    assert (rss.last_used_gb, rss.total_gb, rss.peak_used_gb, rss.samples) == (1.25, None, 1.25, 1)
    tab = MemoryTab(lambda: None, lambda: None)
    qtbot.addWidget(tab)
    tab.set_run(tmp_path)
    qtbot.waitUntil(lambda: tab.readings.rowCount() == 2, timeout=10_000)
    rows = {tab.readings.item(i, 0).text(): [tab.readings.item(i, j).text() for j in (1, 2, 3)] for i in range(2)}
    assert rows == {"device_nvml": ["6.00", "24.00", "7.50"], "process_rss": ["1.25", "", "1.25"]}


def test_ledger_part_of_a_report_without_a_run_folder_line_is_the_whole_report():
    assert ledger_part("just text\n") == "just text"


# ---------------------------------------------------------------- Data panel (tests/app/test_data_panel.py)

def test_data_panel_follows_the_config_panel(window, tmp_path):
    raw = window.config.config()
    raw["identity"]["train_data_dir"] = str(tmp_path / "mine")
    raw["resources"].update(train_batch_size=3, gradient_accumulation_steps=2)
    window.config.set_config(raw, window.config.base_dir())
    assert window.data.source() == tmp_path / "mine" and window.data.effective_batch() == 6
    window.training.processes.setValue(4)  # the Training panel's Processes: batch x accumulation x processes
    assert window.data.effective_batch() == 24


# ---------------------------------------------------------------- dmad-studio

def test_bad_arguments_are_one_line_and_exit_2(tmp_path, capsys):
    assert main(["--no-such-option"]) == 2
    assert main([str(tmp_path / "missing")]) == 2
    (tmp_path / "empty").mkdir()
    assert main([str(tmp_path / "empty")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and all(line.startswith("dmad-studio: error: ") for line in err)
    assert "run folder not found" in err[1] and "not a run folder (no config.json)" in err[2]


def test_arguments_resolve_paths(recorded_run, tmp_path):
    args = parse_args([str(recorded_run), "--runs-root", str(tmp_path)])
    assert args.run_dir == recorded_run and args.runs_root == tmp_path
    (tmp_path / "file").write_text("x")
    with pytest.raises(_BadInput, match="--screenshots is not a folder"):
        parse_args(["--screenshots", str(tmp_path / "file")])


def _run_python(code: str, **env) -> str:
    full = dmad_env()
    full.update(QT_QPA_PLATFORM="offscreen", **env)
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=full, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout.strip()


def test_lc_numeric_is_c_after_the_application_starts():
    available = subprocess.run(["locale", "-a"], capture_output=True, text=True).stdout.split()
    if not {"C.utf8", "C.UTF-8"} & set(available):
        pytest.skip("no C.UTF-8 locale to start from")
    probe = "import locale; print(locale.setlocale(locale.LC_NUMERIC))"
    # Control: a bare QApplication takes LC_NUMERIC from the environment (what the reset is for)
    bare = _run_python(f"from PySide6.QtWidgets import QApplication; a = QApplication([]); {probe}",
                       LC_ALL="C.UTF-8")
    assert bare != "C"
    ours = _run_python(f"from app.main import _make_app; a = _make_app(); {probe}", LC_ALL="C.UTF-8")
    assert ours == "C"


def test_the_app_frees_garbage_cycles_on_the_gui_thread_only(qtbot):
    """No automatic collection (it would run in any thread, pool workers included); a cycle that holds a
    QObject is freed by the GUI thread's timer, so its destructor runs there."""
    import gc
    import threading

    from PySide6.QtCore import QObject

    from app.main import collect_garbage_on_the_gui_thread

    collector = collect_garbage_on_the_gui_thread(interval_s=0.02)
    try:
        assert not gc.isenabled()
        class Owner:
            pass

        freed = []
        owner = Owner()
        owner.me, owner.qobject = owner, QObject()  # a cycle: only the collector frees it, and the QObject with it
        owner.qobject.destroyed.connect(lambda: freed.append(threading.current_thread() is threading.main_thread()))
        del owner
        allocated = [[] for _ in range(2 * gc.get_threshold()[0])]  # past generation 0's threshold (kept: a free counts down)
        qtbot.waitUntil(lambda: bool(freed), timeout=10_000)
        assert freed == [True] and allocated
    finally:
        collector.timer.stop()
        gc.enable()


def test_ctrl_c_closes_the_window_then_a_second_one_quits(qapp, monkeypatch):
    import signal

    from app.main import _install_sigint

    handlers, closes, quits = {}, [], []
    monkeypatch.setattr(signal, "signal", lambda sig, h: handlers.__setitem__(sig, h))
    monkeypatch.setattr(qapp, "quit", lambda: quits.append(1))
    heartbeat = _install_sigint(qapp, lambda: closes.append(1))
    assert heartbeat.isActive()  # Python gets control while Qt's loop runs
    handlers[signal.SIGINT](signal.SIGINT, None)
    qapp.processEvents()  # the close is deferred to the event loop (a signal handler must not re-enter Qt)
    assert closes == [1] and quits == []
    handlers[signal.SIGINT](signal.SIGINT, None)
    assert quits == [1]
    heartbeat.stop()


def test_screenshots_writes_one_png_per_panel(tmp_path):
    # The real CLI in a subprocess: it runs its own event loop and the engine's dry run (~7 s).
    out = tmp_path / "shots"
    full = dmad_env()
    full["QT_QPA_PLATFORM"] = "offscreen"
    full["XDG_CACHE_HOME"] = str(tmp_path / "cache")  # the Samples panel's thumbnails
    r = subprocess.run([sys.executable, "-m", "app", "--screenshots", str(out)], cwd=tmp_path, env=full,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    names = sorted(p.name for p in out.iterdir())
    assert names == sorted(f"{i + 1}-{p.lower()}.png" for i, p in enumerate(PANELS))
    for p in out.iterdir():
        img = QImage(str(p))
        assert (img.width(), img.height()) == (1280, 800), p
    assert not list(RECORDED_RUN.glob("control.jsonl"))  # the recorded run itself is never written


def test_ddp_or_fsdp_beside_processes_is_the_configs_distributed_setting(window, qtbot):
    """Picking FSDP edits the config (one source of truth, no silent override at Start); a config
    that says fsdp shows FSDP; the per-GPU estimate of each setting lands in its item."""
    from dmad.contract.memory import LedgerReport

    box = window.training.controls.sharding
    assert box.currentData() == "ddp" and window.config.config()["resources"].get("distributed", "ddp") == "ddp"
    box.setCurrentIndex(box.findData("fsdp"))
    assert window.config.config()["resources"]["distributed"] == "fsdp"
    raw = window.config.config()
    raw["resources"]["distributed"] = "ddp"
    window.config.apply_changes({"resources.distributed": "ddp"})
    qtbot.waitUntil(lambda: box.currentData() == "ddp")
    window.training.processes.setValue(4)
    assert window.config.ledger_view._processes == 4
    window.config.ledger_view.ledger_shown.emit(LedgerReport("framework", [], 27.6, {"processes": 4},
                                                             "sdxl", {"ddp": 115.2, "fsdp": 27.6}))
    assert [box.itemText(i) for i in range(box.count())] == ["DDP · 115 GiB/GPU", "FSDP · 28 GiB/GPU"]
