"""Which modules of a denoiser FSDP2 shards as units of their own (resources.distributed fsdp;
dmad.train.sharding applies them, dmad.models.teacher / pipelines count the largest for the
memory ledger): one list, so the ledger counts what training gathers.

Each unit is gathered whole for its forward and again for its backward, then freed, so the
largest unit sets the transient memory of sharding. Units, innermost first: every ResNet block
and attention layer of a UNet (SDXL's 1280-channel transformer layers are ~30 M parameters each;
a whole up block would be ~1 B) and its down / up samplers; every block of a transformer (SD3,
Flux double and single stream); then each child of the network that still holds weights of its
own (a UNet's down / mid / up blocks for their norms and projections, conv_in, the time
embedding, the output layers). The root is left with none: FSDP2 keeps a root's weights gathered
after a forward, and the GAN term backpropagates through the fake score from a block's features,
where the root's output hook never fires; a root with weights would then compute with a stale
gathered copy (a frozen critic's root layers got no gradient: measured on 2 processes) or find
them freed.
"""
from __future__ import annotations

from torch import nn

FINE = ("ResnetBlock2D", "BasicTransformerBlock", "Downsample2D", "Upsample2D", "JointTransformerBlock",
        "FluxTransformerBlock", "FluxSingleTransformerBlock")
BLOCK_LISTS = ("down_blocks", "up_blocks", "transformer_blocks", "single_transformer_blocks")


def _has_params(m: nn.Module) -> bool:
    return any(True for _ in m.parameters())


def shard_units(net: nn.Module) -> list[nn.Module]:
    """The units, innermost first (the order fully_shard must be applied in)."""
    fine = [m for m in net.modules() if m is not net and type(m).__name__ in FINE and _has_params(m)]
    coarse: list[nn.Module] = []
    for name, child in net.named_children():
        if name in BLOCK_LISTS and isinstance(child, nn.ModuleList):
            coarse += [b for b in child if _has_params(b)]
        elif _has_params(child):
            coarse.append(child)
    seen = {id(m) for m in fine}
    return fine + [m for m in coarse if id(m) not in seen]


def largest_unit_params(net: nn.Module) -> int:
    """Parameters of the largest unit, counting only its own (not those of units inside it): what
    one all-gather brings in at a time. Works on a meta model."""
    units = shard_units(net)
    inner: set[int] = set()
    largest = 0
    for u in units:  # innermost first: a unit's nested units are already counted
        own = [p for p in u.parameters() if id(p) not in inner]
        largest = max(largest, sum(p.numel() for p in own))
        inner.update(id(p) for p in own)
    rest = sum(p.numel() for p in net.parameters() if id(p) not in inner)
    return max(largest, rest)
