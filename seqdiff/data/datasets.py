"""Named text datasets (registry DATASETS) and the detokenizers applied before scoring (DETOKENIZERS).

    data.corpus: NAME     NAME in DATASETS (text8, lm1b, openwebtext, wikitext2, wikitext103, ptb, lambada,
                          ag_news, arxiv, pubmed, austen) — or a builtin corpus (shakespeare), or a folder

Two kinds of entries:
- `HubDataset`: loaded with Hugging Face `datasets` by its real id (imported lazily, downloaded by
  `datasets` into its own cache), with the splits used in the papers: OpenWebText has only a train split,
  whose last 100,000 documents are the validation (and test) set, as in MDLM; LM1B, LAMBADA and AG News
  have no validation split, so their test split serves for both. text8 is not on the hub in its
  canonical form: it is read from the original text8.zip (cached under the data directory) and split
  into the first 90M / next 5M / last 5M characters. A hub dataset is read from the local `datasets`
  cache when it is there (no request made); otherwise the hub is asked once, briefly, and when it does
  not answer the error comes at once (not after the library's ~30 s of retries), naming the cache folder
  looked in and how to use local files instead (`data.corpus=/folder` with {train,valid,test}.txt /
  .jsonl / .parquet, `seqdiff eval RUN --data PATH`). HF_HUB_OFFLINE / HF_DATASETS_OFFLINE set by the
  user are honoured (see `seqdiff.data.hub`).
- `LocalCorpus`: files that `seqdiff data fetch NAME` put in the data directory, split by whole works so
  that validation and test measure generalization to unseen text. Austen: Emma, Mansfield Park, Pride and
  Prejudice and Sense and Sensibility train; Northanger Abbey validates; Persuasion tests (the two
  shortest novels, ~10% of the characters each).

Detokenizers undo the tokenization of corpora distributed pre-tokenized (WikiText's " @-@ ", PTB's
" n't", LM1B's spaces before punctuation, LAMBADA's curly quotes) so that a model is scored on natural
text, as in the zero-shot tables of SEDD / MDLM. They are pure functions `str -> str`.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from seqdiff.data.cache import file_identity
from seqdiff.data.hub import HubUnavailable, load_hub_dataset
from seqdiff.data.text_files import BUILTIN_CORPORA, read_documents
from seqdiff.errors import SeqdiffError
from seqdiff.safe_io import atomic_write
from seqdiff.sources import data_dir, is_present, source_path

SPLITS = ("train", "valid", "test")
OFFLINE_HINT = ("to train or evaluate offline, point at local files instead: data.corpus=/folder holding "
                "train / valid / test files (.txt, .txt.gz, .jsonl or .parquet with a 'text' column), or "
                "data.train_file / data.valid_file / data.test_file, to train; seqdiff eval RUN --data PATH "
                "(one such file, or such a folder) to evaluate")


class DatasetError(SeqdiffError):
    """An unknown dataset name, a dataset that cannot be loaded, or a local corpus not fetched yet."""


# ---------------------------------------------------------------------------------------------- detokenizers
def wikitext_detokenize(text: str) -> str:
    """WikiText: " @-@ " -> "-", spaces around punctuation and inside brackets / quotes, "= = =" headings."""
    s = text.replace("s '", "s'")
    s = re.sub(r"/' [0-9]/", r"/'[0-9]/", s)
    s = s.replace(" @-@ ", "-").replace(" @,@ ", ",").replace(" @.@ ", ".")
    for p in (":", ";", ".", "!", "?", ","):
        s = s.replace(f" {p} ", f"{p} ")
    s = re.sub(r"\(\s*([^)]*?)\s*\)", r"(\1)", s)
    s = re.sub(r"\[\s*([^\]]*?)\s*\]", r"[\1]", s)
    s = re.sub(r"{\s*([^}]*?)\s*}", r"{\1}", s)
    s = re.sub(r"\"\s*([^\"]*?)\s*\"", r'"\1"', s)
    s = re.sub(r"'\s*([^']*?)\s*'", r"'\1'", s)
    s = s.replace("= = = =", "====").replace("= = =", "===").replace("= =", "==")
    s = s.replace(" \N{DEGREE SIGN} ", "\N{DEGREE SIGN}")
    s = s.replace(" \n", "\n").replace("\n ", "\n")
    s = s.replace(" N ", " 1 ").replace(" 's", "'s")
    return s


def ptb_detokenize(text: str) -> str:
    """Penn Treebank: " 's" / " n't" contractions, "\\/" -> "/", N (a number) -> 1, <unk> -> ?."""
    s = text.replace(" 's", "'s").replace("s ' ", "s' ").replace(" n't", "n't").replace(" \n ", "\n")
    s = s.replace("\\/", "/")
    while " N " in s:
        s = s.replace(" N ", " 1 ")
    return s.replace("$ 1", "$1").replace("# 1", "#1").replace("<unk>", "?")


def lm1b_detokenize(text: str) -> str:
    """LM1B: no space before punctuation or clitics, URLs rejoined, quotes and brackets tightened."""
    s = text.replace("http : / / ", "http://").replace("https : / / ", "https://")
    s = re.sub(r" '(\w+)", r"'\1", s)
    s = s.replace(" n't", "n't")
    s = re.sub(r" ([.,!?;:%])", r"\1", s)
    s = re.sub(r"\" ([^\"]*?) \"", r'"\1"', s)
    s = s.replace("( ", "(").replace(" )", ")").replace("$ ", "$")
    return s


def lambada_detokenize(text: str) -> str:
    """LAMBADA: curly quotes become straight ones; surrounding whitespace is dropped."""
    s = text.replace("\u201c", '"').replace("\u201d", '"').replace("\u2018", "'").replace("\u2019", "'")
    return s.strip()


DETOKENIZERS: dict[str, Callable[[str], str]] = {
    "wikitext": wikitext_detokenize,
    "ptb": ptb_detokenize,
    "lm1b": lm1b_detokenize,
    "lambada": lambada_detokenize,
}
"""Registry: data.text.detokenizer -> function applied to each document before tokenization."""


def get_detokenizer(name: str | None) -> Callable[[str], str] | None:
    if name is None:
        return None
    if name not in DETOKENIZERS:
        raise DatasetError(f"data.text.detokenizer={name!r} is unknown; choose one of {sorted(DETOKENIZERS)}")
    return DETOKENIZERS[name]


# ---------------------------------------------------------------------------------------------- hub datasets
def _hub_load(path: str, name: str | None, split: str):
    """`datasets.load_dataset`, local cache first, failing at once when the dataset is not cached and the hub
    cannot be reached (`seqdiff.data.hub`; tests replace this function to simulate the hub)."""
    return load_hub_dataset(path, name, split)


@dataclass(frozen=True)
class HubDataset:
    name: str
    description: str
    path: str
    """Hugging Face `datasets` id."""
    config: str | None
    splits: dict[str, str]
    """Our split -> the hub's split expression (slices allowed, e.g. "train[-100000:]")."""
    text_column: str = "text"
    detokenizer: str | None = None
    """Detokenizer used unless data.text.detokenizer says otherwise."""

    def identity(self, split: str) -> dict[str, Any]:
        return {"dataset": self.name, "path": self.path, "config": self.config, "split": self.splits[split]}

    def documents(self, split: str) -> list[str]:
        spec = self.splits[split]
        what = (f"dataset {self.name!r} (Hugging Face id {self.path!r}"
                f"{f', config {self.config!r}' if self.config else ''}, split {spec!r})")
        try:
            rows = _hub_load(self.path, self.config, spec)
        except HubUnavailable as e:  # neither cached nor reachable: said at once, without the library's retries
            raise DatasetError(f"{what} is not available offline: {e}; {OFFLINE_HINT}") from e
        except Exception as e:  # ConnectionError, OSError, or a hub error class of `datasets`
            message = " ".join(f"{type(e).__name__}: {e}".split())  # one line: the library's text can span several
            raise DatasetError(f"{what} could not be loaded: {message}. {OFFLINE_HINT}") from e
        return [d for d in rows[self.text_column] if isinstance(d, str) and d.strip()]


TEXT8_URL = "http://mattmahoney.net/dc/text8.zip"
TEXT8_TIMEOUT = 30.0
"""Seconds a connection attempt or a read of the text8 download may wait before the download fails."""
TEXT8_SPLITS = {"train": (0, 90_000_000), "valid": (90_000_000, 95_000_000), "test": (95_000_000, 100_000_000)}


@dataclass(frozen=True)
class Text8Dataset:
    name: str = "text8"
    description: str = "text8: 100M characters of Wikipedia (a-z and space), split 90M / 5M / 5M"
    detokenizer: str | None = None
    splits: dict[str, tuple[int, int]] = field(default_factory=lambda: dict(TEXT8_SPLITS))

    def identity(self, split: str) -> dict[str, Any]:
        return {"dataset": self.name, "split": self.splits[split]}

    def documents(self, split: str) -> list[str]:
        import urllib.request
        import zipfile

        archive = data_dir() / "text8" / "text8.zip"
        if not archive.is_file():
            def download(f) -> None:
                try:
                    with urllib.request.urlopen(TEXT8_URL, timeout=TEXT8_TIMEOUT) as response:
                        shutil.copyfileobj(response, f)
                except OSError as e:
                    raise DatasetError(f"dataset 'text8' could not be downloaded from {TEXT8_URL}: {e}. "
                                       f"Put text8.zip at {archive} by hand, or {OFFLINE_HINT}") from e

            atomic_write(archive, download, "download")
        with zipfile.ZipFile(archive) as z:
            text = z.read("text8").decode("ascii")
        start, end = self.splits[split]
        return [text[start:end]]


# ---------------------------------------------------------------------------------------------- local corpora
@dataclass(frozen=True)
class LocalCorpus:
    name: str
    description: str
    source: str
    """`seqdiff data fetch` source that puts the files in the data directory."""
    splits: dict[str, tuple[str, ...]]
    """Split -> file names (whole works) under the source's folder."""
    detokenizer: str | None = None

    def files(self, split: str) -> list[Path]:
        folder = source_path(self.source)
        if not is_present(self.source):
            raise DatasetError(f"corpus {self.name!r} is not in the data directory ({folder} is missing or "
                               f"incomplete); fetch it first: seqdiff data fetch {self.source}")
        return [folder / name for name in self.splits[split]]

    def identity(self, split: str) -> dict[str, Any]:
        return {"dataset": self.name, "files": [file_identity(p) for p in self.files(split)]}

    def documents(self, split: str, documents: str = "paragraphs") -> list[str]:
        return [d for path in self.files(split) for d in read_documents(path, documents)]


AUSTEN_SPLITS = {
    "train": ("emma.txt", "mansfieldpark.txt", "prideprejudice.txt", "sensesensibility.txt"),
    "valid": ("northangerabbey.txt",),
    "test": ("persuasion.txt",),
}

_ENTRIES: list[HubDataset | Text8Dataset | LocalCorpus] = [
    Text8Dataset(),
    HubDataset("lm1b", "One Billion Word benchmark (one sentence per row; test split also validates)", "lm1b",
               None, {"train": "train", "valid": "test", "test": "test"}, detokenizer="lm1b"),
    HubDataset("openwebtext", "OpenWebText (last 100k documents of train held out for validation)",
               "openwebtext", None,
               {"train": "train[:-100000]", "valid": "train[-100000:]", "test": "train[-100000:]"}),
    HubDataset("wikitext2", "WikiText-2 (raw)", "wikitext", "wikitext-2-raw-v1",
               {"train": "train", "valid": "validation", "test": "test"}, detokenizer="wikitext"),
    HubDataset("wikitext103", "WikiText-103 (raw)", "wikitext", "wikitext-103-raw-v1",
               {"train": "train", "valid": "validation", "test": "test"}, detokenizer="wikitext"),
    HubDataset("ptb", "Penn Treebank (text only)", "ptb_text_only", None,
               {"train": "train", "valid": "validation", "test": "test"}, text_column="sentence",
               detokenizer="ptb"),
    HubDataset("lambada", "LAMBADA (OpenAI version; test only)", "EleutherAI/lambada_openai", "default",
               {"train": "test", "valid": "test", "test": "test"}, detokenizer="lambada"),
    HubDataset("ag_news", "AG News (test split also validates)", "ag_news", None,
               {"train": "train", "valid": "test", "test": "test"}),
    HubDataset("arxiv", "Scientific papers: arXiv articles", "scientific_papers", "arxiv",
               {"train": "train", "valid": "validation", "test": "test"}, text_column="article"),
    HubDataset("pubmed", "Scientific papers: PubMed articles", "scientific_papers", "pubmed",
               {"train": "train", "valid": "validation", "test": "test"}, text_column="article"),
    LocalCorpus("austen", "Jane Austen, 6 novels split by whole novels (4 train / 1 valid / 1 test)", "austen",
                AUSTEN_SPLITS),
]

DATASETS: dict[str, HubDataset | Text8Dataset | LocalCorpus] = {d.name: d for d in _ENTRIES}
"""Registry: data.corpus name -> dataset (hub loaders and fetched local corpora)."""


def get_dataset(name: str):
    if name not in DATASETS:
        raise DatasetError(f"unknown dataset {name!r}; known datasets: {', '.join(sorted(DATASETS))} "
                           f"(builtin corpora: {', '.join(sorted(BUILTIN_CORPORA))}), or a folder path")
    return DATASETS[name]


def load_documents(name: str, split: str, documents: str = "paragraphs") -> list[str]:
    """The documents of `split` ("train", "valid", "test") of dataset `name`, in order."""
    if split not in SPLITS:
        raise DatasetError(f"split {split!r} is unknown; choose one of {list(SPLITS)}")
    dataset = get_dataset(name)
    if isinstance(dataset, LocalCorpus):
        return dataset.documents(split, documents)
    return dataset.documents(split)
