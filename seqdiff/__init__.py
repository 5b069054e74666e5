"""seqdiff: masked discrete diffusion language models (MDLM and its baselines) over text and DNA.

Layers, from the bottom up (a module imports only from its own layer or below, with no import cycle):
  __init__.py, errors.py, categorical.py, config.py, sources.py, atomic.py, safe_io.py, figures.py,
  run_layout.py, host_memory.py   leaf modules
  optim.py                  AdamW + learning-rate warm-up (training, probe fine-tuning, NCE)
  tokenizers/               text and nucleotide vocabularies
  data/                     corpora, FASTA / BED, block packing, caches, Lightning data modules
  backbones/, schedules.py  networks that map tokens (+ noise level) to logits; noise schedules
  methods/                  the math of each method: corruption, loss, likelihood bound, reverse step
  checkpoint.py             a saved run loaded back: config, tokenizer, backbone + method
  edlm/                     energies on top of a frozen MDLM and the EDLM likelihood bound
  samplers/                 the loop of reverse steps, one sampler per file
  probes/, hf/              genomic probe protocol; export to and conversion from Hugging Face layouts
  training/, evaluation/    Lightning module and run; likelihoods, generation, metrics, frontier, statistics
  cli.py, options.py, edlm/cli.py, quickstart.py, bench/   the commands a person runs, their options; the benchmarks

A file named on a line overrides the folder it sits in (`edlm/cli.py` holds the `seqdiff edlm` commands,
which use evaluation/). Nothing in seqdiff imports `experiments/` (the studies that write reports/, run
from the repository root and not installed). tests/test_layers.py reads this table and checks every import
of the package against it, those inside functions included.
"""

__version__ = "0.1.0"
