"""BD3-LM sampling: block by block, the MDLM reverse process inside a block, a KV cache of the clean prefix.

Arriola et al. 2025 (seqdiff.methods.bd3lm), Algorithm 2. For each block b = 0, 1, ...:
  1. start from the all-MASK block (given tokens, e.g. a prompt, start revealed);
  2. run `steps` MDLM reverse steps t -> s on the uniform grid from 1 to 0, the denoiser reading the block
     against the clean prefix x^<b; draws of the reveal and of the token are float64 (seqdiff.categorical),
     temperature and nucleus (top-p) filtering apply to x_theta before each reveal;
  3. append the finished block to the prefix.

Design choices
- Exact KV cache of the clean prefix (`kv_cache=True`, sampler `bd3lm`): every finished block is run once
  through the backbone with the cache (seqdiff.backbones.dit, `new_kv_cache(blockwise=True)`: a block
  attends to the cached blocks and to itself, exactly the block-causal attention of training); the noisy
  block is denoised against the cache with `update_cache=False`, so each reverse step costs one forward
  of L' tokens, not of the whole prefix. The uncached variant (`bd3lm_uncached`) runs the prefix + block
  under the block-causal mask at every step; both make the same random draws and give the same tokens
  (tested), the cached one faster.
- Skip the denoiser when x_t is unchanged (the cached MDLM sampler's trick, Sahoo et al. 2024 section 4.2):
  without time conditioning the denoiser depends on (prefix, x_t^b) only, so after a step that reveals
  nothing in a row, the previous x_theta is still exact for that row; only rows that changed run (with a
  row-subset copy of the cache). A block whose tokens are all revealed stops early (no further draws).
- Any length: blocks are generated until `seq_len` tokens (the last block is generated in full and cut),
  or, with `stop_at_eos`, until every row holds a generated EOS. Beyond the model's context the prefix
  slides (the paper's sliding window): the denoiser sees the latest whole blocks that fit beside the noisy
  block in `context` tokens (default: the backbone's max_seq_len; `seqdiff.evaluation.generate` sets the
  training length); the cache is then rebuilt from that window in one block-causal pass, at the window's
  own positions, as the uncached sampler reads it.
- Conditioning: `given` (B, L) or (L,), -1 at free positions. A prompt (prefix) is exact. A given token
  inside a block conditions that block (infilling within the current block) and every later one, never an
  earlier block: the model is left to right across blocks.
- Time-conditioned models are refused: the cache holds the prefix computed once, which a time-conditioned
  denoiser would need at every noise level (bd3lm trains without time conditioning).
- Pluggable within-block step: the block loop (`generate`: blocks, prompt, KV cache, sliding window, EOS) is
  written once; what fills a block is `fill_block`, by default the MDLM reverse process above, or, in the
  samplers `within_blocks` builds (registered as bd3lm_first_hitting, bd3lm_remdm, bd3lm_confidence,
  bd3lm_threshold; `sample.sampler=first_hitting` on a bd3lm run picks bd3lm_first_hitting), another
  sampler's `reverse_process` (seqdiff.samplers.base) run on the block with the block's denoiser
  (`block_denoiser`: the block after its clean prefix, through the cache). Such a sampler is exact when its
  inner one is: each block's conditional is drawn by the inner process, across blocks the chain rule is exact.
  A block with nothing left to fill (a prompt covering it) costs no call.
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch
from torch import Tensor

from seqdiff.methods.bd3lm import block_causal_mask
from seqdiff.samplers.base import Denoiser, SampleOutput, Sampler, SamplerError


class BD3LMSampler(Sampler):
    name = "bd3lm"
    methods = ("bd3lm",)
    exact = True  # within each block the model's own reverse process, across blocks its exact conditional
    reads = frozenset({"steps"})  # steps per block; a block sampler reads what its inner sampler reads
    supports_top_p = True
    any_length = True
    """Generates any length itself: no semi-autoregressive wrapping, no context check on seq_len."""
    use_kv_cache = True
    inner_class: ClassVar[type[Sampler] | None] = None
    """The sampler whose `reverse_process` fills each block (None: this sampler's MDLM reverse process)."""

    def __init__(self, method, backbone, steps: int = 128, temperature: float = 1.0, top_p: float = 1.0,
                 stop_at_eos: bool = False, context: int | None = None, **inner_options):
        super().__init__(method, backbone, steps=steps, temperature=temperature, top_p=top_p)
        if self.inner_class is None and inner_options:
            raise TypeError(f"sampler {self.name!r} takes no options {sorted(inner_options)}")
        self.inner = None if self.inner_class is None else self.inner_class(
            method, backbone, steps=steps, temperature=temperature, top_p=top_p, **inner_options)
        """The within-block sampler (its options checked by its own constructor), or None."""
        self.stop_at_eos = stop_at_eos
        """Stop once every row holds a generated EOS (the output may then be shorter than seq_len)."""
        self.context = context
        """Tokens the denoiser may see (clean window + noisy block); None: the backbone's max_seq_len."""

    @classmethod
    def options_from_config(cls, cfg) -> dict:
        return {} if cls.inner_class is None else cls.inner_class.options_from_config(cfg)

    def check_compatible(self) -> None:
        cfg = self.backbone.config
        if getattr(cfg, "time_conditioning", False):
            raise SamplerError(f"sampler {self.name!r} needs a model without time conditioning: the KV cache and the "
                               "skipped denoiser calls hold the prefix computed once, a time-conditioned model would "
                               "need it at every noise level (train bd3lm with model.time_conditioning=false)")
        if self.method.block_size > cfg.max_seq_len:
            raise SamplerError(f"method.block_size={self.method.block_size} exceeds the model's context "
                               f"model.max_seq_len={cfg.max_seq_len}")
        if self.use_kv_cache and not hasattr(self.backbone, "new_kv_cache"):
            raise SamplerError(f"sampler {self.name!r} needs a backbone with a KV cache (the DiT); use "
                               "sample.sampler=bd3lm_uncached")

    def check_length(self, seq_len: int) -> None:
        if seq_len < 1:
            raise SamplerError(f"sample.seq_len must be >= 1, got {seq_len}")

    # ------------------------------------------------------------------ pieces
    def time_grid(self, device) -> Tensor:
        """(steps + 1,) times from 1 to 0, float64."""
        return torch.linspace(1.0, 0.0, self.steps + 1, device=device, dtype=torch.float64)

    def window_blocks(self) -> int:
        """How many clean blocks the denoiser sees beside the noisy one."""
        context = self.context or self.backbone.config.max_seq_len
        context = min(context, self.backbone.config.max_seq_len)
        if self.method.block_size > context:
            raise SamplerError(f"method.block_size={self.method.block_size} exceeds the sampling context {context}")
        return context // self.method.block_size - 1

    def _logits(self, block: Tensor, prefix: Tensor, cache) -> Tensor:
        """The backbone's logits (b, L', V) for the block x_t^b read after its clean prefix x^<b (b rows of each)."""
        if cache is not None:
            return self.backbone(block, kv_cache=cache, update_cache=False)  # (b, L', V)
        if prefix.shape[1] == 0:
            return self.backbone(block)
        seq = torch.cat([prefix, block], dim=1)  # (b, P + L')
        mask = block_causal_mask(seq.shape[1], self.method.block_size, str(seq.device))
        return self.backbone(seq, attn_mask=mask)[:, -block.shape[1]:]

    def _denoise(self, block: Tensor, prefix: Tensor, cache, rows: Tensor | None) -> Tensor:
        """x_theta(x_t^b | x^<b) for the rows `rows` (None: all) as SUBS logits (b, L', V), MASK at -inf."""
        if rows is not None:
            block, prefix = block[rows], prefix[rows]
            cache = None if cache is None else cache.select_rows(rows)
        return self.method.subs_logits(self._logits(block, prefix, cache))

    def block_denoiser(self, prefix: Tensor, cache) -> Denoiser:
        """The current block's denoiser for a within-block sampler: SUBS logits of x_t (its rows `rows` of the B
        being generated) read after their clean prefix (B, P), through the cache when there is one. The time is
        not used: the model has no time conditioning (check_compatible)."""
        def denoise(x: Tensor, t: Tensor, rows: Tensor | None = None) -> Tensor:
            if rows is None:
                return self.method.subs_logits(self._logits(x, prefix, cache))
            sub = None if cache is None else cache.select_rows(rows)
            return self.method.subs_logits(self._logits(x, prefix[rows], sub))  # (b, L', V)

        return denoise

    def _feed(self, tokens: Tensor, cache, attn_mask: Tensor | None = None) -> None:
        """Write clean tokens into the cache (their hidden states are not needed, only their keys / values)."""
        run = getattr(self.backbone, "hidden_states", self.backbone)
        run(tokens, kv_cache=cache, attn_mask=attn_mask)

    def denoise_block(self, block: Tensor, prefix: Tensor, cache, generator) -> tuple[Tensor, int]:
        """The MDLM reverse process over one block (B, L') given its clean prefix; (block, denoiser calls)."""
        method, mask_id = self.method, self.method.mask_id
        B = block.shape[0]
        grid = self.time_grid(block.device)
        logits, prev, calls = None, None, 0  # the SUBS logits (B, L', V); probabilities only where a step reveals
        for i in range(self.steps):
            if not (block == mask_id).any():
                break  # every token is revealed: later steps would change nothing
            if logits is None:
                logits, calls = self._denoise(block, prefix, cache, None), calls + 1
            else:
                changed = (block != prev).any(dim=-1)  # (B,) rows where a token was revealed
                if changed.all():
                    logits, calls = self._denoise(block, prefix, cache, None), calls + 1
                elif changed.any():
                    logits = logits.clone()
                    logits[changed] = self._denoise(block, prefix, cache, changed)
                    calls += 1
            prev = block
            block = method.reveal_step(self.probs_at(logits), block, grid[i].expand(B), grid[i + 1].expand(B),
                                       generator)
        if (block == mask_id).any():  # noise removal for schedules with alpha(0) < 1
            logits, calls = self._denoise(block, prefix, cache, None), calls + 1
            block = method.fill_remaining_at(self.probs_at(logits), block)
        return block, calls

    def fill_block(self, block: Tensor, prefix: Tensor, cache, generator) -> tuple[Tensor, int]:
        """Reveal every MASK of the block (B, L') given its clean prefix: (block, denoiser calls)."""
        if self.inner is None:
            return self.denoise_block(block, prefix, cache, generator)
        if not (block == self.method.mask_id).any():
            return block, 0  # nothing to fill (e.g. a prompt covers the block)
        return self.inner.reverse_process(block, self.block_denoiser(prefix, cache), generator)

    # ------------------------------------------------------------------ loop
    @torch.no_grad()
    def generate(self, batch_size: int, seq_len: int, generator: torch.Generator | None = None,
                 given: Tensor | None = None) -> SampleOutput:
        device, given = self.prepare(batch_size, seq_len, given)
        method = self.method
        Lb = method.block_size
        n_blocks = math.ceil(seq_len / Lb)
        total = n_blocks * Lb
        x = torch.full((batch_size, total), method.mask_id, dtype=torch.long, device=device)  # (B, nb L')
        free = torch.ones((batch_size, total), dtype=torch.bool, device=device)
        if given is not None:
            if (given == method.mask_id).any():
                raise SamplerError("given holds the MASK id; use -1 for free positions")
            fixed = given >= 0
            x[:, :seq_len] = torch.where(fixed, given, x[:, :seq_len])  # given tokens start revealed
            free[:, :seq_len] = ~fixed
        window = self.window_blocks() * Lb  # clean tokens the denoiser sees at most
        cache, cache_start = None, 0
        if self.use_kv_cache:
            cache = self.backbone.new_kv_cache(batch_size, window + Lb, device=device, blockwise=True)
        calls, produced = 0, total
        for b in range(n_blocks):
            lo, hi = b * Lb, (b + 1) * Lb
            start = max(0, lo - window)  # first token of the clean window (a block boundary)
            if cache is not None and start != cache_start:  # slide: rebuild the cache from the window
                cache.reset()
                if lo > start:
                    self._feed(x[:, start:lo], cache, attn_mask=block_causal_mask(lo - start, Lb, str(device)))
                    calls += 1
                cache_start = start
            block, n = self.fill_block(x[:, lo:hi], x[:, start:lo], cache, generator)
            x[:, lo:hi] = block
            calls += n
            if self.stop_at_eos and ((x[:, :hi] == method.eos_id) & free[:, :hi]).any(dim=-1).all():
                produced = hi
                break
            if cache is not None and b + 1 < n_blocks and max(0, hi - window) == cache_start:
                self._feed(block, cache)  # the finished block joins the cached prefix
                calls += 1
        return SampleOutput(tokens=x[:, : min(seq_len, produced)], num_denoiser_calls=calls)


class BD3LMUncachedSampler(BD3LMSampler):
    """The same sampler without the KV cache: the prefix is re-read at every denoiser call (for comparison)."""

    name = "bd3lm_uncached"
    reads = frozenset({"steps"})
    use_kv_cache = False


def within_blocks(inner: type[Sampler], base: type[BD3LMSampler] = BD3LMSampler) -> type[BD3LMSampler]:
    """The block sampler `base` with `inner`'s reverse process inside every block, named `<base>_<inner>`
    (bd3lm_first_hitting); exact when `inner` is, its options (and `steps`, per block) those of `inner`."""
    if not issubclass(base, BD3LMSampler) or not set(base.methods) & set(inner.block_methods):
        raise TypeError(f"sampler {inner.name!r} cannot run inside the blocks of {base.name!r} "
                        f"(its block_methods: {list(inner.block_methods)})")
    attrs = {"name": f"{base.name}_{inner.name}", "inner_class": inner, "exact": inner.exact,
             "reads": inner.reads, "supports_top_p": inner.supports_top_p, "__module__": __name__,
             "__doc__": f"BD3-LM block by block, each block filled by the {inner.name!r} sampler's reverse process."}
    if hasattr(inner, "stats"):
        attrs["stats"] = lambda self: self.inner.stats()
    return type(f"{base.__name__.removesuffix('Sampler')}{inner.__name__.removeprefix('MDLM')}", (base,), attrs)


__all__ = ["BD3LMSampler", "BD3LMUncachedSampler", "within_blocks"]
