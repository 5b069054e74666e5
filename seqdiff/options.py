"""Typed options of the commands that read a checkpoint (`sample`, `eval`, `probe`, `edlm ...`), and the one
way every command turns a saved config, `section.key=value` overrides and flags into them.

Design choices
- One dataclass per command, one section name per command: `sample.*` (SampleOptions: the recipe's
  SampleConfig plus what only one invocation asks for: prompt, infill, output, metrics, EDLM energy, device),
  `eval.*` (EvalOptions), `probe.*` (ProbeOptions); the `edlm` commands declare theirs in seqdiff/edlm/cli.py
  (`edlm.*`, `nce.*`). Each field carries a one-line docstring, read for `--help` and `seqdiff config --keys`.
- Precedence: field default < the run's saved config.yaml section of the same name (`sample:`, written by
  `seqdiff train`; a checkpoint under runs/NAME/checkpoints/ reads runs/NAME/config.yaml) < what this
  invocation gives. A key given both as a flag and as an override is refused, naming both.
- Every flag is an alias of one key: `--num-samples 2` is `sample.num_samples=2` (field `num_samples` of
  section `sample`). A field's metadata may rename its flag (`flag`), give none (`flag: None`), or map several
  appending flags onto one list (`append`: eval's `--data PATH` / `--dataset NAME` keep their command-line
  order in `eval.sources`). Flag values are typed by the same checks as overrides, so a bad value is one
  ConfigError line naming the flag the user typed; nothing has been loaded or written yet.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

import yaml

from seqdiff.config import ConfigError, SampleConfig, apply_overrides, field_help, from_dict, load_yaml

OVERRIDE = re.compile(r"^[A-Za-z_]\w*(\.\w+)*=")
"""An argument that is a `section.key=value` override (a path with / or no `=` is not one)."""


# ---------------------------------------------------------------------------------------------- options
@dataclass
class SampleOptions(SampleConfig):
    """sample.*: the run's saved sampling defaults (SampleConfig) and what one `seqdiff sample` asks for."""
    out_is_file: ClassVar[bool] = True  # `out` names a file: checked before any work (cli.resolve_options)

    length: int | None = None
    """Tokens per sample; beyond the model's context, semi-autoregressive blocks (diffusion); wins over seq_len."""
    format: Literal["auto", "text", "fasta"] = "auto"
    """Output format: auto (FASTA for a DNA model, else text), text or fasta."""
    out: str | None = None
    """Write the samples to this file instead of stdout."""
    prompt: str | None = None
    """Prefix every sample starts with (characters of the model's alphabet)."""
    infill: str | None = None
    """Text with masked spans to fill: runs of '_' (text) or 'N' (DNA), one per token; diffusion models only."""
    infill_file: str | None = None
    """Read the infill text from this file (DNA: lines joined, '>' headers skipped; text: less the final newline)."""
    infill_intervals: str | None = field(default=None, metadata={"metavar": "START-END,..."})
    """Also regenerate these token positions of the infill sequence (0-based, end exclusive, e.g. 10-20,40-55)."""
    rc_conjoin: bool = False
    """DNA diffusion models: average the predictions on both strands (post-hoc RC conjoining, Caduceus-Ph)."""
    metrics: bool = False
    """Print entropy, distinct-n, repetition, lengths (and GC / k-mer distance for DNA)."""
    oracle: str | None = None
    """Causal LM for generative perplexity: a seqdiff AR run / checkpoint or a HF causal LM directory (metrics)."""
    reference: str | None = None
    """DNA reference (FASTA or plain) for GC and k-mer distances (implies metrics)."""
    energy: str | None = None
    """sampler edlm: the energy, KIND:PATH (ar:AR_RUN, coar:AR_RUN or nce:ENERGY.pt)."""
    edlm_k: int = 2
    """sampler edlm: candidates per importance step."""
    edlm_window: float = 0.2
    """sampler edlm: importance steps for t >= 1 - window."""
    device: str = "cpu"
    """Device to sample on: cpu, cuda, cuda:1, ..."""
    no_ema: bool = False
    """Use the raw weights instead of the EMA weights."""

    def __post_init__(self) -> None:
        super().__post_init__()
        for key in ("length", "edlm_k"):
            value = getattr(self, key)
            if value is not None and value < 1:
                raise ConfigError(f"sample.{key} must be >= 1, got {value}")

    def sample_config(self) -> SampleConfig:
        """The SampleConfig part (what samplers and `generate` read)."""
        names = [f.name for f in dataclasses.fields(SampleConfig)]
        return SampleConfig(**{name: getattr(self, name) for name in names})


EVAL_SOURCES = {"--data": "data:", "--dataset": "dataset:"}


@dataclass
class EvalOptions:
    """eval.*: what `seqdiff eval` scores and how."""
    out_is_file: ClassVar[bool] = True  # `out` names a file: checked before any work (cli.resolve_options)

    sources: list[str] = field(default_factory=list, metadata={"append": EVAL_SOURCES})
    """Zero-shot sources in order, each data:PATH (a text / FASTA file or corpus folder; flag --data PATH) or
    dataset:NAME[:SPLIT] (a builtin, fetched or hub corpus; flag --dataset NAME); empty: the run's own split."""
    split: Literal["train", "valid", "test"] = "test"
    """Split of the run's corpus (and of a source that names none)."""
    num_t_samples: int = 1
    """Monte Carlo time samples per block (diffusion)."""
    batch_size: int = 32
    """Blocks per evaluation batch."""
    detokenizer: str | None = None
    """Detokenizer of every source (wikitext, ptb, lm1b, lambada, or none); default: each dataset's own, none for
    files."""
    json: bool = False
    """Print the results as JSON instead of a table."""
    out: str | None = None
    """JSON file for the results (default: <run or export>/eval/<data>-<hash of its path>.json)."""
    rc_conjoin: bool = False
    """DNA: both strands. Diffusion models average the denoiser over them (post-hoc RC conjoining, Caduceus-Ph);
    AR models score the exact strand mixture (p(x) + p(RC x)) / 2 of each block."""
    order: str | None = None
    """MDLM: the exact likelihood of the denoiser decoded in this fixed order (left_to_right, right_to_left, or a
    uniform mixture left_to_right+right_to_left) instead of the NELBO; random:K: the importance-weighted bound of
    MDLM's own likelihood over K random orders per block (tighter than the NELBO). One forward per token and order."""
    seed: int = 0
    """Seed of every random draw."""
    device: str = "cpu"
    """Device to evaluate on: cpu, cuda, cuda:1, ..."""
    no_ema: bool = False
    """Use the raw weights instead of the EMA weights."""

    def __post_init__(self) -> None:
        for key in ("num_t_samples", "batch_size"):
            if getattr(self, key) < 1:
                raise ConfigError(f"eval.{key} must be >= 1, got {getattr(self, key)}")
        if self.order is not None:
            from seqdiff.evaluation.ordered import parse_orders

            parse_orders(self.order)
        for i, source in enumerate(self.sources):
            if not source.startswith(tuple(EVAL_SOURCES.values())):
                raise ConfigError(f"eval.sources[{i}]={source!r} must start with data: (a file or folder) or "
                                  f"dataset: (a named corpus)")

    def source_options(self) -> list[tuple[str, str]]:
        """("data", PATH) / ("dataset", NAME[:SPLIT]) pairs, in order, for seqdiff.evaluation.zeroshot."""
        return [tuple(s.split(":", 1)) for s in self.sources]  # type: ignore[misc]


PROBE_SKIPS = Literal["frozen", "finetune", "random", "kmer", "onehot", "cnn", "checkpoints"]


@dataclass
class ProbeOptions:
    """probe.*: the benchmark of `seqdiff probe`, its protocol and the fine-tuning it runs."""

    benchmark: str | None = None
    """Required: splice, a Genomic Benchmarks name, nt/TASK or nt-revised/TASK, or a .csv / .tsv of sequence,label."""
    data_dir: str | None = None
    """Folder of the benchmark's files (Genomic Benchmarks, splice's DNA.rda, nt/TASK parquet); default: the local
    cache, never downloaded."""
    test_file: str | None = None
    """For a user .csv / .tsv: its test rows (default: a seeded 20% hold-out)."""
    seeds: int = 5
    """Protocol seeds (random 90/10 train/validation splits)."""
    train_size: int | None = None
    """Small-data check: each seed draws this many training sequences (stratified) before its 90/10 split; the
    test set is unchanged. Default: the whole training set."""
    cv_folds: int = 0
    """> 1: the frozen, k-mer and one-hot rows choose C (and layer, k) by K-fold cross-validation over each seed's
    train and validation rows, then refit on all of them (small data sets); fine-tuned and CNN rows keep 90/10."""
    finetune_seeds: int | None = None
    """Seeds for the trained rows (default: seeds)."""
    epochs: int = 3
    """Fine-tuning epochs (best on validation is kept)."""
    lr: float = 3e-4
    """Fine-tuning learning rate."""
    head_epochs: int = 0
    """Epochs training only the head, backbone frozen, before the end-to-end ones (LP-FT)."""
    head_init: Literal["random", "probe"] = "random"
    """Fine-tuning head: random, or the fitted frozen linear probe (LP-FT; scored as epoch 0)."""
    encoder_lr_scale: float = 1.0
    """The backbone's fine-tuning learning rate is lr times this (the head's is lr)."""
    cnn_epochs: int = 10
    """CNN baseline epochs (best on validation is kept)."""
    layer: int | str | None = None
    """Layer of the frozen probe: 0 (embeddings) .. n_layers, 'best' (chosen on validation) or 'concat' (every layer
    side by side, for fine-tuning too); default: the output. Fine-tuning reads the output for 'best'."""
    rc_average: bool = False
    """Average embeddings with the reverse complement's."""
    rc_both: bool = False
    """Keep both strands' features side by side (an RC-equivariant model: both strands' states, not their mean)."""
    pool: Literal["mean", "flatten"] = "mean"
    """Frozen probe and fine-tuning head: mean over real positions, or every position's state side by side."""
    context_scales: list[float] = field(default_factory=list)
    """With --layer concat: weights of the blocks' features against the token embeddings' to choose from, with C, on
    validation (e.g. 0 0.1 0.3 1; 0 = the embeddings alone, 1 = the plain concatenation). Default: the plain one."""
    mask_stride: int = 0
    """K >= 2: read each base's features from a pass where it is masked (K passes, every K-th base masked in each):
    where an MDLM denoiser predicts; its upper layers are untrained at unmasked positions. 0: the clean sequence."""
    skip: list[PROBE_SKIPS] = field(default_factory=list)
    """Rows to leave out: frozen, finetune, random, kmer, onehot, cnn, checkpoints (the checkpoints' own rows)."""
    out: str = "reports/probes"
    """Report folder (writes NAME.json and NAME.md)."""
    device: str = "cpu"
    """Device to run on: cpu, cuda, ..."""
    no_ema: bool = False
    """Use the raw weights instead of the EMA weights."""

    def __post_init__(self) -> None:
        if self.rc_average and self.rc_both:
            raise ConfigError("probe.rc_average and probe.rc_both exclude each other: average the two strands "
                              "(--rc-average) or keep both side by side (--rc-both)")
        if isinstance(self.layer, str) and self.layer not in ("best", "concat"):
            raise ConfigError(f"probe.layer takes an integer, 'best' or 'concat', not {self.layer!r}")
        for key in ("seeds", "finetune_seeds", "cnn_epochs", "train_size"):
            value = getattr(self, key)
            if value is not None and value < 1:
                raise ConfigError(f"probe.{key} must be >= 1, got {value}")
        if self.mask_stride < 0 or self.mask_stride == 1:
            raise ConfigError(f"probe.mask_stride takes 0 (read the clean sequence) or K >= 2 passes, got "
                              f"{self.mask_stride}")
        if self.context_scales and self.layer != "concat":
            raise ConfigError("probe.context_scales weighs the blocks' features of a concatenation: it needs "
                              "--layer concat")
        if any(scale < 0 for scale in self.context_scales):
            raise ConfigError(f"probe.context_scales must be >= 0, got {self.context_scales}")
        if self.cv_folds < 0 or self.cv_folds == 1:
            raise ConfigError(f"probe.cv_folds takes 0 (choose on the 90/10 split) or a number of folds >= 2, "
                              f"got {self.cv_folds}")


@dataclass
class ScoreOptions:
    """score.*: `seqdiff score`, zero-shot variant effects of a DNA model (seqdiff.evaluation.variants)."""
    out_is_file: ClassVar[bool] = True  # `out` names a file: checked before any work (cli.resolve_options)

    fasta: str | None = None
    """Required: the reference FASTA (plain or bgzip) the variants refer to."""
    variants: str | None = None
    """Required: a VCF, or a TSV / CSV with a header naming chrom, pos (1-based), ref, alt (other columns kept)."""
    window: int | None = None
    """Bases of reference context around each variant (default: the model's training length)."""
    batch_size: int = 16
    """Windows scored per batch."""
    format: Literal["auto", "tsv", "json"] = "auto"
    """Output format (auto: json for an out ending in .json, else tsv)."""
    out: str | None = None
    """Output file (default: TSV on stdout)."""
    rc_conjoin: bool = False
    """Both strands: diffusion models average the denoiser over them; AR models score (p(w) + p(RC w)) / 2 exactly."""
    seed: int = 0
    """Seed of every random draw."""
    device: str = "cpu"
    """cpu, cuda, cuda:1, ..."""
    no_ema: bool = False
    """Use the raw weights instead of the EMA weights."""

    def __post_init__(self) -> None:
        if self.window is not None and self.window < 1:
            raise ConfigError(f"score.window must be >= 1, got {self.window}")
        if self.batch_size < 1:
            raise ConfigError(f"score.batch_size must be >= 1, got {self.batch_size}")


@dataclass
class ExportOptions:
    """export.*: `seqdiff export CHECKPOINT OUT_DIR`, a Hugging Face model directory."""

    no_ema: bool = False
    """Export the raw weights instead of the EMA weights."""
    overwrite: bool = False
    """Replace an existing output directory."""
    encoder_alpha: float = field(default=1.0, metadata={"metavar": "A"})
    """WiSE-FT (fine-tuned from model.init_from): encoder (1 - A) x pretrained + A x fine-tuned (1: as trained)."""


@dataclass
class QuickstartOptions:
    """quickstart.*: `seqdiff quickstart`, MDLM and AR on the shipped Shakespeare slice."""

    out: str = "reports/quickstart"
    """Report folder."""
    run_dir: str = "runs/quickstart"
    """Folder for the two runs."""
    max_steps: int | None = None
    """Training steps of each model, both the same (default: each model's own, seqdiff.quickstart.MAX_STEPS)."""
    overwrite: bool = False
    """Replace earlier quickstart runs."""
    seed: int | None = None
    """Seed of both trainings (initialization, data order, noise) and of the samples (default: the recipe's, 0).
    Rerun with other seeds to see how much of a gap is the seed's."""
    sequential: bool = False
    """Train the two models one after the other on every CPU thread (default: side by side in two processes, the
    threads split, where there are at least two: sooner on a small CPU)."""

    def __post_init__(self) -> None:
        if self.max_steps is not None and self.max_steps < 1:
            raise ConfigError(f"quickstart.max_steps must be >= 1, got {self.max_steps}")
        if self.seed is not None and self.seed < 0:
            raise ConfigError(f"quickstart.seed must be >= 0, got {self.seed}")


# ---------------------------------------------------------------------------------------------- help
def options_help(cls: type) -> dict[str, str]:
    """Field docstrings of an options dataclass and of the dataclasses it extends (SampleOptions: SampleConfig's)."""
    docs: dict[str, str] = {}
    for base in reversed(cls.__mro__):
        if dataclasses.is_dataclass(base):
            docs.update(field_help(base))
    return docs


def flag_names(cls: type) -> dict[str, list[str]]:
    """field -> the flags that set it (`--num-samples`; eval.sources: `--data`, `--dataset`; none: [])."""
    out = {}
    for f in dataclasses.fields(cls):
        if "append" in f.metadata:
            out[f.name] = list(f.metadata["append"])
        else:
            flag = f.metadata.get("flag", "--" + f.name.replace("_", "-"))
            out[f.name] = [flag] if flag else []
    return out


def key_lines(section: str, cls: type, width: int = 28) -> list[str]:
    """`  section.key  (--flag) doc` for every field, for --help epilogs and `seqdiff config --keys`."""
    docs, flags = options_help(cls), flag_names(cls)
    lines = []
    for f in dataclasses.fields(cls):
        alias = f" ({', '.join(flags[f.name])})" if flags[f.name] else ""
        doc = " ".join(docs.get(f.name, "").split())
        lines.append(f"  {section + '.' + f.name:<{width}} {doc}{alias}")
    return lines


# ---------------------------------------------------------------------------------------------- flags
def _is_str(tp: Any) -> bool:
    """Whether a flag's text is the value itself (a string field), not YAML to be read."""
    if tp is str:
        return True
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return len(args) == 1 and _is_str(args[0])
    if origin is typing.Literal:
        return all(isinstance(a, str) for a in typing.get_args(tp))
    return False


def add_flags(parser: argparse.ArgumentParser, section: str, cls: type) -> None:
    """One flag per field of `cls` (see the module doc); values land in `<section>.<field>`, unset ones nowhere."""
    docs = options_help(cls)
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        doc = docs.get(f.name, "").replace("%", "%%")
        dest = f"{section}.{f.name}"
        if "append" in f.metadata:
            for flag, prefix in f.metadata["append"].items():
                parser.add_argument(flag, dest=dest, action="append", default=argparse.SUPPRESS,
                                    type=lambda v, p=prefix: p + v, metavar=flag.lstrip("-").upper(),
                                    help=f"{doc} [{dest}]")
            continue
        flag = f.metadata.get("flag", "--" + f.name.replace("_", "-"))
        if not flag:
            continue
        tp = hints[f.name]
        kwargs: dict[str, Any] = {"dest": dest, "default": argparse.SUPPRESS, "help": f"{doc} [{dest}]"}
        if tp is bool:
            kwargs["action"] = "store_true"
        else:
            if typing.get_origin(tp) is list:
                kwargs["nargs"] = "*"
            kwargs["metavar"] = f.metadata.get("metavar", _metavar(f.name, tp))
        parser.add_argument(flag, **kwargs)


def _metavar(name: str, tp: Any) -> str:
    """N for integers, X for numbers, {a,b} for a choice, the key's name for text."""
    if typing.get_origin(tp) is list:
        return _metavar(name, (typing.get_args(tp) or (str,))[0])
    args = [a for a in typing.get_args(tp) if a is not type(None)] if typing.get_origin(tp) in (
        typing.Union, types.UnionType) else [tp]
    if len(args) == 1 and typing.get_origin(args[0]) is typing.Literal:
        return "{" + ",".join(map(str, typing.get_args(args[0]))) + "}"
    if args == [int]:
        return "N"
    if args == [float]:
        return "X"
    return name.upper()


def _flag_value(raw: Any, tp: Any) -> Any:
    """A flag's text -> the value an override would give (strings as typed; numbers, null, lists read as YAML)."""
    if typing.get_origin(tp) is list:
        (inner,) = typing.get_args(tp)[:1] or (Any,)
        return [_flag_value(v, inner) for v in raw]
    if isinstance(raw, bool) or _is_str(tp):
        return raw
    try:
        return yaml.safe_load(raw)
    except yaml.YAMLError:
        return raw  # the type check below names the flag and the value


def resolve(section: str, cls: type, args: argparse.Namespace, saved: dict[str, Any] | None = None,
            saved_from: str | Path | None = None) -> Any:
    """The typed options of `section`: defaults < `saved` (the run's section, read from the file `saved_from`) <
    args.overrides and flags.

    Unknown keys, sections other than `section` and bad values fail with one ConfigError line naming the key
    (or the flag the user typed, or the file a saved value was read from) and what is allowed."""
    given = vars(args)
    flags = {key.split(".", 1)[1]: value for key, value in given.items() if key.startswith(section + ".")}
    overrides = list(given.get("overrides") or [])
    names = flag_names(cls)
    set_by_override = set()
    for text in overrides:
        key = text.split("=", 1)[0].strip()
        path = key.split(".")
        if path[0] != section or len(path) < 2:
            raise ConfigError(f"override {text!r}: seqdiff {args.command} takes {section}.KEY=VALUE overrides (keys: "
                              f"`seqdiff config --keys`)")
        set_by_override.add(path[1])
    for key in sorted(set(flags) & set_by_override):
        raise ConfigError(f"{section}.{key} is given twice, as {'/'.join(names[key])} and as an override; give one")
    data = apply_overrides({section: dict(saved or {})}, overrides)[section]
    hints = typing.get_type_hints(cls)
    for key, raw in flags.items():
        data[key] = _flag_value(raw, hints[key])
    try:
        return from_dict(cls, data, prefix=section + ".")
    except ConfigError as e:
        message = str(e)
        if saved_from is not None and message == _refusal(section, cls, saved or {}):  # the saved value's fault
            raise ConfigError(f"{saved_from}: {message}") from None
        for key in flags:  # name what the user typed: "--steps must be >= 1, got 0 (sample.steps)"; a message
            # that names the flag already ("sample.remdm_eta (--remdm-eta) must ...") is left as it is
            if len(names[key]) != 1 or re.search(rf"{re.escape(names[key][0])}(?![\w-])", message):
                continue
            pattern = rf"{re.escape(section + '.' + key)}(?![\w(]| \()"
            if re.search(pattern, message):
                message = re.sub(pattern, names[key][0], message) + f" ({section}.{key})"
        raise ConfigError(message) from None


def _refusal(section: str, cls: type, values: dict[str, Any]) -> str | None:
    """The error `values` alone meet as options of `section` (None: they are valid)."""
    try:
        from_dict(cls, dict(values), prefix=section + ".")
    except ConfigError as e:
        return str(e)
    return None


def explicit_keys(section: str, args: argparse.Namespace) -> set[str]:
    """Keys of `section` this invocation sets (by flag or override), as opposed to saved or default ones."""
    keys = {k.split(".", 1)[1] for k in vars(args) if k.startswith(section + ".")}
    for text in getattr(args, "overrides", None) or []:
        path = text.split("=", 1)[0].strip().split(".")
        if path[0] == section and len(path) > 1:
            keys.add(path[1])
    return keys


def given_as(section: str, cls: type, key: str, args: argparse.Namespace) -> str:
    """How this invocation gave `section.key`, as the user typed it (`--steps 64` or `sample.steps=64`), for
    errors about an option the user gave."""
    for text in getattr(args, "overrides", None) or []:
        if text.split("=", 1)[0].strip().split(".")[:2] == [section, key]:
            return text
    value = vars(args).get(f"{section}.{key}")
    flag = (flag_names(cls)[key] or [f"{section}.{key}"])[0]
    if isinstance(value, bool) or value is None:
        return flag
    return f"{flag} {' '.join(map(str, value)) if isinstance(value, list) else value}"


# ---------------------------------------------------------------------------------------------- saved config
def run_config_file(checkpoint: str | Path) -> Path | None:
    """The config.yaml `seqdiff train` wrote for the run a checkpoint belongs to (a run directory, or a .ckpt in
    its checkpoints/ folder); None for an exported directory or a checkpoint outside a run."""
    path = Path(checkpoint)
    run = path if path.is_dir() else path.parent.parent if path.parent.name == "checkpoints" else None
    if run is None or not (run / "config.yaml").is_file():
        return None
    return run / "config.yaml"


def saved_section(checkpoint: str | Path, section: str) -> dict[str, Any]:
    """The `section` mapping of the run's saved config.yaml ({} when there is none); a malformed file is refused,
    naming it."""
    file = run_config_file(checkpoint)
    if file is None:
        return {}
    value = load_yaml(file).get(section)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"{file}: {section} must be a mapping of keys, got {value!r}")
    return value


def split_overrides(items: list[str]) -> tuple[list[str], list[str]]:
    """Positional arguments -> (paths, overrides): `key.path=value` is an override unless it names an existing
    file (Lightning names checkpoints step=100.ckpt)."""
    paths, overrides = [], []
    for item in items:
        (overrides if OVERRIDE.match(item) and not Path(item).exists() else paths).append(item)
    return paths, overrides


__all__ = ["EvalOptions", "ExportOptions", "ProbeOptions", "QuickstartOptions", "SampleOptions", "ScoreOptions",
           "add_flags", "explicit_keys", "flag_names", "given_as", "key_lines", "options_help", "resolve",
           "run_config_file", "saved_section", "split_overrides"]
