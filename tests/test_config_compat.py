"""Old runs keep loading (issue 20 items 4 and 6): the config.yaml and checkpoint hyper_parameters written by
the release with flat data.* keys (tests/fixtures/release_runs) resolve to the same values in data.text /
data.fasta; old override spellings still work; an old key given with its new spelling is refused."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from seqdiff.config import (
    LEGACY_DATA_KEYS,
    ConfigError,
    DataConfig,
    RunConfig,
    from_dict,
    load_run_config,
    to_dict,
)
from seqdiff.training.resume import recipe_changes

FIXTURES = Path(__file__).parent / "fixtures" / "release_runs"
ROOT = Path(__file__).resolve().parents[1]


def _resolved(data: DataConfig, old_key: str):
    """Where an old flat data.* key lives now."""
    if old_key in LEGACY_DATA_KEYS:
        part, key = LEGACY_DATA_KEYS[old_key]
        return getattr(getattr(data, part), key)
    return getattr(data, old_key)


@pytest.mark.parametrize("kind", ["text", "fasta"])
def test_release_config_yaml_loads_to_the_same_values(kind):
    path = FIXTURES / f"{kind}_config.yaml"
    saved = yaml.safe_load(path.read_text())
    assert "block_mode" in saved["data"] and isinstance(saved["data"]["fasta"], (str, type(None)))  # old layout
    config = load_run_config(path)
    assert config.data.kind == kind
    for key, value in saved["data"].items():
        assert _resolved(config.data, key) == value, key
    for section in ("model", "method", "train", "sample"):  # every saved key reads back; new keys take defaults
        resolved = to_dict(getattr(config, section))
        assert {k: resolved[k] for k in saved[section]} == saved[section], section
    # written again, it is the new layout, and that loads to the same config
    again = yaml.safe_load(yaml.safe_dump(to_dict(config)))
    assert set(again["data"]["text"]) == {"block_mode", "documents", "detokenizer", "cache", "cache_min_bytes",
                                          "tokenize_workers"}
    assert "block_mode" not in again["data"] and again["data"]["fasta"]["path"] == saved["data"]["fasta"]
    assert from_dict(RunConfig, again) == config


@pytest.mark.parametrize("kind", ["text", "fasta"])
def test_release_checkpoint_hparams_load_and_resume_without_changes(kind):
    hp = yaml.safe_load((FIXTURES / f"{kind}_hparams.yaml").read_text())
    config = load_run_config(FIXTURES / f"{kind}_config.yaml")
    assert from_dict(DataConfig, hp["data"], prefix="data.") == config.data
    # --resume compares the old checkpoint's recipe with today's: nothing may look changed
    assert recipe_changes(hp, config, hp["tokenizer"]) == {}
    # and a real change in a moved key is still seen, under its new name
    moved = load_run_config(FIXTURES / f"{kind}_config.yaml", ["data.text.block_mode=padded"])
    assert recipe_changes(hp, moved, hp["tokenizer"]) == {"data.text.block_mode": ("stream", "padded")}


def test_old_override_spellings_map_to_the_new_keys():
    config = load_run_config(None, ["data.kind=fasta", "data.tokenizer=nucleotide", "data.fasta=/x/genome.fa",
                                    "data.split_mode=bed", "data.bed=/x/s.bed", "data.rc_augment=false",
                                    "data.block_mode=padded", "data.cache=false", "data.block_size=700"])
    assert config.data.fasta.path == "/x/genome.fa" and config.data.fasta.split_mode == "bed"
    assert config.data.fasta.bed == "/x/s.bed" and config.data.fasta.rc_augment is False
    assert config.data.fasta.block_size == 700
    assert config.data.text.block_mode == "padded" and config.data.text.cache is False
    # old-spelled recipe + new-spelled override, and the reverse
    fasta = FIXTURES / "fasta_config.yaml"
    assert load_run_config(fasta, ["data.fasta.path=/y.fa"]).data.fasta.path == "/y.fa"
    assert load_run_config(fasta, ["data.fasta=/z.fa"]).data.fasta.path == "/z.fa"
    assert load_run_config(fasta, ["data.fasta.split_seed=3"]).data.fasta.split_seed == 3


def test_an_old_key_with_its_new_spelling_is_refused_naming_both():
    with pytest.raises(ConfigError, match=r"data\.block_mode .*data\.text\.block_mode"):
        from_dict(RunConfig, {"data": {"block_mode": "padded", "text": {"block_mode": "wrapped"}}})
    with pytest.raises(ConfigError, match=r"data\.split_mode .*data\.fasta\.split_mode"):
        from_dict(RunConfig, {"data": {"split_mode": "bed", "fasta": {"split_mode": "blocks"}}})


def test_validation_names_the_new_keys():
    with pytest.raises(ConfigError, match=r"data\.fasta\.valid_fraction must lie in"):
        load_run_config(None, ["data.valid_fraction=2"])
    with pytest.raises(ConfigError, match=r"unknown config key data\.text\.nope"):
        load_run_config(None, ["data.text.nope=1"])


def test_config_keys_lists_the_new_keys():
    """Also: building the command table loads no training stack (Lightning takes seconds to import, and every
    `seqdiff` command, --help included, builds the table first)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "seqdiff.cli", "config", "--keys"],
                          capture_output=True, text=True, env=env, check=True)
    loaded = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time")}
    heavy = loaded & {"lightning", "transformers", "seqdiff.training.module"}
    assert not heavy, heavy
    out = done.stdout
    for key in ("data.text.block_mode", "data.text.cache_min_bytes", "data.fasta.path", "data.fasta.split_mode",
                "data.fasta.keep_soft_mask", "data.seq_len"):
        assert f"  {key} " in out, key
    assert "  data.block_mode " not in out and "  data.fasta " not in out
