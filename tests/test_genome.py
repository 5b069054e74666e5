"""FASTA / BED / windows on real GRCh37 chr20 slices (tests/fixtures/grch37_chr20_slices.*, see README)."""

import gzip
import logging
import os
import shutil
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from experiments import fetch_grch37
from seqdiff.config import ConfigError, DataConfig, FastaDataConfig, load_run_config
from seqdiff.data import build_data_module, data_module_class
from seqdiff.data import genome as G
from seqdiff.data.modules import FastaDataModule
from seqdiff.sources import data_dir
from seqdiff.tokenizers import NucleotideTokenizer, TokenizerError, load_tokenizer

FIXTURES = Path(__file__).parent / "fixtures"
STEM = "grch37_chr20_slices"
N_RECORD = "chr20_55000_95000"  # 5,000 N (end of the chr20 p-telomere gap), then 35,000 bases
GAP_RECORD = "chr20_34892085_34922085"  # 5,000 bases, then 25,000 N (start of a 50 kb assembly gap)
PLAIN_RECORDS = ["chr20_10000000_10030000", "chr20_45000000_45030000"]
TOK = NucleotideTokenizer()


@pytest.fixture
def gdir(tmp_path):
    """A writable copy of the fixtures (FASTA first, so that copied indexes are not older than it)."""
    for suffix in (".fa", ".fa.gz", ".fa.gz.fai", ".fa.gz.gzi", ".bed"):
        shutil.copy(FIXTURES / f"{STEM}{suffix}", tmp_path / f"{STEM}{suffix}")
    return tmp_path


def records(path) -> dict[str, str]:
    """Reference parse of the plain fixture, one line at a time."""
    out, name = {}, None
    for line in Path(path).read_text().splitlines():
        if line.startswith(">"):
            name = line[1:].split()[0]
            out[name] = []
        else:
            out[name].append(line)
    return {k: "".join(v) for k, v in out.items()}


def write_fasta(path, recs: dict[str, str], width: int = 60) -> Path:
    with open(path, "w") as f:
        for name, seq in recs.items():
            f.write(f">{name}\n" + "".join(seq[i:i + width] + "\n" for i in range(0, len(seq), width)))
    return Path(path)


# ---------------------------------------------------------------------------------------------- tokens
def test_vectorized_tokenization_equals_a_loop_on_real_sequence(gdir):
    seq = records(gdir / f"{STEM}.fa")[N_RECORD]
    assert set(seq) == set("ACGTN") and seq[:5000] == "N" * 5000
    lookup = {c: i for i, c in enumerate("ACGTN")}
    expected = np.array([lookup[c] for c in seq])
    raw = np.frombuffer(seq.encode(), dtype=np.uint8)
    enc = G.encode_bases(raw, TOK, "x.fa", N_RECORD)
    np.testing.assert_array_equal(enc.ids, expected)
    np.testing.assert_array_equal(TOK.encode(seq), expected)
    np.testing.assert_array_equal(enc.n_mask, expected == TOK.n_id)
    with pytest.raises(G.GenomeError, match=r"x.fa: record r, position 3: character '\*'"):
        G.encode_bases(np.frombuffer(b"AC*T", dtype=np.uint8), TOK, "x.fa", "r")


def test_n_is_never_scored(gdir):
    fasta = G.open_fasta(gdir / f"{STEM}.fa.gz")
    iv = [G.Interval(N_RECORD, 3_000, 9_000, "test")]  # 2,000 N then 4,000 bases
    tiles = G.TiledGenomeWindows(fasta, iv, 100, TOK, max_n_fraction=1.0)
    for item in tiles:
        ids, lm, am = item["input_ids"], item["loss_mask"], item["attention_mask"]
        assert torch.equal(lm, (ids != TOK.n_id) & am)
    windows = G.RandomGenomeWindows(fasta, iv, 2_100, 8, TOK, seed=1, max_n_fraction=1.0, rc_augment=False)
    batch = windows.batch_at(0)
    assert (batch["input_ids"] == TOK.n_id).any()  # some windows start in the N run
    assert torch.equal(batch["loss_mask"], batch["input_ids"] != TOK.n_id)
    ids, mask = G.fasta_tokens(gdir / f"{STEM}.fa", TOK)
    np.testing.assert_array_equal(mask, ids != TOK.n_id)
    assert 0 < mask.mean() < 1


def test_iupac_read_as_n_and_reported_once_per_file(gdir, caplog):
    seq = list(records(gdir / f"{STEM}.fa")[PLAIN_RECORDS[0]])
    for pos, code in [(100, "R"), (2_000, "y"), (2_001, "K"), (25_000, "W")]:
        seq[pos] = code
    path = write_fasta(gdir / "iupac.fa", {"r1": "".join(seq)})
    with caplog.at_level(logging.WARNING, logger="seqdiff.data.genome"):
        ids, mask = G.fasta_tokens(path, TOK)
        G.fasta_tokens(path, TOK)
        windows = G.RandomGenomeWindows(G.open_fasta(path), [G.Interval("r1", 0, 30_000)], 5_000, 8, TOK, seed=0,
                                        max_n_fraction=1.0)
        for step in range(5):
            windows.batch_at(step)
    lines = [r.getMessage() for r in caplog.records if "IUPAC" in r.getMessage()]
    assert len(lines) == 1 and "4 IUPAC" in lines[0] and "r1:101" in lines[0] and "iupac.fa" in lines[0]
    assert windows.iupac_count > 0
    assert all(ids[p] == TOK.n_id and not mask[p] for p in (100, 2_000, 2_001, 25_000))


def test_soft_mask_uppercased_and_optionally_kept(gdir):
    seq = records(gdir / f"{STEM}.fa")[PLAIN_RECORDS[1]][:3_000]
    soft = seq[:1_000] + seq[1_000:1_500].lower() + seq[1_500:]
    path = write_fasta(gdir / "soft.fa", {"r": soft})
    fasta = G.open_fasta(path)
    iv = [G.Interval("r", 0, 3_000)]
    tiles = G.TiledGenomeWindows(fasta, iv, 1_000, TOK, keep_soft_mask=True)
    item = tiles[1]
    assert TOK.decode(item["input_ids"]) == seq[1_000:2_000]
    assert item["soft_mask"][:500].all() and not item["soft_mask"][500:].any()
    ids, _ = G.fasta_tokens(path, TOK)
    assert TOK.decode(ids) == seq
    windows = G.RandomGenomeWindows(fasta, iv, 3_000, 4, TOK, seed=0, keep_soft_mask=True)
    batch = windows.batch_at(0)
    plain = torch.from_numpy(TOK.encode(seq))
    flag = torch.zeros(3_000, dtype=torch.bool)
    flag[1_000:1_500] = True
    for row, sm in zip(batch["input_ids"], batch["soft_mask"]):
        forward = torch.equal(row, plain)
        assert forward or torch.equal(row, TOK.reverse_complement(plain))
        assert torch.equal(sm, flag if forward else flag.flip(0))


def test_reverse_complement_augmentation_is_step_indexed(gdir):
    fasta = G.open_fasta(gdir / f"{STEM}.fa.gz")
    iv = [G.Interval(c, 0, 30_000) for c in PLAIN_RECORDS]
    aug = G.RandomGenomeWindows(fasta, iv, 256, 32, TOK, seed=3, rc_augment=True)
    plain = G.RandomGenomeWindows(fasta, iv, 256, 32, TOK, seed=3, rc_augment=False)
    a, p = aug.batch_at(7), plain.batch_at(7)
    flipped = [not torch.equal(x, y) for x, y in zip(a["input_ids"], p["input_ids"])]
    assert 0 < sum(flipped) < 32
    for x, y, f in zip(a["input_ids"], p["input_ids"], flipped):
        if f:
            assert torch.equal(x, TOK.reverse_complement(y))
    # the windows come from the reference: each plain row is found in the FASTA
    seqs = records(gdir / f"{STEM}.fa")
    for row in p["input_ids"][:4]:
        assert any(TOK.decode(row) in seqs[c] for c in PLAIN_RECORDS)
    assert torch.equal(aug.batch_at(7)["input_ids"], a["input_ids"])


# ---------------------------------------------------------------------------------------------- windows
def test_n_threshold_for_training_and_evaluation(gdir):
    fasta = G.open_fasta(gdir / f"{STEM}.fa")
    iv = [G.Interval(GAP_RECORD, 0, 30_000), G.Interval(N_RECORD, 0, 40_000)]
    L = 500
    windows = G.RandomGenomeWindows(fasta, iv, L, 16, TOK, seed=0, max_n_fraction=0.1)
    for step in range(20):
        n = (windows.batch_at(step)["input_ids"] == TOK.n_id).float().mean(1)
        assert (n <= 0.1).all()
    tiles = G.TiledGenomeWindows(fasta, iv, L, TOK, max_n_fraction=0.1)
    seqs = records(gdir / f"{STEM}.fa")
    expected = [(i.chrom, s) for i in iv for s in range(i.start, i.end, L)
                if seqs[i.chrom][s:s + L].count("N") <= 0.1 * len(seqs[i.chrom][s:s + L])]
    assert [(c, s) for c, s, _ in tiles.tiles] == expected
    assert tiles.skipped == 25_000 // L + 5_000 // L and all(t["loss_mask"].any() for t in tiles)
    all_n = [G.Interval(GAP_RECORD, 10_000, 30_000)]
    with pytest.raises(G.GenomeError, match="mostly N"):
        G.RandomGenomeWindows(fasta, all_n, L, 2, TOK, seed=0, max_draws=50).batch_at(0)


def test_same_seed_and_step_same_batch_and_workers_keep_step_order(gdir):
    fasta = G.open_fasta(gdir / f"{STEM}.fa.gz")
    iv = G.read_bed(gdir / f"{STEM}.bed", fasta)
    train = [i for i in iv if i.split == "train"]
    data = G.RandomGenomeWindows(fasta, train, 64, 4, TOK, seed=5, start_step=3)
    again = G.RandomGenomeWindows(fasta, train, 64, 4, TOK, seed=5)
    assert torch.equal(data.batch_at(11)["input_ids"], again.batch_at(11)["input_ids"])
    other = G.RandomGenomeWindows(fasta, train, 64, 4, TOK, seed=6)
    assert not torch.equal(other.batch_at(11)["input_ids"], again.batch_at(11)["input_ids"])
    loader = DataLoader(data, batch_size=None, num_workers=2, multiprocessing_context="fork")
    got = [b for _, b in zip(range(6), loader)]
    for k, b in enumerate(got):
        ref = again.batch_at(3 + k)
        assert torch.equal(b["input_ids"], ref["input_ids"]) and torch.equal(b["loss_mask"], ref["loss_mask"])


def test_window_start_is_uniform_over_all_valid_windows(gdir):
    fasta = G.open_fasta(gdir / f"{STEM}.fa")
    iv = [G.Interval(PLAIN_RECORDS[0], 0, 1_000), G.Interval(PLAIN_RECORDS[1], 0, 3_000)]
    data = G.RandomGenomeWindows(fasta, iv, 1_000, 1, TOK, seed=0)
    assert data.total == 1 + 2_001
    assert data.window(0) == (PLAIN_RECORDS[0], 0) and data.window(1) == (PLAIN_RECORDS[1], 0)
    assert data.window(2_001) == (PLAIN_RECORDS[1], 2_000)


class _Probe(Dataset):
    """Reads through a FastaHandle opened in the parent process."""

    def __init__(self, handle, regions):
        self.handle, self.regions = handle, regions

    def __len__(self):
        return len(self.regions)

    def __getitem__(self, i):
        chrom, start, end = self.regions[i]
        seq = self.handle.sequence(chrom, start, end)
        return {"pid": os.getpid(), "handle_pid": self.handle._pid, "seq": seq}


def test_each_worker_opens_its_own_handle(gdir):
    fasta = G.open_fasta(gdir / f"{STEM}.fa.gz")
    fasta.sequence(PLAIN_RECORDS[0], 0, 10)  # the parent's handle is open (and would be inherited)
    rng = np.random.default_rng(0)
    regions = [(c, int(s), int(s) + 500) for c in PLAIN_RECORDS for s in rng.integers(0, 29_000, 8)]
    seqs = records(gdir / f"{STEM}.fa")
    loader = DataLoader(_Probe(fasta, regions), batch_size=None, num_workers=2, multiprocessing_context="fork")
    items = list(loader)
    assert len(items) == len(regions)
    pids = {it["pid"] for it in items}
    assert os.getpid() not in pids and len(pids) == 2
    for (c, s, e), it in zip(regions, items):
        assert it["handle_pid"] == it["pid"]
        assert len(it["seq"]) == 500 and it["seq"] == seqs[c][s:e]
    assert fasta._pid == os.getpid()


# ---------------------------------------------------------------------------------------------- splits
def _covered(intervals, length, L, split):
    """Positions covered by any training window or evaluation tile of `split` (brute force)."""
    cover = np.zeros(length, dtype=bool)
    for iv in intervals:
        if iv.split != split:
            continue
        for s in range(iv.start, iv.end - L + 1):  # every training window
            cover[s:s + L] = True
        for s in range(iv.start, iv.end, L):  # every evaluation tile
            cover[s:min(iv.end, s + L)] = True
    return cover


@pytest.mark.parametrize("chrom, block", [(N_RECORD, 2_000), (PLAIN_RECORDS[0], 1_500), (GAP_RECORD, 1_000)])
def test_blocks_never_overlap_across_splits(gdir, chrom, block):
    fasta = G.open_fasta(gdir / f"{STEM}.fa")
    L = 300
    ivs = G.split_by_blocks(fasta, chrom, block, 0.15, 0.15, gap=L, seed=0)
    assert ivs == G.split_by_blocks(fasta, chrom, block, 0.15, 0.15, gap=L, seed=0)
    assert ivs != G.split_by_blocks(fasta, chrom, block, 0.15, 0.15, gap=L, seed=1)
    length = fasta.lengths[chrom]
    cover = {s: _covered(ivs, length, L, s) for s in G.SPLITS}
    positions = {s: np.flatnonzero(c) for s, c in cover.items()}
    assert all(len(p) for p in positions.values())
    for a in G.SPLITS:
        for b in G.SPLITS:
            if a < b:
                assert not (cover[a] & cover[b]).any()
                pa, pb = positions[a], positions[b]
                j = np.clip(np.searchsorted(pb, pa), 1, len(pb) - 1)
                distance = np.minimum(np.abs(pa - pb[j - 1]), np.abs(pa - pb[j])).min()
                assert distance > L  # at least one window length of unused bases between splits
    seq = records(gdir / f"{STEM}.fa")[chrom]
    for iv in ivs:  # mostly-N blocks are dropped
        for s in range(iv.start, iv.end, block):
            assert seq[s:s + block].count("N") <= 0.5 * len(seq[s:s + block])
    if chrom == GAP_RECORD:
        assert max(iv.end for iv in ivs) <= 6_000


def test_blocks_need_enough_blocks(gdir):
    fasta = G.open_fasta(gdir / f"{STEM}.fa")
    with pytest.raises(G.GenomeError, match="usable blocks"):
        G.split_by_blocks(fasta, GAP_RECORD, 2_500, 0.1, 0.1, gap=100)


def test_split_by_chromosome_and_names(gdir):
    seqs = records(gdir / f"{STEM}.fa")
    renamed = dict(zip(["20", "21", "MT", "chr1_gl000191_random"], seqs.values()))
    fasta = G.open_fasta(write_fasta(gdir / "named.fa", renamed))
    ivs = G.split_by_chromosome(fasta, valid=["chr21"], test=["chrM"])
    assert [(i.chrom, i.split) for i in ivs] == [("20", "train"), ("21", "valid"), ("MT", "test")]
    assert ivs[0] == G.Interval("20", 0, 40_000, "train")
    with pytest.raises(G.GenomeError, match=r"'chr22' is not in the FASTA; available: 20, 21, MT"):
        G.split_by_chromosome(fasta, valid=["chr22"], test=["MT"])
    assert fasta.sequence("chr20", 5_000, 5_010) == seqs[N_RECORD][5_000:5_010]
    assert G.resolve_chrom("20", ["chr20", "chr21"]) == "chr20"
    assert G.resolve_chrom("MT", ["chrM"]) == "chrM" and G.resolve_chrom("chrM", ["MT"]) == "MT"
    with pytest.raises(G.GenomeError, match="ambiguous"):
        G.resolve_chrom("chr20", ["20", "CHR20"])


# ---------------------------------------------------------------------------------------------- BED
def test_bed_reading_aliases_and_clipping(gdir, caplog):
    fasta = G.open_fasta(gdir / f"{STEM}.fa")
    bed = gdir / "a.bed"
    bed.write_text(f"# comment\ntrack name=x\n{PLAIN_RECORDS[0]}\t0\t1000\ttraining\n"
                   f"{PLAIN_RECORDS[0]}\t2000\t3000\tvalidation\n{PLAIN_RECORDS[0]}\t4000\t5000\tval\n"
                   f"{PLAIN_RECORDS[1]}\t29000\t31000\ttest\textra\n")
    with caplog.at_level(logging.WARNING, logger="seqdiff.data.genome"):
        ivs = G.read_bed(bed, fasta)
    assert [i.split for i in ivs] == ["train", "valid", "valid", "test"]
    assert ivs[-1] == G.Interval(PLAIN_RECORDS[1], 29_000, 30_000, "test")
    assert any("line 6" in r.getMessage() and "clipped" in r.getMessage() for r in caplog.records)
    assert G.read_bed(gdir / f"{STEM}.bed", fasta)[3] == G.Interval(PLAIN_RECORDS[0], 22_000, 30_000, "valid")


@pytest.mark.parametrize("line, message", [
    ("r\t10\t20", r"line 2: expected `chrom start end split`"),
    ("r\t1O\t20\ttrain", r"line 2: start and end must be integers"),
    ("r\t10\t20\tholdout", r"line 2: split 'holdout' is unknown"),
    ("r\t20\t20\ttrain", r"line 2: empty interval r:20-20"),
    ("r\t30\t20\ttrain", r"line 2: reversed interval"),
    ("r\t-5\t20\ttrain", r"line 2: start -5 is negative"),
    ("r\t30000\t30010\ttrain", r"line 2: r:30000-30010 starts beyond the end of r \(length 30,000\)"),
    ("chrQ\t1\t20\ttrain", r"line 2: chromosome 'chrQ' is not in the FASTA; available: r"),
])
def test_bed_errors_name_the_line(gdir, line, message):
    seq = records(gdir / f"{STEM}.fa")[PLAIN_RECORDS[0]]
    fasta = G.open_fasta(write_fasta(gdir / "r.fa", {"r": seq}))
    bed = gdir / "bad.bed"
    bed.write_text(f"r\t0\t100\ttrain\n{line}\n")
    with pytest.raises(G.GenomeError, match=message) as err:
        G.read_bed(bed, fasta)
    assert "bad.bed" in str(err.value)


# ---------------------------------------------------------------------------------------------- files
def test_bgzip_reads_like_plain(gdir):
    plain, bgz = G.open_fasta(gdir / f"{STEM}.fa"), G.open_fasta(gdir / f"{STEM}.fa.gz")
    assert bgz.bgzf and not plain.bgzf and plain.lengths == bgz.lengths
    for name, length in plain.lengths.items():
        assert plain.sequence(name, 0, length) == bgz.sequence(name, 0, length)
    assert plain.sequence(N_RECORD, 12_345, 13_000) == bgz.sequence(N_RECORD, 12_345, 13_000)
    a, _ = G.fasta_tokens(gdir / f"{STEM}.fa", TOK)
    b, _ = G.fasta_tokens(gdir / f"{STEM}.fa.gz", TOK)
    np.testing.assert_array_equal(a, b)
    c, _ = G.fasta_tokens(gdir / f"{STEM}.fa.gz", TOK, records=["20_45000000_45030000".join(["chr", ""])])
    assert TOK.decode(c) == records(gdir / f"{STEM}.fa")[PLAIN_RECORDS[1]]


def test_missing_indexes_are_built(gdir):
    for p in (f"{STEM}.fa.gz.fai", f"{STEM}.fa.gz.gzi"):
        (gdir / p).unlink()
    fasta = G.open_fasta(gdir / f"{STEM}.fa.gz")
    assert (gdir / f"{STEM}.fa.gz.fai").is_file() and (gdir / f"{STEM}.fa.gz.gzi").is_file()
    assert fasta.sequence(GAP_RECORD, 0, 8) == records(gdir / f"{STEM}.fa")[GAP_RECORD][:8]
    G.open_fasta(gdir / f"{STEM}.fa")
    assert (gdir / f"{STEM}.fa.fai").is_file()


def test_truncated_and_plain_gzip_files(gdir):
    data = (gdir / f"{STEM}.fa.gz").read_bytes()
    cut = gdir / "cut.fa.gz"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(G.GenomeError, match=r"cut.fa.gz is truncated"):
        G.open_fasta(cut)
    with pytest.raises(G.GenomeError, match=r"cut.fa.gz is truncated"):
        G.fasta_tokens(cut, TOK)
    gz = gdir / "plain.fa.gz"
    gz.write_bytes(gzip.compress((gdir / f"{STEM}.fa").read_bytes()))
    with pytest.raises(G.PlainGzip, match=r"plain.fa.gz is gzip- but not bgzip-compressed.*bgzip_file"):
        G._open_indexed(gz)
    cutgz = gdir / "cut2.fa.gz"
    cutgz.write_bytes(gz.read_bytes()[:-1000])
    with pytest.raises(G.GenomeError, match=r"cut2.fa.gz is truncated"):
        G.fasta_tokens(cutgz, TOK)
    with pytest.raises(G.GenomeError, match=r"cut2.fa.gz is truncated: the compressed file ends early"):
        G.open_fasta(cutgz)  # the same message as fasta_tokens (check_fasta), before any indexable copy is begun
    assert not list((data_dir() / "fasta-indexable").glob("cut2*"))
    fixed = G.bgzip_file(gz, gdir / "fixed.fa.gz")
    assert G.open_fasta(fixed).lengths == G.open_fasta(gdir / f"{STEM}.fa").lengths
    with pytest.raises(G.GenomeError, match="does not exist"):
        G.open_fasta(gdir / "nope.fa")


def test_a_fasta_in_a_read_only_folder_is_indexed_under_the_data_directory(gdir, tmp_path, monkeypatch):
    """A shared genome in a folder this user cannot write (and without an index beside it): the .fai / .gzi go
    under the data directory, named by the file, and every base reads as with an index beside the file."""
    monkeypatch.setenv("SEQDIFF_DATA", str(tmp_path / "data"))
    beside = G.open_fasta(gdir / f"{STEM}.fa.gz")
    for p in (f"{STEM}.fa.gz.fai", f"{STEM}.fa.gz.gzi"):
        (gdir / p).unlink()
    monkeypatch.setattr(G.os, "access", lambda *a, **k: False)
    fasta = G.open_fasta(gdir / f"{STEM}.fa.gz")
    assert not (gdir / f"{STEM}.fa.gz.fai").exists() and not (gdir / f"{STEM}.fa.gz.gzi").exists()
    assert fasta.index_base.parent.parent == tmp_path / "data" / "fasta-index"
    assert Path(f"{fasta.index_base}.fai").is_file() and Path(f"{fasta.index_base}.gzi").is_file()
    assert fasta.lengths == beside.lengths
    for name in fasta.names:
        size = fasta.length(name)
        np.testing.assert_array_equal(fasta.fetch(name, size // 3, size), beside.fetch(name, size // 3, size))
    fasta._faidx = None  # a forked worker reopens with the same private index
    assert fasta.sequence(N_RECORD, 5_000, 5_010) == beside.sequence(N_RECORD, 5_000, 5_010)


def test_a_stale_or_wrong_index_is_rebuilt_beside_the_file_or_privately(gdir, caplog, monkeypatch):
    seqs = records(gdir / f"{STEM}.fa")
    path = write_fasta(gdir / "s.fa", {"a": seqs[PLAIN_RECORDS[0]][:5_000], "b": seqs[PLAIN_RECORDS[1]][:3_000]})
    G.open_fasta(path)
    fai = Path(str(path) + ".fai")
    # 1. the FASTA changed after indexing (newer than its .fai)
    write_fasta(path, {"a": seqs[PLAIN_RECORDS[0]][:7_000], "b": seqs[PLAIN_RECORDS[1]][:3_000]})
    old = time.time() - 100
    os.utime(fai, (old, old))
    with caplog.at_level(logging.WARNING, logger="seqdiff.data.genome"):
        fasta = G.open_fasta(path)
    assert fasta.lengths == {"a": 7_000, "b": 3_000} and "older than the FASTA" in caplog.text
    assert fasta.sequence("b", 2_990, 3_000) == seqs[PLAIN_RECORDS[1]][2_990:3_000]
    # 2. an index that looks fresh but lists other lengths
    fai.write_text(fai.read_text().replace("a\t7000", "a\t6000"))
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="seqdiff.data.genome"):
        fasta = G.open_fasta(path)
    assert fasta.lengths["a"] == 7_000 and "does not match" in caplog.text and "longer than" in caplog.text
    # 3. the same in a folder that cannot be written: indexed afresh under the data directory, the wrong index
    # beside the file left alone
    wrong = fai.read_text().replace("a\t7000", "a\t6000")
    fai.write_text(wrong)
    monkeypatch.setattr(G.os, "access", lambda *a, **k: False)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="seqdiff.data.genome"):
        fasta = G.open_fasta(path)
    assert fasta.lengths == {"a": 7_000, "b": 3_000} and fasta.index_base != path and fai.read_text() == wrong
    assert "does not match it (record a is longer" in caplog.text and "read-only" in caplog.text
    # 4. a right index beside a file in a read-only folder is used, even when older than the file
    fai.unlink()
    monkeypatch.undo()
    G.open_fasta(path)
    os.utime(fai, (old, old))
    monkeypatch.setattr(G.os, "access", lambda *a, **k: False)
    assert G.open_fasta(path).index_base == path


# ---------------------------------------------------------------------------------------------- tokenizer
def test_tokenizer_hugging_face_layout(tmp_path):
    TOK.save_pretrained(tmp_path)
    assert (tmp_path / "vocab.txt").read_text().split() == ["A", "C", "G", "T", "N", "[BOS]", "[EOS]", "[PAD]",
                                                             "[MASK]"]
    assert (tmp_path / "special_tokens_map.json").is_file()
    assert NucleotideTokenizer.from_pretrained(tmp_path) == TOK and load_tokenizer(tmp_path) == TOK
    ids = torch.from_numpy(TOK.encode("ACGTN"))
    again = NucleotideTokenizer.from_pretrained(tmp_path)
    assert torch.equal(again.reverse_complement(ids), TOK.reverse_complement(ids))
    (tmp_path / "vocab.txt").write_text("A\nC\n")
    with pytest.raises(TokenizerError, match="vocab.txt lists"):
        NucleotideTokenizer.from_pretrained(tmp_path)


# ---------------------------------------------------------------------------------------------- data module
def fasta_overrides(gdir, **extra):
    overrides = [
        "model.preset=test", "model.max_seq_len=64", "data.seq_len=32", "data.batch_size=4",
        "data.eval_batch_size=8", "data.kind=fasta", "data.tokenizer=nucleotide",
        f"data.fasta={gdir / (STEM + '.fa.gz')}", "data.split_mode=bed", f"data.bed={gdir / (STEM + '.bed')}",
        "train.max_steps=3", "train.val_every=3", "train.val_batches=2", "train.checkpoint_every=3",
        "train.progress_bar=false", "train.warmup_steps=1", "train.log_every=1",
    ]
    return overrides + [f"{k}={v}" for k, v in extra.items()]


def test_fasta_data_module_trains_end_to_end(gdir):
    from seqdiff.training.run import train

    assert data_module_class("fasta") is FastaDataModule
    cfg = load_run_config(None, fasta_overrides(gdir))
    result = train(cfg, gdir / "run")
    assert result.trainer.global_step == 3 and result.checkpoint.is_file()
    df = pd.read_csv(gdir / "run" / "logs" / "metrics.csv")
    assert np.isfinite(df["train/loss"].dropna()).all() and len(df["train/loss"].dropna()) == 3
    val = df["val/nll"].dropna()
    assert len(val) == 1 and np.isfinite(val).all()
    assert load_tokenizer(gdir / "run") == TOK


def test_fasta_data_module_blocks_and_early_errors(gdir, tmp_path):
    cfg = load_run_config(None, fasta_overrides(gdir, **{
        "data.split_mode": "blocks", "data.chromosomes": f"[{N_RECORD}]", "data.block_size": 2_000,
        "data.valid_fraction": 0.1, "data.test_fraction": 0.1}))
    dm = build_data_module(cfg.data, TOK, seed=0)
    dm.check_files()
    assert {iv.chrom for iv in dm.intervals()} == {N_RECORD}
    batch = next(iter(dm.train_dataloader()))
    assert batch["input_ids"].shape == (4, 32) and batch["loss_mask"].dtype == torch.bool
    val = next(iter(dm.val_dataloader()))
    assert val["input_ids"].shape[1] == 32 and set(val) == {"input_ids", "attention_mask", "loss_mask"}
    missing = load_run_config(None, fasta_overrides(gdir, **{"data.fasta": str(tmp_path / "none.fa")}))
    from seqdiff.training.run import train

    with pytest.raises(G.GenomeError, match="none.fa does not exist"):
        train(missing, tmp_path / "r")
    assert not (tmp_path / "r").exists()
    with pytest.raises(G.GenomeError, match=r"needs data\.fasta\.chromosomes"):
        build_data_module(DataConfig(kind="fasta", tokenizer="nucleotide", fasta=FastaDataConfig(
            split_mode="blocks", path=str(gdir / f"{STEM}.fa"))), TOK).check_files()
    with pytest.raises(ConfigError, match="data.tokenizer=nucleotide"):
        load_run_config(None, ["data.kind=fasta"])


def test_data_module_workers_give_the_main_process_windows(gdir):
    """num_workers=2: each worker opens its own handle; train and eval batches equal those of num_workers=0,
    in the same order, and no window comes back empty or all N."""
    batches = {}
    for workers in (0, 2):
        cfg = load_run_config(None, fasta_overrides(gdir, **{"data.num_workers": workers}))
        dm = build_data_module(cfg.data, TOK, seed=3)
        dm.fasta.sequence(PLAIN_RECORDS[0], 0, 10)  # the parent's handle is open before the fork
        train = [b for _, b in zip(range(5), dm.train_dataloader())]
        batches[workers] = (train, list(dm.val_dataloader()), list(dm.test_dataloader()))
    seqs = records(gdir / f"{STEM}.fa")
    for main, workers in zip(batches[0], batches[2]):
        assert len(main) == len(workers) > 0
        for a, b in zip(main, workers):
            assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
            scored = b["loss_mask"] & b.get("attention_mask", torch.ones_like(b["loss_mask"]))
            assert scored.any(dim=1).all()  # no empty or all-N window
    val = torch.cat([b["input_ids"] for b in batches[2][1]])  # the valid interval, tiled in order
    assert TOK.decode(val.flatten()) == seqs[PLAIN_RECORDS[0]][22_000:30_000]


# ---------------------------------------------------------------------------------------------- fetch pipeline
def test_fetch_pipeline_checksum_and_index(gdir):
    src = gdir / "hg19.fa.gz"
    src.write_bytes(gzip.compress((gdir / f"{STEM}.fa").read_bytes()))
    md5 = fetch_grch37.file_digest(src)
    listing = f"0123456789abcdef0123456789abcdef  hg38.fa.gz\n{md5}  hg19.fa.gz\n"
    assert fetch_grch37.parse_md5sums(listing, "hg19.fa.gz") == md5
    fetch_grch37.verify_checksum(src, md5)
    with pytest.raises(fetch_grch37.ChecksumError, match="no line for hg18.fa.gz"):
        fetch_grch37.parse_md5sums(listing, "hg18.fa.gz")
    with pytest.raises(fetch_grch37.ChecksumError, match="md5 is"):
        fetch_grch37.verify_checksum(src, "0" * 32)
    out = fetch_grch37.prepare_reference(src, gdir / "out.fa.gz", "bgzip", chromosomes=[N_RECORD, PLAIN_RECORDS[1]])
    assert G.compression(gdir / "out.fa.gz") == "bgzf" and (gdir / "out.fa.gz.gzi").is_file()
    assert list(out.lengths) == [N_RECORD, PLAIN_RECORDS[1]]
    seqs = records(gdir / f"{STEM}.fa")
    assert out.sequence(PLAIN_RECORDS[1], 0, 30_000) == seqs[PLAIN_RECORDS[1]]
    plain = fetch_grch37.prepare_reference(src, gdir / "out.fa", "plain")
    assert plain.lengths == G.open_fasta(gdir / f"{STEM}.fa").lengths
    with pytest.raises(G.GenomeError, match="chr99"):
        fetch_grch37.prepare_reference(src, gdir / "x.fa", "plain", chromosomes=["chr99"])


# ---------------------------------------------------------------------------------------------- real chr20
@pytest.mark.slow
@pytest.mark.requires_source("grch37-chr20")
def test_real_grch37_chr20(data_source):
    path = data_source("grch37-chr20") / "20.fa.gz"
    fasta = G.open_fasta(path)
    assert fasta.resolve("chr20") == "20" and fasta.lengths["20"] == 63_025_520
    assert fasta.sequence("chr20", 30_000_000, 30_000_010) == "AAATAAGGCT"
    ivs = G.split_by_blocks(fasta, "chr20", 100_000, 0.05, 0.05, gap=1_024)
    sizes = G.summarize(ivs)
    assert sizes["valid"]["bases"] > 2_000_000 and sizes["test"]["bases"] > 2_000_000


def test_a_fasta_path_that_is_a_directory_says_so(tmp_path):
    (tmp_path / "dir.fa").mkdir()
    with pytest.raises(G.GenomeError, match=r"FASTA file .*dir.fa is a directory"):
        G.open_fasta(tmp_path / "dir.fa")
    with pytest.raises(G.GenomeError, match=r"FASTA file .*none.fa does not exist"):
        G.open_fasta(tmp_path / "none.fa")


def test_a_fasta_with_uneven_lines_is_read_through_a_rewrapped_copy(gdir, tmp_path, monkeypatch, caplog):
    """Real chr20 sequence re-wrapped at varying widths (with a blank line, a comment, CRLF and trailing spaces):
    pyfaidx cannot index it, so a copy with 60 bases per line is written once under the data directory and
    every base reads back as in the file; nothing is left in the user's folder."""
    monkeypatch.setenv("SEQDIFF_DATA", str(tmp_path / "data"))
    seqs = records(gdir / f"{STEM}.fa")
    names = PLAIN_RECORDS
    folder = tmp_path / "mine"
    folder.mkdir()
    lines = []
    for k, name in enumerate(names):
        lines.append(f">{name} description text")
        seq, i, widths = seqs[name], 0, [50, 61, 70, 33]
        while i < len(seq):
            w = widths[(i // 7 + k) % len(widths)]
            lines.append(seq[i:i + w] + (" " if i % 3 == 0 else ""))
            i += w
        lines.insert(3, "")
    lines.insert(1, "; a comment line")
    path = folder / "uneven.fa"
    path.write_bytes("\r\n".join(lines).encode() + b"\r\n")
    with pytest.raises(G.GenomeError, match="not consistent"):
        G._open_indexed(path)
    with caplog.at_level(logging.WARNING):
        fasta = G.open_fasta(path)
    copies = list((tmp_path / "data" / "fasta-indexable").glob("*.fa"))
    assert len(copies) == 1 and fasta.path == copies[0] and "lines vary in length" in caplog.text
    assert sorted(p.name for p in folder.iterdir()) == ["uneven.fa"]
    assert fasta.names == names
    for name in names:
        assert fasta.fetch(name, 0, fasta.length(name)).tobytes().decode() == seqs[name]
    assert all(len(line) == 60 for line in copies[0].read_bytes().split(b"\n")[1:10])
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert G.open_fasta(path).path == copies[0]  # written once
    assert "lines vary" not in caplog.text
    path.write_bytes(path.read_bytes().replace(b"\r\n>", b"\r\nACGT\r\n>", 1))  # an edited file: a fresh copy
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 10**9))
    assert G.open_fasta(path).length(names[0]) == len(seqs[names[0]]) + 4
    assert len(list((tmp_path / "data" / "fasta-indexable").glob("*.fa"))) == 2


def test_a_plain_gzip_fasta_is_read_through_a_bgzip_copy(gdir, tmp_path, monkeypatch, caplog):
    """UCSC ships hg19.fa.gz as plain gzip, which has no random access: a BGZF copy is written once under the
    data directory and reads every base as the plain file does."""
    monkeypatch.setenv("SEQDIFF_DATA", str(tmp_path / "data"))
    gz = tmp_path / "hg.fa.gz"
    gz.write_bytes(gzip.compress((gdir / f"{STEM}.fa").read_bytes()))
    with caplog.at_level(logging.WARNING):
        fasta = G.open_fasta(gz)
    assert "not bgzip-compressed" in caplog.text and fasta.bgzf and fasta.path.parent.name == "fasta-indexable"
    plain = G.open_fasta(gdir / f"{STEM}.fa")
    assert fasta.lengths == plain.lengths
    for name in plain.names:
        size = plain.length(name)
        np.testing.assert_array_equal(fasta.fetch(name, 0, size), plain.fetch(name, 0, size))
    assert G.open_fasta(gz).path == fasta.path  # written once
    assert sorted(p.name for p in tmp_path.glob("hg*")) == ["hg.fa.gz"]  # nothing beside the user's file


def test_a_fasta_with_a_non_ascii_byte_names_its_line_and_column(tmp_path):
    path = tmp_path / "latin.fa"
    path.write_bytes(b">chr1\nACGTACGT\nACGTACGT\nACGT\xe9CGT\nACGT\n")
    with pytest.raises(G.GenomeError, match=r"latin.fa: line 4, column 5: byte 0xe9 is not ASCII"):
        G.open_fasta(path)


def test_recipe_paths_under_the_data_directory_follow_seqdiff_data(tmp_path, monkeypatch):
    """`$SEQDIFF_DATA/...` in a FASTA path is the data directory whether or not the variable is set, so the
    shipped DNA recipes find a fetched genome under a custom data directory and under the default one."""
    from seqdiff.sources import expand_data_path

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("SEQDIFF_DATA", raising=False)
    default = tmp_path / "home" / ".cache" / "seqdiff" / "data"
    assert expand_data_path("$SEQDIFF_DATA/g/20.fa.gz") == default / "g" / "20.fa.gz"
    assert expand_data_path("${SEQDIFF_DATA}/x.fa") == default / "x.fa"
    assert expand_data_path("~/.cache/seqdiff/data/x.fa") == default / "x.fa"
    monkeypatch.setenv("SEQDIFF_DATA", str(tmp_path / "custom"))
    (tmp_path / "custom" / "g").mkdir(parents=True)
    write_fasta(tmp_path / "custom" / "g" / "toy.fa", {"chrT": "ACGT" * 30})
    handle = G.open_fasta("$SEQDIFF_DATA/g/toy.fa")
    assert handle.sequence("chrT", 0, 8) == "ACGTACGT"
    for recipe in Path("configs").glob("dna_chr20_cpu_*.yaml"):  # the shipped recipes use the form
        assert load_run_config(str(recipe), []).data.fasta.path.startswith("$SEQDIFF_DATA/"), recipe
