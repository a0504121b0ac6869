"""`dmad probe`: one process per point (distinct pids), a baseline without
backward, the trade-off table, out-of-memory phases per point, and the recommendation order."""
from __future__ import annotations

import csv
import json
import os

import pytest

from dmad.contract.config import TrainConfig
from dmad.train.probe import COLUMNS, fits, markdown, parse_ints, recommend
from dmad.errors import UserInputError
from tests.conftest import dmad_captured


def _cfg(**resources) -> TrainConfig:
    return TrainConfig.model_validate({"identity": {"pretrained_model_name_or_path": "t", "train_data_dir": "d"},
                                       "resources": resources})


def _point(kind="train", batch=1, res=512, status="ok", peak=None, total=None, phase="none") -> dict:
    return {"kind": kind, "batch": batch, "resolution": res, "status": status, "oom_phase": phase,
            "framework_peak_gb": peak, "device_peak_gb": peak, "device_total_gb": total}


def test_recommendation_follows_the_triage_order():
    cfg = _cfg(train_batch_size=4, gradient_accumulation_steps=2, resolution=768)
    # nothing fits, checkpointing off: turn it on first, then batch 1
    rec = recommend([_point(batch=2, status="oom", phase="first-backward"),
                     _point(batch=4, status="oom", phase="first-forward")], cfg)
    assert not rec["fits"] and rec["steps"][0].startswith("Turn on gradient checkpointing")
    assert rec["config_changes"] == {"resources.gradient_checkpointing": True, "resources.train_batch_size": 1}
    # some fit: the largest resolution that fits with the margin, its largest batch, accumulation to 8
    points = [_point(batch=1, res=512, peak=10, total=24), _point(batch=2, res=512, peak=17, total=24),
              _point(batch=1, res=768, peak=20, total=24), _point(batch=2, res=768, peak=22.5, total=24),
              _point(batch=4, res=768, status="oom", phase="first-backward")]
    assert not fits(points[3])  # ran, but 22.5 of 24 GiB leaves less than 10% free
    rec = recommend(points, cfg)
    assert rec["fits"] and rec["config_changes"] == {
        "resources.gradient_checkpointing": True, "resources.train_batch_size": 1, "resources.resolution": 768,
        "resources.gradient_accumulation_steps": 8}
    done = recommend(points[:3], _cfg(gradient_checkpointing=True, train_batch_size=2))
    assert done["config_changes"] == {"resources.train_batch_size": 1, "resources.resolution": 768,
                                      "resources.gradient_accumulation_steps": 2}
    assert "gradient checkpointing" not in " ".join(done["steps"]).lower()


def test_lists_are_checked():
    assert parse_ints("4,1,2,2", "batch") == [1, 2, 4] and parse_ints(None, "batch") is None
    for bad, what in (("a,b", "batch"), ("0", "batch"), ("500", "resolution"), ("", "batch"),
                      ("99999999999999999999", "batch"), ("4097", "batch"), ("8200", "resolution")):
        with pytest.raises(UserInputError, match=f"--{what}"):
            parse_ints(bad, what, 8 if what == "resolution" else 1)
    assert parse_ints("4096", "batch") == [4096] and parse_ints("8192", "resolution", 8) == [8192]  # the config's own limits


torch = pytest.importorskip("torch")


def _probe(capsys, config, out, *extra, batch: str = "1,2") -> tuple[int, str, str]:
    """`dmad probe` in this process: each point still runs in a process of its own (what is tested);
    the probe's own process would only add a CLI start (~7 s of imports)."""
    return dmad_captured(capsys, "probe", "--config", str(config), "--batch", batch, "--resolution", "32",
                         "--steps", "2", "--warmup", "1", "--out", str(out), "--progress", *extra)


@pytest.mark.slow
def test_probe_runs_each_point_in_its_own_process(write_config, capsys, tmp_path):
    out = tmp_path / "probe"
    code, stdout, stderr = _probe(capsys, write_config(), out)
    assert code == 0, stderr[-2000:]
    report = json.loads((out / "probe.json").read_text())
    points = report["points"]
    assert [(p["kind"], p["batch"], p["resolution"]) for p in points] == [
        ("baseline", 1, 32), ("train", 1, 32), ("train", 2, 32)]
    pids = [p["pid"] for p in points]
    assert len(set(pids)) == 3 and os.getpid() not in pids
    for p in points:
        assert p["status"] == "ok" and p["oom_phase"] == "none" and p["error"] is None
        assert p["framework_peak_gb"] is None and p["device_peak_gb"] is None  # CPU: those scopes do not apply
        assert p["process_peak_rss_gb"] > 0.1 and p["step_time_s"] > 0 and p["ledger_gb"] > 0
        assert abs(p["step_time_s"] - p["data_time_s"] - p["compute_time_s"]) < 1e-9
        assert p["effective_batch"] == p["batch"] and p["precision"] == "no"
    # the baseline never ran a backward: no optimizer state, no gradients
    assert json.loads((out / "points" / "p00_baseline_b1_r32" / "run" / "status.json").read_text())["state"] == "finished"
    assert not list((out / "points" / "p01_train_b1_r32" / "run").glob("checkpoints/iter_*"))  # probe: no checkpoints
    with open(out / "probe.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == COLUMNS and [int(x["pid"]) for x in rows] == pids
    md = (out / "probe.md").read_text()
    assert md == markdown(report) and "| 2 | train | 2 |" in md and "## Recommendation" in md
    assert report["recommendation"]["config_changes"]["resources.train_batch_size"] == 2
    assert "progress 3 3" in stderr and stdout.startswith("# dmad probe:")


@pytest.mark.slow
def test_probe_records_where_each_point_ran_out(write_config, capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("DMAD_FAULT", "oom:first-backward")  # the points inherit it
    out = tmp_path / "probe"
    code, _, stderr = _probe(capsys, write_config(), out, batch="1")  # one train point: each is a process (~6 s)
    assert code == 0, stderr[-2000:]
    report = json.loads((out / "probe.json").read_text())
    assert [(p["status"], p["oom_phase"]) for p in report["points"]] == [
        ("ok", "none"), ("oom", "first-backward")]  # the baseline has no backward
    assert report["points"][1]["error"].startswith("out of memory during first-backward")
    rec = report["recommendation"]
    assert not rec["fits"] and rec["config_changes"] == {"resources.gradient_checkpointing": True}
    assert "oom: first-backward" in (out / "probe.md").read_text()


def test_probe_refuses_bad_input_in_one_line(write_config, dmad_cli, tmp_path):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("keep me")
    for args, words in ((["--batch", "one"], "--batch 'one'"), (["--resolution", "30"], "multiples of 8"),
                        (["--out", str(tmp_path / "full")], "not empty")):
        r = dmad_cli("probe", "--config", str(write_config()), *args)
        assert r.returncode == 2 and words in r.stderr and r.stderr.count("\n") == 1, r.stderr
    assert (tmp_path / "full" / "x").read_text() == "keep me"
