"""The built-in demo: a procedural shapes dataset (dmad.demo.shapes) and the architecture of a
Stable-Diffusion-layout teacher small enough to train and distil on a CPU.

resources/demo/teacher/ holds that architecture as a diffusers pipeline folder without weights
(write_teacher_architecture); `dmad demo make-teacher` trains it on resources/demo/shapes/ and
adds the weights.
"""
from __future__ import annotations

from pathlib import Path

# Sized for 64 px shapes: the VAE downsamples x4 (64x64x3 -> 16x16x4 latents). Captions are
# byte-level tokens (one per character, spaces free): the longest demo caption is ~57 tokens
# with BOS/EOS, so 32 would cut off position and background; 64 fits every one.
TEACHER_MAX_LENGTH = 64
TEACHER_TEXT_DIM = 128
# (64, 128, 256) would be 12.6 M UNet parameters alone (25 MB in fp16); 192 at the bottom
# keeps the whole pipeline near 10.6 M parameters, ~21 MB in fp16.
TEACHER_UNET_CHANNELS = (64, 128, 192)
TEACHER_VAE_CHANNELS = (32, 64, 64)


def build_teacher(seed: int = 0):
    """A randomly initialised demo teacher: StableDiffusionPipeline on the CPU, fp32."""
    import torch
    from diffusers import AutoencoderKL, DDPMScheduler, StableDiffusionPipeline, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer

    from dmad.tiny import byte_level_vocab

    torch.manual_seed(seed)
    vocab = byte_level_vocab()
    bos, eos = vocab["<|startoftext|>"], vocab["<|endoftext|>"]
    tokenizer = CLIPTokenizer(vocab=vocab, merges=[], model_max_length=TEACHER_MAX_LENGTH)
    text_encoder = CLIPTextModel(CLIPTextConfig(
        vocab_size=len(vocab), hidden_size=TEACHER_TEXT_DIM, intermediate_size=4 * TEACHER_TEXT_DIM,
        num_hidden_layers=4, num_attention_heads=4, max_position_embeddings=TEACHER_MAX_LENGTH,
        projection_dim=TEACHER_TEXT_DIM, bos_token_id=bos, eos_token_id=eos, pad_token_id=eos))
    unet = UNet2DConditionModel(
        sample_size=16, in_channels=4, out_channels=4, block_out_channels=TEACHER_UNET_CHANNELS, layers_per_block=1,
        down_block_types=("CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=TEACHER_TEXT_DIM, attention_head_dim=tuple(c // 32 for c in TEACHER_UNET_CHANNELS),
        norm_num_groups=32)  # attention_head_dim is the head COUNT in SD configs: 32 channels per head
    vae = AutoencoderKL(
        in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 3,
        up_block_types=("UpDecoderBlock2D",) * 3, block_out_channels=TEACHER_VAE_CHANNELS, latent_channels=4,
        layers_per_block=1, norm_num_groups=32, sample_size=64)
    # Stable Diffusion 1.x noise schedule; the sampler for reference images comes from the prompt set.
    scheduler = DDPMScheduler(num_train_timesteps=1000, beta_schedule="scaled_linear", beta_start=0.00085,
                              beta_end=0.012, prediction_type="epsilon", clip_sample=False,
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
