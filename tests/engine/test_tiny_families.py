"""dmad.testing.tiny builders for the other families (SDXL, SD3, Flux): each writes a small safetensors
diffusers folder that loads back with local_files_only=True and renders a finite 32x32 image."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("diffusers")


def _render(pipe, **kw):
    out = pipe("a red square", num_inference_steps=2, height=32, width=32, output_type="pt",
               generator=torch.Generator().manual_seed(0), **kw).images
    assert tuple(out.shape) == (1, 3, 32, 32)
    assert torch.isfinite(out).all()
    return out


def _only_safetensors(path):
    weights = [p for p in path.rglob("*") if p.suffix in {".bin", ".safetensors", ".pt", ".ckpt"}]
    assert weights and all(p.suffix == ".safetensors" for p in weights)
    assert sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) < 10_000_000


def test_t5_tokenizer_round_trips(tmp_path):
    from transformers import AutoTokenizer, T5TokenizerFast

    from dmad.models.tokenizers import tiny_t5_tokenizer

    tok = tiny_t5_tokenizer(16)
    ids = tok("a red square").input_ids
    assert ids[-1] == tok.eos_token_id == 1 and tok.pad_token_id == 0 and tok.unk_token_id not in ids
    tok.save_pretrained(tmp_path)
    for cls in (T5TokenizerFast, AutoTokenizer):
        back = cls.from_pretrained(tmp_path, local_files_only=True)
        assert back("a red square").input_ids == ids
        padded = back("a red square", padding="max_length", max_length=16, truncation=True).input_ids
        assert len(padded) == 16 and padded[len(ids):] == [0] * (16 - len(ids))
        assert len(back("x" * 40, padding="max_length", max_length=16, truncation=True).input_ids) == 16


@pytest.mark.parametrize("prediction_type", ["epsilon", "v_prediction"])
def test_tiny_sdxl(tmp_path, prediction_type):
    from diffusers import StableDiffusionXLPipeline, UNet2DConditionModel
    from transformers import CLIPTextModel, CLIPTextModelWithProjection, CLIPTokenizer

    from dmad.testing.tiny import make_tiny_sdxl_pipeline

    built = make_tiny_sdxl_pipeline(tmp_path, prediction_type=prediction_type)
    assert isinstance(built, StableDiffusionXLPipeline)
    _only_safetensors(tmp_path)
    pipe = StableDiffusionXLPipeline.from_pretrained(tmp_path, local_files_only=True)
    assert isinstance(pipe.unet, UNet2DConditionModel)
    assert type(pipe.text_encoder) is CLIPTextModel
    assert isinstance(pipe.text_encoder_2, CLIPTextModelWithProjection)
    assert isinstance(pipe.tokenizer, CLIPTokenizer) and isinstance(pipe.tokenizer_2, CLIPTokenizer)
    cfg = pipe.unet.config
    assert cfg.addition_embed_type == "text_time"
    assert cfg.cross_attention_dim == pipe.text_encoder.config.hidden_size + pipe.text_encoder_2.config.hidden_size
    assert cfg.projection_class_embeddings_input_dim == (
        6 * cfg.addition_time_embed_dim + pipe.text_encoder_2.config.projection_dim)
    assert pipe.vae.config.force_upcast
    assert pipe.scheduler.config.prediction_type == prediction_type
    assert pipe.scheduler.config.timestep_spacing == "leading"
    _render(pipe)


@pytest.mark.parametrize("with_t5", [False, True])
def test_tiny_sd3(tmp_path, with_t5):
    from diffusers import (AutoencoderKL, FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel,
                           StableDiffusion3Pipeline)
    from transformers import CLIPTextModelWithProjection, T5EncoderModel, T5TokenizerFast

    from dmad.testing.tiny import make_tiny_sd3_pipeline

    built = make_tiny_sd3_pipeline(tmp_path, with_t5=with_t5)
    assert isinstance(built, StableDiffusion3Pipeline)
    _only_safetensors(tmp_path)
    # Without T5 the folder records text_encoder_3 / tokenizer_3 as null, but diffusers still wants
    # them passed explicitly as None.
    extra = {} if with_t5 else {"text_encoder_3": None, "tokenizer_3": None}
    pipe = StableDiffusion3Pipeline.from_pretrained(tmp_path, local_files_only=True, **extra)
    assert isinstance(pipe.transformer, SD3Transformer2DModel)
    assert isinstance(pipe.text_encoder, CLIPTextModelWithProjection)
    assert isinstance(pipe.text_encoder_2, CLIPTextModelWithProjection)
    assert isinstance(pipe.vae, AutoencoderKL) and pipe.vae.config.shift_factor == pytest.approx(0.0609)
    assert isinstance(pipe.scheduler, FlowMatchEulerDiscreteScheduler) and pipe.scheduler.config.shift == 3.0
    if with_t5:
        assert isinstance(pipe.text_encoder_3, T5EncoderModel) and isinstance(pipe.tokenizer_3, T5TokenizerFast)
        assert pipe.text_encoder_3.config.d_model == pipe.transformer.config.joint_attention_dim
    else:
        assert pipe.text_encoder_3 is None and pipe.tokenizer_3 is None
    assert pipe.transformer.config.in_channels == pipe.vae.config.latent_channels
    _render(pipe, max_sequence_length=16)


@pytest.mark.parametrize("guidance_embeds", [True, False])
def test_tiny_flux(tmp_path, guidance_embeds):
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel
    from transformers import CLIPTextModel, T5EncoderModel, T5TokenizerFast

    from dmad.testing.tiny import make_tiny_flux_pipeline

    built = make_tiny_flux_pipeline(tmp_path, guidance_embeds=guidance_embeds)
    assert isinstance(built, FluxPipeline)
    _only_safetensors(tmp_path)
    pipe = FluxPipeline.from_pretrained(tmp_path, local_files_only=True)
    assert isinstance(pipe.transformer, FluxTransformer2DModel)
    assert type(pipe.text_encoder) is CLIPTextModel
    assert isinstance(pipe.text_encoder_2, T5EncoderModel) and isinstance(pipe.tokenizer_2, T5TokenizerFast)
    assert isinstance(pipe.vae, AutoencoderKL) and pipe.vae.config.scaling_factor == pytest.approx(0.3611)
    assert isinstance(pipe.scheduler, FlowMatchEulerDiscreteScheduler)
    assert pipe.scheduler.config.use_dynamic_shifting
    tcfg = pipe.transformer.config
    assert tcfg.guidance_embeds is guidance_embeds
    assert tcfg.in_channels == 4 * pipe.vae.config.latent_channels
    assert sum(tcfg.axes_dims_rope) == tcfg.attention_head_dim
    assert tcfg.joint_attention_dim == pipe.text_encoder_2.config.d_model
    assert tcfg.pooled_projection_dim == pipe.text_encoder.config.hidden_size
    _render(pipe, max_sequence_length=16, guidance_scale=3.5)
