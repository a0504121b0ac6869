"""`dmad export` end to end: train tiny students (full and LoRA) with the real CLI, export them,
and load the result with plain diffusers."""
from __future__ import annotations

import json
import re
import socket
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import _deep_update, dmad_captured, dmad_in_process, run_dmad, tiny_config_dict

torch = pytest.importorskip("torch")

from dmad.contract.prompts import load_prompt_set, item_seed  # noqa: E402

FULL = {"distillation": {"student_steps": 2, "ema_decay": 0.5}}
# lora_alpha != rank: the file must carry the scale alpha / r = 2. A high generator_lr moves the
# adapter (B starts at zero) far enough in 2 iterations for the comparisons below to mean something.
LORA = {"identity": {"student": "lora", "fake_score": "lora", "lora_rank": 4, "lora_alpha": 8},
        "optimization": {"generator_lr": 1e-3},
        "distillation": {"student_steps": 4, "critic_updates_per_generator_update": 1}}


def _train(root: Path, name: str, extra: dict, teacher: Path, data: Path, prompts: Path) -> Path:
    """A 2-iteration run, checkpoint (and samples) at iteration 2."""
    cfg = _deep_update(tiny_config_dict(teacher, data, prompts, root / "runs"), extra)
    path = root / f"{name}.json"
    path.write_text(json.dumps(cfg), encoding="utf-8")
    run = root / name
    assert dmad_in_process("train", "--config", str(path), "--run-dir", str(run)) == 0
    assert (run / "samples" / "iter_2" / "meta.json").is_file()
    return run


@pytest.fixture(scope="module")
def full_run(tmp_path_factory, tiny_teacher, tiny_data, tiny_prompt_set) -> Path:
    return _train(tmp_path_factory.mktemp("export_full"), "full", FULL, tiny_teacher, tiny_data, tiny_prompt_set)


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory, tiny_teacher, tiny_data, tiny_prompt_set) -> Path:
    run = _train(tmp_path_factory.mktemp("export_lora"), "lora", LORA, tiny_teacher, tiny_data, tiny_prompt_set)
    # a LoRA student and fake score share the teacher's frozen base (the default): its export is what is tested
    assert "one frozen base" in (run / "logs" / "engine.log").read_text()
    return run


def _export(capsys, run: Path, *args: str) -> Path:
    """`dmad export` in this process (a CLI start is ~7 s of imports; test_bad_requests_exit_2_with_one_line
    runs the real CLI); stdout's last line is the exported folder."""
    code, stdout, stderr = dmad_captured(capsys, "export", "--run", str(run), *args)
    assert code == 0, stderr[-3000:]
    out = Path(stdout.strip().splitlines()[-1])
    assert out.is_dir() and not any(p.name.startswith(".tmp-") for p in out.parent.iterdir())
    return out


def _pipe(folder: Path):
    from diffusers import StableDiffusionPipeline

    pipe = StableDiffusionPipeline.from_pretrained(str(folder), local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _render(pipe, run: Path, steps: int) -> dict[str, np.ndarray]:
    """Every prompt of the run's prompt set with plain diffusers: the user's call from README.md."""
    ps = load_prompt_set(run / "prompt_set.json")
    out = {}
    for item in ps.items:
        gen = torch.Generator("cpu").manual_seed(item_seed(ps, item))
        image = pipe(item.prompt, num_inference_steps=steps, guidance_scale=1.0, width=ps.width, height=ps.height,
                     generator=gen).images[0]
        out[item.id] = np.asarray(image)
    return out


def _engine_images(run: Path, it: int) -> dict[str, np.ndarray]:
    from PIL import Image

    folder = run / "samples" / f"iter_{it}"
    meta = json.loads((folder / "meta.json").read_text())
    return {i: np.asarray(Image.open(folder / v["file"]).convert("RGB")) for i, v in meta["items"].items()}


@pytest.mark.slow
def test_full_student_exports_to_a_pipeline_that_reproduces_the_engine_exactly(full_run, run_python, tmp_path, capsys):
    from PIL import Image

    out = _export(capsys, full_run, "--format", "diffusers")
    assert out == full_run / "export" / "iter_2-diffusers"
    doc = json.loads((out / "dmad_export.json").read_text())
    assert doc["student_timesteps"] == [999, 499] and doc["weights"] == "ema" and doc["checkpoint"] == "iter_2"
    assert doc["method"] == "dmad"
    assert doc["num_inference_steps_gives_timesteps"] is True
    assert "num_inference_steps=2" in (out / "README.md").read_text()
    assert not [p for p in out.rglob("*") if p.suffix in (".bin", ".ckpt", ".pt", ".pth")]  # safetensors only

    pipe = _pipe(out)
    assert type(pipe.scheduler).__name__ == "LCMScheduler"
    pipe.scheduler.set_timesteps(2)
    assert pipe.scheduler.timesteps.tolist() == [999, 499]
    # The same latents, re-noising draws and arithmetic as the engine's render: identical pixels.
    got, want = _render(pipe, full_run, 2), _engine_images(full_run, 2)
    assert got.keys() == want.keys()
    for k in want:
        assert got[k].shape == want[k].shape and np.array_equal(got[k], want[k]), k
    # the README's lines, pasted as they are, render the first prompt's sample
    assert np.array_equal(_run_readme(out, run_python, tmp_path), want["red"])
    # and `dmad sample` re-rendering the checkpoint agrees
    assert dmad_in_process("sample", "--run", str(full_run), "--checkpoint", "2", "--out", str(tmp_path / "again")) == 0
    again = {k: np.asarray(Image.open(tmp_path / "again" / "iter_2" / f"{k}.png").convert("RGB")) for k in want}
    assert all(np.array_equal(again[k], got[k]) for k in want)
    # --dtype fp16: every network saved in fp16, and it loads and renders (close, not the same pixels)
    half = _export(capsys, full_run, "--format", "diffusers", "--dtype", "fp16", "--out", str(tmp_path / "fp16"))
    from safetensors.torch import load_file
    for net in ("unet", "vae", "text_encoder"):
        saved = load_file(str(next((half / net).glob("*.safetensors"))))
        assert {v.dtype for v in saved.values() if v.is_floating_point()} == {torch.float16}, net
    assert "saved in fp16" in (half / "README.md").read_text()


@pytest.mark.slow
def test_lora_student_exports_as_lora_and_as_fused_pipeline(lora_run, tiny_teacher, monkeypatch, run_python,
                                                             tmp_path, capsys):
    from diffusers import LCMScheduler, StableDiffusionPipeline

    from dmad.sample import export
    attempts = []

    def no_network(self, address, *a, **k):
        attempts.append(address)
        raise OSError("network disabled in this test")
    monkeypatch.setattr(socket.socket, "connect", no_network)

    # in process (the socket guard sees it): the LoRA file
    assert export.main(str(lora_run), "2", "lora", None) == 0
    lora_out = lora_run / "export" / "iter_2-lora"
    assert attempts == []
    assert (lora_out / "pytorch_lora_weights.safetensors").is_file()
    doc = json.loads((lora_out / "dmad_export.json").read_text())
    assert doc["student_timesteps"] == [999, 749, 499, 249] and doc["format"] == "lora"
    assert "load_lora_weights" in (lora_out / "README.md").read_text()
    monkeypatch.undo()

    fused_out = _export(capsys, lora_run, "--format", "diffusers", "--checkpoint", "latest")
    fused = _pipe(fused_out)
    assert not any("lora" in k for k in fused.unet.state_dict())

    # the teacher + the LoRA file + the exported scheduler, as README.md says
    teacher = StableDiffusionPipeline.from_pretrained(str(tiny_teacher), local_files_only=True)
    teacher.set_progress_bar_config(disable=True)
    teacher.scheduler = LCMScheduler.from_pretrained(str(lora_out), subfolder="scheduler")
    teacher.scheduler.set_timesteps(4)
    assert teacher.scheduler.timesteps.tolist() == [999, 749, 499, 249]
    before = {k: v.clone() for k, v in teacher.unet.state_dict().items()}
    teacher.load_lora_weights(str(lora_out))

    # the engine's own student (peft adapter, unfused) is the reference
    src = export.resolve_source(str(lora_run), "2")
    _, student, _ = export.load_student(src)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 4, 16, 16, generator=g)
    t = torch.tensor([999, 249])
    ctx = torch.randn(2, 16, 32, generator=g)
    with torch.no_grad():
        ref = student(x, t, ctx).sample
        base = teacher.unet.__class__.from_pretrained(str(tiny_teacher), subfolder="unet")(x, t, ctx).sample
        via_lora = teacher.unet(x, t, ctx).sample
        via_fused = fused.unet(x, t, ctx).sample
    scale = ref.abs().max().item()
    assert (ref - base).abs().max().item() > 1e-3 * scale  # the adapter matters: 100x the tolerance below
    for got in (via_lora, via_fused):  # fp32 re-association only: (W + sBA)x vs Wx + sB(Ax)
        assert torch.allclose(got, ref, rtol=0, atol=1e-5 * scale), (got - ref).abs().max().item()
    assert all(torch.equal(before[k], v) for k, v in teacher.unet.state_dict().items() if k in before)

    # images, against the engine's own render of the checkpoint: fused weights (W + sBA) and
    # diffusers' re-created adapter round differently from the engine's adapter (~1e-6 relative in
    # the UNet output), so a pixel may land one code value off (observed: 0 fused, <= 1 LoRA).
    want = _engine_images(lora_run, 2)
    for got in (_render(fused, lora_run, 4), _render(teacher, lora_run, 4)):
        for k in want:
            diff = np.abs(got[k].astype(int) - want[k].astype(int))
            assert diff.max() <= 1 and diff.mean() < 0.05, (k, diff.max(), diff.mean())
    for folder in (lora_out, fused_out):  # the README's lines: teacher + LoRA file, and the fused pipeline
        diff = np.abs(_run_readme(folder, run_python, tmp_path).astype(int) - want["red"].astype(int))
        assert diff.max() <= 1 and diff.mean() < 0.05, (folder.name, diff.max(), diff.mean())


def _single_file_pipe(tiny_teacher: Path, out: Path):
    """The base pipeline with the single file's denoiser, as the README says."""
    from safetensors.torch import load_file

    pipe = _pipe(tiny_teacher)
    doc = json.loads((out / "dmad_export.json").read_text())
    pipe.unet.load_state_dict(load_file(str(out / doc["lora_weight_name"])))  # strict: every key, no other
    from diffusers import LCMScheduler

    pipe.scheduler = LCMScheduler.from_pretrained(str(out), subfolder="scheduler")
    return pipe, doc


@pytest.mark.slow
def test_any_student_exports_as_one_model_file_comfyui_and_diffusers_load(full_run, lora_run, tiny_teacher, tmp_path,
                                                                          capsys):
    """--format single-file: the student's UNet (a LoRA student fused) as one .safetensors in
    diffusers' key names: ComfyUI's Load Diffusion Model reads those for a UNet whose state dict has
    conv_in.weight (comfy/model_detection.py unet_config_from_diffusers_unet, then
    comfy/utils.py unet_to_diffusers); plain diffusers loads it into the base pipeline's UNet
    and renders the run's samples (full: the same pixels; LoRA: within one code value)."""
    from safetensors import safe_open

    for run, steps, tolerance in ((full_run, 2, 0), (lora_run, 4, 1)):
        out = _export(capsys, run, "--format", "single-file", "--out", str(tmp_path / f"{run.name}-one"))
        pipe, doc = _single_file_pipe(tiny_teacher, out)
        assert doc["format"] == "single-file" and doc["lora_weight_name"] == f"{run.name}-iter_2-{steps}step.safetensors"
        with safe_open(str(out / doc["lora_weight_name"]), "pt") as f:
            keys, meta = set(f.keys()), f.metadata()
        assert keys == set(pipe.unet.state_dict()) and "conv_in.weight" in keys and not any("lora" in k for k in keys)
        assert meta["dmad_format"] == "single-file" and meta["dmad_student_steps"] == str(steps)
        assert meta["modelspec.architecture"] == "stable-diffusion-v1" and json.loads(meta["dmad_user_loras"]) == []
        want = _engine_images(run, 2)
        got = _render(pipe, run, steps)
        for k in want:
            diff = np.abs(got[k].astype(int) - want[k].astype(int))
            assert diff.max() <= tolerance, (run.name, k, diff.max())
        readme = (out / "README.md").read_text()
        assert "Load Diffusion Model" in readme and "models/diffusion_models" in readme
        scope: dict = {}  # the README's lines, in process (run_python's subprocess is the other tests')
        exec(compile(readme.split("```python\n", 1)[1].split("```", 1)[0], str(out / "README.md"), "exec"), scope)  # noqa: S102
        diff = np.abs(np.asarray(scope["image"].convert("RGB")).astype(int) - want["red"].astype(int))
        assert diff.max() <= tolerance, (run.name, diff.max())


COMFY_ATTENTION = re.compile(r"(down_blocks_\d+|up_blocks_\d+|mid_block)_attentions_\d+_transformer_blocks_\d+_"
                            r"(attn[12]_(to_q|to_k|to_v|to_out_0)|ff_net_0_proj|ff_net_2)")


def comfyui_unet_lora_names(unet) -> set[str]:
    """The kohya module names ComfyUI maps onto the linear layers a LoRA student adapts in an SD /
    SDXL UNet (Comfy-Org/ComfyUI a125cd84, comfy/lora.py model_lora_keys_unet over comfy/utils.py
    unet_to_diffusers' TRANSFORMER_BLOCKS: "lora_unet_" + the diffusers weight key without
    ".weight", dots as underscores, for attn1 / attn2 to_q, to_k, to_v, to_out.0 and ff.net.0.proj,
    ff.net.2 of every transformer block; docs/export.md)."""
    names = {"lora_unet_" + k[:-len(".weight")].replace(".", "_") for k in unet.state_dict() if k.endswith(".weight")}
    return {n for n in names if COMFY_ATTENTION.fullmatch(n[len("lora_unet_"):])}


def test_lora_student_exports_as_one_file_in_kohya_layout(lora_run, tiny_teacher, capsys):
    """--format lora-single-file on SD 1.x: kohya names (the ones diffusers' own PEFT -> kohya
    converter gives, and ComfyUI maps), alpha = rank with the scale alpha / r = 2 in the up
    weights, metadata; diffusers' load_lora_weights reads it back to the engine's adapter; fp16."""
    from diffusers import LCMScheduler, StableDiffusionPipeline
    from diffusers.utils.state_dict_utils import convert_state_dict_to_kohya
    from peft.utils import get_peft_model_state_dict
    from safetensors import safe_open
    from safetensors.torch import load_file

    from dmad.sample import export
    out = _export(capsys, lora_run, "--format", "lora-single-file")
    assert out == lora_run / "export" / "iter_2-lora-single-file"
    doc = json.loads((out / "dmad_export.json").read_text())
    name = "lora-iter_2-4step.safetensors"
    assert doc["lora_weight_name"] == name and doc["single_file_layout"] == "kohya (lora_unet_*)"
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "dmad_export.json", name, "scheduler"]
    tensors = load_file(str(out / name))
    with safe_open(str(out / name), "pt") as f:
        meta = f.metadata()
    assert meta["dmad_family"] == "sd1" and meta["dmad_student_steps"] == "4" and meta["ss_network_dim"] == "4"
    assert json.loads(meta["dmad_student_timesteps"]) == [999, 749, 499, 249] and meta["dmad_suggested_cfg"] == "1"
    assert meta["dmad_base_model"] == tiny_teacher.name and json.loads(meta["dmad_user_loras"]) == []

    src = export.resolve_source(str(lora_run), "2")
    _, student, _ = export.load_student(src)
    peft_sd = get_peft_model_state_dict(student)
    theirs = convert_state_dict_to_kohya({f"unet.{k}": v for k, v in peft_sd.items()})
    assert set(tensors) == set(theirs) and len(tensors) == 3 * (len(peft_sd) // 2)
    modules = {k.split(".")[0] for k in tensors}
    teacher = StableDiffusionPipeline.from_pretrained(str(tiny_teacher), local_files_only=True)
    assert modules <= comfyui_unet_lora_names(teacher.unet)
    key = next(k for k in peft_sd if k.endswith("lora_B.weight"))
    kohya = "lora_unet_" + key[:-len(".lora_B.weight")].replace(".", "_")
    assert torch.equal(tensors[f"{kohya}.lora_up.weight"], peft_sd[key] * 2.0)  # alpha / r = 8 / 4
    assert tensors[f"{kohya}.alpha"].item() == 4.0 and all(v.dtype == torch.float32 for v in tensors.values())

    # diffusers' loader (its kohya converter) puts the same adapter on the teacher
    teacher.set_progress_bar_config(disable=True)
    teacher.scheduler = LCMScheduler.from_pretrained(str(out), subfolder="scheduler")
    teacher.load_lora_weights(str(out), weight_name=name)
    g = torch.Generator().manual_seed(1)
    x, t, ctx = torch.randn(2, 4, 16, 16, generator=g), torch.tensor([999, 249]), torch.randn(2, 16, 32, generator=g)
    with torch.no_grad():
        ref, got = student(x, t, ctx).sample, teacher.unet(x, t, ctx).sample
    scale = ref.abs().max().item()
    assert torch.allclose(got, ref, rtol=0, atol=1e-5 * scale), (got - ref).abs().max().item()
    want = _engine_images(lora_run, 2)
    images = _render(teacher, lora_run, 4)
    for k in want:
        diff = np.abs(images[k].astype(int) - want[k].astype(int))
        assert diff.max() <= 1 and diff.mean() < 0.05, (k, diff.max(), diff.mean())
    readme = (out / "README.md").read_text()
    assert f"weight_name={name!r}" in readme and "models/loras" in readme and "`lcm` sampler" in readme

    # --dtype fp16: half the bytes, the same adapter within fp16's rounding
    half = _export(capsys, lora_run, "--format", "lora-single-file", "--dtype", "fp16",
                   "--out", str(lora_run / "export" / "fp16"))
    small = load_file(str(half / name))
    assert set(small) == set(tensors) and all(v.dtype == torch.float16 for v in small.values())
    assert json.loads((half / "dmad_export.json").read_text())["dtype"] == "fp16"
    assert "saved in fp16" in (half / "README.md").read_text()
    teacher.unload_lora_weights()
    teacher.load_lora_weights(str(half), weight_name=name)
    with torch.no_grad():
        got = teacher.unet(x, t, ctx).sample
    assert torch.allclose(got, ref, rtol=0, atol=1e-2 * scale), (got - ref).abs().max().item()


def _run_readme(out: Path, run_python, tmp_path: Path) -> np.ndarray:
    """Run the python block of the export's README.md as a user would paste it; the image it makes."""
    from PIL import Image

    text = (out / "README.md").read_text()
    code = text.split("```python\n", 1)[1].split("```", 1)[0]
    png = tmp_path / "readme.png"
    r = run_python(code + f"image.save({str(png)!r})\n", timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return np.asarray(Image.open(png).convert("RGB"))


@pytest.mark.slow
def test_lora_export_of_a_single_file_teacher_run(tmp_path, tiny_teacher, tiny_data, tiny_prompt_set, run_python,
                                                 capsys):
    """A run whose teacher is one LDM-layout .safetensors file: the README loads it with
    from_single_file + teacher_config_dir, puts the LoRA on it and renders the engine's sample."""
    import sys

    from safetensors.torch import save_file

    from dmad.models.teacher import load_teacher

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "engine"))
    from ldm_keys import pipeline_to_ldm

    t = load_teacher(str(tiny_teacher))
    single = tmp_path / "tiny-ldm.safetensors"
    save_file({k: v.contiguous() for k, v in pipeline_to_ldm(t.unet, t.vae, t.text_encoder).items()}, str(single))
    extra = _deep_update(json.loads(json.dumps(LORA)), {"identity": {
        "pretrained_model_name_or_path": str(single), "teacher_config_dir": str(tiny_teacher)}})
    run = _train(tmp_path, "single", extra, tiny_teacher, tiny_data, tiny_prompt_set)
    out = _export(capsys, run, "--format", "lora")
    assert "from_single_file" in (out / "README.md").read_text()
    diff = np.abs(_run_readme(out, run_python, tmp_path).astype(int) - _engine_images(run, 2)["red"].astype(int))
    assert diff.max() <= 1 and diff.mean() < 0.05, (diff.max(), diff.mean())


def _one_error_line(r) -> str:
    assert r.returncode == 2, (r.returncode, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dmad: error: ") and "Traceback" not in r.stderr, r.stderr
    return lines[0]


def test_bad_requests_exit_2_with_one_line(tmp_path, write_config, run_python):
    cli = lambda *a: run_dmad("export", *a, cwd=tmp_path)  # noqa: E731
    assert "run folder not found" in _one_error_line(cli("--run", str(tmp_path / "nope"), "--format", "diffusers"))
    empty = tmp_path / "empty_run"
    empty.mkdir()
    assert "no config.json" in _one_error_line(cli("--run", str(empty), "--format", "diffusers"))
    (empty / "config.json").write_text(Path(write_config()).read_text())
    assert "no complete checkpoint" in _one_error_line(cli("--run", str(empty), "--format", "diffusers"))
    assert "invalid choice" in _one_error_line(cli("--run", str(empty), "--format", "onnx"))
    ckpt = empty / "checkpoints" / "iter_5"
    ckpt.mkdir(parents=True)
    (ckpt / "training_state.json").write_text("{}")
    line = _one_error_line(cli("--run", str(empty), "--checkpoint", "7", "--format", "diffusers"))
    assert "iter_7" in line and "5" in line
    assert "expected 'latest'" in _one_error_line(cli("--run", str(empty), "--checkpoint", "x", "--format", "lora"))
    line = _one_error_line(cli("--run", str(empty), "--format", "lora"))
    assert "full UNet" in line and "--format diffusers" in line
    (tmp_path / "taken").mkdir()
    line = _one_error_line(cli("--run", str(empty), "--format", "diffusers", "--out", str(tmp_path / "taken")))
    assert "already exists" in line
    assert not (empty / "export").exists() or not any((empty / "export").iterdir())
    # answered before torch is imported (a fraction of a second, like config errors)
    r = run_python(f"import sys; from dmad.cli import main; rc = main(['export', '--run', {str(empty)!r}, "
                   f"'--format', 'lora']); print(rc, 'torch' in sys.modules)")
    assert r.stdout.split() == ["2", "False"], r.stdout + r.stderr


@pytest.mark.parametrize("prediction_type", ["epsilon", "v_prediction"])
def test_lcm_scheduler_is_the_student_sampler(prediction_type):
    """The exported scheduler's timesteps and arithmetic, checked without training: for every
    default student step count set_timesteps(n) gives the student's timesteps, and the pipeline's
    loop (LCMScheduler.step with the generator) equals dmad's sampler bit for bit."""
    from diffusers import DDPMScheduler

    from dmad.contract.config import Distillation
    from dmad.sample.export import check_scheduler_matches, student_scheduler
    from dmad.methods.dmd2 import sample_student
    from dmad.methods.prediction import NoiseSchedule

    ddpm = DDPMScheduler(beta_schedule="scaled_linear", beta_start=0.00085, beta_end=0.012,
                         prediction_type=prediction_type, clip_sample=False)
    schedule = NoiseSchedule.from_scheduler(ddpm)
    model = lambda x, t: torch.tanh(x * 0.7 + t.float().view(-1, 1, 1, 1) / 1000)  # noqa: E731 - any fixed function
    for n in (1, 2, 3, 4):
        ts = Distillation(student_steps=n).resolved_student_timesteps()
        sched, reproduces = student_scheduler(ddpm.config, ts)
        assert reproduces, (n, ts)
        check_scheduler_matches(sched, schedule, ts)
        sched.set_timesteps(n)
        assert sched.timesteps.tolist() == ts

        gen = torch.Generator("cpu").manual_seed(n)
        noise = torch.randn((1, 4, 8, 8), generator=gen)
        want = sample_student(lambda x, t: schedule.to_x0(x, model(x, t), t), noise, ts, schedule, gen)
        gen = torch.Generator("cpu").manual_seed(n)
        x = torch.randn((1, 4, 8, 8), generator=gen)  # what the pipeline's prepare_latents draws
        for t in sched.timesteps:
            x = sched.step(model(x, t.view(1)), t, x, generator=gen, return_dict=False)[0]
        assert torch.equal(x, want), (n, (x - want).abs().max().item())

    custom = [999, 800, 300]  # no LCM spacing gives these: the README passes timesteps= instead
    sched, reproduces = student_scheduler(ddpm.config, custom)
    assert not reproduces
    sched.set_timesteps(timesteps=custom)
    assert sched.timesteps.tolist() == custom
