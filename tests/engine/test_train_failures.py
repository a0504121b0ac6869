"""How a run ends when something breaks: out of memory is classified by phase (exit 3), an
unexpected exception is one line plus the traceback in logs/engine.log (exit 1); both leave an
error event and a failed status."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from dmad.contract.config import load_config  # noqa: E402
from dmad.errors import DmadError  # noqa: E402
from dmad.contract.events import is_iteration_metric, read_events  # noqa: E402
from dmad.train.session import DataStream  # noqa: E402
from dmad.train.loop import run_training  # noqa: E402


def _oom(*args, **kwargs):
    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")


def _run(write_config, tmp_path: Path, extra: dict | None = None) -> tuple[int, Path]:
    cfg = load_config(write_config({"optimization": {"max_train_steps": 4}, **(extra or {})}))
    run = tmp_path / "run"
    return run_training(cfg, run_dir=run, resume=None, argv=["dmad", "train"]), run


def _error(run: Path):
    errors = [e for e in read_events(run / "events.jsonl") if e.kind == "error"]
    assert len(errors) == 1
    status = json.loads((run / "status.json").read_text())
    assert status["state"] == "failed" and status["failure_reason"] == errors[0].data["reason"]
    return errors[0]


def test_oom_while_loading(write_config, tmp_path, monkeypatch, capsys):
    import dmad.models.teacher

    monkeypatch.setattr(dmad.models.teacher, "load_teacher", _oom)
    code, run = _run(write_config, tmp_path)
    assert code == 3
    err = _error(run)
    assert err.data["cause"] == "out_of_memory" and err.data["phase"] == "loading"
    assert "out of memory during loading" in capsys.readouterr().err


def test_oom_in_the_first_forward(write_config, tmp_path, monkeypatch):
    import dmad.methods.dmd2

    monkeypatch.setattr(dmad.methods.dmd2, "student_input", _oom)  # the student's first forward
    code, run = _run(write_config, tmp_path)
    assert code == 3 and _error(run).data["phase"] == "first-forward"


def test_oom_at_a_later_step_names_the_iteration(write_config, tmp_path, monkeypatch):
    real, calls = DataStream.encode, []

    def encode(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 3:  # iteration 3: one micro-batch each
            _oom()
        return real(self, *args, **kwargs)

    monkeypatch.setattr(DataStream, "encode", encode)
    code, run = _run(write_config, tmp_path)
    assert code == 3
    err = _error(run)
    assert err.data["phase"] == "step-3" and err.iter == 2
    rows = [e.iter for e in read_events(run / "events.jsonl") if is_iteration_metric(e)]
    assert rows == [1, 2]


def test_unexpected_exception_is_one_line_with_the_log(write_config, tmp_path, monkeypatch):
    def boom(*args, **kwargs):
        raise ZeroDivisionError("a bug")

    import dmad.methods.dmd2

    monkeypatch.setattr(dmad.methods.dmd2, "student_input", boom)
    cfg = load_config(write_config())
    run = tmp_path / "run"
    with pytest.raises(DmadError) as exc:
        run_training(cfg, run_dir=run, resume=None, argv=["dmad", "train"])
    assert "ZeroDivisionError: a bug" in str(exc.value) and "engine.log" in str(exc.value)
    assert "Traceback" in (run / "logs" / "engine.log").read_text()
    assert _error(run).data["cause"] == "exception"


def test_sampling_failure_is_a_warning_and_training_goes_on(write_config, tmp_path, monkeypatch):
    import dmad.sample.render

    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(dmad.sample.render, "render_student_samples", broken)
    code, run = _run(write_config, tmp_path, {"observation": {"validation_steps": 1, "checkpointing_steps": 4}})
    assert code == 0
    events = list(read_events(run / "events.jsonl"))
    assert sum(1 for e in events if e.kind == "warning" and "disk full" in e.data["message"]) == 4
    assert events[-1].kind == "finished"


def test_unexpected_failure_through_the_cli_is_one_line_on_stderr(write_config, tmp_path, monkeypatch, capsys):
    """The engine's log handler on stderr leaves the traceback out: stderr has the one `dmad:` line
    (and log lines), logs/engine.log the traceback."""
    from tests.conftest import dmad_captured

    real, calls = DataStream.encode, []

    def encode(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 2:  # iteration 2: one micro-batch each
            raise RuntimeError("broken at iteration 2")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(DataStream, "encode", encode)
    run = tmp_path / "run"
    code, out, err = dmad_captured(capsys, "train", "--config", str(write_config({"optimization": {"max_train_steps": 4}})),
                                   "--run-dir", str(run))
    assert code == 1
    assert "Traceback" not in err and 'File "' not in err, err
    ours = [line for line in err.splitlines() if line.startswith("dmad:")]
    assert len(ours) == 1 and ours[0].startswith("dmad: error: RuntimeError: broken at iteration 2"), err
    log = (run / "logs" / "engine.log").read_text()
    assert "Traceback" in log and "broken at iteration 2" in log
    assert _error(run).data["cause"] == "exception" and _error(run).iter == 1
