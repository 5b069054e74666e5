"""train.activation_checkpointing (seqdiff.backbones.checkpointing): the blocks' activations recomputed in the
backward pass. The loss and every gradient must be the plain step's (dropout included: the recomputation draws the
same masks), far less must be kept for the backward, nothing may change where no gradient is recorded, and a
training run with it must reach the plain run's weights, under micro-batches, torch.compile and fsdp2 too."""

import copy
import dataclasses

import pytest
import torch
from torch import nn

import seqdiff.backbones.checkpointing as checkpointing
from seqdiff.backbones import build_backbone
from seqdiff.backbones.checkpointing import set_activation_checkpointing
from seqdiff.config import ConfigError, MethodConfig, ModelConfig, load_run_config
from seqdiff.methods import Batch, build_method
from seqdiff.tokenizers import CharTokenizer, NucleotideTokenizer
from seqdiff.training.run import train
from tests.test_ddp import RECIPE
from tests.test_training import StopAt

TOK = CharTokenizer()
SMALL = ModelConfig(hidden_size=32, n_layers=3, n_heads=2, max_seq_len=24, cond_dim=8, dropout=0.1,
                    time_conditioning=True)
VARIANTS = {
    "dit_mdlm": ({}, "mdlm"),
    "dit_mdlm_conv_kmers": ({"local_conv": 3, "local_conv_mlp": True, "kmer_sizes": [2, 3], "kmer_buckets": 64,
                             "kmer_dim": 8}, "mdlm"),
    "dit_ar": ({"time_conditioning": False}, "ar"),
    "bert_mdlm": ({"backbone": "bert", "time_conditioning": False}, "mdlm"),
}


def _model(overrides: dict, method: str, tokenizer=TOK):
    torch.manual_seed(0)
    cfg = dataclasses.replace(SMALL, **overrides)
    complement = getattr(tokenizer, "complement_ids", None)
    net = build_backbone(cfg, tokenizer.vocab_size, causal=method == "ar",
                         complement_ids=complement() if callable(complement) else complement)
    return net, build_method(MethodConfig(name=method), tokenizer)


def _loss_and_grads(net, method, ids, seed=3):
    net.zero_grad(set_to_none=True)
    torch.manual_seed(seed)  # dropout
    out = method.loss(net, Batch(input_ids=ids), torch.Generator().manual_seed(seed))
    out.loss.backward()
    return out.loss.detach(), {n: p.grad.clone() for n, p in net.named_parameters() if p.grad is not None}


def _ids(tokenizer=TOK, rows=4, length=24):
    return torch.randint(0, tokenizer.vocab_size - 4, (rows, length), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_checkpointed_blocks_give_the_plain_loss_and_gradients(name):
    overrides, method_name = VARIANTS[name]
    plain, method = _model(overrides, method_name)
    checked = copy.deepcopy(plain)
    assert set_activation_checkpointing(checked, True) == 1
    ids = _ids()
    for seed in (3, 4):
        loss, grads = _loss_and_grads(plain, method, ids, seed)
        loss_c, grads_c = _loss_and_grads(checked, method, ids, seed)
        torch.testing.assert_close(loss_c, loss, rtol=1e-6, atol=1e-7)
        assert set(grads_c) == set(grads) and len(grads) > 10
        for n, g in grads.items():
            torch.testing.assert_close(grads_c[n], g, rtol=1e-5, atol=1e-7, msg=n)
    # dropout is on: another seed gives another loss, so the agreement above is not of a deterministic function
    assert not torch.equal(_loss_and_grads(plain, method, ids, 3)[0], _loss_and_grads(plain, method, ids, 5)[0])


def _saved_bytes(net, method, ids) -> int:
    """Bytes of the tensors autograd keeps for the backward of one loss (each storage once)."""
    seen: dict[int, int] = {}

    def pack(t):
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = method.loss(net, Batch(input_ids=ids), torch.Generator().manual_seed(0))
    out.loss.backward()
    return sum(seen.values())


def test_checkpointing_keeps_far_less_for_the_backward():
    plain, method = _model({"n_layers": 6, "dropout": 0.0}, "mdlm")
    checked = copy.deepcopy(plain)
    set_activation_checkpointing(checked, True)
    ids = _ids(rows=8)
    kept, kept_checked = _saved_bytes(plain, method, ids), _saved_bytes(checked, method, ids)
    assert kept_checked < 0.4 * kept, (kept_checked, kept)


def test_nothing_is_checkpointed_without_gradients_or_with_a_kv_cache(monkeypatch):
    calls = []
    real = checkpointing.checkpoint
    monkeypatch.setattr(checkpointing, "checkpoint", lambda *a, **k: calls.append(1) or real(*a, **k))
    net, method = _model({"time_conditioning": False, "dropout": 0.0}, "ar")
    set_activation_checkpointing(net, True)
    ids = _ids(rows=2, length=8)
    net(ids).sum().backward()
    assert len(calls) == SMALL.n_layers
    calls.clear()
    with torch.no_grad():
        full = net(ids)
        cache = net.new_kv_cache(2, 8)
        stepped = torch.cat([net(ids[:, i:i + 1], kv_cache=cache) for i in range(8)], 1)
    torch.testing.assert_close(stepped, full, rtol=1e-5, atol=1e-5)
    with torch.enable_grad():  # a cache written under autograd: still run plainly (the recomputation would write twice)
        net(ids[:, :4], kv_cache=net.new_kv_cache(2, 8))
    assert calls == []


def test_the_switch_reaches_a_wrapped_backbone_and_refuses_a_model_without_blocks():
    tok = NucleotideTokenizer()
    wrapped, _ = _model({"rc_equivariant": "shared", "time_conditioning": False}, "mdlm", tok)
    assert type(wrapped).__name__ == "RCEquivariant"
    assert set_activation_checkpointing(wrapped, True) == 1
    assert all(m.activation_checkpointing for m in wrapped.modules() if hasattr(type(m), "activation_checkpointing"))
    assert set_activation_checkpointing(nn.Linear(2, 2), False) == 0
    with pytest.raises(ConfigError, match="activation_checkpointing"):
        set_activation_checkpointing(nn.Linear(2, 2), True)


def test_checkpointed_blocks_trace_into_one_graph_per_block_kind():
    """torch.compile traces through the checkpoint (aot_eager: dynamo and autograd tracing without Inductor's
    compile time): no graph break, and the same loss and gradients as eager."""
    import torch._dynamo as dynamo

    plain, method = _model({"dropout": 0.0}, "mdlm")
    checked = copy.deepcopy(plain)
    set_activation_checkpointing(checked, True)
    dynamo.reset()
    dynamo.utils.counters.clear()
    checked.compile(backend="aot_eager")
    ids = _ids()
    loss, grads = _loss_and_grads(plain, method, ids)
    loss_c, grads_c = _loss_and_grads(checked, method, ids)
    torch.testing.assert_close(loss_c, loss, rtol=1e-5, atol=1e-6)
    for n, g in grads.items():
        torch.testing.assert_close(grads_c[n.replace("_orig_mod.", "")] if n in grads_c else grads_c[n], g,
                                   rtol=1e-4, atol=1e-6, msg=n)
    assert dict(dynamo.utils.counters["graph_break"]) == {}
    dynamo.reset()


MDLM_RECIPE = [r for r in RECIPE if r not in ("method.name=ar", "model.dropout=0.0")] + ["method.name=mdlm",
                                                                                     "model.dropout=0.1"]


def _weights(run_dir):
    return torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=False)["state_dict"]


@pytest.mark.parametrize("extra", [[], ["train.micro_batch_size=2"]], ids=["whole", "micro_batches"])
def test_a_checkpointed_run_reaches_the_plain_runs_weights(tmp_path, extra):
    recipe = MDLM_RECIPE
    plain = train(load_run_config(None, [*recipe, *extra]), tmp_path / "plain")
    checked = train(load_run_config(None, [*recipe, *extra, "train.activation_checkpointing=true"]),
                    tmp_path / "checked")
    assert checked.module.backbone.activation_checkpointing and not plain.module.backbone.activation_checkpointing
    whole, split = _weights(tmp_path / "plain"), _weights(tmp_path / "checked")
    assert set(whole) == set(split)
    for name, value in whole.items():
        torch.testing.assert_close(split[name], value, rtol=1e-5, atol=1e-6, msg=name)
    init = train(load_run_config(None, [*recipe, "train.max_steps=1", "train.lr=0"]), tmp_path / "init").module
    assert any(not torch.allclose(v, whole[n]) for n, v in init.state_dict().items())  # the runs trained


def test_activation_checkpointing_may_change_on_resume(tmp_path):
    recipe = [*MDLM_RECIPE, "train.max_steps=4", "train.checkpoint_every=2", "train.val_every=2"]
    train(load_run_config(None, recipe), tmp_path / "full")
    train(load_run_config(None, recipe), tmp_path / "part", extra_callbacks=[StopAt(2)])
    train(load_run_config(None, [*recipe, "train.activation_checkpointing=true"]), tmp_path / "part", resume=True)
    for name, value in _weights(tmp_path / "full").items():
        torch.testing.assert_close(_weights(tmp_path / "part")[name], value, rtol=1e-5, atol=1e-6, msg=name)


def test_checkpointed_sharded_blocks_give_the_plain_gradients(one_process_group):  # fixture: tests/conftest.py
    """fsdp2: fully_shard's hooks run inside the checkpointed call; the recomputation gathers the weights again."""
    from torch.distributed.device_mesh import init_device_mesh

    from seqdiff.training.fsdp2 import full_tensor, shard_backbone

    plain, method = _model({}, "mdlm")
    sharded = copy.deepcopy(plain)
    shard_backbone(sharded, init_device_mesh("cpu", (1,)))
    set_activation_checkpointing(sharded, True)
    ids = _ids()
    loss, grads = _loss_and_grads(plain, method, ids)
    loss_s, grads_s = _loss_and_grads(sharded, method, ids)
    torch.testing.assert_close(loss_s, loss, rtol=1e-6, atol=1e-7)
    for n, g in grads.items():
        torch.testing.assert_close(full_tensor(grads_s[n]), g, rtol=1e-5, atol=1e-7, msg=n)


def test_checkpointed_sharded_compiled_blocks_give_the_plain_gradients(one_process_group, monkeypatch):
    """The GPU recipe's combination: fsdp2, each block's forward compiled (compile_sharded), checkpointed. The
    compiler is aot_eager (dynamo and autograd tracing without Inductor's compile time)."""
    import functools

    import torch._dynamo as dynamo
    from torch.distributed.device_mesh import init_device_mesh

    from seqdiff.training.fsdp2 import compile_sharded, full_tensor, shard_backbone

    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="aot_eager"))
    plain, method = _model({"dropout": 0.0}, "mdlm")
    sharded = copy.deepcopy(plain)
    shard_backbone(sharded, init_device_mesh("cpu", (1,)))
    dynamo.reset()
    dynamo.utils.counters.clear()
    assert compile_sharded(sharded) == SMALL.n_layers
    set_activation_checkpointing(sharded, True)
    ids = _ids()
    for seed in (3, 4):
        loss, grads = _loss_and_grads(plain, method, ids, seed)
        loss_s, grads_s = _loss_and_grads(sharded, method, ids, seed)
        torch.testing.assert_close(loss_s, loss, rtol=1e-5, atol=1e-6)
        for n, g in grads.items():
            torch.testing.assert_close(full_tensor(grads_s[n]), g, rtol=1e-4, atol=1e-6, msg=n)
    assert dict(dynamo.utils.counters["graph_break"]) == {}
    dynamo.reset()



@pytest.mark.parametrize("method_name", ["sedd", "d3pm", "bd3lm"])
def test_every_other_method_trains_the_same_with_checkpointed_blocks(method_name):
    """SEDD's score, D3PM's transitions and BD3-LM's block-causal mask over [x_t, x_0] go through the same blocks."""
    from seqdiff.methods import build_model

    tok = CharTokenizer()
    torch.manual_seed(0)
    method, plain, _ = build_model(dataclasses.replace(SMALL, time_conditioning=None, max_seq_len=48),
                                   MethodConfig(name=method_name), tok)
    checked = copy.deepcopy(plain)
    assert set_activation_checkpointing(checked, True) == 1
    ids = _ids(length=24)
    loss, grads = _loss_and_grads(plain, method, ids)
    loss_c, grads_c = _loss_and_grads(checked, method, ids)
    torch.testing.assert_close(loss_c, loss, rtol=1e-6, atol=1e-7)
    assert set(grads_c) == set(grads) and grads
    for n, g in grads.items():
        torch.testing.assert_close(grads_c[n], g, rtol=1e-5, atol=1e-7, msg=n)
