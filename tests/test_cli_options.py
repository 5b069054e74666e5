"""One syntax for every command (seqdiff.options, the command table of seqdiff.cli): the options of `sample`,
`eval`, `probe` and `edlm` start from the field defaults, then the run's saved config.yaml section, then this
invocation's `section.key=value` overrides and flags (each flag an alias of one key); unknown keys, other
sections, bad values and a key given twice are refused in one line before anything is loaded or written."""

import argparse
import dataclasses
import json
import subprocess
import sys

import pytest
import yaml

from seqdiff import cli
from seqdiff.cli import _commands, build_parser, main, parse, resolve_options
from seqdiff.config import ConfigError, SampleConfig
from seqdiff.options import EvalOptions, ProbeOptions, SampleOptions
from tests.test_cli import TINY


def options(argv):
    """The typed options `seqdiff ARGV` would run with (nothing is loaded: only config.yaml is read)."""
    args = parse(argv)
    resolve_options(args)
    section = args._command.options[0]
    return getattr(args, section), args


@pytest.fixture
def saved_run(tmp_path):
    """A run directory whose config.yaml (as `seqdiff train` writes it) records a sample: section."""
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.yaml").write_text(yaml.safe_dump({"name": "run", "sample": {"num_samples": 3, "steps": 16,
                                                                                "temperature": 0.5}}))
    return run


# ---------------------------------------------------------------------------------------------- precedence
def test_default_then_saved_section_then_override(tmp_path, saved_run):
    bare = tmp_path / "bare"  # no config.yaml (an exported directory, a loose .ckpt): the defaults
    bare.mkdir()
    o, _ = options(["sample", str(bare)])
    assert (o.num_samples, o.steps, o.temperature) == (SampleConfig.num_samples, SampleConfig.steps, 1.0)
    o, _ = options(["sample", str(saved_run)])  # the run's saved sample: section beats the defaults
    assert (o.num_samples, o.steps, o.temperature) == (3, 16, 0.5)
    o, _ = options(["sample", str(saved_run), "sample.num_samples=2", "sample.sampler=remdm"])
    assert (o.num_samples, o.steps, o.sampler) == (2, 16, "remdm")  # an override beats it; the rest stays saved
    o, _ = options(["sample", str(saved_run / "checkpoints" / "last.ckpt")])  # a .ckpt of the run reads it too
    assert o.steps == 16


@pytest.mark.parametrize("flags,overrides", [
    (["--num-samples", "2", "--steps", "8", "--top-p", "0.9", "--stop-at-eos"],
     ["sample.num_samples=2", "sample.steps=8", "sample.top_p=0.9", "sample.stop_at_eos=true"]),
    (["--prompt", "1", "--remdm-schedule", "loop", "--no-ema", "--out", "x.txt"],
     ["sample.prompt='1'", "sample.remdm_schedule=loop", "sample.no_ema=true", "sample.out=x.txt"]),
    (["--length", "90", "--edlm-window", "0.5", "--device", "cpu"],
     ["sample.length=90", "sample.edlm_window=0.5", "sample.device=cpu"]),
])
def test_a_sample_flag_is_its_override(saved_run, flags, overrides):
    by_flag, _ = options(["sample", str(saved_run), *flags])
    by_override, _ = options(["sample", str(saved_run), *overrides])
    assert by_flag == by_override != options(["sample", str(saved_run)])[0]


def test_eval_probe_and_edlm_flags_are_their_overrides(saved_run):
    run = str(saved_run)
    pairs = [
        (["eval", run, "--split", "valid", "--num-t-samples", "2", "--json", "--seed", "3"],
         ["eval", run, "eval.split=valid", "eval.num_t_samples=2", "eval.json=true", "eval.seed=3"]),
        (["probe", run, "--benchmark", "splice", "--seeds", "2", "--layer", "best", "--skip", "cnn", "kmer"],
         ["probe", run, "probe.benchmark=splice", "probe.seeds=2", "probe.layer=best", "probe.skip=[cnn, kmer]"]),
        (["edlm", "eval", run, "--energy", "ar:x", "--form", "sequence", "--num-partition-samples", "4"],
         ["edlm", "eval", run, "edlm.energy=ar:x", "edlm.form=sequence", "edlm.num_partition_samples=4"]),
        (["edlm", "train-nce", run, "--out", "e.pt", "--steps", "2", "--lr", "1e-3"],
         ["edlm", "train-nce", run, "nce.out=e.pt", "nce.steps=2", "nce.lr=1e-3"]),
        (["score", run, "--fasta", "g.fa", "--window", "64", "--format", "json", "--rc-conjoin"],
         ["score", run, "score.fasta=g.fa", "score.window=64", "score.format=json", "score.rc_conjoin=true"]),
        (["export", run, "out", "--overwrite", "--encoder-alpha", "0.25"],
         ["export", run, "out", "export.overwrite=true", "export.encoder_alpha=0.25"]),
        (["quickstart", "--max-steps", "5", "--out", "r", "--seed", "3"],
         ["quickstart", "quickstart.max_steps=5", "quickstart.out=r", "quickstart.seed=3"]),
    ]
    for flags, overrides in pairs:
        by_flag, _ = options(flags)
        assert by_flag == options(overrides)[0]
        assert by_flag != type(by_flag)(**({"benchmark": "splice"} if flags[0] == "probe" else {}))


def test_eval_sources_keep_their_command_line_order(saved_run):
    o, _ = options(["eval", str(saved_run), "--data", "a.txt", "--dataset", "ptb", "--data", "b.txt"])
    assert o.sources == ["data:a.txt", "dataset:ptb", "data:b.txt"]
    assert o.source_options() == [("data", "a.txt"), ("dataset", "ptb"), ("data", "b.txt")]
    assert options(["eval", str(saved_run), "eval.sources=[data:a.txt, dataset:ptb]"])[0].sources == \
        ["data:a.txt", "dataset:ptb"]


def test_probe_checkpoints_and_overrides_mix_in_any_order(tmp_path):
    ckpt = tmp_path / "step=100.ckpt"  # a Lightning name with '=' is a path, not an override
    ckpt.write_bytes(b"")
    o, args = options(["probe", "a", str(ckpt), "probe.seeds=2", "b", "--benchmark", "splice", "probe.pool=flatten"])
    assert args.checkpoints == ["a", str(ckpt), "b"] and (o.seeds, o.pool, o.benchmark) == (2, "flatten", "splice")
    assert options(["probe", "--layer", "3", "--benchmark", "x"])[0].layer == 3


def test_overrides_may_follow_flags(saved_run):
    o, _ = options(["sample", str(saved_run), "--steps", "8", "sample.num_samples=2", "--seed", "5",
                    "sample.top_p=0.5"])
    assert (o.steps, o.num_samples, o.seed, o.top_p) == (8, 2, 5, 0.5)


def test_frontier_and_bench_take_overrides_onto_their_flags():
    by_flag = parse(["frontier", "--steps", "4,8", "--checkpoint", "a", "--checkpoint", "b", "--edlm-window", "0.5",
                     "--render-only"])
    by_override = parse(["frontier", "frontier.steps=4,8", "frontier.checkpoint=[a, b]", "frontier.edlm_window=0.5",
                         "frontier.render_only=true"])
    for args in (by_flag, by_override):
        resolve_options(args)
    keys = ("steps", "checkpoint", "edlm_window", "render_only", "num_samples")
    assert [getattr(by_flag, k) for k in keys] == [getattr(by_override, k) for k in keys] == \
        ["4,8", ["a", "b"], 0.5, True, 16]
    args = parse(["bench", "--repeats", "2", "bench.repeats=3", "bench.preset=test", "bench.compile=true"])
    resolve_options(args)  # an override is applied after the flags
    assert (args.repeats, args.preset, args.compile, args.seq_len) == (3, "test", True, 256)
    for argv, message in [(["frontier", "frontier.stepz=4"], r"KEY one of \[.*'steps'"),
                          (["frontier", "frontier.edlm_window=nan"], "finite number"),
                          (["bench", "bench.preset=huge"], r"bench.preset='huge' is not allowed; choose one of"),
                          (["bench", "bench.repeats=x"], r"bench.repeats='x'"),
                          (["bench", "bench.compile=maybe"], "must be true or false"),
                          (["bench", "bench.compile=[tru"], r"'bench.compile=\[tru': the value is not valid YAML"),
                          (["frontier", "frontier.checkpoint=[a, b"], "not valid YAML")]:
        with pytest.raises(ConfigError, match=message):
            resolve_options(parse(argv))


# ---------------------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("argv", [["sample", "RUN"], ["eval", "RUN"], ["score", "RUN", "--fasta", "a.fa"],
                                  ["edlm", "eval", "RUN"], ["edlm", "train-nce", "RUN"]])
def test_an_out_file_that_cannot_be_written_is_refused_before_any_work(argv, tmp_path, capsys):
    """A folder, or a path under a file, given as --out fails in one line before the checkpoint is read (the
    run named here does not exist: reaching it would be a different error)."""
    (tmp_path / "file").write_text("x")
    section = {"edlm eval": "edlm", "edlm train-nce": "nce"}.get(" ".join(argv[:2]), argv[0])
    for out, message in [(tmp_path, f"{section}.out {tmp_path} is a folder; name a file"),
                         (tmp_path / "file" / "x.json", f"{tmp_path / 'file'} is a file, not a folder")]:
        assert main([*argv, "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err
    assert not (tmp_path / "new").exists()
    o, _ = options([*argv, "--out", str(tmp_path / "new" / "out.txt")])  # a new file in a new folder passes
    assert o.out == str(tmp_path / "new" / "out.txt") and not (tmp_path / "new").exists()  # nothing created yet


def test_an_out_file_that_is_an_input_or_part_of_a_run_is_refused_before_any_work(saved_run, tmp_path, capsys):
    """--out naming the checkpoint, a file the command reads (--fasta, --variants, --data, --infill-file) or a
    run's own file (checkpoints/, logs/, config.yaml) fails in one line and leaves the file as it was; the run's
    eval/ folder and a new file beside the run's files are allowed."""
    ckpt = saved_run / "checkpoints" / "last.ckpt"
    ckpt.write_bytes(b"weights")
    loose = tmp_path / "model.ckpt"
    loose.write_bytes(b"weights")
    fasta, variants, text = tmp_path / "ref.fa", tmp_path / "v.tsv", tmp_path / "valid.txt"
    for f in (fasta, variants, text):
        f.write_text("keep\n")
    cases = [(["sample", str(saved_run), "--out", str(ckpt)], "lies in the checkpoints/ folder of the run"),
             (["eval", str(ckpt), "--out", str(saved_run / "config.yaml")], "is the config.yaml of the run"),
             (["eval", str(saved_run), "--out", str(saved_run / "logs" / "m.json")], "lies in the logs/ folder"),
             (["sample", str(saved_run), "--out", str(saved_run / "timing.json")], "is the timing.json of the run"),
             (["eval", str(saved_run), "--data", str(text), "--out", str(text)],
              "is a file this command reads (eval.sources data:"),
             (["score", str(saved_run), "--fasta", str(fasta), "--variants", str(variants), "--out", str(variants)],
              "is a file this command reads (score.variants"),
             (["score", str(saved_run), "--fasta", str(fasta), "--out", str(fasta)], "(score.fasta "),
             (["sample", str(saved_run), "--infill-file", str(text), "--out", str(text)], "(sample.infill_file "),
             (["sample", str(loose), "--out", str(loose)], "reads (the checkpoint "),
             (["sample", str(ckpt), "--out", str(tmp_path / "elsewhere" / ".." / "run" / "checkpoints" / "x.ckpt")],
              "lies in the checkpoints/ folder")]
    for argv, message in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err
    assert ckpt.read_bytes() == loose.read_bytes() == b"weights"
    assert all(f.read_text() == "keep\n" for f in (fasta, variants, text))
    for out in (saved_run / "eval" / "test.json", saved_run / "samples.txt", tmp_path / "other.txt"):
        o, _ = options(["eval", str(saved_run), "--out", str(out)])
        assert o.out == str(out)


@pytest.mark.parametrize("argv,message", [
    (["sample", "RUN", "sample.stepz=3"], r"unknown config key sample\.stepz; allowed keys: \[.*'steps'"),
    (["sample", "RUN", "model.hidden_size=8"], r"model.hidden_size=8.*takes sample\.KEY=VALUE"),
    (["sample", "RUN", "steps=8"], r"steps=8.*takes sample\.KEY=VALUE"),
    (["sample", "RUN", "sample.steps=abc"], r"sample\.steps must be an integer, got 'abc'"),
    (["sample", "RUN", "--steps", "abc"], r"--steps must be an integer, got 'abc' \(sample\.steps\)"),
    (["sample", "RUN", "--steps", "8", "sample.steps=9"], r"sample\.steps is given twice, as --steps and as an"),
    (["sample", "RUN", "sample.format=pdf"], r"sample\.format='pdf' is not allowed; choose one of \['auto'"),
    (["sample", "RUN", "--temperature", "nan"], r"--temperature must be a finite number"),
    (["eval", "RUN", "eval.split=dev"], r"eval\.split='dev' is not allowed; choose one of \['train', 'valid'"),
    (["eval", "RUN", "eval.sources=[a.txt]"], r"eval\.sources\[0\]='a.txt' must start with data:"),
    (["eval", "RUN", "sample.steps=3"], r"takes eval\.KEY=VALUE"),
    (["probe", "--benchmark", "x", "--layer", "top"], r"--layer takes an integer, 'best' or 'concat', not 'top'"),
    (["probe", "probe.skip=[frozen, everything]"], r"probe\.skip\[1\]='everything' is not allowed"),
    (["edlm", "eval", "RUN", "edlm.form=joint"], r"edlm\.form='joint' is not allowed"),
    (["edlm", "train-nce", "RUN", "nce.steps=0"], r"nce\.steps must be >= 1, got 0"),
    (["score", "RUN", "score.format=vcf"], r"score\.format='vcf' is not allowed; choose one of \['auto', 'tsv'"),
    (["export", "RUN", "out", "export.alpha=0.5"], r"unknown config key export\.alpha; allowed keys"),
    (["quickstart", "--max-steps", "0"], r"--max-steps must be >= 1, got 0 \(quickstart\.max_steps\)"),
    (["quickstart", "--seed", "-1"], r"--seed must be >= 0, got -1 \(quickstart\.seed\)"),
])
def test_bad_keys_and_values_are_refused_naming_the_key(saved_run, argv, message):
    argv = [str(saved_run) if a == "RUN" else a for a in argv]
    with pytest.raises(ConfigError, match=message):
        options(argv)


def test_a_refusal_is_one_line_and_writes_nothing(saved_run, tmp_path, capsys):
    out = tmp_path / "never.txt"
    assert main(["sample", str(saved_run), "sample.stepz=3", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("seqdiff sample: error: unknown config key sample.stepz") and "\n" not in err
    assert not out.exists() and not list(tmp_path.glob("never*"))
    (saved_run / "config.yaml").write_text("sample: [1, 2]\n")  # a saved section that is not a mapping is named
    assert main(["sample", str(saved_run)]) == 2
    assert "config.yaml: sample must be a mapping" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------- end to end
@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny MDLM run trained with a sample: section in its recipe (saved to its config.yaml)."""
    run = tmp_path_factory.mktemp("options") / "mdlm"
    assert main(["train", "--run-dir", str(run), *TINY, "sample.num_samples=3", "sample.steps=4",
                 "sample.seq_len=12"]) == 0
    return run


def test_fasta_output_of_a_text_model_is_refused_before_sampling(trained, refused):
    line = refused(["sample", str(trained), "--format", "fasta"])
    assert line.startswith(f"seqdiff sample: error: --format fasta writes nucleotide samples, and {trained} is a "
                           "text model (char, ") and "write text" in line
    assert "sample.format fasta" in refused(["sample", str(trained), "sample.format=fasta"])


def _samples(capsys, argv):
    assert main(argv) == 0
    captured = capsys.readouterr()
    samples = [line for line in captured.out.splitlines() if line and not line.startswith("===")]
    return samples, captured.out, captured.err


def test_sample_honours_the_runs_saved_sample_section(trained, capsys):
    saved = yaml.safe_load((trained / "config.yaml").read_text())["sample"]
    assert (saved["num_samples"], saved["steps"], saved["seq_len"]) == (3, 4, 12)
    samples, _, _ = _samples(capsys, ["sample", str(trained)])
    assert len(samples) == 3 and all(len(s) <= 12 for s in samples)  # not the default 4 samples of 32 tokens
    samples, _, _ = _samples(capsys, ["sample", str(trained), "sample.num_samples=2", "sample.seq_len=6"])
    assert len(samples) == 2 and all(len(s) <= 6 for s in samples)


def test_a_sample_flag_gives_the_same_samples_as_its_override(trained, capsys):
    _, by_flag, err = _samples(capsys, ["sample", str(trained), "--num-samples", "2", "--seed", "7", "--sampler",
                                   "remdm", "--remdm-eta", "0.1"])
    _, by_override, _ = _samples(capsys, ["sample", str(trained), "sample.num_samples=2", "sample.seed=7",
                                       "sample.sampler=remdm", "sample.remdm_eta=0.1"])
    _, other_seed, _ = _samples(capsys, ["sample", str(trained), "sample.num_samples=2", "sample.seed=8",
                                      "sample.sampler=remdm", "sample.remdm_eta=0.1"])
    assert by_flag == by_override != other_seed and "remdm sampler" in err and "eta=0.1" in err


def test_an_eval_flag_gives_the_same_report_as_its_override(trained, tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    assert main(["eval", str(trained), "--num-t-samples", "2", "--split", "valid", "--out", str(a)]) == 0
    assert main(["eval", str(trained), "eval.num_t_samples=2", "eval.split=valid", f"eval.out={b}"]) == 0
    ra, rb = (json.loads(p.read_text())["results"][0] for p in (a, b))
    assert ra == rb and ra["num_t_samples"] == 2 and ra["split"] == "valid"


# ---------------------------------------------------------------------------------------------- the table
def test_every_subcommand_comes_from_the_one_table():
    parser_choices = build_parser()._subparsers._group_actions[0].choices
    table = _commands()
    assert list(parser_choices) == list(table)
    for name, command in table.items():
        assert (command.handler is None) == bool(command.subcommands), name
        for sub in command.subcommands.values():
            assert sub.handler is not None
    assert set(table["edlm"].subcommands) == {"eval", "train-nce"}
    assert {"bench", "frontier"} <= set(table)


def test_a_command_line_builds_only_the_command_it_names_and_ctrl_c_while_parsing_is_one_line(monkeypatch, capsys):
    """`seqdiff --help` and a light command do not import torch (the key lists of the other commands would);
    the named command still gets every flag, and the top-level help still lists every command."""
    code = ("import sys\nfrom seqdiff.cli import build_parser, parse\n"
            "args = parse(['data', 'list'])\nassert args.command == 'data list', args.command\n"
            "parse(['config', 'data.seq_len=64'])\n"
            "help = build_parser([]).format_help()\n"
            "assert all(c in help for c in ('train', 'sample', 'frontier', 'bench')), help\n"
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
    full = build_parser()._subparsers._group_actions[0].choices["eval"]
    named = build_parser(["eval", "runs/x"])._subparsers._group_actions[0].choices["eval"]
    assert [a.dest for a in named._actions] == [a.dest for a in full._actions]
    assert "eval.num_t_samples" in named.format_help()

    def interrupted(argv):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "parse", interrupted)
    assert main(["train"]) == 130
    assert capsys.readouterr().err == "seqdiff: interrupted\n"


def test_help_and_config_keys_list_the_command_options(capsys):
    assert main(["config", "--keys"]) == 0
    out = capsys.readouterr().out
    for key in ("train.ema_decay", "sample.steps", "sample.prompt", "eval.split", "eval.sources", "probe.seeds",
                "probe.benchmark", "edlm.form", "nce.steps", "score.window", "export.encoder_alpha",
                "quickstart.max_steps"):
        assert f"  {key} " in out, key
    # bench and frontier take argparse flags: each is listed as its key, with its help and flag, every one documented
    assert "seqdiff frontier: frontier.key=value overrides" in out and "seqdiff bench: bench.key=value overrides" in out
    for command, section in (("bench", "bench"), ("frontier", "frontier")):
        parser = argparse.ArgumentParser(add_help=False)
        cli._commands()[command].arguments(parser)
        for action in parser._actions:
            if action.option_strings:
                line = next(line for line in out.splitlines() if line.startswith(f"  {section}.{action.dest} "))
                assert line.endswith(f"({', '.join(action.option_strings)})")
                assert len(line.split(None, 1)[1]) > len(" ".join(action.option_strings)) + 3, line  # a help text
    assert "bench.sample_budget_s" in out and "frontier.steps               comma-separated step counts" in out
    assert "Split of the run's corpus" in out and "(--num-t-samples)" in out
    with pytest.raises(SystemExit):
        main(["eval", "--help"])
    out = capsys.readouterr().out
    assert "eval.num_t_samples" in out and "--num-t-samples N" in out and "[eval.num_t_samples]" in out
    for cls, section in ((SampleOptions, "sample"), (EvalOptions, "eval"), (ProbeOptions, "probe")):
        assert all(f.name for f in dataclasses.fields(cls))
        from seqdiff.options import options_help

        docs = options_help(cls)
        missing = [f.name for f in dataclasses.fields(cls) if not docs.get(f.name)]
        assert not missing, f"{section}: fields without a docstring: {missing}"


@pytest.mark.parametrize("command, what", [("sample", "samples"), ("eval", "results"), ("score", "scores")])
def test_an_interrupted_sample_eval_or_score_says_nothing_was_written(command, what, monkeypatch, capsys, tmp_path):
    """They write their output once, at the end (atomically): Ctrl-C leaves nothing, and the message says so."""
    from seqdiff import cli

    def stopped(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, f"cmd_{command}", stopped)
    assert main([command, str(tmp_path / "run")]) == 130
    assert capsys.readouterr().err == (f"seqdiff {command}: interrupted; nothing was written (the {what} are written "
                                       "once all are done)\n")
