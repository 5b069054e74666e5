"""Datasets and data files: text corpora, packing, FASTA/BED readers and benchmark loaders."""
