"""seqdiff.optim, the one AdamW + warm-up builder, and its three callers (training, probe fine-tuning, NCE).

- The lr of every group at every step, read off the optimizer the builder returns, against the closed form of
  each schedule written out here.
- Each caller against a hand-written "before": torch's AdamW + LambdaLR set up as the caller did before the
  builder existed, driven by the same gradients. With the fused kernel the weights agree bit for bit (so
  groups, lr, betas, weight decay and schedule are the same); with torch's default implementation (what
  fine-tuning and NCE used) within float rounding.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn

from seqdiff.config import MethodConfig, ModelConfig, load_run_config, to_dict
from seqdiff.optim import adamw_with_warmup, decay_groups, lr_multiplier
from seqdiff.tokenizers import NucleotideTokenizer


def _lrs(optimizer, scheduler, steps: int) -> list[list[float]]:
    """The lr of every group at optimizer steps 0 .. steps - 1 (what each step used)."""
    out = []
    for _ in range(steps):
        out.append([g["lr"] for g in optimizer.param_groups])
        optimizer.step()  # no gradients: nothing moves, but the order of calls is the real one
        scheduler.step()
    return out


def _cosine(s: int, w: int, t: int) -> float:
    return 1.0 if s < w else 0.5 * (1 + math.cos(math.pi * min(1.0, (s - w) / max(1, t - w))))


CLOSED_FORMS = {  # (warmup_steps, schedule, max_steps, start) -> multiplier at step s
    (5, "constant", 0, 0): lambda s: min(1.0, (s + 1) / 5),
    (0, "constant", 0, 0): lambda s: 1.0,
    (-3, "constant", 0, 0): lambda s: 1.0,  # NCE / fine-tuning took max(1, warmup): no warm-up
    (4, "cosine", 20, 0): lambda s: (s + 1) / 4 if s < 4 else _cosine(s, 4, 20),
    (0, "cosine", 20, 0): lambda s: _cosine(s, 0, 20),
    (4, "cosine", 20, 7): lambda s: 0.0 if s < 7 else min(1.0, (s - 6) / 4) * _cosine(s, 4, 20),
    (4, "constant", 0, 7): lambda s: 0.0 if s < 7 else min(1.0, (s - 6) / 4),
}


@pytest.mark.parametrize("key", list(CLOSED_FORMS))
def test_lr_at_every_step_is_the_closed_form(key):
    warmup, schedule, max_steps, start = key
    a, b = nn.Parameter(torch.ones(3, 2)), nn.Parameter(torch.ones(2))
    groups = [{"params": [a], "lr": 0.5}, {"params": [b]}]  # a group's own lr wins over lr=
    opt, sched = adamw_with_warmup(groups, [lr_multiplier(warmup, schedule, max_steps, start)] * 2, lr=2e-3)
    for s, (lr_a, lr_b) in enumerate(_lrs(opt, sched, 26)):
        assert lr_a == pytest.approx(0.5 * CLOSED_FORMS[key](s), rel=1e-12, abs=1e-15), s
        assert lr_b == pytest.approx(2e-3 * CLOSED_FORMS[key](s), rel=1e-12, abs=1e-15), s


def test_one_multiplier_serves_every_group_and_empty_groups_are_dropped():
    a, b = nn.Parameter(torch.ones(3, 2)), nn.Parameter(torch.ones(2))
    opt, sched = adamw_with_warmup([{"params": [a]}, {"params": []}, {"params": [b], "lr": 1.0}],
                                   lr_multiplier(2), lr=0.1, weight_decay=0.3)
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([0.05, 0.5])
    assert [g["weight_decay"] for g in opt.param_groups] == [0.3, 0.3]
    assert all(g["fused"] for g in opt.param_groups)  # CPU float parameters: the fused kernel
    with pytest.raises(ValueError, match="2 lr multipliers for 3 parameter groups"):
        adamw_with_warmup([{"params": [a]}, {"params": []}, {"params": [b]}], [lr_multiplier(2)] * 2, lr=0.1)
    with pytest.raises(ValueError, match="'linear' is unknown"):
        lr_multiplier(2, "linear")


def test_decay_groups_decay_matrices_only():
    w, bias = nn.Parameter(torch.ones(3, 2)), nn.Parameter(torch.ones(2))
    groups = decay_groups([w, bias], 0.1, name="head")
    assert [(g["params"], g["weight_decay"], g["name"]) for g in groups] == [([w], 0.1, "head"), ([bias], 0.0, "head")]
    assert decay_groups([bias], 0.1) == [{"params": [bias], "weight_decay": 0.0}]


# ------------------------------------------------------------------------------------------------ the callers
def _drive(params: list[nn.Parameter], optimizer, scheduler, steps: int, seed: int = 0) -> None:
    """`steps` AdamW steps on a fixed quadratic loss with gradients that differ per step and per parameter."""
    g = torch.Generator().manual_seed(seed)
    targets = [torch.randn(p.shape, generator=g) for p in params]
    for step in range(steps):
        loss = sum(((p - t) ** 2 * (1 + step % 3)).sum() + p.sum() * (-1) ** step for p, t in zip(params, targets))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()


def _same_weights(a: list[torch.Tensor], b: list[torch.Tensor], exact: bool, lr: float = 0.0) -> bool:
    """Bit for bit, or within a hundredth of one AdamW step (about lr per weight, whatever the gradient's
    scale): where sqrt(v) is near eps, as for NCE's weights behind its zero-initialized head, the kernels'
    different rounding is amplified (about 8e-6 at lr 3e-3 after five steps; 1e-7 elsewhere)."""
    if exact:
        return all(torch.equal(x, y) for x, y in zip(a, b))
    return all(torch.allclose(x, y, rtol=0, atol=1e-2 * lr) for x, y in zip(a, b))


def _training_module(**train):
    from seqdiff.training.module import SeqDiffModule

    overrides = ["model.preset=test", "model.max_seq_len=16", "train.weight_decay=0.1", "train.lr=1e-2",
                 "train.betas=[0.8,0.95]", "train.max_steps=6", "train.warmup_steps=2", "train.lr_schedule=cosine"]
    cfg = load_run_config(None, overrides + [f"train.{k}={v}" for k, v in train.items()])
    torch.manual_seed(0)
    return SeqDiffModule(model=to_dict(cfg.model), method=to_dict(cfg.method), train=to_dict(cfg.train),
                         tokenizer=NucleotideTokenizer().to_dict(), seq_len=16)


def _old_training_optimizer(module, **impl):
    """training/module.py's configure_optimizers as it was written before seqdiff.optim, with its closed forms."""
    cfg = module.train_config

    def split(params, **extra):
        return [g for g in ({"params": [p for p in params if p.ndim >= 2], "weight_decay": cfg.weight_decay, **extra},
                            {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0, **extra}) if g["params"]]

    def head(s):
        return (s + 1) / cfg.warmup_steps if s < cfg.warmup_steps else _cosine(s, cfg.warmup_steps, cfg.max_steps)

    def body(s):
        start = cfg.freeze_backbone_steps
        return 0.0 if s < start else min(1.0, (s - start + 1) / cfg.warmup_steps) * _cosine(s, cfg.warmup_steps,
                                                                                          cfg.max_steps)

    if cfg.freeze_backbone_steps == 0 and cfg.backbone_lr_scale == 1.0:
        groups = split([p for p in module.backbone.parameters() if p.requires_grad])
        lambdas = [head] * len(groups)
    else:
        h, b = module.head_and_body()
        hg, bg = split(h, name="head", lr=cfg.lr), split(b, name="body", lr=cfg.lr * cfg.backbone_lr_scale)
        groups, lambdas = hg + bg, [head] * len(hg) + [body] * len(bg)
    opt = torch.optim.AdamW(groups, lr=cfg.lr, betas=tuple(cfg.betas), **impl)
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, lambdas)


@pytest.mark.parametrize("train", [{}, {"freeze_backbone_steps": 2, "backbone_lr_scale": 0.5}])
def test_training_gets_the_weights_of_the_hand_written_optimizer(train):
    weights = {}
    for name in ("builder", "fused", "loop"):
        module = _training_module(**train)
        if name == "builder":
            out = module.configure_optimizers()
            opt, sched = out["optimizer"], out["lr_scheduler"]["scheduler"]
            assert out["lr_scheduler"]["interval"] == "step"
        else:
            opt, sched = _old_training_optimizer(module, **({"fused": True} if name == "fused" else {}))
        params = list(module.backbone.parameters())
        _drive(params, opt, sched, 6)
        weights[name] = [p.detach().clone() for p in params]
        if name != "loop":  # the checkpoint layout: the same groups and settings (a resumed run loads them)
            weights[name + "_groups"] = [{k: v for k, v in g.items() if k != "params"}
                                         for g in opt.state_dict()["param_groups"]]
    assert weights["builder_groups"] == weights["fused_groups"]
    assert _same_weights(weights["builder"], weights["fused"], exact=True)
    assert _same_weights(weights["builder"], weights["loop"], exact=False, lr=1e-2)
    start = [p.detach() for p in _training_module(**train).backbone.parameters()]
    assert not _same_weights(weights["builder"], start, exact=False, lr=1e-2)  # the weights did move


class _Encoder(nn.Module):
    """(ids, mask) -> (B, 8): a token embedding, mean-pooled, through a Linear."""

    out_features = 8

    def __init__(self) -> None:
        super().__init__()
        self.embed, self.proj = nn.Embedding(5, 8), nn.Linear(8, 8)

    def forward(self, ids, mask):
        return self.proj(self.embed(ids).mean(1))


def test_finetuning_gets_the_weights_of_its_hand_written_optimizer():
    from seqdiff.probes.finetune import SequenceClassifier

    weights = {}
    for name in ("builder", "fused", "loop"):
        torch.manual_seed(0)
        module = SequenceClassifier(_Encoder(), 3, lr=1e-2, weight_decay=0.05, warmup_steps=3, encoder_lr_scale=0.1)
        if name == "builder":
            out = module.configure_optimizers()
            opt, sched = out["optimizer"], out["lr_scheduler"]["scheduler"]
        else:  # probes/finetune.py before seqdiff.optim (fused=True: the builder's kernel)
            groups = [{"params": list(module.head.parameters()), "lr": 1e-2},
                      {"params": list(module.encoder.parameters()), "lr": 1e-2 * 0.1}]
            opt = torch.optim.AdamW([g for g in groups if g["params"]], weight_decay=0.05,
                                    **({"fused": True} if name == "fused" else {}))
            sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: min(1.0, (step + 1) / 3))
        params = list(module.parameters())
        _drive(params, opt, sched, 6)
        weights[name] = [p.detach().clone() for p in params]
    assert _same_weights(weights["builder"], weights["fused"], exact=True)
    assert _same_weights(weights["builder"], weights["loop"], exact=False, lr=1e-2)


def test_nce_training_gets_the_weights_of_its_hand_written_optimizer(tmp_path, monkeypatch):
    """The NCE loop run with the builder, then with the set-up it had before swapped in for the builder."""
    import seqdiff.edlm.nce_train as nce_train
    from seqdiff.methods import build_model

    tok = NucleotideTokenizer()
    torch.manual_seed(0)
    method, backbone, _ = build_model(ModelConfig(hidden_size=32, n_layers=1, n_heads=2, cond_dim=32,
                                                  max_seq_len=8), MethodConfig(), tok)
    mdlm = SimpleNamespace(method=method, backbone=backbone, tokenizer=tok, seq_len=8, path="tiny")
    tokens = np.tile(np.array([0, 1, 2, 3]), 50)
    cfg = nce_train.NCEConfig(steps=5, batch_size=4, lr=3e-3, warmup_steps=3, weight_decay=0.01, log_every=5)
    builder = nce_train.adamw_with_warmup
    weights = {}
    for name in ("builder", "fused", "loop"):
        if name != "builder":
            def old(params, multiplier, lr, weight_decay, impl={"fused": True} if name == "fused" else {}):
                opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay, **impl)
                return opt, torch.optim.lr_scheduler.LambdaLR(
                    opt, lambda step: min(1.0, (step + 1) / max(1, cfg.warmup_steps)))

            monkeypatch.setattr(nce_train, "adamw_with_warmup", old)
        else:
            monkeypatch.setattr(nce_train, "adamw_with_warmup", builder)
        net, _ = nce_train.train_nce(mdlm, tokens, cfg, tmp_path / f"{name}.pt")
        weights[name] = [p.detach().clone() for p in net.parameters()]
    assert _same_weights(weights["builder"], weights["fused"], exact=True)
    assert _same_weights(weights["builder"], weights["loop"], exact=False, lr=cfg.lr)
