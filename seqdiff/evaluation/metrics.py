"""Sample-quality metrics, one implementation for every job that reports them (sample, EDLM, frontier).

Always report diversity next to generative perplexity: a low perplexity from collapsed, repetitive samples
(low entropy) is not quality.

- `unigram_entropy`: entropy in nats of the empirical distribution of token ids within one sample.
- `distinct_n`: unique n-grams / n-grams of one sample; `repetition_rate` = 1 - distinct_n, the fraction of
  a sample's n-grams that repeat one seen earlier in it.
- `known_word_share`: the share of a text sample's words that occur in a reference vocabulary (the training
  text's words), a check that character-level samples are made of real words.
- DNA: `gc_content` (G + C over A, C, G, T; other symbols such as N are ignored) and `kmer_distance`
  between the normalized k-mer count vectors of two sequences (k-mers over ACGT only, case-insensitive):
  total variation 0.5 sum |p - q| in [0, 1] (the default), or Jensen-Shannon divergence in nats, in
  [0, ln 2]. Identical spectra give 0, disjoint ones the maximum.
- Generative perplexity under an oracle causal LM given by path (`load_oracle`): a seqdiff AR checkpoint /
  run directory, or a Hugging Face causal LM directory (loaded with local_files_only). Samples are decoded
  text, re-tokenized with the oracle's own tokenizer; each sample is scored from BOS (when the oracle has
  one) in chunks of the oracle's context. Weighting: token-weighted, i.e. exp(sum of NLL over all oracle
  tokens of all samples / number of those tokens), not a mean of per-sample perplexities.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.nn.functional as F

from seqdiff.checkpoint import load_checkpoint
from seqdiff.errors import SeqdiffError

DNA = "ACGT"


# ---------------------------------------------------------------------------------------------- diversity
def unigram_entropy(tokens: Sequence[int] | torch.Tensor) -> float:
    """Entropy in nats of the token-id frequencies of one sample (0 for an empty or constant sample)."""
    ids = torch.as_tensor(tokens).reshape(-1).long()
    if ids.numel() == 0:
        return 0.0
    counts = torch.bincount(ids - ids.min()).double()
    p = counts[counts > 0] / ids.numel()
    return float(-(p * p.log()).sum())


def ngrams(tokens: Sequence[int] | torch.Tensor, n: int) -> list[tuple]:
    seq = torch.as_tensor(tokens).reshape(-1).tolist() if not isinstance(tokens, str) else list(tokens)
    return [tuple(seq[i : i + n]) for i in range(len(seq) - n + 1)]


def distinct_n(tokens: Sequence[int] | torch.Tensor, n: int) -> float:
    """Unique n-grams / n-grams in one sample (1 when it has no n-gram at all)."""
    grams = ngrams(tokens, n)
    return len(set(grams)) / len(grams) if grams else 1.0


def repetition_rate(tokens: Sequence[int] | torch.Tensor, n: int) -> float:
    """Fraction of a sample's n-grams that repeat an earlier n-gram of the same sample (1 - distinct_n)."""
    return 1.0 - distinct_n(tokens, n)


def diversity_metrics(samples: Sequence[Sequence[int] | torch.Tensor], max_n: int = 4) -> dict[str, float]:
    """Means over samples of unigram entropy (nats), distinct-n and repetition rate for n = 1..max_n."""
    out = {"unigram_entropy_nats": _mean(unigram_entropy(s) for s in samples)}
    for n in range(1, max_n + 1):
        out[f"distinct_{n}"] = _mean(distinct_n(s, n) for s in samples)
        out[f"repetition_{n}"] = _mean(repetition_rate(s, n) for s in samples)
    return out


def known_word_share(texts: Sequence[str], vocabulary: set[str]) -> tuple[float, int]:
    """(share of the samples' words found in `vocabulary`, number of words counted).

    Words are whitespace-separated runs; a sample's last word is left out when the sample does not end in
    whitespace (a sample of fixed length usually stops inside a word). A crude but honest check that
    samples are made of real words: character-level models early in training mostly are not.
    """
    known = total = 0
    for text in texts:
        words = text.split()
        if words and text[-1:].strip():
            words = words[:-1]
        total += len(words)
        known += sum(w in vocabulary for w in words)
    return (known / total if total else math.nan), total


def _mean(values) -> float:
    values = list(values)
    return sum(values) / len(values) if values else float("nan")


# ---------------------------------------------------------------------------------------------- DNA
def gc_content(seq: str) -> float:
    """(G + C) / (A + C + G + T), case-insensitive; NaN when the sequence has no A, C, G or T."""
    seq = seq.upper()
    acgt = sum(seq.count(b) for b in DNA)
    return (seq.count("G") + seq.count("C")) / acgt if acgt else float("nan")


def kmer_spectrum(seq: str, k: int) -> torch.Tensor:
    """(4^k,) float64 counts of the k-mers over ACGT in lexicographic order (k-mers with other symbols skipped)."""
    index = {"".join(p): i for i, p in enumerate(itertools.product(DNA, repeat=k))}
    counts = torch.zeros(4**k, dtype=torch.float64)
    seq = seq.upper()
    for km, c in Counter(seq[i : i + k] for i in range(len(seq) - k + 1)).items():
        if km in index:
            counts[index[km]] += c
    return counts


def kmer_distance(a: str, b: str, k: int, kind: str = "tv") -> float:
    """Distance between the normalized k-mer spectra of `a` and `b`: "tv" (total variation, in [0, 1]) or
    "js" (Jensen-Shannon divergence in nats, in [0, ln 2])."""
    p, q = kmer_spectrum(a, k), kmer_spectrum(b, k)
    if p.sum() == 0 or q.sum() == 0:
        raise SeqdiffError(f"a sequence has no {k}-mer over ACGT")
    p, q = p / p.sum(), q / q.sum()
    if kind == "tv":
        return float(0.5 * (p - q).abs().sum())
    if kind == "js":
        m = 0.5 * (p + q)

        def kl(x):
            nz = x > 0
            return (x[nz] * (x[nz] / m[nz]).log()).sum()

        return float(0.5 * kl(p) + 0.5 * kl(q))
    raise SeqdiffError(f"kind={kind!r} is not allowed; choose one of ['tv', 'js']")


def dna_metrics(samples: Sequence[str], reference: str | None = None, ks: Sequence[int] = range(1, 7)
                ) -> dict[str, float]:
    """Mean GC content of the samples; with a reference, its GC and the total variation between the k-mer
    spectrum of all samples pooled and the reference's, for each k."""
    out = {"gc_content": _mean(g for g in (gc_content(s) for s in samples) if not math.isnan(g))}
    if reference is not None:
        out["reference_gc_content"] = gc_content(reference)
        pooled = "|".join(samples)  # the separator breaks k-mers across samples
        for k in ks:  # NaN when the samples (or the reference) are too short for a k-mer
            try:
                out[f"kmer_tv_k{k}"] = kmer_distance(pooled, reference, k, "tv")
            except ValueError:
                out[f"kmer_tv_k{k}"] = float("nan")
    return out


# ---------------------------------------------------------------------------------------------- oracle
class Oracle:
    """A causal LM that scores text: `nll(texts)` -> (sum of NLL in nats, number of scored tokens)."""

    def nll(self, texts: Sequence[str]) -> tuple[float, int]:
        raise NotImplementedError

    def perplexity(self, texts: Sequence[str]) -> float:
        """Generative perplexity, token-weighted over all samples: exp(total NLL / total tokens)."""
        total, n = self.nll(texts)
        if n == 0:
            raise SeqdiffError("the samples hold no token for the oracle to score")
        return math.exp(total / n)


class SeqdiffAROracle(Oracle):
    """A seqdiff AR model: each text re-encoded with its tokenizer, scored from BOS in chunks of its block
    length (each chunk restarts from BOS, as in training)."""

    def __init__(self, model):
        if not model.method.causal:
            raise SeqdiffError(f"the oracle {model.path} is a {model.method.name!r} model; it must be autoregressive")
        self.model = model

    @torch.no_grad()
    def nll(self, texts: Sequence[str]) -> tuple[float, int]:
        m = self.model
        device = next(m.backbone.parameters()).device
        total, n = 0.0, 0
        for text in texts:
            ids = torch.as_tensor(m.tokenizer.encode(text), dtype=torch.long, device=device)
            for start in range(0, len(ids), m.seq_len):
                chunk = ids[start : start + m.seq_len][None]  # (1, l)
                out = m.method.loss(m.backbone, chunk)
                total += float(out.nll_sum)
                n += int(out.num_tokens)
        return total, n


class HFOracle(Oracle):
    """A Hugging Face causal LM directory (no download: local_files_only)."""

    def __init__(self, path: str | Path, device: str = "cpu"):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        self.model = AutoModelForCausalLM.from_pretrained(str(path), local_files_only=True).to(device).eval()
        cfg = self.model.config
        self.context = getattr(cfg, "n_positions", None) or getattr(cfg, "max_position_embeddings", None) or 1024
        self.device = device

    @torch.no_grad()
    def nll(self, texts: Sequence[str]) -> tuple[float, int]:
        bos = self.tokenizer.bos_token_id
        total, n = 0.0, 0
        for text in texts:
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            step = self.context - 1 if bos is not None else self.context
            for start in range(0, len(ids), step):
                chunk = ids[start : start + step]
                inp = ([bos] if bos is not None else []) + chunk
                x = torch.tensor([inp], device=self.device)
                logits = self.model(x).logits[0, :-1].double()  # (l, V) predictions of inp[1:]
                targets = x[0, 1:]
                total += float(F.cross_entropy(logits, targets, reduction="sum"))
                n += len(targets)
        return total, n


def load_oracle(path: str | Path, device: str = "cpu") -> Oracle:
    """A seqdiff run directory / .ckpt / export, or a Hugging Face causal LM directory (config.json with a
    model_type that is not seqdiff's own export)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"oracle {path} does not exist")
    try:
        model = load_checkpoint(path, device=device)
    except Exception as seqdiff_error:
        if path.is_dir() and (path / "config.json").exists():
            return HFOracle(path, device)
        raise SeqdiffError(f"oracle {path} is neither a seqdiff AR checkpoint nor a Hugging Face causal LM "
                         f"directory ({seqdiff_error})") from seqdiff_error
    return SeqdiffAROracle(model)


def check_oracle_fits(oracle: Oracle, tokenizer, what: str) -> None:
    """Refuse a seqdiff oracle that reads the other kind of sequence than the samples (a text LM scoring DNA, a
    DNA LM scoring text): its perplexity would be a number of nothing. Text against text is fine whatever the
    tokenizers (GPT-2 scoring a character model's samples is the usual generative perplexity); a Hugging Face
    oracle cannot be checked here and is the user's choice."""
    if not isinstance(oracle, SeqdiffAROracle):
        return
    theirs = oracle.model.tokenizer.kind
    if (theirs == "nucleotide") != (tokenizer.kind == "nucleotide"):
        def reads(kind: str) -> str:
            return "DNA" if kind == "nucleotide" else "text"

        raise SeqdiffError(f"oracle {oracle.model.path} reads {reads(theirs)} ({theirs} tokenizer) but {what} "
                           f"generates {reads(tokenizer.kind)} ({tokenizer.kind} tokenizer): give an AR run "
                           f"trained on {reads(tokenizer.kind)}")


def generation_metrics(token_samples: Sequence[torch.Tensor], texts: Sequence[str], dna: bool = False,
                       reference: str | None = None, oracle: Oracle | None = None) -> dict[str, float]:
    """Every metric that applies: diversity always, GC / k-mer for DNA, generative perplexity with an oracle."""
    out = diversity_metrics(token_samples)
    if dna:
        out.update(dna_metrics(texts, reference))
    if oracle is not None:
        per_text = [oracle.nll([text]) for text in texts]  # (NLL sum, tokens) of each sample
        total, n = sum(t for t, _ in per_text), sum(k for _, k in per_text)
        out["oracle_tokens"] = n
        out["oracle_nll_nats_per_token"] = total / n if n else float("nan")
        out["oracle_nll_se"] = ratio_standard_error([t for t, _ in per_text], [k for _, k in per_text])
        out["gen_perplexity"] = math.exp(total / n) if n else float("nan")
    return out


def ratio_standard_error(totals: Sequence[float], counts: Sequence[int]) -> float:
    """Standard error of the token-weighted mean sum(totals) / sum(counts) over independent samples (the
    delta-method / ratio-estimator form, sqrt(m / (m - 1) * sum_i (y_i - r n_i)^2) / N): the s.e. of the
    log generative perplexity, so two samplers' perplexities compare by |log ratio| against 2 s.e. With equal
    counts it is the plain s.e. of the per-sample means. NaN with fewer than two samples."""
    m, big_n = len(totals), sum(counts)
    if m < 2 or big_n == 0:
        return float("nan")
    r = sum(totals) / big_n
    return math.sqrt(m / (m - 1) * sum((y - r * k) ** 2 for y, k in zip(totals, counts))) / big_n
