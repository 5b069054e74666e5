import dataclasses
from pathlib import Path

import pytest

from seqdiff.config import ConfigError, ModelConfig, RunConfig, from_dict, load_run_config, to_dict

CONFIGS = sorted(Path(__file__).resolve().parents[1].glob("configs/**/*.yaml"))


def test_there_are_recipes():
    assert len(CONFIGS) >= 3


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_recipe_loads_and_round_trips(path):
    cfg = load_run_config(path)
    assert isinstance(cfg, RunConfig)
    assert from_dict(RunConfig, to_dict(cfg)) == cfg


def test_quickstart_recipe_file_equals_embedded_default():
    from seqdiff.quickstart import QUICKSTART

    path = next(p for p in CONFIGS if p.name == "quickstart.yaml")
    assert load_run_config(path) == QUICKSTART


def test_preset_fills_and_explicit_keys_win():
    cfg = from_dict(ModelConfig, {"preset": "small"})
    assert (cfg.hidden_size, cfg.n_layers, cfg.n_heads) == (768, 12, 12)
    cfg = from_dict(ModelConfig, {"preset": "small", "n_layers": 3})
    assert cfg.n_layers == 3
    assert from_dict(ModelConfig, {"preset": "medium"}).n_heads == 16
    assert from_dict(ModelConfig, {"preset": "tiny"}).hidden_size == 512


@pytest.mark.parametrize("override, message", [
    ("model.hiden_size=3", "model.hiden_size"),
    ("model.preset=huge", "cpu-small"),
    ("train.lr_schedule=cos", "constant"),
    ("train.max_steps=abc", "train.max_steps must be an integer"),
    ("data.seq_len=0", "data.seq_len"),
    ("model.n_heads=3", "not divisible"),
    ("bogus.key=1", "allowed keys"),
    ("no_equals_sign", "section.key=value"),
    ("train.freeze_backbone_steps=-1", r"train.freeze_backbone_steps must lie in \[0, train.max_steps=1000\], got -1"),
    ("train.freeze_backbone_steps=1001", r"train.freeze_backbone_steps must lie in \[0, train.max_steps=1000\]"),
    ("train.freeze_backbone_steps=1.5", "train.freeze_backbone_steps must be an integer"),
    ("train.backbone_lr_scale=0", r"train.backbone_lr_scale must be a finite number > 0, got 0.*"
                                  r"train.freeze_backbone_steps=train.max_steps"),
    ("train.backbone_lr_scale=-0.1", "train.backbone_lr_scale must be a finite number > 0"),
    ("train.backbone_lr_scale=.inf", "train.backbone_lr_scale must be a finite number, got inf"),
    # sizes that no model has (they trained, or crashed deep inside torch, before these checks)
    ("model.hidden_size=0", r"model.hidden_size must be >= 1, got 0"),
    ("model.n_layers=0", r"model.n_layers must be >= 1, got 0"),
    ("model.n_heads=0", r"model.n_heads must be >= 1, got 0"),
    ("model.mlp_ratio=0", r"model.mlp_ratio must be >= 1, got 0"),
    ("model.cond_dim=0", r"model.cond_dim must be >= 1, got 0"),
    ("model.max_seq_len=0", r"model.max_seq_len must be >= 1, got 0"),
    ("model.dropout=1.5", r"model.dropout is a probability and must lie in \[0, 1\), got 1.5"),
    ("model.dropout=-0.1", r"model.dropout is a probability .* got -0.1"),
    ("model.dropout=1", r"model.dropout is a probability .* got 1"),
    ("train.betas=[0.9]", r"train.betas must be two numbers in \[0, 1\) \(AdamW's beta1, beta2\), got \[0.9\]"),
    ("train.betas=[0.9,1.5]", r"train.betas must be two numbers .* got \[0.9, 1.5\]"),
    ("train.betas=[0.9,0.99,0.999]", r"train.betas must be two numbers"),
    ("train.seed=-1", r"train.seed must lie in \[0, 2\^32\), got -1"),
    ("train.seed=4294967296", r"train.seed must lie in \[0, 2\^32\)"),
    ("train.devices=abc", r"train.devices must be auto, a number of devices >= 1, -1 \(all\), .* got 'abc'"),
    ("train.devices=0", r"train.devices must be auto"),
    ("train.devices=-2", r"train.devices must be auto"),
    ("data.fasta.path=ref.fa", r"data.fasta.path is set but data.kind=text, which does not read it: .*data.kind=fasta"),
    ("data.fasta=ref.fa", r"data.fasta.path is set but data.kind=text"),  # the old flat spelling
    ("data.fasta.bed=splits.bed", r"data.fasta.bed is set but data.kind=text"),
])
def test_bad_overrides_name_the_key(override, message):
    with pytest.raises(ConfigError, match=message):
        load_run_config(None, [override])


@pytest.mark.parametrize("override, value", [
    ("train.devices=auto", "auto"), ("train.devices=2", 2), ("train.devices=-1", -1), ("train.devices=0,1", "0,1"),
    ("train.devices=0,", "0,"), ("train.betas=[0.0,0.5]", [0.0, 0.5]), ("train.seed=4294967295", 4294967295),
])
def test_edge_values_that_lightning_and_torch_take_are_accepted(override, value):
    key = override.split("=")[0].split(".")[1]
    assert getattr(load_run_config(None, [override]).train, key) == value


def test_lp_ft_options_accept_their_bounds():
    cfg = load_run_config(None, ["train.max_steps=10", "train.freeze_backbone_steps=10", "train.backbone_lr_scale=1"])
    assert cfg.train.freeze_backbone_steps == 10 and cfg.train.backbone_lr_scale == 1.0
    assert (RunConfig().train.freeze_backbone_steps, RunConfig().train.backbone_lr_scale) == (0, 1.0)


def test_bad_recipe_files(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_run_config(tmp_path / "missing.yaml")
    (tmp_path / "empty.yaml").write_text("")
    with pytest.raises(ConfigError, match="empty"):
        load_run_config(tmp_path / "empty.yaml")
    (tmp_path / "bad.yaml").write_text("model: [unclosed")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_run_config(tmp_path / "bad.yaml")
    (tmp_path / "bad.yaml").write_text("name: x\nmodel:\n  preset: [cpu-tiny\ntrain:\n  max_steps: 2\n")
    with pytest.raises(ConfigError) as e:
        load_run_config(tmp_path / "bad.yaml")
    assert "\n" not in str(e.value) and "bad.yaml is not valid YAML: line 4, column 6: " in str(e.value)
    (tmp_path / "binary.yaml").write_bytes(b"name: x\n\xd0\xff\x00")
    with pytest.raises(ConfigError, match=r"binary.yaml is not UTF-8 text \(byte 8\)"):
        load_run_config(tmp_path / "binary.yaml")
    with pytest.raises(ConfigError, match=r"override 'data.seq_len=\[1': the value is not valid YAML \(line 1"):
        load_run_config(None, ["data.seq_len=[1"])
    (tmp_path / "typo.yaml").write_text("modle:\n  hidden_size: 8\n")
    with pytest.raises(ConfigError, match=r"typo.yaml.*modle"):
        load_run_config(tmp_path / "typo.yaml")


def test_every_field_has_a_docstring():
    from seqdiff.config import field_help

    for section in dataclasses.fields(RunConfig):
        cls = type(getattr(RunConfig(), section.name))
        if dataclasses.is_dataclass(cls):
            docs = field_help(cls)
            missing = [f.name for f in dataclasses.fields(cls) if f.name not in docs]
            assert not missing, (cls.__name__, missing)


# ------------------------------------------------------------------ method.* keys another method alone reads
@pytest.mark.parametrize("method, key, value, owner", [
    ("mdlm", "block_size", 16, "bd3lm"), ("ar", "clip_min", 0.3, "bd3lm"),
    ("sedd", "clip_search", [[0.3, 0.8]], "bd3lm"), ("mdlm", "graph", "uniform", "sedd"),
    ("bd3lm", "scale_by_sigma", False, "sedd"), ("d3pm", "graph", "uniform", "sedd"),
])
def test_a_key_only_another_method_reads_is_named(method, key, value, owner):
    from seqdiff.methods import build_method, foreign_keys
    from seqdiff.tokenizers import build_tokenizer

    tokenizer = build_tokenizer(RunConfig().data.tokenizer)
    extra = {"num_timesteps": 8} if method == "d3pm" else {}
    config = dataclasses.replace(RunConfig().method, name=method, **extra)
    assert foreign_keys(config, build_method(config, tokenizer)) == []  # the defaults
    config = dataclasses.replace(config, **{key: value})
    assert foreign_keys(config, build_method(config, tokenizer)) == [
        f"method.{key}={value} is read by method.name={owner} only; method.name={method} ignores it"]


def test_a_method_reads_its_own_keys_and_those_of_the_method_it_extends():
    from seqdiff.methods import build_method, foreign_keys
    from seqdiff.tokenizers import build_tokenizer

    tokenizer = build_tokenizer(RunConfig().data.tokenizer)
    bd3lm = dataclasses.replace(RunConfig().method, name="bd3lm", block_size=8, clip_min=0.3, time_sampling="uniform")
    assert foreign_keys(bd3lm, build_method(bd3lm, tokenizer)) == []  # its own, and MDLM's time sampling
    sedd = dataclasses.replace(RunConfig().method, name="sedd", graph="uniform", scale_by_sigma=False)
    assert foreign_keys(sedd, build_method(sedd, tokenizer)) == []


def test_config_warns_of_a_key_the_method_ignores(capsys):
    from seqdiff.cli import main

    assert main(["config", "method.name=mdlm", "method.block_size=16"]) == 0
    assert ("seqdiff: warning: method.block_size=16 is read by method.name=bd3lm only; method.name=mdlm ignores it"
            in capsys.readouterr().err)


def test_the_warning_can_be_left_to_process_zero(capsys):
    """Every process of a multi-process run checks the recipe; train lets only process 0 say what is ignored."""
    from seqdiff.methods import check_trainable
    from seqdiff.tokenizers import build_tokenizer

    config = load_run_config(None, ["method.name=mdlm", "method.block_size=16"])
    tokenizer = build_tokenizer(config.data.tokenizer)
    check_trainable(config, tokenizer, warn=False)
    assert capsys.readouterr().err == ""
    check_trainable(config, tokenizer)
    assert "method.block_size=16 is read by method.name=bd3lm only" in capsys.readouterr().err
