"""One base class for user errors: only a SeqdiffError becomes a one-line message; a bug keeps its traceback."""

import pytest

from seqdiff import cli
from seqdiff.checkpoint import CheckpointError
from seqdiff.config import ConfigError
from seqdiff.data.fetch import FetchError
from seqdiff.errors import SeqdiffError
from seqdiff.samplers import SamplerError
from seqdiff.tokenizers import TokenizerError


def test_every_user_error_class_is_a_seqdiff_error_and_still_a_value_error():
    for cls in (ConfigError, CheckpointError, FetchError, SamplerError, TokenizerError):
        assert issubclass(cls, SeqdiffError) and issubclass(cls, ValueError)


def test_a_user_error_is_one_line_and_a_bug_keeps_its_traceback(monkeypatch, capsys):
    def user_error(args):
        raise ConfigError("model.width=3 is not a key; did you mean model.hidden_size?")

    def bug(args):
        raise ValueError("an internal shape mismatch")

    monkeypatch.setattr(cli, "cmd_config", user_error)
    assert cli.main(["config"]) == 2
    assert capsys.readouterr().err == ("seqdiff config: error: model.width=3 is not a key; did you mean "
                                       "model.hidden_size?\n")
    monkeypatch.setattr(cli, "cmd_config", bug)
    with pytest.raises(ValueError, match="internal shape mismatch"):
        cli.main(["config"])
