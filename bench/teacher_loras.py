"""identity.teacher_loras: fused into the teacher, or kept as frozen adapters? Measured on the demo teacher.

Both give base + LoRA. This measures what each costs and how exact each is:
- exactness: the denoiser's output against the float32 adapter reference (diffusers' load_lora_weights
  + set_adapters, unfused), for the engine's way (fused in float32, then cast) and for adapters kept in
  the compute precision, in float32 and bfloat16;
- memory: the parameters each adds to the frozen teacher;
- time: one denoiser forward (batch 8 at the demo's 64 px), median of --rounds (CPU: a GPU's
  relative cost of the adapter matmuls differs).

    python bench/teacher_loras.py [--rank 16] [--rounds 21] [--json OUT]

Nothing is downloaded: the LoRA is a random one for the demo teacher (dmad.testing.tiny.make_tiny_lora,
its up matrices ~N(0, 0.02)), on every attention projection of the transformer and of the first text encoder.
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _inputs(den, batch: int, side: int, g: torch.Generator) -> dict:
    c = den.config
    return {"hidden_states": torch.randn(batch, c.in_channels, side, side, generator=g),
            "encoder_hidden_states": torch.randn(batch, 16, c.joint_attention_dim, generator=g),
            "pooled_projections": torch.randn(batch, c.pooled_projection_dim, generator=g),
            "timestep": torch.full((batch,), 500.0)}


def _forward(den, x: dict, dtype: torch.dtype) -> torch.Tensor:
    with torch.no_grad():
        return den(**{k: v.to(dtype) for k, v in x.items()}).sample.float()


def _timed(den, x: dict, dtype: torch.dtype, rounds: int) -> float:
    _forward(den, x, dtype)
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        _forward(den, x, dtype)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=21)
    ap.add_argument("--json", metavar="OUT")
    a = ap.parse_args()

    import diffusers

    from dmad.contract.paths import resource
    from dmad.models.teacher import load_teacher
    from dmad.testing.tiny import make_tiny_lora

    teacher_dir = resource("demo", "teacher")
    torch.set_num_threads(max(1, torch.get_num_threads()))
    with tempfile.TemporaryDirectory() as tmp:
        lora = make_tiny_lora(teacher_dir, Path(tmp) / "lora", "diffusers", rank=a.rank, seed=0, strength=0.02)
        entry = SimpleNamespace(path=str(lora), scale=1.0)
        side = 64 // 8
        x = _inputs(load_teacher(str(teacher_dir)).transformer, 8, side, torch.Generator().manual_seed(0))

        def adapters(dtype: torch.dtype):
            pipe = diffusers.StableDiffusion3Pipeline.from_pretrained(str(teacher_dir), text_encoder_3=None,
                                                                      tokenizer_3=None)
            pipe.load_lora_weights(str(lora), adapter_name="user")
            pipe.set_adapters(["user"], adapter_weights=[1.0])
            return pipe.transformer.to(dtype)

        reference = _forward(adapters(torch.float32), x, torch.float32)
        bare = load_teacher(str(teacher_dir)).transformer
        lora_effect = (_forward(bare, x, torch.float32) - reference).abs().mean().item()
        rows = []
        bare_ref = _forward(bare, x, torch.float32)
        bare16 = load_teacher(str(teacher_dir), dtype=torch.bfloat16).transformer
        out16 = _forward(bare16, x, torch.bfloat16)
        rows.append({"precision": "bf16", "how": "none (the bare teacher against itself in fp32: bf16's own error)",
                     "max_abs_err": (out16 - bare_ref).abs().max().item(),
                     "mean_abs_err": (out16 - bare_ref).abs().mean().item(), "extra_param_bytes": 0,
                     "forward_s": _timed(bare16, x, torch.bfloat16, a.rounds)})
        for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
            fused = load_teacher(str(teacher_dir), dtype=dtype, loras=(entry,)).transformer
            kept = adapters(dtype)
            for how, den in (("fused (the engine)", fused), ("adapters", kept)):
                out = _forward(den, x, dtype)
                extra = sum(p.numel() * p.element_size() for n, p in den.named_parameters() if "lora_" in n)
                rows.append({"precision": name, "how": how,
                             "max_abs_err": (out - reference).abs().max().item(),
                             "mean_abs_err": (out - reference).abs().mean().item(),
                             "extra_param_bytes": extra,
                             "forward_s": _timed(den, x, dtype, a.rounds)})
    doc = {"machine": f"{platform.processor() or platform.machine()}, torch {torch.__version__}, "
                      f"{torch.get_num_threads()} threads", "rank": a.rank,
           "lora_effect_mean_abs": lora_effect, "rows": rows}
    print(f"LoRA rank {a.rank} on the demo teacher; mean |base + LoRA - base| = {lora_effect:.2e} (what is applied)")
    print("| precision | LoRA as | max abs error | mean abs error | extra parameters | forward (batch 8, 64 px) |")
    print("|---|---|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['precision']} | {r['how']} | {r['max_abs_err']:.2e} | {r['mean_abs_err']:.2e} | "
              f"{r['extra_param_bytes'] / 2**20:.2f} MiB | {r['forward_s'] * 1000:.1f} ms |")
    if a.json:
        Path(a.json).write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
