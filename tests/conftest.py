"""Test-wide settings: tiny models run fastest on one thread (several threads on busy shared cores wait on
each other far longer than the work takes)."""

import torch

torch.set_num_threads(1)
