"""`seqdiff export`: a checkpoint (or run directory) -> a Hugging Face model directory.

    OUT_DIR/
      config.json            SeqDiffConfig (model_type "seqdiff"): seqdiff's model and method configs, the
                             tokenizer's special ids, seq_len, architectures and auto_map
      model.safetensors      the backbone's weights (EMA weights by default), keys "backbone.<DiT name>"
      tokenizer_config.json  seqdiff's tokenizer (Tokenizer.save_pretrained; vocabulary included) plus the keys
                             transformers reads (tokenizer_class PreTrainedTokenizerFast, special tokens)
      tokenizer.json         the same tokenizer for `AutoTokenizer.from_pretrained(OUT_DIR)` (same ids;
                             seqdiff.hf.tokenizer_json)
      modeling_seqdiff.py    a two-line module re-exporting seqdiff.hf.modeling, for trust_remote_code

Three ways to load it, all offline:
- seqdiff itself: `seqdiff eval OUT_DIR`, `seqdiff sample OUT_DIR`, `load_checkpoint(OUT_DIR)`; this reads the
  safetensors file directly and does not import transformers.
- transformers with registration (recommended):
  `from seqdiff.hf import register_auto_classes; register_auto_classes()`, then
  `AutoModelForMaskedLM.from_pretrained(OUT_DIR)` (MDLM-family) or `AutoModelForCausalLM` (AR).
- transformers with `trust_remote_code=True` and nothing imported beforehand: config.json's auto_map
  points at modeling_seqdiff.py in OUT_DIR, which transformers copies into its modules cache (no network)
  and imports; that module imports the installed seqdiff package, so seqdiff must be installed. The
  code that runs is the installed seqdiff's, not a frozen copy.

The directory is written into a temporary sibling folder and renamed into place, so an interrupted
export never leaves a half-written OUT_DIR.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import torch

from seqdiff.backbones.wise_ft import wise_ft
from seqdiff.checkpoint import (
    EXPORT_CONFIG,
    EXPORT_MODEL_TYPE,
    EXPORT_WEIGHTS,
    CheckpointError,
    LoadedModel,
    is_exported_dir,
    load_exported,
    model_from_checkpoint,
    read_checkpoint_or_run,
)
from seqdiff.config import ConfigError, DataConfig, MethodConfig, ModelConfig, to_dict
from seqdiff.hf.tokenizer_json import write_hf_tokenizer
from seqdiff.run_layout import RUN_OWN_FOLDERS, run_root
from seqdiff.safe_io import atomic_directory
from seqdiff.tokenizers.base import Tokenizer

MODELING_FILE = "modeling_seqdiff.py"
MODELING_SHIM = '''"""transformers' trust_remote_code entry point: the classes live in the installed seqdiff package."""

from seqdiff.hf.modeling import SeqDiffConfig, SeqDiffForCausalLM, SeqDiffForMaskedLM  # noqa: F401
'''
AUTO_MAP = {
    "AutoConfig": "modeling_seqdiff.SeqDiffConfig",
    "AutoModelForMaskedLM": "modeling_seqdiff.SeqDiffForMaskedLM",
    "AutoModelForCausalLM": "modeling_seqdiff.SeqDiffForCausalLM",
}


class ExportError(CheckpointError):
    """A checkpoint that cannot be exported, or an output directory that cannot be written."""


def export_checkpoint(checkpoint: str | Path, out_dir: str | Path, use_ema: bool = True,
                      overwrite: bool = False, encoder_alpha: float = 1.0) -> Path:
    """Write the model of `checkpoint` (a .ckpt, a run directory or an export) as a Hugging Face directory.

    encoder_alpha < 1: write the WiSE-FT encoder (1 - alpha) x model.init_from's weights + alpha x fine-tuned
    (seqdiff.backbones.wise_ft); config.json records the alpha as `wise_ft_alpha`.
    """
    source = Path(checkpoint)
    if is_exported_dir(source):
        model = load_exported(source)
    else:
        path, ckpt = read_checkpoint_or_run(source)
        if not ckpt["hyper_parameters"].get("tokenizer"):
            raise ExportError(f"checkpoint {path} holds no tokenizer, so the exported model could not encode or "
                              f"decode text; export a checkpoint written by `seqdiff train`, which stores its "
                              f"tokenizer")
        model = model_from_checkpoint(ckpt, path, use_ema=use_ema)
    if encoder_alpha != 1.0:
        try:
            wise_ft(model, encoder_alpha)
        except ConfigError as e:
            raise ExportError(f"--encoder-alpha: {e}") from e
    return export_model(model, out_dir, overwrite=overwrite, source=source, encoder_alpha=encoder_alpha)


def export_model(model: LoadedModel, out_dir: str | Path, overwrite: bool = False,
                 source: Path | None = None, encoder_alpha: float = 1.0) -> Path:
    """Write a loaded model (see `seqdiff.checkpoint.load_checkpoint`) as a Hugging Face directory."""
    if model.model_config.rc_equivariant != "none":  # the transformers shim builds a plain DiT
        raise ExportError(f"model.rc_equivariant={model.model_config.rc_equivariant}: an RC-equivariant model "
                          "cannot be exported to the Hugging Face layout yet; load its checkpoint with seqdiff")
    return write_export(out_dir, model.backbone.state_dict(), model.model_config, model.method_config,
                        model.tokenizer, model.seq_len, data_config=model.data_config, step=model.step,
                        ema=model.ema, overwrite=overwrite, source=source, encoder_alpha=encoder_alpha)


def hf_config(model_config: ModelConfig, method_config: MethodConfig, tokenizer: Tokenizer, seq_len: int,
              data_config: DataConfig | None = None, step: int = 0, ema: bool = False, encoder_alpha: float = 1.0):
    """The SeqDiffConfig (config.json) of a model; architectures and auto_map filled in."""
    from seqdiff.hf.modeling import SeqDiffConfig, _method_of  # late: it imports transformers (slow to load)

    summary: dict[str, Any] = {"kind": tokenizer.kind, "vocab_size": tokenizer.vocab_size,
                               "bos_id": tokenizer.bos_id, "eos_id": tokenizer.eos_id,
                               "pad_id": tokenizer.pad_id, "mask_id": tokenizer.mask_id}
    description = tokenizer.to_dict()
    if "sha256" in description:
        summary["sha256"] = description["sha256"]
    config = SeqDiffConfig(model=to_dict(model_config), method=to_dict(method_config), tokenizer=summary,
                           seq_len=seq_len, data=to_dict(data_config) if data_config is not None else None,
                           step=step, ema_weights=ema, auto_map=dict(AUTO_MAP),
                           **({"wise_ft_alpha": encoder_alpha} if encoder_alpha != 1.0 else {}))
    causal = _method_of(config).causal
    config.architectures = ["SeqDiffForCausalLM" if causal else "SeqDiffForMaskedLM"]
    return config


def write_export(out_dir: str | Path, state_dict: dict[str, torch.Tensor], model_config: ModelConfig,
                 method_config: MethodConfig, tokenizer: Tokenizer, seq_len: int,
                 data_config: DataConfig | None = None, step: int = 0, ema: bool = False,
                 overwrite: bool = False, source: Path | None = None, encoder_alpha: float = 1.0) -> Path:
    """Write config.json, model.safetensors, tokenizer_config.json and the modeling shim, atomically."""
    from safetensors.torch import save_file

    out = Path(out_dir)
    check_destination(out, overwrite, source)
    config = hf_config(model_config, method_config, tokenizer, seq_len, data_config, step, ema, encoder_alpha)
    with atomic_directory(out, "export directory") as tmp:
        config.save_pretrained(tmp)
        tensors = {f"backbone.{k}": v.detach().to("cpu", copy=True).contiguous() for k, v in state_dict.items()}
        save_file(tensors, str(tmp / EXPORT_WEIGHTS), metadata={"format": "pt"})
        tokenizer.save_pretrained(tmp)
        write_hf_tokenizer(tokenizer, tmp, model_max_length=seq_len)  # AutoTokenizer loads the directory
        (tmp / MODELING_FILE).write_text(MODELING_SHIM)
        _readable_as_umask_says(tmp)
        extra = sorted(set(os.listdir(out)) - set(os.listdir(tmp))) if out.is_dir() else []
        if extra:  # --overwrite of an earlier export: what goes with it (its eval/ results) is said, not silent
            print(f"seqdiff export: {out}: replacing the earlier export removes what was added to it too: "
                  f"{', '.join(extra)}", file=sys.stderr)
    return out


def _readable_as_umask_says(folder: Path) -> None:
    """Give every file the mode the user's umask asks for: safetensors writes its file 0600, which would keep
    the weights of a shared export unreadable to the others who can read the rest of it."""
    umask = os.umask(0)
    os.umask(umask)
    for path in folder.rglob("*"):
        if path.is_file():
            path.chmod(0o666 & ~umask)


def check_destination(out: Path, overwrite: bool, source: Path | None) -> None:
    """Refuse an OUT_DIR that is a file, a run's own folder, holds `source`, or is not an earlier export."""
    if out.exists() and not out.is_dir():
        raise ExportError(f"{out} exists and is not a directory")
    resolved = out.expanduser().resolve()
    run = run_root(resolved)
    if run is not None:
        inside = resolved.relative_to(run).parts
        if not inside or inside[0] in RUN_OWN_FOLDERS:
            where = "is the run directory" if not inside else f"lies in its {inside[0]}/ folder"
            raise ExportError(f"{out} {where} {run}: an export never writes into or over a run's own files; choose "
                              f"another output directory (e.g. {run}/hf or outside the run)")
    if source is not None and out.exists():
        src, dst = source.resolve(), out.resolve()
        if src == dst or dst in src.parents:
            raise ExportError(f"{out} holds the checkpoint being read ({source}); choose another output directory")
    if out.is_dir() and any(out.iterdir()):
        if not overwrite:
            raise ExportError(f"{out} already exists and is not empty; choose another directory or pass --overwrite")
        if not _is_seqdiff_export(out):  # --overwrite replaces the whole folder: never someone's other files
            raise ExportError(f"{out} is not a seqdiff export (no {EXPORT_CONFIG} with model_type "
                              f"{EXPORT_MODEL_TYPE!r} and {EXPORT_WEIGHTS}): --overwrite only replaces an earlier "
                              f"export; choose another directory")


def _is_seqdiff_export(folder: Path) -> bool:
    """Whether `folder` is what an earlier export wrote (its config.json names model_type seqdiff)."""
    if not is_exported_dir(folder):
        return False
    try:
        return json.loads((folder / EXPORT_CONFIG).read_text()).get("model_type") == EXPORT_MODEL_TYPE
    except (OSError, ValueError, AttributeError):
        return False


__all__ = ["AUTO_MAP", "ExportError", "check_destination", "export_checkpoint", "export_model", "hf_config",
           "write_export"]
