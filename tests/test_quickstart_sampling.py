"""experiments/quickstart_sampling.py: its repetition readings on hand-made texts, and its reading of real text
(the shipped Shakespeare slice, offline), which every sampler setting is compared with."""

from __future__ import annotations

import math

import numpy as np
import pytest

from experiments.quickstart_sampling import (
    fit_ngram,
    readings,
    real_windows,
    repeated_word_share,
    table,
    word_pair_distinct,
)
from seqdiff.data.text import split_path
from seqdiff.data.text_files import read_text_file
from seqdiff.quickstart import QUICKSTART
from seqdiff.tokenizers import build_tokenizer
from seqdiff.tokenizers.char import text8_normalize


def test_word_pair_distinct_and_repeats_count_what_they_say():
    assert word_pair_distinct("a b a b a b") == pytest.approx(2 / 5)  # pairs ab ba ab ba ab
    assert word_pair_distinct("one") == 1.0
    assert repeated_word_share("the the the cat") == pytest.approx(2 / 3)
    assert repeated_word_share("to be or not to be") == 0.0
    assert repeated_word_share("") == 0.0


@pytest.fixture(scope="module")
def char_tokenizer():
    return build_tokenizer(QUICKSTART.data.tokenizer, **QUICKSTART.data.tokenizer_options)


def test_real_text_reads_as_text_and_a_stutter_does_not(char_tokenizer):
    ngram, order = fit_ngram(char_tokenizer)
    assert order >= 1
    vocabulary = set(text8_normalize(read_text_file(split_path(QUICKSTART.data, "train"))).split())
    real = real_windows(char_tokenizer, 8, 128)
    assert len(real) == 8 and all(len(t) == 128 for t in real)
    r = readings(real, vocabulary, ngram, char_tokenizer)
    assert r["known_word_share"] > 0.8 and r["repeated_word_share"] < 0.05
    assert 1.5 < r["ngram_bits_per_char"] < 3.5  # the baseline scores the unseen play at about 2.3
    stutter = readings(["the " * 32] * 2, vocabulary, ngram, char_tokenizer)
    assert stutter["known_word_share"] == 1.0  # known words alone would call this perfect ...
    assert stutter["repeated_word_share"] == 1.0 and stutter["distinct_word_pairs"] < 0.1  # ... these do not
    assert stutter["ngram_bits_per_char"] < r["ngram_bits_per_char"] - 0.5
    noise = readings(["".join(np.random.default_rng(0).choice(list("abcdefghijklmnopqrstuvwxyz "), 128))],
                     vocabulary, ngram, char_tokenizer)
    assert noise["ngram_bits_per_char"] > r["ngram_bits_per_char"] + 1.0


def test_table_lists_real_text_first_and_every_setting():
    row = {"known_word_share": 0.5, "words_counted": 10, "ngram_bits_per_char": 3.0, "distinct_word_pairs": 1.0,
           "repeated_word_share": 0.0}
    results = {"command": "python -m experiments.quickstart_sampling", "seconds": 1.0, "torch_threads": 1,
               "num_samples": 2, "seq_len": 128, "steps": {"mdlm": 1}, "ngram_order": 4, "real": row,
               "settings": [{**row, "model": "mdlm", "setting": "cached", "denoiser_calls": 3},
                            {**row, "model": "ar", "setting": "ancestral", "denoiser_calls": 128,
                             "known_word_share": math.nan}]}
    lines = table(results).splitlines()
    body = [line for line in lines if line.startswith("| ") and not line.startswith("| model")]
    assert body[0].startswith("| real text") and body[1].startswith("| MDLM | cached") and "nan" in body[2]
