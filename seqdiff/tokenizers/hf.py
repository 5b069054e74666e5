"""GPT-2 byte-level BPE and bert-base-uncased WordPiece, built with the `tokenizers` library from local files.

    GPT2Tokenizer(vocab_dir)    vocab.json + merges.txt, or the original encoder.json + vocab.bpe
    BertTokenizer(vocab_dir)    vocab.txt
    (no vocab_dir: the data directory's gpt2-vocab / bert-vocab, from `seqdiff data fetch`)

Design choices
- Local files only; nothing is downloaded. The files may also be gzipped (`encoder.json.gz`, ...).
- GPT-2 has 50,257 tokens (ids 0..50256) and no mask or padding token. `<|endoftext|>` (50256) serves as
  both BOS and EOS, as in GPT-2's own training, where it separates documents. `[MASK]` = 50257 and
  `[PAD]` = 50258 are appended after the vocabulary, so neither collides with a real id, and
  `vocab_size` = 50,259 rows of embedding. PAD gets its own id (rather than reusing EOS) so that padding
  can be left out of the loss without leaving out the real document separators.
- bert-base-uncased: lowercasing, accent stripping, BERT pre-tokenization, WordPiece with `##`
  continuations; `[CLS]` (101) is BOS, `[SEP]` (102) is EOS, and `[PAD]` (0) and `[MASK]` (103) are the
  vocabulary's own; `vocab_size` = 30,522.
- Special ids never come out of `encode`: the underlying `tokenizers` object has no added tokens, so a
  literal "[MASK]" or "<|endoftext|>" in a corpus is encoded as ordinary text. Special ids enter only
  through code (block packing, masking).
- Checkpoints are self-contained: `to_dict` holds the vocabulary (one token per line, in id order) and the
  BPE merges as two strings (about 0.9 MB for GPT-2; strings, not 50k-entry dicts, so YAML and JSON dumps
  of hyperparameters stay fast), plus their sha256 `fingerprint`, checked again by `from_dict`.
- `unit` is None: a token is not a character, so bits per character must be computed from the text.
"""

from __future__ import annotations

import gzip
import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer as FastTokenizer
from tokenizers import decoders, models, normalizers, pre_tokenizers

from seqdiff.sources import source_path
from seqdiff.tokenizers.base import Tokenizer, TokenizerError

GPT2_FILE_PAIRS = (("vocab.json", "merges.txt"), ("encoder.json", "vocab.bpe"))
"""(vocabulary, merges) file names looked for in a GPT-2 vocab_dir, in this order."""
ENDOFTEXT = "<|endoftext|>"
BERT_SPECIALS = {"bos": "[CLS]", "eos": "[SEP]", "pad": "[PAD]", "mask": "[MASK]", "unk": "[UNK]"}


# ---------------------------------------------------------------------------------------------- files
def _find(folder: Path, name: str) -> Path | None:
    for candidate in (folder / name, folder / f"{name}.gz"):
        if candidate.is_file():
            return candidate
    return None


def _read_text(path: str | Path) -> str:
    path = Path(path)
    try:
        raw = path.read_bytes()
        if path.suffix == ".gz":
            raw = gzip.decompress(raw)
        return raw.decode("utf-8")
    except FileNotFoundError:
        raise TokenizerError(f"{path} does not exist") from None
    except (OSError, EOFError, UnicodeDecodeError) as e:
        raise TokenizerError(f"{path} cannot be read as UTF-8 text: {e}") from e


def _default_dir(source: str) -> Path:
    return source_path(source)


def _fingerprint(kind: str, *parts: str) -> str:
    digest = hashlib.sha256(kind.encode())
    for part in parts:
        digest.update(b"\0")
        digest.update(part.encode("utf-8"))
    return digest.hexdigest()


def _check_tokens(tokens: Sequence[str], what: str) -> None:
    if len(set(tokens)) != len(tokens):
        raise TokenizerError(f"{what}: the vocabulary holds the same token twice")
    bad = next((t for t in tokens if not t or "\n" in t or "\r" in t), None)
    if bad is not None:
        raise TokenizerError(f"{what}: token {bad!r} is empty or holds a line break")


def read_gpt2_vocab(path: str | Path) -> list[str]:
    """A vocab.json / encoder.json (token -> id, ids 0..N-1) -> the tokens in id order."""
    try:
        mapping = json.loads(_read_text(path))
    except json.JSONDecodeError as e:
        raise TokenizerError(f"{path} is not valid JSON: {e}") from e
    if not isinstance(mapping, dict) or not all(isinstance(i, int) for i in mapping.values()):
        raise TokenizerError(f"{path} is not a JSON object mapping tokens to integer ids")
    if sorted(mapping.values()) != list(range(len(mapping))):
        raise TokenizerError(f"{path}: ids are not exactly 0..{len(mapping) - 1}")
    tokens = [""] * len(mapping)
    for token, i in mapping.items():
        tokens[i] = token
    return tokens


def read_merges(path: str | Path) -> list[tuple[str, str]]:
    """A merges.txt / vocab.bpe ("#version" header line, then one "left right" pair a line)."""
    return parse_merges(_read_text(path), str(path))


def parse_merges(text: str, what: str) -> list[tuple[str, str]]:
    merges = []
    for number, line in enumerate(text.split("\n"), start=1):
        line = line.rstrip("\r")
        if not line or (number == 1 and line.startswith("#version")):
            continue
        parts = line.split(" ")
        if len(parts) != 2 or not all(parts):
            raise TokenizerError(f"{what}, line {number}: {line!r} is not a 'left right' merge")
        merges.append((parts[0], parts[1]))
    return merges


def read_wordpiece_vocab(path: str | Path) -> list[str]:
    """A vocab.txt: one token a line, the line number (from 0) being its id."""
    text = _read_text(path)
    tokens = [t.rstrip("\r") for t in text.split("\n")]
    if tokens and tokens[-1] == "":
        tokens.pop()
    return tokens


# ---------------------------------------------------------------------------------------------- shared
class FastTokenizerBase(Tokenizer):
    """A `tokenizers` tokenizer behind seqdiff's Tokenizer interface (specials inside or after the vocabulary).

    `num_regular` is the size of the vocabulary read from the files; `vocab_size` the embedding rows.
    """

    unit = None

    # set by the subclasses' _setup
    _fast: FastTokenizer
    _tokens: list[str]
    _vocab_size: int
    _dict: dict[str, Any]

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    @property
    def special_ids(self) -> list[int]:
        """BOS, EOS, PAD, MASK without repeats (GPT-2's BOS and EOS are one id)."""
        return list(dict.fromkeys([self.bos_id, self.eos_id, self.pad_id, self.mask_id]))

    @property
    def fingerprint(self) -> str:
        """sha256 of the vocabulary (and merges): equal fingerprints, identical tokenization."""
        return self._dict["sha256"]

    def encode(self, text: str) -> np.ndarray:
        if not isinstance(text, str):
            raise TokenizerError(f"{self.kind} tokenizer: expected a str, got {type(text).__name__}")
        return np.asarray(self._fast.encode(text, add_special_tokens=False).ids, dtype=np.int64)

    def id_to_token(self, i: int) -> str:
        if 0 <= i < len(self._tokens):
            return self._tokens[i]
        if i == self.mask_id:
            return "[MASK]"
        if i == self.pad_id:
            return "[PAD]"
        raise TokenizerError(f"id {i} is outside the vocabulary of size {self.vocab_size}")

    def _checked_ids(self, ids: Sequence[int] | np.ndarray) -> list[int]:
        flat = np.asarray(ids, dtype=np.int64).reshape(-1)
        bad = flat[(flat < 0) | (flat >= self.vocab_size)]
        if bad.size:
            raise TokenizerError(f"id {int(bad[0])} is outside the vocabulary of size {self.vocab_size}")
        return flat.tolist()

    def to_dict(self) -> dict[str, Any]:
        return dict(self._dict)

    @classmethod
    def _check_dict(cls, data: dict[str, Any], keys: Sequence[str]) -> None:
        kind = data.get("kind") if isinstance(data, dict) else None
        if kind != cls.kind:
            raise TokenizerError(f"not a {cls.kind} tokenizer description (kind={kind!r})")
        missing = [k for k in keys if not isinstance(data.get(k), str)]
        if missing:
            raise TokenizerError(f"{cls.kind} tokenizer description lacks {missing}")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, FastTokenizerBase) and self._dict == other._dict

    def __repr__(self) -> str:
        return f"{type(self).__name__}(vocab_size={self.vocab_size}, fingerprint={self.fingerprint[:12]})"


# ---------------------------------------------------------------------------------------------- GPT-2
class GPT2Tokenizer(FastTokenizerBase):
    """GPT-2 byte-level BPE: every string encodes, and decoding gives it back byte for byte.

    ids 0..N-1: the vocabulary (N = 50,257 for GPT-2); BOS = EOS = `<|endoftext|>`; MASK = N; PAD = N + 1.
    """

    kind = "gpt2"

    def __init__(self, vocab_dir: str | Path | None = None, *, vocab_file: str | Path | None = None,
                 merges_file: str | Path | None = None):
        if (vocab_file is None) != (merges_file is None):
            raise TokenizerError("gpt2 tokenizer: give both vocab_file and merges_file, or neither")
        if vocab_file is None:
            vocab_file, merges_file = self.find_files(vocab_dir)
        self._setup(read_gpt2_vocab(vocab_file), read_merges(merges_file), str(vocab_file))

    @staticmethod
    def find_files(vocab_dir: str | Path | None = None) -> tuple[Path, Path]:
        """(vocabulary, merges) files in `vocab_dir` (default: the data directory's gpt2-vocab)."""
        folder = Path(vocab_dir).expanduser() if vocab_dir is not None else _default_dir("gpt2-vocab")
        for vocab_name, merges_name in GPT2_FILE_PAIRS:
            vocab, merges = _find(folder, vocab_name), _find(folder, merges_name)
            if vocab is not None and merges is not None:
                return vocab, merges
        wanted = " or ".join(f"{v} + {m}" for v, m in GPT2_FILE_PAIRS)
        how = ("run `seqdiff data fetch gpt2-vocab`, or set data.tokenizer_options.vocab_dir to a folder "
               "that holds them" if vocab_dir is None else "check data.tokenizer_options.vocab_dir")
        raise TokenizerError(f"no GPT-2 vocabulary in {folder} (looked for {wanted}); {how}")

    def _setup(self, tokens: list[str], merges: list[tuple[str, str]], what: str) -> None:
        _check_tokens(tokens, what)
        if ENDOFTEXT not in tokens:
            raise TokenizerError(f"{what}: no {ENDOFTEXT} token, which GPT-2 uses as BOS and EOS")
        ids = {t: i for i, t in enumerate(tokens)}
        try:
            model = models.BPE(vocab=ids, merges=merges, fuse_unk=False, byte_fallback=False)
        except Exception as e:  # the Rust side reports merges that name unknown tokens
            raise TokenizerError(f"{what}: the BPE vocabulary and merges do not fit together: {e}") from e
        fast = FastTokenizer(model)
        fast.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        fast.decoder = decoders.ByteLevel()
        self._fast = fast
        self._tokens = tokens
        self.num_regular = len(tokens)
        self.bos_id = self.eos_id = ids[ENDOFTEXT]
        self.mask_id = len(tokens)
        self.pad_id = len(tokens) + 1
        self._vocab_size = len(tokens) + 2
        vocab_text = "\n".join(tokens)
        merges_text = "\n".join(f"{a} {b}" for a, b in merges)
        self._dict = {"kind": self.kind, "vocab": vocab_text, "merges": merges_text,
                      "sha256": _fingerprint(self.kind, vocab_text, merges_text)}

    def decode(self, ids: Sequence[int] | np.ndarray, mask_char: str = "_") -> str:
        """Ids -> text; BOS/EOS/PAD are dropped, MASK shows as `mask_char`.

        Runs of real tokens between specials are decoded separately (bytes are never joined across a
        special token); a run that ends inside a multi-byte character decodes to U+FFFD.
        """
        out: list[str] = []
        run: list[int] = []
        for i in self._checked_ids(ids):
            if i < self.num_regular and i != self.eos_id:
                run.append(i)
                continue
            if run:
                out.append(self._fast.decode(run, skip_special_tokens=False))
                run = []
            if i == self.mask_id:
                out.append(mask_char)
        if run:
            out.append(self._fast.decode(run, skip_special_tokens=False))
        return "".join(out)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GPT2Tokenizer:
        cls._check_dict(data, ("vocab", "merges"))
        _check_fingerprint(data, _fingerprint(cls.kind, data["vocab"], data["merges"]))
        tok = cls.__new__(cls)
        tok._setup(data["vocab"].split("\n"), parse_merges(data["merges"], "gpt2 tokenizer description"),
                   "gpt2 tokenizer description")
        return tok


def _check_fingerprint(data: dict[str, Any], actual: str) -> None:
    """A description's recorded sha256 must match its content (when it records one)."""
    if "sha256" in data and data["sha256"] != actual:
        raise TokenizerError(f"{data['kind']} tokenizer description is damaged: its sha256 {data['sha256']} does "
                             f"not match its content ({actual})")


# ---------------------------------------------------------------------------------------------- BERT
class BertTokenizer(FastTokenizerBase):
    """BERT WordPiece (bert-base-uncased by default): [CLS] = BOS, [SEP] = EOS, [PAD] and [MASK] from the vocab.

    Lossy by design: text is lowercased, accents are stripped, and decoding joins words with single spaces
    (no space before . , ! ? or inside contractions). Characters outside the vocabulary become [UNK].
    """

    kind = "bert"

    def __init__(self, vocab_dir: str | Path | None = None, *, vocab_file: str | Path | None = None,
                 lowercase: bool = True):
        if vocab_file is None:
            vocab_file = self.find_file(vocab_dir)
        self._setup(read_wordpiece_vocab(vocab_file), bool(lowercase), str(vocab_file))

    @staticmethod
    def find_file(vocab_dir: str | Path | None = None) -> Path:
        """vocab.txt in `vocab_dir` (default: the data directory's bert-vocab)."""
        folder = Path(vocab_dir).expanduser() if vocab_dir is not None else _default_dir("bert-vocab")
        found = _find(folder, "vocab.txt")
        if found is None:
            how = ("run `seqdiff data fetch bert-vocab`, or set data.tokenizer_options.vocab_dir to a folder "
                   "that holds it" if vocab_dir is None else "check data.tokenizer_options.vocab_dir")
            raise TokenizerError(f"no BERT vocabulary in {folder} (looked for vocab.txt); {how}")
        return found

    def _setup(self, tokens: list[str], lowercase: bool, what: str) -> None:
        _check_tokens(tokens, what)
        ids = {t: i for i, t in enumerate(tokens)}
        missing = [t for t in BERT_SPECIALS.values() if t not in ids]
        if missing:
            raise TokenizerError(f"{what}: the vocabulary lacks {missing}")
        fast = FastTokenizer(models.WordPiece(vocab=ids, unk_token=BERT_SPECIALS["unk"],
                                              max_input_chars_per_word=100))
        # strip_accents=None: strip accents exactly when lowercasing, as BERT does
        fast.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True,
                                                     strip_accents=None, lowercase=lowercase)
        fast.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        fast.decoder = decoders.WordPiece(prefix="##", cleanup=True)
        self._fast = fast
        self._tokens = tokens
        self.lowercase = lowercase
        self.num_regular = len(tokens)
        self.bos_id, self.eos_id = ids[BERT_SPECIALS["bos"]], ids[BERT_SPECIALS["eos"]]
        self.pad_id, self.mask_id = ids[BERT_SPECIALS["pad"]], ids[BERT_SPECIALS["mask"]]
        self.unk_id = ids[BERT_SPECIALS["unk"]]
        self._vocab_size = len(tokens)
        vocab_text = "\n".join(tokens)
        self._dict = {"kind": self.kind, "vocab": vocab_text, "lowercase": lowercase,
                      "sha256": _fingerprint(self.kind, vocab_text, str(lowercase))}

    def decode(self, ids: Sequence[int] | np.ndarray, mask_char: str = "_") -> str:
        """Ids -> text; [CLS]/[SEP]/[PAD] are dropped, [MASK] shows as `mask_char` (a word or a word piece)."""
        dropped = {self.bos_id, self.eos_id, self.pad_id}
        pieces = [mask_char if i == self.mask_id else self._tokens[i]
                  for i in self._checked_ids(ids) if i not in dropped]
        return self._fast.decoder.decode(pieces) if pieces else ""

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BertTokenizer:
        cls._check_dict(data, ("vocab",))
        lowercase = data.get("lowercase", True)
        if not isinstance(lowercase, bool):
            raise TokenizerError(f"bert tokenizer description: lowercase={lowercase!r} is not true or false")
        _check_fingerprint(data, _fingerprint(cls.kind, data["vocab"], str(lowercase)))
        tok = cls.__new__(cls)
        tok._setup(data["vocab"].split("\n"), lowercase, "bert tokenizer description")
        return tok
