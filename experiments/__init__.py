"""The studies behind reports/: each module reproduces one report with the seqdiff library.

Run from the repository root, `python -m experiments.NAME --help`; this folder is not installed and nothing in
seqdiff/ imports it (tests/test_layers.py checks that).
"""
