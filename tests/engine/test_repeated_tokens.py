"""SD3 without T5: its 256 zero tokens computed as one token that stands for 256 (exact)."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")


def _transformer(layers: int = 2):
    from diffusers import SD3Transformer2DModel

    torch.manual_seed(0)
    net = SD3Transformer2DModel(sample_size=8, patch_size=2, in_channels=4, out_channels=4, num_layers=layers,
                                attention_head_dim=16, num_attention_heads=2, joint_attention_dim=32,
                                caption_projection_dim=32, pooled_projection_dim=16, pos_embed_max_size=8)
    for p in net.parameters():  # diffusers zero-initialises the output layers: make every path count
        p.data.normal_(0, 0.1)
    return net.eval()


def _inputs(n_zero: int):
    g = torch.Generator().manual_seed(1)
    clip = torch.randn((2, 5, 32), generator=g)
    return (torch.randn((2, 4, 8, 8), generator=g), torch.cat([clip, torch.zeros((2, n_zero, 32))], 1),
            torch.randn((2, 16), generator=g), torch.tensor([999.0, 250.0]))


@torch.no_grad()
def test_one_token_standing_for_n_zero_tokens_gives_the_full_sequence_output():
    from dmad.models.repeated_tokens import collapse_zero_tokens, install, trailing_zero_tokens

    net = _transformer()
    x, ctx, pooled, t = _inputs(256)
    full = net(hidden_states=x, encoder_hidden_states=ctx, pooled_projections=pooled, timestep=t).sample
    install(net)
    plain_after_install = net(hidden_states=x, encoder_hidden_states=ctx, pooled_projections=pooled, timestep=t).sample
    assert trailing_zero_tokens(ctx, 256) and not trailing_zero_tokens(ctx, 257)
    short = collapse_zero_tokens(ctx, 256)
    assert short.shape == (2, 6, 32)
    fast = net(hidden_states=x, encoder_hidden_states=short, pooled_projections=pooled, timestep=t,
               joint_attention_kwargs={"repeated_last": 256}).sample
    assert torch.equal(plain_after_install, full)  # without the argument: diffusers' own attention
    assert (fast - full).abs().max() < 1e-5 * full.abs().max()
    wrong = net(hidden_states=x, encoder_hidden_states=short, pooled_projections=pooled, timestep=t).sample
    assert (wrong - full).abs().max() > 1e-3  # the log n weight is what makes it exact


def test_a_context_without_trailing_zeros_is_not_collapsed():
    from dmad.models.repeated_tokens import trailing_zero_tokens

    _, ctx, _, _ = _inputs(256)
    ctx[:, -1, 0] = 1e-9
    assert not trailing_zero_tokens(ctx, 256)


@torch.no_grad()
def test_the_sd3_family_call_collapses_and_matches_the_full_context():
    from dmad.methods.prediction import FlowSchedule
    from dmad.models.families import Cond, make_family

    net = _transformer()
    x, ctx, pooled, _ = _inputs(256)
    family = make_family("sd3", vae_factor=8)
    schedule = FlowSchedule(1000, 1.0)
    t = torch.tensor([999, 250])
    fast = family.predict(net, x, t, Cond(emb=ctx, pooled=pooled), schedule)
    ts = schedule.sigma_of(t) * 1000
    full = _transformer()(hidden_states=x, encoder_hidden_states=ctx, pooled_projections=pooled, timestep=ts).sample
    assert (fast - full).abs().max() < 1e-5 * full.abs().max()
