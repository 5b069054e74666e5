"""seqdiff.bench.gpu_check without a GPU: the peak table, the MFU formula, the FLOP count, the report, the run."""

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from seqdiff.backbones import build_backbone
from seqdiff.bench import gpu_check
from seqdiff.config import MODEL_PRESETS, ModelConfig


def test_peak_table_matches_device_names():
    assert gpu_check.peak_bf16_flops("NVIDIA H100 80GB HBM3") == 989.4e12
    assert gpu_check.peak_bf16_flops("NVIDIA H100 PCIe") == 756e12
    assert gpu_check.peak_bf16_flops("NVIDIA H200") == 989.4e12
    assert gpu_check.peak_bf16_flops("NVIDIA A100-SXM4-80GB") == 312e12
    assert gpu_check.peak_bf16_flops("NVIDIA L40S") == 362e12  # not L4's
    assert gpu_check.peak_bf16_flops("Tesla T4") is None


def test_mfu_formula():
    # 6e9 FLOPs per token at 50k tokens/s = 3e14 FLOP/s, on a 1e15 peak: 30%
    assert gpu_check.mfu(6e9, 5e4, 1e15) == pytest.approx(0.3)
    assert gpu_check.mfu(6e9, 5e4, None) is None


@pytest.mark.parametrize("causal", [False, True])
def test_flops_per_token_counts_the_matmuls_of_a_training_step(causal):
    """6 N + 12 n_layers d L against torch's FLOP counter on one forward + backward. The counter sees the Linear
    matmuls (6 x their weights per token, exactly) but not CPU SDPA, so the attention term is checked on the same
    attention written with matmuls; what is left is 6 x the biases and norm weights, which the formula counts."""
    L, B = 16, 2
    cfg = ModelConfig(**MODEL_PRESETS["test"], max_seq_len=L, time_conditioning=False)
    net = build_backbone(cfg, 11, causal=causal)
    x = torch.randint(0, 11, (B, L))
    with FlopCounterMode(display=False) as counter:
        net(x).float().square().mean().backward()
    linear = counter.get_total_flops() / (B * L)
    assert linear == 6 * sum(m.weight.numel() for m in net.modules() if isinstance(m, torch.nn.Linear))

    H, nH = cfg.hidden_size, cfg.n_heads
    q, k, v = (torch.randn(B, nH, L, H // nH, requires_grad=True) for _ in range(3))
    with FlopCounterMode(display=False) as counter:
        ((q @ k.transpose(-1, -2)).softmax(-1) @ v).sum().backward()
    attention = cfg.n_layers * counter.get_total_flops() / (B * L)  # per token, every layer

    formula = gpu_check.model_flops_per_token("test", L, 11, causal=causal)
    assert formula == net.flops_per_token(L)
    rest = formula - linear - attention
    small = sum(p.numel() for n, p in net.named_parameters() if p.ndim == 1)  # biases, norm weights
    assert rest == 6 * small, (formula, linear, attention, small)


def _result() -> dict:
    run = {"tokens_per_s": 1234.5, "step_s_median": 0.5, "mfu": 0.4123, "peak_memory_gb": 12.25, "compiled": True,
           "final_train_loss": 1.5}
    result = {"command": "python -m seqdiff.bench.gpu_check", "date": "d", "device_name": "NVIDIA H200", "torch": "t",
              "precision": "bf16 autocast", "peak_flops": 989.4e12, "peak_source": "table",
              "config": {"preset": "small", "seq_len": 1024, "batch_size": 32, "micro_batch_size": 16, "steps": 300,
                         "skip_steps": 30, "compile": True},
              "runs": {"mdlm": run, "ar": dict(run, step_s_median=0.4, dynamo_graphs=1, dynamo_graph_breaks=0)},
              "mdlm_over_ar_step_time": 1.25}
    return result


def test_report_is_written_from_the_result(tmp_path):
    result = _result()
    gpu_check.write_report(tmp_path, result)
    assert json.loads((tmp_path / "gpu_check.json").read_text()) == result
    md = (tmp_path / "README.md").read_text()
    assert "`python -m seqdiff.bench.gpu_check`" in md
    assert "| mdlm | 1,234 | 0.5000 | 41.2% | 12.2 | True | 1.500 |" in md  # a report from before the counters
    assert "| ar | 1,234 | 0.4000 | 41.2% | 12.2 | True (1 graph(s), 0 break(s)) | 1.500 |" in md
    assert "MDLM step time / AR step time: 1.250" in md


def test_a_ctrl_c_while_the_report_is_written_comes_after_both_files(tmp_path, monkeypatch):
    """A Ctrl-C between the JSON and the Markdown used to leave a new gpu_check.json beside an old README.md."""
    import signal

    from seqdiff import safe_io

    (tmp_path / "README.md").write_text("old\n")
    written = []

    def write_and_interrupt(path, text, what="file"):
        written.append(Path(path).name)
        safe_io.atomic_write_bytes(path, text.encode(), what)
        if len(written) == 1:
            signal.raise_signal(signal.SIGINT)  # the handler runs here, in the main thread

    monkeypatch.setattr(gpu_check, "atomic_write_text", write_and_interrupt)
    with pytest.raises(KeyboardInterrupt):
        gpu_check.write_report(tmp_path, _result())
    assert written == ["gpu_check.json", "README.md"]
    assert "MDLM step time / AR step time" in (tmp_path / "README.md").read_text()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_refuses_without_cuda_and_runs_on_cpu_when_allowed(tmp_path, capsys):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    out = tmp_path / "gpu"
    assert gpu_check.main(["--out", str(out)]) == 2
    assert "no CUDA device" in capsys.readouterr().err and not out.exists()
    args = ["--allow-cpu", "--preset", "test", "--seq-len", "32", "--batch-size", "4", "--micro-batch-size", "2",
            "--steps", "3", "--skip-steps", "1", "--no-compile", "--peak-tflops", "1", "--out", str(out)]
    assert gpu_check.main(args) == 0
    result = json.loads((out / "gpu_check.json").read_text())
    for method in ("mdlm", "ar"):
        r = result["runs"][method]
        assert r["steps"] == 3 and r["timed_steps"] == 2 and r["tokens_per_s"] > 0
        assert "train.strategy=fsdp2" in r["recipe"] and "train.micro_batch_size=2" in r["recipe"]
        assert "train.activation_checkpointing=false" in r["recipe"]
        assert r["mfu"] == pytest.approx(r["flops_per_token"] * r["tokens_per_s"] / 1e12)
        profile = r["profile"]  # the last step, profiled on the host (no device time on the CPU)
        assert profile["wall_ms"] > 0 and profile["device_busy_ms"] is None and profile["top_device_ops"] == []
        assert profile["top_host_ops"] and sum(profile["host_ms_by_category"].values()) > 0
        by_kind = profile["host_ms_by_category"]
        assert by_kind["optimizer"] > 0 and by_kind["matmul"] > 0  # AdamW and the forward / backward, apart
    assert result["mdlm_over_ar_step_time"] == pytest.approx(
        result["runs"]["mdlm"]["step_s_median"] / result["runs"]["ar"]["step_s_median"])
    assert "One profiled step per method" in (out / "README.md").read_text()


class _Event:
    def __init__(self, name: str, self_ms: float, cuda: bool = False) -> None:
        self.name, self.key, self.count = name, name, 1
        self.self_cpu_time_total = 0.0 if cuda else self_ms * 1e3
        self.self_device_time_total = self_ms * 1e3 if cuda else 0.0
        self.device_type = "DeviceType.CUDA" if cuda else "DeviceType.CPU"


class _Profile:
    def __init__(self, events: list) -> None:
        self._events = events

    def events(self) -> list:
        return self._events

    def key_averages(self) -> list:
        return self._events


def test_profile_bins_each_operator_by_name_and_the_closure_python_as_unattributed():
    """Lightning runs forward and backward inside optimizer.step(closure): the operators keep their own kinds
    and the annotation's self time (the closure's Python between operators) is not AdamW's work."""
    from seqdiff.bench.gpu_callbacks import summarize_profile

    prof = _Profile([_Event("Optimizer.step#AdamW.step", 50.0), _Event("aten::mm", 7.0),
                     _Event("aten::_fused_adamw_", 2.0), _Event("aten::_foreach_mul_", 1.0),
                     _Event("autograd::engine::evaluate_function: MmBackward0", 0.5),
                     _Event("aten::native_layer_norm", 0.25), _Event("sm90_gemm_kernel", 3.0, cuda=True)])
    summary = summarize_profile(prof, wall_s=0.1, cuda=True, top=2)
    by_kind = summary["host_ms_by_category"]
    assert by_kind["optimizer"] == 3.0 and by_kind["matmul"] == 7.0 and by_kind["unattributed"] == 50.0
    assert by_kind["autograd"] == 0.5 and by_kind["layernorm"] == 0.25
    assert summary["device_busy_ms"] == 3.0 and summary["device_busy_share"] == 0.03
    assert summary["top_host_ops"] == [["Optimizer.step#AdamW.step", 50.0, 1], ["aten::mm", 7.0, 1]]
    assert summary["top_device_ops"] == [["sm90_gemm_kernel", 3.0, 1]]


def test_strategy_auto_runs_without_the_sharding_wrapper(tmp_path):
    """--strategy auto: the same recipe on a plain single device (to measure what fsdp2 costs on one GPU)."""
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    out = tmp_path / "gpu"
    args = ["--allow-cpu", "--preset", "test", "--seq-len", "32", "--batch-size", "4", "--micro-batch-size", "2",
            "--steps", "2", "--skip-steps", "1", "--no-compile", "--methods", "mdlm", "--strategy", "auto",
            "--no-profile", "--activation-checkpointing", "--out", str(out)]
    assert gpu_check.main(args) == 0
    result = json.loads((out / "gpu_check.json").read_text())
    assert set(result["runs"]) == {"mdlm"} and result["mdlm_over_ar_step_time"] is None
    recipe = result["runs"]["mdlm"]["recipe"]
    assert "train.strategy=auto" in recipe and result["runs"]["mdlm"]["profile"] is None
    assert "train.activation_checkpointing=true" in recipe  # --activation-checkpointing: the run recomputes blocks
    assert "train.strategy=auto on one device, train.activation_checkpointing=true." in (out / "README.md").read_text()


def test_a_profiler_that_cannot_start_costs_the_profile_not_the_run(tmp_path, monkeypatch):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")

    def broken(*args, **kwargs):
        raise RuntimeError("CUPTI is not available")

    monkeypatch.setattr(torch.profiler, "profile", broken)
    out = tmp_path / "gpu"
    args = ["--allow-cpu", "--preset", "test", "--seq-len", "32", "--batch-size", "4", "--micro-batch-size", "2",
            "--steps", "2", "--skip-steps", "1", "--no-compile", "--methods", "mdlm", "--out", str(out)]
    assert gpu_check.main(args) == 0
    run = json.loads((out / "gpu_check.json").read_text())["runs"]["mdlm"]
    assert run["tokens_per_s"] > 0 and "CUPTI is not available" in run["profile"]["error"]
    assert "The step profile failed: mdlm: RuntimeError: CUPTI is not available" in (out / "README.md").read_text()


def test_gpu_suite_script_runs_every_part_and_copies_only_new_results(tmp_path):
    """scripts/gpu_suite.sh: a part that fails (exit 2 here) does not stop the suite, each part's command is the
    planned module, and the copy folder gets nothing (the committed reports are older than the run). PYTHON is a
    stand-in that logs its arguments and exits 2, as each part does on a machine without CUDA (that refusal is
    tested in this process below and above): five real ones cost five imports of torch and Lightning."""
    stand_in = tmp_path / "python"
    stand_in.write_text(f'#!/usr/bin/env bash\necho "$*" >> {tmp_path / "calls"}\nexit 2\n')
    stand_in.chmod(0o755)
    script = Path(__file__).resolve().parents[1] / "scripts" / "gpu_suite.sh"
    done = subprocess.run(["bash", str(script), str(tmp_path / "copy")], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHON": str(stand_in)})
    assert done.returncode == 0, done.stderr[-2000:]
    parts = ["auto_accum", "auto_mb32", "bench_gpt2", "bench_small", "spec"]
    for part in parts:
        assert f"=== {part}: exit 2" in done.stdout
    calls = (tmp_path / "calls").read_text().splitlines()
    assert [c.split()[1] for c in calls] == ["seqdiff.bench.gpu_check"] * 3 + ["seqdiff.cli"] * 2
    assert all("--device cuda" in c for c in calls[3:]) and "--micro-batch-size 32" in calls[2]
    assert sorted(p.name for p in (tmp_path / "copy").iterdir()) == parts
    assert not any((tmp_path / "copy").rglob("*.*"))


def test_bench_on_cuda_refuses_a_machine_without_it(tmp_path, capsys):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    from seqdiff.cli import main

    assert main(["bench", "--device", "cuda", "--out", str(tmp_path / "b")]) == 2  # the check every command uses
    assert "torch sees no CUDA GPU here" in capsys.readouterr().err and not (tmp_path / "b").exists()
