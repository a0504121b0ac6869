"""The built-in default: the shipped teacher, `dmad demo` and `dmad bench distill`, run for real on
the shipped weights (nothing downloaded)."""
from __future__ import annotations

import json
from dataclasses import replace

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
    assert len(checks) >= 5 and all(set(r["swap_rise"]) == set(measured) - {"all"} for r in checks)
    # and, since 2026-12, how it draws captions that leave attributes out
    assert all(set(r["under_specified"]) == {"stated_accuracy", "tv", "coverage"} for r in checks)
    assert record["under_specified_share"] > 0


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
                                         "--set", "observation.validation_steps=4",
                                         # demo_v3: demo_v4's 4 health seeds would make the teacher's 50-step
                                         # reference 4x as long; health is tested on tiny models (test_health.py)
                                         "--set", f"observation.prompt_set={resource('prompt_sets', 'demo_v3.json')}")
    assert code == 0, stderr[-2000:]
    assert "Done. Run folder:" in stdout and str(run) in stdout
    assert "teacher samples:" in stdout  # rendered by the engine, before iteration 1 (the demo only makes the grid)
    ps = json.loads((run / "prompt_set.json").read_text())
    ids = {item["id"] for item in ps["items"]}
    for folder in ("teacher", "iter_4"):
        meta = json.loads((run / "samples" / folder / "meta.json").read_text())
        assert set(meta["items"]) == ids
        assert {p.stem.split("~s")[0] for p in (run / "samples" / folder).glob("*.png")} == ids  # and health seeds
    teacher_meta = json.loads((run / "samples" / "teacher" / "meta.json").read_text())
    # a flow-matching teacher samples with its own Euler sampler whatever the prompt set names
    assert (teacher_meta["steps"], teacher_meta["cfg"], teacher_meta["sampler"]) == (ps["steps"], ps["cfg"], "flow_match_euler")
    grid = json.loads((run / "samples" / "grid.json").read_text())
    assert grid["columns"] == ["teacher", "iter_4"] and len(grid["rows"]) == len(ids)
    from PIL import Image

    assert grid["column_labels"] == ["teacher", "iteration 4"]
    assert [label.split(": ", 1)[0] for label in grid["row_labels"]] == grid["rows"]
    with Image.open(run / "samples" / "grid.png") as im:  # labelled: wider and taller than the cells alone
        assert im.size[0] > 2 * 128 and im.size[1] > len(ids) * 128
        assert all(c["box"][2] == 128 and c["box"][0] + 128 <= im.size[0] for c in grid["cells"])


def _first_in_its_process_then_in_this_one(real):
    """bench_runs.run_distillation for the small bench: its first distillation goes through the
    bench's own subprocess (the command, its stderr log, the wall and CPU clocks); the other three
    run the same `dmad train` command in this process (a CLI start is ~6 s of imports on 2 cores).
    The peer's wall-clock budget (600 s) is never reached here, so its control sends nothing: it
    is asked once, at the end, and must say so."""
    import contextlib
    import io
    import os
    import time

    from tests.conftest import dmad_in_process

    calls: list = []

    def run(run_dir, config, overrides, log, control=None):
        calls.append(run_dir)
        if len(calls) == 1:
            return real(run_dir, config, overrides, log, control)
        args = ["train", "--config", str(config), "--run-dir", str(run_dir)]
        for item in overrides:
            args += ["--set", item]
        log(f"distilling (in the test's process): dmad {' '.join(args)}")
        t0, c0 = time.perf_counter(), os.times()
        with contextlib.redirect_stdout(io.StringIO()):  # its events, which the bench's process sends nowhere
            assert dmad_in_process(*args) == 0
        wall, c1 = time.perf_counter() - t0, os.times()
        assert control is None or control(wall, 0) == []
        return {"wall_time_s": round(wall, 1), "cpu_time_s": round(c1.user + c1.system - c0.user - c0.system, 1),
                "run_dir": str(run_dir), "command": "dmad " + " ".join(args), "control": [], "wall_clock_iter": None}

    return run


@pytest.fixture(scope="module")
def small_bench(tmp_path_factory, tiny_prompt_set):
    """`dmad bench distill`'s whole protocol (every teacher and real row, two training seeds of DMAD
    and of LCM, each a 4-iteration distillation in its own process, the learning-curve rows, the
    summary over seeds, the seed-level comparisons, the targets, the grid, the JSON and the
    tables) at a small size, in process. What the numbers say is the bench's job (bench/distill.py,
    docs/benchmarks.md). The distillation runs' own samples (the engine's teacher reference, its
    validation renders) are not what the bench reads, so they use the two-prompt, 2-step set."""
    import contextlib
    import io

    from dmad.demo import bench, bench_runs

    small = bench.BenchSettings(prompts=4, seeds_per_prompt=2, under_captions=2, under_seeds=4, real_per_prompt=8,
                                teacher_steps=6, batch_size=16, training_seeds=(0, 1),
                                train_overrides=("optimization.max_train_steps=4", "observation.checkpointing_steps=2",
                                                 "observation.validation_steps=4", "observation.log_every_steps=2",
                                                 f"observation.prompt_set={tiny_prompt_set}"),
                                # LCM ends by its step cap (the equal-compute iteration) however busy the
                                # machine; the wall-clock stop is what the full and --quick benches show
                                peer_step_cap=1, peer_budget_s=600.0)
    tmp = tmp_path_factory.mktemp("bench")
    stdout = io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(stdout):
        mp.setattr(bench, "QUICK", small)
        mp.setattr(bench_runs, "run_distillation", _first_in_its_process_then_in_this_one(bench_runs.run_distillation))
        code = bench.main_distill(quick=True, json_out=str(tmp / "out" / "bench.json"), out_dir=str(tmp / "b"),
                                  config=None, methods="dmad,lcm", seeds="0,1")
    assert code == 0
    return stdout.getvalue(), json.loads((tmp / "out" / "bench.json").read_text()), tmp / "b", small


def test_bench_distill_runs_every_row_on_both_caption_kinds(small_bench):
    table, doc, folder, _ = small_bench
    rows = {row["label"]: row for row in doc["rows"]}
    assert doc["settings"]["set"] == "heldout" and doc["settings"]["checkpoint_rule"] == "final"
    ref, floor = rows["teacher 6 steps + CFG"], rows["real renders (floor)"]
    assert ref["nfe"] == 12 and ref["fd_teacher"] == 0.0
    assert rows["teacher 6 steps + CFG, other seeds"]["fd_teacher"] > 0  # the noise floor
    for k in (1, 2, 4):
        assert rows[f"teacher {k} step{'s' if k > 1 else ''} + CFG"]["nfe"] == 2 * k
        for seed in (0, 1):
            for name, budget in (("DMAD", "final"), ("LCM", "same wall clock"), ("LCM", "equal compute")):
                at = "" if budget == "final" else f" @ {budget}"
                r = rows[f"{name} {k} step{'s' if k > 1 else ''}{at}, seed {seed}"]
                assert r["nfe"] == k and r["seed"] == seed and r["budget"] == budget and r["fd_real"] > 0
                # the under-specified part: distances and shares, precision and recall against real renders
                assert 0 <= r["tv"] <= 1 and 0 <= r["coverage"] <= 1 and 0 <= r["stated_accuracy"] <= 1
                assert 0 <= r["precision"] <= 1 and 0 <= r["recall"] <= 1 and r["network_passes"] > 0
                lo, hi = r["fd_real_ci"]
                assert lo <= r["fd_real"] <= hi
    # a finite sample of the data is not at 0: the floor printed beside every distance
    assert 0 < floor["tv"] < 1 and floor["stated_accuracy"] == 1.0 and floor["diversity"] > 0
    assert rows["DMAD 4 steps @ iter 2, seed 1"]["iteration"] == 2  # the learning curve: the earlier checkpoint
    first = doc["runs"]["dmad-seed0"]  # the one distillation in a process of its own, as the bench runs them
    assert " -m dmad train --config " in first["command"] and first["cpu_time_s"] > 0
    assert (folder / "runs" / "dmad-seed0.stderr.log").is_file()
    assert "| DMAD 4 steps, seed 0 |" in table and "Students over training seeds" in table
    from PIL import Image

    # the picture: 4 prompts x (teacher 6 steps, teacher 4 steps, DMAD and LCM at 1 and 4 steps), 2x size
    with Image.open(folder / "grid.png") as im:
        assert im.size == (250 + 6 * (128 + 4), 18 + 4 * (128 + 4))
    with Image.open(folder / "grid_under.png") as im:  # "a red shape" over 8 seeds: teacher, then each student
        assert im.size == (250 + 8 * (128 + 4), 18 + 5 * (128 + 4))


def test_bench_distill_summarises_seeds_and_compares_them_with_their_spread(small_bench):
    table, doc, folder, _ = small_bench
    summary = {e["name"]: e for e in doc["summary"]}
    rows = {row["label"]: row for row in doc["rows"]}
    d4 = summary["DMAD 4 steps"]
    assert d4["seeds"] == [0, 1] and d4["fd_real"]["values"] == [rows["DMAD 4 steps, seed 0"]["fd_real"],
                                                                 rows["DMAD 4 steps, seed 1"]["fd_real"]]
    assert d4["fd_real"]["sd"] == pytest.approx(abs(d4["fd_real"]["values"][0] - d4["fd_real"]["values"][1]) / 2 ** 0.5)
    c = next(x for x in doc["comparisons"] if x["a"] == "DMAD 4 steps" and x["b"] == "LCM 4 steps @ same wall clock")
    per = [rows[f"DMAD 4 steps, seed {k}"]["tv"] - rows[f"LCM 4 steps @ same wall clock, seed {k}"]["tv"] for k in (0, 1)]
    assert c["tv"]["per_seed"] == pytest.approx(per) and c["what"] == "same wall clock"
    half = 12.706 * abs(per[0] - per[1]) / 2 ** 0.5 / 2 ** 0.5  # t(0.975, 1) * sd / sqrt(2)
    assert c["tv"]["ci"] == pytest.approx((sum(per) / 2 - half, sum(per) / 2 + half))
    names = {t["target"] for t in doc["targets"]}
    assert "teacher mean TV <= its sampling floor + 0.05" in names and "DMAD 4 steps: mean TV <= teacher's + 0.05" in names
    assert any("beats LCM 1 step @ equal compute on tv (equal training compute" in n for n in names)


def test_bench_distill_reads_lcm_at_dmads_training_compute(small_bench):
    """LCM's equal-compute checkpoint is where its engine-counted network passes reach DMAD's final
    count: the analytic per-iteration cost the bench plans with is what the engine counts."""
    from dmad.demo.bench_runs import peer_passes_per_iteration

    table, doc, folder, _ = small_bench
    for seed in (0, 1):
        dmad, lcm = doc["runs"][f"dmad-seed{seed}"], doc["runs"][f"lcm-seed{seed}"]
        per = peer_passes_per_iteration(lcm["effective_batch"])
        assert lcm["equal_compute_iter"] == max(1, round(dmad["network_passes"] / per))
        assert lcm["network_passes"] == pytest.approx(per * lcm["iterations"])  # counted == planned
        assert lcm["wall_clock_iter"] is None  # its step cap (the equal-compute iteration) ended it first
        rows = {row["label"]: row for row in doc["rows"]}
        eq = rows[f"LCM 4 steps @ equal compute, seed {seed}"]
        assert eq["iteration"] == lcm["equal_compute_iter"] and eq["network_passes"] == pytest.approx(
            per * lcm["equal_compute_iter"])
    assert lcm["student_timesteps"] == [999, 759, 499, 259]


def test_an_interrupted_bench_goes_on_from_its_rows_and_runs(small_bench, capsys):
    """The same command on the same --out trains nothing again and samples nothing again: it reads
    every row and run back and prints the same tables."""
    import contextlib
    import io

    from dmad.demo import bench, bench_runs

    table, doc, folder, small = small_bench
    before = {p: p.stat().st_mtime_ns for p in (folder / "rows").iterdir()}

    def again(**kw) -> str:
        """The bench once more on `folder` (training refused); its stdout."""
        stdout = io.StringIO()
        with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(stdout):
            mp.setattr(bench, "QUICK", small)
            mp.setattr(bench_runs, "run_distillation", lambda *a, **k: pytest.fail("trained again"))
            assert bench.main_distill(quick=True, json_out=None, out_dir=str(folder), config=None, **kw) == 0
        return stdout.getvalue()

    out = again(methods="dmad,lcm", seeds="0,1")
    assert {p: p.stat().st_mtime_ns for p in (folder / "rows").iterdir()} == before
    strip = lambda t: [x for x in t.splitlines() if not x.startswith("| distillation within")]  # noqa: E731
    assert strip(out) == strip(table)
    from dmad.errors import UserInputError

    # fewer methods or seeds read the kept rows back: nothing is trained or scored again
    out = again(methods="dmad", seeds="0")
    assert {p: p.stat().st_mtime_ns for p in (folder / "rows").iterdir()} == before
    assert not any(line.startswith("| LCM") for line in out.splitlines()) and "seed 1" not in out
    assert "| DMAD 4 steps beats LCM 4 steps @ equal compute on tv" in out and "| not measured |" in out  # said, not dropped
    with pytest.raises(UserInputError, match=r"holds a bench with other settings \(set\)"):
        again(methods="dmad", seeds="0", set_name="tuning")

    # a bench.json written before the peer's settings had neutral names (lcm_*) is the same bench
    manifest = folder / "bench.json"
    current = json.loads(manifest.read_text(encoding="utf-8"))
    old = {**{k: v for k, v in current.items() if k != "peer_config"}, "lcm_config": current["peer_config"],
           "settings": {("lcm_" + k[len("peer_"):] if k.startswith("peer_") else k): v
                        for k, v in current["settings"].items()}}
    assert "lcm_step_cap" in old["settings"] and "peer_step_cap" not in old["settings"]
    manifest.write_text(json.dumps(old), encoding="utf-8")
    assert strip(again(methods="dmad,lcm", seeds="0,1")) == strip(table)
    assert json.loads(manifest.read_text(encoding="utf-8"))["settings"]["peer_step_cap"] == 1  # today's names again


def test_bench_methods_and_seeds_are_checked_before_any_work(tmp_path):
    from dmad.demo.bench import main_distill, parse_methods, parse_seeds
    from dmad.errors import UserInputError

    assert parse_methods("lcm, dmad,dm_only") == ("dmad", "lcm", "dm_only")
    with pytest.raises(UserInputError, match="unknown method 'lcd'"):
        parse_methods("dmad,lcd")
    with pytest.raises(UserInputError, match="must include dmad"):
        parse_methods("lcm")
    assert parse_seeds("0,1,2") == (0, 1, 2)
    for bad in ("", "a", "1,1", "-1"):
        with pytest.raises(UserInputError, match="--seeds"):
            parse_seeds(bad)
    (tmp_path / "file").write_text("x")
    with pytest.raises(UserInputError, match="--json"):  # a JSON path below a file: refused before any work
        main_distill(quick=True, json_out=str(tmp_path / "file" / "x.json"), out_dir=None, config=None)


def test_the_teacher_rows_guidance_is_the_option_then_the_prompt_set_then_the_config():
    """--teacher-cfg sets the teacher rows' scale (a teacher trained longer is best at CFG 1.25:
    resources/demo/teacher/README.md); without it, the prompt set's the distillations validate
    with, then the config's real-score scale, as before."""
    from types import SimpleNamespace

    from dmad.demo.bench import FULL, parse_guidance, teacher_guidance

    cfg = SimpleNamespace(distillation=SimpleNamespace(real_guidance_scale=4.5))
    prompts = SimpleNamespace(cfg=3.0)
    assert teacher_guidance(FULL, prompts, cfg) == 3.0
    assert teacher_guidance(FULL, None, cfg) == 4.5
    assert teacher_guidance(FULL, SimpleNamespace(cfg=None), cfg) == 4.5
    assert teacher_guidance(replace(FULL, teacher_cfg=1.25), prompts, cfg) == 1.25
    assert parse_guidance("1.25") == 1.25 and parse_guidance("1") == 1.0


def test_the_few_step_flow_baseline_uses_every_step():
    """SD3's default Euler spacing ends at sigma 0.001, so its "2 steps" are one step and a tiny one
    (measured: 2 steps differed from 1 by 9e-5 per pixel); the bench's baseline spaces sigmas
    1, ..., 1/k instead (0.06 per pixel apart here)."""
    from dmad.demo.bench_sampling import sample_teacher
    from dmad.demo.bench_sets import initial_noise
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


def test_sigterm_to_dmad_demo_stops_its_engine_and_waits_for_it(tmp_path, tiny_teacher, tiny_data, tiny_prompt_set):
    """`kill <pid of dmad demo>` (SIGTERM to the demo alone, not its group): the engine gets a
    graceful stop and the demo waits for it, then exits with the interrupted code (130); no engine
    is left training. The demo's command on the tiny teacher, for a run too long to end by itself."""
    import contextlib
    import signal
    import subprocess
    import time

    import psutil

    from dmad.contract.paths import engine_argv
    from tests.conftest import dmad_env, gone

    run = tmp_path / "demo-run"
    tiny = {"identity.pretrained_model_name_or_path": tiny_teacher, "identity.train_data_dir": tiny_data,
            "observation.prompt_set": tiny_prompt_set, "resources.resolution": 32, "resources.train_batch_size": 1,
            "optimization.max_train_steps": 100_000, "observation.log_every_steps": 1,
            "observation.checkpointing_steps": 100_000, "observation.validation_steps": 100_000}
    sets = [a for k, v in tiny.items() for a in ("--set", f"{k}={v}")]
    with open(tmp_path / "demo.out", "w") as out:
        demo = subprocess.Popen(engine_argv("demo", "--run-dir", str(run), *sets), cwd=tmp_path, env=dmad_env(),
                                stdout=out, stderr=subprocess.STDOUT)
    engines: list = []
    try:
        deadline = time.monotonic() + 600  # a hang guard, not a performance target
        while not _logged_rows(run) and demo.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert demo.poll() is None and _logged_rows(run), (tmp_path / "demo.out").read_text()[-3000:]
        engines = psutil.Process(demo.pid).children()
        assert len(engines) == 1 and "train" in engines[0].cmdline()
        demo.send_signal(signal.SIGTERM)
        code = demo.wait(timeout=600)
        deadline = time.monotonic() + 60
        while not gone(engines[0].pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert gone(engines[0].pid), "the engine outlived dmad demo"
    finally:  # after a failure only: nothing of the test keeps running
        for p in [demo, *engines]:
            with contextlib.suppress(Exception):
                p.kill()
    text = (tmp_path / "demo.out").read_text()
    assert code == 130, text[-3000:]
    assert "Stopped. Run folder:" in text and "Traceback" not in text
    status = json.loads((run / "status.json").read_text())
    assert status["state"] == "stopped"  # a graceful stop: the engine wrote its end


def _logged_rows(run) -> int:
    try:
        return max(0, len((run / "metrics.csv").read_text().splitlines()) - 1)
    except OSError:
        return 0
