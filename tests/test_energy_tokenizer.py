"""An EDLM energy must read the MDLM's tokens: energies are matched to the MDLM by tokenizer, not by vocabulary size
(a character tokenizer over another alphabet of the same size gives the same ids to other characters)."""

from types import SimpleNamespace

import pytest
import torch

from seqdiff.config import MethodConfig, ModelConfig
from seqdiff.edlm import AREnergy, EnergyError
from seqdiff.edlm import ar_energy as ar_energy_module
from seqdiff.edlm.nce_energy import EnergyNet, NCEEnergy, save_energy_net, tokenizer_record
from seqdiff.methods import AR, MDLM
from seqdiff.tokenizers import CharTokenizer

ABC = CharTokenizer(alphabet="abc", normalize="none")
XYZ = CharTokenizer(alphabet="xyz", normalize="none")  # the same size, other characters
ABCD = CharTokenizer(alphabet="abcd", normalize="none")


def test_identity_tells_tokenizers_apart_that_the_size_does_not():
    assert ABC.vocab_size == XYZ.vocab_size
    assert ABC.identity() == CharTokenizer(alphabet="abc", normalize="none").identity()
    assert ABC.identity() != XYZ.identity()
    text8 = CharTokenizer()
    assert text8.identity() != CharTokenizer(normalize="none").identity()  # options count, symbols alike
    assert ABC.describe() == "char, 7 ids"


def _loaded(tokenizer, method_cls, path):
    return SimpleNamespace(method=method_cls(MethodConfig(), tokenizer), tokenizer=tokenizer, path=path,
                           model_config=SimpleNamespace(max_seq_len=8))


@pytest.mark.parametrize("ar_tok, message", [
    (XYZ, r"the AR model ar_run reads tokens of another tokenizer \(char, 7 ids\) than the MDLM mdlm_run "
          r"\(char, 7 ids\) \(the same size: other symbols or options\)"),
    (ABCD, r"another tokenizer \(char, 8 ids\) than the MDLM mdlm_run \(char, 7 ids\): an energy must share"),
])
def test_ar_energy_with_another_tokenizer_is_refused(monkeypatch, ar_tok, message):
    mdlm = _loaded(ABC, MDLM, "mdlm_run")
    monkeypatch.setattr(ar_energy_module, "load_checkpoint", lambda path, device: _loaded(ar_tok, AR, path))
    with pytest.raises(EnergyError, match=message):
        AREnergy.load("ar_run", mdlm)
    monkeypatch.setattr(ar_energy_module, "load_checkpoint", lambda path, device: _loaded(ABC, AR, path))
    assert AREnergy.load("ar_run", mdlm).ar.tokenizer is ABC  # the same tokenizer: accepted


def test_a_bidirectional_energy_model_is_named_as_such_first(monkeypatch):
    monkeypatch.setattr(ar_energy_module, "load_checkpoint", lambda path, device: _loaded(XYZ, MDLM, path))
    with pytest.raises(EnergyError, match="is a 'mdlm' model; the AR energies need an autoregressive one"):
        AREnergy.load("not_ar", _loaded(ABC, MDLM, "mdlm_run"))


def _nce_file(tmp_path, tokenizer):
    net = EnergyNet(ModelConfig(hidden_size=16, n_layers=1, n_heads=2, cond_dim=16, max_seq_len=8),
                    tokenizer.vocab_size, tokenizer.mask_id)
    net.tokenizer = tokenizer_record(tokenizer)
    return save_energy_net(net, tmp_path / "energy.pt")


def test_nce_energy_keeps_its_tokenizer_and_refuses_another(tmp_path):
    path = _nce_file(tmp_path, ABC)
    assert isinstance(NCEEnergy.load(str(path), _loaded(ABC, MDLM, "mdlm_run")), NCEEnergy)
    with pytest.raises(EnergyError, match=rf"NCE energy {path} reads tokens of another tokenizer \(char, 7 ids\)"):
        NCEEnergy.load(str(path), _loaded(XYZ, MDLM, "mdlm_run"))


def test_nce_file_without_a_tokenizer_record_is_matched_by_size(tmp_path):
    """Files written before the record was saved still load (the size check is all they allow)."""
    net = EnergyNet(ModelConfig(hidden_size=16, n_layers=1, n_heads=2, cond_dim=16, max_seq_len=8),
                    ABC.vocab_size, ABC.mask_id)
    ckpt_path = save_energy_net(net, tmp_path / "old.pt")
    ckpt = torch.load(ckpt_path, weights_only=True)
    ckpt.pop("tokenizer")
    torch.save(ckpt, ckpt_path)
    assert NCEEnergy.load(str(ckpt_path), _loaded(XYZ, MDLM, "m")).net.tokenizer is None
    with pytest.raises(EnergyError, match="trained for vocabulary size 7"):
        NCEEnergy.load(str(ckpt_path), _loaded(ABCD, MDLM, "m"))
