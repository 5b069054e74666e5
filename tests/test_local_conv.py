"""model.local_conv: the depthwise convolution of seqdiff.backbones.local_conv against a brute-force sum, its
causality, and the combinations it refuses. Padding, packing and KV-cache parity run in tests/test_backbone.py
and tests/test_packing.py (parametrized over local_conv)."""

from __future__ import annotations

import pytest
import torch

from seqdiff.backbones import build_backbone
from seqdiff.backbones.local_conv import LocalConv
from seqdiff.config import ConfigError, MethodConfig, ModelConfig, from_dict
from seqdiff.methods import build_method
from seqdiff.tokenizers import CharTokenizer


def brute_force(conv: LocalConv, x: torch.Tensor, keep=None, segment_ids=None) -> torch.Tensor:
    """x + sum_j w[:, j] x[i + j - left], over neighbours that exist, are kept and share the segment."""
    B, L, H = x.shape
    out = x.clone()
    for b in range(B):
        for i in range(L):
            for j in range(conv.kernel_size):
                n = i + j - conv.left
                if not 0 <= n < L or (keep is not None and not keep[b, n]):
                    continue
                if segment_ids is not None and segment_ids[b, n] != segment_ids[b, i]:
                    continue
                out[b, i] += conv.weight[:, j] * x[b, n]
    return out


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("kernel_size", [3, 5])
def test_local_conv_is_the_brute_force_sum(causal, kernel_size):
    torch.manual_seed(0)
    conv = LocalConv(6, kernel_size, causal).double()
    x = torch.randn(2, 9, 6, dtype=torch.float64)
    keep = torch.ones(2, 9, dtype=torch.bool)
    keep[1, :2] = False  # left padding
    keep[0, 7:] = False  # right padding
    segments = torch.tensor([[0, 0, 0, 1, 1, 2, 2, 2, 2], [0, 0, 1, 1, 1, 1, 1, 1, 3]])
    with torch.no_grad():
        torch.testing.assert_close(conv(x), brute_force(conv, x))
        torch.testing.assert_close(conv(x, keep), brute_force(conv, x, keep))
        torch.testing.assert_close(conv(x, keep, segments), brute_force(conv, x, keep, segments))
        # the tap-by-tap form with one segment is the convolution
        torch.testing.assert_close(conv(x, keep, torch.zeros_like(segments)), conv(x, keep))


def test_local_conv_cached_steps_equal_the_full_causal_pass():
    torch.manual_seed(1)
    conv = LocalConv(4, 5, causal=True).double()
    x = torch.randn(2, 8, 4, dtype=torch.float64)
    history = torch.zeros(2, 8, 4, dtype=torch.float64)
    with torch.no_grad():
        pieces = [conv.forward_cached(x[:, a:b], history, a) for a, b in [(0, 2), (2, 3), (3, 7), (7, 8)]]
        torch.testing.assert_close(torch.cat(pieces, 1), conv(x))
    with pytest.raises(ValueError, match="causal"):
        LocalConv(4, 3, causal=False).forward_cached(x, history, 0)


def _dit(causal: bool, local_conv: int, seed: int = 0, local_conv_mlp: bool = False):
    torch.manual_seed(seed)
    cfg = from_dict(ModelConfig, {"preset": "test", "max_seq_len": 32, "local_conv": local_conv,
                                  "local_conv_mlp": local_conv_mlp})
    return build_backbone(cfg, vocab_size=11, causal=causal).double().eval()


@pytest.mark.parametrize("local_conv_mlp", [False, True])
def test_a_causal_dit_with_local_conv_never_reads_a_later_token(local_conv_mlp):
    model = _dit(causal=True, local_conv=5, local_conv_mlp=local_conv_mlp)
    x = torch.randint(0, 11, (1, 12), generator=torch.Generator().manual_seed(0))
    y = x.clone()
    y[0, 6] = (x[0, 6] + 1) % 11
    with torch.no_grad():
        a, b = model(x), model(y)
    torch.testing.assert_close(a[:, :6], b[:, :6])
    assert (a[:, 6:] - b[:, 6:]).abs().max() > 1e-6  # and the change does reach the later positions


def test_local_conv_adds_k_times_width_weights_per_layer_and_trains():
    plain, conv = _dit(False, 0), _dit(False, 5)
    cfg = conv.config
    assert conv.num_parameters() - plain.num_parameters() == cfg.n_layers * 5 * cfg.hidden_size
    assert conv.flops_per_token(16) - plain.flops_per_token(16) == 6 * cfg.n_layers * 5 * cfg.hidden_size
    x = torch.randint(0, 11, (2, 10))
    conv.train()
    conv(x).logsumexp(-1).sum().backward()
    assert all(block.local_conv.weight.grad.abs().sum() > 0 for block in conv.blocks)
    both = _dit(False, 5, local_conv_mlp=True)
    assert both.num_parameters() - plain.num_parameters() == 2 * cfg.n_layers * 5 * cfg.hidden_size
    both.train()
    both(x).logsumexp(-1).sum().backward()
    assert all(block.local_conv_mlp.weight.grad.abs().sum() > 0 for block in both.blocks)


def test_the_mlp_convolution_is_a_residual_branch_of_the_mlp_input():
    """A zero MLP kernel gives back the model without one (the same other weights), a nonzero one changes it."""
    plain, both = _dit(False, 3), _dit(False, 3, local_conv_mlp=True)
    missing, unexpected = both.load_state_dict(plain.state_dict(), strict=False)
    assert missing and all("local_conv_mlp" in key for key in missing) and not unexpected
    x = torch.randint(0, 11, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        for block in both.blocks:
            block.local_conv_mlp.weight.zero_()
        torch.testing.assert_close(both(x), plain(x))
        both.blocks[-1].local_conv_mlp.weight.normal_()
        assert (both(x) - plain(x)).abs().max() > 1e-3


def test_local_conv_mlp_needs_a_kernel():
    with pytest.raises(ConfigError, match="local_conv_mlp"):
        ModelConfig(local_conv_mlp=True)


@pytest.mark.parametrize("value", [1, 2, 4, -3])
def test_local_conv_refuses_an_even_or_too_small_kernel(value):
    with pytest.raises(ConfigError, match=f"model.local_conv={value}"):
        ModelConfig(local_conv=value)


def test_local_conv_refuses_other_backbones_and_block_causal_attention():
    with pytest.raises(ConfigError, match="DiT option"):
        ModelConfig(backbone="bert", local_conv=3)
    model = _dit(False, 3)
    x = torch.randint(0, 11, (1, 8))
    with pytest.raises(ValueError, match="local_conv"):
        model(x, attn_mask=torch.ones(8, 8, dtype=torch.bool))
    with pytest.raises(ValueError, match="local_conv"):
        model(x, kv_cache=model.new_kv_cache(1, 16, blockwise=True))
    tokenizer = CharTokenizer()
    bd3lm = build_method(MethodConfig(name="bd3lm", block_size=4), tokenizer)
    with pytest.raises(ConfigError, match="local_conv"):
        bd3lm.check_backbone(model)
