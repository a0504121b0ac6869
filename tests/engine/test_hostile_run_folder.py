"""Never block on a run-folder file, never trust a value read back from one (issue 43, W4 and T2-T5).

A FIFO (or a socket, a folder, a device) where a run folder keeps a file made `dmad train --resume
latest` wait forever with no word; a status.json pid of 2**31 was an OverflowError, an event line
with "t": "x" or "v": [1] an internal error on every resume. Each is now refused with exit 2 and one
line before anything is touched (the folder hashed before and after), or passed over. Commands run
in a thread with a generous join timeout, so a regression fails here instead of hanging the suite;
a thread left waiting on a FIFO is let go by opening the FIFO's other end."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import threading
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from dmad.cli import main as dmad  # noqa: E402
from dmad.contract.events import parse_line, read_events  # noqa: E402
from dmad.contract.regular import NotRegularFile, open_regular  # noqa: E402
from dmad.contract.runs import (ControlReader, RunFolder, append_control, check_not_in_use,  # noqa: E402
                                effective_state, pid_alive, read_metrics)

needs_fifo = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")
HANG_S = 60  # only a real hang waits this long


def _train(config: Path, run: Path, *extra: str) -> int:
    return dmad(["train", "--config", str(config), "--run-dir", str(run), *extra])


def _hashes(run: Path) -> dict[str, str]:
    """Every entry's kind and, for regular files, content (a FIFO is hashed by kind, never opened)."""
    out = {}
    for p in sorted(run.rglob("*")):
        rel = str(p.relative_to(run))
        out[rel] = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else ("dir" if p.is_dir() else "other")
    return out


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    lines = [line for line in err if line.startswith("dmad:")]
    assert len(lines) == 1 and "Traceback" not in "\n".join(err), err
    return lines[0]


def _in_thread(fn, fifos: list[Path] = ()):
    """fn()'s result, or a failed test after HANG_S; FIFOs are opened at their other end to free a
    thread stuck on one."""
    box: dict = {}

    def work() -> None:
        try:
            box["result"] = fn()
        except BaseException as e:  # noqa: BLE001 - raised again in the test's thread
            box["error"] = e

    t = threading.Thread(target=work, daemon=True)
    t.start()
    t.join(HANG_S)
    if t.is_alive():
        for f in fifos:
            try:
                os.close(os.open(f, os.O_RDWR | os.O_NONBLOCK))
            except OSError:
                pass
        t.join(5)
        pytest.fail(f"hung for {HANG_S} s")
    if "error" in box:
        raise box["error"]
    return box.get("result")


RUN_FILES = ["status.json", "checkpoints/latest.json", "metrics.csv", "events.jsonl", "control.jsonl",
             "gpu_mem.csv", "engine.lock", "logs/engine.log", "config.json", "prompt_set.json"]


def _replace_with_fifo(path: Path) -> None:
    path.unlink(missing_ok=True)
    os.mkfifo(path)


# ---------------------------------------------------------------- open_regular


@needs_fifo
def test_open_regular_refuses_what_is_not_a_regular_file_without_waiting(tmp_path):
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "folder").mkdir()
    (tmp_path / "file").write_text("x")
    for name, kind in (("fifo", "a FIFO (named pipe)"), ("folder", "a folder")):
        for flags in (os.O_RDONLY, os.O_WRONLY | os.O_APPEND | os.O_CREAT, os.O_RDWR):
            with pytest.raises(NotRegularFile) as e:
                _in_thread(lambda: open_regular(tmp_path / name, flags))
            assert str(e.value) == f"{tmp_path / name} is {kind}, not a regular file"
    if os.path.exists("/dev/null"):
        with pytest.raises(NotRegularFile, match="is a device"):
            open_regular("/dev/null")
    fd = open_regular(tmp_path / "file")
    try:
        assert os.get_blocking(fd) and os.read(fd, 5) == b"x"
    finally:
        os.close(fd)


# ---------------------------------------------------------------- W4: a resume


@needs_fifo
@pytest.mark.parametrize("name", RUN_FILES)
def test_a_fifo_in_the_run_folder_refuses_a_resume_with_one_line_and_touches_nothing(run_copy, capsys, name):
    config, run = run_copy
    _replace_with_fifo(run / name)
    before = _hashes(run)
    code = _in_thread(lambda: _train(config, run, "--resume", "latest"), [run / name])
    assert code == 2
    line = _one_line(capsys)
    assert name in line and "FIFO" in line and "not a regular file" in line, line
    assert _hashes(run) == before


@pytest.mark.parametrize("name", ["status.json", "metrics.csv", "events.jsonl", "control.jsonl", "engine.lock"])
def test_a_folder_in_place_of_a_run_file_refuses_a_resume(run_copy, capsys, name):
    config, run = run_copy
    (run / name).unlink(missing_ok=True)
    (run / name).mkdir()
    before = _hashes(run)
    assert _in_thread(lambda: _train(config, run, "--resume", "latest")) == 2
    line = _one_line(capsys)
    assert f"{name} is a folder, not a regular file" in line, line
    assert _hashes(run) == before


@needs_fifo
def test_a_fifo_in_a_fresh_run_folders_skeleton_refuses_the_start(run_copy, tmp_path, capsys):
    config, _ = run_copy
    fresh = tmp_path / "fresh"
    (fresh / "logs").mkdir(parents=True)
    os.mkfifo(fresh / "events.jsonl")
    assert _in_thread(lambda: _train(config, fresh), [fresh / "events.jsonl"]) == 2
    assert "events.jsonl is a FIFO" in _one_line(capsys)
    assert sorted(p.name for p in fresh.iterdir()) == ["events.jsonl", "logs"]


@needs_fifo
def test_a_fifo_as_the_latest_checkpoints_training_state_is_passed_over(run_copy, capsys):
    config, run = run_copy
    _replace_with_fifo(run / "checkpoints" / "iter_4" / "training_state.json")
    fifo = run / "checkpoints" / "iter_4" / "training_state.json"
    assert _in_thread(lambda: _train(config, run, "--resume", "latest"), [fifo]) == 0
    capsys.readouterr()
    warnings = [e.data["message"] for e in read_events(run / "events.jsonl") if e.kind == "warning"]
    assert any("training_state.json" in w and "FIFO" in w for w in warnings), warnings


# ---------------------------------------------------------------- T2-T5: values read back


@pytest.mark.parametrize("pid", [2**31, 2**63, -5, True])
def test_a_status_pid_out_of_range_is_no_process(run_copy, capsys, pid):
    config, run = run_copy
    status = json.loads((run / "status.json").read_text())
    (run / "status.json").write_text(json.dumps({**status, "state": "running", "pid": pid,
                                                 "heartbeat": time.time() - 3600}))
    assert not pid_alive(pid)
    check_not_in_use(run)  # raised OverflowError before
    assert effective_state(RunFolder(run).read_status()) == "failed"  # the pid is dropped; the heartbeat decides
    assert _in_thread(lambda: _train(config, run, "--resume", "latest")) == 0
    assert "Traceback" not in capsys.readouterr().err


@pytest.mark.parametrize("line", ['{"v":1,"t":"x","kind":"metric","iter":1,"data":{}}',
                                  '{"v":[1],"t":1,"kind":"metric","iter":1,"data":{}}',
                                  '{"v":1,"t":1e999,"kind":"metric","iter":1,"data":{}}',
                                  '{"v":1,"t":1,"kind":"metric","iter":1e999,"data":{}}'])
def test_an_event_line_of_the_wrong_types_is_skipped_and_the_resume_goes_on(run_copy, capsys, line):
    config, run = run_copy
    with open(run / "events.jsonl", "a") as f:
        f.write(line + "\n")
    parsed = parse_line(line)
    assert parsed is None or parsed.iter is None
    assert _in_thread(lambda: _train(config, run, "--resume", "latest")) == 0  # internal error before
    assert "Traceback" not in capsys.readouterr().err


def test_a_metrics_iter_of_1e999_is_skipped(tmp_path):
    (tmp_path / "metrics.csv").write_text("iter,loss\n1,0.5\n1e999,0.4\nnan,0.3\n" + "9" * 30 + ",0.2\n2,0.1\n")
    columns, rows = read_metrics(tmp_path / "metrics.csv")
    assert [r["iter"] for r in rows] == [1, 2]


# ---------------------------------------------------------------- control.jsonl


@needs_fifo
def test_the_apps_stop_never_blocks_on_a_fifo_control_file(tmp_path):
    os.mkfifo(tmp_path / "control.jsonl")
    with pytest.raises(NotRegularFile, match="control.jsonl is a FIFO"):
        _in_thread(lambda: append_control(tmp_path, "stop"), [tmp_path / "control.jsonl"])


@needs_fifo
def test_a_control_file_swapped_for_a_fifo_is_reported_once_and_read_again_once_regular(tmp_path):
    path = tmp_path / "control.jsonl"
    said: list[str] = []
    reader = ControlReader(path, from_start=True, on_problem=said.append)
    append_control(tmp_path, "pause")
    assert [c["cmd"] for c in reader.poll()] == ["pause"]
    _replace_with_fifo(path)
    for _ in range(3):
        assert _in_thread(reader.poll, [path]) == []
    assert said == ["control.jsonl is a FIFO (named pipe), not a regular file"] and reader.problem == said[0]
    path.unlink()
    append_control(tmp_path, "resume")
    assert [c["cmd"] for c in reader.poll()] == ["resume"] and reader.problem == "" and len(said) == 1


def test_a_pause_written_after_a_gigabyte_of_garbage_is_read_at_the_next_poll(tmp_path):
    path = tmp_path / "control.jsonl"
    reader = ControlReader(path, from_start=True)
    with open(path, "wb") as f:
        f.truncate((1 << 30) - 1)  # a sparse gigabyte of NUL bytes: one enormous line
        f.seek(0, os.SEEK_END)
        f.write(b"\n")
    append_control(tmp_path, "pause")
    assert [c["cmd"] for c in reader.poll()] == ["pause"]  # ~1,024 polls before
    assert reader.offset == path.stat().st_size and reader.ignored == 1
    with open(path, "ab") as f:
        f.write(b"x" * (3 << 20) + b"\n")  # garbage that ends in a newline, then a command
    append_control(tmp_path, "resume")
    assert [c["cmd"] for c in reader.poll()] == ["resume"]


@needs_fifo
def test_a_control_file_that_becomes_a_fifo_mid_run_leaves_training_going_and_says_so(run_copy, capsys):
    """The run trains on to its end; a warning event says control is off (before: iterations
    stalled while the heartbeat said running)."""
    config, run = run_copy
    path = run / "control.jsonl"
    from dmad.train import loop

    original = loop.checkpoint_and_sample

    def swap_at_5(s, tr):
        if s.progress.iter == 5:
            _replace_with_fifo(path)
        original(s, tr)

    loop.checkpoint_and_sample = swap_at_5
    try:
        code = _in_thread(lambda: _train(config, run, "--resume", "latest", "--set",
                                         "optimization.max_train_steps=8"), [path])
    finally:
        loop.checkpoint_and_sample = original
    assert code == 0
    capsys.readouterr()
    events = list(read_events(run / "events.jsonl"))
    warnings = [e.data["message"] for e in events if e.kind == "warning" and "control.jsonl" in e.data["message"]]
    assert len(warnings) == 1 and "FIFO" in warnings[0], warnings
    assert events[-1].kind == "finished" and events[-1].iter == 8
