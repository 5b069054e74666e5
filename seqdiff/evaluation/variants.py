"""Zero-shot variant scoring: the log-likelihood ratio log p(alt) / p(ref) of a DNA model around each variant.

`seqdiff score RUN --fasta FA --variants TABLE` reads a VCF or a TSV / CSV of (chrom, pos, ref, alt), cuts a
window of the reference around each variant, and writes per variant the inputs plus the score, in nats.

What the score is, per method (SCORERS, a registry by method name)
- AR (exact): llr = log p(window with alt) - log p(window with ref), each the sum of the model's next-base
  log-probabilities over the whole window (conditioned on BOS at the window start). Exact for the model;
  positions before the variant contribute identically to both and cancel.
- MDLM / D3PM (masked marginal): the variant's positions are masked in the reference window (everything else
  clean) and llr = sum over those positions of log x_theta(alt_j) - log x_theta(ref_j), from the denoiser's
  marginals at them (ESM-1v's "masked marginal", Meier et al. 2021). This is NOT an exact likelihood ratio of
  the model and not a bound on one: a diffusion model gives only an upper bound (NELBO) on -log p(window),
  and the difference of two upper bounds bounds nothing. For a single-base variant it is the exact ratio
  p(w_alt) / p(w_ref) of any joint distribution whose full conditional p(x_i | x_{-i}) is the denoiser's
  (since p(w) = p(x_i | x_{-i}) p(x_{-i}) and x_{-i} is shared), which is what a perfectly trained MDLM
  learns at low noise; for a multi-base substitution the denoiser's factorized marginals also ignore the
  dependence between the masked bases. A time-conditioned model is read at the time whose expected masked
  share equals the variant's share of the window.
- `rc_conjoin=True`: both strands. Diffusion models: the denoiser's probabilities are averaged over the two
  strands first (seqdiff.backbones.rc_equivariant, post-hoc conjoining). AR: the windows are scored under the
  strand mixture p(w) = (p_theta(w) + p_theta(RC w)) / 2, an RC-invariant distribution, so still exactly.

Input table
- VCF (a `.vcf` / `.vcf.gz` file, or any file whose first line starts with `##fileformat=VCF`): columns
  CHROM POS ID REF ALT; a multi-allelic ALT (`A,G`) gives one row per alternative allele.
- TSV / CSV (tab or comma, chosen from the header line): a header naming at least chrom, pos, ref, alt
  (case-insensitive; `#chrom`, `chr`, `position` also accepted); every other column is carried to the output.
- pos is 1-based. Every row is checked against the FASTA before any model runs: an unknown chromosome, a
  position outside it or a ref allele that differs from the FASTA (a table for another genome build) refuses
  the table with one message naming the file, line and problem.
- Scored: substitutions, ref and alt A / C / G / T strings of equal length (SNVs and multi-base). Other rows
  of a real VCF (indels, ALT '.' or '*', symbolic alleles, N bases) stay in the output, in table order, with an
  empty score and the reason in `not_scored`; stderr counts them. A table with nothing to score is refused.

The window has `window` bases (default: the model's training length), centered on the variant and shifted to
stay inside the chromosome (a shorter chromosome is scored whole).
"""

from __future__ import annotations

import csv
import dataclasses
import gzip
import io
import json
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from seqdiff.backbones.rc_equivariant import RCEquivariant, rc_tokens
from seqdiff.checkpoint import LoadedModel
from seqdiff.data.genome import FastaHandle, GenomeError

ALLELE_BASES = frozenset("ACGT")
COLUMN_ALIASES = {"chrom": ("chrom", "#chrom", "chr", "chromosome"), "pos": ("pos", "position"),
                  "ref": ("ref",), "alt": ("alt",)}
"""Header names accepted for the four required columns of a TSV / CSV table (lower-cased)."""


class VariantError(GenomeError):
    """A variant table (or model) that cannot be scored; the message names the file, line and problem."""


@dataclass
class Variant:
    chrom: str
    """Chromosome as written in the table."""
    pos: int
    """1-based position of the first base of ref."""
    ref: str
    alt: str
    where: str
    """'FILE line N', for messages."""
    extra: dict[str, str] = field(default_factory=dict)
    """The table's other columns (VCF: id), carried to the output."""
    fasta_chrom: str = ""
    """The FASTA's spelling of chrom (filled by `check_variants`)."""


# ---------------------------------------------------------------------------------------------- reading
def _open_text(path: Path) -> str:
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise VariantError(f"cannot read the variant table {path}: {e}") from e
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as e:
            raise VariantError(f"{path}: cannot decompress ({e})") from e
    try:
        return raw.decode("utf-8").removeprefix("\ufeff")  # a byte-order mark: what spreadsheets' "CSV UTF-8" writes
    except UnicodeDecodeError as e:
        raise VariantError(f"{path}: not a text file ({e})") from e


def _is_vcf(path: Path, text: str) -> bool:
    name = path.name.lower()
    return name.endswith((".vcf", ".vcf.gz", ".vcf.bgz")) or text.startswith("##fileformat=VCF")


def read_variants(path: str | Path) -> list[Variant]:
    """Rows of a VCF or a TSV / CSV table (see the module docstring); malformed rows are refused."""
    path = Path(path)
    text = _open_text(path)
    rows = _read_vcf(path, text) if _is_vcf(path, text) else _read_table(path, text)
    if not rows:
        raise VariantError(f"{path}: no variants in the table")
    return rows


def _read_vcf(path: Path, text: str) -> list[Variant]:
    rows = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.startswith("#"):
            continue
        where = f"{path} line {number}"
        cols = line.split("\t")
        if len(cols) < 5:
            raise VariantError(f"{where}: malformed VCF row: {len(cols)} tab-separated columns, need at least 5 "
                               f"(CHROM POS ID REF ALT)")
        chrom, pos, vid, ref, alts = cols[:5]
        for alt in alts.split(","):
            rows.append(Variant(chrom, _position(pos, where), ref, alt, where, {"id": vid}))
    return rows


def _read_table(path: Path, text: str) -> list[Variant]:
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.strip()), None)
    if start is None:
        raise VariantError(f"{path}: the variant table is empty")
    header_line = lines[start]
    delimiter = "\t" if "\t" in header_line else ","
    reader = csv.reader(io.StringIO("\n".join(lines[start:])), delimiter=delimiter)
    header = [h.strip() for h in next(reader)]
    lower = [h.lower() for h in header]
    index = {}
    for key, names in COLUMN_ALIASES.items():
        found = [i for i, h in enumerate(lower) if h in names]
        if not found:
            raise VariantError(f"{path} line {start + 1}: the header {header} has no {key!r} column (need chrom, pos, "
                               f"ref, alt; or give a VCF)")
        index[key] = found[0]
    others = [i for i in range(len(header)) if i not in index.values()]
    rows = []
    for offset, cols in enumerate(reader, start=1):
        where = f"{path} line {start + 1 + offset}"
        if not cols or all(not c.strip() for c in cols):
            continue
        if len(cols) != len(header):
            raise VariantError(f"{where}: malformed row: {len(cols)} columns, the header has {len(header)}")
        cols = [c.strip() for c in cols]
        rows.append(Variant(cols[index["chrom"]], _position(cols[index["pos"]], where), cols[index["ref"]],
                            cols[index["alt"]], where, {header[i]: cols[i] for i in others}))
    return rows


def _position(value: str, where: str) -> int:
    try:
        pos = int(value)
    except ValueError:
        raise VariantError(f"{where}: malformed row: position {value!r} is not an integer") from None
    if pos < 1:
        raise VariantError(f"{where}: position {pos} is outside the chromosome (positions are 1-based)")
    return pos


# ---------------------------------------------------------------------------------------------- checking
def not_scored_reason(v: Variant) -> tuple[str, str] | None:
    """(kind, reason) of a well-formed row that the scorers do not handle (None: a substitution they do).
    Real VCFs mix these in (indels, ALT '.' of reference sites, '*' and symbolic alleles); their rows are kept
    in the output without a score rather than failing the whole table. The kind is what stderr counts."""
    alt, ref = v.alt.upper(), v.ref.upper()
    if alt in (".", ""):
        return "ALT '.'", "no alternative allele (ALT '.')"
    if alt == "*":
        return "ALT '*'", "allele removed by an upstream deletion (ALT '*')"
    if alt.startswith("<") or "[" in alt or "]" in alt:
        return "symbolic allele", f"symbolic or breakend allele {v.alt!r}"
    if len(ref) != len(alt):
        return "indel", "indel (only substitutions are scored)"
    for name, allele in (("ref", ref), ("alt", alt)):
        if set(allele) - ALLELE_BASES:
            return "non-ACGT base", f"{name} allele {getattr(v, name)!r} has bases other than A, C, G, T"
    if ref == alt:
        return "alt equals ref", "alt equals ref"
    return None


def check_variants(variants: Sequence[Variant], fasta: FastaHandle) -> dict[int, tuple[str, str]]:
    """Refuse the first row with an unknown chromosome, a position outside it or a ref that does not match the
    FASTA (a table for another genome build); return {row index: (kind, reason)} of the rows not scored."""
    skipped = {}
    for i, v in enumerate(variants):
        if not v.ref.isascii() or not v.ref.isalpha():  # letters are checked against the FASTA below
            raise VariantError(f"{v.where}: ref allele {v.ref!r} is not a string of bases")
        try:
            v.fasta_chrom = fasta.resolve(v.chrom)
        except GenomeError as e:
            raise VariantError(f"{v.where}: unknown chromosome {v.chrom!r}: {str(e).split(': ', 2)[-1]}") from None
        length = fasta.lengths[v.fasta_chrom]
        end = v.pos + len(v.ref) - 1
        if end > length:
            raise VariantError(f"{v.where}: position {v.chrom}:{v.pos}{f'-{end}' if end > v.pos else ''} is "
                               f"outside the chromosome (length {length:,})")
        found = fasta.sequence(v.fasta_chrom, v.pos - 1, end).upper()
        if found != v.ref.upper():
            raise VariantError(f"{v.where}: ref allele {v.ref!r} does not match the FASTA, which has {found!r} at "
                               f"{v.chrom}:{v.pos}")
        reason = not_scored_reason(v)
        if reason is not None:
            skipped[i] = reason
    if variants and len(skipped) == len(variants):
        raise VariantError(f"{variants[0].where.rsplit(' line ', 1)[0]}: none of its {len(variants)} variants can be "
                           f"scored ({_reason_counts(skipped)}); seqdiff scores substitutions of A, C, G, T")
    return skipped


def _reason_counts(skipped: dict[int, tuple[str, str]]) -> str:
    counts: dict[str, int] = {}
    for kind, _ in skipped.values():
        counts[kind] = counts.get(kind, 0) + 1
    return ", ".join(f"{n:,} {kind}" for kind, n in sorted(counts.items(), key=lambda kv: -kv[1]))


def check_model(model: LoadedModel, what: str) -> None:
    """Refuse a model that is not a DNA model, or whose method has no scorer."""
    if model.tokenizer.kind != "nucleotide":
        raise VariantError(f"{what}: variant scoring needs a DNA model (nucleotide tokenizer); this model has a "
                           f"{model.tokenizer.kind!r} tokenizer")
    if model.method.name not in SCORERS:
        raise VariantError(f"{what}: variant scoring supports methods {sorted(SCORERS)}, not "
                           f"{model.method.name!r}")


# ---------------------------------------------------------------------------------------------- windows
def window_bounds(pos0: int, width: int, chrom_length: int, window: int) -> tuple[int, int]:
    """[start, end) of `window` bases centered on [pos0, pos0 + width), shifted to stay inside the chromosome."""
    size = min(window, chrom_length)
    start = pos0 + width // 2 - size // 2
    start = max(0, min(start, chrom_length - size))
    return start, start + size


@dataclass
class Window:
    variant: Variant
    start: int
    """0-based start of the window on the chromosome."""
    ref_ids: np.ndarray
    """(W,) token ids of the reference window."""
    offset: int
    """Index of the variant's first base inside the window."""
    ref_ids_allele: np.ndarray
    alt_ids_allele: np.ndarray


def make_windows(variants: Sequence[Variant], fasta: FastaHandle, tokenizer, window: int) -> list[Window]:
    out = []
    for v in variants:
        pos0, width = v.pos - 1, len(v.ref)
        start, end = window_bounds(pos0, width, fasta.lengths[v.fasta_chrom], window)
        ids = np.asarray(tokenizer.encode(fasta.sequence(v.fasta_chrom, start, end)), dtype=np.int64)
        out.append(Window(v, start, ids, pos0 - start, np.asarray(tokenizer.encode(v.ref.upper()), dtype=np.int64),
                          np.asarray(tokenizer.encode(v.alt.upper()), dtype=np.int64)))
    return out


def _batches(windows: Sequence[Window], batch_size: int):
    """Runs of up to `batch_size` windows of one length (only a chromosome shorter than the window differs)."""
    by_length: dict[int, list[Window]] = {}
    for w in windows:
        by_length.setdefault(len(w.ref_ids), []).append(w)
    for group in by_length.values():
        for i in range(0, len(group), batch_size):
            yield group[i: i + batch_size]


# ---------------------------------------------------------------------------------------------- scorers
def _device(model: LoadedModel) -> torch.device:
    return next(model.backbone.parameters()).device


def _time_for_share(method, share: float) -> float:
    """The time t in [t_min, 1] whose mask probability is `share` (bisection on the schedule)."""
    lo, hi = float(method.config.t_min), 1.0
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        if float(method.schedule.mask_probability(torch.tensor([mid], dtype=torch.float64))[0]) < share:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


@torch.no_grad()
def score_masked_marginal(model: LoadedModel, windows: Sequence[Window], rc_conjoin: bool = False
                          ) -> list[dict[str, float]]:
    """Diffusion models: sum over the variant's positions of log x_theta(alt) - log x_theta(ref), masked.

    rc_conjoin: the denoiser's probabilities are first averaged over both strands (Caduceus-Ph).
    """
    if rc_conjoin and not isinstance(model.backbone, RCEquivariant):
        model = dataclasses.replace(model, backbone=RCEquivariant(model.backbone, model.tokenizer.complement_ids,
                                                                  mode="conjoined"))
    method, device = model.method, _device(model)
    xt = torch.from_numpy(np.stack([w.ref_ids for w in windows])).to(device)  # (B, W)
    widths = [len(w.ref_ids_allele) for w in windows]
    for i, w in enumerate(windows):
        xt[i, w.offset: w.offset + widths[i]] = method.mask_id
    shares = torch.tensor([widths[i] / xt.shape[1] for i in range(len(windows))], dtype=torch.float64)
    times = {float(x): _time_for_share(method, float(x)) for x in set(shares.tolist())}  # one bisection per share
    t = torch.tensor([times[float(x)] for x in shares], device=device)  # (B,)
    probs = method.denoise(model.backbone, xt, t)  # (B, W, V) float64, zero mass on MASK
    log_probs = probs.clamp_min(1e-300).log()
    out = []
    for i, w in enumerate(windows):
        rows = torch.arange(w.offset, w.offset + widths[i], device=device)
        lp = log_probs[i, rows]  # (k, V)
        ref = lp.gather(-1, torch.from_numpy(w.ref_ids_allele).to(device)[:, None]).sum().item()
        alt = lp.gather(-1, torch.from_numpy(w.alt_ids_allele).to(device)[:, None]).sum().item()
        out.append({"log_p_ref": ref, "log_p_alt": alt, "llr": alt - ref})
    return out


def _ar_log_likelihood(model: LoadedModel, x: torch.Tensor) -> torch.Tensor:
    """(N,) exact log p of windows x (N, W) under an AR model, each started from BOS."""
    logits = model.backbone(model.method.shift_right(x))  # (N, W, V): position j predicts x_j
    return torch.log_softmax(logits.double(), dim=-1).gather(-1, x[..., None])[..., 0].sum(-1)  # (N,)


@torch.no_grad()
def score_exact_ar(model: LoadedModel, windows: Sequence[Window], rc_conjoin: bool = False
                   ) -> list[dict[str, float]]:
    """AR: log p(window with alt) - log p(window with ref), each summed over every base of the window.

    rc_conjoin: score the strand mixture p(w) = (p_theta(w) + p_theta(RC w)) / 2 instead, an RC-invariant
    distribution whose ratio is exact too (strand symmetry for a causal model is sequence-level).
    """
    device = _device(model)
    ref = np.stack([w.ref_ids for w in windows])  # (B, W)
    alt = ref.copy()
    for i, w in enumerate(windows):
        alt[i, w.offset: w.offset + len(w.alt_ids_allele)] = w.alt_ids_allele
    x = torch.from_numpy(np.concatenate([ref, alt])).to(device)  # (2B, W)
    totals = _ar_log_likelihood(model, x)  # (2B,)
    if rc_conjoin:
        other = _ar_log_likelihood(model, rc_tokens(x, model.tokenizer.complement_ids))  # (2B,)
        totals = torch.logaddexp(totals, other) - math.log(2.0)
    B = len(windows)
    return [{"log_p_ref": totals[i].item(), "log_p_alt": totals[B + i].item(),
             "llr": totals[B + i].item() - totals[i].item()} for i in range(B)]


@dataclass(frozen=True)
class Scorer:
    run: Callable[..., list[dict[str, float]]]
    """(model, windows, rc_conjoin) -> one {"llr", "log_p_ref", "log_p_alt"} per window."""
    kind: str
    """What the score is, written in every output row."""


SCORERS: dict[str, Scorer] = {
    "mdlm": Scorer(score_masked_marginal, "masked_marginal"),
    "d3pm": Scorer(score_masked_marginal, "masked_marginal"),
    "ar": Scorer(score_exact_ar, "exact"),
}
"""Method name -> how its variants are scored (see the module docstring)."""


# ---------------------------------------------------------------------------------------------- driver
def score_variants(model: LoadedModel, fasta: FastaHandle, variants: Sequence[Variant], window: int | None = None,
                   batch_size: int = 16, progress: bool = False, rc_conjoin: bool = False) -> list[dict[str, Any]]:
    """One output row per variant (table order): the inputs, the window and the score in nats.

    rc_conjoin: both strands (diffusion: the denoiser's probabilities averaged over the strands; AR: the
    strand mixture of the two windows' likelihoods). The model is not modified.
    """
    check_model(model, str(model.path))
    window = window or model.seq_len
    if not 1 <= window <= model.model_config.max_seq_len:
        raise VariantError(f"--window {window} must lie in [1, model.max_seq_len={model.model_config.max_seq_len}]")
    skipped = check_variants(variants, fasta)
    if skipped:
        print(f"seqdiff score: {len(skipped):,} of {len(variants):,} rows not scored ({_reason_counts(skipped)}); "
              f"they are kept in the output with an empty score and the reason in not_scored", file=sys.stderr)
    scorer = SCORERS[model.method.name]
    windows = make_windows([v for i, v in enumerate(variants) if i not in skipped], fasta, model.tokenizer, window)
    scores: dict[int, dict[str, float]] = {}
    batches = list(_batches(windows, batch_size))
    if progress:
        from tqdm import tqdm

        batches = tqdm(batches, desc="score", unit="batch")
    position = {id(w): i for i, w in enumerate(windows)}
    for group in batches:
        for w, s in zip(group, scorer.run(model, group, rc_conjoin)):
            scores[position[id(w)]] = s
    scored = iter(enumerate(windows))
    rows = []
    for index, v in enumerate(variants):  # table order, the rows not scored included
        # the table's own columns are carried over; one named like an output (an earlier score's llr) is kept as
        # input_<name>, never overwritten
        extra = {f"input_{k}" if k in OUTPUT_COLUMNS else k: value for k, value in v.extra.items()}
        row: dict[str, Any] = {"chrom": v.chrom, "pos": v.pos, "ref": v.ref, "alt": v.alt, **extra}
        if index in skipped:
            row.update(window_start=None, window_end=None, llr=None, log_p_ref=None, log_p_alt=None,
                       score=None, not_scored=skipped[index][1])
        else:
            i, w = next(scored)
            row.update(window_start=w.start + 1, window_end=w.start + len(w.ref_ids), llr=scores[i]["llr"],
                       log_p_ref=scores[i]["log_p_ref"], log_p_alt=scores[i]["log_p_alt"], score=scorer.kind)
        rows.append(row)
    return rows


OUTPUT_COLUMNS = frozenset({"window_start", "window_end", "llr", "log_p_ref", "log_p_alt", "score", "not_scored"})
"""Columns `score_variants` writes; an input column of the same name is carried over as input_<name>."""

SCORE_NOTES = {
    "masked_marginal": "masked-marginal score (diffusion model): log x_theta(alt) - log x_theta(ref) at the masked "
                       "variant positions, reference context elsewhere; not an exact likelihood ratio, nor a bound",
    "exact": "exact log-likelihood ratio (AR): log p(window with alt) - log p(window with ref)",
}


def format_rows(rows: Sequence[dict[str, Any]], fmt: str, header: dict[str, Any]) -> str:
    """TSV (a `#`-comment header stating what the score is, then one line per variant) or JSON."""
    if fmt == "json":
        return json.dumps({**header, "variants": list(rows)}, indent=2) + "\n"
    columns = list(rows[0])
    for row in rows[1:]:  # a TSV's rows may carry different extra columns: keep their union, in order
        columns += [c for c in row if c not in columns]
    lines = [f"# {k}: {v}" for k, v in header.items()]
    lines.append("\t".join(columns))
    for row in rows:
        lines.append("\t".join(_cell(row.get(c, "")) for c in columns))
    return "\n".join(lines) + "\n"


def _cell(value: Any) -> str:
    if value is None:  # a row not scored
        return ""
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.6g}"
    return str(value)


__all__ = ["SCORERS", "SCORE_NOTES", "Variant", "VariantError", "check_model", "check_variants", "format_rows",
           "not_scored_reason",
           "read_variants", "score_variants", "window_bounds"]
