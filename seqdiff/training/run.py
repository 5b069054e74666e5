"""Wire a RunConfig into a Lightning Trainer and fit it: `seqdiff train` and the quickstart call this.

Layout of a run directory:
  config.yaml            the resolved recipe (every field, after overrides)
  tokenizer_config.json  the tokenizer
  checkpoints/last.ckpt  the latest checkpoint (weights, EMA weights, optimizer, loop state, configs)
  checkpoints/step*.ckpt the same, named by step: `--resume` falls back to the newest readable one when
                         last.ckpt is corrupted (seqdiff.checkpoint.latest_readable_checkpoint)
  logs/metrics.csv       training and validation metrics, always
  train.lock             while a trainer writes the directory: its pid and host (seqdiff.training.lock)
  timing.json            wall-clock training seconds, summed over resumes (TrainingClock)

What keeps it trustworthy (seqdiff.training.guards): a moved or copied directory resumes into its own
last.ckpt; a non-finite loss stops the run before a checkpoint of that step is written; no checkpoint with
non-finite weights is ever written; SIGTERM / SIGINT write a checkpoint of the current step and stop
(TrainingInterrupted); `--resume` refuses a changed recipe (seqdiff.training.resume.RESUMABLE_KEYS lists
what may change); a failed write (full disk, read-only folder) is one line and leaves no partial file.

Several processes (train.strategy=ddp, train.devices, train.num_nodes): every process runs this function;
data.batch_size is the global batch, split across processes by the data module, and only global rank 0
writes files.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import sys
import time
import warnings
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import lightning as L
import torch
import yaml
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.plugins.io import TorchCheckpointIO
from lightning.pytorch.strategies import StrategyRegistry
from lightning.pytorch.utilities.rank_zero import rank_zero_only, rank_zero_warn

from seqdiff.backbones import BLOCKS, load_pretrained, pretrained_model_config
from seqdiff.checkpoint import CheckpointError, latest_readable_checkpoint, step_checkpoints
from seqdiff.config import RunConfig, TrainConfig, to_dict
from seqdiff.data import build_data_module
from seqdiff.host_memory import reuse_freed_memory
from seqdiff.methods import build_model, check_trainable
from seqdiff.safe_io import WriteError, atomic_torch_save, atomic_write_text, ensure_dir, os_cause
from seqdiff.samplers import SAMPLERS, samplers_for
from seqdiff.tokenizers import build_tokenizer
from seqdiff.training.clip_search import clip_search_callback
from seqdiff.training.csv_log import ResumableCSVLogger
from seqdiff.training.ema import EMA
from seqdiff.training.fsdp2 import FSDP2Strategy, is_sharded, unsharded_copy
from seqdiff.training.guards import (  # noqa: F401 (RunError is imported from here by the CLI and tests)
    NonFiniteLossError,
    NonFiniteWeightsError,
    RunError,
    SignalGuard,
    TrainingInterrupted,
    check_finite_weights,
    loss_value,
    non_finite_message,
    relocate_checkpoint_state,
    step_flags,
)
from seqdiff.training.lock import RunLock
from seqdiff.training.module import SeqDiffModule, check_micro_batch
from seqdiff.training.precision import resolve_precision
from seqdiff.training.progress import ResumableProgressBar
from seqdiff.training.resume import check_resume
from seqdiff.training.throughput import Throughput

LAST_CHECKPOINT = Path("checkpoints") / "last.ckpt"
SEQDIFF_STRATEGIES = {"fsdp2": FSDP2Strategy}
"""train.strategy names that seqdiff builds itself; every other name goes to Lightning's registry."""


class AtomicCheckpointIO(TorchCheckpointIO):
    """Write to a temporary file, then rename: a crash mid-write never leaves a truncated checkpoint.

    Weights holding NaN or inf are never written (NonFiniteWeightsError); a failed write (full disk,
    read-only folder) removes the temporary file and raises WriteError naming the path and the cause.
    """

    def save_checkpoint(self, checkpoint, path, storage_options=None) -> None:
        check_finite_weights(checkpoint, path)
        atomic_torch_save(checkpoint, path)


class TrainingClock:
    """Wall-clock training seconds of a run directory, summed over resumes: <run_dir>/timing.json,
    {"train_seconds": ..., "step": ...}.

    Written at every checkpoint as well as at the end, so a run that ends without a word (kill -9, a second
    Ctrl-C, a crash) keeps the seconds up to the checkpoint its resume continues from (the steps after it are
    trained again, and timed again); it used to be written at the end only, and such a run lost all its seconds.
    An unreadable timing.json counts as 0 seconds (it is rewritten whole at the next record)."""

    def __init__(self, run_dir: Path) -> None:
        self.path = run_dir / "timing.json"
        self.before = 0.0  # seconds of earlier processes
        self.started: float | None = None

    def start(self) -> None:
        try:
            self.before = float(json.loads(self.path.read_text()).get("train_seconds", 0.0))
        except (OSError, ValueError, AttributeError, TypeError):  # absent, or not the dict this class writes
            self.before = 0.0
        self.started = time.perf_counter()

    def record(self, step: int) -> None:
        """Write the seconds so far (this process's since start(), plus the earlier ones) and the step."""
        if self.started is not None:
            seconds = self.before + time.perf_counter() - self.started
            atomic_write_text(self.path, json.dumps({"train_seconds": seconds, "step": step}) + "\n")


class StepCheckpoint(ModelCheckpoint):
    """ModelCheckpoint that also writes the final step when max_steps is not a multiple of checkpoint_every.

    Lightning's own writes last.ckpt at the end of training only when no checkpoint was written before, so a
    run of 250 steps checkpointed every 83 would end with the weights of step 249 on disk (and a second call
    would resume it for one step, again and again).

    It also holds the per-step guards (seqdiff.training.guards), because Lightning runs checkpoint callbacks
    after all others: after each optimizer step (and the EMA update) a non-finite loss raises
    NonFiniteLossError before this step can be saved, and a recorded SIGTERM / SIGINT writes a checkpoint of
    this step and stops the loop. File versioning (`last-v1.ckpt`) is off and the saved paths follow a moved
    run directory, so a resume always continues into checkpoints/last.ckpt.
    """

    def __init__(self, *args, guard: SignalGuard | None = None, saved_step: int | None = None,
                 clock: TrainingClock | None = None, **kwargs):
        super().__init__(*args, enable_version_counter=False, **kwargs)
        self.guard = guard
        self.clock = clock  # timing.json follows every checkpoint written
        self.saved_step = saved_step
        """Step of the newest checkpoint on disk (the resumed one until this run writes one)."""
        self.interrupted_at: int | None = None
        self._step_seen: int | None = None  # global_step at the previous batch end (gradient accumulation)

    @property
    def state_key(self) -> str:
        """One key whatever the cadence, so a resume with another train.checkpoint_every restores the state."""
        return "StepCheckpoint"

    def load_state_dict(self, state_dict) -> None:
        super().load_state_dict(relocate_checkpoint_state(state_dict, self.dirpath))

    def on_train_start(self, trainer, pl_module) -> None:
        super().on_train_start(trainer, pl_module)
        self._step_seen = trainer.global_step
        if self.guard is not None:  # over the SIGTERM handler Lightning installed when fit started
            self.guard.install()
            connector = getattr(trainer, "_signal_connector", None)
            if connector is not None:
                connector.received_sigterm = False

    def _kept(self) -> str | None:
        last = Path(self.dirpath) / LAST_CHECKPOINT.name
        return f"{last} (step {self.saved_step})" if self.saved_step is not None and last.is_file() else None

    def _save_checkpoint(self, trainer, filepath) -> None:
        try:
            super()._save_checkpoint(trainer, filepath)
        except NonFiniteWeightsError as e:  # the loss was still finite, the update that followed was not
            tcfg = trainer.lightning_module.train_config
            what = str(e).split(" at step ")[0]
            raise NonFiniteWeightsError(non_finite_message(trainer.global_step, what, tcfg.lr, tcfg.grad_clip,
                                                           self._kept())) from e
        self.saved_step = trainer.global_step
        if self.clock is not None:
            self.clock.record(trainer.global_step)
        if self.guard is not None:
            self.guard.step_saved = f"{Path(self.dirpath) / LAST_CHECKPOINT.name} (step {self.saved_step})"

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        bad, stop = step_flags(trainer, pl_module, outputs, self.guard)
        if bad:
            loss = loss_value(outputs)
            local = loss.item() if loss is not None and not bool(torch.isfinite(loss).all()) else None
            what = f"the training loss is {local}" if local is not None else "the training loss of another process " \
                   "is not finite"
            tcfg = pl_module.train_config
            raise NonFiniteLossError(non_finite_message(trainer.global_step, what, tcfg.lr, tcfg.grad_clip,
                                                        self._kept()))
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        stepped = trainer.global_step != self._step_seen  # not in the middle of accumulating gradients
        self._step_seen = trainer.global_step
        if stop and stepped and self.interrupted_at is None:
            self.save_now(trainer)
            self.interrupted_at = trainer.global_step
            trainer.should_stop = True

    def save_now(self, trainer) -> None:
        """Write the step-named checkpoint and last.ckpt of the current step (unless already on disk)."""
        if not self._should_skip_saving_checkpoint(trainer):
            candidates = self._monitor_candidates(trainer)
            self._save_topk_checkpoint(trainer, candidates)
            self._save_last_checkpoint(trainer, candidates)

    def on_train_end(self, trainer, pl_module) -> None:
        self.save_now(trainer)  # skips when this step is already on disk
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
        if tcfg.strategy == "fsdp2" and str(tcfg.devices) == "1" and tcfg.num_nodes == 1:
            rank_zero_warn("train.strategy=fsdp2 with one process shards nothing (no memory saved) and costs time "
                           "every step (13% of the throughput on an H200, reports/bench/gpu); "
                           "train.strategy=auto is faster")
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


def train(config: RunConfig, run_dir: str | Path, resume: bool = False,
          extra_callbacks: list | None = None) -> TrainResult:
    """Train (or resume) the recipe in `run_dir`; returns the trained module and the last checkpoint.

    Raises TrainingInterrupted after SIGTERM / SIGINT (a checkpoint of the step reached is on disk),
    NonFiniteLossError when the loss stops being finite, RunError / WriteError for what cannot be done.
    """
    run_dir = Path(run_dir)
    last = run_dir / LAST_CHECKPOINT
    for folder in (run_dir, run_dir / "checkpoints"):
        if folder.exists() and not folder.is_dir():
            raise RunError(f"--run-dir {run_dir}: {folder} is a file, not a directory")
    if last.exists() and not last.is_file():  # refused now, not after training up to the first checkpoint
        raise RunError(f"--run-dir {run_dir}: {last} is not a file; move it away")
    if rank_zero_only.rank == 0:
        RunLock(run_dir).check_free()  # a trainer busy in this directory: say so, not "no checkpoint yet"
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
    if config.sample.sampler is not None and config.sample.sampler not in SAMPLERS:
        # checked here: a typo would otherwise surface only at the first `seqdiff sample` of the run
        raise RunError(f"sample.sampler={config.sample.sampler!r} is unknown; choose one of {sorted(SAMPLERS)}")
    strategy, accelerator = build_strategy(tcfg)
    check_accelerator(accelerator)
    precision = resolve_precision(tcfg.precision, accelerator)
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
    method = check_trainable(config, tokenizer, warn=rank_zero_only.rank == 0)  # e.g. bd3lm: block_size | seq_len
    if config.sample.sampler is not None and config.sample.sampler not in samplers_for(method.name):
        # the run's default sampler: refused now, not at its first `seqdiff sample`
        raise RunError(f"sample.sampler={config.sample.sampler} cannot drive models of method.name={method.name}; "
                       f"choose one of {samplers_for(method.name)}, or sample.sampler=null for its default")
    clip_search = clip_search_callback(config.method, method, seed=tcfg.seed)  # bd3lm's var_min search
    data = build_data_module(config.data, tokenizer, seed=tcfg.seed)
    check_relative_data_files(config, run_dir, resume)  # a relative path that names nothing from here
    if rank_zero_only.rank == 0:
        note_corpus_validation(config)
    data.check_files()  # fail on bad data before anything is written
    data.check_windows(("train", "valid"))  # a split too short, or too N-rich, for one window

    ckpt_path, resume_step = None, None
    if resume:  # a corrupted last.ckpt falls back to the newest readable step*.ckpt, with a message
        try:
            ckpt_path, ckpt = latest_readable_checkpoint(last)
        except CheckpointError as e:
            raise RunError(f"--resume: {e}") from e
        saved = ckpt.get("hyper_parameters", {}).get("train", {}).get("strategy", "auto")
        if optimizer_layout(saved) != optimizer_layout(tcfg.strategy):
            raise RunError(f"--resume: {ckpt_path} was written with train.strategy={saved}, whose optimizer state "
                           f"train.strategy={tcfg.strategy} cannot read; resume with train.strategy={saved}")
        frozen = list(ckpt.get("hyper_parameters", {}).get("train", {}).get("frozen_parameters", []))
        if frozen != list(tcfg.frozen_parameters):
            raise RunError(f"--resume: {ckpt_path} was trained with train.frozen_parameters={frozen}; its optimizer "
                           f"state holds exactly the parameters that setting trains, so resume with it (got "
                           f"{list(tcfg.frozen_parameters)})")
        resume_step = check_resume(ckpt, ckpt_path, config, tokenizer.to_dict())  # every other recipe change
        del ckpt

    L.seed_everything(tcfg.seed, workers=True, verbose=False)
    module = SeqDiffModule(model=to_dict(config.model), method=to_dict(config.method), train=to_dict(tcfg),
                           tokenizer=tokenizer.to_dict(), seq_len=config.data.seq_len,
                           data=to_dict(config.data))
    if config.method.time_sampling == "auto" and rank_zero_only.rank == 0:  # say what the default chose
        noise = module.method.training_noise()
        if noise is not None:
            law = f" with mask_count_law={noise['mask_count_law']}" if noise["mask_count_law"] else ""
            print(f"seqdiff: method.time_sampling=auto draws {noise['time_sampling']}{law}", file=sys.stderr)
    if config.model.init_from and not resume:  # a resumed run takes every weight from its checkpoint
        loaded = load_pretrained(module.backbone, config.model)
        if rank_zero_only.rank == 0:
            fresh = f"; newly initialized: {', '.join(loaded['fresh'])}" if loaded["fresh"] else ""
            print(f"seqdiff: {len(loaded['loaded'])} weights loaded from {config.model.init_from}{fresh}",
                  file=sys.stderr)

    if rank_zero_only.rank == 0 and (resume_step or 0) < tcfg.max_steps:  # steps to train
        warn_long_warmup(tcfg)
    guard = SignalGuard()
    clock = TrainingClock(run_dir)  # started on process 0 only: the others never record
    checkpointer = StepCheckpoint(dirpath=run_dir / "checkpoints", filename="step{step}", save_last=True,
                                  every_n_train_steps=tcfg.checkpoint_every, save_top_k=1,
                                  auto_insert_metric_name=False, guard=guard, saved_step=resume_step, clock=clock)
    callbacks = [checkpointer]
    if tcfg.ema_decay > 0:
        callbacks.append(EMA(tcfg.ema_decay))
    if clip_search is not None:
        callbacks.append(clip_search)
    callbacks.append(Throughput(tcfg.log_every))  # perf/tokens_per_s, perf/seconds_per_step, perf/mfu on a GPU
    if tcfg.progress_bar:
        callbacks.append(ResumableProgressBar(refresh_rate=max(1, tcfg.log_every)))
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
    lock = RunLock(run_dir)
    if rank_zero_only.rank == 0:  # the other processes of a multi-process run re-run this function
        ensure_dir(run_dir, "run directory")
        lock.acquire()  # one trainer per run directory
        guard.at_hard_exit.append(lambda: (_remove_partial_files(run_dir), lock.release()))
    try:
        if rank_zero_only.rank == 0:
            _remove_partial_files(run_dir)
            atomic_write_text(run_dir / "config.yaml", yaml.safe_dump(to_dict(config), sort_keys=False))
            try:
                tokenizer.save_pretrained(run_dir)
            except OSError as e:
                raise WriteError(f"cannot write the tokenizer into {run_dir}: {os_cause(e)}") from e
        if rank_zero_only.rank == 0:  # one writer in a multi-process run
            clock.start()
        guard.install()  # a signal during set-up stops at the first step boundary
        try:
            # on CPU, the memory a step frees stays mapped for the next step (seqdiff.host_memory)
            host_memory = reuse_freed_memory() if trainer.strategy.root_device.type == "cpu" else nullcontext()
            with warnings.catch_warnings(), host_memory:  # on resume the folder holds this run's own checkpoints
                warnings.filterwarnings("ignore", message=r"Checkpoint directory .* exists and is not empty")
                trainer.fit(module, datamodule=data, ckpt_path=str(ckpt_path) if ckpt_path is not None else None)
        finally:  # close the wandb run, or the next train() in this process would log into it
            guard.uninstall()
            if tcfg.wandb and rank_zero_only.rank == 0 and wandb_logger._experiment is not None:
                wandb_logger.experiment.finish()
        clock.record(trainer.global_step)
    finally:
        lock.release()
    if checkpointer.interrupted_at is not None:
        raise TrainingInterrupted(guard.signum or signal.SIGTERM, checkpointer.interrupted_at, last, run_dir)
    return TrainResult(run_dir=run_dir, checkpoint=last, module=module, trainer=trainer)


DATA_FILE_KEYS = ("train_file", "valid_file", "test_file")
"""The data.* keys of data.kind=text that name a file (checked by `check_relative_data_files`)."""


def check_relative_data_files(config: RunConfig, run_dir: Path, resume: bool) -> None:
    """Refuse, in one line, a relative data.*_file that names no file from the current directory, saying that it
    is read from there (not from where the run was started, nor from the run directory) and, on --resume, that
    the file may be given again with data.KEY=PATH (a resumable key), with a PATH found from the run directory's
    parents when there is one. Absolute paths and other problems are left to the data module's own messages."""
    if config.data.kind != "text":
        return
    missing = [(key, value) for key in DATA_FILE_KEYS
               if (value := getattr(config.data, key)) and not Path(value).is_absolute() and not Path(value).exists()]
    if not missing:
        return
    named = ", ".join(f"data.{key}={value}" for key, value in missing)
    message = (f"{named}: no such file{'s' if len(missing) > 1 else ''}; a relative path is read from the current "
               f"directory ({Path.cwd()})")
    if resume:
        again = " ".join(f"data.{key}={_found_from(run_dir, value) or '<path>'}" for key, value in missing)
        message = (f"--resume: {message}, not from the directory the run was started in; give the file again on "
                   f"resume: {again}")
    raise RunError(message)


def _found_from(run_dir: Path, relative: str) -> str | None:
    """`relative` as seen from the current directory when it lies under a parent of the run directory (where a
    run in runs/NAME was most likely started), else None."""
    for folder in Path(run_dir).resolve().parents:
        candidate = folder / relative
        if candidate.is_file():
            return os.path.relpath(candidate)
    return None


def note_corpus_validation(config: RunConfig) -> None:
    """One line on stderr when the user's own data.train_file is validated on the corpus' valid split (no
    data.valid_file): legitimate, but easy to miss, and the validation curve then measures another text."""
    data = config.data
    if data.kind == "text" and data.train_file and not data.valid_file:
        print(f"seqdiff: data.train_file={data.train_file} is given without data.valid_file: validation reads the "
              f"{data.corpus!r} corpus' valid split; give data.valid_file=PATH to validate on your own text",
              file=sys.stderr, flush=True)


def warn_long_warmup(tcfg: TrainConfig) -> None:
    """One line on stderr when train.warmup_steps exceeds train.max_steps: the learning rate is still rising when
    training stops. Not an error: a resume may raise train.max_steps past the warm-up."""
    if tcfg.warmup_steps > tcfg.max_steps:
        share = tcfg.max_steps / tcfg.warmup_steps
        print(f"seqdiff: warning: train.warmup_steps={tcfg.warmup_steps} exceeds train.max_steps={tcfg.max_steps}: "
              f"the learning rate warms up linearly over {tcfg.warmup_steps} steps and reaches only {share:.0%} of "
              f"train.lr={tcfg.lr:g} by the last step; lower train.warmup_steps, or raise train.max_steps (now or "
              f"on --resume)", file=sys.stderr, flush=True)


def check_accelerator(accelerator: str) -> None:
    """train.accelerator=gpu / cuda without a visible CUDA device: one line before anything is built."""
    if accelerator in ("gpu", "cuda") and not torch.cuda.is_available():
        raise RunError(f"train.accelerator={accelerator}, but torch sees no CUDA GPU here "
                       f"(torch.cuda.is_available() is False); use train.accelerator=cpu or auto")


def _remove_partial_files(run_dir: Path) -> None:
    """`*.tmp` files an earlier process left when it was killed mid-write (no trainer holds the lock)."""
    for folder in (run_dir, run_dir / "checkpoints"):
        for tmp in folder.glob("*.tmp") if folder.is_dir() else ():
            if not tmp.name.startswith(".train.lock"):
                tmp.unlink(missing_ok=True)
