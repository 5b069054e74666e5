"""Reverse-complement equivariance (seqdiff.backbones.rc_equivariant): max |g(RC x) - RC g(x)| at float64
round-off for logits, hidden states and the MDLM loss, both forms (shared, conjoined), with and without time
conditioning and padding; a plain DiT fails the same check; refusals; old checkpoints still load."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from seqdiff.backbones import DiT, RCEquivariant, build_backbone
from seqdiff.backbones.rc_equivariant import conjoin_loaded, rc_logits, rc_mask, rc_tokens
from seqdiff.checkpoint import LoadedModel, model_from_checkpoint
from seqdiff.config import ConfigError, DataConfig, MethodConfig, ModelConfig, from_dict, to_dict
from seqdiff.methods import MDLM, build_model
from seqdiff.methods.base import Batch
from seqdiff.tokenizers.char import CharTokenizer
from seqdiff.tokenizers.nucleotide import NucleotideTokenizer

TOK = NucleotideTokenizer()
COMP = TOK.complement_ids
TOL = 1e-10  # float64 round-off (hidden states of a float64 model); a plain DiT is off by ~1e-1
LOGIT_TOL = 1e-6  # the DiT casts its logits to float32, so losses and logits are at float32 round-off
FAIL = 1e-4


def randomize(model: torch.nn.Module, seed: int = 0, std: float = 0.3) -> None:
    """Every parameter random (the adaLN Linears are zero at init, which would hide time conditioning)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(std * torch.randn(p.shape, generator=gen, dtype=p.dtype))


def make(mode: str, time_conditioning: bool, seed: int = 0, local_conv: int = 0,
         local_conv_mlp: bool = False, kmer_sizes: tuple[int, ...] = ()) -> torch.nn.Module:
    cfg = from_dict(ModelConfig, {"preset": "test", "max_seq_len": 32, "time_conditioning": time_conditioning,
                                  "rc_equivariant": mode, "local_conv": local_conv,
                                  "local_conv_mlp": local_conv_mlp, "kmer_sizes": list(kmer_sizes),
                                  "kmer_buckets": 4096})
    model = build_backbone(cfg, TOK.vocab_size, causal=False, complement_ids=COMP).double().eval()
    randomize(model, seed)
    return model


def batch(padded: bool, B: int = 4, L: int = 12, seed: int = 0):
    """ids (B, L) over A C G T N and MASK (some masked), attention mask (B, L) or None (right padding)."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 5, (B, L), generator=gen)
    ids = torch.where(torch.rand(B, L, generator=gen) < 0.3, TOK.mask_id, ids)
    if not padded:
        return ids, None
    lengths = torch.tensor([L, L - 3, 5, 1])[:B]
    mask = torch.arange(L)[None] < lengths[:, None]
    return torch.where(mask, ids, TOK.pad_id), mask


def noise(time_conditioning: bool, B: int = 4):
    return torch.rand(B, generator=torch.Generator().manual_seed(5), dtype=torch.float64) if time_conditioning else None


def logits_error(model, ids, mask, sigma) -> float:
    out = model(ids, sigma, mask)
    out_rc = model(rc_tokens(ids, COMP), sigma, rc_mask(mask))
    return (out_rc - rc_logits(out, COMP)).abs().max().item()


def hidden_error(model, ids, mask, sigma, layer=None) -> float:
    h = model.hidden_states(ids, sigma, mask, layer=layer)
    h_rc = model.hidden_states(rc_tokens(ids, COMP), sigma, rc_mask(mask), layer=layer)
    return (h_rc - h.flip(-2)).abs().max().item()


MODES = ["shared", "conjoined"]


# 1. the RC maps -----------------------------------------------------------------------------------------

def test_complement_map_fixes_specials_and_is_an_involution():
    ids = torch.arange(TOK.vocab_size)
    assert torch.equal(COMP[COMP], ids)
    for base, other in zip("ACGTN", "TGCAN"):
        assert TOK.decode(COMP[TOK.encode(base)]) == other
    for special in (TOK.mask_id, TOK.pad_id, TOK.bos_id, TOK.eos_id, TOK.n_id):
        assert COMP[special] == special
    x = torch.from_numpy(TOK.encode("AACGTN"))[None]
    assert TOK.decode(rc_tokens(x, COMP)[0]) == "NACGTT"
    assert torch.equal(rc_tokens(x, COMP), TOK.reverse_complement(x))
    assert torch.equal(rc_tokens(rc_tokens(x, COMP), COMP), x)


# 2. logits and hidden states ----------------------------------------------------------------------------

@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("time_conditioning,local", [(False, {}), (True, {}), (False, {"local_conv": 3}),
                                                     (True, {"local_conv": 3, "local_conv_mlp": True}),
                                                     (True, {"kmer_sizes": (2, 3)})])  # k-mers: even k is one-sided
@pytest.mark.parametrize("padded", [False, True])
def test_logits_and_hidden_states_are_equivariant(mode, time_conditioning, padded, local):
    model = make(mode, time_conditioning, **local)
    ids, mask = batch(padded)
    sigma = noise(time_conditioning)
    assert logits_error(model, ids, mask, sigma) < LOGIT_TOL
    assert hidden_error(model, ids, mask, sigma) < TOL
    assert hidden_error(model, ids, mask, sigma, layer=1) < TOL
    both = model.strand_hidden_states(ids, sigma, mask)  # (B, L, 2H): RC flips L and swaps the halves
    both_rc = model.strand_hidden_states(rc_tokens(ids, COMP), sigma, rc_mask(mask))
    H = model.config.hidden_size
    swapped = torch.cat([both[..., H:], both[..., :H]], dim=-1).flip(-2)
    assert (both_rc - swapped).abs().max().item() < TOL


@pytest.mark.parametrize("time_conditioning", [False, True])
@pytest.mark.parametrize("padded", [False, True])
def test_a_plain_dit_fails_the_same_check(time_conditioning, padded):
    model = make("none", time_conditioning)
    assert isinstance(model, DiT)
    ids, mask = batch(padded)
    sigma = noise(time_conditioning)
    assert logits_error(model, ids, mask, sigma) > FAIL
    assert hidden_error(model, ids, mask, sigma) > FAIL


def test_wrapper_shapes_and_combinations_against_a_manual_two_pass():
    """shared = mean of the strands' logits; conjoined = log of the mean of their probabilities."""
    ids, mask = batch(True)
    sigma = noise(True)
    shared = make("shared", True)
    inner = shared.inner
    fwd = inner(ids, sigma, mask)
    rev = rc_logits(inner(rc_tokens(ids, COMP), sigma, rc_mask(mask)), COMP)
    torch.testing.assert_close(shared(ids, sigma, mask), 0.5 * (fwd + rev))
    conjoined = RCEquivariant(inner, COMP, mode="conjoined")
    mixture = 0.5 * (fwd.softmax(-1) + rev.softmax(-1))
    torch.testing.assert_close(conjoined(ids, sigma, mask).exp(), mixture)
    h = 0.5 * (inner.hidden_states(ids, sigma, mask)
               + inner.hidden_states(rc_tokens(ids, COMP), sigma, rc_mask(mask)).flip(-2))
    torch.testing.assert_close(shared.hidden_states(ids, sigma, mask), h)
    assert shared(ids, sigma, mask).shape == (4, 12, TOK.vocab_size)
    assert shared.hidden_states(ids, sigma, mask).shape == (4, 12, shared.config.hidden_size)
    # the forwarded attributes the rest of seqdiff reads
    assert shared.vocab_size == TOK.vocab_size and shared.causal is False and shared.blocks is inner.blocks
    assert shared.num_parameters() == inner.num_parameters()
    assert shared.flops_per_token(12) == 2 * inner.flops_per_token(12)
    assert [id(p) for p in shared.head_parameters()] == [id(p) for p in inner.head_parameters()]


def test_conjoining_an_equivariant_model_changes_nothing():
    ids, mask = batch(True)
    shared = make("shared", True)
    sigma = noise(True)
    twice = RCEquivariant(shared, COMP, mode="conjoined")
    torch.testing.assert_close(twice(ids, sigma, mask), torch.log_softmax(shared(ids, sigma, mask), -1))


# 3. the MDLM loss ---------------------------------------------------------------------------------------

def mdlm_loss(method: MDLM, backbone, x0, xt, t, mask):
    """method.loss with its noise pinned to (t, x_t)."""
    method.sample_times = lambda B, device, generator: t
    method.corrupt = lambda x0_, t_, maskable, generator: xt
    return method.loss(backbone, Batch(input_ids=x0, attention_mask=mask))


def loss_inputs(padded: bool):
    gen = torch.Generator().manual_seed(3)
    x0, mask = batch(padded)
    x0 = torch.where(x0 == TOK.mask_id, 2, x0)  # clean data: no MASK
    masked = (torch.rand(x0.shape, generator=gen) < 0.5) & (x0 != TOK.pad_id)
    xt = torch.where(masked, TOK.mask_id, x0)
    t = torch.rand(x0.shape[0], generator=gen, dtype=torch.float64) * 0.9 + 0.05
    return x0, xt, t, mask


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("time_conditioning", [False, True])
@pytest.mark.parametrize("padded", [False, True])
def test_mdlm_loss_is_invariant_under_rc_of_data_and_noise(mode, time_conditioning, padded):
    model = make(mode, time_conditioning)
    method = MDLM(MethodConfig(time_sampling="antithetic"), TOK)  # the test draws times
    x0, xt, t, mask = loss_inputs(padded)
    out = mdlm_loss(method, model, x0, xt, t, mask)
    out_rc = mdlm_loss(method, model, rc_tokens(x0, COMP), rc_tokens(xt, COMP), t, rc_mask(mask))
    assert out.nll_sum.item() > 0.1
    assert abs(out.nll_sum.item() - out_rc.nll_sum.item()) < LOGIT_TOL * out.nll_sum.item()
    assert abs(out.loss.item() - out_rc.loss.item()) < LOGIT_TOL * out.loss.item()
    plain = make("none", time_conditioning)
    a = mdlm_loss(method, plain, x0, xt, t, mask).nll_sum.item()
    b = mdlm_loss(method, plain, rc_tokens(x0, COMP), rc_tokens(xt, COMP), t, rc_mask(mask)).nll_sum.item()
    assert abs(a - b) > FAIL  # the check can fail


@pytest.mark.parametrize("padded", [False, True])
def test_conjoined_loss_is_at_most_the_mean_of_both_strands(padded):
    """Jensen: -log((p + q) / 2) <= (-log p - log q) / 2 at every masked position (SUBS renormalizes
    without MASK, which keeps the inequality: the mixture is compared with the strands' SUBS distributions)."""
    plain = make("none", True)
    method = MDLM(MethodConfig(time_sampling="antithetic"), TOK)  # the test draws times
    x0, xt, t, mask = loss_inputs(padded)
    with torch.no_grad():  # the strands' SUBS distributions have no MASK mass: remove it before mixing
        plain.output.bias[TOK.mask_id] = -1e4
    conjoined = RCEquivariant(plain, COMP, mode="conjoined")
    c = mdlm_loss(method, conjoined, x0, xt, t, mask).nll_sum.item()
    a = mdlm_loss(method, plain, x0, xt, t, mask).nll_sum.item()
    b = mdlm_loss(method, plain, rc_tokens(x0, COMP), rc_tokens(xt, COMP), t, rc_mask(mask)).nll_sum.item()
    assert c <= 0.5 * (a + b) + LOGIT_TOL
    assert c < 0.5 * (a + b) - FAIL  # strictly, on random weights


# 4. building, refusals, checkpoints ---------------------------------------------------------------------

def test_build_model_wraps_and_trains_one_step():
    method, backbone, cfg = build_model(ModelConfig(preset="test", hidden_size=32, n_layers=2, n_heads=2,
                                                    rc_equivariant="shared"), MethodConfig(), TOK)
    assert isinstance(backbone, RCEquivariant) and cfg.rc_equivariant == "shared"
    x0 = torch.randint(0, 4, (2, 8), generator=torch.Generator().manual_seed(0))
    out = method.loss(backbone, Batch(input_ids=x0), torch.Generator().manual_seed(1))
    out.loss.backward()
    assert backbone.inner.embed.weight.grad is not None and torch.isfinite(out.loss)


@pytest.mark.parametrize("mode", MODES)
def test_refusals_name_the_key(mode):
    cfg = ModelConfig(preset="test", hidden_size=32, n_layers=2, n_heads=2, rc_equivariant=mode)
    with pytest.raises(ConfigError, match=r"model\.rc_equivariant=.*complement map"):
        build_model(cfg, MethodConfig(), CharTokenizer())
    with pytest.raises(ConfigError, match=r"model\.rc_equivariant=.*bidirectional"):
        build_model(cfg, MethodConfig(name="ar"), TOK)
    with pytest.raises(ConfigError, match=r"model\.rc_equivariant"):
        ModelConfig(rc_equivariant="both")


def test_conjoined_refused_for_sedd_but_shared_allowed():
    cfg = ModelConfig(hidden_size=32, n_layers=1, n_heads=2, rc_equivariant="conjoined")
    with pytest.raises(ConfigError, match=r"model\.rc_equivariant=conjoined.*sedd"):
        build_model(cfg, MethodConfig(name="sedd"), TOK)
    _, backbone, _ = build_model(dataclasses.replace(cfg, rc_equivariant="shared"), MethodConfig(name="sedd"), TOK)
    assert isinstance(backbone, RCEquivariant)


def fake_checkpoint(model_config: dict, method: str, tokenizer, backbone) -> dict:
    return {"hyper_parameters": {"model": model_config, "method": to_dict(MethodConfig(name=method)),
                                 "data": to_dict(DataConfig()), "tokenizer": tokenizer.to_dict(), "seq_len": 12},
            "state_dict": {f"backbone.{k}": v for k, v in backbone.state_dict().items()}, "global_step": 3}


def test_checkpoint_without_the_key_loads_unwrapped_and_conjoins(tmp_path):
    _, plain, cfg = build_model(ModelConfig(hidden_size=32, n_layers=1, n_heads=2), MethodConfig(), TOK)
    old = to_dict(cfg)
    del old["rc_equivariant"]  # written before the key existed
    loaded = model_from_checkpoint(fake_checkpoint(old, "mdlm", TOK, plain), tmp_path / "x.ckpt")
    assert isinstance(loaded.backbone, DiT) and loaded.model_config.rc_equivariant == "none"
    ids, _ = batch(False)
    before = loaded.backbone(ids)
    conjoin_loaded(loaded)
    assert isinstance(loaded.backbone, RCEquivariant)
    after = loaded.backbone(ids)
    assert not torch.allclose(before.log_softmax(-1), after)
    err = (loaded.backbone(rc_tokens(ids, COMP)) - rc_logits(after, COMP)).abs().max().item()
    assert err < 1e-5  # float32


def test_shared_checkpoint_round_trips(tmp_path):
    _, wrapped, cfg = build_model(ModelConfig(hidden_size=32, n_layers=1, n_heads=2, rc_equivariant="shared"),
                                  MethodConfig(), TOK)
    randomize(wrapped)
    loaded = model_from_checkpoint(fake_checkpoint(to_dict(cfg), "mdlm", TOK, wrapped), tmp_path / "x.ckpt")
    assert isinstance(loaded.backbone, RCEquivariant)
    ids, _ = batch(False)
    torch.testing.assert_close(loaded.backbone(ids), wrapped.eval()(ids))


def test_conjoin_refuses_ar_and_text_models(tmp_path):
    def loaded(method: str, tokenizer) -> LoadedModel:
        m, backbone, cfg = build_model(ModelConfig(hidden_size=32, n_layers=1, n_heads=2), MethodConfig(name=method),
                                       tokenizer)
        return LoadedModel(backbone, m, tokenizer, cfg, MethodConfig(name=method), None, 12, 0, tmp_path, False)

    with pytest.raises(ConfigError, match="--rc-conjoin.*causal"):
        conjoin_loaded(loaded("ar", TOK))
    with pytest.raises(ConfigError, match="--rc-conjoin.*complement map"):
        conjoin_loaded(loaded("mdlm", CharTokenizer()))
    with pytest.raises(ConfigError, match="--rc-conjoin.*sedd"):
        conjoin_loaded(loaded("sedd", TOK))


# 5. the command line ------------------------------------------------------------------------------------

def test_train_eval_sample_with_rc(tmp_path, capsys):
    import json
    import shutil

    from seqdiff.checkpoint import load_checkpoint
    from seqdiff.cli import main

    fa = tmp_path / "slices.fa"  # a copy: pyfaidx writes its index beside the FASTA
    shutil.copy("tests/fixtures/grch37_chr20_slices.fa", fa)
    run = tmp_path / "rc"
    common = ["model.preset=test", "model.max_seq_len=64", "data.kind=fasta", "data.tokenizer=nucleotide",
              f"data.fasta={fa}", "data.split_mode=bed", "data.bed=tests/fixtures/grch37_chr20_slices.bed",
              "data.seq_len=64", "data.batch_size=4", "train.max_steps=2", "train.val_every=2",
              "train.val_batches=1", "train.progress_bar=false"]
    assert main(["train", "--run-dir", str(run), *common, "model.rc_equivariant=shared"]) == 0
    assert isinstance(load_checkpoint(run).backbone, RCEquivariant)
    plain, conj = tmp_path / "plain.json", tmp_path / "conj.json"
    capsys.readouterr()
    assert main(["eval", str(run), "--out", str(plain)]) == 0
    assert "both strands conjoined" not in capsys.readouterr().out
    assert main(["eval", str(run), "--rc-conjoin", "--out", str(conj)]) == 0
    assert "), upper bounds (NELBO), both strands conjoined (--rc-conjoin):" in capsys.readouterr().out  # the header
    a, b = json.loads(plain.read_text()), json.loads(conj.read_text())
    assert b["rc_conjoined"] is True and "rc_conjoined" not in a
    a, b = a["results"][0], b["results"][0]
    # conjoining an equivariant model changes nothing: the same bound, to float32 round-off
    assert abs(a["bits_per_base"] - b["bits_per_base"]) < 1e-5
    assert main(["sample", str(run), "--rc-conjoin", "--num-samples", "2", "--steps", "4"]) == 0
    assert ">sample_0" in capsys.readouterr().out
    # a text recipe is refused in one line naming the key, before anything is written
    text_run = tmp_path / "text"
    fixture = "tests/fixtures/shakespeare_tiny.txt"
    text = ["model.preset=test", "data.seq_len=32", f"data.train_file={fixture}", f"data.valid_file={fixture}",
            f"data.test_file={fixture}", "train.max_steps=1", "model.rc_equivariant=shared"]
    assert main(["train", "--run-dir", str(text_run), *text]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "model.rc_equivariant=shared needs a tokenizer with a complement map" in err[0]
    assert not (text_run / "checkpoints").exists()


RC_RECIPES = sorted((Path(__file__).resolve().parents[1] / "configs").glob("*_rc*.yaml"))


def test_there_are_rc_recipes():
    assert len(RC_RECIPES) == 2


@pytest.mark.parametrize("path", RC_RECIPES, ids=lambda p: p.name)
def test_rc_recipes_build_an_equivariant_model(path):
    from seqdiff.config import load_run_config

    cfg = load_run_config(path)
    assert cfg.model.rc_equivariant == "shared" and cfg.data.tokenizer == "nucleotide"
    small = dataclasses.replace(cfg.model, preset=None, hidden_size=16, n_layers=1, n_heads=2)
    _, backbone, _ = build_model(small, cfg.method, TOK)
    assert isinstance(backbone, RCEquivariant)


def test_export_refuses_an_rc_model(tmp_path):
    from seqdiff.hf.export import ExportError, export_model

    method, backbone, cfg = build_model(ModelConfig(hidden_size=16, n_layers=1, n_heads=2, rc_equivariant="shared"),
                                        MethodConfig(), TOK)
    model = LoadedModel(backbone, method, TOK, cfg, MethodConfig(), None, 12, 0, tmp_path, False)
    with pytest.raises(ExportError, match="model.rc_equivariant=shared"):
        export_model(model, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_probe_encoder_reads_every_layer_of_an_rc_model_and_copies():
    """The probes' layer search hooks the inner modules (which see [x; RC x]): still one state per sequence,
    equal to hidden_states(layer=k), and strand-invariant after pooling; the wrapper deep-copies (fine-tuning)."""
    import copy
    import pickle

    from seqdiff.probes.embeddings import BackboneEncoder

    model = make("shared", False).float()
    ids, mask = batch(True)
    encoder = BackboneEncoder(model, COMP, all_layers=True)
    layers = encoder(ids, mask)  # (B, n_layers + 1, H)
    assert layers.shape == (4, model.config.n_layers + 1, model.config.hidden_size)
    for k in range(model.config.n_layers + 1):
        h = model.hidden_states(ids, None, mask, layer=k if k < model.config.n_layers else None)
        want = (h * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)
        torch.testing.assert_close(layers[:, k], want, rtol=1e-5, atol=1e-5)
    rc_layers = encoder(rc_tokens(ids, COMP), rc_mask(mask))
    torch.testing.assert_close(rc_layers, layers, rtol=1e-5, atol=1e-5)  # mean pooling: strand-invariant
    twin = copy.deepcopy(model)
    assert isinstance(twin, RCEquivariant) and twin.inner is not model.inner
    torch.testing.assert_close(twin(ids, None, mask), model(ids, None, mask))
    torch.testing.assert_close(pickle.loads(pickle.dumps(model))(ids, None, mask), model(ids, None, mask))


def test_probe_encoder_keeps_both_strands_of_an_rc_model_with_rc_both():
    """rc_both on an RC-equivariant backbone reads strand_hidden_states [this | other] (2H per position)
    instead of their average, for the final output and every hooked layer; the average is its two halves'
    mean, and RC swaps the halves (flatten: and reverses the positions)."""
    from seqdiff.probes.embeddings import BackboneEncoder

    model = make("shared", False).float()
    H, n = model.config.hidden_size, model.config.n_layers
    ids, _ = batch(False)
    L = ids.shape[1]
    mask = torch.ones_like(ids, dtype=torch.bool)
    both = BackboneEncoder(model, COMP, all_layers=True, rc_both=True)
    layers, mean = both(ids, mask), BackboneEncoder(model, COMP, all_layers=True)(ids, mask)
    assert layers.shape == (4, n + 1, 2 * H) and both.out_features == 2 * H
    torch.testing.assert_close(0.5 * (layers[..., :H] + layers[..., H:]), mean, rtol=1e-5, atol=1e-5)
    final = model.strand_hidden_states(ids, None, None).mean(1)
    torch.testing.assert_close(layers[:, -1], final, rtol=1e-5, atol=1e-5)
    flat = BackboneEncoder(model, COMP, rc_both=True, pool="flatten", length=L)
    x, rc = flat(ids, mask).reshape(4, L, 2 * H), flat(rc_tokens(ids, COMP), rc_mask(mask)).reshape(4, L, 2 * H)
    torch.testing.assert_close(rc, torch.cat([x[..., H:], x[..., :H]], -1).flip(1), rtol=1e-5, atol=1e-5)
    assert not torch.allclose(x[..., :H], x[..., H:], atol=1e-4)  # the two strands' states differ


def test_an_nce_energy_starts_from_an_rc_mdlm():
    from seqdiff.edlm.nce_energy import EnergyNet

    _, backbone, _ = build_model(ModelConfig(hidden_size=16, n_layers=1, n_heads=2, rc_equivariant="shared"),
                                 MethodConfig(), TOK)
    net = EnergyNet.from_mdlm(backbone, TOK.vocab_size, TOK.mask_id)
    assert isinstance(net.trunk, DiT) and net.model_config.rc_equivariant == "none"
    torch.testing.assert_close(net.trunk.blocks[0].mlp.fc.weight, backbone.inner.blocks[0].mlp.fc.weight)
