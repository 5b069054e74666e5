"""Every command that reads a user's FASTA checks it with the one function, seqdiff.data.genome.check_fasta: the
same malformed file gets the same one-line error (exit 2, no traceback) from `train` (data.fasta.path), `score
--fasta`, `eval --data` and `sample --infill-file`, before anything is written (no run directory, no .fai, no
indexable copy, no results file). What a FASTA may hold (lowercase, N, IUPAC codes, CRLF, ragged lines, comments)
keeps being accepted."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from seqdiff.cli import main
from seqdiff.data import genome as G
from seqdiff.sources import data_dir
from tests.test_genome import records, write_fasta
from tests.test_variants import TOK, save_checkpoint

FIXTURE = Path(__file__).parent / "fixtures" / "grch37_chr20_slices.fa"

MALFORMED = {  # name: (bytes, the problem the one error line names)
    "empty_header": (b">\nACGT\n", "record 1 has an empty header line (line 1)"),
    "empty_header_later": (b">a\nACGT\n>b\nAC\n>  \nACGT\n", "record 3 has an empty header line (line 5)"),
    "duplicate_names": (b">a\nACGT\n>a\nACGT\n", "record names are not unique: 'a' names records 1 and 2"),
    "all_n": (b">a\n" + b"N" * 4_990 + b"nnnnRYKMSW\n", "every base is N (IUPAC codes are read as N)"),
    "bad_character": (b">a\nACGT\n>b\nACGTAC\nGTXCA*\n",
                      "record b, position 9: character 'X' is not a nucleotide or IUPAC code (2 such characters"),
    "text_before_header": (b"ACGT\n>a\nACGT\n", "not a FASTA file (it must start with a '>' header line)"),
    "not_ascii": (b">a\nACGT\nAC\xe9T\n", "line 3, column 3: byte 0xe9 is not ASCII"),
    "no_bases": (b">a\n>b\n", "holds no sequence: its records are empty"),
}
SAMPLE_OK = {"all_n"}  # N marks the positions an infill fills: an all-N infill file is a request, not an error
VARIANTS = "chrom\tpos\tref\talt\na\t2\tC\tT\n"


@pytest.fixture(scope="module")
def dna_checkpoint(tmp_path_factory) -> Path:
    return save_checkpoint(tmp_path_factory.mktemp("fasta_errors") / "dna.ckpt", TOK)


def snapshot(*folders: Path) -> set[str]:
    return {str(p) for folder in folders if folder.exists() for p in folder.rglob("*")}


def command(name: str, fasta: Path, checkpoint: Path, work: Path) -> list[str]:
    if name == "train":
        return ["train", "--run-dir", str(work / "run"), "data.kind=fasta", "data.tokenizer=nucleotide",
                f"data.fasta.path={fasta}", "model.preset=test", "data.seq_len=16", "model.max_seq_len=16",
                "data.batch_size=2", "train.max_steps=1", "train.progress_bar=false"]
    if name == "score":
        (work / "v.tsv").write_text(VARIANTS)
        return ["score", str(checkpoint), "--fasta", str(fasta), "--variants", str(work / "v.tsv"), "--out",
                str(work / "scores.tsv")]
    if name == "eval":
        return ["eval", str(checkpoint), "--data", str(fasta), "--out", str(work / "eval.json")]
    return ["sample", str(checkpoint), "--infill-file", str(fasta), "--num-samples", "1", "--steps", "2", "--out",
            str(work / "samples.fa")]


# an all-N infill file asks for every base: not a case for sample (accepted: test_read_sequence_file below)
@pytest.mark.parametrize("cmd, name", [(cmd, name) for cmd in ("train", "score", "eval", "sample")
                                       for name in sorted(MALFORMED) if not (cmd == "sample" and name in SAMPLE_OK)])
def test_each_command_refuses_a_malformed_fasta_in_one_line_and_writes_nothing(cmd, name, dna_checkpoint,
                                                                               tmp_path, capsys):
    content, problem = MALFORMED[name]
    fasta = tmp_path / "in" / f"{name}.fa"
    fasta.parent.mkdir()
    fasta.write_bytes(content)
    with pytest.raises(G.GenomeError) as direct:  # the one check, called directly
        G.check_fasta(fasta)
    expected = str(direct.value)
    assert expected.startswith(str(fasta)) and problem in expected
    work = tmp_path / "work"
    work.mkdir()
    argv = command(cmd, fasta, dna_checkpoint, work)
    before = snapshot(tmp_path, data_dir())
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"seqdiff {cmd}: error: {expected}"], err
    assert snapshot(tmp_path, data_dir()) == before  # no run dir, .fai, indexable copy or output file


def test_a_bgzip_file_is_checked_like_the_plain_one(tmp_path):
    from Bio import bgzf

    plain = tmp_path / "dup.fa"
    plain.write_bytes(MALFORMED["duplicate_names"][0])
    packed = tmp_path / "dup.fa.gz"
    with bgzf.BgzfWriter(str(packed), "wb") as f:
        f.write(plain.read_bytes())
    with pytest.raises(G.GenomeError, match=r"dup.fa.gz: record names are not unique: 'a' names records 1 and 2"):
        G.open_fasta(packed)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dup.fa", "dup.fa.gz"]  # no .fai / .gzi written


def test_what_a_fasta_may_hold_is_still_accepted_everywhere(tmp_path):
    """Lowercase, N and IUPAC codes, CRLF, ragged and blank lines, spaces at line ends, ';' comments and
    descriptions: the check accepts them, and every reader returns the same bases."""
    seqs = records(FIXTURE)
    names = list(seqs)[:2]
    lines = ["; made by hand"]
    for k, name in enumerate(names):
        seq = seqs[name][:5_000].lower() + "RYKM" + seqs[name][5_000:9_000]
        lines.append(f">{name} a description")
        i, widths = 0, [60, 61, 13, 70]
        while i < len(seq):
            w = widths[(i // 60 + k) % len(widths)]
            lines.append(seq[i:i + w] + ("  " if i % 3 == 0 else ""))
            i += w
        lines.append("")
    path = tmp_path / "mixed.fa"
    path.write_bytes("\r\n".join(lines).encode() + b"\r\n")
    summary = G.check_fasta(path)
    want = {name: seqs[name][:5_000].lower() + "RYKM" + seqs[name][5_000:9_000] for name in names}
    assert summary.lengths == {name: len(s) for name, s in want.items()}
    assert summary.scored == sum(len(s) - sum(c in "NnRYKM" for c in s) for s in want.values())
    assert [(n, s.decode()) for n, s in G.read_fasta_records(path)] == list(want.items())
    ids, mask = G.fasta_tokens(path, TOK)
    assert TOK.decode(ids) == "".join(want.values()).upper().translate(str.maketrans("RYKM", "NNNN"))
    handle = G.open_fasta(path)  # (read through a re-wrapped copy: the lines vary in length)
    assert {n: handle.sequence(n, 0, handle.length(n)) for n in names} == want
    assert G.read_sequence_file(path) == "".join(want.values())


@pytest.mark.parametrize("block", [5, 7, 64, 1 << 22])
def test_blocks_of_any_size_give_the_same_answer(tmp_path, monkeypatch, block):
    """The file is read in blocks that end at a line end; a line longer than a block (a chromosome on one line),
    a header or a bad character at a block edge give the same records, positions and line numbers."""
    monkeypatch.setattr(G, "_FASTA_BLOCK", block)
    good = tmp_path / "good.fa"
    good.write_bytes(b">r1 x\nACGTACGTACGTACGTACGTNNNNacgt\n\n>r2\nAC\nGT\n;note\n>r3\n" + b"ACGT" * 40 + b"\n")
    assert G.read_fasta_records(good) == [("r1", b"ACGTACGTACGTACGTACGTNNNNacgt"), ("r2", b"ACGT"),
                                          ("r3", b"ACGT" * 40)]
    assert G._scan_fasta(good, keep=False)[0].scored == 24 + 4 + 160
    bad = tmp_path / "bad.fa"
    bad.write_bytes(b">r1\nACGTACGTAC\nGTACGTACGT\n>r2\nACGTACGTACGTACGTACGTAC?GT\n")
    with pytest.raises(G.GenomeError, match=r"record r2, position 23: character '\?'"):
        G.check_fasta(bad)
    late = tmp_path / "late.fa"
    late.write_bytes(b">r1\nACGTACGTAC\nGTACGTACGT\n\n>r2\nACGT\n>\nACGT\n")
    with pytest.raises(G.GenomeError, match=r"record 3 has an empty header line \(line 7\)"):
        G.check_fasta(late)


def test_read_sequence_file_for_infill(tmp_path):
    """--infill-file of a DNA model: plain lines are joined as before; a FASTA is checked (N allowed: N marks the
    positions to fill)."""
    plain = tmp_path / "infill.txt"
    plain.write_text("ACGTNNNN\r\nnnTT\n")
    assert G.read_sequence_file(plain) == "ACGTNNNNnnTT"
    fasta = write_fasta(tmp_path / "masked.fa", {"x": "N" * 100})
    assert G.read_sequence_file(fasta) == "N" * 100
    gz = tmp_path / "masked.fa.gz"
    gz.write_bytes(gzip.compress(fasta.read_bytes()))
    assert G.read_sequence_file(gz) == "N" * 100
    for name in ("empty_header", "duplicate_names", "text_before_header", "bad_character", "not_ascii"):
        path = tmp_path / f"{name}.fa"
        path.write_bytes(MALFORMED[name][0])
        with pytest.raises(G.GenomeError, match=rf"{name}.fa: .*{MALFORMED[name][1][:25]}".replace("(", r"\(")):
            G.read_sequence_file(path)


def test_a_large_file_is_checked_once_across_commands(tmp_path, monkeypatch):
    """A genome's check is one streamed pass: its summary is kept under the data directory, per file version, so
    the next command (a new process) does not read the file again; an edited file is checked afresh."""
    monkeypatch.setattr(G, "_STAMP_MIN_BYTES", 0)
    path = write_fasta(tmp_path / "genome.fa", {"c1": "ACGT" * 50, "c2": "N" * 10 + "GG"})
    first = G.check_fasta(path)
    assert list((data_dir() / "fasta-checked").glob("genome.fa-*.json"))
    G._CHECKED.clear()  # as a new process

    def no_pass(*args, **kwargs):
        raise AssertionError("the file was read again")

    monkeypatch.setattr(G, "_scan_fasta", no_pass)
    assert G.check_fasta(path) == first
    monkeypatch.undo()
    monkeypatch.setattr(G, "_STAMP_MIN_BYTES", 0)
    path.write_bytes(b">\nACGT\n")  # edited: another size, another version
    with pytest.raises(G.GenomeError, match="empty header line"):
        G.check_fasta(path)
