"""`seqdiff bench` and the GPU check: how fast seqdiff trains and samples, measured on the machine at hand.

harness.py is the benchmark against Hugging Face models of the same shape (`seqdiff bench`), with models.py
(the contenders), measure.py (timers, meters), profile.py (operator breakdown) and report.py (bench.md);
gpu_check.py trains MDLM and AR on a CUDA GPU and reports MFU and peak memory (scripts/gpu_check.sh).
"""

from seqdiff.bench.harness import build_parser, main

__all__ = ["build_parser", "main"]
