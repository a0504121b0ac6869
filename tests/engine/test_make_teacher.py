"""`python -m dmad.demo.make_teacher`: a few steps of each stage give a loadable pipeline folder
with its training config and log beside fp16 weights (the full run is the built-in-default issue)."""
from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")


@pytest.mark.slow
def test_a_short_run_writes_a_loadable_pipeline(tmp_path):
    from diffusers import StableDiffusionPipeline

    from dmad.demo.make_teacher import main

    out = tmp_path / "teacher"
    assert main(["--out", str(out), "--vae-steps", "2", "--unet-steps", "2", "--warmup-steps", "1",
                 "--vae-batch", "4", "--unet-batch", "4", "--eval-every", "0",
                 "--final-eval-prompts", "2", "--decoder-steps", "2", "--decoder-batch", "4"]) == 0
    assert not list(tmp_path.glob(".teacher.*"))  # the temp folder was renamed into place
    cfg = json.loads((out / "training_config.json").read_text())
    assert cfg["unet_steps"] == 2 and cfg["parameters"]["total"] > 0
    log = [json.loads(line) for line in (out / "training_log.jsonl").read_text().splitlines()]
    assert {row["stage"] for row in log} == {"vae", "unet", "decoder", "final"}
    assert set(cfg["final_adherence_ddim50_cfg"]) == {"all", "shape", "colour", "size", "position", "background"}
    from safetensors import safe_open

    with safe_open(str(out / "unet" / "diffusion_pytorch_model.safetensors"), framework="pt") as f:
        assert f.get_tensor(next(iter(f.keys()))).dtype == torch.float16  # stored fp16: ~21 MB in all
    pipe = StableDiffusionPipeline.from_pretrained(str(out), local_files_only=True, safety_checker=None)
    assert pipe.vae.config.scaling_factor == pytest.approx(next(r["scaling_factor"] for r in log if "scaling_factor" in r))


def test_make_teacher_refuses_an_existing_folder(tmp_path, dmad_cli):
    (tmp_path / "t").mkdir()
    r = dmad_cli("demo", "make-teacher", "--out", str(tmp_path / "t"))
    assert r.returncode == 2 and "already exists" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_every_demo_word_is_one_token_and_other_text_still_tokenizes():
    from transformers import CLIPTokenizer

    from dmad.demo import TEACHER_MAX_LENGTH, demo_vocab, demo_words
    from dmad.demo.shapes import attributes_for, caption

    vocab, merges = demo_vocab()
    tok = CLIPTokenizer(vocab=vocab, merges=merges, model_max_length=TEACHER_MAX_LENGTH)
    for word in demo_words():
        assert tok.convert_ids_to_tokens(tok(word).input_ids)[1:-1] == [word + "</w>"], word
    longest = max((caption(attributes_for(i, 0)) for i in range(500)), key=lambda c: len(tok(c).input_ids))
    assert len(tok(longest).input_ids) <= 16
    assert len(tok("a reddish thing").input_ids) > 5  # unknown words fall back to byte tokens


TINY = ["--vae-steps", "2", "--unet-steps", "2", "--warmup-steps", "1", "--vae-batch", "4", "--unet-batch", "4",
        "--eval-every", "0", "--final-eval-prompts", "2", "--decoder-batch", "4"]


@pytest.mark.slow
def test_continuing_after_stage_two_gives_the_weights_of_one_whole_run(tmp_path):
    """The shipped teacher's stages 1-2 and 3 ran as two commands; that must equal one command."""
    from safetensors.torch import load_file

    from dmad.demo.make_teacher import main

    assert main(["--out", str(tmp_path / "whole"), *TINY, "--decoder-steps", "3"]) == 0
    assert main(["--out", str(tmp_path / "first"), *TINY, "--decoder-steps", "0"]) == 0
    assert main(["--out", str(tmp_path / "then"), *TINY, "--decoder-steps", "3",
                 "--continue-from", str(tmp_path / "first")]) == 0
    for part in ("unet", "vae", "text_encoder"):
        name = "model.safetensors" if part == "text_encoder" else "diffusion_pytorch_model.safetensors"
        a, b = load_file(str(tmp_path / "whole" / part / name)), load_file(str(tmp_path / "then" / part / name))
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), part
    vae_file = "vae/diffusion_pytorch_model.safetensors"
    first_vae, then_vae = load_file(str(tmp_path / "first" / vae_file)), load_file(str(tmp_path / "then" / vae_file))
    assert any(not torch.equal(first_vae[k], then_vae[k]) for k in first_vae if k.startswith("decoder."))  # stage 3 ran
    assert all(torch.equal(first_vae[k], then_vae[k]) for k in first_vae if k.startswith("encoder."))  # latents kept
    doc = json.loads((tmp_path / "then" / "training_config.json").read_text())
    assert doc["continued_from"]["decoder_steps"] == 0
    log = (tmp_path / "then" / "training_log.jsonl").read_text().splitlines()
    assert json.loads(log[0])["stage"] == "vae"  # the earlier stages' log comes first
