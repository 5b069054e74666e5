"""BERT backbone: hidden-state and logit parity with transformers' BertModel / BertForMaskedLM from the same
weights (tiny random configs built here, and the real MiniLM when the data directory has it), and clear errors."""

import json
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing here may reach a model hub

import pytest
import torch

from seqdiff.backbones import Bert, build_backbone, load_pretrained, pretrained_model_config
from seqdiff.backbones.bert import BertPretrainedError
from seqdiff.config import ConfigError, MethodConfig, ModelConfig
from seqdiff.methods import MDLM, build_model

V = 50


def hf_bert(tmp_path: Path, mlm: bool = False, hidden_act: str = "gelu", seed: int = 0, vocab_size: int = V,
            **overrides):
    """A tiny random Hugging Face BERT saved as config.json + model.safetensors; returns (model, dir)."""
    from transformers import BertConfig, BertForMaskedLM, BertModel

    cfg = BertConfig(vocab_size=vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=128, max_position_embeddings=40, hidden_act=hidden_act, hidden_dropout_prob=0.0,
                     attention_probs_dropout_prob=0.0, **overrides)
    torch.manual_seed(seed)
    model = (BertForMaskedLM if mlm else BertModel)(cfg).eval()
    with torch.no_grad():  # move LayerNorms, biases and the token-type row away from their trivial init
        for name, p in model.named_parameters():
            if "LayerNorm" in name or name.endswith("bias") or "token_type" in name:
                p.add_(0.2 * torch.randn_like(p))
    out = tmp_path / ("mlm" if mlm else "encoder")
    model.save_pretrained(out)
    return model, out


def ours(path: Path, max_seq_len: int = 24, **extra) -> Bert:
    cfg = ModelConfig(backbone="bert", init_from=str(path), max_seq_len=max_seq_len, time_conditioning=False, **extra)
    cfg, _ = pretrained_model_config(cfg)
    model = build_backbone(cfg, V, causal=False)
    report = load_pretrained(model, cfg)
    return model.eval(), report


def batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, V, (3, 17), generator=g)
    mask = torch.ones(3, 17, dtype=torch.long)
    mask[1, 11:] = 0  # a padded row exercises the key mask
    return ids, mask


@pytest.mark.parametrize("hidden_act", ["gelu", "gelu_new"])
def test_hidden_states_match_transformers_bert_model(tmp_path, hidden_act):
    ref, path = hf_bert(tmp_path, hidden_act=hidden_act)
    model, report = ours(path)
    assert model.config.activation == {"gelu": "gelu", "gelu_new": "gelu_tanh"}[hidden_act]
    assert (model.config.hidden_size, model.config.n_layers, model.config.n_heads, model.config.mlp_ratio) == \
        (32, 2, 4, 4)
    assert sorted(report["fresh"]) == ["head.bias", "head.dense.bias", "head.dense.weight", "head.norm.bias",
                                       "head.norm.weight"]  # BertModel has no MLM head
    ids, mask = batch()
    with torch.no_grad():
        expected = ref(input_ids=ids, attention_mask=mask).last_hidden_state
        got = model.hidden_states(ids, attention_mask=mask)
        assert expected.abs().max() > 0.5
        real = mask.bool()
        torch.testing.assert_close(got[real], expected[real], rtol=1e-5, atol=1e-5)
        # without a mask: all positions, and the logits use the tied word embeddings
        torch.testing.assert_close(model.hidden_states(ids), ref(input_ids=ids).last_hidden_state, rtol=1e-5,
                                   atol=1e-5)
        # padding changes nothing at the real positions of the padded row
        short = model.hidden_states(ids[1:2, :11])
        torch.testing.assert_close(got[1, :11], short[0], rtol=1e-5, atol=1e-5)


def test_masked_lm_head_loads_and_matches_bert_for_masked_lm(tmp_path):
    ref, path = hf_bert(tmp_path, mlm=True, seed=1)
    model, report = ours(path)
    assert report["fresh"] == []
    ids, mask = batch(1)
    with torch.no_grad():
        expected = ref(input_ids=ids, attention_mask=mask).logits
        got = model(ids, attention_mask=mask)
        real = mask.bool()
        torch.testing.assert_close(got[real], expected[real], rtol=1e-5, atol=1e-5)
    # the decoder is the word embedding itself (tied): one tensor, trained once
    assert "head.decoder.weight" not in model.state_dict()
    assert model.embeddings.word.weight.data_ptr() == next(
        p for n, p in model.named_parameters() if n == "embeddings.word.weight").data_ptr()


def test_mdlm_trains_the_bert_backbone_without_time_conditioning(tmp_path):
    from types import SimpleNamespace

    tok = SimpleNamespace(vocab_size=V, mask_id=V - 1, pad_id=0, bos_id=1, eos_id=2)
    method, backbone, cfg = build_model(ModelConfig(backbone="bert", hidden_size=16, n_layers=1, n_heads=2,
                                                    max_seq_len=16), MethodConfig(name="mdlm"), tok)
    assert isinstance(method, MDLM) and isinstance(backbone, Bert) and cfg.time_conditioning is False
    x = torch.randint(3, V - 1, (4, 16), generator=torch.Generator().manual_seed(0))
    out = method.loss(backbone, x, torch.Generator().manual_seed(0))
    out.loss.backward()
    assert torch.isfinite(out.loss) and backbone.embeddings.word.weight.grad.abs().sum() > 0


def test_refusals_name_the_problem(tmp_path):
    from types import SimpleNamespace

    tok = SimpleNamespace(vocab_size=V, mask_id=V - 1, pad_id=0, bos_id=1, eos_id=2)
    with pytest.raises(ConfigError, match="bidirectional"):
        build_model(ModelConfig(backbone="bert", hidden_size=16, n_heads=2), MethodConfig(name="ar"), tok)
    with pytest.raises(ConfigError, match="time conditioning"):
        build_model(ModelConfig(backbone="bert", hidden_size=16, n_heads=2), MethodConfig(name="sedd"), tok)
    with pytest.raises(ConfigError, match="backbone that loads published weights"):
        pretrained_model_config(ModelConfig(init_from=str(tmp_path)))
    with pytest.raises(BertPretrainedError, match="config.json does not exist"):
        pretrained_model_config(ModelConfig(backbone="bert", init_from=str(tmp_path / "none")))
    _, path = hf_bert(tmp_path)
    with pytest.raises(BertPretrainedError, match="max_seq_len=64 exceeds the checkpoint's 40"):
        ours(path, max_seq_len=64)
    cfg, _ = pretrained_model_config(ModelConfig(backbone="bert", init_from=str(path), max_seq_len=16))
    with pytest.raises(BertPretrainedError, match="50 word embeddings but the tokenizer has 51"):
        load_pretrained(build_backbone(cfg, V + 1, causal=False), cfg)
    wrong = ModelConfig(backbone="bert", init_from=str(path), hidden_size=32, n_layers=3, n_heads=4, max_seq_len=16,
                        activation="gelu")
    with pytest.raises(BertPretrainedError, match="model.n_layers=3 but the checkpoint has 2"):
        load_pretrained(build_backbone(wrong, V, causal=False), wrong)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "model_type": "gpt2"}))
    with pytest.raises(BertPretrainedError, match="model_type 'gpt2'"):
        pretrained_model_config(ModelConfig(backbone="bert", init_from=str(path)))


@pytest.mark.requires_source("bert-vocab")
def test_real_minilm_matches_transformers(data_source):
    from transformers import BertModel

    MINILM = data_source("bert-vocab")

    ref = BertModel.from_pretrained(str(MINILM)).eval()
    cfg, changed = pretrained_model_config(ModelConfig(backbone="bert", init_from=str(MINILM), max_seq_len=128,
                                                       time_conditioning=False))
    assert (cfg.hidden_size, cfg.n_layers, cfg.n_heads, cfg.activation) == (384, 6, 12, "gelu")
    assert changed["activation"] == ("gelu_tanh", "gelu")
    model = build_backbone(cfg, 30522, causal=False)
    load_pretrained(model, cfg)
    model.eval()
    from seqdiff.tokenizers import BertTokenizer

    tok = BertTokenizer(MINILM)
    text = "It is a truth universally acknowledged, that a single man in possession of a good fortune"
    ids = torch.tensor([[tok.bos_id, *tok.encode(text).tolist(), tok.eos_id]])
    with torch.no_grad():
        torch.testing.assert_close(model.hidden_states(ids), ref(input_ids=ids).last_hidden_state, rtol=1e-4,
                                   atol=1e-4)


def test_seqdiff_train_starts_from_the_bert_weights_and_the_run_travels(tmp_path, capsys):
    """`seqdiff train model.init_from=DIR`: shape from DIR's config.json, weights loaded (lr 0 keeps them), and
    the run is an ordinary seqdiff model: eval, sample, export, transformers' AutoModelForMaskedLM."""
    from transformers import AutoModelForMaskedLM

    from seqdiff.backbones.bert import hf_bert_state_dict
    from seqdiff.checkpoint import load_checkpoint
    from seqdiff.cli import main
    from seqdiff.hf import register_auto_classes
    from seqdiff.tokenizers import CharTokenizer

    tok = CharTokenizer()
    ref, path = hf_bert(tmp_path, mlm=True, seed=2, vocab_size=tok.vocab_size)
    fixture = "tests/fixtures/shakespeare_tiny.txt"
    run = tmp_path / "run"
    args = ["train", "--run-dir", str(run), "model.backbone=bert", f"model.init_from={path}", "model.max_seq_len=32",
            "data.seq_len=32", "data.batch_size=4", f"data.train_file={fixture}", f"data.valid_file={fixture}",
            f"data.test_file={fixture}", "train.max_steps=1", "train.lr=0", "train.val_every=1",
            "train.val_batches=1", "train.progress_bar=false", "train.ema_decay=0"]
    assert main(args) == 0
    err = capsys.readouterr().err
    assert "model.n_layers=2 (recipe: 4)" in err and "weights loaded from" in err
    model = load_checkpoint(run)
    assert model.model_config.backbone == "bert" and model.model_config.n_layers == 2
    expected = hf_bert_state_dict(ref.state_dict(), 2, 32)
    own = model.backbone.state_dict()
    for name, tensor in expected.items():
        torch.testing.assert_close(own[name], tensor, rtol=0, atol=0, msg=name)

    assert main(["eval", str(run), "--batch-size", "2"]) == 0
    assert main(["sample", str(run), "--steps", "4", "--num-samples", "1", "--seq-len", "16"]) == 0
    assert main(["export", str(run), str(tmp_path / "hf")]) == 0
    register_auto_classes()
    hf = AutoModelForMaskedLM.from_pretrained(tmp_path / "hf").eval()
    ids = torch.randint(0, tok.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, model.method.subs_logits(model.backbone(ids)))
    # a missing directory is one clear line
    assert main([*args[:2], str(tmp_path / "run2"), "model.backbone=bert", "model.init_from=/nonexistent/bert"]) == 2
    assert "/nonexistent/bert/config.json does not exist" in capsys.readouterr().err


def test_head_parameters_are_the_weights_an_encoder_checkpoint_leaves_fresh(tmp_path):
    """For a BERT without a masked-LM head, the LP-FT "head" is exactly what loading leaves newly initialized;
    for one with a head, the same parameters (now loaded); the tied decoder weight belongs to the encoder."""
    _, encoder = hf_bert(tmp_path)
    model, report = ours(encoder)
    names = {id(p): n for n, p in model.named_parameters()}
    head = sorted(names[id(p)] for p in model.head_parameters())
    assert head == sorted(report["fresh"]) == ["head.bias", "head.dense.bias", "head.dense.weight", "head.norm.bias",
                                               "head.norm.weight"]
    _, mlm = hf_bert(tmp_path, mlm=True)
    model, report = ours(mlm)
    names = {id(p): n for n, p in model.named_parameters()}
    assert report["fresh"] == [] and sorted(names[id(p)] for p in model.head_parameters()) == head


def test_export_with_encoder_alpha_writes_the_wise_ft_interpolation(tmp_path, capsys):
    """`seqdiff export RUN OUT --encoder-alpha A`: encoder (1 - A) x init_from + A x fine-tuned, head as fine-tuned."""
    from seqdiff.backbones.bert import hf_bert_state_dict
    from seqdiff.backbones.wise_ft import encoder_keys
    from seqdiff.checkpoint import load_checkpoint
    from seqdiff.cli import main
    from seqdiff.tokenizers import CharTokenizer

    tok = CharTokenizer()
    ref, path = hf_bert(tmp_path, seed=3, vocab_size=tok.vocab_size)
    fixture = "tests/fixtures/shakespeare_tiny.txt"
    run = tmp_path / "run"
    common = [f"data.train_file={fixture}", f"data.valid_file={fixture}", f"data.test_file={fixture}",
              "model.max_seq_len=32", "data.seq_len=32", "data.batch_size=4", "train.max_steps=2", "train.lr=1e-2",
              "train.warmup_steps=1", "train.val_every=2", "train.val_batches=1", "train.progress_bar=false",
              "train.ema_decay=0"]
    assert main(["train", "--run-dir", str(run), "model.backbone=bert", f"model.init_from={path}", *common]) == 0
    assert main(["export", str(run), str(tmp_path / "wise"), "--encoder-alpha", "0.25"]) == 0
    tuned = load_checkpoint(run).backbone
    pre = hf_bert_state_dict(ref.state_dict(), 2, 32)
    post = tuned.state_dict()
    wise = load_checkpoint(tmp_path / "wise").backbone.state_dict()
    keys = encoder_keys(tuned)
    assert set(keys) == set(pre) and len(keys) < len(post)  # the head is not in the pretrained encoder
    for k in post:
        expected = pre[k] + 0.25 * (post[k] - pre[k]) if k in keys else post[k]
        torch.testing.assert_close(wise[k], expected, rtol=1e-6, atol=1e-7, msg=k)
    assert any(not torch.equal(pre[k], post[k]) for k in keys)  # the run moved the encoder: the check has teeth
    assert json.loads((tmp_path / "wise" / "config.json").read_text())["wise_ft_alpha"] == 0.25
    assert "wise_ft_alpha" not in json.loads(_export(main, run, tmp_path / "plain").read_text())
    capsys.readouterr()
    # a model trained from scratch has no pretrained encoder to go back to; alpha outside [0, 1] is refused
    assert main(["train", "--run-dir", str(tmp_path / "dit"), "model.preset=test", *common]) == 0
    assert main(["export", str(tmp_path / "dit"), str(tmp_path / "x"), "--encoder-alpha", "0.5"]) == 2
    assert "WiSE-FT needs a model fine-tuned from pretrained weights" in capsys.readouterr().err
    assert main(["export", str(run), str(tmp_path / "y"), "--encoder-alpha", "1.5"]) == 2
    assert "must lie in [0, 1]" in capsys.readouterr().err
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()


def _export(main, run, out):
    assert main(["export", str(run), str(out)]) == 0
    return out / "config.json"
