"""Hugging Face interoperability: export to / load from the transformers format, import MDLM weights.

    seqdiff.hf.modeling      SeqDiffConfig, SeqDiffForMaskedLM, SeqDiffForCausalLM, register_auto_classes
    seqdiff.hf.export        export_checkpoint (`seqdiff export`), write_export
    seqdiff.hf.convert_mdlm  convert_mdlm_state_dict: the MDLM reference DiT layout -> seqdiff's DiT

Only this package imports transformers, and only when a name from seqdiff.hf.modeling is first used
(`from seqdiff.hf import register_auto_classes`), so `seqdiff export` errors and `import seqdiff` stay light.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

_LAZY = {
    "SeqDiffConfig": "seqdiff.hf.modeling",
    "SeqDiffForMaskedLM": "seqdiff.hf.modeling",
    "SeqDiffForCausalLM": "seqdiff.hf.modeling",
    "register_auto_classes": "seqdiff.hf.modeling",
    "export_checkpoint": "seqdiff.hf.export",
    "ExportError": "seqdiff.hf.export",
    "convert_mdlm_state_dict": "seqdiff.hf.convert_mdlm",
    "MDLMConversionError": "seqdiff.hf.convert_mdlm",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'seqdiff.hf' has no attribute {name!r}")


__all__ = sorted(_LAZY)
