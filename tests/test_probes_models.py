"""Probes on models: mean pooling over real positions, reverse-complement averaging, layer choice, k-mer
counts, logistic-regression selection, the CNN baseline, fine-tuning, and `seqdiff probe` end to end."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest
import torch

from seqdiff.backbones import build_backbone
from seqdiff.config import ModelConfig, from_dict
from seqdiff.probes.cnn import GenomicBenchmarksCNN, flatten_size
from seqdiff.probes.data import ProbeError
from seqdiff.probes.embeddings import BackboneEncoder, embed_sequences, encode_batch, masked_mean
from seqdiff.probes.finetune import FinetuneConfig, finetune, finetune_predict
from seqdiff.probes.linear import C_GRID, accuracy, all_kmers, fit_kmer, fit_logistic, kmer_counts
from seqdiff.tokenizers import NucleotideTokenizer

TOK = NucleotideTokenizer()


def backbone(causal: bool, seed: int = 0, **overrides):
    torch.manual_seed(seed)
    cfg = from_dict(ModelConfig, {"preset": "test", "max_seq_len": 64, **overrides})
    model = build_backbone(cfg, TOK.vocab_size, causal=causal).eval()
    if model.kmer_embed is not None:  # its projection starts at zero: give it weights, or the k-mers do nothing
        with torch.no_grad():
            model.kmer_embed.proj.weight.normal_(0.0, 0.5)
    return model


# A plain backbone and one that reads k-mer embeddings: padding must stay outside every k-mer window.
LOCAL = [{}, {"kmer_sizes": [3, 5], "kmer_buckets": 4096}]


def toy_sequences(n: int, length: int, seed: int) -> tuple[list[str], np.ndarray]:
    """Class 0 is AT-rich, class 1 GC-rich: separable from base composition alone."""
    rng = np.random.default_rng(seed)
    labels = np.arange(n) % 2
    probs = {0: [0.4, 0.1, 0.1, 0.4], 1: [0.1, 0.4, 0.4, 0.1]}
    seqs = ["".join(rng.choice(list("ACGT"), size=length, p=probs[int(y)])) for y in labels]
    return seqs, labels


def test_masked_mean_brute_force():
    h = torch.randn(2, 5, 3)
    mask = torch.tensor([[1, 1, 0, 0, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)
    out = masked_mean(h, mask)
    torch.testing.assert_close(out[0], h[0, :2].mean(0))
    torch.testing.assert_close(out[1], h[1].mean(0))


@pytest.mark.parametrize("local", LOCAL)
@pytest.mark.parametrize("causal", [False, True])
def test_embedding_ignores_padding_and_batch_company(causal, local):
    """A sequence's embedding alone equals its embedding padded next to a longer one."""
    enc = BackboneEncoder(backbone(causal, **local), TOK.complement_ids)
    short, long = "ACGTTGCA", "GGGCCCAAATTTACGTACGT"
    alone = embed_sequences(enc, TOK, [short])[0]
    batched = embed_sequences(enc, TOK, [long, short], batch_size=2)
    np.testing.assert_allclose(batched[1], alone, atol=1e-5, rtol=1e-5)
    # brute force: the mean of the hidden states of the unpadded sequence
    ids, _ = encode_batch(TOK, [short])
    with torch.no_grad():
        want = enc.backbone.hidden_states(ids)[0].mean(0).numpy()
    np.testing.assert_allclose(alone, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("local", LOCAL)
@pytest.mark.parametrize("causal", [False, True])
def test_reverse_complement_average_is_strand_symmetric(causal, local):
    enc = BackboneEncoder(backbone(causal, **local), TOK.complement_ids, rc_average=True)
    seq = "AACGTTTGCAGGCA"
    rc = "".join({"A": "T", "C": "G", "G": "C", "T": "A"}[b] for b in reversed(seq))
    out = embed_sequences(enc, TOK, [seq, rc, "ACG" + seq], batch_size=3)  # padded: RC puts padding left
    np.testing.assert_allclose(out[0], out[1], atol=1e-5, rtol=1e-5)
    plain = embed_sequences(BackboneEncoder(enc.backbone, TOK.complement_ids), TOK, [seq, rc])
    assert not np.allclose(plain[0], plain[1], atol=1e-4)  # without averaging the strands differ
    np.testing.assert_allclose(out[0], plain.mean(0), atol=1e-5, rtol=1e-5)


def test_reverse_complement_average_of_position_features_aligns_the_strands():
    """flatten + rc_average: the reverse complement's states are flipped back, so position i of the average
    is base pair i on both strands; then the embedding of RC(x) is that of x read backwards, position by
    position (and not, as a strand-invariant average would make it, the same vector)."""
    model = backbone(False)
    seq = "AACGTTTGCAGGCA"
    rc = "".join({"A": "T", "C": "G", "G": "C", "T": "A"}[b] for b in reversed(seq))
    L, H = len(seq), model.config.hidden_size
    enc = BackboneEncoder(model, TOK.complement_ids, rc_average=True, pool="flatten", length=L)
    out = embed_sequences(enc, TOK, [seq, rc]).reshape(2, L, H)
    np.testing.assert_allclose(out[1], out[0][::-1], atol=1e-5, rtol=1e-5)
    assert not np.allclose(out[0], out[1], atol=1e-4)
    # brute force: the forward strand's states plus the reverse strand's states read backwards, halved
    ids, _ = encode_batch(TOK, [seq, rc])
    with torch.no_grad():
        states = model.hidden_states(ids)
    np.testing.assert_allclose(out[0], 0.5 * (states[0] + states[1].flip(0)).numpy(), atol=1e-5, rtol=1e-5)
    # padded rows: the reverse strand's padding moves left, and flipping back restores it on the right
    padded = BackboneEncoder(model, TOK.complement_ids, rc_average=True, pool="flatten", length=L + 3)
    both = embed_sequences(padded, TOK, [seq]).reshape(L + 3, H)
    np.testing.assert_allclose(both[:L], out[0], atol=1e-5, rtol=1e-5)
    assert not both[L:].any()


def test_rc_both_keeps_a_plain_models_two_strands_side_by_side():
    """rc_both on a plain model: [features of x | features of RC(x) flipped back]; their mean is rc_average's
    embedding, and the two together refuse."""
    model = backbone(False)
    seq = "AACGTTTGCAGGCA"
    L, H = len(seq), model.config.hidden_size
    comp = TOK.complement_ids
    both = embed_sequences(BackboneEncoder(model, comp, rc_both=True, pool="flatten", length=L), TOK, [seq])
    avg = embed_sequences(BackboneEncoder(model, comp, rc_average=True, pool="flatten", length=L), TOK, [seq])
    plain = embed_sequences(BackboneEncoder(model, TOK.complement_ids, pool="flatten", length=L), TOK, [seq])
    assert both.shape == (1, 2 * L * H)
    np.testing.assert_allclose(both[:, : L * H], plain, atol=1e-6)
    np.testing.assert_allclose(0.5 * (both[:, : L * H] + both[:, L * H:]), avg, atol=1e-5)
    enc = BackboneEncoder(model, TOK.complement_ids, rc_both=True, concat_layers=True)
    assert enc.out_features == 2 * H * (model.config.n_layers + 1)
    assert embed_sequences(enc, TOK, [seq]).shape == (1, enc.out_features)
    with pytest.raises(ProbeError, match="exclude each other"):
        BackboneEncoder(model, TOK.complement_ids, rc_average=True, rc_both=True)
    from seqdiff.config import ConfigError
    from seqdiff.options import ProbeOptions

    with pytest.raises(ConfigError, match="probe.rc_average and probe.rc_both exclude each other"):
        ProbeOptions(rc_average=True, rc_both=True)  # refused as options, before any model loads


def test_layer_choice_and_time_conditioned_backbone():
    model = backbone(False, time_conditioning=True)
    seqs = ["ACGTACGTAA", "GGCC"]
    first = embed_sequences(BackboneEncoder(model, TOK.complement_ids, layer=0), TOK, seqs)
    ids, _ = encode_batch(TOK, ["GGCC"])
    np.testing.assert_allclose(first[1], model.embed(ids)[0].mean(0).detach().numpy(), atol=1e-6)  # embeddings
    final = embed_sequences(BackboneEncoder(model, TOK.complement_ids), TOK, seqs)  # read at noise level 0
    assert final.shape == first.shape == (2, 32) and not np.allclose(final, first)


def test_kmer_counts_brute_force():
    seqs = ["ACGTNACGTAC", "AC", "acgt"]
    for k in (1, 2, 3):
        counts = kmer_counts(seqs, k)
        names = all_kmers(k)
        for row, seq in zip(counts, seqs):
            seq = seq.upper()
            windows = [seq[i:i + k] for i in range(len(seq) - k + 1) if "N" not in seq[i:i + k]]
            want = Counter(windows)
            expected = np.array([want[m] / max(1, len(windows)) for m in names])
            np.testing.assert_allclose(row, expected, atol=1e-7)


def test_onehot_features_brute_force_and_a_positional_signal():
    """Column 4 i + code of the base at i (A, C, G, T = 0..3); N and padding are zero rows. A class that only
    differs in which base sits at one offset (same composition) is read by the one-hot probe, not by k-mer counts."""
    from seqdiff.probes.linear import fit_onehot, onehot_features

    feats = onehot_features(["ACgN", "T"], 5).reshape(2, 5, 4)
    want = np.zeros((2, 5, 4), dtype=np.float32)
    for i, seq in enumerate(["ACGN", "T"]):
        for pos, base in enumerate(seq):
            if base in "ACGT":
                want[i, pos, "ACGT".index(base)] = 1.0
    np.testing.assert_array_equal(feats, want)
    with pytest.raises(ProbeError, match="more than the one-hot length 2"):
        onehot_features(["ACG"], 2)
    rng = np.random.default_rng(0)

    def draw(n):  # a shuffled composition, with the label deciding whether an A or a T sits at offset 7
        labels = rng.integers(0, 2, n)
        seqs = []
        for y in labels:
            bases = list(rng.permutation(list("AAAAATTTTTCCCCCGGGGG")))
            j = bases.index("A" if y else "T")
            bases[7], bases[j] = bases[j], bases[7]
            seqs.append("".join(bases))
        return seqs, labels

    data = {split: draw(n) for split, n in (("train", 80), ("val", 40), ("test", 100))}
    seqs, labels = {k: v[0] for k, v in data.items()}, {k: v[1] for k, v in data.items()}
    assert fit_onehot(seqs, labels, seed=0).test_accuracy == 1.0
    assert fit_kmer(seqs, labels, seed=0, sizes=(1,)).test_accuracy < 0.75  # same composition: no signal


def test_logistic_regression_keeps_the_c_best_on_validation():
    rng = np.random.default_rng(0)
    X = {s: rng.normal(size=(n, 5)) for s, n in (("train", 60), ("val", 40), ("test", 40))}
    y = {s: (X[s][:, 0] + 0.8 * rng.normal(size=len(X[s])) > 0).astype(int) for s in X}
    picked = fit_logistic(X, y, seed=0)
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    vals = []
    for c in C_GRID:  # independent re-fit of every C
        m = make_pipeline(StandardScaler(), LogisticRegression(C=c, max_iter=2000, random_state=0)).fit(X["train"],
                                                                                                       y["train"])
        vals.append(accuracy(m.predict(X["val"]), y["val"]))
    assert picked.choice["C"] == C_GRID[int(np.argmax(vals))] and picked.val_accuracy == max(vals)


def test_cross_validation_chooses_c_by_the_mean_fold_accuracy_and_refits_on_every_row():
    """folds > 1: train and val pooled, each C scored by stratified K-fold (each fold standardized on its own
    fitting part: brute force below), the best C refit on all pooled rows."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import StratifiedKFold
    from sklearn.preprocessing import StandardScaler

    from seqdiff.probes.linear import cross_validated_accuracy

    rng = np.random.default_rng(1)
    X = {s: rng.normal(size=(n, 8)) for s, n in (("train", 45), ("val", 15), ("test", 50))}
    y = {s: (X[s][:, 0] - X[s][:, 1] + 1.2 * rng.normal(size=len(X[s])) > 0).astype(int) for s in X}
    rows, targets = np.concatenate([X["train"], X["val"]]), np.concatenate([y["train"], y["val"]])
    brute = np.zeros(len(C_GRID))
    for fit_idx, held_idx in StratifiedKFold(4, shuffle=True, random_state=3).split(rows, targets):
        scaler = StandardScaler().fit(rows[fit_idx])
        for j, c in enumerate(C_GRID):
            m = LogisticRegression(C=c, max_iter=2000).fit(scaler.transform(rows[fit_idx]), targets[fit_idx])
            brute[j] += accuracy(m.predict(scaler.transform(rows[held_idx])), targets[held_idx]) / 4
    np.testing.assert_allclose(cross_validated_accuracy(rows, targets, 3, C_GRID, 4), brute)
    picked = fit_logistic(X, y, seed=3, folds=4)
    best = C_GRID[int(np.argmax(brute))]
    assert picked.choice == {"C": best} and picked.val_accuracy == pytest.approx(brute.max())
    scaler = StandardScaler().fit(rows)  # the refit reads every pooled row, not the 90% of a split
    refit = LogisticRegression(C=best, max_iter=2000).fit(scaler.transform(rows), targets)
    assert picked.test_accuracy == accuracy(refit.predict(scaler.transform(X["test"])), y["test"])


@pytest.mark.parametrize("folds", [0, 3])
def test_feature_weights_scale_standardized_features_and_zero_drops_them(folds):
    """weights multiply the standardized features before the fit: brute force against sklearn on the weighted
    columns; a weight of 0 is the fit without those features (ProbeConfig.context_scales' 0 = the embeddings
    alone), with the exported model reading the standardized features."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    from seqdiff.probes.linear import fit_logistic_model
    from seqdiff.probes.protocol import context_weights

    rng = np.random.default_rng(3)
    X = {s: rng.normal(size=(n, 3, 4)) for s, n in (("train", 50), ("val", 20), ("test", 40))}
    y = {s: (X[s][:, 0, 0] + 0.5 * X[s][:, 1, 2] + rng.normal(size=len(X[s])) > 0).astype(int) for s in X}
    flat = {s: x.reshape(len(x), -1) for s, x in X.items()}
    weights = context_weights((3, 4), 0.3)
    assert weights.tolist() == [1.0] * 4 + [0.3] * 8
    scaler, model, choice = fit_logistic_model(flat, y, seed=0, folds=folds, weights=weights)
    rows = flat["train"] if not folds else np.concatenate([flat["train"], flat["val"]])
    labels = y["train"] if not folds else np.concatenate([y["train"], y["val"]])
    ref_scaler = StandardScaler().fit(rows)
    ref = LogisticRegression(C=choice["C"], max_iter=2000).fit(ref_scaler.transform(rows) * weights, labels)
    np.testing.assert_allclose(model.coef_, ref.coef_ * weights, atol=1e-3)
    np.testing.assert_array_equal(model.predict(scaler.transform(flat["test"])),
                                  ref.predict(ref_scaler.transform(flat["test"]) * weights))
    only_embeddings = fit_logistic({s: x[:, 0] for s, x in X.items()}, y, seed=0, folds=folds)
    dropped = fit_logistic(flat, y, seed=0, folds=folds, weights=context_weights((3, 4), 0.0))
    assert dropped.choice == only_embeddings.choice and dropped.test_accuracy == only_embeddings.test_accuracy


def test_context_scales_need_the_concatenation_and_are_not_negative():
    from seqdiff.config import ConfigError
    from seqdiff.options import ProbeOptions

    with pytest.raises(ConfigError, match="needs --layer concat"):
        ProbeOptions(benchmark="splice", context_scales=[0.0, 1.0])
    with pytest.raises(ConfigError, match="must be >= 0"):
        ProbeOptions(benchmark="splice", layer="concat", context_scales=[-1.0])
    ProbeOptions(benchmark="splice", layer="concat", context_scales=[0.0, 0.3, 1.0])


def test_cross_validation_refuses_a_class_smaller_than_the_folds():
    from seqdiff.probes.linear import cross_validated_accuracy

    labels = np.array([0] * 10 + [1] * 3)
    with pytest.raises(ProbeError, match=r"probe.cv_folds=4: .* class 1 has 3"):
        cross_validated_accuracy(np.zeros((13, 2)), labels, 0, C_GRID, 4)


def test_cnn_flatten_size_matches_the_layers():
    for length in (57, 60, 200, 251):
        cnn = GenomicBenchmarksCNN(TOK.vocab_size, length)
        x = torch.zeros(2, length, dtype=torch.long)
        assert cnn.conv(cnn.embed(x).transpose(1, 2)).shape == (2, flatten_size(length))
        assert cnn(x).shape == (2, 512)
    with pytest.raises(ValueError, match="too short"):
        flatten_size(56)


def test_finetune_learns_a_separable_task_and_keeps_the_best_epoch():
    seqs, labels = toy_sequences(96, 16, seed=0)
    ids, mask = encode_batch(TOK, seqs)
    y = torch.from_numpy(labels)
    data = {"train": (ids[:64], mask[:64], y[:64]), "val": (ids[64:80], mask[64:80], y[64:80]),
            "test": (ids[80:], mask[80:], y[80:])}
    enc = BackboneEncoder(backbone(False), TOK.complement_ids).train()
    val, test, epoch = finetune(enc, 2, data, FinetuneConfig(epochs=3, lr=3e-3, batch_size=16), seed=0)
    assert val >= 0.9 and test >= 0.8 and 0 <= epoch < 3


def test_finetune_with_a_flatten_head_learns_a_positional_task():
    """The label is the base at one fixed position, every base uniform: no composition signal to pool, the
    flatten head reads the position directly."""
    rng = np.random.default_rng(3)
    seqs = ["".join(rng.choice(list("ACGT"), size=16)) for _ in range(160)]
    labels = np.array([int(s[5] in "AC") for s in seqs])
    ids, mask = encode_batch(TOK, seqs)
    y = torch.from_numpy(labels)
    data = {"train": (ids[:112], mask[:112], y[:112]), "val": (ids[112:136], mask[112:136], y[112:136]),
            "test": (ids[136:], mask[136:], y[136:])}
    enc = BackboneEncoder(backbone(False), TOK.complement_ids, pool="flatten", length=16).train()
    val, test, _ = finetune(enc, 2, data, FinetuneConfig(epochs=6, lr=3e-3, batch_size=16), seed=0)
    assert val >= 0.9 and test >= 0.85


def _toy_finetune_data():
    seqs, labels = toy_sequences(96, 16, seed=0)
    ids, mask = encode_batch(TOK, seqs)
    y = torch.from_numpy(labels)
    return {"train": (ids[:64], mask[:64], y[:64]), "val": (ids[64:80], mask[64:80], y[64:80]),
            "test": (ids[80:], mask[80:], y[80:])}


def test_head_epochs_leave_the_encoder_bit_identical_and_train_the_head():
    """LP-FT's first phase: with weight decay on, a frozen encoder must still not move (no grads, so AdamW
    skips it); the head must."""
    from seqdiff.probes.finetune import SequenceClassifier

    enc = BackboneEncoder(backbone(False), TOK.complement_ids).train()
    before = {k: v.clone() for k, v in enc.state_dict().items()}
    seen = {}
    original = SequenceClassifier.on_validation_epoch_end

    def spy(self):  # the head's weights after each epoch, and whether the encoder was frozen during it
        seen[self.current_epoch] = (self.head.weight.detach().clone(), self.encoder_frozen())
        original(self)

    def modes(self, batch, batch_idx):  # dropout inside the encoder only once it trains
        modes_seen.add((self.current_epoch, self.encoder.training, self.training))
        return original_step(self, batch, batch_idx)

    modes_seen, original_step = set(), SequenceClassifier.training_step
    SequenceClassifier.on_validation_epoch_end = spy
    SequenceClassifier.training_step = modes
    try:
        config = FinetuneConfig(epochs=0, head_epochs=2, lr=3e-3, batch_size=16, weight_decay=0.1)
        finetune(enc, 2, _toy_finetune_data(), config, seed=0)
        assert modes_seen == {(0, False, True), (1, False, True)}
        first_run, modes_seen = dict(seen), set()
        finetune(BackboneEncoder(backbone(False), TOK.complement_ids), 2, _toy_finetune_data(),
                 FinetuneConfig(epochs=1, head_epochs=1, head_init="probe", batch_size=16), seed=0)
        assert modes_seen == {(0, False, True), (1, True, True)}  # probe scoring's eval mode is not kept
    finally:
        SequenceClassifier.on_validation_epoch_end = original
        SequenceClassifier.training_step = original_step
    assert all(torch.equal(before[k], v) for k, v in enc.state_dict().items())
    assert first_run[0][1] and first_run[1][1] and not torch.equal(first_run[0][0], first_run[1][0])
    assert all(p.requires_grad for p in enc.parameters())  # handed back trainable


def test_encoder_moves_after_the_head_epochs_at_its_scaled_learning_rate():
    from seqdiff.probes.finetune import SequenceClassifier

    enc = BackboneEncoder(backbone(False), TOK.complement_ids).train()
    before = {k: v.clone() for k, v in enc.state_dict().items()}
    finetune(enc, 2, _toy_finetune_data(), FinetuneConfig(epochs=1, head_epochs=1, lr=3e-3, batch_size=16), seed=0)
    assert any(not torch.equal(before[k], v) for k, v in enc.state_dict().items())
    module = SequenceClassifier(enc, 2, lr=1e-3, encoder_lr_scale=0.1)
    head_group, encoder_group = module.configure_optimizers()["optimizer"].param_groups
    assert head_group["lr"] == pytest.approx(1e-3) and encoder_group["lr"] == pytest.approx(1e-4)
    assert len(encoder_group["params"]) == len(list(enc.parameters()))


@pytest.mark.parametrize("n_classes", [2, 3])
def test_probe_head_folds_the_standardized_logistic_regression_exactly(n_classes):
    """The head set from the frozen probe gives the same probabilities as scikit-learn's scaler + logistic
    regression on the same features (binary: logits (0, z)), and epochs=0 returns that probe as the model."""
    from seqdiff.probes.finetune import SequenceClassifier, fit_probe_head, frozen_features
    from seqdiff.probes.linear import fit_logistic_model

    data = _toy_finetune_data()
    if n_classes == 3:
        data = {k: (ids, mask, (ids[:, 0] % 3).long()) for k, (ids, mask, _) in data.items()}
    enc = BackboneEncoder(backbone(False), TOK.complement_ids)
    module = SequenceClassifier(enc, n_classes)
    choice = fit_probe_head(module.head, enc, data, seed=0)
    feats = {s: frozen_features(enc, ids, mask) for s, (ids, mask, _) in data.items()}
    labels = {s: y.numpy() for s, (_, _, y) in data.items()}
    scaler, model, again = fit_logistic_model(feats, labels, seed=0)
    expected = model.predict_proba(scaler.transform(feats["test"]))
    with torch.no_grad():
        got = torch.softmax(module.head(torch.from_numpy(feats["test"]).float()), -1).numpy()
    assert choice == again and np.allclose(got, expected, atol=1e-4)
    val, test, epoch = finetune(enc, n_classes, data, FinetuneConfig(epochs=0, head_init="probe"), seed=0)
    assert epoch == -1 and val == pytest.approx(choice["val_accuracy"])
    assert test == pytest.approx(float((model.predict(scaler.transform(feats["test"])) == labels["test"]).mean()))


def test_fine_tuning_from_the_probe_head_keeps_the_probe_when_validation_says_so():
    data = _toy_finetune_data()
    enc = BackboneEncoder(backbone(False), TOK.complement_ids).train()
    val, _, epoch = finetune(enc, 2, data, FinetuneConfig(epochs=2, lr=1e-3, head_init="probe"), seed=0)
    probe_val, _, _ = finetune(BackboneEncoder(backbone(False), TOK.complement_ids), 2, data,
                               FinetuneConfig(epochs=0, head_init="probe"), seed=0)
    assert val >= probe_val and -1 <= epoch < 2


def test_finetune_config_refuses_no_epochs_and_negative_scales():
    with pytest.raises(ValueError, match="at least one epoch"):
        FinetuneConfig(epochs=0, head_epochs=0)
    with pytest.raises(ValueError, match="encoder_lr_scale"):
        FinetuneConfig(encoder_lr_scale=-1.0)
    with pytest.raises(ValueError, match="head_init 'zeros' is unknown"):
        FinetuneConfig(head_init="zeros")
    FinetuneConfig(epochs=0, head_init="probe")  # the probe alone is a model


# ------------------------------------------------------------------------------------------- CLI
@pytest.fixture(scope="module")
def dna_run(tmp_path_factory):
    from seqdiff.cli import main

    root = tmp_path_factory.mktemp("dna")
    fixture = "tests/fixtures/grch37_chr20_slices.fa"
    import shutil

    fa = root / "slices.fa"
    shutil.copy(fixture, fa)
    assert main(["train", "--run-dir", str(root / "mdlm"), "model.preset=test", "model.max_seq_len=64",
                 "data.kind=fasta", "data.tokenizer=nucleotide", f"data.fasta={fa}", "data.split_mode=bed",
                 "data.bed=tests/fixtures/grch37_chr20_slices.bed", "data.seq_len=64", "data.batch_size=4",
                 "train.max_steps=2", "train.val_every=2", "train.val_batches=1", "train.progress_bar=false"]) == 0
    return root


def test_probe_command_end_to_end(dna_run, tmp_path, capsys):
    from seqdiff.cli import main

    seqs, labels = toy_sequences(80, 70, seed=1)  # longer than the model's 64-base context: cut, counted
    table = tmp_path / "toy.csv"
    table.write_text("sequence,label\n" + "".join(f"{s},{'gc' if y else 'at'}\n" for s, y in zip(seqs, labels)))
    out = tmp_path / "reports"
    assert main(["probe", str(dna_run / "mdlm"), "--benchmark", str(table), "--seeds", "2", "--finetune-seeds", "1",
                 "--epochs", "1", "--cnn-epochs", "1", "--layer", "best", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    report = json.loads((out / "toy.json").read_text())
    kinds = [(r["probe"], r["pretrained"]) for r in report["rows"]]
    assert kinds == [("frozen", True), ("frozen", False), ("kmer", None), ("onehot", None), ("cnn", None),
                     ("finetune", True), ("finetune", False)]  # the costliest rows last
    frozen = report["rows"][0]
    assert frozen["seeds"] == 2 and len(frozen["test_accuracy"]) == 2 and report["rows"][5]["seeds"] == 1
    assert frozen["context"] == 64 and frozen["truncated_sequences"] == 80  # every sequence (70 > 64)
    assert frozen["test_accuracy_min"] <= frozen["test_accuracy_mean"] <= frozen["test_accuracy_max"]
    assert all(choice["layer"] in (0, 1, "final") for choice in frozen["selected"])  # test preset: 2 layers
    assert report["rows"][2]["test_accuracy_mean"] > 0.9  # k-mer counts see GC content directly
    assert report["notes"] == []  # complete: no PARTIAL note
    md = (out / "toy.md").read_text()
    assert md.startswith("# Probes on toy") and "seqdiff probe " in md and "| k-mer" in md
    assert "test accuracy % mean" in printed
    assert (out / "toy.png").stat().st_size > 1000 and len(report["goals"]) == 4  # random, k-mer, one-hot, tuned


def test_probe_command_small_data_check(dna_run, tmp_path, capsys):
    from seqdiff.cli import main

    seqs, labels = toy_sequences(80, 40, seed=2)
    table = tmp_path / "toy.csv"
    table.write_text("sequence,label\n" + "".join(f"{s},{'gc' if y else 'at'}\n" for s, y in zip(seqs, labels)))
    out = tmp_path / "reports"
    assert main(["probe", str(dna_run / "mdlm"), "--benchmark", str(table), "--seeds", "2", "--train-size", "20",
                 "--cv-folds", "3", "--mask-stride", "4", "--skip", "cnn", "random", "--epochs", "1",
                 "--layer", "concat", "--context-scales", "0", "1", "--out", str(out)]) == 0
    report = json.loads((out / "toy.json").read_text())
    assert report["settings"]["train_size"] == 20 and report["settings"]["cv_folds"] == 3
    assert report["settings"]["mask_stride"] == 4 and report["rows"][0]["mask_stride"] == 4
    assert report["rows"][0]["context_scales"] == [0.0, 1.0]
    assert all(choice["context_scale"] in (0.0, 1.0) for choice in report["rows"][0]["selected"])
    assert [r["probe"] for r in report["rows"]] == ["frozen", "kmer", "onehot", "finetune"]  # fine-tuning: masked too
    md = (out / "toy.md").read_text()
    assert "small-data check: each seed draws 20 training sequences" in md and "3-fold cross-validation" in md
    assert "masked reading: each base's features come from one of 4 passes" in md
    # more folds than a class has sequences, and one fold: refused before any report is written
    assert main(["probe", str(dna_run / "mdlm"), "--benchmark", str(table), "--train-size", "20",
                 "--cv-folds", "11", "--out", str(tmp_path / "none")]) == 2
    assert "probe.cv_folds=11: 11-fold cross-validation needs at least 11" in capsys.readouterr().err
    assert main(["probe", str(dna_run / "mdlm"), "--benchmark", str(table), "--cv-folds", "1",
                 "--out", str(tmp_path / "none")]) == 2
    assert "--cv-folds takes 0" in capsys.readouterr().err
    # too large a draw is refused before any report is written
    assert main(["probe", str(dna_run / "mdlm"), "--benchmark", str(table), "--train-size", "5000",
                 "--out", str(tmp_path / "none")]) == 2
    assert "train_size=5000: the training set has only" in capsys.readouterr().err
    assert not (tmp_path / "none").exists()


def test_goal_lines_compare_means():
    from seqdiff.probes.report import goal_lines

    def row(model, probe, pretrained, mean):
        return {"model": model, "probe": probe, "pretrained": pretrained, "test_accuracy_mean": mean}

    rows = [row("mdlm", "frozen", True, 0.90), row("mdlm", "finetune", True, 0.961), row("ar", "finetune", True, 0.5),
            row("random", "frozen", False, 0.92), row("k-mer", "kmer", None, 0.70)]
    goals = goal_lines(rows)
    assert goals[0].endswith("NOT met") and "random-init" in goals[0]  # 90 < 92
    assert goals[1].endswith("— met") and "k-mer" in goals[1]
    assert "mdlm: 96.10%" in goals[2] and goals[2].endswith("— met")


def test_probe_command_refuses_text_models_and_bad_names(tmp_path, capsys):
    from seqdiff.cli import main

    run = tmp_path / "text"
    fixture = "tests/fixtures/shakespeare_tiny.txt"
    assert main(["train", "--run-dir", str(run), "model.preset=test", "model.max_seq_len=64", "data.seq_len=32",
                 "data.batch_size=4", f"data.train_file={fixture}", f"data.valid_file={fixture}",
                 f"data.test_file={fixture}", "train.max_steps=1", "train.val_every=1", "train.val_batches=1",
                 "train.progress_bar=false"]) == 0
    capsys.readouterr()
    assert main(["probe", str(run), "--benchmark", "splice"]) == 2
    err = capsys.readouterr().err
    assert "'char'-tokenizer" in err and "need a DNA model" in err and err.count("\n") == 1
    assert main(["probe", "--benchmark", "no_such_benchmark"]) == 2
    assert "unknown benchmark 'no_such_benchmark'" in capsys.readouterr().err
    with pytest.raises(ProbeError, match="random-init baseline copies a checkpoint"):
        from seqdiff.probes.protocol import ProbeConfig, run_protocol

        run_protocol(None, [], ProbeConfig(), baselines=("random",))


def test_published_rows_are_printed_only_where_listed(monkeypatch):
    from seqdiff.probes import report

    assert "Genomic Benchmarks datasets only" in report.published_lines("splice")[0]
    monkeypatch.delitem(report.PUBLISHED, "human_nontata_promoters")
    assert "No published numbers" in report.published_lines("human_nontata_promoters")[0]
    row = report.PublishedRow("Some model", 0.9123, 0.004, "Paper 2024, Table 9")
    monkeypatch.setitem(report.PUBLISHED, "human_nontata_promoters", [row])
    lines = report.published_lines("human_nontata_promoters")
    assert lines[-1] == "| Some model | 91.2 | ±0.4 | Paper 2024, Table 9 |"


def test_every_genomic_benchmarks_dataset_has_its_published_rows_under_any_name():
    """Each of the eight datasets: the benchmark's CNN and Caduceus Table 1's four rows, each citing its source;
    a short alias finds the same rows."""
    from seqdiff.probes import report
    from seqdiff.probes.genomic_benchmarks import DATASETS

    assert set(report.PUBLISHED) == set(DATASETS)
    for rows in report.PUBLISHED.values():
        assert [r.model for r in rows][1:] == ["CNN", "HyenaDNA", "Caduceus-Ph", "Caduceus-PS"]
        assert all(0.5 < r.accuracy < 1 and r.citation for r in rows)
    lines = report.published_lines("dummy_mouse_enhancers")
    assert "| Caduceus-PS | 79.3 | ±5.8 |" in lines[-1] and len(lines) == 2 + 5


@pytest.mark.parametrize("causal", [False, True])
def test_all_layers_in_one_pass_match_layer_by_layer(causal):
    model = backbone(causal, n_layers=3)
    seqs = ["ACGTACGTAA", "GGCCA", "TTTTGCA"]
    both = embed_sequences(BackboneEncoder(model, TOK.complement_ids, all_layers=True, rc_average=True), TOK, seqs)
    assert both.shape == (3, 4, 32)
    for i, layer in enumerate([0, 1, 2, None]):
        one = embed_sequences(BackboneEncoder(model, TOK.complement_ids, layer=layer, rc_average=True), TOK, seqs)
        np.testing.assert_allclose(both[:, i], one, atol=1e-5, rtol=1e-5)


def test_flatten_pooling_keeps_positions_and_zeroes_padding():
    model = backbone(False)
    seqs = ["ACGTAC", "GGC"]
    enc = BackboneEncoder(model, TOK.complement_ids, pool="flatten", length=8)
    out = embed_sequences(enc, TOK, seqs)
    assert out.shape == (2, 8 * 32) and enc.out_features == 8 * 32
    ids, mask = encode_batch(TOK, seqs, 8)
    with torch.no_grad():
        hidden = model.hidden_states(ids, attention_mask=mask)  # (2, 8, 32)
    np.testing.assert_allclose(out.reshape(2, 8, 32)[0, :6], hidden[0, :6].numpy(), atol=1e-5, rtol=1e-5)
    assert not out.reshape(2, 8, 32)[1, 3:].any()  # padding positions are zero
    with pytest.raises(ProbeError, match="needs the padded length"):
        BackboneEncoder(model, TOK.complement_ids, pool="flatten")
    with pytest.raises(ProbeError, match="pooling 'max' is unknown"):
        BackboneEncoder(model, TOK.complement_ids, pool="max")


@pytest.mark.parametrize("rc_average", [False, True])
@pytest.mark.parametrize("layer", [None, 1, "all"])
def test_masked_reading_takes_each_position_from_the_pass_that_masked_it(layer, rc_average):
    """mask_stride K, brute force: position i's states are those of the sequence with every real position
    j = i (mod K) replaced by MASK, read at i; padding stays padding and zero; every layer and both strands."""
    model = backbone(False, n_layers=2)
    seqs, K, L = ["ACGTACGTAA", "GGCCA", "TTTTGCA"], 3, 10
    enc = BackboneEncoder(model, TOK.complement_ids, layer=None if layer == "all" else layer, pool="flatten",
                          length=L, all_layers=layer == "all", mask_stride=K, mask_id=TOK.mask_id,
                          rc_average=rc_average)
    out = embed_sequences(enc, TOK, seqs).reshape(3, -1, L, 32)  # (N, layers, L, H)
    layers = [0, 1, None] if layer == "all" else [layer]

    def brute(ids, mask):  # (layers, B, L, H): each position from its own masked copy of the input
        want = torch.zeros(len(layers), *ids.shape, 32)
        for i in range(L):
            masked = torch.where(((torch.arange(L) % K) == i % K)[None] & mask, TOK.mask_id, ids)
            for n, lay in enumerate(layers):
                want[n, :, i] = model.hidden_states(masked, attention_mask=mask, layer=lay)[:, i]
        return want * mask[None, :, :, None]

    ids, mask = encode_batch(TOK, seqs, L)
    with torch.no_grad():
        want = brute(ids, mask)
        if rc_average:  # the other strand, masked by its own phase, flipped back to this strand's positions
            rc_ids = TOK.complement_ids[ids].flip(-1)
            want = 0.5 * (want + brute(rc_ids, mask.flip(-1)).flip(2))
    np.testing.assert_allclose(out, want.permute(1, 0, 2, 3).numpy(), atol=1e-5, rtol=1e-5)
    clean = embed_sequences(BackboneEncoder(model, TOK.complement_ids, pool="flatten", length=L), TOK, seqs)
    assert not np.allclose(out[:, -1].reshape(3, -1), clean, atol=1e-3)  # the reading does change the features
    with pytest.raises(ProbeError, match="give the tokenizer's mask_id"):
        BackboneEncoder(model, TOK.complement_ids, mask_stride=K)
    with pytest.raises(ProbeError, match="mask_stride takes 0"):
        BackboneEncoder(model, TOK.complement_ids, mask_stride=1, mask_id=TOK.mask_id)


def test_masked_reading_refuses_causal_and_time_conditioned_backbones():
    from seqdiff.probes.protocol import ProbeConfig, ProbeModel, check_masked_reading

    config = ProbeConfig(mask_stride=4)
    for model, why in ((backbone(True), "is causal and never saw a mask"),
                       (backbone(False, time_conditioning=True), "a time-conditioned backbone")):
        with pytest.raises(ProbeError, match=why):
            check_masked_reading(ProbeModel("m", model, TOK, "x", 0, ""), config)
    check_masked_reading(ProbeModel("m", backbone(False), TOK, "mdlm", 0, ""), config)


def test_skip_checkpoints_keeps_only_the_random_init_rows(dna_run, tmp_path):
    from seqdiff.cli import main

    seqs, labels = toy_sequences(40, 20, seed=2)
    table = tmp_path / "toy2.tsv"
    table.write_text("seq\tlabel\n" + "".join(f"{s}\t{y}\n" for s, y in zip(seqs, labels)))
    assert main(["probe", str(dna_run / "mdlm"), "--benchmark", str(table), "--seeds", "1", "--skip", "finetune",
                 "kmer", "onehot", "cnn", "checkpoints", "--pool", "flatten", "--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "toy2.json").read_text())["rows"]
    assert [(r["probe"], r["pretrained"], r["pool"]) for r in rows] == [("frozen", False, "flatten")]


def test_concat_layer_probe_reads_every_layer_side_by_side():
    """layer=concat: one logistic regression on [embeddings, block outputs, final] of each sequence, the same
    numbers as fitting on the per-layer features concatenated by hand."""
    from seqdiff.probes.data import LabeledSequences
    from seqdiff.probes.protocol import ProbeConfig, ProbeModel, Split, _frozen, _frozen_features

    model = ProbeModel("toy", backbone(False, n_layers=2), TOK, "mdlm", 0, "-")
    seqs, labels = toy_sequences(60, 12, seed=4)
    split = Split(*(LabeledSequences(seqs[a:b], labels[a:b]) for a, b in ((0, 30), (30, 40), (40, 60))))
    config = ProbeConfig(layer="concat", pool="flatten")
    feats = _frozen_features(model, split, config)
    assert feats["train"].shape == (30, 3, 12 * 32)  # embeddings, block 1, final; 12 positions x 32 wide
    by_layer = [_frozen_features(model, split, ProbeConfig(layer=layer, pool="flatten")) for layer in (0, 1, None)]
    for name in ("train", "val", "test"):
        np.testing.assert_allclose(feats[name].reshape(len(feats[name]), -1),
                                   np.concatenate([f[name][:, 0] for f in by_layer], axis=1), atol=1e-5)
    picked = _frozen(model, split, 0, config)
    by_hand = fit_logistic({k: v.reshape(len(v), -1) for k, v in feats.items()}, split.labels(), 0)
    assert picked.choice["layer"] == "concat" and picked.test_accuracy == by_hand.test_accuracy
    assert picked.val_accuracy == by_hand.val_accuracy


def test_concat_encoder_is_the_layers_side_by_side_and_fine_tunes():
    """The fine-tuning encoder of layer=concat returns, per sequence, the frozen probe's concatenated features
    (embeddings, block outputs, final), and trains end to end with the probe head folded in (LP-FT)."""
    model = backbone(False, n_layers=2)
    seqs = ["ACGTACGTAA", "GGCCAATTGC"]
    enc = BackboneEncoder(model, TOK.complement_ids, pool="flatten", length=10, concat_layers=True, rc_average=True)
    layers = BackboneEncoder(model, TOK.complement_ids, pool="flatten", length=10, all_layers=True, rc_average=True)
    out, stacked = embed_sequences(enc, TOK, seqs), embed_sequences(layers, TOK, seqs)
    assert out.shape == (2, 3 * 10 * 32) and enc.out_features == 3 * 10 * 32
    np.testing.assert_allclose(out, stacked.reshape(2, -1), atol=1e-6)
    data = _toy_finetune_data()
    enc = BackboneEncoder(backbone(False, n_layers=2), TOK.complement_ids, pool="flatten", length=16,
                          concat_layers=True).train()
    val, test_pred, epoch = finetune_predict(enc, 2, data, FinetuneConfig(epochs=1, lr=1e-3, batch_size=16,
                                                                        head_init="probe"), seed=0)
    assert epoch in (-1, 0) and val >= 0.9  # composition is separable: the folded probe head already is
    assert test_pred.shape == (16,) and (test_pred == data["test"][2].numpy()).mean() >= 0.8


@pytest.mark.parametrize("n_classes", [2, 3])
def test_logistic_regression_in_the_row_span_is_the_full_solution(n_classes):
    """More features than rows: the L2-regularized regression solved in the span of the training rows has the
    optimum of the solve in all F features (to 1e-9, both solved tightly), and fit_logistic_model's fast path
    agrees with its full path to the solver's default tolerance: same C, same predictions."""
    from sklearn.linear_model import LogisticRegression

    from seqdiff.probes.linear import fit_logistic_model, row_space

    rng = np.random.default_rng(0)
    n, f = 60, 400
    w = rng.normal(size=(f, n_classes))
    feats = {s: rng.normal(size=(m, f)) for s, m in (("train", n), ("val", 30), ("test", 30))}
    labels = {s: (x @ w + rng.normal(scale=3.0, size=(len(x), n_classes))).argmax(1) for s, x in feats.items()}
    basis = row_space(feats["train"])
    assert basis.shape == (n, f) and np.allclose(basis @ basis.T, np.eye(n), atol=1e-10)
    assert row_space(feats["train"][:, :50]) is None  # more rows than features: nothing to gain
    x, y = feats["train"], labels["train"]
    for c in (0.01, 1.0, 10.0):  # the math: the same optimum
        tight = {"C": c, "tol": 1e-12, "max_iter": 100_000}
        full = LogisticRegression(**tight).fit(x, y)
        reduced = LogisticRegression(**tight).fit(x @ basis.T, y)
        np.testing.assert_allclose(reduced.coef_ @ basis, full.coef_, atol=1e-9)
        np.testing.assert_allclose(reduced.intercept_, full.intercept_, atol=1e-9)
    # the fast path of fit_logistic_model (standardized features, default tolerance) lands on that optimum
    # to within the solver's tolerance; so does the full path it replaces (on a grid, C values that tie on
    # validation may swap between the two, and a borderline prediction may flip)
    scaler, fast, choice = fit_logistic_model(feats, labels, seed=0, c_grid=(1.0,))
    _, slow, _ = fit_logistic_model(feats, labels, seed=0, c_grid=(1.0,), reduce=False)
    exact = LogisticRegression(C=1.0, tol=1e-12, max_iter=100_000).fit(scaler.transform(x), y)
    assert choice["C"] == 1.0 and fast.coef_.shape == exact.coef_.shape == (1 if n_classes == 2 else 3, f)
    scale = np.abs(exact.coef_).max()
    for model in (fast, slow):
        np.testing.assert_allclose(model.coef_, exact.coef_, atol=1e-2 * scale)
    assert fast.n_features_in_ == f and fast.predict(scaler.transform(feats["test"])).shape == (30,)
