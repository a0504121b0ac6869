"""Configs-only pipeline folders of the real published models (no weights, nothing downloaded).

The memory ledger reads configs alone (dmad.models.teacher.inspect_teacher builds every network on
the meta device), so a folder with model_index.json, each component's config and placeholder
tokenizer files is enough to get the ledger's figures for SDXL base 1.0, SD3-medium, SD3.5-large
and FLUX.1-dev. The configs below are written out by hand after the published diffusers configs of
those repositories (stabilityai/stable-diffusion-xl-base-1.0, stabilityai/stable-diffusion-3-medium-
diffusers, stabilityai/stable-diffusion-3.5-large, black-forest-labs/FLUX.1-dev); only the keys that
change the architecture are given, the rest are the libraries' defaults. PUBLISHED holds the
parameter counts the model cards and the safetensors files state; tests/engine/test_memory.py
checks the meta models against them within 1%.

The tokenizer folders hold a tokenizer_config.json and a one-entry vocabulary: inspect_teacher
only checks that tokenizer files are there; these folders cannot tokenize anything and no test
loads them.
"""
from __future__ import annotations

import json
from pathlib import Path

CLIP_L = {"architectures": ["CLIPTextModel"], "hidden_size": 768, "intermediate_size": 3072,
          "num_hidden_layers": 12, "num_attention_heads": 12, "max_position_embeddings": 77, "vocab_size": 49408,
          "projection_dim": 768, "hidden_act": "quick_gelu", "bos_token_id": 0, "eos_token_id": 2,
          "model_type": "clip_text_model", "torch_dtype": "float16"}
CLIP_G = {"architectures": ["CLIPTextModelWithProjection"], "hidden_size": 1280, "intermediate_size": 5120,
          "num_hidden_layers": 32, "num_attention_heads": 20, "max_position_embeddings": 77, "vocab_size": 49408,
          "projection_dim": 1280, "hidden_act": "gelu", "bos_token_id": 0, "eos_token_id": 2,
          "model_type": "clip_text_model", "torch_dtype": "float16"}
T5_XXL = {"architectures": ["T5EncoderModel"], "d_model": 4096, "d_ff": 10240, "d_kv": 64, "num_heads": 64,
          "num_layers": 24, "vocab_size": 32128, "feed_forward_proj": "gated-gelu", "dense_act_fn": "gelu_new",
          "is_gated_act": True, "relative_attention_num_buckets": 32, "relative_attention_max_distance": 128,
          "layer_norm_epsilon": 1e-6, "tie_word_embeddings": False, "model_type": "t5", "torch_dtype": "float16"}
VAE_BASE = {"_class_name": "AutoencoderKL", "act_fn": "silu", "block_out_channels": [128, 256, 512, 512],
            "down_block_types": ["DownEncoderBlock2D"] * 4, "up_block_types": ["UpDecoderBlock2D"] * 4,
            "in_channels": 3, "out_channels": 3, "layers_per_block": 2, "norm_num_groups": 32, "sample_size": 1024}
VAE_SDXL = {**VAE_BASE, "latent_channels": 4, "scaling_factor": 0.13025, "force_upcast": True}
VAE_16 = {**VAE_BASE, "latent_channels": 16, "use_quant_conv": False, "use_post_quant_conv": False,
          "force_upcast": True}
VAE_SD3 = {**VAE_16, "scaling_factor": 1.5305, "shift_factor": 0.0609}
VAE_FLUX = {**VAE_16, "scaling_factor": 0.3611, "shift_factor": 0.1159}

VAE_SD15 = {**VAE_BASE, "latent_channels": 4, "scaling_factor": 0.18215, "sample_size": 512}
UNET_SD15 = {
    "_class_name": "UNet2DConditionModel", "act_fn": "silu", "attention_head_dim": 8,
    "block_out_channels": [320, 640, 1280, 1280], "cross_attention_dim": 768,
    "down_block_types": ["CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"],
    "up_block_types": ["UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"],
    "downsample_padding": 1, "flip_sin_to_cos": True, "freq_shift": 0, "in_channels": 4, "out_channels": 4,
    "layers_per_block": 2, "mid_block_scale_factor": 1, "norm_eps": 1e-5, "norm_num_groups": 32, "sample_size": 64}
SD15_SCHEDULER = {"_class_name": "PNDMScheduler", "beta_schedule": "scaled_linear", "beta_start": 0.00085,
                  "beta_end": 0.012, "num_train_timesteps": 1000, "skip_prk_steps": True, "steps_offset": 1,
                  "set_alpha_to_one": False}
UNET_SDXL = {
    "_class_name": "UNet2DConditionModel", "act_fn": "silu", "addition_embed_type": "text_time",
    "addition_embed_type_num_heads": 64, "addition_time_embed_dim": 256, "attention_head_dim": [5, 10, 20],
    "block_out_channels": [320, 640, 1280], "cross_attention_dim": 2048,
    "down_block_types": ["DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"],
    "up_block_types": ["CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"],
    "flip_sin_to_cos": True, "freq_shift": 0, "in_channels": 4, "out_channels": 4, "layers_per_block": 2,
    "norm_eps": 1e-5, "norm_num_groups": 32, "projection_class_embeddings_input_dim": 2816, "sample_size": 128,
    "transformer_layers_per_block": [1, 2, 10], "use_linear_projection": True}
SD3_MEDIUM = {"_class_name": "SD3Transformer2DModel", "sample_size": 128, "patch_size": 2, "in_channels": 16,
              "out_channels": 16, "num_layers": 24, "attention_head_dim": 64, "num_attention_heads": 24,
              "joint_attention_dim": 4096, "caption_projection_dim": 1536, "pooled_projection_dim": 2048,
              "pos_embed_max_size": 192}
SD35_LARGE = {**SD3_MEDIUM, "num_layers": 38, "num_attention_heads": 38, "caption_projection_dim": 2432,
              "qk_norm": "rms_norm"}
FLUX_DEV = {"_class_name": "FluxTransformer2DModel", "patch_size": 1, "in_channels": 64, "num_layers": 19,
            "num_single_layers": 38, "attention_head_dim": 128, "num_attention_heads": 24,
            "joint_attention_dim": 4096, "pooled_projection_dim": 768, "guidance_embeds": True,
            "axes_dims_rope": [16, 56, 56]}

SDXL_SCHEDULER = {"_class_name": "EulerDiscreteScheduler", "beta_schedule": "scaled_linear", "beta_start": 0.00085,
                  "beta_end": 0.012, "num_train_timesteps": 1000, "prediction_type": "epsilon", "steps_offset": 1,
                  "timestep_spacing": "leading", "interpolation_type": "linear", "use_karras_sigmas": False}
SD3_SCHEDULER = {"_class_name": "FlowMatchEulerDiscreteScheduler", "num_train_timesteps": 1000, "shift": 3.0}
FLUX_SCHEDULER = {"_class_name": "FlowMatchEulerDiscreteScheduler", "num_train_timesteps": 1000, "shift": 3.0,
                  "use_dynamic_shifting": True, "base_shift": 0.5, "max_shift": 1.15, "base_image_seq_len": 256,
                  "max_image_seq_len": 4096}

CLIP_TOK = ("transformers", "CLIPTokenizer")
T5_TOK = ("transformers", "T5TokenizerFast")
# model -> (pipeline class, {component: (library, class, config)}, {tokenizer: (library, class)})
MODELS = {
    "sd-v1-5": ("StableDiffusionPipeline", {
        "unet": ("diffusers", "UNet2DConditionModel", UNET_SD15), "vae": ("diffusers", "AutoencoderKL", VAE_SD15),
        "text_encoder": ("transformers", "CLIPTextModel", CLIP_L),
        "scheduler": ("diffusers", "PNDMScheduler", SD15_SCHEDULER)},
        {"tokenizer": CLIP_TOK}),
    "sdxl-base-1.0": ("StableDiffusionXLPipeline", {
        "unet": ("diffusers", "UNet2DConditionModel", UNET_SDXL), "vae": ("diffusers", "AutoencoderKL", VAE_SDXL),
        "text_encoder": ("transformers", "CLIPTextModel", CLIP_L),
        "text_encoder_2": ("transformers", "CLIPTextModelWithProjection", CLIP_G),
        "scheduler": ("diffusers", "EulerDiscreteScheduler", SDXL_SCHEDULER)},
        {"tokenizer": CLIP_TOK, "tokenizer_2": CLIP_TOK}),
    "sd3-medium": ("StableDiffusion3Pipeline", {
        "transformer": ("diffusers", "SD3Transformer2DModel", SD3_MEDIUM),
        "vae": ("diffusers", "AutoencoderKL", VAE_SD3),
        "text_encoder": ("transformers", "CLIPTextModelWithProjection", {**CLIP_L, "architectures": [
            "CLIPTextModelWithProjection"]}),
        "text_encoder_2": ("transformers", "CLIPTextModelWithProjection", CLIP_G),
        "text_encoder_3": ("transformers", "T5EncoderModel", T5_XXL),
        "scheduler": ("diffusers", "FlowMatchEulerDiscreteScheduler", SD3_SCHEDULER)},
        {"tokenizer": CLIP_TOK, "tokenizer_2": CLIP_TOK, "tokenizer_3": T5_TOK}),
    "flux-dev": ("FluxPipeline", {
        "transformer": ("diffusers", "FluxTransformer2DModel", FLUX_DEV),
        "vae": ("diffusers", "AutoencoderKL", VAE_FLUX),
        "text_encoder": ("transformers", "CLIPTextModel", CLIP_L),
        "text_encoder_2": ("transformers", "T5EncoderModel", T5_XXL),
        "scheduler": ("diffusers", "FlowMatchEulerDiscreteScheduler", FLUX_SCHEDULER)},
        {"tokenizer": CLIP_TOK, "tokenizer_2": T5_TOK}),
}
MODELS["sd3.5-large"] = (MODELS["sd3-medium"][0],
                         {**MODELS["sd3-medium"][1],
                          "transformer": ("diffusers", "SD3Transformer2DModel", SD35_LARGE)},
                         MODELS["sd3-medium"][2])

# Published parameter counts per component (model cards; sums of the released safetensors).
PUBLISHED = {
    "sd-v1-5": {"unet": 859_520_964, "vae": 83_653_863, "text_encoder": 123_060_480},
    "sdxl-base-1.0": {"unet": 2_567_463_684, "vae": 83_653_863, "text_encoder": 123_060_480,
                      "text_encoder_2": 694_659_840},
    "sd3-medium": {"transformer": 2_028_328_000, "vae": 83_819_683, "text_encoder": 123_650_304,
                   "text_encoder_2": 694_659_840, "text_encoder_3": 4_762_310_656},
    "sd3.5-large": {"transformer": 8_056_000_000, "vae": 83_819_683, "text_encoder": 123_650_304,
                    "text_encoder_2": 694_659_840, "text_encoder_3": 4_762_310_656},
    "flux-dev": {"transformer": 11_901_408_320, "vae": 83_819_683, "text_encoder": 123_060_480,
                 "text_encoder_2": 4_762_310_656},
}
FAMILY = {"sd-v1-5": "sd1", "sdxl-base-1.0": "sdxl", "sd3-medium": "sd3", "sd3.5-large": "sd3", "flux-dev": "flux"}


def _write(f: Path, data: dict) -> None:
    f.parent.mkdir(parents=True, exist_ok=True)
    f.write_text(json.dumps(data, indent=2), encoding="utf-8")


def write_real_config_folder(path: Path, model: str) -> Path:
    """A configs-only diffusers pipeline folder of `model` (a key of MODELS) at `path`: what
    inspect_teacher and the ledger need, no weights. Returns `path`."""
    pipeline, components, tokenizers = MODELS[model]
    path = Path(path)
    index = {"_class_name": pipeline, "_diffusers_version": "0.30.0"}
    for name, (library, cls, config) in components.items():
        index[name] = [library, cls]
        file = "scheduler_config.json" if name == "scheduler" else "config.json"
        _write(path / name / file, {k: v for k, v in config.items() if k != "_class_name"}
               | ({"_class_name": cls} if library == "diffusers" else {}))
    for name, (library, cls) in tokenizers.items():
        index[name] = [library, cls]
        _write(path / name / "tokenizer_config.json", {"tokenizer_class": cls,
                                                        "model_max_length": 77 if "CLIP" in cls else 512})
        if "CLIP" in cls:
            _write(path / name / "vocab.json", {"<|endoftext|>": 0})
            (path / name / "merges.txt").write_text("#version: 0.2\n", encoding="utf-8")
    _write(path / "model_index.json", index)
    return path


# --------------------------------------------------------------------------- docs/memory.md's table

CARD_GIB = 24.0  # a "24 GB" card (RTX 3090 / 4090: 24 GiB), before the display and other processes
TABLE_RUNS = [  # (model, configuration, resolution, estimate_ledger arguments beyond TABLE_BASE)
    ("sdxl-base-1.0", "full student + LoRA fake", 1024, dict(student="full", fake_score="lora")),
    ("sdxl-base-1.0", "full student + LoRA fake, gc", 1024, dict(student="full", fake_score="lora",
                                                                gradient_checkpointing=True)),
    ("sdxl-base-1.0", "LoRA/LoRA, separate copies, gc", 1024, dict(gradient_checkpointing=True,
                                                                  share_frozen_base=False)),
    ("sdxl-base-1.0", "LoRA/LoRA, gc", 1024, dict(gradient_checkpointing=True)),
    ("sdxl-base-1.0", "LoRA/LoRA", 1024, dict()),
    ("sdxl-base-1.0", "LoRA/LoRA, gc, int8 base + offload", 1024,
     dict(gradient_checkpointing=True, teacher_precision="int8", teacher_cpu_offload=True)),
    ("sd3-medium", "LoRA/LoRA, separate copies, gc", 1024, dict(gradient_checkpointing=True, share_frozen_base=False)),
    ("sd3-medium", "LoRA/LoRA, gc", 1024, dict(gradient_checkpointing=True)),
    ("sd3-medium", "LoRA/LoRA, int8 base + offload", 1024, dict(teacher_precision="int8", teacher_cpu_offload=True)),
    ("sd3-medium", "LoRA/LoRA, int8 base + offload, gc", 1024,
     dict(gradient_checkpointing=True, teacher_precision="int8", teacher_cpu_offload=True)),
    ("sd3.5-large", "LoRA/LoRA, separate copies, int8 teacher + offload, gc", 1024,
     dict(gradient_checkpointing=True, teacher_precision="int8", teacher_cpu_offload=True, share_frozen_base=False)),
    ("sd3.5-large", "LoRA/LoRA, int8 base, gc", 1024, dict(gradient_checkpointing=True, teacher_precision="int8")),
    ("sd3.5-large", "LoRA/LoRA, int8 base + offload, gc", 1024,
     dict(gradient_checkpointing=True, teacher_precision="int8", teacher_cpu_offload=True)),
    ("flux-dev", "LoRA/LoRA, separate copies, fp8 teacher + offload, gc", 1024,
     dict(gradient_checkpointing=True, teacher_precision="fp8", teacher_cpu_offload=True, share_frozen_base=False)),
    ("flux-dev", "LoRA/LoRA, fp8 base, gc", 1024, dict(gradient_checkpointing=True, teacher_precision="fp8")),
    ("flux-dev", "LoRA/LoRA, fp8 base + offload, gc", 1024,
     dict(gradient_checkpointing=True, teacher_precision="fp8", teacher_cpu_offload=True)),
    ("flux-dev", "LoRA/LoRA, gc", 1024, dict(gradient_checkpointing=True)),
    ("flux-dev", "LoRA/LoRA, int8 base + offload", 1024, dict(teacher_precision="int8", teacher_cpu_offload=True)),
    ("flux-dev", "full/full, gc", 1024, dict(student="full", fake_score="full", gradient_checkpointing=True)),
]
TABLE_BASE = dict(student="lora", fake_score="lora", lora_rank=64, mixed_precision="bf16", train_batch_size=1,
                  optimizer="adamw", gradient_checkpointing=False)
COLUMNS = ("teacher / shared base", "student", "fake score", "GAN head", "VAE", "text encoders",
           "offload transient", "saved base weights", "activations", "margin")


def _column(name: str) -> str:
    if "CPU RAM" in name:
        return "CPU RAM"
    if name.startswith("teacher offload"):
        return "offload transient"
    if name == "base weights saved for backward":
        return "saved base weights"
    for prefix, column in (("teacher", "teacher / shared base"), ("frozen base", "teacher / shared base"),
                           ("student", "student"), ("fake score", "fake score"), ("VAE", "VAE"),
                           ("text encoders", "text encoders")):
        if name.startswith(prefix):
            return column
    return name


def ledger_table(root: Path) -> str:
    """The markdown table of docs/memory.md: estimate_ledger on configs-only folders of the
    published models (written under `root`), batch 1, bf16, AdamW, LoRA rank 64; a LoRA/LoRA row
    shares one frozen base unless it says "separate copies" (resources.share_frozen_base)."""
    from dmad.memory.ledger import estimate_ledger, ledger_total
    from dmad.models.teacher import inspect_teacher

    infos = {m: inspect_teacher(str(write_real_config_folder(Path(root) / m, m))) for m, *_ in TABLE_RUNS}
    rows = ["| model (family) | configuration | px | " + " | ".join(COLUMNS) + f" | GPU total | fits {CARD_GIB:.0f} GiB"
            " | CPU RAM |", "|" + "---|" * (len(COLUMNS) + 6)]
    for model, label, resolution, changes in TABLE_RUNS:
        lines = estimate_ledger(infos[model], resolution=resolution, **{**TABLE_BASE, **changes})
        by: dict[str, float] = {}
        for line in lines:
            by[_column(line.name)] = by.get(_column(line.name), 0.0) + line.gib
        total = ledger_total(lines)
        cells = [f"{by[c]:.2f}" if c in by else "-" for c in COLUMNS]
        rows.append(f"| {model} ({lines.family}) | {label} | {resolution} | " + " | ".join(cells)
                    + f" | **{total:.1f}** | {'yes' if total <= CARD_GIB else 'no'} | "
                    + (f"{by['CPU RAM']:.1f}" if "CPU RAM" in by else "-") + " |")
    return "\n".join(rows)


SHARDING_MODELS = ("sdxl-base-1.0", "sd3.5-large", "flux-dev")
SHARDING_MODES = (  # (label, estimate_ledger arguments)
    ("ddp", dict(distributed="ddp")),
    ("fsdp", dict(distributed="fsdp")),
    ("fsdp, teacher sharded", dict(distributed="fsdp", fsdp_shard_teacher=True)),
    ("fsdp, teacher sharded, CPU offload", dict(distributed="fsdp", fsdp_shard_teacher=True, fsdp_cpu_offload=True)),
)
SHARDING_PROCESSES = (2, 4, 8)
CARDS_GIB = (24, 48, 80)  # RTX 3090 / 4090, A6000 / L40S, A100 / H100 80 GB


def sharding_table(root: Path) -> str:
    """docs/memory.md's "Full student and full fake score on several GPUs": the ledger's per-GPU
    total for DMAD full/full at 1024 px, bf16, AdamW, batch 1, gradient checkpointing, on 2, 4
    and 8 processes, ddp against fsdp; each cell names the cards it fits (24 / 48 / 80 GiB), and
    the CPU offload rows the host RAM of each process."""
    from dmad.memory.ledger import estimate_ledger, ledger_total
    from dmad.models.teacher import inspect_teacher

    base = dict(student="full", fake_score="full", lora_rank=64, mixed_precision="bf16", train_batch_size=1,
                optimizer="adamw", gradient_checkpointing=True, resolution=1024)
    rows = ["| model (family) | resources.distributed | " + " | ".join(f"{n} GPUs" for n in SHARDING_PROCESSES)
            + " |", "|---|---|" + "---|" * len(SHARDING_PROCESSES)]
    for model in SHARDING_MODELS:
        info = inspect_teacher(str(write_real_config_folder(Path(root) / model, model)))
        for label, mode in SHARDING_MODES:
            cells = []
            for n in SHARDING_PROCESSES:
                lines = estimate_ledger(info, processes=n, **base, **mode)
                total = ledger_total(lines)
                fits = [f"{c}" for c in CARDS_GIB if total <= c]
                cpu = sum(x.gib for x in lines if x.scope == "cpu")
                cells.append(f"**{total:.1f}** (fits {', '.join(fits) if fits else 'none'})"
                             + (f"; {cpu:.0f} GiB RAM per process" if cpu else ""))
            rows.append(f"| {model} ({info.family}) | {label} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


if __name__ == "__main__":  # python -m tests.engine.real_configs
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        print(ledger_table(Path(d)))
        print()
        print(sharding_table(Path(d)))
