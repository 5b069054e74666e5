"""The training progress bar, counted in optimizer steps from 0 to train.max_steps, also on a resumed run.

Lightning sets the bar's total and its "Epoch N" label in `on_train_epoch_start`, to the steps left in the epoch,
while it counts the bar's position from the batch index it restores. seqdiff's training data is one endless epoch
of step-indexed batches (one batch a step: micro-batches are split inside the step), so a resumed run showed either
"Training: 75/?" (resumed mid-epoch: Lightning calls no `on_train_epoch_start` then) or "4/?" after a total of the
steps left (a finished run resumed with a larger max_steps starts an epoch). This bar counts global steps instead.
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch.callbacks import TQDMProgressBar


class ResumableProgressBar(TQDMProgressBar):
    """TQDMProgressBar over global steps: total train.max_steps, starting at the restored step."""

    def on_train_start(self, trainer: Any, *args: Any) -> None:
        super().on_train_start(trainer, *args)
        self._count_steps(trainer)  # resumed mid-epoch: no on_train_epoch_start follows

    def on_train_epoch_start(self, trainer: Any, *args: Any) -> None:
        super().on_train_epoch_start(trainer, *args)
        self._count_steps(trainer)

    def _count_steps(self, trainer: Any) -> None:
        if trainer.max_steps > 0:  # else Lightning's count of batches stands
            bar = self.train_progress_bar
            bar.reset(total=trainer.max_steps)
            bar.initial = bar.n = trainer.global_step  # the time left counts from the restored step
            bar.set_description(f"Epoch {trainer.current_epoch}")

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        # Lightning's bar moves to batch_idx + 1; the step count is the global step (batch_idx restarts each epoch)
        super().on_train_batch_end(trainer, pl_module, outputs, batch, trainer.global_step - 1)


__all__ = ["ResumableProgressBar"]
