"""Variant scoring (seqdiff.evaluation.variants, `seqdiff score`): on a synthetic genome drawn from an order-2
Markov chain, exact denoiser / next-base oracles give the chain's exact log-likelihood ratio, computed here
by brute force over the whole chromosome; bad rows and models are refused with one line naming them."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import Tensor, nn

from seqdiff.checkpoint import LoadedModel
from seqdiff.cli import main
from seqdiff.config import DataConfig, MethodConfig, ModelConfig, to_dict
from seqdiff.data.genome import open_fasta
from seqdiff.evaluation.variants import VariantError, format_rows, read_variants, score_variants, window_bounds
from seqdiff.methods import AR, MDLM, build_model
from seqdiff.tokenizers.char import CharTokenizer
from seqdiff.tokenizers.nucleotide import NucleotideTokenizer

TOK = NucleotideTokenizer()
K = 2  # Markov order
BASES = "ACGT"
WINDOW = 24


def chain(seed: int = 0) -> np.ndarray:
    """Transition table P[context code (4^K), next base (4)], rows from a Dirichlet(0.5): far from uniform."""
    rng = np.random.default_rng(seed)
    return rng.dirichlet(np.full(4, 0.5), size=4 ** K)


def log_joint(seq: str, P: np.ndarray) -> float:
    """log p(seq) under the chain with the first K bases uniform: the brute-force reference."""
    ids = [BASES.index(c) for c in seq]
    total = K * math.log(0.25)
    for j in range(K, len(ids)):
        code = sum(ids[j - K + m] * 4 ** (K - 1 - m) for m in range(K))
        total += math.log(P[code, ids[j]])
    return total


def sample_chain(n: int, P: np.ndarray, rng: np.random.Generator) -> str:
    ids = list(rng.integers(0, 4, K))
    while len(ids) < n:
        code = sum(ids[-K + m] * 4 ** (K - 1 - m) for m in range(K))
        ids.append(int(rng.choice(4, p=P[code])))
    return "".join(BASES[i] for i in ids)


class _ChainOracle(nn.Module):
    def __init__(self, P: np.ndarray, max_len: int):
        super().__init__()
        self.register_buffer("logP", torch.tensor(np.log(P)))  # (4^K, 4) float64
        self.dummy = nn.Parameter(torch.zeros(()))
        self.vocab_size, self.causal = TOK.vocab_size, isinstance(self, ARChainOracle)
        self.config = ModelConfig(hidden_size=16, n_heads=2, n_layers=1, max_seq_len=max_len)

    def window_log_joint(self, ids: Tensor) -> Tensor:
        """log p of windows (N, W) of base ids under the chain started at the window (first K uniform)."""
        W = ids.shape[1]
        codes = sum(ids[:, m: W - K + m] * 4 ** (K - 1 - m) for m in range(K))  # (N, W-K) contexts of x_K..
        return self.logP[codes, ids[:, K:]].sum(-1) + K * math.log(0.25)


class MDLMChainOracle(_ChainOracle):
    """The exact SUBS denoiser of the chain: marginals of the masked bases given the clean ones (brute force)."""

    def forward(self, input_ids: Tensor, noise_level=None, attention_mask=None) -> Tensor:
        B, W = input_ids.shape
        out = torch.full((B, W, TOK.vocab_size), -1e9, dtype=torch.float64)
        out.scatter_(-1, input_ids[..., None], 0.0)
        for b in range(B):
            masked = (input_ids[b] == TOK.mask_id).nonzero().flatten().tolist()
            fills = torch.tensor(list(itertools.product(range(4), repeat=len(masked))))  # (4^m, m)
            seqs = input_ids[b].repeat(len(fills), 1)
            seqs[:, masked] = fills
            lj = self.window_log_joint(seqs)  # (4^m,)
            for n, pos in enumerate(masked):
                marg = torch.stack([torch.logsumexp(lj[fills[:, n] == a], 0) for a in range(4)])
                out[b, pos] = -1e9
                out[b, pos, :4] = marg - torch.logsumexp(marg, 0)
        return out + 0 * self.dummy


class ARChainOracle(_ChainOracle):
    """The chain's next-base distribution; the first K bases of a window (after BOS) uniform."""

    def forward(self, input_ids: Tensor, noise_level=None, attention_mask=None) -> Tensor:
        B, W = input_ids.shape
        out = torch.full((B, W, TOK.vocab_size), -1e9, dtype=torch.float64)
        out[:, :, :4] = math.log(0.25)
        prev = input_ids[:, 1:]  # position j predicts x_j from x_0 .. x_{j-1} = input[1 .. j]
        for j in range(K, W):
            codes = sum(prev[:, j - K + m] * 4 ** (K - 1 - m) for m in range(K))  # (B,)
            out[:, j, :4] = self.logP[codes]
        return out + 0 * self.dummy


def loaded(method: str, P: np.ndarray, seq_len: int = WINDOW) -> LoadedModel:
    cls, oracle = {"mdlm": (MDLM, MDLMChainOracle), "ar": (AR, ARChainOracle)}[method]
    backbone = oracle(P, 64)
    return LoadedModel(backbone, cls(MethodConfig(name=method), TOK), TOK, backbone.config,
                       MethodConfig(name=method), None, seq_len, 0, Path(f"oracle-{method}"), False)


@pytest.fixture(scope="module")
def genome(tmp_path_factory):
    """Two chromosomes from the chain (one shorter than the window), as a FASTA; their sequences."""
    P = chain()
    rng = np.random.default_rng(1)
    chroms = {"chrS1": sample_chain(200, P, rng), "chrS2": sample_chain(15, P, rng)}
    fa = tmp_path_factory.mktemp("genome") / "synthetic.fa"
    fa.write_text("".join(f">{name}\n" + "".join(seq[i: i + 60] + "\n" for i in range(0, len(seq), 60))
                          for name, seq in chroms.items()))
    return P, chroms, fa


def write_table(path: Path, rows, header="chrom\tpos\tref\talt\tnote") -> Path:
    path.write_text(header + "\n" + "".join("\t".join(map(str, r)) + "\n" for r in rows))
    return path


def snv_rows(chroms, rng, n=12):
    rows = []
    for i in range(n):
        name = "chrS1" if i % 4 else "chrS2"
        seq = chroms[name]
        pos = int(rng.integers(0, len(seq))) if i > 1 else (0 if i == 0 else len(seq) - 1)  # both ends too
        ref = seq[pos]
        alt = BASES[(BASES.index(ref) + 1 + int(rng.integers(0, 3))) % 4]
        rows.append((name, pos + 1, ref, alt, f"v{i}"))
    return rows


def exact_llr(chroms, P, name, pos, ref, alt) -> float:
    seq = chroms[name]
    i = pos - 1
    assert seq[i: i + len(ref)] == ref
    return log_joint(seq[:i] + alt + seq[i + len(ref):], P) - log_joint(seq, P)


# 1. exactness on a genome whose model is known -----------------------------------------------------------

@pytest.mark.parametrize("method", ["mdlm", "ar"])
def test_snv_scores_equal_the_chains_exact_llr(genome, tmp_path, method):
    """AR: exact by construction. MDLM: the masked marginal of one base equals the exact ratio, since
    p(w) = p(x_i | x_-i) p(x_-i) and the denoiser's conditional is the chain's."""
    P, chroms, fa = genome
    rows = snv_rows(chroms, np.random.default_rng(2))
    table = write_table(tmp_path / "v.tsv", rows)
    out = score_variants(loaded(method, P), open_fasta(fa), read_variants(table))
    assert [r["note"] for r in out] == [r[4] for r in rows]  # table order, extra columns carried
    expected = [exact_llr(chroms, P, *r[:4]) for r in rows]
    got = [r["llr"] for r in out]
    assert max(abs(a - b) for a, b in zip(got, expected)) < 1e-5  # float32 softmax inside SUBS
    assert np.std(expected) > 0.3  # the scores are far from constant: the check can fail
    assert all(r["score"] == ("exact" if method == "ar" else "masked_marginal") for r in out)


def test_ar_multibase_substitution_is_exact_and_mdlm_uses_joint_masked_marginals(genome, tmp_path):
    P, chroms, fa = genome
    seq = chroms["chrS1"]
    rows = [("chrS1", 50, seq[49:51], "".join(BASES[(BASES.index(c) + 2) % 4] for c in seq[49:51]), "mnv")]
    table = write_table(tmp_path / "m.tsv", rows)
    ar = score_variants(loaded("ar", P), open_fasta(fa), read_variants(table))[0]
    assert abs(ar["llr"] - exact_llr(chroms, P, *rows[0][:4])) < 1e-5
    mdlm = score_variants(loaded("mdlm", P), open_fasta(fa), read_variants(table))[0]
    # brute force on the chromosome: marginal of each base with both masked, the rest of the chromosome clean
    i, ref, alt = 49, rows[0][2], rows[0][3]
    joint = {(a, b): log_joint(seq[:i] + a + b + seq[i + 2:], P) for a in BASES for b in BASES}
    norm = np.logaddexp.reduce(list(joint.values()))

    def marg(n, base):
        return np.logaddexp.reduce([v for k, v in joint.items() if k[n] == base]) - norm

    expected = marg(0, alt[0]) + marg(1, alt[1]) - marg(0, ref[0]) - marg(1, ref[1])
    assert abs(mdlm["llr"] - expected) < 1e-5
    assert abs(expected - exact_llr(chroms, P, *rows[0][:4])) > 1e-3  # not the exact ratio, as documented


COMPLEMENT = str.maketrans("ACGT", "TGCA")


def rc(seq: str) -> str:
    return seq.translate(COMPLEMENT)[::-1]


def conditional(seq: str, i: int, P: np.ndarray) -> dict[str, float]:
    """log p(x_i = a | the rest of seq) under the chain started at seq (brute force over a)."""
    lj = {a: log_joint(seq[:i] + a + seq[i + 1:], P) for a in BASES}
    norm = np.logaddexp.reduce(list(lj.values()))
    return {a: v - norm for a, v in lj.items()}


def strand_mixture(window: str, P: np.ndarray) -> float:
    return np.logaddexp(log_joint(window, P), log_joint(rc(window), P)) - math.log(2)


@pytest.mark.parametrize("method", ["mdlm", "ar"])
def test_rc_conjoined_scores_against_brute_force_on_both_strands(genome, tmp_path, method):
    """AR: the strand mixture (p(w) + p(RC w)) / 2 of each window, exactly. MDLM: the mean of the chain's
    full conditionals on the window and on its reverse complement (at the mirrored base, complemented)."""
    P, chroms, fa = genome
    rows = snv_rows(chroms, np.random.default_rng(4), n=8)
    table = write_table(tmp_path / "v.tsv", rows)
    model = loaded(method, P)
    backbone = model.backbone
    out = score_variants(model, open_fasta(fa), read_variants(table), rc_conjoin=True)
    assert model.backbone is backbone  # not modified
    plain = score_variants(model, open_fasta(fa), read_variants(table))
    for (name, pos, ref, alt, _), r in zip(rows, out):
        start, end = r["window_start"] - 1, r["window_end"]
        w_ref = chroms[name][start:end]
        i = pos - 1 - start
        w_alt = w_ref[:i] + alt + w_ref[i + 1:]
        if method == "ar":
            expected = strand_mixture(w_alt, P) - strand_mixture(w_ref, P)
        else:
            fwd = conditional(w_ref, i, P)
            rev = conditional(rc(w_ref), len(w_ref) - 1 - i, P)
            mix = {a: np.logaddexp(fwd[a], rev[a.translate(COMPLEMENT)]) - math.log(2) for a in BASES}
            expected = mix[alt] - mix[ref]
        assert abs(r["llr"] - expected) < 1e-5
    assert max(abs(r["llr"] - p["llr"]) for r, p in zip(out, plain)) > 1e-2  # the strands disagree here


def test_windows_are_centered_and_stay_inside():
    assert window_bounds(100, 1, 1000, 24) == (88, 112)
    assert window_bounds(2, 1, 1000, 24) == (0, 24)
    assert window_bounds(999, 1, 1000, 24) == (976, 1000)
    assert window_bounds(5, 1, 15, 24) == (0, 15)


def test_vcf_with_multiallelic_alt_and_json_output(genome, tmp_path, capsys):
    P, chroms, fa = genome
    seq = chroms["chrS1"]
    others = [b for b in BASES if b != seq[99]]
    vcf = tmp_path / "v.vcf"
    vcf.write_text("##fileformat=VCFv4.2\n#CHROM\tPOS\tID\tREF\tALT\tQUAL\tFILTER\tINFO\n"
                   f"S1\t100\trs1\t{seq[99]}\t{others[0]},{others[1]}\t.\t.\t.\n")  # S1: resolved to chrS1
    rows = score_variants(loaded("ar", P), open_fasta(fa), read_variants(vcf))
    assert [(r["id"], r["alt"]) for r in rows] == [("rs1", others[0]), ("rs1", others[1])]
    for r in rows:
        assert abs(r["llr"] - exact_llr(chroms, P, "chrS1", 100, seq[99], r["alt"])) < 1e-5


# 2. bad input ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("row, message", [
    (("chrS1", 10, "X", "A"), "line 2: ref allele 'X' does not match the FASTA, which has '{ref}'"),
    (("chrS1", 10, "1", "A"), "line 2: ref allele '1' is not a string of bases"),
    (("chrS1", 10, "{wrong}", "{ref}"), "line 2: ref allele '{wrong}' does not match the FASTA, which has '{ref}'"),
    (("chrS1", 201, "A", "C"), "line 2: position chrS1:201 is outside the chromosome (length 200)"),
    (("chrS1", 0, "A", "C"), "line 2: position 0 is outside the chromosome"),
    (("chrS9", 10, "A", "C"), "line 2: unknown chromosome 'chrS9'"),
    (("chrS1", "ten", "A", "C"), "line 2: malformed row: position 'ten' is not an integer"),
    (("chrS1", 10, "{ref}", "{ref}"), "none of its 1 variants can be scored (1 alt equals ref)"),
])
def test_bad_rows_are_refused_naming_the_row(genome, tmp_path, row, message):
    P, chroms, fa = genome
    ref = chroms["chrS1"][9]
    wrong = BASES[(BASES.index(ref) + 1) % 4]
    row = tuple(str(c).format(ref=ref, wrong=wrong) for c in row)
    table = write_table(tmp_path / "bad.tsv", [row], header="chrom\tpos\tref\talt")
    with pytest.raises(VariantError, match=str(table) + ":? " + __import__("re").escape(message.format(ref=ref,
                                                                                                     wrong=wrong))):
        score_variants(loaded("ar", P), open_fasta(fa), read_variants(table))


def test_rows_a_scorer_does_not_handle_stay_in_the_output_unscored(genome, tmp_path, capsys):
    """A real VCF mixes indels, ALT '.', '*', symbolic alleles and N into its SNVs: those rows keep their place
    with an empty score and the reason; the SNVs are scored exactly as alone; stderr counts the rest."""
    P, chroms, fa = genome
    seq = chroms["chrS1"]
    alt = BASES[(BASES.index(seq[99]) + 1) % 4]
    body = [f"chrS1\t100\trs1\t{seq[99]}\t{alt}", f"chrS1\t50\tdel\t{seq[49:52]}\t{seq[49]}",
            f"chrS1\t60\tref_site\t{seq[59]}\t.", f"chrS1\t61\tstar\t{seq[60]}\t*",
            f"chrS1\t62\tsv\t{seq[61]}\t<DEL>", f"chrS1\t63\tn\t{seq[62]}\tN",
            f"chrS1\t64\tins\t{seq[63]}\t{seq[63]}GT,{BASES[(BASES.index(seq[63]) + 1) % 4]}"]
    vcf = tmp_path / "mixed.vcf"
    vcf.write_text("##fileformat=VCFv4.2\n#CHROM\tPOS\tID\tREF\tALT\n" + "\n".join(body) + "\n")
    rows = score_variants(loaded("ar", P), open_fasta(fa), read_variants(vcf))
    err = capsys.readouterr().err
    assert "6 of 8 rows not scored" in err and "2 indel" in err and err.count("\n") == 1, err
    assert [r["id"] for r in rows] == ["rs1", "del", "ref_site", "star", "sv", "n", "ins", "ins"]
    assert [r["llr"] is not None for r in rows] == [True, False, False, False, False, False, False, True]
    assert abs(rows[0]["llr"] - exact_llr(chroms, P, "chrS1", 100, seq[99], alt)) < 1e-5
    reasons = [r.get("not_scored", "") for r in rows]
    assert reasons[1].startswith("indel") and "ALT '.'" in reasons[2] and "ALT '*'" in reasons[3]
    assert "'<DEL>'" in reasons[4] and "alt allele 'N'" in reasons[5] and reasons[6].startswith("indel")
    tsv = format_rows(rows, "tsv", {}).splitlines()
    assert tsv[0].split("\t")[-1] == "not_scored" and tsv[2].split("\t")[7] == ""  # an empty llr cell
    assert json.loads(format_rows(rows, "json", {}))["variants"][2]["llr"] is None  # valid JSON (no NaN)


def test_a_spreadsheet_csv_with_output_named_columns_keeps_them(genome, tmp_path):
    """Excel's "CSV UTF-8" starts with a byte-order mark; an earlier score's table fed back holds llr / score
    columns: the header is read, and those columns come back as input_<name> beside the new scores."""
    P, chroms, fa = genome
    seq = chroms["chrS1"]
    alt = BASES[(BASES.index(seq[99]) + 1) % 4]
    table = tmp_path / "excel.csv"
    table.write_bytes(f"\ufeffchrom,pos,ref,alt,llr,score\r\nchrS1,100,{seq[99]},{alt},99,mine\r\n".encode())
    (row,) = score_variants(loaded("ar", P), open_fasta(fa), read_variants(table))
    assert (row["input_llr"], row["input_score"]) == ("99", "mine")
    assert abs(row["llr"] - exact_llr(chroms, P, "chrS1", 100, seq[99], alt)) < 1e-5 and row["score"] == "exact"


def test_malformed_tables_are_refused(tmp_path):
    t = tmp_path / "t.csv"
    t.write_text("chrom,position,ref\nchr1,3,A\n")
    with pytest.raises(VariantError, match=r"t\.csv line 1: the header .* has no 'alt' column"):
        read_variants(t)
    t.write_text("chrom,pos,ref,alt\nchr1,3,A\n")
    with pytest.raises(VariantError, match=r"t\.csv line 2: malformed row: 3 columns, the header has 4"):
        read_variants(t)
    v = tmp_path / "v.vcf"
    v.write_text("##fileformat=VCFv4.2\nchr1\t3\t.\tA\n")
    with pytest.raises(VariantError, match=r"v\.vcf line 2: malformed VCF row"):
        read_variants(v)


# 3. the command line, on a tiny real model ------------------------------------------------------------

def save_checkpoint(path: Path, tokenizer, method: str = "mdlm", **model) -> Path:
    m, backbone, cfg = build_model(ModelConfig(hidden_size=16, n_layers=1, n_heads=2, max_seq_len=64, **model),
                                   MethodConfig(name=method), tokenizer)
    torch.save({"hyper_parameters": {"model": to_dict(cfg), "method": to_dict(MethodConfig(name=method)),
                                     "data": to_dict(DataConfig()), "tokenizer": tokenizer.to_dict(), "seq_len": 32},
                "state_dict": {f"backbone.{k}": v for k, v in backbone.state_dict().items()}, "global_step": 1},
               path)
    return path


@pytest.mark.parametrize("method, extra", [("mdlm", []), ("ar", []), ("mdlm", ["--rc-conjoin"]),
                                           ("ar", ["--rc-conjoin"])])
def test_score_command_on_real_slices(tmp_path, capsys, method, extra):
    import shutil

    fa = tmp_path / "slices.fa"
    shutil.copy("tests/fixtures/grch37_chr20_slices.fa", fa)
    handle = open_fasta(fa)
    name = "chr20_10000000_10030000"  # GRCh37 chr20:10,000,001-10,030,000
    rows = []
    for pos in (1, 100, 101, 500, 30000):  # both ends of the record too
        ref = handle.sequence(name, pos - 1, pos).upper()
        if ref in BASES:
            rows.append((name, pos, ref, BASES[(BASES.index(ref) + 1) % 4]))
    table = write_table(tmp_path / "v.tsv", rows, header="chrom\tpos\tref\talt")
    ckpt = save_checkpoint(tmp_path / f"{method}.ckpt", TOK, method)
    out = tmp_path / "scores.json"
    assert main(["score", str(ckpt), "--fasta", str(fa), "--variants", str(table), "--out", str(out), *extra]) == 0
    report = json.loads(out.read_text())
    assert report["score"] == ("exact" if method == "ar" else "masked_marginal") and report["llr_units"] == "nats"
    assert report["rc_conjoined"] is bool(extra)
    assert len(report["variants"]) == len(rows) == 5
    for r in report["variants"]:
        assert math.isfinite(r["llr"]) and abs(r["llr"] - (r["log_p_alt"] - r["log_p_ref"])) < 1e-9
        assert r["window_end"] - r["window_start"] + 1 == 32
    assert main(["score", str(ckpt), "--fasta", str(fa), "--variants", str(table)]) == 0  # TSV on stdout
    text = capsys.readouterr().out
    assert "# note: " in text and text.splitlines()[-1].count("\t") == 9


def test_score_command_refusals(tmp_path, capsys):
    import shutil

    fa = tmp_path / "slices.fa"
    shutil.copy("tests/fixtures/grch37_chr20_slices.fa", fa)
    name = open_fasta(fa).names[0]
    table = write_table(tmp_path / "v.tsv", [(name, 10**9, "A", "C")], header="chrom\tpos\tref\talt")
    text_ckpt = save_checkpoint(tmp_path / "text.ckpt", CharTokenizer())
    dna_ckpt = save_checkpoint(tmp_path / "dna.ckpt", TOK)
    sedd_ckpt = save_checkpoint(tmp_path / "sedd.ckpt", TOK, "sedd")
    out = tmp_path / "o.tsv"
    for ckpt, message in [(text_ckpt, "variant scoring needs a DNA model (nucleotide tokenizer); this model has a "
                                      "'char' tokenizer"),
                          (sedd_ckpt, "variant scoring supports methods ['ar', 'd3pm', 'mdlm'], not 'sedd'"),
                          (dna_ckpt, f"v.tsv line 2: position {name}:1000000000 is outside the chromosome")]:
        assert main(["score", str(ckpt), "--fasta", str(fa), "--variants", str(table), "--out", str(out)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], err
        assert not out.exists()




def test_time_conditioned_models_are_read_at_the_variants_mask_share(genome, tmp_path):
    from seqdiff.evaluation.variants import _time_for_share

    method = MDLM(MethodConfig(), TOK)
    for share in (1 / 24, 0.5):  # log-linear schedule: 1 - alpha(t) = (1 - 1e-3) t
        assert abs(_time_for_share(method, share) - share / (1 - 1e-3)) < 1e-12
    P, chroms, fa = genome
    seen = []

    class Recorder(MDLMChainOracle):
        def forward(self, input_ids, noise_level=None, attention_mask=None):
            seen.append(noise_level)
            return super().forward(input_ids, noise_level, attention_mask)

    model = loaded("mdlm", P)
    model.backbone = Recorder(P, 64)
    seq = chroms["chrS1"]
    table = write_table(tmp_path / "v.tsv", [("chrS1", 100, seq[99], "A" if seq[99] != "A" else "C", "x")])
    score_variants(model, open_fasta(fa), read_variants(table))
    torch.testing.assert_close(seen[0], method.noise_level(torch.tensor([1 / 24 / (1 - 1e-3)])))


def test_window_longer_than_the_model_is_refused(genome, tmp_path):
    P, chroms, fa = genome
    table = write_table(tmp_path / "v.tsv", [("chrS1", 5, chroms["chrS1"][4], "A" if chroms["chrS1"][4] != "A"
                                              else "C", "x")])
    with pytest.raises(VariantError, match=r"--window 65 must lie in \[1, model.max_seq_len=64\]"):
        score_variants(loaded("ar", P), open_fasta(fa), read_variants(table), window=65)
