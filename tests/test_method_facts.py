"""Method facts are class attributes (issue 20 item 4): every method declares them, the declarations are true
on a tiny model, and no module tells a fact by comparing a method's name with "ar"."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from seqdiff.config import MethodConfig, ModelConfig
from seqdiff.methods import DEFAULT_SAMPLERS, METHODS, Batch, build_model
from seqdiff.samplers import SAMPLERS, sampler_name
from seqdiff.tokenizers import build_tokenizer

ROOT = Path(__file__).resolve().parents[1]
FACTS = {"causal": bool, "exact_likelihood": bool, "default_sampler": str}


@pytest.mark.parametrize("name", sorted(METHODS))
def test_every_method_declares_its_facts(name):
    cls = METHODS[name]
    for attr, tp in FACTS.items():
        assert attr in vars(cls) or any(attr in vars(base) for base in cls.__mro__[1:-1]
                                        if base.__name__ != "Method"), f"{name} does not declare {attr}"
        assert isinstance(getattr(cls, attr), tp), f"{name}.{attr} is not a {tp.__name__}"
    sampler = SAMPLERS[cls.default_sampler]
    # a sampler that lists its methods must list this one (the default must be able to run the method)
    assert name in getattr(sampler, "methods", (name,)), (name, cls.default_sampler)
    assert DEFAULT_SAMPLERS[name] == cls.default_sampler


def test_every_method_class_anywhere_declares_its_facts():
    import seqdiff.edlm.likelihood  # noqa: F401  (EDLMBound is a Method outside seqdiff.methods)
    from seqdiff.methods.base import Method

    def subclasses(cls):
        for sub in cls.__subclasses__():
            yield sub
            yield from subclasses(sub)

    found = list(subclasses(Method))
    assert len(found) >= len(METHODS) + 1
    for cls in found:
        if cls.__module__.startswith("seqdiff."):
            for attr, tp in FACTS.items():
                assert isinstance(getattr(cls, attr, None), tp), f"{cls.__qualname__} does not declare {attr}"


def test_sampler_name_reads_the_attribute():
    class Fake:
        default_sampler = "euler"

    assert sampler_name(None, Fake()) == "euler"
    assert sampler_name("remdm", Fake()) == "remdm"


@pytest.mark.parametrize("name", sorted(METHODS))
def test_exact_likelihood_means_no_dependence_on_random_times(name):
    """exact: two NLL evaluations under different generators agree to the bit; a bound: they differ."""
    tok = build_tokenizer("char", alphabet="abcdefgh", normalize="none")
    method, backbone, _ = build_model(ModelConfig(preset="test", max_seq_len=16), MethodConfig(name=name), tok)
    torch.manual_seed(0)
    x = torch.randint(0, 8, (4, 16))  # (B, L) letters only
    a, _ = method.nll(backbone, Batch(x), torch.Generator().manual_seed(1))
    b, _ = method.nll(backbone, Batch(x), torch.Generator().manual_seed(2))
    assert (a.item() == b.item()) == METHODS[name].exact_likelihood
    assert METHODS[name].causal == getattr(backbone, "causal", METHODS[name].causal)


def _name_comparisons(tree: ast.AST) -> list[int]:
    """Lines comparing something with the string "ar" (==, !=, or membership in a literal tuple / list / set)."""
    lines = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        for op, right in zip(node.ops, node.comparators):
            sides = (node.left, right)
            if isinstance(op, (ast.Eq, ast.NotEq)) and any(
                    isinstance(s, ast.Constant) and s.value == "ar" for s in sides):
                lines.append(node.lineno)
            if isinstance(op, (ast.In, ast.NotIn)) and isinstance(right, (ast.Tuple, ast.List, ast.Set)) and any(
                    isinstance(e, ast.Constant) and e.value == "ar" for e in right.elts):
                lines.append(node.lineno)
    return lines


def test_the_finder_finds():
    src = 'a = m.name != "ar"\nb = method == "ar"\nc = x in ("mdlm", "ar")\nd = "ar" in results\n'
    assert _name_comparisons(ast.parse(src)) == [1, 2, 3]


def test_no_module_compares_a_method_name_with_ar():
    found = []
    for folder in ("seqdiff", "experiments"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            found += [f"{path.relative_to(ROOT)}:{line}" for line in _name_comparisons(ast.parse(path.read_text()))]
    assert found == [], ("method facts are class attributes (exact_likelihood, causal, default_sampler): "
                         + ", ".join(found))


@pytest.mark.parametrize("name", sorted(set(METHODS) - {"bd3lm"}))  # bd3lm refuses time conditioning itself
def test_noise_level_input_is_true_and_time_conditioning_without_it_is_refused(name):
    """A method that declares noise_level_input trains a time-conditioned backbone; one that does not (AR) is
    refused when the recipe asks for one, instead of failing at the first training step."""
    from seqdiff.config import ConfigError

    tok = build_tokenizer("char")
    model = ModelConfig(hidden_size=16, n_layers=1, n_heads=2, max_seq_len=16, time_conditioning=True)
    config = MethodConfig(name=name)
    if not METHODS[name].noise_level_input:
        with pytest.raises(ConfigError, match="model.time_conditioning=true needs a method"):
            build_model(model, config, tok)
        return
    method, backbone, _ = build_model(model, config, tok)
    ids = torch.randint(0, tok.num_regular, (2, 8), generator=torch.Generator().manual_seed(0))
    assert torch.isfinite(method.loss(backbone, Batch(input_ids=ids), torch.Generator().manual_seed(0)).loss)
