"""`seqdiff sample --reference`: FASTA references (plain, gzip, bgzip) keep their records apart."""

import gzip
import random

import pytest

from seqdiff.cli import _read_reference
from seqdiff.evaluation.metrics import dna_metrics
from seqdiff.samplers import SamplerError


def test_reference_fasta_records_are_kept_apart(tmp_path):
    fa = tmp_path / "ref.fa"
    fa.write_text(">a first\nACGTAC\nGG\n>b\nTTTA\n")
    assert _read_reference(str(fa)) == "ACGTACGG|TTTA"
    gz = tmp_path / "ref.fa.gz"
    gz.write_bytes(gzip.compress(fa.read_bytes()))
    assert _read_reference(str(gz)) == "ACGTACGG|TTTA"
    plain = tmp_path / "ref.txt"
    plain.write_text("ACGT\nTTGA\n")
    assert _read_reference(str(plain)) == "ACGTTTGA"
    # no 2-mer spans the two records: GT is absent from "GG" + "TT" joined by the separator
    m = dna_metrics(["GT"], reference=_read_reference(str(fa)), ks=[2])
    ref_2mers = ["AC", "CG", "GT", "TA", "AC", "CG", "GG", "TT", "TT", "TA"]  # brute force, per record
    assert m["kmer_tv_k2"] == pytest.approx(1 - ref_2mers.count("GT") / len(ref_2mers))


def test_reference_errors_name_the_file(tmp_path):
    with pytest.raises(SamplerError, match="cannot read --reference .*nope.fa"):
        _read_reference(str(tmp_path / "nope.fa"))
    cut = tmp_path / "cut.fa.gz"
    bases = bytes(random.Random(0).choices(b"ACGT", k=20_000))  # incompressible enough to cut in the middle
    cut.write_bytes(gzip.compress(b">r\n" + bases)[:-100])
    with pytest.raises(SamplerError, match="cut.fa.gz.*truncated"):
        _read_reference(str(cut))
    empty = tmp_path / "empty.fa"
    empty.write_text(">r\n")
    with pytest.raises(SamplerError, match="holds no sequence"):
        _read_reference(str(empty))


def test_a_reference_that_is_not_dna_is_refused_naming_the_character(tmp_path):
    text = tmp_path / "play.txt"
    text.write_text("ACGT\nto be or not\n")
    with pytest.raises(SamplerError, match=r"play.txt is not a DNA sequence: character 'o' at position 6"):
        _read_reference(str(text))
    lower = tmp_path / "soft.txt"
    lower.write_text("acgtNNryACGT\n")  # soft-masked, N and IUPAC letters are DNA
    assert _read_reference(str(lower)) == "acgtNNryACGT"
