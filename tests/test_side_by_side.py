"""Two runs at once (seqdiff.training.side_by_side): the quickstart trains AR in a second process beside MDLM."""

import json
import os
import signal
import socket
import sys
import threading
import time
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

from seqdiff.cli import main
from seqdiff.training import side_by_side
from seqdiff.training.guards import RunError, TrainingInterrupted
from seqdiff.training.lock import RunLockedError

FAKE_CHILD = ("import signal, sys, time\n"
              "for s in (signal.SIGINT, signal.SIGTERM): signal.signal(s, lambda *a: sys.exit(3))\n"
              "signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})\n"
              "time.sleep(float(sys.argv[1]))\n")
"""A second process in a fraction of a second: sleeps argv[1] seconds (then finishes), exits INTERRUPTED on a stop."""


def fake_child(monkeypatch, seconds: float) -> None:
    command = [sys.executable, "-c", FAKE_CHILD, str(seconds)]
    monkeypatch.setattr(side_by_side.ChildRun, "command", staticmethod(lambda *args: command))


@pytest.fixture
def two_threads():
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(threads)


def quickstart_runs(tmp_path):
    import seqdiff.quickstart as qs

    configs = {m: replace(qs.QUICKSTART, name=f"quickstart-{m}", method=replace(qs.QUICKSTART.method, name=m))
               for m in qs.METHODS}
    return configs, {m: tmp_path / "runs" / m for m in qs.METHODS}, tmp_path / "runs"


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


def test_a_failing_second_process_is_reported_with_its_log(tmp_path, monkeypatch):
    from seqdiff.quickstart import QUICKSTART

    data = replace(QUICKSTART.data, train_file=str(tmp_path / "missing.txt"),
                   valid_file=str(tmp_path / "missing.txt"))
    config = replace(QUICKSTART, data=data)
    (tmp_path / "seqdiff").mkdir()  # a checkout of another version in the working directory is not what runs
    (tmp_path / "seqdiff" / "__init__.py").write_text("raise ImportError('the seqdiff of the working directory')\n")
    monkeypatch.chdir(tmp_path)
    child = side_by_side.ChildRun(config, tmp_path / "run", resume=False, threads=1, log=tmp_path / "child.log")
    child.process.send_signal(signal.SIGTERM)  # while it imports: kept for its training, not the end of it
    status = child.wait()
    assert status == 1
    with pytest.raises(RunError) as e:
        child.check(status)
    message = str(e.value)
    assert f"training {tmp_path / 'run'} in a second process failed (exit status 1)" in message
    assert str(tmp_path / "child.log") in message and "missing.txt" in message  # the child's own error line
    log = (tmp_path / "child.log").read_text()
    assert log.startswith("--- ") and f": training {tmp_path / 'run'} ---\n" in log  # each try's lines headed
    assert "Traceback" not in log


def test_sigterm_while_waiting_for_the_second_process_stops_it_and_names_its_checkpoint(tmp_path, monkeypatch,
                                                                                         capsys, two_threads):
    """A job scheduler's SIGTERM after MDLM finished, while AR trains on: passed on, not the end of this process
    alone; the one message names AR's run and step, the exit status is SIGTERM's."""
    import seqdiff.quickstart as qs

    configs, run_dirs, root = quickstart_runs(tmp_path)
    monkeypatch.setattr(qs, "_steps_done", lambda run_dir: {"mdlm": 50, "ar": 20}[run_dir.name])  # both resume
    fake_child(monkeypatch, 30)
    trained = []
    monkeypatch.setattr(qs, "_train_or_reuse", lambda config, run_dir, *callbacks: trained.append(callbacks))

    def before_the_fix(signum, frame):
        raise AssertionError("SIGTERM reached this process alone")

    previous = signal.signal(signal.SIGTERM, before_the_fix)
    timer = threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGTERM))
    try:
        timer.start()
        with pytest.raises(TrainingInterrupted) as e:
            qs._train_models(configs, run_dirs, root, sequential=False)
        assert signal.getsignal(signal.SIGTERM) is before_the_fix  # given back
    finally:
        timer.cancel()
        signal.signal(signal.SIGTERM, previous)
    assert (e.value.signum, e.value.step, e.value.run_dir) == (signal.SIGTERM, 20, run_dirs["ar"])
    err = capsys.readouterr().err
    assert (f"[quickstart] mdlm finished; waiting for ar in the second process, which takes all 2 torch threads "
            f"from its next step (its output: {root / 'ar.log'})") in err
    assert (root / "ar.threads").read_text() == "2\n"  # the offer AR's process reads at its next step
    assert f"{run_dirs['ar']} (the second process) stopped after writing a checkpoint" in err
    assert torch.get_num_threads() == 2
    clock, watch = trained[0]  # MDLM's projection counts AR's own steps left (from step 20; MDLM's from step 50)
    assert (clock.steps_after, clock.other_steps) == (0, configs["ar"].train.max_steps - 20) and clock.side_by_side
    assert isinstance(watch, side_by_side.ChildWatch)


def test_a_run_another_trainer_holds_is_refused_before_a_second_process_starts(tmp_path, monkeypatch, two_threads):
    import seqdiff.quickstart as qs

    configs, run_dirs, root = quickstart_runs(tmp_path)
    run_dirs["ar"].mkdir(parents=True)
    (run_dirs["ar"] / "train.lock").write_text(json.dumps({"pid": os.getppid(), "host": socket.gethostname()}))
    monkeypatch.setattr(qs, "ChildRun", lambda *a: pytest.fail("a second process was started"))
    with pytest.raises(RunLockedError, match=f"{run_dirs['ar']} is being written by another trainer"):
        qs._train_models(configs, run_dirs, root, sequential=False)


def test_a_killed_second_process_is_reported_at_once_and_in_one_line(tmp_path, monkeypatch, capsys):
    from seqdiff.quickstart import QUICKSTART

    fake_child(monkeypatch, 30)
    child = side_by_side.ChildRun(QUICKSTART, tmp_path / "ar", resume=False, threads=1, log=tmp_path / "ar.log")
    watch = side_by_side.ChildWatch(child, "mdlm")
    trainer = SimpleNamespace(progress_bar_callback=None)
    watch.on_train_batch_end(trainer, None, None, None, 0)
    child.process.kill()
    child.process.wait()
    for _ in range(2):  # said once, at the next step of the run in this process
        watch.on_train_batch_end(trainer, None, None, None, 0)
    err = capsys.readouterr().err
    killed = f"training {tmp_path / 'ar'} in a second process was killed by SIGKILL; the same command trains it again"
    assert err.count(killed) == 1 and "mdlm goes on training" in err
    with pytest.raises(RunError) as e:
        child.check(child.wait())
    assert str(e.value).startswith(killed) and "\n" not in str(e.value)  # no log lines: they would not say why


def test_the_run_left_takes_the_threads_of_the_second_process_once_it_has_ended(tmp_path, monkeypatch):
    """Two runs rarely end together: MDLM's last steps train on every thread once AR's process has finished (or
    failed: its core is free either way); the report says from which step."""
    import seqdiff.quickstart as qs

    fake_child(monkeypatch, 30)
    child = side_by_side.ChildRun(qs.QUICKSTART, tmp_path / "ar", resume=False, threads=1, log=tmp_path / "ar.log")
    watch = side_by_side.ChildWatch(child, "mdlm", threads=2)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        watch.on_train_batch_end(SimpleNamespace(global_step=5, progress_bar_callback=None), None, None, None, 0)
        assert torch.get_num_threads() == 1 and watch.took_threads_at is None  # AR still trains
        child.stop()
        child.wait()
        for step in (6, 7):
            watch.on_train_batch_end(SimpleNamespace(global_step=step, progress_bar_callback=None), None, None, None, 0)
        assert torch.get_num_threads() == 2 and watch.took_threads_at == 6
    finally:
        torch.set_num_threads(threads)

    configs, run_dirs, root = quickstart_runs(tmp_path)
    fake_child(monkeypatch, 0)  # AR ends at once: MDLM, "training" 3 steps after it, takes its thread

    def train_or_reuse(config, run_dir, *callbacks):
        watch = next(c for c in callbacks if isinstance(c, side_by_side.ChildWatch))
        watch.child.process.wait()
        for step in (1, 2, 3):
            watch.on_train_batch_end(SimpleNamespace(global_step=step, progress_bar_callback=None), None, None, None,
                                     0)
            seen.append(torch.get_num_threads())
        return "new"

    seen = []
    monkeypatch.setattr(qs, "_train_or_reuse", train_or_reuse)
    torch.set_num_threads(2)
    try:
        report = qs._train_models(configs, run_dirs, root, sequential=False)
        assert torch.get_num_threads() == 2  # given back after training, as before
    finally:
        torch.set_num_threads(threads)
    assert seen == [2, 2, 2]
    assert report == {"side_by_side": True, "threads": {"mdlm": 1, "ar": 1},
                      "more_threads": {"mdlm": {"threads": 2, "from_step": 1}}}
    assert ("(torch threads: MDLM 1, AR 1; MDLM took 2 from step 1, once the other had finished)"
            in qs._training_sentence(report))


def test_the_second_process_takes_the_threads_offered_once_this_one_only_waits(tmp_path, monkeypatch):
    """The other way round: MDLM ended first and was scored, so this process only waits; AR's process (ThreadOffer
    in it) takes every thread from its next step, once, and the report says from which."""
    import seqdiff.quickstart as qs

    fake_child(monkeypatch, 30)
    log = tmp_path / "ar.log"
    (tmp_path / "ar.threads_taken").write_text('{"threads": 9, "from_step": 1}')  # an earlier try's: not this one's
    child = side_by_side.ChildRun(qs.QUICKSTART, tmp_path / "ar", resume=False, threads=1, log=log)
    assert child.took_threads() is None
    assert child.offer == tmp_path / "ar.threads"
    offer = side_by_side.ThreadOffer(child.offer)  # what the child's run has among its callbacks
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        offer.on_train_batch_end(SimpleNamespace(global_step=4), None, None, None, 0)
        assert torch.get_num_threads() == 1 and offer.took_threads_at is None  # MDLM still trains
        child.offer_threads(2)
        for step in (5, 6):
            offer.on_train_batch_end(SimpleNamespace(global_step=step), None, None, None, 0)
        assert torch.get_num_threads() == 2 and offer.took_threads_at == 5
        assert child.took_threads() == (2, 5)
    finally:
        torch.set_num_threads(threads)
        child.stop()
        child.wait()
    side_by_side.ThreadOffer(None).on_train_batch_end(SimpleNamespace(global_step=1), None, None, None, 0)  # a
    # child started by an older parent, with no offer file: nothing to read

    configs, run_dirs, root = quickstart_runs(tmp_path / "qs")
    fake_child(monkeypatch, 5)  # AR trains on after MDLM ended: it takes this process's thread, at its step 7

    def train_or_reuse(config, run_dir, *callbacks):
        watch = next(c for c in callbacks if isinstance(c, side_by_side.ChildWatch))
        taken = side_by_side.ThreadOffer(watch.child.offer)

        def ar_step():  # as AR's process does at its step 7, a moment after the offer (here: another thread)
            deadline = time.monotonic() + 4
            while not watch.child.offer.is_file() and time.monotonic() < deadline:
                time.sleep(0.05)
            taken.on_train_batch_end(SimpleNamespace(global_step=7), None, None, None, 0)

        timers.append((threading.Thread(target=ar_step), taken))
        timers[-1][0].start()
        return "new"

    timers = []
    monkeypatch.setattr(qs, "_train_or_reuse", train_or_reuse)
    torch.set_num_threads(2)
    try:
        report = qs._train_models(configs, run_dirs, root, sequential=False)
        timers[0][0].join()
    finally:
        torch.set_num_threads(threads)
    assert timers[0][1].took_threads_at == 7
    assert not (root / "ar.threads").exists() and not (root / "ar.threads_taken").exists()  # recorded, then removed
    assert report == {"side_by_side": True, "threads": {"mdlm": 1, "ar": 1},
                      "more_threads": {"ar": {"threads": 2, "from_step": 7}}}
    assert ("(torch threads: MDLM 1, AR 1; AR took 2 from step 7, once the other had finished)"
            in qs._training_sentence(report))


def test_a_second_signal_that_ends_this_process_at_once_stops_the_second_process_with_a_checkpoint(
        tmp_path, monkeypatch, capsys):
    from seqdiff.quickstart import QUICKSTART
    from seqdiff.training.guards import SignalGuard

    fake_child(monkeypatch, 30)
    child = side_by_side.ChildRun(QUICKSTART, tmp_path / "ar", resume=False, threads=1, log=tmp_path / "ar.log")
    guard = SignalGuard()
    side_by_side.ChildWatch(child, "mdlm").on_train_start(SimpleNamespace(checkpoint_callback=SimpleNamespace(
        guard=guard)), None)
    for cleanup in guard.at_hard_exit:  # what the guard runs before its os._exit
        cleanup()
    assert child.process.wait(timeout=30) == side_by_side.INTERRUPTED
    err = capsys.readouterr().err
    assert f"{tmp_path / 'ar'} (the second process) stops at its next step, with a checkpoint" in err


def test_how_runs_trained_is_kept_for_a_report_made_from_reused_runs(tmp_path, monkeypatch, two_threads):
    import seqdiff.quickstart as qs

    configs, run_dirs, root = quickstart_runs(tmp_path)
    fake_child(monkeypatch, 0)  # AR "trains" at once
    steps = {"mdlm": 0, "ar": 0}
    monkeypatch.setattr(qs, "_steps_done", lambda run_dir: steps[run_dir.name] or None)
    monkeypatch.setattr(qs, "_train_or_reuse", lambda config, run_dir, *callbacks: "new")
    side_by_side_report = {"side_by_side": True, "threads": {"mdlm": 1, "ar": 1}}
    assert qs._train_models(configs, run_dirs, root, sequential=False) == side_by_side_report
    steps.update(mdlm=configs["mdlm"].train.max_steps, ar=configs["ar"].train.max_steps)
    monkeypatch.setattr(qs, "_train_or_reuse", lambda config, run_dir, *callbacks: "done")
    assert qs._train_models(configs, run_dirs, root, sequential=False) == side_by_side_report  # reused, as trained
    # AR finished alone after MDLM's side-by-side training (its second process was stopped): partly side by side
    steps.update(ar=30)
    monkeypatch.setattr(qs, "_train_or_reuse", lambda config, run_dir, *c: {"ar": "partial"}.get(run_dir.name, "done"))
    partly = qs._train_models(configs, run_dirs, root, sequential=False)
    assert partly == {"side_by_side": "partly", "threads": {"mdlm": 1, "ar": 2}}
    assert "Part of the training ran side by side" in qs._training_sentence(partly)


def test_out_and_run_dir_are_checked_before_any_training(tmp_path, monkeypatch):
    import seqdiff.quickstart as qs
    from seqdiff.safe_io import WriteError

    monkeypatch.setattr(qs, "_train_models", lambda *a: pytest.fail("trained before the folders were checked"))
    (tmp_path / "file").write_text("")
    with pytest.raises(WriteError, match=f"--out {tmp_path / 'file' / 'out'}: {tmp_path / 'file'} is a file"):
        qs.run_quickstart(out_dir=tmp_path / "file" / "out", run_root=tmp_path / "runs")
    with pytest.raises(WriteError, match=f"--run-dir {tmp_path / 'file'} is a file, not a folder"):
        qs.run_quickstart(out_dir=tmp_path / "out", run_root=tmp_path / "file", overwrite=True)
    assert (tmp_path / "file").is_file()
    monkeypatch.setattr(os, "access", lambda path, mode: False)
    with pytest.raises(WriteError, match=f"--out {tmp_path / 'out'}: {tmp_path} is not writable"):
        qs.run_quickstart(out_dir=tmp_path / "out", run_root=tmp_path / "runs")


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
    training = results["training"]
    assert (training["side_by_side"], training["threads"]) == (True, {"mdlm": 1, "ar": 1})
    assert training.get("more_threads", {}).get("mdlm", {"threads": 2})["threads"] == 2  # if AR ended first
    assert all(r["steps"] == 40 for r in results["models"].values())
    assert "The two models trained side by side, in two processes at the same time" in (out / "summary.md").read_text()
    log = (runs / "ar.log").read_text()  # both tries' output, the interrupted one first
    assert log.index("SIGINT at step") < log.index("`Trainer.fit` stopped: `max_steps=40` reached")
    assert log.count(f": resuming {runs / 'ar'} ---\n") == 1 and "litlogger" not in log  # each try headed; no ads


def test_mdlm_is_scored_while_the_second_process_trains_and_a_stop_then_stops_both(tmp_path, monkeypatch, capsys,
                                                                                  two_threads):
    """The quickstart's work on MDLM's finished run (evaluation, samples, the n-gram) runs while AR still trains in
    its process, on this process's thread share; Ctrl-C during it stops AR with a checkpoint, as during training."""
    import seqdiff.quickstart as qs

    configs, run_dirs, root = quickstart_runs(tmp_path)
    done = tmp_path / "ar_finished"
    child = ("import signal, sys, time\n"
             "for s in (signal.SIGINT, signal.SIGTERM): signal.signal(s, lambda *a: sys.exit(3))\n"
             "signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})\n"
             f"time.sleep(3)\nopen({str(done)!r}, 'w').close()\n")
    monkeypatch.setattr(side_by_side.ChildRun, "command", staticmethod(lambda *args: [sys.executable, "-c", child]))
    monkeypatch.setattr(qs, "_train_or_reuse", lambda config, run_dir, *callbacks: "new")
    seen = []

    def task():  # the first runs during AR's training, the second after it: left to the caller
        seen.append((done.exists(), torch.get_num_threads()))
        time.sleep(4.5)

    qs._train_models(configs, run_dirs, root, sequential=False, while_waiting=(task, task))
    assert seen == [(False, 1)] and done.exists()  # during AR's training, on one of the two threads; then waited
    assert "[quickstart] mdlm finished; scoring it while ar trains in the second process" in capsys.readouterr().err

    done.unlink()
    monkeypatch.setattr(qs, "_steps_done", lambda run_dir: {"mdlm": 10, "ar": 4}[run_dir.name])

    def ctrl_c():
        raise KeyboardInterrupt

    with pytest.raises(TrainingInterrupted) as e:
        qs._train_models(configs, run_dirs, root, sequential=False, while_waiting=(ctrl_c,))
    assert (e.value.step, e.value.run_dir) == (4, run_dirs["ar"]) and not done.exists()  # AR stopped, not finished
    assert torch.get_num_threads() == 2
