"""WiSE-FT (Wortsman et al. 2022, "Robust fine-tuning of zero-shot models", arXiv:2109.01903).

A fine-tuned encoder moved back along the straight line to the pretrained weights it started from:
encoder = (1 - alpha) x pretrained + alpha x fine-tuned, the output head kept as fine-tuned (a pretrained
encoder such as the MiniLM has no head to go back to). For a BERT fine-tuned with MDLM this trades some of
the generative gain for features closer to the pretrained ones (see reports/bert_init).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Protocol

import torch
from torch import nn

from seqdiff.backbones import load_pretrained
from seqdiff.config import ConfigError, ModelConfig

State = dict[str, torch.Tensor]


class FineTuned(Protocol):
    """What WiSE-FT reads of a loaded model (seqdiff.checkpoint.LoadedModel has it); named here, not imported,
    since checkpoint.py sits above the backbones."""

    path: Path
    backbone: nn.Module
    model_config: ModelConfig


def encoder_keys(backbone: nn.Module) -> list[str]:
    """Parameter names of the encoder: everything but the output head's own parameters."""
    head = {id(p) for p in backbone.head_parameters()}
    return [name for name, p in backbone.named_parameters() if id(p) not in head]


def interpolate(pre: State, post: State, keys: list[str], alpha: float) -> State:
    """post with every key in keys set to (1 - alpha) * pre + alpha * post."""
    out = dict(post)
    for k in keys:
        out[k] = torch.lerp(pre[k], post[k], alpha)  # pre + alpha * (post - pre)
    return out


def pretrained_and_finetuned(model: FineTuned) -> tuple[State, State]:
    """(the pretrained encoder under the fine-tuned head, the fine-tuned weights) of a model fine-tuned from
    model.init_from; the model is left holding the fine-tuned weights."""
    if not model.model_config.init_from or not hasattr(model.backbone, "head_parameters"):
        raise ConfigError(f"{model.path}: WiSE-FT needs a model fine-tuned from pretrained weights "
                          f"(model.init_from), and this one was trained from scratch "
                          f"(backbone {model.model_config.backbone})")
    post = {k: v.clone() for k, v in model.backbone.state_dict().items()}
    load_pretrained(model.backbone, model.model_config)  # the encoder only; the head keeps its fine-tuned weights
    pre = {k: v.clone() for k, v in model.backbone.state_dict().items()}
    model.backbone.load_state_dict(post)
    return pre, post


def wise_ft(model: FineTuned, alpha: float) -> None:
    """Move model's encoder, in place, to (1 - alpha) x pretrained + alpha x fine-tuned; alpha in [0, 1]."""
    if not (math.isfinite(alpha) and 0.0 <= alpha <= 1.0):
        raise ConfigError(f"WiSE-FT alpha must lie in [0, 1] (the weight of the fine-tuned encoder), got {alpha}")
    pre, post = pretrained_and_finetuned(model)
    model.backbone.load_state_dict(interpolate(pre, post, encoder_keys(model.backbone), alpha))


__all__ = ["encoder_keys", "interpolate", "pretrained_and_finetuned", "wise_ft"]
