"""DiT.last_block_at_outputs: with output_index, the last block runs its output projection and MLP at the
selected positions only. Its attention still runs everywhere (keys and values need every position), so the
outputs and every gradient must equal the full forward's at those positions, under every structure the
backbone takes: padding, time conditioning, local convolutions (before the MLP too), causal attention, a KV
cache, packed documents and an explicit attention mask."""

import dataclasses

import pytest
import torch

from seqdiff.backbones.dit import DiT
from seqdiff.config import ModelConfig

V, B, L = 11, 3, 10
BASE = ModelConfig(hidden_size=16, n_layers=2, n_heads=2, max_seq_len=2 * L, cond_dim=8, time_conditioning=False)
INDEX = torch.tensor([0, 4, 9, 12, 13, 27, 29])  # flat b * L + i, rows 0, 1 and 2

CASES = {
    "plain": ({}, {}),
    "conditioned": ({"time_conditioning": True}, {}),
    "local_conv": ({"local_conv": 3}, {}),
    "local_conv_mlp": ({"local_conv": 3, "local_conv_mlp": True}, {}),
    "kmers": ({"kmer_sizes": [2, 3], "kmer_buckets": 64, "kmer_dim": 4, "local_conv": 3, "local_conv_mlp": True}, {}),
    "padding": ({"time_conditioning": True}, {"padding": True}),
    "causal": ({"local_conv": 3}, {"causal": True}),
    "packed": ({"local_conv": 3, "local_conv_mlp": True}, {"packed": True}),
    "attn_mask": ({}, {"attn_mask": True}),
    "one_layer": ({"n_layers": 1, "time_conditioning": True}, {}),
}


def _net(model_kw, causal):
    torch.manual_seed(0)
    net = DiT(dataclasses.replace(BASE, **model_kw), V, causal=causal)
    with torch.no_grad():  # adaLN-Zero starts at zero: give the modulations values so they are exercised
        for name, p in net.named_parameters():
            if "modulation" in name:
                p.normal_(0, 0.3)
    return net


def _inputs(opts):
    gen = torch.Generator().manual_seed(1)
    x = torch.randint(0, V, (B, L), generator=gen)
    kw = {"noise_level": torch.tensor([0.2, 1.0, 2.5])}
    if opts.get("padding"):
        mask = torch.ones(B, L, dtype=torch.bool)
        mask[1, 7:] = False
        kw["attention_mask"] = mask
    if opts.get("packed"):
        kw["segment_ids"] = torch.tensor([0] * 4 + [1] * 6).repeat(B, 1)
        kw["positions"] = torch.cat([torch.arange(4), torch.arange(6)]).repeat(B, 1)
    if opts.get("attn_mask"):
        kw["attn_mask"] = torch.rand(L, L, generator=gen) < 0.5
    return x, kw


def _outputs_and_grads(net, x, kw, index):
    net.zero_grad()
    if index is None:
        out = net(x, **kw).flatten(0, 1)[INDEX]  # the full forward, then the positions
    else:
        out = net(x, **kw, output_index=index)
    weights = torch.linspace(-1, 1, out.numel()).view_as(out)
    (out * weights).sum().backward()
    return out, {n: p.grad.clone() for n, p in net.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("case", list(CASES))
def test_selected_outputs_and_gradients_equal_the_full_forward(case):
    model_kw, opts = CASES[case]
    net = _net(model_kw, opts.get("causal", False))
    x, kw = _inputs(opts)
    full, grads_full = _outputs_and_grads(net, x, kw, None)
    sparse, grads_sparse = _outputs_and_grads(net, x, kw, INDEX)
    assert sparse.shape == (len(INDEX), V)
    torch.testing.assert_close(sparse, full, rtol=1e-5, atol=1e-6)
    assert grads_sparse.keys() == grads_full.keys()
    for name in grads_full:
        torch.testing.assert_close(grads_sparse[name], grads_full[name], rtol=1e-5, atol=1e-6, msg=name)
    net.last_block_at_outputs = False  # the switch selects after the final norm instead: the same numbers
    off, _ = _outputs_and_grads(net, x, kw, INDEX)
    torch.testing.assert_close(off, full, rtol=1e-5, atol=1e-6)


def test_the_last_block_really_runs_at_fewer_positions():
    """The MLP of the last block sees N rows, that of the first block every B * L (forward hooks)."""
    net = _net({}, False)
    rows = {}
    for i, block in enumerate(net.blocks):
        block.mlp.fc.register_forward_hook(lambda m, args, out, i=i: rows.__setitem__(i, args[0].shape[:-1].numel()))
    x, kw = _inputs({})
    net(x, **kw, output_index=INDEX)
    assert rows == {0: B * L, 1: len(INDEX)}


def test_a_kv_cache_is_filled_as_by_the_full_forward():
    """Prefill with output_index (the last position of each row, as a decoder asks) writes the cache the full
    prefill writes, and the next token's logits agree."""
    net = _net({"local_conv": 3, "local_conv_mlp": True}, causal=True).eval()
    x, _ = _inputs({})
    last = torch.arange(B) * L + L - 1
    caches = [net.new_kv_cache(B, 2 * L), net.new_kv_cache(B, 2 * L)]
    with torch.no_grad():
        sparse = net(x, kv_cache=caches[0], output_index=last)  # (B, V)
        full = net(x, kv_cache=caches[1])[:, -1]  # (B, V)
        torch.testing.assert_close(sparse, full, rtol=1e-5, atol=1e-6)
        for a, b in zip(caches[0].keys + caches[0].values + caches[0].conv_inputs,
                        caches[1].keys + caches[1].values + caches[1].conv_inputs, strict=True):
            torch.testing.assert_close(a, b)
        step = torch.randint(0, V, (B, 1), generator=torch.Generator().manual_seed(5))
        torch.testing.assert_close(net(step, kv_cache=caches[0]), net(step, kv_cache=caches[1]))


def test_an_intermediate_layer_takes_no_output_index():
    net = _net({}, False)
    x, _ = _inputs({})
    with pytest.raises(ValueError, match="output_index"):
        net.hidden_states(x, layer=1, output_index=INDEX)
