"""Teacher inspection and loading on tiny random SD pipelines (CPU, a few seconds)."""
from __future__ import annotations

import json
import shutil
import socket
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from dmad.errors import UserInputError
from dmad.models.teacher import inspect_teacher, load_teacher
from dmad.models.teacher_files import encode_prompts
from dmad.testing.tiny import make_tiny_sd_pipeline

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ldm_keys import pipeline_to_ldm  # noqa: E402


@pytest.fixture(scope="module")
def eps_teacher(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("teacher") / "tiny-eps"
    make_tiny_sd_pipeline(path, prediction_type="epsilon")
    return path


@pytest.fixture(scope="module")
def v_teacher(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("teacher") / "tiny-v"
    make_tiny_sd_pipeline(path, prediction_type="v_prediction", seed=1)
    return path


@pytest.fixture(scope="module")
def ldm_file(eps_teacher, tmp_path_factory) -> Path:
    """The eps teacher as one original-layout (LDM/CompVis) .safetensors file."""
    t = load_teacher(str(eps_teacher))
    path = tmp_path_factory.mktemp("single") / "tiny-ldm.safetensors"
    save_file({k: v.contiguous() for k, v in pipeline_to_ldm(t.unet, t.vae, t.text_encoder).items()}, str(path))
    return path


def copy_teacher(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def edit_json(f: Path, **changes) -> None:
    f.write_text(json.dumps({**json.loads(f.read_text()), **changes}))


def expect_error(match: str, fn, *args, **kwargs) -> str:
    with pytest.raises(UserInputError, match=match) as e:
        fn(*args, **kwargs)
    msg = str(e.value)
    assert "\n" not in msg, msg
    return msg


def n_params(module) -> int:
    return sum(p.numel() for p in module.parameters())


# --------------------------------------------------------------------------- folders

def test_folder_load_eps(eps_teacher):
    t = load_teacher(str(eps_teacher))
    info = t.info
    assert (info.family, info.prediction_type, info.kind) == ("sd1", "epsilon", "folder")
    assert info.param_counts == {"unet": n_params(t.unet), "vae": n_params(t.vae),
                                 "text_encoder": n_params(t.text_encoder)}
    assert info.weights_present == {"unet": True, "vae": True, "text_encoder": True} and info.has_weights
    assert info.weights_dtype["unet"] == "float32"
    assert (info.sample_size, info.vae_scale_factor, info.latent_channels) == (16, 2, 4)
    assert (info.bottleneck_channels, info.text_hidden_size) == (64, 32)
    stored = load_file(str(eps_teacher / "unet" / "diffusion_pytorch_model.safetensors"))
    assert all(torch.equal(v, stored[k]) for k, v in t.unet.state_dict().items())
    for m in (t.unet, t.vae, t.text_encoder):
        assert not m.training and not any(p.requires_grad for p in m.parameters())
    assert type(t.scheduler).__name__ == "DDPMScheduler"
    assert t.scheduler.config.prediction_type == "epsilon" and t.scheduler.config.clip_sample is False


def test_lora_params_per_rank_match_peft(eps_teacher):
    from diffusers import UNet2DConditionModel
    from peft import LoraConfig

    info = inspect_teacher(str(eps_teacher))
    unet = UNet2DConditionModel.from_pretrained(str(eps_teacher), subfolder="unet", local_files_only=True)
    unet.add_adapter(LoraConfig(r=4, target_modules=["to_q", "to_k", "to_v", "to_out.0"]))
    adapter = sum(p.numel() for n, p in unet.named_parameters() if "lora_" in n)
    assert adapter == 4 * info.unet_lora_params_per_rank


def test_v_prediction_is_sd2(v_teacher):
    t = load_teacher(str(v_teacher), model_family="sd2", dtype=torch.float16)
    assert (t.info.family, t.info.prediction_type) == ("sd2", "v_prediction")
    assert t.scheduler.config.prediction_type == "v_prediction"
    assert next(t.unet.parameters()).dtype == torch.float16
    msg = expect_error("model_family is 'sd1' but the teacher is sd2", inspect_teacher, str(v_teacher), "sd1")
    assert str(v_teacher) in msg


def test_encode_prompts_matches_pipeline(eps_teacher):
    from diffusers import StableDiffusionPipeline

    t = load_teacher(str(eps_teacher))
    prompts = ["a red square", "a very long prompt " * 10]
    emb = encode_prompts(t.tokenizer, t.text_encoder, prompts, "cpu")
    assert emb.shape == (2, t.tokenizer.model_max_length, t.info.text_hidden_size)
    pipe = StableDiffusionPipeline(unet=t.unet, vae=t.vae, text_encoder=t.text_encoder, tokenizer=t.tokenizer,
                                   scheduler=t.scheduler, safety_checker=None, feature_extractor=None,
                                   requires_safety_checker=False)
    ref, _ = pipe.encode_prompt(prompts, "cpu", 1, False)
    assert torch.equal(emb, ref)


def test_missing_weights_inspect_still_works(eps_teacher, tmp_path):
    p = copy_teacher(eps_teacher, tmp_path / "no-unet-weights")
    (p / "unet" / "diffusion_pytorch_model.safetensors").unlink()
    info = inspect_teacher(str(p))
    assert info.weights_present == {"unet": False, "vae": True, "text_encoder": True} and not info.has_weights
    assert info.param_counts["unet"] > 0 and info.weights_dtype["unet"] is None
    msg = expect_error("teacher has no weights", load_teacher, str(p))
    assert str(p / "unet" / "diffusion_pytorch_model.safetensors") in msg


def test_pickle_only_component_is_refused(eps_teacher, tmp_path):
    p = copy_teacher(eps_teacher, tmp_path / "pickled")
    (p / "vae" / "diffusion_pytorch_model.safetensors").rename(p / "vae" / "diffusion_pytorch_model.bin")
    assert not inspect_teacher(str(p)).weights_present["vae"]
    msg = expect_error("pickle checkpoints are never loaded", load_teacher, str(p))
    assert str(p / "vae") in msg


def test_fp16_variant_is_found(eps_teacher, tmp_path):
    p = copy_teacher(eps_teacher, tmp_path / "variant")
    (p / "unet" / "diffusion_pytorch_model.safetensors").rename(p / "unet" / "diffusion_pytorch_model.fp16.safetensors")
    t = load_teacher(str(p))
    assert t.info.weights_files["unet"][0].endswith("diffusion_pytorch_model.fp16.safetensors")
    assert n_params(t.unet) == t.info.param_counts["unet"]


# --------------------------------------------------------------------------- error cases

def _no_index(p: Path) -> None:
    (p / "model_index.json").unlink()


def _sdxl(p: Path) -> None:
    edit_json(p / "model_index.json", _class_name="StableDiffusionXLPipeline")


def _kandinsky(p: Path) -> None:
    edit_json(p / "model_index.json", _class_name="KandinskyPipeline")


def _no_vae_folder(p: Path) -> None:
    shutil.rmtree(p / "vae")


def _no_unet_config(p: Path) -> None:
    (p / "unet" / "config.json").unlink()


def _bad_json(p: Path) -> None:
    (p / "text_encoder" / "config.json").write_text("{not json")


def _corrupt_weights(p: Path) -> None:
    (p / "unet" / "diffusion_pytorch_model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00garbage!")


def _truncated_weights(p: Path) -> None:
    f = p / "text_encoder" / "model.safetensors"
    f.write_bytes(f.read_bytes()[:-100])


def _inpainting_unet(p: Path) -> None:
    edit_json(p / "unet" / "config.json", in_channels=9)


@pytest.mark.parametrize("damage, match, where", [
    (_no_index, "not a diffusers pipeline folder \\(no model_index.json\\)", ""),
    (_kandinsky, "unsupported model family \\(KandinskyPipeline\\).*StableDiffusionXLPipeline", "model_index.json"),
    (_sdxl, "component 'text_encoder_2' is null; a StableDiffusionXLPipeline needs it", "model_index.json"),
    (_no_vae_folder, "component folder 'vae/' is missing", ""),
    (_no_unet_config, "missing \\(unet config\\)", "unet/config.json"),
    (_bad_json, "invalid JSON", "text_encoder/config.json"),
    (_corrupt_weights, "not a readable .safetensors file", "unet/diffusion_pytorch_model.safetensors"),
    (_truncated_weights, "truncated .safetensors file", "text_encoder/model.safetensors"),
    (_inpainting_unet, "inpainting, depth and upscaling models are not supported", "unet"),
])
def test_folder_errors(eps_teacher, tmp_path, damage, match, where):
    p = copy_teacher(eps_teacher, tmp_path / "damaged")
    damage(p)
    msg = expect_error(match, inspect_teacher, str(p))
    assert str(p / where).rstrip("/") in msg
    expect_error(match, load_teacher, str(p))


def test_missing_path(tmp_path):
    msg = expect_error("teacher not found", inspect_teacher, str(tmp_path / "nowhere"))
    assert str(tmp_path / "nowhere") in msg


@pytest.mark.parametrize("suffix", [".ckpt", ".pt", ".pth", ".bin"])
def test_pickle_files_are_refused(tmp_path, suffix):
    f = tmp_path / f"model{suffix}"
    f.write_bytes(b"\x80\x04not really a pickle")
    msg = expect_error("pickle checkpoints are never loaded; convert to .safetensors", load_teacher, str(f))
    assert str(f) in msg


def test_folder_teacher_with_config_dir_is_refused(eps_teacher):
    expect_error("only for a single-file teacher", inspect_teacher, str(eps_teacher),
                 teacher_config_dir=str(eps_teacher))


# --------------------------------------------------------------------------- single file

def test_single_file_needs_config_dir(ldm_file):
    msg = expect_error("needs teacher_config_dir", inspect_teacher, str(ldm_file))
    assert str(ldm_file) in msg
    expect_error("teacher_config_dir not found", inspect_teacher, str(ldm_file),
                 teacher_config_dir=str(ldm_file.parent / "missing"))


def test_single_file_loads_offline(eps_teacher, ldm_file, monkeypatch):
    attempts = []

    def no_network(self, address, *a, **k):
        attempts.append(address)
        raise OSError("network disabled in this test")
    monkeypatch.setattr(socket.socket, "connect", no_network)

    t = load_teacher(str(ldm_file), teacher_config_dir=str(eps_teacher))
    assert attempts == []
    ref = load_teacher(str(eps_teacher))
    assert (t.info.kind, t.info.family, t.info.config_dir) == ("single_file", "sd1", str(eps_teacher))
    assert t.info.param_counts == ref.info.param_counts
    for name in ("unet", "vae", "text_encoder"):
        got, want = getattr(t, name).state_dict(), getattr(ref, name).state_dict()
        assert got.keys() == want.keys()
        assert all(torch.equal(got[k], want[k]) for k in want), name
    assert not any(p.requires_grad for p in t.unet.parameters())


def test_single_file_missing_component(eps_teacher, ldm_file, tmp_path):
    f = tmp_path / "no-vae.safetensors"
    save_file({k: v for k, v in load_file(str(ldm_file)).items() if not k.startswith("first_stage_model.")}, str(f))
    info = inspect_teacher(str(f), teacher_config_dir=str(eps_teacher))
    assert info.weights_present == {"unet": True, "vae": False, "text_encoder": True}
    msg = expect_error("teacher has no weights", load_teacher, str(f), teacher_config_dir=str(eps_teacher))
    assert "first_stage_model." in msg and str(f) in msg


def test_single_file_incomplete_unet(eps_teacher, ldm_file, tmp_path):
    f = tmp_path / "partial.safetensors"
    save_file({k: v for k, v in load_file(str(ldm_file)).items() if k != "model.diffusion_model.out.2.weight"},
              str(f))
    msg = expect_error("weights incomplete", load_teacher, str(f), teacher_config_dir=str(eps_teacher))
    assert str(f) in msg


def test_single_file_with_other_models_configs(eps_teacher, ldm_file, tmp_path):
    cdir = copy_teacher(eps_teacher, tmp_path / "wider")
    edit_json(cdir / "unet" / "config.json", block_out_channels=[64, 64])
    msg = expect_error("UNet width is 32 in the file but 64", inspect_teacher, str(ldm_file),
                       teacher_config_dir=str(cdir))
    assert str(ldm_file) in msg


def test_single_file_corrupt(eps_teacher, tmp_path):
    f = tmp_path / "broken.safetensors"
    f.write_bytes(b"\xff" * 64)
    msg = expect_error("not a readable .safetensors file", load_teacher, str(f), teacher_config_dir=str(eps_teacher))
    assert str(f) in msg


def test_the_coverage_benchs_sde_sampler_keeps_the_flows_marginals_and_restores_the_ode():
    """bench/teacher_coverage.py --sde: Euler-Maruyama of the reverse SDE with the flow's marginals.
    On Gaussian data N(0, 0.25) with the exact velocity, it ends at the data's variance (closer
    than the 50-step ODE, whose Euler error shrinks it), and leaving the context restores the
    scheduler's own step."""
    import importlib.util
    from pathlib import Path

    import torch
    from diffusers import FlowMatchEulerDiscreteScheduler as F

    spec = importlib.util.spec_from_file_location("coverage_bench", Path(__file__).parents[2] / "bench" / "teacher_coverage.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    var0, plain = 0.25, F.step

    def final_variance(eta: float) -> float:
        with bench.flow_sde(eta):
            sched = F()
            sched.set_timesteps(50)
            x = torch.randn(100_000, generator=torch.Generator().manual_seed(1))
            for i, t in enumerate(sched.timesteps):
                s = float(sched.sigmas[i])
                x = sched.step((s - (1 - s) * var0) / ((1 - s) ** 2 * var0 + s ** 2) * x, t, x).prev_sample
        return float(x.var())

    ode, sde = final_variance(0.0), final_variance(1.0)
    assert abs(sde - var0) < 0.01 and abs(sde - var0) < abs(ode - var0)
    assert F.step is plain


def test_the_coverage_benchs_autoguidance_extrapolates_from_the_weak_model_and_restores_the_forward():
    """bench/teacher_coverage.py --autoguide: inside the context the teacher's forward returns
    weak + W (teacher - weak) on the same inputs, through the pipeline's return_dict=False call
    and the default one alike; W 1 leaves it alone; leaving restores the plain forward. With
    teacher_finetune.fresh, the weak model is a new transformer of the given depth."""
    import importlib.util
    from pathlib import Path

    import torch
    from diffusers import SD3Transformer2DModel

    def load(name: str):
        spec = importlib.util.spec_from_file_location(name, Path(__file__).parents[2] / "bench" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    coverage, finetune = load("teacher_coverage"), load("teacher_finetune")
    torch.manual_seed(0)
    den = SD3Transformer2DModel(sample_size=8, patch_size=2, in_channels=4, out_channels=4, num_layers=2,
                                attention_head_dim=8, num_attention_heads=2, joint_attention_dim=16,
                                caption_projection_dim=16, pooled_projection_dim=8, pos_embed_max_size=8).eval()
    weak = finetune.fresh(den, 1, seed=3).eval()
    assert weak.config.num_layers == 1 and len(weak.transformer_blocks) == 1
    kw = dict(hidden_states=torch.randn(2, 4, 8, 8), encoder_hidden_states=torch.randn(2, 5, 16),
              pooled_projections=torch.randn(2, 8), timestep=torch.tensor([500.0, 900.0]))
    with torch.no_grad():
        strong, poor = den(**kw, return_dict=False)[0], weak(**kw, return_dict=False)[0]
        assert not torch.allclose(strong, poor)
        with coverage.autoguide(den, weak, 1.0):
            assert torch.equal(den(**kw, return_dict=False)[0], strong)
        with coverage.autoguide(den, weak, 2.5):
            guided = den(**kw, return_dict=False)[0]
            assert torch.allclose(guided, poor + 2.5 * (strong - poor), atol=1e-6)
            assert torch.equal(den(**kw).sample, guided)
        assert "forward" not in vars(den) and torch.equal(den(**kw, return_dict=False)[0], strong)


def test_the_finetune_benchs_under_specified_noise_levels_apply_to_those_captions_only():
    """bench/teacher_finetune.py --under-logit-mean: a caption that leaves attributes out draws its
    noise level around its own mean, a full caption around the recipe's (one generator, per sample)."""
    import importlib.util
    from pathlib import Path

    import torch

    from dmad.demo.teacher_stages import logit_normal_sigmas

    spec = importlib.util.spec_from_file_location("finetune_bench", Path(__file__).parents[2] / "bench" / "teacher_finetune.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    full = ["a large red circle in the center on a black background"] * 4000
    drawn = ["a red shape" if k % 2 else full[k] for k in range(4000)]
    assert bench.noise_means(drawn, full, None) == bench.RECIPE_LOGIT_MEAN
    means = bench.noise_means(drawn, full, -2.0)
    assert means[0::2].eq(bench.RECIPE_LOGIT_MEAN).all() and means[1::2].eq(-2.0).all()
    sig = logit_normal_sigmas(4000, torch.Generator().manual_seed(0), means, 1.0)
    under, kept = torch.logit(sig[1::2]).mean().item(), torch.logit(sig[0::2]).mean().item()
    assert abs(under + 2.0) < 0.1 and abs(kept - bench.RECIPE_LOGIT_MEAN) < 0.1


def test_shape_difference_masks_mark_where_the_four_shapes_differ_and_nothing_else():
    """teacher_stages.shape_difference_masks (bench/teacher_finetune.py --difference-share): the
    latent pixels inside some of the four shapes drawn at a render's place and size but not all of
    them; the shapes' common middle and the background far from the shape are out."""
    import torch

    from dmad.demo import teacher_stages as ts
    from dmad.demo.shapes import shape_box

    attrs = [{"shape": s, "colour": "red", "size": size, "position": pos, "background": "black"}
             for s in ("circle", "diamond") for size in ("small", "large") for pos in ("center", "top left")]
    masks = ts.shape_difference_masks(attrs, 64, (32, 32))
    assert masks.shape == (len(attrs), 1, 32, 32) and masks.dtype == torch.bool
    for a, m in zip(attrs, masks[:, 0]):
        cx, cy, r = shape_box(a, 64)
        assert m.any() and not m[31, 31]  # the background far from any of these shapes
        assert not m[int(cy) // 2, int(cx) // 2]  # the middle: inside every shape
        # the square's corner is inside the square only: the shapes differ there
        assert m[int(cy - 0.9 * r) // 2, int(cx - 0.9 * r) // 2]
    # the mask depends on where and how large the shape is, never on which shape the render has
    half = len(attrs) // 2
    assert torch.equal(masks[:half], masks[half:])
