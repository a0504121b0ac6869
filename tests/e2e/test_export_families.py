"""`dmad export` for the SDXL, SD3 (without T5) and Flux (guidance embedding) families: train tiny
students (full and LoRA) with the real CLI, export them, load the result with the family's plain
diffusers pipeline and run the README's exact lines against the run's own samples."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.e2e.test_export import _engine_images, _train

torch = pytest.importorskip("torch")

FAMILIES = ("sdxl", "sd3", "flux")
CLASSES = {"sdxl": "StableDiffusionXLPipeline", "sd3": "StableDiffusion3Pipeline", "flux": "FluxPipeline"}
FULL = {"distillation": {"student_steps": 2, "ema_decay": 0.5}}
# lora_alpha != rank: the file must carry the scale alpha / r = 2; a high generator_lr moves the
# adapter (B starts at zero) far enough in 2 iterations for the comparisons to mean something
LORA = {"identity": {"student": "lora", "fake_score": "lora", "lora_rank": 4, "lora_alpha": 8},
        "optimization": {"generator_lr": 1e-3},
        "distillation": {"student_steps": 2, "critic_updates_per_generator_update": 1}}
# identity.lora_targets: SDXL and Flux adapt the feed-forward layers too (kohya's ff_net names; Flux's
# single-block proj_mlp), SD3 the attention projections only, as SD 1.x in test_export.py
LORA_TARGETS = {"sdxl": "attention+ff", "sd3": "attention", "flux": "attention+ff"}


@pytest.fixture(scope="module")
def teachers(tmp_path_factory) -> dict[str, Path]:
    """One tiny teacher folder per family (SD3 without T5, Flux with guidance embedding)."""
    from dmad.testing.tiny import make_tiny_flux_pipeline, make_tiny_sd3_pipeline, make_tiny_sdxl_pipeline

    root = tmp_path_factory.mktemp("family_teachers")
    make_tiny_sdxl_pipeline(root / "sdxl")
    make_tiny_sd3_pipeline(root / "sd3", with_t5=False)
    make_tiny_flux_pipeline(root / "flux", guidance_embeds=True)
    return {f: root / f for f in FAMILIES}


def _run(tmp_path_factory, family: str, kind: str, teachers, data: Path, prompts: Path) -> Path:
    extra = json.loads(json.dumps(FULL if kind == "full" else LORA))
    if kind == "lora":
        extra["identity"]["lora_targets"] = LORA_TARGETS[family]
    return _train(tmp_path_factory.mktemp(f"export_{family}_{kind}"), f"{family}-{kind}", extra, teachers[family],
                  data, prompts)


def _export(run: Path, fmt: str) -> Path:
    """In process (saves a torch import per export); the CLI path is test_export.py's."""
    from dmad.sample import export
    assert export.main(str(run), "2", fmt, None) == 0
    out = run / "export" / f"iter_2-{fmt}"
    assert out.is_dir() and not any(p.name.startswith(".tmp-") for p in out.parent.iterdir())
    return out


def _load(family: str, folder: Path):
    """The exported folder with the family's plain diffusers pipeline class."""
    import diffusers

    extra = {"text_encoder_3": None, "tokenizer_3": None} if family == "sd3" else {}
    pipe = getattr(diffusers, CLASSES[family]).from_pretrained(str(folder), local_files_only=True, **extra)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _readme_image(out: Path) -> tuple[np.ndarray, object]:
    """The python block of the export's README.md, run as written (in process): (its image, its pipe)."""
    code = (out / "README.md").read_text().split("```python\n", 1)[1].split("```", 1)[0]
    scope: dict = {}
    exec(compile(code, str(out / "README.md"), "exec"), scope)  # noqa: S102 - the export's own usage lines
    scope["pipe"].set_progress_bar_config(disable=True)
    return np.asarray(scope["image"].convert("RGB")), scope["pipe"]


def _diff(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    assert got.shape == want.shape
    return np.abs(got.astype(int) - want.astype(int))


def _check_against_samples(out: Path, run: Path, family: str, tol: int) -> None:
    """The README's lines render the run's first prompt as samples/iter_2/<id>.png, within `tol`
    code values (a 2-step student: the re-noising draws must match too; Flux draws them in its
    packed layout, as the engine's Flux sampler does)."""
    doc = json.loads((out / "dmad_export.json").read_text())
    want = _engine_images(run, 2)["red"]
    got, _ = _readme_image(out)
    assert doc["exact"] is True
    d = _diff(got, want)
    assert d.max() <= tol and d.mean() < 0.05, (family, out.name, d.max(), d.mean())


def _check_doc(out: Path, family: str, fmt: str) -> dict:
    doc = json.loads((out / "dmad_export.json").read_text())
    assert (doc["family"], doc["pipeline_class"], doc["format"]) == (family, CLASSES[family], fmt)
    assert doc["student_timesteps"] == [999, 499] and doc["checkpoint"] == "iter_2"
    readme = (out / "README.md").read_text()
    assert CLASSES[family] in readme
    if family == "flux":  # the guidance embedding the student was trained with (real_guidance_scale)
        assert doc["guidance_embedded"] is True and doc["guidance_scale"] == 3.0
        assert "guidance_scale=3.0" in readme and "_pack_latents" in readme
    else:
        assert doc["guidance_scale"] == 1.0 and "guidance_scale=1.0" in readme
    if family in ("sd3", "flux"):
        assert doc["scheduler"] == {"class": "FlowMatchEulerDiscreteScheduler", "shift": 1.0,
                                    "use_dynamic_shifting": False, "stochastic_sampling": True}
        assert f"sigmas={doc['student_sigmas']!r}" in readme
        assert "step(*args, **kwargs, generator=generator)" in readme  # re-noising from the item's generator
    else:
        assert doc["scheduler"]["class"] == "LCMScheduler" and "num_inference_steps=2" in readme
    if family == "sd3":
        assert "text_encoder_3=None, tokenizer_3=None" in readme
    return doc


def _check_scheduler(pipe, family: str, doc: dict) -> None:
    """The loaded pipeline's scheduler steps through the engine's timesteps / sigmas."""
    pipe.scheduler.set_timesteps(**({"sigmas": doc["student_sigmas"], "mu": 0.0} if family != "sdxl"
                                    else {"num_inference_steps": 2}))
    if family == "sdxl":
        assert type(pipe.scheduler).__name__ == "LCMScheduler"
        assert pipe.scheduler.timesteps.tolist() == [999, 499]
    else:
        assert type(pipe.scheduler).__name__ == "FlowMatchEulerDiscreteScheduler"
        want = torch.tensor(doc["student_sigmas"], dtype=torch.float32)
        assert torch.equal(pipe.scheduler.sigmas, torch.cat([want, torch.zeros(1)]))


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_full_student_exports_to_the_family_pipeline(family, teachers, tiny_data, tiny_prompt_set,
                                                     tmp_path_factory):
    run = _run(tmp_path_factory, family, "full", teachers, tiny_data, tiny_prompt_set)
    out = _export(run, "diffusers")
    doc = _check_doc(out, family, "diffusers")
    assert doc["weights"] == "ema" and doc["student"] == "full"
    assert not [p for p in out.rglob("*") if p.suffix in (".bin", ".ckpt", ".pt", ".pth")]  # safetensors only
    index = json.loads((out / "model_index.json").read_text())
    assert index["_class_name"] == CLASSES[family]
    if family == "sd3":
        assert index["text_encoder_3"] == [None, None] and index["tokenizer_3"] == [None, None]
    pipe = _load(family, out)
    _check_scheduler(pipe, family, doc)
    # the same latents, re-noising draws and arithmetic as the engine's render: the same pixels
    _check_against_samples(out, run, family, tol=1)
    # the student's model as one file in diffusers' names, with the keys ComfyUI's Load Diffusion Model
    # detects each family by (comfy/model_detection.py: conv_in.weight for a UNet, x_embedder.weight
    # for Flux, transformer_blocks.0.attn.add_q_proj.weight for SD3): base pipeline + load_state_dict
    one = _export(run, "single-file")
    doc = _check_doc(one, family, "single-file")
    from safetensors import safe_open

    with safe_open(str(one / doc["lora_weight_name"]), "pt") as f:
        keys = set(f.keys())
    assert keys == set(pipe.unet.state_dict() if family == "sdxl" else pipe.transformer.state_dict())
    assert {"sdxl": "conv_in.weight", "sd3": "transformer_blocks.0.attn.add_q_proj.weight",
            "flux": "x_embedder.weight"}[family] in keys
    _check_against_samples(one, run, family, tol=1)


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_lora_student_exports_as_lora_and_as_fused_pipeline(family, teachers, tiny_data, tiny_prompt_set,
                                                            tmp_path_factory):
    run = _run(tmp_path_factory, family, "lora", teachers, tiny_data, tiny_prompt_set)
    assert "one frozen base" in (run / "logs" / "engine.log").read_text()  # shared by default: what is exported
    lora_out, fused_out = _export(run, "lora"), _export(run, "diffusers")
    doc = _check_doc(lora_out, family, "lora")
    _check_doc(fused_out, family, "diffusers")
    assert (lora_out / "pytorch_lora_weights.safetensors").is_file() and (lora_out / "scheduler").is_dir()

    fused = _load(family, fused_out)
    den = "unet" if family == "sdxl" else "transformer"
    assert not any("lora" in k for k in getattr(fused, den).state_dict())

    # the teacher + the LoRA file + the exported scheduler, as README.md says: the adapter is
    # loaded (denoiser outputs change) and the first prompt renders as the engine's sample
    teacher = _load(family, teachers[family])
    base = {k: v.clone() for k, v in getattr(teacher, den).state_dict().items()}
    got, pipe = _readme_image(lora_out)
    lora_keys = [k for k in getattr(pipe, den).state_dict() if "lora" in k]
    assert lora_keys, "load_lora_weights put no adapter on the teacher"
    assert all(torch.equal(base[k], v) for k, v in getattr(pipe, den).state_dict().items() if k in base)
    # the trained adapter is in the fused weights (W + s B A differs from the teacher's W)
    moved = max((v - base[k]).abs().max().item() for k, v in getattr(fused, den).state_dict().items())
    assert moved > 1e-5, moved
    _check_scheduler(pipe, family, doc)
    # fused weights (W + sBA) and diffusers' re-created adapter round differently from the
    # engine's adapter, so a pixel may land a code value off
    _check_against_samples(lora_out, run, family, tol=2)
    _check_against_samples(fused_out, run, family, tol=2)
    _check_single_file(run, lora_out, family, getattr(teacher, den))


def _check_single_file(run: Path, lora_out: Path, family: str, teacher_denoiser) -> None:
    """--format lora-single-file: SDXL in kohya's layout (names ComfyUI maps), SD3 and Flux in
    diffusers' transformer.* layout (the names of the diffusers-format file, which ComfyUI maps for
    those models) with the scale in the B weights; the README's lines load it and render the run's
    sample; the metadata names the family and steps."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    from tests.e2e.test_export import comfyui_unet_lora_names

    out = _export(run, "lora-single-file")
    doc = _check_doc(out, family, "lora-single-file")
    name = doc["lora_weight_name"]
    assert name == f"{run.name}-iter_2-2step.safetensors" and (out / "scheduler").is_dir()
    tensors = load_file(str(out / name))
    with safe_open(str(out / name), "pt") as f:
        meta = f.metadata()
    assert (meta["dmad_family"], meta["dmad_student_steps"], meta["ss_network_dim"]) == (family, "2", "4")
    diffusers_format = load_file(str(lora_out / "pytorch_lora_weights.safetensors"))
    ff = any(".ff." in k or "proj_mlp" in k for k in diffusers_format)
    assert ff == (LORA_TARGETS[family] == "attention+ff")
    assert ff == any("_ff_net_" in k or ".ff.net." in k for k in tensors)  # kohya's names, or diffusers'
    if family == "flux":
        assert any(".single_transformer_blocks." in k and "proj_mlp" in k for k in tensors)
    if family == "sdxl":
        modules = {k.split(".")[0] for k in tensors}
        assert modules <= comfyui_unet_lora_names(teacher_denoiser)
        assert len(tensors) == 3 * len(modules) and len(modules) * 2 == len(diffusers_format)
    else:
        assert set(tensors) == set(diffusers_format)  # transformer.<path>.lora_A / lora_B.weight
        comfy = {"transformer." + k[:-len(".weight")] for k in teacher_denoiser.state_dict() if k.endswith(".weight")}
        assert {k.rsplit(".", 2)[0] for k in tensors} <= comfy  # comfy/lora.py maps "transformer.<key>"
        b = next(k for k in tensors if k.endswith("lora_B.weight"))
        assert torch.allclose(tensors[b], diffusers_format[b] * 2.0)  # alpha / r = 8 / 4, in the weights
    assert "models/loras" in (out / "README.md").read_text()
    _check_against_samples(out, run, family, tol=2)


@pytest.mark.parametrize("config", [{"shift": 3.0}, {"use_dynamic_shifting": True, "base_shift": 0.5,
                                                     "max_shift": 1.15, "shift": 1.0}])
def test_flow_scheduler_is_the_student_sampler(config):
    """The exported flow scheduler, given the usage lines' sigmas, steps through exactly the
    engine's sigmas (no second shift) and its loop with the generator equals dmad's sampler bit for
    bit (without training), for a fixed shift (SD3) and Flux's dynamic shift."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    from dmad.contract.config import Distillation
    from dmad.sample.export import check_flow_scheduler_matches, flow_student_scheduler, student_sigmas
    from dmad.methods.dmd2 import sample_student
    from dmad.models.families import make_family

    teacher_sched = FlowMatchEulerDiscreteScheduler(**config)
    schedule = make_family("flux" if config.get("use_dynamic_shifting") else "sd3", vae_factor=8).schedule(
        teacher_sched, 512)
    assert schedule.shift != 1.0  # the engine's sigmas are shifted: a second shift would change them
    model = lambda x, t: torch.tanh(x * 0.7 + t.float().view(-1, 1, 1, 1) / 1000)  # noqa: E731 - any fixed function
    for n in (1, 2, 3, 4):
        ts = Distillation(student_steps=n).resolved_student_timesteps()
        sched = flow_student_scheduler(teacher_sched.config)
        check_flow_scheduler_matches(sched, schedule, ts)
        sched.set_timesteps(sigmas=student_sigmas(schedule, ts), mu=0.0)

        gen = torch.Generator("cpu").manual_seed(n)
        noise = torch.randn((1, 4, 8, 8), generator=gen)
        want = sample_student(lambda x, t: schedule.to_x0(x, model(x, schedule.sigma_of(t) * 1000), t), noise, ts,
                              schedule, gen)
        gen = torch.Generator("cpu").manual_seed(n)
        x = torch.randn((1, 4, 8, 8), generator=gen)
        for t in sched.timesteps:
            x = sched.step(model(x, t.view(1)), t, x, generator=gen, return_dict=False)[0]
        assert torch.equal(x, want), (n, (x - want).abs().max().item())


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_lora_lora_runs_on_a_teacher_with_a_user_lora(family, teachers, tiny_data, tiny_prompt_set, tmp_path_factory,
                                                      capsys):
    """Issue 40 on the larger families: a LoRA student and LoRA fake score on one shared frozen base
    that is base + the user's LoRA (fused at load): the run records the LoRA, the ledger counts it,
    and the exported student LoRA, loaded on top of the user's LoRA as the README says, renders the
    run's sample."""
    from dmad.testing.tiny import make_tiny_lora
    from tests.conftest import dmad_captured

    root = tmp_path_factory.mktemp(f"user_lora_{family}")
    layout = "kohya" if family == "sdxl" else "diffusers"
    user = make_tiny_lora(teachers[family], root / ("style.safetensors" if layout == "kohya" else "style"), layout,
                          text_encoder=family == "sdxl", strength=0.2)
    extra = json.loads(json.dumps(LORA))
    extra["identity"]["teacher_loras"] = [{"path": str(user), "scale": 0.7}]
    run = _train(root, f"{family}-user-lora", extra, teachers[family], tiny_data, tiny_prompt_set)
    assert "one frozen base" in (run / "logs" / "engine.log").read_text()
    meta = json.loads((run / "samples" / "iter_2" / "meta.json").read_text())
    recorded = [(Path(x["path"]), x["scale"]) for x in meta["teacher_loras"]]  # a folder: its weights file
    assert recorded == [(user if user.is_file() else user / "pytorch_lora_weights.safetensors", 0.7)]
    code, out, err = dmad_captured(capsys, "train", "--config", str(run / "config.json"), "--run-dir",
                                   str(root / "dry"), "--dry-run")
    assert code == 0, err[-2000:]
    assert "teacher LoRAs (1, fused at load" in out
    lora_out = _export(run, "lora")
    readme = (lora_out / "README.md").read_text()
    assert "adapter_name='user_0'" in readme and "set_adapters(['user_0', 'student']" in readme
    _check_against_samples(lora_out, run, family, tol=2)
