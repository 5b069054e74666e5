"""Genomic classification probes: benchmark loaders, frozen-embedding and fine-tuned classifiers, baselines
(k-mer logistic regression, the Genomic Benchmarks CNN, a randomly initialized backbone) and the
5-seed protocol of Caduceus and MDLM. `seqdiff probe CHECKPOINT --benchmark NAME` drives them.
"""

from seqdiff.probes.benchmarks import BENCHMARKS, load_benchmark
from seqdiff.probes.data import Benchmark, LabeledSequences, ProbeError

__all__ = ["BENCHMARKS", "Benchmark", "LabeledSequences", "ProbeError", "load_benchmark"]
