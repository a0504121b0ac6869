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
                 "--vae-batch", "4", "--unet-batch", "4"]) == 0
    cfg = json.loads((out / "training_config.json").read_text())
    assert cfg["unet_steps"] == 2 and cfg["parameters"]["total"] > 0
    log = [json.loads(line) for line in (out / "training_log.jsonl").read_text().splitlines()]
    assert {row["stage"] for row in log} == {"vae", "unet"}
    from safetensors import safe_open

    with safe_open(str(out / "unet" / "diffusion_pytorch_model.safetensors"), framework="pt") as f:
        assert f.get_tensor(next(iter(f.keys()))).dtype == torch.float16  # stored fp16: ~21 MB in all
    pipe = StableDiffusionPipeline.from_pretrained(str(out), local_files_only=True, safety_checker=None)
    assert pipe.vae.config.scaling_factor == pytest.approx(next(r["scaling_factor"] for r in log if "scaling_factor" in r))
