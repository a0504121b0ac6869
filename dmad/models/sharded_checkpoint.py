"""Sharded checkpoints of resources.distributed fsdp runs (dmad.train.sharding shards the networks;
dmad.models.checkpoint writes and reads the rest).

What is sharded: every *full* trained network (the student, the fake score) unit by unit
(dmad.models.shard_units: a UNet's ResNet blocks and attention layers, a transformer's blocks,
then what is left of each block), and the GAN head with the fake score (one optimizer steps both: its parameters must be all sharded or all
replicated). With resources.fsdp_shard_teacher the frozen teacher's denoiser too. LoRA networks
stay replicated (DDP through accelerate, as with ddp): an adapter is ~1-3% of the network, so
sharding it saves little and would add an all-gather to each of the ~5 network calls of an
iteration; the memory of a LoRA run is its frozen base.

Precision: the trained weights stay float32 (the master weights and optimizer states, sharded);
with mixed_precision bf16 each block is gathered and computed in bf16 and gradients are reduced in
float32 (MixedPrecisionPolicy). fsdp_cpu_offload keeps the shards in CPU memory (CPUOffloadPolicy).
fsdp runs shard at every world size, one process included (a process group of one), so a run's
checkpoints have one format whatever it was launched with.

Sharded checkpoints (checkpoints/iter_<N>/sharded/): torch.distributed.checkpoint with its
safetensors storage (HuggingFaceStorageWriter, save_distributed): each rank writes its own shards,
one file per part (each network, the EMA, each optimizer: a file is serialised in memory before it
is written, so this bounds the host memory a checkpoint adds to one part),
`shard-<rank+1>-model-<part>-of-<parts>.safetensors`, with each tensor's offset in the header, so
loading at another world size re-shards and nothing is ever unpickled (DCP's default storage
pickles its metadata). Keys: `<network>.<parameter name>` for the sharded networks,
`ema.shadow.<i>` for the student's EMA, `optimizer_<name>.state.<index>.<key>` for the sharded
optimizers' states; index.json (rank 0) holds the rest: the world size, which networks and
optimizers are there, the optimizers' param_groups and the EMA's counters. Everything that is
not sharded (LoRA networks, their optimizers, the RNG and training_state.json) is written by rank
0 as in any checkpoint. `dmad sample` and `dmad export` read the networks back in one process
(no_dist), into an ordinary diffusers model.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping, Optional

import torch
from torch import nn

from dmad.models.optim_state import join_state, split_state

SHARDED_DIR = "sharded"
INDEX = "index.json"
SHARDED_FORMAT = "dmad-sharded-1"


# --------------------------------------------------------------------------- sharded checkpoints

def _state(modules: Mapping[str, nn.Module], ema: Optional[Any], optimizers: Mapping[str, dict]) -> dict:
    """The flat state dict of everything sharded (tensors only: what DCP's safetensors storage
    holds); `optimizers`: each one's split_state tensors."""
    out: dict[str, torch.Tensor] = {}
    for name, net in modules.items():
        for key, value in net.state_dict().items():
            out[f"{name}.{key}"] = value.detach()
    if ema is not None:
        for i, t in enumerate(ema.shadow_params):
            out[f"ema.shadow.{i}"] = t
    for name, tensors in optimizers.items():
        out.update({f"optimizer_{name}.{k}": v for k, v in tensors.items()})
    return out


def save_sharded(out: Path, modules: Mapping[str, nn.Module], ema: Optional[Any], optimizers: Mapping[str, Any],
                 is_main: bool) -> None:
    """Every rank calls it (a collective): `out`/sharded/ gets each rank's shards and rank 0's
    index.json. `modules` / `optimizers`: the sharded ones only; `ema`: the student's, when it
    is sharded."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import HuggingFaceStorageWriter

    folder = out / SHARDED_DIR
    split = {name: split_state(opt.state_dict()) for name, opt in optimizers.items()}
    state = _state(modules, ema, {name: tensors for name, (tensors, _, _) in split.items()})
    # one file per part (each network, the EMA, each optimizer) and rank: the writer serialises a
    # file in memory before writing it, so a rank's host memory rises by its largest part, not by
    # all of its shards at once
    parts = sorted({_part(k) for k in state})
    mapping = {k: parts.index(_part(k)) + 1 for k in state}
    dcp.save(state, storage_writer=HuggingFaceStorageWriter(str(folder), fqn_to_index_mapping=mapping,
                                                            save_distributed=True))
    if is_main:
        import torch.distributed as dist

        index = {"format": SHARDED_FORMAT, "world_size": dist.get_world_size() if dist.is_initialized() else 1,
                 "networks": sorted(modules),
                 "optimizers": {name: _jsonable(groups) for name, (_, _, groups) in split.items()},
                 "ema": None if ema is None else {"decay": ema.decay, "optimization_step": ema.optimization_step},
                 "optimizer_scalars": {name: scalars for name, (_, scalars, _) in split.items()}}
        (folder / INDEX).write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")


def _part(key: str) -> str:
    """The part a key belongs to: its network, "ema" or "optimizer_<name>"."""
    return key.split(".", 1)[0]


def _jsonable(groups: list) -> list:
    return json.loads(json.dumps(groups, default=lambda o: None))


def read_index(ckpt: Path) -> Optional[dict]:
    """The sharded part's index.json, or None when the checkpoint has no sharded part. ValueError
    when it is there but not one of ours."""
    from dmad.contract.regular import read_regular

    path = ckpt / SHARDED_DIR / INDEX
    if not (ckpt / SHARDED_DIR).exists():
        return None
    doc = json.loads(read_regular(path).decode("utf-8"))
    if not isinstance(doc, dict) or doc.get("format") != SHARDED_FORMAT:
        raise ValueError(f"{SHARDED_DIR}/{INDEX} is not a {SHARDED_FORMAT} index")
    if not isinstance(doc.get("networks"), list) or not isinstance(doc.get("optimizers"), dict):
        raise ValueError(f"{SHARDED_DIR}/{INDEX}: networks or optimizers have the wrong type")
    return doc


def index_or_none(ckpt: Path) -> Optional[dict]:
    """read_index, or None for an unreadable index too (verify_checkpoint says why)."""
    try:
        return read_index(ckpt)
    except (OSError, ValueError, UnicodeDecodeError, RecursionError):
        return None


def sharded_networks(ckpt: Path) -> list[str]:
    """The networks a checkpoint holds sharded ([] for none, or an unreadable index)."""
    index = index_or_none(ckpt)
    return list(index["networks"]) if index else []


def shard_files(ckpt: Path) -> list[Path]:
    return sorted((ckpt / SHARDED_DIR).glob("*.safetensors"))


def stored_shapes(ckpt: Path) -> dict[str, tuple[int, ...]]:
    """{key: full shape} of every tensor in the sharded part, from the safetensors headers alone."""
    from torch.distributed.checkpoint import HuggingFaceStorageReader

    md = HuggingFaceStorageReader(str(ckpt / SHARDED_DIR)).read_metadata()
    return {k: tuple(v.size) for k, v in md.state_dict_metadata.items()}


def _load(flat: dict, ckpt: Path) -> None:
    """Fill `flat` (its tensors, plain or sharded) in place from the sharded part: a collective when
    they are sharded, one process (no_dist) otherwise."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import HuggingFaceStorageReader
    from torch.distributed.tensor import DTensor

    import warnings

    sharded = any(isinstance(t, DTensor) for t in flat.values())
    with warnings.catch_warnings():  # one process by design (dmad sample, dmad export): not worth a warning
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(flat, storage_reader=HuggingFaceStorageReader(str(ckpt / SHARDED_DIR)),
                 no_dist=not (sharded and dist.is_initialized()))


def load_network_sharded(net: nn.Module, ckpt: Path, name: str) -> None:
    """The network `name` from the sharded part into `net` (sharded in a run, or an ordinary model
    in `dmad sample` / `dmad export`), in place. KeyError / RuntimeError when it does not fit."""
    sd = net.state_dict()
    flat = {f"{name}.{k}": v for k, v in sd.items()}
    _load(flat, ckpt)
    net.load_state_dict({k[len(name) + 1:]: v for k, v in flat.items()}, strict=True)


def load_ema_sharded(params: list[torch.Tensor], ckpt: Path) -> None:
    """The EMA's shadow tensors from the sharded part into `params` (the EMA's own shadow params in
    a run; the student's parameters when sampling with its EMA weights), in place."""
    flat = {f"ema.shadow.{i}": p.data for i, p in enumerate(params)}
    _load(flat, ckpt)  # DCP fills each tensor it is given


def load_optimizer_sharded(opt: Any, ckpt: Path, name: str, index: dict, shapes: dict) -> None:
    """An optimizer's state from the sharded part (collective): templates shaped like its
    parameters (sharded alike) or like the stored scalar, filled by DCP, then load_state_dict."""
    from torch.distributed.tensor import DTensor

    params = [p for g in opt.param_groups for p in g["params"]]
    prefix = f"optimizer_{name}.state."
    flat: dict[str, torch.Tensor] = {}
    for key, shape in shapes.items():
        if not key.startswith(prefix):
            continue
        p = params[int(key[len(prefix):].split(".", 1)[0])]
        if tuple(p.shape) == tuple(shape) and shape:
            flat[key] = torch.zeros_like(p, dtype=torch.float32) if isinstance(p, DTensor) else torch.zeros_like(p)
        else:
            flat[key] = torch.zeros(shape, dtype=torch.float32)
    _load(flat, ckpt)
    tensors = {k[len(f"optimizer_{name}."):]: v for k, v in flat.items()}
    opt.load_state_dict(join_state(tensors, index.get("optimizer_scalars", {}).get(name, {}),
                                   index["optimizers"][name]))


def finite_on_every_rank(tensors: Mapping[str, torch.Tensor]) -> Optional[str]:
    """The first key (on this rank) of a floating tensor holding NaN or Inf, checked shard by shard
    and the verdict shared by every rank (a collective where the tensors are sharded): "a shard"
    where only another rank's shard is bad. None when every value is finite."""
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    bad = None
    device = None
    for key, t in tensors.items():
        local = t.to_local() if isinstance(t, DTensor) else t
        device = device or local.device
        if bad is None and local.is_floating_point() and not bool(torch.isfinite(local).all()):
            bad = key
    if any(isinstance(t, DTensor) for t in tensors.values()) and dist.is_initialized() and dist.get_world_size() > 1:
        flag = torch.tensor([0.0 if bad is None else 1.0], device=device)
        dist.all_reduce(flag)
        if flag.item() > 0 and bad is None:
            bad = "a shard"
    return bad
