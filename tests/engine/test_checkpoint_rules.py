"""What a run's checkpoints may hold and which one "latest" is (issue 43: W2, W3, W5, E1, P1, P2).

- One rule for "latest", shared by resume, sample and export (RunFolder.checkpoints_from_latest):
  the checkpoint latest.json names; after a branch from an older checkpoint, the abandoned newer
  ones are neither latest nor a fallback.
- training_state.json values are range-checked: an iter other than its folder's, or more batches
  or generator steps than the iterations allow, make the checkpoint unusable.
- NaN or Inf weights make a checkpoint unusable: resume and "latest" pass over it to an older one;
  a checkpoint named by sample or export is refused with one line, as a truncated one is.
- sample and export read only checkpoints inside the run, and never write their crash log
  through a link that leaves it."""
from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from dmad.contract.events import is_iteration_metric, read_events  # noqa: E402
from dmad.contract.runs import RunFolder  # noqa: E402
from tests.conftest import dmad_captured  # noqa: E402


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny_teacher, tiny_data, tiny_prompt_set):
    """(config, a finished 6-iteration run with checkpoints at 2, 4 and 6)."""
    from tests.conftest import train_tiny_run

    return train_tiny_run(tmp_path_factory.mktemp("rules"), tiny_teacher, tiny_data, tiny_prompt_set, 6)


@pytest.fixture
def run(trained, tmp_path) -> tuple[Path, Path]:
    config, original = trained
    copy = tmp_path / "run"
    shutil.copytree(original, copy, symlinks=True)
    return config, copy


def _hashes(run: Path) -> dict[str, str]:
    return {str(p.relative_to(run)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(run.rglob("*")) if p.is_file() and not p.is_symlink()}


def _error_line(err: str) -> str:
    lines = [x for x in err.strip().splitlines() if x.startswith("dmad: error")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def _sampled(out: str) -> str:
    [event] = [json.loads(x) for x in out.splitlines() if x.startswith("{")]
    return event["data"]["checkpoint"]


def _state(ckpt: Path, **values) -> None:
    path = ckpt / "training_state.json"
    doc = json.loads(path.read_text())
    doc.update(values)
    path.write_text(json.dumps(doc))


def _nan_student(ckpt: Path) -> None:
    from safetensors.torch import load_file, save_file

    [path] = sorted((ckpt / "student").glob("*.safetensors"))
    state = load_file(str(path))
    key = sorted(k for k, v in state.items() if v.is_floating_point())[0]
    state[key] = torch.full_like(state[key], float("nan"))
    save_file(state, str(path))


def _truncate_student(ckpt: Path) -> None:
    [path] = sorted((ckpt / "student").glob("*.safetensors"))
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _metric_iters(run: Path) -> list[int]:
    return [e.iter for e in read_events(run / "events.jsonl") if is_iteration_metric(e)]


# --------------------------------------------------------------------------- one rule for latest

def test_after_a_branch_every_command_takes_the_branch_as_latest(run, capsys):
    config, run = run
    code, _, _ = dmad_captured(capsys, "train", "--config", str(config), "--run-dir", str(run), "--resume",
                               str(run / "checkpoints" / "iter_2"), "--set", "optimization.max_train_steps=3")
    assert code == 0
    assert (run / "checkpoints" / "iter_6").is_dir()  # the abandoned branch is kept, not deleted
    folder = RunFolder(run)
    assert [it for it, _ in folder.checkpoints_from_latest()] == [3, 2]  # iter_4 and iter_6 are not fallbacks
    code, out, err = dmad_captured(capsys, "sample", "--run", str(run))
    assert code == 0 and _sampled(out) == "iter_3", err
    from dmad.sample.export import resolve_source

    assert resolve_source(str(run), "latest").iter == 3
    code, _, err = dmad_captured(capsys, "train", "--config", str(config), "--run-dir", str(run), "--resume", "latest",
                                 "--set", "optimization.max_train_steps=4")
    assert code == 0, err
    assert _metric_iters(run) == [1, 2, 3, 4]  # continued from iter_3, not from the abandoned iter_6


# --------------------------------------------------------------------------- NaN weights and damaged files

def test_a_resume_passes_over_a_checkpoint_with_nan_weights(run, capsys):
    config, run = run
    _nan_student(run / "checkpoints" / "iter_6")
    code, _, err = dmad_captured(capsys, "train", "--config", str(config), "--run-dir", str(run), "--resume", "latest",
                                 "--set", "optimization.max_train_steps=7")
    assert code == 0, err
    events = list(read_events(run / "events.jsonl"))
    assert not [e for e in events if e.kind == "error"]
    passed = [e.data["message"] for e in events if e.kind == "warning" and "passed over" in e.data["message"]]
    assert len(passed) == 1 and "iter_6" in passed[0] and "NaN" in passed[0]
    assert _metric_iters(run) == [1, 2, 3, 4, 5, 6, 7]  # cut back to iter_4's history, then on
    state = json.loads((run / "checkpoints" / "iter_7" / "training_state.json").read_text())
    assert state["iter"] == 7


@pytest.mark.parametrize("damage", [_nan_student, _truncate_student], ids=["nan", "truncated"])
def test_sample_and_export_refuse_a_named_damaged_checkpoint_and_latest_passes_over_it(run, capsys, damage):
    _, run = run
    damage(run / "checkpoints" / "iter_6")
    before = _hashes(run)
    for command in (("sample",), ("export", "--format", "diffusers")):
        code, out, err = dmad_captured(capsys, *command, "--run", str(run), "--checkpoint", "6")
        assert code == 2 and out == ""
        line = _error_line(err)
        assert "iter_6" in line and ("NaN" in line if damage is _nan_student else "damaged" in line), line
    assert _hashes(run) == before and not any((run / "export").iterdir())
    code, out, err = dmad_captured(capsys, "sample", "--run", str(run))
    assert code == 0 and _sampled(out) == "iter_4"
    assert "passed over a damaged checkpoint" in err and "iter_6" in err
    from dmad.sample.export import resolve_source

    assert resolve_source(str(run), "latest").iter == 4


# --------------------------------------------------------------------------- training_state ranges

@pytest.mark.parametrize("values, reason", [
    ({"batches_used": 10**30}, "batches_used"),
    ({"iter": 999}, "not the 6 its folder is named for"),
    ({"generator_steps": 7}, "generator_steps"),
], ids=["batches_used 10**30", "iter 999 in iter_6", "more generator steps than iterations"])
def test_out_of_range_training_state_is_passed_over(run, capsys, values, reason):
    config, run = run
    _state(run / "checkpoints" / "iter_6", **values)
    code, _, err = dmad_captured(capsys, "train", "--config", str(config), "--run-dir", str(run), "--resume", "latest",
                                 "--set", "optimization.max_train_steps=7")
    assert code == 0, err
    passed = [e.data["message"] for e in read_events(run / "events.jsonl")
              if e.kind == "warning" and "passed over" in e.data["message"]]
    assert len(passed) == 1 and reason in passed[0], passed
    assert json.loads((run / "status.json").read_text())["state"] == "finished"
    assert json.loads((run / "checkpoints" / "iter_7" / "training_state.json").read_text())["iter"] == 7


def test_a_named_checkpoint_out_of_range_is_refused_untouched(run, capsys):
    config, run = run
    _state(run / "checkpoints" / "iter_4", iter=999)
    before = _hashes(run)
    code, _, err = dmad_captured(capsys, "train", "--config", str(config), "--run-dir", str(run), "--resume",
                                 str(run / "checkpoints" / "iter_4"), "--set", "optimization.max_train_steps=8")
    assert code == 2 and "not the 4 its folder is named for" in _error_line(err)
    assert _hashes(run) == before


# --------------------------------------------------------------------------- confinement

def test_sample_does_not_render_a_checkpoint_linked_from_another_run(run, trained, capsys):
    _, run = run
    _, other = trained
    (run / "checkpoints" / "iter_8").symlink_to(other / "checkpoints" / "iter_6", target_is_directory=True)
    for command in (("sample",), ("export", "--format", "diffusers")):
        code, out, err = dmad_captured(capsys, *command, "--run", str(run), "--checkpoint", "8")
        assert code == 2 and out == ""
        assert "no checkpoint iter_8" in _error_line(err)


@pytest.mark.parametrize("command", ["sample", "export"])
def test_a_crash_log_is_never_written_through_a_link_out_of_the_run(run, tmp_path, capsys, monkeypatch, command):
    import dmad.sample.command
    import dmad.sample.export

    _, run = run
    outside = tmp_path / "outside.log"
    outside.write_text("precious\n")
    (run / "logs" / "engine.log").unlink()
    (run / "logs" / "engine.log").symlink_to(outside)

    def boom(*args, **kwargs):
        raise RuntimeError("a bug")

    monkeypatch.setattr(dmad.sample.export, "export", boom)
    monkeypatch.setattr(dmad.sample.command, "_render_folder", boom)
    args = ("sample",) if command == "sample" else ("export", "--format", "diffusers")
    args += ("--out", str(tmp_path / "out"))  # without --out both refuse the link before any work
    code, _, err = dmad_captured(capsys, *args, "--run", str(run))
    assert code == 1 and "internal error" in err and "a bug" in err
    assert outside.read_text() == "precious\n"


# --------------------------------------------------------------------------- a restarted run

def test_a_run_started_again_keeps_no_error_of_the_attempt_that_failed(write_config, tmp_path, capsys, monkeypatch):
    """A run that failed before its first checkpoint, started again with --resume latest, reads as
    the run that finished: the failed attempt's error event does not stay in its history."""
    import dmad.train.loop

    config, run = write_config({"optimization": {"max_train_steps": 3}}), tmp_path / "run"

    def boom(*args, **kwargs):
        raise RuntimeError("a bug at iteration 1")

    monkeypatch.setattr(dmad.train.loop, "checkpoint_and_sample", boom)
    code, _, err = dmad_captured(capsys, "train", "--config", str(config), "--run-dir", str(run))
    assert code == 1 and [e.kind for e in read_events(run / "events.jsonl")].count("error") == 1
    monkeypatch.undo()
    code, _, err = dmad_captured(capsys, "train", "--config", str(config), "--run-dir", str(run), "--resume", "latest")
    assert code == 0, err
    events = list(read_events(run / "events.jsonl"))
    assert not [e for e in events if e.kind == "error"]
    assert _metric_iters(run) == [1, 2, 3] and events[-1].kind == "finished"
