"""EDLM importance sampling batched across rows and candidates draws the same tokens as the row-by-row
implementation it replaced (kept here as the reference), for the same generator."""

import pytest
import torch

from seqdiff.categorical import sample_categorical
from seqdiff.config import MethodConfig
from seqdiff.edlm.base import draw_candidates, draw_candidates_rows, masked_log_mu
from seqdiff.methods import MDLM
from seqdiff.samplers import EDLMImportanceSampler
from seqdiff.samplers.edlm_importance import effective_sample_size, row_generators
from tests.edlm_toys import MASK, TOK, CountEnergy
from tests.test_mdlm import TinyNet


def dense(probs_at, x, mask_id):
    """(B, L, V) float64 x_theta from the sampler's masked-position lookup: SUBS's one-hot carry-over elsewhere
    (what `MDLM.denoise` returns, which the samplers read before they kept logits at the masked positions)."""
    positions = (x == mask_id).flatten().nonzero()[:, 0]
    p = probs_at(positions)
    out = torch.zeros(x.numel(), p.shape[-1], dtype=torch.float64)
    out.scatter_(1, x.flatten()[:, None], 1.0)
    out[positions] = p
    return out.view(*x.shape, -1)


class RowByRowEDLM(EDLMImportanceSampler):
    """The sampler as it was: candidates, resampling and MDLM steps one row at a time, on dense probabilities."""

    def importance_x0(self, probs_at, xt, gens):
        probs = dense(probs_at, xt, self.method.mask_id)
        B, L, V = probs.shape
        k, mask_id = self.k, self.method.mask_id
        cands = torch.cat([draw_candidates(probs[r : r + 1], xt[r : r + 1], mask_id, k, g)
                           for r, g in enumerate(gens)])
        flat = cands.reshape(B * k, L)
        xt_rep = xt.repeat_interleave(k, 0)
        log_mu = masked_log_mu(probs.repeat_interleave(k, 0), flat, xt_rep, mask_id)
        log_w = -self.energy(flat, xt_rep, log_mu).view(B, k)
        weights = torch.softmax(log_w, dim=-1)
        pick = torch.cat([sample_categorical(weights[r : r + 1], g) for r, g in enumerate(gens)])
        return cands[torch.arange(B), pick], effective_sample_size(log_w)

    def reveal_rows(self, x, t, s, gens):
        return torch.cat([self.method.reveal_mask(x[r : r + 1], t[r : r + 1], s[r : r + 1], g)
                          for r, g in enumerate(gens)])

    def mdlm_step_rows(self, probs_at, x, t, s, gens):
        probs = dense(probs_at, x, self.method.mask_id)
        return torch.cat([self.method.reverse_step(probs[r : r + 1], x[r : r + 1], t[r : r + 1], s[r : r + 1], g)
                          for r, g in enumerate(gens)])


class CallCounter(CountEnergy):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def energy(self, x0, xt, log_mu):
        self.calls += 1
        return super().energy(x0, xt, log_mu)


@pytest.mark.parametrize("k,window,steps,batch", [(2, 0.2, 8, 5), (3, 1.0, 6, 4), (4, 0.6, 30, 3), (1, 1.0, 5, 2)])
def test_batched_equals_row_by_row(k, window, steps, batch):
    net = TinyNet(8)
    given = torch.tensor([-1, 2, -1, -1, 0, -1, -1, -1])
    for g in (None, given):
        out = []
        for cls in (EDLMImportanceSampler, RowByRowEDLM):
            sampler = cls(MDLM(MethodConfig(), TOK), net, steps=steps, energy=CountEnergy(), k=k, window=window)
            res = sampler.generate(batch, 8, torch.Generator().manual_seed(11), given=g)
            out.append((res.tokens, sampler.ess, res.num_denoiser_calls))
        assert torch.equal(out[0][0], out[1][0])
        assert out[0][1] == out[1][1] and out[0][2] == out[1][2]


def test_time_conditioned_and_one_energy_forward_per_step():
    net = TinyNet(8)
    net.config.time_conditioning = True
    energy = CallCounter()
    a = EDLMImportanceSampler(MDLM(MethodConfig(), TOK), net, steps=6, energy=energy, k=3, window=1.0)
    b = RowByRowEDLM(MDLM(MethodConfig(), TOK), net, steps=6, energy=CountEnergy(), k=3, window=1.0)
    x = a.generate(16, 8, torch.Generator().manual_seed(2)).tokens
    assert torch.equal(x, b.generate(16, 8, torch.Generator().manual_seed(2)).tokens)
    assert energy.calls == len(a.ess) <= 6  # one forward over all 16 x 3 candidates per importance step


def test_candidate_rows_match_one_row_calls():
    g = torch.Generator().manual_seed(0)
    probs = torch.softmax(torch.randn(4, 5, 7, generator=g, dtype=torch.float64), -1)
    xt = torch.tensor([[6, 1, 6, 6, 2]] * 4)
    batched = draw_candidates_rows(probs, xt, 6, 3, row_generators(4, torch.Generator().manual_seed(1), "cpu"))
    gens = row_generators(4, torch.Generator().manual_seed(1), "cpu")
    rows = torch.cat([draw_candidates(probs[r : r + 1], xt[r : r + 1], 6, 3, gens[r]) for r in range(4)])
    assert torch.equal(batched, rows) and (batched[..., 1] == 1).all()


def test_candidates_log_mu_equals_masked_log_mu_of_repeated_probabilities():
    from seqdiff.edlm.base import candidates_log_mu

    g = torch.Generator().manual_seed(3)
    probs = torch.softmax(torch.randn(4, 5, 7, generator=g, dtype=torch.float64), -1)
    xt = torch.tensor([[6, 1, 6, 6, 2], [6, 6, 6, 6, 6], [0, 1, 2, 3, 4], [6, 0, 6, 1, 6]])
    cands = draw_candidates_rows(probs, xt, 6, 3, row_generators(4, torch.Generator().manual_seed(1), "cpu"))
    got = candidates_log_mu(probs, cands, xt, 6)  # (4, 3)
    want = masked_log_mu(probs.repeat_interleave(3, 0), cands.reshape(12, 5), xt.repeat_interleave(3, 0), 6)
    assert torch.equal(got.reshape(12), want)
    assert (got[2] == 0).all() and (got[1] < 0).all()  # nothing masked: log 1; all masked: a sum of logs


@pytest.mark.parametrize("top_p", [1.0, 0.8])
def test_candidates_at_masked_positions_equal_the_dense_draws(top_p):
    """draw_candidates_at (mu asked per row at its masked positions, one (L, V) draw of uniforms per candidate)
    gives the candidates and log mu of draw_candidates_rows + candidates_log_mu on the dense probabilities,
    with the same generators: rows with every, some and no position masked."""
    from seqdiff.categorical import probs_from_logits
    from seqdiff.edlm.base import candidates_log_mu, draw_candidates_at

    g = torch.Generator().manual_seed(4)
    xt = torch.tensor([[6, 1, 6, 6, 2], [6, 6, 6, 6, 6], [0, 1, 2, 3, 4], [6, 0, 6, 1, 6]])
    logits = torch.randn(4, 5, 7, generator=g, dtype=torch.float64)
    logits[..., 6] = -torch.inf  # SUBS: no mass on MASK
    masked = (xt == 6).flatten().nonzero()[:, 0]
    at = lambda pos: probs_from_logits(logits.flatten(0, 1)[pos], 1.0, top_p)  # noqa: E731
    probs = dense(at, xt, 6)
    want_c = draw_candidates_rows(probs, xt, 6, 3, row_generators(4, torch.Generator().manual_seed(1), "cpu"))
    want_mu = candidates_log_mu(probs, want_c, xt, 6)
    asked = []
    cands, log_mu = draw_candidates_at(lambda pos: asked.append(pos) or at(pos), xt, 6, 3,
                                       row_generators(4, torch.Generator().manual_seed(1), "cpu"))
    assert torch.equal(cands, want_c) and torch.equal(log_mu, want_mu)
    assert torch.equal(torch.cat(asked), masked)  # mu asked only where x_t is masked, once per row
    assert not torch.equal(cands[:, 0], cands[:, 1])  # the k candidates differ (so the test can fail)


def test_likelihood_log_weights_equal_the_dense_draw():
    """EDLMBound.log_weights draws its n candidates row by row (draw_candidates_at with one generator for every
    row): the same candidates, log mu and weights as one (B, n, L, V) draw with n copies of the probabilities,
    including draws from an x_t with one more position fixed (log mu still relative to x_t)."""
    from seqdiff.edlm.likelihood import EDLMBound

    g = torch.Generator().manual_seed(5)
    probs = torch.softmax(torch.randn(4, 5, 7, generator=g, dtype=torch.float64), -1)
    xt = torch.tensor([[6, 1, 6, 6, 2], [6, 6, 6, 6, 6], [0, 1, 2, 3, 4], [6, 0, 6, 1, 6]])
    draw_from = xt.clone()
    draw_from[[0, 1, 3], [0, 2, 4]] = torch.tensor([3, 0, 5])
    class WithLogMu(CountEnergy):  # reads log mu too, so a wrong log mu changes the weights
        def energy(self, x0, xt, log_mu):
            return super().energy(x0, xt, log_mu) + 0.5 * log_mu

    assert MASK == 6
    bound = EDLMBound(MDLM(MethodConfig(), TOK), WithLogMu(), num_partition_samples=3)
    for source in (xt, draw_from):
        got = bound.log_weights(probs, xt, source, torch.Generator().manual_seed(2))
        cands = draw_candidates(probs, source, 6, 3, torch.Generator().manual_seed(2)).reshape(12, 5)
        log_mu = masked_log_mu(probs.repeat_interleave(3, 0), cands, xt.repeat_interleave(3, 0), 6)
        want = -WithLogMu()(cands, xt.repeat_interleave(3, 0), log_mu).view(4, 3)
        assert torch.equal(got, want)
    assert got.std() > 0  # the weights vary (so the comparison can fail)


def test_energy_forwards_are_capped_by_rows_times_length_times_width():
    """Energy.__call__ splits the rows so that rows x L x row_width stays under chunk_elements (an AR energy at
    1,024 tokens and GPT-2's vocabulary would otherwise hold (rows, L, V) float64 log-probabilities at once),
    with the same energies as one forward."""

    class Wide(CallCounter):
        chunk_elements = 100

        def row_width(self):
            return 10

    x0 = torch.randint(0, 3, (12, 5), generator=torch.Generator().manual_seed(0))
    log_mu = torch.zeros(12, dtype=torch.float64)
    wide, plain = Wide(), CallCounter()
    assert torch.equal(wide(x0, x0, log_mu, chunk=256), plain(x0, x0, log_mu, chunk=256))
    assert (wide.calls, plain.calls) == (6, 1)  # 100 // (5 x 10) = 2 rows a forward
    assert wide(x0[:1], x0[:1], log_mu[:1]).shape == (1,)  # a row wider than the cap still runs, alone
    from seqdiff.edlm.ar_energy import AREnergy
    from tests.edlm_toys import ar_model

    ar = AREnergy(ar_model(torch.full((3, 3, 3), 1 / 27, dtype=torch.float64), 3), TOK.vocab_size, MASK)
    assert ar.row_width() == TOK.vocab_size
