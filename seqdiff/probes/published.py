"""Published Genomic Benchmarks accuracies, printed next to our rows in the probe reports.

Two sources, each named in every row's citation:

- The benchmark's own CNN baseline: the PyTorch CNN table of the genomic_benchmarks repository
  (`experiments/README.md`, "Results / PyTorch CNN", test accuracy of one run; Grešová et al. 2023).
- Schiff et al. 2024 (Caduceus), Table 1: CNN, HyenaDNA, Caduceus-Ph and Caduceus-PS, top-1 accuracy over
  5 seeds with the spread given as max - min. Read from the copy of that table in JanusDNA's Table 1, which
  states that it adopts the Caduceus paper's reported numbers; the original PDF could not be opened from this
  offline machine, so the citation says "via JanusDNA". Rows of the MDLM paper's genomic table are not listed:
  no copy of it could be read.

Numbers are fractions; a row is added only with the paper and table it comes from.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PublishedRow:
    model: str
    accuracy: float
    """Top-1 test accuracy (mean over seeds / folds), as a fraction."""
    spread: float | None
    """As the paper gives it (e.g. max - min over 5 seeds), or None."""
    citation: str
    """Paper and table."""


GB_CNN = "Genomic Benchmarks PyTorch CNN (genomic_benchmarks repo, experiments/README.md; one run)"
CADUCEUS = "Schiff et al. 2024, Table 1 (5 seeds, spread = max - min), via JanusDNA Table 1"

_GB_CNN = {  # dataset: accuracy %
    "demo_coding_vs_intergenomic_seqs": 87.6, "demo_human_or_worm": 93.0, "dummy_mouse_enhancers_ensembl": 69.0,
    "human_enhancers_cohn": 69.5, "human_enhancers_ensembl": 68.9, "human_ensembl_regulatory": 93.3,
    "human_nontata_promoters": 84.6, "human_ocr_ensembl": 68.0,
}
_CADUCEUS_MODELS = ("CNN", "HyenaDNA", "Caduceus-Ph", "Caduceus-PS")
_CADUCEUS = {  # dataset: ((mean, spread) for each of _CADUCEUS_MODELS)
    "dummy_mouse_enhancers_ensembl": ((0.715, 0.087), (0.780, 0.025), (0.754, 0.074), (0.793, 0.058)),
    "demo_coding_vs_intergenomic_seqs": ((0.892, 0.008), (0.904, 0.005), (0.915, 0.003), (0.910, 0.003)),
    "demo_human_or_worm": ((0.942, 0.002), (0.964, 0.002), (0.973, 0.001), (0.968, 0.002)),
    "human_enhancers_cohn": ((0.702, 0.021), (0.729, 0.014), (0.747, 0.004), (0.745, 0.007)),
    "human_enhancers_ensembl": ((0.744, 0.122), (0.849, 0.006), (0.893, 0.008), (0.900, 0.006)),
    "human_ensembl_regulatory": ((0.872, 0.005), (0.869, 0.012), (0.872, 0.011), (0.873, 0.007)),
    "human_ocr_ensembl": ((0.698, 0.013), (0.783, 0.007), (0.828, 0.006), (0.818, 0.006)),
    "human_nontata_promoters": ((0.861, 0.009), (0.944, 0.002), (0.946, 0.007), (0.945, 0.010)),
}

PUBLISHED: dict[str, list[PublishedRow]] = {
    name: [PublishedRow("CNN (Genomic Benchmarks)", _GB_CNN[name] / 100, None, GB_CNN)]
    + [PublishedRow(model, mean, spread, CADUCEUS) for model, (mean, spread) in zip(_CADUCEUS_MODELS, rows)]
    for name, rows in _CADUCEUS.items()
}
