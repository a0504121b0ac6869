"""Optimizer and grad-scaler states as files that cannot run code: safetensors for the tensors,
JSON for the rest (checkpoint format 2; dmad.models.checkpoint).

optimizer_<name>.safetensors: tensor `state.<param index>.<key>` for each tensor of the per-
parameter state (Adam: step, exp_avg, exp_avg_sq); the header metadata holds `param_groups` (JSON:
learning rates, betas, the parameter indices) and `scalars` (JSON: per-parameter values that are
not tensors, e.g. SGD's momentum_buffer None). A torch.optim state_dict round-trips exactly.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from dmad.contract.regular import read_regular

OPTIMIZER_FORMAT = "dmad-optimizer-1"


def split_state(sd: dict) -> tuple[dict[str, torch.Tensor], dict, list]:
    """A torch.optim state_dict as (tensors named `state.<param index>.<key>`, the other
    per-parameter values {index: {key: value}}, param_groups): what a tensor file and JSON hold.
    The tensors are the state's own (sharded ones stay sharded)."""
    tensors, scalars = {}, {}
    for idx, state in sd["state"].items():
        for key, value in state.items():
            if isinstance(value, torch.Tensor):
                tensors[f"state.{idx}.{key}"] = value
            else:
                scalars.setdefault(str(idx), {})[key] = value
    return tensors, scalars, sd["param_groups"]


def join_state(tensors: dict, scalars: dict, groups: list) -> dict:
    """split_state's parts back into a state_dict (JSON lists of betas made tuples again)."""
    state: dict[int, dict] = {}
    for name, value in tensors.items():
        _, idx, key = name.split(".", 2)
        state.setdefault(int(idx), {})[key] = value
    for idx, values in scalars.items():
        state.setdefault(int(idx), {}).update(values)
    for g in groups:
        if isinstance(g.get("betas"), list):
            g["betas"] = tuple(g["betas"])  # what torch.optim.Adam makes (JSON has no tuples)
    return {"state": dict(sorted(state.items())), "param_groups": groups}


def save_optimizer(opt: torch.optim.Optimizer, path: Path) -> None:
    tensors, scalars, groups = split_state(opt.state_dict())
    meta = {"format": OPTIMIZER_FORMAT, "param_groups": json.dumps(groups), "scalars": json.dumps(scalars)}
    save_file({k: v.detach().contiguous().cpu() for k, v in tensors.items()}, str(path), metadata=meta)


def read_optimizer(path: Path, tensors: bool = True) -> dict:
    """The state_dict save_optimizer wrote (tensors=False: the metadata only, a cheap check).
    ValueError / KeyError / SafetensorError when the file is not one (the caller names the
    checkpoint)."""
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
        if meta.get("format") != OPTIMIZER_FORMAT:
            raise ValueError(f"not a {OPTIMIZER_FORMAT} file (format {meta.get('format')!r})")
        groups, scalars = json.loads(meta["param_groups"]), json.loads(meta["scalars"])
        if not isinstance(groups, list) or not all(isinstance(g, dict) for g in groups) or not isinstance(scalars, dict):
            raise ValueError("param_groups or scalars have the wrong type")
        stored = {name: f.get_tensor(name) if tensors else None for name in f.keys()}
    return join_state(stored, scalars, groups)


def save_scaler(scaler, path: Path) -> None:
    path.write_text(json.dumps(scaler.state_dict()) + "\n", encoding="utf-8")


def read_scaler(path: Path) -> dict:
    d = json.loads(read_regular(path).decode("utf-8"))
    if not isinstance(d, dict):
        raise ValueError("not a JSON object")
    return d
