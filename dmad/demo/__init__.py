"""The built-in demo: a procedural shapes dataset (dmad.demo.shapes) and the architecture of a
Stable-Diffusion-layout teacher small enough to train and distil on a CPU.

resources/demo/teacher/ holds that architecture as a diffusers pipeline folder without weights
(write_teacher_architecture); `dmad demo make-teacher` trains it on resources/demo/shapes/ and
adds the weights.
"""
from __future__ import annotations

from pathlib import Path

# Sized for 64 px shapes: the VAE downsamples x4 (64x64x3 -> 16x16x8 latents). Every word of the
# demo captions is one token (demo_vocab), so the longest caption is 15 tokens with BOS/EOS;
# other text falls back to one token per byte, and 32 positions leave room for that.
TEACHER_MAX_LENGTH = 32
TEACHER_TEXT_DIM = 128
# (64, 128, 256) would be 12.6 M UNet parameters alone (25 MB in fp16); 192 at the bottom
# keeps the whole pipeline near 10.6 M parameters, ~21 MB in fp16.
TEACHER_UNET_CHANNELS = (64, 128, 192)
TEACHER_VAE_CHANNELS = (32, 64, 64)
# GroupNorm groups for both networks. With 32 groups on 32 channels (SD's 32 groups, but SD has
# 128+ channels) every channel is normalised on its own over the image, which erases the
# amplitude of flat colour regions: a VAE so built reconstructs shapes but not their colours.
# 8 groups keep 4-24 channels per group, as SD's 32 groups over 128-1280 channels do.
TEACHER_NORM_GROUPS = 8
# 8 latent channels (SD 1.x has 4, SD3 and Flux 16): with 4, a VAE trained for 800 steps on this
# CPU still drew 17% of shapes as the wrong shape (a 16 px triangle spans 4x4 latent cells);
# the UNet costs the same either way.
TEACHER_LATENT_CHANNELS = 8


def demo_words() -> list[str]:
    """Every word the demo captions use (dmad.demo.shapes.caption), sorted."""
    from dmad.demo import shapes

    words = set(shapes.SHAPES) | set(shapes.COLOURS) | set(shapes.BACKGROUNDS) | set(shapes.SIZES)
    for position in shapes.POSITIONS:
        words.update(position.split())
    words.update("a at the in on background".split())
    return sorted(words)


def demo_vocab() -> tuple[dict[str, int], list[tuple[str, str]]]:
    """A CLIP BPE vocabulary and merge list in which every demo word is a single token.

    The base is the byte-level table (every byte a token, so any text still tokenizes); each
    demo word adds the merges that build it left to right. Longer words' merges rank first so a
    shorter word's pair (the "ri" of "right") cannot split a longer one ("triangle"); a test checks
    that every word comes out as one token. A word-level vocabulary is what lets a text encoder
    trained from scratch on a CPU learn the captions in minutes rather than hours: with one token
    per byte it first has to learn to spell.
    """
    from dmad.tiny import byte_level_vocab

    vocab = byte_level_vocab()
    specials = ("<|startoftext|>", "<|endoftext|>")  # re-added after the words, as the last ids
    for token in specials:
        del vocab[token]
    merges: list[tuple[str, str]] = []
    for word in sorted(demo_words(), key=lambda w: (-len(w), w)):
        parts = list(word[:-1]) + [word[-1] + "</w>"]
        left = parts[0]
        for right in parts[1:]:
            if (left, right) not in merges:
                merges.append((left, right))
            left += right
            vocab.setdefault(left, len(vocab))
    for token in specials:
        vocab[token] = len(vocab)
    return vocab, merges


def build_teacher(seed: int = 0):
    """A randomly initialised demo teacher: StableDiffusionPipeline on the CPU, fp32."""
    import torch
    from diffusers import AutoencoderKL, DDPMScheduler, StableDiffusionPipeline, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer

    torch.manual_seed(seed)
    vocab, merges = demo_vocab()
    bos, eos = vocab["<|startoftext|>"], vocab["<|endoftext|>"]
    tokenizer = CLIPTokenizer(vocab=vocab, merges=merges, model_max_length=TEACHER_MAX_LENGTH)
    text_encoder = CLIPTextModel(CLIPTextConfig(
        vocab_size=len(vocab), hidden_size=TEACHER_TEXT_DIM, intermediate_size=4 * TEACHER_TEXT_DIM,
        num_hidden_layers=4, num_attention_heads=4, max_position_embeddings=TEACHER_MAX_LENGTH,
        projection_dim=TEACHER_TEXT_DIM, bos_token_id=bos, eos_token_id=eos, pad_token_id=eos))
    unet = UNet2DConditionModel(
        sample_size=16, in_channels=TEACHER_LATENT_CHANNELS, out_channels=TEACHER_LATENT_CHANNELS, block_out_channels=TEACHER_UNET_CHANNELS, layers_per_block=1,
        down_block_types=("CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=TEACHER_TEXT_DIM, attention_head_dim=tuple(c // 32 for c in TEACHER_UNET_CHANNELS),
        norm_num_groups=TEACHER_NORM_GROUPS,  # attention_head_dim is the head COUNT in SD configs: 32 channels per head
        # The caption, attention-pooled, is also added to the time embedding (diffusers' "text" addition
        # embedding), so it reaches every ResNet block and not only the cross-attention layers.
        addition_embed_type="text", addition_embed_type_num_heads=4)
    vae = AutoencoderKL(
        in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 3,
        up_block_types=("UpDecoderBlock2D",) * 3, block_out_channels=TEACHER_VAE_CHANNELS, latent_channels=TEACHER_LATENT_CHANNELS,
        layers_per_block=1, norm_num_groups=TEACHER_NORM_GROUPS, sample_size=64)
    # Stable Diffusion's noise schedule with SD 2.x's v-prediction; the sampler for reference images
    # comes from the prompt set.
    scheduler = DDPMScheduler(num_train_timesteps=1000, beta_schedule="scaled_linear", beta_start=0.00085,
                              beta_end=0.012, prediction_type="v_prediction", clip_sample=False,
                              steps_offset=1, timestep_spacing="leading")
    return StableDiffusionPipeline(unet=unet, vae=vae, text_encoder=text_encoder, tokenizer=tokenizer,
                                   scheduler=scheduler, safety_checker=None, feature_extractor=None,
                                   requires_safety_checker=False)


def parameter_counts(pipe) -> dict[str, int]:
    counts = {name: sum(p.numel() for p in getattr(pipe, name).parameters())
              for name in ("unet", "vae", "text_encoder")}
    counts["total"] = sum(counts.values())
    return counts


def write_teacher_architecture(path: str | Path) -> dict[str, int]:
    """Save the demo teacher's configs and tokenizer to `path`, without weights: the folder
    describes the architecture only. Returns the parameter counts."""
    pipe = build_teacher()
    path = Path(path)
    pipe.save_pretrained(str(path), safe_serialization=True)
    for weights in list(path.rglob("*.safetensors")) + list(path.rglob("*.bin")):
        weights.unlink()
    return parameter_counts(pipe)
