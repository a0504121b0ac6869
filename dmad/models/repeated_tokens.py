"""SD3 without T5, computed without its 256 zero tokens: exact, and ~5x cheaper on small latents.

StableDiffusion3Pipeline without text_encoder_3 appends `max_sequence_length` (default 256) zero
tokens to the CLIP tokens. In an SD3 transformer every context token goes through the same
per-token layers (no position embedding on text), so those copies stay identical in every block;
the only place they meet other tokens is the joint attention, where n identical keys with
identical values weigh exactly like one key whose logit is raised by log n. So one zero token
standing for n, with log n added to its attention logit, gives the same image tokens as the full
sequence (measured: max difference 1e-6 on a random transformer; tests/engine/test_repeated_tokens.py).

Cost: with 64 image tokens (a 64 px demo image) the 256 zeros are ~80% of the transformer's work.
`collapse_for(transformer, emb, n)` gives the context and the joint_attention_kwargs of a call.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F


class RepeatedLastToken:
    """diffusers' JointAttnProcessor2_0, plus `repeated_last`: the context's last token stands for
    that many identical copies (1, the default: a plain joint attention, the same numbers as
    diffusers'). It arrives through the transformer's joint_attention_kwargs, so a pipeline that
    passes none runs exactly as without this processor."""

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, repeated_last: int = 1):
        b, n_img = hidden_states.shape[:2]

        def heads(x: torch.Tensor) -> torch.Tensor:  # (B, L, H*D) -> (B, H, L, D)
            return x.view(b, -1, attn.heads, x.shape[-1] // attn.heads).transpose(1, 2)

        q, k, v = heads(attn.to_q(hidden_states)), heads(attn.to_k(hidden_states)), heads(attn.to_v(hidden_states))
        if attn.norm_q is not None:
            q, k = attn.norm_q(q), attn.norm_k(k)
        bias = None
        if encoder_hidden_states is not None:
            cq = heads(attn.add_q_proj(encoder_hidden_states))
            ck = heads(attn.add_k_proj(encoder_hidden_states))
            cv = heads(attn.add_v_proj(encoder_hidden_states))
            if attn.norm_added_q is not None:
                cq, ck = attn.norm_added_q(cq), attn.norm_added_k(ck)
            q, k, v = torch.cat([q, cq], 2), torch.cat([k, ck], 2), torch.cat([v, cv], 2)
            if repeated_last > 1:  # n identical keys (and values) = one key with log n on its logit
                bias = torch.zeros((1, k.shape[2]), dtype=q.dtype, device=q.device)
                bias[0, -1] = math.log(repeated_last)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
        out = out.transpose(1, 2).reshape(b, -1, q.shape[1] * q.shape[-1]).to(q.dtype)
        if encoder_hidden_states is None:
            return attn.to_out[1](attn.to_out[0](out))
        h, c = out[:, :n_img], out[:, n_img:]
        if not attn.context_pre_only:
            c = attn.to_add_out(c)
        return attn.to_out[1](attn.to_out[0](h)), c


def install(transformer) -> None:
    """Give every attention of an SD3 transformer (or a wrapper of one) the processor, once."""
    if not getattr(transformer, "_dmad_repeated_last", False):
        transformer.set_attn_processor(RepeatedLastToken())
        transformer._dmad_repeated_last = True


def collapse_zero_tokens(prompt_embeds: torch.Tensor, zero_tokens: int) -> torch.Tensor:
    """(B, L + n, D) pipeline embeddings ending in n zero tokens -> (B, L + 1, D)."""
    if zero_tokens < 1 or prompt_embeds.shape[1] <= zero_tokens:
        raise ValueError(f"expected {zero_tokens} trailing zero tokens in a sequence of {prompt_embeds.shape[1]}")
    return prompt_embeds[:, : prompt_embeds.shape[1] - zero_tokens + 1]


def trailing_zero_tokens(prompt_embeds: torch.Tensor, n: int) -> bool:
    """True when the last n tokens of every row are exactly zero: SD3's stand-in for an absent T5
    (a real T5 never outputs an exact zero vector)."""
    return prompt_embeds.shape[1] > n and not bool(prompt_embeds[:, -n:].any())


def collapse_for(transformer, prompt_embeds: torch.Tensor, n: int) -> tuple[torch.Tensor, dict]:
    """(context, joint_attention_kwargs) for a call of `transformer`: the n trailing zero tokens as
    one (processor installed) when they are all exact zeros, else the context as it is and {}."""
    if not trailing_zero_tokens(prompt_embeds, n):
        return prompt_embeds, {}
    install(transformer)
    return collapse_zero_tokens(prompt_embeds, n), {"repeated_last": n}
