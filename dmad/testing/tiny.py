"""Tiny random Stable-Diffusion-layout pipelines, built locally, for tests and benchmarks.

Nothing is downloaded: the CLIP tokenizer gets a byte-level vocabulary with no merges (every
byte is a token), which CLIPTokenizer accepts. The result is a real diffusers folder
(model_index.json, unet/, vae/, text_encoder/, tokenizer/, scheduler/) that
StableDiffusionPipeline.from_pretrained(path, local_files_only=True) loads.
Cost: ~0.8 M UNet parameters, ~4 MB on disk, well under a second to build on a CPU.
"""
from __future__ import annotations

from pathlib import Path

from dmad.models.tokenizers import byte_level_vocab, tiny_t5_tokenizer


def make_tiny_sd_pipeline(path: str | Path, prediction_type: str = "epsilon", seed: int = 0,
                          unet_channels: tuple[int, int] = (32, 64), text_dim: int = 32,
                          max_length: int = 16):
    """Build, save (safetensors) and return a tiny random StableDiffusionPipeline at `path`.

    The VAE downsamples by 2 (two blocks), so a 32 px image is an 16x16x4 latent."""
    import torch
    from diffusers import AutoencoderKL, DDPMScheduler, StableDiffusionPipeline, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer

    torch.manual_seed(seed)
    vocab = byte_level_vocab()
    tokenizer = CLIPTokenizer(vocab=vocab, merges=[], model_max_length=max_length)
    text_encoder = CLIPTextModel(CLIPTextConfig(
        vocab_size=len(vocab), hidden_size=text_dim, intermediate_size=2 * text_dim, num_hidden_layers=2,
        num_attention_heads=4, max_position_embeddings=max_length, projection_dim=text_dim,
        bos_token_id=vocab["<|startoftext|>"], eos_token_id=vocab["<|endoftext|>"], pad_token_id=vocab["<|endoftext|>"]))
    unet = UNet2DConditionModel(
        sample_size=16, in_channels=4, out_channels=4, block_out_channels=unet_channels, layers_per_block=1,
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=text_dim, attention_head_dim=8, norm_num_groups=8)
    vae = AutoencoderKL(
        in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2, block_out_channels=(16, 32), latent_channels=4,
        norm_num_groups=8, sample_size=32)
    scheduler = DDPMScheduler(num_train_timesteps=1000, beta_schedule="scaled_linear", beta_start=0.00085,
                              beta_end=0.012, prediction_type=prediction_type)
    pipe = StableDiffusionPipeline(unet=unet, vae=vae, text_encoder=text_encoder, tokenizer=tokenizer,
                                   scheduler=scheduler, safety_checker=None, feature_extractor=None,
                                   requires_safety_checker=False)
    pipe.save_pretrained(str(path), safe_serialization=True)
    return pipe


def make_caption_folder(path: str | Path, n: int = 8, size: int = 32, seed: int = 0) -> Path:
    """A small captioned image folder (image + .txt of the same stem) of coloured rectangles."""
    import random

    from PIL import Image, ImageDraw

    rng = random.Random(seed)
    colours = {"red": (220, 30, 30), "green": (30, 200, 60), "blue": (40, 60, 230), "yellow": (240, 220, 40)}
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        name, rgb = rng.choice(sorted(colours.items()))
        img = Image.new("RGB", (size, size), (0, 0, 0))
        x0, y0 = rng.randrange(0, size // 2), rng.randrange(0, size // 2)
        ImageDraw.Draw(img).rectangle([x0, y0, x0 + size // 3, y0 + size // 3], fill=rgb)
        img.save(path / f"img_{i:03d}.png")
        (path / f"img_{i:03d}.txt").write_text(f"a {name} square on a black background\n", encoding="utf-8")
    return path


# --------------------------------------------------------------------------------------------
# Other families: SDXL (two CLIP encoders + text_time conditioning), SD3 (MMDiT, flow matching,
# T5 optional) and Flux (MMDiT + single blocks, CLIP pooled + T5, packed 2x2 latents).
# All random, all local, all saved with safetensors.
# --------------------------------------------------------------------------------------------

def _tiny_t5_encoder(vocab_size: int, d_model: int):
    from transformers import T5Config, T5EncoderModel

    return T5EncoderModel(T5Config(
        vocab_size=vocab_size, d_model=d_model, d_ff=2 * d_model, d_kv=8, num_layers=2, num_heads=4,
        relative_attention_num_buckets=8, relative_attention_max_distance=16, feed_forward_proj="gated-gelu",
        pad_token_id=0, eos_token_id=1, decoder_start_token_id=0))


def _tiny_clip(text_dim: int, max_length: int, with_projection: bool, projection_dim: int | None = None):
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection, CLIPTokenizer

    vocab = byte_level_vocab()
    tokenizer = CLIPTokenizer(vocab=vocab, merges=[], model_max_length=max_length)
    cfg = CLIPTextConfig(
        vocab_size=len(vocab), hidden_size=text_dim, intermediate_size=2 * text_dim, num_hidden_layers=2,
        num_attention_heads=4, max_position_embeddings=max_length, projection_dim=projection_dim or text_dim,
        bos_token_id=vocab["<|startoftext|>"], eos_token_id=vocab["<|endoftext|>"], pad_token_id=vocab["<|endoftext|>"])
    model = CLIPTextModelWithProjection(cfg) if with_projection else CLIPTextModel(cfg)
    return tokenizer, model


def _tiny_vae(latent_channels: int = 4, shift_factor: float | None = None, scaling_factor: float = 0.18215,
              force_upcast: bool = True, use_quant_conv: bool = True):
    """Two-block AutoencoderKL: downsamples by 2 (vae_scale_factor 2)."""
    from diffusers import AutoencoderKL

    return AutoencoderKL(
        in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2, block_out_channels=(16, 32), latent_channels=latent_channels,
        norm_num_groups=8, sample_size=32, scaling_factor=scaling_factor, shift_factor=shift_factor,
        force_upcast=force_upcast, use_quant_conv=use_quant_conv, use_post_quant_conv=use_quant_conv)


def make_tiny_sdxl_pipeline(path: str | Path, prediction_type: str = "epsilon", seed: int = 0,
                            unet_channels: tuple[int, int] = (32, 64), text_dim: int = 32, text_dim_2: int = 32,
                            max_length: int = 16, time_embed_dim: int = 8):
    """Build, save (safetensors) and return a tiny random StableDiffusionXLPipeline at `path`.

    text_encoder: CLIPTextModel (width text_dim); text_encoder_2: CLIPTextModelWithProjection
    (width text_dim_2, projection_dim text_dim_2 = pooled width). UNet cross_attention_dim is
    text_dim + text_dim_2 (penultimate hidden states of both, concatenated); its text_time
    embedding takes 6 * time_embed_dim + pooled width. VAE factor 2; the SDXL pipeline itself
    requires height/width to be multiples of 8."""
    import torch
    from diffusers import EulerDiscreteScheduler, StableDiffusionXLPipeline, UNet2DConditionModel

    torch.manual_seed(seed)
    tokenizer, text_encoder = _tiny_clip(text_dim, max_length, with_projection=False)
    tokenizer_2, text_encoder_2 = _tiny_clip(text_dim_2, max_length, with_projection=True, projection_dim=text_dim_2)
    unet = UNet2DConditionModel(
        sample_size=16, in_channels=4, out_channels=4, block_out_channels=unet_channels, layers_per_block=1,
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=text_dim + text_dim_2, attention_head_dim=8, norm_num_groups=8,
        addition_embed_type="text_time", addition_time_embed_dim=time_embed_dim,
        projection_class_embeddings_input_dim=6 * time_embed_dim + text_dim_2, use_linear_projection=True)
    vae = _tiny_vae(latent_channels=4, scaling_factor=0.13025, force_upcast=True)
    scheduler = EulerDiscreteScheduler(num_train_timesteps=1000, beta_schedule="scaled_linear", beta_start=0.00085,
                                       beta_end=0.012, prediction_type=prediction_type, timestep_spacing="leading",
                                       steps_offset=1)
    pipe = StableDiffusionXLPipeline(vae=vae, text_encoder=text_encoder, text_encoder_2=text_encoder_2,
                                     tokenizer=tokenizer, tokenizer_2=tokenizer_2, unet=unet, scheduler=scheduler,
                                     force_zeros_for_empty_prompt=True, add_watermarker=False)
    pipe.save_pretrained(str(path), safe_serialization=True)
    return pipe


def make_tiny_sd3_pipeline(path: str | Path, seed: int = 0, with_t5: bool = False, text_dim: int = 32,
                           max_length: int = 16, num_layers: int = 2):
    """Build, save (safetensors) and return a tiny random StableDiffusion3Pipeline at `path`.

    Two CLIPTextModelWithProjection encoders (width = projection = text_dim); pooled_projection_dim
    = 2 * text_dim; joint_attention_dim = 2 * text_dim (the CLIP hidden states, concatenated, are
    zero-padded to it); T5 (d_model = joint_attention_dim) only when with_t5, else text_encoder_3 /
    tokenizer_3 are None and the pipeline feeds zeros in their place. Transformer inner width 32
    (4 heads x 8), patch 2; VAE factor 2, 4 latent channels, SD3 shift/scale; pixel side multiple 4.
    Call the pipeline with max_sequence_length <= the T5 tokenizer length (16) when with_t5.

    Without T5, model_index.json records text_encoder_3 / tokenizer_3 as [null, null], but diffusers
    0.42 still refuses to load the folder unless they are passed explicitly:
    StableDiffusion3Pipeline.from_pretrained(path, local_files_only=True, text_encoder_3=None,
    tokenizer_3=None). (The pipeline then uses zeros of shape (max_sequence_length,
    joint_attention_dim) for the T5 part; pass max_sequence_length to keep the sequence short.)"""
    import torch
    from diffusers import FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel, StableDiffusion3Pipeline

    torch.manual_seed(seed)
    tokenizer, text_encoder = _tiny_clip(text_dim, max_length, with_projection=True)
    tokenizer_2, text_encoder_2 = _tiny_clip(text_dim, max_length, with_projection=True)
    joint_dim = 2 * text_dim
    tokenizer_3 = text_encoder_3 = None
    if with_t5:
        tokenizer_3 = tiny_t5_tokenizer(max_length)
        text_encoder_3 = _tiny_t5_encoder(len(tokenizer_3), joint_dim)
    heads, head_dim = 4, 8
    transformer = SD3Transformer2DModel(
        sample_size=16, patch_size=2, in_channels=4, out_channels=4, num_layers=num_layers,
        attention_head_dim=head_dim, num_attention_heads=heads, joint_attention_dim=joint_dim,
        caption_projection_dim=heads * head_dim, pooled_projection_dim=2 * text_dim, pos_embed_max_size=32)
    vae = _tiny_vae(latent_channels=4, shift_factor=0.0609, scaling_factor=1.5305, force_upcast=True,
                    use_quant_conv=False)
    scheduler = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=3.0)
    pipe = StableDiffusion3Pipeline(transformer=transformer, scheduler=scheduler, vae=vae,
                                    text_encoder=text_encoder, tokenizer=tokenizer,
                                    text_encoder_2=text_encoder_2, tokenizer_2=tokenizer_2,
                                    text_encoder_3=text_encoder_3, tokenizer_3=tokenizer_3)
    pipe.save_pretrained(str(path), safe_serialization=True)
    return pipe


def make_tiny_flux_pipeline(path: str | Path, seed: int = 0, guidance_embeds: bool = True, text_dim: int = 32,
                            t5_dim: int = 32, max_length: int = 16):
    """Build, save (safetensors) and return a tiny random FluxPipeline at `path`.

    text_encoder: CLIPTextModel (pooled output, width text_dim = pooled_projection_dim);
    text_encoder_2: T5EncoderModel (d_model t5_dim = joint_attention_dim) with tiny_t5_tokenizer();
    transformer: 1 double + 1 single block, 2 heads x 16, rope axes (4, 6, 6), in_channels 16 =
    4 latent channels x 2x2 packing. VAE factor 2 with Flux shift/scale; the pipeline packs 2x2
    latents, so the pixel side must be a multiple of 4. Call with max_sequence_length <= 16."""
    import torch
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel

    torch.manual_seed(seed)
    tokenizer, text_encoder = _tiny_clip(text_dim, max_length, with_projection=False)
    tokenizer_2 = tiny_t5_tokenizer(max_length)
    text_encoder_2 = _tiny_t5_encoder(len(tokenizer_2), t5_dim)
    latent_channels = 4
    transformer = FluxTransformer2DModel(
        patch_size=1, in_channels=4 * latent_channels, num_layers=1, num_single_layers=1, attention_head_dim=16,
        num_attention_heads=2, joint_attention_dim=t5_dim, pooled_projection_dim=text_dim,
        guidance_embeds=guidance_embeds, axes_dims_rope=(4, 6, 6))
    vae = _tiny_vae(latent_channels=latent_channels, shift_factor=0.1159, scaling_factor=0.3611,
                    force_upcast=True, use_quant_conv=False)
    scheduler = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=3.0, use_dynamic_shifting=True,
                                                base_shift=0.5, max_shift=1.15, base_image_seq_len=256,
                                                max_image_seq_len=4096)
    pipe = FluxPipeline(scheduler=scheduler, vae=vae, text_encoder=text_encoder, tokenizer=tokenizer,
                        text_encoder_2=text_encoder_2, tokenizer_2=tokenizer_2, transformer=transformer)
    pipe.save_pretrained(str(path), safe_serialization=True)
    return pipe


def make_tiny_lora(teacher: str | Path, out: str | Path, layout: str = "diffusers", rank: int = 4, seed: int = 0,
                   text_encoder: bool = True, strength: float = 0.5) -> Path:
    """A random LoRA for the tiny pipeline at `teacher` (any family), as a user would bring one:
    `layout` "diffusers" (a folder with pytorch_lora_weights.safetensors, as the family pipeline's
    save_lora_weights writes it) or "kohya" (one .safetensors in lora_unet_* / lora_te_* names with
    alpha, UNet families; dmad.sample.lora_file's layout for the transformer ones). Its B matrices
    are random (`strength` times unit normal), so it changes what the teacher computes; with
    `text_encoder`, the first text encoder gets one too. Returns the path teacher_loras takes."""
    import json

    import diffusers
    import torch
    from diffusers.utils import convert_state_dict_to_diffusers, convert_state_dict_to_kohya
    from peft import LoraConfig
    from peft.utils import get_peft_model_state_dict
    from safetensors.torch import save_file

    index = json.loads((Path(teacher) / "model_index.json").read_text())
    cls = getattr(diffusers, index["_class_name"])
    denoiser = "unet" if "unet" in index else "transformer"
    net = getattr(diffusers, index[denoiser][1]).from_pretrained(str(teacher), subfolder=denoiser)
    targets = ["to_q", "to_k", "to_v", "to_out.0"]
    torch.manual_seed(seed)
    net.add_adapter(LoraConfig(r=rank, lora_alpha=rank, target_modules=targets, init_lora_weights="gaussian"))
    te = None
    if text_encoder:
        import transformers

        te = getattr(transformers, index["text_encoder"][1]).from_pretrained(str(teacher), subfolder="text_encoder")
        te.add_adapter(LoraConfig(r=rank, lora_alpha=rank, target_modules=["q_proj", "k_proj", "v_proj", "out_proj"],
                                  init_lora_weights="gaussian"))
    with torch.no_grad():
        for model in (net, te):
            for name, p in (model.named_parameters() if model is not None else ()):
                if "lora_B" in name:
                    p.normal_(0.0, strength)
    net_layers = get_peft_model_state_dict(net)
    te_layers = get_peft_model_state_dict(te) if te is not None else None
    out = Path(out)
    if layout == "diffusers":
        kw = {f"{denoiser}_lora_layers": convert_state_dict_to_diffusers(net_layers) if denoiser == "unet" else net_layers}
        if te_layers is not None:
            kw["text_encoder_lora_layers"] = convert_state_dict_to_diffusers(te_layers)
        out.mkdir(parents=True, exist_ok=True)
        cls.save_lora_weights(str(out), safe_serialization=True, **kw)
        return out
    if layout != "kohya":
        raise ValueError(layout)
    tensors = {}
    if denoiser == "unet":
        tensors.update(convert_state_dict_to_kohya({f"unet.{k}": v for k, v in net_layers.items()}))
        if te_layers is not None:
            tensors.update(convert_state_dict_to_kohya({f"text_encoder.{k}": v for k, v in te_layers.items()}))
    else:
        tensors.update({f"transformer.{k}": v for k, v in net_layers.items()})
    out.parent.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(out))
    return out
