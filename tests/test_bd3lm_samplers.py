"""The MDLM samplers inside BD3-LM's blocks (seqdiff.samplers.bd3lm.within_blocks): first-hitting against the
enumerated joint law (exact) and its conditional given a prompt; with one block (L' = L) each block sampler draws
the MDLM sampler's own tokens, with smaller blocks it does not; the KV cache gives the uncached tokens; prompts kept,
every position revealed, the call count of one reveal per call; the registry's names, labels and refusals."""

from __future__ import annotations

import pytest
import torch
from scipy.stats import chisquare

from seqdiff.config import MethodConfig
from seqdiff.methods import MDLM
from seqdiff.samplers import (
    BLOCK_SAMPLERS,
    SAMPLERS,
    BD3LMSampler,
    BD3LMUncachedSampler,
    ConfidenceSampler,
    MDLMFirstHittingSampler,
    ReMDMSampler,
    SamplerError,
    ThresholdSampler,
    build_sampler,
    sampler_name,
    within_blocks,
)
from tests.test_bd3lm import MASK, TOK, AttentionOracle, EOSNet, _joint_counts, bd3lm, dit, random_joint

INNER = {"first_hitting": MDLMFirstHittingSampler, "remdm": ReMDMSampler, "confidence": ConfidenceSampler,
         "threshold": ThresholdSampler}
OPTIONS = {"first_hitting": {}, "remdm": {"schedule": "rescale", "eta": 0.5}, "confidence": {},
           "threshold": {"threshold": 0.5}}


def _cached(name):
    return SAMPLERS[f"bd3lm_{name}"]


def _uncached(name):
    return within_blocks(INNER[name], BD3LMUncachedSampler)


def _chi2_p(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs.double() * counts.sum()
    keep = expected > 5
    expected = expected[keep] * counts[keep].sum() / expected[keep].sum()
    return chisquare(counts[keep].numpy(), expected.numpy()).pvalue


# ---------------------------------------------------------------------------------------------------- exact
@pytest.mark.parametrize("cached", [True, False])
def test_first_hitting_in_blocks_reproduces_the_joint(cached):
    """An exact denoiser that sees only what the block-causal attention lets it see: the first-hitting process in
    each block, the prefix through the KV cache (or re-read), draws the enumerated joint over 3^4 sequences."""
    L, N = 4, 4000
    joint = random_joint(L, seed=2)
    sampler = (_cached if cached else _uncached)("first_hitting")(bd3lm(block_size=2), AttentionOracle(joint, L))
    out = sampler.generate(N, L, torch.Generator().manual_seed(0))
    assert not (out.tokens == MASK).any()
    assert _chi2_p(_joint_counts(out.tokens), joint) > 1e-3


def test_first_hitting_in_blocks_with_a_prompt_samples_the_conditional():
    L, N = 4, 3000
    joint = random_joint(L, seed=3)
    oracle = AttentionOracle(joint, L)
    given = torch.tensor([1, -1, -1, -1])  # the prompt ends inside the first block
    out = _cached("first_hitting")(bd3lm(block_size=2), oracle).generate(N, L, torch.Generator().manual_seed(1),
                                                                         given=given)
    assert (out.tokens[:, 0] == 1).all()
    rows = oracle.states[:, 0] == 1
    assert _chi2_p(_joint_counts(out.tokens)[rows], joint[rows] / joint[rows].sum()) > 1e-3


def test_the_joint_test_refutes_an_approximate_block_sampler():
    """The same check has the power to fail: confidence top-k with one step per block commits both tokens of a
    block from their marginals, which misses the within-block correlation of this joint."""
    L, N = 4, 4000
    joint = random_joint(L, seed=2)
    out = _cached("confidence")(bd3lm(block_size=2), AttentionOracle(joint, L), steps=1).generate(
        N, L, torch.Generator().manual_seed(0))
    assert _chi2_p(_joint_counts(out.tokens), joint) < 1e-6


# ---------------------------------------------------------------------------------------------------- the same process
@pytest.mark.parametrize("name", list(INNER))
def test_one_block_is_the_mdlm_sampler_and_smaller_blocks_are_not(name):
    """L' = L: the block loop runs the inner sampler's reverse process once, on the whole sequence, with the same
    denoiser, so it draws exactly the MDLM sampler's tokens for the same generator; with L' < L the prefix is read
    block-causally and the blocks are drawn one after another, so the tokens differ."""
    L, steps = 12, 6
    model = dit(max_seq_len=L)
    mdlm = INNER[name](MDLM(MethodConfig(), TOK), model, steps=steps, **OPTIONS[name])
    given = torch.full((L,), -1)
    given[:3] = torch.tensor([0, 2, 1])
    for g in (None, given):
        ref = mdlm.generate(3, L, torch.Generator().manual_seed(4), given=g)
        one = _uncached(name)(bd3lm(block_size=L), model, steps=steps, **OPTIONS[name]).generate(
            3, L, torch.Generator().manual_seed(4), given=g)
        assert torch.equal(one.tokens, ref.tokens) and one.num_denoiser_calls == ref.num_denoiser_calls
        blocks = _cached(name)(bd3lm(block_size=4), model, steps=steps, **OPTIONS[name]).generate(
            3, L, torch.Generator().manual_seed(4), given=g)
        assert not torch.equal(blocks.tokens, ref.tokens)


@pytest.mark.parametrize("name", list(INNER))
def test_kv_cache_gives_the_uncached_tokens_and_keeps_the_prompt(name):
    """Same generator, same tokens: several blocks, a partial last block, the sliding window (context 16, 37 tokens),
    rows advancing at different paces, a prompt that ends inside a block, temperature and top-p."""
    method, model = bd3lm(block_size=4), dit(max_seq_len=16)
    prompt = torch.full((37,), -1)
    prompt[:6] = torch.tensor([0, 1, 2, 2, 1, 0])
    for kw, given in (({}, None), ({"temperature": 0.8, "top_p": 0.9}, prompt)):
        outs = [cls(method, model, steps=5, **OPTIONS[name], **kw).generate(3, 37, torch.Generator().manual_seed(3),
                                                                            given=given)
                for cls in (_cached(name), _uncached(name))]
        assert torch.equal(outs[0].tokens, outs[1].tokens)
        assert outs[0].num_denoiser_calls > 0
        assert outs[0].tokens.shape == (3, 37) and not (outs[0].tokens == MASK).any()
        if given is not None:
            assert torch.equal(outs[0].tokens[:, :6], prompt[:6].expand(3, -1))
    plain = BD3LMSampler(method, model, steps=5).generate(3, 37, torch.Generator().manual_seed(3))
    assert not torch.equal(plain.tokens, outs[0].tokens)  # the inner step is used (not bd3lm's own)


@pytest.mark.parametrize("name,options", [("first_hitting", {}), ("threshold", {"threshold": 1.0})])
def test_one_reveal_per_call(name, options):
    """One row: first-hitting (and threshold at tau = 1) call the denoiser once per revealed token, plus one cache
    write per finished block but the last; a block the prompt fills costs nothing."""
    method, model = bd3lm(block_size=4), dit(max_seq_len=32)
    out = _cached(name)(method, model, **options).generate(1, 16, torch.Generator().manual_seed(0))
    assert out.num_denoiser_calls == 16 + 3
    given = torch.full((16,), -1)
    given[:5] = torch.tensor([0, 1, 2, 0, 1])  # block 0 given whole, one token of block 1
    out = _cached(name)(method, model, **options).generate(1, 16, torch.Generator().manual_seed(0), given=given)
    assert out.num_denoiser_calls == 11 + 3 and torch.equal(out.tokens[0, :5], given[:5])


def test_remdm_in_blocks_never_remasks_given_tokens_and_stops_at_eos():
    method, model = bd3lm(block_size=4), dit(max_seq_len=16)
    given = torch.full((12,), -1)
    given[[1, 5, 6]] = torch.tensor([2, 0, 1])
    sampler = _cached("remdm")(method, model, steps=20, schedule="rescale", eta=1.0)
    x = sampler.generate(64, 12, torch.Generator().manual_seed(0), given=given).tokens
    assert (x[:, [1, 5, 6]] == given[[1, 5, 6]]).all() and not (x == MASK).any()
    still = _cached("remdm")(method, model, steps=20, schedule="rescale", eta=0.0).generate(
        64, 12, torch.Generator().manual_seed(0), given=given).tokens
    assert not torch.equal(x, still)  # the remasking did redraw tokens
    assert sampler.stats()["remdm_eta"] == 1.0 and len(sampler.inner.trace) == 20  # (the last block's steps)
    out = within_blocks(ThresholdSampler, BD3LMUncachedSampler)(method, EOSNet(), stop_at_eos=True).generate(
        2, 40, torch.Generator().manual_seed(0))
    assert out.tokens.shape == (2, 12) and (out.tokens[:, 8:] == TOK.eos_id).all()  # the block loop's EOS stop


# ---------------------------------------------------------------------------------------------------- registry
def test_registry_names_labels_and_dispatch():
    method, model = bd3lm(block_size=4), dit()
    assert BLOCK_SAMPLERS == {("bd3lm", name): f"bd3lm_{name}" for name in INNER}
    for name, inner in INNER.items():
        cls = SAMPLERS[f"bd3lm_{name}"]
        assert issubclass(cls, BD3LMSampler) and cls.inner_class is inner and cls.any_length
        assert cls.exact is inner.exact and cls.kind() == ("exact" if name == "first_hitting" else "approximate")
        assert cls.uses_steps is inner.uses_steps and cls.methods == ("bd3lm",)
        assert sampler_name(name, method) == cls.name  # sample.sampler=first_hitting on a bd3lm run
        sampler = build_sampler(name, method, model, steps=4, **OPTIONS[name])
        assert type(sampler) is cls and isinstance(sampler.inner, inner)
        assert sampler_name(name, MDLM(MethodConfig(), TOK)) == name  # on MDLM the name is the MDLM sampler
    assert SAMPLERS["bd3lm"].exact and SAMPLERS["bd3lm"].inner_class is None
    from seqdiff.config import SampleConfig

    cfg = SampleConfig(remdm_schedule="conf", remdm_eta=0.3, threshold=0.7)
    assert SAMPLERS["bd3lm_remdm"].options_from_config(cfg) == ReMDMSampler.options_from_config(cfg)
    assert SAMPLERS["bd3lm_threshold"].options_from_config(cfg) == {"threshold": 0.7}
    assert build_sampler("remdm", method, model, steps=4, **ReMDMSampler.options_from_config(cfg)).inner.eta == 0.3


def test_refusals_name_sample_sampler_and_what_is_allowed():
    method, model = bd3lm(block_size=4), dit()
    allowed = ("['bd3lm', 'bd3lm_confidence', 'bd3lm_first_hitting', 'bd3lm_remdm', 'bd3lm_threshold', "
               "'bd3lm_uncached', 'confidence', 'first_hitting', 'remdm', 'threshold']")
    for name in ("cached", "ancestral", "edlm", "ar"):
        with pytest.raises(SamplerError) as e:
            build_sampler(name, method, model, steps=4)
        assert str(e.value).startswith(f"--sampler {name} (sample.sampler) cannot drive a 'bd3lm' model")
        assert f"for bd3lm choose one of {allowed}" in str(e.value)
    mdlm = MDLM(MethodConfig(), TOK)
    with pytest.raises(SamplerError, match=r"--sampler bd3lm_remdm \(sample.sampler\) cannot drive a 'mdlm' model; "
                                           r"it works with \['bd3lm'\]; for mdlm choose one of \['ancestral', "):
        build_sampler("bd3lm_remdm", mdlm, model, steps=4)
    with pytest.raises(SamplerError, match=r"it works with \['mdlm'\] \(and inside the blocks of \['bd3lm'\]\); "
                                           r"for ar choose one of \['ar'\]"):
        build_sampler("first_hitting", type("AR", (), {"name": "ar"})(), model, steps=4)
    # built by hand for bd3lm, an inner sampler runs only inside the blocks
    with pytest.raises(SamplerError, match="only inside its blocks.*sample.sampler=first_hitting"):
        MDLMFirstHittingSampler(method, model).generate(1, 8)
    # the inner sampler's own option checks apply through the block sampler
    with pytest.raises(SamplerError, match=r"--remdm-eta \(sample.remdm_eta\)=1.5"):
        build_sampler("remdm", method, model, steps=4, eta=1.5)
    with pytest.raises(SamplerError, match=r"--threshold \(sample.threshold\)=0.0"):
        build_sampler("bd3lm_threshold", method, model, steps=4, threshold=0.0)
    with pytest.raises(SamplerError, match=r"--steps \(sample.steps\)=3 .*needs --steps >= 4"):
        build_sampler("remdm", method, model, steps=3, schedule="loop")
    with pytest.raises(TypeError, match="takes no options"):
        BD3LMSampler(method, model, eta=0.1)
    with pytest.raises(TypeError, match="cannot run inside the blocks"):
        within_blocks(SAMPLERS["cached"])
