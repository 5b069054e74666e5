"""The Genomic Benchmarks CNN baseline (Grešová et al. 2023), written from its description:

token embedding (100 dims) -> three blocks of [Conv1d, kernel 8, BatchNorm, MaxPool 2] with 16, 8, 4
channels (ReLU after the first block) -> flatten -> Linear(512). The classification head (Linear(512,
classes)) is added by `finetune.SequenceClassifier`, as for every encoder. Inputs are padded to one fixed
length (the benchmark's), since the flatten size depends on it.
"""

from __future__ import annotations

from torch import Tensor, nn

from seqdiff.probes.data import ProbeError

EMBEDDING_DIM = 100
CHANNELS = (16, 8, 4)
KERNEL = 8
DENSE = 512


class GenomicBenchmarksCNN(nn.Module):
    """(ids (B, L), mask) -> features (B, 512); L must equal `input_len`."""

    def __init__(self, vocab_size: int, input_len: int) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        in_ch = EMBEDDING_DIM
        for i, out_ch in enumerate(CHANNELS):
            layers += [nn.Conv1d(in_ch, out_ch, KERNEL), nn.BatchNorm1d(out_ch)]
            if i == 0:
                layers.append(nn.ReLU())
            layers.append(nn.MaxPool1d(2))
            in_ch = out_ch
        self.input_len = input_len
        self.embed = nn.Embedding(vocab_size, EMBEDDING_DIM)
        self.conv = nn.Sequential(*layers, nn.Flatten())
        self.dense = nn.Linear(flatten_size(input_len), DENSE)
        self.out_features = DENSE

    def forward(self, ids: Tensor, mask: Tensor | None = None) -> Tensor:
        if ids.shape[1] != self.input_len:
            raise ValueError(f"the CNN was built for length {self.input_len}, got {ids.shape[1]}")
        x = self.embed(ids).transpose(1, 2)  # (B, 100, L)
        return self.dense(self.conv(x))  # (B, 512)


def _pooled_length(input_len: int) -> int:
    length = input_len
    for _ in CHANNELS:
        length = (length - KERNEL + 1) // 2
    return length


def _min_input_len() -> int:
    length = 1
    while _pooled_length(length) < 1:
        length += 1
    return length


MIN_INPUT_LEN = _min_input_len()
"""Shortest input the three blocks leave at least one position of (57)."""


def too_short(input_len: int) -> str | None:
    """Why the CNN cannot read inputs of `input_len` bases, or None when it can (for refusals made up front)."""
    if input_len >= MIN_INPUT_LEN:
        return None
    return (f"sequences of at most {input_len} bases are too short for the Genomic Benchmarks CNN baseline (its three "
            f"conv + max-pool blocks need at least {MIN_INPUT_LEN})")


def flatten_size(input_len: int) -> int:
    """Features after the three conv (valid, kernel 8) + max-pool (2) blocks."""
    why = too_short(input_len)
    if why is not None:
        raise ProbeError(why)
    return CHANNELS[-1] * _pooled_length(input_len)

