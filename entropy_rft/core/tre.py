"""TRE (arXiv 2602.03635, WhyChaos/TRE-Encouraging-Exploration-in-the-Trust-Region@2727fd5): an entropy bonus
over the trust region, the tokens the policy already considers plausible, instead of the whole vocabulary.

- TRE-K: the entropy of softmax over the K largest logits, times log V / log K (so its range [0, log V] matches the
  full entropy's); K = 1 is the min-entropy logsumexp(z) - max z, unscaled. K 2 in the authors' Countdown scripts.
- TRE-P: the entropy of softmax over the smallest prefix of the probability-sorted tokens whose cumulative
  probability reaches p (a token is in it when the mass before it is < p; at most the top 256), times
  log V / log(its size); 0 where the prefix is one token. p 0.99 in its scripts.
The bonus enters the loss as -entropy_coef x (the aggregated top entropy) (coefficient 0.001 in its scripts), where the
plain bonus has H (objective.py's entropy_bonus term reads TokenStats.entropy_top when the run has TRE).

`top_entropy` computes it from logits as the authors' verl `utils/torch_functional.entropy_from_logits(logits, top_k,
top_p)` does (tests/fixtures/tre_oracle.json: values and gradients). `top_entropy_from_hidden` gives the same from the
LM head's input without a [N, V] tensor: the top set's indices (and, for TRE-P, the log-partition over the whole
vocabulary) stream over vocabulary tiles without a graph, then the selected logits are recomputed from the hidden
states and the head's rows with one, so the gradient flows to the selected logits only, as through the authors'
torch.topk / gather.

Departures, numbered:
1. The authors compute it at the logits' precision; here in float32 whatever the forward's precision (as
   TokenStats).
2. The authors' TRE-P returns zeros for the whole batch when every position's prefix is one token (an early exit);
   the per-position rule gives the same zeros.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .dynamics import token_stats_from_hidden

__all__ = ["top_entropy", "top_entropy_from_hidden", "TOP_P_MAX_K", "check_top"]

TOP_P_MAX_K = 256  # the authors' bound on TRE-P's set (max_k), "covers most cases" of p 0.9-0.99
_MASKED = -1e10  # the authors' logit for tokens outside TRE-P's set
_ROW_CHUNK_ELEMENTS = 1 << 22  # rows x selected x D elements per chunk of the recomputed logits


def check_top(top_k: int | None, top_p: float | None) -> None:
    """Exactly one of top_k (an integer >= 1) and top_p (in (0, 1)), the authors' checks."""
    if (top_k is None) == (top_p is None):
        raise ValueError("TRE takes one of top_k (TRE-K) and top_p (TRE-P)")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
        raise ValueError(f"TRE's top_k must be an integer >= 1 (its scripts: 2), got {top_k!r}")
    if top_p is not None and not 0.0 < top_p < 1.0:
        raise ValueError(f"TRE's top_p must be in (0, 1) (its scripts: 0.99), got {top_p!r}")


def _entropy_of(selected: Tensor) -> Tensor:
    """Entropy of softmax over the last dimension, as logsumexp(z) - sum softmax(z) z (the authors' form)."""
    return torch.logsumexp(selected, dim=-1) - (torch.softmax(selected, dim=-1) * selected).sum(-1)


def _top_p_set(top_logits: Tensor, log_z: Tensor, top_p: float) -> Tensor:
    """(..., M) bool: the prefix of the descending top logits whose preceding mass is < top_p (at least one)."""
    probs = (top_logits - log_z.unsqueeze(-1)).exp()
    before = torch.cumsum(probs, dim=-1) - probs  # the mass before each token
    keep = before < top_p
    keep[..., 0] = True
    return keep


def _finish(selected: Tensor, keep: Tensor | None, vocab: int, top_k: int | None) -> Tensor:
    """The scaled entropy of the selected logits (..., M): all M for TRE-K, those in `keep` for TRE-P."""
    if keep is None:
        assert top_k is not None and top_k >= 2
        return _entropy_of(selected) * (math.log(vocab) / math.log(top_k))
    count = keep.sum(-1)
    masked = torch.where(keep, selected, torch.full_like(selected, _MASKED))
    scale = math.log(vocab) / torch.log(count.float().clamp(min=2.0))
    return torch.where(count == 1, torch.zeros_like(count, dtype=selected.dtype), _entropy_of(masked) * scale)


def top_entropy(logits: Tensor, *, top_k: int | None = None, top_p: float | None = None) -> Tensor:
    """TRE's scaled top-K (top_k) or top-p (top_p) entropy of each position's logits [..., V] (already divided by
    the temperature), float32, differentiable (module docstring)."""
    check_top(top_k, top_p)
    z = logits.float()
    vocab = z.shape[-1]
    if top_k == 1:  # min-entropy, unscaled (the authors' special case)
        return torch.logsumexp(z, dim=-1) - z.amax(dim=-1)
    if top_k is not None:
        return _finish(torch.topk(z, k=top_k, dim=-1).values, None, vocab, top_k)
    assert top_p is not None
    with torch.no_grad():
        probs = torch.softmax(z, dim=-1)
        _, idx = torch.topk(probs, k=min(TOP_P_MAX_K, vocab), dim=-1)
        top = z.gather(-1, idx)
        keep = _top_p_set(top, torch.logsumexp(z, dim=-1), top_p)
    return _finish(z.gather(-1, idx), keep, vocab, None)


@torch.no_grad()
def _stream_top(hidden: Tensor, weight: Tensor, k: int, temperature: float, v_chunk: int) -> tuple[Tensor, Tensor]:
    """(indices (N, k) of the k largest logits, descending; log-partition (N,)) of logits = hidden @ weight.T /
    temperature, over vocabulary tiles of v_chunk rows."""
    best_z: Tensor | None = None
    best_i: Tensor | None = None
    log_z = torch.full((hidden.shape[0],), -math.inf, dtype=torch.float32, device=hidden.device)
    for v0 in range(0, weight.shape[0], v_chunk):
        zt = (hidden @ weight[v0 : v0 + v_chunk].T).float() / temperature  # (N, vt)
        log_z = torch.logaddexp(log_z, torch.logsumexp(zt, dim=-1))
        it = torch.arange(v0, v0 + zt.shape[1], device=hidden.device).expand_as(zt)
        zs = zt if best_z is None else torch.cat([best_z, zt], dim=-1)
        ids = it if best_i is None else torch.cat([best_i, it], dim=-1)
        best_z, pos = torch.topk(zs, k=min(k, zs.shape[1]), dim=-1)
        best_i = ids.gather(-1, pos)
    assert best_i is not None, "the LM head has at least one row"
    return best_i, log_z


def top_entropy_from_hidden(
    hidden: Tensor,
    lm_head_weight: Tensor,
    *,
    top_k: int | None = None,
    top_p: float | None = None,
    temperature: float = 1.0,
    vocab_chunk: int = 8192,
) -> Tensor:
    """top_entropy of logits = hidden @ lm_head_weight.T / temperature without materialising [N, V]: hidden (N, D),
    lm_head_weight (V, D); (N,) float32, differentiable with respect to both (module docstring)."""
    check_top(top_k, top_p)
    vocab = lm_head_weight.shape[0]
    k = top_k if top_k is not None else min(TOP_P_MAX_K, vocab)
    idx, log_z = _stream_top(hidden, lm_head_weight, k, temperature, vocab_chunk)  # (N, k), (N,)
    if top_k == 1:  # min-entropy -log p(argmax), differentiable through the whole vocabulary's log-partition
        return -token_stats_from_hidden(hidden, lm_head_weight, idx[:, 0], temperature=temperature).logp
    rows = max(1, _ROW_CHUNK_ELEMENTS // max(1, k * hidden.shape[-1]))
    parts = [  # the selected logits, recomputed with a graph from the hidden states and the head's rows
        torch.einsum("nd,nkd->nk", hidden[i : i + rows].float(), lm_head_weight[idx[i : i + rows]].float())
        / temperature
        for i in range(0, hidden.shape[0], rows)
    ]
    selected = torch.cat(parts) if parts else hidden.new_zeros(0, k, dtype=torch.float32)
    keep = None
    if top_p is not None:
        with torch.no_grad():
            keep = _top_p_set(selected.detach(), log_z, top_p)
    return _finish(selected, keep, vocab, top_k)
