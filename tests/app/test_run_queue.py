"""The run queue: the queue file (app/models/run_queue.py), and the window running queued configs one
after another (app/models/queue_runner.py) through an app restart, with a config made invalid after it
was queued (skipped, with the reason). The engine is a small script that behaves like `dmad train`
(a run folder per run, Stop with a checkpoint, Continue from it). No torch."""
from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest
from PySide6.QtCore import QSettings
from PySide6.QtWidgets import QMessageBox

import app.engine.process as engine_process
import app.window as window_module
from app.models.run_queue import FINISHED, INTERRUPTED, RUNNING, SKIPPED, WAITING, RunQueue
from app.window import MainWindow

WAIT_MS = 30_000


# ---------------------------------------------------------------- the queue file

def test_entries_are_copies_kept_in_order_and_saved_atomically(tmp_path):
    q = RunQueue(tmp_path / "queue")
    a = q.add({"identity": {"run_name": "a"}}, "a.json", now=1.0)
    b = q.add({"identity": {"run_name": "b"}}, "b.json", now=2.0)
    c = q.add({"identity": {"run_name": "c"}}, "untitled (preset CPU demo)", now=3.0)
    assert json.loads(Path(b.config).read_text())["identity"]["run_name"] == "b"
    assert len({a.id, b.id, c.id}) == 3
    assert q.move(c.id, -1) and [e.label for e in q.entries] == ["a.json", "untitled (preset CPU demo)", "b.json"]
    assert not q.move(a.id, -1)  # already first
    q.mark(a.id, RUNNING, run_dir=tmp_path / "runs" / "a")
    assert not q.move(a.id, +1) and not q.move(c.id, -1)  # only among the waiting ones
    assert not q.remove(a.id)  # under way
    assert q.remove(b.id) and not Path(b.config).exists()
    q.set_active(True)
    again = RunQueue(tmp_path / "queue").load()
    assert [(e.id, e.state, e.run_dir) for e in again.entries] == [(a.id, RUNNING, str(tmp_path / "runs" / "a")),
                                                                 (c.id, WAITING, "")]
    assert again.active and again.problem == "" and again.under_way().id == a.id
    assert sorted(p.name for p in (tmp_path / "queue").iterdir()) == ["configs", "queue.json"]  # no temp files left
    q.mark(a.id, FINISHED, "finished")
    q.mark(c.id, SKIPPED, "bad path")
    assert q.summary() == "2 runs: 1 finished, 1 skipped" and q.pending() == 0
    assert q.clear_ended() == 2 and q.entries == []


def test_a_damaged_queue_file_is_kept_aside_and_said(tmp_path):
    folder = tmp_path / "queue"
    folder.mkdir()
    (folder / "queue.json").write_text('{"entries": [', encoding="utf-8")
    q = RunQueue(folder).load()
    assert q.entries == [] and "the run queue could not be read" in q.problem and "queue.json.bad" in q.problem
    assert (folder / "queue.json.bad").exists() and not (folder / "queue.json").exists()
    good = {"id": "q1", "label": "x", "config": "/c.json", "added": 1.0, "state": "waiting"}
    (folder / "queue.json").write_text(json.dumps({"entries": [good, {"id": 3}, dict(good, state="odd")]}))
    q = RunQueue(folder).load()
    assert [e.id for e in q.entries] == ["q1"] and q.problem.startswith("2 entries of")


# ---------------------------------------------------------------- the window runs a queue through a restart

ENGINE = textwrap.dedent(r'''
    import json, os, sys, time
    from pathlib import Path
    from dmad.contract.events import make_event
    from dmad.contract.runs import RunFolder, atomic_write_json

    record, argv = Path(sys.argv[1]), sys.argv[2:]
    with open(record, "a") as f:
        f.write(json.dumps(argv) + "\n")
    raw = json.loads(Path(argv[argv.index("--config") + 1]).read_text())
    if "--run-dir" in argv:  # Continue
        run = RunFolder(Path(argv[argv.index("--run-dir") + 1]))
        first = run.latest_checkpoint()[0] + 1
    else:
        out = next(json.loads(a.split("=", 1)[1]) for a in argv if a.startswith("identity.output_dir="))
        run = RunFolder.create(Path(out) / raw["identity"]["run_name"])
        atomic_write_json(run.config_json, raw)
        first = 1

    def emit(kind, it=None, **data):
        line = make_event(kind, it, **data).to_line() + "\n"
        with open(run.events_jsonl, "a") as f:
            f.write(line)
        sys.stdout.write(line)
        sys.stdout.flush()

    atomic_write_json(run.status_json, {"state": "running", "pid": os.getpid(), "heartbeat": time.time()})
    emit("started", None, run_dir=str(run.path), max_train_steps=6)
    for i in range(first, first + 3):
        emit("metric", i, loss_dm=1.0 / i, step_time_s=0.1, max_train_steps=6, eta_s=1.0)
    if (record.parent / "hold").exists():  # a long run: until the app stops it
        while not (run.control_jsonl.exists() and '"stop"' in run.control_jsonl.read_text()):
            time.sleep(0.05)
        run.checkpoint_path(first + 2).mkdir(parents=True)
        atomic_write_json(run.latest_json, {"iter": first + 2, "path": f"iter_{first + 2}"})
        atomic_write_json(run.status_json, {"state": "stopped", "last_checkpoint": first + 2})
        emit("stopped", first + 2, last_checkpoint=first + 2)
        sys.exit(0)
    atomic_write_json(run.status_json, {"state": "finished"})
    emit("finished", first + 2, elapsed_s=1.0, start_iter=first - 1)
    time.sleep(1.0)  # as the real engine: the finished event, then a while until the process exits
''')


def _answer(monkeypatch, text: str, asked: list) -> None:
    def exec_(box):
        labels = [b.text().replace("&", "") for b in box.buttons()]
        if "Discard" in labels:  # the unsaved config edits (run_name) are not what this test is about
            return QMessageBox.Discard
        asked.append(f"{box.text()} {box.informativeText()}")
        found = [b for b in box.buttons() if b.text().replace("&", "").startswith(text)]
        assert found, f"no button {text!r} in {[b.text() for b in box.buttons()]}"
        return box.standardButton(found[0])
    monkeypatch.setattr(QMessageBox, "exec", exec_)


@pytest.fixture
def queue_window(qtbot, tmp_path, monkeypatch):
    script = tmp_path / "engine.py"
    script.write_text(ENGINE, encoding="utf-8")
    monkeypatch.setattr(engine_process, "engine_argv", lambda: [sys.executable, str(script), str(tmp_path / "argv")])
    monkeypatch.setattr(window_module, "QUEUE_RESUME_MS", 50)
    monkeypatch.setattr(window_module, "QUEUE_NEXT_MS", 50)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))

    def make() -> MainWindow:
        settings = QSettings(str(tmp_path / "settings.ini"), QSettings.IniFormat)
        w = MainWindow(settings, runs_root=tmp_path / "runs", load_nvml=lambda: (_ for _ in ()).throw(ImportError()),
                       unsaved_dir=tmp_path / "unsaved", queue_dir=tmp_path / "queue")
        qtbot.addWidget(w)
        return w
    return make


def test_a_queue_of_three_finishes_through_a_restart_and_skips_an_invalid_config(qtbot, queue_window, tmp_path,
                                                                                 monkeypatch):
    w = queue_window()
    w.show()
    qtbot.waitUntil(w.config.is_valid, timeout=WAIT_MS)  # the CPU demo preset; its paths checked
    for name in ("first", "second", "third"):
        w.config.apply_changes({"identity.run_name": name})
        assert w.queue_config()
    runner = w.queue_runner
    first, second, third = runner.queue.entries
    assert w.queue.table.rowCount() == 3 and w.queue.table.item(1, 1).text() == "waiting"
    assert w.queue.status.full_text() == "Not started: Start queue runs them · 3 waiting"
    # the second becomes invalid after it was queued: its data folder is gone
    raw = json.loads(Path(second.config).read_text())
    raw["identity"]["train_data_dir"] = str(tmp_path / "moved-away")
    Path(second.config).write_text(json.dumps(raw))
    (tmp_path / "hold").touch()  # the first run trains until stopped
    w.queue.buttons["run"].click()
    qtbot.waitUntil(lambda: w.run_state.state == "running" and runner.queue.get(first.id).run_dir != "",
                    timeout=WAIT_MS)
    assert w.queue.buttons["run"].text() == "Pause queue"
    asked: list[str] = []
    _answer(monkeypatch, "Stop the run (save a checkpoint)", asked)
    w.close()  # waits for the engine's checkpoint, then closes
    qtbot.waitUntil(lambda: not w.isVisible() and not w.run_state.is_live(), timeout=WAIT_MS)
    assert len(asked) == 1 and "first is still training" in asked[0]
    assert "The queue keeps its 2 waiting runs: it goes on when DMAD Studio opens again" in asked[0]
    saved = RunQueue(tmp_path / "queue").load()
    assert saved.active and saved.get(first.id).state == INTERRUPTED

    (tmp_path / "hold").unlink()
    w2 = queue_window()  # the app opens again: the queue goes on by itself
    w2.show()
    runner2 = w2.queue_runner
    qtbot.waitUntil(lambda: not runner2.queue.active and runner2.queue.pending() == 0, timeout=WAIT_MS)
    states = {e.id: (e.state, e.reason) for e in runner2.queue.entries}
    assert states[first.id] == (FINISHED, "finished at iteration 6: 3 iterations in 1 s after continuing from 3")
    assert states[third.id] == (FINISHED, "finished 3 iterations in 1 s")  # its own run's words, not the first's
    assert states[second.id] == (SKIPPED, f"identity.train_data_dir: not found: {tmp_path / 'moved-away'}")
    argv = [json.loads(line) for line in (tmp_path / "argv").read_text().splitlines()]
    assert len(argv) == 3 and "--resume" in argv[1] and argv[1][argv[1].index("--run-dir") + 1].endswith("first")
    assert any(a.endswith('"' + str(tmp_path / "runs") + '"') for a in argv[2]) and "--run-dir" not in argv[2]
    sent = runner2.parent().notifier.sent
    assert ("Queue done", "3 runs: 2 finished, 1 skipped") in sent
    assert any(title == "Queue: run skipped" and "moved-away" in text for title, text in sent)
    assert (tmp_path / "runs" / "third").is_dir() and not (tmp_path / "runs" / "second").exists()
    assert w2.queue.status.full_text().startswith("Queue idle (done: 3 runs")
    w2.training._clear()


def test_stop_pauses_the_queue_and_closing_asks_about_what_waits(qtbot, queue_window, tmp_path, monkeypatch):
    w = queue_window()
    w.show()
    qtbot.waitUntil(w.config.is_valid, timeout=WAIT_MS)
    for name in ("one", "two"):
        w.config.apply_changes({"identity.run_name": name})
        assert w.queue_config()
    runner = w.queue_runner
    one, two = runner.queue.entries
    (tmp_path / "hold").touch()
    runner.start()
    qtbot.waitUntil(lambda: w.run_state.state == "running", timeout=WAIT_MS)
    w.queue.select(one.id)
    assert not w.queue.buttons["remove"].isEnabled()  # under way
    w.training.stop_run()  # the user steps in: the queue pauses after this run
    qtbot.waitUntil(lambda: runner.queue.get(one.id).state == "stopped", timeout=WAIT_MS)
    assert not runner.queue.active and "one" not in runner.queue.data.note  # its label is the preset's
    assert runner.queue.data.note.startswith("paused: untitled (preset CPU demo) was stopped")
    assert runner.queue.get(two.id).state == WAITING and w.queue.buttons["run"].text() == "Start queue"
    runner.queue.set_active(True)  # as if it were running between two runs
    asked: list[str] = []
    _answer(monkeypatch, "Pause the queue", asked)
    assert w.close()
    assert asked == ["The queue has 1 queued run to do. What should happen to it? The queue is kept either way "
                     "(the Queue tab); nothing runs while the app is closed."]
    assert not RunQueue(tmp_path / "queue").load().active
