"""Packed documents (data.text.block_mode=packed): the packing itself against a brute-force reference, the
document-aware attention of the DiT (one packed forward = the separate forwards of its documents), the
losses of AR / MDLM / D3PM / SEDD (a packed row's loss = the sum of its documents' losses with the same
noise), the kernel choice, the refusals, and short training runs."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from seqdiff.backbones import dit as dit_module
from seqdiff.backbones.dit import DiT, packed_attention_kernel
from seqdiff.config import (
    ConfigError,
    DataConfig,
    MethodConfig,
    ModelConfig,
    SampleConfig,
    TextDataConfig,
    load_run_config,
)
from seqdiff.data.blocks import DocumentPacker, PackedBlocks, RandomBlockBatches, pack_documents, segment_positions
from seqdiff.methods import AR, D3PM, MDLM, SEDD, Batch, build_method, check_packing
from seqdiff.tokenizers import CharTokenizer

FIXTURES = Path(__file__).parent / "fixtures"
BOS, EOS, PAD = 100, 101, 102
TOK = CharTokenizer(alphabet="abcdefgh", normalize="none")  # 8 letters + BOS EOS PAD MASK
V = TOK.vocab_size


# ------------------------------------------------------------------------------------------- packing
def _brute_force(documents, L):
    """Token by token: (blocks, lengths, segments, positions) as lists of rows; the reference."""
    stream = [(tok, d) for d, doc in enumerate(documents) for tok in [BOS, *doc.tolist(), EOS]]
    rows = [stream[i : i + L] for i in range(0, len(stream), L)]
    blocks, lengths, segments, positions = [], [], [], []
    for row in rows:
        real = len(row)
        pad_doc = row[-1][1] + 1
        row = row + [(PAD, pad_doc)] * (L - real)
        docs = [d for _, d in row]
        segments.append([d - docs[0] for d in docs])
        positions.append([i - docs.index(d) for i, d in enumerate(docs)])
        blocks.append([t for t, _ in row])
        lengths.append(real)
    return np.array(blocks), np.array(lengths), np.array(segments), np.array(positions)


@pytest.mark.parametrize("L", [3, 4, 7, 16, 40])
def test_packing_matches_a_brute_force_reference_and_loses_no_token(L):
    rng = np.random.default_rng(L)
    docs = [rng.integers(0, 50, size=int(rng.integers(0, 25))) for _ in range(30)]
    blocks, lengths, segments = pack_documents(docs, L, BOS, EOS, PAD)
    ref_blocks, ref_lengths, ref_segments, ref_positions = _brute_force(docs, L)
    np.testing.assert_array_equal(blocks, ref_blocks)
    np.testing.assert_array_equal(lengths, ref_lengths)
    np.testing.assert_array_equal(segments, ref_segments)
    positions = segment_positions(torch.from_numpy(segments.astype(np.int64))).numpy()
    np.testing.assert_array_equal(positions, ref_positions)  # 0 at every document's first token in a row
    # no padding but the tail of the last row; every row but the last full
    assert (lengths[:-1] == L).all() and 1 <= lengths[-1] <= L
    real = np.arange(L)[None] < lengths[:, None]
    assert not (blocks[real] == PAD).any() and (blocks[~real] == PAD).all()
    # concatenated, the real tokens are BOS d EOS of every document in order: none lost, none repeated
    joined = np.concatenate([b[:n] for b, n in zip(blocks, lengths)])
    np.testing.assert_array_equal(joined, np.concatenate([np.r_[BOS, d, EOS] for d in docs]))
    # each (row, segment) holds one contiguous piece of one document; pieces of a document are consecutive
    assert (np.diff(segments, axis=1) >= 0).all() and (np.diff(segments, axis=1) <= 1).all()
    if lengths[-1] < L:  # the padding is a segment of its own
        assert segments[-1, lengths[-1]] == segments[-1, lengths[-1] - 1] + 1


def test_packer_fed_in_pieces_gives_the_same_rows():
    rng = np.random.default_rng(0)
    docs = [rng.integers(0, 50, size=int(rng.integers(0, 40))) for _ in range(25)]
    packer = DocumentPacker(9, BOS, EOS, PAD)
    parts = [packer.add(d) for d in docs] + [packer.finish()]
    for i, whole in enumerate(pack_documents(docs, 9, BOS, EOS, PAD)):
        np.testing.assert_array_equal(np.concatenate([p[i] for p in parts]), whole)


def test_packed_batches_carry_segments_and_positions():
    rng = np.random.default_rng(1)
    blocks, lengths, segments = pack_documents([rng.integers(0, 50, size=5) for _ in range(12)], 8, BOS, EOS, PAD)
    data = RandomBlockBatches(blocks, lengths, 4, seed=3, segments=segments)
    batch = data.batch_at(2)
    assert set(batch) == {"input_ids", "attention_mask", "segment_ids", "positions"}
    assert torch.equal(batch["positions"], segment_positions(batch["segment_ids"]))
    item = PackedBlocks(blocks, lengths, segments)[len(blocks) - 1]
    assert item["segment_ids"].shape == (8,) and not item["attention_mask"].all()


# ------------------------------------------------------------------------------------------- backbone
def _docs_row(lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, V - 4, (n,), generator=g) for n in lengths]


def _pack(rows, L):
    """Rows of documents -> a packed batch (B, L) with tail padding, its segments and positions."""
    ids = torch.full((len(rows), L), TOK.pad_id)
    seg = torch.zeros(len(rows), L, dtype=torch.long)
    mask = torch.zeros(len(rows), L, dtype=torch.bool)
    for b, docs in enumerate(rows):
        flat = torch.cat(docs)
        ids[b, : len(flat)] = flat
        mask[b, : len(flat)] = True
        seg[b, : len(flat)] = torch.cat([torch.full((len(d),), i) for i, d in enumerate(docs)])
        seg[b, len(flat):] = len(docs)  # the padding: a segment of its own
    return Batch(input_ids=ids, attention_mask=mask, segment_ids=seg, positions=segment_positions(seg))


ROWS = [[5, 1, 6, 4], [9, 3, 2]]  # document lengths per row; the second row ends in 2 padding tokens
L = 16


def _dit(causal, time_conditioning, seed=0, local_conv=0, local_conv_mlp=False, kmer_sizes=()):
    torch.manual_seed(seed)
    cfg = ModelConfig(hidden_size=32, n_heads=4, n_layers=2, max_seq_len=32, cond_dim=16,
                      time_conditioning=time_conditioning, local_conv=local_conv, local_conv_mlp=local_conv_mlp,
                      kmer_sizes=list(kmer_sizes))
    model = DiT(cfg, V, causal).eval()
    with torch.no_grad():  # adaLN-Zero starts every block as the identity: give the gates weights, or nothing mixes
        for p in model.parameters():
            p.normal_(0.0, 0.2)
    return model


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("time_conditioning", [False, True])
@pytest.mark.parametrize("kernel,local_conv", [("sdpa", 0), ("flex", 0), ("sdpa", 3), ("sdpa", "3+mlp"),
                                               ("sdpa", "kmer")])
@torch.no_grad()  # eager flex_attention runs on CPU in torch 2.13, forward only (no backward on CPU)
def test_one_packed_forward_equals_the_separate_forwards_of_its_documents(causal, time_conditioning, kernel,
                                                                          local_conv):
    if kernel == "flex" and not dit_module.FLEX_AVAILABLE:
        pytest.skip("this torch has no flex_attention")
    if local_conv == "kmer":  # k-mer embeddings instead of a convolution: 2- and 3-mers
        model = _dit(causal, time_conditioning, kmer_sizes=(2, 3))
    else:
        model = _dit(causal, time_conditioning, local_conv=int(str(local_conv)[0]),
                     local_conv_mlp="mlp" in str(local_conv))
    model.packed_attention = kernel
    rows = [_docs_row(r, seed=i) for i, r in enumerate(ROWS)]
    batch = _pack(rows, L)
    noise = torch.tensor([0.3, 2.0]) if time_conditioning else None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # eager flex on CPU warns that it is unfused
        packed = model(batch.input_ids, noise, batch.attention_mask, **batch.packing())  # (B, L, V)
    for b, docs in enumerate(rows):
        start = 0
        for doc in docs:
            alone = model(doc[None], None if noise is None else noise[b : b + 1])  # (1, n, V)
            torch.testing.assert_close(packed[b, start : start + len(doc)], alone[0], atol=2e-5, rtol=1e-4)
            start += len(doc)
    # the check can fail: without the segments the documents see each other
    plain = model(batch.input_ids, noise, batch.attention_mask)
    assert (plain[0, 5:11] - packed[0, 5:11]).abs().max() > 1e-3


@torch.no_grad()
def test_bert_packed_forward_equals_the_separate_forwards_of_its_documents():
    from seqdiff.backbones.bert import Bert

    torch.manual_seed(0)
    model = Bert(ModelConfig(backbone="bert", hidden_size=32, n_heads=4, n_layers=2, max_seq_len=32,
                             time_conditioning=False), V, causal=False).eval()
    rows = [_docs_row(r, seed=i) for i, r in enumerate(ROWS)]
    batch = _pack(rows, L)
    packed = model(batch.input_ids, None, batch.attention_mask, **batch.packing())
    for b, docs in enumerate(rows):
        start = 0
        for doc in docs:
            torch.testing.assert_close(packed[b, start : start + len(doc)], model(doc[None])[0], atol=2e-5, rtol=1e-4)
            start += len(doc)
    assert (model(batch.input_ids, None, batch.attention_mask)[0, 5:11] - packed[0, 5:11]).abs().max() > 1e-3


def test_kernel_selection_and_auto_uses_it(monkeypatch):
    assert packed_attention_kernel("cuda", flex_available=True) == "flex"
    assert packed_attention_kernel("cuda", flex_available=False) == "sdpa"
    assert packed_attention_kernel("cpu", flex_available=True) == "sdpa"
    if not dit_module.FLEX_AVAILABLE:
        return
    model = _dit(False, False)
    batch = _pack([_docs_row(r) for r in ROWS], L)
    calls = []
    flex = dit_module._flex
    monkeypatch.setattr(dit_module, "_flex", lambda *a: calls.append(1) or flex(*a))
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model(batch.input_ids, attention_mask=batch.attention_mask, **batch.packing())
        assert not calls  # auto on CPU: SDPA
        monkeypatch.setattr(dit_module, "packed_attention_kernel", lambda device_type: "flex")
        model(batch.input_ids, attention_mask=batch.attention_mask, **batch.packing())
    assert len(calls) == len(model.blocks)  # auto takes what the selection says: flex in every layer


def test_segment_ids_refuse_a_kv_cache_and_an_explicit_mask():
    model = _dit(True, False)
    batch = _pack([_docs_row(r) for r in ROWS], L)
    with pytest.raises(ValueError, match="segment_ids"):
        model(batch.input_ids, kv_cache=model.new_kv_cache(2, L), segment_ids=batch.segment_ids)
    with pytest.raises(ValueError, match="segment_ids"):
        model(batch.input_ids, attn_mask=torch.ones(L, L, dtype=torch.bool), segment_ids=batch.segment_ids)
    with pytest.raises(ValueError, match="segment_ids must have shape"):
        model(batch.input_ids, segment_ids=batch.segment_ids[:, :-1])
    with pytest.raises(ValueError, match="positions per row must have shape"):
        model(batch.input_ids, segment_ids=batch.segment_ids, positions=batch.positions[:1])


# ------------------------------------------------------------------------------------------- losses
def _method(cls, **kw):
    return cls(MethodConfig(name=cls.name, **kw), TOK)


def test_ar_packed_loss_is_the_sum_of_its_documents_losses():
    model = _dit(True, False)
    method = _method(AR)
    rows = [_docs_row(r, seed=i + 5) for i, r in enumerate(ROWS)]
    out = method.loss(model, _pack(rows, L))
    alone = [method.loss(model, Batch(input_ids=d[None])) for docs in rows for d in docs]
    torch.testing.assert_close(out.nll_sum, sum(o.nll_sum for o in alone), rtol=1e-5, atol=1e-5)
    assert out.num_tokens.item() == sum(sum(r) for r in ROWS)
    # without the per-document shift the first token of a document would be predicted from the previous one
    shifted = method.shift_right(_pack(rows, L).input_ids, _pack(rows, L).segment_ids)
    assert (shifted[0, [0, 5, 6, 12]] == TOK.bos_id).all() and shifted[0, 1] == rows[0][0][0]


@pytest.mark.parametrize("cls,time_conditioning,kw", [
    (MDLM, False, {}), (MDLM, True, {}), (MDLM, False, {"time_sampling": "mask_count"}), (D3PM, False, {}),
    (MDLM, False, {"complementary_masks": True}),
    (MDLM, False, {"time_sampling": "mask_count", "complementary_masks": True}),
])
def test_diffusion_packed_loss_is_the_sum_of_its_documents_losses_with_the_same_noise(cls, time_conditioning, kw):
    model = _dit(False, time_conditioning)
    method = _method(cls, **kw)
    rows = [_docs_row(r, seed=i + 9) for i, r in enumerate(ROWS)]
    batch = _pack(rows, L)
    out = method.loss(model, batch, torch.Generator().manual_seed(4))
    pairs = method.config.complementary_masks  # rows B + b score row b again, with the partner draw
    t, xt, weight = method.draw_noise(batch.input_ids, batch.scored(TOK.pad_id), torch.Generator().manual_seed(4),
                                      pairs)
    assert (xt[:len(rows)][batch.attention_mask] == TOK.mask_id).any()
    total = torch.zeros((), dtype=torch.float64)
    for b in range(xt.shape[0]):
        docs = rows[b % len(rows)]
        start = 0
        for doc in docs:
            span = slice(start, start + len(doc))
            logits = model(xt[b : b + 1, span], noise_level=method.noise_level(t[b : b + 1]))  # (1, n, V)
            if method.subs:
                nll = torch.nn.functional.cross_entropy(method.subs_logits(logits)[0], doc, reduction="none")
                per_token = torch.where(xt[b, span] == TOK.mask_id, weight[b] * nll, torch.zeros_like(nll))
            else:
                per_token = method.per_token_without_subs(logits, doc[None], xt[b : b + 1, span], t[b : b + 1])
            total += per_token.double().sum()
            start += len(doc)
    torch.testing.assert_close(out.nll_sum, total / (2 if pairs else 1), rtol=1e-5, atol=1e-5)


def test_sedd_packed_loss_is_the_sum_of_its_documents_losses_with_the_same_noise():
    model = _dit(False, True)
    method = _method(SEDD)
    rows = [_docs_row(r, seed=i + 2) for i, r in enumerate(ROWS)]
    batch = _pack(rows, L)
    out = method.loss(model, batch, torch.Generator().manual_seed(1))
    g = torch.Generator().manual_seed(1)
    t = method.sample_times(2, "cpu", g)
    sigma = method.sigma(t)
    xt = method.graph.sample_forward(batch.input_ids, sigma, batch.scored(TOK.pad_id), g)
    prior = method.graph.prior_kl(method.sigma(torch.ones(1)))
    total = torch.zeros((), dtype=torch.float64)
    for b, docs in enumerate(rows):
        start = 0
        for doc in docs:
            span = slice(start, start + len(doc))
            logits = model(xt[b : b + 1, span], noise_level=sigma[b : b + 1].float())
            se = method.graph.score_entropy(logits.float(), method.score_offset(sigma[b : b + 1]), xt[b : b + 1, span],
                                            doc[None], sigma[b : b + 1])
            total += (method.dsigma(t[b : b + 1])[:, None] * se + prior).sum()
            start += len(doc)
    torch.testing.assert_close(out.nll_sum, total, rtol=1e-5, atol=1e-5)


def test_mdlm_micro_batch_rows_take_their_segments():
    model = _dit(False, False)
    method = _method(MDLM)
    batch = _pack([_docs_row(r, seed=i) for i, r in enumerate(ROWS)], L)
    whole = method.loss(model, batch, torch.Generator().manual_seed(2))
    parts = [method.loss(model, batch, torch.Generator().manual_seed(2), rows=slice(i, i + 1)) for i in range(2)]
    torch.testing.assert_close(whole.nll_sum, parts[0].nll_sum + parts[1].nll_sum)


# ------------------------------------------------------------------------------------------- refusals
def _recipe(*extra):
    return load_run_config(None, ["model.preset=test", "data.text.block_mode=packed", *extra])


def test_packing_refusals_name_the_key_and_what_is_allowed():
    with pytest.raises(ConfigError, match=r"data\.text\.block_mode=packed .*data\.kind=text.*fasta"):
        DataConfig(kind="fasta", tokenizer="nucleotide", text=TextDataConfig(block_mode="packed"))
    config = _recipe("method.name=bd3lm", "method.block_size=4")
    with pytest.raises(ConfigError, match=r"data\.text\.block_mode=packed .*\(ar, d3pm, mdlm, sedd\).*bd3lm"):
        check_packing(config, build_method(config.method, TOK))
    config = _recipe("model.rc_equivariant=shared")
    allowed = r"data\.text\.block_mode=packed .*\['bert', 'dit'\].*model\.rc_equivariant=shared"
    with pytest.raises(ConfigError, match=allowed):
        check_packing(config, build_method(config.method, TOK))
    check_packing(_recipe("model.backbone=bert"), build_method(_recipe().method, TOK))  # accepted
    for name in ("mdlm", "ar", "sedd", "d3pm"):
        config = _recipe(f"method.name={name}")
        check_packing(config, build_method(config.method, TOK))  # accepted
    with pytest.raises(ValueError, match="bd3lm does not take packed"):
        method = build_method(MethodConfig(name="bd3lm", block_size=4), TOK)
        method.loss(_dit(False, False), _pack([_docs_row(r) for r in ROWS], L))


@pytest.fixture
def data_home(tmp_path, monkeypatch):
    monkeypatch.setenv("SEQDIFF_DATA", str(tmp_path / "data"))
    return tmp_path / "data"


TRAIN = [
    "model.preset=test", "model.max_seq_len=64", "data.seq_len=32", "data.batch_size=4",
    *(f"data.{s}_file={FIXTURES / 'shakespeare_tiny.txt'}" for s in ("train", "valid", "test")),
    "train.max_steps=3", "train.val_every=3", "train.val_batches=1", "train.checkpoint_every=3",
    "train.progress_bar=false", "train.warmup_steps=1", "data.documents=lines",
    "data.tokenizer=gpt2", f"data.tokenizer_options={{vocab_dir: {FIXTURES / 'gpt2'}}}",
]


def test_bd3lm_with_packing_is_refused_before_anything_is_written(tmp_path, data_home):
    from seqdiff.training.run import train

    with pytest.raises(ConfigError, match="data.text.block_mode=packed"):
        train(load_run_config(None, [*TRAIN, "data.text.block_mode=packed", "method.name=bd3lm",
                                     "method.block_size=4"]), tmp_path / "run")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("method,extra", [("mdlm", []), ("ar", ["train.micro_batch_size=2"])])
def test_three_step_packed_train_evaluates_and_samples(tmp_path, data_home, method, extra):
    from seqdiff.checkpoint import load_checkpoint
    from seqdiff.evaluation.generate import generate
    from seqdiff.evaluation.likelihood import evaluate_batches
    from seqdiff.training.run import train

    cfg = load_run_config(None, [*TRAIN, "data.text.block_mode=packed", f"method.name={method}", *extra])
    result = train(cfg, tmp_path / "run")
    assert result.trainer.global_step == 3
    dm = result.trainer.datamodule
    batch = next(iter(dm.train_dataloader()))
    assert batch["input_ids"].shape == (4, 32) and "segment_ids" in batch
    arrays = dm.split_arrays("train")
    assert (arrays["lengths"][:-1] == 32).all()  # every training row full but the last
    assert all(np.isfinite(v.item()) for k, v in result.trainer.callback_metrics.items() if "loss" in k)
    model = load_checkpoint(result.checkpoint)  # eval of the run's own split: packed, as it was trained
    report = evaluate_batches(model, dm.eval_dataloader("test"))
    assert report["num_tokens"] == int(dm.split_arrays("test")["lengths"].sum()) and np.isfinite(
        report["nll_nats_per_token"])
    out = generate(model, SampleConfig(steps=4, num_samples=2, batch_size=2, seq_len=16))  # samplers: unpacked
    assert len(out.tokens) == 2 and all(len(t) == 16 for t in out.tokens)


def test_a_changed_block_mode_is_refused_on_resume(tmp_path, data_home):
    from seqdiff.training.guards import RunError
    from seqdiff.training.run import train

    run = tmp_path / "run"
    train(load_run_config(None, [*TRAIN, "train.max_steps=1", "train.checkpoint_every=1",
                                 "data.text.block_mode=padded"]), run)
    with pytest.raises(RunError, match=r"data\.text\.block_mode: 'padded' -> 'packed'"):
        train(load_run_config(None, [*TRAIN, "train.max_steps=2", "data.text.block_mode=packed"]), run, resume=True)
