"""Fine-tuning: an encoder ((ids, mask) -> features) plus a linear classification head, trained end to end
with Lightning; the epoch with the best validation accuracy is kept (model selection on validation) and
only that one is scored on the test set.

Optionally in two phases (LP-FT, Kumar et al. 2022, "Fine-Tuning can Distort Pretrained Features"): first
`head_epochs` with the encoder frozen, so the fresh head is already useful when the encoder starts to move,
then end-to-end epochs with the encoder's learning rate scaled by `encoder_lr_scale`. Large early gradients
through a random head are what distorts pretrained features; both knobs limit them. With `head_init="probe"`
the head starts as the frozen probe itself (logistic regression on the frozen features, C chosen on
validation, its standardization folded into the weights), the LP of Kumar et al.'s LP-FT; that starting
point is scored on validation as epoch 0 and competes with the fine-tuned epochs.

The encoder is a pretrained backbone (`embeddings.BackboneEncoder`, mean pooling over real positions), the
same backbone randomly initialized, or the Genomic Benchmarks CNN.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import warnings
from dataclasses import dataclass

import lightning as L
import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset

from seqdiff.optim import adamw_with_warmup, lightning_optimizers, lr_multiplier
from seqdiff.probes.data import ProbeError
from seqdiff.probes.linear import fit_logistic_model

HEAD_INITS = ("random", "probe")


@dataclass
class FinetuneConfig:
    epochs: int = 3
    """Passes over the training split; the best epoch on validation is kept."""
    lr: float = 3e-4
    """AdamW learning rate (constant after a linear warm-up over the first 10% of steps)."""
    weight_decay: float = 0.01
    batch_size: int = 32
    dropout: float = 0.1
    """Dropout on the pooled features before the head."""
    head_epochs: int = 0
    """Epochs that train only the head, encoder frozen, before the `epochs` end-to-end ones (LP-FT)."""
    encoder_lr_scale: float = 1.0
    """The encoder's learning rate is lr * encoder_lr_scale; the head's is lr."""
    head_init: str = "random"
    """"random" (PyTorch's default Linear init) or "probe" (the fitted frozen linear probe; see the module doc)."""

    def __post_init__(self) -> None:
        if self.head_init not in HEAD_INITS:
            raise ProbeError(f"head_init {self.head_init!r} is unknown; choose one of {list(HEAD_INITS)}")
        needs = 0 if self.head_init == "probe" else 1  # a probe head is a model before any epoch
        if self.epochs < 0 or self.head_epochs < 0 or self.epochs + self.head_epochs < needs:
            raise ProbeError(f"fine-tuning needs epochs >= 0, head_epochs >= 0 and at least one epoch in all, "
                             f"got epochs={self.epochs}, head_epochs={self.head_epochs}")
        if not self.encoder_lr_scale >= 0:
            raise ProbeError(f"encoder_lr_scale must be >= 0, got {self.encoder_lr_scale}")


class SequenceClassifier(L.LightningModule):
    """encoder -> dropout -> Linear(classes); cross-entropy. Keeps the weights of its best validation epoch.

    During the first `head_epochs` epochs the encoder is frozen (no gradients, so AdamW, weight decay
    included, leaves it bit-identical) and kept in eval mode (no dropout inside it)."""

    def __init__(self, encoder: nn.Module, num_classes: int, lr: float = 3e-4, weight_decay: float = 0.01,
                 dropout: float = 0.1, warmup_steps: int = 0, head_epochs: int = 0,
                 encoder_lr_scale: float = 1.0) -> None:
        super().__init__()
        self.save_hyperparameters(ignore=["encoder"], logger=False)
        self.encoder = encoder
        self.dropout = nn.Dropout(dropout)
        self.head = nn.Linear(encoder.out_features, num_classes)
        self._val_counts = torch.zeros(2)
        self.best_accuracy, self.best_epoch = -1.0, -1
        self.best_state: dict[str, Tensor] | None = None

    def forward(self, ids: Tensor, mask: Tensor) -> Tensor:
        return self.head(self.dropout(self.encoder(ids, mask)))  # (B, classes)

    def encoder_frozen(self) -> bool:
        return self.current_epoch < self.hparams.head_epochs

    def on_train_epoch_start(self) -> None:
        frozen = self.encoder_frozen()
        for p in self.encoder.parameters():
            p.requires_grad_(not frozen)
        self.encoder.train(not frozen)  # Lightning restores each module's mode after validation: set it each epoch

    def training_step(self, batch, batch_idx):
        ids, mask, labels = batch
        loss = F.cross_entropy(self(ids, mask), labels)
        self.log("train/loss", loss, prog_bar=False)
        return loss

    def validation_step(self, batch, batch_idx):
        ids, mask, labels = batch
        correct = (self(ids, mask).argmax(-1) == labels).sum()
        self._val_counts += torch.stack([correct.cpu().float(), torch.tensor(float(len(labels)))])

    def on_validation_epoch_end(self):
        correct, total = self._val_counts
        self._val_counts = torch.zeros(2)
        if total == 0 or self.trainer.sanity_checking:
            return
        accuracy = float(correct / total)
        self.log("val/accuracy", accuracy)
        if accuracy > self.best_accuracy:  # model selection on validation: keep this epoch's weights
            self.best_accuracy, self.best_epoch = accuracy, self.current_epoch
            self.best_state = copy.deepcopy(self.state_dict())

    def configure_optimizers(self):
        groups = [{"params": list(self.head.parameters()), "lr": self.hparams.lr},
                  {"params": list(self.encoder.parameters()), "lr": self.hparams.lr * self.hparams.encoder_lr_scale}]
        return lightning_optimizers(*adamw_with_warmup(groups, lr_multiplier(self.hparams.warmup_steps),
                                                       lr=self.hparams.lr, weight_decay=self.hparams.weight_decay))


def loader(ids: Tensor, mask: Tensor, labels: Tensor, batch_size: int, shuffle: bool, seed: int = 0) -> DataLoader:
    generator = torch.Generator().manual_seed(seed)
    return DataLoader(TensorDataset(ids, mask, labels), batch_size=batch_size, shuffle=shuffle, generator=generator)


@contextlib.contextmanager
def _quiet():
    """Lightning's per-fit banners (accelerator, tips, deprecations) would repeat for every seed."""
    log = logging.getLogger("lightning.pytorch")
    level = log.level
    log.setLevel(logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*(LeafSpec|does not have many workers|litlogger).*")
            yield
    finally:
        log.setLevel(level)


@torch.no_grad()
def predict(module: nn.Module, ids: Tensor, mask: Tensor, batch_size: int = 128) -> Tensor:
    module.eval()
    device = next(module.parameters()).device
    out = [module(ids[i:i + batch_size].to(device), mask[i:i + batch_size].to(device)).argmax(-1).cpu()
           for i in range(0, len(ids), batch_size)]
    return torch.cat(out)


@torch.no_grad()
def frozen_features(encoder: nn.Module, ids: Tensor, mask: Tensor, batch_size: int = 128) -> np.ndarray:
    """(N, F) float64 features of the encoder in eval mode (what the head sees, without dropout)."""
    encoder.eval()
    device = next(encoder.parameters()).device
    out = [encoder(ids[i:i + batch_size].to(device), mask[i:i + batch_size].to(device)).double().cpu()
           for i in range(0, len(ids), batch_size)]
    return torch.cat(out).numpy()


def fit_probe_head(head: nn.Linear, encoder: nn.Module, data: dict[str, tuple[Tensor, Tensor, Tensor]],
                   seed: int) -> dict:
    """Set `head` to the frozen linear probe: standardized features -> logistic regression (C on validation).

    Standardization x -> (x - mean) / scale is folded in: W = coef / scale, b = intercept - W @ mean. A binary
    model's single logit z becomes the two logits (0, z), whose softmax is sigmoid(z): the same probabilities.
    """
    feats = {split: frozen_features(encoder, ids, mask) for split, (ids, mask, _) in data.items() if split != "test"}
    labels = {split: data[split][2].numpy() for split in feats}
    scaler, model, choice = fit_logistic_model(feats, labels, seed)
    coef = model.coef_ / scaler.scale_  # (C or 1, F)
    bias = model.intercept_ - coef @ scaler.mean_
    if coef.shape[0] == 1:  # binary: logits (0, z)
        coef, bias = np.concatenate([np.zeros_like(coef), coef]), np.concatenate([[0.0], bias])
    with torch.no_grad():
        head.weight.copy_(torch.from_numpy(coef))
        head.bias.copy_(torch.from_numpy(bias))
    return choice


def finetune(encoder: nn.Module, num_classes: int, data: dict[str, tuple[Tensor, Tensor, Tensor]],
             config: FinetuneConfig, seed: int, accelerator: str = "cpu") -> tuple[float, float, int]:
    """(validation accuracy, test accuracy, best epoch) of encoder + head trained on data["train"].

    data maps train / val / test to (ids, mask, labels) tensors.
    """
    val_acc, test_pred, epoch = finetune_predict(encoder, num_classes, data, config, seed, accelerator)
    return val_acc, float((torch.from_numpy(test_pred) == data["test"][2]).float().mean()), epoch


def finetune_predict(encoder: nn.Module, num_classes: int, data: dict[str, tuple[Tensor, Tensor, Tensor]],
                     config: FinetuneConfig, seed: int, accelerator: str = "cpu") -> tuple[float, np.ndarray, int]:
    """(validation accuracy, test predictions (N_test,) int64, best epoch): `finetune` with the predictions
    kept, for test metrics other than accuracy."""
    L.seed_everything(seed, workers=False, verbose=False)
    epochs = config.head_epochs + config.epochs
    steps = epochs * -(-len(data["train"][0]) // config.batch_size)
    module = SequenceClassifier(encoder, num_classes, lr=config.lr, weight_decay=config.weight_decay,
                                dropout=config.dropout, warmup_steps=max(1, steps // 10),
                                head_epochs=config.head_epochs, encoder_lr_scale=config.encoder_lr_scale)
    if config.head_init == "probe":  # epoch 0: the probe head on the untouched encoder, scored on validation
        module.probe_choice = fit_probe_head(module.head, encoder, data, seed)
        val_ids, val_mask, val_labels = data["val"]
        module.best_accuracy = float((predict(module, val_ids, val_mask) == val_labels).float().mean())
        module.best_epoch, module.best_state = -1, copy.deepcopy(module.state_dict())
    if epochs == 0:
        test_ids, test_mask, _ = data["test"]
        return module.best_accuracy, predict(module, test_ids, test_mask).numpy(), module.best_epoch
    module.train()  # the probe head's scoring left it in eval mode, which Lightning would keep for training
    with _quiet():
        trainer = L.Trainer(max_epochs=epochs, accelerator=accelerator, devices=1, logger=False,
                            enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                            num_sanity_val_steps=0)
        trainer.fit(module, loader(*data["train"], config.batch_size, shuffle=True, seed=seed),
                    loader(*data["val"], 256, shuffle=False))
    module.load_state_dict(module.best_state)
    for p in module.encoder.parameters():
        p.requires_grad_(True)
    test_ids, test_mask, _ = data["test"]
    return module.best_accuracy, predict(module, test_ids, test_mask).numpy(), module.best_epoch
