"""method.fused_loss: the output head and its cross-entropy in one chunked pass (linear_cross_entropy).

The reference is the plain computation, F.cross_entropy(F.linear(h, W, b)), weighted and summed: values and
gradients must agree (float64 to 1e-12, the methods' float32 losses to float rounding) for every chunk size,
with an excluded (-inf) id, with no rows, without a gradient, and under CPU bf16 autocast to bf16's rounding.
"""

import dataclasses
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from seqdiff.backbones import build_backbone
from seqdiff.backbones.linear_cross_entropy import default_chunk, linear_cross_entropy
from seqdiff.config import ConfigError, MethodConfig
from seqdiff.methods import AR, MDLM, Batch, build_model
from seqdiff.methods.base import FUSED_LOSS_MIN_VOCAB
from seqdiff.tokenizers import NucleotideTokenizer
from tests.test_head_at_masked import TINY, TOK, _batch


def _inputs(n=13, h=5, v=11, dtype=torch.float64, exclude=None, seed=0):
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, h, generator=gen, dtype=dtype, requires_grad=True)
    weight = torch.randn(v, h, generator=gen, dtype=dtype, requires_grad=True)
    bias = torch.randn(v, generator=gen, dtype=dtype, requires_grad=True)
    targets = torch.randint(0, v, (n,), generator=gen)
    if exclude is not None:
        targets[targets == exclude] = (exclude + 1) % v
    token_weight = torch.rand(n, generator=gen, dtype=dtype) * 3
    return hidden, weight, bias, targets, token_weight


def _bias(bias, exclude):
    return bias if exclude is None else bias.index_fill(0, torch.tensor([exclude]), float("-inf"))


def _plain(hidden, weight, bias, targets, token_weight, exclude=None):
    nll = F.cross_entropy(F.linear(hidden, weight, _bias(bias, exclude)), targets, reduction="none")
    return (token_weight * nll).sum(), nll


def _grads(fn, tensors):
    for t in tensors:
        t.grad = None
    total, nll = fn()
    total.backward()
    return total.detach(), nll.detach(), [t.grad.clone() for t in tensors]


@pytest.mark.parametrize("chunk", [1, 4, 13, 100])
@pytest.mark.parametrize("exclude", [None, 3])
def test_values_and_gradients_equal_the_plain_head_and_cross_entropy(chunk, exclude):
    hidden, weight, bias, targets, token_weight = _inputs(exclude=exclude)
    leaves = [hidden, weight, bias]
    ref = _grads(lambda: _plain(hidden, weight, bias, targets, token_weight, exclude), leaves)
    got = _grads(lambda: linear_cross_entropy(hidden, weight, _bias(bias, exclude), targets, token_weight, chunk),
                 leaves)
    torch.testing.assert_close(got[0], ref[0], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(got[1], ref[1], rtol=1e-12, atol=1e-12)
    for g, r in zip(got[2], ref[2]):
        torch.testing.assert_close(g, r, rtol=1e-12, atol=1e-12)
    if exclude is not None:
        assert bias.grad[exclude] == 0  # the -inf column takes no gradient, as in the plain path


def test_the_incoming_gradient_scales_every_gradient():
    """Backward multiplies the gradients formed in the forward by d(loss)/d(total): here 2.5 / 7."""
    hidden, weight, bias, targets, token_weight = _inputs()
    leaves = [hidden, weight, bias]
    ref = _grads(lambda: tuple(x * 2.5 / 7 if i == 0 else x for i, x in
                               enumerate(_plain(hidden, weight, bias, targets, token_weight))), leaves)
    got = _grads(lambda: tuple(x * 2.5 / 7 if i == 0 else x for i, x in
                               enumerate(linear_cross_entropy(hidden, weight, bias, targets, token_weight, 5))),
                 leaves)
    for g, r in zip(got[2], ref[2]):
        torch.testing.assert_close(g, r, rtol=1e-12, atol=1e-12)


def test_no_rows_and_no_gradient():
    hidden, weight, bias, targets, token_weight = _inputs(n=0)
    total, nll = linear_cross_entropy(hidden, weight, bias, targets, token_weight)
    total.backward()
    assert total == 0 and nll.shape == (0,) and (weight.grad == 0).all() and hidden.grad.shape == (0, 5)
    hidden, weight, bias, targets, token_weight = _inputs()
    with torch.no_grad():
        total, nll = linear_cross_entropy(hidden, weight, bias, targets, token_weight, 4)
    torch.testing.assert_close(nll, _plain(hidden, weight, bias, targets, token_weight)[1].detach())
    assert not total.requires_grad


def test_bf16_autocast_matches_the_plain_path_to_bf16_rounding():
    """Under CPU autocast both paths run the matmuls in bf16 and the softmax in float32."""
    hidden, weight, bias, targets, token_weight = _inputs(n=40, h=32, v=300, dtype=torch.float32)
    leaves = [hidden, weight, bias]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref = _grads(lambda: (lambda t, n: (t, n))(*[x.float() for x in _plain_autocast(hidden, weight, bias,
                                                                                         targets, token_weight)]),
                     leaves)
        got = _grads(lambda: linear_cross_entropy(hidden, weight, bias, targets, token_weight, 7), leaves)
    assert got[1].dtype == torch.float32
    torch.testing.assert_close(got[0], ref[0], rtol=2e-2, atol=1e-1)
    torch.testing.assert_close(got[1], ref[1], rtol=2e-2, atol=5e-2)
    for g, r in zip(got[2], ref[2]):
        assert g.dtype == torch.float32
        torch.testing.assert_close(g, r, rtol=5e-2, atol=5e-2)


def test_bf16_parameters_without_autocast_get_bf16_gradients_close_to_the_plain_path():
    """A model cast to bf16 (no autocast): gradients come back in the parameters' dtype, accumulated in float32."""
    hidden, weight, bias, targets, token_weight = (t.detach().to(torch.bfloat16).requires_grad_(t.requires_grad)
                                                   if t.is_floating_point() else t
                                                   for t in _inputs(n=40, h=32, v=300, dtype=torch.float32))
    token_weight = token_weight.detach()
    leaves = [hidden, weight, bias]
    ref = _grads(lambda: _plain_autocast(hidden, weight, bias, targets, token_weight), leaves)
    got = _grads(lambda: linear_cross_entropy(hidden, weight, bias, targets, token_weight, 7), leaves)
    torch.testing.assert_close(got[0].float(), ref[0].float(), rtol=2e-2, atol=1e-1)
    for g, r in zip(got[2], ref[2]):
        assert g.dtype == torch.bfloat16
        torch.testing.assert_close(g.float(), r.float(), rtol=5e-2, atol=5e-2)


def _plain_autocast(hidden, weight, bias, targets, token_weight):
    nll = F.cross_entropy(F.linear(hidden, weight, bias).float(), targets, reduction="none")
    return (token_weight * nll).sum(), nll


def test_bad_shapes_are_refused():
    hidden, weight, bias, targets, token_weight = _inputs()
    with pytest.raises(ValueError, match="targets"):
        linear_cross_entropy(hidden, weight, bias, targets[:-1], token_weight)


def test_default_chunk_follows_the_vocabulary_and_device():
    assert default_chunk(50261, torch.device("cpu")) == (1 << 23) // 50261
    assert default_chunk(10 ** 9, torch.device("cpu")) == 1
    assert default_chunk(50261, torch.device("cuda")) == (1 << 27) // 50261


# ------------------------------------------------------------------ in the methods

def _net(causal, conditioned=False, backbone="dit"):
    torch.manual_seed(0)
    cfg = dataclasses.replace(TINY, time_conditioning=conditioned, backbone=backbone)
    return build_backbone(cfg, TOK.vocab_size, causal=causal)


def _run(net, method, batch, **kw):
    net.zero_grad()
    out = method.loss(net, batch, torch.Generator().manual_seed(11), **kw)
    out.loss.backward()
    return out, {n: p.grad.clone() for n, p in net.named_parameters() if p.grad is not None}


CASES = {
    "mdlm": ("mdlm", {}, {}),
    "mdlm_mask_count": ("mdlm", {"time_sampling": "mask_count"}, {}),
    "mdlm_pairs": ("mdlm", {"complementary_masks": True}, {}),
    "mdlm_time_conditioned": ("mdlm", {}, {"conditioned": True}),
    "mdlm_packed": ("mdlm", {}, {"packed": True}),
    "mdlm_bert": ("mdlm", {}, {"backbone": "bert"}),  # the decoder is the word embedding (tied)
    "mdlm_bert_packed": ("mdlm", {}, {"backbone": "bert", "packed": True}),
    "mdlm_micro_batch": ("mdlm", {}, {"rows": slice(2, 5)}),
    "d3pm_subs": ("d3pm", {"subs": True}, {}),  # MDLM's loss with the discrete-time weights
    "bd3lm": ("bd3lm", {"block_size": 4}, {}),  # the head on the x_t half of the 2L pass
    "bd3lm_one_block": ("bd3lm", {"block_size": 12}, {}),
    "bd3lm_block_1": ("bd3lm", {"block_size": 1}, {}),
    "ar": ("ar", {}, {}),
    "ar_packed": ("ar", {}, {"packed": True}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_fused_loss_leaves_loss_and_gradients_unchanged(case):
    name, method_kw, opts = CASES[case]
    from seqdiff.methods import METHODS

    cls = METHODS[name]
    net = _net(causal=name == "ar", conditioned=opts.get("conditioned", False), backbone=opts.get("backbone", "dit"))
    batch = _batch(opts.get("packed", False))
    kw = {"rows": opts["rows"]} if "rows" in opts else {}
    fused = cls(MethodConfig(name=name, fused_loss=True, **method_kw), TOK)
    plain = cls(MethodConfig(name=name, fused_loss=False, **method_kw), TOK)
    assert fused.uses_fused_loss(net) and not plain.uses_fused_loss(net)
    out_f, grads_f = _run(net, fused, batch, **kw)
    out_p, grads_p = _run(net, plain, batch, **kw)
    assert out_f.loss.shape == () and out_f.loss.dtype == out_p.loss.dtype
    torch.testing.assert_close(out_f.loss, out_p.loss, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(out_f.nll_sum, out_p.nll_sum, rtol=1e-6, atol=1e-6)
    assert out_f.num_tokens == out_p.num_tokens
    assert grads_f.keys() == grads_p.keys() and grads_f
    for n in grads_p:
        torch.testing.assert_close(grads_f[n], grads_p[n], rtol=1e-5, atol=1e-7, msg=n)


def test_the_fused_path_never_builds_the_logits():
    """The largest tensor the fused MDLM and AR losses allocate is a chunk of logits, not all of them: a head
    at a 4,096-id vocabulary with chunks of a few rows, watched by a dispatch mode that records every
    output's size."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Largest(TorchDispatchMode):
        biggest = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (tuple, list)) else [out]:
                if isinstance(t, torch.Tensor):
                    Largest.biggest = max(Largest.biggest, t.numel())
            return out

    vocab = FUSED_LOSS_MIN_VOCAB
    torch.manual_seed(0)
    net = build_backbone(TINY, vocab, causal=True)
    x = torch.randint(0, vocab - 4, (4, 12))
    method = AR(MethodConfig(name="ar"), TOK)
    method.vocab_size = vocab
    assert method.uses_fused_loss(net)  # null, at this vocabulary
    import seqdiff.backbones.linear_cross_entropy as lce

    old = lce.CHUNK_ELEMENTS["cpu"]
    lce.CHUNK_ELEMENTS["cpu"] = 3 * vocab  # three rows of logits a chunk
    try:
        with Largest():
            method.loss(net, Batch(x)).loss.backward()
    finally:
        lce.CHUNK_ELEMENTS["cpu"] = old
    assert Largest.biggest == max(3 * vocab, net.output.weight.numel())  # the chunk, or the head's own gradient
    assert Largest.biggest < 48 * vocab  # never the (4 x 12, V) logits


def test_auto_fuses_from_the_threshold_vocabulary_on():
    small = _net(causal=False)
    assert not MDLM(MethodConfig(), TOK).uses_fused_loss(small)  # null at a character vocabulary
    assert MDLM(MethodConfig(fused_loss=True), TOK).uses_fused_loss(small)
    big = build_backbone(TINY, FUSED_LOSS_MIN_VOCAB, causal=False)
    assert MDLM(MethodConfig(), TOK).uses_fused_loss(big)
    assert not MDLM(MethodConfig(fused_loss=False), TOK).uses_fused_loss(big)
    bert = build_backbone(dataclasses.replace(TINY, backbone="bert"), FUSED_LOSS_MIN_VOCAB, causal=False)
    assert MDLM(MethodConfig(), TOK).uses_fused_loss(bert)  # bert-base-uncased's 30,522 ids: fused


@pytest.mark.parametrize("kw,match", [
    ({"name": "sedd", "fused_loss": True}, "weighted cross-entropy of the head"),
    ({"name": "d3pm", "fused_loss": True}, "head_at_masked"),  # d3pm's default is no SUBS
    ({"subs": False, "fused_loss": True}, "head_at_masked"),
    ({"head_at_masked": False, "fused_loss": True}, "head_at_masked"),
])
def test_bad_fused_loss_settings_are_refused(kw, match):
    from seqdiff.methods import build_method

    with pytest.raises(ConfigError, match=match):
        build_method(MethodConfig(**kw), TOK)


def test_a_bad_fused_loss_value_is_refused():
    with pytest.raises(ConfigError, match="true, false or null"):
        MethodConfig(fused_loss="yes")


def test_fused_loss_on_with_a_backbone_without_it_is_refused():
    tok = NucleotideTokenizer()
    model = dataclasses.replace(TINY, rc_equivariant="shared")
    with pytest.raises(ConfigError, match="method.fused_loss=true needs a backbone"):
        build_model(model, MethodConfig(fused_loss=True), tok)


def test_a_compiled_backbone_gives_the_eager_fused_loss_and_gradients():
    """The chunked head is left out of the compiled graph (a graph break at the head); the rest compiles and
    the loss and gradients are the eager ones."""
    import copy

    from seqdiff.training import module

    reason = module.compile_unavailable(torch.device("cpu"))
    if reason is not None:
        pytest.skip(f"torch.compile is unavailable on this machine: {reason}")
    torch.manual_seed(0)
    eager = build_backbone(dataclasses.replace(TINY, n_layers=1), TOK.vocab_size, causal=False)
    compiled = copy.deepcopy(eager)
    compiled.compile()
    method = MDLM(MethodConfig(fused_loss=True), TOK)
    batch = _batch()
    for _ in range(2):
        out_c, grads_c = _run(compiled, method, batch)
        out_e, grads_e = _run(eager, method, batch)
        torch.testing.assert_close(out_c.loss, out_e.loss, rtol=1e-5, atol=1e-6)
        for n in grads_e:
            torch.testing.assert_close(grads_c[n], grads_e[n], rtol=1e-4, atol=1e-6, msg=n)


def test_a_recipe_value_that_is_neither_bool_nor_null_names_both():
    from seqdiff.config import from_dict

    with pytest.raises(ConfigError, match=r"method.fused_loss must be true or false, got 'maybe' \(or null\)"):
        from_dict(MethodConfig, {"fused_loss": "maybe"}, prefix="method.")


def test_the_head_is_left_out_of_compile_even_when_its_first_call_is_under_compile():
    """`_left_out_of_compile` makes torch.compiler.disable's function lazily (its import of torch._dynamo costs
    seconds): a first call while torch.compile traces must still run the function eagerly, with the eager result."""
    from seqdiff.backbones.linear_cross_entropy import _left_out_of_compile
    from seqdiff.training import module

    reason = module.compile_unavailable(torch.device("cpu"))
    if reason is not None:
        pytest.skip(f"torch.compile is unavailable on this machine: {reason}")
    compiling = []

    @_left_out_of_compile
    def head(x):
        compiling.append(torch.compiler.is_compiling())
        return x * (int(x.sum().item() > 0) + 2)  # data-dependent Python: what tracing would specialize on

    def body(x):
        return head(torch.sin(x) + 1).cos()

    x = torch.randn(8, generator=torch.Generator().manual_seed(0))
    compiled = torch.compile(body, backend="eager")
    for _ in range(2):
        torch.testing.assert_close(compiled(x), body(x))
    assert compiling and not any(compiling)  # every call ran outside the traced graph


def test_sampling_and_scoring_an_mdlm_do_not_import_torch_dynamo():
    """A process that builds an MDLM with its sparse head and the fused loss, takes a loss and a denoising step
    never imports torch._dynamo (about 2 s of `seqdiff sample` / `eval` before), since nothing compiles there."""
    import subprocess
    import sys

    script = (
        "import sys, torch\n"
        "from tests.test_head_at_masked import TINY, TOK, _batch\n"
        "from seqdiff.backbones import build_backbone\n"
        "from seqdiff.config import MethodConfig\n"
        "from seqdiff.methods import MDLM\n"
        "net = build_backbone(TINY, TOK.vocab_size, causal=False)\n"
        "method = MDLM(MethodConfig(fused_loss=True), TOK)\n"
        "batch = _batch()\n"
        "method.loss(net, batch, torch.Generator().manual_seed(0)).loss.backward()\n"
        "xt = batch.input_ids.clone()\n"
        "xt[:, ::2] = TOK.mask_id\n"
        "with torch.no_grad():\n"
        "    index, logits = method.denoise_masked(net, xt, torch.full((xt.shape[0],), 0.5))\n"
        "assert index.numel() == (xt == TOK.mask_id).sum() and logits.shape[0] == index.numel()\n"
        "print('torch._dynamo' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                         cwd=Path(__file__).resolve().parent.parent)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "False"
