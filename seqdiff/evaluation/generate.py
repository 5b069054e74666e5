"""Generate sequences from a loaded checkpoint and write them as text or FASTA.

- Length: up to the model's context in one block; longer (`seq_len` > context, with `semi_ar`) in
  overlapping blocks (seqdiff.samplers.mdlm_semi_ar), for any sampler that accepts `given` conditioning.
- Conditioning: `given` (L,) or (B, L) with -1 at free positions; `given_from_prompt` / `given_from_infill`
  build it from text. Infill placeholders: `_` for character models, `N` for DNA (so N cannot be given as a
  base), `_` for BPE models, where each `_` is one masked token; or explicit intervals of token positions
  (`parse_intervals`: "10-20,40-55", 0-based, end exclusive) masked in a given sequence.
- Special ids: samples hold no PAD, and no BOS / EOS where they have no place (`never_generated`: the model's
  probabilities renormalized without them while sampling, `Method.sampling_without`).
- Variable length: with `stop_at_eos` each sample is cut at its first EOS (EOS and what follows dropped);
  `Generation.lengths` holds the lengths and `length_distribution` summarizes them.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

import torch

from seqdiff.atomic import save_figure_atomically, write_atomically  # noqa: F401  (re-exported from their old home)
from seqdiff.checkpoint import LoadedModel
from seqdiff.config import SampleConfig
from seqdiff.samplers import SamplerError, build_sampler
from seqdiff.samplers.mdlm_semi_ar import block_starts, generate_semi_ar
from seqdiff.tokenizers.base import Tokenizer, TokenizerError


@dataclass
class Generation:
    tokens: list[torch.Tensor]
    texts: list[str]
    seconds: float
    denoiser_calls: int
    sampler: str
    lengths: list[int] | None = None
    """Length of each sample in tokens (after EOS truncation when asked)."""
    stats: dict | None = None
    """What the sampler reports about itself, when it does (edlm: effective sample size)."""


def placeholder_char(tokenizer: Tokenizer) -> str:
    """The character that marks a masked position in infill text: N for DNA, `_` otherwise."""
    return "N" if tokenizer.unit == "base" else "_"


def encode_strict(tokenizer: Tokenizer, text: str, what: str | None = None, quote: bool = True) -> list[int]:
    """Token ids of `text`; for character / base tokenizers every character must be in the alphabet (a
    prompt is not silently normalized: `!` is refused, not turned into a space; case is free). `what` names the
    text in an error (`--prompt`); `quote`: the error may show `text` as the model's normalization reads it."""
    where = f"{what}: " if what else ""
    if tokenizer.unit is not None:
        def known(c: str) -> bool:
            try:
                return tokenizer.decode(tokenizer.encode(c)).lower() == c.lower()
            except TokenizerError:
                return False

        bad = sorted({c for c in text if not known(c)})
        if bad:
            raise SamplerError(f"{where}characters outside the tokenizer's alphabet: {''.join(bad)!r} "
                               f"(alphabet: {''.join(tokenizer.symbols)!r})"
                               f"{_normalized_hint(tokenizer, text, what, quote)}")
    try:
        return [int(i) for i in tokenizer.encode(text)]
    except TokenizerError as e:
        raise SamplerError(f"{where}{e}") from e


def _normalized_hint(tokenizer: Tokenizer, text: str, what: str | None, quote: bool) -> str:
    """For a normalizing tokenizer (text8): the rule training and eval apply to text and sampling does not apply
    to its input, with `text` as that rule would make it (when short enough to quote)."""
    if not tokenizer.normalizes_away:
        return ""
    seen = None
    if quote:
        try:
            seen = tokenizer.decode(tokenizer.encode(text))
        except TokenizerError:
            pass
    example = f", e.g. {seen!r} as the model saw such text in training" if seen and len(seen) <= 80 else ""
    return (f"; training and eval normalize text (lowercase, each run of other characters one space), sampling takes "
            f"{what or 'its input'} as written: write it in the alphabet{example}")


def given_from_prompt(tokenizer: Tokenizer, prompt: str, length: int, what: str | None = None) -> torch.Tensor:
    """(length,) conditioning: the prompt's ids first, -1 after them; `what` names the prompt in an error."""
    ids = encode_strict(tokenizer, prompt, what)
    if len(ids) > length:
        raise SamplerError(f"the prompt is {len(ids)} tokens long, longer than the sample length {length}")
    given = torch.full((length,), -1, dtype=torch.long)
    given[: len(ids)] = torch.tensor(ids, dtype=torch.long)
    return given


def parse_intervals(spec: str) -> list[tuple[int, int]]:
    """"10-20,40-55" -> [(10, 20), (40, 55)]: token positions, 0-based, end exclusive (the BED convention)."""
    intervals = []
    for part in spec.split(","):
        match = re.fullmatch(r"\s*(\d+)\s*-\s*(\d+)\s*", part)
        if not match:
            raise SamplerError(f"infill interval {part.strip()!r} is not START-END (0-based, end exclusive, "
                               "e.g. 10-20,40-55)")
        start, end = int(match.group(1)), int(match.group(2))
        if end <= start:
            raise SamplerError(f"infill interval {start}-{end} is empty: END must exceed START (end exclusive)")
        intervals.append((start, end))
    return intervals


def given_from_infill(tokenizer: Tokenizer, text: str, length: int | None = None,
                      intervals: list[tuple[int, int]] | None = None, what: str | None = None) -> torch.Tensor:
    """Conditioning from text whose masked positions are `placeholder_char` (one per masked token) and, with
    `intervals` ((start, end) token positions, end exclusive), every position inside them. Its length is the
    text's; a longer `length` leaves the tail free too."""
    mark = placeholder_char(tokenizer)
    ids: list[int] = []
    segment = ""
    for c in text:
        if c != mark:
            segment += c
            continue
        if segment:
            ids.extend(encode_strict(tokenizer, segment, what, quote=False))
            segment = ""
        ids.append(-1)
    if segment:
        ids.extend(encode_strict(tokenizer, segment, what, quote=False))
    length = len(ids) if length is None else length
    if len(ids) > length:
        raise SamplerError(f"the infill text is {len(ids)} tokens long, longer than the sample length {length}")
    for start, end in intervals or []:
        if end > len(ids):
            raise SamplerError(f"infill interval {start}-{end} reaches past the end of the {len(ids)}-token "
                               "sequence to infill")
        ids[start:end] = [-1] * (end - start)
    if -1 not in ids and length == len(ids):
        raise SamplerError(f"the infill text has no masked position (mark them with {mark!r} or give intervals)")
    return torch.tensor(ids + [-1] * (length - len(ids)), dtype=torch.long)


def truncate_at_eos(tokens: torch.Tensor, eos_id: int) -> torch.Tensor:
    """(L,) -> (l,): the tokens before the first EOS (all of them when there is none)."""
    hits = torch.nonzero(tokens == eos_id).flatten()
    return tokens[: int(hits[0])] if len(hits) else tokens


def length_distribution(lengths: list[int]) -> dict[str, float]:
    """Summary of sample lengths: count, min, max, mean, median, std (population)."""
    t = torch.tensor(lengths, dtype=torch.float64)
    return {"count": len(lengths), "min": float(t.min()), "max": float(t.max()), "mean": float(t.mean()),
            "median": float(t.median()), "std": float(t.std(unbiased=False))}


def never_generated(model: LoadedModel, cfg: SampleConfig, given: torch.Tensor | None) -> set[int]:
    """Special ids a diffusion sample has no place for: PAD (filler, never a training target) always; BOS and
    EOS when the model's data never held them (DNA windows, text streams); BOS, and EOS unless sample.stop_at_eos
    asks for it, when conditioning on given tokens (inside an infill or after a prompt). A model trained on
    documents (wrapped, packed, padded rows), or one that records no data, keeps BOS / EOS unconditionally."""
    tok = model.tokenizer
    data = model.data_config
    ids = {tok.pad_id}
    if data is not None and (data.kind != "text" or data.text.block_mode == "stream"):
        ids |= {tok.bos_id, tok.eos_id}
    if given is not None:
        ids.add(tok.bos_id)
        if not cfg.stop_at_eos:
            ids.add(tok.eos_id)
    return ids



def in_blocks(cfg: SampleConfig, sampler_class: type, seq_len: int, context: int) -> bool:
    """Whether `generate` makes samples of `seq_len` tokens in overlapping semi-autoregressive blocks (what
    `sample.overlap` shapes): asked for (`cfg.semi_ar`), longer than the context, and a sampler that does not
    generate any length itself (bd3lm's, block by block)."""
    return bool(cfg.semi_ar) and seq_len > context and not getattr(sampler_class, "any_length", False)


@torch.no_grad()
def generate(model: LoadedModel, cfg: SampleConfig, progress: bool = False,
             given: torch.Tensor | None = None, sampler_options: dict | None = None) -> Generation:
    """`cfg.num_samples` sequences in batches of `cfg.batch_size`, all draws from one seeded generator.

    `given` ((L,) or (num_samples, L), -1 at free positions) conditions the samples; its length is the sample
    length when `cfg.seq_len` is unset. With `cfg.semi_ar`, lengths beyond the model's context are generated in
    blocks of the training length, overlapping by `cfg.overlap` tokens (default: half a block).
    `sampler_options` go to samplers that take more than the config (edlm: energy, k, window)."""
    if cfg.num_samples < 1 or cfg.batch_size < 1:
        raise SamplerError("sample.num_samples and sample.batch_size must be >= 1")
    seq_len = cfg.seq_len or (given.shape[-1] if given is not None else model.seq_len)
    sampler = build_sampler(cfg.sampler, model.method, model.backbone, steps=cfg.steps,
                            temperature=cfg.temperature, top_p=cfg.top_p, **(sampler_options or {}))
    context = model.backbone.config.max_seq_len
    block_len = min(model.seq_len, context)
    if getattr(sampler, "any_length", False):  # bd3lm: any length block by block, in a window of the training length
        sampler.context, sampler.stop_at_eos = block_len, cfg.stop_at_eos
    semi_ar = in_blocks(cfg, type(sampler), seq_len, context)
    if not semi_ar:
        sampler.check_length(seq_len)
    overlap = cfg.overlap if cfg.overlap is not None else block_len // 2
    if semi_ar and progress:  # the progress bar counts batches; say up front what one batch costs
        import sys

        blocks = len(block_starts(seq_len, block_len, overlap))
        print(f"seqdiff: {seq_len:,} tokens exceed the model's context of {context}: each sample is made in "
              f"{blocks:,} semi-autoregressive blocks of {block_len} tokens (overlap {overlap}), each a full "
              f"{sampler.name} run", file=sys.stderr, flush=True)
    if given is not None:
        given = torch.as_tensor(given).long()
        if given.shape[-1] != seq_len:
            raise SamplerError(f"the conditioning is {given.shape[-1]} tokens long but the sample length is "
                               f"{seq_len}")
    device = next(model.backbone.parameters()).device
    generator = torch.Generator(device).manual_seed(cfg.seed)
    tokens, calls = [], 0
    start = time.perf_counter()
    batches = range(0, cfg.num_samples, cfg.batch_size)
    if progress:
        from tqdm import tqdm

        batches = tqdm(batches, desc=f"sample ({sampler.name})", unit="batch")
    with model.method.sampling_without(never_generated(model, cfg, given)):
        for first in batches:
            n = min(cfg.batch_size, cfg.num_samples - first)
            g = None if given is None else (given if given.ndim == 1 else given[first : first + n])
            if semi_ar:
                out = generate_semi_ar(sampler, n, seq_len, block_len, overlap, generator, given=g)
            elif g is not None:
                out = sampler.generate(n, seq_len, generator, given=g)
            else:
                out = sampler.generate(n, seq_len, generator)
            tokens.extend(out.tokens.cpu())
            calls += out.num_denoiser_calls
    seconds = time.perf_counter() - start
    if cfg.stop_at_eos:
        tokens = [truncate_at_eos(t, model.tokenizer.eos_id) for t in tokens]
    texts = [model.tokenizer.decode(t) for t in tokens]
    return Generation(tokens=tokens, texts=texts, seconds=seconds, denoiser_calls=calls, sampler=sampler.name,
                      lengths=[len(t) for t in tokens], stats=sampler.stats() if hasattr(sampler, "stats") else None)


def format_samples(gen: Generation, fasta: bool) -> str:
    """FASTA records (>sample_i) for DNA, otherwise samples separated by header lines."""
    parts = []
    for i, text in enumerate(gen.texts):
        if fasta:
            lines = [text[j : j + 80] for j in range(0, len(text), 80)] or [""]
            parts.append(f">sample_{i} sampler={gen.sampler}\n" + "\n".join(lines))
        else:
            parts.append(f"=== sample {i} ===\n{text}")
    return "\n".join(parts) + "\n"
