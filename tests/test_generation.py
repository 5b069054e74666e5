"""Generation: conditioning (prompts, infilling), nucleus sampling, EOS truncation, semi-AR, seeds."""

import itertools

import pytest
import torch
from scipy.stats import chisquare

from seqdiff.backbones import build_backbone
from seqdiff.categorical import probs_from_logits, top_p_filter
from seqdiff.config import MethodConfig, ModelConfig, from_dict
from seqdiff.methods import MDLM
from seqdiff.methods.ar import AR
from seqdiff.samplers import ARSampler, MDLMAncestralSampler, MDLMCachedSampler, SamplerError, build_sampler
from seqdiff.tokenizers import CharTokenizer
from tests.oracles import JointOracle
from tests.test_mdlm import TinyNet

TOK = CharTokenizer(alphabet="abc", normalize="none")
V, MASK = TOK.vocab_size, TOK.mask_id


def _mdlm():
    return MDLM(MethodConfig(), TOK)


def _ar_backbone(seed: int = 0):
    torch.manual_seed(seed)
    cfg = from_dict(ModelConfig, {"preset": "test", "max_seq_len": 16})
    net = build_backbone(cfg, vocab_size=V, causal=True).eval()
    with torch.no_grad():  # random weights everywhere (zero-initialized heads would ignore the context)
        for p in net.parameters():
            p.add_(0.5 * torch.randn_like(p))
    return net


# ------------------------------------------------------------------------------------------- conditioning
@pytest.mark.parametrize("cls", [MDLMAncestralSampler, MDLMCachedSampler])
def test_infilling_keeps_given_tokens_and_fills_every_mask(cls):
    L, B = 12, 6
    given = torch.full((B, L), -1)
    given[:, :3] = torch.tensor([0, 1, 2])  # prefix
    given[:, 6] = 1  # an isolated token
    given[::2, 10:] = 2  # a suffix in every other row
    for steps in (1, 5, 40):
        x = cls(_mdlm(), TinyNet(L), steps=steps).generate(B, L, torch.Generator().manual_seed(steps),
                                                            given=given).tokens
        fixed = given >= 0
        assert torch.equal(x[fixed], given[fixed])
        assert not (x == MASK).any() and (x < V).all()
    # a 1-D given applies to every row
    x = cls(_mdlm(), TinyNet(L), steps=8).generate(3, L, torch.Generator().manual_seed(0), given=given[1]).tokens
    assert (x[:, :3] == torch.tensor([0, 1, 2])).all() and (x[:, 6] == 1).all()


def test_cached_equals_uncached_with_given():
    L = 12
    given = torch.full((L,), -1)
    given[2], given[7:9] = 0, 2
    for steps in (4, 30):
        a = MDLMAncestralSampler(_mdlm(), TinyNet(L), steps=steps).generate(4, L, torch.Generator().manual_seed(3),
                                                                             given=given)
        b = MDLMCachedSampler(_mdlm(), TinyNet(L), steps=steps).generate(4, L, torch.Generator().manual_seed(3),
                                                                          given=given)
        assert torch.equal(a.tokens, b.tokens)
        assert b.num_denoiser_calls <= a.num_denoiser_calls


def test_given_is_validated():
    s = MDLMAncestralSampler(_mdlm(), TinyNet(4), steps=2)
    with pytest.raises(SamplerError, match="shape"):
        s.generate(2, 4, given=torch.full((3,), -1))
    with pytest.raises(SamplerError, match="outside"):
        s.generate(2, 4, given=torch.tensor([0, 99, -1, -1]))
    with pytest.raises(SamplerError, match="MASK"):
        s.generate(2, 4, given=torch.tensor([MASK, -1, -1, -1]))


def test_conditioning_on_a_middle_token_gives_the_exact_conditional():
    """Exact joint denoiser + one reveal per step: the samples follow p(x_0, x_2 | x_1 = 1) (chi-square)."""
    L, K, N = 3, 3, 3000
    torch.manual_seed(1)
    joint = torch.distributions.Dirichlet(torch.full((K**L,), 0.7)).sample(()).reshape(K, K, K)
    oracle = JointOracle(joint, L, K, V, MASK)
    given = torch.tensor([-1, 1, -1])
    x = MDLMCachedSampler(_mdlm(), oracle, steps=400).generate(N, L, torch.Generator().manual_seed(0),
                                                               given=given).tokens
    assert (x[:, 1] == 1).all()
    counts = torch.bincount(x[:, 0] * K + x[:, 2], minlength=K * K).double()
    cond = joint[:, 1, :].double().reshape(-1)
    expected = cond / cond.sum() * N
    keep = expected > 5
    expected = expected[keep] * counts[keep].sum() / expected[keep].sum()
    assert chisquare(counts[keep].numpy(), expected.numpy()).pvalue > 1e-3
    # and it is not the unconditional marginal of (x_0, x_2) (so the test can fail)
    marg = joint.double().sum(1).reshape(-1)
    assert (marg / marg.sum() - cond / cond.sum()).abs().max() > 0.02


def test_ar_prompt_is_kept_and_infilling_refused():
    net, method = _ar_backbone(), AR(MethodConfig(name="ar"), TOK)
    sampler = ARSampler(method, net)
    L = 10
    given = torch.full((2, L), -1)
    given[0, :3] = torch.tensor([2, 1, 0])
    given[1, :1] = 1  # rows may have prompts of different lengths
    x = sampler.generate(2, L, torch.Generator().manual_seed(0), given=given).tokens
    assert torch.equal(x[given >= 0], given[given >= 0])
    # the continuation depends on the prompt: same seed, different prompt -> different continuation
    x2 = sampler.generate(2, L, torch.Generator().manual_seed(0), given=torch.full((L,), -1)).tokens
    assert not torch.equal(x[:, 3:], x2[:, 3:])
    bad = torch.full((L,), -1)
    bad[4] = 0
    with pytest.raises(SamplerError, match="prefix prompt only"):
        sampler.generate(2, L, given=bad)


def test_ar_samples_never_hold_mask_or_pad():
    """An AR model leaves MASK and PAD (never its targets) some softmax mass; the sampler gives them none. Here
    a backbone that puts most of its mass on them: every drawn token is still a real one (or BOS / EOS)."""
    net, method = _ar_backbone(), AR(MethodConfig(name="ar"), TOK)
    never = [method.mask_id, method.pad_id]
    favoured = [*never, method.bos_id, method.eos_id]

    class Favouring(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net, self.config = net, net.config

        def new_kv_cache(self, *args, **kwargs):
            return net.new_kv_cache(*args, **kwargs)

        def forward(self, tokens, **kwargs):
            out = self.net(tokens, **kwargs).clone()
            out[..., favoured] += 20.0
            return out

    bos = torch.full((64, 1), method.bos_id)
    assert torch.softmax(Favouring()(bos)[:, -1].double(), -1)[:, favoured].sum(-1).min() > 0.9  # the test can fail
    for temperature, top_p in ((1.0, 1.0), (1.5, 0.9), (0.0, 1.0)):
        x = ARSampler(method, Favouring(), temperature=temperature, top_p=top_p).generate(
            64, 8, torch.Generator().manual_seed(0)).tokens
        assert not torch.isin(x, torch.tensor(never)).any()
    # through generate(), for a model whose data held no specials (a text stream): no BOS / EOS either, so
    # every sample decodes to the length asked for
    from seqdiff.config import DataConfig, SampleConfig, TextDataConfig
    from seqdiff.evaluation.generate import generate

    model = _loaded(Favouring(), method, 8)
    model.data_config = DataConfig(text=TextDataConfig(block_mode="stream"))
    out = generate(model, SampleConfig(num_samples=64, batch_size=64, seed=0))
    assert not torch.isin(torch.stack(out.tokens), torch.tensor(favoured)).any()
    assert all(len(t) == 8 for t in out.texts) and method.never_sampled == ()


# ------------------------------------------------------------------------------------------- top-p
def _brute_force_nucleus(p: list[float], top_p: float) -> set[int]:
    """The smallest set with mass >= top_p; among equal-size sets, the one of largest mass, then the
    lexicographically smallest ids (ties toward lower ids)."""
    total = sum(p)
    for size in range(1, len(p) + 1):
        best = None
        for subset in itertools.combinations(range(len(p)), size):
            mass = sum(p[i] for i in subset) / total
            if mass >= top_p - 1e-12:
                key = (-mass, subset)
                best = key if best is None or key < best else best
        if best is not None:
            return set(best[1])
    raise AssertionError


def test_top_p_keeps_the_smallest_set_reaching_p():
    g = torch.Generator().manual_seed(0)
    cases = []
    for _ in range(60):
        probs = torch.distributions.Dirichlet(torch.full((7,), 0.5)).sample().double()
        top_p = float(torch.rand((), generator=g)) * 0.98 + 0.01
        cases.append((probs, top_p))
    # ties with exact binary fractions: equal probabilities at the boundary
    cases += [(torch.tensor([0.25, 0.125, 0.25, 0.125, 0.25], dtype=torch.float64), p)
              for p in (0.1, 0.25, 0.3, 0.5, 0.6, 0.75, 0.8, 0.875, 0.9, 1.0)]
    cases += [(torch.full((5,), 0.2, dtype=torch.float64), p) for p in (0.1, 0.3, 0.5, 0.99)]
    for probs, top_p in cases:
        out = top_p_filter(probs, top_p)
        kept = set(torch.nonzero(out).flatten().tolist())
        assert kept == _brute_force_nucleus(probs.tolist(), top_p), (probs, top_p)
        assert out.sum().item() == pytest.approx(1.0, abs=1e-12)
        # renormalized: kept ratios are unchanged
        idx = sorted(kept)
        torch.testing.assert_close(out[idx], probs[idx] / probs[idx].sum())
    # batched rows are independent, and the tie rule picks the lower id
    batch = torch.stack([c[0] for c in cases[:5]])
    torch.testing.assert_close(top_p_filter(batch, 0.5), torch.stack([top_p_filter(c[0], 0.5) for c in cases[:5]]))
    assert top_p_filter(torch.full((4,), 0.25, dtype=torch.float64), 0.5).tolist() == [0.5, 0.5, 0.0, 0.0]
    with pytest.raises(ValueError):
        top_p_filter(torch.ones(3), 0.0)
    # through logits: temperature first, then the filter
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0])
    expected = top_p_filter(torch.softmax(logits.double() / 0.5, -1), 0.9)
    torch.testing.assert_close(probs_from_logits(logits, 0.5, 0.9), expected)
    # temperature 0: a float64 one-hot on the argmax of each row
    greedy = probs_from_logits(torch.tensor([[[0.0, 3.0, 1.0], [5.0, -1.0, 2.0]]]), 0.0)
    assert greedy.dtype == torch.float64 and greedy.tolist() == [[[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]]]


def test_top_p_threads_through_the_samplers():
    L = 8
    net = TinyNet(L)
    s = MDLMCachedSampler(_mdlm(), net, steps=L, top_p=0.3)
    x = s.generate(200, L, torch.Generator().manual_seed(0)).tokens
    # with top_p tiny only the argmax can be drawn at the first reveal of each row; check overall support shrinks
    full = MDLMCachedSampler(_mdlm(), net, steps=L).generate(200, L, torch.Generator().manual_seed(0)).tokens
    assert len(torch.unique(x, dim=0)) < len(torch.unique(full, dim=0))
    ar = ARSampler(AR(MethodConfig(name="ar"), TOK), _ar_backbone(), top_p=1e-6)  # greedy
    y = ar.generate(3, 6, torch.Generator().manual_seed(1)).tokens
    assert torch.equal(y, ar.generate(3, 6, torch.Generator().manual_seed(2)).tokens)
    assert torch.equal(y, ARSampler(AR(MethodConfig(name="ar"), TOK), _ar_backbone(), temperature=0)
                       .generate(3, 6, torch.Generator().manual_seed(5)).tokens)
    with pytest.raises(SamplerError, match="top_p"):
        MDLMCachedSampler(_mdlm(), net, top_p=1.5)
    assert build_sampler("ancestral", _mdlm(), net, steps=4, top_p=0.9).top_p == 0.9


# ------------------------------------------------------------------------------------------- generate()
def _loaded(net, method, seq_len):
    from seqdiff.checkpoint import LoadedModel

    return LoadedModel(backbone=net, method=method, tokenizer=TOK, model_config=None, method_config=None,
                       data_config=None, seq_len=seq_len, step=0, path=None, ema=False)


def test_semi_ar_length_and_overlap():
    from seqdiff.samplers.mdlm_semi_ar import block_starts, generate_semi_ar

    assert block_starts(30, 12, 4) == [0, 8, 16, 24]
    assert block_starts(12, 12, 4) == [0]
    with pytest.raises(SamplerError, match="overlap"):
        block_starts(30, 12, 12)
    L, total, overlap = 12, 37, 5
    sampler = MDLMCachedSampler(_mdlm(), TinyNet(L), steps=6)
    given = torch.full((total,), -1)
    given[:3], given[30] = 1, 2  # a prompt and a token in a later block
    out = generate_semi_ar(sampler, 3, total, L, overlap, torch.Generator().manual_seed(0), given=given)
    assert out.tokens.shape == (3, total) and not (out.tokens == MASK).any() and (out.tokens >= 0).all()
    assert (out.tokens[:, :3] == 1).all() and (out.tokens[:, 30] == 2).all()
    starts = block_starts(total, L, overlap)
    assert len(out.blocks) == len(starts) == 5
    for k, (start, block) in enumerate(zip(starts, out.blocks)):
        assert torch.equal(out.tokens[:, start : start + block.shape[1]], block)
        if k:  # the overlap tokens of block k equal the tail of block k - 1
            assert torch.equal(block[:, :overlap], out.blocks[k - 1][:, -overlap:])
    assert sum(b.shape[1] for b in out.blocks) - overlap * (len(starts) - 1) == total
    # semi-AR through generate(): requested length, same seed -> same samples, different seed -> different
    from seqdiff.config import SampleConfig
    from seqdiff.evaluation.generate import generate

    model = _loaded(TinyNet(L), _mdlm(), L)
    with pytest.raises(SamplerError, match="max_seq_len"):  # beyond the context only when asked
        generate(model, SampleConfig(steps=6, seq_len=50))
    cfg = SampleConfig(steps=6, num_samples=3, batch_size=2, seq_len=50, semi_ar=True, overlap=4, seed=1)
    a, b = generate(model, cfg), generate(model, cfg)
    assert all(len(t) == 50 for t in a.tokens) and a.lengths == [50] * 3
    assert all(torch.equal(x, y) for x, y in zip(a.tokens, b.tokens))
    c = generate(model, SampleConfig(steps=6, num_samples=3, batch_size=2, seq_len=50, semi_ar=True, overlap=4,
                                     seed=2))
    assert not all(torch.equal(x, y) for x, y in zip(a.tokens, c.tokens))


def test_eos_truncation_and_length_distribution():
    from seqdiff.config import SampleConfig
    from seqdiff.evaluation.generate import generate, length_distribution, truncate_at_eos

    eos = TOK.eos_id
    assert truncate_at_eos(torch.tensor([0, 1, eos, 2, eos]), eos).tolist() == [0, 1]
    assert truncate_at_eos(torch.tensor([eos, 1]), eos).tolist() == []
    assert truncate_at_eos(torch.tensor([0, 1, 2]), eos).tolist() == [0, 1, 2]
    assert length_distribution([2, 4, 9]) == {"count": 3, "min": 2.0, "max": 9.0, "mean": 5.0, "median": 4.0,
                                               "std": pytest.approx((26 / 3) ** 0.5)}

    class EosNet(TinyNet):  # EOS is likely at every position
        def forward(self, input_ids, noise_level=None, attention_mask=None, kv_cache=None):
            logits = super().forward(input_ids)
            return logits.index_add(-1, torch.tensor([eos]), torch.full_like(logits[..., :1], 2.0))

    model = _loaded(EosNet(10), _mdlm(), 10)
    full = generate(model, SampleConfig(steps=10, num_samples=8, batch_size=8, seed=0))
    cut = generate(model, SampleConfig(steps=10, num_samples=8, batch_size=8, seed=0, stop_at_eos=True))
    assert any((t == eos).any() for t in full.tokens)
    for f, c, n in zip(full.tokens, cut.tokens, cut.lengths):
        assert not (c == eos).any() and len(c) == n and torch.equal(c, f[:n])
        assert n == len(f) or f[n] == eos
    assert min(cut.lengths) < 10


def test_text_conditioning_helpers():
    from seqdiff.evaluation.generate import given_from_infill, given_from_prompt
    from seqdiff.tokenizers import NucleotideTokenizer

    assert given_from_prompt(TOK, "ab", 4).tolist() == [0, 1, -1, -1]
    with pytest.raises(SamplerError, match="longer than the sample length"):
        given_from_prompt(TOK, "abcab", 4)
    with pytest.raises(SamplerError, match="outside the tokenizer's alphabet: 'dz'"):
        given_from_prompt(TOK, "adz", 8)
    assert given_from_infill(TOK, "a__c_").tolist() == [0, -1, -1, 2, -1]
    assert given_from_infill(TOK, "a_", 4).tolist() == [0, -1, -1, -1]
    with pytest.raises(SamplerError, match="no masked position"):
        given_from_infill(TOK, "abc")
    dna = NucleotideTokenizer()
    assert given_from_infill(dna, "ACNNt").tolist() == [0, 1, -1, -1, 3]
    with pytest.raises(SamplerError, match="alphabet"):
        given_from_infill(dna, "ACXN")
    # text8 normalization does not hide bad characters in a prompt
    with pytest.raises(SamplerError, match="'!'"):
        given_from_prompt(CharTokenizer(), "Hi!", 8)
    assert given_from_prompt(CharTokenizer(), "Hi", 3).tolist()[:2] == [7, 8]


def test_infill_intervals_mask_exactly_their_positions_and_keep_the_rest():
    from seqdiff.evaluation.generate import given_from_infill, parse_intervals

    assert parse_intervals("2-5, 8-10") == [(2, 5), (8, 10)]
    for bad, message in [("2-2", "empty"), ("5-3", "empty"), ("a-b", "START-END"), ("3", "START-END")]:
        with pytest.raises(SamplerError, match=message):
            parse_intervals(bad)
    text = "abcabcab_cab"  # a placeholder too: both kinds of masks combine
    given = given_from_infill(TOK, text, intervals=[(2, 5), (8, 10)])
    free = [i for i in range(len(text)) if 2 <= i < 5 or 8 <= i < 10]
    assert [i for i, g in enumerate(given.tolist()) if g == -1] == free
    with pytest.raises(SamplerError, match="past the end"):
        given_from_infill(TOK, text, intervals=[(10, 13)])
    assert given_from_infill(TOK, "abc", intervals=[(0, 1)]).tolist() == [-1, 1, 2]  # no placeholder needed
    for cls in (MDLMAncestralSampler, MDLMCachedSampler):
        x = cls(_mdlm(), TinyNet(len(text)), steps=7).generate(4, len(text), torch.Generator().manual_seed(1),
                                                               given=given).tokens
        kept = given >= 0
        assert torch.equal(x[:, kept], given[kept].expand(4, -1)) and not (x == MASK).any() and (x < V).all()


# ------------------------------------------------------------------------------------------- special ids
class SpecialNet(TinyNet):
    """A denoiser that puts most of its mass on BOS, EOS and PAD (an undertrained model's habit)."""

    def forward(self, input_ids, noise_level=None, attention_mask=None, kv_cache=None):
        logits = super().forward(input_ids)
        specials = torch.tensor([TOK.bos_id, TOK.eos_id, TOK.pad_id])
        return logits.index_add(-1, specials, torch.full((*logits.shape[:-1], 3), 4.0))


def _dit(seq_len, seed=0):
    torch.manual_seed(seed)
    net = build_backbone(from_dict(ModelConfig, {"preset": "test", "max_seq_len": seq_len}), vocab_size=V,
                         causal=False).eval()
    with torch.no_grad():  # random weights: roughly uniform, so 3 of 7 ids are specials
        for p in net.parameters():
            p.add_(0.5 * torch.randn_like(p))
    return net


@pytest.mark.parametrize("sampler", ["ancestral", "cached", "first_hitting", "remdm", "confidence"])
@pytest.mark.parametrize("net", ["special", "dit"])
def test_samples_hold_no_special_token_they_have_no_place_for(sampler, net):
    """PAD (never a training target) is never generated; inside an infill neither are BOS and EOS, so the
    decoded text lines up with its template; a model whose data held no specials (a text stream) generates
    none; the restriction ends with the generation (the loss never sees it). The real DiT takes the sparse
    output head (x_theta only at the masked positions), the toy net the full one."""
    from seqdiff.config import DataConfig, SampleConfig, TextDataConfig
    from seqdiff.evaluation.generate import generate, given_from_infill

    L = 16
    backbone = SpecialNet(L) if net == "special" else _dit(L)
    method = _mdlm()
    model = _loaded(backbone, method, L)
    cfg = SampleConfig(sampler=sampler, steps=8, num_samples=6, batch_size=6, seed=0)
    specials = torch.tensor([TOK.bos_id, TOK.eos_id, TOK.pad_id])
    free = generate(model, cfg)
    held = torch.stack(free.tokens)
    assert not (held == TOK.pad_id).any() and torch.isin(held, specials).any()  # BOS / EOS: documents, maybe
    template = "ab____cabc__ab_c"
    out = generate(model, cfg, given=given_from_infill(TOK, template))
    assert not torch.isin(torch.stack(out.tokens), specials).any()
    assert all(len(t) == L and all(a == b for a, b in zip(template, t) if a != "_") for t in out.texts)
    model.data_config = DataConfig(text=TextDataConfig(block_mode="stream"))
    assert not torch.isin(torch.stack(generate(model, cfg).tokens), specials).any()
    assert method.never_sampled == ()


def test_sampling_without_renormalizes_x_theta_over_the_other_tokens():
    """Inside `sampling_without(ids)` x_theta is exactly the usual one with `ids` removed and the rest rescaled
    to sum to 1 (brute force: zero and divide); outside it, the usual one again (what the loss reads)."""
    method, net = _mdlm(), SpecialNet(8)
    xt = torch.full((2, 8), MASK)
    xt[0, 3] = 1
    t = torch.full((2,), 0.7)
    before = method.denoise(net, xt, t)
    ids = [TOK.bos_id, TOK.pad_id]
    with method.sampling_without(set(ids)):
        inside = method.denoise(net, xt, t)
    expected = before.clone()
    expected[..., ids] = 0
    expected /= expected.sum(-1, keepdim=True)
    torch.testing.assert_close(inside, expected)
    torch.testing.assert_close(method.denoise(net, xt, t), before)
