"""BD3-LM: the block NELBO against MDLM (L' = L), exact AR (L' = 1) and per-block references; the one-pass
x_t + x_0 forward against block-by-block forwards; the sampler's KV cache against the uncached sampler;
an exact (enumerated) denoiser driven by the sampler against its joint law; refusals of bad input."""

from __future__ import annotations

import itertools
import math
from types import SimpleNamespace

import pytest
import torch
from scipy.stats import chisquare
from torch import nn

from seqdiff.backbones import build_backbone
from seqdiff.config import ConfigError, MethodConfig, ModelConfig, from_dict, load_run_config
from seqdiff.methods import BD3LM, MDLM, Batch, build_model
from seqdiff.methods.bd3lm import block_causal_mask, clip_variance, inverse_mask_rate, training_mask
from seqdiff.samplers import BD3LMSampler, BD3LMUncachedSampler, MDLMCachedSampler, SamplerError, build_sampler
from seqdiff.schedules import SCHEDULES, unit_times
from seqdiff.tokenizers import CharTokenizer

TOK = CharTokenizer(alphabet="abc", normalize="none")  # 3 symbols + specials
V, MASK = TOK.vocab_size, TOK.mask_id


def bd3lm(**kw) -> BD3LM:
    return BD3LM(MethodConfig(name="bd3lm", **kw), TOK)


def dit(max_seq_len: int = 32, scale: float = 15.0, seed: int = 0):
    """A random bidirectional DiT whose attention is far from uniform (weights scaled up), so the prefix matters."""
    torch.manual_seed(seed)
    model = build_backbone(from_dict(ModelConfig, {"preset": "test", "max_seq_len": max_seq_len,
                                                   "time_conditioning": False}), V, causal=False)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(scale)
    return model.eval()


def symbols(B: int, L: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 3, (B, L), generator=torch.Generator().manual_seed(seed))


# ---------------------------------------------------------------------------------------------------- oracle
class TokenCache:
    """The oracle's 'KV cache': the clean tokens themselves."""

    def __init__(self, batch_size: int, max_len: int):
        self.tokens = torch.full((batch_size, max_len), MASK, dtype=torch.long)
        self.length, self.blockwise = 0, True

    def reset(self):
        self.length = 0

    def select_rows(self, rows):
        sub = TokenCache(0, 0)
        sub.tokens, sub.length = self.tokens[rows].clone(), self.length
        return sub


class AttentionOracle(nn.Module):
    """The exact denoiser of a joint law over K^L sequences that sees only what attention lets it see: the
    logits of query i are log p(token at position pos_i | the unmasked tokens of the keys that i may attend
    to, at their positions). A mask that leaks (or hides) a token changes its output."""

    def __init__(self, joint: torch.Tensor, seq_len: int, num_symbols: int = 3):
        super().__init__()
        self.states = torch.tensor(list(itertools.product(range(num_symbols), repeat=seq_len)))  # (S, L)
        self.joint = joint.reshape(-1).double()
        self.K = num_symbols
        self.dummy = nn.Parameter(torch.zeros(()))
        self.config = SimpleNamespace(time_conditioning=False, max_seq_len=seq_len)

    def new_kv_cache(self, batch_size, max_len, device=None, blockwise=False):
        assert blockwise
        return TokenCache(batch_size, max_len)

    def forward(self, input_ids, noise_level=None, attention_mask=None, kv_cache=None, *, attn_mask=None,
                positions=None, update_cache=True):
        B, n = input_ids.shape
        if kv_cache is not None:
            full = torch.cat([kv_cache.tokens[:, : kv_cache.length], input_ids], dim=1)
            pos = torch.arange(full.shape[1])
            if update_cache:
                kv_cache.tokens[:, kv_cache.length : kv_cache.length + n] = input_ids
                kv_cache.length += n
        else:
            full, pos = input_ids, (torch.arange(n) if positions is None else positions)
        start = full.shape[1] - n
        vis = torch.ones(n, full.shape[1], dtype=torch.bool) if attn_mask is None else attn_mask
        logits = torch.full((B, n, V), float("-inf"), dtype=torch.float64)
        per_state = self.states[:, pos]  # (S, n_all) the state's token at each key's position
        for q in range(n):
            known = vis[q][None] & (full != MASK)  # (B, n_all)
            agree = ((per_state[None] == full[:, None]) | ~known[:, None]).all(-1)  # (B, S)
            weight = self.joint[None] * agree
            onehot = torch.nn.functional.one_hot(self.states[:, pos[start + q]], self.K).double()  # (S, K)
            probs = weight @ onehot  # (B, K)
            logits[:, q, : self.K] = (probs / probs.sum(-1, keepdim=True)).log()
        return logits.float() + 0 * self.dummy


def random_joint(L: int, K: int = 3, seed: int = 0) -> torch.Tensor:
    torch.manual_seed(seed)
    return torch.distributions.Dirichlet(torch.full((K**L,), 0.7)).sample(())


def state_index(x: torch.Tensor, K: int = 3) -> torch.Tensor:
    L = x.shape[-1]
    return (x * (K ** torch.arange(L - 1, -1, -1))).sum(-1)


# ---------------------------------------------------------------------------------------------------- masks
def test_training_mask_is_the_papers_structure():
    # L = 4, L' = 2: rows / columns x_t[0..3] then x_0[0..3]
    expected = torch.tensor([
        [1, 1, 0, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0, 0, 0],
        [0, 0, 1, 1, 1, 1, 0, 0],
        [0, 0, 1, 1, 1, 1, 0, 0],
        [0, 0, 0, 0, 1, 1, 0, 0],
        [0, 0, 0, 0, 1, 1, 0, 0],
        [0, 0, 0, 0, 1, 1, 1, 1],
        [0, 0, 0, 0, 1, 1, 1, 1],
    ], dtype=torch.bool)
    assert torch.equal(training_mask(4, 2), expected)
    assert torch.equal(block_causal_mask(4, 2), expected[4:, 4:])


# ---------------------------------------------------------------------------------------------------- DiT
def test_dit_explicit_structure_and_positions():
    model = dit()
    x = symbols(2, 10)
    with torch.no_grad():
        plain = model(x)
        torch.testing.assert_close(model(x, attn_mask=torch.ones(10, 10, dtype=torch.bool)), plain)
        torch.testing.assert_close(model(x, positions=torch.arange(10)), plain)
        causal = torch.ones(10, 10, dtype=torch.bool).tril()
        assert (model(x, attn_mask=causal) - plain).abs().max() > 1e-3  # the mask is applied
        shifted = model(x, positions=torch.arange(10) + 5)  # rotary: only relative positions matter
        torch.testing.assert_close(shifted, plain, atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError, match="attn_mask must have shape"):
        model(x, attn_mask=torch.ones(9, 9, dtype=torch.bool))
    with pytest.raises(ValueError, match="boolean"):
        model(x, attn_mask=torch.ones(10, 10))
    with pytest.raises(ValueError, match="positions must lie"):
        model(x, positions=torch.arange(10) + 30)


def test_dit_blockwise_cache_is_block_causal():
    model = dit()
    x = symbols(2, 12)
    with torch.no_grad():
        reference = model(x, attn_mask=block_causal_mask(12, 4))
        cache = model.new_kv_cache(2, 12, blockwise=True)
        peek = model(x[:, 4:8], kv_cache=cache, update_cache=False)  # nothing cached yet: the block alone
        torch.testing.assert_close(peek, model(x[:, 4:8]))
        assert cache.length == 0
        pieces = [model(x[:, i : i + 4], kv_cache=cache) for i in (0, 4, 8)]
        torch.testing.assert_close(torch.cat(pieces, 1), reference, atol=1e-5, rtol=1e-5)
        sub = model.new_kv_cache(2, 12, blockwise=True)
        model(x[:, :8], kv_cache=sub, attn_mask=block_causal_mask(8, 4))  # one-pass prefill
        rows = torch.tensor([False, True])
        last = model(x[rows, 8:], kv_cache=sub.select_rows(rows), update_cache=False)
        torch.testing.assert_close(last, reference[rows, 8:], atol=1e-5, rtol=1e-5)
        assert sub.length == 8
    with pytest.raises(ValueError, match="causal"):
        model.new_kv_cache(1, 8)
    causal = build_backbone(from_dict(ModelConfig, {"preset": "test", "max_seq_len": 16}), V, causal=True)
    with pytest.raises(ValueError, match="bidirectional"):
        causal.new_kv_cache(1, 8, blockwise=True)


@pytest.mark.parametrize("block_size", [1, 3, 4])
def test_one_pass_forward_equals_each_block_after_its_prefix(block_size):
    """The x_t + x_0 pass gives the logits of running each block alone after its clean prefix (block-causal
    KV cache, no explicit mask: an independent code path)."""
    method, model = bd3lm(block_size=block_size), dit()
    x0 = symbols(3, 12, seed=1)
    xt = torch.where(torch.rand(x0.shape, generator=torch.Generator().manual_seed(2)) < 0.5, MASK, x0)
    with torch.no_grad():
        one_pass = method.block_logits(model, xt, x0)  # (B, L, V)
        for lo in range(0, 12, block_size):
            hi = lo + block_size
            cache = model.new_kv_cache(3, 12, blockwise=True)
            for b in range(0, lo, block_size):
                model(x0[:, b : b + block_size], kv_cache=cache)
            alone = model(xt[:, lo:hi], kv_cache=cache, update_cache=False)
            torch.testing.assert_close(one_pass[:, lo:hi], alone, atol=2e-4, rtol=2e-4)
        bidirectional = model(xt)
    assert (one_pass - bidirectional).abs().max() > 1e-2  # the structure matters: the test can fail


def test_one_pass_forward_ignores_padded_keys():
    method, model = bd3lm(block_size=2), dit()
    x0 = symbols(1, 8, seed=3)
    xt = x0.clone()
    xt[:, ::3] = MASK
    pad = torch.tensor([[True] * 6 + [False] * 2])
    other = x0.clone()
    other[:, 6:] = (other[:, 6:] + 1) % 3
    with torch.no_grad():
        a = method.block_logits(model, xt, x0, pad)
        b = method.block_logits(model, torch.where(pad, xt, other), other, pad)
    torch.testing.assert_close(a[:, :6], b[:, :6])


# ---------------------------------------------------------------------------------------------------- loss
def test_full_block_equals_mdlm_loss_on_the_same_noise():
    model = dit()
    x0 = symbols(6, 12, seed=4)
    for kw in ({}, {"time_sampling": "uniform"}, {"schedule": "cosine", "t_min": 0.01}):
        ours = bd3lm(block_size=12, **kw).loss(model, Batch(x0), torch.Generator().manual_seed(5))
        # bd3lm's time_sampling=auto draws antithetic times; mdlm's would draw mask counts
        theirs = MDLM(MethodConfig(**{"time_sampling": "antithetic", **kw}), TOK).loss(
            model, Batch(x0), torch.Generator().manual_seed(5))
        torch.testing.assert_close(ours.nll_sum, theirs.nll_sum, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(ours.loss, theirs.loss)
        assert ours.num_tokens == theirs.num_tokens == 72
    different = bd3lm(block_size=6).loss(model, Batch(x0), torch.Generator().manual_seed(5))
    assert abs(float(different.nll_sum - theirs.nll_sum)) > 1e-3


def test_block_size_one_is_the_exact_ar_nll():
    L = 4
    joint = random_joint(L)
    oracle = AttentionOracle(joint, L)
    states = oracle.states
    out = bd3lm(block_size=1).loss(oracle, Batch(states), torch.Generator().manual_seed(0))
    exact = -joint.double().log().sum()  # sum over every sequence of -log p(x)
    torch.testing.assert_close(out.nll_sum, exact, rtol=1e-5, atol=1e-5)
    assert out.nll_sum.dtype == torch.float64 and out.num_tokens == states.numel()
    # a denoiser that also sees its own clean token (a leaking mask) would score 0: the oracle is not blind
    leak = AttentionOracle(joint, L)
    x = states[:5]
    logits = leak(torch.cat([torch.full_like(x, MASK), x], 1), attn_mask=torch.ones(8, 8, dtype=torch.bool),
                  positions=torch.arange(4).repeat(2))[:, :4]
    assert torch.allclose(logits.gather(-1, x[..., None]), torch.zeros(()), atol=1e-6)


def test_block_decomposition_equals_per_block_mdlm_terms():
    """1 < L' < L: each block's share of the loss is the MDLM term of that block alone, computed after its clean
    prefix, at that block's own time, on the same noise."""
    Lb, L, B = 4, 12, 5
    method, model = bd3lm(block_size=Lb), dit()
    x0 = symbols(B, L, seed=6)
    per_token, scored, _ = method.block_loss(model, Batch(x0), torch.Generator().manual_seed(7), method.train_times)
    g = torch.Generator().manual_seed(7)  # the same draws, in the same order: times per block, then masks
    t = method.config.t_min + (1 - method.config.t_min) * unit_times(B * (L // Lb), "antithetic", g).view(B, -1)
    u = torch.rand(x0.shape, generator=g)
    assert len(set(t[0].tolist())) == L // Lb  # every block has its own time
    for b in range(L // Lb):
        lo, hi = b * Lb, (b + 1) * Lb
        p_mask = method.schedule.mask_probability(t[:, b])[:, None]
        xt_b = torch.where(u[:, lo:hi] < p_mask, MASK, x0[:, lo:hi])
        with torch.no_grad():
            cache = model.new_kv_cache(B, L, blockwise=True)
            if lo:
                model(x0[:, :lo], kv_cache=cache, attn_mask=block_causal_mask(lo, Lb))
            logits = method.subs_logits(model(xt_b, kv_cache=cache, update_cache=False))
        ce = -torch.log_softmax(logits.double(), -1).gather(-1, x0[:, lo:hi, None])[..., 0]
        term = (1 / t[:, b].double())[:, None] * torch.where(xt_b == MASK, ce, torch.zeros_like(ce))  # loglinear w
        torch.testing.assert_close(per_token[:, lo:hi].double().sum(-1), term.sum(-1), rtol=1e-5, atol=1e-5)


def test_block_nelbo_of_the_exact_denoiser_is_the_nll():
    """With the exact conditionals the masked-diffusion bound of each block is tight, so the block NELBO's
    expectation is -log p(x) (up to the omitted share of t < t_min): a Monte Carlo check, 4 standard errors."""
    L, N = 4, 3000
    joint = random_joint(L, seed=1)
    oracle = AttentionOracle(joint, L)
    x = oracle.states[joint.argmax()][None].expand(N, L)
    per_token, _, _ = bd3lm(block_size=2).block_loss(oracle, Batch(x), torch.Generator().manual_seed(0),
                                                  (1e-3, 1.0))
    per_seq = per_token.detach().double().sum(-1)
    nll = -float(joint.double().max().log())
    se = float(per_seq.std()) / math.sqrt(N)
    assert abs(float(per_seq.mean()) - nll) < 4 * se + 0.005 * nll, (float(per_seq.mean()), nll, se)


def test_clipped_schedule_is_for_training_only():
    method = bd3lm(block_size=4, clip_min=0.3, clip_max=0.8)
    eps = 1e-3
    assert method.train_times == pytest.approx((0.3 / (1 - eps), 0.8 / (1 - eps)))
    assert method.eval_times == (1e-3, 1.0)
    t = method.sample_block_times(64, 3, "cpu", torch.Generator().manual_seed(0), method.train_times)
    assert t.min() >= method.train_times[0] and t.max() <= method.train_times[1]
    model, x0 = dit(), symbols(4, 12)
    a = method.loss(model, Batch(x0), torch.Generator().manual_seed(1))
    b = method.bound(model, Batch(x0), torch.Generator().manual_seed(1))
    c = bd3lm(block_size=4).loss(model, Batch(x0), torch.Generator().manual_seed(1))
    assert abs(float(a.nll_sum - b.nll_sum)) > 1e-3
    torch.testing.assert_close(b.nll_sum, c.nll_sum)  # evaluation never clips
    total, count = method.nll(model, Batch(x0), torch.Generator().manual_seed(1))
    torch.testing.assert_close(total, c.nll_sum.cpu())
    for name in ("loglinear", "cosine", "geometric"):
        schedule = SCHEDULES[name]()
        for rate in (0.05, 0.5, 0.9):
            t = inverse_mask_rate(schedule, rate)
            assert float(schedule.mask_probability(torch.tensor(t, dtype=torch.float64))) == pytest.approx(rate)
    variances = clip_variance(method, model, [Batch(x0)], [(0.0, 1.0), (0.3, 0.8)],
                              torch.Generator().manual_seed(0), draws=4)
    assert set(variances) == {(0.0, 1.0), (0.3, 0.8)} and all(v >= 0 for v in variances.values())


# ---------------------------------------------------------------------------------------------------- sampler
@pytest.mark.parametrize("steps", [2, 40])
def test_kv_cache_sampler_gives_the_uncached_tokens(steps):
    """Same generator, same tokens: over several blocks, a partial last block, the sliding window (context 16,
    37 tokens), skipped calls on a subset of rows, a prompt, temperature and top-p."""
    method, model = bd3lm(block_size=4), dit(max_seq_len=16)
    prompt = torch.full((37,), -1)
    prompt[:5] = torch.tensor([0, 1, 2, 2, 1])
    for kw, given in (({}, None), ({"temperature": 0.8, "top_p": 0.9}, prompt)):
        outs = [cls(method, model, steps=steps, **kw).generate(3, 37, torch.Generator().manual_seed(3), given=given)
                for cls in (BD3LMSampler, BD3LMUncachedSampler)]
        assert torch.equal(outs[0].tokens, outs[1].tokens)
        assert outs[0].tokens.shape == (3, 37) and not (outs[0].tokens == MASK).any()
        if given is not None:
            assert torch.equal(outs[0].tokens[:, :5], prompt[:5].expand(3, -1))
    other = BD3LMSampler(method, dit(max_seq_len=16, seed=1), steps=steps).generate(
        3, 37, torch.Generator().manual_seed(3))
    assert not torch.equal(other.tokens, outs[0].tokens)


def _joint_counts(x: torch.Tensor, K: int = 3) -> torch.Tensor:
    return torch.bincount(state_index(x, K), minlength=K ** x.shape[1]).double()


@pytest.mark.parametrize("sampler", [BD3LMSampler, BD3LMUncachedSampler])
def test_exact_denoiser_reproduces_the_joint(sampler):
    L, N = 4, 4000
    joint = random_joint(L, seed=2)
    oracle = AttentionOracle(joint, L)
    out = sampler(bd3lm(block_size=2), oracle, steps=100).generate(N, L, torch.Generator().manual_seed(0))
    counts = _joint_counts(out.tokens)
    expected = joint.double() * N
    keep = expected > 5
    expected = expected[keep] * counts[keep].sum() / expected[keep].sum()
    assert chisquare(counts[keep].numpy(), expected.numpy()).pvalue > 1e-3


def test_exact_denoiser_with_a_prompt_samples_the_conditional():
    L, N = 4, 3000
    joint = random_joint(L, seed=3)
    oracle = AttentionOracle(joint, L)
    given = torch.tensor([1, -1, -1, -1])  # the prompt ends inside the first block
    out = BD3LMSampler(bd3lm(block_size=2), oracle, steps=50).generate(N, L, torch.Generator().manual_seed(1),
                                                                       given=given)
    assert (out.tokens[:, 0] == 1).all()
    rows = oracle.states[:, 0] == 1
    counts = _joint_counts(out.tokens)[rows]
    expected = joint.double()[rows] / joint.double()[rows].sum() * N
    keep = expected > 5
    expected = expected[keep] * counts[keep].sum() / expected[keep].sum()
    assert chisquare(counts[keep].numpy(), expected.numpy()).pvalue > 1e-3


def test_the_joint_test_can_fail_one_step_per_block_misses_correlations():
    L, K = 4, 3
    joint = torch.zeros(K**L)
    for v in range(K):  # all tokens equal
        joint[v * sum(K**i for i in range(L))] = 1 / K
    oracle = AttentionOracle(joint + 1e-12, L)
    one = BD3LMSampler(bd3lm(block_size=4), oracle, steps=1).generate(2000, L, torch.Generator().manual_seed(0))
    assert (one.tokens == one.tokens[:, :1]).all(-1).double().mean() < 0.5
    many = BD3LMSampler(bd3lm(block_size=2), oracle, steps=200).generate(500, L, torch.Generator().manual_seed(0))
    assert (many.tokens == many.tokens[:, :1]).all(-1).double().mean() > 0.98


class EOSNet(nn.Module):
    """Uniform over the symbols before position 8, EOS from there on (positions of the whole input)."""

    def __init__(self):
        super().__init__()
        self.dummy = nn.Parameter(torch.zeros(()))
        self.config = SimpleNamespace(time_conditioning=False, max_seq_len=64)

    def forward(self, input_ids, noise_level=None, attention_mask=None, kv_cache=None, **kw):
        logits = torch.zeros(*input_ids.shape, V)
        logits[:, 8:, TOK.eos_id] = 50.0
        return logits + 0 * self.dummy


def test_skipped_calls_and_stop_at_eos():
    method, model = bd3lm(block_size=4), dit(max_seq_len=32)
    out = BD3LMSampler(method, model, steps=200).generate(1, 16, torch.Generator().manual_seed(0))
    # one row: at most one denoiser call per revealed token, plus one cache write per finished block but the last
    assert out.num_denoiser_calls <= 16 + 3
    eos = TOK.eos_id
    full = BD3LMUncachedSampler(method, EOSNet(), steps=8).generate(2, 40, torch.Generator().manual_seed(0))
    assert full.tokens.shape == (2, 40) and (full.tokens[:, 8:] == eos).all()
    given = torch.full((40,), -1)
    given[2] = eos  # a given EOS does not stop generation: only a generated one does
    out = BD3LMUncachedSampler(method, EOSNet(), steps=8, stop_at_eos=True).generate(
        2, 40, torch.Generator().manual_seed(0), given=given)
    assert out.tokens.shape == (2, 12) and (out.tokens[:, 8:] == eos).all() and (out.tokens[:, 2] == eos).all()


def test_default_sampler_and_registry():
    method, model = bd3lm(block_size=4), dit()
    assert isinstance(build_sampler(None, method, model, steps=4), BD3LMSampler)
    assert isinstance(build_sampler("bd3lm_uncached", method, model, steps=4), BD3LMUncachedSampler)
    assert BD3LM.exact_likelihood is False and BD3LM.default_sampler == "bd3lm"


# ---------------------------------------------------------------------------------------------------- bad input
def test_refusals_name_the_key():
    with pytest.raises(ConfigError, match="method.block_size"):
        MethodConfig(name="bd3lm", block_size=0)
    with pytest.raises(ConfigError, match="method.clip_min"):
        MethodConfig(name="bd3lm", clip_min=0.6, clip_max=0.5)
    with pytest.raises(ConfigError, match="method.clip_max"):
        MethodConfig(name="bd3lm", clip_max=1.5)
    with pytest.raises(ConfigError, match="method.num_timesteps"):
        bd3lm(num_timesteps=10)
    with pytest.raises(ConfigError, match="method.subs"):
        bd3lm(subs=False)
    config = load_run_config(None, ["method.name=bd3lm", "method.block_size=5", "data.seq_len=32",
                                    "model.max_seq_len=32"])
    with pytest.raises(ConfigError, match=r"method.block_size=5 must divide data.seq_len=32.*\[1, 2, 4, 8, 16, 32\]"):
        bd3lm(block_size=5).check_recipe(config)
    config = load_run_config(None, ["method.name=bd3lm", "method.block_size=64", "data.seq_len=64",
                                    "model.max_seq_len=32"])
    with pytest.raises(ConfigError, match="method.block_size=64 exceeds the model's context model.max_seq_len=32"):
        bd3lm(block_size=64).check_recipe(config)
    model_cfg = from_dict(ModelConfig, {"preset": "test", "max_seq_len": 8})
    with pytest.raises(ConfigError, match="method.block_size=16 exceeds"):
        build_model(model_cfg, MethodConfig(name="bd3lm", block_size=16), TOK)
    with pytest.raises(ConfigError, match="model.time_conditioning=false"):
        build_model(from_dict(ModelConfig, {"preset": "test", "time_conditioning": True}),
                    MethodConfig(name="bd3lm"), TOK)
    with pytest.raises(ConfigError, match="must divide the sequence length 10"):
        bd3lm(block_size=4).loss(dit(), Batch(symbols(2, 10)))


def test_samplers_refuse_the_wrong_method_and_time_conditioning():
    model = dit()
    with pytest.raises(SamplerError, match="cannot drive a 'mdlm' model"):
        BD3LMSampler(MDLM(MethodConfig(), TOK), model)
    with pytest.raises(SamplerError, match="cannot drive a 'bd3lm' model"):
        MDLMCachedSampler(bd3lm(), model)
    with pytest.raises(SamplerError, match="cannot drive a 'bd3lm' model"):
        build_sampler("ancestral", bd3lm(), model, steps=4)
    timed = build_backbone(from_dict(ModelConfig, {"preset": "test", "time_conditioning": True}), V, causal=False)
    with pytest.raises(SamplerError, match="time conditioning"):
        BD3LMSampler(bd3lm(), timed)
    with pytest.raises(SamplerError, match="bd3lm_uncached"):
        BD3LMSampler(bd3lm(), SimpleNamespace(config=SimpleNamespace(time_conditioning=False, max_seq_len=8)))


# ---------------------------------------------------------------------------------------------------- experiments
FIXTURE = "tests/fixtures/shakespeare_tiny.txt"
TINY = ["model.preset=test", "model.max_seq_len=32", "data.seq_len=32", "data.batch_size=4",
        f"data.train_file={FIXTURE}", f"data.valid_file={FIXTURE}", f"data.test_file={FIXTURE}",
        "train.max_steps=3", "train.val_every=3", "train.val_batches=1", "train.progress_bar=false",
        "train.ema_decay=0.9", "method.name=bd3lm", "method.block_size=8"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    from seqdiff.training.run import train

    root = tmp_path_factory.mktemp("bd3lm_run")
    train(load_run_config(None, TINY), root / "bd3lm")
    return root / "bd3lm"


def test_train_eval_sample_export(run, tmp_path, capsys):
    import json

    from seqdiff.checkpoint import load_checkpoint
    from seqdiff.cli import main

    model = load_checkpoint(run)
    assert model.method.name == "bd3lm" and model.method.block_size == 8
    out = tmp_path / "eval.json"
    assert main(["eval", str(run), "--out", str(out), "--json"]) == 0  # its own test split
    report = json.loads(out.read_text())["results"][0]
    assert report["method"] == "bd3lm" and report["bound"] is True and math.isfinite(report["nll_nats_per_token"])
    assert main(["eval", str(run), "--data", FIXTURE, "--data", FIXTURE, "--out", str(tmp_path / "z.json")]) == 0
    assert "upper bounds (NELBO)" in capsys.readouterr().out  # zero-shot table
    # any length beyond the 32-token context, with a prompt, from the default (KV-cached) sampler
    assert main(["sample", str(run), "--num-samples", "2", "--length", "70", "--steps", "4", "--prompt", "the "]) == 0
    captured = capsys.readouterr()
    texts = [block.split("\n", 1)[1] for block in captured.out.split("=== sample ")[1:]]
    assert len(texts) == 2 and all(t.startswith("the ") for t in texts) and "bd3lm sampler" in captured.err
    assert main(["sample", str(run), "--num-samples", "1", "--seq-len", "40", "--steps", "4", "--stop-at-eos",
                 "--sampler", "bd3lm_uncached"]) == 0
    capsys.readouterr()
    assert main(["sample", str(run), "--sampler", "cached", "--num-samples", "1"]) == 2
    err = capsys.readouterr().err
    assert "cannot drive a 'bd3lm' model" in err and "'first_hitting'" in err and err.count("\n") == 1
    # the MDLM samplers inside the blocks, by their short names: any length, the prompt kept, the label printed
    for sampler, kind, steps in (("first_hitting", "exact", []), ("remdm", "approximate", ["--steps", "4"]),
                                 ("threshold", "approximate", [])):
        assert main(["sample", str(run), "--sampler", sampler, "--num-samples", "2", "--seq-len", "70", *steps,
                     "--prompt", "the "]) == 0
        captured = capsys.readouterr()
        texts = [block.split("\n", 1)[1] for block in captured.out.split("=== sample ")[1:]]
        assert len(texts) == 2 and all(t.startswith("the ") for t in texts)
        assert f"(bd3lm_{sampler} sampler, {kind})" in captured.err
    assert main(["sample", str(run), "--semi-ar", "--length", "70", "--steps", "4"]) == 2  # blocks are its own
    assert ("--semi-ar asks for semi-autoregressive blocks, and the bd3lm sampler generates any length block by "
            "block itself (--length or --seq-len alone sets the length)") in capsys.readouterr().err
    assert main(["sample", str(run), "sample.semi_ar=false", "--length", "40", "--steps", "4"]) == 0  # not asked
    capsys.readouterr()
    assert main(["sample", str(run), "--sampler", "first_hitting", "--steps", "4"]) == 2  # it would ignore --steps
    assert ("--steps 4 is read by --sampler bd3lm, bd3lm_uncached, confidence, remdm only (this run samples with "
            "bd3lm_first_hitting, which would ignore it)") in capsys.readouterr().err

    from transformers import AutoModelForMaskedLM

    from seqdiff.hf import register_auto_classes

    assert main(["export", str(run), str(tmp_path / "hf")]) == 0
    register_auto_classes()
    hf = AutoModelForMaskedLM.from_pretrained(tmp_path / "hf").eval()
    ids = torch.randint(0, model.tokenizer.vocab_size - 1, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = model.method.subs_logits(model.backbone(ids, attn_mask=block_causal_mask(24, 8)))
        torch.testing.assert_close(hf(input_ids=ids).logits, expected)
    reloaded = load_checkpoint(tmp_path / "hf")  # seqdiff reads the export back as a bd3lm model
    assert reloaded.method.name == "bd3lm" and reloaded.method.block_size == 8


def test_train_refuses_a_block_size_that_does_not_divide_the_length(tmp_path, capsys):
    from seqdiff.cli import main

    assert main(["train", "--run-dir", str(tmp_path / "r"), *TINY, "method.block_size=5"]) == 2
    err = capsys.readouterr().err
    assert "method.block_size=5 must divide data.seq_len=32" in err and err.count("error:") == 1
    assert not (tmp_path / "r").exists()
    assert main(["train", "--run-dir", str(tmp_path / "r"), *TINY, "model.time_conditioning=true"]) == 2
    assert "model.time_conditioning=false" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_frontier_runs_the_cached_and_uncached_bd3lm_samplers(run, tmp_path):
    import json

    from seqdiff.cli import main
    from seqdiff.training.run import train

    ar = tmp_path / "ar"
    train(load_run_config(None, [*TINY, "method.name=ar"]), ar)
    out = tmp_path / "frontier"
    assert main(["frontier", "--checkpoint", str(run), "--checkpoint", str(ar), "--oracle", str(ar), "--steps", "4",
                 "--length", "32", "--num-samples", "2", "--out", str(out)]) == 0
    rows = {r["sampler"]: r for r in json.loads((out / "frontier.json").read_text())["rows"]}
    inside = {"bd3lm_first_hitting", "bd3lm_remdm", "bd3lm_confidence", "bd3lm_threshold"}  # MDLM samplers in blocks
    assert set(rows) == {"bd3lm", "bd3lm_uncached", "ar"} | inside
    assert rows["bd3lm"]["gen_perplexity"] == rows["bd3lm_uncached"]["gen_perplexity"]  # the same tokens
    assert [name for name in sorted(inside) if rows[name]["exact"]] == ["bd3lm_first_hitting"]
    assert rows["bd3lm_first_hitting"]["label"] == "BD3-LM first-hitting" and rows["bd3lm_threshold"]["steps"] == 32


def test_dna_fasta_train_eval_sample(tmp_path, capsys):
    """GRCh37 slices through the FASTA data module and the nucleotide tokenizer: bits per base, FASTA samples."""
    import json
    import shutil

    from seqdiff.cli import main

    stem = "grch37_chr20_slices"
    for suffix in (".fa", ".fa.gz", ".fa.gz.fai", ".fa.gz.gzi", ".bed"):  # the FASTA first (index not older)
        shutil.copy(f"tests/fixtures/{stem}{suffix}", tmp_path / f"{stem}{suffix}")
    overrides = ["model.preset=test", "model.max_seq_len=32", "data.seq_len=32", "data.batch_size=4",
                 "data.eval_batch_size=8", "data.kind=fasta", "data.tokenizer=nucleotide",
                 f"data.fasta={tmp_path / (stem + '.fa.gz')}", "data.split_mode=bed",
                 f"data.bed={tmp_path / (stem + '.bed')}", "train.max_steps=2", "train.val_every=2",
                 "train.val_batches=1", "train.progress_bar=false", "method.name=bd3lm", "method.block_size=16"]
    assert main(["train", "--run-dir", str(tmp_path / "run"), *overrides]) == 0
    out = tmp_path / "eval.json"
    assert main(["eval", str(tmp_path / "run"), "--out", str(out), "--batch-size", "64"]) == 0
    report = json.loads(out.read_text())["results"][0]
    assert report["method"] == "bd3lm" and math.isfinite(report["bits_per_base"])
    capsys.readouterr()
    assert main(["sample", str(tmp_path / "run"), "--num-samples", "1", "--length", "50", "--steps", "4"]) == 0
    fasta = capsys.readouterr().out
    assert fasta.startswith(">sample_0 sampler=bd3lm")  # (special tokens of the untrained model are not printed)
    from seqdiff.checkpoint import load_checkpoint
    from seqdiff.config import SampleConfig
    from seqdiff.evaluation.generate import generate

    gen = generate(load_checkpoint(tmp_path / "run"), SampleConfig(num_samples=2, batch_size=2, seq_len=50, steps=4))
    assert gen.sampler == "bd3lm" and gen.lengths == [50, 50]  # beyond the 32-base context
    # the frontier's real-data row on FASTA: whole test tiles without N, cut to the length
    from seqdiff.data import build_data_module
    from seqdiff.evaluation.frontier import reference_windows

    model = load_checkpoint(tmp_path / "run")
    tiles = build_data_module(model.data_config, model.tokenizer).eval_dataset("test")
    texts = [model.tokenizer.decode(t["input_ids"][t["attention_mask"]]) for t in tiles]
    windows = [model.tokenizer.decode(w) for w in reference_windows(model, 20, 3, seed=0)]
    assert len(windows) == 3 and all(len(w) == 20 and "N" not in w.upper() for w in windows)
    assert all(any(t.startswith(w) for t in texts) for w in windows)


def test_clip_search_picks_the_least_variance_range_during_training(tmp_path):
    import pandas as pd

    from seqdiff.training.run import train

    # the criterion: the 1/t weights of small mask rates make the unclipped estimate the noisiest
    L = 4
    oracle = AttentionOracle(random_joint(L, seed=4), L)
    method = bd3lm(block_size=2)
    batch = Batch(oracle.states[:32])
    variances = clip_variance(method, oracle, [batch], [(0.0, 1.0), (0.3, 0.8)], torch.Generator().manual_seed(0),
                              draws=16)
    assert variances[(0.3, 0.8)] < variances[(0.0, 1.0)]
    # in training: every validation measures the candidates and trains on the least-variance one
    result = train(load_run_config(None, [*TINY, "method.clip_search=[[0.0, 1.0], [0.3, 0.8]]",
                                          "method.clip_search_batches=2"]), tmp_path / "run")
    search = next(cb for cb in result.trainer.callbacks if type(cb).__name__ == "ClipSearch")
    assert set(search.variances) == {(0.0, 1.0), (0.3, 0.8)}
    assert search.best == min(search.variances, key=search.variances.get)
    assert result.module.method.train_times == result.module.method.clip_times(*search.best)
    logged = pd.read_csv(tmp_path / "run" / "logs" / "metrics.csv")[["clip/min", "clip/max"]].dropna()
    assert tuple(logged.iloc[-1]) == pytest.approx(search.best)
    state = torch.load(result.checkpoint, weights_only=False)["callbacks"]["ClipSearch"]
    assert state == {"best": list(search.best)}
    with pytest.raises(ConfigError, match="method.clip_search is for method.name=bd3lm"):
        train(load_run_config(None, [*TINY, "method.name=mdlm", "method.clip_search=[[0.3, 0.8]]"]),
              tmp_path / "mdlm")
    assert not (tmp_path / "mdlm").exists()
    with pytest.raises(ConfigError, match=r"method.clip_search\[0\]"):
        MethodConfig(name="bd3lm", clip_search=[[0.8, 0.3]])


def test_one_pass_forward_under_bf16_autocast():
    """The additive mask takes the queries' dtype (bf16 under autocast), as CUDA training runs it."""
    method, model = bd3lm(block_size=4), dit()
    x0 = symbols(2, 12)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = method.loss(model, Batch(x0), torch.Generator().manual_seed(0))
    full = method.loss(model, Batch(x0), torch.Generator().manual_seed(0))
    assert out.loss.dtype == torch.float32 and torch.isfinite(out.loss)
    assert abs(float(out.loss - full.loss)) < 0.05 * float(full.loss)


def test_experiment_command_writes_the_reports(tmp_path):
    import json

    from experiments import bd3lm_experiment

    text = "to be or not to be that is the question whether tis nobler in the mind to suffer\n\n" * 6
    for split in ("train", "valid", "test"):
        (tmp_path / f"{split}.txt").write_text(text)
    overrides = ["model.preset=test", "model.n_layers=1", "model.max_seq_len=32", "data.seq_len=32",
                 "data.batch_size=4", "data.eval_batch_size=8", "train.max_steps=2", "train.warmup_steps=1",
                 "train.val_every=2", "train.val_batches=1", "train.checkpoint_every=2", "train.progress_bar=false",
                 f"data.corpus={tmp_path}"]
    out = tmp_path / "report"
    assert bd3lm_experiment.main(["--corpora", "shakespeare", "--methods", "ar,bd3lm_4", "--run-root",
                                  str(tmp_path / "runs"), "--out", str(out), "--num-t-samples", "1",
                                  "--frontier-steps", "4", "--num-samples", "2", *overrides]) == 0
    results = json.loads((out / "shakespeare.json").read_text())
    assert results["methods"]["bd3lm_4"]["bound"] and results["methods"]["bd3lm_4"]["sampler"] == "bd3lm"
    assert (out / "shakespeare.md").is_file() and (out / "shakespeare_curves.png").is_file()
    rows = json.loads((out / "frontier_shakespeare" / "frontier.json").read_text())["rows"]
    assert {r["sampler"] for r in rows} == {"ar", "bd3lm", "bd3lm_uncached", "bd3lm_first_hitting", "bd3lm_remdm",
                                            "bd3lm_confidence", "bd3lm_threshold"}
    with pytest.raises(SystemExit):
        bd3lm_experiment.main(["--methods", "mdlm,bd3lm_4", "--run-root", str(tmp_path / "x")])
