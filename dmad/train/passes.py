"""Training compute, counted: every network pass of every network an iteration runs.

Two methods are compared fairly only at equal compute, and "teacher passes" alone flatters a
method that runs more networks (DMAD's fake score runs forward and backward every iteration;
the consistency peer has none). PassCounter counts, per network (teacher, student, fake score, GAN head), the
images each forward call processed (the batch of its first tensor argument: a CFG teacher pass on
B images counts 2B) and, when that forward's output carries a graph, the same number again as a
backward pass. In forward-pass equivalents a backward counts as two forwards (its two matrix
products per layer), so a network's cost is forward + 2 x backward image-passes. The student's
backward-simulation rollouts and the consistency peer's EMA-target pass (the student's module with the EMA
weights) count as student forwards. Gradient checkpointing's recomputation is not counted (it
re-runs blocks inside the network, not the network). Validation and teacher samples are not
training and are not counted: only what runs inside `counting()`.

The counts live in each checkpoint's training_state.json (network_passes), so they continue
across resumes, and ride on the `finished` / `stopped` events and the metric events.
"""
from __future__ import annotations

import contextlib
from typing import Iterator, Optional

import torch
from torch import nn


def _rows(args: tuple, kwargs: dict) -> int:
    for a in (*args, *kwargs.values()):
        if isinstance(a, torch.Tensor) and a.ndim > 0:
            return int(a.shape[0])
    return 0


def _carries_graph(out) -> bool:
    if isinstance(out, torch.Tensor):
        return out.requires_grad
    if isinstance(out, (tuple, list)):
        return any(_carries_graph(o) for o in out)
    if isinstance(out, dict):
        return any(_carries_graph(o) for o in out.values())
    sample = getattr(out, "sample", None)  # diffusers' output dataclasses
    return isinstance(sample, torch.Tensor) and sample.requires_grad


def network_size(net: nn.Module, adapters: bool = True) -> int:
    """The parameters one forward of `net` runs through: its weights, plus, for a view on one
    shared frozen base (dmad.models.shared_base.AdapterView: the teacher with its adapters off, a
    LoRA student or fake score with its adapter on), the base's weights, which a view holds outside
    its own parameters (its parameters are its adapter's). LoRA weights count for the network they
    are part of (`adapters`); the shared base itself carries every view's adapters, so its own
    size, the reference, counts without them (adapters=False)."""
    size = sum(p.numel() for n, p in net.named_parameters() if adapters or "lora_" not in n)
    base = getattr(getattr(net, "shared", None), "base", None)
    if isinstance(base, nn.Module):
        size += sum(p.numel() for n, p in base.named_parameters() if "lora_" not in n)
    return size


class PassCounter:
    """Image-passes per network while `counting()`: {name: {"forward": n, "backward": n}}, and
    their cost in passes of the teacher's denoiser (equivalents): each network's forward + 2 x
    backward image-passes, weighted by its parameter count over the denoiser's (network_size: a
    LoRA student carries its frozen base, a separate copy or the shared one: about 1; the GAN
    head: a few percent). Parameters stand in for
    FLOPs per image: exact for a network of dense layers on the same tokens, an approximation
    for convolutions at other resolutions."""

    def __init__(self, networks: dict[str, Optional[nn.Module]], reference: nn.Module, start: Optional[dict] = None):
        self.counts: dict[str, dict[str, int]] = {}
        self.weights: dict[str, float] = {}
        self._active = False
        self._handles = []
        self._name_of: dict[int, str] = {}
        ref = max(1, network_size(reference, adapters=False))
        for name, net in networks.items():
            if net is None:
                continue
            if id(net) in self._name_of:  # one module in two roles: one row named for both
                old = self._name_of[id(net)]
                self._name_of[id(net)] = joined = f"{old}+{name}"
                self.counts[joined], self.weights[joined] = self.counts.pop(old), self.weights.pop(old)
                continue
            self._name_of[id(net)] = name
            self.counts[name] = {"forward": 0, "backward": 0}
            self.weights[name] = network_size(net) / ref
            self._handles.append(net.register_forward_hook(self._hook, with_kwargs=True))
        self.start_from(start)

    def start_from(self, counts: Optional[dict]) -> None:
        """Continue the counts a checkpoint kept (training_state.json's network_passes; None or {}
        before they were counted): what is not a count of a network here is ignored."""
        for name, c in (counts or {}).items():
            if name in self.counts and isinstance(c, dict):
                for k in ("forward", "backward"):
                    if isinstance(c.get(k), int) and not isinstance(c.get(k), bool) and c[k] >= 0:
                        self.counts[name][k] = c[k]

    def _hook(self, module, args, kwargs, output) -> None:
        if not self._active:
            return
        c = self.counts[self._name_of[id(module)]]
        rows = _rows(args, kwargs)
        c["forward"] += rows
        if torch.is_grad_enabled() and _carries_graph(output):
            c["backward"] += rows

    @contextlib.contextmanager
    def counting(self) -> Iterator[None]:
        self._active = True
        try:
            yield
        finally:
            self._active = False

    def equivalents(self) -> dict[str, float]:
        """Per network, its forward + 2 x backward image-passes; "total": their sum weighted by
        each network's size, in image-passes of the teacher's denoiser."""
        out: dict[str, float] = {name: c["forward"] + 2 * c["backward"] for name, c in self.counts.items()}
        out["total"] = round(sum(v * self.weights[n] for n, v in out.items()), 1)
        return out

    def state(self) -> dict:
        """What training_state.json keeps: the raw counts and each network's weight."""
        return {name: {**c, "weight": round(self.weights[name], 6)} for name, c in self.counts.items()}

    def close(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
