"""Tiny random Stable-Diffusion-layout pipelines, built locally, for tests and benchmarks.

Nothing is downloaded: the CLIP tokenizer gets a byte-level vocabulary with no merges (every
byte is a token), which CLIPTokenizer accepts. The result is a real diffusers folder
(model_index.json, unet/, vae/, text_encoder/, tokenizer/, scheduler/) that
StableDiffusionPipeline.from_pretrained(path, local_files_only=True) loads.
Cost: ~0.8 M UNet parameters, ~4 MB on disk, well under a second to build on a CPU.
"""
from __future__ import annotations

from pathlib import Path


def byte_level_vocab() -> dict[str, int]:
    """GPT-2 / CLIP byte-to-unicode table: 256 printable stand-ins, each alone and word-final."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    chars = [chr(c) for c in cs]
    vocab = {c: i for i, c in enumerate(chars)}
    vocab.update({c + "</w>": 256 + i for i, c in enumerate(chars)})
    vocab["<|startoftext|>"] = len(vocab)
    vocab["<|endoftext|>"] = len(vocab)
    return vocab


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
