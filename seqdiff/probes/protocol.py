"""The evaluation protocol of Caduceus and MDLM on Genomic Benchmarks, for every probe and baseline:

for each of `seeds` seeds, a random stratified 90/10 split of the training set into train / validation;
hyperparameters (C, k, the fine-tuning epoch) are chosen on validation; the chosen model is scored once
on the test set. For small data sets the linear rows can choose by K-fold cross-validation over train and
validation instead (`ProbeConfig.cv_folds`). A row reports the benchmark's headline test metric (top-1
accuracy unless the benchmark declares another, `metrics.METRICS`) as the mean and the range (min, max) over
seeds; accuracy is always recorded too. Selection stays on validation accuracy whatever the headline.

Rows (the `PROBES` registry, one function per kind of row):
- `frozen`    a checkpoint's backbone, frozen; mean-pooled embeddings -> logistic regression
- `finetune`  the same backbone + a linear head, trained end to end (Lightning)
- `kmer`      k-mer frequencies (k = 3..6) -> logistic regression
- `onehot`    which base sits at each position (one-hot, flattened) -> logistic regression
- `cnn`       the Genomic Benchmarks CNN, trained from scratch
A randomly initialized copy of the first checkpoint's backbone (same config) gets `frozen` and `finetune`
rows too, to show what pretraining adds.
"""

from __future__ import annotations

import copy
import dataclasses
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from seqdiff.backbones import build_backbone
from seqdiff.checkpoint import load_checkpoint
from seqdiff.probes.cnn import GenomicBenchmarksCNN, too_short
from seqdiff.probes.data import (
    Benchmark,
    LabeledSequences,
    ProbeError,
    stratified_split,
    stratified_subsample,
    truncate,
)
from seqdiff.probes.embeddings import BackboneEncoder, embed_sequences, encode_batch
from seqdiff.probes.finetune import FinetuneConfig, finetune_predict
from seqdiff.probes.linear import Selected, accuracy, check_folds, fit_kmer, fit_logistic, fit_onehot
from seqdiff.probes.metrics import score
from seqdiff.tokenizers.nucleotide import NucleotideTokenizer

VAL_FRACTION = 0.1
BEST_LAYER = "best"
CONCAT_LAYER = "concat"
ALL_LAYER_MODES = (BEST_LAYER, CONCAT_LAYER)
"""Layer modes that read every layer in one pass: choose one on validation, or concatenate them all."""
RANDOM_INIT_SEED = 1000
"""Seed s of the protocol initializes the random-init backbone with RANDOM_INIT_SEED + s."""


@dataclass
class ProbeConfig:
    seeds: int = 5
    """Seeds of the protocol: each draws its own 90/10 train / validation split (and initialization)."""
    finetune_seeds: int | None = None
    """Seeds for the trained rows (finetune, cnn); None = `seeds`. Fewer saves CPU time; the report says so."""
    layer: int | str | None = None
    """Layer the frozen probe reads (0 = embeddings, n_layers = last block; None = final output; "best" = chosen
    on validation among all; "concat" = every layer side by side, so that the embeddings' base identity and the
    deeper layers' context reach one probe; fine-tuning then trains a head on that concatenation). Fine-tuning
    pools the final output for None and "best"."""
    rc_average: bool = False
    """Average each embedding with its reverse complement's."""
    rc_both: bool = False
    """Keep both strands' features side by side instead (twice the features; seqdiff.probes.embeddings)."""
    pool: str = "mean"
    """Pooling of the frozen probe and of the fine-tuning head: "mean" over real positions, or "flatten" (every
    position's state side by side, padding zeroed; a position-aware head for motifs at fixed offsets)."""
    finetune: FinetuneConfig = field(default_factory=FinetuneConfig)
    cnn: FinetuneConfig = field(default_factory=lambda: FinetuneConfig(epochs=10, lr=1e-3, dropout=0.0))
    """Training of the CNN baseline (the Genomic Benchmarks experiments used Adam at 1e-3)."""
    train_size: int | None = None
    """Small-data check: each seed first draws this many training sequences (stratified, its own draw), then
    splits them 90/10; the test set is unchanged. None: the whole training set."""
    mask_stride: int = 0
    """K >= 2: read each position's states from a pass where it is masked (K passes; seqdiff.probes.embeddings),
    for the frozen and fine-tuned rows alike; 0: the clean sequence."""
    context_scales: tuple[float, ...] = ()
    """With layer "concat": candidate weights of the blocks' features (every layer but the token embeddings), applied
    after standardization and chosen with C on validation (or by cross-validation). 0 is the embeddings alone,
    which for bases is the one-hot model up to the embedding's linear map; 1 the plain concatenation. Why: one L2
    penalty over the blocks' thousands of features and the embeddings' few lets the context swamp the base identity
    on small data; with 0 in the grid the probe can only lose to the embeddings alone by selection noise, so what it
    gains over them is what the context layers add. Empty: the plain concatenation."""
    cv_folds: int = 0
    """> 1: the linear rows (frozen, k-mer, one-hot) choose C, the layer and k by stratified K-fold cross-validation
    over the seed's train and validation rows pooled, then refit on all of them (seqdiff.probes.linear; for small data
    sets, where 10% is a handful of sequences). The trained rows (fine-tune, CNN) keep the 90/10 split, which
    their epoch choice needs. 0: every row chooses on the 90/10 split."""
    device: str = "cpu"


@dataclass
class ProbeModel:
    """A backbone under test: loaded from a checkpoint, or randomly initialized."""

    name: str
    backbone: nn.Module
    tokenizer: Any
    method: str
    step: int
    path: str
    pretrained: bool = True


@dataclass
class Split:
    """One seed's data: train / val / test `LabeledSequences` (already truncated to the context)."""

    train: LabeledSequences
    val: LabeledSequences
    test: LabeledSequences

    def sequences(self) -> dict[str, list[str]]:
        return {"train": self.train.sequences, "val": self.val.sequences, "test": self.test.sequences}

    def labels(self) -> dict[str, np.ndarray]:
        return {"train": self.train.labels, "val": self.val.labels, "test": self.test.labels}


def seed_split(bench: Benchmark, seed: int, context: int, train_size: int | None = None) -> tuple[Split, int]:
    """(the seed's 90/10 split with every sequence cut to `context` by the benchmark's rule, number cut).

    With `train_size`, the split is made from a stratified draw of that many training sequences (seeded by
    `seed`, so every row of a seed sees the same small set)."""
    pool = bench.train
    if train_size is not None:
        pool = pool.subset(stratified_subsample(pool.labels, train_size, seed))
    train_idx, val_idx = stratified_split(pool.labels, VAL_FRACTION, seed)
    n_cut = 0
    parts = []
    for data in (pool.subset(train_idx), pool.subset(val_idx), bench.test):
        seqs, cut = truncate(data.sequences, context, bench.truncation)
        parts.append(LabeledSequences(seqs, data.labels))
        n_cut += cut
    return Split(*parts), n_cut


# -------------------------------------------------------------------------------------------- row kinds
def _frozen(model: ProbeModel, split: Split, seed: int, config: ProbeConfig):
    best = None
    feats = _frozen_features(model, split, config)  # split -> (N, n_candidate_layers, H)
    layers = candidate_layers(model.backbone, config.layer)
    for i, layer in enumerate(layers):
        chosen = {k: v.reshape(len(v), -1) if layer == CONCAT_LAYER else v[:, i] for k, v in feats.items()}
        scales = config.context_scales if layer == CONCAT_LAYER and config.context_scales else (None,)
        for scale in scales:
            weights = None if scale is None else context_weights(feats["train"].shape[1:], scale)
            result = fit_logistic(chosen, split.labels(), seed, folds=config.cv_folds, weights=weights)
            if best is None or result.val_accuracy > best.val_accuracy:
                extra = {} if scale is None else {"context_scale": scale}
                best = Selected(result.val_accuracy, result.test_accuracy,
                                {"layer": "final" if layer is None else layer, **extra, **result.choice},
                                result.test_pred)
    return best


def context_weights(shape: tuple[int, int], scale: float) -> np.ndarray:
    """Feature weights of a concatenation of (n_layers + 1, F) features, layer-major: 1 for the token embeddings
    (layer 0), `scale` for every block's output (ProbeConfig.context_scales)."""
    weights = np.full(shape, float(scale))
    weights[0] = 1.0
    return weights.reshape(-1)


def candidate_layers(backbone: nn.Module, layer: int | str | None) -> list[int | None]:
    """The layers a frozen probe tries: the one asked for, or with "best" the token embeddings (0), the outputs
    of blocks 1 .. n_layers - 1 and the final output (None); validation accuracy picks among them."""
    if layer == BEST_LAYER:
        return [*range(backbone.config.n_layers), None]
    return [layer]  # an integer, None (the final output) or CONCAT_LAYER (every layer side by side)


def _frozen_features(model: ProbeModel, split: Split, config: ProbeConfig) -> dict[str, np.ndarray]:
    best = config.layer in ALL_LAYER_MODES  # every layer in one pass: (N, n_layers + 1, H)
    length = max(len(s) for seqs in split.sequences().values() for s in seqs)  # the same for every seed
    encoder = BackboneEncoder(model.backbone, model.tokenizer.complement_ids, None if best else config.layer,
                              config.rc_average, all_layers=best, pool=config.pool, length=length,
                              rc_both=config.rc_both, **_masked_reading(model, config))
    # a frozen backbone embeds a sequence the same way for every seed: embed each distinct sequence once
    cache = _EMBEDDINGS.setdefault((model.backbone, config.layer, config.rc_average, config.rc_both, config.pool,
                                    config.mask_stride), {})
    missing = sorted({s for seqs in split.sequences().values() for s in seqs} - cache.keys())
    if missing:
        vectors = embed_sequences(encoder, model.tokenizer, missing, device=config.device)
        cache.update(zip(missing, vectors if best else vectors[:, None]))  # (n_layers + 1, H) or (1, H)
    return {k: np.stack([cache[s] for s in seqs]) for k, seqs in split.sequences().items()}


_EMBEDDINGS: dict[tuple, dict[str, np.ndarray]] = {}
"""Frozen embeddings by (backbone (hashed by identity, kept alive), layer, rc_average, rc_both, pool, mask_stride)
and sequence; cleared after each row."""


def check_masked_reading(model: ProbeModel, config: ProbeConfig) -> None:
    """mask_stride needs a backbone trained on masked input without a noise input: refused otherwise."""
    if not config.mask_stride:
        return
    if model.backbone.causal:
        raise ProbeError(f"probe.mask_stride reads states at masked positions; {model.name} is causal and never saw a "
                         "mask in training: probe it without mask_stride")
    if model.backbone.config.time_conditioning:
        raise ProbeError(f"probe.mask_stride on {model.name}, a time-conditioned backbone, would need the noise level "
                         "of a 1/K mask rate, which the probe does not know: probe it without mask_stride")


def _masked_reading(model: ProbeModel, config: ProbeConfig) -> dict[str, Any]:
    """BackboneEncoder's mask_stride / mask_id (nothing without a stride)."""
    return {"mask_stride": config.mask_stride, "mask_id": model.tokenizer.mask_id} if config.mask_stride else {}


def _tensors(tokenizer, split: Split, length: int | None = None) -> dict[str, tuple]:
    out = {}
    for name, data in (("train", split.train), ("val", split.val), ("test", split.test)):
        ids, mask = encode_batch(tokenizer, data.sequences, length)
        out[name] = (ids, mask, torch.from_numpy(data.labels))
    return out


def _finetune(model: ProbeModel, split: Split, seed: int, config: ProbeConfig):
    length = max(len(s) for seqs in split.sequences().values() for s in seqs)  # flatten: one padded length
    encoder = BackboneEncoder(copy.deepcopy(model.backbone).train(), model.tokenizer.complement_ids,
                              None if config.layer in ALL_LAYER_MODES else config.layer, config.rc_average,
                              pool=config.pool, length=length, concat_layers=config.layer == CONCAT_LAYER,
                              rc_both=config.rc_both, **_masked_reading(model, config))
    n_classes = int(split.train.labels.max()) + 1
    tensors = _tensors(model.tokenizer, split, length if config.pool == "flatten" else None)
    val, pred, epoch = finetune_predict(encoder, n_classes, tensors, config.finetune, seed,
                                        accelerator=_accelerator(config.device))
    return _selected(val, pred, split, {"epoch": epoch + 1})


def _selected(val: float, test_pred: np.ndarray, split: Split, choice: dict[str, Any]):
    return Selected(val, accuracy(test_pred, split.test.labels), choice, test_pred)


def _kmer(model: ProbeModel | None, split: Split, seed: int, config: ProbeConfig):
    return fit_kmer(split.sequences(), split.labels(), seed, folds=config.cv_folds)


def _onehot(model: ProbeModel | None, split: Split, seed: int, config: ProbeConfig):
    return fit_onehot(split.sequences(), split.labels(), seed, folds=config.cv_folds)


def _cnn(model: ProbeModel | None, split: Split, seed: int, config: ProbeConfig):
    tokenizer = NucleotideTokenizer()
    length = max(len(s) for seqs in split.sequences().values() for s in seqs)
    torch.manual_seed(seed)
    cnn = GenomicBenchmarksCNN(tokenizer.vocab_size, length)
    n_classes = int(split.train.labels.max()) + 1
    val, pred, epoch = finetune_predict(cnn, n_classes, _tensors(tokenizer, split, length), config.cnn, seed,
                                        accelerator=_accelerator(config.device))
    return _selected(val, pred, split, {"epoch": epoch + 1})


def cnn_input_len(bench: Benchmark) -> int:
    """The padded length the CNN row builds its network for (`_cnn`): the longest sequence, cut to the context."""
    return min(bench.max_len, max(len(s) for s in bench.train.sequences + bench.test.sequences))


def _accelerator(device: str) -> str:
    return "cpu" if device == "cpu" else "gpu"


@dataclass(frozen=True)
class RowKind:
    run: Callable[..., Any]
    """(model or None, split, seed, config) -> linear.Selected"""
    trained: bool
    """Trained rows use `finetune_seeds`."""
    label: str


PROBES: dict[str, RowKind] = {
    "frozen": RowKind(_frozen, False, "frozen probe (mean pool + logistic regression)"),
    "finetune": RowKind(_finetune, True, "fine-tuned (backbone + linear head)"),
    "kmer": RowKind(_kmer, False, "k-mer (k=3..6) + logistic regression"),
    "onehot": RowKind(_onehot, False, "one-hot bases by position + logistic regression"),
    "cnn": RowKind(_cnn, True, "Genomic Benchmarks CNN"),
}


# ------------------------------------------------------------------------------------------------ runner
def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def random_init_like(model: ProbeModel, seed: int) -> ProbeModel:
    """The same backbone architecture with fresh random weights (seeded)."""
    torch.manual_seed(seed)
    cfg = model.backbone.config
    backbone = build_backbone(cfg, model.backbone.vocab_size, causal=model.backbone.causal,
                              complement_ids=getattr(model.backbone, "complement_ids", None)).eval()
    return dataclasses.replace(model, name=f"random init ({model.name} architecture)", backbone=backbone,
                               method="none", step=0, path="", pretrained=False)


def headline_score(bench: Benchmark, result, split: Split) -> float:
    """The benchmark's headline metric of one seed's test predictions (its accuracy when the headline is
    accuracy, so rows of accuracy benchmarks are exactly as before)."""
    if bench.metric == "accuracy":
        return result.test_accuracy
    if result.test_pred is None:
        raise ProbeError(f"{bench.name}: the {bench.metric} metric needs the test predictions, which this row "
                         "kind did not keep")
    return score(bench.metric, split.test.labels, result.test_pred, len(bench.classes))


def context_of(model: ProbeModel | None, bench: Benchmark) -> int:
    if model is None:
        return bench.max_len
    return min(bench.max_len, int(model.backbone.config.max_seq_len))


def run_row(kind: str, model: ProbeModel | None, bench: Benchmark, config: ProbeConfig,
            log: Callable[[str], None] = _stderr, random_init_of: ProbeModel | None = None) -> dict[str, Any]:
    """One row of the table: `kind` over every seed. `random_init_of`: a fresh random copy per seed."""
    row_kind = PROBES[kind]
    n_seeds = (config.finetune_seeds or config.seeds) if row_kind.trained else config.seeds
    subject = random_init_like(random_init_of, RANDOM_INIT_SEED) if random_init_of is not None else model
    context = context_of(subject, bench)
    name = subject.name if subject is not None else row_kind.label
    results, headline, n_cut, start = [], [], 0, time.perf_counter()
    for seed in range(n_seeds):
        split, n_cut = seed_split(bench, seed, context, config.train_size)
        this = random_init_like(random_init_of, RANDOM_INIT_SEED + seed) if random_init_of is not None else model
        r = row_kind.run(this, split, seed, config)
        results.append(r)
        headline.append(headline_score(bench, r, split))
        extra = "" if bench.metric == "accuracy" else f" {bench.metric} {headline[-1]:.4f}"
        log(f"  {kind:<8} {name}: seed {seed} val {r.val_accuracy:.4f} test {r.test_accuracy:.4f}{extra} {r.choice}")
    _EMBEDDINGS.clear()
    test = np.array([r.test_accuracy for r in results])
    row = {
        "model": name, "probe": kind, "description": row_kind.label,
        "method": subject.method if subject is not None else None,
        "checkpoint": subject.path if subject is not None else None,
        "step": subject.step if subject is not None else None,
        "pretrained": subject.pretrained if subject is not None else None,
        "seeds": n_seeds, "context": context, "truncated_sequences": n_cut,
        "test_accuracy_mean": float(test.mean()), "test_accuracy_min": float(test.min()),
        "test_accuracy_max": float(test.max()),
        "test_accuracy": [r.test_accuracy for r in results],
        "val_accuracy": [r.val_accuracy for r in results],
        "selected": [r.choice for r in results],
        "seconds": round(time.perf_counter() - start, 1),
        "metric": bench.metric,
    }
    if bench.metric != "accuracy":
        scores = np.array(headline)
        row.update({f"test_{bench.metric}_mean": float(scores.mean()), f"test_{bench.metric}_min": float(scores.min()),
                    f"test_{bench.metric}_max": float(scores.max()), f"test_{bench.metric}": headline})
    if kind == "frozen":
        row.update({"layer": config.layer, "rc_average": config.rc_average, "rc_both": config.rc_both,
                    "pool": config.pool, "mask_stride": config.mask_stride,
                    "context_scales": list(config.context_scales)})
    return row


def run_protocol(bench: Benchmark, models: list[ProbeModel], config: ProbeConfig,
                 probes: tuple[str, ...] = ("frozen", "finetune"),
                 baselines: tuple[str, ...] = ("random", "kmer", "onehot", "cnn"),
                 log: Callable[[str], None] = _stderr,
                 on_row: Callable[[list[dict[str, Any]], int], None] | None = None) -> list[dict[str, Any]]:
    """Every row: frozen probes (each model, then the random init of models[0]), the k-mer and CNN baselines,
    then the fine-tuned rows (the costliest last). `on_row(rows so far, total)` is called after each row, so a
    caller can write partial reports. "checkpoints" in `baselines` skips the checkpoints' own rows (they then
    only lend their architecture to the random-init baseline).

    Refused before any row runs: unknown kinds, no rows at all, a training split with no class of two sequences (the
    validation split would be empty), too many cross-validation folds, and sequences too short for the CNN when it
    is the only row; alongside other rows such a CNN row is left out, with a line on `log` and a note appended to
    `bench.notes` (which the report lists)."""
    unknown = sorted(set(probes) - {"frozen", "finetune"}) + sorted(set(baselines) - {"random", "kmer", "onehot",
                                                                                     "cnn", "checkpoints"})
    if unknown:
        raise ProbeError(f"unknown probe or baseline {unknown}; probes: frozen, finetune; baselines: random, kmer, "
                         "onehot, cnn")
    for model in models:  # before any row runs (and any report is written)
        check_masked_reading(model, config)
    if "random" in baselines and not models:
        raise ProbeError("the random-init baseline copies a checkpoint's architecture: give at least one checkpoint")
    if config.train_size is None and len(bench.train) and np.bincount(bench.train.labels).max() < 2:
        raise ProbeError(f"{bench.source or bench.name}: the training split holds one sequence of each class "
                         f"({len(bench.train)} in all); the protocol's 90/10 train/validation split needs at least 2 "
                         "sequences of some class")
    if config.cv_folds > 1:
        pool = bench.train.labels
        if config.train_size is not None:  # the class counts of a draw do not depend on its seed
            pool = pool[stratified_subsample(pool, config.train_size, seed=0)]
        check_folds(pool, config.cv_folds)
    plan: list[tuple[str, ProbeModel | None, ProbeModel | None]] = []  # (kind, model, random init of)
    for kind in ("frozen", "kmer", "onehot", "cnn", "finetune"):
        if kind in probes:
            plan += [(kind, model, None) for model in models if "checkpoints" not in baselines]
            if "random" in baselines:
                plan.append((kind, None, models[0]))
        elif kind in baselines:
            plan.append((kind, None, None))
    why = too_short(cnn_input_len(bench)) if any(kind == "cnn" for kind, _, _ in plan) else None
    if why is not None:  # the other rows are still valid: the CNN row is left out, and the report says why
        plan = [step for step in plan if step[0] != "cnn"]
        if not plan:
            raise ProbeError(f"{bench.source or bench.name}: {why}, and the CNN baseline is the only row asked for")
        note = f"CNN baseline row skipped: {why}"
        log(f"{bench.name}: {note}")
        if note not in bench.notes:
            bench.notes.append(note)  # write_report lists the benchmark's notes
    if not plan:
        raise ProbeError("no rows to run: the frozen and fine-tuned rows need a checkpoint, and every baseline was "
                         "skipped")
    rows: list[dict[str, Any]] = []
    for kind, model, random_of in plan:
        rows.append(run_row(kind, model, bench, config, log, random_init_of=random_of))
        if on_row is not None:
            on_row(rows, len(plan))
    return rows


def load_probe_model(path: str, device: str = "cpu", use_ema: bool = True) -> ProbeModel:
    """A checkpoint's backbone for probing; a model whose tokenizer is not nucleotide is refused."""
    loaded = load_checkpoint(path, device=device, use_ema=use_ema)
    if loaded.tokenizer.kind != "nucleotide":
        raise ProbeError(f"{path} is a {loaded.tokenizer.kind!r}-tokenizer ({loaded.method.name}) model; genomic "
                         f"probes need a DNA model trained with the nucleotide tokenizer")
    name = f"{loaded.method.name} ({path})"
    return ProbeModel(name=name, backbone=loaded.backbone, tokenizer=loaded.tokenizer, method=loaded.method.name,
                      step=loaded.step, path=str(loaded.path))
