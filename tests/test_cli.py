import json

import pytest
import torch

from seqdiff.checkpoint import CheckpointError, load_checkpoint
from seqdiff.cli import main
from seqdiff.tokenizers import CharTokenizer, NucleotideTokenizer

FIXTURE = "tests/fixtures/shakespeare_tiny.txt"
TINY = ["model.preset=test", "model.max_seq_len=64", "data.seq_len=32", "data.batch_size=4",
        f"data.train_file={FIXTURE}", f"data.valid_file={FIXTURE}", f"data.test_file={FIXTURE}",
        "train.max_steps=3", "train.val_every=3", "train.val_batches=1", "train.progress_bar=false"]


@pytest.fixture(scope="module")
def run_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    dirs = {}
    for method, extra in [("mdlm", []), ("ar", []), ("tc", ["model.time_conditioning=true"])]:
        name = "mdlm" if method == "tc" else method
        assert main(["train", "--run-dir", str(root / method), *TINY, f"method.name={name}", *extra]) == 0
        dirs[method] = root / method
    return dirs


def test_train_eval_sample_end_to_end(run_dirs, tmp_path, capsys):
    out = tmp_path / "eval.json"
    assert main(["eval", str(run_dirs["mdlm"]), "--num-t-samples", "2", "--out", str(out)]) == 0
    report = json.loads(out.read_text())["results"][0]
    assert report["bound"] is True and report["num_t_samples"] == 2
    assert report["num_tokens"] == len(CharTokenizer().encode(open(FIXTURE).read()))
    assert report["bits_per_character"] == pytest.approx(report["nll_nats_per_token"] / 0.6931471805599453)
    assert main(["eval", str(run_dirs["ar"]), "--out", str(out)]) == 0
    assert json.loads(out.read_text())["results"][0]["bound"] is False
    samples = tmp_path / "samples.txt"
    assert main(["sample", str(run_dirs["mdlm"]), "--num-samples", "3", "--batch-size", "2", "--steps", "8",
                 "--out", str(samples)]) == 0
    assert samples.read_text().count("=== sample") == 3
    assert main(["sample", str(run_dirs["ar"]), "--num-samples", "2"]) == 0
    assert capsys.readouterr().out.count("=== sample") == 2


def test_eval_in_a_fixed_order_is_exact_and_refused_where_it_cannot_apply(run_dirs, tmp_path, capsys):
    out, text = tmp_path / "ordered.json", tmp_path / "slice.txt"  # an order costs a forward per token: 2,000 chars
    text.write_text(open(FIXTURE).read()[:2000])
    assert main(["eval", str(run_dirs["mdlm"]), "--data", str(text), "--order", "left_to_right+right_to_left",
                 "--out", str(out)]) == 0
    report = json.loads(out.read_text())["results"][0]
    assert report["bound"] is False and report["num_t_samples"] is None
    assert report["order"] == "left_to_right+right_to_left" and 0 < report["bits_per_character"] < 10
    assert report["num_tokens"] == len(CharTokenizer().encode(text.read_text()))
    assert main(["eval", str(run_dirs["mdlm"]), "--data", str(text), "--order", "random:2", "--out", str(out)]) == 0
    weighted = json.loads(out.read_text())["results"][0]
    assert weighted["bound"] is True and weighted["order"] == "random:2" and weighted["num_t_samples"] is None
    assert "importance-weighted upper bounds over 2 random orders" in capsys.readouterr().out
    # default output files: the bound and each order keep their own (the order named in the file name)
    from seqdiff.evaluation.zeroshot import eval_results_path, parse_sources

    sources = parse_sources([("data", str(text))], "test")
    paths = {eval_results_path(run_dirs["mdlm"], sources, order=order).name
             for order in (None, "left_to_right", "left_to_right+right_to_left", "random:2")}
    assert len(paths) == 4 and any(name.endswith("-order-left_to_right_right_to_left.json") for name in paths)
    assert "this checkpoint is ar" in _error(capsys, ["eval", str(run_dirs["ar"]), "--order", "left_to_right"])
    assert "time-conditioned" in _error(capsys, ["eval", str(run_dirs["tc"]), "--order", "left_to_right"])
    assert "unknown order 'up'" in _error(capsys, ["eval", str(run_dirs["mdlm"]), "--order", "up",
                                                    "--out", str(tmp_path / "never.json")])
    assert not (tmp_path / "never.json").exists()


def test_eval_is_reproducible(run_dirs, tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    main(["eval", str(run_dirs["mdlm"]), "--out", str(a)])
    main(["eval", str(run_dirs["mdlm"]), "--out", str(b)])
    assert json.loads(a.read_text())["results"] == json.loads(b.read_text())["results"]


def _error(capsys, argv):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1
    return err


def test_bad_input_fails_with_one_clear_message(run_dirs, tmp_path, capsys):
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    assert "empty.txt" in _error(capsys, ["eval", str(run_dirs["mdlm"]), "--data", str(empty)])
    assert "missing.txt" in _error(capsys, ["eval", str(run_dirs["mdlm"]), "--data", str(tmp_path / "missing.txt")])
    assert "does not exist" in _error(capsys, ["eval", str(tmp_path / "nope.ckpt")])
    junk = tmp_path / "junk.ckpt"
    junk.write_bytes(b"not a checkpoint")
    assert "junk.ckpt" in _error(capsys, ["sample", str(junk)])
    assert "model.hiden" in _error(capsys, ["train", "--run-dir", str(tmp_path / "r"), "model.hiden=1"])
    assert "max_seq_len" in _error(capsys, ["sample", str(run_dirs["mdlm"]), "--seq-len", "65"])
    assert "time conditioning" in _error(capsys, ["sample", str(run_dirs["tc"]), "--sampler", "cached"])
    assert "cannot drive" in _error(capsys, ["sample", str(run_dirs["ar"]), "--sampler", "cached"])
    out = tmp_path / "never.txt"
    _error(capsys, ["sample", str(run_dirs["mdlm"]), "--seq-len", "65", "--out", str(out)])
    assert not out.exists() and not list(tmp_path.glob("never*"))
    assert "unknown" in _error(capsys, ["sample", str(run_dirs["mdlm"]), "--sampler", "nope"])


def test_time_conditioned_model_samples_with_ancestral(run_dirs, capsys):
    assert main(["sample", str(run_dirs["tc"]), "--sampler", "ancestral", "--steps", "4", "--num-samples", "1"]) == 0


def test_vocabulary_mismatch_is_refused(run_dirs):
    with pytest.raises(CheckpointError, match="vocabulary does not match"):
        load_checkpoint(run_dirs["mdlm"], tokenizer=NucleotideTokenizer())


def test_checkpoint_round_trip_uses_ema_weights(run_dirs):
    ckpt = torch.load(run_dirs["mdlm"] / "checkpoints" / "last.ckpt", weights_only=False)
    model = load_checkpoint(run_dirs["mdlm"])
    assert model.ema
    name, value = next(iter(ckpt["ema_state_dict"].items()))
    torch.testing.assert_close(model.backbone.state_dict()[name], value)
    raw = load_checkpoint(run_dirs["mdlm"], use_ema=False)
    torch.testing.assert_close(raw.backbone.state_dict()[name], ckpt["state_dict"]["backbone." + name])
    assert model.tokenizer == CharTokenizer()


def test_help_lists_documented_config_keys(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    out = capsys.readouterr().out
    assert "model.time_conditioning" in out and "adaLN conditioning on the noise level" in out
    assert main(["config", "--keys"]) == 0
    assert "train.ema_decay" in capsys.readouterr().out


def test_fasta_output_format():
    from seqdiff.evaluation.generate import Generation, format_samples

    gen = Generation(tokens=[], texts=["ACGT" * 30, "NNAC"], seconds=1.0, denoiser_calls=1, sampler="cached")
    text = format_samples(gen, fasta=True)
    lines = text.splitlines()
    assert lines[0].startswith(">sample_0") and lines[1] == "ACGT" * 20 and lines[2] == "ACGT" * 10
    assert lines[3].startswith(">sample_1") and lines[4] == "NNAC"


def test_dna_train_eval_and_zero_shot_fasta(tmp_path, capsys):
    import shutil

    fa = tmp_path / "slices.fa"  # a copy: pyfaidx writes its index beside the FASTA
    shutil.copy("tests/fixtures/grch37_chr20_slices.fa", fa)
    run = tmp_path / "dna"
    assert main(["train", "--run-dir", str(run), "model.preset=test", "model.max_seq_len=64", "data.kind=fasta",
                 "data.tokenizer=nucleotide", f"data.fasta={fa}", "data.split_mode=bed",
                 "data.bed=tests/fixtures/grch37_chr20_slices.bed",
                 "data.seq_len=64", "data.batch_size=4", "train.max_steps=2", "train.val_every=2",
                 "train.val_batches=1", "train.progress_bar=false"]) == 0
    out = tmp_path / "held_out.json"
    assert main(["eval", str(run), "--out", str(out)]) == 0
    held_out = json.loads(out.read_text())["results"][0]
    assert "bits_per_base" in held_out and held_out["data"] == "fasta test split"
    assert main(["eval", str(run), "--data", str(fa), "--out", str(out)]) == 0
    zero_shot = json.loads(out.read_text())["results"][0]
    text = open(fa).read()
    bases = sum(len(line.strip()) for line in text.splitlines() if not line.startswith(">"))
    n_count = sum(line.strip().upper().count("N") for line in text.splitlines() if not line.startswith(">"))
    assert zero_shot["num_tokens"] == bases - n_count  # N bases are not scored
    small = tmp_path / "small.fa"  # one forward per base: a short slice keeps it quick
    bases_only = "".join(line for line in text.splitlines() if not line.startswith(">")).replace("N", "")
    small.write_text(">slice\n" + bases_only[:300] + "\n")
    assert main(["eval", str(run), "--data", str(small), "--order", "left_to_right", "--rc-conjoin",
                 "--out", str(out)]) == 0  # exact in a fixed order, both strands' denoisers averaged
    ordered = json.loads(out.read_text())["results"][0]
    assert ordered["num_tokens"] == 300 and ordered["bound"] is False and ordered["rc_conjoined"]
    assert main(["sample", str(run), "--num-samples", "2", "--steps", "8"]) == 0
    assert ">sample_0 sampler=cached\n" in capsys.readouterr().out


def test_bench_options_reach_the_benchmark(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "--help"])
    assert exit_info.value.code == 0
    assert "--repeats" in capsys.readouterr().out


def test_edlm_commands_end_to_end(run_dirs, tmp_path, capsys):
    """`seqdiff edlm eval / train-nce` and `seqdiff sample --sampler edlm` (EDLM, seqdiff.edlm) on the tiny runs."""
    mdlm, ar = str(run_dirs["mdlm"]), str(run_dirs["ar"])
    out = tmp_path / "coar.json"
    assert main(["edlm", "eval", mdlm, "--energy", f"coar:{ar}", "--out", str(out), "--batch-size", "8",
                 "--form", "sequence"]) == 0
    report = json.loads(out.read_text())
    assert report["method"] == "edlm-coar" and report["form"] == "sequence" and not report["bound"]
    energy = tmp_path / "e.pt"
    assert main(["edlm", "train-nce", mdlm, "--out", str(energy), "--steps", "2", "--batch-size", "2"]) == 0
    out = tmp_path / "nce.json"
    assert main(["edlm", "eval", mdlm, "--energy", f"nce:{energy}", "--num-partition-samples", "2",
                 "--out", str(out), "--batch-size", "8"]) == 0
    assert json.loads(out.read_text())["num_partition_samples"] == 2
    capsys.readouterr()
    assert main(["sample", mdlm, "--sampler", "edlm", "--energy", f"ar:{ar}", "--edlm-k", "3", "--edlm-window",
                 "0.5", "--steps", "6", "--num-samples", "2", "--batch-size", "2", "--prompt", "the"]) == 0
    text = capsys.readouterr().out
    assert text.count("=== sample") == 2 and all(line.startswith("the") for line in text.splitlines()[1::2])
    assert main(["sample", mdlm, "--sampler", "cached", "--energy", f"ar:{ar}", "--steps", "2"]) == 2
    assert "--energy ar:" in (err := capsys.readouterr().err) and "read by --sampler edlm only" in err
    assert main(["edlm", "eval", mdlm, "--energy", f"ar:{mdlm}"]) == 2  # an MDLM is not an AR energy
    assert "autoregressive" in capsys.readouterr().err
    assert main(["edlm", "eval", mdlm, "--energy", "nce:/nonexistent.pt"]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_config_refuses_what_train_would_refuse_from_the_recipe_alone(capsys):
    """`seqdiff config` does not print a recipe `train` refuses before writing anything (the method's checks need
    the tokenizer: bd3lm's block size must divide data.seq_len); a valid one is printed as before."""
    recipe = "configs/shakespeare_char_bd3lm.yaml"
    assert main(["config", "--config", recipe, "data.seq_len=100", "method.block_size=16"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1
    assert "method.block_size=16 must divide data.seq_len=100" in captured.err
    assert main(["config", "--config", recipe, "data.seq_len=128", "method.block_size=16"]) == 0
    assert "block_size: 16" in capsys.readouterr().out
    assert main(["config", "--config", "configs/shakespeare_char_mdlm.yaml", "data.seq_len=4096"]) == 2
    assert "data.seq_len=4096 exceeds model.max_seq_len=" in capsys.readouterr().err
