"""The output head and its cross-entropy in one chunked pass, without the (N, V) logits.

Why: at a word-piece vocabulary (GPT-2's 50,257 ids, BERT's 30,522) the logits of a training batch are the
largest tensor of the step. The plain path writes them, reads them for the log-softmax, writes the
log-probabilities, and in the backward writes and reads their gradient and the head's input gradient; in
`seqdiff bench --vocab-size 50261` the loss and the copies around it took a third of a CPU step. On a GPU the
float32 logits and their gradient of one micro-batch of 16 x 1,024 tokens at GPT-2's vocabulary take 6.6 GB.

How: the rows are taken `chunk` at a time. For each chunk the logits are computed, their log-sum-exp and the
target's negative log-likelihood kept, and, when a gradient is wanted, the gradient of the weighted sum
sum_i w_i nll_i with respect to the logits (w_i (softmax_i - onehot(target_i))) is formed in place and pushed
at once through the head: into the input's gradient (chunk rows) and the weight's and bias's (accumulated).
Backward then only scales those by the incoming gradient. The FLOPs are those of the plain path (one
forward and two backward matmuls); only a (chunk, V) block of logits is ever alive. This is the design of
the fused linear cross-entropy kernels of Liger-Kernel and of "Cut Your Losses" (Wijmans et al. 2024); the
code here is written from the math above.

What it returns: the weighted sum (differentiable in hidden, weight and bias) and the per-row negative
log-likelihood (no gradient), so a method keeps its per-token terms for its metrics. The token weights and
the targets get no gradient. Under autocast the matmuls run in the autocast dtype as they would in the plain
path, the softmax and the sums in float32 (float64 inputs stay float64, for the tests).
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

CHUNK_ELEMENTS = {"cpu": 1 << 23, "cuda": 1 << 27}
"""Logit elements per chunk (chunk = this // V rows, at least 1): 32 MB of float32 logits on CPU, 512 MB on a
GPU, where large matmuls keep the device busy and memory is the reason to chunk. Each chunk reads and writes
the whole (V, H) weight gradient once, so chunks of a few rows are slow; reports/bench/fused_loss times whole
training steps with the CPU value."""


def default_chunk(vocab_size: int, device: torch.device) -> int:
    """Rows per chunk for a head with `vocab_size` outputs on `device`."""
    return max(1, CHUNK_ELEMENTS.get(device.type, CHUNK_ELEMENTS["cuda"]) // max(1, vocab_size))


class _LinearCrossEntropy(torch.autograd.Function):
    """forward(hidden (N, H), weight (V, H), bias (V,) or None, targets (N,), token_weight (N,), chunk) ->
    (sum_i token_weight_i nll_i (scalar), nll (N,)); gradients computed during the forward (module docstring)."""

    @staticmethod
    def forward(ctx, hidden: Tensor, weight: Tensor, bias: Tensor | None, targets: Tensor, token_weight: Tensor,
                chunk: int) -> tuple[Tensor, Tensor]:
        n = hidden.shape[0]
        acc = torch.promote_types(hidden.dtype, torch.float32)  # float32, or float64 in the tests
        want_h, want_w, want_b = ctx.needs_input_grad[0], ctx.needs_input_grad[1], bias is not None and \
            ctx.needs_input_grad[2]
        nll = torch.empty(n, dtype=acc, device=hidden.device)
        grad_h = torch.empty_like(hidden) if want_h else None
        grad_w = torch.zeros(weight.shape, dtype=torch.promote_types(weight.dtype, torch.float32),
                             device=weight.device) if want_w else None
        grad_b = torch.zeros(bias.shape, dtype=acc, device=bias.device) if want_b else None
        autocast = torch.is_autocast_enabled(hidden.device.type)
        for start in range(0, n, chunk):
            end = min(start + chunk, n)
            h, tgt = hidden[start:end], targets[start:end]
            logits = F.linear(h, weight, bias).to(acc)  # (c, V); under autocast a low-precision matmul
            picked = logits.gather(1, tgt[:, None])[:, 0]  # (c,) the targets' logits
            # log-sum-exp written out in the logits' storage (no (c, V) temporaries; each pass over the chunk
            # costs as much as a small matmul on a CPU): exp(logits - max), then its row sums
            top = logits.amax(dim=-1, keepdim=True)  # (c, 1); finite: only one id is ever -inf
            unnormed = logits.sub_(top).exp_()  # (c, V)
            row_sum = unnormed.sum(dim=-1)  # (c,)
            nll[start:end] = top[:, 0] + row_sum.log() - picked
            if not (want_h or want_w or want_b):
                continue
            # d(sum w nll)/d logits = w (softmax - onehot), still in the same storage
            w = token_weight[start:end].to(acc)  # (c,)
            probs = unnormed.mul_((w / row_sum)[:, None])
            probs[torch.arange(end - start, device=probs.device), tgt] -= w
            if want_b:
                grad_b += probs.sum(0)
            g = probs if autocast else probs.to(h.dtype)
            if want_h:
                grad_h[start:end] = g @ weight  # (c, H); under autocast a low-precision matmul, as the plain path
            if want_w and autocast:
                grad_w += g.t() @ h  # (V, H) from a low-precision matmul, accumulated in float32
            elif want_w:  # (V, H) accumulated in place (no (V, H) temporary per chunk), at least in float32
                grad_w.addmm_(probs.t().to(grad_w.dtype), h.to(grad_w.dtype))
        # low-precision weights (bf16 parameters, no autocast) get their gradients in their own dtype
        grad_w = grad_w.to(weight.dtype) if want_w else None
        grad_b = grad_b.to(bias.dtype) if want_b else None
        ctx.save_for_backward(grad_h, grad_w, grad_b)
        ctx.mark_non_differentiable(nll)
        total = (token_weight.to(acc) * nll).sum()
        return total, nll

    @staticmethod
    def backward(ctx, grad_total: Tensor, _grad_nll: Tensor):
        grad_h, grad_w, grad_b = ctx.saved_tensors
        scale = (lambda g: None if g is None else g * grad_total.to(g.dtype))  # noqa: E731
        return scale(grad_h), scale(grad_w), scale(grad_b), None, None, None


def _left_out_of_compile(fn: Callable) -> Callable:
    """`torch.compiler.disable(fn)`, made at the first call once torch._dynamo has been imported.

    Why not the decorator itself: it imports torch._dynamo (~2 s of the ~5 s that `seqdiff sample`, `eval` or
    `score` spend importing, which never compile). Nothing can be compiling before torch._dynamo is imported, so
    until then `fn` runs as it is; a first call under torch.compile makes the disabled function there (one extra
    graph break, at that trace only). Tested: the import leaves torch._dynamo out, and a compiled backbone gives the
    eager loss with the head run eagerly."""
    disabled: Callable | None = None

    @functools.wraps(fn)
    def call(*args, **kwargs):
        nonlocal disabled
        if disabled is None:
            if "torch._dynamo" not in sys.modules:
                return fn(*args, **kwargs)
            disabled = torch.compiler.disable(fn)
        return disabled(*args, **kwargs)

    return call


@_left_out_of_compile
def linear_cross_entropy(hidden: Tensor, weight: Tensor, bias: Tensor | None, targets: Tensor,
                         token_weight: Tensor | None, chunk: int | None = None) -> tuple[Tensor, Tensor]:
    """(sum_i token_weight_i * nll_i, nll (N,)) for logits = hidden @ weight.T + bias and nll_i =
    -log softmax(logits_i)[targets_i], without forming the (N, V) logits (module docstring).

    hidden (N, H) or (..., H), flattened to N rows; weight (V, H); bias (V,) or None (a -inf entry excludes
    that id, as SUBS's MASK); targets (N,) long; token_weight (N,), required; chunk: rows per chunk (default:
    `default_chunk`).
    Left out of torch.compile (a graph break at the head): the loop's length follows N, which changes every
    MDLM step, and each chunk is already one large matmul."""
    if token_weight is None:
        raise ValueError("linear_cross_entropy: targets need their token_weight (N,)")
    hidden = hidden.reshape(-1, hidden.shape[-1])
    if targets.shape != hidden.shape[:1] or token_weight.shape != hidden.shape[:1]:
        raise ValueError(f"linear_cross_entropy: hidden (N, H), targets (N,), token_weight (N,) expected; got "
                         f"{tuple(hidden.shape)}, {tuple(targets.shape)}, {tuple(token_weight.shape)}")
    chunk = chunk or default_chunk(weight.shape[0], hidden.device)
    return _LinearCrossEntropy.apply(hidden, weight, bias, targets, token_weight.detach(), chunk)
