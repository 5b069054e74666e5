"""train.compile under train.strategy=fsdp2: each transformer block's forward is compiled on its own
(seqdiff.training.fsdp2.compile_sharded), so the sharding hooks stay outside the graph. Checked on CPU with a
one-process gloo group: no graph break, one graph for every block, and the eager loss and gradients."""

import copy

import pytest
import torch

import seqdiff.training.module as module
from seqdiff.backbones import BLOCKS
from seqdiff.checkpoint import load_checkpoint
from seqdiff.config import MethodConfig, ModelConfig, load_run_config
from seqdiff.methods import build_model
from seqdiff.methods.base import Batch
from seqdiff.tokenizers.char import CharTokenizer
from seqdiff.training.fsdp2 import compile_sharded, full_tensor, shard_backbone
from seqdiff.training.run import train
from tests.test_ddp import RECIPE


def _needs_inductor():
    reason = module.compile_unavailable(torch.device("cpu"))
    if reason is not None:
        pytest.skip(f"torch.compile is unavailable on this machine: {reason}")


def _loss_and_grads(method, backbone, ids, seed):
    backbone.zero_grad(set_to_none=True)
    out = method.loss(backbone, Batch(input_ids=ids), torch.Generator().manual_seed(seed))
    out.loss.backward()
    return out.loss.detach(), {n: full_tensor(p.grad) for n, p in backbone.named_parameters()}


def test_sharded_blocks_compile_to_one_graph_with_the_eager_loss_and_gradients(one_process_group):
    _needs_inductor()
    import torch._dynamo as dynamo
    from torch.distributed.device_mesh import init_device_mesh

    tok = CharTokenizer()
    method, eager, _ = build_model(ModelConfig(preset="test", n_layers=2, max_seq_len=16, dropout=0.0),
                                   MethodConfig(name="mdlm"), tok)
    sharded = copy.deepcopy(eager)
    shard_backbone(sharded, init_device_mesh("cpu", (1,)))
    dynamo.reset()
    dynamo.utils.counters.clear()
    assert compile_sharded(sharded) == 2
    assert compile_sharded(sharded) == 0  # idempotent: a block is compiled once
    ids = torch.randint(4, tok.vocab_size, (4, 16), generator=torch.Generator().manual_seed(0))
    for seed in (1, 2):
        loss_c, grads_c = _loss_and_grads(method, sharded, ids, seed)
        loss_e, grads_e = _loss_and_grads(method, eager, ids, seed)
        torch.testing.assert_close(loss_c, loss_e, rtol=1e-5, atol=1e-6)
        assert set(grads_c) == set(grads_e)  # the parameter names are the unsharded module's
        for name, g in grads_e.items():
            torch.testing.assert_close(grads_c[name], g, rtol=1e-4, atol=1e-6, msg=name)
    counters = dynamo.utils.counters
    assert dict(counters["graph_break"]) == {}
    # the first block runs one graph; the last runs its MLP at the masked positions (DiT.last_block_at_outputs), a
    # second graph, compiled once for every count of them (both seeds: the index is marked dynamic)
    assert counters["stats"]["unique_graphs"] == 2
    assert counters["stats"]["calls_captured"] > 0


def test_fsdp2_training_compiles_each_block_not_the_whole_backbone(tmp_path, monkeypatch):
    """The wiring, without Inductor's minutes: torch.compile records what it is given and returns it as it is."""
    compiled = []

    def record(fn, *args, **kwargs):
        compiled.append(fn)
        return fn

    monkeypatch.setattr(module, "compile_unavailable", lambda device: None)
    monkeypatch.setattr(torch, "compile", record)
    recipe = [*RECIPE, "method.name=mdlm", "train.max_steps=2", "train.val_every=2", "train.checkpoint_every=2",
              "train.strategy=fsdp2", "train.devices=1", "train.compile=true"]
    result = train(load_run_config(None, recipe), tmp_path / "run")
    backbone = result.module.backbone
    assert result.module._compiled
    assert backbone._compiled_call_impl is None  # the root is not compiled as a whole...
    blocks = [m for m in backbone.modules() if isinstance(m, BLOCKS)]
    assert blocks and all("forward" in vars(b) for b in blocks)  # ...each block's forward is
    assert len(compiled) == len(blocks)
    state = torch.load(tmp_path / "run" / "checkpoints" / "last.ckpt", weights_only=False)["state_dict"]
    assert not any("_orig_mod" in name for name in state)  # checkpoints keep the eager names
    assert load_checkpoint(tmp_path / "run" / "checkpoints" / "last.ckpt").step == 2

    plain = train(load_run_config(None, [*recipe[:-3], "train.compile=true"]), tmp_path / "plain")
    assert plain.module.backbone._compiled_call_impl is not None  # one process, no sharding: the whole backbone
