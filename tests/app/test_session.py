"""The session remembered between launches (app/models/session.py and the window): the config's unsaved
edits as a draft (written as they happen, so a kill loses nothing; "Keep as a draft" at close), the
saved config file, the last tab, and a run left training, followed again. No torch."""
from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

import pytest
from PySide6.QtCore import QSettings
from PySide6.QtWidgets import QMessageBox

from app.models.session import Draft, find_live_run, read_draft, write_draft
from app.window import MainWindow
from dmad.contract.runs import RunFolder, atomic_write_json

WAIT_MS = 30_000


def test_draft_round_trip_and_a_damaged_one_is_ignored(tmp_path):
    write_draft(tmp_path, Draft({"identity": {"run_name": "x"}}, tmp_path / "base", None, "untitled (preset CPU demo)"))
    got = read_draft(tmp_path)
    assert got == Draft({"identity": {"run_name": "x"}}, tmp_path / "base", None, "untitled (preset CPU demo)")
    (tmp_path / "draft.json").write_text("{", encoding="utf-8")
    assert read_draft(tmp_path) is None and read_draft(tmp_path / "none") is None


def _run(root: Path, name: str, state: str, beat: float, pid: int) -> Path:
    run = RunFolder.create(root / name)
    atomic_write_json(run.status_json, {"state": state, "pid": pid, "host": socket.gethostname(), "heartbeat": beat})
    return run.path


def test_find_live_run_takes_the_one_still_beating(tmp_path):
    now = time.time()
    _run(tmp_path, "a-finished", "finished", now, os.getpid())
    _run(tmp_path, "b-dead", "running", now, 2**31 - 2)  # its process is gone: failed, not live
    _run(tmp_path, "c-stale", "running", now - 3600, os.getpid())
    assert find_live_run(tmp_path) is None
    live = _run(tmp_path, "d-live", "paused", now, os.getpid())
    assert find_live_run(tmp_path) == live and find_live_run(tmp_path / "none") is None


@pytest.fixture
def launch(qtbot, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    made = []

    def make() -> MainWindow:
        settings = QSettings(str(tmp_path / "settings.ini"), QSettings.IniFormat)
        w = MainWindow(settings, runs_root=tmp_path / "runs", load_nvml=lambda: (_ for _ in ()).throw(ImportError()),
                       unsaved_dir=tmp_path / "unsaved", queue_dir=tmp_path / "queue", session_dir=tmp_path / "session")
        qtbot.addWidget(w)
        made.append(w)
        return w
    yield make
    for w in made:
        w.training._clear()


def _answer(monkeypatch, label: str) -> None:
    def exec_(box):
        found = [b for b in box.buttons() if b.text().replace("&", "").startswith(label)]
        assert found, [b.text() for b in box.buttons()]
        return box.standardButton(found[0])
    monkeypatch.setattr(QMessageBox, "exec", exec_)


def test_unsaved_edits_and_the_tab_come_back_at_the_next_launch(qtbot, launch, tmp_path, monkeypatch):
    w = launch()
    w.config.apply_changes({"resources.train_batch_size": 3})
    qtbot.waitUntil(lambda: (tmp_path / "session" / "draft.json").exists(), timeout=WAIT_MS)  # a kill loses nothing
    w.show_panel("Samples")
    _answer(monkeypatch, "Keep as a draft")
    assert w.close()
    w2 = launch()
    qtbot.waitUntil(lambda: w2.config.config().get("resources", {}).get("train_batch_size") == 3, timeout=WAIT_MS)
    assert w2.config.has_unsaved_changes() and w2.tabs.tabText(w2.tabs.currentIndex()) == "Samples"
    assert "Reopened untitled (preset CPU demo) as it was" in w2.statusBar().currentMessage()
    # saved at close: the file is what reopens, and no draft is left
    _answer(monkeypatch, "Save")
    monkeypatch.setattr(w2.config, "save_before_close", lambda: w2.config.save_to(tmp_path / "mine.json"))
    assert w2.close()
    assert not (tmp_path / "session" / "draft.json").exists()
    w3 = launch()
    qtbot.waitUntil(lambda: w3.config.doc.path == tmp_path / "mine.json", timeout=WAIT_MS)
    assert not w3.config.has_unsaved_changes()
    assert json.loads((tmp_path / "mine.json").read_text())["resources"]["train_batch_size"] == 3


def test_a_run_left_training_is_followed_again(qtbot, launch, tmp_path, monkeypatch):
    run = _run(tmp_path / "runs", "still-going", "running", time.time(), os.getpid())  # this process: alive
    atomic_write_json(RunFolder(run).config_json, {"config_version": 1})
    w = launch()
    qtbot.waitUntil(lambda: w.run_dir() == run and w.training.opening() is None, timeout=WAIT_MS)
    assert "still-going: it is still training from the last session" in w.statusBar().currentMessage()
    assert w.run_state.is_live()
    _answer(monkeypatch, "Leave it running")  # the close asks about a live run: it goes on
    assert w.close()
