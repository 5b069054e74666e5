"""train.compile (Inductor, in place: checkpoints keep their names) and the AdamW implementation."""

import pandas as pd
import pytest
import torch

import seqdiff.training.module as module
from seqdiff.config import MethodConfig, load_run_config
from seqdiff.methods import MDLM
from seqdiff.training.run import train
from tests.test_ddp import RECIPE


def _losses(run_dir):
    return torch.tensor(pd.read_csv(run_dir / "logs" / "metrics.csv")["train/loss"].dropna().values)


def test_compile_falls_back_to_eager_with_one_warning(tmp_path, monkeypatch):
    monkeypatch.setattr(module, "compile_unavailable", lambda device: "CppCompileError: no C++ compiler")
    with pytest.warns(UserWarning, match=r"train.compile=true: torch.compile is unavailable here \(CppCompileError"):
        result = train(load_run_config(None, [*RECIPE, "train.compile=true", "train.max_steps=1"]), tmp_path / "r")
    assert result.module._compiled is False
    assert result.trainer.global_step == 1


def test_compile_unavailable_names_the_first_line_of_the_reason(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("no working C++ compiler found\nlong details")

    monkeypatch.setattr(torch, "compile", broken)
    assert module.compile_unavailable(torch.device("cpu")) == "RuntimeError: no working C++ compiler found"


def test_adamw_takes_the_fused_kernel_where_torch_has_one():
    assert module.adamw_implementation([torch.nn.Parameter(torch.ones(3))]) == {"fused": True}
    assert module.adamw_implementation([torch.nn.Parameter(torch.ones(3, device="meta"))]) == {"foreach": True}
    assert module.adamw_implementation([]) == {"foreach": True}


@pytest.mark.slow  # 60 s with a cold Inductor cache; the default suite compiles in the test below
def test_compiled_training_matches_eager(tmp_path):
    """Inductor on CPU: the compiled backbone trains like the eager one, under the same parameter names."""
    reason = module.compile_unavailable(torch.device("cpu"))
    if reason is not None:
        pytest.skip(f"torch.compile is unavailable on this machine: {reason}")
    eager = train(load_run_config(None, RECIPE), tmp_path / "eager")
    compiled = train(load_run_config(None, [*RECIPE, "train.compile=true"]), tmp_path / "compiled")
    assert compiled.module._compiled and compiled.module.backbone._compiled_call_impl is not None
    assert not eager.module._compiled
    torch.testing.assert_close(_losses(tmp_path / "compiled"), _losses(tmp_path / "eager"), rtol=1e-4, atol=1e-5)
    a = torch.load(tmp_path / "eager" / "checkpoints" / "last.ckpt", weights_only=False)["state_dict"]
    b = torch.load(tmp_path / "compiled" / "checkpoints" / "last.ckpt", weights_only=False)["state_dict"]
    assert set(a) == set(b)
    for name in a:
        torch.testing.assert_close(b[name], a[name], rtol=1e-4, atol=1e-5, msg=name)


def test_compiled_mdlm_sparse_head_is_one_graph_with_the_eager_gradients():
    """MDLM's output head runs at a different number of masked positions every step (method.head_at_masked): the
    index is marked dynamic, so a compiled backbone compiles one graph for every count, and its loss and
    gradients are the eager ones."""
    reason = module.compile_unavailable(torch.device("cpu"))
    if reason is not None:
        pytest.skip(f"torch.compile is unavailable on this machine: {reason}")
    import copy

    import torch._dynamo as dynamo

    from tests.test_head_at_masked import TOK, _backbone, _batch, _loss_and_grads

    eager = _backbone(layers=1)  # one block: half the compile time
    compiled = copy.deepcopy(eager)
    compiled.compile()
    dynamo.reset()
    dynamo.utils.counters.clear()
    method = MDLM(MethodConfig(time_sampling="antithetic"), TOK)  # masked counts that vary over the batch
    batch = _batch()
    counts = set()
    for seed in (11, 12, 13):
        xt = method.draw_noise(batch.input_ids, batch.scored(TOK.pad_id), torch.Generator().manual_seed(seed))[1]
        counts.add(int((xt == TOK.mask_id).sum()))  # the head's rows this step
        out_c, grads_c = _loss_and_grads(compiled, method, batch, seed=seed)
        out_e, grads_e = _loss_and_grads(eager, method, batch, seed=seed)
        torch.testing.assert_close(out_c.loss, out_e.loss, rtol=1e-5, atol=1e-6)
        for name in grads_e:
            torch.testing.assert_close(grads_c[name], grads_e[name], rtol=1e-4, atol=1e-6, msg=name)
    assert len(counts) >= 2  # several shapes...
    assert dynamo.utils.counters["stats"]["unique_graphs"] == 1  # ...one graph


def test_bench_compile_needs_an_untimed_warm_up_step(capsys):
    from seqdiff.bench import main as bench_main

    with pytest.raises(SystemExit) as e:
        bench_main(["--compile", "--warmup", "0"])
    assert e.value.code == 2 and "--compile needs --warmup >= 1" in capsys.readouterr().err
