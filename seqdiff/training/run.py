"""Wire a RunConfig into a Lightning Trainer and fit it: `seqdiff train` and the quickstart call this.

Layout of a run directory:
  config.yaml            the resolved recipe (every field, after overrides)
  tokenizer_config.json  the tokenizer
  checkpoints/last.ckpt  the latest checkpoint (weights, EMA weights, optimizer, loop state, configs)
  checkpoints/step*.ckpt the same, named by step: `--resume` falls back to the newest readable one when
                         last.ckpt is corrupted (seqdiff.checkpoint.latest_readable_checkpoint)
  logs/metrics.csv       training and validation metrics, always

Several processes (train.strategy=ddp, train.devices, train.num_nodes): every process runs this function;
data.batch_size is the global batch, split across processes by the data module, and only global rank 0
writes files.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import lightning as L
import torch
import yaml
from lightning.pytorch.callbacks import ModelCheckpoint, TQDMProgressBar
from lightning.pytorch.plugins.io import TorchCheckpointIO
from lightning.pytorch.strategies import StrategyRegistry
from lightning.pytorch.utilities.rank_zero import rank_zero_only, rank_zero_warn

from seqdiff.backbones import BLOCKS, load_pretrained, pretrained_model_config
from seqdiff.checkpoint import CheckpointError, latest_readable_checkpoint, step_checkpoints
from seqdiff.config import RunConfig, TrainConfig, to_dict
from seqdiff.data import build_data_module
from seqdiff.methods import build_model
from seqdiff.tokenizers import build_tokenizer
from seqdiff.training.csv_log import ResumableCSVLogger
from seqdiff.training.ema import EMA
from seqdiff.training.fsdp2 import FSDP2Strategy, is_sharded, unsharded_copy
from seqdiff.training.module import SeqDiffModule, check_micro_batch

LAST_CHECKPOINT = Path("checkpoints") / "last.ckpt"
SEQDIFF_STRATEGIES = {"fsdp2": FSDP2Strategy}
"""train.strategy names that seqdiff builds itself; every other name goes to Lightning's registry."""


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


class StepCheckpoint(ModelCheckpoint):
    """ModelCheckpoint that also writes the final step when max_steps is not a multiple of checkpoint_every.

    Lightning's own writes last.ckpt at the end of training only when no checkpoint was written before, so a
    run of 250 steps checkpointed every 83 would end with the weights of step 249 on disk (and a second call
    would resume it for one step, again and again).
    """

    def on_train_end(self, trainer, pl_module) -> None:
        if not self._should_skip_saving_checkpoint(trainer):  # skips when this step is already on disk
            candidates = self._monitor_candidates(trainer)
            self._save_topk_checkpoint(trainer, candidates)
            self._save_last_checkpoint(trainer, candidates)
        super().on_train_end(trainer, pl_module)


class WandbSamples(L.Callback):
    """After each validation (EMA weights swapped in), log a table of samples to the wandb run (rank 0).

    Under train.strategy=fsdp2 rank 0 samples from a gathered, unsharded copy of the weights.

    Sampling follows the recipe's `sample` section; a sampler that refuses the model only skips the table.
    """

    def __init__(self, config: RunConfig):
        self.config = config

    @torch.no_grad()
    def on_validation_epoch_end(self, trainer, pl_module) -> None:
        from lightning.pytorch.loggers import WandbLogger

        wandb_loggers = [lg for lg in trainer.loggers if isinstance(lg, WandbLogger)]
        if trainer.sanity_checking or not wandb_loggers:
            return
        backbone = pl_module.backbone
        if is_sharded(backbone):  # every process takes part in gathering the weights; rank 0 samples
            backbone = unsharded_copy(backbone, lambda: build_model(pl_module.model_config, pl_module.method_config,
                                                                    pl_module.tokenizer)[1])
        if not trainer.is_global_zero:
            return
        from seqdiff.checkpoint import LoadedModel
        from seqdiff.evaluation.generate import generate

        model = LoadedModel(backbone=backbone, method=pl_module.method, tokenizer=pl_module.tokenizer,
                            model_config=pl_module.model_config, method_config=pl_module.method_config,
                            data_config=self.config.data, seq_len=self.config.data.seq_len,
                            step=trainer.global_step, path=Path(trainer.default_root_dir),
                            ema=self.config.train.ema_decay > 0)
        try:
            gen = generate(model, self.config.sample)
        except Exception as e:  # samples are a convenience: never stop a training run for them
            rank_zero_warn(f"wandb samples skipped: {e}")
            return
        wandb_loggers[0].log_text(key="samples", columns=["step", "sample"],
                                  data=[[trainer.global_step, text] for text in gen.texts], step=trainer.global_step)


@dataclass
class TrainResult:
    run_dir: Path
    checkpoint: Path
    module: SeqDiffModule
    trainer: L.Trainer


def _add_training_time(run_dir: Path, seconds: float, step: int) -> None:
    """Accumulate wall-clock training time across resumes in <run_dir>/timing.json."""
    path = run_dir / "timing.json"
    total = json.loads(path.read_text()).get("train_seconds", 0.0) if path.is_file() else 0.0
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"train_seconds": total + seconds, "step": step}) + "\n")
    os.replace(tmp, path)


def resolve_init_from(value: str) -> Path:
    """`model.init_from`: a directory, or the name of a fetched data source (`bert-vocab`) in the data directory."""
    from seqdiff.data.fetch import SOURCES, source_path

    path = Path(value).expanduser()
    if not path.exists() and value in SOURCES:
        return source_path(value)
    return path


def build_strategy(tcfg: TrainConfig) -> tuple[object, str]:
    """(strategy, accelerator) for the Trainer: train.strategy as given, except FSDP (see below).

    FSDP gets one shard unit per transformer block (seqdiff.backbones.BLOCKS) and full-state-dict
    checkpoints (what `eval`, `sample` and `export` read). Lightning's FSDP runs only on CUDA and wants the
    accelerator named, so accelerator=auto becomes gpu; on CPU it is refused here with the alternative.
    EMA is refused with FSDP: the EMA callback would keep per-process copies of sharded parameters, which
    a checkpoint cannot hold.
    """
    from lightning.pytorch.strategies import FSDPStrategy

    if tcfg.strategy in SEQDIFF_STRATEGIES:
        return SEQDIFF_STRATEGIES[tcfg.strategy](), tcfg.accelerator
    if tcfg.strategy not in FSDPStrategy.get_registered_strategies():
        return tcfg.strategy, tcfg.accelerator
    if tcfg.ema_decay > 0:
        raise RunError(f"train.strategy={tcfg.strategy} needs train.ema_decay=0: EMA weights of sharded parameters "
                       f"are not gathered into checkpoints")
    accelerator = tcfg.accelerator
    if accelerator == "auto":
        accelerator = "gpu" if torch.cuda.is_available() else "cpu"
    if accelerator not in ("gpu", "cuda"):
        raise RunError(f"train.strategy={tcfg.strategy} needs CUDA GPUs: Lightning's FSDP strategy does not run on "
                       f"{accelerator} (train.accelerator={tcfg.accelerator}); on CPU use train.strategy=fsdp2 "
                       f"(PyTorch's fully_shard) or train.strategy=ddp, both run with gloo")
    strategy = FSDPStrategy(auto_wrap_policy=set(BLOCKS), state_dict_type="full",
                            cpu_offload=tcfg.strategy == "fsdp_cpu_offload")
    return strategy, accelerator


def optimizer_layout(strategy: str) -> str:
    """How a strategy stores the optimizer state in a checkpoint: a run resumes only within one layout.
    fsdp2 keys it by parameter name over whole tensors, Lightning's FSDP by its own flattened names, the
    others (single process, DDP) by parameter index."""
    from lightning.pytorch.strategies import FSDPStrategy

    if strategy in SEQDIFF_STRATEGIES:
        return strategy
    return "fsdp" if strategy in FSDPStrategy.get_registered_strategies() else "by index"


def resolve_precision(setting: str) -> str:
    if setting != "auto":
        return setting if setting != "32" else "32-true"
    return "bf16-mixed" if torch.cuda.is_available() else "32-true"


def train(config: RunConfig, run_dir: str | Path, resume: bool = False,
          extra_callbacks: list | None = None) -> TrainResult:
    """Train (or resume) the recipe in `run_dir`; returns the trained module and the last checkpoint."""
    run_dir = Path(run_dir)
    last = run_dir / LAST_CHECKPOINT
    has_checkpoint = last.is_file() or bool(step_checkpoints(last.parent))
    if resume and not has_checkpoint:
        raise RunError(f"--resume: no checkpoint at {last}")
    if not resume and has_checkpoint:
        raise RunError(f"{run_dir} already holds a run ({last.parent}); pass --resume to continue it or choose "
                       f"another --run-dir")
    tcfg = config.train
    strategies = ["auto", *SEQDIFF_STRATEGIES, *StrategyRegistry.available_strategies()]
    if tcfg.strategy not in strategies:
        raise RunError(f"train.strategy={tcfg.strategy!r} is unknown; choose one of {strategies}")
    strategy, accelerator = build_strategy(tcfg)
    precision = resolve_precision(tcfg.precision)
    if isinstance(strategy, FSDP2Strategy) and precision not in FSDP2Strategy.precisions:
        raise RunError(f"train.strategy=fsdp2 does not run with train.precision={tcfg.precision}; use bf16-mixed "
                       f"or 32")
    tokenizer = build_tokenizer(config.data.tokenizer, **config.data.tokenizer_options)
    if config.model.init_from:  # the published weights fix the shape: their config.json wins over the recipe
        model_config = dataclasses.replace(config.model, init_from=str(resolve_init_from(config.model.init_from)))
        model_config, changed = pretrained_model_config(model_config)
        config = dataclasses.replace(config, model=model_config)
        if changed and rank_zero_only.rank == 0:
            print(f"seqdiff: model.init_from={config.model.init_from} sets " + ", ".join(
                f"model.{k}={new!r} (recipe: {old!r})" for k, (old, new) in changed.items()), file=sys.stderr)
    if config.data.seq_len > config.model.max_seq_len:
        raise RunError(f"data.seq_len={config.data.seq_len} exceeds model.max_seq_len={config.model.max_seq_len}")
    data = build_data_module(config.data, tokenizer, seed=tcfg.seed)
    data.check_files()  # fail on bad data before anything is written

    ckpt_path, resume_step = None, None
    if resume:  # a corrupted last.ckpt falls back to the newest readable step*.ckpt, with a message
        try:
            ckpt_path, ckpt = latest_readable_checkpoint(last)
        except CheckpointError as e:
            raise RunError(f"--resume: {e}") from e
        resume_step = int(ckpt["global_step"])
        saved = ckpt.get("hyper_parameters", {}).get("train", {}).get("strategy", "auto")
        if optimizer_layout(saved) != optimizer_layout(tcfg.strategy):
            raise RunError(f"--resume: {ckpt_path} was written with train.strategy={saved}, whose optimizer state "
                           f"train.strategy={tcfg.strategy} cannot read; resume with train.strategy={saved}")
        frozen = list(ckpt.get("hyper_parameters", {}).get("train", {}).get("frozen_parameters", []))
        if frozen != list(tcfg.frozen_parameters):
            raise RunError(f"--resume: {ckpt_path} was trained with train.frozen_parameters={frozen}; its optimizer "
                           f"state holds exactly the parameters that setting trains, so resume with it (got "
                           f"{list(tcfg.frozen_parameters)})")
        del ckpt

    L.seed_everything(tcfg.seed, workers=True, verbose=False)
    module = SeqDiffModule(model=to_dict(config.model), method=to_dict(config.method), train=to_dict(tcfg),
                           tokenizer=tokenizer.to_dict(), seq_len=config.data.seq_len,
                           data=to_dict(config.data))
    if config.model.init_from and not resume:  # a resumed run takes every weight from its checkpoint
        loaded = load_pretrained(module.backbone, config.model)
        if rank_zero_only.rank == 0:
            fresh = f"; newly initialized: {', '.join(loaded['fresh'])}" if loaded["fresh"] else ""
            print(f"seqdiff: {len(loaded['loaded'])} weights loaded from {config.model.init_from}{fresh}",
                  file=sys.stderr)

    callbacks = [StepCheckpoint(dirpath=run_dir / "checkpoints", filename="step{step}", save_last=True,
                                every_n_train_steps=tcfg.checkpoint_every, save_top_k=1,
                                auto_insert_metric_name=False)]
    if tcfg.ema_decay > 0:
        callbacks.append(EMA(tcfg.ema_decay))
    if tcfg.progress_bar:
        callbacks.append(TQDMProgressBar(refresh_rate=max(1, tcfg.log_every)))
    callbacks += extra_callbacks or []
    loggers = [ResumableCSVLogger(save_dir=str(run_dir), name="logs", resume_step=resume_step)]
    if tcfg.wandb:
        from lightning.pytorch.loggers import WandbLogger

        os.environ.setdefault("WANDB_MODE", "offline")
        wandb_logger = WandbLogger(project="seqdiff", name=config.name, save_dir=str(run_dir),
                                   config=to_dict(config))
        loggers.append(wandb_logger)
        callbacks.append(WandbSamples(config))

    trainer = L.Trainer(
        max_steps=tcfg.max_steps,
        accelerator=accelerator,
        devices=int(tcfg.devices) if str(tcfg.devices).isdigit() else tcfg.devices,
        strategy=strategy,
        num_nodes=tcfg.num_nodes,
        precision=precision,
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
    if config.data.batch_size % trainer.world_size != 0:
        raise RunError(f"data.batch_size={config.data.batch_size} is the global batch and must divide by the "
                       f"{trainer.world_size} training processes (train.num_nodes={tcfg.num_nodes} x "
                       f"{trainer.world_size // tcfg.num_nodes} devices)")
    # --- train.micro_batch_size (seqdiff.training.module): refused before anything is written
    micro_problem = check_micro_batch(tcfg, config.data.batch_size, trainer.world_size)
    if micro_problem:
        raise RunError(micro_problem)
    # ---
    if rank_zero_only.rank == 0:  # the other processes of a multi-process run re-run this function
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.yaml").write_text(yaml.safe_dump(to_dict(config), sort_keys=False))
        tokenizer.save_pretrained(run_dir)
    start = time.perf_counter()
    try:
        trainer.fit(module, datamodule=data, ckpt_path=str(ckpt_path) if ckpt_path is not None else None)
    finally:  # close the wandb run, or the next train() in this process would log into it
        if tcfg.wandb and rank_zero_only.rank == 0 and wandb_logger._experiment is not None:
            wandb_logger.experiment.finish()
    if rank_zero_only.rank == 0:  # one writer in a multi-process run
        _add_training_time(run_dir, time.perf_counter() - start, trainer.global_step)
    return TrainResult(run_dir=run_dir, checkpoint=last, module=module, trainer=trainer)
