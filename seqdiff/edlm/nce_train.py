"""Train the EDLM-NCE energy: a small dedicated loop (the Lightning module trains one backbone with one method;
NCE needs a frozen MDLM, fresh negatives from it every step and a second network, which would not fit it
cleanly).

Each step: blocks x0 of training text (random windows), t from MDLM's time sampler and x_t ~ q(x_t | x0);
negatives x0' ~ mu(. | x_t) from the frozen MDLM (same x_t, so the classifier must tell data from mu's
draws at equal noise); loss = softplus(E(x0, x_t)) + softplus(-E(x0', x_t)) (seqdiff.edlm.nce_energy).
AdamW with linear warm-up (seqdiff.optim); every draw from one seeded generator; the energy is saved with its config and
the MDLM it was trained against.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from seqdiff.checkpoint import LoadedModel
from seqdiff.edlm.base import EnergyError, draw_candidates
from seqdiff.edlm.nce_energy import EnergyNet, nce_loss, save_energy_net, tokenizer_record
from seqdiff.optim import adamw_with_warmup, lr_multiplier
from seqdiff.safe_io import atomic_write_text


@dataclass
class NCEConfig:
    steps: int = 500
    """Optimizer steps."""
    batch_size: int = 32
    """Blocks of data (positives) per step; as many negatives."""
    lr: float = 3e-4
    """AdamW learning rate after warm-up."""
    warmup_steps: int = 50
    """Linear warm-up of the learning rate."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    grad_clip: float = 1.0
    """Gradient norm clip (0: off)."""
    seed: int = 0
    """Seed of every draw (windows, times, masks, negatives)."""
    log_every: int = 25
    """Print loss and classification accuracy every this many steps."""


def random_windows(tokens: np.ndarray, seq_len: int, batch_size: int, generator: torch.Generator) -> torch.Tensor:
    """(batch_size, seq_len) long: windows of the token stream at random offsets."""
    if len(tokens) < seq_len:
        raise EnergyError(f"the training text has {len(tokens)} tokens, fewer than one block of {seq_len}")
    starts = torch.randint(0, len(tokens) - seq_len + 1, (batch_size,), generator=generator)
    stream = torch.as_tensor(np.asarray(tokens), dtype=torch.long)
    return torch.stack([stream[s : s + seq_len] for s in starts.tolist()])


def train_nce(mdlm: LoadedModel, tokens: np.ndarray, cfg: NCEConfig, out: str | Path,
              seq_len: int | None = None) -> tuple[EnergyNet, list[dict]]:
    """Fit an energy network against the frozen MDLM `mdlm` on the token stream `tokens`; save it to `out`."""
    seq_len = seq_len or mdlm.seq_len
    device = next(mdlm.backbone.parameters()).device
    method, backbone = mdlm.method, mdlm.backbone.eval()
    for p in backbone.parameters():
        p.requires_grad_(False)
    net = EnergyNet.from_mdlm(backbone, mdlm.tokenizer.vocab_size, mdlm.tokenizer.mask_id).train()
    net.tokenizer = tokenizer_record(mdlm.tokenizer)
    opt, sched = adamw_with_warmup(net.parameters(), lr_multiplier(cfg.warmup_steps), lr=cfg.lr,
                                   weight_decay=cfg.weight_decay)
    g = torch.Generator().manual_seed(cfg.seed)
    log: list[dict] = []
    start = time.perf_counter()
    for step in range(cfg.steps):
        x0 = random_windows(tokens, seq_len, cfg.batch_size, g).to(device)  # (B, L)
        t = method.sample_times(cfg.batch_size, device, g)
        xt = method.corrupt(x0, t, torch.ones_like(x0, dtype=torch.bool), g)
        with torch.no_grad():
            probs = method.denoise(backbone, xt, t)  # (B, L, V) float64
            negatives = draw_candidates(probs, xt, method.mask_id, 1, g)[:, 0]  # (B, L)
        e_pos, e_neg = net(x0, xt), net(negatives, xt)  # (B,) each
        loss = nce_loss(e_pos, e_neg)
        opt.zero_grad()
        loss.backward()
        if cfg.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(net.parameters(), cfg.grad_clip)
        opt.step()
        sched.step()
        if (step + 1) % cfg.log_every == 0 or step == cfg.steps - 1:
            # a pair is classified right when the data block has the lower energy
            acc = float(((e_pos < 0).float().mean() + (e_neg > 0).float().mean()) / 2)
            row = {"step": step + 1, "loss": float(loss.detach()), "accuracy": acc,
                   "seconds": time.perf_counter() - start}
            log.append(row)
            print(f"[nce] step {row['step']} loss {row['loss']:.4f} accuracy {acc:.3f}", flush=True)
    net.eval()
    save_energy_net(net, out, extra={"mdlm_checkpoint": str(mdlm.path), "nce": asdict(cfg), "seq_len": seq_len,
                                     "log": log})
    atomic_write_text(str(out) + ".log.json", json.dumps(log, indent=1) + "\n", "NCE training log")
    return net, log
