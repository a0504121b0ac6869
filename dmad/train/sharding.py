"""resources.distributed fsdp: torch's own FSDP2 (`torch.distributed.fsdp.fully_shard`) over the
networks a run trains. What is sharded and why, and the checkpoint format:
dmad.models.sharded_checkpoint; the training steps over sharded networks: dmad.methods.sharded.
"""
from __future__ import annotations

from typing import Any, Optional

import torch
from torch import nn

from dmad.models.shard_units import shard_units


def ensure_process_group(device: torch.device) -> None:
    """fully_shard needs a process group: a one-process run gets one of its own (in memory)."""
    import torch.distributed as dist

    if dist.is_initialized():
        return
    global _OWN_GROUP
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    _OWN_GROUP = True


_OWN_GROUP = False  # ensure_process_group made the default group (a one-process run)


def release_own_process_group() -> None:
    """Destroy the group ensure_process_group made, so a later run in the same process (a script,
    the tests) starts as a fresh process would; a launched run's group is accelerate's: untouched."""
    global _OWN_GROUP
    if _OWN_GROUP:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
        _OWN_GROUP = False


def from_rank0(net: nn.Module, device: torch.device) -> None:
    """Every rank's weights and buffers made rank 0's, as DDP does when it wraps a network: each
    rank then keeps its own slice of the same network. Copies of the teacher agree anyway; a
    randomly initialised one (the GAN head: every rank seeds differently) would otherwise be
    sharded from different initialisations (measured: its gradients then differed by more than
    100% from a one-process run's)."""
    import torch.distributed as dist

    if dist.get_world_size() == 1:
        return
    with torch.no_grad():
        for t in [*net.parameters(), *net.buffers()]:
            on = t.data if t.device == device else t.data.to(device)
            dist.broadcast(on, src=0)
            if on is not t.data:
                t.data.copy_(on)


def shard(net: nn.Module, device: torch.device, param_dtype: Optional[torch.dtype], offload: bool) -> nn.Module:
    """fully_shard `net` block by block, then its root (in place: its parameters become DTensors
    sharded over the default mesh; build optimizers and EMA after this). param_dtype: what each
    gathered block computes in (None: as stored); gradients are reduced in float32."""
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    if device.type == "cuda" and not offload:
        net.to(device)
    from_rank0(net, device)
    mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32 if param_dtype else None)
    kw = dict(mp_policy=mp, offload_policy=CPUOffloadPolicy() if offload else OffloadPolicy())
    for unit in shard_units(net):  # innermost first (dmad.models.shard_units says which and why)
        fully_shard(unit, **kw)
    fully_shard(net, **kw)  # the root: what is left (nothing, in diffusers' denoisers)
    # FSDP2 fixes each unit's gradient dtypes at its first forward, from the parameters that
    # require grad at that moment; the critic's first forward is inside the student's step, frozen,
    # so its bf16 gradients would later meet float32 parameters (measured: "attempting to assign a
    # gradient with dtype BFloat16 to a tensor with grad_dtype Float"). Initialise now, with every
    # trained parameter requiring grad. (FSDP2 has no public call for this; its forward makes it.)
    net._get_fsdp_state()._lazy_init()
    return net


def shard_run(cfg: Any, trained: Any, teacher: Any, method: Any, device: torch.device) -> str:
    """resources.distributed fsdp: shard the method's full networks (and the GAN head with a full
    fake score; the teacher's denoiser with fsdp_shard_teacher), then remake what holds copies of
    their parameters (the student's EMA). Returns a line for the engine log."""
    from dmad.methods.unit import make_ema
    from dmad.models.teacher import torch_dtype

    res = cfg.resources
    ensure_process_group(device)
    offload = res.fsdp_cpu_offload and device.type != "cpu"  # on a CPU the shards are in host memory already
    param_dtype = torch_dtype(res.mixed_precision) if res.mixed_precision != "no" else None
    modules = dict(method.modules(trained))
    full = {name for name, mode in method.layout(cfg.identity).networks if mode == "full"}
    done = []
    for name, net in modules.items():
        if name in full or (name == "gan_head" and "fake_score" in full):
            shard(net, device, param_dtype, offload)
            done.append(name)
    if trained.ema is not None and "student" in done:
        trained.ema = make_ema(trained.student, cfg.distillation.ema_decay)
    if res.fsdp_shard_teacher:
        shard(teacher.denoiser, device, None, offload)
        done.append("teacher denoiser")
    import torch.distributed as dist

    where = "CPU memory" + (" (fsdp_cpu_offload)" if offload else "") if offload or device.type == "cpu" \
        else str(device)
    what = ", ".join(done) or "nothing (every network is LoRA: replicated)"
    return f"fsdp over {dist.get_world_size()} process(es): sharded {what}; shards in {where}; compute " \
           f"{param_dtype or 'as stored'}"


def world_size_note(ckpt: Any, world: int, cfg: Any) -> Optional[str]:
    """What differs when a run continues a checkpoint written by another number of processes
    (None when it is the same): the shards are re-split, the effective batch changes with the
    number of processes, and so does which samples and noise each process draws."""
    from pathlib import Path

    from dmad.models.sharded_checkpoint import index_or_none

    index = index_or_none(Path(ckpt))
    before = index.get("world_size") if index else None
    if not isinstance(before, int) or before == world:
        return None
    return (f"continuing checkpoint {Path(ckpt).name}, written by {before} process(es), on {world}: its shards were "
            f"re-split; the effective batch is now {cfg.effective_batch(world)} (it was {cfg.effective_batch(before)}) "
            f"and the data order and noise differ from an uninterrupted run's")
