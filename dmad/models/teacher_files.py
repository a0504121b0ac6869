"""What a teacher's files say, read without its weights: the pieces dmad.models.teacher (SD 1.x/2.x),
dmad.models.pipelines (SDXL, SD3, Flux) and dmad.models.families share, kept here so that each of
them imports this module at its top and none has to import another lazily to avoid a cycle.

JSON configs and safetensors headers (tensors are never read); which .safetensors files
from_pretrained will read; the stored dtype; TeacherInfo, what inspection finds; LORA_TARGETS, the
layers a LoRA adapts; and encode_prompts, SD's text encoding, which the SD families call. Imports
neither torch nor diffusers: encode_prompts only calls the modules it is given.
"""
from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from dmad.errors import UserInputError

if TYPE_CHECKING:
    import torch

PICKLE_SUFFIXES = (".ckpt", ".pt", ".pth", ".bin", ".pkl")
# The layers a LoRA adapts (dmad.models.networks.add_lora, diffusers' LoRA scripts, DMD2).
LORA_TARGETS = ("to_q", "to_k", "to_v", "to_out.0")
SAFETENSORS_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
                      "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2"}


@dataclass(frozen=True)
class TeacherInfo:
    """What the configs and file headers say about a teacher; no weights are read to make it."""

    path: str                   # the teacher as given: a pipeline folder or a .safetensors file
    kind: str                   # "folder" | "single_file"
    config_dir: str             # configs + tokenizer: `path` itself, or teacher_config_dir
    family: str                 # "sd1" | "sd2"
    prediction_type: str        # "epsilon" | "v_prediction"
    param_counts: dict[str, int]              # unet, vae, text_encoder
    weights_dtype: dict[str, Optional[str]]   # stored dtype (most bytes), e.g. "float16"; None: no weights
    weights_present: dict[str, bool]
    weights_files: dict[str, tuple[str, ...]]
    missing_weights: tuple[str, ...]          # one readable line per missing component
    sample_size: int            # UNet latent side it was trained at (SD 1.5: 64, i.e. 512 px)
    vae_scale_factor: int       # pixels per latent pixel: 2 ** (len(vae block_out_channels) - 1)
    latent_channels: int
    unet_block_out_channels: tuple[int, ...]
    bottleneck_channels: int    # unet block_out_channels[-1]: the mid-block width the GAN head reads
    text_hidden_size: int       # D of the text embeddings: 768 (SD 1.x), 1024 (SD 2.x)
    unet_lora_params_per_rank: int  # sum(in + out) over the LORA_TARGETS linears: adapter = rank * this
    denoiser: str = "unet"          # the denoiser's component name: "unet" | "transformer"
    denoiser_config: dict = field(default_factory=dict)  # its resolved config (transformer widths for the ledger)
    components: tuple[str, ...] = ("unet", "vae", "text_encoder", "tokenizer", "scheduler")
    lora_targets: tuple[str, ...] = LORA_TARGETS
    text_tokens: Optional[int] = None  # context tokens per transformer block (SD3: CLIP + 256 T5 or 1); None: the family's

    @property
    def has_weights(self) -> bool:
        return not self.missing_weights

    @property
    def denoiser_params(self) -> int:
        return self.param_counts[self.denoiser]

    @property
    def frozen_params(self) -> int:
        """VAE + every text encoder."""
        return sum(n for c, n in self.param_counts.items() if c != self.denoiser)


# --------------------------------------------------------------------------- files and headers

def read_json(f: Path) -> dict:
    """A JSON object from a teacher's config file; UserInputError (one line naming the file) otherwise."""
    try:
        data = json.loads(f.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        raise UserInputError(f"{f}: cannot read ({e.__class__.__name__}: {e})") from e
    except json.JSONDecodeError as e:
        raise UserInputError(f"{f}:{e.lineno}:{e.colno}: invalid JSON: {e.msg}") from e
    if not isinstance(data, dict):
        raise UserInputError(f"{f}: expected a JSON object")
    return data


def read_safetensors_header(f: Path) -> dict[str, dict]:
    """{tensor name: {"dtype", "shape", "data_offsets"}} from the file's JSON header (a few KB to
    a few hundred KB; tensors are never read). Also checks that the file is long enough for every
    tensor, so a truncated download fails here with its name, not halfway through loading."""
    try:
        size = f.stat().st_size
        with open(f, "rb") as fh:
            n = int.from_bytes(fh.read(8), "little")
            if not 2 <= n <= size - 8:
                raise ValueError(f"header length {n} does not fit a {size}-byte file")
            header = json.loads(fh.read(n))
        header.pop("__metadata__", None)
        end = max((int(t["data_offsets"][1]) for t in header.values()), default=0)
    except (OSError, ValueError, KeyError, TypeError, AttributeError, IndexError) as e:
        raise UserInputError(f"{f}: not a readable .safetensors file ({e.__class__.__name__}: {e})") from e
    if 8 + n + end > size:
        raise UserInputError(f"{f}: truncated .safetensors file ({size} bytes; its header needs {8 + n + end})")
    return header


def _folder_weights(d: Path, base: str) -> tuple[Path, ...]:
    """The .safetensors files from_pretrained will read: <base>.safetensors, the shards of
    <base>.safetensors.index.json, or one variant such as <base>.fp16.safetensors. () if none."""
    if (d / f"{base}.safetensors").is_file():
        return (d / f"{base}.safetensors",)
    index = d / f"{base}.safetensors.index.json"
    if index.is_file():
        shards = tuple(d / s for s in sorted(set(read_json(index).get("weight_map", {}).values())))
        return shards if shards and all(s.is_file() for s in shards) else ()
    variants = sorted(d.glob(f"{base}.*.safetensors"))
    return (variants[0],) if variants else ()


def weight_variant(f: str) -> Optional[str]:
    """The variant of a weight file name, as from_pretrained's `variant=` wants it; None: none."""
    parts = Path(f).name.split(".")  # diffusion_pytorch_model.fp16.safetensors -> fp16
    return parts[1] if len(parts) == 3 else None


def weights_in_folder(p: Path, bases: dict[str, str]) -> tuple[dict, dict, tuple[str, ...]]:
    """({component: weight files}, {component: their headers}, missing-weight lines) for the
    components of `bases` ({component: file base name}, e.g. unet: diffusion_pytorch_model)."""
    files, headers, missing = {}, {}, []
    for c, base in bases.items():
        files[c] = _folder_weights(p / c, base)
        headers[c] = [read_safetensors_header(f) for f in files[c]]
        if not files[c]:
            pickles = [f.name for f in sorted((p / c).glob("*")) if f.suffix.lower() in PICKLE_SUFFIXES]
            hint = (f" (found only {', '.join(pickles)}: pickle checkpoints are never loaded; convert to .safetensors)"
                    if pickles else "")
            missing.append(f"{p / c / base}.safetensors{hint}")
    return files, headers, tuple(missing)


def stored_dtype(headers: list[dict]) -> Optional[str]:
    """The dtype of most tensor elements in `headers` (as torch names it, e.g. "float16"); None: no tensors."""
    nbytes: Counter = Counter()
    for h in headers:
        for t in h.values():
            nbytes[t["dtype"]] += math.prod(t["shape"])
    if not nbytes:
        return None
    code = nbytes.most_common(1)[0][0]
    return SAFETENSORS_DTYPES.get(code, code.lower())


# --------------------------------------------------------------------------- prompts

def encode_prompts(tokenizer: Any, text_encoder: Any, prompts: list[str], device: Any) -> torch.Tensor:
    """(B, L, D) text embeddings the way StableDiffusionPipeline makes them: pad/truncate to
    L = tokenizer.model_max_length (77 for SD), last hidden state of width D (768 / 1024)."""
    tok = tokenizer(list(prompts), padding="max_length", max_length=tokenizer.model_max_length,
                    truncation=True, return_tensors="pt")
    mask = tok.attention_mask.to(device) if getattr(text_encoder.config, "use_attention_mask", False) else None
    return text_encoder(tok.input_ids.to(device), attention_mask=mask)[0]
