"""The memory ledger: a run's framework peak per device, estimated line by line from the config and
the teacher's file headers before anything loads (docs/memory.md). Torch-free. Its types and its
JSON form are the contract's (dmad.contract.memory): the app reads what this computes.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

from dmad.contract.memory import Ledger, LedgerLine, ledger_document, ledger_total
from dmad.contract.config import COMPUTE_FORMAT, FLOAT_FORMATS
from dmad.memory.readings import GIB

if TYPE_CHECKING:
    from dmad.models.teacher import TeacherInfo


BYTES = {mp: FLOAT_FORMATS[fmt][0] for mp, fmt in COMPUTE_FORMAT.items()}  # per value, by mixed_precision
DTYPE_NAME = COMPUTE_FORMAT
# Weight-only int8 / fp8 (dmad.models.quant.quantize_linears): each nn.Linear weight in 1 byte plus
# a float32 scale per output channel, every other parameter (convolutions, norms, embeddings,
# biases) in bf16. Per family: (share of the denoiser's parameters that are nn.Linear weights,
# output channels of those linears per parameter). Measured with linear_params-style sums on the
# meta models of the published configs (tests/engine/real_configs.py; SD 1.5 and SD 2.1 UNet
# configs for sd1/sd2): SD 1.5 0.3142 / 0.00027, SD 2.1 0.3479 / 0.00030 (1x1-conv projections and
# ResNet convolutions stay bf16), SDXL base 0.8696 / 0.00057, SD3-medium 0.99941 / 0.00054,
# SD3.5-large 0.99964 / 0.00034, FLUX.1-dev 0.99974 / 0.00026.
LINEAR_SHARE = {"sd1": (0.3142, 0.00027), "sd2": (0.3479, 0.00030), "sdxl": (0.8696, 0.00057),
                "sd3": (0.9994, 0.00054), "flux": (0.9997, 0.00026)}
# Optimizer state tensors per trainable parameter (dmad.methods.unit.make_optimizer: Adam(W) keeps
# exp_avg and exp_avg_sq; its SGD has no momentum buffer).
OPTIMIZER_STATES = {"adamw": 2, "adam": 2, "sgd": 0}
# Saved activations of one UNet forward with graph, in values per sample per latent pixel per
# base channel (block_out_channels[0]). Measured by summing the tensors autograd saves in SD 1.5's
# UNet (64x64 latents, 77 tokens) with memory-efficient attention (q, k, v, out saved; no
# attention matrix): 405 at 32-128 px latents, i.e. ~2 GiB fp32 at 512 px, batch 1.
ACTIVATION_VALUES = 405
# With gradient checkpointing the same count gave 60 (block inputs only); backward recomputes one
# block at a time on top, so 0.25 is the stated rule.
CHECKPOINTING_FACTOR = 0.25
# UNet graphs alive at the peak: the critic step backpropagates through the fake score on student
# samples and on noised real latents; the student step through the student and the fake score (GAN).
GRAPHS_AT_PEAK = 2
CONTEXT_GIB, FRAGMENTATION = 0.5, 0.10
# Text tokens a transformer block sees per sample: SD3 joins 77 CLIP tokens (CLIP-L and CLIP-G
# side by side) and 256 T5 tokens (StableDiffusion3Pipeline's max_sequence_length); Flux uses the
# 512 T5 tokens of FLUX.1-dev (the pooled CLIP vector is no token).
TEXT_TOKENS = {"sd3": 77 + 256, "flux": 512}


def _denoiser_word(info: "TeacherInfo") -> str:
    return "UNet" if info.denoiser == "unet" else "transformer"


def _trainable(name: str, mode: str, info: "TeacherInfo", rank: int, optimizer: str,
               mixed_precision: str = "no", shared: bool = False, why_not_shared: str = "") -> LedgerLine:
    """A student or fake-score line. `shared`: a LoRA adapter on the shared frozen base (whose
    weights are their own line), so only the adapter's trainable state is counted here.
    `why_not_shared`: for a separate LoRA copy, why it is not on a shared base."""
    n = info.denoiser_params
    per_trainable = 4 * (2 + OPTIMIZER_STATES[optimizer])  # fp32 master + grad + states
    states = f"{OPTIMIZER_STATES[optimizer]} {optimizer} states"
    if mode == "full":
        return LedgerLine(f"{name} (full)", n * per_trainable / GIB,
                          f"{n / 1e6:.0f} M params fp32 + grads + {states}; a full network is always its own "
                          f"copy (never on a shared base)")
    adapter = rank * info.unet_lora_params_per_rank
    names = tuple(info.lora_targets)
    short = ("to_q", "to_k", "to_v", "to_out.0")
    targets = "/".join(("to_q/k/v/out",) + names[4:]) if names[:4] == short else "/".join(names)
    adapter_how = (f"{adapter / 1e6:.2f} M adapter params on {targets} (rank x (in + out)), fp32 + grads + "
                   f"{states}")
    if shared:
        return LedgerLine(f"{name} (LoRA r={rank}, on the shared base)", adapter * per_trainable / GIB,
                          f"{adapter_how}; its frozen base is the shared line, not counted again")
    # the frozen base of a LoRA copy is held in the autocast dtype (dmad.models.networks.make_trainable_copy)
    base = BYTES[mixed_precision]
    return LedgerLine(f"{name} (LoRA r={rank})", (n * base + adapter * per_trainable) / GIB,
                      f"frozen {DTYPE_NAME[mixed_precision]} copy of the {_denoiser_word(info)} + {adapter_how}"
                      + (f" ({why_not_shared})" if why_not_shared else ""))


def _why_not_shared(student: str, fake_score: str, share_frozen_base: bool) -> str:
    """Why a LoRA network of a run keeps its own frozen copy instead of sitting on the shared base."""
    if not share_frozen_base:
        return "separate copies: resources.share_frozen_base is false"
    full = [name for name, mode in (("student", student), ("fake score", fake_score)) if mode == "full"]
    return f"no shared base: the {full[0]} is a full network" if full else ""


def teacher_bytes_per_param(family: str, precision: str, mixed_precision: str) -> tuple[float, str]:
    """(bytes per parameter, what it is) of the frozen teacher denoiser under
    resources.teacher_precision: auto = the mixed-precision dtype; int8 / fp8 = LINEAR_SHARE's
    linear weights in 1 byte + their float32 per-channel scales + the rest in bf16."""
    if precision == "auto":
        return BYTES[mixed_precision], DTYPE_NAME[mixed_precision]
    if precision in FLOAT_FORMATS:
        return FLOAT_FORMATS[precision][0], precision
    share, outs = LINEAR_SHARE[family]
    return (share * 1 + (1 - share) * 2 + outs * 4,
            f"{precision} weight-only ({share:.2%} of params are linear weights at 1 B + fp32 per-channel scales, "
            f"the rest bf16)")


# Values autograd saves per token per block, in units of the block width D (heads x head_dim),
# for diffusers' blocks run under autocast with memory-efficient SDPA (q, k, v and the output are
# saved; never an attention matrix). Double-stream block (SD3 JointTransformerBlock, Flux
# FluxTransformerBlock), per token of either stream: two AdaLN-Zero norms x (LayerNorm input,
# normalised, modulated) = 6; attention: joint q, k, v + output + its reshaped copy for to_out = 5;
# two gated residuals (the gated tensor) = 2; 4x GELU-tanh MLP: hidden pre-activation + activation
# = 8; total 21. qk RMSNorm (SD3.5, Flux) saves the normalised q and k: +2; Flux's rotary
# embedding saves q and k before rotation and their rotated halves: +4 (Flux double block 27).
# Flux single-stream block (FluxSingleTransformerBlock), per token of the joined sequence: AdaLN
# 3 + MLP hidden and activation 8 + q, k, v, output 4 + qk norm 2 + rotary 4 + the concatenated
# [attention, MLP] input of proj_out 5 + gated output 1 = 27. Gradient checkpointing (diffusers
# checkpoints every block) keeps each block's inputs (1 D per token per block) and recomputes one
# block at a time in backward. Not counted: embeddings, the final layer, fp32 copies autocast makes
# for norms, the teacher's forwards (no graph) and LoRA's rank-r intermediates (r << D).
DOUBLE_BLOCK, QK_NORM, ROPE, SINGLE_BLOCK = 21, 2, 4, 27


def transformer_activation_values(info: "TeacherInfo", resolution: int, gradient_checkpointing: bool) \
        -> tuple[float, str]:
    """(saved activation values per sample for one forward with graph, how): the block model
    above x tokens x width, from info.denoiser_config. Image tokens = (resolution / vae factor /
    patch)^2 with patch = patch_size for SD3 and 2 for Flux (its 2x2 packing; patch_size is 1)."""
    cfg = info.denoiser_config
    width = int(cfg["num_attention_heads"]) * int(cfg["attention_head_dim"])
    patch = 2 if info.family == "flux" else int(cfg.get("patch_size") or 2)
    side = resolution // info.vae_scale_factor // patch
    text = info.text_tokens if info.text_tokens is not None else TEXT_TOKENS.get(info.family, 0)
    tokens = side * side + text
    double = int(cfg.get("num_layers") or 0)
    single = int(cfg.get("num_single_layers") or 0)
    qk = info.family == "flux" or bool(cfg.get("qk_norm"))
    per_double = DOUBLE_BLOCK + (QK_NORM if qk else 0) + (ROPE if info.family == "flux" else 0)
    full = double * per_double + single * SINGLE_BLOCK
    how = (f"{side * side} image + {text} text tokens x width {width} x "
           f"({double} blocks x {per_double}" + (f" + {single} single blocks x {SINGLE_BLOCK}" if single else "")
           + " values/token/width)")
    if gradient_checkpointing:
        saved = (double + single) + max(per_double if double else 0, SINGLE_BLOCK if single else 0)
        how += f"; gradient checkpointing: 1 per block + one block recomputed = {saved}"
        return float(saved * tokens * width), how
    return float(full * tokens * width), how


def _saved_base_weights(n_den: int, family: str, *, teacher_precision: str, mixed_precision: str,
                        teacher_cpu_offload: bool, teacher_bytes: float, teacher_dtype: str) \
        -> Optional[tuple[float, str]]:
    """(bytes, how) of base weights the graphs through the adapters keep for backward on a shared
    frozen base without gradient checkpointing, beyond the base itself; None when there are none.
    A linear layer's backward needs the weight it multiplied by: a base stored in the compute dtype
    saves the stored tensor itself (nothing extra), but an int8 / fp8 base saves the weights it
    dequantised (dmad.models.quant.WeightOnlyLinear), a base in another float dtype the copies
    autocast cast, and an offloaded base the device copy each graph ran on (it outlives the move
    back to CPU RAM). With gradient checkpointing only one block's are alive at a time (not counted)."""
    wb, dt = BYTES[mixed_precision], DTYPE_NAME[mixed_precision]
    graphs = f"each of the {GRAPHS_AT_PEAK} graphs through an adapter"
    if teacher_precision in ("int8", "fp8"):
        share = LINEAR_SHARE[family][0]
        return (GRAPHS_AT_PEAK * share * n_den * wb,
                f"{graphs} keeps the {dt} weights its {teacher_precision} linear layers dequantised ({share:.2%} "
                f"of {n_den / 1e6:.0f} M params) for backward; gradient checkpointing avoids it")
    if mixed_precision != "no" and teacher_dtype != dt:
        return (GRAPHS_AT_PEAK * n_den * wb,
                f"{graphs} keeps autocast's {dt} casts of the {teacher_precision} base weights for backward; "
                f"gradient checkpointing avoids it")
    if teacher_cpu_offload:
        return ((GRAPHS_AT_PEAK - 1) * n_den * teacher_bytes,
                f"{graphs} keeps the GPU copy of the base it ran on after the base returns to CPU RAM; the "
                f"transient line counts one of the {GRAPHS_AT_PEAK}; gradient checkpointing avoids it")
    return None


def estimate_ledger(info: "TeacherInfo", *, student: str, fake_score: str, lora_rank: int, mixed_precision: str,
                    gradient_checkpointing: bool, train_batch_size: int, resolution: int, optimizer: str,
                    teacher_precision: str = "auto", teacher_cpu_offload: bool = False, share_frozen_base: bool = True,
                    method: str = "dmad", processes: int = 1, distributed: str = "ddp",
                    fsdp_shard_teacher: bool = False, fsdp_cpu_offload: bool = False, device: str = "cuda") -> Ledger:
    """Framework-scope estimate of the training peak on one device, line by line with the
    assumption behind each: a rule of thumb for planning, not a measurement (`dmad probe`
    measures). Shapes come from the configs alone (inspect_teacher), so no weights are needed;
    any family (sd1, sd2, sdxl: UNet; sd3, flux: transformer).

    Lines: the frozen teacher denoiser (teacher_precision; int8/fp8 per LINEAR_SHARE); the student
    and the fake score (fp32 master + grads + optimizer states, or a frozen copy in the autocast
    dtype + LoRA); the GAN head; the VAE (fp32 where the family keeps it so: SDXL) and every text
    encoder (mixed precision); the activations (UNet: ACTIVATION_VALUES per latent pixel per base
    channel; transformer: transformer_activation_values), x batch x GRAPHS_AT_PEAK; a margin. With
    teacher_cpu_offload the teacher denoiser and the text encoders are a CPU RAM line (not in the
    total) and only the largest of them is counted on the GPU, transiently, during its call.

    A shared base (resources.share_frozen_base with a LoRA student and a LoRA fake score, the rule
    of dmad.models.networks.shares_base): the teacher's denoiser is the only frozen copy, one
    line counted once in teacher_precision, and the student and fake-score lines are their
    adapters alone; offload moves that base, as it moves the teacher otherwise. Without gradient
    checkpointing the graphs through the adapters may keep extra base weights
    (_saved_base_weights), a line of its own.

    The method (dmad.methods: its unit) adds its own lines beside the student's (DMAD: the fake
    score and the GAN head; latent consistency distillation: its EMA target), says how many graphs
    with gradients are alive at the peak and whether its LoRA networks may share the frozen base.
    One GPU of `processes` with ddp or fsdp: _sharding_lines. `device`: "cuda", or "cpu" for a run
    on the CPU (no CUDA device: training_device), whose margin has no CUDA context (margin_line)."""
    from dmad.methods import method_unit
    from dmad.methods.unit import LedgerInputs
    from dmad.models.networks import shares_base

    wb, dt, n_den, word = BYTES[mixed_precision], DTYPE_NAME[mixed_precision], info.denoiser_params, _denoiser_word(info)
    unit = method_unit(method)
    shared = unit.shares_base and shares_base(student, fake_score, share_frozen_base)
    encoders = {c: n for c, n in info.param_counts.items() if c not in (info.denoiser, "vae")}
    n_text = sum(encoders.values())
    tb, tdt = teacher_bytes_per_param(info.family, teacher_precision, mixed_precision)
    teacher_how = f"{info.family}: {n_den / 1e6:.0f} M params in {tdt}, no grads" + (
        "; held once: the teacher's own denoiser, with the student's and the fake score's LoRA adapters on it "
        "(resources.share_frozen_base)" if shared else "")
    frozen_name = f"frozen base: teacher + student + fake score ({word})" if shared else f"teacher {word} (frozen)"
    why = unit.own_copy or ("" if shared else _why_not_shared(student, fake_score, share_frozen_base))
    lines = [] if teacher_cpu_offload else [LedgerLine(frozen_name, n_den * tb / GIB, teacher_how)]
    lines.append(_trainable("student", student, info, lora_rank, optimizer, mixed_precision, shared, why))
    lines += unit.ledger_lines(LedgerInputs(
        fake_score=fake_score, optimizer_states=OPTIMIZER_STATES[optimizer],
        bottleneck_channels=info.bottleneck_channels,
        student_trainable=n_den if student == "full" else lora_rank * info.unet_lora_params_per_rank,
        trainable=lambda name, mode: _trainable(name, mode, info, lora_rank, optimizer, mixed_precision, shared, why),
        line=lambda name, nbytes, how: LedgerLine(name, nbytes / GIB, how)))
    lines += _vae_and_encoder_lines(info, mixed_precision, teacher_cpu_offload)
    saved = None if not shared or gradient_checkpointing else _saved_base_weights(
        n_den, info.family, teacher_precision=teacher_precision, mixed_precision=mixed_precision,
        teacher_cpu_offload=teacher_cpu_offload, teacher_bytes=tb, teacher_dtype=tdt)
    if saved is not None:
        lines.append(LedgerLine("base weights saved for backward", saved[0] / GIB, saved[1]))
    offloaded = {f"frozen base {word}" if shared else f"teacher {word}": n_den * tb,
                 **{c: n * wb for c, n in encoders.items()}}
    if teacher_cpu_offload:
        lines.append(_offload_transient(offloaded, shared))
    lines.append(_activations_line(info, unit.graphs_at_peak, train_batch_size, resolution, gradient_checkpointing,
                                   mixed_precision))
    if processes > 1 or distributed == "fsdp":
        trained = {"full": n_den, "lora": lora_rank * info.unet_lora_params_per_rank}
        lines = _sharding_lines(lines, info, processes=processes, distributed=distributed, trainable=trained[student]
                                + (trained[fake_score] if "fake_score" in unit.networks else 0), teacher_line=frozen_name,
                                shard_teacher=fsdp_shard_teacher and not teacher_cpu_offload and not shared,
                                cpu_offload=fsdp_cpu_offload, mixed_precision=mixed_precision)
    lines.append(margin_line(ledger_total(lines), device))
    if teacher_cpu_offload:
        lines.append(LedgerLine(f"{next(iter(offloaded))} + text encoders (CPU RAM)", (n_den * tb + n_text * wb) / GIB,
                                f"teacher_cpu_offload: {teacher_how}; "
                                + " + ".join(f"{c} {n / 1e6:.0f} M" for c, n in encoders.items())
                                + f" in {dt}; host memory, not in the total", scope="cpu"))
    ledger = Ledger(lines, info.family)
    ledger.device = device  # ledger_json's inputs and format_ledger's header say it
    return ledger


def training_device() -> str:
    """Where a run started on this machine trains: "cuda", or "cpu" when torch sees no CUDA device
    (dmad.train.build puts the accelerator on the CPU then). torch is imported here, only when asked."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def margin_line(subtotal: float, device: str) -> LedgerLine:
    """The CUDA context (CONTEXT_GIB, a GPU run only: a CPU run creates none) + allocator fragmentation."""
    if device == "cpu":
        return LedgerLine("margin", FRAGMENTATION * subtotal,
                          f"{FRAGMENTATION:.0%} allocator fragmentation (a CPU run)")
    return LedgerLine("margin", CONTEXT_GIB + FRAGMENTATION * subtotal,
                      f"CUDA context {CONTEXT_GIB} GiB + {FRAGMENTATION:.0%} allocator fragmentation")


def _offload_transient(offloaded: dict[str, float], shared: bool) -> LedgerLine:
    """teacher_cpu_offload: the largest offloaded network (bytes by name) on the GPU during its call."""
    largest = max(offloaded, key=offloaded.get)
    return LedgerLine("teacher offload (transient)", offloaded[largest] / GIB,
                      f"teacher_cpu_offload: the largest offloaded network ({largest}) on the GPU during its own "
                      f"call" + ("; the shared base is on the GPU for each teacher, student and fake-score call, one "
                                 "at a time" if shared else ""))


SHARDED_NAMES = ("student (full)", "fake score (full)", "GAN head")


def _sharding_lines(lines: list[LedgerLine], info: "TeacherInfo", *, processes: int, distributed: str,
                    trainable: int, shard_teacher: bool, teacher_line: str, cpu_offload: bool,
                    mixed_precision: str) -> list[LedgerLine]:
    """The lines of one GPU of `processes` (one GPU each; dmad.train.sharding). ddp: everything whole, plus DDP's
    gradient buckets (torch DDP copies each gradient into a flat float32 bucket: gradient_as_bucket_view
    is off). fsdp: the full networks, the GAN head (and the teacher) divided by the processes; the
    largest unit gathered twice in the compute dtype (the one computing and the next, prefetched)
    and its gradient in the compute dtype plus the float32 copy reduce-scatter takes; with
    fsdp_cpu_offload the shards live in CPU RAM."""
    wb, dt = BYTES[mixed_precision], DTYPE_NAME[mixed_precision]
    if distributed != "fsdp":
        return lines + [LedgerLine(
            "DDP gradient buckets", trainable * 4 / GIB,
            f"{trainable / 1e6:.0f} M trainable params: DDP keeps a float32 copy of every gradient in its buckets "
            f"for the all-reduce ({processes} processes, each with every network whole)")]
    out = []
    present = {line.name for line in lines}
    sharded = {n for n in SHARDED_NAMES[:2] if n in present}
    if "fake score (full)" in sharded:
        sharded.add("GAN head")  # sharded with the full fake score (one optimizer steps both)
    for line in lines:
        if line.name in sharded or (shard_teacher and line.name == teacher_line):
            how = f"{line.assumption}; sharded over {processes} processes (1/{processes} here)"
            if cpu_offload:
                out.append(LedgerLine(f"{line.name}, this process's shard (CPU RAM)", line.gib / processes,
                                      how + "; fsdp_cpu_offload: in host memory, not in the total", scope="cpu"))
            else:
                out.append(LedgerLine(line.name, line.gib / processes, how))
        else:
            out.append(line)
    unit = info.shard_unit_params
    out.append(LedgerLine(
        "FSDP gather + reduce buffers", unit * (3 * wb + 4) / GIB,
        f"the largest unit ({unit / 1e6:.0f} M params) gathered in {dt} twice (computing, and the next one "
        f"prefetched) + its gradient in {dt} + the float32 copy reduce-scatter takes"))
    return out


def _activations_line(info: "TeacherInfo", graphs: int, batch: int, resolution: int, checkpointing: bool,
                      mixed_precision: str) -> LedgerLine:
    """The activations of `graphs` graphs with gradients alive at the peak (UNet: ACTIVATION_VALUES
    per latent pixel per base channel; transformer: transformer_activation_values)."""
    wb, dt = BYTES[mixed_precision], DTYPE_NAME[mixed_precision]
    if info.denoiser == "unet":
        latent = resolution // info.vae_scale_factor
        base = info.unet_block_out_channels[0]
        act = (ACTIVATION_VALUES * graphs * batch * latent * latent * base * wb
               * (CHECKPOINTING_FACTOR if checkpointing else 1.0))
        how = (f"{ACTIVATION_VALUES} values x batch {batch} x {latent}x{latent} latent px x "
               f"{base} base channels x {graphs} UNet graph{'s' if graphs > 1 else ''}, {dt}"
               + (f", x{CHECKPOINTING_FACTOR} for gradient checkpointing" if checkpointing else "")
               + "; memory-efficient attention assumed")
    else:
        values, per_sample = transformer_activation_values(info, resolution, checkpointing)
        act = values * graphs * batch * wb
        how = (f"{per_sample} x batch {batch} x {graphs} transformer graph{'s' if graphs > 1 else ''}, {dt}; "
               f"memory-efficient attention assumed")
    return LedgerLine("activations", act / GIB, how)


def _vae_and_encoder_lines(info: "TeacherInfo", mixed_precision: str, offload: bool) -> list[LedgerLine]:
    """The frozen VAE (fp32 where the family keeps it so: SDXL) and text encoders (mixed precision;
    with teacher_cpu_offload the encoders are in the CPU line instead); SD 1.x/2.x on the GPU keep
    their one "VAE + text encoder" line."""
    from dmad.models.families import FAMILIES

    wb, dt = BYTES[mixed_precision], DTYPE_NAME[mixed_precision]
    encoders = {c: n for c, n in info.param_counts.items() if c not in (info.denoiser, "vae")}
    n_text, n_vae = sum(encoders.values()), info.param_counts["vae"]
    vae_fp32 = FAMILIES[info.family].vae_fp32 if info.family in FAMILIES else False
    vb = 4 if vae_fp32 else wb
    if info.family in ("sd1", "sd2") and not offload:
        return [LedgerLine("VAE + text encoder (frozen)", (n_vae * vb + n_text * wb) / GIB,
                           f"{(n_vae + n_text) / 1e6:.0f} M params in {dt}")]
    vdt = "fp32 (kept float32 by the family)" if vae_fp32 else dt
    lines = [LedgerLine("VAE (frozen)", n_vae * vb / GIB, f"{n_vae / 1e6:.1f} M params in {vdt}")]
    if not offload:
        names = " + ".join(f"{c} {n / 1e6:.0f} M" for c, n in encoders.items())
        lines.append(LedgerLine("text encoders (frozen)", n_text * wb / GIB, f"{names}, in {dt}"))
    return lines


def format_ledger(lines: list[LedgerLine]) -> str:
    """A plain-text table: name, GiB, assumption; then the GPU total (a CPU RAM line is shown but
    not added). A Ledger names its teacher family in the header."""
    width = max([len(line.name) for line in lines] + [len("total")])
    family = getattr(lines, "family", None)
    head = (f"family {family}" if family else "") + (" (CPU run)" if getattr(lines, "device", None) == "cpu" else "")
    rows = [f"{head:<{width}}  {'GiB':>7}  assumption"]
    rows += [f"{line.name:<{width}}  {line.gib:>7.2f}  {line.assumption}" for line in lines]
    rows.append(f"{'total':<{width}}  {ledger_total(lines):>7.2f}")
    return "\n".join(rows)


def config_ledger(cfg: Any, info: "Optional[TeacherInfo]" = None, processes: int = 1,
                  distributed: Optional[str] = None, device: Optional[str] = None) -> Ledger:
    """The ledger of a run config (dmad.contract.config.TrainConfig) on one GPU of `processes`, with
    its resources.distributed (or `distributed`: the side-by-side comparison); the teacher is
    inspected (configs and file headers only) unless `info` is given. `device`: "cuda" or "cpu";
    None: where a run started here would train (training_device), so a CPU machine's estimate
    has no CUDA context in its margin."""
    if info is None:
        from dmad.models.teacher import inspect_teacher

        ident = cfg.identity
        info = inspect_teacher(ident.pretrained_model_name_or_path, ident.model_family, ident.teacher_config_dir)
    r, ident = cfg.resources, cfg.identity
    info = info.for_lora_targets(ident.lora_targets)
    ledger = estimate_ledger(info, student=ident.student, fake_score=ident.fake_score, lora_rank=ident.lora_rank,
                             mixed_precision=r.mixed_precision, gradient_checkpointing=r.gradient_checkpointing,
                             train_batch_size=r.train_batch_size, resolution=r.resolution,
                             optimizer=cfg.optimization.optimizer, teacher_precision=r.teacher_precision,
                             teacher_cpu_offload=r.teacher_cpu_offload, share_frozen_base=r.share_frozen_base,
                             method=cfg.distillation.method, processes=processes,
                             distributed=distributed or r.distributed, fsdp_shard_teacher=r.fsdp_shard_teacher,
                             fsdp_cpu_offload=r.fsdp_cpu_offload, device=device or training_device())
    if ident.teacher_loras:
        ledger.append(teacher_loras_line(ident.teacher_loras))
    return ledger


def teacher_loras_line(loras: Any) -> LedgerLine:
    """identity.teacher_loras: fused into the teacher's own weights when it loads (dmad.models.teacher_loras),
    so nothing on the device; their files are in host memory only while the teacher loads."""
    from dmad.models.teacher_loras import lora_path

    total = sum(p.stat().st_size for p in (lora_path(x.path) for x in loras) if p.is_file())
    return LedgerLine(f"teacher LoRAs ({len(loras)}, fused at load; CPU RAM while loading)", total / GIB,
                      f"{total / 2**20:.1f} MiB of LoRA files, read once and fused into the teacher's weights: "
                      f"0 on the device and no time per step; host memory, not in the total", scope="cpu")


def checkpoint_bytes(cfg: Any, info: "TeacherInfo") -> int:
    """At least what one checkpoint of a run config takes on disk, from the teacher's parameter
    counts: each network the method trains (identity.student, identity.fake_score ...: the whole
    denoiser, or its LoRA adapter) in float32 with its optimizer's states, and the student's EMA.
    The method's own smaller tensors (DMAD's GAN head) are left out: a run that fits is never refused."""
    from dmad.methods import method_unit

    ident = cfg.identity
    trained = {"full": info.denoiser_params, "lora": ident.lora_rank * info.lora_params_per_rank(ident.lora_targets)}
    networks = method_unit(cfg.distillation.method).layout(ident).networks
    values = sum(trained[mode] for _, mode in networks) * (1 + OPTIMIZER_STATES[cfg.optimization.optimizer])
    if cfg.distillation.ema_decay is not None:
        values += trained[ident.student]
    return 4 * values


def format_comparison(by_mode: dict[str, list[LedgerLine]], processes: int) -> str:
    """ddp and fsdp side by side, one GPU of `processes`: each line's GiB in both (a CPU RAM line in
    brackets, not in the total), then the totals."""
    names: list[str] = []
    for lines in by_mode.values():
        for line in lines:
            base = line.name.removesuffix(", this process's shard (CPU RAM)")
            if base not in names:
                names.append(base)

    def cell(lines: list[LedgerLine], name: str) -> str:
        for line in lines:
            if line.name.removesuffix(", this process's shard (CPU RAM)") == name:
                return f"{line.gib:.2f}" if line.scope == "gpu" else f"({line.gib:.2f})"
        return "-"

    width = max(len(n) for n in names + ["total"])
    modes = list(by_mode)
    rows = [f"per GPU at {processes} processes".ljust(width) + "".join(f"  {m:>9}" for m in modes)]
    rows += [name.ljust(width) + "".join(f"  {cell(by_mode[m], name):>9}" for m in modes) for name in names]
    rows.append("total".ljust(width) + "".join(f"  {ledger_total(by_mode[m]):>9.2f}" for m in modes))
    return "\n".join(rows)


def ledger_json(cfg: Any, lines: list[LedgerLine], processes: int = 1, compare: Optional[dict] = None) -> dict:
    """`dmad ledger --json` (docs/memory.md). total_gib: the GPU lines; a line with "scope": "cpu"
    is host RAM (teacher_cpu_offload, fsdp_cpu_offload). `compare`: {"ddp": lines, "fsdp": lines}
    at `processes`, each as its own document under "by_distributed"."""
    doc = _ledger_document(cfg, lines, processes)
    if compare:
        doc["by_distributed"] = {m: _ledger_document(cfg, ls, processes, m) for m, ls in compare.items()}
    return doc


def _ledger_document(cfg: Any, lines: list[LedgerLine], processes: int, distributed: Optional[str] = None) -> dict:
    r, ident = cfg.resources, cfg.identity
    return ledger_document(lines, {
        "device": getattr(lines, "device", "cuda"),  # "cpu": a CPU run (no CUDA context in the margin)
        "processes": processes, "distributed": distributed or getattr(r, "distributed", "ddp"),
        "fsdp_shard_teacher": getattr(r, "fsdp_shard_teacher", False),
        "fsdp_cpu_offload": getattr(r, "fsdp_cpu_offload", False),
        "train_batch_size": r.train_batch_size, "resolution": r.resolution,
        "mixed_precision": r.mixed_precision, "gradient_checkpointing": r.gradient_checkpointing,
        "teacher_precision": r.teacher_precision, "teacher_cpu_offload": r.teacher_cpu_offload,
        "share_frozen_base": r.share_frozen_base, "method": cfg.distillation.method,
        "student": ident.student, "fake_score": ident.fake_score, "lora_rank": ident.lora_rank,
        "lora_targets": getattr(ident, "lora_targets", "attention"),
        "optimizer": cfg.optimization.optimizer, "model_family": ident.model_family})
