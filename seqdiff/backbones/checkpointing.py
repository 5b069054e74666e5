"""Activation checkpointing (`train.activation_checkpointing`): each transformer block's activations recomputed in
the backward pass instead of kept from the forward.

Why: a training step keeps every block's intermediate tensors (attention inputs and outputs, the MLP's 4x-wide
hidden layer, norms, dropout masks) until the backward pass reads them, so activation memory grows with layers x
batch x length and, at GPU scale (the papers' 512 x 1,024-token batches, 131k-base DNA contexts), runs out long
before the weights do. Checkpointed, a block keeps only its input and reruns its forward when its backward needs
the rest: about one more forward pass of compute (a step costs ~4/3 as much) for activation memory of the block
inputs plus one block's worth. Gradients are unchanged: the recomputed forward is the same computation, and
dropout draws the same masks (torch.utils.checkpoint restores the RNG state; tested against the plain step).

How: backbones that support it (DiT, BERT) have an `activation_checkpointing` attribute, off by default, and call
each block through `call_block`, which wraps the call in non-reentrant `torch.utils.checkpoint` when it is on and
gradients are being recorded (evaluation and sampling under no_grad, and KV-cache decoding, run plainly). The
flag lives on the backbone, not in a patched `forward`, so copies (probes deep-copy a backbone) and state dicts
are unaffected. It composes with torch.compile (traced through the checkpoint), micro-batches and fsdp2
(fully_shard's hooks run inside the checkpointed call; FSDP2 gathers the block's weights again for the
recomputation, by design).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from seqdiff.config import ConfigError


def call_block(block: nn.Module, checkpointed: bool, *args: Any, **kwargs: Any) -> Any:
    """block(*args, **kwargs), under activation checkpointing when `checkpointed` and autograd is recording."""
    if checkpointed and torch.is_grad_enabled():
        return checkpoint(block, *args, use_reentrant=False, **kwargs)
    return block(*args, **kwargs)


def set_activation_checkpointing(model: nn.Module, on: bool) -> int:
    """Switch activation checkpointing on or off in every backbone inside `model` (an RC-equivariant wrapper's
    inner backbone included); returns how many backbones it set. On, with none that supports it: ConfigError."""
    backbones = [m for m in model.modules() if hasattr(type(m), "activation_checkpointing")]
    if on and not backbones:
        raise ConfigError(f"train.activation_checkpointing=true needs a backbone whose blocks can be checkpointed "
                          f"(dit, bert); {type(model).__name__} has none")
    for backbone in backbones:
        backbone.activation_checkpointing = on
    return len(backbones)


__all__ = ["call_block", "set_activation_checkpointing"]
