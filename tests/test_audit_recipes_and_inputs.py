"""What a fresh-machine walk through the README's commands found (session 41): a recipe key written twice was
silently dropped, chromosome names and run names that YAML reads as numbers were refused, a recipe's FASTA that
`seqdiff data fetch` provides was said to be missing without saying how to get it, and text saved as UTF-16 was
called a binary file."""

from pathlib import Path

import pytest
import yaml

import seqdiff.data.text_files as text_files
from seqdiff.cli import main
from seqdiff.config import ConfigError, load_yaml
from seqdiff.errors import SeqdiffError

FIXTURE = Path("tests/fixtures/shakespeare_tiny.txt").resolve()


# ------------------------------------------------------------------ 1. a key given twice in a recipe
def test_a_section_given_twice_in_a_recipe_is_refused_naming_both_lines(tmp_path, refused):
    recipe = tmp_path / "twice.yaml"
    recipe.write_text("name: x\nmodel:\n  preset: test\ntrain:\n  max_steps: 1\nmodel:\n  dropout: 0.1\n")
    line = refused(["config", "--config", str(recipe)])
    assert line == (f"seqdiff config: error: config file {recipe} is not valid YAML: line 6, column 1: key 'model' is "
                    "given twice (first on line 2); the second would silently replace the first: merge them into one")
    recipe.write_text("train:\n  lr: 1.0e-3\n  lr: 2.0e-3\n")  # inside a section too
    with pytest.raises(ConfigError, match=r"line 3, column 3: key 'lr' is given twice \(first on line 2\)"):
        load_yaml(recipe)


def test_yaml_merge_keys_may_still_be_overridden(tmp_path):
    recipe = tmp_path / "merge.yaml"
    recipe.write_text("base: &b\n  lr: 1.0e-3\n  max_steps: 5\ntrain:\n  <<: *b\n  lr: 2.0e-3\n")
    assert load_yaml(recipe)["train"] == {"lr": 2.0e-3, "max_steps": 5}


def test_every_shipped_recipe_has_each_key_once():
    for recipe in sorted(Path("configs").glob("*.yaml")):
        assert isinstance(load_yaml(recipe), dict), recipe


# ------------------------------------------------------------------ 2. numbers YAML reads where a string is meant
def test_chromosomes_and_names_written_as_numbers_are_strings(capsys):
    """The shipped GRCh37 FASTA names its record `20`: `data.fasta.chromosomes=[20]` means that record."""
    assert main(["config", "data.kind=fasta", "data.tokenizer=nucleotide", "data.fasta.chromosomes=[20, X]",
                 "data.fasta.valid_chromosomes=[21]", "name=2024"]) == 0
    resolved = yaml.safe_load(capsys.readouterr().out)
    assert resolved["name"] == "2024"
    assert resolved["data"]["fasta"]["chromosomes"] == ["20", "X"]
    assert resolved["data"]["fasta"]["valid_chromosomes"] == ["21"]


@pytest.mark.parametrize(("override", "said"), [("name=on", "name must be a string, got True"),
                                                 ("name=1.5", "name must be a string, got 1.5")])
def test_a_boolean_or_a_fraction_is_still_not_a_string(override, said, refused):
    assert refused(["config", override]).endswith(said)


# ------------------------------------------------------------------ 3. a recipe's FASTA not fetched yet
def test_a_missing_fetchable_fasta_names_the_fetch(tmp_path, monkeypatch, refused):
    data = tmp_path / "data"
    monkeypatch.setenv("SEQDIFF_DATA", str(data))
    run = tmp_path / "run"
    line = refused(["train", "--config", "configs/dna_chr20_cpu_mdlm_rc.yaml", "--run-dir", str(run)])
    assert line == (f"seqdiff train: error: FASTA file {data / 'grch37-chr20' / '20.fa.gz'} does not exist; fetch it "
                    "with `seqdiff data fetch grch37-chr20`")
    assert not run.exists() and not data.exists()


def test_a_missing_fasta_of_ones_own_gets_no_fetch_hint(tmp_path, refused):
    line = refused(["train", "--config", "configs/dna_chr20_cpu_mdlm_rc.yaml", "--run-dir", str(tmp_path / "run"),
                    f"data.fasta.path={tmp_path / 'mine.fa'}"])
    assert line == f"seqdiff train: error: FASTA file {tmp_path / 'mine.fa'} does not exist"


# ------------------------------------------------------------------ 4. UTF-16 text
@pytest.mark.parametrize(("encoding", "name"), [("utf-16", "UTF-16"), ("utf-16-le", "UTF-16LE"),
                                                ("utf-16-be", "UTF-16BE"), ("utf-32", "UTF-32")])
def test_text_saved_as_utf16_is_named_so(encoding, name, tmp_path):
    path = tmp_path / "notes.txt"
    path.write_bytes(FIXTURE.read_text(encoding="utf-8")[:2000].encode(encoding))
    assert text_files.wide_text_encoding(path.read_bytes()) == name
    with pytest.raises(SeqdiffError, match=f"notes.txt: {name} text, not UTF-8: save it as UTF-8"):
        text_files.read_text_file(path)


def test_utf16_training_text_is_refused_before_the_run_is_written(tmp_path, refused):
    path = tmp_path / "mine.txt"
    path.write_text("to be or not to be, that is the question\n" * 50, encoding="utf-16")
    run = tmp_path / "run"
    line = refused(["train", "--run-dir", str(run), "model.preset=test", f"data.train_file={path}",
                    f"data.valid_file={FIXTURE}"])
    assert line == (f"seqdiff train: error: {path}: UTF-16 text, not UTF-8: save it as UTF-8 "
                    "(`iconv -f UTF-16 -t UTF-8` converts it)")
    assert not run.exists()


def test_a_binary_file_is_still_called_binary(tmp_path):
    path = tmp_path / "blob.txt"
    path.write_bytes(bytes(range(1, 40)) + b"\x00\x01\x02\xff" * 10)
    assert text_files.wide_text_encoding(path.read_bytes()) is None
    with pytest.raises(SeqdiffError, match="a NUL byte at byte offset 39 of the file: a binary file"):
        text_files.read_text_file(path)
