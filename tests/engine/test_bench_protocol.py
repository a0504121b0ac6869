"""The measures and statistics of `dmad bench distill`'s protocol, against closed forms: what an
under-specified caption means (the data's conditional), total-variation distance and coverage,
precision and recall, the seed-stratified bootstrap, the t interval over training seeds, the
network-pass counter, and the targets' readings."""
from __future__ import annotations

import json
import random
from collections import Counter

import numpy as np
import pytest

from dmad.demo import shapes
from dmad.demo.coverage import caption_report, coverage_summary, precision_recall, total_variation


def test_the_conditional_is_the_generators_own_frequencies():
    """conditional() in closed form against 60,000 draws of the generator, filtered by what the
    caption states: every probability within 0.02."""
    draws = [shapes.attributes_for(i, 11) for i in range(60_000)]
    for stated in ({"colour": "white"}, {"background": "white"}, {"shape": "circle", "size": "large"}, {}):
        kept = [a for a in draws if all(a[k] == v for k, v in stated.items())]
        for attribute, dist in shapes.conditional(stated).items():
            seen = Counter(a[attribute] for a in kept)
            assert set(seen) <= set(dist)
            for value, p in dist.items():
                assert seen[value] / len(kept) == pytest.approx(p, abs=0.02), (stated, attribute, value)
    assert shapes.conditional({"colour": "white"})["background"] == {"black": 0.5, "gray": 0.5}
    with pytest.raises(ValueError, match="no shapes image is white on a white background"):
        shapes.conditional({"colour": "white", "background": "white"})


def test_sample_given_draws_from_the_conditional_and_keeps_what_is_stated():
    rng = random.Random(0)
    stated = {"colour": "white", "position": "center"}
    draws = [shapes.sample_given(stated, rng) for _ in range(8000)]
    assert all(d["colour"] == "white" and d["position"] == "center" for d in draws)
    for attribute, dist in shapes.conditional(stated).items():
        assert total_variation([d[attribute] for d in draws], dist) < 0.03


def test_total_variation_and_coverage_by_hand():
    target = {"a": 0.5, "b": 0.25, "c": 0.25}
    assert total_variation(["a", "b", "a", "c"], target) == pytest.approx(0.0)
    assert total_variation(["a"] * 4, target) == pytest.approx(0.5)  # collapsed on the mode
    assert total_variation(["x"] * 4, target) == pytest.approx(1.0)  # a value the data never draws
    # a collapsed model on "a red shape": stated colour right, one shape, one size, one place
    preds = [{"shape": "circle", "colour": "red", "size": "small", "position": "center", "background": "black"}] * 64
    r = caption_report(preds, {"colour": "red"})
    assert r["stated_accuracy"] == 1.0 and r["tv"]["shape"] == pytest.approx(0.75)
    assert r["tv"]["position"] == pytest.approx(0.8) and r["covered"]["shape"] == 0.25
    assert set(r["missing"]["shape"]) == {"square", "triangle", "diamond"}
    s = coverage_summary(preds, ["a red shape"] * 64)
    assert s["captions"] == 1 and not s["all_covered"] and s["stated_accuracy"] == 1.0
    # the background's TV is 1 - P(black | red): red is allowed on every background, but a background
    # with fewer allowed colours draws red more often (shapes.colours_on)
    p_black = (1 / len(shapes.colours_on("black"))) / sum(1 / len(shapes.colours_on(b)) for b in shapes.BACKGROUNDS)
    assert r["tv"]["background"] == pytest.approx(1 - p_black)
    assert s["tv"] == pytest.approx(np.mean([0.75, 0.5, 0.8, 1 - p_black]))  # shape, size, position, background


def test_precision_and_recall_of_a_set_against_itself_and_a_far_one():
    rng = np.random.default_rng(0)
    real = rng.normal(size=(200, 8))
    assert precision_recall(real, real) == (1.0, 1.0)
    assert precision_recall(real + 100, real) == (0.0, 0.0)
    # a collapsed set: every sample inside the real manifold (precision 1), little of it covered
    p, r = precision_recall(np.repeat(real[:1], 50, axis=0) + rng.normal(scale=1e-3, size=(50, 8)), real)
    assert p == 1.0 and r < 0.1


def test_the_stratified_bootstrap_keeps_each_captions_share():
    from dmad.demo.metrics import _draws

    groups = [[0, 1, 2, 3], [4, 5], [6, 7, 8, 9, 10, 11]]
    for d in _draws(12, 50, 0, groups):
        assert len(d) == 12 and all(sum(1 for i in d if i in g) == len(g) for g in groups)
    with pytest.raises(ValueError, match="partition"):
        _draws(12, 1, 0, [[0, 1], [1, 2]])


def test_the_seed_interval_is_students_t_over_per_seed_differences():
    from dmad.demo.bench_report import seed_difference, t975
    from dmad.demo.bench_rows import Row

    a = [Row("student", 4, "dmad", seed=k, tv=v) for k, v in enumerate((0.10, 0.12, 0.11))]
    b = [Row("student", 4, "lcm", seed=k, tv=v) for k, v in enumerate((0.20, 0.25, 0.18))]
    d = seed_difference(a, b, "tv")
    per = np.array([-0.10, -0.13, -0.07])
    half = 4.303 * per.std(ddof=1) / np.sqrt(3)
    assert d["per_seed"] == pytest.approx(per) and d["ci"] == pytest.approx((per.mean() - half, per.mean() + half))
    assert seed_difference(a[:1], b[:1], "tv")["ci"] is None  # one seed: no interval
    assert t975(2) == 4.303 and t975(11) == 2.228 and t975(40) == 1.96


def test_the_targets_read_the_seed_intervals_and_the_floor():
    from dmad.demo.bench import BenchResult, BenchSettings
    from dmad.demo.bench_report import compare_seeds, summarize
    from dmad.demo.bench_rows import Row
    from dmad.demo.bench_targets import check_targets

    def student(method, k, seed, fd, tv, adh=0.96, covered=True, budget="final"):
        return Row("student", k, method, seed, budget, nfe=k, fd_real=fd, tv=tv, adherence=adh,
                   coverage=1.0 if covered else 0.75, all_covered=covered, stated_accuracy=0.97)

    rows = [Row("teacher", 50, nfe=100, fd_real=18.0, adherence=0.96, tv=0.10, stated_accuracy=0.97),
            Row("real", fd_real=1.0, adherence=1.0, tv=0.08, stated_accuracy=1.0)]
    for seed, (d4, l4) in enumerate(((0.12, 0.20), (0.13, 0.22), (0.11, 0.19))):
        rows += [student("dmad", 4, seed, 19.0, d4), student("lcm", 4, seed, 24.0, l4, budget="same wall clock"),
                 student("dmad", 1, seed, 25.0, 0.15), student("lcm", 1, seed, 30.0, 0.14, budget="same wall clock")]
    s = BenchSettings(methods=("dmad", "lcm"))
    r = BenchResult(settings={}, machine={}, rows=rows)
    r.summary, r.comparisons = summarize(rows), compare_seeds(rows, s)
    t = {x["target"]: x for x in check_targets(r, s)}
    assert t["teacher mean TV <= its sampling floor + 0.05"]["met"]  # 0.10 <= 0.08 + 0.05
    assert t["DMAD 4 steps: mean TV <= teacher's + 0.05"]["met"]
    assert t["DMAD 4 steps: every value with data probability >= 5% appears (every seed)"]["met"]
    assert t["DMAD 4 steps beats LCM 4 steps @ same wall clock on tv (same wall clock; interval over training seeds "
             "excludes 0)"]["met"]
    # 1 step: DMAD's TV is higher on every seed: the interval lies above 0, not met
    assert not t["DMAD 1 step beats LCM 1 step @ same wall clock on tv (same wall clock; interval over training seeds "
                 "excludes 0)"]["met"]
    rows[2] = student("dmad", 4, 0, 19.0, 0.12, covered=False)
    r.summary = summarize(rows)
    assert not {x["target"]: x for x in check_targets(r, s)}[
        "DMAD 4 steps: every value with data probability >= 5% appears (every seed)"]["met"]
    # a bench without the rows a target reads says so, naming them, rather than leaving the target out
    no_lcm = [x for x in rows if x.method != "lcm" and not (x.method == "dmad" and x.steps == 1)]
    r = BenchResult(settings={}, machine={}, rows=no_lcm)
    r.summary = summarize(no_lcm)
    t = {x["target"]: x for x in check_targets(r, BenchSettings(methods=("dmad",), student_steps=(4,)))}
    assert t["DMAD 1 step: mean TV <= teacher's + 0.10"]["met"] is None
    assert t["DMAD 1 step: mean TV <= teacher's + 0.10"]["measured"] == "not measured (no DMAD 1 step rows)"
    beats = t["DMAD 4 steps beats LCM 4 steps @ equal compute on fd_real (equal training compute; interval over "
              "training seeds excludes 0)"]
    assert beats["met"] is None and beats["needs"] == ["DMAD 4 steps", "LCM 4 steps @ equal compute"]
    assert t["DMAD 4 steps: mean TV <= teacher's + 0.05"]["met"] is True  # what is there is still read


def test_row_labels_are_derived_from_their_keys():
    """A row is found by (model, steps, method, seed, budget, noise set); its label (and the file it
    is kept in) follows from that key, as every bench's rows folder names them."""
    from dmad.demo.bench_rows import Row, RowKey, slug

    assert RowKey("teacher", 50).label == "teacher 50 steps + CFG"
    assert RowKey("teacher", 50, noise="B").label == "teacher 50 steps + CFG, other seeds"
    assert RowKey("teacher", 1).label == "teacher 1 step + CFG"
    assert RowKey("real").label == "real renders (floor)"
    assert RowKey("student", 4, "dmad", 1, "final").label == "DMAD 4 steps, seed 1"
    assert RowKey("student", 1, "lcm", 0, "equal compute").label == "LCM 1 step @ equal compute, seed 0"
    assert RowKey("student", 4, "gan_only", 2, "iter 400").label == "DMAD GAN alone 4 steps @ iter 400, seed 2"
    assert RowKey("student", 4, "lcm", 0, "same wall clock").group == "LCM 4 steps @ same wall clock"
    assert slug(RowKey("teacher", 50).label) == "teacher-50-steps-cfg"
    row = Row.at(RowKey("student", 2, "dm_only", 0, "final"), nfe=2, fd_real=3.0)
    assert row.key == RowKey("student", 2, "dm_only", 0, "final") and row.to_dict()["label"] == "DMAD DM alone 2 steps, seed 0"


def test_the_pass_counter_counts_images_and_backward_passes():
    torch = pytest.importorskip("torch")
    from dmad.train.passes import PassCounter

    big, small = torch.nn.Linear(10, 10), torch.nn.Linear(10, 1)
    counter = PassCounter({"teacher": big, "head": small}, reference=big)
    x = torch.randn(4, 10)
    big(x)  # outside counting(): not training
    with counter.counting():
        with torch.no_grad():
            big(torch.cat([x, x]))       # a CFG pass: 8 images, no backward
        small(big(x)).sum().backward()   # 4 images through both, with a graph
    assert counter.counts == {"teacher": {"forward": 12, "backward": 4}, "head": {"forward": 4, "backward": 4}}
    eq = counter.equivalents()
    assert eq["teacher"] == 12 + 2 * 4 and eq["head"] == 4 + 2 * 4
    assert eq["total"] == pytest.approx(20 + 12 * 11 / 110, abs=0.1)  # the head weighs 11 / 110 of the teacher
    resumed = PassCounter({"teacher": big, "head": small}, reference=big, start=counter.state())
    assert resumed.counts == counter.counts


@pytest.mark.parametrize("dm_weight,regression,guided_up_to", [(1.0, False, 999), (0.0, False, 999),
                                                                 (1.0, True, 999), (1.0, False, 0)])
def test_the_engine_counts_every_network_pass_of_training(write_config, tmp_path, dm_weight, regression,
                                                          guided_up_to):
    """Two DMAD iterations on the tiny teacher (batch 1, a 1-step student, the student steps every
    iteration, the GAN head on the fake score's bottleneck), counted by the engine, against the
    iteration's own code (dmad.methods.dmd2.iteration): per iteration the student runs forward and backward
    once; distribution matching runs the guided teacher on 2 images (CFG) and the fake score once
    without a graph; the student's GAN term runs the fake score and the head with a graph; the
    critic runs the fake score twice with a graph (its denoising on the student's sample, and the
    real image for the GAN) and the head on both. dm_weight 0 drops exactly the teacher's and the
    no-graph fake-score passes. The regression loss adds the guided teacher's ODE from the student's
    input (4 steps over the range: 4 CFG passes from t = 999) and nothing else. A guidance interval
    that ends below every distribution-matching timestep (real_guidance_max_timestep 0) leaves the
    teacher one plain conditional pass an image instead of two."""
    import json

    from dmad.cli import main
    from dmad.contract.events import read_events

    config = write_config({"optimization": {"max_train_steps": 2},
                           "distillation": {"critic_updates_per_generator_update": 1, "dm_weight": dm_weight,
                                            "regression_weight": 1.0 if regression else 0.0,
                                            "regression_teacher_steps": 4,
                                            "real_guidance_max_timestep": guided_up_to}})
    run = tmp_path / "run"
    assert main(["train", "--config", str(config), "--run-dir", str(run)]) == 0
    state = json.loads((run / "checkpoints" / "iter_2" / "training_state.json").read_text())
    counts = {k: (v["forward"], v["backward"]) for k, v in state["network_passes"].items()}
    dm = dm_weight > 0
    ode = 2 * 2 * 4 if regression else 0  # per iteration: 1 image x 2 (CFG) x 4 steps
    dm_teacher = (4 if guided_up_to == 999 else 2) if dm else 0
    assert counts == {"teacher": (dm_teacher + ode, 0), "student": (2, 2), "fake_score": (8 if dm else 6, 6),
                      "gan_head": (6, 6)}
    assert state["network_passes"]["student"]["weight"] == 1.0  # a full student is the teacher's size
    finished = [e for e in read_events(run / "events.jsonl") if e.kind == "finished"][0]
    assert finished.data["network_passes"]["student"] == 2 + 2 * 2


def test_a_lora_student_on_the_shared_base_costs_the_whole_base_per_pass(write_config, tmp_path):
    """With resources.share_frozen_base the teacher, student and fake score are views on one
    module whose own parameters are only their adapters (none for the teacher): each pass still
    runs the whole base, so each weighs about one teacher pass (it counted 0 for the teacher and
    the adapters' share for the LoRA networks before)."""
    import json

    from dmad.cli import main

    config = write_config({"identity": {"student": "lora", "fake_score": "lora", "lora_rank": 4},
                           "optimization": {"max_train_steps": 1}})
    run = tmp_path / "run"
    assert main(["train", "--config", str(config), "--run-dir", str(run)]) == 0
    assert "one frozen base" in (run / "logs" / "engine.log").read_text()
    passes = json.loads((run / "checkpoints" / "iter_1" / "training_state.json").read_text())["network_passes"]
    assert passes["teacher"]["weight"] == 1.0
    for name in ("student", "fake_score"):
        assert 1.0 < passes[name]["weight"] < 1.2, (name, passes[name])  # the base, and its own adapter


def test_lcms_two_budgets_checkpoint_at_the_wall_clock_and_stop_after_equal_compute():
    from dmad.demo.bench_runs import two_budgets

    later = two_budgets(10.0, 100)  # equal compute comes after DMAD's wall clock
    assert later(5.0, 50) == [] and later(10.0, 60) == ["checkpoint_now"] and later.wall_iteration() == 60
    assert later(12.0, 90) == [] and later(14.0, 100) == ["stop"] and later(15.0, 101) == []
    assert later.wall_iteration() == 60  # still the wall clock's iteration once the stop is sent
    earlier = two_budgets(10.0, 50)  # equal compute was passed before the wall clock ran out
    assert earlier(9.0, 45) == [] and earlier(10.5, 60) == ["stop"] and earlier(11.0, 61) == []
    assert earlier.wall_iteration() == 60


def test_lcm_is_read_at_the_checkpoint_where_dmads_wall_clock_ran_out(tmp_path):
    """The same-wall-clock rows read the first checkpoint at or after the iteration the run had
    reached when the wall clock ran out (the first command sent), not the equal-compute one; a
    run's facts from before 2026-12-06 held the equal-compute iteration in wall_clock_iter."""
    from dmad.demo.bench_runs import peer_readings

    ckpts = tmp_path / "checkpoints"
    for it in (1912, 2895, 3825):
        (ckpts / f"iter_{it}").mkdir(parents=True)
        (ckpts / f"iter_{it}" / "training_state.json").write_text(json.dumps({"iter": it}))
    (ckpts / "latest.json").write_text(json.dumps({"iter": 3825, "path": "iter_3825"}))
    run = {"run_dir": str(tmp_path), "wall_clock_iter": 3825,
           "control": [{"cmd": "checkpoint_now", "at_s": 677.0, "iter": 2888}, {"cmd": "stop", "at_s": 917.9, "iter": 3825}]}
    budgets, others = peer_readings(run, 3825)
    assert [(b, it) for b, it, _ in budgets] == [("same wall clock", 2895), ("equal compute", 3825)]
    assert budgets[0][2] == ckpts / "iter_2895" and list(others) == [1912]
    ended = {"run_dir": str(tmp_path), "control": [], "wall_clock_iter": None}  # its step cap came first
    assert [(b, it) for b, it, _ in peer_readings(ended, 3825)[0]] == [("same wall clock", 3825), ("equal compute", 3825)]


def test_a_rows_folder_from_another_protocol_is_refused_not_mixed(tmp_path):
    from dmad.demo.bench_rows import Row, RowKey, RowStore
    from dmad.errors import UserInputError

    made = []
    key = RowKey("teacher", 50, noise="B")

    def make():
        made.append(1)
        return Row.at(key, fd_real=1.5, adherence=0.9), {"full_features": np.zeros((2, 3))}

    store = RowStore(tmp_path / "rows", {"set": "tuning", "references": "abc"})
    assert store.get(key, make)[0].fd_real == 1.5
    assert (tmp_path / "rows" / "teacher-50-steps-cfg-other-seeds.json").is_file()
    again = RowStore(tmp_path / "rows", {"set": "tuning", "references": "abc"})
    back = again.get(key, make)[0]
    assert back.fd_real == 1.5 and back.key == key and len(made) == 1  # read back, not made again
    with pytest.raises(UserInputError, match=r"rows.*another protocol \(references, set differ\)"):
        RowStore(tmp_path / "rows", {"set": "heldout", "references": "abd"})
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "teacher.json").write_text("{}")
    with pytest.raises(UserInputError, match="do not say which protocol"):
        RowStore(tmp_path / "old", {"set": "tuning"})
