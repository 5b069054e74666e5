"""BD3-LM: block discrete denoising diffusion (Arriola et al., ICLR 2025, "Block Diffusion: Interpolating
Between Autoregressive and Diffusion Language Models", arXiv 2503.09573).

A sequence of L tokens is cut into B = L / L' blocks x^1 .. x^B of L' tokens (L' = `method.block_size`).
log p(x) = sum_b log p(x^b | x^<b), and each factor is an MDLM over the block, conditioned on the clean
earlier blocks, so the NELBO is a sum of per-block MDLM terms:

    -log p(x) <= sum_b E_{t_b} [ w(t_b) sum_{l in block b, masked} -log x_theta(x_{t_b}^b, x^<b)[x_0^l] ],

w(t) = -alpha'(t) / (1 - alpha(t)) (seqdiff.methods.mdlm), each block with its own time t_b (drawn with
low-discrepancy sampling over the batch x blocks), SUBS parameterization (MASK logit -inf, unmasked tokens
carried over). L' = L is MDLM exactly; L' = 1 is autoregression (see below).

Design choices
- One forward pass for every block (the paper's vectorized training): the backbone reads x_t + x_0
  (2L tokens, both halves at rotary positions 0..L-1) under the mask of `training_mask`: noisy block b
  attends to itself and to the clean blocks < b, clean block b to the clean blocks <= b (block-causal),
  nothing attends to a noisy token from another block. The logits of the noisy half are the denoiser of
  every block given its clean prefix: the same as running each block separately after its prefix (tested).
  The DiT takes the mask as `attn_mask` / `positions` (seqdiff.backbones.dit); with L' = L the clean half
  is dropped (no block has a prefix) and the plain bidirectional forward runs.
- L' = 1: a one-token block is masked with probability 1 - alpha(t), so its continuous-time term is
  integral_0^1 -alpha'(t) dt * -log p(x^b | x^<b) = (alpha(0) - alpha(1)) (-log p): the integral has a closed
  form and we evaluate it with the token masked and weight 1 -- the exact AR NLL (the limit eps -> 0 of the
  log-linear schedule's factor 1 - eps), with no variance. The reference code does the same (t = 1, weight 1).
- Clipped ("variance-minimizing") schedules, training only: `method.clip_min` / `clip_max` restrict the
  mask rate 1 - alpha(t) of training draws to [beta, omega] (t mapped through the inverse of the schedule's
  mask rate); the weight stays w(t), so the training objective is then a biased (lower-variance) surrogate,
  as in the paper. Evaluation (`nll`) always draws t in [t_min, 1]: the valid bound. Difference from the
  reference: it also redraws x_t until the realized fraction of masked tokens of each block lies in
  [beta, omega] (`training.resample`); we clip the rate only, so x_t keeps the forward process' law given t.
  `clip_variance` measures the variance of the per-batch training estimate for candidate ranges on
  held-out batches (the paper's "var_min" search); with `method.clip_search` candidates, training runs the
  search at every validation and trains on the range of least variance (seqdiff.training.clip_search).
  Difference from the reference: its criterion is the variance over the batch of the per-block losses of
  one draw (data and noise variance mixed); ours is the variance over noise draws of the batch's mean
  estimate, averaged over batches (the noise variance of the objective the optimizer sees).
- Time conditioning is refused: each block has its own noise level (adaLN conditions a whole sequence on
  one), and the clean prefix held in the sampler's KV cache must not depend on the time. The reference
  trains bd3lm without time conditioning too.
- Continuous time only (method.num_timesteps = 0) and SUBS only.
- The output head runs at the masked positions of the x_t half only (method.head_at_masked, as in MDLM: the
  only positions with a SUBS loss; their expected share is `masked_share`), through the backbone's forward so
  that FSDP's hooks see it, and with method.fused_loss the head and its cross-entropy are one chunked pass
  without the logits (seqdiff.backbones.linear_cross_entropy). Both give the full computation's terms and
  gradients (tested). The reference runs the head on the whole x_t half.

Facts of the method: a bound, not an exact likelihood (except L' = 1); default sampler `bd3lm`
(seqdiff.samplers.bd3lm: block by block with an exact KV cache of the clean prefix).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seqdiff.config import ConfigError, MethodConfig
from seqdiff.methods.base import Batch, MethodOutput
from seqdiff.methods.mdlm import MDLM
from seqdiff.schedules import NoiseSchedule, unit_times
from seqdiff.tokenizers.base import Tokenizer


@functools.lru_cache(maxsize=16)
def training_mask(seq_len: int, block_size: int, device: str = "cpu") -> Tensor:
    """(2L, 2L) bool, True = may attend: rows / columns 0..L-1 are x_t, L..2L-1 are x_0.

    noisy -> noisy: same block; noisy -> clean: earlier blocks; clean -> clean: same or earlier blocks
    (block-causal); clean -> noisy: never.
    """
    block = torch.arange(seq_len, device=device) // block_size
    q, k = block[:, None], block[None, :]  # (L, 1), (1, L)
    top = torch.cat([q == k, k < q], dim=1)  # (L, 2L) queries of x_t
    bottom = torch.cat([torch.zeros_like(q == k), k <= q], dim=1)  # (L, 2L) queries of x_0
    return torch.cat([top, bottom], dim=0)  # (2L, 2L)


@functools.lru_cache(maxsize=16)
def block_causal_mask(seq_len: int, block_size: int, device: str = "cpu") -> Tensor:
    """(L, L) bool: a token attends to every token of its own block and of earlier blocks."""
    block = torch.arange(seq_len, device=device) // block_size
    return block[None, :] <= block[:, None]


def inverse_mask_rate(schedule: NoiseSchedule, rate: float) -> float:
    """The t in [0, 1] with 1 - alpha(t) = rate (bisection in float64; clamps to the ends of [0, 1])."""
    lo, hi = torch.zeros((), dtype=torch.float64), torch.ones((), dtype=torch.float64)
    if float(schedule.mask_probability(hi)) <= rate:
        return 1.0
    if float(schedule.mask_probability(lo)) >= rate:
        return 0.0
    for _ in range(80):
        mid = (lo + hi) / 2
        if float(schedule.mask_probability(mid)) < rate:
            lo = mid
        else:
            hi = mid
    return float((lo + hi) / 2)


class BD3LM(MDLM):
    name = "bd3lm"
    causal = False
    default_time_conditioning = False
    exact_likelihood = False
    """A NELBO (an upper bound on the NLL), reported like MDLM's; exact only for block_size = 1."""
    default_sampler = "bd3lm"
    """The sampler `build_sampler` picks when sample.sampler is null."""
    packable = False
    """Packed documents are refused: its block-causal x_t + x_0 mask would need the segments folded in."""
    own_keys = ("block_size", "clip_min", "clip_max", "clip_search", "clip_search_batches")

    def __init__(self, config: MethodConfig, tokenizer: Tokenizer):
        super().__init__(config, tokenizer)
        if config.num_timesteps != 0:
            raise ConfigError(f"method.num_timesteps={config.num_timesteps}: bd3lm has the continuous-time NELBO "
                              "only; use method.num_timesteps=0")
        if not self.subs:
            raise ConfigError("method.subs=false: bd3lm uses the SUBS parameterization only; use method.subs=true "
                              "or null")
        self.block_size = config.block_size
        self.train_times = self.clip_times(config.clip_min, config.clip_max)
        """Range of t of training draws (the clipped schedule); evaluation uses eval_times."""
        self.eval_times = (config.t_min, 1.0)

    def clip_times(self, clip_min: float | None, clip_max: float | None) -> tuple[float, float]:
        """The range of t whose mask rates 1 - alpha(t) lie in [clip_min, clip_max] (null: t_min / 1)."""
        t_min = self.config.t_min
        t_lo = t_min if clip_min is None else max(t_min, inverse_mask_rate(self.schedule, clip_min))
        t_hi = 1.0 if clip_max is None else inverse_mask_rate(self.schedule, clip_max)
        if t_hi <= t_lo:
            raise ConfigError(f"method.clip_min={clip_min}, method.clip_max={clip_max} leave no times above "
                              f"method.t_min={t_min}; choose clip_max > clip_min")
        return t_lo, t_hi

    def set_train_clip(self, clip_min: float | None, clip_max: float | None) -> None:
        """Train from now on with mask rates in [clip_min, clip_max] (the clip-range search sets it)."""
        self.train_times = self.clip_times(clip_min, clip_max)

    # ------------------------------------------------------------------ checks
    def check_backbone(self, backbone: nn.Module) -> None:
        cfg = getattr(backbone, "config", None)
        if getattr(cfg, "backbone", "dit") != "dit":
            raise ConfigError(f"method.name=bd3lm needs model.backbone=dit (its training pass takes an explicit "
                              f"block-causal attention mask), got model.backbone={cfg.backbone!r}")
        if getattr(cfg, "local_conv", 0):
            raise ConfigError(f"method.name=bd3lm needs model.local_conv=0 (got {cfg.local_conv}): a kernel at the end "
                              "of a block would read the next block, which block diffusion keeps hidden")
        if getattr(cfg, "kmer_sizes", None):
            raise ConfigError(f"method.name=bd3lm needs model.kmer_sizes=[] (got {cfg.kmer_sizes}): a k-mer at the end "
                              "of a block would read the next block, which block diffusion keeps hidden")
        if getattr(cfg, "time_conditioning", False):
            raise ConfigError("method.name=bd3lm needs model.time_conditioning=false: every block has its own noise "
                              "level and the clean prefix in the KV cache must not depend on time")
        context = getattr(cfg, "max_seq_len", None)
        if context is not None and self.block_size > context:
            raise ConfigError(f"method.block_size={self.block_size} exceeds the model's context "
                              f"model.max_seq_len={context}")

    def check_recipe(self, config) -> None:
        """Refuse a recipe (RunConfig) this method cannot train, before anything is written."""
        seq_len, context = config.data.seq_len, config.model.max_seq_len
        if config.model.backbone != "dit":
            raise ConfigError(f"method.name=bd3lm needs model.backbone=dit (its training pass takes an explicit "
                              f"block-causal attention mask), got model.backbone={config.model.backbone!r}")
        if self.block_size > context:
            raise ConfigError(f"method.block_size={self.block_size} exceeds the model's context "
                              f"model.max_seq_len={context}")
        if seq_len % self.block_size != 0:
            raise ConfigError(f"method.block_size={self.block_size} must divide data.seq_len={seq_len} (blocks of "
                              f"equal length); e.g. one of {divisors(seq_len)}")
        if config.model.time_conditioning:
            raise ConfigError("method.name=bd3lm needs model.time_conditioning=false (or null): every block has its "
                              "own noise level and the clean prefix in the KV cache must not depend on time")

    def check_length(self, seq_len: int) -> None:
        if seq_len % self.block_size != 0:
            raise ConfigError(f"method.block_size={self.block_size} must divide the sequence length {seq_len}; "
                              f"e.g. one of {divisors(seq_len)}")

    # ------------------------------------------------------------------ forward
    def attention_structure(self, seq_len: int, device) -> Tensor:
        """(L, L) bool: how a sequence of clean blocks (+ a noisy last block) is read at inference: block-causal.
        Exported models (seqdiff.hf) run their forward under it."""
        return block_causal_mask(seq_len, self.block_size, str(device))

    def block_logits(self, backbone: nn.Module, xt: Tensor, x0: Tensor, attention_mask: Tensor | None = None,
                     index: Tensor | None = None, **head) -> Tensor | tuple[Tensor, Tensor]:
        """Denoiser logits (B, L, V) of every block given its clean prefix, in one pass over x_t + x_0.

        A backbone that selects outputs runs its head on the noisy half only, through its forward (so that
        FSDP's and DDP's hooks gather and see the head's weights; calling its parts directly fails under
        train.strategy=fsdp2). index: (N,) flat positions b * L + i of the noisy half: the head there only,
        logits (N, V) (the sparse head). `head`: exclude_id, targets, token_weight for that head (DiT.forward),
        one per output position; with targets the result is the fused loss, not logits."""
        B, L = xt.shape
        if self.block_size >= L:  # one block: no prefix, the plain bidirectional forward
            return backbone(xt, attention_mask=attention_mask, **({} if index is None else {"output_index": index}),
                            **head)
        tokens = torch.cat([xt, x0], dim=1)  # (B, 2L)
        positions = torch.arange(L, device=xt.device).repeat(2)  # (2L,) both halves at 0..L-1
        mask = training_mask(L, self.block_size, str(xt.device))  # (2L, 2L)
        pad = None if attention_mask is None else torch.cat([attention_mask, attention_mask], dim=1).bool()
        kwargs = {"attention_mask": pad, "attn_mask": mask, "positions": positions}
        if getattr(backbone, "selects_outputs", False):  # the output head only for the noisy half
            flat = torch.arange(B * L, device=xt.device) if index is None else index  # (N,) in the (B, L) layout
            out = backbone(tokens, output_index=flat + (flat // L) * L, **kwargs, **head)  # b 2L + i in (B, 2L)
            return out if "targets" in head or index is not None else out.view(B, L, -1)  # (B, L, V) or (N, V)
        if head or index is not None:
            raise ValueError("block_logits: head options need a backbone that selects outputs")
        return backbone(tokens, **kwargs)[:, :L]

    def sample_block_times(self, batch_size: int, num_blocks: int, device, generator: torch.Generator | None,
                           times: tuple[float, float]) -> Tensor:
        """(B, num_blocks) times in [lo, hi], low-discrepancy over all B * num_blocks draws (row-major strata)."""
        lo, hi = times
        u = unit_times(batch_size * num_blocks, self.time_sampling, generator, device)
        return (lo + (hi - lo) * u).view(batch_size, num_blocks)

    def block_loss(self, backbone: nn.Module, batch: Batch, generator: torch.Generator | None,
                   times: tuple[float, float]) -> tuple[Tensor, Tensor]:
        """(per-token NELBO terms (B, L) in float32, scored (B, L), their sum): one draw of t per block and of
        x_t. The sum carries the gradient; with method.fused_loss the per-token terms carry none."""
        batch = Batch.from_any(batch)
        x0 = batch.input_ids  # (B, L)
        B, L = x0.shape
        self.check_length(L)
        scored = batch.scored(self.pad_id)  # (B, L)
        if self.block_size == 1:  # the closed form of a one-token block: masked, weight 1 (exact NLL)
            xt = torch.where(scored, self.mask_id, x0)
            weight = torch.ones(x0.shape, device=x0.device)
        else:
            t = self.sample_block_times(B, L // self.block_size, x0.device, generator, times)  # (B, nb)
            t = t.repeat_interleave(self.block_size, dim=1)  # (B, L) each token at its block's time
            p_mask = self.schedule.mask_probability(t)
            u = torch.rand(x0.shape, generator=generator, device=x0.device)
            xt = torch.where((u < p_mask) & scored, self.mask_id, x0)  # (B, L)
            weight = self.schedule.nelbo_weight(t)  # (B, L)
        masked = xt == self.mask_id  # SUBS carry-over: only masked positions carry loss
        if self.uses_sparse_head(backbone):  # the head (and loss) at the masked positions of x_t only
            index = self.masked_positions(xt)  # (N,) flat b * L + i
            token_weight, targets = weight.flatten()[index].float(), x0.flatten()[index]  # (N,) each
            if self.uses_fused_loss(backbone):  # method.fused_loss: the weighted sum without the (N, V) logits
                total, nll = self.block_logits(backbone, xt, x0, batch.attention_mask, index, exclude_id=self.mask_id,
                                               targets=targets, token_weight=token_weight)
                terms = (token_weight * nll.to(token_weight.dtype)).detach()  # (N,), no gradient
            else:
                logits = self.block_logits(backbone, xt, x0, batch.attention_mask, index, exclude_id=self.mask_id)
                terms = token_weight * F.cross_entropy(logits.float(), targets, reduction="none")  # (N,)
                total = terms.sum()
            per_token = torch.zeros(x0.numel(), dtype=terms.dtype, device=x0.device).index_put((index,), terms)
            return per_token.view_as(x0), scored, total
        logits = self.subs_logits(self.block_logits(backbone, xt, x0, batch.attention_mask))  # (B, L, V)
        nll = F.cross_entropy(logits.flatten(0, 1).float(), x0.flatten(), reduction="none").view_as(x0)
        per_token = torch.where(masked, weight * nll, torch.zeros_like(nll))
        return per_token, scored, per_token.sum()

    def _output(self, per_token: Tensor, scored: Tensor, total: Tensor) -> MethodOutput:
        num_tokens = scored.sum().to(torch.float64)
        loss = total / num_tokens.clamp(min=1).to(total.dtype)
        return MethodOutput(loss=loss, nll_sum=per_token.detach().to(torch.float64).sum(), num_tokens=num_tokens)

    # ------------------------------------------------------------------ objective
    @staticmethod
    def _refuse_packed(batch) -> None:
        if Batch.from_any(batch).segment_ids is not None:
            raise ValueError("bd3lm does not take packed documents (segment_ids); use data.text.block_mode=padded")

    fusable_loss = True
    """The block loss is a weighted cross-entropy of the head over the x_t half (method.fused_loss)."""

    def masked_share(self) -> float:
        """Expected share of the scored positions a training draw masks (where method.head_at_masked runs the
        head): the mean of 1 - alpha(t) over t ~ U[train_times] (the clipped range; midpoint rule), 1 for
        one-token blocks (always masked)."""
        if self.block_size == 1:
            return 1.0
        lo, hi = self.train_times
        t = lo + (hi - lo) * (torch.arange(4096, dtype=torch.float64) + 0.5) / 4096
        return float(self.schedule.mask_probability(t).mean())

    def loss(self, backbone: nn.Module, batch: Batch, generator: torch.Generator | None = None) -> MethodOutput:
        """The training objective: the block NELBO with t in `train_times` (the clipped range, if any)."""
        self._refuse_packed(batch)
        return self._output(*self.block_loss(backbone, batch, generator, self.train_times))

    def bound(self, backbone: nn.Module, batch: Batch, generator: torch.Generator | None = None) -> MethodOutput:
        """One draw of the block NELBO with t in [t_min, 1] (never clipped)."""
        self._refuse_packed(batch)
        return self._output(*self.block_loss(backbone, batch, generator, self.eval_times))


@torch.no_grad()
def clip_variance(method: BD3LM, backbone: nn.Module, batches: list, candidates: list[tuple[float, float]],
                  generator: torch.Generator | None = None, draws: int = 4) -> dict[tuple[float, float], float]:
    """The paper's "var_min" criterion: for each candidate mask-rate range (beta, omega), the variance (over
    `draws` noise draws, averaged over `batches`) of the per-token training estimate. A lower variance means
    a steadier gradient; the bound itself is always evaluated unclipped (`BD3LM.nll`)."""
    out = {}
    for beta, omega in candidates:
        lo, hi = method.clip_times(beta, omega)
        variances = []
        for batch in batches:
            values = []
            for _ in range(draws):
                per_token, scored, _ = method.block_loss(backbone, batch, generator, (lo, hi))
                values.append(float(per_token.double().sum() / scored.sum().clamp(min=1)))
            variances.append(torch.tensor(values, dtype=torch.float64).var().item())
        out[(beta, omega)] = float(sum(variances) / len(variances))
    return out


def divisors(n: int) -> list[int]:
    """The block sizes that cut n tokens into equal blocks."""
    return [d for d in range(1, n + 1) if n % d == 0]


__all__ = ["BD3LM", "block_causal_mask", "clip_variance", "divisors", "inverse_mask_rate", "training_mask"]
