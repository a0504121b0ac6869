"""Health signals (issue 39): each signal on synthetic images, the alert rule, and a tiny run with a
prompt set of health_seeds 2 that writes health events and health.csv (cut back on resume),
completes a teacher reference whose health seeds a stop cut short, and stops on an alert."""
from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageFilter

from dmad.contract.runlog import HEALTH_COLUMNS, read_health
from dmad.sample import health

RNG = np.random.default_rng(0)


def _scene(rng: np.random.Generator, side: int = 64) -> np.ndarray:
    """A random picture: a coloured background and a few coloured rectangles, float (H, W, 3) in [0, 1]."""
    img = np.ones((side, side, 3), np.float32) * rng.uniform(0.1, 0.6, 3).astype(np.float32)
    for _ in range(4):
        x0, y0 = rng.integers(0, side - 8, 2)
        w, h = rng.integers(6, side // 2, 2)
        img[y0:y0 + h, x0:x0 + w] = rng.uniform(0.0, 1.0, 3)
    return img


def _varied(prompts: int = 3, seeds: int = 4, seed: int = 0) -> dict[str, list[np.ndarray]]:
    rng = np.random.default_rng(seed)
    return {f"p{i}": [_scene(rng) for _ in range(seeds)] for i in range(prompts)}


def _map(images: dict[str, list[np.ndarray]], fn) -> dict[str, list[np.ndarray]]:
    return {pid: [fn(im) for im in ims] for pid, ims in images.items()}


def _blur(img: np.ndarray, radius: float = 2.0) -> np.ndarray:
    pil = Image.fromarray((img * 255).round().astype(np.uint8)).filter(ImageFilter.GaussianBlur(radius))
    return np.asarray(pil, dtype=np.float32) / 255.0


def _saturate(img: np.ndarray, k: float = 1.8) -> np.ndarray:
    grey = health.luma(img)[..., None]
    return np.clip(grey + k * (img - grey), 0.0, 1.0)


@pytest.mark.parametrize("feature", sorted(health.FEATURES))
def test_a_collapsed_set_has_about_no_diversity_relative_to_varied_seeds(feature):
    teacher = _varied()
    collapsed = {pid: [ims[0]] * len(ims) for pid, ims in teacher.items()}
    tiny = {pid: [np.clip(ims[0] + RNG.normal(0, 0.004, ims[0].shape).astype(np.float32), 0, 1) for _ in ims]
            for pid, ims in teacher.items()}
    t_levels = health.set_levels(teacher, feature)
    assert health.relative_signals(health.set_levels(collapsed, feature), t_levels)["diversity"] == pytest.approx(0.0)
    assert health.relative_signals(health.set_levels(tiny, feature), t_levels)["diversity"] < 0.05
    other = health.relative_signals(health.set_levels(_varied(seed=1), feature), t_levels)["diversity"]
    assert 0.6 < other < 1.6  # other seeds of the same kind of pictures: about the teacher's own level


def test_identical_images_are_the_teachers_level_and_at_distance_zero():
    teacher = _varied()
    signals = health.health_signals(teacher, teacher)
    assert list(signals) == list(health.SIGNALS)
    assert signals["teacher_distance"] == 0.0
    for name in health.SIGNALS[:-1]:
        assert signals[name] == pytest.approx(1.0), name


def test_saturating_the_colours_raises_saturation_and_colourfulness():
    teacher = _varied()
    signals = health.health_signals(_map(teacher, _saturate), teacher)
    assert signals["saturation"] > 1.15 and signals["colourfulness"] > 1.3
    assert 0.0 < signals["teacher_distance"] < 0.35


def test_a_gaussian_blur_lowers_detail():
    teacher = _varied()
    signals = health.health_signals(_map(teacher, _blur), teacher)
    assert signals["detail"] < 0.5
    assert signals["brightness"] == pytest.approx(1.0, abs=0.02)


def test_darker_and_flatter_images_lower_brightness_and_contrast():
    teacher = _varied()
    signals = health.health_signals(_map(teacher, lambda im: 0.1 + 0.3 * im), teacher)
    assert signals["contrast"] < 0.4 and signals["brightness"] < 0.7


def test_a_teacher_level_of_about_zero_leaves_that_ratio_out():
    grey = {"p0": [np.full((16, 16, 3), v, np.float32) for v in (0.2, 0.4)]}  # no saturation, no detail
    signals = health.health_signals(grey, grey)
    assert "saturation" not in signals and "detail" not in signals and "colourfulness" not in signals
    assert signals["brightness"] == pytest.approx(1.0)


def test_one_seed_gives_no_diversity():
    teacher = {pid: ims[:1] for pid, ims in _varied().items()}
    signals = health.health_signals(teacher, teacher)
    assert "diversity" not in signals and signals["teacher_distance"] == 0.0


# ----------------------------------------------------------------------------- alerts

def test_a_falling_diversity_fires_with_the_start_of_its_fall():
    history = {"diversity": [(1000, 0.95), (2000, 0.9), (3000, 0.7)]}
    alerts = health.alerts_for({"diversity": 0.41, "saturation": 1.0}, 4000, history, "iter_2000")
    assert [(a.signal, a.direction, a.threshold, a.since_iter) for a in alerts] == [("diversity", "low", health.THRESHOLDS["diversity"][0], 1000)]
    a = alerts[0]
    assert a.message == "diversity 41% of the teacher's at iteration 4,000, falling since 1,000"
    assert "GAN weight" in a.advice and "iter_2000" in a.advice
    assert a.warning() == f"health: {a.message} — {a.advice}"
    assert set(a.to_event()) == {"signal", "value", "threshold", "direction", "since_iter", "message", "advice"}


def test_a_healthy_series_fires_nothing():
    history = {s: [(i * 100, 1.0 + 0.02 * (-1) ** i) for i in range(1, 6)] for s in health.SIGNALS}
    history["teacher_distance"] = [(i * 100, 0.1) for i in range(1, 6)]
    signals = {s: 1.01 for s in health.SIGNALS} | {"teacher_distance": 0.12}
    assert health.alerts_for(signals, 600, history) == []


def test_a_value_beyond_its_threshold_fires_without_a_trend_and_says_so():
    alerts = health.alerts_for({"saturation": 1.5, "detail": 0.4, "teacher_distance": 0.5}, 300,
                               {"saturation": [(100, 1.6), (200, 1.55)]})
    got = {a.signal: a for a in alerts}
    assert set(got) == {"saturation", "detail", "teacher_distance"}
    assert got["saturation"].since_iter is None and "since" not in got["saturation"].message
    assert "CFG" in got["saturation"].advice and "an earlier checkpoint" in got["saturation"].advice
    assert "critic" in got["detail"].advice
    assert got["teacher_distance"].message.startswith("distance to the teacher 0.50 at iteration 300")


def test_a_steady_fall_close_to_the_threshold_fires_early():
    close = health.THRESHOLDS["diversity"][0] * (1 + health.TREND_MARGIN / 2)
    steady = [(100, 0.95), (200, 0.85), (300, 0.75)]
    assert [a.signal for a in health.alerts_for({"diversity": close}, 400, {"diversity": steady})] == ["diversity"]
    assert health.alerts_for({"diversity": close}, 400, {"diversity": steady[1:]}) == []  # too short a fall


def test_health_rows_round_trip_through_health_csv(tmp_path):
    from dmad.contract.runlog import CsvAppender, health_row

    path = tmp_path / "health.csv"
    with CsvAppender(path, HEALTH_COLUMNS) as f:
        f.append(health_row(10, "iter_10", {"diversity": 0.123456789, "detail": 1.5}, []))
        f.append(health_row(20, None, {"diversity": 0.5}, ["diversity", "detail"]))
    lines = path.read_text().splitlines()
    assert lines[0] == ",".join(HEALTH_COLUMNS)
    assert lines[1] == "10,iter_10,0.123457,,,,,1.5,,"
    rows = read_health(path)
    assert rows[1]["alerts"] == ["diversity", "detail"] and rows[1]["checkpoint"] is None
    assert health.history_of(rows)["diversity"] == [(10, 0.123457), (20, 0.5)]


def test_rotation_never_removes_the_protected_checkpoint(tmp_path):
    from dmad.contract.runs import RunFolder

    folder = RunFolder.create(tmp_path / "run")
    for it in (1, 2, 3, 4):
        tmp = folder.begin_checkpoint(it)
        (tmp / "x").write_text("x")
        folder.commit_checkpoint(it, tmp, limit=2, protect=1)
    assert [i for i, _ in folder.list_checkpoints()] == [1, 4]


def test_a_refused_start_puts_health_csv_back_as_it_was(tmp_path):
    from dmad.contract.runlog import CsvAppender, health_row
    from dmad.train.folder_undo import FolderSnapshot

    run = tmp_path / "run"
    run.mkdir()
    with CsvAppender(run / "health.csv", HEALTH_COLUMNS) as f:
        f.append(health_row(2, "iter_2", {"diversity": 0.9}, []))
    before = (run / "health.csv").read_bytes()
    snap = FolderSnapshot.take(run)
    with CsvAppender(run / "health.csv", HEALTH_COLUMNS) as f:
        f.append(health_row(3, None, {"diversity": 0.5}, ["diversity"]))
    assert snap.restore() == []
    assert (run / "health.csv").read_bytes() == before


# ----------------------------------------------------------------------------- in a run

def _config(tmp: Path, teacher: Path, data: Path, prompts: Path, name: str, **observation) -> Path:
    from tests.conftest import tiny_config_dict

    cfg = tiny_config_dict(teacher, data, prompts, tmp / "runs")
    cfg["identity"]["run_name"] = name
    cfg["optimization"]["max_train_steps"] = 4
    cfg["observation"].update({"validation_steps": 1, **observation})
    path = tmp / f"{name}.json"
    path.write_text(json.dumps(cfg), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def health_run(tmp_path_factory, tiny_teacher, tiny_data, health_prompt_set) -> tuple[Path, Path]:
    """A finished 4-iteration run validating every iteration, checkpoints at 2 and 4."""
    pytest.importorskip("torch")
    from tests.conftest import dmad_in_process

    tmp = tmp_path_factory.mktemp("health_run")
    config = _config(tmp, tiny_teacher, tiny_data, health_prompt_set, "health")
    assert dmad_in_process("train", "--config", str(config)) == 0
    return config, tmp / "runs" / "health"


def _health_events(run: Path):
    from dmad.contract.events import read_events

    return [e for e in read_events(run / "events.jsonl") if e.kind == "health"]


def test_a_run_writes_a_health_row_and_event_after_each_validations_samples(health_run):
    from dmad.contract.events import read_events

    _, run = health_run
    with open(run / "health.csv", newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        assert reader.fieldnames == HEALTH_COLUMNS
        rows = list(reader)
    assert [(r["iter"], r["checkpoint"]) for r in rows] == [("1", ""), ("2", "iter_2"), ("3", ""), ("4", "iter_4")]
    assert all(r[s] != "" for r in rows for s in health.SIGNALS)
    kinds = [(e.kind, e.iter) for e in read_events(run / "events.jsonl") if e.kind in ("samples", "health")]
    assert kinds[1:] == [(k, i) for i in (1, 2, 3, 4) for k in ("samples", "health")]  # teacher's first
    ev = _health_events(run)[1]
    assert ev.data["checkpoint"] == "iter_2" and ev.data["folder"] == str((run / "samples" / "iter_2").resolve())
    assert (ev.data["seeds"], ev.data["prompts"]) == (2, 2) and ev.data["alerts"] == []
    assert list(ev.data["signals"]) == list(health.SIGNALS) and "teacher_distance" not in ev.data["teacher"]
    for folder in ("teacher", "iter_2"):
        meta = json.loads((run / "samples" / folder / "meta.json").read_text())
        item = meta["items"]["red"]
        assert item["file"] == "red.png" and item["health_files"] == ["red~s1.png"]
        assert item["health_seeds"] == [item["seed"], (item["seed"] + 1_000_003) % 2**32]
        assert (run / "samples" / folder / "red~s1.png").is_file()
    with Image.open(run / "samples" / "teacher" / "red.png") as teacher:
        assert teacher.size == (32, 32)


def test_resume_cuts_health_csv_back_to_the_checkpoint(health_run, tmp_path):
    from tests.conftest import dmad_in_process

    config, run = health_run
    copy = tmp_path / "copy"
    shutil.copytree(run, copy)
    teacher_before = {p.name: p.read_bytes() for p in (copy / "samples" / "teacher").iterdir()}
    assert dmad_in_process("train", "--config", str(config), "--run-dir", str(copy), "--resume",
                           str(copy / "checkpoints" / "iter_2"), "--set", "optimization.max_train_steps=3") == 0
    assert [r["iter"] for r in read_health(copy / "health.csv")] == [1, 2, 3]
    assert [e.iter for e in _health_events(copy)] == [1, 2, 3]
    assert {p.name: p.read_bytes() for p in (copy / "samples" / "teacher").iterdir()} == teacher_before


def test_a_teacher_reference_without_its_health_seeds_is_completed_not_rendered_again(health_run, health_prompt_set,
                                                                                     tiny_teacher, tmp_path):
    import logging

    from dmad.contract.prompts import load_prompt_set
    from dmad.models.teacher import load_teacher
    from dmad.sample.render import ensure_teacher_samples

    _, run = health_run
    out = tmp_path / "teacher"
    shutil.copytree(run / "samples" / "teacher", out)
    meta = json.loads((out / "meta.json").read_text())
    del meta["items"]["blue"]["health_files"]  # as a stop after red's health seed, before blue's, leaves it
    for item in meta["items"].values():
        del item["health_seeds"]
    (out / "meta.json").write_text(json.dumps(meta))
    (out / "blue~s1.png").unlink()
    grid = {n: (out / n).read_bytes() for n in ("red.png", "blue.png")}

    class Events(list):
        def emit(self, kind, it=None, **data):
            self.append((kind, data))

    events = Events()
    ensure_teacher_samples(out, teacher=load_teacher(str(tiny_teacher)), prompt_set=load_prompt_set(health_prompt_set),
                           device="cpu", events=events, log=logging.getLogger("test"), iteration=0)
    phases = [d for k, d in events if k == "phase"]
    assert [(d["done"], d["total"]) for d in phases] == [(0, 1), (1, 1)]  # only blue~s1 rendered
    assert [k for k, _ in events][-1] == "samples"
    assert {n: (out / n).read_bytes() for n in grid} == grid
    assert (out / "blue~s1.png").read_bytes() == (run / "samples" / "teacher" / "blue~s1.png").read_bytes()
    assert json.loads((out / "meta.json").read_text())["items"]["blue"]["health_files"] == ["blue~s1.png"]


def test_stop_on_alert_stops_without_a_new_checkpoint_and_names_the_signal(tmp_path, tiny_teacher, tiny_data,
                                                                           health_prompt_set, monkeypatch):
    pytest.importorskip("torch")
    from dmad.contract.events import read_events
    from tests.conftest import dmad_in_process

    # the student drifts a little from the teacher by iteration 3: a bound no run can meet there
    monkeypatch.setattr(health, "THRESHOLDS", {**health.THRESHOLDS, "teacher_distance": (None, -1.0)})
    config = _config(tmp_path, tiny_teacher, tiny_data, health_prompt_set, "stops", validation_steps=3,
                     health={"stop_on_alert": True})
    monkeypatch.setattr(health, "alerts_for", _alerts_after(2, health.alerts_for))
    assert dmad_in_process("train", "--config", str(config)) == 0
    run = tmp_path / "runs" / "stops"
    events = list(read_events(run / "events.jsonl"))
    stopped = [e for e in events if e.kind == "stopped"]
    assert len(stopped) == 1 and stopped[0].iter == 3
    assert stopped[0].data["reason"] == "health alert: teacher_distance"
    assert stopped[0].data["healthy_checkpoint"] == 2 and stopped[0].data["checkpoint_saved"] is False
    assert sorted(p.name for p in (run / "checkpoints").glob("iter_*")) == ["iter_2"]
    warnings = [e.data["message"] for e in events if e.kind == "warning"]
    assert any(m.startswith("health: distance to the teacher") for m in warnings)
    assert read_health(run / "health.csv")[-1]["alerts"] == ["teacher_distance"]


def _alerts_after(it: int, alerts_for):
    """alerts_for that raises nothing up to iteration `it` (a healthy start)."""
    def wrapped(signals, at, *args, **kwargs):
        return alerts_for(signals, at, *args, **kwargs) if at > it else []
    return wrapped


def test_a_prompts_health_seeds_render_as_one_batch_that_matches_single_renders(tiny_teacher):
    """The health seeds of a prompt are one batch (their cost); each batched image is its seed's
    single render up to the last bits, and a batch of one is student_png's bytes exactly."""
    import io

    import torch
    from PIL import Image

    from dmad.models.teacher import load_teacher
    from dmad.sample.render import student_png, student_pngs

    teacher = load_teacher(str(tiny_teacher))
    fam = teacher.family
    emb = fam.encode(teacher.modules, ["a red square"], "cpu")
    kw = dict(student=teacher.denoiser, vae=teacher.vae, emb=emb, schedule=fam.schedule(teacher.scheduler, 32),
              timesteps=[999, 499], device="cpu", dtype=torch.float32, size=(32, 32), family=fam)
    seeds = [11, 12, 13]
    batch = student_pngs(seeds=seeds, **kw)
    singles = [student_png(seed=s, **kw) for s in seeds]
    assert student_pngs(seeds=[12], **kw)[0] == singles[1]

    def pixels(png):
        return np.asarray(Image.open(io.BytesIO(png)), dtype=np.int16)

    for b, s in zip(batch, singles):
        assert np.abs(pixels(b) - pixels(s)).max() <= 1
    assert np.abs(pixels(batch[0]) - pixels(batch[1])).max() > 10  # each image its own seed's noise
