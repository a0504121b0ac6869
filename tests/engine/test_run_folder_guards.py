"""What a run folder survives (docs/ARCHITECTURE.md, Reliability): a second engine, control lines
of any shape, commands before training, damaged checkpoints, a run that ended before its first checkpoint,
and links out of the folder (a full disk: test_disk_full.py). Each test runs the real `dmad train` command in
process on the tiny teacher and checks the exit code, the one stderr line and the files left."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from dmad.cli import main as dmad  # noqa: E402
from dmad.contract.events import is_iteration_metric, read_events  # noqa: E402
from dmad.contract.runs import ControlReader, RunFolder, RunLock, append_control  # noqa: E402


def _train(config: Path, run: Path, *extra: str) -> int:
    return dmad(["train", "--config", str(config), "--run-dir", str(run), *extra])


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    lines = [line for line in err if line.startswith("dmad:")]
    assert len(lines) == 1 and "Traceback" not in "\n".join(err), err
    return lines[0]


def _kinds(run: Path) -> list[str]:
    return [e.kind for e in read_events(run / "events.jsonl")]


def _iters(run: Path) -> list[int]:
    return [e.iter for e in read_events(run / "events.jsonl") if is_iteration_metric(e)]


def _status(run: Path) -> dict:
    return json.loads((run / "status.json").read_text())


# ---------------------------------------------------------------- one writer

HOLD = "import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT); " \
       "fcntl.flock(fd, fcntl.LOCK_EX); os.ftruncate(fd, 0); os.write(fd, b'{\"pid\": %d}' % os.getpid()); print('held', flush=True); " \
       "time.sleep(60)"


@pytest.mark.skipif(os.name == "nt", reason="the holder uses flock")
def test_a_second_engine_is_refused_with_the_live_pid_and_touches_nothing(run_copy, capsys):
    config, run = run_copy
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(run / "engine.lock")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
        assert _train(config, run, "--resume", "latest") == 2
        line = _one_line(capsys)
        assert f"is in use by engine pid {holder.pid}" in line and str(run) in line
        assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before
    finally:
        holder.kill()
        holder.communicate()
    # the holder died: its lock went with it (a killed engine's lock is taken over)
    assert _train(config, run, "--resume", "latest", "--set", "optimization.max_train_steps=5") == 0
    assert _iters(run)[-1] == 5


def test_the_lock_refuses_in_process_too_and_is_released_after_the_run(tmp_path):
    lock = RunLock(tmp_path).acquire()
    try:
        with pytest.raises(Exception, match="in use by engine pid"):
            RunLock(tmp_path).acquire()
    finally:
        lock.release()
    RunLock(tmp_path).acquire().release()


# ---------------------------------------------------------------- control.jsonl

@pytest.mark.parametrize("bad", [
    b"[" * 100_000 + b"]" * 100_000,  # RecursionError in json
    b'{"cmd": "stop", "pad": "' + b"x" * 5_000_000 + b'"}',  # over-long: never parsed
    b"\xff\xfe\x00 not utf-8",
    b'{"cmd": "stop", "t": "yesterday"}',
    b'{"cmd": ["stop"]}',
    b"null",
])
def test_no_control_line_raises_out_of_the_reader(tmp_path, bad):
    path = tmp_path / "control.jsonl"
    reader = ControlReader(path, offset=0, since=0.0)
    path.write_bytes(bad + b"\n")
    for _ in range(8):  # a 5 MB line takes several one-megabyte polls
        assert reader.poll() == []
    append_control(tmp_path, "pause")
    assert [c["cmd"] for c in reader.poll()] == ["pause"]
    assert reader.ignored == 1


def test_an_over_long_line_still_being_written_is_skipped_to_its_end(tmp_path):
    path = tmp_path / "control.jsonl"
    reader = ControlReader(path, offset=0, since=0.0)
    path.write_bytes(b"[" * 10_000)  # no newline yet
    assert reader.poll() == []
    with open(path, "ab") as f:
        f.write(b'"]\n{"cmd": "stop"}\n')
    assert [c["cmd"] for c in reader.poll()] == ["stop"]


def test_a_malformed_control_line_does_not_end_the_run(write_config, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "control.jsonl").write_bytes(b"[" * 100_000 + b"\n")
    assert _train(write_config({"optimization": {"max_train_steps": 3}}), run) == 0
    assert _status(run)["state"] == "finished" and _iters(run) == [1, 2, 3]


def test_commands_of_earlier_engines_are_not_replayed(tmp_path):
    path = tmp_path / "control.jsonl"
    path.write_text(json.dumps({"cmd": "stop", "t": 100.0}) + "\n")  # a killed engine never read it
    old = path.stat().st_size
    with open(path, "a") as f:
        f.write(json.dumps({"cmd": "pause", "t": 50.0}) + "\n")  # before the offset: consumed earlier
    reader = ControlReader(path, offset=old, since=200.0)
    assert reader.poll() == []
    append_control(tmp_path, "stop")  # now: for this engine
    assert [c["cmd"] for c in reader.poll()] == ["stop"]


# ---------------------------------------------------------------- before training

def _stop_during(monkeypatch, module, name: str, run: Path, signal_instead: bool = False):
    real = getattr(module, name)

    def patched(*args, **kwargs):
        if signal_instead:
            os.kill(os.getpid(), __import__("signal").SIGTERM)
        else:
            append_control(run, "stop")
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, patched)


@pytest.mark.parametrize("where", ["loading", "teacher-samples", "sigterm-loading"])
def test_stop_before_training_is_honoured_and_the_run_starts_again(write_config, tmp_path, monkeypatch, where):
    import dmad.models.teacher
    import dmad.sample.render

    run = tmp_path / "run"
    config = write_config({"optimization": {"max_train_steps": 3}})
    if where == "teacher-samples":
        _stop_during(monkeypatch, dmad.sample.render, "teacher_png", run)
    else:
        _stop_during(monkeypatch, dmad.models.teacher, "load_teacher", run, signal_instead=where.startswith("sigterm"))
    assert _train(config, run) == 0
    assert _status(run)["state"] == "stopped" and _iters(run) == []
    assert _kinds(run)[-1] == "stopped" and list(read_events(run / "events.jsonl"))[-1].data["last_checkpoint"] is None
    assert not RunFolder(run).list_checkpoints()
    monkeypatch.undo()
    # not a dead end: a fresh start says how to start it again, and --resume latest does
    assert _train(config, run) == 2
    assert _train(config, run, "--resume", "latest") == 0
    assert _status(run)["state"] == "finished" and _iters(run) == [1, 2, 3]
    warnings = [e.data["message"] for e in read_events(run / "events.jsonl") if e.kind == "warning"]
    assert any("starting again from iteration 0" in w for w in warnings)


def test_pause_resume_and_sample_now_during_loading_are_honoured(write_config, tmp_path, monkeypatch):
    import threading

    import dmad.models.teacher

    run = tmp_path / "run"
    real = dmad.models.teacher.load_teacher
    resume_sent: list[float] = []

    def resume():
        resume_sent.append(time.time())
        append_control(run, "resume")

    later = threading.Timer(1.0, resume)

    def load(*args, **kwargs):
        for cmd in ("pause", "sample_now"):
            append_control(run, cmd)
        later.start()
        return real(*args, **kwargs)

    monkeypatch.setattr(dmad.models.teacher, "load_teacher", load)
    try:
        assert _train(write_config({"optimization": {"max_train_steps": 2}}), run) == 0
    finally:
        later.join()
    events = list(read_events(run / "events.jsonl"))
    kinds = [e.kind for e in events]
    assert kinds.index("paused") < kinds.index("resumed") < kinds.index("finished")
    # paused while loading, and not resumed before the resume command was sent (event times are
    # rounded to the millisecond); no wall-clock bound on how long loading takes
    assert events[kinds.index("paused")].data["phase"] == "loading"
    assert events[kinds.index("resumed")].t >= resume_sent[0] - 0.001
    assert (run / "samples" / "iter_0" / "meta.json").is_file()  # the sample_now, once there was a student


def test_a_run_that_failed_before_its_first_checkpoint_starts_again(write_config, tmp_path, monkeypatch, capsys):
    from dmad.train.session import DataStream

    real, calls = DataStream.encode, []

    def fail_at_2(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 3:  # iteration 3: one micro-batch each
            raise ZeroDivisionError("a bug")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(DataStream, "encode", fail_at_2)
    config = write_config({"optimization": {"max_train_steps": 4}, "observation": {"checkpointing_steps": 10}})
    run = tmp_path / "run"
    assert _train(config, run) == 1
    capsys.readouterr()
    monkeypatch.undo()
    assert _train(config, run) == 2
    line = _one_line(capsys)
    assert "--resume latest starts it again from iteration 0" in line
    assert _train(config, run, "--resume", "latest") == 0
    assert _iters(run) == [1, 2, 3, 4] and _status(run)["state"] == "finished"
    assert "failure_reason" not in _status(run)


def test_a_stop_that_ended_a_run_is_not_replayed_on_resume(run_copy):
    config, run = run_copy
    append_control(run, "stop")  # the Stop that ended the last engine, which consumed it:
    RunFolder(run).update_status(control_offset=(run / "control.jsonl").stat().st_size)
    assert _train(config, run, "--resume", "latest", "--set", "optimization.max_train_steps=6") == 0
    assert _status(run)["state"] == "finished" and _iters(run)[-2:] == [5, 6]


# ---------------------------------------------------------------- damaged checkpoints

def _truncate(p: Path) -> None:
    p.write_bytes(p.read_bytes()[:-100])


class _Planted:
    """What a hostile optimizer file holds: unpickling it would run a shell command."""

    marker = Path("/nonexistent")

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def _pickle_in(p: Path) -> None:
    _Planted.marker = p.parent.parent.parent / "PWNED"
    torch.save({"state": {0: _Planted()}, "param_groups": []}, p)


def _gan_keys(p: Path) -> None:
    from safetensors.torch import load_file, save_file

    save_file({f"renamed.{k}": v for k, v in load_file(str(p)).items()}, str(p))


def _json_type(p: Path) -> None:
    _edit_state(p, batches_used="many")


def _as_format_1(ckpt: Path) -> None:
    """The checkpoint as an engine before format 2 wrote it: optimizer states as torch.save files."""
    from dmad.models.optim_state import read_optimizer

    for name in ("generator", "critic"):
        new = ckpt / f"optimizer_{name}.safetensors"
        torch.save(read_optimizer(new), ckpt / f"optimizer_{name}.pt")
        new.unlink()
    _edit_state(ckpt / "training_state.json", format_version=1)


def _edit_state(p: Path, **fields) -> None:
    p.write_text(json.dumps({**json.loads(p.read_text()), **fields}))


def _legacy_pickle_in(p: Path) -> None:
    _as_format_1(p.parent)
    _pickle_in(p.parent / "optimizer_generator.pt")


DAMAGE = {
    "truncated student": ("student/diffusion_pytorch_model.safetensors", _truncate),
    "missing optimizer": ("optimizer_critic.safetensors", Path.unlink),
    "truncated optimizer": ("optimizer_generator.safetensors", _truncate),
    "garbage rng": ("rng.safetensors", lambda p: p.write_bytes(os.urandom(300))),
    "pickle in a format 1 optimizer": ("training_state.json", _legacy_pickle_in),
    "wrong GAN-head keys": ("gan_head.safetensors", _gan_keys),
    "training_state type": ("training_state.json", _json_type),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_resume_falls_back_past_a_damaged_latest_checkpoint(run_copy, capsys, damage):
    config, run = run_copy
    name, spoil = DAMAGE[damage]
    spoil(run / "checkpoints" / "iter_4" / name)
    assert _train(config, run, "--resume", "latest", "--set", "optimization.max_train_steps=5") == 0
    events = list(read_events(run / "events.jsonl"))
    restored = [e for e in events if e.kind == "phase" and e.data.get("phase") == "restored"]
    assert restored[-1].iter == 2 and restored[-1].data["checkpoint"].endswith("iter_2")
    warning = [e.data["message"] for e in events if e.kind == "warning" and "damaged" in e.data["message"]]
    assert len(warning) == 1 and "iter_4" in warning[0]
    assert "weights_only" not in json.dumps([e.data for e in events]) + capsys.readouterr().err
    assert not (run / "PWNED").exists()
    assert _iters(run)[-3:] == [3, 4, 5] and _iters(run).count(3) == 1  # iterations 3-4 redone, once each


def test_a_format_1_checkpoint_still_resumes_exactly(run_copy, trained):
    from safetensors.torch import load_file

    config, run = run_copy
    shutil.rmtree(run / "checkpoints" / "iter_4")
    (run / "checkpoints" / "latest.json").unlink()
    _as_format_1(run / "checkpoints" / "iter_2")
    assert _train(config, run, "--resume", "latest") == 0
    student = "checkpoints/iter_4/student/diffusion_pytorch_model.safetensors"
    a, b = load_file(str(run / student)), load_file(str(trained[1] / student))
    assert all(torch.equal(a[k], b[k]) for k in b)


def test_no_usable_checkpoint_left_is_exit_2_and_one_line(run_copy, capsys):
    config, run = run_copy
    for it in (2, 4):
        _legacy_pickle_in(run / "checkpoints" / f"iter_{it}" / "training_state.json")
    assert _train(config, run, "--resume", "latest") == 2
    line = _one_line(capsys)
    assert "no usable checkpoint" in line and "weights_only" not in line and "could run code" in line
    assert not (run / "PWNED").exists()


# ---------------------------------------------------------------- confinement

def test_latest_json_pointing_into_another_run_is_ignored(run_copy, tmp_path):
    config, run = run_copy
    other = tmp_path / "other"
    shutil.copytree(run, other)
    (run / "checkpoints" / "latest.json").write_text(json.dumps({"iter": 4, "path": "../../other/checkpoints/iter_4"}))
    shutil.rmtree(run / "checkpoints" / "iter_4")
    assert RunFolder(run).latest_checkpoint() == (2, run / "checkpoints" / "iter_2")
    os.symlink(other / "checkpoints" / "iter_4", run / "checkpoints" / "iter_4")  # a link out is not ours either
    assert [it for it, _ in RunFolder(run).list_checkpoints()] == [2]


def test_a_log_linked_out_of_the_run_folder_is_refused_before_any_write(run_copy, tmp_path, capsys):
    config, run = run_copy
    outside = tmp_path / "outside.txt"
    outside.write_text("precious\n")
    (run / "logs" / "engine.log").unlink()
    os.symlink(outside, run / "logs" / "engine.log")
    before = (run / "events.jsonl").read_bytes()
    assert _train(config, run, "--resume", "latest") == 2
    line = _one_line(capsys)
    assert "logs/engine.log is a symbolic link to" in line and "outside the run folder" in line
    assert outside.read_text() == "precious\n" and (run / "events.jsonl").read_bytes() == before


def test_a_run_dir_below_a_regular_file_is_exit_2_before_any_model_loads(write_config, tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    for extra in (["--dry-run"], []):
        assert _train(write_config(), blocker / "run", *extra) == 2
        assert "is a file, not a folder" in _one_line(capsys)


def _mutate(rng, line: bytes) -> bytes:
    kind = rng.randrange(7)
    b = bytearray(line)
    if kind == 0 and b:  # flip bytes
        for _ in range(rng.randint(1, 4)):
            b[rng.randrange(len(b))] = rng.randrange(256)
    elif kind == 1 and b:  # cut
        del b[rng.randrange(len(b)):]
    elif kind == 2:  # nest
        depth = rng.choice([10, 1000, 50_000])
        b = bytearray(b"[" * depth + bytes(b) + b"]" * rng.choice([0, depth]))
    elif kind == 3:  # a huge value
        b = bytearray(line.replace(b'"t":', b'"x": "' + b"y" * rng.choice([10, 5000, 200_000]) + b'", "t":'))
    elif kind == 4:  # other types where the command is
        b = bytearray(line.replace(b'"stop"', rng.choice([b"1", b"null", b"[]", b'{"cmd": "stop"}', b"NaN"])))
    elif kind == 5:  # odd numbers for the time
        b = bytearray(line.replace(b'"t":', b'"t": ' + rng.choice([b"NaN", b"1e999", b'"now"', b"true"]) + b', "u":'))
    else:  # embedded newlines and NULs
        b.insert(rng.randrange(len(b) + 1), rng.choice([10, 0, 13]))
    return bytes(b)


def test_fuzzed_control_lines_never_raise_and_valid_commands_get_through(tmp_path):
    import random

    rng = random.Random(18)
    path = tmp_path / "control.jsonl"
    valid = (json.dumps({"cmd": "stop", "t": time.time()}) + "\n").encode()
    reader = ControlReader(path, offset=0, since=0.0)
    got = 0
    for i in range(400):
        with open(path, "ab") as f:
            f.write(_mutate(rng, valid.rstrip(b"\n")) + b"\n")
            f.write(valid)  # a good command after every bad line
        try:
            commands = reader.poll()
            while len(commands) < 1:  # an over-long line takes more than one poll
                more = reader.poll()
                if not more:
                    break
                commands += more
        except BaseException as e:  # noqa: BLE001 - the point of the test
            pytest.fail(f"mutation {i} (seed 18) raised {type(e).__name__}: {e}")
        got += sum(c.get("cmd") == "stop" for c in commands)
    assert got >= 400  # every good line arrived (a mutation may itself still be a valid stop)


def test_sample_and_export_never_write_through_a_link_out_of_the_run(run_copy, tmp_path, capsys):
    config, run = run_copy
    outside = tmp_path / "elsewhere"
    shutil.move(run / "samples", outside)
    os.symlink(outside, run / "samples")
    assert dmad(["sample", "--run", str(run), "--checkpoint", "teacher"]) == 2
    assert "samples is a symbolic link to" in _one_line(capsys)
    shutil.rmtree(run / "export")
    os.symlink(outside, run / "export")
    assert dmad(["export", "--run", str(run), "--format", "diffusers"]) == 2
    assert "export is a symbolic link to" in _one_line(capsys)
    assert not any(p.name.startswith("iter_4-diffusers") for p in outside.iterdir())


def test_a_resume_compares_configs_by_meaning_not_by_the_methods_older_word(tmp_path):
    """A run written when DMAD's value was "dmd2", resumed today ("dmad"): not a changed config;
    a real change is still named."""
    from dmad.contract.config import TrainConfig
    from dmad.contract.runs import RunFolder, atomic_write_json
    from dmad.train.run_files import _config_changes

    resolved = TrainConfig.model_validate({"identity": {"pretrained_model_name_or_path": "t",
                                                        "train_data_dir": "d"}}).model_dump(mode="json")
    folder = RunFolder.create(tmp_path / "run")
    older = {g: dict(f) if isinstance(f, dict) else f for g, f in resolved.items()}
    older["distillation"]["method"] = "dmd2"
    atomic_write_json(folder.config_json, older)
    assert resolved["distillation"]["method"] == "dmad" and _config_changes(folder, resolved) == []
    older["optimization"]["generator_lr"] = 1.0
    atomic_write_json(folder.config_json, older)
    assert _config_changes(folder, resolved) == [f"optimization.generator_lr 1.0 -> {resolved['optimization']['generator_lr']!r}"]
