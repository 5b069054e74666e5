"""Turning one long token stream into training and evaluation blocks, independent of the domain.

- Training: `RandomWindowBatches` is an endless, step-indexed stream of batches of random windows. Batch k
  depends only on (seed, k), so a run resumed at step k sees exactly the batches an uninterrupted run
  would have seen, with or without worker processes.
- Evaluation: `TiledBlocks` cuts the stream into consecutive non-overlapping blocks; the last one is
  padded, and padding is excluded from attention and from the loss, so every token is scored exactly once.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch.utils.data import Dataset, IterableDataset, get_worker_info


def step_generator(seed: int, step: int) -> torch.Generator:
    """A generator whose state depends only on (seed, step)."""
    return torch.Generator().manual_seed((seed * 1_000_003 + step) % (2**63))


def rank_slice(global_batch: int, rank: int, world_size: int) -> slice:
    """The rows of a global batch that process `rank` of `world_size` trains on."""
    if global_batch % world_size != 0:
        raise ValueError(f"data.batch_size={global_batch} (the global batch) does not divide by the "
                         f"{world_size} training processes")
    per_rank = global_batch // world_size
    return slice(rank * per_rank, (rank + 1) * per_rank)


class RandomWindowBatches(IterableDataset):
    """Yields {"input_ids": (B, L)} batches of windows at uniformly random offsets, from `start_step` on.

    `batch_size` is the global batch; with several processes each takes its `rank_slice` of the same
    global batch, so the data of a step do not depend on the number of processes.
    """

    def __init__(self, tokens: np.ndarray, seq_len: int, batch_size: int, seed: int, start_step: int = 0,
                 rank: int = 0, world_size: int = 1):
        if len(tokens) < seq_len:
            raise ValueError(f"the training split has {len(tokens)} tokens, fewer than data.seq_len={seq_len}")
        self.tokens = torch.from_numpy(np.ascontiguousarray(tokens, dtype=np.int64))
        self.seq_len, self.batch_size, self.seed, self.start_step = seq_len, batch_size, seed, start_step
        self.rows = rank_slice(batch_size, rank, world_size)

    def batch_at(self, step: int) -> dict[str, torch.Tensor]:
        g = step_generator(self.seed, step)
        starts = torch.randint(0, len(self.tokens) - self.seq_len + 1, (self.batch_size,), generator=g)
        index = starts[self.rows, None] + torch.arange(self.seq_len)  # (B / world_size, L)
        return {"input_ids": self.tokens[index]}

    def __iter__(self):
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info else (0, 1)
        step = self.start_step + worker  # workers take turns; the DataLoader interleaves them in order
        while True:
            yield self.batch_at(step)
            step += workers


class TiledBlocks(Dataset):
    """Consecutive blocks of `seq_len` tokens covering the stream; the last block is padded.

    An optional `loss_mask` (same length as the stream; e.g. False at N bases) travels with the blocks.
    """

    def __init__(self, tokens: np.ndarray, seq_len: int, pad_id: int, loss_mask: np.ndarray | None = None):
        self.tokens = torch.from_numpy(np.ascontiguousarray(tokens, dtype=np.int64))
        self.seq_len, self.pad_id = seq_len, pad_id
        self.loss_mask = None
        if loss_mask is not None:
            if len(loss_mask) != len(tokens):
                raise ValueError("loss_mask must have one entry per token")
            self.loss_mask = torch.from_numpy(np.ascontiguousarray(loss_mask, dtype=bool))

    def __len__(self) -> int:
        return math.ceil(len(self.tokens) / self.seq_len)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        block = self.tokens[i * self.seq_len : (i + 1) * self.seq_len]
        real = len(block)
        if real < self.seq_len:
            block = torch.cat([block, torch.full((self.seq_len - real,), self.pad_id, dtype=torch.long)])
        attention_mask = torch.arange(self.seq_len) < real
        item = {"input_ids": block, "attention_mask": attention_mask}
        if self.loss_mask is not None:
            mask = self.loss_mask[i * self.seq_len : (i + 1) * self.seq_len]
            item["loss_mask"] = torch.cat([mask, torch.zeros(self.seq_len - real, dtype=torch.bool)])
        return item
