"""The policy's forward pass over rollouts: token statistics of every response token, and the probes that
measure how an update moved the policy's entropy.

- `policy_forward`: one forward pass over prompt + response; log p, H, S*, E_p[S] of the response tokens. They
  stream from the decoder's last hidden state through the LM head's weight (`dynamics.token_stats_from_hidden`),
  so no [B, R, V] logits tensor exists, in training or in the statistics passes. Responses are right-padded to the
  batch's longest; rows run in a few passes grouped by length (`length_buckets`) and the statistics are taken at the
  valid tokens only, so padding costs little (a demo batch: 32% fewer positions, forward + backward 0.46 -> 0.36 s).
- `batch_forward`: the same without gradients, over the batch in the update's passes (`passes`: slices of the
  update's micro-batch size, rules.StepRules.rows_per_pass), in the update's module mode (`update_mode`).
- `HeldForward`: strict on-policy, the update's own forward of every micro-batch, kept with its graph: its
  detached log p is the old log p (the ratio is exactly 1) and its statistics feed the advantages and the token
  filter, so no separate statistics pass runs.
- `EntropyProbe`: the first-order entropy change of the step actually applied, grad_theta(mean H) . delta_theta,
  and the realised change, on the batch's valid response tokens.

Departures, numbered:
1. Models whose logits are not `lm_head(hidden)` (a biased or adapted LM head, logit soft-capping or scaling)
   fall back to materialised logits and `dynamics.token_stats`; `streams_from_hidden` says which path a model takes.
2. Dropout is switched off for RL (as TRL's `disable_dropout` does; entropy_rft/train/dropout.py): sampling, old
   log-probs and the update then see the same policy.

One construction: every pass that must agree with the update's forward (the statistics and old log-probs of the
behaviour policy, the probe's passes) goes through `policy_forward` with the same rows per pass, in the same module
mode, and `policy_forward` decides its passes (shared prompt prefix or full sequences, length buckets) from the
model and the precision only, never from whether gradients are recorded or the module's training flag. So at the
same weights a no-grad pass gives the update's log p bit for bit, in bf16 autocast, under LoRA and gradient
checkpointing alike (tests/test_forward.py, tests/test_recipe_shapes.py). The step's first optimizer step of each update
also takes its old log p from its own forward (step.Step.update), so its ratio is exactly 1 by construction.
"""

from __future__ import annotations

import copy
import dataclasses
from contextlib import contextmanager, nullcontext

import torch
from torch import Tensor

from ..core.dynamics import TokenStats, token_stats, token_stats_from_hidden
from ..core.tre import top_entropy, top_entropy_from_hidden
from ..rollout import Rollout
from ..rollout.cache import cache_arg, cache_of
from ..rollout.hf import sequence_forward
from ..rollout.sampling import position_ids
from .dropout import has_active_dropout

_LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier_scale")


HALF = {"bf16": torch.bfloat16, "fp16": torch.float16}  # precisions that autocast the forward


def autocast(precision: str, device: torch.device):
    """bf16 (fp16, an engine's run only: integrations/trl.py): autocast the forward (and so the backward) to
    bfloat16 (float16); the weights stay float32. fp32: nothing (float32 matmuls, TF32 where the process allows it)."""
    if precision in HALF:
        return torch.autocast(device_type=device.type, dtype=HALF[precision])
    return nullcontext()


@contextmanager
def update_mode(model):
    """The mode the update's forward runs in, for a pass that must compute what the update will: training mode
    (dropout is off, and check_deterministic made sure nothing else draws random numbers, so this equals eval mode
    except where a model itself branches on the flag); eval mode where dropout is deliberately left on
    (disable_dropout: false), so the statistics are not noised. The module's flag is restored after."""
    was_training = model.training
    model.train(not has_active_dropout(model))
    try:
        yield model
    finally:
        model.train(was_training)


def streams_from_hidden(model) -> bool:
    """True when the model's logits are exactly lm_head(last hidden state): a plain bias-free Linear head and no
    logit transform in its config, with a decoder reachable through get_decoder()."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if type(head) is not torch.nn.Linear or head.bias is not None or not hasattr(model, "get_decoder"):
        return False
    config = getattr(model, "config", None)
    return not any(getattr(config, name, None) not in (None, 1, 1.0) for name in _LOGIT_TRANSFORMS)


def prompt_groups(rollout: Rollout) -> Tensor:
    """(B,) index of each row's prompt: consecutive rows with the same (left-padded) prompt share one."""
    ids, mask = rollout.prompt_ids, rollout.prompt_mask
    same = (ids[1:] == ids[:-1]).all(-1) & (mask[1:] == mask[:-1]).all(-1)
    return torch.cat([torch.zeros(1, dtype=torch.long, device=ids.device), (~same).long().cumsum(0)])


def pass_size(n_rows: int, rows_per_pass: int) -> int:
    """Rows in each forward pass over n_rows rows (the last may hold fewer): rows_per_pass, or all of them when it is
    0 or more than there are; at least 1. Arithmetic on sizes only, so the memory plan of a batch of 10^9 rows costs
    nothing (plan.check_fits)."""
    return max(min(rows_per_pass or n_rows, n_rows), 1)


def passes(rows: Tensor | int, rows_per_pass: int) -> tuple[Tensor, ...]:
    """The rows of each forward pass over `rows` (a count: rows 0..n-1): consecutive slices of `pass_size` rows. The
    one split every forward over a batch uses."""
    rows = torch.arange(rows) if isinstance(rows, int) else rows
    return rows.split(pass_size(len(rows), rows_per_pass))


LENGTH_BUCKETS = 4  # most passes per forward: rows split by response length so padding is not computed
MIN_BUCKET_GAIN = 0.05  # a further bucket must remove this share of the one-bucket positions


def length_buckets(
    lengths: Tensor, max_buckets: int = LENGTH_BUCKETS, min_gain: float = MIN_BUCKET_GAIN, candidates: int = 64
) -> list[tuple[Tensor, int]]:
    """Rows split by response length into at most max_buckets (rows ascending, width = the bucket's longest
    response): the boundaries minimise the computed positions sum_b rows_b * width_b (responses are right-padded to
    the batch's longest, so one pass computes rows * R positions, padding included). A bucket is added only when it
    removes at least min_gain of the one-bucket positions, since each costs a pass of its own. Widths are chosen
    among at most `candidates` lengths (quantiles when there are more distinct ones)."""
    lengths = lengths.detach().long().cpu()
    values, counts = lengths.unique(return_counts=True)  # ascending
    cum = counts.cumsum(0)
    if len(values) > candidates:  # widths from quantiles of the lengths, the longest always among them
        idx = torch.searchsorted(cum, torch.linspace(0, int(cum[-1]), candidates + 1)[1:].ceil().long().clamp_min(1))
        keep = torch.unique(torch.cat([idx.clamp_max(len(values) - 1), torch.tensor([len(values) - 1])]))
        values, cum = values[keep], cum[keep]
    widths, rows_upto = values.tolist(), [0] + cum.tolist()
    m = len(widths)
    # best[k][j]: least positions covering the j shortest candidate widths with k buckets (the last one width j-1)
    inf = float("inf")
    best, cut = [[0.0] + [inf] * m], []
    for k in range(1, max(1, max_buckets) + 1):
        row, arg = [inf] * (m + 1), [0] * (m + 1)
        for j in range(1, m + 1):
            for i in range(j):
                cost = best[k - 1][i] + (rows_upto[j] - rows_upto[i]) * widths[j - 1]
                if cost < row[j]:
                    row[j], arg[j] = cost, i
        best.append(row)
        cut.append(arg)
    k = 1
    while k < len(cut) and 0 < best[k][m] - best[k + 1][m] >= min_gain * best[1][m]:
        k += 1
    bounds, j = [], m
    for level in range(k, 0, -1):
        i = cut[level - 1][j]
        bounds.append((widths[i - 1] if i else -1, widths[j - 1]))
        j = i
    out = []
    for low, high in reversed(bounds):
        rows = ((lengths > low) & (lengths <= high)).nonzero().squeeze(1)
        if len(rows):
            out.append((rows, int(lengths[rows].max())))
    return out


def _cache_rows(cache, rows: Tensor):
    """A cache holding rows `rows` of `cache`; `cache` itself is left unchanged, so one prefix serves several passes.
    index_select, not the cache's own batch_select_indices: its backward is an index_add, where advanced indexing's
    is a sorting index_put (6x slower on the CPU, measured on the demo's shapes)."""
    view = copy.copy(cache)
    if hasattr(cache, "layers"):  # transformers 5
        view.layers = [copy.copy(layer) for layer in cache.layers]
        for layer in view.layers:
            if getattr(layer, "keys", None) is not None and layer.keys.numel():
                layer.keys, layer.values = layer.keys.index_select(0, rows), layer.values.index_select(0, rows)
    else:  # transformers 4
        view.key_cache = [k.index_select(0, rows) if k.numel() else k for k in cache.key_cache]
        view.value_cache = [v.index_select(0, rows) if v.numel() else v for v in cache.value_cache]
    return view


def _hidden_full(decoder, rollout: Rollout, rows: Tensor, width: int, device) -> Tensor:
    """(n, width, D) last hidden states that predict response tokens [0, width) of these rows: one pass over the
    prompt and the response tokens before the last (the last predicts nothing the loss uses), without the prompt
    columns that are padding in every one of these rows."""
    p_mask = rollout.prompt_mask[rows]
    start = int(p_mask.any(0).long().argmax()) if bool(p_mask.any()) else p_mask.shape[1] - 1
    attn = torch.cat([p_mask[:, start:], rollout.response_mask[rows, : width - 1]], dim=1).to(device)
    ids = torch.cat([rollout.prompt_ids[rows, start:], rollout.response_ids[rows, : width - 1]], dim=1).to(device)
    out = decoder(input_ids=ids, attention_mask=attn.long(), position_ids=position_ids(attn), use_cache=False)
    return out.last_hidden_state[:, p_mask.shape[1] - start - 1 :]


class _SharedPrefix:
    """Each distinct prompt run once: its keys and values (with their graph) are indexed out to every response of
    its group, which then runs over its response tokens only. Positions continue from each prompt's length, as in
    generation; gradients reach the prompt's computation through the cache."""

    def __init__(self, decoder, rollout: Rollout, groups: Tensor, device):
        first = torch.cat([torch.ones(1, dtype=torch.bool, device=groups.device), groups[1:] != groups[:-1]])
        p_ids, self.p_mask = rollout.prompt_ids[first].to(device), rollout.prompt_mask[first].to(device)
        out = decoder(
            input_ids=p_ids, attention_mask=self.p_mask.long(), position_ids=position_ids(self.p_mask), use_cache=True
        )
        self.decoder, self.rollout, self.device = decoder, rollout, device
        self.groups, self.cache, self.last = groups.to(device), cache_of(out), out.last_hidden_state[:, -1:]

    def hidden(self, rows: Tensor, width: int) -> Tensor:
        """(n, width, D) states that predict response tokens [0, width) of these rows: the prompt's last state, then
        a pass over the response tokens before the last (the last predicts nothing the loss uses)."""
        ro, prompt_of = self.rollout, self.groups[rows.to(self.device)]
        if width == 1:
            return self.last[prompt_of]
        r_pos = self.p_mask.long().sum(-1)[prompt_of, None] + torch.arange(width - 1, device=self.device)[None]
        attn = torch.cat([ro.prompt_mask[rows], ro.response_mask[rows, : width - 1]], dim=1).to(self.device)
        out = self.decoder(
            input_ids=ro.response_ids[rows, : width - 1].to(self.device),
            attention_mask=attn.long(),
            position_ids=r_pos,
            **cache_arg(_cache_rows(self.cache, prompt_of)),
            use_cache=True,
        )
        return torch.cat([self.last[prompt_of], out.last_hidden_state], dim=1)


def _checkpointing(model) -> bool:
    for name in ("is_activation_checkpointing", "is_gradient_checkpointing"):  # transformers 5, then 4
        value = getattr(model, name, None)
        if value is not None:
            return bool(value)
    return False


def policy_forward(
    model,
    rollout: Rollout,
    temperature: float,
    value_head=None,
    precision: str = "fp32",
    *,
    from_hidden: bool = True,
    share_prefix: bool = True,
    buckets: int | None = None,
    top: tuple[int | None, float | None] | None = None,
) -> tuple[TokenStats, Tensor | None]:
    """TokenStats of the response tokens under the model, (B, R) each, and the value head's values, (B, R).
    Statistics are float32 whatever the forward's precision; log p and H carry gradients. They are computed at the
    valid response tokens only (0 at padding), with rows run in at most `buckets` passes by response length
    (default LENGTH_BUCKETS; 1: one pass at the batch's width), so right padding costs little decoder work and no
    LM-head work. One pass when training in bf16 with frozen weights (LoRA): autocast would cast them again per pass.
    With share_prefix, rows that share a prompt (a GRPO group) run it once (not under gradient checkpointing, which
    has no cache). top (K, p): also TRE's bonus entropy (core/tre.py) as stats.entropy_top, with its graph."""
    device = next(model.parameters()).device
    tokens = rollout.response_ids.to(device)
    with autocast(precision, device):
        if from_hidden and streams_from_hidden(model):
            decoder = model.get_decoder()
            groups = prompt_groups(rollout)
            # every decision below depends on the model and the precision only, never on torch.is_grad_enabled() or
            # model.training, so a no-grad pass runs exactly the passes of the update's forward (module docstring)
            shared = share_prefix and not _checkpointing(model) and int(groups[-1]) + 1 < len(groups)
            prefix = _SharedPrefix(decoder, rollout, groups, device) if shared else None
            n_rows, width_all = tokens.shape
            valid = rollout.response_mask.to(device)
            most = buckets or LENGTH_BUCKETS
            if precision in HALF and any(not p.requires_grad for p in model.parameters()):
                most = 1  # autocast casts frozen weights (LoRA's base) again in every pass and autograd keeps each
            passes = [(rows, width) for rows, width in length_buckets(rollout.lengths, most) if width > 0] or [
                (torch.arange(n_rows), width_all)
            ]
            states, where = [], []
            for rows, width in passes:
                h = prefix.hidden(rows, width) if prefix else _hidden_full(decoder, rollout, rows, width, device)
                rows = rows.to(device)
                at = valid[rows, :width]
                states.append(h[at])
                where.append((rows[:, None] * width_all + torch.arange(width, device=device)[None])[at])
            hidden, where = torch.cat(states), torch.cat(where)  # (N, D) at the valid tokens; their flat positions
            head = model.get_output_embeddings().weight
            part = token_stats_from_hidden(hidden, head, tokens.reshape(-1)[where], temperature=temperature)
            if top is not None:
                k, p = top
                extra = top_entropy_from_hidden(hidden, head, top_k=k, top_p=p, temperature=temperature)
                part = dataclasses.replace(part, entropy_top=extra)

            def scatter(x: Tensor, *shape) -> Tensor:  # (N, ...) at the valid tokens -> (B, R, ...), 0 elsewhere
                full = x.new_zeros(n_rows * width_all, *shape).index_copy(0, where, x)
                return full.view(n_rows, width_all, *shape)

            stats = part.map(scatter)
            hidden = scatter(hidden, hidden.shape[-1]) if value_head is not None else None
        else:
            logits, hidden = sequence_forward(model, rollout, hidden=value_head is not None)
            stats = token_stats(logits, tokens, temperature=temperature)
            if top is not None:
                extra = top_entropy(logits.float() / temperature, top_k=top[0], top_p=top[1])
                stats = dataclasses.replace(stats, entropy_top=extra)
            valid = rollout.response_mask.to(device)  # 0 at padding, as on the streaming path
            stats = stats.map(lambda x: torch.where(valid, x, 0.0))
    return stats, (value_head(hidden) if value_head is not None else None)


def _cat_stats(parts: list[TokenStats]) -> TokenStats:
    return TokenStats.join(parts, lambda xs: torch.cat([x.detach() for x in xs]).cpu())


@torch.no_grad()
def batch_forward(
    model,
    rollout: Rollout,
    temperature: float,
    rows_per_pass: int,
    value_head=None,
    precision: str = "fp32",
    *,
    from_hidden: bool = True,
) -> tuple[TokenStats, Tensor | None]:
    """policy_forward without gradients over slices of rows_per_pass rows (the update's micro-batches), in the
    update's module mode; results on the CPU."""
    with update_mode(model):
        parts = [
            policy_forward(model, rollout.select(rows), temperature, value_head, precision, from_hidden=from_hidden)
            for rows in passes(len(rollout.texts), rows_per_pass)
        ]
    values = torch.cat([p[1] for p in parts]).cpu() if value_head is not None else None
    return _cat_stats([p[0] for p in parts]), values


def batch_stats(model, rollout: Rollout, temperature: float, rows_per_pass: int, precision: str = "fp32") -> TokenStats:
    return batch_forward(model, rollout, temperature, rows_per_pass, precision=precision)[0]


def policy_stats(model, rollout: Rollout, temperature: float) -> TokenStats:
    return policy_forward(model, rollout, temperature)[0]


def _split_forward(run, rows: Tensor, frozen: Tensor) -> tuple[TokenStats, Tensor | None]:
    """run(rows) with the frozen rows' forward under no_grad: the rows with a graph and those without, each in one
    pass, put back in the order of `rows` (index_select, so the backward is an index_add)."""
    live, still = rows[~frozen], rows[frozen]
    with torch.no_grad():
        parts = [run(still)]
    if len(live):
        parts.insert(0, run(live))
    back = torch.cat([(~frozen).nonzero().squeeze(1), frozen.nonzero().squeeze(1)]).argsort()

    def merge(xs: list[Tensor]) -> Tensor:
        return torch.cat(xs).index_select(0, back.to(xs[0].device))

    stats = TokenStats.join([p[0] for p in parts], merge)
    return stats, (merge([p[1] for p in parts]) if parts[0][1] is not None else None)


class HeldForward:
    """Strict on-policy: the update's own forward of each micro-batch (rows `i * micro ... (i + 1) * micro`),
    computed once and kept with its graph until the token filter has seen the whole batch.

    It holds the activations of the whole batch at once: the trainer uses it only when the update would hold
    them anyway (micro_batch_size 0 or at least the batch), unless reuse_forward is forced on.

    frozen (B,) bool: rows whose loss gradient is exactly zero (advantage 0 under a loss linear in it). They run
    without a graph; their statistics are the same (to float32 rounding: another batch shape), and the backward
    skips them."""

    def __init__(
        self,
        model,
        rollout: Rollout,
        temperature: float,
        micro: int,
        value_head=None,
        precision: str = "fp32",
        *,
        from_hidden: bool = True,
        frozen: Tensor | None = None,
        top: tuple[int | None, float | None] | None = None,
    ):
        model.train()
        self.rows: list[Tensor | None] = list(passes(len(rollout.texts), micro))
        self.frozen = frozen

        def run(rows: Tensor) -> tuple[TokenStats, Tensor | None]:
            return policy_forward(
                model, rollout.select(rows), temperature, value_head, precision, from_hidden=from_hidden, top=top
            )

        self.parts = [
            run(r) if frozen is None or not frozen[r].any() else _split_forward(run, r, frozen[r]) for r in self.rows
        ]

    def stats(self) -> TokenStats:
        return _cat_stats([s for s, _ in self.parts])

    def values(self) -> Tensor | None:
        if self.parts[0][1] is None:
            return None
        return torch.cat([v.detach() for _, v in self.parts]).cpu()

    def take(self, rows: Tensor) -> tuple[TokenStats, Tensor | None]:
        """The held forward of these rows (once; the graph is freed by its backward)."""
        for i, r in enumerate(self.rows):
            if r is not None and torch.equal(r, rows):
                self.rows[i] = None
                return self.parts[i]
        raise RuntimeError(
            "held forward: the update asked for rows the on-policy forward did not compute "
            "(the micro-batch split changed between the statistics and the update)"
        )


def _trainable(model) -> list[Tensor]:
    return [p for p in model.parameters() if p.requires_grad]


class EntropyProbe:
    """How one update moved the mean entropy of the batch's valid response tokens (Hbar).

    first_order: grad_theta Hbar . (theta_after - theta_before), the exact first-order change through the network
    of the parameter step actually applied (Adam's, clipped, over every mini-batch and epoch). It is computed as
    g . theta_after - g . theta_before in float64, so no copy of the parameters is kept (products of float32
    numbers are exact in float64). realised: Hbar after the update minus Hbar before, both on the same rollouts.
    Without `held`, the passes run in training mode (the built-in trainer's update), or with in_update_mode in
    update_mode (the mode of batch_forward's statistics, restored after: an engine's own loop, integrations/trl.py).
    """

    def __init__(
        self,
        model,
        rollout: Rollout,
        temperature: float,
        rows_per_pass: int,
        precision: str = "fp32",
        *,
        held: HeldForward | None = None,
        from_hidden: bool = True,
        in_update_mode: bool = False,
    ):
        self.model = model
        valid = rollout.response_mask
        n_valid = valid.sum().clamp_min(1)
        params = _trainable(model)
        grads: list[Tensor | None] = [None] * len(params)
        if held is not None:  # the graphs already exist: one extra backward through them
            total = sum(
                (s.entropy * valid[r].to(s.entropy.device)).sum() / n_valid for r, (s, _) in zip(held.rows, held.parts)
            )
            grads = list(torch.autograd.grad(total, params, retain_graph=True, allow_unused=True))
        else:
            if not in_update_mode:
                model.train()
            with update_mode(model) if in_update_mode else nullcontext(), torch.enable_grad():
                for part in passes(len(rollout.texts), rows_per_pass):
                    stats, _ = policy_forward(
                        model, rollout.select(part), temperature, precision=precision, from_hidden=from_hidden
                    )
                    h = (stats.entropy * valid[part].to(stats.entropy.device)).sum() / n_valid
                    for j, g in enumerate(torch.autograd.grad(h, params, allow_unused=True)):
                        if g is not None:
                            grads[j] = g if grads[j] is None else grads[j] + g
        self.pairs = [(p, g.detach()) for p, g in zip(params, grads) if g is not None]
        self.before = self._dot()

    @torch.no_grad()
    def _dot(self) -> float:
        return float(sum((g.double() * p.detach().double()).sum() for p, g in self.pairs))

    def first_order(self) -> float:
        return self._dot() - self.before
