"""A LoRA student as one .safetensors file in the layout the tools users generate with load.

`dmad export --format lora-single-file` writes it; this module makes its tensors and metadata.

Layouts (ComfyUI's loader, comfy/lora.py `model_lora_keys_unet`, maps both; docs/export.md):
- UNet families (SD 1.x, SD 2.x, SDXL): kohya's names, what kohya_ss, ComfyUI, Forge and A1111
  read: `lora_unet_<diffusers module path, dots as underscores>.lora_down.weight`, `.lora_up.weight`
  and `.alpha`. The same names diffusers' own `convert_state_dict_to_kohya` gives a PEFT state
  dict, and diffusers' `load_lora_weights` converts them back.
- Transformer families (SD3, Flux): diffusers' names, `transformer.<module path>.lora_A.weight` /
  `.lora_B.weight`, which is what diffusers' SD3/Flux LoRA scripts save and what ComfyUI maps for
  those models.

The scale. peft computes `W x + (alpha / r) B A x`. A loader that finds no alpha (ComfyUI and
diffusers for the transformer layout, which read no metadata) uses a scale of 1, and kohya's alpha
is a per-module number that not every tool reads the same way (rank-stabilised LoRA is not kohya's
alpha / r). So each module's own scale (peft's `scaling`, which covers rsLoRA and per-module
rank and alpha patterns) is multiplied into its up / B weight and the file says alpha = rank:
every loader then applies exactly the trained adapter.

Metadata (safetensors header, strings): kohya's `ss_*` fields that tools show, `modelspec.*`, and
`dmad_*`: the base model, the family, the student's steps and timesteps, the suggested sampler,
scheduler and CFG, and the user LoRAs the student was distilled with.
"""
from __future__ import annotations

import json
from typing import Any

ADAPTER = "default"  # the adapter name the exported student's LoRA carries (dmad.models.checkpoint)

# kohya's ss_base_model_version and Stability's modelspec architecture, per family
BASE_MODEL_VERSION = {"sd1": "sd_v1", "sd2": "sd_v2", "sdxl": "sdxl_base_v1-0", "sd3": "sd3", "flux": "flux1"}
ARCHITECTURE = {"sd1": "stable-diffusion-v1/lora", "sd2": "stable-diffusion-v2/lora",
                "sdxl": "stable-diffusion-xl-v1-base/lora", "sd3": "stable-diffusion-3-medium/lora",
                "flux": "flux-1-dev/lora"}


def torch_dtype(name: str):
    import torch

    return {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[name]


def lora_modules(student) -> list[tuple[str, Any]]:
    """(module path in the denoiser, peft LoraLayer) of every adapted module, in model order."""
    from peft.tuners.lora import LoraLayer

    out = []
    for name, mod in student.named_modules():
        if isinstance(mod, LoraLayer) and ADAPTER in mod.lora_A:
            if mod.lora_magnitude_vector and ADAPTER in mod.lora_magnitude_vector:
                raise ValueError(f"{name}: a DoRA adapter has no single-file LoRA layout")
            out.append((name, mod))
    if not out:
        raise ValueError("the student has no LoRA layers to export")
    return out


# kohya's prefix for each text encoder of the UNet families (SDXL numbers its two)
KOHYA_TE = {"sd1": {"text_encoder": "lora_te_"}, "sd2": {"text_encoder": "lora_te_"},
            "sdxl": {"text_encoder": "lora_te1_", "text_encoder_2": "lora_te2_"}}


def single_file_tensors(student, denoiser_name: str, dtype, family: str = "",
                        user_layers: dict | None = None) -> dict[str, Any]:
    """The adapter's tensors in the family's single-file layout (module docstring), each module's
    scale multiplied into its up weight, cast to `dtype` (the product taken in float32 first).
    `user_layers` (dmad.models.teacher_loras.user_lora_layers): the user's LoRAs merged in, exactly:
    a module's down matrices are stacked and its up matrices put side by side, so the file's update
    is the sum of theirs (its rank the sum of their ranks), with no approximation."""
    import torch

    parts: dict[tuple[str, str], list] = {k: list(v) for k, v in (user_layers or {}).items()}
    for name, mod in lora_modules(student):
        down = mod.lora_A[ADAPTER].weight.detach().float()
        up = mod.lora_B[ADAPTER].weight.detach().float() * float(mod.scaling[ADAPTER])
        parts.setdefault((denoiser_name, name), []).append((down, up))
    out: dict[str, torch.Tensor] = {}
    for (component, name), pieces in parts.items():
        down = torch.cat([d for d, _ in pieces], dim=0)
        up = torch.cat([u for _, u in pieces], dim=1)
        if denoiser_name == "unet":
            prefix = "lora_unet_" if component == "unet" else KOHYA_TE.get(family, {}).get(component)
            if prefix is None:
                raise ValueError(f"{component}: no kohya name for this family's component")
            key = prefix + name.replace(".", "_")
            out[f"{key}.lora_down.weight"] = down.to(dtype).contiguous()
            out[f"{key}.lora_up.weight"] = up.to(dtype).contiguous()
            out[f"{key}.alpha"] = torch.tensor(float(down.shape[0]), dtype=dtype)  # alpha = rank: scale 1
        else:
            key = f"{component}.{name}"
            out[f"{key}.lora_A.weight"] = down.to(dtype).contiguous()
            out[f"{key}.lora_B.weight"] = up.to(dtype).contiguous()
    return out


def single_file_metadata(*, family: str, base_model: str, rank: int, dtype: str, steps: int,
                         timesteps: list[int], sampler: str, scheduler: str, guidance: float,
                         user_loras: list[dict], run: str, checkpoint: str) -> dict[str, str]:
    """The file's safetensors metadata: strings only (the format's rule)."""
    return {
        "format": "pt",
        "ss_network_module": "networks.lora",
        "ss_network_dim": str(rank),
        "ss_network_alpha": str(rank),  # every scale is in the weights (module docstring)
        "ss_base_model_version": BASE_MODEL_VERSION.get(family, family),
        "ss_output_name": run,
        "modelspec.sai_model_spec": "1.0.0",
        "modelspec.architecture": ARCHITECTURE.get(family, f"{family}/lora"),
        "modelspec.implementation": "diffusers",
        "modelspec.title": f"{run} {checkpoint} ({steps}-step student)",
        "dmad_format": "lora-single-file",
        "dmad_family": family,
        "dmad_base_model": base_model,
        "dmad_dtype": dtype,
        "dmad_student_steps": str(steps),
        "dmad_student_timesteps": json.dumps(list(timesteps)),
        "dmad_suggested_sampler": sampler,
        "dmad_suggested_scheduler": scheduler,
        "dmad_suggested_cfg": f"{guidance:g}",
        "dmad_user_loras": json.dumps(user_loras),
        "dmad_run": run,
        "dmad_checkpoint": checkpoint,
    }


def adapter_rank(student) -> int:
    """The largest rank among the adapted modules (kohya's ss_network_dim is one number)."""
    return max(int(mod.r[ADAPTER]) for _, mod in lora_modules(student))
