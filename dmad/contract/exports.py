"""What `dmad export` writes, named once for the engine, its command line and the app."""
from __future__ import annotations

FORMATS = ("diffusers", "lora", "lora-single-file")
LORA_FORMATS = ("lora", "lora-single-file")  # LoRA students only
DTYPES = ("fp32", "fp16", "bf16")  # the saved weights' precision; fp32: as trained
