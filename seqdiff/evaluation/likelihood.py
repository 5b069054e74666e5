"""Per-token NLL of a model on a token stream, in nats, bits and perplexity, accumulated in float64.

For diffusion methods the number is an upper bound (the NELBO), estimated with `num_t_samples`
Monte Carlo draws of the time and mask per block; for AR it is exact. With `order` (MDLM only) it is the exact
likelihood of the denoiser decoded in that fixed order instead, or with random:K the importance-weighted bound
over K random orders (`seqdiff.evaluation.ordered`). When the tokenizer's tokens are characters or bases, bits
per token are reported as bits per character / per base.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import nullcontext
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader

from seqdiff.checkpoint import LoadedModel
from seqdiff.data.blocks import TiledBlocks, step_generator
from seqdiff.evaluation.ordered import is_exact, ordered_nll
from seqdiff.host_memory import reuse_freed_memory
from seqdiff.methods import Batch


@torch.no_grad()
def evaluate_tokens(model: LoadedModel, tokens: np.ndarray, batch_size: int = 32, num_t_samples: int = 1,
                    seed: int = 0, seq_len: int | None = None, progress: bool = False,
                    loss_mask: np.ndarray | None = None, order: str | None = None) -> dict[str, Any]:
    """Score `tokens` cut into blocks of the training length (every token with loss_mask True exactly once)."""
    seq_len = seq_len or model.seq_len
    if seq_len > model.model_config.max_seq_len:
        raise ValueError(f"seq_len={seq_len} exceeds the model's max_seq_len={model.model_config.max_seq_len}")
    if num_t_samples < 1:
        raise ValueError(f"num_t_samples must be >= 1, got {num_t_samples}")
    loader = DataLoader(TiledBlocks(tokens, seq_len, model.tokenizer.pad_id, loss_mask), batch_size=batch_size)
    return evaluate_batches(model, loader, num_t_samples=num_t_samples, seed=seed, progress=progress, order=order)


@torch.no_grad()
def evaluate_batches(model: LoadedModel, loader, num_t_samples: int = 1, seed: int = 0,
                     progress: bool = False, order: str | None = None) -> dict[str, Any]:
    """Score every batch ({"input_ids", optional "attention_mask", "loss_mask"}) of an evaluation loader;
    order: instead, the exact likelihood in that decoding order ('left_to_right', a mixture 'a+b') or the
    importance-weighted bound over random orders ('random:K'), checked before anything runs."""
    orders = None
    if order is not None:
        from seqdiff.evaluation.ordered import check_ordered, parse_orders

        orders = parse_orders(order)
        check_ordered(model.method, model.backbone)
    if progress:
        from tqdm import tqdm

        loader = tqdm(loader, desc="eval", unit="batch")
    total = torch.zeros((), dtype=torch.float64)
    count = torch.zeros((), dtype=torch.float64)
    on_cpu = next(model.backbone.parameters()).device.type == "cpu"
    with reuse_freed_memory() if on_cpu else nullcontext():  # freed blocks reused by the next batch
        for nll_sum, n in batch_nlls(model, loader, num_t_samples, seed, orders):
            total += nll_sum
            count += n
    return nll_report(total.item(), count.item(), model, num_t_samples, order)


@torch.no_grad()
def batch_nlls(model: LoadedModel, loader, num_t_samples: int = 1, seed: int = 0,
               orders: list | None = None) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """(NLL sum in nats, scored tokens) of each batch, in loader order. Batch i draws its times and masks from
    step_generator(seed, i), so a caller that keeps the batches apart (a paired comparison, a standard error)
    sees exactly the draws evaluate_batches sums. orders: parsed decoding orders (evaluate_batches checks them)."""
    device = next(model.backbone.parameters()).device
    for i, raw in enumerate(loader):
        batch = Batch.from_any({k: v.to(device) for k, v in raw.items()})
        if batch.attention_mask is not None and bool(batch.attention_mask.all()):
            batch.attention_mask = None
        g = torch.Generator(device).manual_seed(step_generator(seed, i).initial_seed())
        if orders is not None:
            yield ordered_nll(model.method, model.backbone, batch, orders, g)
        else:
            yield model.method.nll(model.backbone, batch, g, num_samples=num_t_samples)


def nll_report(nll_sum: float, num_tokens: float, model: LoadedModel, num_t_samples: int,
               order: str | None = None) -> dict[str, Any]:
    nats = nll_sum / num_tokens
    exact = model.method.exact_likelihood or (order is not None and is_exact(order))
    report: dict[str, Any] = {
        "method": model.method.name,
        "bound": not exact,
        "num_tokens": int(num_tokens),
        "num_t_samples": None if exact or order is not None else num_t_samples,
        "nll_nats_per_token": nats,
        "bits_per_token": nats / math.log(2),
        "perplexity": math.exp(nats),
    }
    if order is not None:
        report["order"] = order
    unit = model.tokenizer.unit
    if unit is not None:
        report[f"bits_per_{unit}"] = nats / math.log(2)
    return report
