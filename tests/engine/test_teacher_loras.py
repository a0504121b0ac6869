"""identity.teacher_loras: the user's LoRAs fused into the frozen teacher when it loads, so the
teacher computes exactly what diffusers computes with the same LoRAs as adapters at the same
scales; every layout diffusers reads; one line for every bad entry."""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from dmad.errors import UserInputError  # noqa: E402
from dmad.testing.tiny import make_tiny_lora  # noqa: E402


def _entry(path, scale=1.0):
    return SimpleNamespace(path=str(path), scale=scale)


def _denoise(teacher_or_pipe, family: str, seed: int = 0):
    """The denoiser's output on fixed inputs, and the first text encoder's (what the LoRAs change)."""
    den = teacher_or_pipe.unet if family in ("sd", "sdxl") else teacher_or_pipe.transformer
    te = teacher_or_pipe.text_encoder
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 200, (2, 8), generator=g)
    with torch.no_grad():
        text = te(ids)[0]
        if family == "sd":
            out = den(torch.randn(2, 4, 8, 8, generator=g), torch.tensor([500, 500]),
                      encoder_hidden_states=torch.randn(2, 8, den.config.cross_attention_dim, generator=g)).sample
        elif family == "sdxl":
            cond = {"text_embeds": torch.randn(2, den.config.projection_class_embeddings_input_dim
                                               - 6 * den.config.addition_time_embed_dim, generator=g),
                    "time_ids": torch.tensor([[32.0, 32, 0, 0, 32, 32]] * 2)}
            out = den(torch.randn(2, 4, 8, 8, generator=g), torch.tensor([500, 500]),
                      encoder_hidden_states=torch.randn(2, 8, den.config.cross_attention_dim, generator=g),
                      added_cond_kwargs=cond).sample
        elif family == "sd3":
            c = den.config
            out = den(hidden_states=torch.randn(2, c.in_channels, 8, 8, generator=g),
                      encoder_hidden_states=torch.randn(2, 8, c.joint_attention_dim, generator=g),
                      pooled_projections=torch.randn(2, c.pooled_projection_dim, generator=g),
                      timestep=torch.tensor([500.0, 500.0])).sample
        else:  # flux
            c = den.config
            kw = {"guidance": torch.tensor([3.5, 3.5])} if c.guidance_embeds else {}
            out = den(hidden_states=torch.randn(2, 16, c.in_channels, generator=g),
                      encoder_hidden_states=torch.randn(2, 8, c.joint_attention_dim, generator=g),
                      pooled_projections=torch.randn(2, c.pooled_projection_dim, generator=g),
                      timestep=torch.tensor([0.5, 0.5]), img_ids=torch.zeros(16, 3), txt_ids=torch.zeros(8, 3),
                      **kw).sample
    return out, text


def _with_adapters(path: Path, loras: list, scales: list):
    """The same LoRAs as unfused adapters in plain diffusers: load_lora_weights + set_adapters."""
    import diffusers

    index = json.loads((path / "model_index.json").read_text())
    absent = {k: None for k in ("text_encoder_3", "tokenizer_3")
              if index["_class_name"] == "StableDiffusion3Pipeline" and index.get(k, [None])[0] is None}
    pipe = getattr(diffusers, index["_class_name"]).from_pretrained(str(path), **absent)
    names = []
    for i, lora in enumerate(loras):
        lora = Path(lora)
        folder, name = (lora, "pytorch_lora_weights.safetensors") if lora.is_dir() else (lora.parent, lora.name)
        pipe.load_lora_weights(str(folder), weight_name=name, adapter_name=f"a{i}")
        names.append(f"a{i}")
    pipe.set_adapters(names, adapter_weights=scales)
    return pipe


def _no_adapter_layers(teacher) -> bool:
    from peft.tuners.tuners_utils import BaseTunerLayer

    return not any(isinstance(m, BaseTunerLayer) for net in teacher.networks() for m in net.modules())


@pytest.fixture(scope="module")
def sd_loras(tmp_path_factory, tiny_teacher):
    root = tmp_path_factory.mktemp("loras")
    return {"diffusers": make_tiny_lora(tiny_teacher, root / "style", "diffusers", seed=1),
            "kohya": make_tiny_lora(tiny_teacher, root / "style_kohya.safetensors", "kohya", seed=1),
            "second": make_tiny_lora(tiny_teacher, root / "second", "diffusers", seed=2, text_encoder=False)}


def test_a_fused_lora_computes_what_diffusers_computes_with_it_as_an_adapter(tiny_teacher, sd_loras):
    from dmad.models.teacher import load_teacher

    bare = load_teacher(str(tiny_teacher))
    fused = load_teacher(str(tiny_teacher), loras=(_entry(sd_loras["diffusers"], 0.8),))
    reference = _with_adapters(tiny_teacher, [sd_loras["diffusers"]], [0.8])
    (out_b, text_b), (out_f, text_f), (out_r, text_r) = (_denoise(m, "sd") for m in (bare, fused, reference))
    assert (out_f - out_b).abs().max() > 1e-3 and (text_f - text_b).abs().max() > 1e-3  # it does change the teacher
    assert torch.allclose(out_f, out_r, atol=1e-5) and torch.allclose(text_f, text_r, atol=1e-5)
    assert _no_adapter_layers(fused)  # fused: plain layers, nothing added per step
    assert sum(p.numel() for p in fused.unet.parameters()) == sum(p.numel() for p in bare.unet.parameters())
    assert not any(p.requires_grad for net in fused.networks() for p in net.parameters())
    (record,) = fused.loras
    f = Path(record["path"])
    assert f.name == "pytorch_lora_weights.safetensors" and record["scale"] == 0.8
    import hashlib

    assert record["sha256"] == hashlib.sha256(f.read_bytes()).hexdigest()
    assert set(record["layers"]) == {"unet", "text_encoder"} and all(n > 0 for n in record["layers"].values())


def test_kohya_names_load_as_the_same_lora_and_several_add_at_their_scales(tiny_teacher, sd_loras):
    from dmad.models.teacher import load_teacher

    a = load_teacher(str(tiny_teacher), loras=(_entry(sd_loras["diffusers"]),))
    b = load_teacher(str(tiny_teacher), loras=(_entry(sd_loras["kohya"]),))  # the same weights, kohya's layout
    (out_a, text_a), (out_b, text_b) = _denoise(a, "sd"), _denoise(b, "sd")
    assert torch.allclose(out_a, out_b, atol=1e-5) and torch.allclose(text_a, text_b, atol=1e-5)

    two = load_teacher(str(tiny_teacher), loras=(_entry(sd_loras["kohya"], 0.5), _entry(sd_loras["second"], -1.2)))
    reference = _with_adapters(tiny_teacher, [sd_loras["kohya"], sd_loras["second"]], [0.5, -1.2])
    (out_2, text_2), (out_r, text_r) = _denoise(two, "sd"), _denoise(reference, "sd")
    assert torch.allclose(out_2, out_r, atol=1e-5) and torch.allclose(text_2, text_r, atol=1e-5)
    assert [r["layers"].get("text_encoder", 0) > 0 for r in two.loras] == [True, False]


def test_the_lora_is_fused_in_float32_then_the_teacher_is_cast(tiny_teacher, sd_loras):
    from dmad.models.teacher import load_teacher

    fp32 = load_teacher(str(tiny_teacher), loras=(_entry(sd_loras["diffusers"]),))
    bf16 = load_teacher(str(tiny_teacher), dtype=torch.bfloat16, loras=(_entry(sd_loras["diffusers"]),))
    for name, p in fp32.unet.state_dict().items():
        q = bf16.unet.state_dict()[name]
        assert q.dtype == torch.bfloat16 and torch.equal(q, p.to(torch.bfloat16)), name  # rounded once


def test_the_text_embedding_cache_key_follows_the_lora(tiny_teacher, sd_loras):
    """The latent / text cache keys hash the fused text encoder's weights: a LoRA'd teacher never
    reads the bare teacher's cached embeddings."""
    from dmad.data.latent_cache import module_identity
    from dmad.models.teacher import load_teacher

    bare = load_teacher(str(tiny_teacher), components=("vae", "text_encoder"))
    fused = load_teacher(str(tiny_teacher), components=("vae", "text_encoder"), loras=(_entry(sd_loras["diffusers"]),))
    assert module_identity(bare.text_encoder) != module_identity(fused.text_encoder)
    assert module_identity(bare.vae) == module_identity(fused.vae)  # a LoRA leaves the VAE alone


@pytest.mark.parametrize("family", ["sdxl", "sd3", "flux"])
def test_every_family_fuses_its_lora_as_diffusers_applies_it(tmp_path, family):
    from dmad.models.teacher import load_teacher
    from dmad.testing import tiny

    path = tmp_path / family
    getattr(tiny, f"make_tiny_{family}_pipeline")(path)
    layout = "kohya" if family == "sdxl" else "diffusers"
    lora = make_tiny_lora(path, tmp_path / ("l.safetensors" if layout == "kohya" else "l"), layout, seed=3)
    kind = "sdxl" if family == "sdxl" else family
    bare = load_teacher(str(path))
    fused = load_teacher(str(path), loras=(_entry(lora, 0.7),))
    reference = _with_adapters(path, [lora], [0.7])
    (out_b, _), (out_f, text_f), (out_r, text_r) = (_denoise(m, kind) for m in (bare, fused, reference))
    assert (out_f - out_b).abs().max() > 1e-3
    assert torch.allclose(out_f, out_r, atol=1e-5) and torch.allclose(text_f, text_r, atol=1e-5)
    assert _no_adapter_layers(fused)


def test_bad_entries_get_one_line_each(tmp_path, tiny_teacher, sd_loras):
    from safetensors.torch import save_file

    from dmad.models.teacher import load_teacher
    from dmad.testing.tiny import make_tiny_sd3_pipeline, make_tiny_sd_pipeline

    (tmp_path / "empty").mkdir()
    (tmp_path / "style.ckpt").write_bytes(b"not read")
    save_file({"lora_unet_x.hada_w1_a": torch.zeros(2, 2), "lora_unet_x.hada_w1_b": torch.zeros(2, 2)},
              str(tmp_path / "loha.safetensors"))
    sd3 = tmp_path / "sd3"
    make_tiny_sd3_pipeline(sd3)
    other = make_tiny_lora(sd3, tmp_path / "sd3_lora", "diffusers", text_encoder=False)
    wider = tmp_path / "wider"  # the same layer names, another text width: the shapes do not fit
    make_tiny_sd_pipeline(wider, text_dim=48)
    misfit = make_tiny_lora(wider, tmp_path / "wider_lora", "diffusers", text_encoder=False)
    truncated = tmp_path / "cut.safetensors"
    truncated.write_bytes((Path(sd_loras["kohya"])).read_bytes()[:-100])
    cases = [(tmp_path / "nowhere.safetensors", "no such file"),
             (tmp_path / "empty", "a folder without pytorch_lora_weights.safetensors"),
             (tmp_path / "style.ckpt", "not a .safetensors file (pickle formats"),
             (truncated, "truncated .safetensors file"),
             (tmp_path / "loha.safetensors", "no LoRA layers in a layout diffusers reads"),
             (other, "match no layer of the sd1 teacher"),
             (misfit, "does not fit the sd1 teacher (")]
    for path, words in cases:
        with pytest.raises(UserInputError) as e:
            load_teacher(str(tiny_teacher), loras=(_entry(sd_loras["second"]), _entry(path)))
        message = str(e.value)
        assert message.startswith("identity.teacher_loras[1].path: ") and words in message, message
        assert "\n" not in message


def test_a_run_distils_base_plus_its_loras_and_says_so(write_config, tmp_path, tiny_teacher, sd_loras, capsys):
    """The student starts from base + LoRA (not the bare base); the config's relative LoRA path is
    relative to the config file; the teacher's images and every student image name the LoRA and its
    hash; the dry run and the ledger show it; an export of a LoRA student carries it."""
    import hashlib
    import shutil

    from safetensors.torch import load_file

    from dmad.models.teacher import load_teacher
    from tests.conftest import dmad_captured

    shutil.copytree(sd_loras["diffusers"], tmp_path / "my_style")
    lora = {"path": "my_style", "scale": 0.8}  # relative: to the config file's folder
    cfg = write_config({"identity": {"teacher_loras": [lora]},
                        "optimization": {"max_train_steps": 1}, "observation": {"checkpointing_steps": 1}}, name="c.json")
    shutil.move(str(cfg), tmp_path / "c.json")
    cfg = tmp_path / "c.json"
    code, out, err = dmad_captured(capsys, "train", "--config", str(cfg), "--run-dir", str(tmp_path / "dry"), "--dry-run")
    assert code == 0, err
    assert f"+ LoRA   {tmp_path / 'my_style'} at scale 0.8" in out and "teacher LoRAs (1, fused at load" in out

    run = tmp_path / "run"
    code, _, err = dmad_captured(capsys, "train", "--config", str(cfg), "--run-dir", str(run))
    assert code == 0, err[-2000:]
    assert json.loads((run / "config.json").read_text())["identity"]["teacher_loras"] == [
        {"path": str(tmp_path / "my_style"), "scale": 0.8}]
    sha = hashlib.sha256((tmp_path / "my_style" / "pytorch_lora_weights.safetensors").read_bytes()).hexdigest()
    for folder in ("teacher", "iter_1"):
        meta = json.loads((run / "samples" / folder / "meta.json").read_text())
        assert [(x["scale"], x["sha256"]) for x in meta["teacher_loras"]] == [(0.8, sha)], folder

    student = load_file(str(run / "checkpoints" / "iter_1" / "student" / "diffusion_pytorch_model.safetensors"))
    fused = load_teacher(str(tiny_teacher), loras=(_entry(tmp_path / "my_style", 0.8),)).unet.state_dict()
    bare = load_teacher(str(tiny_teacher)).unet.state_dict()
    to_fused = sum((student[k] - fused[k]).norm() ** 2 for k in student) ** 0.5
    to_bare = sum((student[k] - bare[k]).norm() ** 2 for k in student) ** 0.5
    assert to_fused < to_bare / 10, (to_fused, to_bare)  # one small step from base + LoRA

    # the LoRA file edited in place, then the run resumed: the teacher is not the one it started with
    from dmad.contract.events import read_events

    make_tiny_lora(tiny_teacher, tmp_path / "my_style", "diffusers", seed=7)
    code, _, err = dmad_captured(capsys, "train", "--config", str(cfg), "--run-dir", str(run), "--resume", "latest",
                                 "--set", "optimization.max_train_steps=2")
    assert code == 0, err[-2000:]
    warnings = [e.data["message"] for e in read_events(run / "events.jsonl") if e.kind == "warning"]
    assert any(m.startswith(f"identity.teacher_loras[0]: {tmp_path / 'my_style'}") and "changed since the run started"
               in m and sha[:12] in m for m in warnings), warnings


def test_a_lora_student_of_a_loraed_teacher_exports_with_the_loras_named(write_config, tmp_path, sd_loras, capsys):
    from safetensors import safe_open

    from tests.conftest import dmad_captured

    cfg = write_config({"identity": {"student": "lora", "fake_score": "lora", "lora_rank": 4,
                                     "teacher_loras": [{"path": str(sd_loras["kohya"]), "scale": 1.0}]},
                        "optimization": {"max_train_steps": 1}, "observation": {"checkpointing_steps": 1}})
    run = tmp_path / "run"
    code, _, err = dmad_captured(capsys, "train", "--config", str(cfg), "--run-dir", str(run))
    assert code == 0, err[-2000:]
    assert "one frozen base" in (run / "logs" / "engine.log").read_text()  # adapters on base + LoRA, held once
    out = tmp_path / "export"
    code, _, err = dmad_captured(capsys, "export", "--run", str(run), "--format", "lora-single-file", "--out", str(out))
    assert code == 0, err[-2000:]
    doc = json.loads((out / "dmad_export.json").read_text())
    assert [(x["name"], x["scale"]) for x in doc["teacher_loras"]] == [("style_kohya.safetensors", 1.0)]
    (file,) = [p for p in out.iterdir() if p.suffix == ".safetensors"]
    with safe_open(str(file), "pt") as f:
        named = json.loads(f.metadata()["dmad_user_loras"])
    assert [(x["name"], x["sha256"], x["merged_into_this_file"]) for x in named] == [
        (x["name"], x["sha256"], False) for x in doc["teacher_loras"]] and len(named[0]["sha256"]) == 64

    # the diffusers LoRA export's README: base + the user's LoRA + the student, as adapters in plain
    # diffusers, renders the run's own sample (the engine fused the user's LoRA; diffusers keeps it an
    # adapter: float rounding apart, the same image)
    import numpy as np
    from PIL import Image

    from tests.e2e.test_export_families import _readme_image

    out = tmp_path / "export_lora"
    code, _, err = dmad_captured(capsys, "export", "--run", str(run), "--format", "lora", "--out", str(out))
    assert code == 0, err[-2000:]
    readme = (out / "README.md").read_text()
    assert "adapter_name='user_0'" in readme and "pipe.set_adapters(['user_0', 'student'], adapter_weights=[1.0, 1.0])" in readme
    got, pipe = _readme_image(out)
    assert sorted(pipe.get_active_adapters()) == ["student", "user_0"]
    meta = json.loads((run / "samples" / "iter_1" / "meta.json").read_text())
    first = next(iter(meta["items"].values()))
    want = np.asarray(Image.open(run / "samples" / "iter_1" / first["file"]).convert("RGB"))
    d = np.abs(got.astype(int) - want.astype(int))
    assert d.max() <= 2 and d.mean() < 0.1, (d.max(), d.mean())
    # control: the student alone on the bare base (what stacking it without the user's LoRA gives) is not it
    code = readme.split("```python\n", 1)[1].split("```", 1)[0].replace(
        "pipe.set_adapters(['user_0', 'student'], adapter_weights=[1.0, 1.0])", "pipe.set_adapters(['student'])")
    scope: dict = {}
    exec(compile(code, "README without the user's LoRA", "exec"), scope)  # noqa: S102
    alone = np.asarray(scope["image"].convert("RGB"))
    assert np.abs(alone.astype(int) - want.astype(int)).mean() > 10 * max(d.mean(), 0.1)

    # --merge-user-loras: one file holding the user's LoRA and the student, for tools that load one
    # LoRA at a time; on the bare base it renders the same sample
    from safetensors.torch import load_file

    code, _, err = dmad_captured(capsys, "export", "--run", str(run), "--format", "lora", "--merge-user-loras")
    assert code == 2 and err.strip().endswith("--merge-user-loras: only with --format lora-single-file (not lora)")
    merged = tmp_path / "export_merged"
    code, _, err = dmad_captured(capsys, "export", "--run", str(run), "--format", "lora-single-file",
                                 "--merge-user-loras", "--out", str(merged))
    assert code == 0, err[-2000:]
    assert json.loads((merged / "dmad_export.json").read_text())["user_loras_merged"] is True
    (file,) = [p for p in merged.iterdir() if p.suffix == ".safetensors"]
    tensors = load_file(str(file))
    assert any(k.startswith("lora_te_") for k in tensors)  # the user's text-encoder layers are in it
    q = "lora_unet_down_blocks_0_attentions_0_transformer_blocks_0_attn1_to_q"
    assert tensors[f"{q}.lora_down.weight"].shape[0] == 8 and float(tensors[f"{q}.alpha"]) == 8  # 4 + 4: exact
    readme = (merged / "README.md").read_text()
    assert "adapter_name='user_0'" not in readme and "set_adapters" not in readme
    got, _ = _readme_image(merged)
    d = np.abs(got.astype(int) - want.astype(int))
    assert d.max() <= 2 and d.mean() < 0.1, (d.max(), d.mean())
