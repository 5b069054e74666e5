"""Wire a RunConfig into a Lightning Trainer and fit it: `seqdiff train` and the quickstart call this.

Layout of a run directory:
  config.yaml            the resolved recipe (every field, after overrides)
  tokenizer_config.json  the tokenizer
  checkpoints/last.ckpt  the latest checkpoint (weights, EMA weights, optimizer, loop state, configs)
  logs/metrics.csv       training and validation metrics, always
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import lightning as L
import torch
import yaml
from lightning.pytorch.callbacks import ModelCheckpoint, TQDMProgressBar
from lightning.pytorch.plugins.io import TorchCheckpointIO

from seqdiff.config import RunConfig, to_dict
from seqdiff.data import build_data_module
from seqdiff.tokenizers import build_tokenizer
from seqdiff.training.csv_log import ResumableCSVLogger
from seqdiff.training.ema import EMA
from seqdiff.training.module import SeqDiffModule

LAST_CHECKPOINT = Path("checkpoints") / "last.ckpt"


class RunError(ValueError):
    """A run directory that cannot be started or resumed as asked."""


class AtomicCheckpointIO(TorchCheckpointIO):
    """Write to a temporary file, then rename: a crash mid-write never leaves a truncated checkpoint."""

    def save_checkpoint(self, checkpoint, path, storage_options=None) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        torch.save(checkpoint, tmp)
        os.replace(tmp, path)


@dataclass
class TrainResult:
    run_dir: Path
    checkpoint: Path
    module: SeqDiffModule
    trainer: L.Trainer


def resolve_precision(setting: str) -> str:
    if setting != "auto":
        return setting if setting != "32" else "32-true"
    return "bf16-mixed" if torch.cuda.is_available() else "32-true"


def train(config: RunConfig, run_dir: str | Path, resume: bool = False,
          extra_callbacks: list | None = None) -> TrainResult:
    """Train (or resume) the recipe in `run_dir`; returns the trained module and the last checkpoint."""
    run_dir = Path(run_dir)
    last = run_dir / LAST_CHECKPOINT
    if resume and not last.is_file():
        raise RunError(f"--resume: no checkpoint at {last}")
    if not resume and last.is_file():
        raise RunError(f"{run_dir} already holds a run ({last}); pass --resume to continue it or choose "
                       f"another --run-dir")
    tcfg = config.train
    tokenizer = build_tokenizer(config.data.tokenizer, **config.data.tokenizer_options)
    if config.data.seq_len > config.model.max_seq_len:
        raise RunError(f"data.seq_len={config.data.seq_len} exceeds model.max_seq_len={config.model.max_seq_len}")
    data = build_data_module(config.data, tokenizer, seed=tcfg.seed)
    data.check_files()  # fail on bad data before anything is written

    L.seed_everything(tcfg.seed, workers=True, verbose=False)
    module = SeqDiffModule(model=to_dict(config.model), method=to_dict(config.method), train=to_dict(tcfg),
                           tokenizer=tokenizer.to_dict(), seq_len=config.data.seq_len,
                           data=to_dict(config.data))
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(to_dict(config), sort_keys=False))
    tokenizer.save_pretrained(run_dir)

    callbacks = [ModelCheckpoint(dirpath=run_dir / "checkpoints", filename="step{step}", save_last=True,
                                 every_n_train_steps=tcfg.checkpoint_every, save_top_k=1,
                                 auto_insert_metric_name=False)]
    if tcfg.ema_decay > 0:
        callbacks.append(EMA(tcfg.ema_decay))
    if tcfg.progress_bar:
        callbacks.append(TQDMProgressBar(refresh_rate=max(1, tcfg.log_every)))
    callbacks += extra_callbacks or []
    resume_step = torch.load(last, map_location="cpu", weights_only=False, mmap=True)["global_step"] if resume else None
    loggers = [ResumableCSVLogger(save_dir=str(run_dir), name="logs", resume_step=resume_step)]
    if tcfg.wandb:
        from lightning.pytorch.loggers import WandbLogger

        os.environ.setdefault("WANDB_MODE", "offline")
        loggers.append(WandbLogger(project="seqdiff", name=config.name, save_dir=str(run_dir)))

    trainer = L.Trainer(
        max_steps=tcfg.max_steps,
        accelerator=tcfg.accelerator,
        devices=int(tcfg.devices) if tcfg.devices.isdigit() else tcfg.devices,
        precision=resolve_precision(tcfg.precision),
        gradient_clip_val=tcfg.grad_clip or None,
        val_check_interval=tcfg.val_every,
        check_val_every_n_epoch=None,
        limit_val_batches=tcfg.val_batches or 1.0,
        num_sanity_val_steps=0,
        log_every_n_steps=tcfg.log_every,
        callbacks=callbacks,
        logger=loggers,
        plugins=[AtomicCheckpointIO()],
        enable_progress_bar=tcfg.progress_bar,
        enable_model_summary=False,
        deterministic=tcfg.deterministic,
        default_root_dir=str(run_dir),
    )
    trainer.fit(module, datamodule=data, ckpt_path=str(last) if resume else None)
    return TrainResult(run_dir=run_dir, checkpoint=last, module=module, trainer=trainer)
