"""MDLM: masked diffusion language model (Sahoo et al., NeurIPS 2024, arXiv 2406.07524).

- Forward process: each token is independently replaced by MASK with probability 1 - alpha(t).
- SUBS parameterization of the denoiser x_theta(x_t): the MASK logit is -inf before the softmax (zero
  mask probability), and unmasked positions carry over their input (so they contribute exactly zero loss).
- Continuous-time NELBO: E_t [ w(t) * sum over masked positions of -log x_theta(x_t)[x_0] ],
  w(t) = -alpha'(t) / (1 - alpha(t)); t from antithetic sampling in [t_min, 1].
- Discrete-time NELBO with T steps (optional): t = i/T, s = (i-1)/T, weight T (alpha_s - alpha_t)/(1 - alpha_t);
  it approaches the continuous bound from above as T grows.
- Reverse step q(x_s | x_t, x_0 ~ x_theta): a masked token stays masked with probability
  (1 - alpha_s)/(1 - alpha_t), else becomes v with probability x_theta[v] (alpha_s - alpha_t)/(1 - alpha_t).
- `method.time_sampling: mask_count` (RADD / MD4's form of the same bound; Ou et al. 2024, arXiv 2406.03736;
  Shi et al. 2024, arXiv 2406.04329): for a time-agnostic SUBS denoiser the continuous NELBO of a sequence of
  n scored tokens is sum_k (1/k) E[sum over masked of -log x_theta | k random positions masked], since
  int_0^1 (1/t) C(n,k) t^k (1-t)^(n-k) dt = 1/k. So each row draws k uniformly from 1..n (stratified over the
  batch), masks a uniformly random k-subset and weighs its cross-entropy by n/k <= n. No 1/t weight meets a
  nearly clean row, which is where the time-based draws get most of their variance (reports/variance).
  It estimates the untruncated bound (t_min -> 0, eps -> 0); the time-based draws estimate the one truncated
  at t_min, O(t_min + eps) apart. Needs num_timesteps = 0, SUBS, and no time conditioning.
- `method.complementary_masks` (off by default; reports/variance): every row is scored twice in one forward, once
  with its draw and once with a partner draw whose masked set is (nearly) the complement, so that the pair sees
  every token of the sequence masked once. Each partner is on its own an exact draw of the same estimator, so the
  pair's mean stays unbiased. Time-based draws: the partner has the antithetic time t' = 1 + t_min - t (uniform
  on [t_min, 1] like t) and masks position i iff u_i >= 1 - p(t'), from the same uniforms u_i that masked the
  first draw where u_i < p(t): for loglinear, p(t) + p(t') = (1 - eps)(1 + t_min), so the two sets miss
  complementarity only where u_i falls in a band of width |1 - (1 - eps)(1 + t_min)| (1e-6 at the defaults).
  mask_count: the first draw masks the k lowest-ranked positions, the partner the n + 1 - k highest (ranks k..n
  counted from 1), uniform on 1..n as well; the two share exactly one position. A batch of B rows costs 2B rows
  of forward and backward: halve data.batch_size to compare at equal cost. The loss is the pair's mean.
- Micro-batches (`train.micro_batch_size`): `loss(..., rows=slice)` draws the noise of the whole batch and scores
  only those rows, so a batch split into micro-batches sees exactly the noise of the unsplit one.
- Packed documents (data.text.block_mode=packed, Batch.segment_ids): the backbone keeps attention inside each
  document, so the denoiser of a document sees only that document. One t (and one mask-count draw) per row is
  shared by the documents of the row: each document's masked positions are still drawn independently with
  rate 1 - alpha(t) given t, and t ~ U[t_min, 1] marginally, so each document's term is an unbiased estimate
  of its own NELBO and the row's loss is their sum (tested with the same noise). Under mask_count, k is drawn
  over the row's n scored tokens, not per document: the row's estimate stays unbiased for the row's bound
  (the sum of its documents' bounds, since attention never crosses them).
- `method.fused_loss` (null: on at a vocabulary of 4,096 ids or more): with the sparse head, the backbone returns
  the weighted cross-entropy sum of the masked positions directly, chunk by chunk, without their (N, V)
  logits (seqdiff.backbones.linear_cross_entropy); the same loss and gradients to float rounding (tested).
- `method.head_at_masked` (on by default): with SUBS only masked positions carry loss, so the backbone is asked
  for the logits of those positions only (`output_index`); the loss is the same sum, and at GPT-2's vocabulary
  the output head and its softmax, a large share of the step, run on about half the positions (a third under the
  default mask-count law); the DiT also runs its last block's MLP only there (`DiT.last_block_at_outputs`).
- Time conditioning is optional and off by default (the SUBS model is time-agnostic; the cached sampler
  relies on it).
- Ablation `method.subs: false` (the MDLM paper's "w/o SUBS" ablation row): the D3PM-style x0-parameterization
  (Austin et al. 2021, eq. 4). The denoiser is a softmax over the whole vocabulary, MASK included (no zero-
  masking, no forced carry-over), and each masked position pays KL(q(x_s | x_t, x_0) || p(x_s | x_t)) in full
  (seqdiff.methods.graphs.absorbing_posterior_kl), times T; in continuous time its limit
  w(t) [-log pi_x0 + log(1 + alpha pi_M / (1 - alpha)) - pi_M / (1 - alpha + alpha pi_M)]. Unmasked positions
  still cost nothing (eq. 4 keeps them exactly), and the reverse step reveals with probability
  (alpha_s - alpha_t)(1 - pi_M) / ((1 - alpha_t) + alpha_t pi_M). With pi_M = 0 both reduce to the SUBS forms.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seqdiff.categorical import probs_from_logits, sample_categorical
from seqdiff.config import ConfigError, MethodConfig
from seqdiff.methods.base import Batch, Method, MethodOutput
from seqdiff.methods.graphs import absorbing_posterior_kl, absorbing_posterior_kl_rate, absorbing_reverse_step
from seqdiff.schedules import build_schedule, resolved_time_sampling, stratified_times, unit_times
from seqdiff.tokenizers.base import Tokenizer

NEG_INF = float("-inf")


class MDLM(Method):
    name = "mdlm"
    causal = False
    whole_batch_noise = True
    """loss(rows=...) draws the noise of the whole batch and scores the rows asked for (see the module docstring)."""
    exact_likelihood = False
    """A NELBO (an upper bound on the NLL) over random masking times."""
    default_sampler = "cached"
    """Ancestral sampling that skips the denoiser when nothing was unmasked."""
    fusable_loss = True
    """With SUBS and the sparse head: a weighted cross-entropy at the masked positions (method.fused_loss)."""
    packable = True
    """Packed documents: one t per row, each document's term unbiased (module docstring)."""

    def __init__(self, config: MethodConfig, tokenizer: Tokenizer):
        super().__init__(config, tokenizer)
        self.schedule = build_schedule(config.schedule)
        self.subs = True if config.subs is None else config.subs
        if config.time_sampling == "mask_count" and (config.num_timesteps != 0 or not self.subs):
            raise ConfigError(f"method.time_sampling=mask_count is the continuous-time SUBS bound of {self.name}: it "
                              f"needs method.num_timesteps=0 and SUBS (got num_timesteps={config.num_timesteps}, "
                              f"subs={self.subs}); use antithetic_jitter")
        self.time_sampling, self.mask_count_law = self.resolve_time_sampling(config)
        if config.fused_loss is True and not (self.subs and config.head_at_masked):
            raise ConfigError("method.fused_loss=true needs mdlm's SUBS loss at the masked positions (method.subs "
                              "and method.head_at_masked true): set it to null or false")

    def resolve_time_sampling(self, config: MethodConfig, time_conditioned: bool = False) -> tuple[str, str]:
        """(time sampling, law of mask_count's k) that method.time_sampling asks for. auto: mask_count with
        q(k) ∝ k^(-1/2) where it applies (mdlm's own bound, continuous time, SUBS, a time-agnostic backbone, which
        check_backbone tells), antithetic otherwise; d3pm and bd3lm, subclasses with their own bounds, keep
        antithetic. The choice is measured in reports/variance: at 64-1,024 characters a row 1.7-1.9x lower
        gradient variance than antithetic with fresh data, and at 512 ahead in training by 0.25 bits after 480
        steps (3 seeds; level at 128 there, 0.06-0.07 bits ahead in the quickstart's recipe at 128)."""
        if config.time_sampling != "auto":
            return config.time_sampling, config.mask_count_law
        if self.name == "mdlm" and config.num_timesteps == 0 and self.subs and not time_conditioned:
            return "mask_count", "inverse_sqrt"
        return resolved_time_sampling("auto"), config.mask_count_law

    def check_backbone(self, backbone: nn.Module) -> None:
        """mask_count gives the denoiser no time: refuse a time-conditioned backbone (auto: draw times instead)."""
        config = getattr(backbone, "config", None)
        time_conditioned = bool(getattr(config, "time_conditioning", False))
        if self.config.time_sampling == "auto":
            self.time_sampling, self.mask_count_law = self.resolve_time_sampling(self.config, time_conditioned)
        if self.time_sampling == "mask_count" and time_conditioned:
            raise ConfigError("method.time_sampling=mask_count needs a time-agnostic denoiser (model.time_conditioning="
                              "false); with time conditioning use antithetic_jitter")

    # ------------------------------------------------------------------ forward process
    def sample_times(self, batch_size: int, device, generator: torch.Generator | None) -> Tensor:
        """(B,) times; in discrete mode these are the grid points i/T, i in 1..T."""
        cfg = self.config
        # mask_count draws no times in loss(); callers that corrupt by time themselves get stratified times
        sampling = "antithetic_jitter" if self.time_sampling == "mask_count" else self.time_sampling
        u = unit_times(batch_size, sampling, generator, device)
        if cfg.num_timesteps > 0:
            T = cfg.num_timesteps
            return (torch.floor(u * T).clamp(max=T - 1) + 1) / T
        return cfg.t_min + (1 - cfg.t_min) * u

    def draw_noise(self, x0: Tensor, scored: Tensor, generator: torch.Generator | None,
                   complementary: bool = False) -> tuple[Tensor, Tensor, Tensor]:
        """(t (B,), x_t (B, L), weight (B,)): the times, corrupted tokens and loss weights of one training draw.
        complementary: (2B,), (2B, L), (2B,), row B + i the partner of row i (module docstring)."""
        if self.time_sampling == "mask_count":
            return self.mask_count_noise(x0, scored, generator, complementary)
        t = self.sample_times(x0.shape[0], x0.device, generator)  # (B,)
        if not complementary:
            return t, self.corrupt(x0, t, scored, generator), self.loss_weight(t)
        u = torch.rand(x0.shape, generator=generator, device=x0.device)  # (B, L), as corrupt() draws them
        xt = self.mask_where(x0, (u < self.schedule.mask_probability(t)[:, None]) & scored)  # (B, L)
        t2 = self.config.t_min + 1 - t  # (B,) antithetic: uniform on [t_min, 1] (the grid i/T -> (T + 1 - i)/T)
        if self.config.num_timesteps > 0:
            t2 = 1 + 1 / self.config.num_timesteps - t
        xt2 = self.mask_where(x0, (u >= 1 - self.schedule.mask_probability(t2)[:, None]) & scored)
        t_both = torch.cat([t, t2])
        return t_both, torch.cat([xt, xt2]), self.loss_weight(t_both)

    def mask_where(self, x0: Tensor, masked: Tensor) -> Tensor:
        return torch.where(masked, self.mask_id, x0)

    def mask_count_noise(self, x0: Tensor, scored: Tensor, generator: torch.Generator | None,
                         complementary: bool = False) -> tuple[Tensor, Tensor, Tensor]:
        """k ~ U{1..n} per row (stratified over the batch), a uniformly random k-subset of the n scored positions
        masked, weight n / k. t = k / n is what a time-conditioned backbone would see (none may: check_backbone).
        complementary: 2B rows, row B + i masking the n + 1 - k highest-ranked positions of row i."""
        n = scored.sum(1)  # (B,) scored tokens per row
        s = stratified_times(x0.shape[0], generator, x0.device)  # (B,) in [0, 1), one per stratum
        k, q_k = self.mask_count_k(s, n, x0.shape[1])  # (B,) k on 1..n (0 where nothing is scored), q(k)
        keys = torch.rand(x0.shape, generator=generator, device=x0.device).masked_fill(~scored, 2.0)  # (B, L)
        rank = keys.argsort(1).argsort(1)  # (B, L) rank of each key in its row; unscored positions rank last
        masked = rank < k[:, None]  # (B, L) exactly k masked, all scored
        if complementary:  # ranks k - 1 .. n - 1 (0-based): n + 1 - k positions, one shared with the first draw
            masked = torch.cat([masked, (rank >= (k - 1)[:, None]) & scored])
            n, k, q_k = n.repeat(2), torch.cat([k, torch.where(n > 0, n + 1 - k, 0)]), q_k.repeat(2)
            x0 = x0.repeat(2, 1)
        xt = self.mask_where(x0, masked)
        # n/k p(k)/q(k) = 1/(k q(k)) with p uniform (n/k for uniform q); the partner k' = n + 1 - k has the law
        # q(n + 1 - k'), the first draw's probability, so the same form holds for it
        weight = torch.where(n > 0, 1 / (k.clamp(min=1) * q_k), 0.0).float()  # (B,)
        t = (k / n.clamp(min=1)).float().clamp(min=max(self.config.t_min, 1e-6))
        return t, xt, weight

    def mask_count_k(self, s: Tensor, n: Tensor, length: int) -> tuple[Tensor, Tensor]:
        """(k (B,), q(k) (B,) float64): k on 1..n from the uniforms s (B,) in [0, 1) by the inverse CDF of
        method.mask_count_law (uniform, or q(k) ∝ k^(-1/2)); k = 0 and q = 1 where n = 0. `length` >= n: the
        rows' length (a host number, so the CDF's size costs no device-to-host sync)."""
        if self.mask_count_law == "uniform":
            k = torch.minimum(1 + torch.floor(s * n), n)
            return k, torch.where(n > 0, 1 / n.clamp(min=1).double(), 1.0)
        j = torch.arange(1, max(length, 1) + 1, device=n.device, dtype=torch.float64)  # (J,), zero mass past n
        mass = j.rsqrt() * (j <= n[:, None])  # (B, J) k^(-1/2) on 1..n
        cdf = mass.cumsum(1)  # (B, J)
        total = cdf[:, -1:].clamp(min=1e-300)  # (B, 1) sum_{j <= n} j^(-1/2)
        k = torch.searchsorted(cdf / total, s.double()[:, None], right=True)[:, 0] + 1  # (B,) on 1..n
        k = torch.where(n > 0, torch.minimum(k, n), 0)
        q_k = torch.where(n > 0, k.clamp(min=1).double().rsqrt() / total[:, 0], 1.0)
        return k, q_k

    def corrupt(self, x0: Tensor, t: Tensor, maskable: Tensor, generator: torch.Generator | None) -> Tensor:
        """x_t ~ q(x_t | x_0): mask each maskable token with probability 1 - alpha(t)."""
        p_mask = self.schedule.mask_probability(t)[:, None]  # (B, 1)
        u = torch.rand(x0.shape, generator=generator, device=x0.device)
        return torch.where((u < p_mask) & maskable, self.mask_id, x0)

    def loss_weight(self, t: Tensor) -> Tensor:
        """(B,) weight of the masked cross-entropy at time t (continuous or discrete NELBO)."""
        T = self.config.num_timesteps
        if T > 0:
            s = t - 1.0 / T
            a_t, a_s = self.schedule.alpha(t), self.schedule.alpha(s)
            return T * (a_s - a_t) / self.schedule.one_minus_alpha(t)
        return self.schedule.nelbo_weight(t)

    def uses_sparse_head(self, backbone: nn.Module) -> bool:
        """Whether `loss` asks `backbone` for the masked positions' logits only (method.head_at_masked)."""
        return self.subs and self.config.head_at_masked and getattr(backbone, "selects_outputs", False)

    def head_share(self, backbone: nn.Module) -> float:
        return self.masked_share() if self.uses_sparse_head(backbone) else 1.0

    def masked_positions(self, xt: Tensor) -> Tensor:
        """(N,) flat positions b * L + i of the masked tokens of x_t (B, L): where the sparse head runs."""
        index = (xt == self.mask_id).flatten().nonzero()[:, 0]  # (N,)
        if "torch._dynamo" in sys.modules:  # else nothing is compiled (and importing it takes ~2 s)
            torch._dynamo.maybe_mark_dynamic(index, 0)  # N changes every call: a compiled backbone compiles once
        return index

    def masked_logits(self, backbone: nn.Module, xt: Tensor, t: Tensor, **kwargs) -> tuple[Tensor, Tensor]:
        """(flat positions of the masked tokens (N,), their SUBS logits (N, V), MASK at -inf): the sparse head."""
        index = self.masked_positions(xt)
        logits = backbone(xt, noise_level=self.noise_level(t), output_index=index, exclude_id=self.mask_id, **kwargs)
        return index, self._without_never_sampled(logits)

    def masked_share(self) -> float:
        """Expected share of the scored positions that a training draw masks: where method.head_at_masked runs
        the output head (for FLOP counts). Time-based draws: the mean of 1 - alpha(t) over t ~ U[t_min, 1] (the
        grid i/T in discrete time); mask_count: E[k / n] = (n + 1) / (2n), taken as 1/2."""
        if self.time_sampling == "mask_count":  # E[k/n]: 1/2 uniform; sum sqrt(k) / (n sum k^(-1/2)) -> 1/3
            return 0.5 if self.mask_count_law == "uniform" else 1 / 3
        T = self.config.num_timesteps
        if T > 0:
            t = torch.arange(1, T + 1, dtype=torch.float64) / T
        else:  # midpoint rule; 1 - alpha is smooth on [t_min, 1]
            t = self.config.t_min + (1 - self.config.t_min) * (torch.arange(4096, dtype=torch.float64) + 0.5) / 4096
        return float(self.schedule.mask_probability(t).mean())

    # ------------------------------------------------------------------ parameterization
    def noise_level(self, t: Tensor) -> Tensor:
        """What a time-conditioned backbone sees (ignored by unconditioned ones): sigma(t)."""
        return self.schedule.sigma(t)

    def subs_logits(self, logits: Tensor) -> Tensor:
        """Zero mask probability: the MASK logit becomes -inf before normalization (and, while generating, the
        logits of `never_sampled`)."""
        ids = [self.mask_id, *self.never_sampled]
        return logits.index_fill(-1, torch.tensor(ids, device=logits.device), NEG_INF)

    def _without_never_sampled(self, logits: Tensor) -> Tensor:
        """The logits of `never_sampled` at -inf (generating: see Method.sampling_without); else unchanged."""
        if not self.never_sampled:
            return logits
        return logits.index_fill(-1, torch.tensor(self.never_sampled, device=logits.device), NEG_INF)

    def subs_log_probs(self, logits: Tensor, xt: Tensor) -> Tensor:
        """Full SUBS log x_theta(x_t): (B, L, V); unmasked positions are a one-hot on their token."""
        log_probs = torch.log_softmax(self.subs_logits(logits).float(), dim=-1)
        carry = torch.full_like(log_probs, NEG_INF).scatter_(-1, xt[..., None], 0.0)
        return torch.where((xt == self.mask_id)[..., None], log_probs, carry)

    # ------------------------------------------------------------------ without SUBS (ablation; D3PM)
    def grid_alpha(self, t: Tensor) -> Tensor:
        """alpha on the discrete grid of the no-SUBS bound (D3PM pins alpha(0) = 1 and alpha(1) = 0)."""
        return self.schedule.alpha(t)

    def per_token_without_subs(self, logits: Tensor, x0: Tensor, xt: Tensor, t: Tensor) -> Tensor:
        """(B, L) bound terms of the x0-parameterization with the model's own MASK probability (float32)."""
        log_probs = torch.log_softmax(logits.float(), dim=-1)  # (B, L, V), MASK included
        log_p_x0 = log_probs.gather(-1, x0[..., None])[..., 0].double()  # (B, L)
        p_mask = log_probs[..., self.mask_id].exp().double()  # (B, L)
        T = self.config.num_timesteps
        if T > 0:
            step = torch.round(t.double() * T)  # (B,) grid index i in 1..T: t = i/T, s = (i-1)/T exactly
            a_t, a_s = self.grid_alpha(step / T)[:, None], self.grid_alpha((step - 1) / T)[:, None]
            per_token = T * absorbing_posterior_kl(log_p_x0, p_mask, a_s, a_t)
        else:
            t = t.double()
            weight = self.schedule.nelbo_weight(t)[:, None]
            per_token = weight * absorbing_posterior_kl_rate(log_p_x0, p_mask, self.schedule.alpha(t)[:, None])
        per_token = per_token.float()
        return torch.where(xt == self.mask_id, per_token, torch.zeros_like(per_token))

    # ------------------------------------------------------------------ objective
    def loss(self, backbone: nn.Module, batch: Batch, generator: torch.Generator | None = None,
             rows: slice | None = None) -> MethodOutput:
        """The NELBO estimate of `batch`, or of its `rows` only, with the noise the whole batch would draw."""
        batch = Batch.from_any(batch)
        x0 = batch.input_ids  # (B, L)
        scored = batch.scored(self.pad_id)  # (B, L) positions that count
        pairs = self.config.complementary_masks
        t, xt, weight = self.draw_noise(x0, scored, generator, pairs)  # (B,), (B, L), (B,); (2B, ...) in pairs
        attention_mask, packing = batch.attention_mask, batch.packing()
        if rows is not None:  # a micro-batch: (b, ...) from here on
            x0, scored = x0[rows], scored[rows]
            attention_mask = attention_mask[rows] if attention_mask is not None else None
            packing = batch.packing(rows)
            picked = torch.arange(batch.input_ids.shape[0], device=x0.device)[rows]  # (b,) rows of the batch
            if pairs:  # each row's partner comes along
                picked = torch.cat([picked, picked + batch.input_ids.shape[0]])
            t, xt, weight = t[picked], xt[picked], weight[picked]
        if pairs:  # row b + i scores row i again, with the partner draw
            x0 = x0.repeat(2, 1)
            attention_mask = attention_mask.repeat(2, 1) if attention_mask is not None else None
            packing = {k: v.repeat(2, 1) for k, v in packing.items()}
        masked = xt == self.mask_id  # (B, L) SUBS carry-over: only masked positions carry loss
        if self.uses_sparse_head(backbone) and self.uses_fused_loss(backbone):
            index = self.masked_positions(xt)  # (N,)
            total, _ = backbone(xt, noise_level=self.noise_level(t), attention_mask=attention_mask, output_index=index,
                                exclude_id=self.mask_id, targets=x0.flatten()[index],
                                token_weight=weight[index // x0.shape[1]], **packing)
            per_token = total[None]  # (1,) the sum of the (N,) terms, taken in one chunked pass
        elif self.uses_sparse_head(backbone):
            index, logits = self.masked_logits(backbone, xt, t, attention_mask=attention_mask, **packing)
            nll = F.cross_entropy(logits.float(), x0.flatten()[index], reduction="none")  # (N,)
            per_token = weight[index // x0.shape[1]] * nll  # (N,) the nonzero terms of the (B, L) sum below
        elif self.subs:
            logits = backbone(xt, noise_level=self.noise_level(t), attention_mask=attention_mask,
                              **packing)  # (B, L, V)
            logits = self.subs_logits(logits)
            nll = F.cross_entropy(logits.flatten(0, 1).float(), x0.flatten(), reduction="none").view_as(x0)
            per_token = torch.where(masked, weight[:, None] * nll, torch.zeros_like(nll))  # (B, L)
        else:
            logits = backbone(xt, noise_level=self.noise_level(t), attention_mask=attention_mask, **packing)
            per_token = self.per_token_without_subs(logits, x0, xt, t)  # (B, L)
        num_tokens = scored.sum().to(torch.float64)
        draws = 2 if pairs else 1  # the pair's mean
        loss = per_token.sum() / (draws * num_tokens.clamp(min=1)).to(per_token.dtype)
        return MethodOutput(loss=loss, nll_sum=per_token.detach().to(torch.float64).sum() / draws,
                            num_tokens=num_tokens)

    # ------------------------------------------------------------------ reverse process
    @torch.no_grad()
    def denoise(self, backbone: nn.Module, xt: Tensor, t: Tensor, temperature: float = 1.0) -> Tensor:
        """x_theta(x_t) as float64 probabilities (B, L, V) with zero mass on MASK (without SUBS: the model's).

        With the sparse head (method.head_at_masked) only the masked positions run the output head and the
        softmax; an unmasked position gets SUBS's carry-over, a one-hot on its token (every sampler reads the
        masked positions only, and a one-hot row draws its token whatever the uniforms)."""
        if self.uses_sparse_head(backbone):
            index, logits = self.masked_logits(backbone, xt, t)  # (N,), (N, V)
            # (B, L, V) the carry-over, written in place: F.one_hot would hold an int64 copy of the same size
            probs = torch.zeros(*xt.shape, logits.shape[-1], dtype=torch.float64, device=xt.device)
            probs.scatter_(-1, xt[..., None], 1.0)
            probs.view(-1, logits.shape[-1])[index] = probs_from_logits(logits, temperature)
            return probs
        logits = backbone(xt, noise_level=self.noise_level(t))
        if not self.subs:  # the model's own MASK probability; generating, none on never_sampled
            return probs_from_logits(self._without_never_sampled(logits), temperature)
        return probs_from_logits(self.subs_logits(logits), temperature)

    @property
    def reveals_by_position(self) -> bool:
        """Whether `reveal_step` (x_theta asked only where a step reveals) is this method's reverse step: SUBS."""
        return self.subs

    @torch.no_grad()
    def denoise_masked(self, backbone: nn.Module, xt: Tensor, t: Tensor) -> tuple[Tensor, Tensor]:
        """x_theta(x_t) where a SUBS reverse step reads it: (flat positions b * L + i of x_t's masked tokens (N,),
        increasing; their SUBS logits (N, V), MASK at -inf). The sparse head where the backbone has one, else the
        full output gathered at those positions. `denoise` is this made into float64 probabilities at every
        position; samplers that reveal a few tokens a step take probabilities only where they reveal."""
        if self.uses_sparse_head(backbone):
            return self.masked_logits(backbone, xt, t)
        logits = backbone(xt, noise_level=self.noise_level(t))  # (B, L, V)
        index = (xt == self.mask_id).flatten().nonzero()[:, 0]  # (N,)
        return index, self.subs_logits(logits).flatten(0, 1)[index]

    def reveal_step(self, x0_probs_at: Callable[[Tensor], Tensor], xt: Tensor, t: Tensor, s: Tensor,
                    generator: torch.Generator | None = None) -> Tensor:
        """The SUBS reverse step from t to s with x_theta given as a function: flat positions (R,) -> float64
        probabilities there (R, V), asked only for the positions this step reveals (`reverse_step` with the
        whole (B, L, V) tensor is this with a lookup)."""
        reveal = self.reveal_mask(xt, t, s, generator)  # (B, L)
        xs = xt.clone(memory_format=torch.contiguous_format)  # row-major, so positions index xs.view(-1)
        if reveal.any():
            positions = reveal.flatten().nonzero()[:, 0]  # (R,) row-major, the order of xs[reveal]
            xs.view(-1)[positions] = sample_categorical(x0_probs_at(positions), generator)
        return xs

    def fill_remaining_at(self, x0_probs_at: Callable[[Tensor], Tensor], xt: Tensor) -> Tensor:
        """`fill_remaining` (SUBS) with x_theta given as in `reveal_step`: each MASK left takes its most likely
        token."""
        xs = xt.clone(memory_format=torch.contiguous_format)
        positions = (xt == self.mask_id).flatten().nonzero()[:, 0]
        if len(positions):
            xs.view(-1)[positions] = x0_probs_at(positions).argmax(-1)
        return xs

    def reverse_step(self, x0_probs: Tensor, xt: Tensor, t: Tensor, s: Tensor,
                     generator: torch.Generator | None = None) -> Tensor:
        """Draw x_s ~ q(x_s | x_t, x_0 ~ x0_probs) for s < t; (B,) times. Unmasked tokens never change.

        Two stages with the same law as one categorical over V tokens + MASK: first whether a masked token
        is revealed, with probability (alpha_s - alpha_t) / (1 - alpha_t); then which token, from x0_probs.
        Only revealed positions draw a token, so a step costs O(revealed * V), not O(B L V).
        Without SUBS, x0_probs may hold MASK mass and the step is D3PM's (see absorbing_reverse_step).
        """
        if not self.subs:
            return absorbing_reverse_step(x0_probs, xt, self.grid_alpha(s.double()), self.grid_alpha(t.double()),
                                          self.mask_id, generator)
        return self.reveal_step(lambda positions: x0_probs.flatten(0, 1)[positions], xt, t, s, generator)

    def reveal_mask(self, xt: Tensor, t: Tensor, s: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """(B, L) positions a SUBS reverse step from t to s reveals: each masked token independently, with
        probability (alpha_s - alpha_t) / (1 - alpha_t). Independent of x0, so samplers may draw it first and
        skip work for rows that reveal nothing (the EDLM sampler does)."""
        a_t = self.schedule.alpha(t.double())[:, None]  # (B, 1)
        a_s = self.schedule.alpha(s.double())[:, None]
        reveal_p = ((a_s - a_t) / self.schedule.one_minus_alpha(t.double())[:, None]).clamp(0, 1)
        u = torch.rand(xt.shape, generator=generator, device=xt.device, dtype=torch.float64)
        return (xt == self.mask_id) & (u < reveal_p)

    def fill_remaining(self, x0_probs: Tensor, xt: Tensor) -> Tensor:
        """Final noise removal: any token still masked takes its most likely value (never MASK itself)."""
        if not self.subs:
            x0_probs = x0_probs.index_fill(-1, torch.tensor([self.mask_id], device=xt.device), 0.0)
        return torch.where(xt == self.mask_id, x0_probs.argmax(-1), xt)
