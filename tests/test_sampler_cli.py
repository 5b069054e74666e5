"""The new samplers from `seqdiff sample` (options passed through, labels printed, bad input refused in one
line naming the flag), and help texts that list registry keys generated from the registries."""

import dataclasses

import pytest

from seqdiff.cli import build_parser, main
from seqdiff.config import ConfigError, RunConfig, SampleConfig, field_help
from seqdiff.samplers import SAMPLERS
from tests.test_cli import TINY


@pytest.fixture(scope="module")
def run_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("sampler_runs")
    for name in ("mdlm", "ar"):
        assert main(["train", "--run-dir", str(root / name), *TINY, f"method.name={name}"]) == 0
    return root


@pytest.mark.parametrize("argv,label", [
    (["--sampler", "first_hitting"], "first_hitting sampler, exact"),
    (["--sampler", "remdm", "--remdm-schedule", "loop", "--remdm-eta", "0.1", "--steps", "12"],
     "remdm sampler, approximate"),
    (["--sampler", "remdm", "--remdm-schedule", "conf", "--remdm-eta", "1", "--prompt", "to"],
     "remdm sampler, approximate"),
    (["--sampler", "confidence", "--steps", "5", "--top-p", "0.9"], "confidence sampler, approximate"),
    (["--sampler", "threshold", "--threshold", "0.5"], "threshold sampler, approximate"),
    (["--sampler", "cached", "--steps", "4"], "cached sampler, exact"),
])
def test_new_samplers_from_the_sample_command(run_dirs, capsys, argv, label):
    assert main(["sample", str(run_dirs / "mdlm"), "--num-samples", "2", "--seq-len", "16", *argv]) == 0
    captured = capsys.readouterr()
    assert f"({label})" in captured.err
    assert captured.out.count("\n") >= 2
    if "--prompt" in argv:
        samples = [line for line in captured.out.splitlines() if line and not line.startswith("===")]
        assert len(samples) == 2 and all(line.startswith("to") for line in samples)
    if "remdm" in argv:
        assert "remdm_schedule=" in captured.err


def _error(capsys, argv):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("error:") == 1 and "\n" not in err
    return err


def test_bad_sampler_input_is_refused_in_one_line(run_dirs, capsys):
    mdlm, ar = str(run_dirs / "mdlm"), str(run_dirs / "ar")
    err = _error(capsys, ["sample", ar, "--sampler", "remdm"])
    assert "--sampler remdm" in err and "cannot drive" in err and "['mdlm']" in err
    assert "--remdm-eta" in _error(capsys, ["sample", mdlm, "--sampler", "remdm", "--remdm-eta", "1.5"])
    err = _error(capsys, ["sample", mdlm, "--sampler", "remdm", "--remdm-schedule", "loop", "--remdm-eta", "0.5"])
    assert "--remdm-eta" in err and "alpha_on" in err
    err = _error(capsys, ["sample", mdlm, "--sampler", "remdm", "--remdm-schedule", "nope"])
    assert "--remdm-schedule" in err and "'loop'" in err
    err = _error(capsys, ["sample", mdlm, "--sampler", "remdm", "--remdm-schedule", "loop", "--steps", "3"])
    assert "--steps" in err and "needs --steps >= 4" in err
    for tau in ("0", "1.2"):
        err = _error(capsys, ["sample", mdlm, "--sampler", "threshold", "--threshold", tau])
        assert "--threshold" in err and "(0, 1]" in err
    err = _error(capsys, ["sample", mdlm, "--sampler", "remdm", "--remdm-t-on", "0.01"])
    assert "t_off < t_on" in err


def test_sample_config_validation_names_the_key():
    with pytest.raises(ConfigError, match=r"sample.threshold .*\(0, 1\]"):
        SampleConfig(threshold=0.0)
    with pytest.raises(ConfigError, match=r"sample.remdm_eta .*\[0, 1\]"):
        SampleConfig(remdm_eta=-0.1)
    with pytest.raises(ConfigError, match="sample.remdm_alpha_on"):
        SampleConfig(remdm_alpha_on=1.0)
    with pytest.raises(ConfigError, match="sample.remdm_schedule"):
        SampleConfig(remdm_schedule="nope")


def test_registry_help_is_generated_from_the_registry(monkeypatch):
    doc = field_help(SampleConfig)["sampler"]
    for name, cls in SAMPLERS.items():
        assert f"{name} ({cls.kind()})" in doc
    monkeypatch.setitem(SAMPLERS, "brand_new", SAMPLERS["ancestral"])  # a sampler registered later shows up
    assert "brand_new (exact)" in field_help(SampleConfig)["sampler"]
    sample_help = next(a for a in build_parser()._subparsers._group_actions[0].choices["sample"]._actions
                       if "--sampler" in a.option_strings).help
    assert "brand_new" in sample_help and "first_hitting (exact)" in sample_help
    for section in dataclasses.fields(RunConfig):  # no placeholder is left unfilled anywhere
        cls = type(getattr(RunConfig(), section.name))
        if dataclasses.is_dataclass(cls):
            assert not any("{registry:" in d for d in field_help(cls).values())
    from seqdiff.config import MethodConfig, ModelConfig
    from seqdiff.methods import METHODS

    assert all(name in field_help(MethodConfig)["name"] for name in METHODS)
    assert "dit, bert" in field_help(ModelConfig)["backbone"]
