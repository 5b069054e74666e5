"""Reading text corpora from disk, and the Shakespeare slice shipped with the package."""

from __future__ import annotations

import gzip
import hashlib
import json
import re
from pathlib import Path

import pytest

from seqdiff.data.text_files import (
    BUILTIN_CORPORA,
    DataFileError,
    corpus_split_path,
    load_manifest,
    read_text_file,
)

FIXTURE = Path(__file__).parent / "fixtures" / "shakespeare_tiny.txt"
SPLITS = ("train", "valid", "test")


def write_gz(path: Path, data: bytes) -> Path:
    path.write_bytes(gzip.compress(data, mtime=0))
    return path


# ---------------------------------------------------------------- reading files that are fine


def test_reads_txt_gz_and_jsonl(tmp_path):
    text = "To be, or not to be: that is the question.\nWhether 'tis nobler\n"
    (tmp_path / "a.txt").write_text(text, encoding="utf-8")
    write_gz(tmp_path / "a.txt.gz", text.encode("utf-8"))
    assert read_text_file(tmp_path / "a.txt") == text
    assert read_text_file(str(tmp_path / "a.txt.gz")) == text

    lines = [json.dumps({"text": "first doc", "id": 1}), "", json.dumps({"text": "second\ndoc"})]
    (tmp_path / "a.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert read_text_file(tmp_path / "a.jsonl") == "first doc\n\nsecond\ndoc"


def test_non_ascii_utf8_crlf_and_bom(tmp_path):
    (tmp_path / "u.txt").write_bytes("\ufeffcaf\u00e9\r\nna\u00efve\r\n".encode("utf-8"))
    assert read_text_file(tmp_path / "u.txt") == "caf\u00e9\nna\u00efve\n"


# ---------------------------------------------------------------- every error names the file


def assert_error(path: Path, *fragments: str) -> str:
    with pytest.raises(DataFileError) as info:
        read_text_file(path)
    message = str(info.value)
    assert str(path) in message
    for fragment in fragments:
        assert fragment in message, message
    return message


def test_data_file_error_is_a_value_error():
    assert issubclass(DataFileError, ValueError)


def test_missing_file(tmp_path):
    assert_error(tmp_path / "nope.txt", "no such file")


def test_directory(tmp_path):
    (tmp_path / "dir.txt").mkdir()
    assert_error(tmp_path / "dir.txt", "directory")
    (tmp_path / "corpus").mkdir()  # no suffix: still "a directory", not "an unsupported file type"
    assert_error(tmp_path / "corpus", "is a directory, not a file")


def test_a_binary_file_named_txt_is_refused_naming_the_nul_byte(tmp_path):
    """NUL bytes mark a binary file; read as text, normalization would make it a few spaces and a bits-per-
    character figure of nothing. Both readers (whole file, and streamed in blocks for the cache) refuse it."""
    from seqdiff.data.streaming import iter_text

    (tmp_path / "bin.txt").write_bytes(b"header" + bytes(100_000))
    assert_error(tmp_path / "bin.txt", "a NUL byte at byte offset 6 of the file: a binary file")
    write_gz(tmp_path / "bin.txt.gz", b"abc" + bytes(10))
    assert_error(tmp_path / "bin.txt.gz", "byte offset 3 of the decompressed text")
    with pytest.raises(DataFileError, match="a NUL byte at byte offset 6 of the file"):
        list(iter_text(tmp_path / "bin.txt", read_bytes=4))


@pytest.mark.parametrize("content", [b"", b"   \n\t\n  "])
def test_empty_or_whitespace_txt(tmp_path, content):
    (tmp_path / "e.txt").write_bytes(content)
    message = assert_error(tmp_path / "e.txt")
    assert "empty" in message or "whitespace" in message


@pytest.mark.parametrize("content", [b"", b"\n \n"])
def test_empty_gz_contents(tmp_path, content):
    write_gz(tmp_path / "e.txt.gz", content)
    message = assert_error(tmp_path / "e.txt.gz")
    assert "empty" in message or "whitespace" in message


def test_zero_byte_gz(tmp_path):
    (tmp_path / "z.txt.gz").write_bytes(b"")
    assert_error(tmp_path / "z.txt.gz", "empty")


def test_jsonl_with_only_empty_documents(tmp_path):
    (tmp_path / "e.jsonl").write_text('{"text": ""}\n{"text": "  "}\n', encoding="utf-8")
    assert_error(tmp_path / "e.jsonl", "no text")


def test_invalid_utf8_names_byte_offset(tmp_path):
    (tmp_path / "bad.txt").write_bytes(b"good text\xff more")
    assert_error(tmp_path / "bad.txt", "UTF-8", "byte offset 9")


def test_invalid_utf8_inside_gzip_names_offset(tmp_path):
    write_gz(tmp_path / "bad.txt.gz", "\u00e9t\u00e9 ".encode("utf-8") + b"\xc3(")
    assert_error(tmp_path / "bad.txt.gz", "UTF-8", "byte offset 6", "decompressed")


def test_truncated_gzip(tmp_path):
    data = gzip.compress(("All the world's a stage.\n" * 400).encode("utf-8"), mtime=0)
    (tmp_path / "cut.txt.gz").write_bytes(data[: len(data) // 2])
    assert_error(tmp_path / "cut.txt.gz", "truncated")


def test_not_gzip_at_all(tmp_path):
    (tmp_path / "plain.txt.gz").write_bytes(b"this was never compressed\n")
    assert_error(tmp_path / "plain.txt.gz", "corrupt gzip")


def test_gzip_with_damaged_body(tmp_path):
    data = bytearray(gzip.compress(("Now is the winter of our discontent\n" * 200).encode("utf-8"), mtime=0))
    for i in range(20, 40):
        data[i] ^= 0xFF
    (tmp_path / "damaged.txt.gz").write_bytes(bytes(data))
    assert_error(tmp_path / "damaged.txt.gz", "gzip")


def test_jsonl_line_not_json(tmp_path):
    (tmp_path / "d.jsonl").write_text('{"text": "ok"}\n\n{"text": broken}\n', encoding="utf-8")
    message = assert_error(tmp_path / "d.jsonl", "line 3", "not valid JSON")
    assert "at at" not in message and ", column 10" in message


def test_jsonl_line_without_text_key(tmp_path):
    (tmp_path / "d.jsonl").write_text('{"text": "ok"}\n{"body": "no"}\n', encoding="utf-8")
    assert_error(tmp_path / "d.jsonl", "line 2", "'text'")


def test_jsonl_line_not_an_object(tmp_path):
    (tmp_path / "d.jsonl").write_text('["text"]\n', encoding="utf-8")
    assert_error(tmp_path / "d.jsonl", "line 1", "'text'")


def test_jsonl_text_not_a_string(tmp_path):
    (tmp_path / "d.jsonl").write_text('{"text": "a"}\n{"text": 3}\n', encoding="utf-8")
    assert_error(tmp_path / "d.jsonl", "line 2", "not a string")


def test_unsupported_extension(tmp_path):
    (tmp_path / "data.csv").write_text("a,b\n", encoding="utf-8")
    assert_error(tmp_path / "data.csv", "unsupported", ".txt.gz")


# ---------------------------------------------------------------- resolving a corpus split


def test_builtin_corpus_paths():
    assert set(BUILTIN_CORPORA) == {"shakespeare"}
    for split in SPLITS:
        path = corpus_split_path("shakespeare", split)
        assert path == BUILTIN_CORPORA["shakespeare"] / f"{split}.txt.gz"
        assert path.is_file()


def test_builtin_corpus_unknown_split():
    with pytest.raises(DataFileError, match="no split 'dev'"):
        corpus_split_path("shakespeare", "dev")


@pytest.mark.parametrize("name", ["train.txt", "train.txt.gz", "train.jsonl"])
def test_user_folder_each_file_kind(tmp_path, name):
    path = tmp_path / name
    if name.endswith(".gz"):
        write_gz(path, b"hello\n")
    elif name.endswith(".jsonl"):
        path.write_text('{"text": "hello"}\n', encoding="utf-8")
    else:
        path.write_text("hello\n", encoding="utf-8")
    assert corpus_split_path(str(tmp_path), "train") == path
    assert corpus_split_path(tmp_path, "train") == path
    assert read_text_file(corpus_split_path(tmp_path, "train")).strip() == "hello"


def test_user_folder_without_the_split(tmp_path):
    (tmp_path / "train.txt").write_text("hello\n", encoding="utf-8")
    with pytest.raises(DataFileError) as info:
        corpus_split_path(tmp_path, "valid")
    message = str(info.value)
    for fragment in (str(tmp_path), "valid.txt", "valid.txt.gz", "valid.jsonl", "shakespeare"):
        assert fragment in message, message


def test_user_folder_with_two_files_for_one_split(tmp_path):
    (tmp_path / "train.txt").write_text("a\n", encoding="utf-8")
    (tmp_path / "train.jsonl").write_text('{"text": "a"}\n', encoding="utf-8")
    with pytest.raises(DataFileError, match="several files"):
        corpus_split_path(tmp_path, "train")


@pytest.mark.parametrize("make_file", [False, True])
def test_neither_builtin_nor_folder(tmp_path, make_file):
    target = tmp_path / "shakespear"
    if make_file:
        target.write_text("x", encoding="utf-8")
    with pytest.raises(DataFileError) as info:
        corpus_split_path(str(target), "train")
    message = str(info.value)
    for fragment in ("shakespear", "shakespeare", "train.txt", "train.txt.gz", "train.jsonl"):
        assert fragment in message, message


@pytest.mark.parametrize("split", ["", "../train", ".hidden"])
def test_bad_split_name(tmp_path, split):
    with pytest.raises(DataFileError, match="not a valid split name"):
        corpus_split_path(tmp_path, split)


def test_load_manifest_unknown_name():
    with pytest.raises(DataFileError, match="shakespeare"):
        load_manifest("austen")


# ---------------------------------------------------------------- the packaged Shakespeare slice

BOILERPLATE = re.compile(
    r"gutenberg|\*\*\*\s*(start|end)|\*end\*|\bebooks?\b|\betexts?\b|small print|https?://|www\.|"
    r"by william shakespeare",
    re.IGNORECASE,
)


@pytest.fixture(scope="module")
def shakespeare():
    return {split: read_text_file(corpus_split_path("shakespeare", split)) for split in SPLITS}


@pytest.fixture(scope="module")
def manifest():
    return load_manifest("shakespeare")


def test_shakespeare_splits_load_and_are_sized(shakespeare, manifest):
    assert 1_000_000 <= len(shakespeare["train"]) <= 1_300_000
    for split in ("valid", "test"):
        assert 100_000 <= len(shakespeare[split]) <= 150_000
    for split in SPLITS:
        assert len(shakespeare[split]) == manifest["splits"][split]["characters"]
    assert "ROMEO" in shakespeare["test"] and "Juliet" in shakespeare["test"]


def test_shakespeare_has_no_boilerplate(shakespeare):
    for split, text in shakespeare.items():
        match = BOILERPLATE.search(text)
        assert match is None, f"{split}: {match.group(0)!r} at {match.start()}"
        assert "\r" not in text
        assert "\n\n\n" not in text
        assert not re.search(r"^THE END$", text, re.MULTILINE)


def test_shakespeare_splits_are_disjoint_whole_works(shakespeare, manifest):
    works = {split: [w["name"] for w in manifest["splits"][split]["works"]] for split in SPLITS}
    everything = [name for names in works.values() for name in names]
    assert len(everything) == len(set(everything)), works
    assert len(works["train"]) >= 5 and len(works["valid"]) == 1 and len(works["test"]) == 1
    for split in SPLITS:
        assert works[split] == sorted(works[split])
        info = manifest["splits"][split]["works"]
        # Works joined by one blank line, text ends with a newline: the sizes add up exactly.
        assert sum(w["characters"] for w in info) + 2 * (len(info) - 1) + 1 == len(shakespeare[split])
    # No passage of one split turns up in another: sample runs of three lines across each split.
    checked = 0
    for split, text in shakespeare.items():
        lines = [line for line in text.split("\n") if line.strip()]
        for start in range(0, len(lines) - 3, 61):
            passage = "\n".join(lines[start : start + 3])
            if len(passage) < 100:
                continue
            checked += 1
            for other in SPLITS:
                if other != split:
                    assert passage not in shakespeare[other], (split, other, passage)
    assert checked > 200


def test_shakespeare_manifest_sha256_matches_files(manifest):
    folder = BUILTIN_CORPORA["shakespeare"]
    assert re.fullmatch(r"[0-9a-f]{64}", manifest["source"]["sha256"])
    assert manifest["command"].startswith("python -m experiments.make_shakespeare_slice")
    total = 0
    for split in SPLITS:
        info = manifest["splits"][split]
        data = (folder / info["file"]).read_bytes()
        total += len(data)
        assert hashlib.sha256(data).hexdigest() == info["sha256"], split
        assert len(data) == info["gzip_bytes"]
        text = gzip.decompress(data)
        assert hashlib.sha256(text).hexdigest() == info["text_sha256"], split
        assert data[4:8] == b"\0\0\0\0", "gzip mtime must be 0 for reproducible files"
    assert total < 700_000


def test_tiny_fixture_is_the_start_of_the_test_split(shakespeare):
    tiny = FIXTURE.read_text(encoding="utf-8")
    assert 15_000 <= len(tiny) <= 25_000
    assert shakespeare["test"].startswith(tiny)
    assert read_text_file(FIXTURE) == tiny


# ---------------------------------------------------------------- the script that made the slice


def test_slice_script_rejects_unexpected_layouts():
    from experiments.make_shakespeare_slice import SPLITS as ASSIGNMENT
    from experiments.make_shakespeare_slice import SliceError, clean_work, gzip_bytes

    body = "\n".join(f"Line {i} of the play, spoken well." for i in range(100))
    raw = f"A PLAY\n\nby William Shakespeare\n\n\n\n\nACT I.\n\n\n\n{body}\n\nTHE END\n"
    assert clean_work("a_play", raw) == f"A PLAY\n\nACT I.\n\n{body}"
    with pytest.raises(SliceError, match="start marker missing"):
        clean_work("a_play", raw.replace("by William Shakespeare", "by Anonymous"))
    with pytest.raises(SliceError, match="boilerplate"):
        clean_work("a_play", raw.replace("ACT I.", "*** START OF THIS PROJECT GUTENBERG EBOOK ***"))
    with pytest.raises(SliceError, match="boilerplate"):
        clean_work("a_play", raw + "End of the Project Gutenberg EBook\n")
    assert gzip_bytes("abc") == gzip_bytes("abc")
    assert set(ASSIGNMENT) == set(SPLITS)


@pytest.mark.parametrize("name", ["notes.md", "NOTES.MD", "README", "chapter.rst", "book.text"])
def test_plain_text_under_other_common_names_is_read_as_txt(tmp_path, name):
    from seqdiff.data.text_files import read_text_file

    (tmp_path / name).write_text("To be, or not to be.\n")
    assert read_text_file(tmp_path / name) == "To be, or not to be.\n"


@pytest.mark.parametrize("name", ["table.csv", "data.json", "book.pdf"])
def test_other_file_types_are_refused_naming_what_is_read(tmp_path, name):
    (tmp_path / name).write_text("a,b\n")
    assert_error(tmp_path / name, "unsupported file type; expected a .txt, .txt.gz, .jsonl or .parquet file (plain "
                                  "text may also be named .md, .rst, .text or have no extension)")
