"""Weight-only int8 / fp8 storage for the frozen teacher's linear layers.

Each nn.Linear of the teacher denoiser is replaced by a WeightOnlyLinear holding its weight as
int8 (symmetric, one float32 scale per output channel, |q| <= 127) or float8_e4m3fn (one scale per
output channel mapping the row's absmax to 448, e4m3's largest normal), and the bias as is. A
forward dequantises the weight into the input's dtype and runs F.linear: the matmul is bf16 (or
whatever the activations are), only the stored weight shrinks, from 2 bytes (bf16) to 1 byte per
parameter plus 4 bytes per output channel. Everything else (convolutions, norms, embeddings)
stays in bf16.

Why not torchao: torchao 0.18 (the newest release) cannot load its C++ extensions with torch
2.13 and, once installed, makes every diffusers import print warnings (diffusers' torchao
quantizer fails to import its tensor classes). Storage-only quantisation needs no kernels: the
torch dtypes int8 and float8_e4m3fn and per-channel scales are all it takes.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

FP8_MAX = 448.0  # torch.finfo(torch.float8_e4m3fn).max
FORMATS = ("int8", "fp8")


class WeightOnlyLinear(nn.Module):
    """A frozen linear layer whose weight is stored in int8 or fp8 with per-output-channel scales."""

    keeps_dtype = True  # dtype casts never apply (_apply); dmad.models.shared_base leaves it as it is

    def __init__(self, linear: nn.Linear, fmt: str):
        super().__init__()
        if fmt not in FORMATS:
            raise ValueError(f"unknown weight format {fmt!r}; expected one of {', '.join(FORMATS)}")
        self.fmt, self.in_features, self.out_features = fmt, linear.in_features, linear.out_features
        w = linear.weight.detach().float()
        amax = w.abs().amax(dim=1, keepdim=True).clamp(min=1e-12)
        if fmt == "int8":
            scale = amax / 127.0
            q = (w / scale).round().clamp(-127, 127).to(torch.int8)
        else:
            scale = amax / FP8_MAX
            q = (w / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
        self.register_buffer("qweight", q)
        self.register_buffer("scale", scale)  # (out, 1) float32
        bias = linear.bias.detach().to(torch.bfloat16) if linear.bias is not None else None
        self.register_buffer("bias", bias)

    def _apply(self, fn, recurse: bool = True):
        """Device moves apply; dtype casts (module.to(bf16), .float()) do not: the stored format
        and the float32 scales are what this layer is."""
        for name in ("qweight", "scale", "bias"):
            t = getattr(self, name)
            if t is not None:
                device = fn(torch.empty(0, device=t.device, dtype=t.dtype)).device
                setattr(self, name, t.to(device))
        return self

    def weight_as(self, dtype: torch.dtype) -> torch.Tensor:
        return (self.qweight.to(torch.float32) * self.scale).to(dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b = self.bias.to(x.dtype) if self.bias is not None else None
        return F.linear(x, self.weight_as(x.dtype), b)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, weight={self.fmt}"


def quantize_linears(net: nn.Module, fmt: str, shared=None) -> int:
    """Replace every nn.Linear in `net` (in place, one layer at a time, so the peak is one layer's
    float copy) and cast the rest to bf16. Returns the number of weights now stored in `fmt`.
    `shared` (dmad.models.shared_base.SharedBase on `net`): the LoRA adapters' own layers stay
    float32 and trainable; the linear layers they wrap (peft's base_layer) are quantised."""
    keep = shared.adapter_ids() if shared is not None else set()
    n = 0
    for name, module in list(net.named_modules()):
        for child_name, child in list(module.named_children()):
            if type(child) is nn.Linear and not any(id(p) in keep for p in child.parameters()):
                setattr(module, child_name, WeightOnlyLinear(child, fmt))
                n += child.weight.numel()
    if shared is None:
        net.to(torch.bfloat16)  # the other layers; WeightOnlyLinear ignores dtype casts (_apply)
        net.requires_grad_(False)
    else:
        shared.cast_frozen(torch.bfloat16)
    return n


def linear_params(net: nn.Module) -> int:
    """Weights in nn.Linear layers (what quantize_linears stores in 1 byte)."""
    return sum(m.weight.numel() for m in net.modules() if type(m) is nn.Linear)
