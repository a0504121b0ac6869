"""A run folder's small JSON files as a hostile user (or a broken disk) leaves them: nested deeper
than Python's parser can recurse, larger than any the engine writes, not UTF-8. Each becomes one
line where the app shows the file, never a traceback, and the other runs and files still show.
(Before: a deeply nested config.json raised RecursionError out of the Training panel's open_run
and ended the Runs table's whole scan.) No torch."""
from __future__ import annotations

import contextlib
import json
import os
import socket
import stat
import threading
import time
from pathlib import Path

import pytest

from app.dialogs.prompt_set_editor import PromptSetEditor
from app.engine.follow import EventFollower
from app.models.data_report import load_report
from app.models.methods import read_method
from app.models.probe_result import load_probe
from app.models.run_scan import ScanCache, scan_root
from app.models.thumbs import ThumbCache
from app.panels.samples import SamplesPanel
from app.panels.training import TrainingPanel
from app.screenshots import RECORDED_RUN, prepare_recorded_run
from dmad.contract.events import parse_line
from dmad.contract.jsonfile import RUN_FILE_MAX_BYTES, read_json_or_problem
from dmad.contract.memory import parse_ledger
from dmad.contract.runs import RunFolder, append_control, atomic_write_json

DEEP = "[" * 100_000 + "]" * 100_000  # json.loads raises RecursionError, which is not a ValueError


def _run(root: Path, name: str) -> RunFolder:
    run = RunFolder.create(root / name)
    atomic_write_json(run.config_json, {"config_version": 2, "distillation": {"method": "lcm"}})
    atomic_write_json(run.status_json, {"state": "finished", "pid": os.getpid(), "host": socket.gethostname(),
                                        "heartbeat": time.time()})
    return run


def _giant(path: Path) -> None:
    """A valid JSON object one byte over the limit: valid, yet never read."""
    pad = RUN_FILE_MAX_BYTES - len('{"state": "finished", "x": ""}') + 1
    path.write_text('{"state": "finished", "x": "' + "a" * pad + '"}')


def test_each_fault_is_one_line_naming_the_file(tmp_path):
    cases = {"deep.json": DEEP, "bad.json": '{"a": 1,,}', "digits.json": "1" * 5000}
    for name, text in cases.items():
        (tmp_path / name).write_text(text)
    (tmp_path / "latin1.json").write_bytes('{"caf\xe9": 1}'.encode("latin-1"))
    (tmp_path / "ok.json").write_text('{"a": [1, 2]}')
    problems = {name: read_json_or_problem(tmp_path / name) for name in (*cases, "latin1.json", "missing.json")}
    assert problems["deep.json"] == (None, "deep.json is nested too deeply to read")
    assert problems["bad.json"] == (None, "bad.json is not valid JSON (line 1, column 9: Expecting property name "
                                          "enclosed in double quotes)")
    assert problems["latin1.json"] == (None, "latin1.json is not UTF-8 text")
    assert problems["digits.json"][1].startswith("digits.json is not valid JSON: ")
    assert problems["missing.json"][1].startswith("missing.json cannot be read: ")
    assert all(v is None and "\n" not in p for v, p in problems.values())
    assert read_json_or_problem(tmp_path / "ok.json") == ({"a": [1, 2]}, "")
    assert read_json_or_problem(tmp_path / "ok.json", max_bytes=12) == (
        None, "ok.json is larger than 0 MiB, more than any the engine writes: not read")


def test_the_runs_table_lists_every_run_and_says_what_is_wrong_with_the_hostile_ones(tmp_path):
    good, deep_config, giant_status = _run(tmp_path, "good"), _run(tmp_path, "deep_config"), _run(tmp_path, "giant")
    deep_config.config_json.write_text(DEEP)
    _giant(giant_status.status_json)
    rows = {r.name: r for r in scan_root(tmp_path, ScanCache())}
    assert set(rows) == {"good", "deep_config", "giant"}
    assert rows["good"].state == "finished" and rows["good"].reason == ""
    assert rows["deep_config"].state == "finished" and rows["deep_config"].reason == "config.json is nested too deeply to read"
    assert rows["giant"].state == "error" and "status.json is larger than 4 MiB" in rows["giant"].reason
    assert good.read_status()["state"] == "finished" and giant_status.read_status() is None  # polled on the GUI thread


def test_the_training_panel_opens_a_run_whose_config_is_hostile(qtbot, tmp_path, open_and_wait):
    run = _run(tmp_path, "r")
    assert read_method(run.config_json) == "lcm"
    run.config_json.write_text(DEEP)
    assert read_method(run.config_json) is None
    panel = TrainingPanel()
    qtbot.addWidget(panel)
    assert open_and_wait(panel, run.path)  # raised RecursionError before
    assert panel.run_state.run_dir == run.path


def test_the_prompt_set_editor_says_why_a_hostile_set_is_not_shown(qtbot, tmp_path):
    run = prepare_recorded_run(RECORDED_RUN, tmp_path / "runs")
    (run / "prompt_set.json").write_text(DEEP)
    panel = SamplesPanel(cache=ThumbCache(tmp_path / "thumbs"), prompt_set_dir=tmp_path / "mine")
    qtbot.addWidget(panel)
    panel.set_run(run)
    assert panel.edit_prompt_set() is None  # until the listing (and the prompt set with it) is read in a worker
    qtbot.waitUntil(lambda: panel.buttons["prompts"].isEnabled(), timeout=5000)
    editor = panel.edit_prompt_set()  # raised RecursionError before
    assert editor.message.text() == "The run's prompt set is not shown: prompt_set.json is nested too deeply to read"
    assert editor.name.text() == "my_prompts" and editor.windowTitle() != "Prompt set - prompt_set.json"  # a new set
    with pytest.raises(ValueError, match="^prompt_set.json is nested too deeply to read$"):
        editor.load_file(run / "prompt_set.json")  # the editor's Open shows this line
    editor.close()
    good = PromptSetEditor(tmp_path / "mine", [], None)
    qtbot.addWidget(good)
    (tmp_path / "set.json").write_text(json.dumps({"prompt_set": "p", "version": "v1", "items": [{"prompt": "x"}]}))
    good.load_file(tmp_path / "set.json")
    assert good.name.text() == "p" and good.items.rowCount() == 1 and good.windowTitle() == "Prompt set - set.json"


def test_a_hostile_report_probe_or_ledger_is_one_line(tmp_path):
    (tmp_path / "report.json").write_text(DEEP)
    (tmp_path / "probe.json").write_text(DEEP)
    with pytest.raises(ValueError, match="nested too deeply$"):
        load_report(tmp_path / "report.json")
    with pytest.raises(ValueError, match="nested too deeply$"):
        load_probe(tmp_path)
    with pytest.raises(ValueError, match=r"^the ledger is not JSON \(nested too deeply\)$"):
        parse_ledger(DEEP)


# ---------------------------------------------------------------- issue 43, W4 and T2-T5
# A FIFO (or a folder, a device) where a run keeps a file hung the Runs scan, the Training panel and
# the Samples panel (status.json read on the GUI thread froze the window); one hostile value (a pid of
# 2**31, a metrics iter of 1e999, an event "t": "x", a state that is an object) ended the whole scan or
# raised in the panel. A watchdog opens a FIFO's other end after HANG_S, so a regression fails here
# instead of hanging the suite.

HANG_S = 60
needs_fifo = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")


@contextlib.contextmanager
def _no_hang(*fifos: Path):
    """Fails the test when its body waited HANG_S on one of `fifos`; from then on the FIFOs' other
    ends are opened again and again, so each blocked open returns and the test ends."""
    done, fired = threading.Event(), []

    def free() -> None:
        if done.wait(HANG_S):
            return
        fired.append(True)
        while not done.wait(0.05):
            for f in fifos:
                try:
                    os.close(os.open(f, os.O_RDWR | os.O_NONBLOCK))
                except OSError:
                    pass

    watchdog = threading.Thread(target=free, daemon=True)
    watchdog.start()
    try:
        yield
    finally:
        done.set()
        watchdog.join()
    assert not fired, f"blocked for {HANG_S} s on a FIFO"


def _full_run(root: Path, name: str) -> RunFolder:
    """A finished run with every file the scan and the panels read."""
    run = _run(root, name)
    run.metrics_csv.write_text("iter,loss_dm\n1,0.5\n2,0.4\n")
    started = {"v": 1, "t": time.time(), "kind": "started", "iter": None, "data": {}}
    metric = {"v": 1, "t": time.time(), "kind": "metric", "iter": 2, "data": {"loss_dm": 0.4}}
    run.events_jsonl.write_text(json.dumps(started) + "\n" + json.dumps(metric) + "\n")
    run.control_jsonl.write_text("")
    run.gpu_mem_csv.write_text("t,scope,mem_used_gb,mem_total_gb\n1,process_rss,1.0,\n")
    run.engine_log.write_text("a log line\n")
    run.prompt_set_json.write_text(json.dumps({"prompt_set": "p", "version": "v1", "items": []}))
    (run.checkpoints_dir / "iter_2").mkdir()
    atomic_write_json(run.latest_json, {"iter": 2, "path": "iter_2"})
    return run


FIFO_FILES = ["status.json", "config.json", "metrics.csv", "events.jsonl", "control.jsonl", "gpu_mem.csv",
              "checkpoints/latest.json", "engine.lock", "logs/engine.log", "prompt_set.json", "note.txt"]
FOLDER_FILES = ["status.json", "config.json", "metrics.csv", "events.jsonl", "prompt_set.json",
                "checkpoints/latest.json", "control.jsonl"]
GARBAGE = bytes(range(256)) * 4 + b"\xff\xfe\x00{{{"
STATUS_VALUES = {"pid": [2**31, 2**63, -1, "x", True], "state": [{"a": 1}, [1], "bogus", 5],
                 "heartbeat": ["x", 1e308], "iter": [10**30, -1], "last_checkpoint": ["x"],
                 "max_train_steps": [[1]], "exit_code": [10**40], "failure_reason": [{}]}
METRICS_ROWS = ["1e999,0.3", "nan,0.3", "1" + "0" * 30 + ",0.3", "3,1e999", "inf,inf"]
EVENT_LINES = ['{"v":1,"t":"x","kind":"metric","iter":3,"data":{}}', '{"v":[1],"t":1,"kind":"metric","iter":3,"data":{}}',
               '{"v":1,"t":1,"kind":"metric","iter":1e999,"data":{}}', '{"v":1,"t":1,"kind":"metric","iter":3,"data":[]}',
               '{"v":1,"t":1,"kind":"metric","iter":3,"data":{"loss_dm":1' + "0" * 400 + '}}',
               '{"v":1,"t":1,"kind":5,"iter":3,"data":{}}']


def _hostile_runs(root: Path) -> dict[str, str]:
    """~60 runs, each with one hostile file or value; name: what its row's reason must say ("" where
    the scan does not read that file and the run shows as it is)."""
    expect: dict[str, str] = {}
    for i, name in enumerate(FIFO_FILES):
        run = _full_run(root, f"fifo_{i}")
        (run.path / name).unlink(missing_ok=True)
        os.mkfifo(run.path / name) if hasattr(os, "mkfifo") else (run.path / name).mkdir()
        expect[run.name] = "" if name == "note.txt" else f"{name} is a FIFO"
    for i, name in enumerate(FOLDER_FILES):
        run = _full_run(root, f"folder_{i}")
        (run.path / name).unlink()
        (run.path / name).mkdir()
        expect[run.name] = f"{name} is a folder"
    for name in ("status.json", "config.json", "metrics.csv", "events.jsonl", "prompt_set.json",
                 "checkpoints/latest.json"):
        run = _full_run(root, f"garbage_{name.replace('/', '_')}")
        (run.path / name).write_bytes(GARBAGE)
        expect[run.name] = {"status.json": "status.json is not UTF-8", "config.json": "config.json is not UTF-8"}.get(name, "")
    for field, values in STATUS_VALUES.items():
        for i, value in enumerate(values):
            run = _full_run(root, f"status_{field}_{i}")
            status = json.loads(run.status_json.read_text())
            run.status_json.write_text(json.dumps({**status, "state": "running", field: value}))
            expect[run.name] = f"status.json: {field} "
    for i, row in enumerate(METRICS_ROWS):
        run = _full_run(root, f"metrics_{i}")
        with open(run.metrics_csv, "a") as f:
            f.write(row + "\n")
        expect[run.name] = ""
    for i, line in enumerate(EVENT_LINES):
        run = _full_run(root, f"events_{i}")
        run.metrics_csv.unlink()  # the scan reads the events' tail when there is no metrics row
        with open(run.events_jsonl, "a") as f:
            f.write(line + "\n")
        expect[run.name] = ""
    for i, latest in enumerate(['{"iter": 1e999}', '{"iter": "x", "path": "../../x"}', "[" * 10000]):
        run = _full_run(root, f"latest_{i}")
        run.latest_json.write_text(latest)
        expect[run.name] = ""
    return expect


def test_a_scan_of_a_folder_of_hostile_runs_lists_every_run_with_its_reason(tmp_path):
    expect = _hostile_runs(tmp_path)
    assert len(expect) >= 50
    fifos = [p for p in tmp_path.rglob("*") if p.exists() and stat.S_ISFIFO(p.stat().st_mode)]
    with _no_hang(*fifos):
        rows = {r.name: r for r in scan_root(tmp_path, ScanCache())}
        again = {r.name: r for r in scan_root(tmp_path, ScanCache())}
    assert set(rows) == set(expect) and rows.keys() == again.keys()
    for name, reason in expect.items():
        row = rows[name]
        assert row.is_run and "\n" not in row.reason, (name, row)
        assert reason in row.reason, (name, row.reason)
        assert row.iter is None or 0 <= row.iter <= 2**63, (name, row.iter)
    assert rows["status_state_0"].state == "error" and rows["fifo_0"].state == "error"
    assert rows["status_pid_0"].state == "running" and rows["metrics_0"].iter == 2


@needs_fifo
@pytest.mark.parametrize("name", ["status.json", "config.json", "events.jsonl", "logs/engine.log", "metrics.csv",
                                  "gpu_mem.csv", "prompt_set.json"])
def test_the_training_and_samples_panels_open_a_run_with_a_fifo_without_waiting(qtbot, tmp_path, name, open_and_wait):
    run = _full_run(tmp_path, "r")
    (run.path / name).unlink()
    os.mkfifo(run.path / name)
    training = TrainingPanel()
    qtbot.addWidget(training)
    samples = SamplesPanel(cache=ThumbCache(tmp_path / "thumbs"), prompt_set_dir=tmp_path / "mine")
    qtbot.addWidget(samples)
    with _no_hang(run.path / name):
        assert open_and_wait(training, run.path)
        samples.set_run(run.path)
        qtbot.wait(300)  # the followers' first polls and the samples scan run meanwhile
        assert read_json_or_problem(run.path / name)[1].endswith("is a FIFO (named pipe), not a regular file: not read")
        assert RunFolder(run.path).read_status_or_problem()[0] is None or name != "status.json"
    assert training.run_state.run_dir == run.path


@pytest.mark.parametrize("status", [{"state": "running", "pid": 2**31}, {"state": {"a": 1}}, {"state": [1]},
                                    {"state": "running", "pid": 2**63, "heartbeat": "x"}, {"state": 5}])
def test_the_training_panel_shows_a_run_whose_status_holds_hostile_values(qtbot, tmp_path, status, open_and_wait):
    run = _full_run(tmp_path, "r")
    run.status_json.write_text(json.dumps({**status, "host": socket.gethostname()}))
    panel = TrainingPanel()
    qtbot.addWidget(panel)
    assert open_and_wait(panel, run.path)  # OverflowError / TypeError before
    qtbot.wait(300)
    assert isinstance(panel.run_state.state, str)
    assert RunFolder(run.path).read_status_or_problem()[1].startswith("status.json: ")


@pytest.mark.parametrize("line", EVENT_LINES)
def test_the_event_follower_skips_an_event_line_of_the_wrong_types(qtbot, tmp_path, line):
    run = _full_run(tmp_path, "r")
    with open(run.events_jsonl, "a") as f:
        f.write(line + "\n")
    with open(run.events_jsonl, "a") as f:
        f.write(json.dumps({"v": 1, "t": 2.0, "kind": "metric", "iter": 4, "data": {"loss_dm": 0.1}}) + "\n")
    got: list = []
    follower = EventFollower(run.events_jsonl)
    follower.events_received.connect(got.extend)
    follower.start(live=False)  # raised TypeError / ValueError before
    qtbot.waitUntil(lambda: any(e["iter"] == 4 for e in got), timeout=5000)
    follower.stop()
    kept = parse_line(line)  # a line of the right types with a number too large for int64 is kept, that number null
    middle = [kept.iter] if kept is not None and kept.iter is not None else []
    assert [e["iter"] for e in got if e["kind"] == "metric" and e["iter"] is not None] == [2, *middle, 4]
    assert kept is None or kept.data.get("loss_dm", None) is None
    assert all(isinstance(e["t"], float) and isinstance(e["v"], int) and isinstance(e["data"], dict) for e in got)


@needs_fifo
def test_stop_never_blocks_on_a_fifo_control_file(qtbot, tmp_path):
    """The app's Stop writes control.jsonl: a FIFO there is refused at once (before: blocked until
    a reader came), and the engine is signalled instead (EngineProcess.terminate_gracefully)."""
    run = _full_run(tmp_path, "r")
    run.control_jsonl.unlink()
    os.mkfifo(run.control_jsonl)
    with _no_hang(run.control_jsonl), pytest.raises(OSError, match="control.jsonl is a FIFO"):
        append_control(run.path, "stop")
    assert stat.S_ISFIFO(run.control_jsonl.stat().st_mode)
