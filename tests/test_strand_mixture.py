"""The AR strand mixture q(x) = (p(x) + p(RC x)) / 2 (seqdiff.methods.strand_mixture): normalized over every
sequence of a tiny vocabulary (enumerated), RC-invariant, equal to the mixture of the AR's own per-sequence
likelihoods, within [plain - ..., plain + log 2] of each strand, unchanged by right padding; refusals; the
command line (`seqdiff eval --rc-conjoin` on an AR run)."""

from __future__ import annotations

import itertools
import json
import math
import shutil

import pytest
import torch

from seqdiff.backbones.rc_equivariant import rc_tokens
from seqdiff.checkpoint import LoadedModel
from seqdiff.config import ConfigError, MethodConfig, ModelConfig
from seqdiff.methods import build_model
from seqdiff.methods.base import Batch
from seqdiff.methods.strand_mixture import StrandMixture, conjoin_strands, rc_rows
from seqdiff.tokenizers.char import CharTokenizer
from seqdiff.tokenizers.nucleotide import NucleotideTokenizer

TOK = NucleotideTokenizer()
COMP = torch.as_tensor(TOK.complement_ids)


def tiny_ar(seed: int = 0):
    """A random-weight AR (a DiT with causal attention) and its method; parameters random so p is far from uniform."""
    torch.manual_seed(seed)
    method, backbone, _ = build_model(ModelConfig(hidden_size=32, n_layers=1, n_heads=2, max_seq_len=16),
                                      MethodConfig(name="ar"), TOK)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in backbone.parameters():
            p.copy_(0.5 * torch.randn(p.shape, generator=gen))
    return method, backbone.eval()


def log_p(method, backbone, x: torch.Tensor) -> torch.Tensor:
    """(N,) log p of each row under the plain AR, every row scored separately (the brute-force reference)."""
    out = []
    for row in x:
        logits = backbone(method.shift_right(row[None]))[0].double().log_softmax(-1)  # (L, V)
        out.append(logits.gather(-1, row[:, None]).sum())
    return torch.stack(out)


def test_rc_rows_reverses_each_real_prefix_and_keeps_padding():
    ids = torch.tensor([[0, 1, 2, 3], [0, 0, 1, TOK.pad_id], [2, TOK.pad_id, TOK.pad_id, TOK.pad_id]])
    real = ids != TOK.pad_id
    out = rc_rows(ids, real, COMP)
    torch.testing.assert_close(out[0], rc_tokens(ids[0], COMP))
    torch.testing.assert_close(out[1, :3], rc_tokens(ids[1, :3], COMP))
    assert out[1, 3] == TOK.pad_id and out[2, 1:].eq(TOK.pad_id).all()
    torch.testing.assert_close(out[2, :1], rc_tokens(ids[2, :1], COMP))
    torch.testing.assert_close(rc_rows(out, real, COMP), ids)  # an involution


def test_mixture_is_normalized_and_rc_invariant_by_enumeration():
    method, backbone = tiny_ar()
    method.pad_id = -1  # every id a scored token, PAD's too: the softmax's mass over V^L is what must sum to 1
    mix = StrandMixture(method, COMP)
    V, L = TOK.vocab_size, 3
    every = torch.tensor(list(itertools.product(range(V), repeat=L)))  # all V^L sequences (RC is a bijection of them)
    with torch.no_grad():
        nll, _ = mix.row_nll(backbone, Batch(input_ids=every))
        nll_rc, _ = mix.row_nll(backbone, Batch(input_ids=rc_tokens(every, COMP)))
        plain = -log_p(method, backbone, every)
    assert abs(torch.logsumexp(-nll, 0).exp().item() - 1.0) < 1e-5  # q sums to 1 over V^L
    assert abs(torch.logsumexp(-plain, 0).exp().item() - 1.0) < 1e-5  # so does p (the reference is right)
    assert (nll - nll_rc).abs().max().item() < 1e-5  # q(RC x) = q(x)
    assert (plain - (-log_p(method, backbone, rc_tokens(every, COMP)))).abs().max().item() > 1e-2  # p is not


def test_mixture_equals_brute_force_and_stays_within_its_bounds():
    method, backbone = tiny_ar(1)
    gen = torch.Generator().manual_seed(0)
    x = torch.randint(0, 5, (6, 10), generator=gen)  # A C G T N
    with torch.no_grad():
        nll, _ = StrandMixture(method, COMP).row_nll(backbone, Batch(input_ids=x))
        a, b = -log_p(method, backbone, x), -log_p(method, backbone, rc_tokens(x, COMP))
    expected = -(torch.logaddexp(-a, -b) - math.log(2.0))
    assert (nll - expected).abs().max().item() < 1e-4  # float32 logits
    assert bool((nll <= (a + b) / 2 + 1e-4).all())  # concavity: never above the two strands' mean
    assert bool((nll <= torch.minimum(a, b) + math.log(2.0) + 1e-4).all())  # at most log 2 above the better strand
    assert bool((nll >= torch.minimum(a, b) - 1e-4).all())


def test_padded_rows_score_as_their_unpadded_sequences():
    method, backbone = tiny_ar(2)
    mix = StrandMixture(method, COMP)
    gen = torch.Generator().manual_seed(1)
    x = torch.randint(0, 4, (3, 8), generator=gen)
    lengths = torch.tensor([8, 5, 2])
    real = torch.arange(8)[None] < lengths[:, None]
    padded = torch.where(real, x, TOK.pad_id)
    with torch.no_grad():
        together, _ = mix.row_nll(backbone, Batch(input_ids=padded, attention_mask=real))
        alone = torch.cat([mix.row_nll(backbone, Batch(input_ids=x[i:i + 1, :n]))[0] for i, n in enumerate(lengths)])
        out = mix.bound(backbone, Batch(input_ids=padded, attention_mask=real))
    assert (together - alone).abs().max().item() < 1e-4
    assert out.num_tokens.item() == 15 and abs(out.nll_sum.item() - alone.sum().item()) < 1e-4


def test_mixture_loss_is_differentiable():
    method, backbone = tiny_ar(3)
    backbone.train()
    x = torch.randint(0, 4, (4, 8), generator=torch.Generator().manual_seed(2))
    out = StrandMixture(method, COMP).loss(backbone, Batch(input_ids=x))
    out.loss.backward()
    grads = [p.grad for p in backbone.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads) and any(g.abs().sum() > 0 for g in grads)


def test_refusals(tmp_path):
    method, backbone = tiny_ar()
    mix = StrandMixture(method, COMP)
    x = torch.randint(0, 4, (2, 6), generator=torch.Generator().manual_seed(3))
    partial = torch.ones_like(x, dtype=torch.bool)
    partial[:, :2] = False  # a context that is not scored
    with pytest.raises(ConfigError, match="every real token of a row must be scored"):
        mix.row_nll(backbone, Batch(input_ids=x, loss_mask=partial))
    left = torch.ones_like(x, dtype=torch.bool)
    left[0, 0] = False  # left padding
    with pytest.raises(ConfigError, match="right-padded"):
        mix.row_nll(backbone, Batch(input_ids=x, attention_mask=left, loss_mask=left))
    with pytest.raises(ConfigError, match="packed"):
        mix.row_nll(backbone, Batch(input_ids=x, segment_ids=torch.zeros_like(x), positions=torch.zeros_like(x)))
    mdlm, _, _ = build_model(ModelConfig(hidden_size=32, n_layers=1, n_heads=2), MethodConfig(name="mdlm"), TOK)
    with pytest.raises(ConfigError, match="exact causal"):
        StrandMixture(mdlm, COMP)
    char = CharTokenizer()
    m, b, cfg = build_model(ModelConfig(hidden_size=32, n_layers=1, n_heads=2), MethodConfig(name="ar"), char)
    text = LoadedModel(b, m, char, cfg, MethodConfig(name="ar"), None, 12, 0, tmp_path, False)
    with pytest.raises(ConfigError, match="--rc-conjoin needs a tokenizer with a complement map"):
        conjoin_strands(text)


def test_eval_rc_conjoin_on_an_ar_run(tmp_path):
    from seqdiff.cli import main

    fa = tmp_path / "slices.fa"  # a copy: pyfaidx writes its index beside the FASTA
    shutil.copy("tests/fixtures/grch37_chr20_slices.fa", fa)
    run = tmp_path / "ar"
    common = ["model.preset=test", "model.max_seq_len=64", "method.name=ar", "data.kind=fasta",
              "data.tokenizer=nucleotide", f"data.fasta={fa}", "data.split_mode=bed",
              "data.bed=tests/fixtures/grch37_chr20_slices.bed", "data.seq_len=64", "data.batch_size=4",
              "train.max_steps=3", "train.val_every=3", "train.val_batches=1", "train.progress_bar=false"]
    assert main(["train", "--run-dir", str(run), *common]) == 0
    plain, conj = tmp_path / "plain.json", tmp_path / "conj.json"
    assert main(["eval", str(run), "--out", str(plain)]) == 0
    assert main(["eval", str(run), "--rc-conjoin", "--out", str(conj)]) == 0
    a, b = json.loads(plain.read_text()), json.loads(conj.read_text())
    assert b["rc_conjoined"] is True and "rc_conjoined" not in a
    a, b = a["results"][0], b["results"][0]
    assert b["bound"] is False and a["num_tokens"] == b["num_tokens"]
    # q >= p / 2 for every block: at most one bit per 64-base block above the plain model, and not equal to it
    assert b["bits_per_base"] <= a["bits_per_base"] + 1 / 64 + 1e-6
    assert abs(a["bits_per_base"] - b["bits_per_base"]) > 1e-7
