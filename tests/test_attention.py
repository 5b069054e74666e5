"""seqdiff.backbones.attention: the explicit form equals SDPA (values and gradients, every mask kind), and the
backbones take it exactly where it is meant to run (bf16 on CPU, short self-attention)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from seqdiff.backbones import attention as attn_module
from seqdiff.backbones.attention import EXPLICIT_MAX_LEN, attention, explicit_attention, uses_explicit
from seqdiff.backbones.dit import DiT
from seqdiff.config import ModelConfig

B, H, L, D = 2, 3, 7, 8


def qkv(dtype=torch.float64, L_q=L, L_k=L, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, L_q, D, generator=g, dtype=torch.float64)
    k, v = (torch.randn(B, H, L_k, D, generator=g, dtype=torch.float64) for _ in range(2))
    return [t.to(dtype).requires_grad_() for t in (q, k, v)]


def masks():
    g = torch.Generator().manual_seed(1)
    pairs = torch.rand(B, 1, L, L, generator=g) < 0.6
    pairs |= torch.eye(L, dtype=torch.bool)  # every query sees itself, as the backbones guarantee
    keys = torch.ones(B, 1, 1, L, dtype=torch.bool)
    keys[1, ..., -3:] = False  # the second row ends in 3 padding keys
    additive = torch.randn(B, 1, L, L, generator=g, dtype=torch.float64)
    return {"none": (None, False), "causal": (None, True), "pairs": (pairs, False), "padding keys": (keys, False),
            "additive": (additive, False)}


@pytest.mark.parametrize("case", list(masks()))
def test_explicit_attention_equals_sdpa_with_its_gradients(case):
    """float64, SDPA's math kernel as the reference: the same values and the same q, k, v gradients."""
    mask, causal = masks()[case]
    ours, ref = qkv(), qkv()
    out = explicit_attention(*ours, attn_mask=mask, is_causal=causal)
    with sdpa_kernel(SDPBackend.MATH):
        expected = F.scaled_dot_product_attention(*ref, attn_mask=mask, is_causal=causal)
    torch.testing.assert_close(out, expected, atol=1e-12, rtol=1e-10)
    weights = torch.randn_like(out)
    (out * weights).sum().backward()
    (expected * weights).sum().backward()
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a.grad, b.grad, atol=1e-12, rtol=1e-10)


def test_a_mask_and_is_causal_together_are_refused_as_sdpa_refuses_them():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="cannot be combined"):
        explicit_attention(q, k, v, attn_mask=torch.ones(L, L, dtype=torch.bool), is_causal=True)


def test_a_query_that_sees_no_key_gets_zeros_not_nan():
    mask = torch.ones(B, 1, L, L, dtype=torch.bool)
    mask[0, 0, 2] = False  # query 2 of row 0 sees nothing
    out = explicit_attention(*qkv(), attn_mask=mask)
    assert torch.isfinite(out).all()
    assert (out[0, :, 2] == 0).all()
    assert (out[0, :, 3] != 0).any()


def test_bf16_on_cpu_takes_the_explicit_form_and_stays_close_to_sdpa():
    q, k, v = qkv(torch.bfloat16, L_q=EXPLICIT_MAX_LEN, L_k=EXPLICIT_MAX_LEN)
    assert uses_explicit(q, k)
    out = attention(q, k, v, is_causal=True)
    expected = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), expected, atol=3e-2, rtol=3e-2)


@pytest.mark.parametrize(("dtype", "L_q", "L_k", "expected"), [
    (torch.bfloat16, EXPLICIT_MAX_LEN, EXPLICIT_MAX_LEN, True),
    (torch.float16, 16, 16, True),
    (torch.float32, 16, 16, False),  # float32: the fused CPU kernel is faster at every length measured
    (torch.bfloat16, EXPLICIT_MAX_LEN + 1, EXPLICIT_MAX_LEN + 1, False),  # long: the fused kernel wins
    (torch.bfloat16, 1, 16, False),  # a decoding step against a KV cache
])
def test_where_the_explicit_form_runs(dtype, L_q, L_k, expected):
    q, k, _ = qkv(dtype, L_q=L_q, L_k=L_k)
    assert uses_explicit(q, k) is expected


def test_dropout_goes_to_sdpa(monkeypatch):
    monkeypatch.setattr(attn_module, "explicit_attention", lambda *a, **k: pytest.fail("explicit with dropout"))
    q, k, v = qkv(torch.bfloat16)
    attention(q, k, v, dropout_p=0.1)


@pytest.mark.parametrize("causal", [False, True])
def test_a_dit_under_bf16_autocast_gives_what_sdpa_gives(monkeypatch, causal):
    """The whole backbone, padding mask included: the explicit form against SDPA (EXPLICIT_MAX_LEN = 0)."""
    torch.manual_seed(0)
    model = DiT(ModelConfig(hidden_size=32, n_heads=4, n_layers=2, max_seq_len=32, time_conditioning=False),
                12, causal).eval()
    ids = torch.randint(0, 10, (3, 24))
    keep = torch.ones(3, 24, dtype=torch.bool)
    keep[2, -5:] = False
    calls = []
    monkeypatch.setattr(attn_module, "explicit_attention",
                        lambda *a, **k: calls.append(1) or explicit_attention(*a, **k))
    with torch.no_grad(), torch.autocast("cpu", torch.bfloat16):
        fast = model(ids, None, keep)
        assert len(calls) == 2  # one per layer
        monkeypatch.setattr(attn_module, "EXPLICIT_MAX_LEN", 0)
        fused = model(ids, None, keep)
        assert len(calls) == 2
    torch.testing.assert_close(fast[keep], fused[keep], atol=5e-2, rtol=5e-2)
