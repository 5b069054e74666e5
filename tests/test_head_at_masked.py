"""method.head_at_masked: MDLM asks the backbone for the logits of the masked positions only.

The SUBS loss lives on the masked positions, so skipping the output head elsewhere must leave the loss, the
reported NELBO terms and the gradients exactly where the full computation puts them (up to float summation
order), for every draw of the noise, with packing, micro-batches, complementary pairs and time conditioning.
The full path is itself tested against the enumerated NELBO (tests/test_mdlm.py, test_time_sampling.py).
"""

import dataclasses

import pytest
import torch

from seqdiff.backbones import build_backbone
from seqdiff.config import MethodConfig, ModelConfig
from seqdiff.methods import MDLM, Batch
from seqdiff.tokenizers import CharTokenizer, NucleotideTokenizer

TOK = CharTokenizer()
TINY = ModelConfig(hidden_size=16, n_layers=2, n_heads=2, max_seq_len=12, cond_dim=8,
                   time_conditioning=False)


def _backbone(backbone="dit", time_conditioning=False, rc="none", tokenizer=TOK, layers=TINY.n_layers):
    torch.manual_seed(0)
    cfg = dataclasses.replace(TINY, backbone=backbone, time_conditioning=time_conditioning, rc_equivariant=rc,
                              n_layers=layers)
    complement = getattr(tokenizer, "complement_ids", None)
    return build_backbone(cfg, tokenizer.vocab_size, causal=False,
                          complement_ids=complement() if callable(complement) else complement)


@pytest.mark.parametrize("backbone,conditioned", [("dit", False), ("dit", True), ("bert", False)])
def test_output_index_gives_the_full_logits_at_those_positions(backbone, conditioned):
    net = _backbone(backbone, conditioned).eval()
    x = torch.randint(0, TOK.vocab_size - 4, (3, 12), generator=torch.Generator().manual_seed(1))
    sigma = torch.tensor([0.1, 1.0, 3.0])
    index = torch.tensor([0, 5, 13, 35, 23])
    full = net(x, noise_level=sigma)  # (3, 12, V)
    torch.testing.assert_close(net(x, noise_level=sigma, output_index=index), full.flatten(0, 1)[index])


def _loss_and_grads(net, method, batch, rows=None, seed=11):
    net.zero_grad()
    out = method.loss(net, batch, torch.Generator().manual_seed(seed), **({} if rows is None else {"rows": rows}))
    out.loss.backward()
    return out, {n: p.grad.clone() for n, p in net.named_parameters() if p.grad is not None}


def _batch(packed=False):
    gen = torch.Generator().manual_seed(3)
    x0 = torch.randint(0, TOK.vocab_size - 4, (6, 12), generator=gen)
    x0[2, 9:] = TOK.pad_id
    if not packed:
        return Batch(x0, attention_mask=x0 != TOK.pad_id)
    segment_ids = torch.tensor([0] * 5 + [1] * 7).repeat(6, 1)
    positions = torch.cat([torch.arange(5), torch.arange(7)]).repeat(6, 1)
    return Batch(x0, segment_ids=segment_ids, positions=positions)


CASES = {
    "antithetic": ({}, {}),
    "mask_count": ({"time_sampling": "mask_count"}, {}),
    "pairs": ({"complementary_masks": True}, {}),
    "discrete": ({"num_timesteps": 10}, {}),
    "time_conditioned": ({}, {"conditioned": True}),
    "bert": ({}, {"backbone": "bert"}),
    "packed": ({}, {"packed": True}),
    "micro_batch": ({}, {"rows": slice(2, 5)}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_head_at_masked_leaves_loss_and_gradients_unchanged(case):
    method_kw, opts = CASES[case]
    net = _backbone(opts.get("backbone", "dit"), opts.get("conditioned", False))
    batch = _batch(opts.get("packed", False))
    sparse = MDLM(MethodConfig(**method_kw), TOK)
    full = MDLM(MethodConfig(head_at_masked=False, **method_kw), TOK)
    out_s, grads_s = _loss_and_grads(net, sparse, batch, opts.get("rows"))
    out_f, grads_f = _loss_and_grads(net, full, batch, opts.get("rows"))
    assert out_s.loss.shape == ()
    torch.testing.assert_close(out_s.loss, out_f.loss, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(out_s.nll_sum, out_f.nll_sum, rtol=1e-6, atol=1e-6)
    assert out_s.num_tokens == out_f.num_tokens
    assert grads_s.keys() == grads_f.keys() and grads_s
    for name in grads_f:
        torch.testing.assert_close(grads_s[name], grads_f[name], rtol=1e-5, atol=1e-7, msg=name)


@pytest.mark.parametrize("backbone", ["dit", "bert"])
def test_the_sparse_path_runs_the_head_on_masked_positions_only(backbone):
    """The head really runs at fewer rows: the forward FLOPs differ by the head's 2 H V per unmasked position, and
    for the DiT by its last block's output projection (2 H^2) and MLP (2 x 2 H 4H) there too
    (`DiT.last_block_at_outputs`)."""
    from torch.utils.flop_counter import FlopCounterMode

    net = _backbone(backbone)
    batch = _batch()
    flops = {}
    for sparse in (True, False):
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            MDLM(MethodConfig(head_at_masked=sparse), TOK).loss(net, batch, torch.Generator().manual_seed(0))
        flops[sparse] = counter.get_total_flops()
    scored = batch.scored(TOK.pad_id)
    xt = MDLM(MethodConfig(), TOK).draw_noise(batch.input_ids, scored, torch.Generator().manual_seed(0))[1]
    unmasked = int((xt != TOK.mask_id).sum())
    assert 0 < unmasked < xt.numel()
    H = TINY.hidden_size
    per_position = 2 * H * TOK.vocab_size + (2 * H * H if backbone == "bert" else 18 * H * H)  # BERT: + its dense
    # transform; DiT: its last block's output projection and MLP
    assert flops[False] - flops[True] == per_position * unmasked


def test_excluded_id_has_a_minus_inf_logit_and_no_gradient():
    """exclude_id puts -inf into the output bias: exactly SUBS's MASK logit, and nothing flows back through it."""
    for backbone in ("dit", "bert"):
        net = _backbone(backbone)
        x = torch.randint(0, TOK.vocab_size - 4, (2, 12))
        logits = net(x, output_index=torch.arange(5), exclude_id=TOK.mask_id)
        assert torch.isneginf(logits[:, TOK.mask_id]).all() and torch.isfinite(logits[:, :TOK.mask_id]).all()
        full = MDLM(MethodConfig(), TOK).subs_logits(net(x)).flatten(0, 1)[:5]
        torch.testing.assert_close(logits, full)
        torch.log_softmax(logits, -1)[:, 0].sum().backward()
        bias = net.output.bias if backbone == "dit" else net.head.bias
        assert bias.grad[TOK.mask_id] == 0 and torch.isfinite(bias.grad).all()


def test_a_backbone_that_cannot_select_computes_every_position():
    """The RC-equivariant wrapper combines two strands' logits first: it falls back to the full path."""
    dna = NucleotideTokenizer()
    net = _backbone(rc="shared", tokenizer=dna)
    assert not getattr(net, "selects_outputs", False)
    x0 = torch.randint(0, 4, (4, 12), generator=torch.Generator().manual_seed(5))
    a = MDLM(MethodConfig(), dna).loss(net, Batch(x0), torch.Generator().manual_seed(2))
    b = MDLM(MethodConfig(head_at_masked=False), dna).loss(net, Batch(x0), torch.Generator().manual_seed(2))
    torch.testing.assert_close(a.loss, b.loss)


def test_masked_share_closed_forms():
    """E[1 - alpha(t)] for the log-linear schedule, 1 - alpha(t) = (1 - eps) t: (1 - eps)(1 + t_min) / 2 over
    t ~ U[t_min, 1]; (1 - eps)(T + 1) / (2T) on the grid i/T; mask_count takes 1/2 (E[k/n] = 1/2 + 1/(2n))."""
    eps = 1e-3
    antithetic = MDLM(MethodConfig(time_sampling="antithetic", t_min=0.1), TOK)
    assert antithetic.masked_share() == pytest.approx((1 - eps) * 1.1 / 2, rel=1e-6)
    assert MDLM(MethodConfig(), TOK).masked_share() == 1 / 3  # auto: mask_count, q(k) ∝ k^(-1/2)
    assert MDLM(MethodConfig(num_timesteps=8), TOK).masked_share() == pytest.approx((1 - eps) * 9 / 16, rel=1e-9)
    assert MDLM(MethodConfig(time_sampling="mask_count"), TOK).masked_share() == 0.5


def test_flops_per_token_counts_the_head_at_its_share():
    """torch's FLOP counter on a forward + backward with the head at N of B * L positions: the Linear FLOPs are
    6 x (the body's weights x B L + the weights after the last attention x N), and flops_per_token moves by
    those weights' share; the whole last block runs everywhere with last_block_at_outputs off."""
    from torch.utils.flop_counter import FlopCounterMode

    net = _backbone()
    B, L, N = 3, 12, 10
    x = torch.randint(0, TOK.vocab_size - 4, (B, L))
    with FlopCounterMode(display=False) as counter:
        net(x, output_index=torch.arange(N) * 3).square().mean().backward()
    last = net.blocks[-1]
    sparse = [net.output, last.attn.out, last.mlp.fc, last.mlp.proj]
    assert net.output_modules() == sparse
    head = sum(m.weight.numel() for m in sparse)
    body = sum(m.weight.numel() for m in net.modules() if isinstance(m, torch.nn.Linear)) - head
    assert counter.get_total_flops() == 6 * (body * B * L + head * N)
    share = N / (B * L)
    head_params = head + sum(m.bias.numel() for m in sparse)
    assert net.flops_per_token(L) - net.flops_per_token(L, share) == round(6 * (1 - share) * head_params)

    net.last_block_at_outputs = False
    with FlopCounterMode(display=False) as counter:
        net(x, output_index=torch.arange(N) * 3).square().mean().backward()
    output = net.output.weight.numel()
    assert counter.get_total_flops() == 6 * ((head + body - output) * B * L + output * N)
    assert net.output_modules() == [net.output]


def test_head_share_is_a_fact_of_the_method_and_backbone():
    """What FLOP counts (bench, gpu_check) use: MDLM's masked share only where its loss runs the sparse head."""
    from seqdiff.methods import METHODS

    mdlm = MDLM(MethodConfig(), TOK)
    assert mdlm.head_share(_backbone()) == pytest.approx(mdlm.masked_share())
    assert MDLM(MethodConfig(head_at_masked=False), TOK).head_share(_backbone()) == 1.0
    assert MDLM(MethodConfig(subs=False), TOK).head_share(_backbone()) == 1.0
    dna = NucleotideTokenizer()
    assert MDLM(MethodConfig(), dna).head_share(_backbone(rc="shared", tokenizer=dna)) == 1.0
    assert METHODS["ar"](MethodConfig(name="ar"), TOK).head_share(_backbone()) == 1.0
    bd3lm = METHODS["bd3lm"](MethodConfig(name="bd3lm", clip_min=0.3, clip_max=0.8), TOK)
    assert bd3lm.head_share(_backbone()) == pytest.approx(0.55, rel=1e-9)  # mask rates uniform on [0.3, 0.8]
    assert METHODS["bd3lm"](MethodConfig(name="bd3lm", block_size=1), TOK).head_share(_backbone()) == 1.0


@pytest.mark.parametrize("temperature", [1.0, 0.7, 0.0])
def test_denoise_with_the_sparse_head(temperature):
    """Masked positions: the full computation's probabilities; unmasked ones: SUBS's one-hot carry-over."""
    net = _backbone().eval()
    xt = torch.randint(0, TOK.vocab_size - 4, (3, 12), generator=torch.Generator().manual_seed(4))
    xt[torch.rand(xt.shape, generator=torch.Generator().manual_seed(5)) < 0.5] = TOK.mask_id
    t = torch.full((3,), 0.5)
    sparse = MDLM(MethodConfig(), TOK).denoise(net, xt, t, temperature)
    full = MDLM(MethodConfig(head_at_masked=False), TOK).denoise(net, xt, t, temperature)
    masked = xt == TOK.mask_id
    torch.testing.assert_close(sparse[masked], full[masked])
    torch.testing.assert_close(sparse[~masked], torch.nn.functional.one_hot(xt[~masked], TOK.vocab_size).double())
    assert (sparse[..., TOK.mask_id] == 0).all()


@pytest.mark.parametrize("sampler", ["ancestral", "cached"])
def test_samplers_draw_the_same_tokens_with_the_sparse_head(sampler):
    from seqdiff.samplers import build_sampler

    net = _backbone().eval()
    tokens = {}
    for sparse in (True, False):
        method = MDLM(MethodConfig(head_at_masked=sparse), TOK)
        smp = build_sampler(sampler, method, net, steps=16)
        tokens[sparse] = smp.generate(4, 12, torch.Generator().manual_seed(9)).tokens
    assert (tokens[True] != TOK.mask_id).all()
    torch.testing.assert_close(tokens[True], tokens[False])


@pytest.mark.parametrize("block_size,clip", [(4, None), (4, (0.3, 0.8)), (12, None), (1, None)])
def test_bd3lm_head_at_masked_leaves_terms_loss_and_gradients_unchanged(block_size, clip):
    """bd3lm runs the head at the masked positions of its x_t half only: per-token terms, loss and gradients are
    those of the head at every x_t position (block sizes inside, equal to and below the sequence; clipped)."""
    from seqdiff.methods import METHODS

    net = _backbone()
    batch = _batch()
    kw = {} if clip is None else {"clip_min": clip[0], "clip_max": clip[1]}
    out = {}
    for sparse in (True, False):
        method = METHODS["bd3lm"](MethodConfig(name="bd3lm", block_size=block_size, head_at_masked=sparse, **kw), TOK)
        assert method.uses_sparse_head(net) == sparse
        net.zero_grad()
        per_token, scored, total = method.block_loss(net, batch, torch.Generator().manual_seed(5), method.train_times)
        total.backward()
        out[sparse] = per_token.detach(), total.detach(), {n: p.grad.clone() for n, p in net.named_parameters()
                                                            if p.grad is not None}
    torch.testing.assert_close(out[True][0], out[False][0], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(out[True][1], out[False][1], rtol=1e-6, atol=1e-6)
    assert out[True][2].keys() == out[False][2].keys()
    for name in out[False][2]:
        torch.testing.assert_close(out[True][2][name], out[False][2][name], rtol=1e-5, atol=1e-6, msg=name)
