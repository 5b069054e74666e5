"""Samplers: one file each; SAMPLERS maps config names to classes."""

from __future__ import annotations

from seqdiff.samplers.ar_kv import ARSampler
from seqdiff.samplers.base import SampleOutput, Sampler, SamplerError
from seqdiff.samplers.mdlm_ancestral import MDLMAncestralSampler
from seqdiff.samplers.mdlm_cached import MDLMCachedSampler

SAMPLERS: dict[str, type[Sampler]] = {
    cls.name: cls for cls in (MDLMAncestralSampler, MDLMCachedSampler, ARSampler)
}

DEFAULT_SAMPLER = {"mdlm": "cached", "ar": "ar"}


def build_sampler(name: str | None, method, backbone, steps: int, temperature: float = 1.0) -> Sampler:
    """Sampler by name; None picks the method's default (cached for MDLM, KV-cached for AR)."""
    if name is None:
        name = DEFAULT_SAMPLER.get(method.name)
    if name not in SAMPLERS:
        raise SamplerError(f"sample.sampler={name!r} is unknown; choose one of {sorted(SAMPLERS)}")
    return SAMPLERS[name](method, backbone, steps=steps, temperature=temperature)


__all__ = ["SAMPLERS", "ARSampler", "MDLMAncestralSampler", "MDLMCachedSampler", "SampleOutput", "Sampler",
           "SamplerError", "build_sampler"]
