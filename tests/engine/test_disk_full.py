"""A full disk is a known failure everywhere (issue 43 W6, E5): every writer (the Rust safetensors
writer included) says so in one line, with what was being written, the bytes needed and the bytes
free, exits 1 (cause `disk_full` in a run's error event), and leaves nothing half-written; a start
with no room for one checkpoint is refused (exit 2) before anything is written. The disk is filled
by monkeypatching the writers (CI may not mount a small file system); docs/ARCHITECTURE.md,
Reliability. The commands run in process (dmad.cli.main) on the tiny teacher."""
from __future__ import annotations

import errno
import hashlib
import json
import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from safetensors import SafetensorError  # noqa: E402

from dmad.cli import main as cli  # noqa: E402
from dmad.contract.diskspace import disk_full_message, is_disk_full, size_text  # noqa: E402
from dmad.contract.events import is_iteration_metric, read_events  # noqa: E402

# what safetensors 0.8 raises on a full disk (seen on a 40 MB tmpfs)
RUST_FULL = "Error while serializing: I/O error: No space left on device (os error 28)"


def _enospc(path="") -> OSError:
    return OSError(errno.ENOSPC, "No space left on device", str(path))


def _train(config: Path, run: Path, *extra: str) -> int:
    return cli(["train", "--config", str(config), "--run-dir", str(run), *extra])


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    lines = [line for line in err if line.startswith("dmad:")]
    assert len(lines) == 1 and "Traceback" not in "\n".join(err), err
    assert "internal error" not in lines[0] and "dmad-crash" not in lines[0], lines[0]
    return lines[0]


def _hashes(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)) + ("/" if p.is_dir() else ""):
            "dir" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*"))}


def _error(run: Path):
    return [e for e in read_events(run / "events.jsonl") if e.kind == "error"][-1]


def _status(run: Path) -> dict:
    return json.loads((run / "status.json").read_text())


def _iters(run: Path) -> list[int]:
    return [e.iter for e in read_events(run / "events.jsonl") if is_iteration_metric(e)]


@pytest.fixture(autouse=True)
def _no_crash_logs(monkeypatch, tmp_path):
    """A crash log in the system temp folder fails the test (the CLI writes one for internal errors)."""
    import tempfile

    crash_dir = tmp_path / "system-temp"
    crash_dir.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(crash_dir))
    yield
    assert not list(crash_dir.glob("dmad-crash-*")), "a crash log was written"


# ---------------------------------------------------------------- recognising it

def test_a_full_disk_is_recognised_from_every_writer():
    assert is_disk_full(_enospc()) and is_disk_full(OSError(errno.EDQUOT, "Disk quota exceeded"))
    assert is_disk_full(SafetensorError(RUST_FULL))  # no OSError: known by the OS's text
    wrapped = RuntimeError("saving failed")
    wrapped.__cause__ = SafetensorError(RUST_FULL)
    assert is_disk_full(wrapped)
    assert not is_disk_full(OSError(errno.EACCES, "Permission denied")) and not is_disk_full(ValueError("x"))
    assert not is_disk_full(SafetensorError("Error while deserializing header: HeaderTooLarge"))


def test_the_line_says_what_needed_and_free(tmp_path):
    line = disk_full_message("checkpoint iter_4", tmp_path, 28_077_474)
    assert line.startswith(f"out of disk space writing checkpoint iter_4 in {tmp_path}: needs about 28.1 MB, ")
    assert line.endswith(" free") and size_text(0) == "0 bytes" and size_text(3_400) == "3.4 kB"


# ---------------------------------------------------------------- train

def test_the_safetensors_writer_filling_the_disk_during_a_checkpoint_is_disk_full(write_config, tmp_path, monkeypatch,
                                                                                 capsys):
    """Issue 43 W6: the Rust writer's SafetensorError was cause `exception` with a traceback."""
    import dmad.models.optim_state

    real = dmad.models.optim_state.save_file
    calls = {"n": 0}

    def full_disk(tensors, path, *args, **kwargs):
        if "iter_4" in str(path):
            calls["n"] += 1
            Path(path).write_bytes(b"\0" * 1000)  # some bytes made it, then the disk was full
            raise SafetensorError(RUST_FULL)
        return real(tensors, path, *args, **kwargs)

    monkeypatch.setattr(dmad.models.optim_state, "save_file", full_disk)
    config = write_config({"optimization": {"max_train_steps": 6}})
    run = tmp_path / "run"
    assert _train(config, run) == 1
    line = _one_line(capsys)
    assert line.startswith(f"dmad: error: out of disk space writing checkpoint iter_4 in {run / 'checkpoints'}: "
                           f"needs about ") and " MB, " in line and " free; " in line and "--resume latest" in line
    assert _error(run).data["cause"] == "disk_full" and _error(run).data["reason"] in line
    assert _status(run)["state"] == "failed" and _status(run)["failure_reason"] in line
    assert "Traceback" not in (run / "logs" / "engine.log").read_text()
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["iter_2", "latest.json"]  # no temp left
    monkeypatch.undo()
    assert _train(config, run, "--resume", "latest") == 0
    assert _iters(run) == [1, 2, 3, 4, 5, 6] and calls["n"] == 1


def test_a_full_disk_during_a_checkpoint_is_one_line_and_resumable(write_config, tmp_path, monkeypatch, capsys):
    import dmad.models.checkpoint

    real = dmad.models.checkpoint.save_file
    calls = {"n": 0}

    def full_disk(tensors, path, *args, **kwargs):
        if "iter_4" in str(path):
            calls["n"] += 1
            real(tensors, path, *args, **kwargs)  # some bytes made it, then the disk was full
            raise _enospc(path)
        return real(tensors, path, *args, **kwargs)

    monkeypatch.setattr(dmad.models.checkpoint, "save_file", full_disk)
    config = write_config({"optimization": {"max_train_steps": 6}})
    run = tmp_path / "run"
    assert _train(config, run) == 1
    line = _one_line(capsys)
    assert line.startswith("dmad: error: out of disk space writing checkpoint iter_4 in") and " free; " in line
    assert "needs about" in line and "--resume latest" in line
    status = _status(run)
    assert status["state"] == "failed" and status["failure_reason"] in line
    assert _error(run).data["cause"] == "disk_full"
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["iter_2", "latest.json"]  # no temp left
    monkeypatch.undo()
    assert _train(config, run, "--resume", "latest") == 0
    assert _iters(run) == [1, 2, 3, 4, 5, 6] and calls["n"] == 1


def test_a_full_disk_while_logging_metrics_is_the_same_one_line(write_config, tmp_path, monkeypatch, capsys):
    from dmad.contract.runlog import CsvAppender

    real = CsvAppender.append

    def append(self, row):
        if row.get("iter") == 3:
            raise OSError(errno.ENOSPC, "No space left on device", str(self.path))
        return real(self, row)

    monkeypatch.setattr(CsvAppender, "append", append)
    run = tmp_path / "run"
    assert _train(write_config({"optimization": {"max_train_steps": 4}}), run) == 1
    line = _one_line(capsys)
    assert line.startswith(f"dmad: error: out of disk space writing metrics.csv in {run}: needs about "), line
    assert _status(run)["state"] == "failed" and _error(run).data["cause"] == "disk_full"


def test_a_full_disk_at_the_lock_file_leaves_no_folder(write_config, tmp_path, monkeypatch, capsys):
    """Issue 43 W6: with 0 bytes free, writing engine.lock was an internal error with a crash log in the
    system temp folder, and an empty skeleton folder was left."""
    import dmad.contract.runs

    def full(fd, data):
        raise _enospc()

    monkeypatch.setattr(dmad.contract.runs, "_write_all", full)  # the lock is the run's first write
    run = tmp_path / "runs" / "new"
    assert _train(write_config(), run) == 1
    line = _one_line(capsys)
    assert line.startswith(f"dmad: error: out of disk space writing engine.lock in {run}: ") and " free" in line
    assert "start again" in line
    assert not (tmp_path / "runs").exists()  # nor the parent the start made


def test_a_full_disk_at_the_lock_file_of_a_resume_changes_nothing(run_copy, monkeypatch, capsys):
    import dmad.contract.runs

    config, run = run_copy
    before = _hashes(run)
    real, calls = dmad.contract.runs._write_all, []

    def full_once(fd, data):  # the lock's write fails; putting the old one back (as small) finds room
        calls.append(len(data))
        if len(calls) == 1:
            raise _enospc()
        return real(fd, data)

    monkeypatch.setattr(dmad.contract.runs, "_write_all", full_once)
    assert _train(config, run, "--resume", "latest") == 1
    assert "out of disk space writing engine.lock" in _one_line(capsys)
    monkeypatch.undo()
    assert _hashes(run) == before


def test_a_full_disk_while_a_start_writes_its_files_leaves_the_folder_as_it_was(run_copy, monkeypatch, capsys):
    """Before the run has loaded its checkpoint a full disk is not the run's failure: the folder goes
    back byte for byte (as a refused start's), and the one line says so."""
    config, run = run_copy
    before = _hashes(run)

    def env():
        raise _enospc(run / "env.json")

    monkeypatch.setattr("dmad.train.env.collect_env", env)  # imported when the run's files are written
    assert _train(config, run, "--resume", "latest") == 1
    line = _one_line(capsys)
    assert "out of disk space writing env.json" in line and "left as it was" in line, line
    assert _hashes(run) == before


def test_no_room_for_one_checkpoint_refuses_a_fresh_start_before_any_write(write_config, tmp_path, monkeypatch, capsys):
    import dmad.contract.diskspace

    monkeypatch.setattr(dmad.contract.diskspace, "free_bytes", lambda path: 1000)
    run = tmp_path / "runs" / "new"
    assert _train(write_config(), run) == 2
    line = _one_line(capsys)
    assert line.startswith(f"dmad: error: not enough disk space in {run} for one checkpoint: needs about ")
    assert "1.0 kB free" in line
    assert not (tmp_path / "runs").exists()


def test_no_room_for_one_checkpoint_refuses_a_resume_and_changes_nothing(run_copy, monkeypatch, capsys):
    """The room a resume needs is the size of the checkpoint it resumes from."""
    import dmad.contract.diskspace
    from dmad.train.preflight import folder_bytes

    config, run = run_copy
    before = _hashes(run)
    size = folder_bytes(run / "checkpoints" / "iter_4")
    monkeypatch.setattr(dmad.contract.diskspace, "free_bytes", lambda path: size - 1)
    assert _train(config, run, "--resume", "latest") == 2
    line = _one_line(capsys)
    assert f"for one checkpoint: needs about {size_text(size)}, {size_text(size - 1)} free" in line, line
    assert _hashes(run) == before
    monkeypatch.setattr(dmad.contract.diskspace, "free_bytes", lambda path: size)  # just fits: it goes on
    assert _train(config, run, "--resume", "latest") == 0


def test_the_fresh_estimate_is_not_more_than_a_real_checkpoint(trained, tiny_teacher):
    """The estimate from parameter counts is a floor (a run that fits is never refused), and not a
    loose one: the tiny DMAD run's checkpoint (its GAN head is large for so small a UNet) is < 1.5 x it."""
    from dmad.contract.config import load_config
    from dmad.memory.ledger import checkpoint_bytes
    from dmad.models.teacher import inspect_teacher
    from dmad.train.preflight import folder_bytes

    config, run = trained
    cfg = load_config(config)
    estimate = checkpoint_bytes(cfg, inspect_teacher(str(tiny_teacher), "auto", None))
    real = folder_bytes(run / "checkpoints" / "iter_4")
    assert estimate <= real < 1.5 * estimate


# ---------------------------------------------------------------- sample

def test_a_full_disk_while_sampling_is_one_line_and_leaves_no_folder(run_copy, monkeypatch, capsys):
    """Issue 43 W6: `dmad sample` on a full disk was an internal error and left an empty iter_4-r2/."""
    import dmad.sample.render

    config, run = run_copy
    before = _hashes(run)
    real = dmad.sample.render.atomic_write_bytes
    written = []

    def full_after_one(path, data, durable=True):
        if written:
            raise _enospc(path)
        written.append(path)
        return real(path, data, durable=durable)

    monkeypatch.setattr(dmad.sample.render, "atomic_write_bytes", full_after_one)
    assert cli(["sample", "--run", str(run), "--checkpoint", "4"]) == 1
    line = _one_line(capsys)
    assert line.startswith(f"dmad: error: out of disk space writing the samples of iter_4 in {run / 'samples'}: "
                           "needs about ") and " free" in line, line
    assert len(written) == 1 and not written[0].exists()  # one image made it, and went with its folder
    assert _hashes(run) == before  # no iter_4-r2/, empty or not


def test_a_full_disk_while_writing_a_sweep_leaves_neither_file(run_copy, monkeypatch, capsys, tmp_path):
    import dmad.contract.runs

    config, run = run_copy

    def full(path, obj, durable=True):
        raise _enospc(path)

    monkeypatch.setattr(dmad.contract.runs, "atomic_write_json", full)  # the grid's .json, after its .png
    out = tmp_path / "new" / "sweeps"
    assert cli(["sample", "--run", str(run), "--checkpoint", "4", "--sweep", "steps=1,2", "--out", str(out)]) == 1
    assert "out of disk space writing the samples of iter_4" in _one_line(capsys)
    assert not (tmp_path / "new").exists()  # the grid .png and the folders made for it are gone


# ---------------------------------------------------------------- export

def test_a_full_disk_while_exporting_is_one_line_and_leaves_nothing(run_copy, monkeypatch, capsys, tmp_path):
    """Issue 43 W6: `dmad export` on a full disk was an internal error."""
    import dmad.sample.export

    config, run = run_copy

    def full(tmp, *args, **kwargs):
        (tmp / "unet").mkdir()
        (tmp / "unet" / "diffusion_pytorch_model.safetensors").write_bytes(b"\0" * 1000)  # half a pipeline
        raise SafetensorError(RUST_FULL)

    monkeypatch.setattr(dmad.sample.export, "write_diffusers", full)
    out = tmp_path / "a" / "b" / "exported"
    assert cli(["export", "--run", str(run), "--format", "diffusers", "--out", str(out)]) == 1
    line = _one_line(capsys)
    assert line.startswith(f"dmad: error: out of disk space writing the export exported in {out.parent}: "
                           "needs about ") and " MB, " in line and " free" in line, line
    assert not (tmp_path / "a").exists()  # no temp folder, no parents made for it
    # the default place, inside the run: nothing is left in export/
    assert cli(["export", "--run", str(run), "--format", "diffusers"]) == 1
    assert "out of disk space writing the export iter_4-diffusers" in _one_line(capsys)
    assert list((run / "export").iterdir()) == []


def test_two_exports_to_one_out_keep_the_first_and_say_so(run_copy, monkeypatch, capsys, tmp_path):
    """Issue 43 E5: the second rename onto the first export's folder was `[Errno 39]`, an internal
    error with its crash log in the run's engine.log."""
    import dmad.sample.export

    config, run = run_copy
    out = tmp_path / "exported"
    real = dmad.sample.export.write_diffusers
    log_before = (run / "logs" / "engine.log").read_bytes()

    def another_export_finishes_meanwhile(tmp, *args, **kwargs):
        out.mkdir()
        (out / "model_index.json").write_text('{"the": "other export"}')
        return real(tmp, *args, **kwargs)

    monkeypatch.setattr(dmad.sample.export, "write_diffusers", another_export_finishes_meanwhile)
    assert cli(["export", "--run", str(run), "--format", "diffusers", "--out", str(out)]) == 2
    line = _one_line(capsys)
    assert line.startswith(f"dmad: error: --out {out} was created by another export while this one ran"), line
    assert [p.name for p in out.iterdir()] == ["model_index.json"] and "other export" in (
        out / "model_index.json").read_text()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "system-temp") == ["exported", "run"]  # no .tmp-
    assert (run / "logs" / "engine.log").read_bytes() == log_before


# ---------------------------------------------------------------- check-data

def test_a_full_disk_writing_the_check_data_report_is_one_line(tiny_data, tmp_path, monkeypatch, capsys):
    import dmad.data.check_command

    def full(path, obj, durable=True):
        raise _enospc(path)

    monkeypatch.setattr(dmad.data.check_command, "atomic_write_json", full)
    report = tmp_path / "report.json"
    assert cli(["check-data", str(tiny_data), "--json", str(report), "--no-cache"]) == 1
    line = _one_line(capsys)
    assert line.startswith(f"dmad: error: out of disk space writing --json report.json in {tmp_path}: needs about ")
    assert not report.exists()
