"""Token statistics of the entropy-dynamics theory and its first-order predictions.

For a next-token distribution p = softmax(z / T) and a sampled token k (paper, Section 3):
- entropy H = -sum_i p_i log p_i;
- the entropy discriminator S_i = p_i (H + log p_i) and S* = S_k (Section 3.1);
- its policy expectation E_{i~p}[S_i] = sum_i p_i S_i = H sum_i p_i^2 + sum_i p_i^2 log p_i (Theorem 2);
- the centred score S_c = S* - E_{i~p}[S_i] (Algorithm 2).

Two identities make this cheap (derived here; checked against the direct formulas in tests/test_dynamics.py): with
zbar = sum_i p_i z_i the p-weighted mean logit, S* = p_k (z_k - zbar) and E_p[S] = sum_i p_i^2 (z_i - zbar).
Both follow from H + log p_i = z_i - zbar. So all four statistics come from running sums over the vocabulary,
centred at the running maximum, and never need a stored [N, V] probability tensor.

Predictions (first order in the step size):
- Theorem 1, eq. 4: raising logit k by eps changes entropy by dH = -eps S*.
- Theorem 2, eq. 10: a GRPO step with alpha = lr * r * A changes entropy by dH = -alpha S_c.
- Corollary 4, eq. 14 (and 4.1, eq. 28, off-policy): batch change dH_B = -lr Cov_B(A, r S_c).

Departures:
1. S* and E_p[S] are returned without gradient; log p and H are differentiable (their gradients are exact:
   d log p_k / dz_i = [i = k] - p_i and dH / dz_i = -S_i).
2. Logits masked with -inf are floored at -1e30 after centring, so every statistic stays finite (the paper
   assumes p_i > 0; verl's entropy returns NaN for -inf logits).
3. Normalisation of Corollary 4 (a clarification of eq. 7-8): eq. 7 writes one token's surrogate r A log p_k
   and eq. 8 steps its logits by eta times its gradient, so each token moves by alpha = eta r A. The loss actually
   minimised (eq. 1, and the trainer's token-mean) is the mean of that surrogate over |T_B| tokens, so each
   token's logit gradient carries 1/|T_B| and a step of size eta moves its logits by alpha = eta r A / |T_B|.
   corollary4_entropy_change and batch_mean_entropy_change take that denominator as num_tokens (the loss's
   token-mean denominator: the kept tokens, or every valid token with denominator="all"); num_tokens=None is
   the per-token form as printed (each token stepped by eta r A, as the tabular checks in theory.py do). Either
   way this is the logit-space prediction: a network moves each token's logits by its tangent kernel times the
   logit gradient, and Adam rescales the step, so the trainer also logs the exact first-order change through the
   network (forward.EntropyProbe) and reports the two side by side.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

import torch
from torch import Tensor

from . import kernels
from .advantages import broadcast_advantages
from .kernels import accumulator_stats

__all__ = [
    "TokenStats",
    "token_stats",
    "token_stats_from_hidden",
    "theorem1_entropy_change",
    "theorem2_entropy_change",
    "batch_covariance",
    "corollary4_entropy_change",
    "batch_mean_entropy_change",
    "REGIONS",
    "region_masks",
    "entropy_change_by_region",
]

_NEG_FLOOR = -1e30  # stands in for -inf logits: exp() gives exactly 0 and products stay finite
_CHUNK_ELEMENTS = 1 << 22  # rows * V per chunk in token_stats: 16 MiB per fp32 intermediate
TORCH_ROW_CHUNK, TORCH_VOCAB_CHUNK = 512, 2048  # token_stats_from_hidden's torch-ops tile: 4 MiB of fp32


@dataclass(frozen=True)
class TokenStats:
    """Per-token statistics, each shaped like the token ids and float32.

    logp: log p_k of the sampled token; entropy: H; s_star: S* = p_k (H + log p_k);
    s_expect: E_{i~p}[S_i]; s_centered: S_c = S* - E_{i~p}[S_i].
    """

    logp: Tensor
    entropy: Tensor
    s_star: Tensor
    s_expect: Tensor
    # TRE's bonus entropy (tre.top_entropy: the renormalised top-K / top-p entropy, scaled), differentiable; only
    # where the run's entropy bonus is TRE's (forward.policy_forward's `top`), else None
    entropy_top: Tensor | None = None

    @property
    def s_centered(self) -> Tensor:
        return self.s_star - self.s_expect

    def detach(self) -> TokenStats:
        top = None if self.entropy_top is None else self.entropy_top.detach()
        return TokenStats(self.logp.detach(), self.entropy.detach(), self.s_star, self.s_expect, top)

    def map(self, fn) -> TokenStats:
        """fn applied to each of the statistics (entropy_top where there is one)."""
        out: dict[str, Any] = {f.name: getattr(self, f.name) for f in fields(self)}
        mapped: dict[str, Any] = {k: None if v is None else fn(v) for k, v in out.items()}
        return TokenStats(**mapped)

    @staticmethod
    def join(parts: list[TokenStats], fn) -> TokenStats:
        """fn applied to the list of each statistic over the parts (e.g. torch.cat); entropy_top where every part has
        one."""
        out: dict[str, Any] = {
            f.name: None if any(getattr(s, f.name) is None for s in parts) else fn([getattr(s, f.name) for s in parts])
            for f in fields(TokenStats)
        }
        return TokenStats(**out)


def _check_tokens(tokens: Tensor, vocab_size: int, expected_shape: torch.Size, what: str) -> None:
    if tokens.shape != expected_shape:
        raise ValueError(
            f"tokens have shape {tuple(tokens.shape)} but {what} need tokens of shape {tuple(expected_shape)}; "
            "pass one token id per position (logits [..., V] pair with tokens [...])."
        )
    if tokens.dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        raise TypeError(f"tokens must be integer ids, got dtype {tokens.dtype}; cast with tokens.long().")
    if tokens.numel() and (bool((tokens < 0).any()) or bool((tokens >= vocab_size).any())):
        bad = tokens[(tokens < 0) | (tokens >= vocab_size)].flatten()[:5].tolist()
        raise ValueError(
            f"token ids {bad} lie outside the vocabulary [0, {vocab_size}); check that the tokenizer matches the "
            "model (vocab size) and that padded positions hold a valid id such as the pad id."
        )


def _stats_of_rows(z: Tensor, tokens: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """All four statistics for rows of fp32 logits z [R, V] (already divided by the temperature)."""
    m = z.amax(dim=-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))  # a row of only -inf is degenerate: keep finite
    zc = (z - m).clamp_min(_NEG_FLOOR)  # (R, V), <= 0
    e = zc.exp()
    big_z = e.sum(dim=-1).clamp_min(torch.finfo(torch.float32).tiny)  # (R,)
    c = (e * zc).sum(dim=-1) / big_z  # zbar - m
    log_z = big_z.log()
    entropy = log_z - c
    zk = zc.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)  # z_k - m
    logp = zk - log_z
    s_star = logp.detach().exp() * (zk - c).detach()  # p_k (z_k - zbar) = p_k (H + log p_k)
    with torch.no_grad():
        s_expect = (e * e * (zc - c.unsqueeze(-1))).sum(dim=-1) / (big_z * big_z)  # sum p_i^2 (z_i - zbar)
    return logp, entropy, s_star, s_expect


def token_stats(
    logits: Tensor, tokens: Tensor, *, temperature: float = 1.0, chunk_rows: int | None = None
) -> TokenStats:
    """log p, H, S*, E_p[S] of each position from logits [..., V] and sampled tokens [...].

    Computed in float32 whatever the logits' dtype, one chunk of rows at a time (chunk_rows rows of [V]
    intermediates; by default about 4M elements). log p and H carry gradients to the logits.
    """
    if logits.dim() < 1 or logits.shape[:-1] != tokens.shape:
        raise ValueError(
            f"logits of shape {tuple(logits.shape)} do not match tokens of shape {tuple(tokens.shape)}: "
            "logits must be [..., V] with tokens [...] (did you forget to shift logits by one position?)"
        )
    if not 0 < temperature < math.inf:  # NaN too: it would make every statistic NaN
        raise ValueError(f"temperature must be a finite number > 0, got {temperature}")
    vocab = logits.shape[-1]
    _check_tokens(tokens, vocab, logits.shape[:-1], "these logits")
    flat_z = logits.reshape(-1, vocab)
    flat_t = tokens.reshape(-1).long()
    rows = chunk_rows or max(1, _CHUNK_ELEMENTS // max(vocab, 1))
    parts = [
        _stats_of_rows(flat_z[i : i + rows].float() / temperature, flat_t[i : i + rows])
        for i in range(0, flat_z.shape[0], rows)
    ]
    if not parts:
        empty = logits.new_zeros(tokens.shape, dtype=torch.float32)
        return TokenStats(empty, empty, empty, empty)
    out = [torch.cat(p).reshape(tokens.shape) for p in zip(*parts)]
    return TokenStats(*out)


# ---------------------------------------------------------------------------------------------------------------
# Streaming from hidden states: the LM head and the statistics in one pass over vocabulary tiles.


def _tile_logits(h: Tensor, w: Tensor, temperature: float) -> Tensor:
    z = (h @ w.T).float()
    return z if temperature == 1.0 else z.div_(temperature)


def _rowdot(a: Tensor, b: Tensor) -> Tensor:
    """sum_j a_ij b_ij without a product temporary, in the inputs' float32 (autocast would run bmm in bf16)."""
    with torch.autocast(a.device.type, enabled=False):
        return torch.bmm(a.unsqueeze(1), b.unsqueeze(2)).view(-1)


def _stream_rows(h: Tensor, weight: Tensor, tokens: Tensor, temperature: float, v_chunk: int):
    """Online accumulators (m, Z, A, Q, B, z_k) over vocabulary tiles for rows h [R, D]."""
    zk = torch.zeros(h.shape[0], dtype=torch.float32, device=h.device)
    m: Tensor | None = None  # None until the first tile sets every accumulator
    big_z = a = q = b = zk
    for v0 in range(0, weight.shape[0], v_chunk):
        zt = _tile_logits(h, weight[v0 : v0 + v_chunk], temperature)  # (R, vt)
        in_tile = (tokens >= v0) & (tokens < v0 + zt.shape[1])
        picked = zt.gather(1, (tokens - v0).clamp(0, zt.shape[1] - 1).unsqueeze(1)).squeeze(1)
        zk = torch.where(in_tile, picked, zk)
        mt = zt.amax(dim=1)
        dz = zt.sub_(mt.unsqueeze(1))  # in place: the tile's logits are not needed again
        e = dz.exp()
        zt_, at = e.sum(1), _rowdot(e, dz)
        e2 = e.mul_(e)
        qt, bt = e2.sum(1), _rowdot(e2, dz)
        if m is None:
            m, big_z, a, q, b = mt, zt_, at, qt, bt
            continue
        new_m = torch.maximum(m, mt)
        da, db = m - new_m, mt - new_m
        al, be = da.exp(), db.exp()
        big_z, a, q, b = (
            al * big_z + be * zt_,
            al * (a + da * big_z) + be * (at + db * zt_),
            al * al * q + be * be * qt,
            al * al * (b + da * q) + be * be * (bt + db * qt),
        )
        m = new_m
    return m, big_z, a, q, b, zk


class _StreamingTokenStats(torch.autograd.Function):
    """Forward: the four statistics by streaming; backward: exact gradients of log p and H, recomputing tiles."""

    @staticmethod
    def forward(ctx, hidden, weight, tokens, temperature, v_chunk, r_chunk):
        outs: dict[str, list[Tensor]] = {k: [] for k in ("logp", "entropy", "s_star", "s_expect", "lse", "zbar")}
        for r0 in range(0, hidden.shape[0], r_chunk):
            h, t = hidden[r0 : r0 + r_chunk], tokens[r0 : r0 + r_chunk]
            for key, value in zip(outs, accumulator_stats(*_stream_rows(h, weight, t, temperature, v_chunk))):
                outs[key].append(value)
        logp, entropy, s_star, s_expect, lse, zbar = (torch.cat(outs[k]) for k in outs)
        ctx.save_for_backward(hidden, weight, tokens, lse, zbar)
        ctx.temperature, ctx.v_chunk, ctx.r_chunk = temperature, v_chunk, r_chunk
        ctx.mark_non_differentiable(s_star, s_expect)
        return logp, entropy, s_star, s_expect

    @staticmethod
    def backward(ctx, g_logp, g_entropy, _g_s_star, _g_s_expect):
        hidden, weight, tokens, lse, zbar = ctx.saved_tensors
        temp, v_chunk, r_chunk = ctx.temperature, ctx.v_chunk, ctx.r_chunk
        g_logp = torch.zeros_like(lse) if g_logp is None else g_logp.float()
        g_entropy = torch.zeros_like(lse) if g_entropy is None else g_entropy.float()
        want_h, want_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_h = torch.zeros_like(hidden) if want_h else None
        acc_dtype = torch.float32 if weight.dtype in (torch.float16, torch.bfloat16) else weight.dtype
        grad_w = torch.zeros(weight.shape, dtype=acc_dtype, device=weight.device) if want_w else None
        for r0 in range(0, hidden.shape[0], r_chunk):
            rs = slice(r0, r0 + r_chunk)
            h, t = hidden[rs], tokens[rs]
            for v0 in range(0, weight.shape[0], v_chunk):
                w = weight[v0 : v0 + v_chunk]
                zt = _tile_logits(h, w, temp)
                p = (zt - lse[rs].unsqueeze(1)).exp()
                # d/dz_i of (g_logp log p_k + g_H H) = g_logp ([i = k] - p_i) - g_H p_i (z_i - zbar)
                dz = -p * (g_logp[rs].unsqueeze(1) + g_entropy[rs].unsqueeze(1) * (zt - zbar[rs].unsqueeze(1)))
                in_tile = (t >= v0) & (t < v0 + zt.shape[1])
                idx = (t - v0).clamp(0, zt.shape[1] - 1).unsqueeze(1)
                dz.scatter_add_(1, idx, torch.where(in_tile, g_logp[rs], torch.zeros_like(g_logp[rs])).unsqueeze(1))
                dz = (dz / temp).to(hidden.dtype)
                if grad_h is not None:
                    grad_h[rs] += dz @ w
                if grad_w is not None:
                    grad_w[v0 : v0 + v_chunk] += (dz.T @ h).to(acc_dtype)
        if grad_w is not None:
            grad_w = grad_w.to(weight.dtype)
        return grad_h, grad_w, None, None, None, None


def token_stats_from_hidden(
    hidden: Tensor,
    lm_head_weight: Tensor,
    tokens: Tensor,
    *,
    temperature: float = 1.0,
    vocab_chunk: int | None = None,
    row_chunk: int | None = None,
    use_triton: bool | None = None,
) -> TokenStats:
    """token_stats of logits = hidden @ lm_head_weight.T without materialising [N, V].

    hidden [..., D], lm_head_weight [V, D], tokens [...]. Streams over vocabulary tiles of `vocab_chunk`
    (and rows of `row_chunk`), so at most one [row_chunk, vocab_chunk] tile exists at a time. log p and H
    are differentiable with respect to hidden and weight (the backward pass recomputes the tiles).

    On a CUDA tensor with Triton importable (use_triton None: automatic) the tiles are folded by the Triton
    kernels of `entropy_rft.core.kernels` (default tile 8192 x 8192 in the matmul's dtype: benchmarks/gpu.md measures
    the choice); elsewhere by torch ops on a 512 x 2048 fp32 tile (4 MiB, stays in cache: benchmarks/token_stats.py).
    """
    if hidden.dim() < 1 or lm_head_weight.dim() != 2 or hidden.shape[-1] != lm_head_weight.shape[1]:
        raise ValueError(
            f"hidden {tuple(hidden.shape)} and lm_head_weight {tuple(lm_head_weight.shape)} do not fit: "
            "need hidden [..., D] and weight [V, D] (the LM head's weight, e.g. model.lm_head.weight)."
        )
    if not 0 < temperature < math.inf:  # NaN too: it would make every statistic NaN
        raise ValueError(f"temperature must be a finite number > 0, got {temperature}")
    _check_tokens(tokens, lm_head_weight.shape[0], hidden.shape[:-1], "these hidden states")
    flat_h = hidden.reshape(-1, hidden.shape[-1])
    flat_t = tokens.reshape(-1).long()
    if flat_h.shape[0] == 0:
        empty = hidden.new_zeros(tokens.shape, dtype=torch.float32)
        return TokenStats(empty, empty, empty, empty)
    if use_triton is None:
        use_triton = kernels.available(flat_h)
    if use_triton:
        if not kernels.available(flat_h):
            raise ValueError("use_triton=True needs Triton and a CUDA tensor (or TRITON_INTERPRET=1 on CPU).")
        outs = kernels.TritonTokenStats.apply(
            flat_h,
            lm_head_weight,
            flat_t,
            float(temperature),
            vocab_chunk or kernels.GPU_VOCAB_CHUNK,
            row_chunk or kernels.GPU_ROW_CHUNK,
        )
    else:
        outs = _StreamingTokenStats.apply(
            flat_h,
            lm_head_weight,
            flat_t,
            float(temperature),
            vocab_chunk or TORCH_VOCAB_CHUNK,
            row_chunk or TORCH_ROW_CHUNK,
        )
    return TokenStats(*(o.reshape(tokens.shape) for o in outs))


# ---------------------------------------------------------------------------------------------------------------
# First-order predictions.


def theorem1_entropy_change(s_star: Tensor, eps: Tensor | float) -> Tensor:
    """Theorem 1, eq. 4: entropy change when logit k moves by eps, to first order: -eps * S*."""
    return -eps * s_star


def theorem2_entropy_change(s_centered: Tensor, alpha: Tensor | float) -> Tensor:
    """Theorem 2, eq. 10: entropy change of one GRPO step on a token, alpha = lr * r * A: -alpha * S_c."""
    return -alpha * s_centered


def batch_covariance(x: Tensor, y: Tensor, mask: Tensor) -> Tensor:
    """Cov_B(x, y): population covariance over the positions where mask is true (a 0-dim tensor)."""
    m = mask.to(torch.float32)
    n = m.sum().clamp_min(1.0)
    x, y = x.float(), y.float()
    mx = (x * m).sum() / n
    my = (y * m).sum() / n
    return ((x - mx) * (y - my) * m).sum() / n


def step_size(lr: float, num_tokens: Tensor | float | None) -> Tensor | float:
    """lr / |T_B| (lr when num_tokens is None); a count of 0 or less (a batch with no loss token) is refused by name
    rather than divided by."""
    if num_tokens is None:
        return lr
    if not isinstance(num_tokens, Tensor) and not num_tokens > 0:
        raise ValueError(
            f"num_tokens is |T_B|, the count of the loss's tokens: it must be > 0, got {num_tokens} (a "
            "batch with no loss token moves nothing; pass None for the per-token step lr)"
        )
    return lr / num_tokens


def corollary4_entropy_change(
    advantages: Tensor,
    s_centered: Tensor,
    mask: Tensor,
    *,
    lr: float,
    ratio: Tensor | None = None,
    num_tokens: Tensor | float | None = None,
    step: Tensor | float | None = None,
) -> Tensor:
    """Corollary 4, eq. 14 (on-policy) and Corollary 4.1, eq. 28 (with importance ratios r):
    the mean entropy change over the masked tokens of one logit-space step, -lr / |T_B| * Cov_B(A, r * S_c).

    num_tokens is |T_B|, the token-mean loss's denominator (module docstring, departure 3); None drops it (each
    token's logits stepped by lr r A, eq. 7-8 as printed). `step`, where given, replaces lr / num_tokens by each
    token's own step size lr w_t (losses.step_sizes, for the other loss aggregations): then the change is
    -E_T[step A (r S_c - E_T[r S_c])], which is the covariance form when the step is the same for every token.
    advantages [B] or [B, T]; s_centered, mask (and ratio, step) [B, T].
    """
    adv = broadcast_advantages(advantages, s_centered)
    score = s_centered if ratio is None else ratio * s_centered
    if step is None:
        step = step_size(lr, num_tokens)
    if not isinstance(step, Tensor):
        return -step * batch_covariance(adv, score, mask)
    m = mask.to(torch.float64)
    n = m.sum().clamp_min(1.0)
    score = score.double()
    centred = score - (score * m).sum() / n
    return -(step.double() * adv.double() * centred * m).sum() / n


def batch_mean_entropy_change(
    advantages: Tensor,
    s_centered: Tensor,
    mask: Tensor,
    *,
    lr: float,
    ratio: Tensor | None = None,
    num_tokens: Tensor | float | None = None,
    step: Tensor | float | None = None,
) -> Tensor:
    """Theorem 2 averaged over the batch, eq. 23: -lr / |T_B| * E_B[A r S_c] (num_tokens = |T_B| as in
    corollary4_entropy_change; `step` a per-token lr w_t as there). Corollary 4 drops from this the term
    -lr E_B[A] E_B[r S_c], which Corollary 2 makes about zero on-policy; on a filtered token set (or off-policy)
    E_B[r S_c] need not be small."""
    adv = broadcast_advantages(advantages, s_centered)
    score = s_centered if ratio is None else ratio * s_centered
    m = mask.to(torch.float32)
    if step is None:
        step = step_size(lr, num_tokens)
    if isinstance(step, Tensor):
        m = m.double()
        return -(step.double() * adv.double() * score.double() * m).sum() / m.sum().clamp_min(1.0)
    return -step * (adv.float() * score.float() * m).sum() / m.sum().clamp_min(1.0)


# the four regions of a step's tokens: the sign of the advantage x whether the sampled token is likely (S* > 0:
# log p_k > -H, less surprising than the distribution's mean) or unlikely (S* <= 0)
REGIONS = ("pos_likely", "pos_unlikely", "neg_likely", "neg_unlikely")


def region_masks(advantages: Tensor, s_star: Tensor, mask: Tensor) -> dict[str, Tensor]:
    """The masked tokens of each of REGIONS, (B, T) bool each: A > 0 or A < 0, and S* > 0 (likely) or S* <= 0
    (unlikely). Tokens with A = 0 are in none. advantages (B,) or (B, T); s_star, mask (B, T)."""
    adv = broadcast_advantages(advantages, s_star)
    m, likely = mask.bool(), s_star > 0
    pos, neg = m & (adv > 0), m & (adv < 0)
    return {
        "pos_likely": pos & likely,
        "pos_unlikely": pos & ~likely,
        "neg_likely": neg & likely,
        "neg_unlikely": neg & ~likely,
    }


def entropy_change_by_region(
    advantages: Tensor, s_star: Tensor, s_centered: Tensor, mask: Tensor, *, step: Tensor | float
) -> dict[str, Tensor]:
    """Corollary 4's prediction (corollary4_entropy_change with the same `step`, lr w_t) split by REGIONS: each
    token t of the mask adds -step_t A_t (S_c,t - E_T[S_c]) / |T| to its region, so the four values (float64, 0-dim)
    sum to the prediction and a token with A = 0 adds nothing. The regions are read from S* (the paper's sign rule
    on the token, Theorem 1), the terms from S_c centred over T (Theorem 2 and Corollary 4), so a region's value
    need not have the sign its name suggests. advantages (B,) or (B, T); s_star, s_centered, mask (and a tensor
    step) (B, T)."""
    adv = broadcast_advantages(advantages, s_centered).double()
    m = mask.to(torch.float64)
    n = m.sum().clamp_min(1.0)
    score = s_centered.double()
    size = step.double() if isinstance(step, Tensor) else torch.tensor(float(step), dtype=torch.float64)
    terms = -size * adv * (score - (score * m).sum() / n) * m / n  # (B, T): Corollary 4's term of each token
    return {name: (terms * where).sum() for name, where in region_masks(advantages, s_star, mask).items()}
