"""The built-in demo: a procedural shapes dataset (dmad.demo.shapes) and the architecture of an
SD3-layout teacher small enough to train and distil on a CPU.

Why SD3 (an MMDiT transformer) and not a UNet: the captions name a position ("at the top left"),
and placing a shape needs a denoiser that knows where each latent cell is. A conv/attention UNet
has no positional encoding and learns position only from zero padding: the earlier UNet teacher
ignored the position word entirely (swapping it changed its loss by <= 0.0002) after 1,500
steps. SD3Transformer2DModel adds a fixed 2D sin-cos position embedding to its patch tokens, so
position is a feature from step 0. `dmad demo make-teacher` trains this architecture.
"""
from __future__ import annotations

# 64 px shapes. The VAE downsamples only x2 (64x64x3 -> 32x32x4 latents) and the transformer
# patches 4x4: 64 image tokens, as x4 + 2x2 patches would give, but a x2 autoencoder reconstructs
# small shapes that a x4 one (16x16x8) still drew as the wrong shape 14-16% of the time after
# 900 steps (measured: 93% shape after 300 steps at x2, 84% after 900 at x4). Every word of the
# demo captions is one token (demo_vocab), so the longest caption is 14 tokens with BOS/EOS, and
# 16 CLIP positions hold every demo caption (other text falls back to one token per byte and is
# cut at 16). The transformer attends over the image tokens and every CLIP position, padding
# included, at every step: 16 positions instead of 32 make a teacher training step 22% cheaper
# (0.345 s against 0.444 s on 2 AMD EPYC cores) and the distillation's passes likewise.
TEACHER_MAX_LENGTH = 16
TEACHER_IMAGE_SIZE = 64
TEACHER_LATENT_CHANNELS = 4
TEACHER_VAE_CHANNELS = (32, 64)
TEACHER_PATCH = 4
# GroupNorm groups of the VAE. With 32 groups on 32 channels every channel is normalised on its
# own over the image, which erases the amplitude of flat colour regions; 8 groups keep 4-8
# channels per group, as SD's 32 groups over 128-512 channels do.
TEACHER_NORM_GROUPS = 8
# Two CLIP text encoders (SD3's pipeline requires both; T5's slot holds a null encoder, null_t5): their
# penultimate hidden states, 64 + 64 wide, make the 128-wide token sequence; their pooled
# projections, 64 + 64, the 128-wide pooled vector.
TEACHER_TEXT_DIM = 64
TEACHER_TEXT_LAYERS = 3
TEACHER_WIDTH = 128      # 4 heads x 32
TEACHER_LAYERS = 6
# SD3 without T5 appends this many zero tokens to the CLIP tokens (the pipeline's default
# max_sequence_length); the teacher is trained with exactly that context, so a plain pipeline
# call is what it learned.
SD3_ZERO_TOKENS = 256


def demo_words() -> list[str]:
    """Every word the demo captions use (dmad.demo.shapes.caption), sorted."""
    from dmad.demo import shapes

    words = set(shapes.SHAPES) | set(shapes.COLOURS) | set(shapes.BACKGROUNDS) | set(shapes.SIZES)
    for position in shapes.POSITIONS:
        words.update(position.split())
    words.update("a at the in on background shape".split())  # "shape": a caption that leaves the shape out
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
    from dmad.models.tokenizers import byte_level_vocab

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


def demo_tokenizer():
    from transformers import CLIPTokenizer

    vocab, merges = demo_vocab()
    return CLIPTokenizer(vocab=vocab, merges=merges, model_max_length=TEACHER_MAX_LENGTH)


def _text_encoder(tokenizer):
    from transformers import CLIPTextConfig, CLIPTextModelWithProjection

    vocab = tokenizer.get_vocab()
    eos = vocab["<|endoftext|>"]
    return CLIPTextModelWithProjection(CLIPTextConfig(
        vocab_size=len(vocab), hidden_size=TEACHER_TEXT_DIM, intermediate_size=4 * TEACHER_TEXT_DIM,
        num_hidden_layers=TEACHER_TEXT_LAYERS, num_attention_heads=2, max_position_embeddings=TEACHER_MAX_LENGTH,
        projection_dim=TEACHER_TEXT_DIM, bos_token_id=vocab["<|startoftext|>"], eos_token_id=eos, pad_token_id=eos))


def build_vae(channels: tuple[int, ...] = TEACHER_VAE_CHANNELS):
    from diffusers import AutoencoderKL

    # shift_factor must be a number: StableDiffusion3Pipeline decodes latents / scale + shift
    return AutoencoderKL(
        in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * len(channels),
        up_block_types=("UpDecoderBlock2D",) * len(channels), block_out_channels=tuple(channels),
        latent_channels=TEACHER_LATENT_CHANNELS, layers_per_block=1, norm_num_groups=TEACHER_NORM_GROUPS,
        sample_size=TEACHER_IMAGE_SIZE, scaling_factor=1.0, shift_factor=0.0)


def null_t5():
    """SD3's third text-encoder slot: a T5 encoder whose every weight is zero, so its output is
    exactly the zeros StableDiffusion3Pipeline feeds when there is no T5. The teacher has no T5
    conditioning; the slot is filled only because diffusers 0.42 refuses to load an SD3 folder
    without text_encoder_3 unless the caller passes text_encoder_3=None, and the demo teacher
    must load with no arguments. One layer, 128 wide: ~0.1 M zeros."""
    from transformers import T5Config, T5EncoderModel

    from dmad.models.tokenizers import tiny_t5_tokenizer

    tokenizer = tiny_t5_tokenizer(model_max_length=SD3_ZERO_TOKENS)
    encoder = T5EncoderModel(T5Config(
        vocab_size=len(tokenizer), d_model=2 * TEACHER_TEXT_DIM, d_ff=8, d_kv=8, num_layers=1, num_heads=1,
        relative_attention_num_buckets=8, feed_forward_proj="relu", pad_token_id=0, eos_token_id=1,
        decoder_start_token_id=0))
    for p in encoder.parameters():
        p.data.zero_()
    return tokenizer, encoder


def build_teacher(seed: int = 0, layers: int = TEACHER_LAYERS, vae_channels: tuple[int, ...] = TEACHER_VAE_CHANNELS):
    """A randomly initialised demo teacher: StableDiffusion3Pipeline on the CPU, fp32."""
    import torch
    from diffusers import FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel, StableDiffusion3Pipeline

    torch.manual_seed(seed)
    tokenizer = demo_tokenizer()
    te1, te2 = _text_encoder(tokenizer), _text_encoder(tokenizer)
    latent = TEACHER_IMAGE_SIZE // 2 ** (len(vae_channels) - 1)
    transformer = SD3Transformer2DModel(
        sample_size=latent, patch_size=TEACHER_PATCH, in_channels=TEACHER_LATENT_CHANNELS,
        out_channels=TEACHER_LATENT_CHANNELS,
        num_layers=layers, attention_head_dim=32, num_attention_heads=TEACHER_WIDTH // 32,
        joint_attention_dim=2 * TEACHER_TEXT_DIM, caption_projection_dim=TEACHER_WIDTH,
        pooled_projection_dim=2 * TEACHER_TEXT_DIM,
        pos_embed_max_size=2 * latent // TEACHER_PATCH)  # an 8x8 token grid at 64 px; room for 16x16 (128 px)
    # shift 1: at 16x16 latents there is no high-resolution redundancy to shift noise towards
    scheduler = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=1.0)
    with torch.random.fork_rng():  # all zeros anyway: leave the other parts' initialisation as it was
        tokenizer_3, text_encoder_3 = null_t5()
    return StableDiffusion3Pipeline(transformer=transformer, scheduler=scheduler, vae=build_vae(vae_channels),
                                    text_encoder=te1, tokenizer=tokenizer, text_encoder_2=te2,
                                    tokenizer_2=demo_tokenizer(), text_encoder_3=text_encoder_3,
                                    tokenizer_3=tokenizer_3)


TEACHER_PARTS = ("transformer", "vae", "text_encoder", "text_encoder_2", "text_encoder_3")


def parameter_counts(pipe) -> dict[str, int]:
    counts = {name: sum(p.numel() for p in getattr(pipe, name).parameters()) for name in TEACHER_PARTS}
    counts["total"] = sum(counts.values())
    return counts
