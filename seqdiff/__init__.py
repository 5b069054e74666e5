"""seqdiff: masked discrete diffusion language models (MDLM and its baselines) over text and DNA.

Layers, from the bottom up (imports point downward only):
  tokenizers/, data/        domain entry points: vocabularies and datasets
  backbones/, schedules.py  networks that map tokens (+ noise level) to logits; noise schedules
  methods/                  the math of each method: corruption, loss, likelihood bound, reverse step
  samplers/                 the loop of reverse steps, one sampler per file
  training/, evaluation/    Lightning module and data module; likelihoods and metrics
  cli.py, pipelines/        jobs a person runs
"""

__version__ = "0.1.0"
