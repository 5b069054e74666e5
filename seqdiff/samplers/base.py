"""What a sampler is: the loop of reverse steps that drives a Method and a backbone to produce tokens.

Samplers own no math (that lives in the method) and no global randomness: every draw goes through the
`torch.Generator` passed to `generate`, so equal seeds give equal samples.

A sampler whose reverse process fits any masked sequence given a denoiser (first-hitting, ReMDM, confidence,
threshold) exposes it as `reverse_process(x, denoise, generator)`, the whole of its update with the network
behind a `Denoiser`. Its own `generate` (MDLM) runs it once on the whole sequence with the backbone as the
denoiser; a block-diffusion method's block sampler (seqdiff.samplers.bd3lm) runs it once per block with the
block's denoiser (the block read after its clean prefix through the KV cache). `block_methods` names the
methods it runs inside that way: one reverse process, two drivers, no second copy of either loop.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor, nn

from seqdiff.categorical import probs_from_logits
from seqdiff.errors import SeqdiffError
from seqdiff.methods.base import Method


class SamplerError(SeqdiffError):
    """A sampler that cannot be used with this checkpoint (method or conditioning mismatch)."""


Denoiser = Callable[[Tensor, Tensor, "Tensor | None"], Tensor]
"""x_theta as SUBS logits: denoise(x_t (b, n) long, t (b,) float64, rows (B,) bool | None) -> (b, n, V). `rows`
says which of the B sequences being generated x_t holds (None: all, b = B), for denoisers that hold per-row
context (a block's clean prefix and its KV cache); t is the noise level a time-conditioned backbone sees."""


@dataclass
class SampleOutput:
    tokens: Tensor
    """(B, L) generated token ids."""
    num_denoiser_calls: int
    """How many times the backbone ran (per batch), the cost that caching saves."""
    blocks: list[Tensor] | None = None
    """Semi-autoregressive generation only: each block as its sampler produced it, overlap included."""


class Sampler(ABC):
    name: ClassVar[str]
    methods: ClassVar[tuple[str, ...]]
    """Method names this sampler can drive."""
    supports_top_p: ClassVar[bool] = False
    """Whether the sampler draws tokens from an explicit categorical that nucleus filtering applies to."""
    reads: ClassVar[frozenset[str]]
    """The sample.* keys (SampleConfig / SampleOptions fields) whose value this sampler depends on beyond those
    every sampler takes (temperature and top_p, each applied or refused): `steps` where it sets the loop, the keys
    `options_from_config` reads, and those the sample command hands it (edlm: energy, edlm_k, edlm_window). Every
    sampler declares it: `seqdiff sample` refuses an option the user gives that the chosen sampler would ignore."""
    uses_steps: ClassVar[bool] = True
    """Whether `steps` sets the cost (False: one call per token or data-dependent, e.g. AR, first-hitting); set
    from `reads`, so the two cannot disagree."""
    block_methods: ClassVar[tuple[str, ...]] = ()
    """Block-diffusion methods inside whose blocks `reverse_process` runs, driven by the method's block sampler
    (bd3lm: `sample.sampler=first_hitting` on a bd3lm run is `bd3lm_first_hitting`); `generate` refuses them."""
    exact: ClassVar[bool]
    """True when the sampler draws from the model's own reverse process (at temperature 1, top_p 1), so an exact
    denoiser reproduces the data distribution; False for approximations (tau-leaping, importance sampling with
    finite k, remasking, confidence-ordered decoding). Every sampler declares it; reports show it."""

    def __init__(self, method: Method, backbone: nn.Module, steps: int = 128, temperature: float = 1.0,
                 top_p: float = 1.0):
        if method.name not in self.methods + self.block_methods:
            raise SamplerError(
                f"--sampler {self.name} (sample.sampler) cannot drive a {method.name!r} model; it works with "
                f"{list(self.methods)}"
            )
        if steps < 1:
            raise SamplerError(f"sample.steps must be >= 1, got {steps}")
        if temperature < 0:
            raise SamplerError(f"sample.temperature must be >= 0, got {temperature}")
        if not 0.0 < top_p <= 1.0:
            raise SamplerError(f"sample.top_p must be in (0, 1], got {top_p}")
        if top_p < 1.0 and not (self.supports_top_p and getattr(method, "subs", True)):
            raise SamplerError(f"sample.top_p={top_p}: sampler {self.name!r} supports only top_p=1 "
                               "(nucleus sampling is available for the MDLM (SUBS) and AR samplers)")
        self.method, self.backbone = method, backbone
        self.steps, self.temperature, self.top_p = steps, temperature, top_p
        self.check_compatible()

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if not isinstance(getattr(cls, "exact", None), bool):
            raise TypeError(f"sampler class {cls.__name__} must declare `exact` (True or False)")
        if not isinstance(getattr(cls, "reads", None), frozenset):
            raise TypeError(f"sampler class {cls.__name__} must declare `reads` (a frozenset of sample.* keys)")
        cls.uses_steps = "steps" in cls.reads


    def probs_at(self, logits) -> Callable[[Tensor], Tensor]:
        """x_theta's logits -> flat positions (R,) -> float64 probabilities there (R, V), with this sampler's
        temperature and nucleus filter, made only for the positions asked (the reverse steps that reveal a few
        tokens ask only where they reveal). `logits`: (b, n, V), or an object whose `at(positions)` gives them
        (the MDLM samplers' masked-position logits)."""
        at = getattr(logits, "at", None) or logits.flatten(0, 1).__getitem__
        return lambda positions: probs_from_logits(at(positions), self.temperature, self.top_p)

    @classmethod
    def kind(cls) -> str:
        """'exact' or 'approximate', the label reports print next to the sampler's name."""
        return "exact" if cls.exact else "approximate"

    @classmethod
    def options_from_config(cls, cfg) -> dict:
        """Keyword arguments this sampler takes from a SampleConfig beyond steps / temperature / top_p (the
        sample command and the frontier pass them through; default: none)."""
        return {}

    def check_compatible(self) -> None:
        """Raise SamplerError when this sampler is invalid for the given backbone (default: always valid)."""
        return None

    def check_length(self, seq_len: int) -> None:
        max_len = self.backbone.config.max_seq_len
        if seq_len > max_len:
            raise SamplerError(f"sample.seq_len={seq_len} exceeds the model's max_seq_len={max_len}")

    def masked_start(self, batch_size: int, seq_len: int, given: Tensor | None, device) -> Tensor:
        """(B, L) all MASK, with the given tokens (ids >= 0 in `given`, -1 = free) in place: they start revealed."""
        x = torch.full((batch_size, seq_len), self.method.mask_id, dtype=torch.long, device=device)  # (B, L)
        if given is not None:
            if (given == self.method.mask_id).any():
                raise SamplerError("given holds the MASK id; use -1 for free positions")
            x = torch.where(given >= 0, given, x)
        return x

    def prepare(self, batch_size: int, seq_len: int, given: Tensor | None) -> tuple[torch.device, Tensor | None]:
        """The checks every `generate` starts with: (the backbone's device, `given` checked and on it)."""
        if self.method.name not in self.methods:  # built for a block method: only its block sampler runs it
            raise SamplerError(f"sampler {self.name!r} runs a {self.method.name!r} model only inside its blocks: build "
                               f"it with build_sampler (sample.sampler={self.name} on a {self.method.name} run)")
        self.check_length(seq_len)
        device = next(self.backbone.parameters()).device
        return device, self.check_given(given, batch_size, seq_len, self.method.vocab_size, device)

    @staticmethod
    def check_given(given: Tensor | None, batch_size: int, seq_len: int, vocab_size: int, device) -> Tensor | None:
        """Conditioning as (B, L) long on `device`: a token id where the token is given, -1 where it is free.
        Accepts (B, L) or (L,) (the same for every row)."""
        if given is None:
            return None
        given = torch.as_tensor(given, device=device).long()
        if given.ndim == 1:
            given = given.expand(batch_size, -1)
        if given.shape != (batch_size, seq_len):
            raise SamplerError(f"given must have shape ({batch_size}, {seq_len}) or ({seq_len},), "
                               f"got {tuple(given.shape)}")
        if ((given < -1) | (given >= vocab_size)).any():
            raise SamplerError(f"given holds ids outside [-1, {vocab_size}): use -1 for free positions")
        return given

    def denoiser(self) -> Denoiser:
        """The whole-sequence denoiser: the backbone's SUBS logits on x_t at the noise level of t."""
        method, backbone = self.method, self.backbone

        def denoise(x: Tensor, t: Tensor, rows: Tensor | None = None) -> Tensor:
            return method.subs_logits(backbone(x, noise_level=method.noise_level(t.float())))  # (b, n, V)

        return denoise

    def reverse_process(self, x: Tensor, denoise: Denoiser, generator: torch.Generator | None) -> tuple[Tensor, int]:
        """The sampler's whole reverse process on x (B, n): MASK positions are free, the others given (kept as they
        are); returns (x with no MASK left, denoiser calls). Samplers with `block_methods` implement it."""
        raise NotImplementedError(f"sampler {self.name!r} has no reverse_process")

    def reverse_from_masks(self, batch_size: int, seq_len: int, generator: torch.Generator | None,
                           given: Tensor | None) -> SampleOutput:
        """`generate` of a sampler whose whole update is its `reverse_process`: that process from all MASK (the
        given tokens revealed) with the whole-sequence denoiser."""
        device, given = self.prepare(batch_size, seq_len, given)
        x = self.masked_start(batch_size, seq_len, given, device)  # (B, L); given tokens stay revealed
        x, calls = self.reverse_process(x, self.denoiser(), generator)
        return SampleOutput(tokens=x, num_denoiser_calls=calls)

    @abstractmethod
    @torch.no_grad()
    def generate(self, batch_size: int, seq_len: int, generator: torch.Generator | None = None) -> SampleOutput:
        """Generate a (batch_size, seq_len) block of tokens."""
