"""Sample-quality metrics against hand-computed values, and `seqdiff sample` with its generation flags."""

import json
import math

import pytest
import torch
import torch.nn.functional as F

from seqdiff.cli import main
from seqdiff.evaluation.metrics import (
    distinct_n,
    diversity_metrics,
    gc_content,
    generation_metrics,
    kmer_distance,
    kmer_spectrum,
    load_oracle,
    repetition_rate,
    unigram_entropy,
)
from tests.test_cli import TINY


def test_unigram_entropy_distinct_and_repetition():
    assert unigram_entropy([3, 3, 3]) == 0.0
    assert unigram_entropy([0, 1, 2, 3]) == pytest.approx(math.log(4))
    expected = -(0.5 * math.log(0.5) + 2 * 0.25 * math.log(0.25))
    assert unigram_entropy(torch.tensor([5, 5, 7, 9])) == pytest.approx(expected)
    seq = [1, 2, 1, 2, 1]
    assert distinct_n(seq, 1) == pytest.approx(2 / 5)
    assert distinct_n(seq, 2) == pytest.approx(2 / 4)  # (1,2) (2,1) (1,2) (2,1)
    assert distinct_n(seq, 3) == pytest.approx(2 / 3)
    assert distinct_n(seq, 4) == pytest.approx(2 / 2)
    assert repetition_rate(seq, 2) == pytest.approx(0.5)
    assert distinct_n([1, 2], 3) == 1.0
    m = diversity_metrics([[0, 0], [0, 1]])
    assert m["unigram_entropy_nats"] == pytest.approx(math.log(2) / 2)
    assert m["distinct_1"] == pytest.approx((0.5 + 1) / 2) and m["repetition_2"] == 0.0


def test_gc_and_kmer_distances():
    assert gc_content("GGCCAATT") == 0.5 and gc_content("gcNNa") == pytest.approx(2 / 3)
    assert math.isnan(gc_content("NNN"))
    assert kmer_spectrum("ACGTA", 2).tolist()[:8] == [0, 1, 0, 0, 0, 0, 1, 0]  # AC, CG (GT, TA later)
    assert kmer_spectrum("ACNGT", 2).sum() == 2  # k-mers with N skipped
    for k in range(1, 7):
        seq = "ACGTTGCAAGGCTTACGATCGATCGGGATTAC"
        assert kmer_distance(seq, seq, k) == 0.0 and kmer_distance(seq, seq.lower(), k, "js") == 0.0
    assert kmer_distance("AAAAAA", "CCCCCC", 1) == 1.0
    assert kmer_distance("AAAAAA", "CCCCCC", 3, "js") == pytest.approx(math.log(2))
    # hand-computed: p = (A .5, C .5), q = (A 1) -> TV .5
    assert kmer_distance("ACAC", "AAAA", 1) == pytest.approx(0.5)
    with pytest.raises(ValueError):
        kmer_distance("AC", "AC", 1, "l2")
    m = generation_metrics([torch.tensor([0, 1])], ["AC"], dna=True, reference="ACGT")
    assert m["gc_content"] == 0.5 and m["reference_gc_content"] == 0.5 and m["kmer_tv_k1"] == pytest.approx(0.5)


# ---------------------------------------------------------------------------------------------- tiny runs
@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("gen_runs")
    for name in ("mdlm", "ar"):
        assert main(["train", "--run-dir", str(root / name), *TINY, f"method.name={name}"]) == 0
    g = torch.Generator().manual_seed(0)
    dna_file = root / "dna.txt"
    dna_file.write_text("".join("ACGT"[i] for i in torch.randint(0, 4, (2000,), generator=g).tolist()))
    dna = ["model.preset=test", "model.max_seq_len=32", "data.seq_len=16", "data.batch_size=4",
           "data.tokenizer=nucleotide", f"data.train_file={dna_file}",
           f"data.valid_file={dna_file}", f"data.test_file={dna_file}",
           "train.max_steps=2", "train.val_every=2", "train.val_batches=1", "train.progress_bar=false"]
    assert main(["train", "--run-dir", str(root / "dna"), *dna]) == 0
    return root


def test_generative_perplexity_of_seqdiff_ar_oracle_is_exp_of_its_nll(runs):
    oracle = load_oracle(runs / "ar")
    m = oracle.model
    texts = ["to be or not to be", "a" * 70]  # the second is longer than the block: two chunks
    # independently: BOS + ids through the backbone, log-softmax, gather, per chunk of seq_len
    total, n = 0.0, 0
    for text in texts:
        ids = torch.as_tensor(m.tokenizer.encode(text)).long()
        for start in range(0, len(ids), m.seq_len):
            chunk = ids[start : start + m.seq_len]
            inp = torch.cat([torch.tensor([m.tokenizer.bos_id]), chunk[:-1]])[None]
            with torch.no_grad():
                logp = F.log_softmax(m.backbone(inp).double(), -1)[0]
            total -= float(logp.gather(-1, chunk[:, None]).sum())
            n += len(chunk)
    assert n == 18 + 70
    assert oracle.perplexity(texts) == pytest.approx(math.exp(total / n), rel=1e-4)
    with pytest.raises(ValueError, match="autoregressive"):
        load_oracle(runs / "mdlm")


# ---------------------------------------------------------------------------------------------- CLI
def _samples(out: str) -> list[str]:
    return [part.split("\n", 1)[1].rstrip("\n") for part in out.split("=== sample ")[1:]]


def _metrics(out: str) -> dict[str, float]:
    lines = out.split("metrics:\n")[1].splitlines()
    return {k: float(v) for k, v in (line.split() for line in lines if line.startswith("  "))}


def test_cli_prompt_length_top_p_eos_metrics_oracle(runs, capsys):
    argv = ["sample", str(runs / "mdlm"), "--prompt", "to be", "--length", "100", "--top-p", "0.9", "--steps",
            "8", "--num-samples", "2", "--metrics", "--oracle", str(runs / "ar")]
    assert main(argv) == 0
    out = capsys.readouterr().out
    samples = _samples(out.split("metrics:")[0])
    # (an untrained model also draws BOS / EOS / PAD, which the text drops: lengths are counted in tokens)
    assert len(samples) == 2 and all(s.startswith("to be") and len(s) <= 100 for s in samples)
    metrics = _metrics(out)
    assert metrics["length_min"] == metrics["length_max"] == 100
    assert metrics["gen_perplexity"] > 1 and 0 < metrics["unigram_entropy_nats"] <= math.log(31)
    assert "distinct_4" in metrics and "repetition_1" in metrics
    assert main(argv) == 0 and capsys.readouterr().out == out  # same seed, same samples and metrics
    assert main(["sample", str(runs / "mdlm"), "--stop-at-eos", "--steps", "4", "--num-samples", "2",
                 "--metrics"]) == 0
    eos = _metrics(capsys.readouterr().out)
    assert eos["length_max"] <= 64  # cut at the first EOS (the untrained model draws some)
    assert main(["sample", str(runs / "ar"), "--prompt", "the ", "--num-samples", "2", "--top-p", "0.5"]) == 0
    assert all(s.startswith("the ") for s in _samples(capsys.readouterr().out))
    # AR beyond its context: blocks whose overlap is a prefix prompt
    assert main(["sample", str(runs / "ar"), "--prompt", "the ", "--length", "90", "--num-samples", "1",
                 "--metrics"]) == 0
    assert _metrics(capsys.readouterr().out)["length_min"] == 90


def test_cli_infill_text_and_dna(runs, capsys, tmp_path):
    pattern = "to __ or ___ to be"
    assert main(["sample", str(runs / "mdlm"), "--infill", pattern, "--steps", "6", "--num-samples", "3"]) == 0
    for s in _samples(capsys.readouterr().out):  # (BOS / EOS / PAD drawn by the untrained model are not shown)
        assert s.startswith("to ") and " or " in s and s.endswith(" to be") and len(s) <= len(pattern)
    text_file = tmp_path / "pattern.txt"
    text_file.write_text(pattern + "\n")  # spaces kept, final newline dropped: the same samples as --infill
    assert main(["sample", str(runs / "mdlm"), "--infill", pattern, "--steps", "6", "--num-samples", "3"]) == 0
    direct = capsys.readouterr().out
    assert main(["sample", str(runs / "mdlm"), "--infill-file", str(text_file), "--steps", "6", "--num-samples",
                 "3"]) == 0
    assert capsys.readouterr().out == direct
    ref = tmp_path / "ref.fa"
    ref.write_text(">ref\nACGTACGGGCCCATAT\nGGCCAATT\n")
    infill = tmp_path / "infill.txt"
    infill.write_text("ACGTNNNNNN\nNNNNTTTT\n")
    assert main(["sample", str(runs / "dna"), "--infill-file", str(infill), "--steps", "6", "--num-samples", "2",
                 "--reference", str(ref)]) == 0
    out = capsys.readouterr().out
    records = [r.split("\n", 1)[1].replace("\n", "") for r in out.split("metrics:")[0].split(">")[1:]]
    assert len(records) == 2 and all(r.startswith("ACGT") and r.endswith("TTTT") and len(r) <= 18 for r in records)
    assert "gc_content" in out and "kmer_tv_k6" in out and "reference_gc_content" in out
    seq = "ACGTACGGGCCCATATGG"  # explicit intervals: regenerate 3-7 and 12-15, keep every other base
    assert main(["sample", str(runs / "dna"), "--infill", seq, "--infill-intervals", "3-7,12-15", "--steps", "6",
                 "--num-samples", "2", "--seed", "3"]) == 0
    records = [r.split("\n", 1)[1].replace("\n", "") for r in capsys.readouterr().out.split(">")[1:]]
    assert len(records) == 2  # (the untrained model may draw BOS / EOS / PAD inside the intervals: not shown)
    assert all(r.startswith("ACG") and r[3:].find("GGCCC") >= 0 and r.endswith("TGG") for r in records)


def _error(capsys, argv):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1
    return err


def test_cli_generation_input_errors(runs, capsys):
    mdlm, ar = str(runs / "mdlm"), str(runs / "ar")
    assert "longer than the sample length" in _error(capsys, ["sample", mdlm, "--prompt", "abcdef", "--length", "4"])
    assert "outside the tokenizer's alphabet" in _error(capsys, ["sample", mdlm, "--prompt", "hi!"])
    assert "prompt (prefix) only" in _error(capsys, ["sample", ar, "--infill", "a__b"])
    assert "top_p" in _error(capsys, ["sample", mdlm, "--top-p", "0"])
    assert "not both" in _error(capsys, ["sample", mdlm, "--prompt", "a", "--infill", "a_"])
    assert "--infill or" in _error(capsys, ["sample", mdlm, "--infill-intervals", "1-3"])
    assert "past the end" in _error(capsys, ["sample", mdlm, "--infill", "abcd", "--infill-intervals", "2-9"])
    assert "--oracle" in _error(capsys, ["sample", mdlm, "--oracle", str(runs / "nope")])


def test_hf_oracle_retokenizes_and_scores_from_bos(tmp_path):
    """A tiny GPT-2 (random weights, the real BPE from tests/fixtures) saved as a Hugging Face directory."""
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    from seqdiff.tokenizers.hf import GPT2Tokenizer

    tok = PreTrainedTokenizerFast(tokenizer_object=GPT2Tokenizer("tests/fixtures/gpt2")._fast,
                                  bos_token="<|endoftext|>", eos_token="<|endoftext|>")
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=len(tok), n_positions=8, n_embd=16, n_layer=1, n_head=2)).eval()
    hf_dir = tmp_path / "oracle"
    model.save_pretrained(hf_dir)
    tok.save_pretrained(hf_dir)
    oracle = load_oracle(hf_dir)
    texts = ["to be or not to be, that is the question", "hello"]
    total, n = 0.0, 0
    for text in texts:  # by hand: BOS + up to 7 tokens per window
        ids = tok(text)["input_ids"]
        for start in range(0, len(ids), 7):
            x = torch.tensor([[tok.bos_token_id] + ids[start : start + 7]])
            with torch.no_grad():
                logp = F.log_softmax(model(x).logits[0, :-1].double(), -1)
            total -= float(logp.gather(-1, x[0, 1:, None]).sum())
            n += x.shape[1] - 1
    assert n > 8  # more than one window
    assert oracle.nll(texts) == (pytest.approx(total), n)
    assert oracle.perplexity(texts) == pytest.approx(math.exp(total / n))


def test_frontier_runs_every_sampler_side_by_side(runs, tmp_path, capsys):
    out = tmp_path / "generation"
    assert main(["frontier", "--checkpoint", str(runs / "mdlm"), "--checkpoint", str(runs / "ar"), "--oracle",
                 str(runs / "ar"), "--steps", "4,8,32", "--length", "32", "--num-samples", "2", "--out", str(out),
                 "--edlm-energy", f"ar:{runs / 'ar'}"]) == 0
    result = json.loads((out / "frontier.json").read_text())
    grid = [(r["sampler"], r["steps"]) for r in result["rows"]]
    assert grid == [("ancestral", 4), ("ancestral", 8), ("ancestral", 32), ("cached", 4), ("cached", 8),
                    ("cached", 32), ("edlm", 4), ("edlm", 8), ("edlm", 32), ("first_hitting", 32), ("remdm", 4),
                    ("remdm", 8), ("remdm", 32), ("confidence", 4), ("confidence", 8), ("confidence", 32),
                    ("threshold", 32), ("ar", 32)]
    exact = {r["sampler"]: r["exact"] for r in result["rows"]}
    assert exact == {"ancestral": True, "cached": True, "edlm": False, "first_hitting": True, "remdm": False,
                     "confidence": False, "threshold": False, "ar": True}
    first_hitting = next(r for r in result["rows"] if r["sampler"] == "first_hitting")
    assert first_hitting["denoiser_calls_per_sample"] == 32  # one call per token (batch 1)
    for r in result["rows"]:
        assert math.isfinite(r["gen_perplexity"]) and r["gen_perplexity"] > 1 and r["unigram_entropy_nats"] > 0
        assert r["seconds_per_sample_min"] <= r["seconds_per_sample"] <= r["seconds_per_sample_max"]
        if r["sampler"] == "ancestral":  # one denoiser call per step; the cached sampler never makes more
            assert r["denoiser_calls_per_sample"] == r["steps"]
        if r["sampler"] == "cached":
            assert r["denoiser_calls_per_sample"] <= r["steps"]
    assert result["cached_equals_uncached"] == {"4": True, "8": True, "32": True}  # the same draws, exactly
    t = result["targets"]
    assert "first_hitting_vs_ancestral" not in t  # no ancestral row at 4 x 32 = 128 steps
    quarter = t["approximate_at_quarter_calls"]  # calls <= 8: the 4- and 8-step approximate rows
    assert {(c["label"].split()[0], c["steps"]) for c in quarter["rows"]} >= {("ReMDM-cap", 4), ("ReMDM-cap", 8)}
    assert all(c["calls"] <= 8 for c in quarter["rows"])
    assert len(t["edlm_vs_mdlm_equal_quality"]["pairs"]) == 3 and result["reference"]["gen_perplexity"] > 1
    assert all(r["log_gen_perplexity_se"] > 0 for r in result["rows"])
    readme = (out / "README.md").read_text()
    assert "seqdiff frontier" in readme and "entropy" in readme and "s.e. of log PPL" in readme
    assert "| MDLM first-hitting | exact | 32 |" in readme and "| ReMDM-cap (eta 0.02) | approximate | 4 |" in readme
    assert (out / "frontier.png").stat().st_size > 0 and (out / "frontier_vs_steps.png").stat().st_size > 0
    (out / "README.md").unlink()  # --render-only rebuilds the report from frontier.json alone
    assert main(["frontier", "--render-only", "--out", str(out)]) == 0
    assert (out / "README.md").read_text() == readme


def test_ratio_standard_error_matches_brute_force():
    from seqdiff.evaluation.metrics import ratio_standard_error

    # equal counts: the plain standard error of the per-sample means
    totals, counts = [3.0, 5.0, 4.0, 8.0], [2, 2, 2, 2]
    means = [t / 2 for t in totals]
    mu = sum(means) / 4
    plain = math.sqrt(sum((m - mu) ** 2 for m in means) / 3 / 4)
    assert ratio_standard_error(totals, counts) == pytest.approx(plain)
    # unequal counts: the delta-method variance of sum(y) / sum(n), by its definition
    totals, counts = [1.0, 7.0, 2.5], [1, 4, 3]
    r, big_n = sum(totals) / sum(counts), sum(counts)
    var = 3 / 2 * sum((y - r * k) ** 2 for y, k in zip(totals, counts)) / big_n**2
    assert ratio_standard_error(totals, counts) == pytest.approx(math.sqrt(var))
    assert math.isnan(ratio_standard_error([1.0], [2]))


def test_frontier_targets_follow_the_issue_definitions():
    from seqdiff.evaluation.frontier import targets

    def row(sampler, steps, ppl, sec, calls, exact, se=0.05, ent=2.7):
        return {"sampler": sampler, "label": sampler, "steps": steps, "gen_perplexity": ppl, "seconds_per_sample": sec,
                "denoiser_calls_per_sample": calls, "exact": exact, "checkpoint": "m" if sampler != "ar" else "a",
                "log_gen_perplexity_se": se, "unigram_entropy_nats": ent}

    rows = [row("ancestral", 512, 30.0, 8.0, 512, True), row("first_hitting", 128, 31.0, 1.9, 128, True),
            row("cached", 32, 40.0, 0.5, 30, True), row("cached", 128, 32.0, 1.5, 80, True),
            row("remdm", 32, 32.5, 0.4, 32, False), row("confidence", 32, 5.0, 0.4, 32, False, ent=2.0),
            row("edlm", 32, 33.0, 0.9, 32, False), row("edlm", 128, 25.0, 2.0, 128, False),
            row("ar", 128, 4.0, 0.5, 128, True)]
    t = targets(rows, 128, {"unigram_entropy_nats": 2.7}, batch_size=16)
    f = t["first_hitting_vs_ancestral"]  # 8 / 1.9 > 4 and |log(31 / 30)| = 0.033 < 2 * hypot(0.05, 0.05)
    assert f["speedup"] == pytest.approx(8 / 1.9) and f["within_2se"] and f["met"]
    q = {c["label"]: c for c in t["approximate_at_quarter_calls"]["rows"]}
    assert set(q) == {"remdm", "confidence", "edlm"}  # calls <= 32, approximate only
    assert q["remdm"]["ppl_ratio_to_best_exact"] == pytest.approx(32.5 / 30.0) and q["remdm"]["met"]
    assert not q["confidence"]["met"]  # entropy 26% below real text
    pairs = {p["edlm_steps"]: p for p in t["edlm_vs_mdlm_equal_quality"]["pairs"]}
    assert pairs[32]["mdlm_steps"] == 128 and pairs[32]["speedup"] == pytest.approx(1.5 / 0.9)
    assert pairs[128]["mdlm_steps"] is None and t["edlm_vs_mdlm_equal_quality"]["met"]
    rows[1]["gen_perplexity"] = 36.0  # log(36 / 30) = 0.18 > 2 s.e.: not the same quality
    assert not targets(rows, 128, {"unigram_entropy_nats": 2.7})["first_hitting_vs_ancestral"]["within_2se"]


def test_frontier_labels_tell_checkpoints_apart():
    from seqdiff.evaluation.frontier import distinct_labels

    rows = [{"label": "BD3-LM", "checkpoint": "runs/b4/checkpoints/last.ckpt"},
            {"label": "BD3-LM", "checkpoint": "runs/b16/checkpoints/last.ckpt"},
            {"label": "AR", "checkpoint": "runs/ar/checkpoints/last.ckpt"}]
    distinct_labels(rows)
    assert [r["label"] for r in rows] == ["BD3-LM [b4]", "BD3-LM [b16]", "AR"]
    distinct_labels(rows)  # rendering again changes nothing
    assert [r["label"] for r in rows] == ["BD3-LM [b4]", "BD3-LM [b16]", "AR"]


def test_known_word_share_counts_whole_words_only():
    from seqdiff.evaluation.metrics import known_word_share

    vocab = {"to", "be", "or", "not"}
    share, n = known_word_share(["to be or nxt to b", "not qq "], vocab)
    # first sample: 'b' is cut off (no trailing space) -> to, be, or, nxt, to; second: not, qq (ends in a space)
    assert n == 7 and share == pytest.approx(5 / 7)
    assert math.isnan(known_word_share(["onlyoneword"], vocab)[0])


def test_an_oracle_that_reads_the_other_kind_of_sequence_is_refused(runs, capsys):
    """A text AR run cannot give DNA samples a generative perplexity (nor a DNA one text): refused in one line by
    sample --metrics and frontier; text against text passes whatever the two tokenizers."""
    from types import SimpleNamespace

    from seqdiff.errors import SeqdiffError
    from seqdiff.evaluation.metrics import SeqdiffAROracle, check_oracle_fits
    from seqdiff.tokenizers import CharTokenizer, NucleotideTokenizer

    text_oracle = load_oracle(runs / "ar")
    check_oracle_fits(text_oracle, CharTokenizer(), "a text model")  # text: fine
    with pytest.raises(SeqdiffError, match=r"reads text \(char tokenizer\) but RUN generates DNA"):
        check_oracle_fits(text_oracle, NucleotideTokenizer(), "RUN")
    dna = SeqdiffAROracle(SimpleNamespace(method=SimpleNamespace(causal=True), tokenizer=NucleotideTokenizer(),
                                          path="dna-ar"))
    with pytest.raises(SeqdiffError, match=r"oracle dna-ar reads DNA \(nucleotide tokenizer\) but"):
        check_oracle_fits(dna, CharTokenizer(), "RUN")


@pytest.mark.parametrize("argv, message", [
    (["--steps", "4,x"], "--steps '4,x': give positive step counts"),
    (["--steps", "4", "--num-samples", "3", "--batch-size", "2"], "--num-samples 3 must be a positive multiple"),
])
def test_frontier_bad_arguments_are_one_line(runs, tmp_path, capsys, argv, message):
    out = tmp_path / "fr"
    assert main(["frontier", "--checkpoint", str(runs / "mdlm"), "--oracle", str(runs / "ar"), "--out", str(out),
                 *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and not out.exists()
    assert main(["frontier", "--checkpoint", str(runs / "mdlm"), "--out", str(out)]) == 2  # no --oracle
    assert "give the models (--checkpoint, repeated) and the --oracle" in capsys.readouterr().err
