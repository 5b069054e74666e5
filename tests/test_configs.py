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
])
def test_bad_overrides_name_the_key(override, message):
    with pytest.raises(ConfigError, match=message):
        load_run_config(None, [override])


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
