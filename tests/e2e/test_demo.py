"""The built-in default: the shipped teacher, `dmad demo` and `dmad bench distill`, run for real on
the shipped weights (nothing downloaded)."""
from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from dmad.contract.paths import resource  # noqa: E402

TEACHER = resource("demo", "teacher")


def test_the_shipped_teacher_is_small_safetensors_with_its_training_record():
    files = list(TEACHER.rglob("*"))
    assert not [f for f in files if f.suffix in (".bin", ".pt", ".ckpt", ".pkl")]  # never pickle
    weights = [f for f in files if f.suffix == ".safetensors"]
    assert {f.parent.name for f in weights} == {"transformer", "vae", "text_encoder", "text_encoder_2", "text_encoder_3"}
    assert sum(f.stat().st_size for f in files if f.is_file()) <= 25 * 2**20
    record = json.loads((TEACHER / "training_config.json").read_text())
    measured = record["final_adherence"]  # by make-teacher at the end: the plain pipeline, 50 steps + CFG
    assert set(measured) == {"all", "shape", "colour", "size", "position", "background"}
    log = [json.loads(line) for line in (TEACHER / "training_log.jsonl").read_text().splitlines()]
    checks = [r for r in log if "swap_rise" in r]  # the learning curve: adherence and word-swap rise per check
    assert len(checks) >= 6 and all(set(r["swap_rise"]) == set(measured) - {"all"} for r in checks)


@pytest.mark.slow
def test_plain_diffusers_loads_the_shipped_teacher_with_no_arguments_and_it_follows_prompts():
    from diffusers import StableDiffusion3Pipeline

    from dmad.demo.evaluator import load_evaluator
    from dmad.demo.metrics import evaluate_images
    from dmad.demo.shapes import attributes_for, caption

    pipe = StableDiffusion3Pipeline.from_pretrained(str(TEACHER))  # no dtype, no extra argument
    pipe.set_progress_bar_config(disable=True)
    captions = [caption(attributes_for(i, 77)) for i in range(16)]
    images = pipe(captions, num_inference_steps=20, guidance_scale=4.0, generator=torch.Generator().manual_seed(0),
                  output_type="pt").images
    assert images.shape == (16, 3, 64, 64) and torch.isfinite(images).all()
    result = evaluate_images(load_evaluator(), images * 2 - 1, captions)
    per = result["adherence"]["per_attribute"]
    # 16 images, 20 steps, the CFG its README gives (4; at SD3's default 7 small shapes grow and size
    # fell to 11 of 16): every attribute, position included (the 50-step rates on 256 captions are
    # in training_config.json: 92-100% per attribute)
    assert min(per.values()) >= 0.75, per


@pytest.mark.slow
def test_dmad_demo_distils_and_renders_teacher_and_student(capsys, tmp_path):
    from tests.conftest import dmad_captured

    run = tmp_path / "demo-run"
    # the demo's own command in this process (a CLI start is ~7 s); it starts the engine as a process of its own
    code, stdout, stderr = dmad_captured(capsys, "demo", "--run-dir", str(run), "--set", "optimization.max_train_steps=4",
                                         "--set", "observation.checkpointing_steps=4",
                                         "--set", "observation.validation_steps=4")
    assert code == 0, stderr[-2000:]
    assert "Done. Run folder:" in stdout and str(run) in stdout
    assert "teacher samples:" in stdout  # rendered by the engine, before iteration 1 (the demo only makes the grid)
    ps = json.loads((run / "prompt_set.json").read_text())
    ids = {item["id"] for item in ps["items"]}
    for folder in ("teacher", "iter_4"):
        meta = json.loads((run / "samples" / folder / "meta.json").read_text())
        assert set(meta["items"]) == ids
        assert {p.stem for p in (run / "samples" / folder).glob("*.png")} == ids
    teacher_meta = json.loads((run / "samples" / "teacher" / "meta.json").read_text())
    # a flow-matching teacher samples with its own Euler sampler whatever the prompt set names
    assert (teacher_meta["steps"], teacher_meta["cfg"], teacher_meta["sampler"]) == (ps["steps"], ps["cfg"], "flow_match_euler")
    grid = json.loads((run / "samples" / "grid.json").read_text())
    assert grid["columns"] == ["teacher", "iter_4"] and len(grid["rows"]) == len(ids)
    from PIL import Image

    with Image.open(run / "samples" / "grid.png") as im:
        assert im.size == (2 * 128, len(ids) * 128)


@pytest.fixture(scope="module")
def small_bench(tmp_path_factory, tiny_prompt_set):
    """`dmad bench distill`'s whole pipeline (every row, a 4-iteration distillation in its own
    process, the learning-curve row, the grid, the JSON and the table) at a tenth of --quick's
    size, in process. What the numbers say is the bench's job (bench/distill.py, docs/benchmarks.md).
    The distillation run's own samples (the engine's teacher reference, its validation renders)
    are not what the bench reads, so they use the two-prompt, 2-step set, not the demo's 10
    prompts at 50 steps + CFG."""
    import contextlib
    import io

    from dmad.demo import bench

    small = bench.BenchSettings(prompts=8, seeds_per_prompt=2, real_per_prompt=8, teacher_steps=6, batch_size=16,
                                train_overrides=("optimization.max_train_steps=4", "observation.checkpointing_steps=2",
                                                 "observation.validation_steps=4", "observation.log_every_steps=2",
                                                 f"observation.prompt_set={tiny_prompt_set}"),
                                # LCM ends by its step cap (2 iterations: DMAD's teacher passes) however busy
                                # the machine; the wall-clock stop is what the full and --quick benches show
                                # (docs/benchmarks.md)
                                lcm_step_cap=1, lcm_budget_s=600.0)
    tmp = tmp_path_factory.mktemp("bench")
    stdout = io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(stdout):
        mp.setattr(bench, "QUICK", small)
        code = bench.main_distill(quick=True, json_out=str(tmp / "bench.json"), out_dir=str(tmp / "b"), config=None,
                                  methods="dmad,lcm")
    assert code == 0
    return stdout.getvalue(), json.loads((tmp / "bench.json").read_text()), tmp / "b"


def test_bench_distill_runs_every_row_and_draws_its_grid(small_bench):
    table, doc, folder = small_bench
    rows = {row["label"]: row for row in doc["rows"]}
    assert "| student 1 step |" in table  # the table is printed
    teacher_at = {row["nfe"]: row for row in rows.values() if row["label"].startswith("teacher ") and "+ CFG" in row["label"]}
    for k in (1, 2, 4):
        student = rows[f"student {k} step{'s' if k > 1 else ''}"]
        assert student["nfe"] == k and teacher_at[2 * k]["nfe"] == 2 * k
        assert 0.0 <= student["adherence"] <= 1.0 and student["fd_real"] > 0
    ref = rows["teacher 6 steps + CFG"]
    assert ref["nfe"] == 12 and ref["fd_teacher"] == 0.0
    assert rows["teacher 6 steps + CFG, other seeds"]["fd_teacher"] > 0  # the noise floor
    assert rows["student 4 steps @ iter 2"]["nfe"] == 4  # the learning curve: the earlier checkpoint
    assert doc["distill"]["iterations"] == 4 and doc["distill"]["wall_time_s"] > 0
    assert {t["target"] for t in doc["targets"]}  # every target is checked and reported
    from PIL import Image

    # the picture of the bench: 8 prompts x (teacher 6 steps, teacher 4 steps, students at 1, 2, 4 steps,
    # LCM's students at 1 and 4 steps), 2x size
    with Image.open(folder / "grid.png") as im:
        assert im.size == (250 + 7 * (128 + 4), 18 + 8 * (128 + 4))
        tile = im.convert("RGB").crop((250, 18, 250 + 128, 18 + 128))  # the teacher's first sample
        assert len(tile.getcolors(128 * 128)) > 1  # an image, not the sheet's blank background


def test_bench_distill_puts_lcm_beside_dmad_on_the_same_budgets(small_bench):
    """--methods dmad,lcm: LCM distils the same teacher after DMAD, stopped by DMAD's wall clock (or
    its step cap), with the checkpoint where its teacher passes equal DMAD's evaluated at 1, 2 and 4
    steps, and its targets checked against DMAD's rows."""
    table, doc, folder = small_bench
    rows = {row["label"]: row for row in doc["rows"]}
    lcm = doc["distill_lcm"]
    # DMAD: 4 iterations, a student step every 2nd (critic ratio 2) on batch 8 = 16 teacher passes;
    # LCM: one teacher pass per image per iteration on batch 8, so equal at iteration 2
    assert lcm["dmad_teacher_passes"] == 16 and lcm["equal_teacher_passes_iter"] == 2
    assert lcm["student_timesteps"] == [999, 759, 499, 259]
    assert lcm["teacher_passes"] == 8 * lcm["iterations"] and lcm["iterations"] == 2
    assert lcm["stop_sent_at_s"] is None  # the step cap, not the budget, ended it
    for k, ts in ((1, [999]), (2, [999, 499]), (4, [999, 759, 499, 259])):
        label = f"LCM student {k} step{'s' if k > 1 else ''}"
        final, equal = rows[label], rows[label + " @ equal teacher passes"]
        assert final["nfe"] == k and final["notes"].startswith(f"timesteps {ts}") and final["fd_real"] > 0
        # the run ended at the equal-teacher-pass iteration: the same student, its rows not sampled twice
        assert equal["notes"] == f"timesteps {ts}; iteration 2: 16 teacher passes, as DMAD's"
        assert (equal["fd_real"], equal["adherence"]) == (final["fd_real"], final["adherence"])
    assert rows["LCM student 4 steps @ iter 1"]["notes"] == "timesteps [999, 759, 499, 259]; earlier checkpoint"
    targets = {t["target"] for t in doc["targets"]}
    assert {"DMAD 4-step, same wall clock, beats LCM's on FD_real and adherence (paired 95% intervals)",
            "DMAD 4-step, same teacher passes, beats LCM's on FD_real and adherence (paired 95% intervals)",
            "DMAD 1-step beats LCM's by a wide margin (FD_real <= 0.5x LCM's, adherence higher)",
            "LCM 4-step clearly beats the teacher's 4 steps + CFG (paired 95% intervals: FD_real lower, adherence higher)",
            "LCM 4-step beats the teacher's 4 steps + CFG with the rows' own FD_real intervals apart (stricter)"} <= targets
    # the paired comparisons: every pair the targets read, each on the rows' own numbers
    pairs = {(c["a"], c["b"]): c for c in doc["comparisons"]}
    assert set(pairs) == {(f"student {k} step{'s' if k > 1 else ''}", f"LCM student {k} step{'s' if k > 1 else ''}{eq}")
                          for k in (1, 4) for eq in ("", " @ equal teacher passes")} | {
        ("student 4 steps", "teacher 6 steps + CFG"), ("student 4 steps", "teacher 4 steps + CFG"),
        ("LCM student 4 steps", "teacher 4 steps + CFG")}
    for (a, b), c in pairs.items():
        assert (c["fd_a"], c["fd_b"]) == pytest.approx((rows[a]["fd_real"], rows[b]["fd_real"]))
        assert (c["adherence_a"], c["adherence_b"]) == pytest.approx((rows[a]["adherence"], rows[b]["adherence"]))
        assert c["diff"] == pytest.approx(c["fd_a"] - c["fd_b"]) and c["diff_ci"][0] <= c["diff"] <= c["diff_ci"][1]
    # the equal-pass rows are the final student's: compared from the same samples, the same numbers
    assert pairs[("student 1 step", "LCM student 1 step @ equal teacher passes")] == {
        **pairs[("student 1 step", "LCM student 1 step")], "b": "LCM student 1 step @ equal teacher passes"}
    assert "| LCM student 4 steps | teacher 4 steps + CFG |" in table  # the paired table is printed
    assert "| LCM student 4 steps @ equal teacher passes |" in table and "LCM (demo_lcm.json)" in table
    ckpts = sorted(p.name for p in (folder / "run_lcm" / "checkpoints").iterdir())
    assert {"iter_1", "iter_2"} <= set(ckpts)


def test_bench_methods_must_be_known_and_include_dmad():
    from dmad.demo.bench import parse_methods
    from dmad.errors import UserInputError

    assert parse_methods("lcm, dmad") == ("dmad", "lcm")
    with pytest.raises(UserInputError, match="unknown method 'lcd'"):
        parse_methods("dmad,lcd")
    with pytest.raises(UserInputError, match="must include dmad"):
        parse_methods("lcm")


def test_the_few_step_flow_baseline_uses_every_step():
    """SD3's default Euler spacing ends at sigma 0.001, so its "2 steps" are one step and a tiny one
    (measured: 2 steps differed from 1 by 9e-5 per pixel); the bench's baseline spaces sigmas
    1, ..., 1/k instead (0.06 per pixel apart here)."""
    from dmad.demo.bench import initial_noise, sample_teacher
    from dmad.models.teacher import load_teacher
    from dmad.sample.render import latent_shape

    teacher = load_teacher(str(TEACHER), "auto", None, dtype=torch.float32)
    items = [("a large red circle in the center on a black background", 0, 0),
             ("a small blue square at the top left on a white background", 1, 0)]
    captions = [c for c, _, _ in items]
    noise = initial_noise(items, 7, latent_shape(teacher.vae, 64, 64))
    one = sample_teacher(teacher, captions, noise, 1, 3.0, 2, trailing=True)
    two = sample_teacher(teacher, captions, noise, 2, 3.0, 2, trailing=True)
    default_two = sample_teacher(teacher, captions, noise, 2, 3.0, 2, trailing=False)
    assert (default_two - one).abs().mean() < 1e-3  # the pipeline's own spacing: the flaw this avoids
    assert (two - one).abs().mean() > 0.02


def test_the_lcm_targets_read_the_paired_intervals_and_keep_the_stricter_reading_beside_them():
    """"Clearly beats" and "beats": the point estimates and the paired intervals must all agree;
    the rows' own intervals apart is reported beside it as the stricter reading."""
    from dmad.demo.bench import BenchResult, BenchSettings, Row, check_targets

    def row(label, fd, adh, ci):
        return Row("student", label, 4, 4, fd, None, adh, {}, None, None, "", ci, None)

    def pair(a, b, diff_ci, adh_ci):
        return {"a": a, "b": b, "diff": sum(diff_ci) / 2, "diff_ci": diff_ci, "adherence_diff": sum(adh_ci) / 2,
                "adherence_diff_ci": adh_ci}

    def targets(lcm_vs_teacher, dmad_vs_lcm):
        r = BenchResult(settings={}, machine={}, rows=[
            row("teacher 4 steps + CFG", 39.1, 0.805, (29.3, 48.9)), row("LCM student 4 steps", 23.6, 0.906, (15.9, 31.3)),
            row("student 4 steps", 19.5, 0.963, (12.9, 26.1))],
            comparisons=[pair("LCM student 4 steps", "teacher 4 steps + CFG", *lcm_vs_teacher),
                         pair("student 4 steps", "LCM student 4 steps", *dmad_vs_lcm)])
        return {t["target"].split(" (")[0]: t for t in check_targets(r, BenchSettings())}

    t = targets(((-20.7, -10.3), (0.065, 0.138)), ((-7.0, -1.3), (0.032, 0.081)))
    assert t["LCM 4-step clearly beats the teacher's 4 steps + CFG"]["met"]
    assert not t["LCM 4-step beats the teacher's 4 steps + CFG with the rows' own FD_real intervals apart"]["met"]
    assert t["DMAD 4-step, same wall clock, beats LCM's on FD_real and adherence"]["met"]
    assert "paired A - B: FD_real -15.50 [-20.70, -10.30], adherence +10.2% [+6.5%, +13.8%]" in \
        t["LCM 4-step clearly beats the teacher's 4 steps + CFG"]["measured"]
    # better point estimates, but a paired interval that reaches 0: not beyond chance, not met
    t = targets(((-20.7, 0.4), (0.065, 0.138)), ((-7.0, -1.3), (-0.01, 0.081)))
    assert not t["LCM 4-step clearly beats the teacher's 4 steps + CFG"]["met"]
    assert not t["DMAD 4-step, same wall clock, beats LCM's on FD_real and adherence"]["met"]
