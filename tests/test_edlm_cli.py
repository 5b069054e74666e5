"""What `seqdiff edlm eval` / `train-nce` read when no --data is given."""

from types import SimpleNamespace

import pytest

from seqdiff.config import DataConfig, FastaDataConfig
from seqdiff.edlm.base import EnergyError
from seqdiff.edlm.cli import _data_tokens


def test_a_dna_run_without_data_is_told_to_pass_a_fasta():
    """A DNA run's held-out split is a set of genome intervals the EDLM commands do not cut out: the message
    says so and names the genome, instead of claiming the run records no corpus."""
    model = SimpleNamespace(data_config=DataConfig(kind="fasta", tokenizer="nucleotide",
                                                   fasta=FastaDataConfig(path="genome.fa")))
    with pytest.raises(EnergyError, match=r"trained on the intervals of genome.fa.*pass --data FILE \(a FASTA"):
        _data_tokens(SimpleNamespace(data=None, split="test"), model)
    with pytest.raises(EnergyError, match="records no text corpus"):
        _data_tokens(SimpleNamespace(data=None, split="test"), SimpleNamespace(data_config=None))
