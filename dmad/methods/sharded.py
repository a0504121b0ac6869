"""Training steps over sharded networks (resources.distributed fsdp; dmad.train.sharding shards
them): what differs from a replicated network is gradient synchronisation (no_sync), gradient
clipping over sharded gradients and which objects accelerate prepares (DDP) at all.
"""
from __future__ import annotations

import contextlib
from typing import Any, Iterable, Iterator

import torch
from torch import nn


def is_sharded(net: nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(net, FSDPModule)


def reshard(*nets: nn.Module) -> None:
    """Free every gathered copy of these networks' sharded weights: the next call gathers them
    again from the shards. Called after changing the shards or their requires_grad outside a
    backward (an optimizer step, the critic frozen or thawed, EMA weights swapped in). FSDP2 keeps
    a root's weights gathered after a forward, and a root left gathered by a forward with no
    backward after it computes with its stale copy (a frozen critic's root layers got no
    gradient: measured on 2 processes). dmad.models.shard_units leaves diffusers' roots no weights
    of their own, so this guards what a unit could still hold. Replicated networks: nothing."""
    from torch.distributed.fsdp import FSDPModule

    for net in nets:
        for m in net.modules():
            if isinstance(m, FSDPModule):
                m.reshard()


@contextlib.contextmanager
def no_sync(acc: Any, net: nn.Module) -> Iterator[None]:
    """No gradient synchronisation inside (accumulation's inner micro-steps): FSDP2's
    set_requires_gradient_sync for a sharded network, accelerate's no_sync (DDP) otherwise."""
    if is_sharded(net):
        net.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            net.set_requires_gradient_sync(True)
    else:
        with acc.no_sync(net):
            yield


def clip_grad_norm(params: list[nn.Parameter], max_norm: float) -> float:
    """torch's clip over sharded gradients: the total norm is reduced over the ranks (a DTensor)."""
    from torch.distributed.tensor import DTensor

    norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
    return float(norm.full_tensor() if isinstance(norm, DTensor) else norm)


def all_finite(params: Iterable[torch.Tensor]) -> bool:
    """Whether every value of these (possibly sharded) tensors is finite, this rank's shards only."""
    from torch.distributed.tensor import DTensor

    return all(bool(torch.isfinite(p.to_local() if isinstance(p, DTensor) else p).all()) for p in params)


def is_sharded_optimizer(opt: Any) -> bool:
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for g in opt.param_groups for p in g["params"])


def prepare(acc: Any, *objects: Any) -> tuple:
    """accelerate's prepare (DDP for networks with several processes) for the replicated networks
    and their optimizers; sharded networks and optimizers over sharded parameters come back as
    they are (FSDP2 synchronises them itself). Order kept."""
    replicated = [o for o in objects if not (isinstance(o, nn.Module) and is_sharded(o))
                  and not (isinstance(o, torch.optim.Optimizer) and is_sharded_optimizer(o))]
    prepared = iter(acc.prepare(*replicated) if len(replicated) > 1 else
                    ((acc.prepare(*replicated),) if replicated else ()))
    return tuple(next(prepared) if any(o is r for r in replicated) else o for o in objects)
