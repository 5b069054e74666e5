"""EDLM-NCE: a learned energy, a copy of the MDLM backbone with a scalar head, trained by noise-contrastive
estimation against the frozen denoiser mu (seqdiff.edlm.nce_train).

- Input: the pair (x_t, x0) as one token per position. Every candidate x0 agrees with x_t where x_t is not
  masked, so x_t is x0 plus the set of masked positions; the network reads token id x0^l + V * [x_t^l is
  MASK], an embedding table of 2V rows whose two halves start as copies of the MDLM's embedding.
- Trunk: the MDLM backbone's transformer (weights copied, bidirectional, no time conditioning: t is implied by
  how many positions are masked); the unused output projection is dropped.
- Head: a linear map of the mean-pooled final hidden states to one scalar, zero-initialized, so an untrained
  energy is 0 and EDLM-NCE starts exactly at MDLM.
- NCE: the Bayes classifier between data x0 and draws from mu(. | x_t) has logit log p / mu = -E - log Z;
  with a free bias in the head, training the logit -E by the binary logistic loss fits the residual energy.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seqdiff.backbones import build_backbone
from seqdiff.checkpoint import CheckpointError, load_plain
from seqdiff.config import ModelConfig, from_dict, to_dict
from seqdiff.edlm.base import Energy, EnergyError, check_same_tokenizer
from seqdiff.safe_io import atomic_torch_save

NCE_FORMAT = "seqdiff-edlm-nce"


class EnergyNet(nn.Module):
    """(x0, x_t) -> scalar energy (N,): transformer over flagged tokens, mean pool, linear head."""

    def __init__(self, model_config: ModelConfig, vocab_size: int, mask_id: int):
        super().__init__()
        # the trunk reads flagged ids [0, 2V), which have no complement map: never RC-equivariant
        self.model_config = dataclasses.replace(model_config, time_conditioning=False, rc_equivariant="none")
        self.vocab_size, self.mask_id = vocab_size, mask_id
        self.tokenizer: dict[str, str] | None = None
        """{"identity", "description"} of the MDLM's tokenizer (`tokenizer_record`), saved with the weights so that
        loading refuses an MDLM with another tokenizer; None in files written before it was saved."""
        self.trunk = build_backbone(self.model_config, 2 * vocab_size, causal=False)
        self.trunk.output = nn.Identity()  # only hidden states are read
        self.head = nn.Linear(self.model_config.hidden_size, 1)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    @classmethod
    def from_mdlm(cls, backbone: nn.Module, vocab_size: int, mask_id: int) -> EnergyNet:
        """A new energy network whose trunk starts from the MDLM backbone's weights."""
        backbone = getattr(backbone, "inner", backbone)  # an RC-equivariant MDLM: its shared network
        net = cls(backbone.config, vocab_size, mask_id)
        source = backbone.state_dict()
        target = net.trunk.state_dict()
        copied = {k: v for k, v in source.items() if k in target and target[k].shape == v.shape}
        embed = source["embed.weight"]  # (V, H)
        flagged = embed + embed[mask_id]  # (V, H): token v that x_t masks
        copied["embed.weight"] = torch.cat([embed, flagged], dim=0)  # (2V, H)
        net.trunk.load_state_dict(copied, strict=False)
        return net.to(embed.device)

    def forward(self, x0: Tensor, xt: Tensor) -> Tensor:
        ids = x0 + self.vocab_size * (xt == self.mask_id).long()  # (N, L) in [0, 2V)
        h = self.trunk.hidden_states(ids)  # (N, L, H)
        return self.head(h.mean(dim=1))[:, 0].float()  # (N,)


def nce_loss(energy_data: Tensor, energy_noise: Tensor) -> Tensor:
    """Binary logistic loss with logit -E: data should get low energy, draws from mu high energy.
    -log sigmoid(-E_data) - log sigmoid(E_noise), averaged over the batch."""
    return F.softplus(energy_data).mean() + F.softplus(-energy_noise).mean()


class NCEEnergy(Energy):
    name = "nce"

    def __init__(self, net: EnergyNet):
        self.net = net.eval()

    @classmethod
    def load(cls, path: str, mdlm, device: str = "cpu") -> NCEEnergy:
        """The energy network saved at `path` by `seqdiff edlm train-nce` (must match the MDLM's vocabulary)."""
        net = load_energy_net(path, device)
        if net.tokenizer is not None:  # NCE files written before session 40 store the vocabulary size only
            check_same_tokenizer(f"NCE energy {path}", net.tokenizer["identity"], net.tokenizer["description"], mdlm)
        if net.vocab_size != mdlm.tokenizer.vocab_size or net.mask_id != mdlm.tokenizer.mask_id:
            raise EnergyError(f"NCE energy {path} was trained for vocabulary size {net.vocab_size} (mask id "
                              f"{net.mask_id}); this MDLM has {mdlm.tokenizer.vocab_size} ({mdlm.tokenizer.mask_id})")
        return cls(net)

    def max_length(self) -> int:
        return self.net.model_config.max_seq_len

    def energy(self, x0: Tensor, xt: Tensor, log_mu: Tensor) -> Tensor:
        return self.net(x0, xt).double()


def tokenizer_record(tokenizer) -> dict[str, str]:
    """What an NCE file keeps of its MDLM's tokenizer: enough to refuse another one, not the vocabulary itself."""
    return {"identity": tokenizer.identity(), "description": tokenizer.describe()}


def save_energy_net(net: EnergyNet, path: str | Path, extra: dict[str, Any] | None = None) -> Path:
    return atomic_torch_save({"format": NCE_FORMAT, "model": to_dict(net.model_config), "vocab_size": net.vocab_size,
                              "mask_id": net.mask_id, "tokenizer": net.tokenizer, "state_dict": net.state_dict(),
                              **(extra or {})}, path, "NCE energy")


def load_energy_net(path: str | Path, device: str | torch.device = "cpu") -> EnergyNet:
    path = Path(path)
    if not path.is_file():
        raise EnergyError(f"NCE energy {path} does not exist")
    try:
        ckpt = load_plain(path, "NCE energy")  # tensors and plain values only: no code from the file runs
    except CheckpointError as e:
        raise EnergyError(str(e)) from e
    if not isinstance(ckpt, dict) or ckpt.get("format") != NCE_FORMAT:
        raise EnergyError(f"{path} is not an NCE energy written by `seqdiff edlm train-nce`")
    net = EnergyNet(from_dict(ModelConfig, ckpt["model"]), int(ckpt["vocab_size"]), int(ckpt["mask_id"]))
    net.load_state_dict(ckpt["state_dict"])
    record = ckpt.get("tokenizer")
    if isinstance(record, dict) and all(isinstance(record.get(k), str) for k in ("identity", "description")):
        net.tokenizer = {"identity": record["identity"], "description": record["description"]}
    return net.to(device).eval()
