"""`seqdiff export` -> a Hugging Face directory that seqdiff and transformers both load with the same logits."""

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing here may reach a model hub

import pytest
import torch

from seqdiff.checkpoint import CheckpointError, LoadedModel, load_checkpoint
from seqdiff.cli import main
from seqdiff.config import MethodConfig, ModelConfig, load_run_config
from seqdiff.hf.export import ExportError, export_checkpoint, export_model
from seqdiff.methods import METHODS, build_method
from seqdiff.tokenizers import CharTokenizer
from seqdiff.training.run import train

FIXTURE = "tests/fixtures/shakespeare_tiny.txt"
TINY = ["model.preset=test", "model.max_seq_len=64", "data.seq_len=32", "data.batch_size=4",
        f"data.train_file={FIXTURE}", f"data.valid_file={FIXTURE}", f"data.test_file={FIXTURE}",
        "train.max_steps=3", "train.val_every=3", "train.val_batches=1", "train.progress_bar=false",
        "train.ema_decay=0.9"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf_runs")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models: one thread is much faster on a busy 2-core machine
    try:
        for method in ("mdlm", "ar"):
            train(load_run_config(None, [*TINY, f"method.name={method}"]), root / method)
    finally:
        torch.set_num_threads(threads)
    return root


@pytest.fixture(scope="module")
def exported(runs):
    return {m: export_checkpoint(runs / m, runs / f"{m}-hf") for m in ("mdlm", "ar")}


def _inputs(vocab_size, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab_size, (3, 20), generator=g)
    mask = torch.ones(3, 20, dtype=torch.long)
    mask[1, 15:] = 0  # one padded row exercises the attention-mask path
    return ids, mask


def test_export_writes_the_hf_layout_and_seqdiff_reloads_it_exactly(runs, exported):
    out = exported["mdlm"]
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors", "modeling_seqdiff.py",
                                                     "tokenizer.json", "tokenizer_config.json"]
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "seqdiff" and config["architectures"] == ["SeqDiffForMaskedLM"]
    assert config["ema_weights"] is True and config["step"] == 3
    assert config["auto_map"]["AutoModelForMaskedLM"] == "modeling_seqdiff.SeqDiffForMaskedLM"
    assert not list(runs.glob(".mdlm-hf*"))  # the temporary folder was renamed into place
    ref, back = load_checkpoint(runs / "mdlm"), load_checkpoint(out)
    assert back.tokenizer == ref.tokenizer and back.method.name == "mdlm" and back.seq_len == 32 and back.ema
    ids, mask = _inputs(ref.tokenizer.vocab_size)
    with torch.no_grad():
        torch.testing.assert_close(back.backbone(ids, attention_mask=mask), ref.backbone(ids, attention_mask=mask),
                                   rtol=0, atol=0)
    # EMA weights by default; --no-ema exports the raw ones
    raw = export_checkpoint(runs / "mdlm", runs / "mdlm-raw", use_ema=False)
    raw_model, raw_ref = load_checkpoint(raw), load_checkpoint(runs / "mdlm", use_ema=False)
    assert not raw_model.ema
    with torch.no_grad():
        torch.testing.assert_close(raw_model.backbone(ids), raw_ref.backbone(ids), rtol=0, atol=0)
        assert not torch.allclose(raw_model.backbone(ids), back.backbone(ids))


def test_auto_classes_give_the_checkpoint_logits(runs, exported):
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForMaskedLM

    from seqdiff.hf import register_auto_classes

    register_auto_classes()
    register_auto_classes()  # idempotent
    mdlm = AutoModelForMaskedLM.from_pretrained(exported["mdlm"]).eval()
    ref = load_checkpoint(runs / "mdlm")
    assert type(mdlm).__name__ == "SeqDiffForMaskedLM" and AutoConfig.from_pretrained(exported["mdlm"]).seq_len == 32
    ids, mask = _inputs(ref.tokenizer.vocab_size)
    with torch.no_grad():
        expected = ref.method.subs_logits(ref.backbone(ids, attention_mask=mask))  # x_theta: MASK logit -inf
        labels = torch.where(ids == ref.tokenizer.mask_id, -100, ids)  # MASK is never a target
        out = mdlm(input_ids=ids, attention_mask=mask, labels=labels, output_hidden_states=True)
        torch.testing.assert_close(out.logits, expected)
        assert torch.isneginf(out.logits[..., ref.tokenizer.mask_id]).all() and torch.isfinite(out.loss)
        assert out.hidden_states[0].shape == (3, 20, 32)
        torch.testing.assert_close(mdlm.backbone(ids), ref.backbone(ids))  # the raw DiT logits

    ar = AutoModelForCausalLM.from_pretrained(exported["ar"]).eval()
    ref_ar = load_checkpoint(runs / "ar")
    with torch.no_grad():
        out = ar(input_ids=ids, attention_mask=mask, labels=ids)
        torch.testing.assert_close(out.logits, ref_ar.backbone(ids, attention_mask=mask))
        # the causal-LM loss is seqdiff's AR NLL when the input starts with BOS
        text = ids % ref_ar.tokenizer.num_regular  # no special ids (seqdiff does not score PAD)
        block = torch.cat([torch.full((3, 1), ref_ar.tokenizer.bos_id), text], dim=1)
        nll = ref_ar.method.loss(ref_ar.backbone, text).loss
        torch.testing.assert_close(ar(input_ids=block, labels=block).loss, nll)
    with pytest.raises(ValueError, match="AutoModelForCausalLM"):
        AutoModelForMaskedLM.from_pretrained(exported["ar"])


REMOTE_CODE_SCRIPT = """
import sys
import seqdiff, seqdiff.checkpoint, seqdiff.cli, seqdiff.hf, seqdiff.hf.export
assert "transformers" not in sys.modules, "importing seqdiff must not import transformers"
import torch
from transformers import AutoModelForMaskedLM
model = AutoModelForMaskedLM.from_pretrained(sys.argv[1], trust_remote_code=True).eval()
assert any(name.endswith("modeling_seqdiff") for name in sys.modules), "not loaded through auto_map"
with torch.no_grad():
    torch.save(model(torch.load(sys.argv[2])).logits, sys.argv[3])
"""


def test_trust_remote_code_loads_the_shipped_module(runs, exported, tmp_path):
    """A fresh interpreter that never registers anything: config.json's auto_map and modeling_seqdiff.py do it."""
    import subprocess

    ref = load_checkpoint(runs / "mdlm")
    ids, _ = _inputs(ref.tokenizer.vocab_size, seed=1)
    torch.save(ids, tmp_path / "ids.pt")
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    proc = subprocess.run([sys.executable, "-c", REMOTE_CODE_SCRIPT, str(exported["mdlm"]), str(tmp_path / "ids.pt"),
                           str(tmp_path / "logits.pt")], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with torch.no_grad():
        torch.testing.assert_close(torch.load(tmp_path / "logits.pt"), ref.method.subs_logits(ref.backbone(ids)))


def test_time_conditioned_model_takes_the_noise_level(tmp_path):
    from seqdiff.hf.modeling import SeqDiffForMaskedLM

    tok = CharTokenizer()
    cfg = ModelConfig(hidden_size=16, n_layers=1, n_heads=2, cond_dim=8, time_conditioning=True, max_seq_len=16)
    method = build_method(MethodConfig(), tok)
    torch.manual_seed(0)
    from seqdiff.backbones import build_backbone

    backbone = build_backbone(cfg, tok.vocab_size, causal=False)
    for p in backbone.parameters():  # adaLN starts at zero: perturb it so the noise level matters
        p.data += 0.1 * torch.randn_like(p)
    model = LoadedModel(backbone=backbone, method=method, tokenizer=tok, model_config=cfg,
                        method_config=MethodConfig(), data_config=None, seq_len=16, step=0, path=tmp_path, ema=False)
    out = export_model(model, tmp_path / "tc")
    hf = SeqDiffForMaskedLM.from_pretrained(out).eval()
    ids, noise = torch.randint(0, tok.vocab_size, (2, 16)), torch.tensor([0.3, 2.0])
    with torch.no_grad():
        torch.testing.assert_close(hf(ids, noise_level=noise).logits, method.subs_logits(backbone(ids, noise)))
        with pytest.raises(ValueError, match="noise_level"):
            hf(ids)


@pytest.mark.parametrize("local", [{"local_conv": 5}, {"kmer_sizes": [2, 3], "kmer_buckets": 4096}])
def test_a_model_with_local_structure_exports_with_its_weights(tmp_path, local):
    from seqdiff.backbones import build_backbone
    from seqdiff.hf.modeling import SeqDiffForCausalLM

    tok = CharTokenizer()
    cfg = ModelConfig(hidden_size=16, n_layers=2, n_heads=2, max_seq_len=16, **local)
    method_config = MethodConfig(name="ar")
    torch.manual_seed(0)
    backbone = build_backbone(cfg, tok.vocab_size, causal=True)
    if backbone.kmer_embed is not None:  # a trained projection, not the zero it starts at
        torch.nn.init.normal_(backbone.kmer_embed.proj.weight)
    model = LoadedModel(backbone=backbone, method=build_method(method_config, tok), tokenizer=tok, model_config=cfg,
                        method_config=method_config, data_config=None, seq_len=16, step=0, path=tmp_path, ema=False)
    hf = SeqDiffForCausalLM.from_pretrained(export_model(model, tmp_path / "conv")).eval()
    ids = torch.randint(0, tok.vocab_size, (2, 16))
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, backbone(ids))
    assert all(hf.config.model[key] == value for key, value in local.items())


def _umask() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return umask


def test_cli_export_and_bad_input(runs, exported, tmp_path, capsys):
    out = tmp_path / "cli-export"
    assert main(["export", str(runs / "ar"), str(out), "--no-ema"]) == 0
    assert "exported" in capsys.readouterr().out
    assert main(["sample", str(out), "--num-samples", "1", "--seq-len", "8"]) == 0  # seqdiff uses the export
    capsys.readouterr()

    def error(argv):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("error:") == 1
        return err

    assert "--overwrite" in error(["export", str(runs / "ar"), str(out)])
    (out / "eval").mkdir()
    (out / "eval" / "test.json").write_text("{}")
    assert main(["export", str(runs / "ar"), str(out), "--overwrite"]) == 0
    assert "removes what was added to it too: eval" in capsys.readouterr().err
    assert {p.name: p.stat().st_mode & 0o777 for p in out.iterdir()}["model.safetensors"] == \
        0o666 & ~_umask()  # the weights are as readable as the rest of the export
    # --overwrite replaces an earlier export, never a folder of other files
    other = tmp_path / "my-files"
    other.mkdir()
    (other / "thesis.tex").write_text("keep")
    assert "is not a seqdiff export" in error(["export", str(runs / "ar"), str(other), "--overwrite"])
    assert [p.name for p in other.iterdir()] == ["thesis.tex"]
    # a checkpoint without a tokenizer
    ckpt = torch.load(runs / "mdlm" / "checkpoints" / "last.ckpt", weights_only=False)
    del ckpt["hyper_parameters"]["tokenizer"]
    torch.save(ckpt, tmp_path / "no_tokenizer.ckpt")
    assert "holds no tokenizer" in error(["export", str(tmp_path / "no_tokenizer.ckpt"), str(tmp_path / "x")])
    assert not (tmp_path / "x").exists()
    # an exported directory whose config names an unknown method
    bad = tmp_path / "bad-method"
    export_checkpoint(runs / "mdlm", bad)
    config = json.loads((bad / "config.json").read_text())
    config["method"]["name"] = "flow"
    (bad / "config.json").write_text(json.dumps(config))
    msg = error(["eval", str(bad), "--data", FIXTURE])
    assert "'flow'" in msg and all(name in msg for name in METHODS)
    with pytest.raises(CheckpointError, match="allowed methods"):
        load_checkpoint(bad)
    config["model_type"] = "bert"
    (bad / "config.json").write_text(json.dumps(config))
    assert "not a model exported by `seqdiff export`" in error(["sample", str(bad)])


def test_failed_export_leaves_nothing_behind(runs, tmp_path, monkeypatch):
    import safetensors.torch

    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(safetensors.torch, "save_file", broken)
    with pytest.raises(OSError, match="disk full"):
        export_checkpoint(runs / "mdlm", tmp_path / "out")
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(ExportError, match="holds the checkpoint"):
        export_checkpoint(runs / "mdlm", runs, overwrite=True)


def test_auto_tokenizer_loads_the_exported_directory(runs, exported):
    from transformers import AutoTokenizer

    from seqdiff.checkpoint import load_checkpoint

    for method in ("mdlm", "ar"):
        hf = AutoTokenizer.from_pretrained(str(exported[method]), trust_remote_code=False)  # as docs/export.md
        tok = load_checkpoint(exported[method]).tokenizer
        text = Path(FIXTURE).read_text()[:5_000]
        assert hf(text)["input_ids"] == tok.encode(text).tolist()
        assert hf.mask_token_id == tok.mask_id and hf.model_max_length == 32


def test_the_exported_ar_model_generates_with_transformers_as_seqdiff_decodes_greedily(runs, exported):
    """`generate()` on the exported AR model (greedy, after BOS) gives the tokens of an argmax loop over seqdiff's
    own checkpoint; sampling runs too, and a padded left-aligned batch is not needed (one prompt per row)."""
    from transformers import AutoModelForCausalLM

    from seqdiff.hf import register_auto_classes

    register_auto_classes()
    ar = AutoModelForCausalLM.from_pretrained(exported["ar"]).eval()
    ref = load_checkpoint(runs / "ar")
    tok = ref.tokenizer
    prompt = torch.tensor([[tok.bos_id, *tok.encode("the ")]])
    with torch.no_grad():
        out = ar.generate(prompt, max_new_tokens=12, do_sample=False, pad_token_id=tok.pad_id)
        ids = prompt
        for _ in range(12):
            ids = torch.cat([ids, ref.backbone(ids)[:, -1].argmax(-1, keepdim=True)], dim=1)
        assert out.tolist() == ids.tolist()
        sampled = ar.generate(prompt, max_new_tokens=5, do_sample=True, top_k=0, pad_token_id=tok.pad_id)
        assert sampled.shape == (1, prompt.shape[1] + 5) and sampled[0, :prompt.shape[1]].tolist() == prompt[0].tolist()
