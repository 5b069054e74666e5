"""Test-wide settings.

- A fresh machine by construction. Before any test module imports seqdiff, `HOME`, `SEQDIFF_DATA` and the
  Hugging Face caches point at folders made for this test session, so no test reads the user's home
  directory or a data cache that only a warm machine has (a green run then means a fresh machine passes).
- Real data the way a user gets it: a test that needs a real source says so with
  `@pytest.mark.requires_source("splice-junctions", ...)`; the first such test fetches each source once,
  with the project's own `seqdiff.data.fetch.fetch`, into the session's data directory. The package
  registries are reachable wherever the suite runs, so these tests run everywhere; only when a fetch itself
  fails are they skipped, with the fetch's own one-line error as the reason.
- `SEQDIFF_TEST_DATA=/some/folder pytest` keeps the fetched sources between sessions (a developer's choice
  for quick iterations; CI leaves it unset, so every CI run fetches afresh).
- Tiny models run fastest on one thread (several threads on busy shared cores wait on each other far longer
  than the work takes), so the suite runs its tests side by side instead: pytest-xdist, one process per core
  (`-n auto` in pyproject.toml, at most MAX_WORKERS; `pytest -n 0` runs them in this process, one by one).
  Each worker is its own session here (its own HOME and data directory, its own fetches); a shared
  `SEQDIFF_TEST_DATA` folder is fetched into under a file lock.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import signal
import tempfile
import threading
from pathlib import Path

import pytest

# ------------------------------------------------------------------- the session's own home and data folders
_REAL_HOME = os.environ.get("HOME")
SESSION_ROOT = Path(tempfile.mkdtemp(prefix="seqdiff-tests-"))
SESSION_HOME = SESSION_ROOT / "home"
SESSION_HOME.mkdir()
os.environ["HOME"] = str(SESSION_HOME)
os.environ["SEQDIFF_DATA"] = os.environ.get("SEQDIFF_TEST_DATA") or str(SESSION_ROOT / "data")
for _var in ("HF_HOME", "HF_DATASETS_CACHE", "HF_HUB_CACHE", "TRANSFORMERS_CACHE", "XDG_CACHE_HOME",
             "WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "MPLCONFIGDIR"):
    os.environ[_var] = str(SESSION_HOME / ".cache" / _var.lower())

import torch  # noqa: E402  (after the environment above, so nothing caches the real home first)

torch.set_num_threads(1)


MAX_WORKERS = 4
"""`-n auto` takes one worker per core up to this: every worker imports torch and fetches the real sources anew."""


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()  # macOS: no affinity
    return max(1, min(MAX_WORKERS, cores or 1))


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "requires_source(*names): the test needs these real data sources; they are fetched once per "
                   "session with seqdiff's own fetch (the test is skipped only when a fetch fails)")


def pytest_unconfigure(config: pytest.Config) -> None:
    shutil.rmtree(SESSION_ROOT, ignore_errors=True)


# ------------------------------------------------------------------- real data sources, fetched once
_FETCHED: dict[str, Path | str] = {}
"""source name -> its folder, or the one-line error of the failed fetch (so a failing fetch is tried once)."""


def fetch_source(name: str) -> Path:
    """The folder of source `name`, fetched on first use; skips the calling test when the fetch fails."""
    from seqdiff.data.fetch import FetchError, fetch

    if name not in _FETCHED:
        data = os.path.realpath(os.environ["SEQDIFF_DATA"])  # workers sharing SEQDIFF_TEST_DATA fetch one at a time
        key = hashlib.sha256(data.encode()).hexdigest()[:16]
        with open(Path(tempfile.gettempdir()) / f"seqdiff-tests-fetch-{key}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                _FETCHED[name] = fetch(name, log=lambda line: None)
            except FetchError as e:
                _FETCHED[name] = f"data source {name!r} could not be fetched: {e}"
    got = _FETCHED[name]
    if isinstance(got, str):
        pytest.skip(got)
    return got


@pytest.fixture(autouse=True)
def _required_sources(request: pytest.FixtureRequest) -> None:
    for marker in request.node.iter_markers("requires_source"):
        for name in marker.args:
            fetch_source(name)


DISTRIBUTED_ENV = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK", "NODE_RANK", "GROUP_RANK",
                   "LOCAL_WORLD_SIZE", "PL_GLOBAL_SEED", "PL_SEED_WORKERS")


@pytest.fixture(autouse=True)
def _no_distributed_env_leaks():
    """An in-process run under a distributed strategy (fsdp2 on one device, say) leaves Lightning's MASTER_PORT and
    ranks in os.environ; a later test's multi-process subprocess would inherit them and try to listen on a port
    this process may still hold (EADDRINUSE). Each test ends with the variables it started with."""
    before = {k: os.environ.get(k) for k in DISTRIBUTED_ENV}
    yield
    for k, v in before.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture(autouse=True)
def _ctrl_c_raises():
    """Every test starts with Python's own SIGINT handler (Ctrl-C raises KeyboardInterrupt), as under an interactive
    shell: a test run that a non-interactive shell started in the background (`cmd &`, nohup) inherits SIGINT
    ignored, Python then installs no handler, and a test that raises SIGINT to check what a Ctrl-C does saw nothing
    happen. The handler in place before is put back after the test."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@pytest.fixture
def one_process_group(tmp_path):
    """A gloo group of one process through a file store (no port to pick), torn down afterwards; or the one-process
    group an earlier in-process fsdp2 run of this test process left (Lightning does not destroy it)."""
    import torch.distributed as dist

    if dist.is_initialized():
        assert dist.get_world_size() == 1
        yield
        return
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.fixture
def data_source():
    """`data_source("bert-vocab")` -> the fetched folder (the test should also carry requires_source)."""
    return fetch_source


@pytest.fixture
def refused(capsys):
    """`refused(argv)`: `seqdiff argv` must exit 2 with one error line and no traceback; returns that line."""
    from seqdiff.cli import main

    def run(argv: list[str]) -> str:
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("error:") == 1 and "Traceback" not in err, err
        return err.strip().splitlines()[-1]

    return run


def real_home() -> str | None:
    """The HOME this session replaced (for tests that check that nothing is written there)."""
    return _REAL_HOME
