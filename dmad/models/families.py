"""The model-family registry: everything that differs between SD 1.x/2.x, SDXL, SD3 and Flux.

A family says how to encode prompts (its text encoders, pooled embeddings, micro-conditioning),
how to call its denoiser (UNet or transformer, its timestep convention, Flux's 2x2 latent
packing and guidance embedding), which prediction it makes and its noise schedule (DDPM
alphas_cumprod, or shifted flow matching), its unconditional embedding and guidance rule, where
the GAN head taps features, and which diffusers pipeline renders and exports it. The DMAD losses
(dmad.methods) work in x0 space and never look at the family.

Engine tensors keep one layout for every family: latents (B, C, h, w) and an integer timestep
index t (B,) in [0, T). A Cond is the text conditioning of a batch: a dict of tensors whose first
dimension is the batch (SD: emb (B, L, D); SDXL, SD3, Flux: emb and pooled (B, P)).

Families:
  sd1, sd2  StableDiffusionPipeline       UNet, CLIP; epsilon or v; true CFG (empty prompt)
  sdxl      StableDiffusionXLPipeline     UNet, CLIP-L + OpenCLIP-bigG (pooled), size/crop ids
  sd3       StableDiffusion3Pipeline      SD3Transformer2DModel, CLIP-L + CLIP-G (+ T5); flow;
                                          timestep sigma * 1000; true CFG
  flux      FluxPipeline                  FluxTransformer2DModel, CLIP-L pooled + T5; flow;
                                          packed latents; guidance embedding (dev) or true CFG
"""
from __future__ import annotations

import contextlib
import math
from typing import Any, Optional

import torch
from torch import nn

from dmad.methods.prediction import FlowSchedule, NoiseSchedule, guide
from dmad.models.teacher_files import ATTENTION, LORA_TARGETS, WITH_FF, encode_prompts


# --------------------------------------------------------------------------- conditioning

class Cond(dict):
    """Text conditioning of a batch: {name: tensor (B, ...)}. Float tensors follow `to(dtype)`."""

    @property
    def batch(self) -> int:
        return next(iter(self.values())).shape[0]

    def to(self, device: Any = None, dtype: Optional[torch.dtype] = None) -> "Cond":
        return Cond({k: v.to(device=device, dtype=dtype if dtype is not None and v.is_floating_point() else None)
                     for k, v in self.items()})

    def expand(self, b: int) -> "Cond":
        """A batch-1 Cond repeated to batch b (views, no copy)."""
        return Cond({k: v.expand(b, *v.shape[1:]) for k, v in self.items()})

    def detach(self) -> "Cond":
        return Cond({k: v.detach() for k, v in self.items()})

    def item(self, j: int) -> dict[str, torch.Tensor]:
        """Sample j's tensors, without the batch dimension (what the text cache stores)."""
        return {k: v[j] for k, v in self.items()}

    @staticmethod
    def stack(items: list[dict[str, torch.Tensor]], device: Any = None) -> "Cond":
        return Cond({k: torch.stack([it[k].to(device) for it in items]) for k in items[0]})

    @staticmethod
    def cat(conds: list["Cond"]) -> "Cond":
        return Cond({k: torch.cat([c[k] for c in conds]) for k in conds[0]})


def as_cond(x: Any) -> Cond:
    """A Cond from a Cond or a bare (B, L, D) embedding tensor (SD-family callers, tests)."""
    return x if isinstance(x, Cond) else Cond(emb=x)


@contextlib.contextmanager
def quiet_pipeline_logs():
    """A pipeline's encode_prompt warns on every call whose prompt CLIP truncates (77 tokens): once
    per batch in a training log. Truncation is the rule for every family (SD's own encoder does it
    silently), so those calls run with diffusers' logging at ERROR."""
    from diffusers.utils import logging as dlog

    level = dlog.get_verbosity()
    dlog.set_verbosity_error()
    try:
        yield
    finally:
        dlog.set_verbosity(level)


# --------------------------------------------------------------------------- feature taps

class FeatureTap:
    """Keeps the latest output of one submodule in `.features`, (B, C, h, w), via a forward hook.

    UNet families tap the mid block (the bottleneck); transformer families tap the image tokens of
    the middle joint block, reshaped from (B, N, D) to (B, D, h, w) on the latent patch grid, which
    the family sets in `grid` before each call. The stored tensor keeps its graph (the GAN loss
    backpropagates through it); remove() unhooks."""

    def __init__(self, module: nn.Module, tokens: bool):
        self.tokens = tokens
        self.grid: Optional[tuple[int, int]] = None
        self.features: Optional[torch.Tensor] = None
        self._handle = module.register_forward_hook(self._store)

    def _store(self, module: nn.Module, inputs, output) -> None:
        if self.tokens:
            if self.grid is None:  # a call not made through Family.predict (a pipeline's), or a
                return             # gradient-checkpointing recompute: nothing to keep
            # SD3 JointTransformerBlock and Flux's double block return (encoder_hidden_states, hidden_states)
            h = output[1] if isinstance(output, (tuple, list)) else output
            gh, gw = self.grid
            self.features = h.transpose(1, 2).reshape(h.shape[0], h.shape[2], gh, gw)
        else:
            self.features = output[0] if isinstance(output, (tuple, list)) else output

    def remove(self) -> None:
        self._handle.remove()
        self.features = None


def bare(net: nn.Module) -> nn.Module:
    """The network itself, also when accelerate wrapped it for several processes (DDP's .module)."""
    return getattr(net, "module", net)


def _taps(net: nn.Module) -> list[FeatureTap]:
    return getattr(bare(net), "_dmad_taps", [])


# --------------------------------------------------------------------------- families

class Family:
    """Stable Diffusion 1.x / 2.x: the base every family refines."""

    name = "sd1"
    pipeline_class = "StableDiffusionPipeline"
    denoiser_name = "unet"
    text_encoders: tuple[str, ...] = ("text_encoder",)
    tokenizers: tuple[str, ...] = ("tokenizer",)
    optional_components: tuple[str, ...] = ()  # may be null in model_index.json (SD3's T5)
    flow = False
    lora_targets = LORA_TARGETS  # attention projections, as diffusers' LoRA scripts and DMD2
    # identity.lora_targets "attention+ff" adds these: the transformer blocks' feed-forward layers
    # (diffusers' FeedForward: net.0.proj in, net.2 out), as SimpleTuner's and ai-toolkit's wider targets
    ff_lora_targets: tuple[str, ...] = ("ff.net.0.proj", "ff.net.2")
    vae_fp32 = False    # the VAE overflows in fp16/bf16 and stays float32 (SDXL's)

    denoiser_class = "UNet2DConditionModel"

    def __init__(self, vae_factor: int = 8, guidance: float = 1.0, denoiser_config: Optional[dict] = None):
        self.vae_factor = vae_factor  # pixels per latent pixel of the teacher's VAE
        self.guidance = guidance      # the scale a guidance-embedding network gets when none is given
        self.denoiser_config = denoiser_config or {}  # the teacher's, as inspected

    def lora_modules(self, scope: str = ATTENTION) -> tuple[str, ...]:
        """The layers a LoRA student and fake score adapt for identity.lora_targets."""
        return self.lora_targets + (self.ff_lora_targets if scope == WITH_FF else ())

    # ---- schedule
    def schedule(self, scheduler: Any, resolution: Optional[int] = None) -> NoiseSchedule:
        if self.flow:
            c = scheduler.config
            shift = float(c.get("shift", 1.0))
            if c.get("use_dynamic_shifting", False):
                # Flux: the shift depends on the image token count, as its pipeline computes mu,
                # fixed here at the training resolution
                from diffusers.pipelines.flux.pipeline_flux import calculate_shift

                side = (resolution or 1024) // (self.vae_factor * 2)
                shift = math.exp(calculate_shift(side * side, c.get("base_image_seq_len", 256),
                                                 c.get("max_image_seq_len", 4096), c.get("base_shift", 0.5),
                                                 c.get("max_shift", 1.15)))
            return FlowSchedule(int(c.get("num_train_timesteps", 1000)), shift)
        return NoiseSchedule.from_scheduler(scheduler)

    # ---- prompts
    def encode(self, modules: dict, prompts: list[str], device: Any) -> Cond:
        return Cond(emb=encode_prompts(modules["tokenizer"], modules["text_encoder"], list(prompts), device))

    def uncond(self, modules: dict, device: Any) -> Cond:
        """The batch-1 unconditional embedding the teacher's CFG uses (the empty prompt)."""
        return self.encode(modules, [""], device)

    def guidance_embedded(self, denoiser: nn.Module) -> bool:
        """True when guidance is an input of the network (Flux dev), not a second forward."""
        return False

    # ---- the denoiser
    def _call(self, net: nn.Module, x: torch.Tensor, t: torch.Tensor, cond: Cond, schedule: NoiseSchedule,
              guidance: Optional[float]) -> torch.Tensor:
        return net(x, t, cond["emb"]).sample

    def predict(self, net: nn.Module, x_t: torch.Tensor, t: torch.Tensor, cond: Any, schedule: NoiseSchedule,
                guidance: Optional[float] = None) -> torch.Tensor:
        """The network's native output (eps / v / flow velocity) for x_t (B, C, h, w) at timestep
        indices t (B,), in x_t's layout. Inputs are cast to the network's dtype."""
        cond = as_cond(cond)
        dt = net_dtype(net)
        taps = _taps(net)
        for tap in taps:
            tap.grid = self.token_grid(net, x_t)
        try:
            return self._call(net, x_t.to(dt), t, cond.to(x_t.device, dt), schedule, guidance)
        finally:
            for tap in taps:
                tap.grid = None

    def predict_with_features(self, net: nn.Module, tap: FeatureTap, x_t: torch.Tensor, t: torch.Tensor, cond: Any,
                              schedule: NoiseSchedule, guidance: Optional[float] = None
                              ) -> tuple[torch.Tensor, torch.Tensor]:
        """predict() and the GAN features this very call computed at `tap` (with their graph), so a
        loss never reads features left behind by another forward pass."""
        tap.features = None
        try:
            out = self.predict(net, x_t, t, cond, schedule, guidance)
            features = tap.features
        finally:
            tap.features = None
        if features is None:
            raise RuntimeError("the GAN feature tap saw no forward pass of its network")
        return out, features

    def x0(self, net: nn.Module, x_t: torch.Tensor, t: torch.Tensor, cond: Any, schedule: NoiseSchedule,
           guidance: Optional[float] = None) -> torch.Tensor:
        return schedule.to_x0(x_t.float(), self.predict(net, x_t, t, cond, schedule, guidance).float(), t)

    def guided_x0(self, net: nn.Module, x_t: torch.Tensor, t: torch.Tensor, cond: Any, uncond: Optional[Cond],
                  scale: float, schedule: NoiseSchedule) -> torch.Tensor:
        """The teacher's guided x0: one batched forward on [uncond; cond] and CFG (true CFG), or,
        for a guidance-distilled network, one forward with the scale as an input."""
        cond = as_cond(cond)
        if self.guidance_embedded(net):
            return self.x0(net, x_t, t, cond, schedule, guidance=scale)
        if scale == 1.0 or uncond is None:
            return self.x0(net, x_t, t, cond, schedule)
        b = x_t.shape[0]
        both = Cond.cat([uncond.to(x_t.device).expand(b), cond.to(x_t.device)])
        out_u, out_c = self.predict(net, torch.cat([x_t, x_t]), torch.cat([t, t]), both, schedule).float().chunk(2)
        return schedule.to_x0(x_t.float(), guide(out_u, out_c, scale), t)

    # ---- GAN features
    def tap(self, net: nn.Module) -> FeatureTap:
        mid = getattr(bare(net), "mid_block", None)
        if mid is None:
            raise ValueError("the UNet has no mid_block: the GAN head needs its bottleneck features")
        return self._register(net, FeatureTap(mid, tokens=False))

    @staticmethod
    def _register(net: nn.Module, tap: FeatureTap) -> FeatureTap:
        net = bare(net)
        object.__setattr__(net, "_dmad_taps", _taps(net) + [tap])
        return tap

    def feature_channels(self, net: nn.Module) -> int:
        return int(bare(net).config.block_out_channels[-1])

    def token_grid(self, net: nn.Module, x_t: torch.Tensor) -> Optional[tuple[int, int]]:
        return None

    # ---- latents and sizes
    def size_step(self, denoiser_config: Any) -> int:
        """Pixel sides the teacher takes: VAE factor x UNet downsampling (64 for SD)."""
        return self.vae_factor * 2 ** (len(denoiser_config.block_out_channels) - 1)

    def latents(self, vae: Any, sample: torch.Tensor) -> torch.Tensor:
        """A VAE posterior sample -> the denoiser's latent space (scale, and shift where the VAE has one)."""
        shift = getattr(vae.config, "shift_factor", None) or 0.0
        return (sample - shift) * vae.config.scaling_factor

    def decode(self, vae: Any, latents: torch.Tensor) -> torch.Tensor:
        """Latents (B, C, h, w) -> images in [-1, 1], decoded in the VAE's dtype."""
        shift = getattr(vae.config, "shift_factor", None) or 0.0
        lat = latents.to(net_dtype(vae)) / vae.config.scaling_factor + shift
        return vae.decode(lat).sample.float().clamp(-1, 1)

    # ---- pipelines (teacher samples, export)
    def pipeline(self, modules: dict, scheduler: Any, **override) -> Any:
        import diffusers

        cls = getattr(diffusers, self.pipeline_class)
        kwargs = {k: modules.get(k) for k in self.pipeline_components()}
        kwargs.update(override)
        kwargs["scheduler"] = scheduler
        pipe = cls(**kwargs, **self.pipeline_extra())
        pipe.set_progress_bar_config(disable=True)
        return pipe

    def pipeline_components(self) -> tuple[str, ...]:
        return (self.denoiser_name, "vae", *self.text_encoders, *self.tokenizers)

    def pipeline_extra(self) -> dict:
        return dict(safety_checker=None, feature_extractor=None, requires_safety_checker=False)

    def pipe_latents(self, noise: torch.Tensor) -> torch.Tensor:
        """Item noise (1, C, h, w) in the layout the pipeline's `latents=` takes."""
        return noise

    # SD's pipeline decodes its own latents (the teacher images of earlier runs stay bit-identical);
    # the others return latents that Family.decode turns into pixels in the VAE's own dtype (SDXL's
    # float32 VAE under a bf16 denoiser), unpacked first for Flux
    decode_in_pipeline = True

    def unpack_pipe_latents(self, latents: torch.Tensor, h: int, w: int) -> torch.Tensor:
        return latents

    def fresh_noise(self, like: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """A sampler's re-noising draw from a CPU generator, in the layout the family's pipeline
        draws it (so an exported student gives the same pixels); returned like `like`."""
        n = torch.randn(like.shape, generator=generator, device=generator.device, dtype=torch.float32)
        return n.to(device=like.device, dtype=like.dtype)

    def pipe_call_kwargs(self, scale: float, denoiser: nn.Module) -> dict:
        """The pipeline-call arguments that apply the prompt set's guidance scale."""
        return {"guidance_scale": scale}

    def pipe_prompt_kwargs(self, modules: dict, prompts: list[str], negative: Optional[str] = None) -> dict:
        """The pipeline-call arguments that give it its prompts (and negative prompt)."""
        return {"prompt": prompts, **({"negative_prompt": negative} if negative else {})}


class SD2Family(Family):
    name = "sd2"


class SDXLFamily(Family):
    name = "sdxl"
    decode_in_pipeline = False
    pipeline_class = "StableDiffusionXLPipeline"
    text_encoders = ("text_encoder", "text_encoder_2")
    tokenizers = ("tokenizer", "tokenizer_2")
    vae_fp32 = True

    def _encoder_pipe(self, modules: dict) -> Any:
        from diffusers import StableDiffusionXLPipeline

        pipe = StableDiffusionXLPipeline(vae=modules.get("vae"), text_encoder=modules["text_encoder"],
                                         text_encoder_2=modules["text_encoder_2"], tokenizer=modules["tokenizer"],
                                         tokenizer_2=modules["tokenizer_2"], unet=None, scheduler=None)
        return pipe

    def encode(self, modules: dict, prompts: list[str], device: Any) -> Cond:
        with quiet_pipeline_logs():
            emb, _, pooled, _ = self._encoder_pipe(modules).encode_prompt(
                list(prompts), device=device, do_classifier_free_guidance=False)
        return Cond(emb=emb, pooled=pooled)

    def uncond(self, modules: dict, device: Any) -> Cond:
        # as the pipeline makes it: zeros when force_zeros_for_empty_prompt (SDXL base), else ""
        pipe = self._encoder_pipe(modules)
        with quiet_pipeline_logs():
            _, neg, _, neg_pooled = pipe.encode_prompt([""], device=device, do_classifier_free_guidance=True)
        return Cond(emb=neg, pooled=neg_pooled)

    def _call(self, net, x, t, cond, schedule, guidance):
        h, w = x.shape[-2] * self.vae_factor, x.shape[-1] * self.vae_factor
        # micro-conditioning: original size, crop top-left, target size; a student sample is an
        # uncropped image at the latent's size (DMD2's SDXL recipe)
        ids = torch.tensor([h, w, 0, 0, h, w], device=x.device, dtype=cond["pooled"].dtype).expand(x.shape[0], 6)
        return net(x, t, cond["emb"], added_cond_kwargs={"text_embeds": cond["pooled"], "time_ids": ids}).sample

    def pipeline_extra(self) -> dict:
        return {}


class SD3Family(Family):
    name = "sd3"
    decode_in_pipeline = False
    pipeline_class = "StableDiffusion3Pipeline"
    denoiser_name = "transformer"
    denoiser_class = "SD3Transformer2DModel"
    text_encoders = ("text_encoder", "text_encoder_2", "text_encoder_3")
    tokenizers = ("tokenizer", "tokenizer_2", "tokenizer_3")
    optional_components = ("text_encoder_3", "tokenizer_3")
    flow = True
    lora_targets = ("to_q", "to_k", "to_v", "to_out.0", "add_q_proj", "add_k_proj", "add_v_proj", "to_add_out")
    ff_lora_targets = ("ff.net.0.proj", "ff.net.2", "ff_context.net.0.proj", "ff_context.net.2")
    max_sequence_length = 256

    def _encoder_pipe(self, modules: dict) -> Any:
        """The family's pipeline holding the text encoders, for its encode_prompt. SD3 without T5
        reads the transformer's joint_attention_dim (the width of T5's zero stand-in): when the
        transformer is not loaded (`dmad cache`), a meta-device copy built from its config serves."""
        import diffusers
        from accelerate import init_empty_weights

        den = modules.get(self.denoiser_name)
        if den is None and self.denoiser_config:
            with init_empty_weights():
                den = getattr(diffusers, self.denoiser_class).from_config(self.denoiser_config)
        kw = {k: modules.get(k) for k in (*self.text_encoders, *self.tokenizers)}
        return getattr(diffusers, self.pipeline_class)(vae=modules.get("vae"), scheduler=None,
                                                       **{self.denoiser_name: den}, **kw)

    def encode(self, modules: dict, prompts: list[str], device: Any) -> Cond:
        p = list(prompts)
        with quiet_pipeline_logs():
            emb, _, pooled, _ = self._encoder_pipe(modules).encode_prompt(
                p, p, p, device=device, do_classifier_free_guidance=False,
                max_sequence_length=self.max_sequence_length)
        return Cond(emb=emb, pooled=pooled)

    def _call(self, net, x, t, cond, schedule, guidance):
        from dmad.models import repeated_tokens

        # SD3 takes the scheduler's timestep value: sigma * num_train_timesteps
        ts = schedule.sigma_of(t).to(x.dtype) * schedule.num_train_timesteps
        # no T5 (or a null one): its zero tokens computed as one (exact; dmad/models/repeated_tokens.py)
        emb, joint = repeated_tokens.collapse_for(bare(net), cond["emb"], self.max_sequence_length)
        return net(hidden_states=x, timestep=ts, encoder_hidden_states=emb, pooled_projections=cond["pooled"],
                   **({"joint_attention_kwargs": joint} if joint else {})).sample

    def pipe_prompt_kwargs(self, modules: dict, prompts: list[str], negative: Optional[str] = None) -> dict:
        """The prompts encoded here, as the pipeline would; where the T5 part is all zeros (no T5,
        or a null one) with those zero tokens collapsed to one (exact, ~5x cheaper at 64 image tokens)."""
        from dmad.models import repeated_tokens

        c, u = self.encode(modules, prompts, None), self.encode(modules, [negative or ""] * len(prompts), None)
        both, joint = repeated_tokens.collapse_for(modules[self.denoiser_name], torch.cat([c["emb"], u["emb"]]),
                                                   self.max_sequence_length)  # both collapsed, or neither
        kw = {"prompt_embeds": both[:len(prompts)], "pooled_prompt_embeds": c["pooled"],
              "negative_prompt_embeds": both[len(prompts):], "negative_pooled_prompt_embeds": u["pooled"]}
        return {**kw, "joint_attention_kwargs": joint} if joint else kw

    def tap(self, net: nn.Module) -> FeatureTap:
        blocks = bare(net).transformer_blocks
        return self._register(net, FeatureTap(blocks[len(blocks) // 2], tokens=True))

    def feature_channels(self, net: nn.Module) -> int:
        return int(bare(net).config.num_attention_heads * bare(net).config.attention_head_dim)

    def token_grid(self, net, x_t):
        p = int(bare(net).config.patch_size)
        return x_t.shape[-2] // p, x_t.shape[-1] // p

    def size_step(self, denoiser_config) -> int:
        return self.vae_factor * int(denoiser_config.patch_size)

    def pipeline_extra(self) -> dict:
        return {}


class FluxFamily(SD3Family):
    name = "flux"
    pipeline_class = "FluxPipeline"
    denoiser_class = "FluxTransformer2DModel"
    text_encoders = ("text_encoder", "text_encoder_2")
    tokenizers = ("tokenizer", "tokenizer_2")
    optional_components = ()
    # the single-stream blocks' MLP input too (their proj_out joins attention and MLP outputs, and
    # its name is also the transformer's final layer's: left out)
    ff_lora_targets = SD3Family.ff_lora_targets + ("proj_mlp",)
    max_sequence_length = 512
    pipe_prompt_kwargs = Family.pipe_prompt_kwargs  # T5 is always there: prompts as text

    def encode(self, modules: dict, prompts: list[str], device: Any) -> Cond:
        p = list(prompts)
        with quiet_pipeline_logs():
            emb, pooled, _ = self._encoder_pipe(modules).encode_prompt(p, p, device=device,
                                                                       max_sequence_length=self.max_sequence_length)
        return Cond(emb=emb, pooled=pooled)

    def guidance_embedded(self, denoiser: nn.Module) -> bool:
        return bool(getattr(bare(denoiser).config, "guidance_embeds", False))

    def _call(self, net, x, t, cond, schedule, guidance):
        from diffusers import FluxPipeline

        b, c, h, w = x.shape
        packed = FluxPipeline._pack_latents(x, b, c, h, w)
        img_ids = FluxPipeline._prepare_latent_image_ids(b, h // 2, w // 2, x.device, x.dtype)
        txt_ids = torch.zeros(cond["emb"].shape[1], 3, device=x.device, dtype=x.dtype)
        g = None
        if self.guidance_embedded(net):
            g = torch.full((b,), float(guidance if guidance is not None else self.guidance),
                           device=x.device, dtype=torch.float32)
        # Flux takes sigma in [0, 1] (it multiplies by 1000 inside)
        out = net(hidden_states=packed, timestep=schedule.sigma_of(t).to(x.dtype), guidance=g,
                  pooled_projections=cond["pooled"], encoder_hidden_states=cond["emb"], txt_ids=txt_ids,
                  img_ids=img_ids).sample
        return self.unpack_pipe_latents(out, h, w)

    def token_grid(self, net, x_t):
        return x_t.shape[-2] // 2, x_t.shape[-1] // 2

    def size_step(self, denoiser_config) -> int:
        return self.vae_factor * 2

    def pipe_latents(self, noise: torch.Tensor) -> torch.Tensor:
        from diffusers import FluxPipeline

        b, c, h, w = noise.shape
        return FluxPipeline._pack_latents(noise, b, c, h, w)

    def fresh_noise(self, like: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        # FluxPipeline's scheduler draws in the packed (B, h/2 * w/2, 4C) layout
        b, c, h, w = like.shape
        n = torch.randn((b, (h // 2) * (w // 2), 4 * c), generator=generator, device=generator.device,
                        dtype=torch.float32)
        return self.unpack_pipe_latents(n, h, w).to(device=like.device, dtype=like.dtype)

    def unpack_pipe_latents(self, latents: torch.Tensor, h: int, w: int) -> torch.Tensor:
        b, n, c4 = latents.shape
        c = c4 // 4
        return latents.view(b, h // 2, w // 2, c, 2, 2).permute(0, 3, 1, 4, 2, 5).reshape(b, c, h, w)

    def pipe_call_kwargs(self, scale: float, denoiser: nn.Module) -> dict:
        # guidance-distilled (dev): the scale is the embedded guidance; otherwise true CFG on ""
        if self.guidance_embedded(denoiser):
            return {"guidance_scale": scale}
        return {"true_cfg_scale": scale, "negative_prompt": ""}


FAMILIES: dict[str, type[Family]] = {f.name: f for f in (Family, SD2Family, SDXLFamily, SD3Family, FluxFamily)}
# model_index.json _class_name -> the families it can be
PIPELINE_FAMILIES = {"StableDiffusionPipeline": ("sd1", "sd2"), "StableDiffusionXLPipeline": ("sdxl",),
                     "StableDiffusion3Pipeline": ("sd3",), "FluxPipeline": ("flux",)}
FAMILY_NAMES = tuple(FAMILIES)


def make_family(name: str, vae_factor: int = 8, denoiser_config: Optional[dict] = None) -> Family:
    """The family `name` bound to a teacher: its VAE's downsampling factor and denoiser config."""
    return FAMILIES[name](vae_factor=vae_factor, denoiser_config=denoiser_config)


def net_dtype(net: nn.Module) -> torch.dtype:
    net = bare(net)
    net = getattr(net, "base_network", net)  # a view of a shared base (dmad.models.shared_base): the base's
    for p in net.parameters():
        if p.is_floating_point():
            return p.dtype
    return torch.float32
