"""The model-family registry against diffusers itself: the engine's guided x0 of each family equals
what the family's own pipeline computes, so the timestep convention, micro-conditioning, latent
packing, pooled embeddings, unconditional embedding and guidance rule are the pipeline's."""
from __future__ import annotations

import copy
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from dmad.methods.dmd2 import GanHead  # noqa: E402
from dmad.methods.prediction import FlowSchedule  # noqa: E402
from dmad.models.families import FAMILIES, Cond, make_family  # noqa: E402
from dmad.models.teacher import inspect_teacher, load_teacher  # noqa: E402
from dmad.testing.tiny import make_tiny_flux_pipeline, make_tiny_sd3_pipeline, make_tiny_sdxl_pipeline  # noqa: E402

BUILDERS = {
    "sdxl": lambda p: make_tiny_sdxl_pipeline(p),
    "sdxl_v": lambda p: make_tiny_sdxl_pipeline(p, prediction_type="v_prediction", seed=1),
    "sd3": lambda p: make_tiny_sd3_pipeline(p),
    "sd3_t5": lambda p: make_tiny_sd3_pipeline(p, with_t5=True),
    "flux": lambda p: make_tiny_flux_pipeline(p),
    "flux_cfg": lambda p: make_tiny_flux_pipeline(p, guidance_embeds=False),
}


@pytest.fixture(scope="module")
def teachers(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("families")
    out = {}
    for name, build in BUILDERS.items():
        build(root / name)
        out[name] = root / name
    return out


@pytest.mark.parametrize("name, family, prediction", [
    ("sdxl", "sdxl", "epsilon"), ("sdxl_v", "sdxl", "v_prediction"), ("sd3", "sd3", "flow"),
    ("sd3_t5", "sd3", "flow"), ("flux", "flux", "flow"), ("flux_cfg", "flux", "flow")])
def test_inspect_reads_family_without_weights(teachers, name, family, prediction):
    info = inspect_teacher(str(teachers[name]))
    assert (info.family, info.prediction_type) == (family, prediction)
    assert info.has_weights and info.denoiser == FAMILIES[family].denoiser_name
    t = load_teacher(str(teachers[name]))
    assert sum(p.numel() for p in t.denoiser.parameters()) == info.denoiser_params
    assert info.frozen_params == sum(sum(p.numel() for p in m.parameters()) for m in t.networks()
                                     if m is not t.denoiser)
    assert t.text_encoder_3 is (None if name == "sd3" else t.text_encoder_3)


def test_model_family_mismatch_is_one_line(teachers):
    from dmad.errors import UserInputError

    with pytest.raises(UserInputError, match="model_family is 'sdxl' but the teacher is flux"):
        inspect_teacher(str(teachers["flux"]), model_family="sdxl")


def test_flow_schedule_matches_diffusers_sigmas():
    """FlowSchedule's s_t at t = 999, 749, ... are diffusers' shifted sigmas at timesteps 1000, 750, ..."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    for shift in (1.0, 3.0):
        sched = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=shift)
        fs = FlowSchedule(1000, shift)
        # the scheduler's full table runs from timestep 1000 (index 0) down to 1
        torch.testing.assert_close(fs.sigmas.flip(0), sched.sigmas.float(), rtol=0, atol=1e-6)
    fs = FlowSchedule(1000, 3.0)
    t = torch.tensor([999, 500, 0])
    x0, eps = torch.randn(3, 4, 2, 2), torch.randn(3, 4, 2, 2)
    x_t = fs.add_noise(x0, eps, t)
    torch.testing.assert_close(fs.to_x0(x_t, fs.target(x0, eps, t), t), x0, atol=1e-5, rtol=0)
    assert float(fs.sigma_of(torch.tensor([999]))) == 1.0  # the first student step is pure noise


def _pipeline_one_step_x0(t, prompt: str, scale: float, noise: torch.Tensor):
    """One sampler step of the family's own pipeline from pure noise, whose result is the guided x0
    prediction: flow Euler from sigma 1 to 0 (x - 1 * v), or DDIM 'trailing' from t = 999 to
    alpha 1 (x0)."""
    from diffusers import DDIMScheduler, FlowMatchEulerDiscreteScheduler

    fam = t.family
    if fam.flow:
        sched = FlowMatchEulerDiscreteScheduler.from_config(t.scheduler.config)
    else:
        sched = DDIMScheduler.from_config(t.scheduler.config, timestep_spacing="trailing", set_alpha_to_one=True,
                                          clip_sample=False)
    pipe = fam.pipeline(t.modules, sched)
    h, w = noise.shape[-2] * fam.vae_factor, noise.shape[-1] * fam.vae_factor
    kwargs = fam.pipe_call_kwargs(scale, t.denoiser)
    out = pipe(prompt, latents=fam.pipe_latents(noise), num_inference_steps=1, height=h, width=w,
               output_type="latent", **kwargs).images
    return fam.unpack_pipe_latents(out, *noise.shape[-2:])


@pytest.mark.parametrize("name", ["sdxl", "sdxl_v", "sd3", "sd3_t5", "flux", "flux_cfg"])
def test_guided_x0_equals_the_pipeline(teachers, name):
    t = load_teacher(str(teachers[name]))
    fam = t.family
    schedule = fam.schedule(t.scheduler, resolution=32)
    gen = torch.Generator().manual_seed(0)
    noise = torch.randn(1, t.info.latent_channels, 16, 16, generator=gen)
    prompt, scale = "a red square on a black background", 3.0
    with torch.no_grad():
        cond = fam.encode(t.modules, [prompt], "cpu")
        uncond = None if fam.guidance_embedded(t.denoiser) else fam.uncond(t.modules, "cpu")
        ours = fam.guided_x0(t.denoiser, noise, torch.tensor([999]), cond, uncond, scale, schedule)
        if name.startswith("flux"):  # dynamic shifting: Flux's shift at 32 px; s = 1 whatever the shift
            assert float(schedule.sigma_of(torch.tensor([999]))) == pytest.approx(1.0)
        theirs = _pipeline_one_step_x0(t, prompt, scale, noise)
    torch.testing.assert_close(ours, theirs.float(), atol=2e-5, rtol=1e-4)
    if not fam.guidance_embedded(t.denoiser):  # guidance changes the answer (the check above is not vacuous)
        plain = fam.x0(t.denoiser, noise, torch.tensor([999]), cond, schedule)
        assert (plain - ours).abs().max() > 1e-4


@pytest.mark.parametrize("name", ["sdxl", "sd3", "flux"])
def test_feature_tap_and_gan_head_backpropagate(teachers, name):
    """The GAN head reads the family's features ((B, C, h, w): UNet mid block, or the middle joint
    block's image tokens on the patch grid) and its loss reaches the network's input."""
    t = load_teacher(str(teachers[name]))
    fam = t.family
    net = copy.deepcopy(t.denoiser).requires_grad_(True)
    tap = fam.tap(net)
    schedule = fam.schedule(t.scheduler, resolution=32)
    x = torch.randn(2, t.info.latent_channels, 16, 12, requires_grad=True)  # not square: the grid's order matters
    cond = fam.encode(t.modules, ["a", "b"], "cpu")
    fam.predict(net, x, torch.tensor([500, 20]), cond, schedule)
    feats = tap.features
    assert feats.shape[:2] == (2, fam.feature_channels(net)) and feats.ndim == 4
    if name != "sdxl":
        assert feats.shape[2:] == fam.token_grid(net, x)
    head = GanHead(fam.feature_channels(net), hidden=16)
    head(feats).sum().backward()
    assert x.grad is not None and x.grad.abs().sum() > 0
    # a call outside Family.predict (a pipeline's) leaves the tap alone
    tap.features = None
    with torch.no_grad():
        fam.predict(net, x.detach(), torch.tensor([1, 1]), cond, schedule)
    assert tap.features is not None
    tap.remove()


def test_flux_packing_round_trip():
    fam = make_family("flux", vae_factor=8)
    x = torch.randn(2, 16, 8, 6)
    torch.testing.assert_close(fam.unpack_pipe_latents(fam.pipe_latents(x), 8, 6), x, rtol=0, atol=0)


def test_flux_dynamic_shift_follows_resolution(teachers):
    t = load_teacher(str(teachers["flux"]))
    s_small = t.family.schedule(t.scheduler, resolution=32).shift
    s_big = t.family.schedule(t.scheduler, resolution=2048).shift
    # exp(mu): mu = 0.5 at 256 image tokens and 1.15 at 4096, linear in the token count
    assert s_big > s_small
    fam = make_family("flux", vae_factor=8)
    assert fam.schedule(t.scheduler, resolution=256).shift == pytest.approx(2.718281828 ** 0.5, rel=1e-6)
    assert fam.schedule(t.scheduler, resolution=1024).shift == pytest.approx(2.718281828 ** 1.15, rel=1e-6)


def test_cond_helpers():
    c = Cond(emb=torch.randn(1, 3, 4), pooled=torch.randn(1, 5))
    both = Cond.cat([c.expand(2), c.expand(2)])
    assert both.batch == 4 and both["pooled"].shape == (4, 5)
    items = [both.item(j) for j in range(4)]
    assert Cond.stack(items)["emb"].shape == (4, 3, 4)
    assert c.to(dtype=torch.bfloat16)["emb"].dtype == torch.bfloat16


@pytest.mark.parametrize("name", ["sdxl", "flux"])
def test_lora_copy_holds_its_frozen_base_in_the_autocast_dtype(teachers, name):
    """Under mixed precision a LoRA student / fake score keeps only its adapter in fp32 (master
    weights); the frozen base copy is bf16, half the memory, and still runs under autocast."""
    from dmad.methods.dmd2 import make_networks
    from dmad.models.networks import TeacherCopies, trainable_parameters

    t = load_teacher(str(teachers[name]))
    copies = TeacherCopies(t.denoiser, lora_rank=4, lora_alpha=None, gradient_checkpointing=False, family=t.family,
                           base_dtype=torch.bfloat16)
    nets = make_networks(copies, student="lora", fake_score="lora", gan_on_teacher=False, ema_decay=None)
    for net in (nets.student, nets.fake_score):
        trainable = {id(p) for p in trainable_parameters(net)}
        assert trainable and all(p.dtype == torch.float32 for p in trainable_parameters(net))
        frozen = [p for p in net.parameters() if id(p) not in trainable]
        assert frozen and all(p.dtype == torch.bfloat16 for p in frozen)
    schedule = t.family.schedule(t.scheduler, resolution=32)
    cond = t.family.encode(t.modules, ["a"], "cpu")
    x = torch.randn(1, t.info.latent_channels, 16, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = t.family.x0(nets.student, x, torch.tensor([500]), cond, schedule)
    out.float().pow(2).mean().backward()
    assert all(p.grad is not None for p in trainable_parameters(nets.student))
    full = make_networks(copies, student="full", fake_score="lora", gan_on_teacher=False, ema_decay=None)
    assert all(p.dtype == torch.float32 for p in full.student.parameters())  # a full copy trains every weight


@pytest.mark.parametrize("name", ["sdxl", "sd3", "flux"])
def test_lora_targets_attention_ff_adapts_each_familys_feed_forward(teachers, name):
    """identity.lora_targets attention+ff: the student's and fake score's LoRA adapters sit on the
    attention projections and on every feed-forward linear of the family (Flux: the single
    blocks' MLP input too, never the final proj_out), in a separate copy and on the shared base
    alike; the adapter's size is what the ledger counts (TeacherInfo.for_lora_targets)."""
    from dmad.methods.dmd2 import make_networks
    from dmad.models.networks import TeacherCopies, trainable_parameters

    t = load_teacher(str(teachers[name]))
    ff_names = [n for n, m in t.denoiser.named_modules() if isinstance(m, torch.nn.Linear)
                and any(n.endswith("." + x) for x in t.family.ff_lora_targets)]
    assert ff_names and (name != "flux" or any(n.endswith("proj_mlp") for n in ff_names))
    for scope in ("attention", "attention+ff"):
        targets = t.family.lora_modules(scope)
        for shared in (False, True):
            t = load_teacher(str(teachers[name]))
            copies = TeacherCopies(t.denoiser, lora_rank=4, lora_alpha=None, gradient_checkpointing=False,
                                   family=t.family, share_frozen_base=shared, lora_targets=targets)
            nets = make_networks(copies, student="lora", fake_score="lora", gan_on_teacher=False, ema_decay=None)
            n_trained = sum(p.numel() for p in trainable_parameters(nets.student))
            assert n_trained == 4 * t.info.for_lora_targets(scope).unet_lora_params_per_rank
            assert n_trained == 4 * t.info.lora_params_per_rank(scope)
            adapted = {n.split(".lora_A")[0] for n, _ in nets.student.named_parameters() if ".lora_A." in n}
            adapted = {n.removeprefix("base_network.") for n in adapted}
            assert ("proj_out" not in adapted) and all(not n.endswith("proj_out") or "single" in n for n in adapted)
            on_ff = {n for n in ff_names if any(a.endswith(n) for a in adapted)}
            assert on_ff == (set(ff_names) if scope == "attention+ff" else set())
    assert t.info.ff_lora_params_per_rank > 0


@pytest.mark.parametrize("fmt, bound", [("int8", 0.015), ("fp8", 0.08)])
def test_weight_only_quantisation(fmt, bound):
    """int8 / fp8 storage of linear weights: 1 byte each, close outputs, dtype casts leave the
    stored format alone; the other layers go to bf16."""
    from dmad.models.quant import WeightOnlyLinear, linear_params, quantize_linears

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU(), torch.nn.LayerNorm(64), torch.nn.Linear(64, 8))
    x = torch.randn(16, 64)
    ref = net(x)
    n = linear_params(net)
    assert quantize_linears(net, fmt) == n == 64 * 64 + 64 * 8
    net.float()  # a cast must not undo the storage format
    q = [m for m in net.modules() if isinstance(m, WeightOnlyLinear)]
    assert len(q) == 2 and all(m.qweight.element_size() == 1 and m.scale.dtype == torch.float32 for m in q)
    assert q[0].qweight.dtype == (torch.int8 if fmt == "int8" else torch.float8_e4m3fn)
    assert net[2].weight.dtype == torch.float32  # .float() applies to the other layers as usual
    out = net(x)
    assert out.dtype == torch.float32
    rel = ((out - ref).abs().max() / ref.abs().max()).item()
    assert rel < bound, rel
    assert not any(p.requires_grad for p in net.parameters())


@pytest.fixture(scope="module")
def sdxl_single_file(tmp_path_factory) -> tuple[Path, Path]:
    """A tiny SDXL as one original-layout file (sd_xl_base_1.0.safetensors' keys) and its config
    folder. The two text encoders differ in width, as CLIP-L and OpenCLIP-bigG do (diffusers tells
    them apart by it)."""
    import sys

    from safetensors.torch import save_file

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from ldm_keys import sdxl_pipeline_to_ldm

    root = tmp_path_factory.mktemp("sdxl_single")
    pipe = make_tiny_sdxl_pipeline(root / "configs", text_dim_2=48)
    f = root / "tiny_sdxl.safetensors"
    state = sdxl_pipeline_to_ldm(pipe.unet, pipe.vae, pipe.text_encoder, pipe.text_encoder_2)
    save_file({k: v.contiguous() for k, v in state.items()}, str(f))
    return f, root / "configs"


def test_sdxl_single_file_loads_the_same_weights(sdxl_single_file, teachers):
    from dmad.errors import UserInputError

    f, configs = sdxl_single_file
    info = inspect_teacher(str(f), teacher_config_dir=str(configs))
    assert (info.kind, info.family, info.has_weights) == ("single_file", "sdxl", True)
    single, folder = load_teacher(str(f), teacher_config_dir=str(configs)), load_teacher(str(configs))
    for c in ("unet", "vae", "text_encoder", "text_encoder_2"):
        a, b = getattr(single, c).state_dict(), getattr(folder, c).state_dict()
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in b), c
    # configs of another model: named before any weight is read
    with pytest.raises(UserInputError, match="second text encoder width is 48 in the file but 32 in "
                                             "teacher_config_dir") as e:
        inspect_teacher(str(f), teacher_config_dir=str(teachers["sdxl"]))
    assert "\n" not in str(e.value)


def test_single_file_of_a_transformer_family_is_refused(teachers, tmp_path):
    from safetensors.torch import save_file

    from dmad.errors import UserInputError

    f = tmp_path / "sd3.safetensors"
    save_file({"model.diffusion_model.pos_embed": torch.zeros(2, 2)}, str(f))
    with pytest.raises(UserInputError, match="a single-file sd3 teacher is not supported; give its diffusers "
                                             "pipeline folder") as e:
        inspect_teacher(str(f), teacher_config_dir=str(teachers["sd3"]))
    assert "\n" not in str(e.value)


def test_offload_moves_a_network_up_for_its_call_and_back(monkeypatch):
    """teacher_cpu_offload: forward hooks put the network on the device for its own call only.
    (A CPU machine has one device, so the moves are recorded rather than observed.)"""
    from dmad.train.build import offload_between_calls

    net = torch.nn.Linear(4, 4)
    moves: list = []
    real_to = torch.nn.Module.to

    def to(self, *args, **kwargs):
        moves.append(args[0] if args else kwargs.get("device"))
        return real_to(self, "cpu")

    monkeypatch.setattr(torch.nn.Linear, "to", to)
    offload_between_calls(net, torch.device("cuda", 0))
    net(torch.randn(1, 4))
    net(torch.randn(1, 4))
    assert moves == [torch.device("cuda", 0), "cpu"] * 2
