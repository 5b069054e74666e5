"""Witten-Bell n-gram: a normalized distribution for every context, equal to a naive recursive reference."""

import itertools
import json
import math
from collections import Counter

import numpy as np
import pytest

from seqdiff.errors import SeqdiffError
from seqdiff.evaluation.ngram import WittenBellNGram


def naive_wb(texts, order, V):
    """P(w | h) by the textbook recursion over explicit dictionaries (h a tuple of up to `order` ids)."""
    counts = Counter()
    for t in texts:
        t = list(t)
        for k in range(order + 1):
            for i in range(k, len(t)):
                counts[tuple(t[i - k:i + 1])] += 1

    def p(w, h):
        if len(h) == 0:
            lower = 1.0 / V
        else:
            lower = p(w, h[1:])
        c_h = sum(c for g, c in counts.items() if len(g) == len(h) + 1 and g[:-1] == h)
        t_h = sum(1 for g in counts if len(g) == len(h) + 1 and g[:-1] == h)
        if c_h == 0:
            return lower
        return (counts[h + (w,)] + t_h * lower) / (c_h + t_h)

    return p


@pytest.mark.parametrize("order", [0, 1, 2])
def test_probabilities_match_the_naive_recursion_and_sum_to_one(order):
    V = 3
    rng = np.random.default_rng(order)
    train = [rng.integers(0, V, size=n) for n in (40, 7, 1)]
    model = WittenBellNGram(order, V).fit(train)
    ref = naive_wb(train, order, V)
    for k in range(order + 1):
        for h in itertools.product(range(V), repeat=k):
            probs = [model._probs(np.array([*h, w]))[-1] for w in range(V)]
            assert sum(probs) == pytest.approx(1.0, abs=1e-12)
            for w in range(V):
                assert probs[w] == pytest.approx(ref(w, tuple(h)), abs=1e-12)
    test = [rng.integers(0, V, size=25)]
    bits, n = model.score(test)
    expected = -sum(math.log2(ref(int(test[0][i]), tuple(int(x) for x in test[0][max(0, i - order):i])))
                    for i in range(25))
    assert n == 25 and bits == pytest.approx(expected, rel=1e-12)


def test_a_deterministic_text_is_learned_and_an_unseen_symbol_keeps_mass():
    V = 4
    train = [np.array([0, 1, 2] * 50)]
    model = WittenBellNGram(2, V).fit(train)
    assert model.bits_per_token([np.array([0, 1, 2] * 10)]) < 0.2
    assert 0 < model._probs(np.array([0, 1, 3]))[-1] < 0.01  # never seen, never impossible


def test_bad_input_is_named():
    with pytest.raises(SeqdiffError, match="order must be >= 0"):
        WittenBellNGram(-1, 3)
    with pytest.raises(SeqdiffError, match=r"ids must lie in \[0, 3\)"):
        WittenBellNGram(1, 3).fit([np.array([0, 3])])
    with pytest.raises(SeqdiffError, match="not fitted"):
        WittenBellNGram(1, 3).score([np.array([0])])


def test_a_truncated_model_is_the_lower_order_fitted_afresh():
    """ngram_baseline counts once at its highest order and scores the lower ones from the same counts."""
    V = 5
    rng = np.random.default_rng(3)
    train, test = [rng.integers(0, V, size=300), rng.integers(0, V, size=9)], [rng.integers(0, V, size=80)]
    full = WittenBellNGram(4, V).fit(train)
    for order in range(5):
        assert full.truncated(order).score(test) == WittenBellNGram(order, V).fit(train).score(test)  # bit for bit
    assert full.bits_per_token_by_order(test) == [full.truncated(k).bits_per_token(test) for k in range(5)]
    with pytest.raises(SeqdiffError, match=r"order 5 is not among the fitted orders 0..4"):
        full.truncated(5)


def test_the_ngram_timing_experiment_checks_the_two_procedures_agree(tmp_path, monkeypatch):
    from experiments import ngram_baseline_time

    assert ngram_baseline_time.main(["--out", str(tmp_path), "--rounds", "1"]) == 0
    results = json.loads((tmp_path / "results.json").read_text())
    assert set(results["median_seconds"]) == {"fitted_per_order", "counted_once"} and results["order"] >= 1
    assert "the same bits for every order" in (tmp_path / "README.md").read_text()
    counted_once = ngram_baseline_time.PROCEDURES["counted_once"]
    monkeypatch.setitem(ngram_baseline_time.PROCEDURES, "counted_once",
                        lambda data, tokenizer: {**counted_once(data, tokenizer), "order": 0})  # disagrees
    assert ngram_baseline_time.main(["--out", str(tmp_path / "off"), "--rounds", "1"]) == 1
    assert not (tmp_path / "off").exists()  # nothing written for a disagreement
    with pytest.raises(SystemExit):  # argparse's one-line error
        ngram_baseline_time.main(["--out", str(tmp_path / "none"), "--rounds", "0"])
