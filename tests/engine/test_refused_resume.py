"""A refused start never cuts a run's history (issue 43, D1 and W1): a resume whose config does not
fit the run's checkpoints, or a start refused while loading, exits 2 with one line and leaves every
file of the run folder byte for byte as it was (hashed before and after); a fresh run refused while
loading leaves no folder behind. The logs are cut back to a checkpoint only once it has loaded."""
from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from dmad.cli import main as dmad  # noqa: E402
from dmad.contract.events import is_iteration_metric, read_events  # noqa: E402
from dmad.errors import UserInputError  # noqa: E402


def _train(config: Path, run: Path, *extra: str) -> int:
    return dmad(["train", "--config", str(config), "--run-dir", str(run), *extra])


def _hashes(run: Path) -> dict[str, str]:
    return {str(p.relative_to(run)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(run.rglob("*")) if p.is_file()} | {
        str(p.relative_to(run)) + "/": "dir" for p in run.rglob("*") if p.is_dir()}


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    lines = [line for line in err if line.startswith("dmad:")]
    assert len(lines) == 1 and "Traceback" not in "\n".join(err), err
    return lines[0]


def _metric_iters(run: Path) -> list[int]:
    return [e.iter for e in read_events(run / "events.jsonl") if is_iteration_metric(e)]


def _rows(run: Path) -> list[str]:
    return (run / "metrics.csv").read_text().splitlines()


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny_teacher, tiny_data, tiny_prompt_set):
    """A finished 6-iteration run, checkpoints at 2, 4 and 6, a metrics row every iteration;
    and the same with a LoRA student and fake score (rank 4)."""
    from tests.conftest import tiny_config_dict

    base = tmp_path_factory.mktemp("refused")
    out = {}
    for name, ident in (("full", {}), ("lora", {"student": "lora", "fake_score": "lora", "lora_rank": 4})):
        cfg = tiny_config_dict(tiny_teacher, tiny_data, tiny_prompt_set, base / "runs")
        cfg["identity"].update(ident)
        cfg["optimization"]["max_train_steps"] = 6
        config = base / f"{name}.json"
        config.write_text(json.dumps(cfg))
        assert _train(config, base / name) == 0
        out[name] = (config, base / name)
    return out


def _copy(trained, kind: str, tmp_path: Path) -> tuple[Path, Path]:
    config, run = trained[kind]
    copy = tmp_path / "run"
    shutil.copytree(run, copy, symlinks=True)
    return config, copy


MISFITS = {
    "EMA asked of a run without one": ("full", "distillation.ema_decay=0.99", "has no EMA weights"),
    "other student steps": ("full", "distillation.student_steps=2", "trained with student timesteps [999]"),
    "another method": ("full", "distillation.method=lcm", "is from a DMAD run"),
    "a LoRA student on a full one": ("full", "identity.student=lora", "has a full student"),
    "a LoRA fake score on a full one": ("full", "identity.fake_score=lora", "has a full fake_score"),
    "a full student on a LoRA one": ("lora", "identity.student=full", "has a LoRA student"),
    "another LoRA rank": ("lora", "identity.lora_rank=8", "LoRA has rank 4; this config has identity.lora_rank 8"),
    "other LoRA targets": ("lora", "identity.lora_targets=attention+ff",
                           "LoRA adapts the attention projections only (identity.lora_targets attention); this "
                           "config has identity.lora_targets attention+ff"),
    "fp16 on a CPU": ("full", "resources.mixed_precision=fp16", "fp16 needs a CUDA GPU"),
}


@pytest.mark.parametrize("misfit", list(MISFITS))
def test_a_resume_the_config_does_not_fit_touches_nothing(trained, tmp_path, capsys, misfit):
    kind, setting, reason = MISFITS[misfit]
    config, run = _copy(trained, kind, tmp_path)
    before = _hashes(run)
    assert _train(config, run, "--resume", "latest", "--set", setting, "--set", "optimization.max_train_steps=8") == 2
    line = _one_line(capsys)
    assert reason in line
    assert "damaged" not in line  # a whole checkpoint of another kind, not a broken one
    assert _hashes(run) == before


def test_the_run_continues_whole_after_a_refused_resume(trained, tmp_path):
    config, run = _copy(trained, "full", tmp_path)
    rows = _rows(run)
    assert _train(config, run, "--resume", "latest", "--set", "distillation.ema_decay=0.99") == 2
    assert _train(config, run, "--resume", "latest", "--set", "optimization.max_train_steps=8") == 0
    assert _rows(run)[:len(rows)] == rows and len(_rows(run)) == len(rows) + 2
    assert _metric_iters(run) == list(range(1, 9))
    assert json.loads((run / "config.json").read_text())["distillation"]["ema_decay"] is None


def _wrong_gan_shape(ckpt: Path) -> None:
    """A whole file (its header and coverage pass verify_checkpoint) whose tensors do not fit the
    network: found only once the weights load, minutes into a large model's start."""
    from safetensors.torch import load_file, save_file

    path = ckpt / "gan_head.safetensors"
    save_file({k: torch.zeros(*(s + 1 for s in v.shape)) for k, v in load_file(str(path)).items()}, str(path))


def test_a_resume_refused_while_loading_leaves_every_file_as_it_was(trained, tmp_path, capsys):
    config, run = _copy(trained, "full", tmp_path)
    for it in (2, 4, 6):
        _wrong_gan_shape(run / "checkpoints" / f"iter_{it}")
    before = _hashes(run)
    assert _train(config, run, "--resume", "latest", "--set", "optimization.max_train_steps=8") == 2
    assert "no usable checkpoint" in _one_line(capsys)
    assert _hashes(run) == before


def test_a_load_time_fallback_is_a_warning_not_a_failure(trained, tmp_path):
    config, run = _copy(trained, "full", tmp_path)
    _wrong_gan_shape(run / "checkpoints" / "iter_6")
    assert _train(config, run, "--resume", "latest", "--set", "optimization.max_train_steps=8") == 0
    events = list(read_events(run / "events.jsonl"))
    assert not [e for e in events if e.kind == "error"]
    assert [e.kind for e in events].count("started") == 2  # the first run's and the one that continued
    passed = [e.data["message"] for e in events if e.kind == "warning" and "passed over" in e.data["message"]]
    assert len(passed) == 1 and "iter_6" in passed[0]
    assert _metric_iters(run) == list(range(1, 9))


def test_a_fresh_run_refused_while_loading_leaves_no_folder(write_config, tmp_path, monkeypatch, capsys):
    import dmad.models.teacher

    def refuse(*args, **kwargs):
        raise UserInputError("teacher: a bad input found while loading")

    config, run = write_config(), tmp_path / "runs" / "fresh"
    with monkeypatch.context() as m:
        m.setattr(dmad.models.teacher, "load_teacher", refuse)
        assert _train(config, run) == 2
    assert "a bad input found while loading" in _one_line(capsys)
    assert not run.exists() and not (tmp_path / "runs").exists()
    assert _train(config, run) == 0  # the corrected command is not refused with "already exists"


def test_a_start_again_refused_while_loading_keeps_the_failed_run_as_it_was(write_config, tmp_path, monkeypatch):
    import dmad.methods.dmd2
    import dmad.models.teacher

    config, run = write_config(), tmp_path / "runs" / "again"

    def boom(*args, **kwargs):
        raise ZeroDivisionError("a bug before the first checkpoint")

    with monkeypatch.context() as m:
        m.setattr(dmad.methods.dmd2, "student_input", boom)
        assert _train(config, run) == 1
    before = _hashes(run)

    def refuse(*args, **kwargs):
        raise UserInputError("teacher: a bad input found while loading")

    with monkeypatch.context() as m:
        m.setattr(dmad.models.teacher, "load_teacher", refuse)
        assert _train(config, run, "--resume", "latest") == 2
    assert _hashes(run) == before
    assert _train(config, run, "--resume", "latest") == 0
    kinds = [e.kind for e in read_events(run / "events.jsonl")]
    assert "error" not in kinds and kinds[-1] == "finished"  # the failed attempt's error went with it
