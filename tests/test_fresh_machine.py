"""The suite runs as on a fresh machine: its own HOME and data directory, real sources fetched on demand."""

import os
from pathlib import Path

import pytest

from seqdiff.data.fetch import data_dir
from tests.conftest import SESSION_ROOT, fetch_source, real_home


def test_home_and_data_directory_belong_to_the_test_session():
    assert Path.home() == SESSION_ROOT / "home"
    if os.environ.get("SEQDIFF_TEST_DATA") is None:
        assert data_dir().is_relative_to(SESSION_ROOT)
    if real_home():
        assert not data_dir().is_relative_to(Path(real_home()) / ".cache")


def test_a_failed_fetch_skips_with_the_fetch_error_as_reason():
    with pytest.raises(pytest.skip.Exception, match=r"'no-such-source' could not be fetched: unknown data source"):
        fetch_source("no-such-source")
    with pytest.raises(pytest.skip.Exception, match="could not be fetched"):  # remembered: not fetched twice
        fetch_source("no-such-source")
