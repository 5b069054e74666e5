"""`seqdiff quickstart`: MDLM against AR on real text, offline, on a laptop CPU, in under 10 minutes.

Both models share the backbone size, the data (the Shakespeare slice shipped with seqdiff, split by whole
plays, lowercased to the text8 alphabet) and the optimizer; each trains at its own learning rate for its own
number of steps (LEARNING_RATES, MAX_STEPS: AR stops improving on unseen text long before MDLM does, and its
steps beyond that would only cost time). The job trains both, scores
the unseen test play (MDLM: NELBO upper bound; AR: exact NLL) in bits per character, draws samples (MDLM
with the cached sampler), and writes reports/quickstart/{summary.md, results.json, loss_curves.png}.

On a CPU with two threads or more the two trainings run side by side, AR in a second process
(seqdiff.training.side_by_side), the threads split: at this size that finishes both sooner than one after the
other (`--sequential`). An interrupted quickstart resumes its runs on the next call; a finished run is reused,
not retrained.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import os
import shutil
import signal
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from lightning.pytorch import Callback

from seqdiff.checkpoint import load_checkpoint, read_checkpoint
from seqdiff.config import ConfigError, DataConfig, MethodConfig, ModelConfig, RunConfig, SampleConfig, TrainConfig
from seqdiff.data.text import split_path, tokenize_file
from seqdiff.data.text_files import load_manifest, read_text_file
from seqdiff.evaluation.generate import generate, write_atomically
from seqdiff.evaluation.likelihood import evaluate_tokens
from seqdiff.evaluation.metrics import known_word_share
from seqdiff.evaluation.ngram import WittenBellNGram
from seqdiff.figures import pyplot, save_figure
from seqdiff.safe_io import check_output_folder, written_together
from seqdiff.tokenizers import load_tokenizer
from seqdiff.tokenizers.char import text8_normalize
from seqdiff.training.csv_log import metric_curve, read_metrics
from seqdiff.training.lock import RunLock
from seqdiff.training.precision import resolve_precision, uses_cuda
from seqdiff.training.resume import RESUMABLE_KEYS, recipe_changes
from seqdiff.training.run import LAST_CHECKPOINT, TrainingInterrupted, train
from seqdiff.training.side_by_side import (
    INTERRUPTED,
    ChildRun,
    ChildWatch,
    StepTimer,
    describe,
    sigterm_raises,
    split_threads,
)
from seqdiff.training.spare import SpareProcess

# The embedded default; configs/quickstart.yaml is the same recipe as a file (a test keeps them equal). Chosen by
# reports/quickstart_sweep on the validation play: 2,000 steps in bf16 where the CPU multiplies bf16 natively fit
# the 5-minute budget on a quiet 2-core machine (float32 elsewhere, where a training step is about 1.5x slower);
# model.local_conv=9 (session 14, reports/quickstart_sweep/local_conv): MDLM 2.97 against 3.15 bits, AR 2.17 / 2.21;
# model.local_conv_mlp (session 16, reports/quickstart_sweep/conv_mlp): MDLM 2.66 against 2.96, AR 2.13 / 2.17 at
# 2,000 steps, but each step costs about 1.6x on this CPU (488 s in all), so the recipe trains 1,100 steps to fit the
# 5-minute budget (1,200 steps took 311 s: MDLM 2.81, AR 2.28 test bits; reports/quickstart_sweep/README.md; since
# session 45 MDLM trains 1,000 and AR 550, MAX_STEPS).
# model.kmer_sizes=[2, 3, 4, 5] (session 17, reports/quickstart_sweep/kmer): embeddings of the 2- to 5-character
# windows around each position, MDLM 2.61 against 2.79 and AR 2.15 / 2.19 validation bits at 1,100 steps.
# method.time_sampling: auto, the library's default (mask_count with mask_count_law=inverse_sqrt for this MDLM), in
# place of the antithetic times the recipe kept since session 8 (session 28, reports/quickstart_sweep/time_sampling:
# MDLM 2.549 / 2.548 validation bits against 2.608 / 2.618 under seeds 0 / 1, float32, 1,100 steps).
# model.activation=gelu (session 34, reports/quickstart_sweep/activation): the exact (erf) GELU in place of the tanh
# approximation (the library's default, MDLM's choice): the same validation bits to 1e-4 under seeds 0 and 1 (MDLM
# 2.5487 / 2.5475, AR 2.1489 / 2.1574), and torch's CPU kernel for it is the faster one (reports/bench/bench.md's
# profile; reports/bench/quickstart_step times the step as a whole, side by side).
# Samples: 16 per model (the known-word share counts about 400 words), nucleus top_p 0.9 for both models, the usual
# setting; reports/quickstart/sampling_conv_mlp measures every setting (MDLM 45% known words at top_p 1, 54% at 0.9).
# Learning rates and step counts: each model its own (LEARNING_RATES, MAX_STEPS below); train.* here is MDLM's.
LEARNING_RATES = {"mdlm": 4e-3, "ar": 2e-3}
"""Each model's peak AdamW learning rate (reports/quickstart_sweep/lr and ar_steps, validation play). Session 36:
the 2e-3 both shared since session 8 was chosen before the convolutions, the k-mers and MDLM's lower-variance
estimator; at 1,100 steps MDLM is best at 4e-3 (2.5382 / 2.5412 bits under seeds 0 / 1 against 2.5487 / 2.5475 at
2e-3; 6e-3 2.5513) and AR at 0.7-1e-3 (1e-3: 2.1316 / 2.1374 against 2.1489 / 2.1574 at 2e-3). Session 44: AR
trains 550 steps (MAX_STEPS), and there 2e-3 is best (2.1307 against 2.1411 at 1e-3)."""
MAX_STEPS = {"mdlm": 1000, "ar": 550}
"""Each model's training steps (sessions 44-45, reports/quickstart_sweep/ar_steps and mdlm_steps, validation
play): MDLM improves at every rung of reports/text/ladder (2.724 test bits at 550 steps, 2.598 at 1,100, 2.440 at
4,400); AR does not past ~550-750 steps (2.2617 test bits at 550, 2.2615 at 1,100; its validation curve is lowest at
steps 500-750, and then it memorizes the training plays). AR at 550 steps and lr 2e-3 scores 2.1307 / 2.1471
validation bits under seeds 0 / 1 against 2.1316 / 2.1374 at 1,100 steps and 1e-3 (seed 0 at 700 steps: 2.1317;
400: 2.1426): +0.004 bits on average, within what two seeds differ by. Side by side AR then finishes first and MDLM
trains its last steps on every thread (ChildWatch): the quickstart's time is MDLM's training and scoring (1.3x sooner
on the 2-core AVX2 host, reports/quickstart_side_by_side/session44_runs). Session 45: MDLM trains 1,000 steps, not
1,100, so that the quickstart fits the 5-minute budget on the 2-core AVX2 host too (its last steps there, on both
threads, take ~0.2 s each): 2.5542 / 2.5598 validation bits under seeds 0 / 1 against 2.5382 / 2.5412 at 1,100
(+0.017 bits, 0.7%; lr 5e-3 at 1,000 steps: 2.5545 / 2.5563, the same within the seeds' spread).
`--max-steps N` trains both N steps (each at its own learning rate)."""
QUICKSTART = RunConfig(
    name="quickstart",
    model=ModelConfig(preset="cpu-tiny", hidden_size=128, n_layers=2, n_heads=2, max_seq_len=128, local_conv=9,
                      local_conv_mlp=True, kmer_sizes=[2, 3, 4, 5], kmer_buckets=65536, activation="gelu"),
    method=MethodConfig(name="mdlm"),  # time_sampling auto: mask_count, q(k) ∝ k^(-1/2), 0.06-0.07 bits ahead
    data=DataConfig(corpus="shakespeare", tokenizer="char", seq_len=128, batch_size=32, eval_batch_size=64),
    train=TrainConfig(max_steps=MAX_STEPS["mdlm"], lr=LEARNING_RATES["mdlm"], warmup_steps=50, lr_schedule="cosine",
                      ema_decay=0.9999, val_every=250, val_batches=8, checkpoint_every=250, log_every=10,
                      precision="bf16-if-native"),
    sample=SampleConfig(sampler=None, steps=128, num_samples=16, batch_size=16, seq_len=128, top_p=0.9, seed=0),
)
METHODS = ("mdlm", "ar")


def method_recipe(base: RunConfig, method: str, max_steps: int | None = None) -> RunConfig:
    """The quickstart's run of `method` from `base`: the same recipe with that method, its learning rate and its
    step count (MAX_STEPS; `max_steps` instead when given, as `--max-steps` gives it for both)."""
    train = dataclasses.replace(base.train, lr=LEARNING_RATES[method])
    return dataclasses.replace(base, name=f"quickstart-{method}", method=dataclasses.replace(base.method, name=method),
                               train=with_steps(train, MAX_STEPS[method] if max_steps is None else max_steps))


def with_steps(train: TrainConfig, steps: int) -> TrainConfig:
    """`train` for `steps` steps, its warm-up and its validation, logging and checkpoint intervals no longer."""
    return dataclasses.replace(train, max_steps=steps, warmup_steps=min(train.warmup_steps, steps),
                               val_every=min(train.val_every, steps), log_every=min(train.log_every, steps),
                               checkpoint_every=min(train.checkpoint_every, steps))


NUM_T_SAMPLES = 4  # Monte Carlo draws per test block for the MDLM bound
NGRAM_ORDERS = range(1, 9)
"""Orders of the Witten-Bell character n-gram baseline; the one with the best validation bits is reported."""


def longer_run_note(max_steps: int) -> str | None:
    """What a user training the quickstart longer than its recipe should know first, else None: the recipe was chosen
    at QUICKSTART's step count, and longer its AR memorizes the nine training plays through the k-mer tables (test
    bits 2.26 at 1,100 steps, 2.39 at 2,200, 3.04 at 4,400; without the tables and with dropout 0.1 it is best at about
    3,500 steps: reports/text/ladder), while MDLM keeps improving."""
    if max_steps <= QUICKSTART.train.max_steps:
        return None
    return (f"[quickstart] note: the recipe was chosen at {QUICKSTART.train.max_steps:,} steps; trained longer, MDLM "
            "keeps improving but AR memorizes the nine training plays through its k-mer tables and its test bits "
            "rise (reports/text/ladder); for a long AR run train it with model.kmer_sizes=[] model.dropout=0.1")


def ngram_baseline(data: DataConfig, tokenizer) -> dict:
    """The counting baseline on the models' own splits: Witten-Bell n-grams fitted on the training plays, the
    order chosen on the validation play, scored on the test play (each split as one stream of characters)."""
    ids = {split: tokenize_file(split_path(data, split), tokenizer) for split in ("train", "valid", "test")}
    full = WittenBellNGram(max(NGRAM_ORDERS), tokenizer.num_regular).fit([ids["train"]])  # counted once
    by_order = full.bits_per_token_by_order([ids["valid"]])  # every order in one pass
    valid_bits = {order: by_order[order] for order in NGRAM_ORDERS}
    best = min(valid_bits, key=valid_bits.get)
    return {"order": best, "bits_per_character": full.truncated(best).bits_per_token([ids["test"]]),
            "valid_bits_per_character_by_order": valid_bits, "train_characters": int(len(ids["train"]))}


TIME_BUDGET_S = 300.0
"""The quickstart's budget on a quiet 2-core machine, from the command's start to its report; what ProjectedTime
measures against (imports and scoring included, as a user waits for them)."""
SCORING_STEPS = 55
"""What the quickstart does after its trainings (both models' test-play scores and samples, the n-gram, the report)
in training steps of the run ProjectedTime times: 15.1 s after 0.275 s steps and 18.2 s after 0.335 s ones in
session 45's runs on the AVX2 host (reports/quickstart_side_by_side/session45_runs, reports/quickstart_seeds)."""
REFINE_TOLERANCE = 0.05
"""ProjectedTime prints a second line after the first validation pass when the real time a step since its first
line differs from the one it went by by more than this share."""


TAKEOVER_SPEEDUP = 1.35
"""Side by side, how much faster the run left trains once the other has finished and it has every thread (ChildWatch;
the other run takes this one's the same way): its steps beside the other's against its steps alone on both threads.
MDLM's in the two session-44 quickstarts on the 2-core AVX2 host (reports/quickstart_side_by_side/session44_runs,
new1 and new2: AR's training seconds over the steps MDLM trained by then, against the rest): 0.339 -> 0.226 s and
0.335 -> 0.246 s a step, 1.50x and 1.36x; the projection counts a little under the lower figure."""


class ProjectedTime(Callback):
    """A Lightning callback: after a few steps, one line saying how long training both models will take here.

    Why: the recipe fits TIME_BUDGET_S on a CPU that multiplies bf16 natively; on a slower one (measured: an
    AVX2-only 2-core host took 1,176 s) a user should learn that in the first minute, with the `--max-steps`
    that fits the budget there, not after twenty. Steps `skip`.. `skip + probe` are timed (the first ones pay
    one-off allocation; validation comes later, at train.val_every). After the first validation pass a second
    line follows if what the steps since the first line really took (validation passes and checkpoint writes
    included) moved the projection by more than REFINE_TOLERANCE (`refine`). The budget is the whole command's:
    the seconds spent before the line (from `started`, the command's start on `clock`) and SCORING_STEPS steps of
    scoring after training count too (a run projected at 296 s of training took 330 s in all)."""

    def __init__(self, method: str, steps_after: int, runs: int, skip: int = 5, probe: int = 20,
                 clock=time.perf_counter, side_by_side: bool = False,
                 other: Callable[[], float | None] | None = None, other_name: str = "", wait: int = 40,
                 other_steps: int | None = None, started: float | None = None, setup: float | None = None) -> None:
        """`steps_after`: steps the runs after this one will train (one after the other). Side by side: `other`, the
        other run's seconds a step once known (ChildRun.step_seconds), waited for up to `wait` steps after this
        run's own are timed (on a 2-core AVX2 host AR trained 352 s beside MDLM's 316 s, reports/quickstart_amd:
        MDLM's steps alone under-projected); `other_steps`, the steps the other run trains from when this one
        starts (its own count: AR trains fewer, MAX_STEPS; None: as many as this one). `started`: the command's start
        on `clock` (None: the seconds before the line are not counted); `setup`, the seconds from it to the first
        training (imports, data; default: until now), which a rerun with the advised `--max-steps` pays again."""
        super().__init__()
        self.method, self.steps_after, self.runs, self.side_by_side = method, steps_after, runs, side_by_side
        self.timer = StepTimer(skip, probe, clock)
        self.other, self.other_name, self.wait, self.other_steps = other, other_name, wait, other_steps
        self.started = started
        self.setup = setup if setup is not None else 0.0 if started is None else clock() - started
        self.timed: tuple[int, float] | None = None  # (step, seconds a step) of this run
        self.message: str | None = None
        self.printed: tuple[int, float, float] | None = None  # (step, clock, training seconds left) at the line
        self.validated = False  # a validation pass (and the checkpoint with it) has run since the line
        self.refined: str | None = None  # the second line ("" when the first one held)

    def on_validation_end(self, trainer, pl_module) -> None:
        self.validated = self.printed is not None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.message is not None:
            if self.validated and self.refined is None:
                self.refined = self.refine(trainer)
                if self.refined:
                    self._print(trainer, self.refined)
            return
        step = trainer.global_step
        if self.timed is None:
            per_step = self.timer.tick(step)
            if per_step is None:
                return
            self.timed = (step, per_step)
        theirs = self.other() if self.other is not None else None
        if self.other is not None and theirs is None and step - self.timed[0] < self.wait:
            return  # the second process started a moment later: its steps are timed a few steps after ours
        steps_left, other_left = trainer.max_steps - step, self._other_left(trainer, step)
        self.message = self.describe(self.timed[1], steps_left, theirs, other_left=other_left)
        self.printed = (step, self.timer.clock(),
                        self.seconds_left(self.timed[1], steps_left, theirs, other_left=other_left))
        self._print(trainer, self.message)

    def _other_left(self, trainer, step: int) -> int:
        """Steps the other run (side by side) has left when this one is at `step`: the two started together."""
        if self.other_steps is None:
            return trainer.max_steps - step
        return max(0, self.other_steps - (step - (self.timer.began or 0)))  # began: where this training began

    @staticmethod
    def _print(trainer, line: str) -> None:
        bar = getattr(trainer, "progress_bar_callback", None)
        if bar is not None:  # on a line of its own, not after the progress bar's
            bar.print(line, file=sys.stderr)
        else:
            print(line, file=sys.stderr)

    def refine(self, trainer) -> str:
        """After the first validation pass: the projection again with what the steps since the first line really
        took (validation, checkpoint writes, a busier or quieter machine), as a second line when it moved by more
        than REFINE_TOLERANCE either way; "" when the first line holds. (The first line times training steps alone,
        early, when the second process is still starting: on the AVX2 host it was 5-7% short in one run and 16%
        long in another.) The other process's seconds a step are scaled by this run's ratio. Compared: the
        training time left now against what the first line projected for now."""
        step_then, then, left_then = self.printed
        step = trainer.global_step
        steps, steps_left = step - step_then, trainer.max_steps - step
        if steps <= 0 or steps_left <= 0:
            return ""
        now = self.timer.clock()
        overhead = (now - then) / steps / self.timed[1]  # real time a step / timed, this run
        theirs = self.other() if self.other is not None else None
        other_left = self._other_left(trainer, step)
        expected = left_then - (now - then)  # what the first line implies is left now
        left = self.seconds_left(self.timed[1], steps_left, theirs, overhead, other_left)
        if abs(left - expected) <= REFINE_TOLERANCE * expected:
            return ""
        return self.describe(self.timed[1], steps_left, theirs, overhead=overhead, at_step=step,
                             other_left=other_left)

    def seconds_left(self, per_step: float, steps_left: int, other_per_step: float | None = None,
                     overhead: float = 1.0, other_left: int | None = None) -> float:
        """Training seconds left for every run. One after the other: this run's seconds a step for all steps left
        (this run's and `steps_after`). Side by side: each run's steps at its own seconds a step (the other's
        `other_per_step`, else this run's), and the one that ends last trains the steps it has beyond the other's
        end TAKEOVER_SPEEDUP faster, on every thread."""
        if not self.side_by_side:
            return max(per_step, other_per_step or 0.0) * overhead * (steps_left + self.steps_after)
        mine = per_step * overhead * (steps_left + self.steps_after)
        theirs = (other_per_step or per_step) * overhead * (steps_left if other_left is None else other_left)
        return _with_takeover(mine, theirs)

    def describe(self, per_step: float, steps_left: int, other_per_step: float | None = None,
                 overhead: float = 1.0, at_step: int | None = None, other_left: int | None = None) -> str:
        """The line printed: the projected training time, when the command will end (with `started`), and the
        step count that would fit the budget; side by side with the other run's seconds a step and steps left
        (`seconds_left`). `overhead` (the refined line, at `at_step`): what a step really took since the first line
        over its timed seconds. The end: the seconds so far, the training left and SCORING_STEPS steps of scoring;
        the advice: the steps whose training fits the budget beside this command's setup and that scoring."""
        left = self.seconds_left(per_step, steps_left, other_per_step, overhead, other_left)
        scoring = SCORING_STEPS * per_step * overhead
        end = (0.0 if self.started is None else self.timer.clock() - self.started) + left + scoring
        how = " (trained side by side)" if self.side_by_side else ""
        theirs = f", {self.other_name} {other_per_step:.2f} s in the second process" if other_per_step else ""
        if at_step is None:
            line = (f"[quickstart] {self.method}: {per_step:.2f} s a training step on this machine{theirs}; about "
                    f"{_minutes(left)} of training left for the {self.runs} models{how}")
        else:
            line = (f"[quickstart] {self.method} at step {at_step}, validation and checkpoints counted: "
                    f"{overhead:.2f}x the timed steps; about {_minutes(left)} of training left for the {self.runs} "
                    f"models{how}")
        if self.started is not None:
            line += f", the quickstart's end about {_minutes(end)} after its start"
        if end <= TIME_BUDGET_S:
            return line
        fits = max(1, int((TIME_BUDGET_S - self.setup - scoring)
                          / self.seconds_a_common_step(per_step, other_per_step, overhead)))
        return (f"{line} (the recipe fits {TIME_BUDGET_S / 60:.0f} minutes on a faster CPU; here "
                f"`seqdiff quickstart --max-steps {fits}` would, with worse bits per character)")

    def seconds_a_common_step(self, per_step: float, other_per_step: float | None, overhead: float) -> float:
        """Training seconds a step when every run trains as many steps (`--max-steps N`): one after the other, the
        slower step for each run; side by side, the faster run's step, and the slower run's extra time in its last
        steps TAKEOVER_SPEEDUP faster."""
        mine, theirs = per_step * overhead, (other_per_step or per_step) * overhead
        return _with_takeover(mine, theirs) if self.side_by_side else self.runs * max(mine, theirs)


def _with_takeover(mine: float, theirs: float) -> float:
    """Seconds until both side-by-side runs end, from each one's seconds alone beside the other: the one that ends
    last trains its rest TAKEOVER_SPEEDUP faster on every thread."""
    first, last = sorted((mine, theirs))
    return first + (last - first) / TAKEOVER_SPEEDUP


def _learning_rates(results: dict) -> str:
    """'lr 0.004 (MDLM) and 0.001 (AR)'; one number where they agree, or in results written before session 36."""
    rates = results.get("learning_rates") or {method: results["config"]["train"]["lr"] for method in METHODS}
    if len(set(rates.values())) == 1:
        return f"lr {next(iter(rates.values()))}"
    return "lr " + " and ".join(f"{rate} ({method.upper()})" for method, rate in rates.items())


def _minutes(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 600 else f"{seconds / 60:.0f} min"


def _steps_done(run_dir: Path) -> int | None:
    """The step of a run's last checkpoint; None when it has none."""
    last = run_dir / LAST_CHECKPOINT
    return read_checkpoint(last).get("global_step", 0) if last.is_file() else None


def _steps_to_train(run_dir: Path, max_steps: int) -> int:
    """Steps a run still has to train (0 when finished; reuse is checked later)."""
    return max(0, max_steps - (_steps_done(run_dir) or 0))


def _run_state(run_dir: Path, max_steps: int) -> str:
    done = _steps_done(run_dir)
    if done is None:
        return "new"
    return "done" if done >= max_steps else "partial"


REUSE_IGNORES = ("train.progress_bar", "train.wandb", "train.accelerator", "train.devices", "train.precision",
                 "data.num_workers", "data.eval_batch_size", "model.preset")
"""Keys in which a finished run may differ from the requested recipe and still be reused (how it ran, not what
it trained); any other difference (a seed, a step count) is a different run. `model.preset` is only the name of the
sizes it filled in: those (hidden_size, n_layers, n_heads) are compared on their own, so a sweep's run (preset
null) and the quickstart's (cpu-tiny) of the same sizes are the same run."""


def finished_run_changes(config: RunConfig, run_dir: Path, ignore: Sequence[str] = REUSE_IGNORES) -> str:
    """'' when the run in `run_dir` (its last checkpoint) trained `config`'s recipe, else what differs, as
    'key: old -> new; ...' (keys in `ignore` aside). Also what the recipe sweep checks before reusing a run."""
    saved = read_checkpoint(run_dir / LAST_CHECKPOINT).get("hyper_parameters", {})
    changes = {k: v for k, v in recipe_changes(saved, config, saved.get("tokenizer") or {}).items()
               if k not in ignore}
    return "; ".join(f"{k}: {old!r} -> {new!r}" for k, (old, new) in changes.items())


def _check_reusable(config: RunConfig, run_dir: Path) -> None:
    """Refuse to reuse a finished run of another recipe (another --seed or --max-steps), naming what differs."""
    listed = finished_run_changes(config, run_dir)
    if listed:
        raise ConfigError(f"[quickstart] {run_dir} holds a finished run of another recipe ({listed}); pass "
                          "--overwrite to replace it or --run-dir to train elsewhere")


def _check_resumable(config: RunConfig, run_dir: Path) -> None:
    """Refuse, before any training starts (and before a second process does), to resume an interrupted run of
    another recipe (another --seed, or a run of an earlier version's recipe, such as AR's 1,100 steps at 1e-3 before
    session 44), naming what differs; the step count may change on resume."""
    if not (run_dir / LAST_CHECKPOINT).is_file():
        return  # nothing to compare with: the run starts afresh
    listed = finished_run_changes(config, run_dir, ignore=(*REUSE_IGNORES, *RESUMABLE_KEYS))
    if listed:
        raise ConfigError(f"[quickstart] {run_dir} holds an interrupted run of another recipe ({listed}); pass "
                          "--overwrite to replace it or --run-dir to train elsewhere")


def _train_or_reuse(config: RunConfig, run_dir: Path, *callbacks: Callback) -> str:
    state = _run_state(run_dir, config.train.max_steps)
    if state == "done":
        _check_reusable(config, run_dir)
        print(f"[quickstart] {run_dir} already trained for {config.train.max_steps} steps; reusing it")
        return state
    if state == "partial":
        print(f"[quickstart] resuming the interrupted run in {run_dir}")
    train(config, run_dir, resume=state == "partial", extra_callbacks=list(callbacks) or None)
    return state


TRAINING_RECORD = "training.json"
"""In the run root: how each run was last trained (side by side or not, its torch threads), so that a report made
from finished runs that a later call reuses still says how they trained."""


def _read_training_record(run_root: Path) -> dict:
    try:
        record = json.loads((run_root / TRAINING_RECORD).read_text())
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def _record_training(run_root: Path, method: str, side_by_side: bool, threads: int,
                     more_threads: tuple[int, int] | None = None) -> None:
    """`more_threads`: (threads, from step) where the run took the other run's threads once that had finished."""
    record = _read_training_record(run_root)
    record[method] = {"side_by_side": side_by_side, "threads": threads}
    if more_threads:
        record[method]["more_threads"] = {"threads": more_threads[0], "from_step": more_threads[1]}
    write_atomically(run_root / TRAINING_RECORD, json.dumps(record, indent=2) + "\n")


def _training_report(run_root: Path) -> dict:
    """results.json's "training": side_by_side true, false, or "partly" (a run finished alone after its
    partner's), and the torch threads of each run's last training."""
    record = {m: r for m, r in _read_training_record(run_root).items() if m in METHODS and isinstance(r, dict)}
    modes = {bool(r.get("side_by_side")) for r in record.values()}
    side_by_side = "partly" if len(modes) > 1 else modes == {True}
    report = {"side_by_side": side_by_side, "threads": {m: r.get("threads") for m, r in record.items()}}
    more = {m: r["more_threads"] for m, r in record.items() if isinstance(r.get("more_threads"), dict)}
    return {**report, "more_threads": more} if more else report


def _train_models(configs: dict[str, RunConfig], run_dirs: dict[str, Path], log_dir: Path,
                  sequential: bool, while_waiting: Sequence[Callable[[], None]] = (),
                  spare: SpareProcess | None = None, started: float | None = None) -> dict:
    """Train, resume or reuse both runs; returns how they were trained (for the report).

    Two runs still to train on a CPU with at least two threads train side by side: MDLM here, with its progress
    bar, and AR in a second process (seqdiff.training.side_by_side), the threads split between them. Otherwise,
    or with `sequential`, one after the other on every thread. `while_waiting`: tasks run here, in order, after
    MDLM's training while AR still trains in its process (on this process's thread share), so they are off the path
    that AR's training sets; once AR has finished, the rest are left to the caller (with every thread). A stop
    during one stops AR too, as during training. `spare`: a process already importing (the CLI starts it first
    thing, seqdiff.training.spare) that trains AR if it runs side by side; the caller dismisses it otherwise.
    `started`: the command's start (time.perf_counter), for the projection of its end (ProjectedTime)."""
    setup = None if started is None else time.perf_counter() - started
    for method in METHODS:
        if _run_state(run_dirs[method], configs[method].train.max_steps) == "partial":
            _check_resumable(configs[method], run_dirs[method])
    threads = torch.get_num_threads()
    todo = [m for m in METHODS if _run_state(run_dirs[m], configs[m].train.max_steps) != "done"]
    cuda = uses_cuda(configs[METHODS[0]].train.accelerator)
    split = None if sequential or len(todo) < len(METHODS) or cuda else split_threads(threads)
    if split is None:
        if spare is not None:
            spare.dismiss()  # now, not when the quickstart ends: its memory is better spent on training
        for method in METHODS:
            later = METHODS[METHODS.index(method) + 1:]
            steps_after = sum(_steps_to_train(run_dirs[m], configs[m].train.max_steps) for m in later)
            if _train_or_reuse(configs[method], run_dirs[method],
                               ProjectedTime(method, steps_after, len(METHODS), started=started,
                                             setup=setup)) != "done":
                _record_training(log_dir, method, False, threads)
        return _training_report(log_dir)

    here, there = METHODS
    for method in METHODS:  # a run another trainer holds: one line, before a second process is started
        RunLock(run_dirs[method]).check_free()
    resume = _run_state(run_dirs[there], configs[there].train.max_steps) == "partial"
    log = log_dir / f"{there}.log"
    child_config = dataclasses.replace(configs[there], train=dataclasses.replace(configs[there].train,
                                                                                 progress_bar=False))
    print(f"[quickstart] training {here} here and {there} in a second process at the same time "
          f"({split[0]} + {split[1]} torch threads{'; resuming ' + str(run_dirs[there]) if resume else ''}); "
          f"{there}'s output: {log}", file=sys.stderr)
    their_steps = _steps_to_train(run_dirs[there], configs[there].train.max_steps)
    with sigterm_raises():  # SIGTERM outside MDLM's training reaches the second process too
        child = ChildRun(child_config, run_dirs[there], resume, split[1], log, spare)
        torch.set_num_threads(split[0])
        try:
            watch = ChildWatch(child, here, threads)  # once AR has ended, MDLM trains on every thread
            _train_or_reuse(configs[here], run_dirs[here],
                            ProjectedTime(here, 0, len(METHODS), side_by_side=True, other=child.step_seconds,
                                          other_name=there, other_steps=their_steps, started=started, setup=setup),
                            watch)
            _record_training(log_dir, here, True, split[0], watch.took_threads_at and (threads, watch.took_threads_at))
            for i, task in enumerate(while_waiting):
                if child.process.poll() is not None:
                    break
                if i == 0:
                    print(f"[quickstart] {here} finished; scoring it while {there} trains in the second process",
                          file=sys.stderr)
                task()
            if child.process.poll() is None:
                child.offer_threads(threads)  # nothing left here but waiting: the second process may take them all
                print(f"[quickstart] {here} finished; waiting for {there} in the second process, which takes all "
                      f"{threads} torch threads from its next step (its output: {log})", file=sys.stderr)
            status = child.wait()
        except BaseException as stop:  # Ctrl-C, SIGTERM or an error here: the other run stops with a checkpoint too
            signum = getattr(stop, "signum", signal.SIGINT if isinstance(stop, KeyboardInterrupt) else signal.SIGTERM)
            child.stop(signum)
            status = child.wait()
            print(f"[quickstart] {run_dirs[there]} (the second process) {describe(status)}; its output: {log}",
                  file=sys.stderr)
            if status == INTERRUPTED and isinstance(stop, KeyboardInterrupt):  # stopped while no run trained here
                # (set-up, waiting): name the run that stopped with a checkpoint; exit with the signal's status
                raise TrainingInterrupted(signum, _steps_done(run_dirs[there]) or 0, run_dirs[there] / LAST_CHECKPOINT,
                                          run_dirs[there]) from stop
            raise
        finally:
            torch.set_num_threads(threads)
    child.check(status)
    _record_training(log_dir, there, True, split[1], child.took_threads())
    child.clear_offer()
    return _training_report(log_dir)


def _loss_curves(run_dirs: dict[str, Path], out: Path) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for method, run_dir in run_dirs.items():
        rows = read_metrics(run_dir)
        if rows and "train/bits_per_token" in rows[0]:
            axes[0].plot(*metric_curve(rows, "train/bits_per_token"), label=f"{method} (train, one draw per step)",
                         alpha=0.8)
        if rows and "val/bits_per_token" in rows[0]:
            axes[1].plot(*metric_curve(rows, "val/bits_per_token"), marker="o", label=f"{method} (valid)")
    axes[0].set(xlabel="step", ylabel="bits per character", title="training loss (MDLM: NELBO)")
    axes[1].set(xlabel="step", ylabel="bits per character", title="validation (EMA weights)")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    save_figure(fig, out)


def run_quickstart(out_dir: str | Path = "reports/quickstart", run_root: str | Path = "runs/quickstart",
                   max_steps: int | None = None, overwrite: bool = False, seed: int | None = None,
                   sequential: bool = False, spare: SpareProcess | None = None,
                   started: float | None = None) -> dict:
    """Train, score and report both models. `spare`: see _train_models (dismissed here if unused). `started`: the
    time.perf_counter() at which the command started (the CLI passes its process's start, so the report's
    wall-clock time includes the imports a user waits for); by default, this call's start."""
    now = time.perf_counter()
    start = now if started is None else min(started, now)
    try:
        return _run_quickstart(out_dir, run_root, max_steps, overwrite, seed, sequential, spare, start, now - start)
    finally:
        if spare is not None:
            spare.dismiss()


def _run_quickstart(out_dir: str | Path, run_root: str | Path, max_steps: int | None, overwrite: bool,
                    seed: int | None, sequential: bool, spare: SpareProcess | None, start: float,
                    before_call: float) -> dict:
    out_dir, run_root = Path(out_dir), Path(run_root)
    for folder, option in ((out_dir, "--out"), (run_root, "--run-dir")):  # not after minutes of training
        check_output_folder(folder, option)
    base = QUICKSTART
    if seed is not None:
        if seed < 0:
            raise ConfigError(f"--seed must be >= 0, got {seed}")
        base = dataclasses.replace(base, train=dataclasses.replace(base.train, seed=seed),
                                   sample=dataclasses.replace(base.sample, seed=seed))
    if max_steps is not None:
        if max_steps < 1:
            raise ConfigError(f"--max-steps must be >= 1, got {max_steps}")
        base = dataclasses.replace(base, train=with_steps(base.train, max_steps))
        note = longer_run_note(max_steps)
        if note:
            print(note, flush=True)
    if overwrite and run_root.exists():
        shutil.rmtree(run_root)
    torch.set_float32_matmul_precision("high")
    default_out = Path(inspect.signature(run_quickstart).parameters["out_dir"].default)
    command = ("seqdiff quickstart" + (f" --out {out_dir}" if out_dir != default_out else "")
               + (f" --max-steps {max_steps}" if max_steps else "")
               + (f" --seed {seed}" if seed is not None else "")
               + (" --sequential" if sequential else ""))  # what rewrites this report (runs go anywhere)
    results: dict = {"command": command,
                     "config": dataclasses.asdict(base), "torch_threads": torch.get_num_threads(),
                     "precision": resolve_precision(base.train.precision, base.train.accelerator),
                     "seconds_before_call": before_call,
                     "cpu_count": os.cpu_count(), "load_average_at_start": os.getloadavg()[0], "models": {}}
    configs = {method: method_recipe(base, method, max_steps) for method in METHODS}
    results["learning_rates"] = {method: configs[method].train.lr for method in METHODS}
    results["max_steps"] = {method: configs[method].train.max_steps for method in METHODS}
    run_dirs = {method: run_root / method for method in METHODS}
    words: set[str] = set()

    def score(method: str) -> None:
        """Evaluate and sample one trained run into results["models"][method]."""
        config = configs[method]
        timing = run_dirs[method] / "timing.json"  # written by train(), summed over resumes
        train_seconds = json.loads(timing.read_text())["train_seconds"] if timing.is_file() else float("nan")

        model = load_checkpoint(run_dirs[method])
        test_path = split_path(config.data, "test")
        tokens = tokenize_file(test_path, model.tokenizer)
        t0 = time.perf_counter()
        report = evaluate_tokens(model, tokens, batch_size=config.data.eval_batch_size,
                                 num_t_samples=1 if model.method.exact_likelihood else NUM_T_SAMPLES, seed=0)
        eval_seconds = time.perf_counter() - t0
        gen = generate(model, config.sample)
        if not words:  # the training text's words (after the text8 normalization the models see)
            words.update(text8_normalize(read_text_file(split_path(config.data, "train"))).split())
        word_share, words_counted = known_word_share(gen.texts, words)
        results["models"][method] = {
            **report,
            "test_file": str(test_path),
            "steps": model.step,
            "tokens_seen": model.step * config.data.batch_size * config.data.seq_len,
            "parameters": sum(p.numel() for p in model.backbone.parameters()),
            "train_seconds": train_seconds,
            "eval_seconds": eval_seconds,
            "sampler": gen.sampler,
            "sample_steps": None if model.method.causal else config.sample.steps,
            "sample_seconds": gen.seconds,
            "sample_tokens_per_second": sum(len(t) for t in gen.tokens) / gen.seconds,
            "denoiser_calls": gen.denoiser_calls,
            "samples": gen.texts,
            "known_word_share": word_share,
            "words_counted": words_counted,
            "training_noise": model.method.training_noise(),
        }

    def count() -> None:
        results["ngram"] = ngram_baseline(base.data, load_tokenizer(run_dirs[METHODS[0]]))  # the run's own

    # side by side, the n-gram (one thread at any rate) and then MDLM are scored while AR still trains in its
    # process, off the critical path; what AR's end leaves undone runs below, on every thread
    results["training"] = _train_models(configs, run_dirs, run_root, sequential,
                                        while_waiting=(count, lambda: score(METHODS[0])), spare=spare, started=start)
    for method in METHODS:  # MDLM first either way: the table's order
        if method not in results["models"]:
            score(method)
    mdlm, ar = results["models"]["mdlm"], results["models"]["ar"]
    results["relative_gap_bits"] = mdlm["bits_per_character"] / ar["bits_per_character"] - 1
    if "ngram" not in results:
        count()
    results["total_seconds"] = time.perf_counter() - start

    out_dir.mkdir(parents=True, exist_ok=True)
    with written_together():  # a Ctrl-C here takes effect after the three files
        _loss_curves(run_dirs, out_dir / "loss_curves.png")
        write_atomically(out_dir / "results.json", json.dumps(results, indent=2) + "\n")
        write_atomically(out_dir / "summary.md", _summary(results))
    print(_table(results))
    print(f"[quickstart] reports written to {out_dir}/ in {results['total_seconds']:.0f} s", file=sys.stderr)
    return results


def _table(results: dict) -> str:
    rows = ["| model | test bits/char | perplexity | kind | steps | params | train s | sampler | sample tok/s | "
            "words in training text |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for method, r in results["models"].items():
        kind = f"NELBO bound ({r['num_t_samples']} t-samples)" if r["bound"] else "exact"
        rows.append(f"| {method.upper()} | {r['bits_per_character']:.4f} | {r['perplexity']:.3f} | {kind} | "
                    f"{r['steps']} | {r['parameters']:,} | {r['train_seconds']:.0f} | {r['sampler']} | "
                    f"{r['sample_tokens_per_second']:.0f} | {100 * r['known_word_share']:.0f}% of "
                    f"{r['words_counted']} |")
    ngram = results.get("ngram")
    if ngram:
        bits = ngram["bits_per_character"]
        rows.append(f"| n-gram (Witten-Bell, order {ngram['order']}) | {bits:.4f} | {2 ** bits:.3f} | exact | - | "
                    f"counts | - | - | - | - |")
    return "\n".join(rows)


def _precision(results: dict) -> str:
    """How the run trained, in words (train.precision=bf16-if-native resolves by the machine)."""
    setting = results["config"]["train"]["precision"]
    if results.get("precision") == "bf16-mixed":
        return f"bf16 autocast (train.precision={setting}: this machine multiplies bf16 natively)"
    why = ": this machine does not multiply bf16 natively" if setting == "bf16-if-native" else ""
    return f"float32 (train.precision={setting}{why})"


def _works(split: str) -> str:
    works = load_manifest("shakespeare")["splits"][split]["works"]
    return ", ".join(w["name"] if isinstance(w, dict) else str(w) for w in works)


ACTIVATION_WORDS = {"gelu": "the exact (erf) GELU", "gelu_tanh": "the tanh-approximate GELU"}


def _activation(model: dict) -> str:
    """The summary's words for model.activation (reports made before the key existed used the tanh GELU)."""
    name = model.get("activation", "gelu_tanh")
    return f", {ACTIVATION_WORDS.get(name, name)} in the MLPs (model.activation={name})"


def _local_conv(model: dict) -> str:
    """The summary's words for model.local_conv (absent from reports made before it existed)."""
    k = model.get("local_conv", 0)
    if not k:
        return ""
    sites = ("before each block's attention and its MLP (model.local_conv, model.local_conv_mlp)"
             if model.get("local_conv_mlp") else "(model.local_conv)")
    return f" and a depthwise convolution over {k} neighbouring positions {sites}"


def _kmers(model: dict) -> str:
    """The summary's words for model.kmer_sizes (absent from reports made before it existed)."""
    sizes = model.get("kmer_sizes") or []
    if not sizes:
        return ""
    listed = ", ".join(str(k) for k in sizes)
    return (f", plus learned embeddings of the {listed}-character windows around each position "
            f"(model.kmer_sizes, hashed into at most {model.get('kmer_buckets'):,} rows per size)")


def _start_sentence(results: dict) -> str:
    """What the total time counts from: the command's process (Python's start and the imports included) or, for
    a report made before session 35 or from Python, the quickstart's own call."""
    before = results.get("seconds_before_call") or 0.0
    return f" from the command's start, {before:.0f} s of it starting Python and importing" if before >= 0.5 else ""


def _training_sentence(training: dict | None) -> str:
    """How the two runs were trained (absent from reports made before side-by-side training)."""
    if not training:
        return ""
    threads = ", ".join(f"{m.upper()} {n}" for m, n in training["threads"].items())
    if training["side_by_side"] == "partly":
        return (f"Part of the training ran side by side, in two processes at the same time, and a run finished "
                f"alone (torch threads, last training: {threads}), so the training seconds partly overlap.")
    if training["side_by_side"]:
        more = "".join(f"; {m.upper()} took {r['threads']} from step {r['from_step']}, once the other had finished"
                       for m, r in training.get("more_threads", {}).items())
        return (f"The two models trained side by side, in two processes at the same time (torch threads: "
                f"{threads}{more}), so each model's training seconds overlap the other's.")
    return f"The models trained one after the other (torch threads: {threads})." if threads else ""


def _summary(results: dict) -> str:
    cfg = results["config"]
    m = results["models"]["mdlm"]
    lines = [
        "# Quickstart: MDLM vs AR on Shakespeare (character level, offline)",
        "",
        f"Made by `{results['command']}` in {results['total_seconds']:.0f} s of wall-clock time"
        f"{_start_sentence(results)} ({results['torch_threads']} torch threads on {results['cpu_count']} cores, "
        f"load average {results['load_average_at_start']:.1f} at the start: timings depend on what else the machine "
        "runs). "
        f"Numbers below come from that run (`results.json`); training seconds are summed over resumes. "
        f"{_training_sentence(results.get('training'))}",
        "",
        f"Data: the Shakespeare slice shipped with seqdiff, split by whole plays (train: {_works('train')}; "
        f"valid: {_works('valid')}; test: {_works('test')}), lowercased to the text8 alphabet (a-z and space).",
        f"Both models: DiT backbone {cfg['model']['hidden_size']} wide, {cfg['model']['n_layers']} layers, "
        f"{cfg['model']['n_heads']} heads{_local_conv(cfg['model'])}{_kmers(cfg['model'])}"
        f"{_activation(cfg['model'])}, "
        f"blocks of {cfg['data']['seq_len']} characters, batch "
        f"{cfg['data']['batch_size']}, {_steps_sentence(results['models'])}, AdamW "
        f"{_learning_rates(results)} with cosine decay, EMA weights for evaluation; {_precision(results)}."
        f"{_noise_sentence(m)}",
        "",
        _table(results),
        "",
        f"MDLM's number is an upper bound on its NLL; the relative gap to AR is "
        f"{100 * results['relative_gap_bits']:+.1f}% in bits. With this small budget both models are far from "
        "converged, and MDLM learns more slowly than AR per token (each step trains on a random fraction of "
        "masked positions), so a gap larger than the papers' (a few percent at convergence) is expected here.",
        "",
        f"The n-gram row is a counting baseline: interpolated Witten-Bell character n-grams fitted on the same "
        f"training plays ({results['ngram']['train_characters']:,} characters), the order chosen on the validation "
        "play, each split scored as one stream (the models score blocks of "
        f"{cfg['data']['seq_len']} characters). 'Words in training text': the share of the samples' whole words "
        "(the last, cut-off word of each sample left out) that occur in the training plays"
        f"{_sampling(cfg['sample'])}.",
        "",
        "![loss curves](loss_curves.png)",
        "",
        f"## Samples ({cfg['sample']['seq_len']} characters, seed {cfg['sample']['seed']}; the first {SHOWN} of each "
        "model)",
        "",
    ]
    for method, r in results["models"].items():
        detail = f"{r['sampler']} sampler" + (f", {r['sample_steps']} steps, {r['denoiser_calls']} denoiser calls"
                                               if r["sample_steps"] else "")
        lines += [f"### {method.upper()} ({detail})", ""]
        lines += [f"    {s}" for s in r["samples"][:SHOWN]] + [""]
    return "\n".join(lines)


SHOWN = 4
"""Samples of each model printed in summary.md (results.json keeps them all)."""


def _steps_sentence(models: dict) -> str:
    """'1,100 steps (N training tokens each)' where both trained as long; else each model's steps and why."""
    steps = {method: r["steps"] for method, r in models.items()}
    if len(set(steps.values())) == 1:
        r = next(iter(models.values()))
        return f"{r['steps']:,} steps ({r['tokens_seen']:,} training tokens each)"
    each = " and ".join(f"{r['steps']:,} steps for {method.upper()} ({r['tokens_seen']:,} training tokens)"
                        for method, r in models.items())
    return (f"{each}, each model's own step count (AR trained twice as long scores within 0.01 bits of it on the "
            "validation play: reports/quickstart_sweep/ar_steps)")


def _noise_sentence(mdlm: dict) -> str:
    """The summary's words for MDLM's training noise (empty for a results.json written before it was recorded)."""
    noise = mdlm.get("training_noise")
    if not noise:
        return ""
    if noise["time_sampling"] != "mask_count":
        return f" MDLM's training noise: method.time_sampling {noise['time_sampling']}."
    law = "q(k) ∝ k^(-1/2)" if noise["mask_count_law"] == "inverse_sqrt" else "k uniform on 1..n"
    return (f" MDLM's training noise: method.time_sampling mask_count, mask_count_law {noise['mask_count_law']} "
            f"(k of a row's n characters masked, {law}, weighted so that the NELBO estimate stays unbiased).")


def _sampling(sample: dict) -> str:
    """The summary's words for the samples' count and nucleus setting."""
    top_p = sample.get("top_p", 1.0)
    nucleus = f", drawn with nucleus sampling at top_p {top_p} for both models" if top_p < 1 else ""
    return f" ({sample['num_samples']} samples per model{nucleus})"


__all__ = ["QUICKSTART", "run_quickstart"]

if __name__ == "__main__":  # pragma: no cover
    run_quickstart()
