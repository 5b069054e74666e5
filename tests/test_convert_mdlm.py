"""The MDLM reference DiT layout -> seqdiff's DiT: exact on a tiny random model, clear errors otherwise.

The reference forward below is written from the MDLM DiT's conventions (see seqdiff/hf/convert_mdlm.py):
rotate-half rotary pairs, LayerNorm with a weight and no bias, adaLN chunks (shift, scale, gate) x 2,
no qkv / attention-output bias, sigma zeroed when the model is not time-conditioned.
"""

import math
import os
import pickle

import pytest
import torch
import torch.nn.functional as F

from seqdiff.backbones.dit import DiT
from seqdiff.checkpoint import load_checkpoint
from seqdiff.hf.convert_mdlm import MDLMConversionError, convert_mdlm_checkpoint, convert_mdlm_state_dict, main
from seqdiff.tokenizers import CharTokenizer

V, H, N_HEADS, C, N_LAYERS = 13, 16, 2, 8, 2
D = H // N_HEADS


def mdlm_state_dict(seed=0, prefix="backbone.", V=V):
    """Random weights with the reference names and shapes (LayerNorm weights away from 1, adaLN non-zero)."""
    g = torch.Generator().manual_seed(seed)

    def r(*shape, scale=0.3):
        return torch.randn(*shape, generator=g) * scale

    def ln():
        return 0.5 + torch.rand(H, generator=g)

    sd = {
        "vocab_embed.embedding": r(V, H, scale=1.0),
        "sigma_map.mlp.0.weight": r(C, 256), "sigma_map.mlp.0.bias": r(C),
        "sigma_map.mlp.2.weight": r(C, C), "sigma_map.mlp.2.bias": r(C),
        "rotary_emb.inv_freq": 1.0 / (10_000 ** (torch.arange(0, D, 2).float() / D)),
        "output_layer.norm_final.weight": ln(),
        "output_layer.adaLN_modulation.weight": r(2 * H, C), "output_layer.adaLN_modulation.bias": r(2 * H),
        "output_layer.linear.weight": r(V, H), "output_layer.linear.bias": r(V),
    }
    for i in range(N_LAYERS):
        b = f"blocks.{i}."
        sd.update({
            b + "norm1.weight": ln(), b + "norm2.weight": ln(),
            b + "attn_qkv.weight": r(3 * H, H), b + "attn_out.weight": r(H, H),
            b + "mlp.0.weight": r(4 * H, H), b + "mlp.0.bias": r(4 * H),
            b + "mlp.2.weight": r(H, 4 * H), b + "mlp.2.bias": r(H),
            b + "adaLN_modulation.weight": r(6 * H, C), b + "adaLN_modulation.bias": r(6 * H),
        })
    return {prefix + k: v for k, v in sd.items()}


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def mdlm_reference_forward(sd, indices, sigma, time_conditioning):
    """The reference DiT's forward in float64, from its conventions (not seqdiff code)."""
    w = {k.removeprefix("backbone."): v.double() for k, v in sd.items()}
    H = w["vocab_embed.embedding"].shape[1]
    B, L = indices.shape
    if not time_conditioning:
        sigma = torch.zeros_like(sigma)
    half = 128
    freqs = torch.exp(-math.log(10_000) * torch.arange(half, dtype=torch.float64) / half)
    args = sigma.double()[:, None] * freqs[None]
    t_freq = torch.cat([torch.cos(args), torch.sin(args)], dim=-1)
    c = F.linear(F.silu(F.linear(t_freq, w["sigma_map.mlp.0.weight"], w["sigma_map.mlp.0.bias"])),
                 w["sigma_map.mlp.2.weight"], w["sigma_map.mlp.2.bias"])
    c = F.silu(c)
    pos = torch.arange(L, dtype=torch.float64)
    emb = torch.outer(pos, w["rotary_emb.inv_freq"])
    emb = torch.cat((emb, emb), dim=-1)
    cos, sin = emb.cos()[None, :, None, :], emb.sin()[None, :, None, :]

    def norm(x, weight):
        return F.layer_norm(x, [H]) * weight

    def modulate(x, shift, scale):
        return x * (1 + scale) + shift

    x = w["vocab_embed.embedding"][indices]
    for i in range(N_LAYERS):
        b = f"blocks.{i}."
        mods = F.linear(c, w[b + "adaLN_modulation.weight"], w[b + "adaLN_modulation.bias"])[:, None].chunk(6, dim=2)
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = mods
        qkv = F.linear(modulate(norm(x, w[b + "norm1.weight"]), shift_msa, scale_msa), w[b + "attn_qkv.weight"])
        q, k, v = qkv.view(B, L, 3, N_HEADS, D).unbind(2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        att = torch.softmax(torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(D), dim=-1)
        y = torch.einsum("bhqk,bkhd->bqhd", att, v).reshape(B, L, H)
        x = x + gate_msa * F.linear(y, w[b + "attn_out.weight"])
        h = modulate(norm(x, w[b + "norm2.weight"]), shift_mlp, scale_mlp)
        h = F.linear(F.gelu(F.linear(h, w[b + "mlp.0.weight"], w[b + "mlp.0.bias"]), approximate="tanh"),
                     w[b + "mlp.2.weight"], w[b + "mlp.2.bias"])
        x = x + gate_mlp * h
    shift, scale = F.linear(c, w["output_layer.adaLN_modulation.weight"],
                            w["output_layer.adaLN_modulation.bias"])[:, None].chunk(2, dim=2)
    x = modulate(norm(x, w["output_layer.norm_final.weight"]), shift, scale)
    return F.linear(x, w["output_layer.linear.weight"], w["output_layer.linear.bias"])


def converted_model(sd, **options):
    config, weights = convert_mdlm_state_dict(sd, max_seq_len=32, **options)
    model = DiT(config, vocab_size=weights["embed.weight"].shape[0], causal=False)
    model.load_state_dict(weights, strict=True)  # every seqdiff weight is produced, nothing else
    return config, model.eval()


@pytest.mark.parametrize("time_conditioning", [False, True])
def test_converted_model_matches_the_reference_forward(time_conditioning):
    sd = mdlm_state_dict()
    config, model = converted_model(sd, time_conditioning=time_conditioning)
    assert (config.hidden_size, config.n_layers, config.n_heads, config.cond_dim, config.mlp_ratio) == (H, 2, 2, C, 4)
    assert config.time_conditioning is time_conditioning
    g = torch.Generator().manual_seed(1)
    indices = torch.randint(0, V, (3, 11), generator=g)
    sigma = torch.rand(3, generator=g) * 5
    expected = mdlm_reference_forward(sd, indices, sigma, time_conditioning)
    with torch.no_grad():
        got = model(indices, noise_level=sigma)
    assert got.abs().max() > 1  # a non-trivial function of the inputs
    torch.testing.assert_close(got.double(), expected, rtol=1e-4, atol=1e-4)
    # sigma matters exactly when the model is time-conditioned
    with torch.no_grad():
        other = model(indices, noise_level=sigma + 1)
    assert torch.equal(other, got) is not time_conditioning


def test_rotary_pairing_is_what_the_permutation_fixes():
    """Without the q/k channel permutation the attention differs (so the test above checks it)."""
    sd = mdlm_state_dict()
    _, model = converted_model(sd)
    for block in model.blocks:  # undo the permutation: seqdiff channel 2i <- i, 2i+1 <- i + D/2
        w = block.attn.qkv.weight.data.view(3, N_HEADS, D, H)
        inverse = torch.argsort(torch.stack([torch.arange(D // 2), torch.arange(D // 2) + D // 2], -1).flatten())
        w[:2] = w[:2, :, inverse].clone()
    indices = torch.randint(0, V, (2, 9), generator=torch.Generator().manual_seed(2))
    expected = mdlm_reference_forward(sd, indices, torch.zeros(2), False)
    with torch.no_grad():
        assert not torch.allclose(model(indices).double(), expected, atol=1e-3)


def test_larger_vocabulary_appends_rows_that_are_never_predicted():
    sd = mdlm_state_dict(prefix="")  # prefix-free layouts are accepted too
    config, weights = convert_mdlm_state_dict(sd, vocab_size=V + 1)
    assert weights["embed.weight"].shape == (V + 1, H) and weights["output.bias"][-1] == -1e4
    torch.testing.assert_close(weights["embed.weight"][:V], sd["vocab_embed.embedding"])


def test_bad_state_dicts_fail_with_a_clear_message():
    sd = mdlm_state_dict()
    with pytest.raises(MDLMConversionError, match="vocab_embed.embedding"):
        convert_mdlm_state_dict({k: v for k, v in sd.items() if "vocab_embed" not in k})
    broken = dict(sd)
    del broken["backbone.blocks.1.attn_out.weight"]
    with pytest.raises(MDLMConversionError, match="blocks.1.attn_out.weight"):
        convert_mdlm_state_dict(broken)
    broken = dict(sd, **{"backbone.blocks.0.mlp.2.bias": torch.zeros(H + 1)})
    with pytest.raises(MDLMConversionError, match=r"mlp.2.bias has shape \(17,\), expected \(16,\)"):
        convert_mdlm_state_dict(broken)
    broken = dict(sd, **{"backbone.blocks.0.attn_qkv.bias": torch.zeros(3 * H)})
    with pytest.raises(MDLMConversionError, match="no place for.*attn_qkv.bias"):
        convert_mdlm_state_dict(broken)
    broken = dict(sd, **{"backbone.rotary_emb.inv_freq": sd["backbone.rotary_emb.inv_freq"] * 2})
    with pytest.raises(MDLMConversionError, match="inv_freq"):
        convert_mdlm_state_dict(broken)
    with pytest.raises(MDLMConversionError, match="pass n_heads"):
        convert_mdlm_state_dict({k: v for k, v in sd.items() if "inv_freq" not in k})
    broken = dict(sd, **{"backbone.blocks.0.norm2.weight": torch.zeros(H)})
    with pytest.raises(MDLMConversionError, match="near zero"):
        convert_mdlm_state_dict(broken, time_conditioning=True)
    convert_mdlm_state_dict(broken, time_conditioning=False)  # folded into an affine LayerNorm: fine
    with pytest.raises(MDLMConversionError, match="smaller"):
        convert_mdlm_state_dict(sd, vocab_size=V - 1)


def test_converted_checkpoint_is_a_seqdiff_model_directory(tmp_path, capsys):
    """The written directory loads like an export; seqdiff's MDLM sees the reference's denoiser."""
    tok = CharTokenizer()  # 31 ids, [MASK] = 30 = the last row, as in the reference's layout
    sd = mdlm_state_dict(V=tok.vocab_size)
    torch.save(sd, tmp_path / "mdlm.pt")
    out = convert_mdlm_checkpoint(tmp_path / "mdlm.pt", tmp_path / "converted", tokenizer=tok, max_seq_len=32)
    model = load_checkpoint(out)
    assert model.method.name == "mdlm" and model.tokenizer == tok and not model.model_config.time_conditioning
    indices = torch.randint(0, tok.vocab_size, (2, 12), generator=torch.Generator().manual_seed(3))
    expected = mdlm_reference_forward(sd, indices, torch.zeros(2), False)
    with torch.no_grad():
        torch.testing.assert_close(model.backbone(indices).double(), expected, rtol=1e-4, atol=1e-4)
    # a tokenizer whose MASK id is not the reference's mask index
    with pytest.raises(MDLMConversionError, match="MASK id"):
        convert_mdlm_checkpoint(mdlm_state_dict(V=tok.vocab_size + 1), tmp_path / "x", tokenizer=tok)
    assert not os.path.exists(tmp_path / "x")
    assert main([str(tmp_path / "missing.safetensors"), str(tmp_path / "y"), "--tokenizer", "char"]) == 2
    assert "missing.safetensors does not exist" in capsys.readouterr().err
    # checked before the tokenizer: no GPT-2 vocabulary here, yet the missing file is what is said
    assert main([str(tmp_path / "missing.ckpt"), str(tmp_path / "y"), "--vocab-dir", str(tmp_path / "none")]) == 2
    assert "missing.ckpt does not exist" in capsys.readouterr().err
    # a seqdiff checkpoint given by mistake: the message says what to do with it
    torch.save({"state_dict": {"backbone.embed.weight": torch.zeros(2, 2)}}, tmp_path / "last.ckpt")
    with pytest.raises(MDLMConversionError, match="looks like a seqdiff checkpoint"):
        convert_mdlm_checkpoint(tmp_path / "last.ckpt", tmp_path / "w", tokenizer=tok)
    assert main([str(tmp_path / "mdlm.pt"), str(tmp_path / "z"), "--tokenizer", "char", "--max-seq-len", "32"]) == 0
    assert load_checkpoint(tmp_path / "z").seq_len == 32


# ----------------------------------------------------------------------- a Lightning checkpoint of the reference
def _trap(marker):
    """Would run if the loader executed pickled code: writes `marker`."""
    with open(marker, "w") as f:
        f.write("pickled code ran")


class _ReferenceTokenizer:
    """Stands for the transformers tokenizer object that the reference's save_hyperparameters() pickles."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return _trap, (self.marker,)


def reference_lightning_checkpoint(path, tok, marker):
    """A .ckpt laid out as the MDLM reference's Lightning module writes it: state_dict (backbone.*), the EMA as
    {decay, num_updates, shadow_params: [backbone parameters in order]}, and hyper_parameters holding an OmegaConf
    config and the tokenizer object. Returns (raw state dict, EMA state dict)."""
    omegaconf = pytest.importorskip("omegaconf")
    raw = mdlm_state_dict(seed=0, V=tok.vocab_size)
    ema = mdlm_state_dict(seed=1, V=tok.vocab_size)
    shadow = [v for k, v in ema.items() if not k.endswith("rotary_emb.inv_freq")]
    config = omegaconf.OmegaConf.create({"backbone": "dit", "parameterization": "subs", "time_conditioning": False,
                                         "model": {"hidden_size": H, "n_heads": N_HEADS}, "training": {"ema": 0.9999}})
    torch.save({"epoch": 0, "global_step": 10, "pytorch-lightning_version": "2.2.1", "state_dict": raw,
                "ema": {"decay": 0.9999, "num_updates": 10, "shadow_params": shadow},
                "loops": {"fit_loop": {}}, "optimizer_states": [], "lr_schedulers": [], "callbacks": {},
                "hparams_name": "kwargs", "hyper_parameters": {"config": config,
                                                               "tokenizer": _ReferenceTokenizer(str(marker))}}, path)
    return raw, ema


def test_a_reference_lightning_checkpoint_converts_its_ema_weights_without_running_pickled_code(tmp_path, capsys):
    tok = CharTokenizer()
    marker = tmp_path / "code-ran"
    ckpt = tmp_path / "last.ckpt"
    raw, ema = reference_lightning_checkpoint(ckpt, tok, marker)
    with pytest.raises(pickle.UnpicklingError):  # the safe loader refuses it: the reason this path exists
        torch.load(ckpt, weights_only=True)
    indices = torch.randint(0, tok.vocab_size, (2, 12), generator=torch.Generator().manual_seed(5))
    for argv, weights, ema_flag in (([], ema, True), (["--no-ema"], raw, False)):
        out = tmp_path / f"out{len(argv)}"
        assert main([str(ckpt), str(out), "--tokenizer", "char", "--max-seq-len", "32", *argv]) == 0
        assert ("EMA" in capsys.readouterr().out) == ema_flag
        model = load_checkpoint(out)
        assert model.ema is ema_flag
        with torch.no_grad():
            torch.testing.assert_close(model.backbone(indices).double(),
                                       mdlm_reference_forward(weights, indices, torch.zeros(2), False),
                                       rtol=1e-4, atol=1e-4)
    assert not marker.exists()  # the pickled tokenizer's code never ran
    # the EMA and the raw weights really differ, so the check above can tell them apart
    assert (mdlm_reference_forward(ema, indices, torch.zeros(2), False)
            - mdlm_reference_forward(raw, indices, torch.zeros(2), False)).abs().max() > 0.1


def test_an_ema_that_does_not_fit_the_state_dict_is_named(tmp_path):
    from seqdiff.hf.convert_mdlm import load_state_dict_file

    raw = mdlm_state_dict()
    shadow = [v for k, v in raw.items() if "inv_freq" not in k]
    torch.save({"state_dict": raw, "ema": {"shadow_params": shadow[:-1]}}, tmp_path / "short.ckpt")
    with pytest.raises(MDLMConversionError, match=r"EMA holds \d+ tensors.*--no-ema"):
        load_state_dict_file(tmp_path / "short.ckpt")
    assert load_state_dict_file(tmp_path / "short.ckpt", use_ema=False)[1] == "raw"
    torch.save({"state_dict": raw, "ema": {"shadow_params": shadow[1:] + shadow[:1]}}, tmp_path / "shuffled.ckpt")
    with pytest.raises(MDLMConversionError, match="has shape"):
        load_state_dict_file(tmp_path / "shuffled.ckpt")
    torch.save({"state_dict": raw}, tmp_path / "no_ema.ckpt")
    assert load_state_dict_file(tmp_path / "no_ema.ckpt")[1] == "raw"


def test_n_heads_option_converts_weights_without_the_rotary_buffer(tmp_path, capsys):
    tok = CharTokenizer()
    sd = {k: v for k, v in mdlm_state_dict(V=tok.vocab_size).items() if "inv_freq" not in k}
    torch.save(sd, tmp_path / "no_rotary.pt")
    assert main([str(tmp_path / "no_rotary.pt"), str(tmp_path / "a"), "--tokenizer", "char"]) == 2
    assert "--n-heads" in capsys.readouterr().err
    assert main([str(tmp_path / "no_rotary.pt"), str(tmp_path / "b"), "--tokenizer", "char", "--max-seq-len", "32",
                 "--n-heads", str(N_HEADS)]) == 0
    assert load_checkpoint(tmp_path / "b").model_config.n_heads == N_HEADS


def test_seqdiff_commands_never_run_code_pickled_in_a_checkpoint(tmp_path, capsys):
    """export / sample / eval read checkpoints with torch's weights-only unpickler: a foreign .ckpt whose pickle
    names a callable is refused in one line and the callable never runs; the MDLM reference's is named as such,
    with the command that converts it."""
    from seqdiff.cli import main as seqdiff

    tok = CharTokenizer()
    marker = tmp_path / "code-ran"
    reference = tmp_path / "reference.ckpt"
    reference_lightning_checkpoint(reference, tok, marker)
    trap = tmp_path / "trap.ckpt"  # a seqdiff-looking checkpoint with one object that would run code
    torch.save({"hyper_parameters": {"tokenizer": _ReferenceTokenizer(str(marker))}, "state_dict": {}}, trap)
    for argv in (["export", str(reference), str(tmp_path / "out")], ["sample", str(reference)],
                 ["eval", str(trap)], ["export", str(trap), str(tmp_path / "out2")]):
        assert seqdiff(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "Traceback" not in err, err
        if "reference" in argv[1]:
            assert (f"is a checkpoint of another code base (it holds omegaconf.dictconfig.DictConfig, as the MDLM "
                    f"reference's do); convert its weights with `python -m seqdiff.hf.convert_mdlm {reference} OUT`"
                    ) in err
        else:
            assert "holds Python objects other than tensors and plain values" in err and "_trap" in err
    assert not marker.exists()  # no pickled code ran
    assert not (tmp_path / "out").exists() and not (tmp_path / "out2").exists()
