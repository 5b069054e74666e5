"""model.kmer_sizes: the k-mer rows of seqdiff.backbones.kmer_embedding against a brute-force reading of each
window, the hashed rows, the zero start, training, and the combinations refused. Causality, padding,
packing and KV-cache parity run in tests/test_backbone.py and tests/test_packing.py (parametrized over kmer_sizes)."""

from __future__ import annotations

import pytest
import torch

from seqdiff.backbones import build_backbone
from seqdiff.backbones.kmer_embedding import MULTIPLIER, PRIME, KmerEmbedding, table_rows
from seqdiff.config import ConfigError, MethodConfig, ModelConfig, from_dict
from seqdiff.methods import build_method
from seqdiff.tokenizers import CharTokenizer


def window(ids, b, i, k, left, keep=None, segment_ids=None):
    """The k symbols of position i's window: id + 1, or 0 outside the row, at padding, in another segment."""
    out = []
    for j in range(k):
        n = i + j - left
        inside = 0 <= n < ids.shape[1] and (keep is None or bool(keep[b, n]))
        if inside and segment_ids is not None:
            inside = bool(segment_ids[b, n] == segment_ids[b, i])
        out.append(int(ids[b, n]) + 1 if inside else 0)
    return out


def brute_force_row(symbols, base, buckets):
    """The window as a base-`base` number (first symbol most significant); hashed when the table is smaller."""
    number = sum(s * base ** (len(symbols) - 1 - j) for j, s in enumerate(symbols))
    if base ** len(symbols) <= buckets:
        return number
    return number % PRIME * MULTIPLIER % PRIME % buckets


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("k,buckets", [(1, 1000), (3, 1000), (4, 50), (6, 4096)])
def test_kmer_rows_are_the_brute_force_reading_of_each_window(causal, k, buckets):
    V = 9
    emb = KmerEmbedding(V, 8, [k], buckets, 4, causal)
    gen = torch.Generator().manual_seed(k)
    ids = torch.randint(0, V, (2, 11), generator=gen)
    keep = torch.ones(2, 11, dtype=torch.bool)
    keep[1, :2] = False  # left padding
    keep[0, 9:] = False  # right padding
    segments = torch.tensor([[0, 0, 0, 1, 1, 2, 2, 2, 2, 2, 2], [0, 0, 1, 1, 1, 1, 1, 1, 3, 3, 3]])
    left = emb.left(k)
    assert left == (k - 1 if causal else k // 2)
    for kwargs in ({}, {"keep": keep}, {"keep": keep, "segment_ids": segments}):
        rows = emb.kmer_ids(emb.symbols(ids, kwargs.get("keep")), k, kwargs.get("segment_ids"))
        expected = torch.tensor([[brute_force_row(window(ids, b, i, k, left, **kwargs), V + 1, buckets)
                                  for i in range(11)] for b in range(2)])
        torch.testing.assert_close(rows, expected)
        assert 0 <= rows.min() and rows.max() < table_rows(V, k, buckets) == emb.tables[0].num_embeddings


def test_exact_tables_give_every_kmer_its_own_row_and_hashed_ones_spread():
    assert table_rows(4, 3, 1000) == 125 and table_rows(4, 5, 1000) == 1000
    emb = KmerEmbedding(4, 8, [3], 1000, 4, causal=True)
    every = torch.cartesian_prod(*[torch.arange(4)] * 3)  # all 64 3-mers of 4 ids, one per row
    rows = emb.kmer_ids(emb.symbols(every, None), 3)[:, -1]  # the last position reads the whole row
    assert rows.unique().numel() == 64
    hashed = KmerEmbedding(4, 8, [6], 512, 4, causal=True)
    every = torch.cartesian_prod(*[torch.arange(4)] * 6)  # 4,096 6-mers into 512 rows
    rows = hashed.kmer_ids(hashed.symbols(every, None), 6)[:, -1]
    counts = torch.bincount(rows, minlength=512)
    assert (counts > 0).sum() > 0.95 * 512 and counts.max() <= 24  # about 8 per row, no pile-up


def test_cached_kmers_equal_the_full_causal_pass():
    emb = KmerEmbedding(7, 6, [2, 4], 100, 3, causal=True).double()
    with torch.no_grad():
        emb.proj.weight.normal_()
    ids = torch.randint(0, 7, (2, 9), generator=torch.Generator().manual_seed(3))
    history = torch.zeros(2, 9, dtype=torch.long)
    with torch.no_grad():
        pieces = [emb.forward_cached(ids[:, a:b], history, a) for a, b in [(0, 2), (2, 3), (3, 7), (7, 9)]]
        torch.testing.assert_close(torch.cat(pieces, 1), emb(ids))
    with pytest.raises(ValueError, match="causal"):
        KmerEmbedding(7, 6, [2], 100, 3, causal=False).forward_cached(ids, history, 0)


def _dit(causal: bool, kmer_sizes=(), seed: int = 0, **extra):
    torch.manual_seed(seed)
    cfg = from_dict(ModelConfig, {"preset": "test", "max_seq_len": 32, "kmer_sizes": list(kmer_sizes), **extra})
    return build_backbone(cfg, vocab_size=11, causal=causal).double().eval()


def test_a_new_model_with_kmers_computes_what_it_computes_without_them():
    """The projection starts at zero: the same other weights give the same logits; nonzero, they differ."""
    plain, kmers = _dit(False), _dit(False, [3, 5])
    missing, unexpected = kmers.load_state_dict(plain.state_dict(), strict=False)
    assert missing and all(key.startswith("kmer_embed.") for key in missing) and not unexpected
    x = torch.randint(0, 11, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(kmers(x), plain(x))
        kmers.kmer_embed.proj.weight.normal_()
        assert (kmers(x) - plain(x)).abs().max() > 1e-3


def test_kmer_tables_train_and_count_as_lookups():
    plain, kmers = _dit(False), _dit(False, [2, 3])
    dim, H = kmers.config.kmer_dim, kmers.config.hidden_size
    tables = 12 ** 2 * dim + 12 ** 3 * dim  # 11 ids + "outside": exact rows
    assert kmers.num_parameters() - plain.num_parameters() == tables + dim * H
    assert kmers.num_parameters(exclude_embedding=True) - plain.num_parameters(exclude_embedding=True) == dim * H
    assert kmers.flops_per_token(16) - plain.flops_per_token(16) == 6 * dim * H  # the projection, at every token
    method = build_method(MethodConfig(name="mdlm"), CharTokenizer())
    model = build_backbone(from_dict(ModelConfig, {"preset": "test", "max_seq_len": 32, "kmer_sizes": [3]}),
                           CharTokenizer().vocab_size, causal=False).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x = torch.randint(0, 26, (4, 16), generator=torch.Generator().manual_seed(2))
    from seqdiff.methods import Batch

    for _ in range(2):  # step 1 moves the zero projection, step 2 then reaches the tables
        opt.zero_grad()
        method.loss(model, Batch(input_ids=x), torch.Generator().manual_seed(0)).loss.backward()
        opt.step()
    assert model.kmer_embed.proj.weight.abs().sum() > 0 and model.kmer_embed.tables[0].weight.grad.abs().sum() > 0


@pytest.mark.parametrize("values,message", [
    ({"kmer_sizes": [0]}, r"model.kmer_sizes=\[0\]: give distinct sizes >= 1"),
    ({"kmer_sizes": [3, 3]}, r"model.kmer_sizes=\[3, 3\]: give distinct sizes"),
    ({"kmer_sizes": [3], "kmer_buckets": 0}, r"model.kmer_buckets=0 and model.kmer_dim=32 must be >= 1"),
    ({"kmer_sizes": [3], "backbone": "bert"}, "DiT option"),
])
def test_bad_kmer_settings_are_refused(values, message):
    with pytest.raises(ConfigError, match=message):
        from_dict(ModelConfig, values)


def test_kmers_refuse_block_causal_attention():
    model = _dit(False, [3])
    x = torch.randint(0, 11, (1, 8))
    with pytest.raises(ValueError, match="kmer_sizes"):
        model(x, attn_mask=torch.ones(8, 8, dtype=torch.bool))
    with pytest.raises(ValueError, match="kmer_sizes"):
        model(x, kv_cache=model.new_kv_cache(1, 16, blockwise=True))
    bd3lm = build_method(MethodConfig(name="bd3lm", block_size=4), CharTokenizer())
    with pytest.raises(ConfigError, match="kmer_sizes"):
        bd3lm.check_backbone(model)
