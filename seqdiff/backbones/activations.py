"""MLP nonlinearities by name (`model.activation`): the one place a backbone looks them up.

- gelu_tanh: GELU with the tanh approximation, 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), the MDLM
  DiT's (and GPT-2's) choice; seqdiff's default, so checkpoints written before the key existed load unchanged.
- gelu: the exact GELU, x Phi(x) = 0.5 x (1 + erf(x / sqrt(2))), what BERT uses (Hendrycks & Gimpel 2016).
  Needed to load BERT weights faithfully, and it is the cheaper kernel on CPU.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch.nn.functional as F
from torch import Tensor

ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "gelu_tanh": partial(F.gelu, approximate="tanh"),
    "gelu": F.gelu,
}

__all__ = ["ACTIVATIONS"]
