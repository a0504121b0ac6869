"""DMAD Studio end to end: the real engine on a tiny random pipeline, driven from the window.

1. Start from the UI, see points arrive on the plots, Stop, see the checkpoint and "stopped".
2. Close the window with "Leave it running": the engine outlives the app; a new window opened on
   the run folder reattaches and continues the curves to the end, without gaps or duplicates.
"""
from __future__ import annotations

import csv
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from PySide6.QtCore import QSettings, Qt

from dmad.contract.runs import RunFolder, effective_state
from tests.conftest import REPO, dmad_env

pytest.importorskip("torch")  # the engine trains; the app itself never imports torch

from app.window import MainWindow  # noqa: E402

WAIT_MS = 600_000  # a hang guard for a loaded 2-core CI machine, not a performance target


def no_nvml():
    raise ImportError("no NVML in tests")


def _window(qtbot, tmp_path: Path, **kw) -> MainWindow:
    settings = QSettings(str(tmp_path / "settings.ini"), QSettings.IniFormat)
    w = MainWindow(settings, runs_root=tmp_path / "runs", load_nvml=no_nvml, unsaved_dir=tmp_path / "unsaved", **kw)
    qtbot.addWidget(w)
    w.show()
    return w


def _plotted(w: MainWindow) -> dict[str, int]:
    """Points on screen per loss curve (what setData gave pyqtgraph, not the store behind it)."""
    out = {}
    for key in w.training.loss_plot.loss_keys():
        x, _ = w.training.loss_plot.curve(key).getData()
        out[key] = 0 if x is None else len(x)
    return out


def _logged_iters(run: Path) -> list[int]:
    with open(run / "metrics.csv", newline="", encoding="utf-8") as f:
        return [int(r["iter"]) for r in csv.DictReader(f)]


@pytest.mark.slow
def test_start_watch_and_stop_a_run_from_the_window(qtbot, tmp_path, write_config):
    cfg = write_config({"optimization": {"max_train_steps": 100000},
                        "observation": {"log_every_steps": 1, "checkpointing_steps": 100000,
                                        "gpu_mem_interval_s": 0.5}})
    w = _window(qtbot, tmp_path, config_path=cfg)
    start = w.training.buttons["start"]
    assert w.config.is_valid() and start.isEnabled()

    qtbot.mouseClick(start, Qt.LeftButton)
    assert w.tabs.currentWidget() is w.training
    qtbot.waitUntil(lambda: any(n >= 3 for n in _plotted(w).values()), timeout=WAIT_MS)
    run = w.training.run_state.run_dir
    assert run is not None and run.parent == tmp_path / "runs"
    assert w.samples.run_dir() == run and run.name in w.windowTitle() and "running" in w.windowTitle()
    step_x, _ = w.training.step_plot.curve(w.training.step_plot.curve_keys()[0]).getData()
    assert len(step_x) >= 1  # step time arrives with the losses

    w.training.buttons["stop"].click()
    qtbot.waitUntil(lambda: w.training.run_state.state == "stopped", timeout=WAIT_MS)
    ckpts = RunFolder(run).list_checkpoints()
    assert ckpts, "a graceful stop saves a checkpoint"
    assert json.loads((run / "status.json").read_text())["state"] == "stopped"
    assert "stopped" in w.windowTitle() and not w.training.run_state.is_live()
    assert json.loads((run / "events.jsonl").read_text().splitlines()[-1])["kind"] == "stopped"
    w.close()


HOST = """
import sys
from pathlib import Path
from PySide6.QtCore import QSettings, QTimer
from PySide6.QtWidgets import QApplication, QMessageBox
from app.main import _make_app
from app.window import MainWindow

tmp, cfg = Path(sys.argv[1]), Path(sys.argv[2])
app = _make_app()
QMessageBox.exec = lambda box: QMessageBox.No  # the user answers "Leave it running"

def no_nvml():
    raise ImportError("no NVML")

w = MainWindow(QSettings(str(tmp / "host.ini"), QSettings.IniFormat), runs_root=tmp / "runs",
               load_nvml=no_nvml, config_path=cfg, unsaved_dir=tmp / "unsaved")
w.show()

def check():
    # close once a few iterations are plotted: the rest of the run happens after this app is gone
    if w.training.store.get("loss_c") is not None and len(w.training.store.get("loss_c")) >= 3:
        print(w.training.run_state.run_dir, flush=True)
        w.close()
        app.quit()
    else:
        QTimer.singleShot(50, check)

w.training.start_requested.emit()
check()
sys.exit(app.exec())
"""


@pytest.mark.slow
def test_leave_it_running_then_reattach_through_the_folder(qtbot, tmp_path, write_config):
    cfg = write_config({"optimization": {"max_train_steps": 120},
                        "observation": {"log_every_steps": 1, "checkpointing_steps": 60,
                                        "gpu_mem_interval_s": 0.5}})
    host = tmp_path / "host.py"
    host.write_text(textwrap.dedent(HOST), encoding="utf-8")
    env = dmad_env()
    env["QT_QPA_PLATFORM"] = "offscreen"
    r = subprocess.run([sys.executable, str(host), str(tmp_path), str(cfg)], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=WAIT_MS / 1000)
    assert r.returncode == 0, r.stderr[-3000:]
    run = Path(r.stdout.strip().splitlines()[-1])
    status = RunFolder(run).read_status()
    assert effective_state(status) in ("running", "finished"), status  # the app is gone, the engine is not

    w = _window(qtbot, tmp_path)
    w.open_run(run)
    qtbot.waitUntil(lambda: w.training.opening() is None, timeout=WAIT_MS)  # the run's files are read in a worker
    assert w.training.run_state.run_dir == run
    assert w.training.run_state.state == "running"  # a reattach, not the replay of a finished run
    qtbot.waitUntil(lambda: w.training.run_state.state == "finished", timeout=WAIT_MS)
    x, _ = w.training.store.get("loss_c").view()
    assert list(x.astype(int)) == _logged_iters(run) == list(range(1, 121))  # every iteration once
    assert RunFolder(run).read_status()["state"] == "finished"
    assert [i for i, _ in RunFolder(run).list_checkpoints()] == [60, 120]
    w.close()
