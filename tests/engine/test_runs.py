"""The run-folder contract: atomic writes, status, checkpoints, resume truncation, CSV, control."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest

from dmad.contract import runs
from dmad.errors import EXIT_INVALID_INPUT, UserInputError
from dmad.contract.events import make_event
from dmad.contract.runs import (ControlReader, CsvAppender, RunFolder, append_control, atomic_write_json,
                       atomic_write_text, default_run_name, effective_state, list_runs, read_metrics)


def _visible(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


# ---------------------------------------------------------------- atomic writes

def test_atomic_write_replaces_and_leaves_no_temp(tmp_path):
    target = tmp_path / "status.json"
    atomic_write_json(target, {"a": 1})
    atomic_write_json(target, {"a": 2})
    assert json.loads(target.read_text()) == {"a": 2}
    assert _visible(tmp_path) == ["status.json"]


def test_atomic_write_crash_before_rename_keeps_old_file(tmp_path, monkeypatch):
    target = tmp_path / "config.json"
    atomic_write_text(target, "old\n")
    seen = []

    def crash(src, dst):
        seen.append((Path(src), Path(dst)))
        assert Path(src).read_text() == "new content\n"  # the whole new file was written first
        raise OSError("killed")

    monkeypatch.setattr(runs.os, "replace", crash)
    with pytest.raises(OSError, match="killed"):
        atomic_write_text(target, "new content\n")
    src, dst = seen[0]
    assert dst == target and src.parent == tmp_path and src.name.startswith(".tmp-")
    assert target.read_text() == "old\n"
    assert _visible(tmp_path) == ["config.json"]  # the temp file was removed


def test_atomic_write_json_rejects_nan(tmp_path):
    with pytest.raises(ValueError):
        atomic_write_json(tmp_path / "x.json", {"loss": float("nan")})
    assert not (tmp_path / "x.json").exists()


# ---------------------------------------------------------------- names, create, open

def test_default_run_name_format_and_sanitising():
    now = datetime(2025, 3, 7, 9, 5)
    assert default_run_name("shapes", "demo", "1", now) == "dmad_20250307-0905_shapes_demo-1"
    assert (default_run_name("laion/aes 6+", "my prompts", "v2.1", now)
            == "dmad_20250307-0905_laion-aes-6+_my-prompts-v2.1")
    assert default_run_name("d", "p", "1").startswith(f"dmad_{datetime.now():%Y%m%d}-")


def test_create_makes_tree_and_refuses_non_empty_folder(tmp_path):
    run = RunFolder.create(tmp_path / "r")
    for folder in (run.checkpoints_dir, run.samples_dir, run.export_dir, run.logs_dir):
        assert folder.is_dir()
    assert run.engine_log == tmp_path / "r" / "logs" / "engine.log"
    assert run.latest_json == tmp_path / "r" / "checkpoints" / "latest.json"
    (tmp_path / "empty").mkdir()
    assert RunFolder.create(tmp_path / "empty").checkpoints_dir.is_dir()  # an empty folder is fine
    run.write_json("config.json", {"x": 1})
    with pytest.raises(UserInputError) as e:
        RunFolder.create(run.path)
    assert e.value.exit_code == EXIT_INVALID_INPUT == 2
    assert str(run.path) in str(e.value) and "--resume latest" in str(e.value)


def test_open_requires_config(tmp_path):
    with pytest.raises(UserInputError, match="not found"):
        RunFolder.open(tmp_path / "missing")
    run = RunFolder.create(tmp_path / "r")
    with pytest.raises(UserInputError, match="config.json"):
        RunFolder.open(run.path)
    run.write_json("config.json", {"seed": 0})
    assert RunFolder.open(run.path).read_json("config.json") == {"seed": 0}


def test_write_command_is_shell_quoted(tmp_path):
    run = RunFolder.create(tmp_path / "r")
    run.write_command(["dmad", "train", "--config", "my config.json", "--set", "lr=1e-5"])
    assert run.command_txt.read_text() == "dmad train --config 'my config.json' --set lr=1e-5\n"


# ---------------------------------------------------------------- status

def test_status_merges_fields_and_validates_state(tmp_path):
    run = RunFolder.create(tmp_path / "r")
    assert run.read_status() is None and effective_state(run.read_status()) == "created"
    run.write_status("running", last_checkpoint=10)
    run.write_status("failed", failure="CUDA error")
    st = RunFolder(run.path).read_status()  # a fresh reader sees the merged file
    assert st["state"] == "failed" and st["last_checkpoint"] == 10 and st["failure"] == "CUDA error"
    assert st["pid"] == os.getpid() and abs(st["heartbeat"] - time.time()) < 5 and "updated" in st
    st = run.write_status("running", failure=None)  # None removes the old failure reason
    assert "failure" not in st and st["last_checkpoint"] == 10
    with pytest.raises(ValueError, match="unknown run state"):
        run.write_status("exploded")
    beat = run.read_status()["heartbeat"]
    time.sleep(0.01)
    run.heartbeat()
    st = run.read_status()
    assert st["heartbeat"] > beat and st["state"] == "running" and st["last_checkpoint"] == 10


def test_read_status_unreadable_is_none(tmp_path):
    run = RunFolder.create(tmp_path / "r")
    run.status_json.write_text("{torn")
    assert run.read_status() is None


def test_effective_state_dead_pid_stale_heartbeat_and_final_states():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()  # reaped: its pid is no longer alive
    now = time.time()
    alive = {"state": "running", "pid": os.getpid(), "heartbeat": now}
    assert effective_state(alive, now=now) == "running"
    assert effective_state({**alive, "state": "paused"}, now=now) == "paused"
    assert effective_state({**alive, "pid": proc.pid}, now=now) == "failed"
    assert effective_state({**alive, "heartbeat": now - 120}, now=now) == "failed"
    assert effective_state({**alive, "heartbeat": now - 120}, now=now, stale_after_s=300) == "running"
    assert effective_state({**alive, "state": "finished", "pid": proc.pid, "heartbeat": 0}) == "finished"
    assert effective_state({**alive, "state": "stopped", "pid": proc.pid}) == "stopped"
    # a pid on another machine means nothing: only the heartbeat decides
    assert effective_state({**alive, "pid": proc.pid, "host": "elsewhere"}, now=now) == "running"
    assert effective_state(None) == "created"


@pytest.mark.skipif(not Path("/proc/self/stat").is_file(), reason="zombies are read from /proc (Linux)")
def test_a_zombie_engine_is_dead():
    """A killed rank whose parent died with it waits for init to collect it: until then kill(pid, 0)
    still succeeds, but the run must not read as running."""
    from tests.conftest import gone

    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 60  # a hang guard: the child exits at once
    while not gone(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        assert Path(f"/proc/{proc.pid}/stat").is_file()  # not collected yet: a zombie
        status = {"state": "running", "pid": proc.pid, "heartbeat": time.time()}
        assert not runs.pid_alive(proc.pid) and effective_state(status) == "failed"
    finally:
        proc.wait()


# ---------------------------------------------------------------- checkpoints

def _save(run: RunFolder, it: int, limit=None, payload: str = "w") -> Path:
    tmp = run.begin_checkpoint(it)
    assert tmp.name.startswith(".tmp-") and tmp.is_dir() and not any(tmp.iterdir())
    (tmp / "student.safetensors").write_text(f"{payload}{it}")
    return run.commit_checkpoint(it, tmp, limit=limit)


def test_checkpoint_commit_rotation_and_latest(tmp_path):
    run = RunFolder.create(tmp_path / "r")
    assert run.list_checkpoints() == [] and run.latest_checkpoint() is None
    for it in (100, 200, 300, 1000):
        final = _save(run, it, limit=2)
        assert final == run.checkpoint_path(it) and (final / "student.safetensors").read_text() == f"w{it}"
        assert json.loads(run.latest_json.read_text()) == {"iter": it, "path": f"iter_{it}"}
    assert [i for i, _ in run.list_checkpoints()] == [300, 1000]  # sorted numerically, not as text
    assert run.latest_checkpoint() == (1000, run.checkpoint_path(1000))
    assert not [p for p in run.checkpoints_dir.iterdir() if p.name.startswith(".tmp-")]


def test_rotation_never_deletes_the_checkpoint_just_written(tmp_path):
    run = RunFolder.create(tmp_path / "r")
    for it in (10, 20, 30):
        _save(run, it)
    _save(run, 5, limit=2)  # an older iter re-saved after resuming from it
    assert [i for i, _ in run.list_checkpoints()] == [5, 30]
    assert run.latest_checkpoint()[0] == 5
    with pytest.raises(ValueError, match="limit"):
        run.commit_checkpoint(40, run.begin_checkpoint(40), limit=0)


def test_leftover_temp_is_ignored_and_cleaned(tmp_path):
    run = RunFolder.create(tmp_path / "r")
    _save(run, 10)
    half = run.begin_checkpoint(20)  # killed while saving iter 20
    (half / "student.safetensors").write_text("partial")
    (run.checkpoints_dir / ".tmp-latest.json-123-abcd").write_text("{")
    assert [i for i, _ in run.list_checkpoints()] == [10]
    assert run.latest_checkpoint()[0] == 10
    again = run.begin_checkpoint(20)  # a retry starts from an empty folder
    assert again == half and not any(again.iterdir())
    run.clean_temp()
    assert _visible(run.checkpoints_dir) == ["iter_10", "latest.json"]


def test_latest_falls_back_when_latest_json_points_nowhere(tmp_path):
    run = RunFolder.create(tmp_path / "r")
    _save(run, 10)
    _save(run, 20)
    atomic_write_json(run.latest_json, {"iter": 30, "path": "iter_30"})
    assert run.latest_checkpoint() == (20, run.checkpoint_path(20))
    run.latest_json.unlink()
    assert run.latest_checkpoint() == (20, run.checkpoint_path(20))


def test_recommitting_an_existing_iter_replaces_it(tmp_path):
    run = RunFolder.create(tmp_path / "r")
    _save(run, 10, payload="first")
    (run.checkpoint_path(10) / "stale_extra.bin").write_text("x")
    _save(run, 10, payload="second")
    assert _visible(run.checkpoint_path(10)) == ["student.safetensors"]
    assert (run.checkpoint_path(10) / "student.safetensors").read_text() == "second10"
    assert _visible(run.checkpoints_dir) == ["iter_10", "latest.json"]


def test_clean_temp_restores_checkpoint_moved_aside_by_a_killed_recommit(tmp_path):
    run = RunFolder.create(tmp_path / "r")
    final = _save(run, 10)
    os.replace(final, run.checkpoints_dir / ".tmp-old-iter_10-4242")  # killed between the renames
    assert run.list_checkpoints() == []
    run.clean_temp()
    assert run.latest_checkpoint() == (10, final)
    assert (final / "student.safetensors").read_text() == "w10"


# ---------------------------------------------------------------- resume truncation

def test_truncate_after_metrics_and_events_with_torn_lines(tmp_path):
    run = RunFolder.create(tmp_path / "r")
    run.metrics_csv.write_text("iter,loss_dm,lr\n10,0.5,1e-05\n20,0.4,1e-05\n30,0.3,1e-05\n40,0.")
    lines = [make_event("started", None, run="r"), make_event("metric", 10, loss=0.5),
             make_event("warning", None, message="slow disk"), make_event("checkpoint", 20),
             make_event("metric", 30, loss=0.3), make_event("warning", None, message="after 20"),
             make_event("metric", 40, loss=0.2)]
    text = "".join(e.to_line() + "\n" for e in lines)
    run.events_jsonl.write_text(text + "not json\n" + lines[-1].to_line()[:15])
    run.gpu_mem_csv.write_text("t,mem_device_used_gb\n1.0,3.5\n2.0,3.")
    run.truncate_after(20)
    assert run.metrics_csv.read_text() == "iter,loss_dm,lr\n10,0.5,1e-05\n20,0.4,1e-05\n"
    kept = [json.loads(line) for line in run.events_jsonl.read_text().splitlines()]
    assert [(e["kind"], e["iter"]) for e in kept] == [("started", None), ("metric", 10),
                                                     ("warning", None), ("checkpoint", 20)]
    assert run.gpu_mem_csv.read_text() == "t,mem_device_used_gb\n1.0,3.5\n2.0,3."  # time-based: untouched
    cols, rows = read_metrics(run.metrics_csv)
    assert cols == ["iter", "loss_dm", "lr"] and [r["iter"] for r in rows] == [10, 20]
    assert _visible(run.path).count(".tmp-") == 0


# ---------------------------------------------------------------- CSV

def test_csv_appender_round_trip_exact_floats(tmp_path):
    path = tmp_path / "metrics.csv"
    loss = 0.123456789012345
    with CsvAppender(path, ["iter", "loss_dm", "lr", "note"]) as w:
        w.append({"iter": 1, "loss_dm": loss, "lr": 1e-5})
        w.append({"iter": 2, "loss_dm": 1 / 3, "note": "a,b"})
    with CsvAppender(path, ["iter", "loss_dm", "lr", "note"]) as w:  # reopening appends, no 2nd header
        w.append({"iter": 3, "loss_dm": True})
        with pytest.raises(ValueError, match="unknown columns"):
            w.append({"iter": 4, "los_dm": 1.0})
    assert path.read_text().count("iter,") == 1
    cols, rows = read_metrics(path)
    assert rows[0] == {"iter": 1, "loss_dm": loss, "lr": 1e-5, "note": None}
    assert rows[1]["loss_dm"] == 1 / 3 and rows[1]["note"] is None  # text is not a number
    assert [r["iter"] for r in rows] == [1, 2, 3] and rows[2]["loss_dm"] == 1.0


def test_csv_appender_header_mismatch_names_both(tmp_path):
    path = tmp_path / "metrics.csv"
    CsvAppender(path, ["iter", "loss_dm"]).close()
    with pytest.raises(ValueError) as e:
        CsvAppender(path, ["iter", "loss_dm", "loss_adv"])
    assert "['iter', 'loss_dm']" in str(e.value) and "['iter', 'loss_dm', 'loss_adv']" in str(e.value)


def test_an_older_engines_metrics_go_on_under_their_own_header(tmp_path):
    """Columns are only added at the end (dmad.contract.methods.ADDED_COLUMNS): a metrics.csv an older
    engine started keeps its header and its rows' places; any other header is refused as before."""
    from dmad.contract.methods import ADDED_COLUMNS, METRIC_COLUMNS

    assert METRIC_COLUMNS[-len(ADDED_COLUMNS):] == ADDED_COLUMNS
    older = METRIC_COLUMNS[:-len(ADDED_COLUMNS)]
    path = tmp_path / "metrics.csv"
    with CsvAppender(path, older) as w:
        w.append({"iter": 10, "loss_dm": 0.5})
    with CsvAppender.continued(path, METRIC_COLUMNS) as w:
        assert w.columns == older
        w.append({k: v for k, v in {"iter": 20, "loss_dm": 0.25, "loss_reg": 0.1}.items() if k in w.columns})
    cols, rows = read_metrics(path)
    assert cols == older and [(r["iter"], r["loss_dm"]) for r in rows] == [(10, 0.5), (20, 0.25)]
    other = tmp_path / "other.csv"
    CsvAppender(other, ["iter", "loss_x"]).close()
    with pytest.raises(ValueError, match="has columns"):
        CsvAppender.continued(other, METRIC_COLUMNS)


def test_csv_appender_drops_a_torn_row_before_appending(tmp_path):
    path = tmp_path / "metrics.csv"
    path.write_text("iter,loss\n1,0.5\n2,0.")
    with CsvAppender(path, ["iter", "loss"]) as w:
        w.append({"iter": 2, "loss": 0.25})
    assert path.read_text() == "iter,loss\n1,0.5\n2,0.25\n"


def test_read_metrics_tolerates_missing_file_and_torn_line(tmp_path):
    assert read_metrics(tmp_path / "none.csv") == ([], [])
    path = tmp_path / "m.csv"
    path.write_text("iter,loss\n1,0.5\n2,\n3,0.2")
    assert read_metrics(path) == (["iter", "loss"], [{"iter": 1, "loss": 0.5}, {"iter": 2, "loss": None}])


# ---------------------------------------------------------------- control

def test_control_reader_torn_lines_across_polls(tmp_path):
    run = RunFolder.create(tmp_path / "r")
    append_control(run.path, "stop")  # meant for an earlier process: not replayed
    reader = ControlReader(run.control_jsonl)
    assert reader.poll() == []
    append_control(run.path, "pause")
    with open(run.control_jsonl, "a") as f:
        f.write('{"cmd": "nonsense"}\nnot json\n{"cmd": "sample_')
    got = reader.poll()
    assert [c["cmd"] for c in got] == ["pause"] and abs(got[0]["t"] - time.time()) < 5
    assert reader.poll() == []  # the torn line is not consumed yet
    with open(run.control_jsonl, "a") as f:
        f.write('now", "t": 1.0}\n')
    assert reader.poll() == [{"cmd": "sample_now", "t": 1.0}]
    assert [c["cmd"] for c in ControlReader(run.control_jsonl, from_start=True).poll()] == [
        "stop", "pause", "sample_now"]
    with pytest.raises(ValueError, match="unknown control command"):
        append_control(run.path, "explode")


def test_control_reader_missing_file_then_created(tmp_path):
    run = RunFolder.create(tmp_path / "r")
    reader = ControlReader(run.control_jsonl)
    assert reader.poll() == []
    append_control(run.path, "checkpoint_now")
    assert [c["cmd"] for c in reader.poll()] == ["checkpoint_now"]


# ---------------------------------------------------------------- listing

def test_list_runs_newest_first(tmp_path):
    assert list_runs(tmp_path / "nothing") == []
    old, new = RunFolder.create(tmp_path / "a_old"), RunFolder.create(tmp_path / "b_new")
    old.write_json("config.json", {})
    new.write_status("running")
    os.utime(old.config_json, (time.time() - 100, time.time() - 100))
    (tmp_path / "not_a_run").mkdir()
    (tmp_path / "file.txt").write_text("x")
    assert [r.name for r in list_runs(tmp_path)] == ["b_new", "a_old"]


def test_engine_stderr_survives_its_reader_leaving():
    """The app may exit and leave a run going: the engine's stderr pipe then has no reader."""
    from dmad.train.run_files import PipeSafeStream

    r, w = os.pipe()
    os.close(r)
    raw = os.fdopen(w, "w")
    with pytest.raises(BrokenPipeError):  # what an unwrapped print would do mid-training
        raw.write("x" * 100_000)
        raw.flush()
    stream = PipeSafeStream(raw)
    print("a log line after the app left", file=stream, flush=True)
    assert stream.reader_gone
    stream.write("more")
    stream.flush()
    os.dup2(os.open(os.devnull, os.O_WRONLY), raw.fileno())  # let the buffered bytes go on close
    raw.close()
