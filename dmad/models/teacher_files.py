"""What a teacher's files say, read without its weights: the pieces dmad.models.teacher (SD 1.x/2.x),
dmad.models.pipelines (SDXL, SD3, Flux) and dmad.models.families share, kept here so that each of
them imports this module at its top and none has to import another lazily to avoid a cycle.

JSON configs and safetensors headers (tensors are never read); which .safetensors files
from_pretrained will read; the stored dtype; TeacherInfo, what inspection finds; LORA_TARGETS, the
layers a LoRA adapts; and encode_prompts, SD's text encoding, which the SD families call. Imports
neither torch nor diffusers: encode_prompts only calls the modules it is given.
"""
from __future__ import annotations

import math
import os
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from dmad.contract.jsonfile import MAX_FILE_BYTES, loads_json, path_problem, printable
from dmad.contract.paths import PICKLE_SUFFIXES
from dmad.errors import UserInputError

if TYPE_CHECKING:
    import torch

# The layers a LoRA adapts (dmad.models.networks.add_lora, diffusers' LoRA scripts, DMD2).
LORA_TARGETS = ("to_q", "to_k", "to_v", "to_out.0")
# identity.lora_targets: ATTENTION adapts LORA_TARGETS; WITH_FF adds a family's feed-forward layers
# (Family.ff_lora_targets). The config's Literal spells the same two words.
ATTENTION, WITH_FF = "attention", "attention+ff"
SAFETENSORS_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
                      "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2"}
# Bits per element of every dtype the safetensors format defines (its Dtype enum).
SAFETENSORS_BITS = {"BOOL": 8, "U8": 8, "I8": 8, "F8_E4M3": 8, "F8_E5M2": 8, "F8_E8M0": 8, "F4": 4, "F6_E2M3": 6,
                    "F6_E3M2": 6, "I16": 16, "U16": 16, "F16": 16, "BF16": 16, "I32": 32, "U32": 32, "F32": 32,
                    "I64": 64, "U64": 64, "F64": 64, "C64": 64}
MAX_HEADER_BYTES = 100_000_000  # the safetensors library's own limit


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
    ff_lora_params_per_rank: int = 0  # the same sum over the family's feed-forward linears (Family.ff_lora_targets)
    ff_lora_targets: tuple[str, ...] = ()
    text_tokens: Optional[int] = None  # context tokens per transformer block (SD3: CLIP + 256 T5 or 1); None: the family's
    shard_unit_params: int = 0  # the largest FSDP unit's own parameters (dmad.models.shard_units): one gather

    @property
    def has_weights(self) -> bool:
        return not self.missing_weights

    def lora_params_per_rank(self, scope: str = ATTENTION) -> int:
        """A LoRA adapter's parameters per unit of rank on identity.lora_targets' layers."""
        return self.unet_lora_params_per_rank + (self.ff_lora_params_per_rank if scope == WITH_FF else 0)

    def for_lora_targets(self, scope: str) -> "TeacherInfo":
        """This teacher as a run with identity.lora_targets `scope` trains it: its LoRA adapters'
        layers and size per rank (what the ledger and checkpoint sizes read)."""
        if scope != WITH_FF:
            return self
        return replace(self, unet_lora_params_per_rank=self.lora_params_per_rank(scope),
                       lora_targets=tuple(self.lora_targets) + tuple(self.ff_lora_targets),
                       ff_lora_params_per_rank=0, ff_lora_targets=())

    @property
    def denoiser_params(self) -> int:
        return self.param_counts[self.denoiser]

    @property
    def frozen_params(self) -> int:
        """VAE + every text encoder."""
        return sum(n for c, n in self.param_counts.items() if c != self.denoiser)


def lora_linear_params(denoiser: "torch.nn.Module", targets: tuple[str, ...]) -> int:
    """sum(in + out) over the denoiser's linear layers a LoRA on `targets` adapts (peft matches a
    module whose name ends with a target): a rank-r adapter has r times this many parameters."""
    import torch

    return sum(m.in_features + m.out_features for n, m in denoiser.named_modules()
               if isinstance(m, torch.nn.Linear) and any(n == t or n.endswith("." + t) for t in targets))


# --------------------------------------------------------------------------- files and headers

def read_json(f: Path) -> dict:
    """A JSON object from a teacher's config file; UserInputError (one line naming the file) otherwise."""
    try:
        if f.stat().st_size > MAX_FILE_BYTES:
            raise UserInputError(f"{printable(str(f))}: {f.stat().st_size} bytes is too large for a config file")
        text = f.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise UserInputError(f"{printable(str(f))}: cannot read ({e.__class__.__name__}: {printable(str(e))})") from e
    data = loads_json(text, str(f))
    if not isinstance(data, dict):
        raise UserInputError(f"{printable(str(f))}: expected a JSON object")
    return data


# --------------------------------------------------------------------------- config values

# Sizes a network config gives (channels, widths, heads, layer counts, vocabulary, sample size):
# keys ending so. Each must be a count, or a list of counts, before diffusers or transformers
# builds anything from it: NaN, -5 or "64" would fail deep inside their constructors.
SIZE_SUFFIXES = ("channels", "_dim", "dims", "_size", "heads", "groups", "embeddings", "layers", "_block",
                 "d_model", "d_ff", "d_kv")
MAX_SIZE = 2**24        # no real width, vocabulary or sample size comes near; keeps products finite
MAX_LAYERS = 256        # per entry: FLUX.1 has 57 blocks; each layer is Python objects even on the meta device
MAX_LIST = 32           # entries of a per-block list (down_block_types, block_out_channels: 3-4)
MAX_PARAMS = 200 * 10**9  # a teacher above this (4x FLUX.1) cannot be trained on one machine


def _flat(value: Any) -> list:
    """[1, [2, 3]] -> [1, 2, 3]: per-block values may nest (transformer_layers_per_block)."""
    out, stack = [], [value]
    while stack:
        v = stack.pop()
        if isinstance(v, list):
            stack.extend(reversed(v))
        else:
            out.append(v)
    return out


def _size_problem(key: str, value: Any) -> Optional[str]:
    limit = MAX_LAYERS if key.endswith(("layers", "_block")) else MAX_SIZE
    values = _flat(value)
    if len(values) > MAX_LIST * MAX_LIST:
        return f"{len(values)} entries (at most {MAX_LIST} per block)"
    for v in values:
        if v is not None and not (_is_count(v) and v <= limit):
            return f"{printable(str(v))[:40]} is not a whole number in [0, {limit}]"
    if key == "sample_size" and (not values or any(v is not None and v < 1 for v in values)):
        return "must be at least 1"
    return None


def check_config_values(cfg: dict, f: Path) -> None:
    """Refuse a network config whose sizes (SIZE_SUFFIXES keys) or lists could not build a network,
    or would build an absurd one, before any constructor runs: one line naming the file and key."""
    for key, value in cfg.items():
        if isinstance(value, list) and len(value) > MAX_LIST and key.endswith(SIZE_SUFFIXES + ("_types",)):
            raise UserInputError(f"{printable(str(f))}: {printable(key)}: {len(value)} entries (at most {MAX_LIST})")
        if key.endswith(SIZE_SUFFIXES) and not isinstance(value, (dict, bool)):  # tie_word_embeddings: a flag
            problem = _size_problem(key, value)
            if problem:
                raise UserInputError(f"{printable(str(f))}: {printable(key)}: {problem}")


def check_scheduler_values(cfg: dict, f: Path) -> None:
    """The numbers of a scheduler config that size arrays (num_train_timesteps betas)."""
    n = cfg.get("num_train_timesteps", 1000)
    if not (_is_count(n) and 1 <= n <= 100_000):
        raise UserInputError(f"{printable(str(f))}: num_train_timesteps {printable(str(n))[:40]} is not a whole "
                             f"number in [1, 100000]")


def check_param_count(counts: dict[str, int], cdir: Path) -> None:
    total = sum(counts.values())
    if total > MAX_PARAMS:
        raise UserInputError(f"{printable(str(cdir))}: the component configs describe {total / 1e9:,.0f} B "
                             f"parameters (more than {MAX_PARAMS // 10**9} B): not a teacher this engine can train")


def _is_count(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _tensor_problem(t: Any) -> Optional[str]:
    """Why a header entry is not {"dtype": known, "shape": [n, ...], "data_offsets": [begin, end]}
    with end - begin the bytes that dtype and shape need; None when it is."""
    if not isinstance(t, dict):
        return "entry is not an object"
    dtype, shape, offsets = t.get("dtype"), t.get("shape"), t.get("data_offsets")
    if dtype not in SAFETENSORS_BITS:
        return f"unknown dtype {printable(str(dtype))[:40]!r}"
    if not isinstance(shape, list) or len(shape) > 16 or not all(_is_count(n) for n in shape):
        return f"shape {printable(str(shape))[:60]} is not a list of sizes"
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_count(o) for o in offsets)
            and offsets[0] <= offsets[1]):
        return f"data_offsets {printable(str(offsets))[:60]} are not [begin, end]"
    need = (math.prod(shape) * SAFETENSORS_BITS[dtype] + 7) // 8
    if offsets[1] - offsets[0] != need:
        return f"data_offsets span {offsets[1] - offsets[0]} bytes, but {dtype} {shape} needs {need}"
    return None


def _parse_header(f: Path, raw: bytes) -> dict[str, dict]:
    try:
        header = loads_json(raw.decode("utf-8"), f"{f} (safetensors header)")
    except UnicodeDecodeError as e:
        raise UserInputError(f"{printable(str(f))}: not a readable .safetensors file (header: {e})") from e
    if not isinstance(header, dict):
        raise UserInputError(f"{printable(str(f))}: not a readable .safetensors file (header is not a JSON object)")
    header.pop("__metadata__", None)
    for name, t in header.items():
        problem = _tensor_problem(t)
        if problem:
            raise UserInputError(f"{printable(str(f))}: not a readable .safetensors file (tensor "
                                 f"{printable(name)[:80]!r}: {problem})")
    return header


def read_safetensors_header(f: Path) -> dict[str, dict]:
    """{tensor name: {"dtype", "shape", "data_offsets"}} from the file's JSON header (a few KB to
    a few hundred KB; tensors are never read), each entry checked (known dtype, sizes, offsets that
    match them). Also checks that the file is long enough for every tensor, so a truncated download
    fails here with its name, not halfway through loading."""
    try:
        size = f.stat().st_size
        with open(f, "rb") as fh:
            n = int.from_bytes(fh.read(8), "little")
            if not 2 <= n <= min(size - 8, MAX_HEADER_BYTES):
                raise ValueError(f"header length {n} does not fit a {size}-byte file")
            raw = fh.read(n)
    except (OSError, ValueError) as e:
        raise UserInputError(f"{printable(str(f))}: not a readable .safetensors file ({e.__class__.__name__}: "
                             f"{printable(str(e))})") from e
    header = _parse_header(f, raw)
    end = max((t["data_offsets"][1] for t in header.values()), default=0)
    if 8 + n + end > size:
        raise UserInputError(f"{printable(str(f))}: truncated .safetensors file ({size} bytes; its header needs "
                             f"{8 + n + end})")
    return header


def _shard_names(index: Path) -> list[str]:
    """The shard files an index names, each a plain file name or a relative path inside the index's
    folder: a weight_map entry such as "../../x.safetensors" is refused, never followed. Checked on
    the names, not resolved: a folder of symlinks into a blob store (the Hugging Face cache) is fine."""
    weight_map = read_json(index).get("weight_map", {})
    if not isinstance(weight_map, dict):
        raise UserInputError(f"{printable(str(index))}: weight_map must be an object of tensor name -> file")
    for key, name in weight_map.items():
        if not _inside_name(index.parent, name):
            raise UserInputError(f"{printable(str(index))}: weight_map entry {printable(key)[:80]!r} names "
                                 f"{printable(str(name))[:120]!r}: not a .safetensors file inside "
                                 f"{printable(str(index.parent))}")
    return sorted(set(weight_map.values()))


def _inside_name(folder: Path, name: Any) -> bool:
    """`name` is a relative .safetensors path below `folder` that the OS can take."""
    if not isinstance(name, str) or not name or path_problem(str(folder / name)):
        return False
    parts = name.replace("\\", "/").split("/")
    return not os.path.isabs(name) and ".." not in parts and Path(name).suffix == ".safetensors"


def _folder_weights(d: Path, base: str) -> tuple[Path, ...]:
    """The .safetensors files from_pretrained will read: <base>.safetensors, the shards of
    <base>.safetensors.index.json, or one variant such as <base>.fp16.safetensors. () if none."""
    if (d / f"{base}.safetensors").is_file():
        return (d / f"{base}.safetensors",)
    index = d / f"{base}.safetensors.index.json"
    if index.is_file():
        shards = tuple(d / s for s in _shard_names(index))
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
