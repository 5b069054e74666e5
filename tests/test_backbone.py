"""DiT backbone: shapes, causality, KV cache parity, padding masks, adaLN, rotary, errors, gradients."""

from __future__ import annotations

import pytest
import torch

from seqdiff.backbones import BACKBONES, DiT, build_backbone
from seqdiff.backbones.rotary import RotaryEmbedding, _rotate_complex, _rotate_real, apply_rotary
from seqdiff.config import ConfigError, ModelConfig, from_dict

VOCAB = 13


CONVS = {k: [{}, {"local_conv": k}, {"local_conv": k, "local_conv_mlp": True}, {"kmer_sizes": [2, k]}]
         for k in (3, 5)}
"""Local-structure settings the attention-structure tests run under: none, model.local_conv before attention,
before both, and k-mer embeddings (13 ids: the 2-mers get exact rows, the 5-mers hashed ones)."""


def make_model(causal: bool, seed: int = 0, **overrides) -> DiT:
    torch.manual_seed(seed)
    cfg = from_dict(ModelConfig, {"preset": "test", "max_seq_len": 64, **overrides})
    model = build_backbone(cfg, vocab_size=VOCAB, causal=causal)
    if model.kmer_embed is not None:  # its projection starts at zero: give it weights, or the k-mers do nothing
        with torch.no_grad():
            model.kmer_embed.proj.weight.normal_(0.0, 0.5, generator=torch.Generator().manual_seed(seed + 7))
    return model.eval()


def randomize_modulation(model: DiT, seed: int = 1) -> None:
    """Replace the zero-initialized adaLN Linears with random weights so conditioning has an effect."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "modulation" in name:
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))


def tokens(B: int, L: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, VOCAB, (B, L), generator=torch.Generator().manual_seed(seed))


# 1. shapes --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("causal", [True, False])
def test_output_shapes(causal):
    model = make_model(causal)
    x = tokens(3, 10)
    logits = model(x)
    assert logits.shape == (3, 10, VOCAB)
    assert logits.dtype == torch.float32
    h = model.hidden_states(x)
    assert h.shape == (3, 10, model.config.hidden_size)
    assert model.vocab_size == VOCAB and model.causal is causal
    assert isinstance(model.config, ModelConfig)
    torch.testing.assert_close(model.output(h).float(), logits)


def test_parameter_count_and_flops():
    model = make_model(False)
    cfg = model.config
    H, nl, V = cfg.hidden_size, cfg.n_layers, VOCAB
    per_block = (H * 3 * H + 3 * H) + (H * H + H) + (H * 4 * H + 4 * H) + (4 * H * H + H) + 2 * 2 * H
    expected = V * H + nl * per_block + 2 * H + (H * V + V)
    assert model.num_parameters() == expected
    assert model.num_parameters(exclude_embedding=True) == expected - V * H
    assert model.flops_per_token(50) == 6 * (expected - V * H) + 12 * nl * H * 50
    # Per-sequence conditioning parameters do not count as per-token FLOPs.
    cond = make_model(False, time_conditioning=True)
    affine = (2 * nl + 1) * 2 * H  # LayerNorm affine parameters, absent when adaLN modulates the norms
    assert cond.flops_per_token(50) == model.flops_per_token(50) - 6 * affine


# 2. causality -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("conv", CONVS[5])
def test_causal_model_does_not_look_ahead(conv):
    model = make_model(causal=True, **conv)
    x = tokens(2, 12)
    j = 7
    y = x.clone()
    y[:, j] = (y[:, j] + 1) % VOCAB
    a, b = model(x), model(y)
    torch.testing.assert_close(a[:, :j], b[:, :j])
    assert (a[:, j:] - b[:, j:]).abs().amax() > 1e-4


def test_bidirectional_model_looks_ahead():
    model = make_model(causal=False)
    x = tokens(2, 12)
    j = 7
    y = x.clone()
    y[:, j] = (y[:, j] + 1) % VOCAB
    a, b = model(x), model(y)
    assert (a[:, :j] - b[:, :j]).abs().amax(dim=-1).min() > 1e-6  # every earlier position changes


# 3. KV cache ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("conv", CONVS[5])
@pytest.mark.parametrize("batch", [1, 3])
def test_kv_cache_matches_full_forward(batch, conv):
    model = make_model(causal=True, **conv)
    L, prefix = 16, 5
    x = tokens(batch, L, seed=batch)
    with torch.no_grad():
        full = model(x)
        cache = model.new_kv_cache(batch, max_len=L)
        pieces = [model(x[:, :prefix], kv_cache=cache)]
        assert cache.length == prefix
        for i in range(prefix, L):
            pieces.append(model(x[:, i : i + 1], kv_cache=cache))
    assert cache.length == L
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("conv", CONVS[3])
def test_kv_cache_multi_token_chunks_and_reset(conv):
    model = make_model(causal=True, **conv)
    x = tokens(2, 11)
    with torch.no_grad():
        full = model(x)
        cache = model.new_kv_cache(2, max_len=20)
        chunks = [model(x[:, a:b], kv_cache=cache) for a, b in [(0, 3), (3, 7), (7, 8), (8, 11)]]
        torch.testing.assert_close(torch.cat(chunks, dim=1), full, atol=1e-5, rtol=1e-5)
        cache.reset()
        torch.testing.assert_close(model(x, kv_cache=cache), full, atol=1e-5, rtol=1e-5)


def test_kv_cache_with_time_conditioning():
    model = make_model(causal=True, time_conditioning=True)
    randomize_modulation(model)
    x, t = tokens(2, 9), torch.tensor([0.3, 2.0])
    with torch.no_grad():
        full = model(x, t)
        cache = model.new_kv_cache(2, max_len=9)
        pieces = [model(x[:, :4], t, kv_cache=cache)] + [model(x[:, i : i + 1], t, kv_cache=cache) for i in range(4, 9)]
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, atol=1e-5, rtol=1e-5)


# 4. attention (padding) mask --------------------------------------------------------------------------


@pytest.mark.parametrize("conv", CONVS[3])
def test_padding_mask_bidirectional(conv):
    model = make_model(causal=False, **conv)
    n_real, L = 6, 10
    x = tokens(1, n_real)
    alone = model(x)
    padded_a = torch.cat([x, tokens(1, L - n_real, seed=1)], dim=1)
    padded_b = torch.cat([x, tokens(1, L - n_real, seed=2)], dim=1)
    mask = torch.arange(L)[None] < n_real
    a = model(padded_a, attention_mask=mask)
    b = model(padded_b, attention_mask=mask)
    torch.testing.assert_close(a[:, :n_real], b[:, :n_real])
    torch.testing.assert_close(a[:, :n_real], alone, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(model(padded_a, attention_mask=mask.long()), a)  # 0 / 1 masks work too
    # Without the mask the padding content leaks into real positions.
    assert (model(padded_a)[:, :n_real] - alone).abs().amax() > 1e-4
    # A fully padded row produces finite values rather than NaN.
    assert torch.isfinite(model(padded_a, attention_mask=torch.zeros_like(mask))).all()


@pytest.mark.parametrize("conv", CONVS[5])
def test_padding_mask_causal_left_padding_and_cache(conv):
    """Rotary makes left padding harmless: real positions match the unpadded sequence, with or without a cache."""
    model = make_model(causal=True, **conv)
    n_pad, n_real = 3, 7
    x = tokens(1, n_real)
    alone = model(x)
    padded = torch.cat([tokens(1, n_pad, seed=5), x], dim=1)
    mask = torch.arange(n_pad + n_real)[None] >= n_pad
    out = model(padded, attention_mask=mask)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out[:, n_pad:], alone, atol=1e-5, rtol=1e-5)
    with torch.no_grad():
        cache = model.new_kv_cache(1, max_len=n_pad + n_real)
        first = model(padded[:, : n_pad + 2], attention_mask=mask[:, : n_pad + 2], kv_cache=cache)
        rest = [model(padded[:, i : i + 1], kv_cache=cache) for i in range(n_pad + 2, n_pad + n_real)]
    torch.testing.assert_close(torch.cat([first] + rest, dim=1)[:, n_pad:], alone, atol=1e-5, rtol=1e-5)


# 5. time conditioning ---------------------------------------------------------------------------------


def test_time_conditioning_changes_logits():
    model = make_model(causal=False, time_conditioning=True)
    x = tokens(2, 8)
    t1, t2 = torch.tensor([0.1, 0.1]), torch.tensor([3.0, 3.0])
    # adaLN-Zero: at initialization every block is the identity, so the noise level has no effect.
    torch.testing.assert_close(model(x, t1), model(x, t2))
    H = model.config.hidden_size
    expected = torch.nn.functional.layer_norm(model.embed(x), (H,))
    torch.testing.assert_close(model.hidden_states(x, t1), expected)
    randomize_modulation(model)
    assert (model(x, t1) - model(x, t2)).abs().amax() > 1e-4
    # A scalar noise level broadcasts over the batch.
    torch.testing.assert_close(model(x, torch.tensor(3.0)), model(x, t2))
    with pytest.raises(ValueError, match="noise_level"):
        model(x)


def test_without_time_conditioning_noise_is_ignored():
    model = make_model(causal=False, time_conditioning=False)
    cond = make_model(causal=False, time_conditioning=True)
    names = [n for n, _ in model.named_parameters()]
    assert not any("modulation" in n or "time_embed" in n for n in names)
    assert any("modulation" in n for n, _ in cond.named_parameters())
    assert any("time_embed" in n for n, _ in cond.named_parameters())
    x = tokens(2, 8)
    torch.testing.assert_close(model(x), model(x, torch.tensor([0.1, 5.0])))


# 6. rotary --------------------------------------------------------------------------------------------


def test_rotary_scores_depend_only_on_relative_position():
    D = 16
    rope = RotaryEmbedding(D, max_seq_len=64)
    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(D, generator=gen), torch.randn(D, generator=gen)

    def rotated(v, pos):  # v at position `pos`, shape (D,)
        return apply_rotary(v.view(1, 1, D), rope(1, offset=pos)).view(D)

    def score(m, n):
        return torch.dot(rotated(q, m), rotated(k, n))

    for delta in (0, 3, -5, 17):
        ref = score(20 + delta, 20)
        for n in (5, 7, 30):
            torch.testing.assert_close(score(n + delta, n), ref, atol=1e-5, rtol=1e-5)
    # ... but it does depend on the offset, and rotation keeps norms.
    assert abs(score(10, 0) - score(3, 0)) > 1e-3
    torch.testing.assert_close(rotated(q, 13).norm(), q.norm())
    # A batched table with an offset equals the rows of the full table.
    x = torch.randn(2, 5, 3, D, generator=gen)
    torch.testing.assert_close(apply_rotary(x, rope(5, offset=4)), apply_rotary(x, rope(9)[4:]))
    # A strided input (a slice of a fused projection) gives the same result as a contiguous copy.
    fused = torch.randn(2, 5, 3, D, generator=gen)
    torch.testing.assert_close(apply_rotary(fused[:, :, 1], rope(5)), apply_rotary(fused[:, :, 1].clone(), rope(5)))


def test_rotary_complex_and_real_forms_agree():
    """The eager (complex multiply) and compiled (real arithmetic) code paths compute the same rotation."""
    rope = RotaryEmbedding(16, max_seq_len=32)
    pairs = torch.randn(2, 7, 3, 8, 2, generator=torch.Generator().manual_seed(0))
    rotations = rope(7).view(7, 1, 8, 2)
    torch.testing.assert_close(_rotate_complex(pairs, rotations), _rotate_real(pairs, rotations))


def test_rotary_tables_stay_float32():
    rope = RotaryEmbedding(8, max_seq_len=32).to(torch.bfloat16)
    assert rope.table.dtype == torch.float32
    torch.testing.assert_close(rope(32).square().sum(-1), torch.ones(32, 4))  # cos^2 + sin^2 = 1
    x = torch.randn(1, 4, 8, dtype=torch.bfloat16)
    assert apply_rotary(x, rope(4)).dtype == torch.bfloat16


# 7. errors --------------------------------------------------------------------------------------------


def test_too_long_sequence_raises():
    model = make_model(causal=False)
    with pytest.raises(ValueError, match="max_seq_len"):
        model(tokens(1, 65))


def test_kv_cache_errors():
    with pytest.raises(ValueError, match="causal"):
        make_model(causal=False).new_kv_cache(1, 8)
    model = make_model(causal=True)
    with pytest.raises(ValueError, match="max_seq_len"):
        model.new_kv_cache(1, 65)
    cache = model.new_kv_cache(1, 8)
    model(tokens(1, 6), kv_cache=cache)
    with pytest.raises(ValueError, match="overflow"):
        model(tokens(1, 3), kv_cache=cache)
    assert cache.length == 6  # a refused call leaves the cache untouched
    with pytest.raises(ValueError, match="batch"):
        model(tokens(2, 1), kv_cache=cache)


def test_unknown_backbone_raises_config_error():
    cfg = from_dict(ModelConfig, {"preset": "test", "backbone": "mamba9"})
    with pytest.raises(ConfigError, match="model.backbone") as err:
        build_backbone(cfg, vocab_size=VOCAB, causal=False)
    for key in BACKBONES:
        assert repr(key) in str(err.value)


# 8. gradients -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("time_conditioning", [False, True])
@pytest.mark.parametrize("causal", [False, True])
def test_gradients_reach_every_parameter(time_conditioning, causal):
    model = make_model(causal=causal, time_conditioning=time_conditioning).train()
    if time_conditioning:
        randomize_modulation(model)  # otherwise the zero gates block the gradient of attention / MLP
    x = tokens(2, 8)
    t = torch.tensor([0.5, 1.5]) if time_conditioning else None
    loss = torch.nn.functional.cross_entropy(model(x, t).flatten(0, 1), tokens(2, 8, seed=9).flatten())
    loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None, f"{name} received no gradient"
        assert p.grad.abs().sum() > 0, f"{name} has an all-zero gradient"


# intermediate layers (probes) -------------------------------------------------------------------------


@pytest.mark.parametrize("causal", [True, False])
def test_hidden_states_layer_is_the_residual_stream_after_that_many_blocks(causal):
    model = make_model(causal, time_conditioning=True)
    randomize_modulation(model)
    ids, noise = tokens(2, 9), torch.tensor([0.2, 0.7])
    c = model._condition(noise, 2)
    rotations = model.rotary(9)
    with torch.no_grad():
        x = model.embed(ids)
        expected = [x]
        for block in model.blocks:  # run the blocks by hand, one at a time
            x = block(x, c, rotations, None, causal)
            expected.append(x)
        for k, want in enumerate(expected):
            torch.testing.assert_close(model.hidden_states(ids, noise, layer=k), want)
        # the default (layer=None) is still the final-normed output the logits come from
        final = model.hidden_states(ids, noise)
        torch.testing.assert_close(model.output(final).float(), model(ids, noise))
        assert not torch.allclose(final, expected[-1])


def test_hidden_states_layer_out_of_range_raises():
    model = make_model(False)
    with pytest.raises(ValueError, match=r"layer must be in \[0, 2\]"):
        model.hidden_states(tokens(1, 4), layer=3)


@pytest.mark.parametrize("time_conditioning", [False, True])
def test_head_parameters_are_what_acts_after_the_last_block(time_conditioning):
    cfg = from_dict(ModelConfig, {"preset": "test", "max_seq_len": 16, "time_conditioning": time_conditioning})
    model = build_backbone(cfg, 11, causal=False)
    names = {id(p): n for n, p in model.named_parameters()}
    head = sorted(names[id(p)] for p in model.head_parameters())
    expected = ["final_modulation.bias", "final_modulation.weight"] if time_conditioning else \
        ["norm_final.bias", "norm_final.weight"]
    assert head == sorted(expected + ["output.bias", "output.weight"])
