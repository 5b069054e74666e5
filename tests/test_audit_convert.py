"""`python -m seqdiff.hf.convert_mdlm` as a new user meets it: every mistake is one line and exit 2, said
before the weights are read, and a converted model is what `seqdiff sample` / `eval` accept."""

import torch

from seqdiff.checkpoint import load_checkpoint
from seqdiff.hf.convert_mdlm import main
from tests.test_convert_mdlm import mdlm_state_dict


def _converted_input(tmp_path):
    src = tmp_path / "mdlm.pt"
    torch.save(mdlm_state_dict(V=31), src)  # the character tokenizer's 31 ids, [MASK] last
    return src


def _one_error_line(capsys):
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    return err


def test_an_out_dir_that_cannot_be_created_is_one_line(tmp_path, capsys):
    src = _converted_input(tmp_path)
    # its parent is a file: the operating system's refusal is a user error, not a traceback
    assert main([str(src), str(src / "out"), "--tokenizer", "char", "--max-seq-len", "32"]) == 2
    assert "mdlm.pt" in _one_error_line(capsys)


def test_the_out_dir_is_checked_before_the_weights_are_read(tmp_path, capsys, monkeypatch):
    import seqdiff.hf.convert_mdlm as convert

    src = _converted_input(tmp_path)
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "notes.txt").write_text("mine")

    def never(*args, **kwargs):
        raise AssertionError("the weights were read before the output directory was checked")

    monkeypatch.setattr(convert, "load_state_dict_file", never)
    assert main([str(src), str(tmp_path / "taken"), "--tokenizer", "char"]) == 2
    assert "taken already exists" in _one_error_line(capsys)
    # the folder that holds the input is not an output, with or without --overwrite
    assert main([str(src), str(tmp_path), "--tokenizer", "char", "--overwrite"]) == 2
    assert "mdlm.pt" in _one_error_line(capsys)
    assert (tmp_path / "taken" / "notes.txt").read_text() == "mine" and src.is_file()


def test_a_folder_given_as_the_input_names_the_files_to_pass(tmp_path, capsys):
    folder = tmp_path / "mdlm-owt"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"")
    assert main([str(folder), str(tmp_path / "out"), "--tokenizer", "char"]) == 2
    err = _one_error_line(capsys)
    assert "is a directory" in err and "model.safetensors" in err
    assert not (tmp_path / "out").exists()


def test_max_seq_len_must_be_positive(tmp_path, capsys):
    src = _converted_input(tmp_path)
    for bad in ("0", "-5"):
        try:
            code = main([str(src), str(tmp_path / "out"), "--tokenizer", "char", "--max-seq-len", bad])
        except SystemExit as e:  # argparse's own refusal
            code = e.code
        assert code == 2 and "--max-seq-len" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
    assert main([str(src), str(tmp_path / "out"), "--tokenizer", "char", "--max-seq-len", "32"]) == 0
    assert load_checkpoint(tmp_path / "out").seq_len == 32


def test_a_missing_gpt2_vocabulary_names_the_converters_option(tmp_path, capsys):
    src = _converted_input(tmp_path)
    assert main([str(src), str(tmp_path / "out"), "--vocab-dir", str(tmp_path / "none")]) == 2
    err = _one_error_line(capsys)
    assert "--vocab-dir" in err and "data.tokenizer_options" not in err


def test_a_truncated_file_says_so(tmp_path, capsys):
    src = _converted_input(tmp_path)
    (tmp_path / "cut.pt").write_bytes(src.read_bytes()[:2000])
    assert main([str(tmp_path / "cut.pt"), str(tmp_path / "out"), "--tokenizer", "char"]) == 2
    assert "truncated" in _one_error_line(capsys)
    assert not (tmp_path / "out").exists()
