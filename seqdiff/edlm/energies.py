"""The energy registry (ENERGIES: name -> class) and `KIND:PATH` energy specs, loaded for a frozen MDLM."""

from __future__ import annotations

from seqdiff.checkpoint import CheckpointError
from seqdiff.edlm.ar_energy import AREnergy
from seqdiff.edlm.base import Energy, EnergyError
from seqdiff.edlm.coar_energy import CarryOverAREnergy
from seqdiff.edlm.nce_energy import NCEEnergy

ENERGIES: dict[str, type[Energy]] = {cls.name: cls for cls in (AREnergy, CarryOverAREnergy, NCEEnergy)}


def parse_energy_spec(spec: str) -> tuple[str, str]:
    """'KIND:PATH' -> (kind, path), the kind checked against ENERGIES."""
    kind, sep, path = spec.partition(":")
    if not sep or not path:
        raise EnergyError(f"--energy {spec!r}: expected KIND:PATH with KIND one of {sorted(ENERGIES)}")
    if kind not in ENERGIES:
        raise EnergyError(f"--energy {spec!r}: energy kind {kind!r} is unknown; choose one of {sorted(ENERGIES)}")
    return kind, path


def load_energy(spec: str, mdlm, device: str = "cpu") -> Energy:
    """The energy named by `spec` ('KIND:PATH') for the loaded MDLM `mdlm`."""
    kind, path = parse_energy_spec(spec)
    if mdlm.method.name != "mdlm":
        raise EnergyError(f"EDLM reweights an MDLM denoiser; {mdlm.path} is a {mdlm.method.name!r} model")
    try:
        return ENERGIES[kind].load(path, mdlm, device)
    except CheckpointError as e:
        raise EnergyError(f"--energy {spec}: {e}") from e

