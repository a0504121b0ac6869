"""A distillation method is one unit (dmad.methods.UNITS) with one torch-free description
(dmad.contract.methods.METHODS), and control commands are applied by one function
(dmad.train.control.handle_control) before training and between iterations."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

pytest.importorskip("torch")


def test_every_method_has_one_unit_and_one_description():
    from dmad.contract.config import TrainConfig
    from dmad.contract.methods import METHODS, METRIC_COLUMNS
    from dmad.methods import UNITS

    assert list(UNITS) == list(METHODS)
    groups = TrainConfig.model_fields
    for name, unit in UNITS.items():
        info = unit.info
        assert info is METHODS[name]
        assert unit.networks[0] == "student" and "generator" in info.optimizers  # what the loop relies on
        assert set(info.columns) <= set(METRIC_COLUMNS)
        assert {f"lr_{o}" for o in info.optimizers} <= set(METRIC_COLUMNS)
        assert all(c.key in METRIC_COLUMNS for plot in info.plots for c in plot.curves)
        for group, key in info.settings:  # its settings are real config fields
            assert key in groups[group].annotation.model_fields, (name, group, key)
        layout = unit.layout(SimpleNamespace(student="lora", fake_score="full"))
        assert layout.networks[0] == ("student", "lora") and layout.optimizers == info.optimizers


def test_a_method_is_named_only_in_its_unit_its_description_and_the_benchs_method_table():
    """Outside dmad/methods, the peer method's name appears in its torch-free description, the bench's
    method table and the export (diffusers' LCMScheduler drives every exported few-step UNet
    student), nowhere else: no engine or app code branches on it (issue 38's target: at most 4 files)."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    found = sorted(str(f.relative_to(root)) for d in ("dmad", "app") for f in (root / d).rglob("*.py")
                   if not f.is_relative_to(root / "dmad" / "methods")
                   and re.search("lcm", f.read_text(encoding="utf-8"), re.IGNORECASE))
    assert found == ["dmad/contract/methods.py", "dmad/demo/bench_runs.py", "dmad/sample/export.py"]


def test_the_metrics_columns_are_the_ones_runs_always_had():
    """metrics.csv keeps its columns and their order (old run folders, users' scripts)."""
    from dmad.contract.methods import METRIC_COLUMNS

    assert METRIC_COLUMNS == ["iter", "loss_dm", "loss_g_gan", "loss_g", "loss_fake", "loss_d_gan", "loss_c",
                              "dm_grad_norm", "d_real_acc", "d_fake_acc", "grad_norm_g", "grad_norm_c", "loss_lcm",
                              "step_time_s", "data_time_s", "mem_peak_alloc_gb", "mem_device_used_gb",
                              "lr_generator", "lr_critic",
                              "loss_reg"]  # added since: at the end (ADDED_COLUMNS)


def _handled(monkeypatch, polls: list, stop_flag_at: int = -1):
    """handle_control on a scripted series of polls; returns (result, what was announced, run)."""
    import dmad.train.control as control

    monkeypatch.setattr(control, "POLL_S", 0.0)
    announced, ran, calls = [], [], []

    def poll():
        calls.append(1)
        commands = polls[len(calls) - 1] if len(calls) <= len(polls) else []
        return [{"cmd": c} for c in commands], "stop" if len(calls) - 1 == stop_flag_at else None

    result = control.handle_control(poll, lambda state, event: announced.append((state, event)),
                                    lambda c: ran.append(c["cmd"]))
    return result, announced, ran, len(calls)


def test_no_command_goes_on_at_once(monkeypatch):
    assert _handled(monkeypatch, [[]]) == (None, [], [], 1)


def test_a_pause_waits_for_the_resume(monkeypatch):
    result, announced, _, polls = _handled(monkeypatch, [["pause"], [], [], ["resume"]])
    assert result is None and polls == 4
    assert announced == [("paused", "paused"), ("running", "resumed")]


def test_a_stop_ends_a_pause_and_stop_now_wins(monkeypatch):
    assert _handled(monkeypatch, [["pause"], ["stop"]])[0] == "stop"
    assert _handled(monkeypatch, [["stop", "stop_now", "stop"]])[0] == "stop_now"
    assert _handled(monkeypatch, [["pause"], []], stop_flag_at=1)[0] == "stop"  # SIGTERM while paused


def test_samples_and_checkpoints_are_the_callers(monkeypatch):
    result, _, ran, _ = _handled(monkeypatch, [["sample_now", "checkpoint_now", "nonsense"]])
    assert result is None and ran == ["sample_now", "checkpoint_now"]
