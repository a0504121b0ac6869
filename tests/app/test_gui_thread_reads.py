"""Issue 43, build 2: the app reads nothing from a run folder on the GUI thread.

Every open, stat and listing of a path inside the runs folder made from Python is recorded with the
thread that made it while the window opens a run (Training, Samples, Memory, Runs, Config), follows a
live run's events and compares two samples: none may come from the GUI thread. (Before: the Training
panel read status.json, config.json and engine.log's tail in open_run, the event follower read
events.jsonl on a QTimer, the prompt-set editor and Compare read and stat()ed run files, all on the GUI
thread.) A read that stalls (a network drive) holds a worker, never the event loop; an open that a newer
one overtook is dropped; a failed read is one line in the panel.
"""
from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path

from PySide6.QtCore import QSettings, QThread, QTimer
from PySide6.QtWidgets import QApplication

import dmad.contract.regular as regular
from app.engine.follow import EventFollower
from app.panels.training import TrainingPanel
from app.screenshots import RECORDED_RUN, prepare_recorded_run
from app.window import MainWindow
from tests.app.test_training_panel import WAIT_MS, _metric, append, write_run, xs

HANG_S = 60  # only a real hang waits this long


def _on_gui_thread() -> bool:
    return QThread.currentThread() is QApplication.instance().thread()


class GuiReads:
    """Records (call, path) of every open / stat / listing inside `root`'s run folders, and those made
    on the GUI thread. (The runs root itself is resolved on the GUI thread to name where Start puts a
    new run: app/models/run_target.py; that is a stat of the root, not a read of a run folder.)"""

    def __init__(self, monkeypatch, root: Path):
        self.root, self.seen, self.on_gui, self.paused = str(root) + os.sep, [], [], False
        for name in ("open", "stat", "lstat", "scandir", "listdir"):
            monkeypatch.setattr(os, name, self._wrap(name, getattr(os, name)))

    def _wrap(self, name, real):
        def call(path=".", *args, **kwargs):
            try:
                p = os.fsdecode(path) if not isinstance(path, int) else ""
            except TypeError:
                p = ""
            if not self.paused and p.startswith(self.root):
                self.seen.append((name, p))
                if _on_gui_thread():
                    self.on_gui.append((name, p))
            return real(path, *args, **kwargs)
        return call

    @contextlib.contextmanager
    def pause(self):
        """The test's own file writes (it plays the engine) are not the app's reads."""
        self.paused = True
        try:
            yield
        finally:
            self.paused = False


def _window(qtbot, tmp_path: Path) -> MainWindow:
    settings = QSettings(str(tmp_path / "settings.ini"), QSettings.IniFormat)
    w = MainWindow(settings, runs_root=tmp_path / "runs", load_nvml=lambda: (_ for _ in ()).throw(ImportError()),
                   unsaved_dir=tmp_path / "unsaved", probes_dir=tmp_path / "probes")
    qtbot.addWidget(w)
    return w


def test_opening_following_and_comparing_a_run_reads_nothing_on_the_gui_thread(qtbot, tmp_path, monkeypatch,
                                                                                 open_and_wait):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr("app.dialogs.close.ask_close_during_run", lambda *a: "leave")  # a failure never hangs
    recorded = prepare_recorded_run(RECORDED_RUN, tmp_path / "runs")
    live = write_run(tmp_path / "runs", "live", state="running")
    w = _window(qtbot, tmp_path)
    w.show()
    reads = GuiReads(monkeypatch, tmp_path / "runs")
    open_and_wait(w, live.path)  # a live run: its events.jsonl is followed, its status.json polled
    qtbot.waitUntil(lambda: len(xs(w.training, "loss_dm")) == 10, timeout=WAIT_MS)
    with reads.pause():
        append(live, b"".join(_metric(i) for i in range(11, 16)))
    qtbot.waitUntil(lambda: len(xs(w.training, "loss_dm")) == 15, timeout=WAIT_MS)
    with qtbot.waitSignal(w.training.source.status_reads.done, timeout=WAIT_MS):
        pass  # a status.json poll of the followed run
    open_and_wait(w, recorded)  # a finished run, in every tab
    for name in ("Samples", "Memory", "Runs", "Config", "Training"):
        w.show_panel(name)
        qtbot.wait(50)
    qtbot.waitUntil(lambda: w.samples.model.columnCount() == 3 and w.samples.model.filled(), timeout=WAIT_MS)
    qtbot.waitUntil(lambda: w.memory.readings.rowCount() == 1 and len(w.runs.rows()) == 2, timeout=WAIT_MS)
    qtbot.waitUntil(lambda: w.training.run_state.state == "finished", timeout=WAIT_MS)
    editor = w.samples.edit_prompt_set()
    assert editor is not None and editor.name.text() == "demo"
    editor.close()
    w.samples.grid.set_current_cell(0, 0)
    w.samples.mark("A")
    w.samples.grid.set_current_cell(0, 1)
    w.samples.mark("B")
    with qtbot.waitSignal(w.samples.ab.compared, timeout=WAIT_MS):
        assert w.samples.compare()
    w.samples.ab.close()
    assert {Path(p).name for _, p in reads.seen} >= {"events.jsonl", "status.json", "config.json", "engine.log",
                                                      "prompt_set.json", "gpu_mem.csv", "health.csv"}
    assert reads.on_gui == []


@contextlib.contextmanager
def _stalled(monkeypatch, file_name: str):
    """Opening `file_name` waits (a stalled network drive) until the block ends; a watchdog frees it
    after HANG_S, so code that waits on the GUI thread fails the test instead of hanging it."""
    gate, waited, fired = threading.Event(), [], []
    real = regular.open_regular

    def slow(path, *args, **kwargs):
        if Path(path).name == file_name:
            waited.append(_on_gui_thread())
            if not gate.wait(HANG_S):
                fired.append(True)
        return real(path, *args, **kwargs)

    monkeypatch.setattr(regular, "open_regular", slow)
    try:
        yield waited
    finally:
        gate.set()
    assert not fired, f"the GUI thread waited {HANG_S} s on {file_name}"


def _event_loop_turns(qtbot) -> bool:
    """A QTimer fires and qtbot.wait returns: the event loop is not held."""
    fired = []
    QTimer.singleShot(10, lambda: fired.append(True))
    qtbot.wait(100)
    return fired == [True]


def test_a_stalled_status_read_never_holds_the_window(qtbot, tmp_path, monkeypatch):
    run = write_run(tmp_path, "slow")
    panel = TrainingPanel()
    qtbot.addWidget(panel)
    with _stalled(monkeypatch, "status.json") as waited:
        assert panel.open_run(run.path)
        qtbot.waitUntil(lambda: waited == [False], timeout=WAIT_MS)  # a worker waits, not the GUI thread
        assert _event_loop_turns(qtbot)
        assert panel.opening() == run.path and panel.run_state.run_dir is None
        assert panel.note_label.text() == "reading slow ..."
        assert not any(b.isEnabled() for key, b in panel.buttons.items() if key != "start")
    with qtbot.waitSignal(panel.opened, timeout=WAIT_MS):
        pass  # the read goes on once the drive answers
    assert panel.run_state.run_dir == run.path and panel.opening() is None
    qtbot.waitUntil(lambda: panel.run_state.state == "finished" and len(xs(panel, "loss_dm")) == 10, timeout=WAIT_MS)
    assert "log line 19" in panel.log_view.toPlainText()


def test_a_stalled_events_read_never_holds_the_window(qtbot, tmp_path, monkeypatch):
    run = write_run(tmp_path, "slow")
    follower = EventFollower(run.events_jsonl, poll_ms=20)
    got: list = []
    follower.events_received.connect(got.extend)
    with _stalled(monkeypatch, "events.jsonl") as waited:
        follower.start(live=True)
        qtbot.waitUntil(lambda: len(waited) == 1, timeout=WAIT_MS)
        assert waited == [False] and _event_loop_turns(qtbot)
        qtbot.wait(100)  # polls meanwhile: the read in flight answers for them, none piles up
        assert len(waited) == 1 and got == []
    qtbot.waitUntil(lambda: len([e for e in got if e["kind"] == "metric"]) == 10, timeout=WAIT_MS)
    follower.stop()


def test_an_open_overtaken_by_another_is_dropped(qtbot, tmp_path, monkeypatch, open_and_wait):
    slow, fast = write_run(tmp_path, "slow", state="stopped"), write_run(tmp_path, "fast")
    panel = TrainingPanel()
    qtbot.addWidget(panel)
    shown = []
    panel.opened.connect(shown.append)
    real = regular.open_regular
    gate = threading.Event()

    def slow_status(path, *args, **kwargs):
        if Path(path) == slow.status_json:
            gate.wait(HANG_S)
        return real(path, *args, **kwargs)

    monkeypatch.setattr(regular, "open_regular", slow_status)
    try:
        assert panel.open_run(slow.path)
        assert open_and_wait(panel, fast.path)  # the user opened another run meanwhile
    finally:
        gate.set()
    qtbot.waitUntil(lambda: not panel.opener.busy(), timeout=WAIT_MS)
    qtbot.wait(100)
    assert shown == [fast.path] and panel.run_state.run_dir == fast.path
    qtbot.waitUntil(lambda: panel.run_state.state == "finished", timeout=WAIT_MS)
    panel._clear()


def test_a_read_that_fails_is_one_line_in_the_panel(qtbot, tmp_path, monkeypatch, capfd):
    run = write_run(tmp_path, "odd")

    def broken(run_dir):
        raise OSError(5, "Input/output error\non the drive")  # a dying network drive

    monkeypatch.setattr("app.panels.training_open.read_opened_run", broken)
    panel = TrainingPanel()
    qtbot.addWidget(panel)
    with qtbot.waitSignal(panel.opened, timeout=WAIT_MS) as blocker:
        assert panel.open_run(run.path)
    assert blocker.args == [run.path] and panel.opening() is None and panel.run_state.run_dir is None
    assert panel.note_label.text() == "could not open odd: OSError: [Errno 5] Input/output error on the drive"
    assert "Traceback" not in capfd.readouterr().err
