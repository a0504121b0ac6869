"""`dmad demo make-teacher`: a few steps of each stage give a pipeline folder that plain diffusers
loads and runs, a log with the diagnostics, and an interrupted run resumes to the same weights."""
from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

TINY = ["--vae-steps", "2", "--vae-batch", "4", "--vae-check-images", "8", "--pool-size", "16", "--steps", "4", "--batch", "4",
        "--warmup-steps", "1", "--eval-every", "4", "--eval-prompts", "2", "--swap-images", "2",
        "--final-eval-prompts", "2", "--final-steps", "2", "--layers", "1", "--save-every", "2",
        "--coverage-captions", "2", "--coverage-seeds", "2"]


@pytest.fixture(scope="module")
def short_run(tmp_path_factory):
    from dmad.demo.make_teacher import main

    out = tmp_path_factory.mktemp("mt") / "teacher"
    assert main(["--out", str(out), *TINY]) == 0
    return out


@pytest.mark.slow
def test_a_short_run_writes_a_pipeline_plain_diffusers_runs(short_run):
    from diffusers import StableDiffusion3Pipeline

    out = short_run
    assert not list(out.parent.glob(".teacher.*"))  # temp and work folders gone once renamed into place
    cfg = json.loads((out / "training_config.json").read_text())
    assert cfg["steps"] == 4 and cfg["parameters"]["total"] > 0
    assert set(cfg["final_adherence"]) == {"all", "shape", "colour", "size", "position", "background"}
    log = [json.loads(line) for line in (out / "training_log.jsonl").read_text().splitlines()]
    assert {row["stage"] for row in log} == {"vae", "pool", "transformer", "final"}
    check = next(r for r in log if r.get("check"))
    assert set(check["swap_rise"]) == {"shape", "colour", "size", "position", "background"}
    assert all(set(v) == {"0.5", "0.8", "0.95"} for v in check["swap_rise"].values())
    assert set(check["under_specified"]) == {"stated_accuracy", "tv", "coverage"}
    assert 0 <= check["under_specified"]["tv"] <= 1
    assert "cpu_s" in next(r for r in log if r["stage"] == "transformer")
    # the README's learning curve, written beside the log: one row per check
    table = (out / "learning_curve.md").read_text(encoding="utf-8").splitlines()
    assert table[0].startswith("| step | all | shape |") and len(table) == 2 + sum(1 for r in log if r["stage"] == "transformer" and r.get("check"))
    assert table[2].startswith(f"| {check['step']} | {check['adherence']['all']:.0%} |")
    pipe = StableDiffusion3Pipeline.from_pretrained(str(out), local_files_only=True)  # no dtype argument
    pipe.set_progress_bar_config(disable=True)
    img = pipe("a large red circle in the center on a black background", num_inference_steps=2,
               output_type="pt").images
    assert img.shape == (1, 3, 64, 64) and torch.isfinite(img).all()
    assert pipe.vae.config.scaling_factor == pytest.approx(next(r["scaling_factor"] for r in log if "scaling_factor" in r))


@pytest.mark.slow
def test_an_interrupted_run_resumes_to_the_weights_of_one_whole_run(short_run, tmp_path, monkeypatch):
    from safetensors.torch import load_file

    from dmad.demo import teacher_stages
    from dmad.demo.make_teacher import main

    calls = {"n": 0}
    original = teacher_stages.ema_update

    def stop_after_three(*a, **k):
        calls["n"] += 1
        if calls["n"] == 3:  # step 3 of 4: after the save at step 2
            raise KeyboardInterrupt
        return original(*a, **k)

    monkeypatch.setattr(teacher_stages, "ema_update", stop_after_three)
    out = tmp_path / "teacher"
    with pytest.raises(KeyboardInterrupt):
        main(["--out", str(out), *TINY])
    assert not out.exists() and (tmp_path / ".teacher.partial" / "state.json").is_file()
    monkeypatch.setattr(teacher_stages, "ema_update", original)
    assert main(["--out", str(out), *TINY]) == 0
    for part, name in (("transformer", "diffusion_pytorch_model"), ("vae", "diffusion_pytorch_model"),
                       ("text_encoder", "model"), ("text_encoder_2", "model")):
        a = load_file(str(short_run / part / f"{name}.safetensors"))
        b = load_file(str(out / part / f"{name}.safetensors"))
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), part
    log = [json.loads(line) for line in (out / "training_log.jsonl").read_text().splitlines()]
    assert {"stage": "resume", "step": 2} in log
    assert json.loads((out / "training_config.json").read_text())["resumed_at_steps"] == [2]


def test_a_partial_run_with_other_settings_is_refused_in_one_line(tmp_path, dmad_cli):
    work = tmp_path / ".t.partial"
    work.mkdir()
    (work / "state.json").write_text(json.dumps({"stage_done": 1, "recipe": {"steps": 1}}))
    r = dmad_cli("demo", "make-teacher", "--out", str(tmp_path / "t"))
    assert r.returncode == 2 and "other settings" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_make_teacher_refuses_an_existing_folder(tmp_path, dmad_cli):
    (tmp_path / "t").mkdir()
    r = dmad_cli("demo", "make-teacher", "--out", str(tmp_path / "t"))
    assert r.returncode == 2 and "already exists" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_every_demo_word_is_one_token_and_other_text_still_tokenizes():
    from dmad.demo import demo_tokenizer, demo_words
    from dmad.demo.shapes import attributes_for, caption

    tok = demo_tokenizer()
    for word in demo_words():
        assert tok.convert_ids_to_tokens(tok(word).input_ids)[1:-1] == [word + "</w>"], word
    longest = max((caption(attributes_for(i, 0)) for i in range(500)), key=lambda c: len(tok(c).input_ids))
    assert len(tok(longest).input_ids) <= 16
    assert len(tok("a reddish thing").input_ids) > 5  # unknown words fall back to byte tokens


def test_the_word_swap_diagnostic_changes_exactly_one_attribute():
    import random

    from dmad.demo.metrics import ATTRIBUTES, parse_caption
    from dmad.demo.shapes import attributes_for, caption
    from dmad.demo.teacher_stages import swap_attribute

    rng = random.Random(0)
    for i in range(50):
        a = attributes_for(i, 3)
        for attribute in ATTRIBUTES:
            before, after = parse_caption(caption(a)), parse_caption(caption(swap_attribute(a, attribute, rng)))
            assert [k for k in ATTRIBUTES if before[k] != after[k]] == [attribute]


def test_shape_weights_give_the_shape_its_share_of_each_images_loss():
    from dmad.demo.teacher_stages import render_batch, shape_masks, shape_weights

    x, caps = render_batch(0, 6, 0, 64)
    masks = shape_masks(x, (32, 32))
    plain = ((x - x[..., :1, :1]).abs().amax(1, keepdim=True) > 0)
    assert masks.shape == (6, 1, 32, 32)
    for i in range(6):  # every shape pixel's latent pixel is marked, and the mark is at most 2 latent px wider
        ys, xs = plain[i, 0].nonzero(as_tuple=True)
        assert masks[i, 0, ys // 2, xs // 2].all(), caps[i]
        my, mx = masks[i, 0].nonzero(as_tuple=True)
        assert my.min() >= ys.min() // 2 - 1 and mx.max() <= xs.max() // 2 + 1
    w = shape_weights(masks, 0.5)
    assert torch.allclose(w.mean((1, 2, 3)), torch.ones(6))
    share = (w * masks).sum((1, 2, 3)) / w.sum((1, 2, 3))
    assert torch.allclose(share, torch.full((6,), 0.5))
    small = masks.float().mean((1, 2, 3))  # the plain mean's share, for comparison
    assert (small < 0.5).all()
