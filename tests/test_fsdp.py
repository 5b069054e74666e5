"""train.strategy=fsdp: one FSDP unit per transformer block on GPUs; on CPU (where Lightning's FSDP does not
run) and with EMA, one clear refusal before anything is written."""

import pytest

from seqdiff.backbones import BLOCKS
from seqdiff.backbones.bert import BertLayer
from seqdiff.backbones.dit import DiTBlock
from seqdiff.cli import main
from seqdiff.config import TrainConfig
from seqdiff.training.run import RunError, build_strategy

FIXTURE = "tests/fixtures/shakespeare_tiny.txt"


def test_other_strategies_pass_through():
    assert build_strategy(TrainConfig(strategy="ddp", accelerator="cpu")) == ("ddp", "cpu")
    assert build_strategy(TrainConfig()) == ("auto", "auto")


def test_fsdp_is_refused_on_cpu_and_with_ema():
    with pytest.raises(RunError, match=r"fsdp needs CUDA GPUs.*does not run on cpu.*train.strategy=ddp"):
        build_strategy(TrainConfig(strategy="fsdp", accelerator="cpu", ema_decay=0.0))
    with pytest.raises(RunError, match="fsdp_cpu_offload needs train.ema_decay=0"):
        build_strategy(TrainConfig(strategy="fsdp_cpu_offload", accelerator="gpu", ema_decay=0.999))


def test_fsdp_on_gpu_wraps_every_transformer_block():
    from lightning.pytorch.strategies import FSDPStrategy

    assert set(BLOCKS) == {DiTBlock, BertLayer}
    strategy, accelerator = build_strategy(TrainConfig(strategy="fsdp", accelerator="gpu", ema_decay=0.0))
    assert isinstance(strategy, FSDPStrategy) and accelerator == "gpu"
    policy = strategy.kwargs["auto_wrap_policy"]
    assert set(getattr(policy, "_module_classes", ())) == set(BLOCKS)
    assert strategy._state_dict_type == "full"


def test_cli_refuses_fsdp_on_cpu_before_writing(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "--run-dir", str(run), "model.preset=test", f"data.train_file={FIXTURE}",
                 f"data.valid_file={FIXTURE}", "train.strategy=fsdp", "train.accelerator=cpu",
                 "train.ema_decay=0"]) == 2
    assert "needs CUDA GPUs" in capsys.readouterr().err and not run.exists()
