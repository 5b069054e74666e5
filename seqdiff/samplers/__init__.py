"""Samplers: one file each; SAMPLERS maps config names to classes."""

from __future__ import annotations

from seqdiff.samplers.ar_kv import ARSampler
from seqdiff.samplers.base import SampleOutput, Sampler, SamplerError
from seqdiff.samplers.bd3lm import BD3LMSampler, BD3LMUncachedSampler
from seqdiff.samplers.confidence import ConfidenceSampler, ThresholdSampler
from seqdiff.samplers.d3pm_ancestral import D3PMAncestralSampler
from seqdiff.samplers.edlm_importance import EDLMImportanceSampler
from seqdiff.samplers.mdlm_ancestral import MDLMAncestralSampler
from seqdiff.samplers.mdlm_cached import MDLMCachedSampler
from seqdiff.samplers.mdlm_first_hitting import MDLMFirstHittingSampler
from seqdiff.samplers.mdlm_semi_ar import generate_semi_ar
from seqdiff.samplers.remdm import ReMDMSampler
from seqdiff.samplers.sedd_analytic import SEDDAnalyticSampler
from seqdiff.samplers.sedd_euler import SEDDEulerSampler

SAMPLERS: dict[str, type[Sampler]] = {
    cls.name: cls
    for cls in (MDLMAncestralSampler, MDLMCachedSampler, ARSampler, SEDDAnalyticSampler, SEDDEulerSampler,
                D3PMAncestralSampler, EDLMImportanceSampler)
}
SAMPLERS[MDLMFirstHittingSampler.name] = MDLMFirstHittingSampler
SAMPLERS[ReMDMSampler.name] = ReMDMSampler
SAMPLERS[ConfidenceSampler.name] = ConfidenceSampler
SAMPLERS[ThresholdSampler.name] = ThresholdSampler
SAMPLERS.update({cls.name: cls for cls in (BD3LMSampler, BD3LMUncachedSampler)})



def sampler_name(name: str | None, method) -> str:
    """`name`, or the method's default when None (its class attribute `default_sampler`)."""
    return method.default_sampler if name is None else name


def build_sampler(name: str | None, method, backbone, steps: int, temperature: float = 1.0,
                  top_p: float = 1.0, **options) -> Sampler:
    """Sampler by name; None picks the method's default (`Method.default_sampler`: cached for MDLM, KV-cached
    for AR, analytic for SEDD, ancestral for D3PM, bd3lm for BD3LM). top_p < 1 (nucleus) is for the MDLM and AR
    samplers.
    `options` go to samplers that take more (edlm: energy, k, window)."""
    name = sampler_name(name, method)
    if name not in SAMPLERS:
        raise SamplerError(f"sample.sampler={name!r} is unknown; choose one of {sorted(SAMPLERS)}")
    return SAMPLERS[name](method, backbone, steps=steps, temperature=temperature, top_p=top_p, **options)


__all__ = [
    "SAMPLERS",
    "ARSampler",
    "BD3LMSampler",
    "BD3LMUncachedSampler",
    "ConfidenceSampler",
    "D3PMAncestralSampler",
    "EDLMImportanceSampler",
    "MDLMAncestralSampler",
    "MDLMCachedSampler",
    "MDLMFirstHittingSampler",
    "ReMDMSampler",
    "SEDDAnalyticSampler",
    "SEDDEulerSampler",
    "SampleOutput",
    "Sampler",
    "SamplerError",
    "ThresholdSampler",
    "build_sampler",
    "sampler_name",
    "generate_semi_ar",
]
