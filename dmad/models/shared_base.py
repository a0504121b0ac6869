"""One frozen base for the teacher, the student and the fake score (LoRA student and LoRA fake score).

A LoRA student and a LoRA fake score each used to carry a full frozen copy of the teacher's
denoiser beside the teacher itself: three copies of the biggest weights of the run. Here the
teacher's denoiser is the only copy. Two peft adapters sit on it, "student" and "fake", and three
views call it:

  teacher view  : every adapter disabled: the plain teacher, bit for bit;
  student view  : the "student" adapter active;
  fake view     : the "fake" adapter active.

At rest (between calls, and for anything that calls the base directly, e.g. a diffusers pipeline
rendering teacher samples) every adapter is disabled, so the base *is* the teacher.

Which adapter is active is set on peft's layers directly (`_active_adapter`, `_disable_adapters`)
rather than through `set_adapter` / `enable_adapters`, which also flip `requires_grad`: the
critic's adapter is frozen by the training step during the student's update and must stay so.
Gradient checkpointing recomputes blocks during backward, long after the view's call returned,
and one backward can run through both adapters (the student's loss reaches the student through
the fake score's GAN features): `checkpoint_keeping_adapter` records the adapter state of each
checkpointed block at forward time and restores it for the recompute.

A view's parameters are its adapter's only, named exactly as a separate LoRA copy names them
(peft's adapter name replaced by "default"), in the same order. So optimizers, EMA, DDP,
checkpoints and `dmad sample` / `dmad export` see the same tensors under the same names as a
separate-copies run, and a shared-base checkpoint is file for file what a separate-copies run with
the same seed writes.
"""
from __future__ import annotations

import contextlib
from typing import Iterator, Optional

import torch
from torch import nn

STUDENT, FAKE = "student", "fake"
SAVED_NAME = "default"  # the adapter name a separate LoRA copy has (add_lora: peft's default)


def lora_layers(base: nn.Module) -> list[nn.Module]:
    from peft.tuners.tuners_utils import BaseTunerLayer

    return [m for m in base.modules() if isinstance(m, BaseTunerLayer)]


class SharedBase:
    """The teacher's denoiser with the "student" and "fake" adapters, and the switch between them."""

    def __init__(self, base: nn.Module):
        self.base = base
        self.layers = lora_layers(base)
        if not self.layers:
            raise ValueError("the shared base has no LoRA layers: add the adapters first")
        self._state: Optional[str] = None  # None: every adapter disabled (the teacher)
        self._apply(None)
        self.offload_device = None  # set by teacher_cpu_offload: where the frozen base computes
        self._mode: Optional[bool] = None  # the train/eval mode set_mode last gave the base
        self._sensitive: Optional[list[nn.Module]] = None
        self._adapter_ids: Optional[set[int]] = None

    # ---- which adapter is active
    @property
    def state(self) -> Optional[str]:
        return self._state

    def _apply(self, adapter: Optional[str]) -> None:
        for layer in self.layers:
            if adapter is None:
                layer._disable_adapters = True
            else:
                layer._disable_adapters = False
                layer._active_adapter = [adapter]
        self._state = adapter

    @contextlib.contextmanager
    def active(self, adapter: Optional[str]) -> Iterator[None]:
        before = self._state
        if adapter != before:
            self._apply(adapter)
        try:
            yield
        finally:
            if self._state != before:
                self._apply(before)

    # ---- train / eval
    def set_mode(self, training: bool) -> None:
        """The base in the calling view's mode (the teacher's calls eval, the student's and fake
        score's train, as separate copies are). Only modules that behave differently in the two
        modes are switched (dropout with p > 0, batch norm; usually none in a diffusion denoiser):
        a whole-model train() per call walks every module and costs more than a tiny model's call."""
        if self._mode == training:
            return
        if self._sensitive is None:  # first call: the whole base, once (the rest stays in that mode)
            self.base.train(training)
            self._sensitive = [m for m in self.base.modules() if _mode_matters(m)]
        self.base.training = training
        for m in self._sensitive:
            m.training = training
        self._mode = training

    # ---- the adapters' parameters
    def adapter_parameters(self, adapter: str) -> list[tuple[str, nn.Parameter]]:
        """(name as a separate LoRA copy saves it, parameter), in the base's parameter order."""
        out = []
        for n, p in self.base.named_parameters():
            saved = _saved_name(n, adapter)
            if saved is not None:
                out.append((saved, p))
        return out

    def adapter_ids(self) -> set[int]:
        """id() of every adapter parameter of both adapters (fixed once the adapters exist)."""
        if self._adapter_ids is None:
            self._adapter_ids = {id(p) for a in (STUDENT, FAKE) for _, p in self.adapter_parameters(a)}
        return self._adapter_ids

    def frozen_tensors(self, within: Optional[nn.Module] = None) -> list[tuple[nn.Module, str, bool]]:
        """(module, name, is_parameter) of every base weight and buffer (of `within`, a submodule,
        when given) that is not an adapter's: what precision casts and offload move."""
        adapter_ids = self.adapter_ids()
        out = []
        for m in (within or self.base).modules():
            if getattr(m, "keeps_dtype", False):  # a WeightOnlyLinear: its stored format is what it is
                out += [(m, name, False) for name, b in m._buffers.items() if b is not None]
                continue
            for name, p in m._parameters.items():
                if p is not None and id(p) not in adapter_ids:
                    out.append((m, name, True))
            for name, b in m._buffers.items():
                if b is not None:
                    out.append((m, name, False))
        return out

    def cast_frozen(self, dtype: torch.dtype) -> None:
        """The frozen base in `dtype` (floating tensors only); the adapters keep their float32."""
        for m, name, is_param in self.frozen_tensors():
            t = m._parameters[name] if is_param else m._buffers[name]
            if t.is_floating_point() and t.dtype != dtype and not getattr(m, "keeps_dtype", False):
                if is_param:
                    t.data = t.data.to(dtype)
                else:
                    m._buffers[name] = t.to(dtype)

    def move_frozen(self, device, within: Optional[nn.Module] = None) -> int:
        """The frozen base (or the part of it in `within`) to `device` (teacher_cpu_offload between
        calls); the adapters stay where they are. Returns how many tensors moved."""
        moved = 0
        target = torch.device(device)
        for m, name, is_param in self.frozen_tensors(within):
            t = m._parameters[name] if is_param else m._buffers[name]
            if t.device.type == target.type and (target.index is None or t.device.index == target.index):
                continue
            moved += 1
            if is_param:
                p = m._parameters[name]
                p.data = p.data.to(device)
            else:
                m._buffers[name] = m._buffers[name].to(device)
        return moved

    def checkpoint_keeping_adapter(self, module: nn.Module, *args):
        """diffusers' gradient-checkpointing function (module.__call__ through torch's non-reentrant
        checkpoint, as ModelMixin's default), with the adapter state of the forward restored for the
        recompute in backward. With teacher_cpu_offload the base went back to CPU RAM when the
        forward call ended: a recompute brings this block's frozen weights to the device for itself."""
        state = self._state

        def run(*a):
            moved = self.move_frozen(self.offload_device, module) if self.offload_device is not None else 0
            try:
                with self.active(state):
                    return module(*a)
            finally:
                if moved:
                    self.move_frozen("cpu", module)

        return torch.utils.checkpoint.checkpoint(run, *args, use_reentrant=False)


def _mode_matters(m: nn.Module) -> bool:
    """Whether train and eval mode compute different numbers in this module: dropout with p > 0,
    batch norm, diffusers' label embedding with class dropout."""
    if isinstance(m, nn.modules.dropout._DropoutNd):
        return m.p > 0
    return isinstance(m, nn.modules.batchnorm._BatchNorm) or getattr(m, "dropout_prob", 0) > 0


def _saved_name(name: str, adapter: str) -> Optional[str]:
    """"...to_q.lora_A.<adapter>.weight" -> "...to_q.lora_A.default.weight"; None for any other
    parameter (the base's own, or another adapter's)."""
    from peft.tuners.lora.layer import LoraLayer

    parts = name.split(".")
    for i in range(len(parts) - 1):
        if parts[i] in LoraLayer.adapter_layer_names and parts[i + 1] == adapter:
            return ".".join(parts[:i + 1] + [SAVED_NAME] + parts[i + 2:])
    return None


class AdapterView(nn.Module):
    """The shared base as one network: `adapter` active (None: the teacher) for each call.

    Not a parent of the base (`base` is held outside nn.Module's registry), so moving, casting or
    freezing a view never touches the base; its parameters are its adapter's, named as a
    separate LoRA copy names them. Attributes it lacks (config, dtype, mid_block, ...) are the
    base's, so the family code and diffusers' pipelines use a view as they use the denoiser."""

    def __init__(self, shared: SharedBase, adapter: Optional[str]):
        super().__init__()
        object.__setattr__(self, "shared", shared)
        self.adapter = adapter
        self._params = [] if adapter is None else shared.adapter_parameters(adapter)

    @property
    def base_network(self) -> nn.Module:
        return self.shared.base

    def forward(self, *args, **kwargs):
        self.shared.set_mode(self.training)
        base = self.shared.base
        with self.shared.active(self.adapter):
            return base(*args, **kwargs)

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(object.__getattribute__(self, "shared").base, name)

    # ---- parameters: the adapter's, under a separate copy's names
    def named_parameters(self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True):
        for n, p in self._params:
            yield (f"{prefix}.{n}" if prefix else n), p

    def parameters(self, recurse: bool = True):
        for _, p in self.named_parameters():
            yield p

    def state_dict(self, *args, destination=None, prefix: str = "", keep_vars: bool = False):
        out = destination if destination is not None else {}
        for n, p in self._params:
            out[prefix + n] = p if keep_vars else p.detach()
        return out

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        own = dict(self._params)
        missing = [n for n in own if n not in state_dict]
        unexpected = [n for n in state_dict if n not in own]
        if strict and (missing or unexpected):
            raise RuntimeError(f"adapter weights do not match: missing {missing[:3]}, unexpected {unexpected[:3]}")
        with torch.no_grad():
            for n, p in own.items():
                if n in state_dict:
                    p.copy_(state_dict[n])
        return nn.modules.module._IncompatibleKeys(missing, unexpected)

    def extra_repr(self) -> str:
        return f"adapter={self.adapter or 'none (teacher)'}, {sum(p.numel() for _, p in self._params)} parameters"
