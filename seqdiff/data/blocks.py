"""Turning one long token stream into training and evaluation blocks, independent of the domain.

- Training: `RandomWindowBatches` is an endless, step-indexed stream of batches of random windows. Batch k
  depends only on (seed, k), so a run resumed at step k sees exactly the batches an uninterrupted run
  would have seen, with or without worker processes.
- Evaluation: `TiledBlocks` cuts the stream into consecutive non-overlapping blocks; the last one is
  padded, and padding is excluded from attention and from the loss, so every token is scored exactly once.
- Document blocks (a table of rows, `blocks` (N, L) + `lengths` (N,)), built from tokenized documents:
  `pack_wrapped` (MDLM's wrap: documents joined by EOS, cut into pieces of L - 2, each row BOS piece EOS;
  only the last row may be short) and `pack_padded` (one document per row, BOS doc EOS, truncated to L,
  right-padded with PAD). `RandomBlockBatches` trains on whole rows (a fresh permutation per epoch, batch k
  a function of (seed, k), rank-sliced); `PackedBlocks` evaluates every row in order.
- Packed rows (`pack_documents`, `DocumentPacker`): each document BOS doc EOS, in corpus order, one after
  the other into rows of exactly L tokens; a document that does not fit in what is left of a row is cut
  there and its rest starts the next row (a document longer than a row so becomes row-sized pieces). Each
  piece is its own document: a third table `segments` (N, L) numbers the pieces of a row 0, 1, 2, ...
  (the tail padding of the last row, the only padding, gets a number of its own), and the batches carry
  `segment_ids` and `positions` (0 at the first token of each piece) for document-aware attention and
  rotary positions. Concatenating `blocks[i, :lengths[i]]` gives back the BOS d EOS stream: no token is
  lost or repeated. Cutting at the row end (rather than moving the whole document to the next row) is
  what keeps every row full; it depends on nothing random, so the rows are the same for every seed (the
  seed orders them in training, as for the other tables).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch.utils.data import Dataset, IterableDataset, get_worker_info

from seqdiff.errors import SeqdiffError


def step_generator(seed: int, step: int) -> torch.Generator:
    """A generator whose state depends only on (seed, step)."""
    return torch.Generator().manual_seed((seed * 1_000_003 + step) % (2**63))


def rank_slice(global_batch: int, rank: int, world_size: int) -> slice:
    """The rows of a global batch that process `rank` of `world_size` trains on."""
    if global_batch % world_size != 0:
        raise SeqdiffError(f"data.batch_size={global_batch} (the global batch) does not divide by the "
                         f"{world_size} training processes")
    per_rank = global_batch // world_size
    return slice(rank * per_rank, (rank + 1) * per_rank)


class StepIndexedBatches(IterableDataset):
    """An endless stream of batches where batch k is `batch_at(k)`, a function of (seed, k) only.

    Iteration starts at `start_step` (so a resumed run continues where it stopped); with DataLoader
    workers, worker w yields steps w, w + W, ... and the DataLoader interleaves them back into step order.
    """

    start_step: int = 0

    def batch_at(self, step: int) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def __iter__(self):
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info else (0, 1)
        step = self.start_step + worker  # workers take turns; the DataLoader interleaves them in order
        while True:
            yield self.batch_at(step)
            step += workers


class RandomWindowBatches(StepIndexedBatches):
    """Yields {"input_ids": (B, L)} batches of windows at uniformly random offsets, from `start_step` on.

    `batch_size` is the global batch; with several processes each takes its `rank_slice` of the same
    global batch, so the data of a step do not depend on the number of processes.
    """

    def __init__(self, tokens: np.ndarray, seq_len: int, batch_size: int, seed: int, start_step: int = 0,
                 rank: int = 0, world_size: int = 1):
        if len(tokens) < seq_len:
            raise SeqdiffError(f"the training split has {len(tokens)} tokens, fewer than data.seq_len={seq_len}")
        self.tokens = torch.from_numpy(np.ascontiguousarray(tokens, dtype=np.int64))
        self.seq_len, self.batch_size, self.seed, self.start_step = seq_len, batch_size, seed, start_step
        self.rows = rank_slice(batch_size, rank, world_size)

    def batch_at(self, step: int) -> dict[str, torch.Tensor]:
        g = step_generator(self.seed, step)
        starts = torch.randint(0, len(self.tokens) - self.seq_len + 1, (self.batch_size,), generator=g)
        index = starts[self.rows, None] + torch.arange(self.seq_len)  # (B / world_size, L)
        return {"input_ids": self.tokens[index]}



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


# ------------------------------------------------------------------------------ document blocks
def pack_wrapped(documents: list[np.ndarray], seq_len: int, bos_id: int, eos_id: int,
                 pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """Documents joined by EOS (d1 EOS d2 EOS ...), cut into pieces of seq_len - 2, each row BOS piece EOS.

    Returns (blocks (N, L) int32, lengths (N,) int32); every row but the last is full, the last is
    padded after its EOS. Concatenating `blocks[i, 1:lengths[i] - 1]` gives back the joined stream.
    """
    if seq_len < 3:
        raise SeqdiffError(f"wrapped blocks need seq_len >= 3, got {seq_len}")
    eos = np.array([eos_id], dtype=np.int32)
    parts = [p for doc in documents for p in (np.asarray(doc, dtype=np.int32), eos)]
    stream = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int32)
    piece = seq_len - 2
    full, rest = divmod(len(stream), piece)
    rows = full + (rest > 0)
    blocks = np.full((rows, seq_len), pad_id, dtype=np.int32)
    lengths = np.full(rows, seq_len, dtype=np.int32)
    blocks[:, 0] = bos_id
    blocks[:full, 1:-1] = stream[: full * piece].reshape(full, piece)
    blocks[:full, -1] = eos_id
    if rest:
        blocks[full, 1 : 1 + rest] = stream[full * piece :]
        blocks[full, 1 + rest] = eos_id
        lengths[full] = rest + 2
    return blocks, lengths


def pack_padded(documents: list[np.ndarray], seq_len: int, bos_id: int, eos_id: int,
                pad_id: int) -> tuple[np.ndarray, np.ndarray, int]:
    """One document per row: BOS doc EOS, the document truncated to seq_len - 2 tokens, then PAD.

    Returns (blocks (N, L) int32, lengths (N,) int32 real tokens per row, number of truncated documents).
    """
    if seq_len < 3:
        raise SeqdiffError(f"padded blocks need seq_len >= 3, got {seq_len}")
    blocks = np.full((len(documents), seq_len), pad_id, dtype=np.int32)
    lengths = np.zeros(len(documents), dtype=np.int32)
    truncated = 0
    for i, doc in enumerate(documents):
        doc = np.asarray(doc)
        if len(doc) > seq_len - 2:
            truncated += 1
            doc = doc[: seq_len - 2]
        blocks[i, 0] = bos_id
        blocks[i, 1 : 1 + len(doc)] = doc
        blocks[i, 1 + len(doc)] = eos_id
        lengths[i] = len(doc) + 2
    return blocks, lengths, truncated


class DocumentPacker:
    """Packed rows one document at a time (`pack_documents` is this over a list): BOS doc EOS appended to a
    stream that is cut into rows of seq_len; keeps less than one row between calls.

    `add` and `finish` return (blocks (n, L) int32, lengths (n,) int32, segments (n, L) int32).
    """

    arrays = ("blocks", "lengths", "segments")
    """The tables it fills (what the cache stores)."""

    def __init__(self, seq_len: int, bos_id: int, eos_id: int, pad_id: int):
        if seq_len < 3:
            raise SeqdiffError(f"packed blocks need seq_len >= 3, got {seq_len}")
        self.seq_len, self.bos, self.eos, self.pad = seq_len, bos_id, eos_id, pad_id
        self.tokens = np.zeros(0, dtype=np.int32)  # the start of the next row
        self.docs = np.zeros(0, dtype=np.int64)  # the document index of each of those tokens
        self.count = 0  # documents seen
        self.truncated = 0  # never: nothing is cut off (for the meta data the other packers report)

    def _rows(self, tokens: np.ndarray, docs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        L = self.seq_len
        blocks = tokens.reshape(-1, L)
        docs = docs.reshape(-1, L)
        segments = (docs - docs[:, :1]).astype(np.int32)  # pieces numbered from 0 in each row
        return blocks, np.full(len(blocks), L, dtype=np.int32), segments

    def add(self, doc: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        doc = np.asarray(doc, dtype=np.int32)
        piece = np.concatenate([np.array([self.bos], np.int32), doc, np.array([self.eos], np.int32)])
        tokens = np.concatenate([self.tokens, piece])
        docs = np.concatenate([self.docs, np.full(len(piece), self.count, dtype=np.int64)])
        self.count += 1
        full = len(tokens) // self.seq_len * self.seq_len
        self.tokens, self.docs = tokens[full:], docs[full:]
        return self._rows(tokens[:full], docs[:full])

    def finish(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The last row, right-padded (the padding its own segment); nothing if the stream ended on a row."""
        rest = len(self.tokens)
        if not rest:
            return np.zeros((0, self.seq_len), np.int32), np.zeros(0, np.int32), np.zeros((0, self.seq_len), np.int32)
        pad = self.seq_len - rest
        tokens = np.concatenate([self.tokens, np.full(pad, self.pad, dtype=np.int32)])
        docs = np.concatenate([self.docs, np.full(pad, self.docs[-1] + 1, dtype=np.int64)])
        blocks, _, segments = self._rows(tokens, docs)
        self.tokens, self.docs = self.tokens[:0], self.docs[:0]
        return blocks, np.array([rest], dtype=np.int32), segments


def segment_dtype(seq_len: int) -> np.dtype:
    """The dtype stored for a table of segment ids (fewer than seq_len per row): uint16 when it holds them."""
    return np.dtype(np.uint16 if seq_len <= np.iinfo(np.uint16).max + 1 else np.int32)


def pack_documents(documents: list[np.ndarray], seq_len: int, bos_id: int, eos_id: int,
                   pad_id: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Packed rows of `documents` (see the module docstring): (blocks (N, L), lengths (N,), segments (N, L)),
    int32; every row is full but the last, whose padding follows its `lengths` real tokens."""
    packer = DocumentPacker(seq_len, bos_id, eos_id, pad_id)
    parts = [packer.add(doc) for doc in documents] + [packer.finish()]
    return tuple(np.concatenate([p[i] for p in parts]) for i in range(3))  # type: ignore[return-value]


def segment_positions(segment_ids: torch.Tensor) -> torch.Tensor:
    """(..., L) segment ids -> (..., L) positions: 0 at the first token of each run of equal ids, then 1, 2, ..."""
    L = segment_ids.shape[-1]
    index = torch.arange(L, device=segment_ids.device).expand_as(segment_ids)
    starts = torch.ones_like(segment_ids, dtype=torch.bool)
    starts[..., 1:] = segment_ids[..., 1:] != segment_ids[..., :-1]
    first = torch.where(starts, index, torch.zeros_like(index)).cummax(-1).values  # (..., L) start of the run
    return index - first


def _rows_to_batch(blocks: np.ndarray, lengths: np.ndarray, index: np.ndarray,
                   segments: np.ndarray | None = None) -> dict[str, torch.Tensor]:
    ids = torch.from_numpy(np.asarray(blocks[index], dtype=np.int64))  # (b, L)
    real = torch.from_numpy(np.asarray(lengths[index], dtype=np.int64))  # (b,)
    batch = {"input_ids": ids, "attention_mask": torch.arange(ids.shape[-1]) < real[..., None]}
    if segments is not None:  # packed rows: which document each token belongs to, and its place in it
        seg = torch.from_numpy(np.asarray(segments[index], dtype=np.int64))  # (b, L)
        batch["segment_ids"], batch["positions"] = seg, segment_positions(seg)
    return batch


class RandomBlockBatches(StepIndexedBatches):
    """Yields {"input_ids", "attention_mask"} batches of whole rows of a block table, from `start_step` on.

    Rows are visited in a fresh random permutation each epoch: global sample i (= step * batch_size + j)
    is row perm_e[i mod N] with e = i // N, and perm_e depends only on (seed, e) — so batch k depends only
    on (seed, k), and each process takes its `rank_slice` of the global batch, as in RandomWindowBatches.
    """

    def __init__(self, blocks: np.ndarray, lengths: np.ndarray, batch_size: int, seed: int, start_step: int = 0,
                 rank: int = 0, world_size: int = 1, segments: np.ndarray | None = None):
        if len(blocks) == 0:
            raise SeqdiffError("the training split has no blocks (no non-empty documents?)")
        if len(lengths) != len(blocks) or (segments is not None and segments.shape != blocks.shape):
            raise ValueError("lengths must have one entry per block (and segments one per token)")
        self.blocks, self.lengths, self.segments = blocks, lengths, segments
        self.batch_size, self.seed, self.start_step = batch_size, seed, start_step
        self.rows = rank_slice(batch_size, rank, world_size)
        self._perm: tuple[int, torch.Tensor] | None = None

    def permutation(self, epoch: int) -> torch.Tensor:
        if self._perm is None or self._perm[0] != epoch:
            g = step_generator(self.seed ^ 0x5DEECE66D, epoch)  # its own stream, apart from the window draws
            self._perm = (epoch, torch.randperm(len(self.blocks), generator=g))
        return self._perm[1]

    def batch_at(self, step: int) -> dict[str, torch.Tensor]:
        n = len(self.blocks)
        samples = np.arange(step * self.batch_size, (step + 1) * self.batch_size)[self.rows]
        index = np.empty(len(samples), dtype=np.int64)
        for epoch in np.unique(samples // n):
            here = samples // n == epoch
            index[here] = self.permutation(int(epoch)).numpy()[samples[here] % n]
        return _rows_to_batch(self.blocks, self.lengths, index, self.segments)

class PackedBlocks(Dataset):
    """Every row of a block table, in order, with its attention mask (False on padding) and, for packed
    rows, its segment ids and positions."""

    def __init__(self, blocks: np.ndarray, lengths: np.ndarray, segments: np.ndarray | None = None):
        if len(lengths) != len(blocks) or (segments is not None and segments.shape != blocks.shape):
            raise ValueError("lengths must have one entry per block (and segments one per token)")
        self.blocks, self.lengths, self.segments = blocks, lengths, segments

    def __len__(self) -> int:
        return len(self.blocks)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        item = _rows_to_batch(self.blocks, self.lengths, np.array([i]), self.segments)
        return {k: v[0] for k, v in item.items()}
