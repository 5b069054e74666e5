"""The Lightning data modules: each data class of seqdiff.data with LightningDataModule's hooks, for training.

Why apart: Lightning takes seconds to import (it imports torchmetrics, transformers and torch._dynamo), and
evaluation (`seqdiff eval`, zero-shot scores, the frontier) reads the same splits through the plain classes
(seqdiff.data.build_data) without it. The Trainer sets `trainer` on these, from which train_dataloader reads the
step to resume at and the process's rank.
"""

from __future__ import annotations

import lightning as L

from seqdiff.data.fasta import FastaData
from seqdiff.data.text import TextData


class TextDataModule(TextData, L.LightningDataModule):
    """TextData for a Lightning Trainer."""


class FastaDataModule(FastaData, L.LightningDataModule):
    """FastaData for a Lightning Trainer."""
