"""Samplers: one file each; SAMPLERS maps config names to classes."""

from __future__ import annotations

from seqdiff.samplers.ar_kv import ARSampler
from seqdiff.samplers.base import SampleOutput, Sampler, SamplerError
from seqdiff.samplers.bd3lm import BD3LMSampler, BD3LMUncachedSampler, within_blocks
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
SAMPLERS.update({blocks.name: blocks for blocks in [within_blocks(cls) for cls in list(SAMPLERS.values())
                                                    if set(BD3LMSampler.methods) & set(cls.block_methods)]})

BLOCK_SAMPLERS: dict[tuple[str, str], str] = {
    (method, cls.inner_class.name): cls.name
    for cls in SAMPLERS.values() if getattr(cls, "inner_class", None) is not None for method in cls.methods
}
"""(method, sampler) -> the registered sampler that runs it inside the method's blocks: sample.sampler=first_hitting
on a bd3lm run is bd3lm_first_hitting (the block loop with the first-hitting process in every block)."""


def sampler_name(name: str | None, method) -> str:
    """`name`, or the method's default when None (its class attribute `default_sampler`); a sampler that runs inside
    the blocks of a block-diffusion method resolves to its block sampler there (BLOCK_SAMPLERS)."""
    name = method.default_sampler if name is None else name
    return BLOCK_SAMPLERS.get((getattr(method, "name", None), name), name)


def samplers_for(method_name: str) -> list[str]:
    """The names `sample.sampler` accepts for a method: the samplers that drive it, and those that run inside its
    blocks (their short names)."""
    names = {name for name, cls in SAMPLERS.items() if method_name in cls.methods}
    return sorted(names | {inner for (m, inner) in BLOCK_SAMPLERS if m == method_name})


def sampler_keys() -> frozenset[str]:
    """The sample.* keys that some sampler reads and others ignore (the union of the registry's `reads`): an option
    among them matters only to the samplers that declare it."""
    return frozenset().union(*(cls.reads for cls in SAMPLERS.values()))


def samplers_reading(key: str, method_name: str | None = None) -> list[str]:
    """The names `--sampler` takes that read `key`, for models of `method_name` (None: any model); a sampler run
    inside the blocks of a block-diffusion method is named as the user gives it (threshold, not bd3lm_threshold)."""
    names = SAMPLERS if method_name is None else samplers_for(method_name)
    wrapped = set(BLOCK_SAMPLERS.values())
    return sorted(name for name in names if name not in wrapped and key in SAMPLERS[name].reads)


def build_sampler(name: str | None, method, backbone, steps: int, temperature: float = 1.0,
                  top_p: float = 1.0, **options) -> Sampler:
    """Sampler by name; None picks the method's default (`Method.default_sampler`: cached for MDLM, KV-cached
    for AR, analytic for SEDD, ancestral for D3PM, bd3lm for BD3LM). top_p < 1 (nucleus) is for the MDLM and AR
    samplers.
    `options` go to samplers that take more (edlm: energy, k, window)."""
    name = sampler_name(name, method)
    if name not in SAMPLERS:
        raise SamplerError(f"sample.sampler={name!r} is unknown; choose one of {sorted(SAMPLERS)}")
    cls, method_name = SAMPLERS[name], getattr(method, "name", None)
    if method_name not in cls.methods:
        inside = f" (and inside the blocks of {list(cls.block_methods)})" if cls.block_methods else ""
        raise SamplerError(f"--sampler {name} (sample.sampler) cannot drive a {method_name!r} model; it works with "
                           f"{list(cls.methods)}{inside}; for {method_name} choose one of {samplers_for(method_name)}")
    return cls(method, backbone, steps=steps, temperature=temperature, top_p=top_p, **options)


__all__ = [
    "SAMPLERS",
    "ARSampler",
    "BD3LMSampler",
    "BD3LMUncachedSampler",
    "BLOCK_SAMPLERS",
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
    "sampler_keys",
    "sampler_name",
    "samplers_for",
    "samplers_reading",
    "within_blocks",
    "generate_semi_ar",
]
