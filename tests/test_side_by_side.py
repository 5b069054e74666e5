"""Two runs at once (seqdiff.training.side_by_side): the quickstart trains AR in a second process beside MDLM."""

import json
import os
import signal
import time
from dataclasses import replace

import pytest
import torch

from seqdiff.cli import main
from seqdiff.training import side_by_side
from seqdiff.training.guards import RunError


def test_threads_are_split_between_the_two_runs_and_one_thread_is_not():
    assert side_by_side.split_threads(1) is None
    assert side_by_side.split_threads(2) == (1, 1)
    assert side_by_side.split_threads(3) == (2, 1)
    assert side_by_side.split_threads(16) == (8, 8)


def test_a_child_whose_parent_is_gone_stops_as_on_sigterm(monkeypatch):
    watch = side_by_side.OrphanWatch()
    sent = []
    monkeypatch.setattr(os, "kill", lambda pid, signum: sent.append((pid, signum)))
    watch.on_train_batch_end(None, None, None, None, 0)
    assert sent == []  # the parent is still there
    monkeypatch.setattr(os, "getppid", lambda: watch.parent + 1)  # re-parented: the parent died
    watch.on_train_batch_end(None, None, None, None, 0)
    assert sent == [(os.getpid(), signal.SIGTERM)]


def test_a_stop_asked_for_before_training_is_handed_to_the_runs_guard(monkeypatch):
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        early = side_by_side.EarlySignals()
        sent = []
        early.on_train_start(None, None)
        os.kill(os.getpid(), signal.SIGTERM)  # recorded, not acted on: training has not started
        monkeypatch.setattr(os, "kill", lambda pid, signum: sent.append((pid, signum)))
        early.on_train_start(None, None)
        assert sent == [(os.getpid(), signal.SIGTERM)]
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def test_a_failing_second_process_is_reported_with_its_log(tmp_path):
    from seqdiff.quickstart import QUICKSTART

    data = replace(QUICKSTART.data, train_file=str(tmp_path / "missing.txt"),
                   valid_file=str(tmp_path / "missing.txt"))
    config = replace(QUICKSTART, data=data)
    child = side_by_side.ChildRun(config, tmp_path / "run", resume=False, threads=1, log=tmp_path / "child.log")
    status = child.wait()
    assert status == 1
    with pytest.raises(RunError) as e:
        child.check(status)
    message = str(e.value)
    assert f"training {tmp_path / 'run'} in a second process failed (exit status 1)" in message
    assert str(tmp_path / "child.log") in message and "missing.txt" in message  # the child's own error line
    assert "Traceback" not in (tmp_path / "child.log").read_text()


def test_quickstart_trains_side_by_side_stops_both_on_ctrl_c_and_resumes_both(tmp_path, capsys, monkeypatch):
    import seqdiff.quickstart as qs

    monkeypatch.setattr(qs, "NUM_T_SAMPLES", 1)
    recipe = qs.QUICKSTART
    monkeypatch.setattr(qs, "QUICKSTART", replace(recipe, train=replace(recipe.train, val_batches=1),
                                                  sample=replace(recipe.sample, steps=8, num_samples=4,
                                                                 batch_size=4)))
    out, runs = tmp_path / "report", tmp_path / "runs"
    interrupted = []

    class Projected(qs.ProjectedTime):
        def on_train_batch_end(self, trainer, *rest):
            super().on_train_batch_end(trainer, *rest)
            if not interrupted and trainer.global_step == 2:  # Ctrl-C once AR has started in its process
                deadline = time.monotonic() + 120
                while not (runs / "ar" / "config.yaml").is_file() and time.monotonic() < deadline:
                    time.sleep(0.1)
                interrupted.append(trainer.global_step)
                os.kill(os.getpid(), signal.SIGINT)  # a terminal's Ctrl-C reaches this process only

    monkeypatch.setattr(qs, "ProjectedTime", Projected)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        args = ["quickstart", "--max-steps", "40", "--out", str(out), "--run-dir", str(runs)]
        assert main(args) == 130
        err = capsys.readouterr().err
        assert ("[quickstart] training mdlm here and ar in a second process at the same time (1 + 1 torch "
                "threads)") in err
        assert f"{runs / 'ar'} (the second process) stopped after writing a checkpoint" in err
        assert f"stopped by SIGINT at step 2 of {runs / 'mdlm'}" in err
        assert torch.get_num_threads() == 2  # given back to this process
        for method in ("mdlm", "ar"):  # both stopped early, with a checkpoint to resume from
            assert 0 < qs._steps_done(runs / method) < 40
            assert not (runs / method / ".train.lock").exists()
        assert main(args) == 0
        err = capsys.readouterr().err
        assert f"resuming {runs / 'ar'}" in err
    finally:
        torch.set_num_threads(threads)
    results = json.loads((out / "results.json").read_text())
    assert results["training"] == {"side_by_side": True, "threads": {"mdlm": 1, "ar": 1}}
    assert all(r["steps"] == 40 for r in results["models"].values())
    assert "The two models trained side by side, in two processes at the same time" in (out / "summary.md").read_text()
    log = (runs / "ar.log").read_text()  # both tries' output, the interrupted one first
    assert log.index("SIGINT at step") < log.index("`Trainer.fit` stopped: `max_steps=40` reached")
