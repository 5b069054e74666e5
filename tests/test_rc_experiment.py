"""experiments/rc_equivariance.py on the real chr20 slices in tests/fixtures: a plain MDLM, its post-hoc
conjoined form and its equivariant twin, trained for two steps."""

import json
import shutil
from pathlib import Path

import pytest

from experiments import rc_equivariance as X
from seqdiff.config import load_run_config
from seqdiff.training.run import train

FIXTURES = Path(__file__).parent / "fixtures"
STEM = "grch37_chr20_slices"


def test_plain_conjoined_and_equivariant_side_by_side(tmp_path):
    for suffix in (".fa.gz", ".fa.gz.fai", ".fa.gz.gzi", ".bed"):
        shutil.copy(FIXTURES / f"{STEM}{suffix}", tmp_path / f"{STEM}{suffix}")
    overrides = {"model.preset": "test", "model.max_seq_len": 64, "data.seq_len": 64, "data.batch_size": 4,
                 "data.eval_batch_size": 8, "data.kind": "fasta", "data.tokenizer": "nucleotide",
                 "data.fasta": tmp_path / f"{STEM}.fa.gz", "data.split_mode": "bed",
                 "data.bed": tmp_path / f"{STEM}.bed",
                 "method.name": "mdlm", "train.max_steps": 2, "train.val_every": 2, "train.val_batches": 1,
                 "train.log_every": 1, "train.warmup_steps": 1, "train.progress_bar": "false"}
    plain, twin, out = tmp_path / "plain", tmp_path / "twin", tmp_path / "report"
    train(load_run_config(None, [f"{k}={v}" for k, v in overrides.items()]), plain)
    with pytest.raises(SystemExit, match="pass --train"):
        X.main(["--plain", str(plain), "--equivariant", str(twin), "--out", str(out)])
    X.main(["--plain", str(plain), "--equivariant", str(twin), "--train", "--out", str(out),
            "--max-test-windows", "12", "--gap-tiles", "4", "--also", str(plain)])
    assert load_run_config(twin / "config.yaml").model.rc_equivariant == "shared"  # the one key changed
    results = json.loads((out / "results.json").read_text())
    m = results["models"]
    assert set(m) == {"plain", "conjoined (post hoc)", "equivariant (shared)", "plain (plain, 2 steps)"}
    assert m["plain (plain, 2 steps)"]["bits_per_base"] == m["plain"]["bits_per_base"]  # same run, same draws
    assert all(r["num_tokens"] == m["plain"]["num_tokens"] > 0 for r in m.values())  # the same tiles
    for name in ("conjoined (post hoc)", "equivariant (shared)"):  # equivariant to float round-off
        assert m[name]["strand"]["max_logit_error"] < 1e-4 and m[name]["strand"]["max_abs_strand_gap_bits"] < 1e-4
    assert m["plain"]["strand"]["max_logit_error"] > 1e-3  # the check can fail: a plain DiT is not equivariant
    assert m["equivariant (shared)"]["parameters"] == m["plain"]["parameters"]  # shared weights
    assert m["plain"]["delta_vs_plain_bits"] == 0
    text = (out / "table.md").read_text()
    for name, r in m.items():
        assert f"| {name} | {r['step']} |" in text and f"{r['bits_per_base']:.4f}" in text
