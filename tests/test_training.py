import math
from pathlib import Path

import lightning as L
import pandas as pd
import pytest
import torch

from seqdiff.config import ConfigError, load_run_config
from seqdiff.training.module import lr_lambda
from seqdiff.training.run import RunError, train

FIXTURE = "tests/fixtures/shakespeare_tiny.txt"


def tiny_config(**extra):
    overrides = [
        "model.preset=test", "model.max_seq_len=64", "data.seq_len=32", "data.batch_size=4",
        f"data.train_file={FIXTURE}", f"data.valid_file={FIXTURE}", f"data.test_file={FIXTURE}",
        "train.max_steps=8", "train.val_every=4", "train.val_batches=1", "train.checkpoint_every=4",
        "train.progress_bar=false", "train.warmup_steps=2", "train.lr_schedule=cosine", "train.lr=1e-3",
        "model.dropout=0.1",
    ]
    overrides += [f"{k}={v}" for k, v in extra.items()]
    return load_run_config(None, overrides)


class StopAt(L.Callback):
    def __init__(self, step):
        self.step = step

    def on_train_batch_end(self, trainer, *args):
        if trainer.global_step >= self.step:
            trainer.should_stop = True


def _losses(run_dir):
    df = pd.read_csv(run_dir / "logs" / "metrics.csv")
    df = df[df["train/loss"].notna()]
    return df.set_index("step")["train/loss"]


def _interrupted_and_resumed(tmp_path, cfg, stop_at: int):
    """(uninterrupted run, run stopped after `stop_at` steps then resumed); their logged losses must agree."""
    full = train(cfg, tmp_path / "full")
    part = train(cfg, tmp_path / "part", extra_callbacks=[StopAt(stop_at)])
    assert part.trainer.global_step == stop_at
    resumed = train(cfg, tmp_path / "part", resume=True)
    assert resumed.trainer.global_step == 8
    a, b = _losses(tmp_path / "full"), _losses(tmp_path / "part")
    assert len(a) == 8
    torch.testing.assert_close(torch.tensor(b.loc[a.index].values), torch.tensor(a.values), rtol=1e-5, atol=1e-6)
    return full, resumed


@pytest.mark.parametrize("method", ["mdlm", "ar"])
def test_resume_repeats_uninterrupted_run(tmp_path, method):
    full, resumed = _interrupted_and_resumed(tmp_path, tiny_config(**{"method.name": method, "train.log_every": 1}), 4)
    for (n, p), (_, q) in zip(full.module.backbone.named_parameters(), resumed.module.backbone.named_parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6, msg=n)
    ema_a = torch.load(full.checkpoint, weights_only=False)["ema_state_dict"]
    ema_b = torch.load(resumed.checkpoint, weights_only=False)["ema_state_dict"]
    for n in ema_a:
        torch.testing.assert_close(ema_a[n], ema_b[n], rtol=1e-5, atol=1e-6)


def test_refuses_to_overwrite_or_resume_nothing(tmp_path):
    cfg = tiny_config(**{"train.max_steps": 2})
    with pytest.raises(RunError, match="no checkpoint"):
        train(cfg, tmp_path / "r", resume=True)
    train(cfg, tmp_path / "r")
    with pytest.raises(RunError, match="--resume"):
        train(cfg, tmp_path / "r")


def test_bad_data_fails_before_writing(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    cfg = tiny_config(**{"data.train_file": str(empty)})
    with pytest.raises(ValueError, match="empty"):
        train(cfg, tmp_path / "r")
    assert not (tmp_path / "r").exists()
    cfg = tiny_config(**{"data.train_file": str(tmp_path / "missing.txt")})
    with pytest.raises(ValueError, match="missing.txt"):
        train(cfg, tmp_path / "r")
    cfg = tiny_config(**{"data.seq_len": 128})  # a recipe error (methods.check_trainable), as `seqdiff config` says
    with pytest.raises(ConfigError, match="data.seq_len=128 exceeds model.max_seq_len"):
        train(cfg, tmp_path / "r")


def _fasta(path, records):
    path.write_text("".join(f">{name}\n" + "\n".join(seq[i:i + 60] for i in range(0, len(seq), 60)) + "\n"
                            for name, seq in records.items()))
    return path


@pytest.mark.parametrize("block_mode", ["stream", "padded"])
def test_a_training_split_too_short_for_one_row_fails_before_writing_and_names_the_file(tmp_path, block_mode):
    short = tmp_path / "short.txt"
    short.write_text("to be\n" if block_mode == "stream" else "\n\n")
    cfg = tiny_config(**{"data.train_file": str(short), "data.text.block_mode": block_mode})
    with pytest.raises(ValueError, match="short.txt" if block_mode == "stream" else "empty|short.txt"):
        train(cfg, tmp_path / "r")
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("n_rich", ["chr1", "chr2"])
def test_a_mostly_n_training_or_validation_split_fails_before_writing(tmp_path, n_rich):
    g = torch.Generator().manual_seed(0)
    bases = lambda n: "".join("ACGT"[i] for i in torch.randint(0, 4, (n,), generator=g).tolist())  # noqa: E731
    mostly_n = "".join("N" * 70 if i % 2 else bases(30) for i in range(60))
    records = {c: (mostly_n if c == n_rich else bases(3000)) for c in ("chr1", "chr2", "chr3")}
    fa = _fasta(tmp_path / "g.fa", records)
    cfg = load_run_config(None, [
        "model.preset=test", "model.max_seq_len=64", "data.seq_len=64", "data.batch_size=2", "data.kind=fasta",
        "data.tokenizer=nucleotide", f"data.fasta.path={fa}", "data.fasta.split_mode=chromosomes",
        "data.fasta.valid_chromosomes=[chr2]", "data.fasta.test_chromosomes=[chr3]", "train.max_steps=2",
        "train.progress_bar=false"])
    with pytest.raises(ValueError, match="g.fa: .*N"):
        train(cfg, tmp_path / "r")
    assert not (tmp_path / "r").exists()
    records[n_rich] = bases(3000)  # the same recipe trains once the split is usable
    _fasta(fa, records)
    Path(f"{fa}.fai").unlink(missing_ok=True)
    train(cfg, tmp_path / "r")
    assert (tmp_path / "r" / "checkpoints" / "last.ckpt").is_file()


def test_training_lowers_the_loss(tmp_path):
    cfg = tiny_config(**{"train.max_steps": 60, "train.lr_schedule": "constant", "train.log_every": 1,
                         "train.val_every": 60, "model.dropout": 0.0})
    train(cfg, tmp_path / "r")
    losses = _losses(tmp_path / "r")
    assert losses.iloc[-10:].mean() < losses.iloc[:5].mean() - 0.3


def test_lr_schedule_shape():
    cfg = tiny_config(**{"train.max_steps": 100, "train.warmup_steps": 10}).train
    f = lr_lambda(cfg)
    assert f(0) == pytest.approx(0.1) and f(9) == pytest.approx(1.0)
    assert f(10) == pytest.approx(1.0) and f(55) == pytest.approx(0.5) and f(100) == pytest.approx(0.0, abs=1e-12)
    assert all(f(s) >= f(s + 1) for s in range(10, 100))
    assert math.isclose(f(32), 0.5 * (1 + math.cos(math.pi * 22 / 90)))


def test_wandb_logging_offline(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    cfg = tiny_config(**{"train.max_steps": 2, "train.wandb": "true", "train.val_every": 2})
    train(cfg, tmp_path / "r")
    runs = list((tmp_path / "r" / "wandb").glob("offline-run-*"))
    assert runs, "an offline wandb run folder must be written"
    assert (tmp_path / "r" / "logs" / "metrics.csv").is_file()  # CSV logs always


def test_global_batch_is_split_across_processes():
    import numpy as np

    from seqdiff.data.blocks import RandomWindowBatches

    tokens = np.arange(1000)
    whole = RandomWindowBatches(tokens, 16, 8, seed=3).batch_at(5)["input_ids"]
    parts = [RandomWindowBatches(tokens, 16, 8, seed=3, rank=r, world_size=4).batch_at(5)["input_ids"]
             for r in range(4)]
    assert torch.equal(torch.cat(parts), whole)
    with pytest.raises(ValueError, match="does not divide"):
        RandomWindowBatches(tokens, 16, 6, seed=3, rank=0, world_size=4)


def test_time_conditioning_follows_the_method_unless_set(tmp_path, capsys):
    from seqdiff.checkpoint import load_checkpoint

    sedd = train(tiny_config(**{"method.name": "sedd", "train.max_steps": 1, "train.val_every": 1}), tmp_path / "s")
    assert sedd.module.model_config.time_conditioning is True
    assert load_checkpoint(tmp_path / "s").model_config.time_conditioning is True
    mdlm = train(tiny_config(**{"train.max_steps": 1, "train.val_every": 1}), tmp_path / "m")
    assert mdlm.module.model_config.time_conditioning is False
    # method.time_sampling=auto: mask counts for the time-agnostic MDLM, times for a time-conditioned one; said
    assert (mdlm.module.method.time_sampling, mdlm.module.method.mask_count_law) == ("mask_count", "inverse_sqrt")
    assert "time_sampling=auto draws mask_count with mask_count_law=inverse_sqrt" in capsys.readouterr().err
    timed = train(tiny_config(**{"train.max_steps": 1, "train.val_every": 1, "model.time_conditioning": "true"}),
                  tmp_path / "t")
    assert timed.module.method.time_sampling == "antithetic"
    assert "time_sampling=auto draws antithetic" in capsys.readouterr().err
    from seqdiff.config import ConfigError

    with pytest.raises(ConfigError, match="time_conditioning=true"):
        train(tiny_config(**{"method.name": "sedd", "model.time_conditioning": "false"}), tmp_path / "x")
    assert not (tmp_path / "x").exists()  # refused before anything was written


# ---------------------------------------------------------------------------------------------- LP-FT options
class Snapshots(L.Callback):
    """Weights (and the EMA shadow, and which parameters AdamW holds state for) after every optimizer step."""

    def __init__(self):
        self.weights, self.ema, self.with_state = {}, {}, {}

    def _take(self, trainer, module):
        step = trainer.global_step
        self.weights[step] = {n: p.detach().clone() for n, p in module.backbone.named_parameters()}
        ema = next((c for c in trainer.callbacks if type(c).__name__ == "EMA"), None)
        if ema is not None and ema.shadow is not None:
            self.ema[step] = {n: v.clone() for n, v in ema.shadow.items()}
        state = trainer.optimizers[0].state
        self.with_state[step] = {n for n, p in module.backbone.named_parameters() if len(state.get(p, {})) > 0}

    def on_train_start(self, trainer, module):
        self._take(trainer, module)

    def on_train_batch_end(self, trainer, module, *args):
        self._take(trainer, module)


@pytest.mark.parametrize("backbone", ["dit", "bert"])
def test_frozen_backbone_keeps_its_weights_bit_for_bit_then_trains(tmp_path, backbone):
    n_frozen, scale = 4, 0.25
    cfg = tiny_config(**{"model.backbone": backbone, "model.time_conditioning": "false", "train.max_steps": 8,
                         "train.freeze_backbone_steps": n_frozen, "train.backbone_lr_scale": scale,
                         "train.weight_decay": 0.1, "train.lr_schedule": "constant", "train.log_every": 1,
                         "train.val_every": 8, "train.ema_decay": 0.9})
    snaps = Snapshots()
    result = train(cfg, tmp_path / "r", extra_callbacks=[snaps])
    module = result.module
    head = {n for n, p in module.backbone.named_parameters()
            if any(p is q for q in module.backbone.head_parameters())}
    body = {n for n, _ in module.backbone.named_parameters()} - head
    assert head and body
    w = snaps.weights
    for step in range(1, n_frozen + 1):  # weight decay 0.1 would move any weight AdamW touched
        for n in body:
            assert torch.equal(w[step][n], w[0][n]), (step, n)
            assert torch.equal(snaps.ema[step][n], w[0][n]), (step, n)
        assert snaps.with_state[step] == head  # no AdamW state for the frozen weights
    assert all(not torch.equal(w[1][n], w[0][n]) for n in head)
    moved = [n for n in body if not torch.equal(w[n_frozen + 1][n], w[n_frozen][n])]
    assert len(moved) == len(body), sorted(body - set(moved))
    assert snaps.with_state[8] == head | body

    groups = result.trainer.optimizers[0].param_groups
    assert [g["name"] for g in groups] == ["head", "head", "body", "body"]
    assert {id(p) for g in groups[:2] for p in g["params"]} == {id(p) for p in module.backbone.head_parameters()}
    assert [g["initial_lr"] for g in groups] == pytest.approx([1e-3, 1e-3, 1e-3 * scale, 1e-3 * scale])
    df = pd.read_csv(tmp_path / "r" / "logs" / "metrics.csv")
    df = df[df["lr"].notna()].sort_values("step")
    assert len(df) == 8
    body_lr, head_lr = df["lr_backbone"].to_numpy(), df["lr"].to_numpy()
    # steps 0-3 frozen (lr 0), step 4 the body's warm-up (1 of 2), then train.lr * scale
    assert body_lr[:n_frozen].tolist() == [0.0] * n_frozen
    assert body_lr[n_frozen] / head_lr[n_frozen] == pytest.approx(scale / 2)
    assert body_lr[n_frozen + 1:] / head_lr[n_frozen + 1:] == pytest.approx([scale] * 3)


def test_backbone_lr_multiplier_follows_warm_up_and_decay():
    from seqdiff.training.module import backbone_lr_lambda

    cfg = tiny_config(**{"train.max_steps": 100, "train.warmup_steps": 10}).train
    head = lr_lambda(cfg)
    unfrozen = backbone_lr_lambda(cfg)  # freeze_backbone_steps = 0: the head's schedule
    assert [unfrozen(s) for s in range(101)] == [head(s) for s in range(101)]
    cfg = tiny_config(**{"train.max_steps": 100, "train.warmup_steps": 10, "train.freeze_backbone_steps": 30}).train
    f, head = backbone_lr_lambda(cfg), lr_lambda(cfg)
    assert all(f(s) == 0.0 for s in range(30))
    assert f(30) == pytest.approx(0.1 * head(30)) and f(34) == pytest.approx(0.5 * head(34))
    assert all(f(s) == pytest.approx(head(s)) for s in range(39, 101))  # warmed up: the same cosine


def test_default_options_keep_the_two_optimizer_groups(tmp_path):
    """Checkpoints written before the LP-FT options hold two groups (decay / no decay); they must resume."""
    result = train(tiny_config(**{"train.max_steps": 1, "train.val_every": 1}), tmp_path / "r")
    groups = result.trainer.optimizers[0].param_groups
    assert len(groups) == 2 and "name" not in groups[0]
    assert [g["weight_decay"] for g in groups] == [0.0, 0.0]


def test_resume_inside_the_frozen_phase_repeats_the_uninterrupted_run(tmp_path):
    cfg = tiny_config(**{"train.log_every": 1, "train.freeze_backbone_steps": 4, "train.backbone_lr_scale": 0.5,
                         "train.weight_decay": 0.1})
    full, resumed = _interrupted_and_resumed(tmp_path, cfg, 3)
    for (n, p), (_, q) in zip(full.module.backbone.named_parameters(), resumed.module.backbone.named_parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6, msg=n)


def test_the_final_step_is_checkpointed_when_max_steps_is_not_a_multiple(tmp_path):
    from seqdiff.checkpoint import load_checkpoint

    cfg = tiny_config(**{"train.max_steps": 5, "train.checkpoint_every": 2, "train.val_every": 5})
    result = train(cfg, tmp_path / "r")
    assert torch.load(result.checkpoint, weights_only=False)["global_step"] == 5
    assert sorted(p.name for p in (tmp_path / "r" / "checkpoints").iterdir()) == ["last.ckpt", "step5.ckpt"]
    assert load_checkpoint(tmp_path / "r").step == 5


def test_csv_log_is_rewritten_by_global_rank_zero_only(tmp_path, monkeypatch):
    """On resume the CSV logger trims metrics.csv to the checkpoint's step. Only rank 0 may do it: in a resumed
    multi-process run every process built the writer, and their simultaneous rewrites corrupted the file."""
    from lightning.pytorch.utilities.rank_zero import rank_zero_only

    from seqdiff.training.csv_log import ResumableCSVLogger

    logs = tmp_path / "logs"
    logs.mkdir()
    original = "step,train/loss\n0,2.0\n1,1.5\n2,1.2\n"
    (logs / "metrics.csv").write_text(original)
    monkeypatch.setattr(rank_zero_only, "rank", 1)
    ResumableCSVLogger(str(tmp_path), resume_step=1).experiment.log_metrics({"train/loss": 9.0}, step=5)
    assert (logs / "metrics.csv").read_text() == original  # another rank: no rewrite, nothing logged
    monkeypatch.setattr(rank_zero_only, "rank", 0)
    assert ResumableCSVLogger(str(tmp_path), resume_step=1).experiment is not None  # rank 0 trims to step < 1
    assert (logs / "metrics.csv").read_text().splitlines() == ["step,train/loss", "0,2.0"]


@pytest.mark.parametrize("backbone", ["dit", "bert"])
def test_frozen_parameters_keep_their_weights_and_get_no_optimizer_state_or_ema(tmp_path, backbone):
    pattern = "layers.0.*" if backbone == "bert" else "blocks.0.*"
    cfg = tiny_config(**{"model.backbone": backbone, "model.time_conditioning": "false", "train.max_steps": 3,
                         "train.weight_decay": 0.1, "train.val_every": 3, "train.ema_decay": 0.9,
                         "train.frozen_parameters": f"[{pattern}]"})
    snaps = Snapshots()
    result = train(cfg, tmp_path / "r", extra_callbacks=[snaps])
    from fnmatch import fnmatchcase

    names = [n for n, _ in result.module.backbone.named_parameters()]
    frozen = {n for n in names if fnmatchcase(n, pattern)}
    assert frozen and len(frozen) < len(names)
    w = snaps.weights
    for n in names:  # weight decay 0.1 would move any weight AdamW touched
        assert torch.equal(w[3][n], w[0][n]) == (n in frozen), n
    assert snaps.with_state[3] == set(names) - frozen
    ckpt = torch.load(result.checkpoint, weights_only=False)
    assert set(ckpt["ema_state_dict"]) == set(names) - frozen
    from seqdiff.checkpoint import load_checkpoint

    loaded = load_checkpoint(tmp_path / "r")  # EMA weights where tracked, the frozen ones as they were
    for n, p in loaded.backbone.named_parameters():
        if n in frozen:
            assert torch.equal(p, w[0][n]), n
    with pytest.raises(RunError, match=r"frozen_parameters=\[.*\]; its optimizer state"):
        train(tiny_config(**{"model.backbone": backbone, "model.time_conditioning": "false",
                             "train.max_steps": 4}), tmp_path / "r", resume=True)


def test_a_frozen_pattern_that_matches_nothing_or_everything_is_refused(tmp_path):
    from seqdiff.config import ConfigError

    with pytest.raises(ConfigError, match=r"'layer.0.\*' matches no parameter of the DiT backbone \(its names"):
        train(tiny_config(**{"train.frozen_parameters": "[layer.0.*]"}), tmp_path / "a")
    with pytest.raises(ConfigError, match="freezes every parameter"):
        train(tiny_config(**{"train.frozen_parameters": "['*']"}), tmp_path / "b")
    with pytest.raises(ConfigError, match="non-empty strings"):
        tiny_config(**{"train.frozen_parameters": "['']"})
