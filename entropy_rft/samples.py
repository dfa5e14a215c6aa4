"""Token-level samples of a run: a few groups of a step's batch, each token with its statistics and its share of
the step's first-order entropy change, in one bounded file per sampled step (RUN/samples/step-000010.json.gz).

Which steps: step 1, every `samples_every`-th step and the last step (`due`); samples_every 0 writes none.
Which groups: `samples_groups` of the batch's groups, those with mixed rewards first (their advantages are not 0,
so their tokens move entropy), then the rest, each in batch order (`choose_groups`); 0 writes every group.

What a token carries: its text, log p, H, S*, S_c (dynamics.TokenStats, under the policy that sampled it), the
advantage, whether the method kept it in the loss, and its term of the step's first-order entropy change, eq. 23:

    term_t = -alpha_t S_c,t / |T|,   alpha_t = lr w_t A_t,   summed over the tokens t of T (the kept tokens),

Theorem 2 (eq. 10: dH_t = -alpha_t S_c,t) averaged over the batch as eq. 21 does. Averaged over T, the terms
sum to the first-order change of the mean entropy over the kept tokens (the step's `entropy_kept`), not of the
all-token mean the run logs as `entropy`: in logit space a clipped token gets no gradient, so that mean moves by
|T| / (valid tokens) times the sum (the same under GRPO, which keeps every token). w_t is the token's weight in the
loss: 1 / |T_B| for the token-mean loss (the trainer's; dynamics, departure 3), so alpha_t = lr A_t / |T_B|. A
clipped token is not in T and its term is 0; the file keeps `term_scale` = lr w / |T| so that a reader can show
what it would have contributed (-term_scale A S_c). Each response also carries its reward, advantage, length and
whether it finished; each group its prompt (as the model saw it, decoded from the rollout's prompt ids). A record
may also mark tokens (`mark_tokens`: a 0/1 field per response, listed in the record's `marks` with a label): a
monitored engine run marks what Clip_B and Clip_V would drop.

Each file also holds, over the whole batch (not only the written groups): eq. 23's sum of every term (the change of
entropy_kept, as above), Corollary
4's covariance form -lr / |T_B| Cov_B(A, S_c) (the step's `entropy_change/predicted` metric), the batch means of
A and S_c that relate the two, and the tokens with the largest terms in each direction and the clipped tokens
with the largest would-be terms, with a few tokens of context.

Departures, numbered:
1. The terms of every token sum to eq. 23, -lr / |T_B| E_T[A S_c], not to Corollary 4's covariance: the two differ
   by lr / |T_B| E_T[A] E_T[S_c], the term Corollary 2 makes about 0 on-policy over every token (not exactly 0 in
   a finite batch, nor on the kept tokens of a filtered one). Both totals are in the file, with that difference.
2. Bounded: at most `groups` groups, `max_tokens` tokens per response (the first ones; the response's length says
   how many it had), token texts cut at MAX_TEXT_CHARS and prompts at MAX_PROMPT_CHARS characters, numbers
   rounded to 7 significant digits (float32 carries 7.2). `size_bound` is the largest file that can give.
3. A token that decodes to part of a character (byte-level BPE splitting a multi-byte UTF-8 character) gets the
   character decoded from the run of tokens that completes it, and the run's later tokens get "" (the page shows
   them as continuation marks).
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import math
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from .core.advantages import broadcast_advantages
from .core.dynamics import TokenStats

FORMAT, VERSION = "entropy-rft/samples", 1
SAMPLES_DIR = "samples"
MAX_RESPONSE_TOKENS = 512  # tokens written per response (the first ones)
MAX_TEXT_CHARS = 64  # characters of one token's text
MAX_PROMPT_CHARS = 4000  # characters of a prompt: its head and tail beyond that
TOP_TOKENS = 8  # tokens listed per direction in `top`
CONTEXT_BEFORE, CONTEXT_AFTER = 8, 4  # tokens of context around a listed token
CONTEXT_CHARS_BEFORE, CONTEXT_CHARS_AFTER = 80, 40  # at most these characters of that context
HEADER_BYTES = 8000  # the record's fields outside groups and top (info, batch, entropy_change, bound)
# the step's metrics a record carries (a fixed set: the header stays bounded)
METRIC_KEYS = (
    "entropy",
    "entropy_kept",
    "reward_mean",
    "accuracy",
    "clip_frac",
    "clip_frac_pos",
    "clip_frac_neg",
    "cov_a_sc",
    "entropy_change/predicted",
    "entropy_change/by_region/pos_likely",
    "entropy_change/by_region/pos_unlikely",
    "entropy_change/by_region/neg_likely",
    "entropy_change/by_region/neg_unlikely",
    "entropy_change/first_order",
    "entropy_change/realised",
    "filter/mu",
)
TOKEN_FIELDS = ("logp", "entropy", "s_star", "s_centered", "term")  # per-token numbers, besides text and kept
_NAME = re.compile(r"^step-(\d{6,})\.json\.gz$")


@dataclass(frozen=True)
class SampleBatch:
    """A step's batch as its host (the trainer, the TRL and verl adapters) hands it to `write_step`: the rollout's
    tensors, the tokenizer that decodes them, the behaviour policy's statistics and the step's choices. Shapes:
    prompt_ids, prompt_mask (B, P) left-padded; response_ids, response_mask, keep and the statistics (B, T);
    finished, rewards (B,); advantages (B,) or (B, T); B = groups x group_size, a group's rows consecutive.
    step_size: lr times the loss's weight of a token (losses.step_sizes): a float (lr / |T_B| for a token-mean loss),
    (B,) per row or (B, T) per token (the same within a row: it is taken per row for term_scale); None when the loss's
    weights are unknown (terms are then null)."""

    prompt_ids: Tensor
    prompt_mask: Tensor
    response_ids: Tensor
    response_mask: Tensor
    finished: Tensor
    tokenizer: Any
    stats: TokenStats
    advantages: Tensor
    keep: Tensor
    rewards: Tensor
    group_size: int
    step_size: float | Tensor | None = None


def due(step: int, every: int, last: int | None = None) -> bool:
    """Whether step (1-based) is sampled: step 1, every `every`-th and the last one; never when every is 0."""
    return every > 0 and (step == 1 or step % every == 0 or step == last)


def file_name(step: int) -> str:
    return f"step-{step:06d}.json.gz"


def choose_groups(rewards: Tensor, group_size: int, n: int) -> list[int]:
    """Indices of the n groups to write (all of them when n is 0): groups whose rewards differ first, then the
    others, each in batch order. rewards (B,), B a multiple of group_size, rows of group g at [g G, (g+1) G)."""
    values = rewards.detach().float().cpu().tolist()
    groups = [values[i : i + group_size] for i in range(0, len(values), group_size)]
    mixed = [max(g) > min(g) for g in groups]
    order = [g for g, m in enumerate(mixed) if m] + [g for g, m in enumerate(mixed) if not m]
    return order if n <= 0 else order[:n]


def _num(x: float) -> float | None:
    """A float rounded to 7 significant digits (JSON-ready; None for NaN and infinities)."""
    return float(f"{x:.7g}") + 0.0 if math.isfinite(x) else None  # + 0.0: no -0.0


def _nums(t: Tensor) -> list[float | None]:
    return [_num(v) for v in t.tolist()]


def _cut(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    head = (2 * limit) // 3
    return text[:head] + " \u2026 " + text[len(text) - (limit - head - 3) :]


def token_texts(tokenizer, ids: list[int]) -> list[str]:
    """The text of each token, in order (departure 3: a run of tokens that together decode one character gives
    that character to its first token and "" to the others)."""
    pieces = tokenizer.batch_decode([[i] for i in ids], skip_special_tokens=False, clean_up_tokenization_spaces=False)
    out = list(pieces)
    i = 0
    while i < len(ids):
        if "\ufffd" not in pieces[i]:
            i += 1
            continue
        for j in range(i + 2, min(len(ids), i + 8) + 1):  # a character is at most 4 UTF-8 bytes: 8 tokens suffice
            joint = tokenizer.decode(ids[i:j], skip_special_tokens=False, clean_up_tokenization_spaces=False)
            if "\ufffd" not in joint:
                out[i:j] = [joint] + [""] * (j - i - 1)
                i = j
                break
        else:
            i += 1
    return [_cut(t, MAX_TEXT_CHARS) for t in out]


def _decode(tokenizer, ids: list[int]) -> str:
    return tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)


def size_bound(groups: int, group_size: int, max_tokens: int = MAX_RESPONSE_TOKENS) -> int:
    """Bytes of the largest uncompressed record `build_record` can give under these caps (departure 2). In the
    record's JSON (UTF-8, ensure_ascii=False) one character takes at most 6 bytes (a control character's \\u00XX),
    a number at most 16 (7 significant digits, sign and exponent: -1.234567e-300) and a keep flag 1. Per token: its
    text, five numbers, the keep flag and a token-level advantage, each with a separator; per response, group and
    listed top token a fixed allowance for keys and scalars beside their texts; a header of fixed fields."""
    per_token = (6 * MAX_TEXT_CHARS + 3) + 5 * (16 + 1) + (1 + 1) + (16 + 1)
    per_response = 400
    per_group = (6 * MAX_PROMPT_CHARS + 3) + 200
    per_top = 6 * (MAX_TEXT_CHARS + CONTEXT_CHARS_BEFORE + CONTEXT_CHARS_AFTER) + 12 * 17 + 300
    return (
        groups * group_size * (max_tokens * per_token + per_response)
        + groups * per_group
        + 3 * TOP_TOKENS * per_top
        + HEADER_BYTES
    )


def entropy_terms(
    advantages: Tensor, s_centered: Tensor, loss_mask: Tensor, step_size: float | Tensor
) -> tuple[Tensor, Tensor, dict]:
    """(term, would, totals) of one step, float64 (B, T): eq. 23's term of each token of T (the loss_mask tokens),
    term = -step_size A S_c / |T| there and 0 elsewhere; `would`, the same product at every position (what a clipped
    token would have added had it stayed in the loss); the step's totals: eq. 23's sum, the means of A and S_c over
    T, |T|, Corollary 4's form -E_T[step A (S_c - E_T[S_c])] (the covariance form for a constant step) and the
    difference of the two (departure 1). advantages (B,) or (B, T); step_size lr w_t (losses.step_sizes): a float,
    (B,) per row or (B, T) per token."""
    a = broadcast_advantages(advantages, s_centered).double()
    s, m = s_centered.double(), loss_mask.to(s_centered.device).double()
    size = torch.as_tensor(step_size, dtype=torch.float64, device=s.device)
    size = size[:, None] if size.dim() == 1 else size
    n = m.sum().clamp_min(1.0)
    would = -size * a * s / n
    term = would * m
    mean_a, mean_s = float((a * m).sum() / n), float((s * m).sum() / n)
    eq23 = float(term.sum())
    corollary4 = float(
        -(size * a * (s - mean_s) * m).sum() / n
    )  # eq. 14: -lr / |T_B| Cov_T(A, S_c) for a constant step
    totals = {
        "eq23": eq23,
        "mean_advantage": mean_a,
        "mean_s_centered": mean_s,
        "tokens_in_mean": int(m.sum()),
        "corollary4": corollary4,
        "dropped_term": corollary4 - eq23,
    }
    if size.numel() == 1:
        totals["step_size"] = float(size)
    return term, would, totals


def _written_groups(
    w: dict[str, Tensor],
    chosen: list[int],
    rows: list[int],
    tokenizer,
    group_size: int,
    max_tokens: int,
    token_level: bool,
    has_terms: bool,
) -> list[dict]:
    """The chosen groups as JSON: w holds the written rows (in the order of `rows`) of the response ids, masks,
    advantages, rewards, term scales, prompts and token statistics."""
    out_groups = []
    for k, g in enumerate(chosen):
        first = k * group_size
        prompt = _decode(tokenizer, w["prompt_ids"][first][w["prompt_mask"][first]].tolist())
        responses = []
        for i in range(first, first + group_size):
            length = int(w["valid"][i].sum())
            n = min(length, max_tokens)
            resp = {
                "row": rows[i],
                "reward": _num(float(w["reward"][i])),
                "length": length,
                "finished": bool(w["finished"][i]),
                "advantage": None if token_level else _num(float(w["advantage"][i])),
                "term_scale": _num(float(w["scale"][i])) if has_terms else None,
                "text": token_texts(tokenizer, w["ids"][i, :n].tolist()),
                "kept": [int(x) for x in w["kept"][i, :n].tolist()],
            }
            if token_level:  # PPO's GAE: one advantage per token
                resp["advantage_t"] = _nums(w["advantage"][i, :n])
            for name in TOKEN_FIELDS:
                resp[name] = _nums(w[name][i, :n]) if name in w else [None] * n
            responses.append(resp)
        out_groups.append(
            {"index": g, "prompt": _cut(prompt, MAX_PROMPT_CHARS), "prompt_chars": len(prompt), "responses": responses}
        )
    return out_groups


def _batch_summary(rewards: Tensor, group_size: int, mask: Tensor, loss_mask: Tensor, entropy: Tensor) -> dict:
    """The whole batch's counts, mean reward and mean entropy over its valid tokens."""
    return {
        "groups": int(rewards.numel()) // group_size,
        "group_size": group_size,
        "responses": int(rewards.numel()),
        "valid_tokens": int(mask.sum()),
        "kept_tokens": int(loss_mask.sum()),
        "reward_mean": _num(float(rewards.float().mean())),
        "entropy": _num(float((entropy.float() * mask.to(entropy.device)).sum() / mask.sum().clamp_min(1))),
    }


def build_record(
    batch: SampleBatch, *, step: int, groups: int, max_tokens: int = MAX_RESPONSE_TOKENS, info: dict | None = None
) -> dict:
    """One step's samples as a JSON-ready dict (module docstring): `groups` of the batch's groups (0: all), at most
    max_tokens tokens of each response. info: fields copied into the record (method, source, the step's metrics,
    ...). Each response carries term_scale, its step size / |T|: a clipped token would have added -term_scale A S_c."""
    batch = dataclasses.replace(batch, response_mask=batch.response_mask.bool(), stats=batch.stats.detach())
    mask, stats, group_size, step_size = batch.response_mask, batch.stats, batch.group_size, batch.step_size
    s_c = stats.s_centered.float()
    loss_mask = mask.to(s_c.device) & batch.keep.to(s_c.device).bool()
    adv_t = broadcast_advantages(batch.advantages.to(s_c.device).float(), s_c)  # (B, T)
    token_level = batch.advantages.dim() == 2
    term = would = None
    totals: dict = {}
    scale = torch.zeros(mask.shape[0], dtype=torch.float64)
    if step_size is not None:
        term, would, totals = entropy_terms(adv_t, s_c, loss_mask, step_size)
        size = torch.as_tensor(step_size, dtype=torch.float64).cpu()
        size = size.amax(-1) if size.dim() == 2 else size  # per token: the same within a row at ratio 1, 0 off it
        scale = size.expand(mask.shape[0]) / max(totals["tokens_in_mean"], 1)
    chosen = choose_groups(batch.rewards, group_size, groups)
    rows = [g * group_size + j for g in chosen for j in range(group_size)]
    index = torch.tensor(rows, dtype=torch.long)

    def cpu(t: Tensor) -> Tensor:  # only the written rows leave the device
        return t.detach()[index.to(t.device)].cpu()

    written = {
        "logp": cpu(stats.logp).float(),
        "entropy": cpu(stats.entropy).float(),
        "s_star": cpu(stats.s_star).float(),
        "s_centered": cpu(s_c),
        **({"term": cpu(term)} if term is not None else {}),
        "ids": cpu(batch.response_ids),
        "valid": cpu(mask),
        "kept": cpu(loss_mask),
        "advantage": cpu(adv_t) if token_level else cpu(batch.advantages.float()),
        "reward": cpu(batch.rewards.float()),
        "finished": cpu(batch.finished.bool()),
        "scale": cpu(scale),
        "prompt_ids": cpu(batch.prompt_ids),
        "prompt_mask": cpu(batch.prompt_mask.bool()),
    }
    out_groups = _written_groups(
        written, chosen, rows, batch.tokenizer, group_size, max_tokens, token_level, term is not None
    )
    return {
        "format": FORMAT,
        "version": VERSION,
        "step": int(step),
        **(info or {}),
        "batch": _batch_summary(batch.rewards, group_size, mask, loss_mask, stats.entropy),
        "entropy_change": {k: (_num(v) if isinstance(v, float) else v) for k, v in totals.items()},
        "bound": {"groups": groups, "tokens_per_response": max_tokens},
        "groups": out_groups,
        "top": {} if term is None or would is None else top_tokens(batch, term, would, adv_t, loss_mask, set(rows)),
    }


def mark_tokens(record: dict, name: str, mask: Tensor, label: str) -> dict:
    """Adds a per-token 0/1 field `name` to every written response of a record (its row of `mask`, (B, T), cut as the
    response's tokens are) and lists it in record["marks"] as {"key": name, "label": label}: what the inspect page
    underlines (the monitor marks the tokens Clip_B and Clip_V would drop). Returns the record."""
    rows = mask.detach().bool().cpu()
    for group in record["groups"]:
        for resp in group["responses"]:
            resp[name] = [int(x) for x in rows[resp["row"], : len(resp["text"])].tolist()]
    record.setdefault("marks", []).append({"key": name, "label": label})
    return record


def top_tokens(
    batch: SampleBatch,
    term: Tensor,
    would: Tensor,
    adv_t: Tensor,
    loss_mask: Tensor,
    written: set[int],
    k: int = TOP_TOKENS,
) -> dict:
    """The batch's k tokens with the largest terms (`raise`: they push entropy up), the k with the smallest
    (`lower`), and the k clipped tokens with the largest |would-be term| (`removed`), each with its place (row,
    group, position, whether its group is written), its values and a few tokens of context. term, would, adv_t and
    loss_mask (B, T) as build_record computes them."""
    stats, mask, response_ids, tokenizer = batch.stats, batch.response_mask, batch.response_ids, batch.tokenizer
    group_size = batch.group_size
    places: dict[str, list[int]] = {}
    on = loss_mask.flatten().to(term.device)
    off = (mask.to(term.device) & ~loss_mask.to(term.device)).flatten()
    for name, score, allowed in (
        ("raise", term.flatten(), on),
        ("lower", -term.flatten(), on),
        ("removed", would.flatten().abs(), off),
    ):
        allowed = allowed & (score > 0) if name != "removed" else allowed
        score = torch.where(allowed, score, torch.full_like(score, -1.0))
        top = score.topk(min(k, score.numel()))
        places[name] = [int(i) for i, v in zip(top.indices.tolist(), top.values.tolist()) if v >= 0]
    width = term.shape[1]
    out: dict[str, list[dict]] = {}
    for name, chosen in places.items():
        entries = []
        for place in chosen:
            row, pos = divmod(place, width)
            ids = response_ids[row].tolist()
            end = int(mask[row].sum())
            entries.append(
                {
                    "row": row,
                    "group": row // group_size,
                    "position": pos,
                    "written": row in written,
                    "text": token_texts(tokenizer, ids[pos : pos + 1])[0],
                    "before": _decode(tokenizer, ids[max(0, pos - CONTEXT_BEFORE) : pos])[-CONTEXT_CHARS_BEFORE:],
                    "after": _decode(tokenizer, ids[pos + 1 : min(pos + 1 + CONTEXT_AFTER, end)])[:CONTEXT_CHARS_AFTER],
                    "term": _num(float(would[row, pos])),
                    "advantage": _num(float(adv_t[row, pos])),
                    "s_centered": _num(float(stats.s_centered[row, pos])),
                    "s_star": _num(float(stats.s_star[row, pos])),
                    "entropy": _num(float(stats.entropy[row, pos])),
                    "logp": _num(float(stats.logp[row, pos])),
                    "kept": name != "removed",
                }
            )
        out[name] = entries
    return out


def write_record(run_dir: Path | str, record: dict) -> Path:
    """RUN_DIR/samples/step-NNNNNN.json.gz, written whole or not at all (a temporary file, then a rename); the same
    record gives the same bytes (gzip's timestamp is 0)."""
    folder = Path(run_dir) / SAMPLES_DIR
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / file_name(record["step"])
    data = gzip.compress(
        json.dumps(record, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode(),
        compresslevel=6,
        mtime=0,
    )
    tmp = folder / f".{path.name}.{os.getpid()}.tmp"  # cut_after removes one a kill left
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def write_step(
    run_dir: Path | str,
    step: int,
    batch: SampleBatch,
    *,
    groups: int,
    info: dict,
    metrics: dict | None = None,
    marks: Sequence[tuple[str, Tensor, str]] = (),
) -> Path:
    """A host's call on a step it samples (each host decides which: `due` for the trainer): the record of `batch`
    with `info` (source, method, lr, ...) and the step's METRIC_KEYS of `metrics` (numbers rounded, NaN as null),
    each of `marks` (name, (B, T) mask, label) added with mark_tokens, written to RUN_DIR/samples."""
    if metrics is not None:
        info = {
            **info,
            "metrics": {k: _num(v) if isinstance(v, float) else v for k, v in metrics.items() if k in METRIC_KEYS},
        }
    record = build_record(batch, step=step, groups=groups, info=info)
    for name, mask, label in marks:
        mark_tokens(record, name, mask, label)
    return write_record(run_dir, record)


def steps_written(run_dir: Path | str) -> list[int]:
    """The steps with a samples file in RUN_DIR/samples, ascending."""
    folder = Path(run_dir) / SAMPLES_DIR
    found = (_NAME.match(p.name) for p in folder.iterdir()) if folder.is_dir() else ()
    return sorted(int(m.group(1)) for m in found if m)


def cut_after(run_dir: Path | str, step: int) -> list[int]:
    """Remove the samples of steps after `step` and any temporary file a kill left (a run resumed from the checkpoint
    of `step` writes them again; a fresh run, step 0, starts empty). Returns the steps removed."""
    folder = Path(run_dir) / SAMPLES_DIR
    if not folder.is_dir():
        return []
    for stale in folder.glob(".step-*"):
        stale.unlink(missing_ok=True)
    removed = [s for s in steps_written(run_dir) if s > step]
    for s in removed:
        (folder / file_name(s)).unlink(missing_ok=True)
    return removed


def read_record(path: Path | str) -> dict:
    """One samples file; a file that is not one (damaged, another format or version) raises ValueError naming it."""
    path = Path(path)
    try:
        record = json.loads(gzip.decompress(path.read_bytes()))
    except (OSError, EOFError, ValueError) as err:
        raise ValueError(
            f"{path} is not a readable samples file ({type(err).__name__}: {err}); delete it, or rerun "
            "the run with --resume from an earlier checkpoint to write it again"
        ) from None
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        raise ValueError(f"{path} is not an entropy-rft samples file (no format {FORMAT!r}); delete it")
    if record.get("version") != VERSION:
        raise ValueError(
            f"{path} is samples format version {record.get('version')!r}; this entropy-rft reads "
            f"version {VERSION}: inspect it with the entropy-rft that wrote it"
        )
    return record


def read_samples(run_dir: Path | str) -> dict[int, dict]:
    """Every samples file of a run directory, by step."""
    folder = Path(run_dir) / SAMPLES_DIR
    return {s: read_record(folder / file_name(s)) for s in steps_written(run_dir)}
