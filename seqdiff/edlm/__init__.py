"""EDLM: energy-based diffusion language models on top of a frozen MDLM (Xu et al., ICLR 2025).

- Energies (one per file; ENERGIES in seqdiff.edlm.energies maps names to classes): `ar` (residual AR
  energy), `coar` (carry-over AR, exactly normalized), `nce` (a learned energy network trained by
  noise-contrastive estimation).
- Generation: seqdiff.samplers.edlm_importance (importance sampling inside a window of early steps).
- Likelihood: seqdiff.edlm.likelihood (NELBO with the corrected log-partition estimate of
  seqdiff.edlm.partition; exact for coAR).
- Training of the NCE energy: seqdiff.edlm.nce_train.

An energy is named on the command line as KIND:PATH, e.g. `coar:runs/ar` (an AR run directory or checkpoint)
or `nce:runs/edlm/energy.pt`.

Importing this package is light (the names below load on first use, PEP 562), so that `seqdiff --help`, whose
command table names the EDLM commands, does not import torch.
"""

from __future__ import annotations

from importlib import import_module

_EXPORTS = {
    "ENERGIES": "seqdiff.edlm.energies", "load_energy": "seqdiff.edlm.energies",
    "parse_energy_spec": "seqdiff.edlm.energies", "Energy": "seqdiff.edlm.base", "EnergyError": "seqdiff.edlm.base",
    "AREnergy": "seqdiff.edlm.ar_energy", "CarryOverAREnergy": "seqdiff.edlm.coar_energy",
    "NCEEnergy": "seqdiff.edlm.nce_energy",
}


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'seqdiff.edlm' has no attribute {name!r}")
    return getattr(import_module(_EXPORTS[name]), name)


__all__ = sorted(_EXPORTS)
