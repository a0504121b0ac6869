"""Test-only: diffusers state dicts -> one original LDM/CompVis single-file state dict.

The inverse of diffusers.loaders.single_file_utils (convert_ldm_unet_checkpoint,
convert_ldm_vae_checkpoint, convert_ldm_clip_checkpoint), after diffusers'
scripts/convert_diffusers_to_original_stable_diffusion.py, generalised from SD 1.5's fixed
layout (4 blocks, 2 layers each) to any UNet2DConditionModel / AutoencoderKL config, so the
tiny test pipelines can be written as the kind of .safetensors file users download.
SD 1.x CLIP text encoders only (SD 2.x's OpenCLIP layout is not produced).
"""
from __future__ import annotations

UNET_TOP = {"time_embedding.linear_1.": "time_embed.0.", "time_embedding.linear_2.": "time_embed.2.",
            "conv_in.": "input_blocks.0.0.", "conv_norm_out.": "out.0.", "conv_out.": "out.2."}
UNET_RESNET = {"norm1": "in_layers.0", "conv1": "in_layers.2", "norm2": "out_layers.0", "conv2": "out_layers.3",
               "time_emb_proj": "emb_layers.1", "conv_shortcut": "skip_connection"}
VAE_ATTN = {"group_norm.": "norm.", "to_q.": "q.", "to_k.": "k.", "to_v.": "v.", "to_out.0.": "proj_out."}


def _unet_prefixes(config: dict) -> dict[str, str]:
    """diffusers module prefix -> LDM prefix. LDM numbers the UNet's modules flatly:
    input_blocks.0 is conv_in, then per down block `layers_per_block` (resnet, attention) pairs and
    one downsampler; output_blocks hold `layers_per_block + 1` pairs per up block, the block's
    upsampler sitting after the last pair's attention (index 1 without attention, 2 with)."""
    lpb, n = config["layers_per_block"], len(config["block_out_channels"])
    up = config["up_block_types"]
    m = {"mid_block.attentions.0.": "middle_block.1."}
    for j in range(2):
        m[f"mid_block.resnets.{j}."] = f"middle_block.{2 * j}."
    for i in range(n):
        for j in range(lpb):
            m[f"down_blocks.{i}.resnets.{j}."] = f"input_blocks.{(lpb + 1) * i + j + 1}.0."
            m[f"down_blocks.{i}.attentions.{j}."] = f"input_blocks.{(lpb + 1) * i + j + 1}.1."
        m[f"down_blocks.{i}.downsamplers.0.conv."] = f"input_blocks.{(lpb + 1) * (i + 1)}.0.op."
        for j in range(lpb + 1):
            m[f"up_blocks.{i}.resnets.{j}."] = f"output_blocks.{(lpb + 1) * i + j}.0."
            m[f"up_blocks.{i}.attentions.{j}."] = f"output_blocks.{(lpb + 1) * i + j}.1."
        has_attn = up[i].startswith("CrossAttn")
        m[f"up_blocks.{i}.upsamplers.0."] = f"output_blocks.{(lpb + 1) * i + lpb}.{2 if has_attn else 1}."
    return m


def unet_to_ldm(state: dict, config: dict) -> dict:
    prefixes = {**UNET_TOP, **_unet_prefixes(config)}
    out = {}
    for key, value in state.items():
        match = max((p for p in prefixes if key.startswith(p)), key=len)
        rest = key[len(match):]
        if ".resnets." in match:
            name, _, tail = rest.partition(".")
            rest = f"{UNET_RESNET.get(name, name)}.{tail}"
        out["model.diffusion_model." + prefixes[match] + rest] = value
    return out


def vae_to_ldm(state: dict, config: dict) -> dict:
    n = len(config["block_out_channels"])
    prefixes = {"encoder.conv_norm_out.": "encoder.norm_out.", "decoder.conv_norm_out.": "decoder.norm_out."}
    for part in ("encoder", "decoder"):
        prefixes[f"{part}.mid_block.attentions.0."] = f"{part}.mid.attn_1."
        for j in range(2):
            prefixes[f"{part}.mid_block.resnets.{j}."] = f"{part}.mid.block_{j + 1}."
    for i in range(n):
        prefixes[f"encoder.down_blocks.{i}.resnets."] = f"encoder.down.{i}.block."
        prefixes[f"encoder.down_blocks.{i}.downsamplers.0."] = f"encoder.down.{i}.downsample."
        prefixes[f"decoder.up_blocks.{i}.resnets."] = f"decoder.up.{n - 1 - i}.block."  # LDM counts up blocks upwards
        prefixes[f"decoder.up_blocks.{i}.upsamplers.0."] = f"decoder.up.{n - 1 - i}.upsample."
    out = {}
    for key, value in state.items():
        match = max((p for p in prefixes if key.startswith(p)), key=len, default="")
        rest = key[len(match):]
        if prefixes.get(match, "").endswith("attn_1."):
            name, _, tail = rest.partition(".") if not rest.startswith("to_out.0.") else ("to_out.0", "", rest[9:])
            rest = VAE_ATTN[name + "."] + tail
            if value.ndim == 2:  # LDM's attention projections are 1x1 convolutions
                value = value[:, :, None, None]
        rest = rest.replace("conv_shortcut", "nin_shortcut")
        out["first_stage_model." + prefixes.get(match, "") + rest] = value
    return out


def clip_to_ldm(state: dict) -> dict:
    # transformers >= 5.6 flattened CLIPTextModel (no `text_model.` level); LDM files keep it.
    return {"cond_stage_model.transformer.text_model." + k.removeprefix("text_model."): v for k, v in state.items()}


def pipeline_to_ldm(unet, vae, text_encoder) -> dict:
    """One LDM-layout state dict from the three loaded diffusers / transformers modules."""
    return {**unet_to_ldm(unet.state_dict(), dict(unet.config)),
            **vae_to_ldm(vae.state_dict(), dict(vae.config)),
            **clip_to_ldm(text_encoder.state_dict())}


# --------------------------------------------------------------------------- SDXL

SDXL_UNET_EXTRA = {"add_embedding.linear_1.": "label_emb.0.0.", "add_embedding.linear_2.": "label_emb.0.2."}


def open_clip_to_ldm(state: dict, prefix: str) -> dict:
    """A transformers CLIPTextModelWithProjection state dict -> OpenCLIP keys under `prefix`
    (the inverse of diffusers' convert_open_clip_checkpoint: q/k/v fused into in_proj, the
    text projection transposed)."""
    from diffusers.loaders.single_file_utils import DIFFUSERS_TO_LDM_MAPPING

    layers = DIFFUSERS_TO_LDM_MAPPING["openclip"]["layers"]
    names = [("text_model.encoder.layers.", "resblocks."), ("layer_norm1", "ln_1"), ("layer_norm2", "ln_2"),
             (".fc1.", ".c_fc."), (".fc2.", ".c_proj."), (".self_attn", ".attn")]
    out: dict = {}
    qkv: dict = {}
    for key, value in state.items():
        if key in layers:
            out[prefix + layers[key]] = value.T.contiguous() if key == "text_projection.weight" else value
            continue
        ldm = key
        for new, old in names:
            ldm = ldm.replace(new, old)
        for p in ("q", "k", "v"):
            for kind in ("weight", "bias"):
                if ldm.endswith(f".attn.{p}_proj.{kind}"):
                    base = ldm[: -len(f".{p}_proj.{kind}")]
                    qkv.setdefault((base, kind), {})[p] = value
                    break
            else:
                continue
            break
        else:
            out[prefix + "transformer." + ldm] = value
    for (base, kind), parts in qkv.items():
        import torch

        out[f"{prefix}transformer.{base}.in_proj_{kind}"] = torch.cat([parts["q"], parts["k"], parts["v"]])
    return out


def sdxl_pipeline_to_ldm(unet, vae, text_encoder, text_encoder_2) -> dict:
    """One SDXL original-layout state dict (sd_xl_base_1.0.safetensors' key layout)."""
    unet_state = unet.state_dict()
    extra = {k: v for k, v in unet_state.items() if k.startswith(tuple(SDXL_UNET_EXTRA))}
    ldm_unet = unet_to_ldm({k: v for k, v in unet_state.items() if k not in extra}, dict(unet.config))
    for k, v in extra.items():
        p = next(p for p in SDXL_UNET_EXTRA if k.startswith(p))
        ldm_unet["model.diffusion_model." + SDXL_UNET_EXTRA[p] + k[len(p):]] = v
    clip_l = {"conditioner.embedders.0.transformer.text_model." + k.removeprefix("text_model."): v
              for k, v in text_encoder.state_dict().items()}
    return {**ldm_unet, **vae_to_ldm(vae.state_dict(), dict(vae.config)), **clip_l,
            **open_clip_to_ldm(text_encoder_2.state_dict(), "conditioner.embedders.1.model.")}
