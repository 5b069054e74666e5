"""Sampler options a run would ignore are refused: every sampler declares the sample.* keys it reads (`reads`),
checked here against what it really reads (its options_from_config, and whether `steps` changes its draws), and
`seqdiff sample` / `seqdiff eval` refuse in one line, before any work, an option the user gave that the chosen
sampler (or the eval mode) would silently ignore; the run's saved sample.* defaults never trigger a refusal."""

from __future__ import annotations

import dataclasses
import shutil

import pytest
import torch
import yaml

from seqdiff.cli import main
from seqdiff.config import MethodConfig, ModelConfig, SampleConfig, from_dict
from seqdiff.methods import build_model
from seqdiff.options import SampleOptions, options_help
from seqdiff.samplers import SAMPLERS, build_sampler, sampler_keys, samplers_reading
from seqdiff.tokenizers import CharTokenizer
from tests.test_cli import FIXTURE, TINY


# ---------------------------------------------------------------------------------------------- declarations
class RecordingConfig:
    """A SampleConfig (all defaults) that records which fields are read."""

    def __init__(self) -> None:
        self.read: set[str] = set()
        self.config = SampleConfig()

    def __getattr__(self, key: str):
        self.read.add(key)
        return getattr(self.config, key)


@pytest.mark.parametrize("name", sorted(SAMPLERS))
def test_reads_is_what_options_from_config_reads(name):
    """The SampleConfig keys a sampler declares (less `steps`, which build_sampler hands every sampler) are exactly
    those its options_from_config reads; the others it declares are SampleOptions keys the command hands it."""
    cls = SAMPLERS[name]
    recorder = RecordingConfig()
    cls.options_from_config(recorder)
    config_keys = {f.name for f in dataclasses.fields(SampleConfig)}
    assert recorder.read <= cls.reads, f"{name} reads {sorted(recorder.read - cls.reads)} without declaring them"
    assert recorder.read == (cls.reads & config_keys) - {"steps"}
    assert cls.reads <= {f.name for f in dataclasses.fields(SampleOptions)}
    assert cls.uses_steps == ("steps" in cls.reads)


def test_every_sampler_option_is_documented_for_its_sampler():
    """A field documented `sampler X: ...` is one X declares, and every key some sampler declares (beyond steps) is
    documented that way: a new sampler option cannot be added without saying who reads it."""
    docs = options_help(SampleOptions)
    documented = {key: doc.split()[1].rstrip(":,") for key, doc in docs.items() if doc.startswith("sampler ")}
    for key, sampler in documented.items():
        assert key in SAMPLERS[sampler].reads, (key, sampler)
    assert set(documented) == sampler_keys() - {"steps"}


_MODELS: dict[str, tuple] = {}


def _tiny(method_name: str):
    """A random tiny (method, backbone) for `method_name`, built once."""
    if method_name not in _MODELS:
        torch.manual_seed(0)
        extra = {"block_size": 4} if method_name == "bd3lm" else {}
        method, backbone, _ = build_model(from_dict(ModelConfig, {"preset": "test", "max_seq_len": 16}),
                                          MethodConfig(name=method_name, **extra),
                                          CharTokenizer(alphabet="abc", normalize="none"))
        _MODELS[method_name] = (method, backbone.eval())
    return _MODELS[method_name]


def _zero_energy(x, xt, log_mu, chunk=None):
    return torch.zeros(x.shape[0], dtype=torch.float64)


@pytest.mark.parametrize("name", sorted(SAMPLERS))
def test_steps_changes_the_draws_exactly_when_declared(name):
    """Same seed, 2 against 7 steps: a sampler that declares `steps` draws other tokens (or makes other calls), one
    that does not draws the very same tokens with the same calls."""
    cls = SAMPLERS[name]
    method, backbone = _tiny(cls.methods[0])
    options = {"energy": _zero_energy} if "energy" in cls.reads else {}
    outs = [build_sampler(name, method, backbone, steps=steps, **options).generate(3, 8, torch.Generator()
                                                                                     .manual_seed(0))
            for steps in (2, 7)]
    same = torch.equal(outs[0].tokens, outs[1].tokens) and outs[0].num_denoiser_calls == outs[1].num_denoiser_calls
    assert same == ("steps" not in cls.reads)


def test_samplers_reading_names_what_the_user_passes():
    assert samplers_reading("threshold") == ["threshold"]
    assert samplers_reading("steps", "ar") == []
    assert samplers_reading("steps", "bd3lm") == ["bd3lm", "bd3lm_uncached", "confidence", "remdm"]
    assert samplers_reading("energy", "mdlm") == ["edlm"]


# ---------------------------------------------------------------------------------------------- the commands
@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Tiny MDLM and AR runs whose config.yaml saves sample.* keys that their default samplers do not read."""
    root = tmp_path_factory.mktemp("option_runs")
    assert main(["train", "--run-dir", str(root / "mdlm"), *TINY, "method.name=mdlm", "sample.steps=4",
                 "sample.threshold=0.5", "sample.remdm_eta=0.1", "sample.num_samples=2", "sample.seq_len=16"]) == 0
    assert main(["train", "--run-dir", str(root / "ar"), *TINY, "method.name=ar", "sample.steps=64",
                 "sample.num_samples=2", "sample.seq_len=16"]) == 0
    return root


def _refused(capsys, argv) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("error:") == 1 and "\n" not in err, err
    return err.split("error: ", 1)[1]


@pytest.mark.parametrize("argv,message", [
    (["--sampler", "cached", "--threshold", "0.5"],
     "--threshold 0.5 is read by --sampler threshold only (this run samples with cached, which would ignore it)"),
    (["--threshold", "0.5"],
     "--threshold 0.5 is read by --sampler threshold only (this run samples with cached, the default for mdlm "
     "models, which would ignore it)"),
    (["--sampler", "first_hitting", "--steps", "8"],
     "--steps 8 is read by --sampler ancestral, cached, confidence, edlm, remdm only (this run samples with "
     "first_hitting, which would ignore it)"),
    (["--sampler", "threshold", "sample.steps=8"],
     "sample.steps=8 is read by --sampler ancestral, cached, confidence, edlm, remdm only (this run samples with "
     "threshold, which would ignore it)"),
    (["--sampler", "confidence", "--remdm-eta", "0.3", "--threshold", "0.5"],
     "--remdm-eta 0.3 is read by --sampler remdm only; --threshold 0.5 is read by --sampler threshold only (this "
     "run samples with confidence, which would ignore them)"),
    (["--sampler", "cached", "--edlm-k", "3"],
     "--edlm-k 3 is read by --sampler edlm only (this run samples with cached, which would ignore it)"),
])
def test_an_option_the_mdlm_sampler_ignores_is_refused(runs, capsys, argv, message):
    assert _refused(capsys, ["sample", str(runs / "mdlm"), *argv]) == message


def test_energy_is_refused_for_any_sampler_but_edlm(runs, capsys):
    err = _refused(capsys, ["sample", str(runs / "mdlm"), "--sampler", "cached", "--energy", f"ar:{runs / 'ar'}"])
    assert err == (f"--energy ar:{runs / 'ar'} is read by --sampler edlm only (this run samples with cached, which "
                   f"would ignore it)")
    err = _refused(capsys, ["sample", str(runs / "mdlm"), "--energy", f"ar:{runs / 'ar'}"])
    assert "--sampler edlm only" in err and "cached, the default for mdlm models" in err


@pytest.mark.parametrize("argv,message", [
    (["--steps", "64"], "--steps 64 is read by no sampler of ar models (this run samples with ar, the default for "
                        "ar models, which would ignore it)"),
    (["--sampler", "ar", "sample.threshold=0.5"],
     "sample.threshold=0.5 is read by no sampler of ar models (this run samples with ar, which would ignore it)"),
])
def test_an_option_the_ar_sampler_ignores_is_refused(runs, capsys, argv, message):
    assert _refused(capsys, ["sample", str(runs / "ar"), *argv]) == message


def test_the_refusal_comes_before_the_checkpoint_loads(runs, tmp_path, capsys, monkeypatch):
    """A run directory's config.yaml names the method: refused before the weights load. Without one (a bare
    checkpoint folder) the loaded model's method decides, still before any sampling."""
    import seqdiff.checkpoint

    def no_loading(*args, **kwargs):
        raise AssertionError("the checkpoint was loaded")

    with monkeypatch.context() as patch:
        patch.setattr(seqdiff.checkpoint, "load_checkpoint", no_loading)
        assert "--steps 64 is read by no sampler" in _refused(capsys, ["sample", str(runs / "ar"), "--steps", "64"])
    bare = tmp_path / "bare"
    shutil.copytree(runs / "ar", bare)
    (bare / "config.yaml").unlink()
    assert "--steps 64 is read by no sampler of ar models" in _refused(capsys, ["sample", str(bare), "--steps",
                                                                                 "64"])


def test_the_runs_saved_sampler_is_named(runs, tmp_path, capsys):
    run = tmp_path / "remdm"
    shutil.copytree(runs / "mdlm", run)
    config = yaml.safe_load((run / "config.yaml").read_text())
    config["sample"]["sampler"] = "remdm"
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    assert _refused(capsys, ["sample", str(run), "--threshold", "0.5"]) == (
        "--threshold 0.5 is read by --sampler threshold only (this run samples with remdm, the run's saved "
        "sample.sampler, which would ignore it)")


@pytest.mark.parametrize("run,argv,label", [
    ("mdlm", ["--sampler", "threshold", "--threshold", "0.5"], "threshold sampler"),  # the option where it is read
    ("mdlm", ["--sampler", "remdm", "--remdm-eta", "0.1", "--steps", "4"], "remdm sampler"),
    ("mdlm", ["--sampler", "first_hitting"], "first_hitting sampler"),  # saved steps, threshold, remdm_eta: defaults
    ("mdlm", [], "cached sampler"),
    ("ar", [], "ar sampler"),  # the saved sample.steps=64 is a default, not a request
    ("ar", ["--temperature", "0.8", "--top-p", "0.9", "--seed", "3", "--batch-size", "1", "--prompt", "to"],
     "ar sampler"),  # general options: every sampler reads them
])
def test_options_the_sampler_reads_and_saved_defaults_are_accepted(runs, capsys, run, argv, label):
    assert main(["sample", str(runs / run), *argv]) == 0
    captured = capsys.readouterr()
    assert captured.out.count("=== sample") == 2 and f"({label}, " in captured.err


def test_eval_refuses_num_t_samples_where_no_time_is_drawn(runs, tmp_path, capsys):
    text = tmp_path / "slice.txt"  # an order costs a forward per token: a short slice
    text.write_text(open(FIXTURE).read()[:300])
    mdlm, ar = str(runs / "mdlm"), str(runs / "ar")
    assert _refused(capsys, ["eval", mdlm, "--data", str(text), "--order", "left_to_right", "--num-t-samples",
                             "2"]) == ("--num-t-samples 2 is read by the NELBO only (this run scores --order "
                                       "left_to_right, which would ignore it)")
    assert _refused(capsys, ["eval", ar, "--num-t-samples", "2"]) == (
        "--num-t-samples 2 is read by the NELBO of diffusion models only (this ar model's likelihood is exact, "
        "which would ignore it)")
    assert "eval.num_t_samples=2 is read by the NELBO of diffusion" in _refused(
        capsys, ["eval", ar, "eval.num_t_samples=2"])
    out = tmp_path / "eval.json"
    assert main(["eval", mdlm, "--data", str(text), "--num-t-samples", "2", "--out", str(out)]) == 0  # the NELBO
    assert main(["eval", ar, "--data", str(text), "--out", str(out)]) == 0


def test_an_overlap_without_semi_autoregressive_blocks_is_refused(runs, capsys):
    """--overlap shapes the blocks of a sample longer than the context; where there are none it would be ignored."""
    mdlm = str(runs / "mdlm")  # context 64, samples of 16 saved
    assert _refused(capsys, ["sample", mdlm, "--overlap", "4"]) == (
        "--overlap 4 sets the overlap of semi-autoregressive blocks, and this sample has none (16 tokens fit the "
        "model's context of 64 in one pass)")
    assert "(64 tokens fit the model's context of 64 in one pass)" in _refused(
        capsys, ["sample", mdlm, "--length", "64", "sample.overlap=8"])
    assert main(["sample", mdlm, "--length", "100", "--overlap", "8", "--steps", "2"]) == 0  # in blocks: read
    assert capsys.readouterr().out.count("=== sample") == 2
