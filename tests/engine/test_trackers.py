"""observation.report_to (dmad.train.trackers): a tracker whose package is missing is refused at
preflight, before torch loads; wandb stays offline unless the user set it up; and a tiny run with
tensorboard writes event files under <run>/logs/tensorboard holding every metrics.csv value at its
iteration and the health signals, a resume purging what the earlier engine logged after its
checkpoint; wandb writes an offline run there. The runs are skipped where their package is absent
(neither is a dependency); the refusal runs everywhere."""
from __future__ import annotations

import csv
import io
import json
import os
from pathlib import Path

import pytest

from dmad.train.trackers import flat_config, tracker_problem, wandb_configured
from tests.conftest import dmad_in_process

REFUSE = """
import importlib.util, sys
real = importlib.util.find_spec
importlib.util.find_spec = lambda name, *a, **k: None if name in ("wandb", "tensorboard", "tensorboardX") else real(name, *a, **k)
from dmad.cli import main
codes = [main(["train", "--config", {config!r}, "--set", "observation.report_to=" + to]) for to in ("wandb", "tensorboard")]
print(codes, "torch" in sys.modules)
"""


def test_a_missing_tracker_package_is_one_line_and_exit_2_before_torch_loads(write_config, run_python, tmp_path):
    config = write_config()
    out = run_python(REFUSE.format(config=str(config)))
    assert out.stdout.split() == ["[2,", "2]", "False"], out.stderr
    assert out.stderr.splitlines() == [
        'dmad: error: observation.report_to "wandb": the wandb package is not installed (pip install wandb)',
        'dmad: error: observation.report_to "tensorboard": the tensorboard package is not installed '
        '(pip install tensorboard)']
    assert not (tmp_path / "runs").exists()  # nothing written


def test_either_tensorboard_writer_will_do(monkeypatch):
    import importlib.util

    have = {"tensorboardX"}  # accelerate falls back to tensorboardX without torch.utils.tensorboard's package
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a, **k: object() if name in have else None)
    assert tracker_problem("tensorboard") is None and tracker_problem("none") is None
    assert "pip install wandb" in tracker_problem("wandb")


def test_wandb_stays_offline_unless_the_user_set_it_up(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    assert not wandb_configured({}, home)
    assert not wandb_configured({"WANDB_DIR": "/x", "WANDB_MODE": ""}, home)  # set but empty: not a choice
    for var in ("WANDB_MODE", "WANDB_API_KEY"):
        assert wandb_configured({var: "offline" if var == "WANDB_MODE" else "k" * 40}, home)
    (home / ".netrc").write_text("machine example.org login u password p\n")
    assert not wandb_configured({}, home)
    (home / ".netrc").write_text("machine api.wandb.ai\n  login user\n  password " + "k" * 40 + "\n")
    (home / ".netrc").chmod(0o600)
    assert wandb_configured({}, home)  # `wandb login`
    assert not wandb_configured({"WANDB_BASE_URL": "https://wandb.example.org"}, home)  # the key is for another host
    other = tmp_path / "other"
    other.mkdir()
    settings = other / ".config" / "wandb" / "settings"
    settings.parent.mkdir(parents=True)
    settings.write_text("[default]\nentity = me\n")
    assert not wandb_configured({}, other)
    settings.write_text("[default]\napi_key = " + "k" * 40 + "\n")
    assert wandb_configured({}, other)


def test_the_config_goes_to_the_trackers_flat(write_config):
    from dmad.contract.config import load_config

    flat = flat_config(load_config(write_config({"observation": {"report_to": "tensorboard"}})))
    assert flat["observation.report_to"] == "tensorboard" and flat["resources.resolution"] == 32
    assert flat["identity.teacher_loras"] == "[]" and flat["observation.validation_steps"] is None
    assert json.loads(flat["observation.health"]) == {"alerts": True, "stop_on_alert": False}
    assert all(v is None or isinstance(v, (bool, int, float, str)) for v in flat.values())


# --------------------------------------------------------------------------- a run with tensorboard

def _scalars(folder: Path) -> dict[str, list[tuple[int, float]]]:
    """{tag: [(step, value), ...]} as TensorBoard shows them (earlier engines' purged steps left out)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def _csv(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _expected(rows: list[dict], skip=("iter",)) -> dict[str, list[tuple[int, float]]]:
    """{column: [(iter, value), ...]} of a run's CSV, empty cells left out."""
    out: dict[str, list[tuple[int, float]]] = {}
    for r in rows:
        for k, v in r.items():
            if k not in skip and v not in ("", None):
                out.setdefault(k, []).append((int(r["iter"]), float(v)))
    return out


def _same(got: dict, want: dict, rel: float = 1e-6) -> None:
    """Same steps, same values (TensorBoard keeps float32: 1e-6 relative)."""
    assert set(want) <= set(got), sorted(set(want) - set(got))
    for tag, points in want.items():
        assert [s for s, _ in got[tag]] == [s for s, _ in points], tag
        assert [v for _, v in got[tag]] == pytest.approx([v for _, v in points], rel=rel, abs=1e-12), tag


def test_tensorboard_holds_every_metric_at_its_iteration_and_a_resume_purges_the_rest(
        write_config, health_prompt_set, tmp_path):
    pytest.importorskip("tensorboard")
    cfg = write_config({"optimization": {"max_train_steps": 4},
                        "observation": {"report_to": "tensorboard", "log_every_steps": 2, "checkpointing_steps": 2,
                                        "prompt_set": str(health_prompt_set)}})
    run = tmp_path / "run"
    assert dmad_in_process("train", "--config", str(cfg), "--run-dir", str(run)) == 0
    board = run / "logs" / "tensorboard"
    got, rows = _scalars(board), _csv(run / "metrics.csv")
    assert [int(r["iter"]) for r in rows] == [2, 4]
    assert {"loss_fake", "loss_dm", "step_time_s", "lr_generator"} <= set(got)
    _same(got, _expected(rows))
    health = _expected(_csv(run / "health.csv"), skip=("iter", "checkpoint", "alerts"))
    assert health["teacher_distance"] and [s for s, _ in health["teacher_distance"]] == [2, 4]  # each checkpoint's
    _same(got, {f"health/{k}": v for k, v in health.items()}, rel=1e-5)  # health.csv has 6 significant digits
    assert set(got) == set(_expected(rows)) | {f"health/{k}" for k in health}  # nothing else
    hparams = list(board.glob("*/hparams.yml"))
    assert len(hparams) == 1 and "observation.report_to: tensorboard" in hparams[0].read_text()

    # continue from iter_2 to 6: the first engine's iteration 4 is replaced, not drawn twice
    assert dmad_in_process("train", "--config", str(cfg), "--run-dir", str(run), "--resume",
                           str(run / "checkpoints" / "iter_2"), "--set", "optimization.max_train_steps=6") == 0
    got, rows = _scalars(board), _csv(run / "metrics.csv")
    assert [int(r["iter"]) for r in rows] == [2, 4, 6]
    _same(got, _expected(rows))
    assert len(list(board.glob("*/hparams.yml"))) == 2  # each start's config


def test_wandb_writes_an_offline_run_in_the_run_folder(write_config, tmp_path, monkeypatch):
    """With no wandb set up here (a home without a key, no WANDB_* variables) nothing is sent: the run
    is written offline under <run>/logs/wandb, and stdout stays the event stream."""
    pytest.importorskip("wandb")
    for var in [v for v in os.environ if v.startswith("WANDB_") or v == "NETRC"]:
        monkeypatch.delenv(var)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    out = io.StringIO()
    monkeypatch.setattr("sys.stdout", out)
    cfg = write_config({"observation": {"report_to": "wandb"}})
    run = tmp_path / "run"
    assert dmad_in_process("train", "--config", str(cfg), "--run-dir", str(run)) == 0
    offline = list((run / "logs" / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(offline) == 1 and offline[0].stat().st_size > 0
    assert not list((run / "logs" / "wandb").glob("run-*"))  # no online run
    assert all(json.loads(line)["kind"] for line in out.getvalue().splitlines())
