"""Generate sequences from a loaded checkpoint and write them as text or FASTA."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from seqdiff.checkpoint import LoadedModel
from seqdiff.config import SampleConfig
from seqdiff.samplers import build_sampler


@dataclass
class Generation:
    tokens: list[torch.Tensor]
    texts: list[str]
    seconds: float
    denoiser_calls: int
    sampler: str


@torch.no_grad()
def generate(model: LoadedModel, cfg: SampleConfig, progress: bool = False) -> Generation:
    """`cfg.num_samples` sequences in batches of `cfg.batch_size`, all draws from one seeded generator."""
    if cfg.num_samples < 1 or cfg.batch_size < 1:
        raise ValueError("sample.num_samples and sample.batch_size must be >= 1")
    seq_len = cfg.seq_len or model.seq_len
    sampler = build_sampler(cfg.sampler, model.method, model.backbone, steps=cfg.steps,
                            temperature=cfg.temperature)
    sampler.check_length(seq_len)
    device = next(model.backbone.parameters()).device
    generator = torch.Generator(device).manual_seed(cfg.seed)
    tokens, calls = [], 0
    start = time.perf_counter()
    batches = range(0, cfg.num_samples, cfg.batch_size)
    if progress:
        from tqdm import tqdm

        batches = tqdm(batches, desc=f"sample ({sampler.name})", unit="batch")
    for first in batches:
        n = min(cfg.batch_size, cfg.num_samples - first)
        out = sampler.generate(n, seq_len, generator)
        tokens.extend(out.tokens.cpu())
        calls += out.num_denoiser_calls
    seconds = time.perf_counter() - start
    texts = [model.tokenizer.decode(t) for t in tokens]
    return Generation(tokens=tokens, texts=texts, seconds=seconds, denoiser_calls=calls, sampler=sampler.name)


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


def write_atomically(path: str | Path, text: str) -> Path:
    """Write then rename, so an interrupted run never leaves a partial file under the final name."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
    return path
