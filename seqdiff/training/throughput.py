"""Training throughput in the run's own logs: tokens per second, seconds per step and, on a GPU, model FLOP
utilization, logged with the other training metrics (`perf/...` in logs/metrics.csv, and W&B when on).

Why: a user training for a GPU-day needs to see, in the run itself, whether the GPU is being used well (the
papers' recipes and nanoGPT / torchtitan report MFU), and to compare two runs' speed, without a separate
benchmark. `seqdiff bench` and `seqdiff.bench.gpu_check` measure chosen shapes; this measures the run.

What is counted: the token positions of each training batch (padding included: the model processes it), over
every process (each process sees its share; the count is multiplied by the world size), divided by the wall-clock
time of the steps since the last log. Validation passes are left out of the time (their pause is subtracted);
checkpoint writes and data loading are in it, as they are in the run. On CUDA the device is synchronized once per
logged window, so queued kernels are counted in the window that launched them.
MFU = model FLOPs per token (the backbone's `flops_per_token`, PaLM's 6N + attention convention, with the share of
positions at which the method runs the output head) x tokens per second / the device's dense bf16 peak
(seqdiff.training.device_peaks, from the device name): logged on CUDA under bf16 (against a bf16 peak a float32
run would read low), when the device is in the table.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
from lightning.pytorch.callbacks import Callback

from seqdiff.methods import Batch
from seqdiff.training.device_peaks import mfu, peak_bf16_flops


def run_peak_flops(trainer) -> float | None:
    """The bf16 peak of the run's device where MFU means something: CUDA, under bf16, a device in the table."""
    device = trainer.strategy.root_device
    if device.type != "cuda" or "bf16" not in str(trainer.precision):
        return None
    return peak_bf16_flops(torch.cuda.get_device_name(device))


class Throughput(Callback):
    """Logs perf/tokens_per_s and perf/seconds_per_step (and perf/mfu where `peak_flops` is known) every
    train.log_every steps. `peak_flops`: "auto" (`run_peak_flops`), a number, or None (no MFU); `clock`: seconds,
    replaceable in tests."""

    def __init__(self, log_every: int, peak_flops: float | str | None = "auto",
                 clock: Callable[[], float] = time.perf_counter) -> None:
        super().__init__()
        self.log_every, self.peak_setting, self.clock = log_every, peak_flops, clock
        self.peak_flops: float | None = None
        self.window_start: float | None = None
        self.paused_at: float | None = None
        self.tokens = self.steps = 0
        self.flops_per_token: dict[int, float | None] = {}  # per sequence length

    def on_train_start(self, trainer, pl_module) -> None:
        self.peak_flops = run_peak_flops(trainer) if self.peak_setting == "auto" else self.peak_setting
        self._restart()

    def _restart(self) -> None:
        self.window_start, self.tokens, self.steps = self.clock(), 0, 0

    def on_validation_start(self, trainer, pl_module) -> None:
        self.paused_at = self.clock()

    def on_validation_end(self, trainer, pl_module) -> None:
        if self.paused_at is not None and self.window_start is not None:
            self.window_start += self.clock() - self.paused_at  # the validation pass is not training time
        self.paused_at = None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.window_start is None:
            self._restart()
        ids = Batch.from_any(batch).input_ids
        self.tokens += ids.numel() * trainer.world_size
        self.steps += 1
        if trainer.global_step % self.log_every != 0:  # Lightning writes step metrics at these steps only
            return
        if pl_module.device.type == "cuda":
            torch.cuda.synchronize(pl_module.device)
        seconds = self.clock() - self.window_start
        if seconds <= 0:
            return
        tokens_per_s = self.tokens / seconds
        metrics = {"perf/tokens_per_s": tokens_per_s, "perf/seconds_per_step": seconds / self.steps}
        flops_per_token = self._flops_per_token(pl_module, ids.shape[1]) if self.peak_flops else None
        if flops_per_token:
            metrics["perf/mfu"] = mfu(flops_per_token, tokens_per_s, self.peak_flops)
        for name, value in metrics.items():
            pl_module.log(name, float(value), on_step=True, on_epoch=False)
        self._restart()

    def _flops_per_token(self, pl_module, seq_len: int) -> float | None:
        """The backbone's training FLOPs per token at this length (None for a backbone that does not count them)."""
        if seq_len not in self.flops_per_token:
            backbone = pl_module.backbone
            count = getattr(backbone, "flops_per_token", None)
            self.flops_per_token[seq_len] = (count(seq_len, pl_module.method.head_share(backbone))
                                             if count is not None else None)
        return self.flops_per_token[seq_len]


__all__ = ["Throughput", "run_peak_flops"]
