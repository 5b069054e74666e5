"""FASTA data module (`data.kind: fasta`): windows of a reference genome, split by BED, chromosomes or blocks.

Training batches are random windows, step-indexed (batch k depends only on (seed, k); a resumed run starts
at the trainer's global step); validation and test are deterministic tilings of the held-out intervals.
N is excluded from the loss. See seqdiff.data.genome for the reading, splitting and windowing rules.
"""

from __future__ import annotations

from torch.utils.data import DataLoader

from seqdiff.config import DataConfig
from seqdiff.data.blocks import step_generator
from seqdiff.data.genome import (
    SPLITS,
    FastaHandle,
    GenomeError,
    Interval,
    RandomGenomeWindows,
    TiledGenomeWindows,
    open_fasta,
    read_bed,
    split_by_blocks,
    split_by_chromosome,
    summarize,
)
from seqdiff.tokenizers.base import Tokenizer
from seqdiff.tokenizers.nucleotide import NucleotideTokenizer


class FastaData:
    """Random genome windows for training (step-indexed, resumable), tiled windows for validation and test.

    Without Lightning, for evaluation; training uses FastaDataModule (seqdiff.data.modules: this class with
    LightningDataModule's hooks, whose trainer gives train_dataloader its step)."""

    def __init__(self, config: DataConfig, tokenizer: Tokenizer, seed: int = 0):
        super().__init__()  # LightningDataModule's, in FastaDataModule
        self.config, self.tokenizer, self.seed = config, tokenizer, seed
        self._fasta: FastaHandle | None = None
        self._intervals: list[Interval] | None = None
        self._tiled: dict[str, TiledGenomeWindows] = {}

    # ------------------------------------------------------------------ files and splits
    @property
    def fasta(self) -> FastaHandle:
        if self._fasta is None:
            if not self.config.fasta.path:
                raise GenomeError("data.kind=fasta needs data.fasta.path=PATH (a plain or bgzip FASTA)")
            self._fasta = open_fasta(self.config.fasta.path)
        return self._fasta

    def intervals(self) -> list[Interval]:
        """All intervals of the three splits (built once)."""
        if self._intervals is None:
            cfg, fasta = self.config.fasta, self.fasta
            if cfg.split_mode == "bed":
                if not cfg.bed:
                    raise GenomeError("data.fasta.split_mode=bed needs data.fasta.bed=PATH (lines `chrom start "
                                      "end split`)")
                intervals = read_bed(cfg.bed, fasta)
                if cfg.chromosomes:  # optional restriction to some chromosomes
                    keep = {fasta.resolve(c, "data.fasta.chromosomes") for c in cfg.chromosomes}
                    intervals = [iv for iv in intervals if iv.chrom in keep]
            elif cfg.split_mode == "chromosomes":
                if not cfg.valid_chromosomes or not cfg.test_chromosomes:
                    raise GenomeError("data.fasta.split_mode=chromosomes needs data.fasta.valid_chromosomes and "
                                      "data.fasta.test_chromosomes")
                intervals = split_by_chromosome(fasta, cfg.valid_chromosomes, cfg.test_chromosomes,
                                                cfg.chromosomes or None)
            else:  # blocks
                chroms = cfg.chromosomes or (fasta.names if len(fasta.names) == 1 else [])
                if not chroms:
                    raise GenomeError(f"data.fasta.split_mode=blocks needs data.fasta.chromosomes (e.g. [chr20]); "
                                      f"the FASTA holds {len(fasta.names)} sequences")
                intervals = []
                for chrom in chroms:
                    intervals += split_by_blocks(fasta, chrom, cfg.block_size, cfg.valid_fraction,
                                                 cfg.test_fraction, gap=self.config.seq_len, seed=cfg.split_seed)
            self._intervals = intervals
        return self._intervals

    def split_intervals(self, split: str) -> list[Interval]:
        if split not in SPLITS:
            raise GenomeError(f"split {split!r} is unknown; choose one of {list(SPLITS)}")
        return [iv for iv in self.intervals() if iv.split == split]

    def check_files(self, splits=SPLITS) -> None:
        """Fail early (before any training writes) on a missing / bad FASTA or BED, or an empty split."""
        if not isinstance(self.tokenizer, NucleotideTokenizer):
            raise GenomeError(f"data.kind=fasta needs data.tokenizer=nucleotide, got {type(self.tokenizer).__name__}")
        sizes = summarize(self.intervals())
        for split in splits:
            longest = max((len(iv) for iv in self.split_intervals(split)), default=0)
            if longest == 0:
                raise GenomeError(f"{self.config.fasta.path}: the {split} split is empty (split_mode="
                                  f"{self.config.fasta.split_mode}); intervals per split: {sizes}")
            if split == "train" and longest < self.config.seq_len:
                raise GenomeError(f"{self.config.fasta.path}: no training interval holds a window of data.seq_len="
                                  f"{self.config.seq_len} bases (longest: {longest})")

    def check_windows(self, splits=("train", "valid")) -> None:
        """Fail before training writes anything when a split's windows are unusable (mostly N): one training
        window is drawn (up to its max_draws tries) and the evaluation splits are tiled (kept for later)."""
        for split in splits:
            if split == "train":
                self.train_dataset().draw(step_generator(self.seed, 0))
            else:
                self.eval_dataset(split)

    # ------------------------------------------------------------------ datasets and loaders
    def train_dataset(self, start_step: int = 0) -> RandomGenomeWindows:
        cfg, fa = self.config, self.config.fasta
        return RandomGenomeWindows(self.fasta, self.split_intervals("train"), cfg.seq_len, cfg.batch_size,
                                   self.tokenizer, self.seed, start_step=start_step,
                                   max_n_fraction=fa.max_n_fraction, rc_augment=fa.rc_augment,
                                   keep_soft_mask=fa.keep_soft_mask)

    def eval_dataset(self, split: str) -> TiledGenomeWindows:
        if split not in self._tiled:
            cfg, fa = self.config, self.config.fasta
            data = TiledGenomeWindows(self.fasta, self.split_intervals(split), cfg.seq_len, self.tokenizer,
                                      max_n_fraction=fa.max_n_fraction, keep_soft_mask=fa.keep_soft_mask)
            if len(data) == 0:
                raise GenomeError(f"{fa.path}: every {split} window has more than {fa.max_n_fraction:.0%} N "
                                  f"(data.fasta.max_n_fraction)")
            self._tiled[split] = data
        return self._tiled[split]

    def train_dataloader(self) -> DataLoader:
        trainer = getattr(self, "trainer", None)  # FastaDataModule's, while a Trainer fits it
        start = trainer.global_step if trainer is not None else 0  # resume mid-run exactly
        if trainer is not None and trainer.world_size > 1:
            raise GenomeError("multi-process training on FASTA data is not supported yet (every process would "
                              "draw the same windows); train with one process")
        return DataLoader(self.train_dataset(start), batch_size=None, num_workers=self.config.num_workers,
                          persistent_workers=self.config.num_workers > 0)

    def eval_dataloader(self, split: str) -> DataLoader:
        return DataLoader(self.eval_dataset(split), batch_size=self.config.eval_batch_size, shuffle=False,
                          num_workers=self.config.num_workers)

    def val_dataloader(self) -> DataLoader:
        return self.eval_dataloader("valid")

    def test_dataloader(self) -> DataLoader:
        return self.eval_dataloader("test")
