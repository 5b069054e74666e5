"""The MDLM ancestral and cached samplers keep x_theta as logits at the masked positions and make float64
probabilities only where a step reveals (seqdiff.samplers.mdlm_ancestral.MaskedX0). The draws are those of the
dense path (every position's probabilities, as `denoise` gives them), so the tokens must be identical."""

import pytest
import torch

from seqdiff.config import MethodConfig, ModelConfig
from seqdiff.methods import MDLM, build_model
from seqdiff.samplers import MDLMAncestralSampler, MDLMCachedSampler
from seqdiff.samplers.mdlm_ancestral import MaskedX0
from seqdiff.tokenizers import CharTokenizer
from tests.test_mdlm import TinyNet

TOK = CharTokenizer(alphabet="abc", normalize="none")


class DenseAncestral(MDLMAncestralSampler):
    lazy = False  # every position's float64 probabilities at every step: the reference path


class DenseCached(MDLMCachedSampler):
    lazy = False


def _dit(tok, seq_len):
    torch.manual_seed(0)
    method, backbone, _ = build_model(ModelConfig(preset="test", max_seq_len=seq_len, dropout=0.0),
                                      MethodConfig(name="mdlm"), tok)
    with torch.no_grad():  # the DiT zero-initializes its output layer: random weights give peaked, varied logits
        for param in backbone.parameters():
            param.normal_(0.0, 0.5)
    return method, backbone.eval()


@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.7, 0.9), (0.0, 1.0), (1.3, 0.5)])
@pytest.mark.parametrize("steps", [3, 16, 40])
def test_lazy_tokens_equal_the_dense_path_on_a_dit_with_the_sparse_head(temperature, top_p, steps):
    tok = CharTokenizer()
    method, net = _dit(tok, 16)
    assert method.uses_sparse_head(net)
    for lazy_cls, dense_cls in ((MDLMAncestralSampler, DenseAncestral), (MDLMCachedSampler, DenseCached)):
        lazy = lazy_cls(method, net, steps=steps, temperature=temperature, top_p=top_p)
        dense = dense_cls(method, net, steps=steps, temperature=temperature, top_p=top_p)
        assert lazy.lazy and not dense.lazy
        a = lazy.generate(5, 16, torch.Generator().manual_seed(steps))
        b = dense.generate(5, 16, torch.Generator().manual_seed(steps))
        assert torch.equal(a.tokens, b.tokens), (lazy_cls.__name__, temperature, top_p, steps)
        assert a.num_denoiser_calls == b.num_denoiser_calls


def test_lazy_tokens_equal_the_dense_path_without_a_sparse_head_with_prompts_and_noise_removal():
    """TinyNet has no sparse head (the full output is gathered); the linear schedule leaves masks at t = 0 for the
    final fill; `given` fixes some positions; 50 steps over 12 positions make the cache skip and merge rows."""
    net = TinyNet(12).eval()
    given = torch.full((4, 12), -1)
    given[:, 0], given[1, 5], given[3, 11] = 0, 2, 1
    for schedule in ("loglinear", "linear"):
        method = MDLM(MethodConfig(schedule=schedule), TOK)
        assert not method.uses_sparse_head(net)
        for lazy_cls, dense_cls in ((MDLMAncestralSampler, DenseAncestral), (MDLMCachedSampler, DenseCached)):
            for steps in (4, 50):
                a = lazy_cls(method, net, steps=steps, top_p=0.8).generate(4, 12, torch.Generator().manual_seed(3),
                                                                           given=given)
                b = dense_cls(method, net, steps=steps, top_p=0.8).generate(4, 12, torch.Generator().manual_seed(3),
                                                                            given=given)
                assert torch.equal(a.tokens, b.tokens), (schedule, lazy_cls.__name__, steps)
                assert a.num_denoiser_calls == b.num_denoiser_calls
                assert (a.tokens[given >= 0] == given[given >= 0]).all()


def test_the_cache_merge_keeps_unchanged_rows_and_recomputes_changed_ones():
    """_merge against a fresh call on the whole batch: the same logits at every masked position."""
    net = TinyNet(6).eval()
    method = MDLM(MethodConfig(), TOK)
    sampler = MDLMCachedSampler(method, net, steps=8)
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 3, (4, 6), generator=g)
    x[torch.rand(4, 6, generator=g) < 0.6] = method.mask_id
    t = torch.full((4,), 0.5, dtype=torch.float64)
    cache: dict = {}
    first, calls = sampler.masked_x0(x, t, cache)
    assert calls == 1 and torch.equal(first.index, (x == method.mask_id).flatten().nonzero()[:, 0])
    same, calls = sampler.masked_x0(x.clone(), t, cache)
    assert calls == 0 and same is first  # nothing revealed: reused
    y = x.clone()
    for row in (1, 3):  # reveal one masked token in rows 1 and 3
        col = int((y[row] == method.mask_id).nonzero()[0, 0])
        y[row, col] = 2
    merged, calls = sampler.masked_x0(y, t, cache)
    whole = MaskedX0(*method.denoise_masked(net, y, t.float()))
    assert calls == 1
    assert torch.equal(merged.index, whole.index)
    torch.testing.assert_close(merged.logits, whole.logits)
    # the unchanged rows' logits are the first call's (TinyNet's rows depend on the whole row only)
    keep = (merged.index // 6 == 0) | (merged.index // 6 == 2)
    assert torch.equal(merged.logits[keep], first.at(merged.index[keep]))


def test_d3pm_keeps_the_dense_path():
    from seqdiff.methods.d3pm import D3PM
    from seqdiff.samplers.d3pm_ancestral import D3PMAncestralSampler

    method = D3PM(MethodConfig(name="d3pm", num_timesteps=8), TOK)
    assert not D3PMAncestralSampler(method, TinyNet(6).eval(), steps=8).lazy


@pytest.mark.parametrize("sampler", ["cached", "edlm"])
def test_the_sampler_experiment_runs_both_arms_to_the_same_tokens(sampler):
    from experiments import sampler_lazy

    def run(arm):
        args = sampler_lazy.parse(["--vocab-size", "300", "--batch", "2", "--seq-len", "12", "--steps", "6",
                                   "--threads", "1", "--sampler", sampler, "--edlm-k", "3", "--arm", arm])
        args.top_p = 0.9  # main() does this for a child run
        return sampler_lazy.one_run(args)

    lazy, dense = run("lazy"), run("dense")
    assert lazy["checksum"] == dense["checksum"] and lazy["denoiser_calls"] == dense["denoiser_calls"] == 6
    if sampler == "edlm":  # both arms went through the importance steps, k candidates each
        assert lazy["importance_steps"] == dense["importance_steps"] > 0
    row = {"top_p": 0.9, "lazy_s": 1.0, "dense_s": 3.0, "speedup": 3.0, "lazy_rss_mb": 10, "dense_rss_mb": 20,
           "denoiser_calls": 6, "same_tokens": True}
    results = {"command": "python -m experiments.sampler_lazy", "date": "d", "seconds": 1, "torch": "t",
               "load_average": 0.5, "rows": [row],
               "config": {"threads": 1, "hidden": 128, "layers": 2, "vocab_size": 300, "batch": 2, "seq_len": 12,
                          "steps": 6, "rounds": 1}}
    assert "| 0.9 | 1.00 | 3.00 | 3.00x | 10 | 20 | 6 | True |" in sampler_lazy.table(results)


@pytest.mark.parametrize("schedule", ["cap", "conf"])
def test_remdm_step_with_probabilities_at_revealed_positions_equals_the_dense_step(schedule):
    """ReMDM's step asks x_theta only where it reveals (Sampler.probs_at); against every position's float64
    probabilities with the nucleus filter, as the step took them before: the same tokens and confidences."""
    from seqdiff.categorical import probs_from_logits
    from seqdiff.samplers.remdm import ReMDMSampler

    method = MDLM(MethodConfig(), TOK)
    sampler = ReMDMSampler(method, TinyNet(10).eval(), steps=10, temperature=0.8, top_p=0.7, schedule=schedule,
                           eta=0.1)
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 3, (6, 10), generator=g)
    x[torch.rand(6, 10, generator=g) < 0.5] = method.mask_id
    logits = method.subs_logits(torch.randn(6, 10, TOK.vocab_size, generator=g))
    dense = probs_from_logits(logits, 0.8, 0.7)  # (B, L, V)
    t, s = torch.full((6,), 0.6, dtype=torch.float64), torch.full((6,), 0.5, dtype=torch.float64)
    fixed = torch.zeros_like(x, dtype=torch.bool)
    conf_a = torch.rand(6, 10, dtype=torch.float64, generator=g)
    conf_b = conf_a.clone()
    a = sampler.step(sampler.probs_at(logits), x, fixed, conf_a, t, s, torch.Generator().manual_seed(1))
    b = sampler.step(lambda positions: dense.flatten(0, 1)[positions], x, fixed, conf_b, t, s,
                     torch.Generator().manual_seed(1))
    assert torch.equal(a, b) and torch.equal(conf_a, conf_b)
    assert ((x == method.mask_id) & (a != method.mask_id)).any()  # the step revealed something


@pytest.mark.parametrize("bad", [["--top-p", "0.9,x"], ["--top-p", "1.5"], ["--steps", "0"], ["--edlm-k", "0"],
                                 ["--sampler", "euler"]])
def test_the_sampler_experiment_refuses_bad_options(bad, capsys):
    from experiments import sampler_lazy

    with pytest.raises(SystemExit) as e:
        sampler_lazy.parse(bad)
    assert e.value.code == 2 and bad[0] in capsys.readouterr().err
