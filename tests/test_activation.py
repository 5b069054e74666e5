"""`model.activation`: exact vs tanh GELU in the DiT, closed forms, the default for old checkpoints, HF export."""

import json
import math
import os
import typing

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing here may reach a model hub

import pytest
import torch

from seqdiff.backbones import build_backbone
from seqdiff.backbones.activations import ACTIVATIONS
from seqdiff.checkpoint import LoadedModel, load_checkpoint, model_from_checkpoint
from seqdiff.config import ConfigError, MethodConfig, ModelConfig, from_dict, to_dict
from seqdiff.hf.convert_mdlm import convert_mdlm_state_dict
from seqdiff.hf.export import export_model
from seqdiff.methods import build_method
from seqdiff.tokenizers import CharTokenizer
from tests.test_convert_mdlm import mdlm_state_dict

TOK = CharTokenizer()


def tiny(activation=None, seed=0):
    torch.manual_seed(seed)
    extra = {} if activation is None else {"activation": activation}
    cfg = from_dict(ModelConfig, {"preset": "test", "max_seq_len": 16, "time_conditioning": False, **extra})
    return cfg, build_backbone(cfg, TOK.vocab_size, causal=False).eval()


def ids(seed=0):
    return torch.randint(0, TOK.vocab_size, (2, 12), generator=torch.Generator().manual_seed(seed))


def test_registry_names_are_the_config_choices():
    assert set(ACTIVATIONS) == set(typing.get_args(typing.get_type_hints(ModelConfig)["activation"]))


def test_activations_match_their_closed_forms():
    x = torch.linspace(-6, 6, 241, dtype=torch.float64)
    exact = torch.tensor([0.5 * v * (1 + math.erf(v / math.sqrt(2))) for v in x.tolist()], dtype=torch.float64)
    tanh = 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    torch.testing.assert_close(ACTIVATIONS["gelu"](x), exact, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(ACTIVATIONS["gelu_tanh"](x), tanh, rtol=1e-12, atol=1e-12)
    assert (ACTIVATIONS["gelu"](x) - ACTIVATIONS["gelu_tanh"](x)).abs().max() > 1e-4  # they are different


def test_config_default_is_tanh_and_bad_values_are_named():
    assert ModelConfig().activation == "gelu_tanh"
    assert from_dict(ModelConfig, {"hidden_size": 32, "n_heads": 2}).activation == "gelu_tanh"
    with pytest.raises(ConfigError, match="model.activation.*relu.*gelu"):
        from_dict(ModelConfig, {"activation": "relu"}, prefix="model.")
    with pytest.raises(ConfigError, match="activation='relu'"):
        ModelConfig(activation="relu")


def test_dit_mlp_applies_the_chosen_activation():
    cfg, model = tiny("gelu")
    mlp = model.blocks[0].mlp
    x = torch.randn(2, 5, cfg.hidden_size)
    h = x @ mlp.fc.weight.T + mlp.fc.bias
    exact = 0.5 * h * (1 + torch.erf(h / math.sqrt(2)))
    torch.testing.assert_close(mlp(x), exact @ mlp.proj.weight.T + mlp.proj.bias)
    # the same weights under the tanh GELU give other logits
    _, tanh_model = tiny("gelu_tanh")
    tanh_model.load_state_dict(model.state_dict())
    with torch.no_grad():
        assert not torch.allclose(model(ids()), tanh_model(ids()))


def _checkpoint(cfg, backbone):
    model = to_dict(cfg)
    return {"hyper_parameters": {"model": model, "method": to_dict(MethodConfig()), "tokenizer": TOK.to_dict(),
                                 "seq_len": 12},
            "state_dict": {f"backbone.{k}": v for k, v in backbone.state_dict().items()}}


def test_checkpoint_without_the_key_loads_as_gelu_tanh(tmp_path):
    """Checkpoints written before `model.activation` existed store no such key: they must load unchanged."""
    cfg, model = tiny()
    ckpt = _checkpoint(cfg, model)
    del ckpt["hyper_parameters"]["model"]["activation"]
    loaded = model_from_checkpoint(ckpt, tmp_path / "old.ckpt")
    assert loaded.model_config.activation == "gelu_tanh"
    with torch.no_grad():
        torch.testing.assert_close(loaded.backbone(ids()), model(ids()), rtol=0, atol=0)
    # a checkpoint that says gelu is rebuilt with it
    ckpt["hyper_parameters"]["model"]["activation"] = "gelu"
    exact = model_from_checkpoint(ckpt, tmp_path / "new.ckpt")
    assert exact.model_config.activation == "gelu"
    with torch.no_grad():
        assert not torch.allclose(exact.backbone(ids()), model(ids()))


def test_hf_export_carries_the_activation(tmp_path):
    from seqdiff.hf.modeling import SeqDiffForMaskedLM

    cfg, backbone = tiny("gelu", seed=1)
    method = build_method(MethodConfig(), TOK)
    model = LoadedModel(backbone=backbone, method=method, tokenizer=TOK, model_config=cfg,
                        method_config=MethodConfig(), data_config=None, seq_len=12, step=0, path=tmp_path, ema=False)
    out = export_model(model, tmp_path / "exact")
    assert json.loads((out / "config.json").read_text())["model"]["activation"] == "gelu"
    back = load_checkpoint(out)
    hf = SeqDiffForMaskedLM.from_pretrained(out).eval()
    assert back.model_config.activation == "gelu" and hf.backbone.config.activation == "gelu"
    with torch.no_grad():
        expected = backbone(ids())
        torch.testing.assert_close(back.backbone(ids()), expected, rtol=0, atol=0)
        torch.testing.assert_close(hf(ids()).logits, method.subs_logits(expected))


def test_mdlm_converter_sets_gelu_tanh():
    config, _ = convert_mdlm_state_dict(mdlm_state_dict(), max_seq_len=32)
    assert config.activation == "gelu_tanh"
