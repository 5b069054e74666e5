"""The spare second process (seqdiff.training.spare): started before the quickstart's imports, it trains AR's run
when handed it, exits when dismissed or when its parent is gone, and reports its own import errors in the run's log."""

import json
import os
import subprocess
import sys
import time
from dataclasses import replace

import pytest

from seqdiff.cli import _process_start, main
from seqdiff.training import side_by_side
from seqdiff.training.guards import RunError
from seqdiff.training.spare import PROGRAM, SpareProcess, package_root


def ended(pid: int) -> bool:
    """A process that is gone or a zombie (a reparented one may wait for a reaper that never comes)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_a_dismissed_spare_ends_without_writing_anything(tmp_path):
    spare = SpareProcess.start()
    spare.dismiss()
    assert spare.process.returncode is not None
    spare.dismiss()  # twice is harmless
    assert spare.hand(["unused"], tmp_path / "log") is None  # a dismissed spare takes no run
    assert not (tmp_path / "log").exists()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_spare_whose_parent_is_gone_exits_once_it_has_imported(tmp_path):
    program = ("import os, sys; from seqdiff.training.spare import SpareProcess\n"
               "spare = SpareProcess.start(); print(spare.process.pid, flush=True); os._exit(0)\n")
    out = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60, check=True)
    pid = int(out.stdout)
    deadline = time.monotonic() + 120  # its imports (torch, Lightning) come first
    while not ended(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert ended(pid)


def test_a_spare_that_cannot_import_says_why_in_the_runs_log(tmp_path):
    """As a fresh process would: the traceback in the log, exit status 1, the log's tail in the error."""
    program = "import sys; sys.modules['seqdiff.training.side_by_side'] = None\n" + PROGRAM.format(root=package_root())
    log = tmp_path / "ar.log"
    log.write_text("--- header ---\n")
    job = json.dumps({"argv": ["unused"], "log": str(log)}) + "\n"
    done = subprocess.run([sys.executable, "-c", program], input=job, capture_output=True, text=True, timeout=60,
                          cwd=package_root())
    assert done.returncode == 1 and done.stdout == done.stderr == ""  # everything went to the log
    text = log.read_text()
    assert text.startswith("--- header ---\n") and "ModuleNotFoundError" in text and "side_by_side" in text


def test_a_spare_trains_the_run_it_is_handed(tmp_path):
    """The same run a fresh process trains: its output in the log after the header, exit status 0."""
    from seqdiff.quickstart import QUICKSTART

    train = replace(QUICKSTART.train, max_steps=2, warmup_steps=1, val_every=2, val_batches=1, log_every=1,
                    checkpoint_every=2, progress_bar=False)
    config = replace(QUICKSTART, name="spare-ar", method=replace(QUICKSTART.method, name="ar"), train=train)
    spare = SpareProcess.start()
    try:
        child = side_by_side.ChildRun(config, tmp_path / "ar", resume=False, threads=1, log=tmp_path / "ar.log",
                                      spare=spare)
        assert child.process is spare.process
        status = child.wait()
        child.check(status)
    finally:
        spare.dismiss()  # harmless once handed
    assert status == 0 and (tmp_path / "ar" / "checkpoints" / "last.ckpt").is_file()
    log = (tmp_path / "ar.log").read_text()
    assert log.startswith("--- ") and "`Trainer.fit` stopped: `max_steps=2` reached" in log


def test_a_spare_that_has_ended_is_replaced_by_a_fresh_process(tmp_path, monkeypatch):
    from seqdiff.quickstart import QUICKSTART

    spare = SpareProcess.start()
    spare.process.kill()
    spare.process.wait()
    monkeypatch.setattr(side_by_side.ChildRun, "command",
                        staticmethod(lambda *args: [sys.executable, "-c", "print('fresh')"]))
    child = side_by_side.ChildRun(QUICKSTART, tmp_path / "ar", resume=False, threads=1, log=tmp_path / "ar.log",
                                  spare=spare)
    assert child.process is not spare.process and child.wait() == 0
    assert (tmp_path / "ar.log").read_text().endswith("fresh\n")


def test_the_quickstart_dismisses_a_spare_it_does_not_use(tmp_path, monkeypatch):
    """--sequential starts none; a quickstart whose runs train one after the other dismisses it before training."""
    import seqdiff.quickstart as qs

    started = []
    monkeypatch.setattr(SpareProcess, "start", classmethod(lambda cls: started.append(FakeSpare()) or started[-1]))
    monkeypatch.setattr(qs, "_train_or_reuse", lambda config, run_dir, *callbacks: pytest.fail("trained"))
    (tmp_path / "out").write_text("a file where the report folder goes\n")
    args = ["quickstart", "--out", str(tmp_path / "out"), "--run-dir", str(tmp_path / "runs")]
    assert main(args + ["--sequential"]) == 2
    assert started == []
    assert main(args) == 2  # refused before training: dismissed
    assert [s.dismissed for s in started] == ([True] if len(os.sched_getaffinity(0)) >= 2 else [])

    configs = {m: replace(qs.QUICKSTART, name=f"quickstart-{m}", method=replace(qs.QUICKSTART.method, name=m))
               for m in qs.METHODS}
    spare = FakeSpare()

    def train_or_reuse(config, run_dir, *callbacks):
        assert spare.dismissed, "trained before the spare was dismissed"
        return "new"

    monkeypatch.setattr(qs, "_train_or_reuse", train_or_reuse)
    qs._train_models(configs, {m: tmp_path / "runs" / m for m in qs.METHODS}, tmp_path / "runs", sequential=True,
                     spare=spare)
    assert spare.dismissed


class FakeSpare:
    def __init__(self) -> None:
        self.dismissed = False

    def hand(self, argv, log):
        raise AssertionError("handed a run")

    def dismiss(self) -> None:
        self.dismissed = True


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_the_process_start_is_found_and_counts_the_imports():
    program = ("import time; time.sleep(1.5); from seqdiff.cli import _process_start; import time\n"
               "print(time.perf_counter() - _process_start())\n")
    age = float(subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60,
                               check=True).stdout)
    assert 1.5 <= age < 30
    assert _process_start() <= time.perf_counter()


def test_a_failing_spare_run_is_reported_as_a_fresh_ones(tmp_path):
    from seqdiff.quickstart import QUICKSTART

    data = replace(QUICKSTART.data, train_file=str(tmp_path / "missing.txt"), valid_file=str(tmp_path / "missing.txt"))
    spare = SpareProcess.start()
    child = side_by_side.ChildRun(replace(QUICKSTART, data=data), tmp_path / "run", resume=False, threads=1,
                                  log=tmp_path / "child.log", spare=spare)
    status = child.wait()
    with pytest.raises(RunError, match="missing.txt") as e:
        child.check(status)
    assert status == 1 and "failed (exit status 1)" in str(e.value)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_the_quickstarts_clock_starts_with_the_process_on_the_command_line_and_with_the_call_otherwise(monkeypatch):
    import seqdiff.quickstart as qs

    calls = []
    monkeypatch.setattr(qs, "run_quickstart", lambda **kwargs: calls.append(kwargs) or {})
    monkeypatch.setattr(SpareProcess, "start", classmethod(lambda cls: FakeSpare()))
    monkeypatch.setattr(sys, "argv", ["seqdiff", "quickstart", "--sequential"])
    assert main() == 0  # the `seqdiff` program: from this process's start, seconds ago (pytest's imports)
    assert main(["quickstart", "--sequential"]) == 0  # called from Python: from this call
    now = time.perf_counter()
    assert now - calls[0]["started"] > 1.0 and now - calls[1]["started"] < 1.0
    assert qs._start_sentence({"seconds_before_call": 7.2}) == (" from the command's start, 7 s of it starting Python "
                                                                "and importing")
    assert qs._start_sentence({"seconds_before_call": 0.03}) == qs._start_sentence({}) == ""  # from Python
