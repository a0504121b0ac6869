"""What `dmad export` writes, named once for the engine, its command line and the app."""
from __future__ import annotations

FORMATS = ("diffusers", "lora", "lora-single-file", "single-file")
LORA_FORMATS = ("lora", "lora-single-file")  # LoRA students only
DTYPES = ("fp32", "fp16", "bf16")  # the saved weights' precision; fp32: as trained
# the file in a diffusers LoRA folder: what `--format lora` writes, load_lora_weights' default, and
# what a folder in identity.teacher_loras must hold
LORA_WEIGHT_NAME = "pytorch_lora_weights.safetensors"
