"""Variance of a method's training-loss estimator, and of its gradient, at fixed weights.

What is measured. At fixed weights theta, one training step sees the stochastic loss l(theta; x, noise) of a
batch x and its gradient g = grad l. For each estimator (a `method.time_sampling`, optionally with several
masks per sequence at equal cost) this draws R independent estimates and reports
  loss_var   the sample variance of l over the R draws,
  grad_var   the trace of the gradient's covariance, E ||g - E g||^2 (unbiased: sum ||g_r - g_bar||^2 / (R - 1)),
  grad_norm2 ||g_bar||^2, the squared norm of the mean gradient (the signal the variance is compared with),
and the means with their standard errors, so that the estimators can be seen to agree (each is unbiased).

Two regimes, both at the same cost per draw (B rows, one forward and backward):
- `fixed_batch`: one batch x held fixed, only the noise (times and masks) redrawn: the variance that the
  time sampler controls.
- `fresh_batch`: a new batch of windows every draw as well: the whole gradient noise SGD sees, where the
  data's own variance is added to the sampler's.
- `batch_noise`: fresh batches, each drawn `per_batch` times with fresh noise; the variance is pooled within the
  batches (sum over batches of sum_r ||g_r - g_bar_b||^2 over sum of (per_batch - 1)): the sampler's variance
  averaged over the data, E_x Var(g | x). By the law of total variance fresh_batch = Var_x E(g | x) + this, so the
  difference of the two is the data's part, which no estimator of a batch's loss can remove: fresh_batch of the
  baseline over that part bounds the ratio any estimator can reach with fresh data.

`masks_per_sequence = k`: B / k distinct windows, each repeated k times (tiled, so the copies of a sequence fall
in strata B / k apart) and masked independently; at fixed data this can only add variance per row, but with
fresh data it trades data variance for noise variance. `complementary`: B / 2 distinct windows, each scored
with a mask and its (near-)complement (`method.complementary_masks`), also B rows per forward: the same cost
and the same data as two independent masks, with the pair's masks coupled instead of independent.

Accumulation is in float64 (running sums of g and ||g||^2 per group of draws), so R draws of a P-parameter
model cost O(P) memory. Draws are seeded by (seed, estimator index, draw), and every estimator sees the same batches.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from seqdiff.data.blocks import step_generator
from seqdiff.methods import Batch
from seqdiff.methods.base import Method


@dataclass(frozen=True)
class Estimator:
    """One way to estimate the training loss of a batch of B rows."""

    time_sampling: str
    """method.time_sampling (seqdiff.schedules.TIME_SAMPLINGS)."""
    masks_per_sequence: int = 1
    """Independent masks of each window in the batch (B / k windows, each k times)."""
    complementary: bool = False
    """method.complementary_masks: B / 2 windows, each with a mask and its complement (B rows per forward)."""
    mask_count_law: str = "uniform"
    """method.mask_count_law (mask_count's law of k)."""

    def __post_init__(self) -> None:
        if self.complementary and self.masks_per_sequence != 1:
            raise ValueError("complementary pairs are two masks per window already: keep masks_per_sequence=1")

    @property
    def label(self) -> str:
        name = self.time_sampling + ("" if self.mask_count_law == "uniform" else f" {self.mask_count_law}")
        if self.complementary:
            return f"{name} complementary pairs"
        k = self.masks_per_sequence
        return name if k == 1 else f"{name} x{k} masks"

    @property
    def windows_divisor(self) -> int:
        """The batch of B rows holds B / this distinct windows."""
        return 2 if self.complementary else self.masks_per_sequence

    @property
    def method_options(self) -> dict:
        """MethodConfig keys besides time_sampling that this estimator sets."""
        options = {"complementary_masks": True} if self.complementary else {}
        if self.mask_count_law != "uniform":
            options["mask_count_law"] = self.mask_count_law
        return options


@dataclass
class EstimatorStats:
    label: str
    time_sampling: str
    masks_per_sequence: int
    regime: str
    draws: int
    loss_mean: float
    loss_mean_stderr: float
    loss_var: float
    loss_var_stderr: float
    grad_var: float
    grad_var_stderr: float
    grad_norm2: float
    complementary: bool = False

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _grad_vector(loss: Tensor, params: list[nn.Parameter]) -> Tensor:
    grads = torch.autograd.grad(loss, params, allow_unused=True)
    return torch.cat([(torch.zeros_like(p) if g is None else g).reshape(-1).double() for g, p in zip(grads, params)])


def _draw(method: Method, backbone: nn.Module, x: Tensor, params: list[nn.Parameter], seed: int, e_index: int,
          r: int) -> tuple[float, Tensor]:
    """Draw r of estimator e_index on the rows x (B, L): (loss, gradient (P,) float64). The rows are put in a random
    order first, the same for every estimator at draw r, as a data loader would (a stratified sampler ties row i
    to stratum i, which is unbiased only over the order of the rows)."""
    x = x[torch.randperm(x.shape[0], generator=step_generator(seed + 77, r))]
    loss = method.loss(backbone, Batch(x), step_generator(seed * 1_000 + e_index, r)).loss
    return loss.item(), _grad_vector(loss, params)


def _variances(losses: Tensor, g_sum: Tensor, g2_sum: float, n: int) -> tuple[float, float]:
    """(sample variance of the losses, trace of the gradient covariance) from running sums over n draws."""
    g_bar = g_sum / n
    return float(losses.var()), (g2_sum - n * float(g_bar.square().sum())) / (n - 1)


REGIMES = ("fixed_batch", "fresh_batch", "batch_noise")


def measure(method_factory, backbone: nn.Module, batch_at, estimators: list[Estimator], draws: int,
            regime: str = "fixed_batch", seed: int = 0, groups: int = 5,
            mean_gradients: dict[str, Tensor] | None = None, per_batch: int = 10) -> list[EstimatorStats]:
    """Statistics of each estimator over `draws` draws at the backbone's current weights.

    method_factory(time_sampling, **est.method_options) -> Method; batch_at(k, rows) -> (rows, L) token ids, the
    k-th batch (a function of k only). fixed_batch uses batch_at(0, B) for every draw, fresh_batch
    batch_at(1 + r, B / d), d = est.windows_divisor.
    The rows of every draw are put in a random order (the same for every estimator at draw r), as a data loader
    would: a stratified sampler ties row i to stratum i, which is unbiased only over the order of the rows.
    The variances' standard errors come from the spread of the estimates over `groups` disjoint groups of draws
    (the losses are heavy-tailed near t = 0, so a variance needs many draws). `mean_gradients`, if given, receives
    each estimator's mean gradient (label -> (P,) float64), for `mean_gradient_agreement`.
    batch_noise: draw r uses batch_at(1 + r // per_batch, B / d), and the variances are pooled within those batches
    (`measure_batch_noise`); its groups are whole batches.
    """
    if regime not in REGIMES:
        raise ValueError(f"regime={regime!r}; choose one of {list(REGIMES)}")
    if draws < 2 * groups or groups < 2:
        raise ValueError(f"draws={draws}, groups={groups}: need groups >= 2 and at least 2 draws per group")
    if regime == "batch_noise":
        return measure_batch_noise(method_factory, backbone, batch_at, estimators, draws, seed, groups,
                                   mean_gradients, per_batch)
    params = [p for p in backbone.parameters() if p.requires_grad]
    full = batch_at(0, None)  # (B, L)
    B = full.shape[0]
    out = []
    for e_index, est in enumerate(estimators):
        k = est.masks_per_sequence
        d = est.windows_divisor  # B / d windows per draw
        if B % d != 0:
            raise ValueError(f"{est.label}: {d} rows per window do not divide the batch of {B} rows")
        method: Method = method_factory(est.time_sampling, **est.method_options)
        losses = [[] for _ in range(groups)]
        g_sums: list[Tensor | None] = [None] * groups
        g2_sums = [0.0] * groups
        for r in range(draws):
            if regime == "fixed_batch":
                x = full if d == 1 else full[: B // d]
            else:
                x = batch_at(1 + r, B // d)  # (B / d, L): the same windows for every estimator at draw r
            x = x.repeat(k, 1)  # (B / d * k, L): copy j of window i at row j * B / k + i
            loss, g = _draw(method, backbone, x, params, seed, e_index, r)
            j = r % groups
            losses[j].append(loss)
            g_sums[j] = g if g_sums[j] is None else g_sums[j] + g
            g2_sums[j] += float(g.square().sum())
        all_losses = torch.tensor([v for group in losses for v in group], dtype=torch.float64)
        g_sum = sum(g_sums[1:], g_sums[0])
        if mean_gradients is not None:
            mean_gradients[est.label] = g_sum / draws
        loss_var, grad_var = _variances(all_losses, g_sum, sum(g2_sums), draws)
        per_group = torch.tensor([_variances(torch.tensor(losses[j], dtype=torch.float64), g_sums[j], g2_sums[j],
                                             len(losses[j])) for j in range(groups)], dtype=torch.float64)
        stderr = per_group.std(0) / math.sqrt(groups)  # (2,)
        out.append(EstimatorStats(label=est.label, time_sampling=est.time_sampling, masks_per_sequence=k,
                                  regime=regime, draws=draws, loss_mean=float(all_losses.mean()),
                                  loss_mean_stderr=float(all_losses.std() / math.sqrt(draws)),
                                  loss_var=loss_var, loss_var_stderr=float(stderr[0]), grad_var=grad_var,
                                  grad_var_stderr=float(stderr[1]), grad_norm2=float((g_sum / draws).square().sum()),
                                  complementary=est.complementary))
    return out


def measure_batch_noise(method_factory, backbone: nn.Module, batch_at, estimators: list[Estimator], draws: int,
                        seed: int, groups: int, mean_gradients: dict[str, Tensor] | None,
                        per_batch: int) -> list[EstimatorStats]:
    """The `batch_noise` regime of `measure`: draws / per_batch fresh batches, each drawn per_batch times with fresh
    noise; loss_var and grad_var are the variances pooled within the batches, their standard errors the spread over
    `groups` groups of whole batches (batch b in group b mod groups)."""
    batches = draws // per_batch if per_batch >= 2 else 0
    if per_batch < 2 or draws % per_batch or batches < 2 * groups:
        raise ValueError(f"batch_noise: draws={draws}, per_batch={per_batch}, groups={groups}: need per_batch >= 2 "
                         "dividing draws, and at least 2 batches per group")
    params = [p for p in backbone.parameters() if p.requires_grad]
    B = batch_at(0, None).shape[0]
    out = []
    for e_index, est in enumerate(estimators):
        d = est.windows_divisor
        if B % d != 0:
            raise ValueError(f"{est.label}: {d} rows per window do not divide the batch of {B} rows")
        method: Method = method_factory(est.time_sampling, **est.method_options)
        within = torch.zeros(groups, 2, dtype=torch.float64)  # per group: loss and gradient sums of squares
        dof = torch.zeros(groups, dtype=torch.float64)
        losses, g_total = [], None
        for b in range(batches):
            x_b = batch_at(1 + b, B // d).repeat(est.masks_per_sequence, 1)  # (B, L), as in fresh_batch
            batch_losses, g_sum, g2_sum = [], None, 0.0
            for i in range(per_batch):
                loss, g = _draw(method, backbone, x_b, params, seed, e_index, b * per_batch + i)
                batch_losses.append(loss)
                g_sum = g if g_sum is None else g_sum + g
                g2_sum += float(g.square().sum())
            losses += batch_losses
            g_total = g_sum if g_total is None else g_total + g_sum
            loss_var, grad_var = _variances(torch.tensor(batch_losses, dtype=torch.float64), g_sum, g2_sum, per_batch)
            within[b % groups] += torch.tensor([loss_var, grad_var], dtype=torch.float64) * (per_batch - 1)
            dof[b % groups] += per_batch - 1
        if mean_gradients is not None:
            mean_gradients[est.label] = g_total / draws
        pooled = within.sum(0) / dof.sum()  # (2,)
        stderr = (within / dof[:, None]).std(0) / math.sqrt(groups)  # (2,)
        all_losses = torch.tensor(losses, dtype=torch.float64)
        out.append(EstimatorStats(label=est.label, time_sampling=est.time_sampling,
                                  masks_per_sequence=est.masks_per_sequence, regime="batch_noise", draws=draws,
                                  loss_mean=float(all_losses.mean()),
                                  loss_mean_stderr=float(all_losses.std() / math.sqrt(draws)),
                                  loss_var=float(pooled[0]), loss_var_stderr=float(stderr[0]),
                                  grad_var=float(pooled[1]), grad_var_stderr=float(stderr[1]),
                                  grad_norm2=float((g_total / draws).square().sum()), complementary=est.complementary))
    return out


def mean_gradient_agreement(mean_gradients: dict[str, Tensor], stats: list[EstimatorStats], baseline: str
                            ) -> dict[str, float]:
    """label -> ||g_bar - g_bar_baseline||^2 / ((grad_var + grad_var_baseline) / draws): about 1 when the two
    estimators have the same mean gradient (the expected squared distance of two independent sample means),
    far above 1 when one is biased against the other. Only meaningful between draws on the same batches."""
    by_label = {s.label: s for s in stats}
    base, g0 = by_label[baseline], mean_gradients[baseline]
    return {label: float((g - g0).square().sum()) / ((by_label[label].grad_var + base.grad_var) / base.draws)
            for label, g in mean_gradients.items() if label != baseline}
