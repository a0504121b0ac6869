"""A run folder's small JSON files as a hostile user (or a broken disk) leaves them: nested deeper
than Python's parser can recurse, larger than any the engine writes, not UTF-8. Each becomes one
line where the app shows the file, never a traceback, and the other runs and files still show.
(Before: a deeply nested config.json raised RecursionError out of the Training panel's open_run
and ended the Runs table's whole scan.) No torch."""
from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

import pytest

from app.dialogs.prompt_set_editor import PromptSetEditor
from app.models.data_report import load_report
from app.models.methods import read_method
from app.models.probe_result import load_probe
from app.models.run_scan import ScanCache, scan_root
from app.models.thumbs import ThumbCache
from app.panels.samples import SamplesPanel
from app.panels.training import TrainingPanel
from app.screenshots import RECORDED_RUN, prepare_recorded_run
from dmad.contract.jsonfile import RUN_FILE_MAX_BYTES, read_json_or_problem
from dmad.contract.memory import parse_ledger
from dmad.contract.runs import RunFolder, atomic_write_json

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


def test_the_training_panel_opens_a_run_whose_config_is_hostile(qtbot, tmp_path):
    run = _run(tmp_path, "r")
    assert read_method(run.config_json) == "lcm"
    run.config_json.write_text(DEEP)
    assert read_method(run.config_json) is None
    panel = TrainingPanel()
    qtbot.addWidget(panel)
    assert panel.open_run(run.path)  # raised RecursionError before
    assert panel.run_state.run_dir == run.path


def test_the_prompt_set_editor_says_why_a_hostile_set_is_not_shown(qtbot, tmp_path):
    run = prepare_recorded_run(RECORDED_RUN, tmp_path / "runs")
    (run / "prompt_set.json").write_text(DEEP)
    panel = SamplesPanel(cache=ThumbCache(tmp_path / "thumbs"), prompt_set_dir=tmp_path / "mine")
    qtbot.addWidget(panel)
    panel.set_run(run)
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
