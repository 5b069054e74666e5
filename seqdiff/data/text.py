"""Text data module: a corpus (builtin or a user's folder / files) tokenized into one stream per split."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import numpy as np
from torch.utils.data import DataLoader

from seqdiff.config import DataConfig
from seqdiff.data.blocks import RandomWindowBatches, TiledBlocks
from seqdiff.data.text_files import DataFileError, corpus_split_path, read_text_file
from seqdiff.tokenizers.base import Tokenizer, TokenizerError

SPLITS = ("train", "valid", "test")


def split_path(config: DataConfig, split: str) -> Path:
    explicit = getattr(config, f"{split}_file")
    return Path(explicit) if explicit else corpus_split_path(config.corpus, split)


def tokenize_file(path: str | Path, tokenizer: Tokenizer) -> np.ndarray:
    """Read and tokenize one file; errors name the file."""
    text = read_text_file(path)
    try:
        ids = tokenizer.encode(text)
    except TokenizerError as e:
        raise DataFileError(f"{path}: {e}") from e
    if len(ids) == 0:
        raise DataFileError(f"{path}: no tokens after tokenization")
    return ids


class TextDataModule(L.LightningDataModule):
    """Random windows for training (step-indexed, resumable), tiled blocks for validation and test."""

    def __init__(self, config: DataConfig, tokenizer: Tokenizer, seed: int = 0):
        super().__init__()
        self.config, self.tokenizer, self.seed = config, tokenizer, seed
        self.tokens: dict[str, np.ndarray] = {}

    def check_files(self, splits=SPLITS) -> None:
        """Fail early (before any training) on a missing, empty or malformed file."""
        for split in splits:
            self.split_tokens(split)

    def split_tokens(self, split: str) -> np.ndarray:
        if split not in self.tokens:
            self.tokens[split] = tokenize_file(split_path(self.config, split), self.tokenizer)
        return self.tokens[split]

    def train_dataloader(self) -> DataLoader:
        trainer = self.trainer
        start = trainer.global_step if trainer is not None else 0  # resume mid-run exactly
        rank, world = (trainer.global_rank, trainer.world_size) if trainer is not None else (0, 1)
        data = RandomWindowBatches(self.split_tokens("train"), self.config.seq_len, self.config.batch_size,
                                   self.seed, start_step=start, rank=rank, world_size=world)
        return DataLoader(data, batch_size=None, num_workers=self.config.num_workers,
                          persistent_workers=self.config.num_workers > 0)

    def eval_dataloader(self, split: str) -> DataLoader:
        data = TiledBlocks(self.split_tokens(split), self.config.seq_len, self.tokenizer.pad_id)
        return DataLoader(data, batch_size=self.config.eval_batch_size, shuffle=False,
                          num_workers=self.config.num_workers)

    def val_dataloader(self) -> DataLoader:
        return self.eval_dataloader("valid")

    def test_dataloader(self) -> DataLoader:
        return self.eval_dataloader("test")
