"""The HF engine's own sampling loop: exactly softmax(z / T) restricted to the top-p nucleus, nothing else.

`transformers.generate` merges the model's generation_config into every call, so processors the checkpoint
ships (Qwen2.5-Instruct: repetition_penalty 1.05, top_k 20) silently change the sampling distribution and the
rollouts stop being on-policy for the policy the trainer differentiates. This loop applies no processor but
temperature and top-p, and it is faster on GRPO batches:
- each distinct prompt is prefilled once and its keys and values are repeated to its n samples;
- rows that have finished (sampled any EOS id) leave the batch, so the model runs only on live rows;
- after the prefill, on the CPU, tokens go through rollout/decode.py's hand-written step for the model families it
  reads exactly (Qwen2, Qwen3, Llama, Mistral): the same arithmetic without transformers' per-call work.

Top-p is the nucleus of Holtzman et al. as transformers' TopPLogitsWarper computes it: sort by probability,
keep the smallest prefix whose mass reaches top_p (a token is kept when the mass strictly before it is below
top_p, so at least one is kept); the kept logits are renormalised by the softmax. tests/test_rollout.py checks
the kept sets against TopPLogitsWarper and the sampled frequencies against the model's probabilities.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .decode import HandDecoder, HandSteps, unsupported


def nucleus_logits(logits: Tensor, top_p: float) -> Tensor:
    """logits [B, V] with the tokens outside each row's top-p nucleus set to -inf (top_p >= 1: unchanged)."""
    if top_p >= 1.0:
        return logits
    probs = logits.softmax(-1)
    sorted_p, order = probs.sort(dim=-1, descending=True)
    mass_before = sorted_p.cumsum(-1) - sorted_p
    drop_sorted = mass_before >= top_p
    drop_sorted[:, 0] = False
    drop = torch.zeros_like(drop_sorted).scatter_(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


def position_ids(mask: Tensor) -> Tensor:
    """Position ids of left-padded rows: each real token's index among its row's real tokens (padding: 0)."""
    return (mask.long().cumsum(-1) - 1).clamp_min(0)


DECODE = ("auto", "hand", "hf")  # how tokens after the prompt go through the model (see `sample`)


def check_decode(decode: str) -> str:
    if decode not in DECODE:
        raise ValueError(f"decode must be one of {', '.join(DECODE)}, got {decode!r}")
    return decode


def sample(model, prompt_ids: Tensor, prompt_mask: Tensor, *, n: int, temperature: float, top_p: float,
           max_new_tokens: int, eos_ids: list[int], pad_id: int, generator: torch.Generator | None = None,
           decode: str = "auto") -> tuple[Tensor, Tensor]:
    """n samples of each left-padded prompt, grouped (rows [i n, (i + 1) n) are prompt i's).

    The model runs in eval mode (its training flag is restored after). Returns (response_ids [P n, R],
    sampler_logp [P n, R]): R is the longest response (<= max_new_tokens); each
    response runs up to and including its first EOS id, then holds pad_id; sampler_logp is the log-probability of
    each sampled token under the distribution it was drawn from (0 after the response ends). The loop runs in
    inference mode (no autograd bookkeeping: 5% faster on the demo's rollouts); the results are ordinary tensors.

    decode: how each new token goes through the model after the prefill. "hf": the model's forward with its
    cache; "hand": rollout/decode.py's step (the same arithmetic without transformers' per-call machinery; an
    error for a model it cannot read); "auto": "hand" on the CPU for a model it can read, else "hf".
    """
    check_decode(decode)
    was_training = model.training
    model.eval()  # the policy itself (no dropout), and a cache: gradient checkpointing turns it off in training mode
    try:
        with torch.inference_mode():
            response, logp = _sample(model, prompt_ids, prompt_mask, n=n, temperature=temperature, top_p=top_p,
                                     max_new_tokens=max_new_tokens, eos_ids=eos_ids, pad_id=pad_id,
                                     generator=generator, decode=decode)
    finally:
        model.train(was_training)
    return response.clone(), logp.clone()


def hand_decoder(model, decode: str, columns: int, device: torch.device):
    """The HandDecoder `decode` asks for (None: decode with the model's forward); columns is the longest
    sequence the rollout can reach, prompt padding included."""
    if decode == "hf" or (decode == "auto" and device.type != "cpu"):
        return None
    reason = unsupported(model)
    decoder = HandDecoder(model) if reason is None else None
    if decoder is not None and decoder.window is not None and columns > decoder.window:
        reason, decoder = f"{columns} tokens exceed the sliding attention window of {decoder.window}", None
    if decoder is None and decode == "hand":
        raise ValueError(f"decode='hand' cannot decode this model: {reason}; use decode='auto' or 'hf'")
    return decoder


class _ForwardSteps:
    """Decoding through the model's own forward and cache (decode='hf')."""

    def __init__(self, model, cache, rows: Tensor, prompt_mask: Tensor):
        cache.batch_select_indices(rows)
        self.model, self.cache = model, cache
        self.attn = prompt_mask.long()[rows]
        self.position = prompt_mask.long().sum(-1)[rows]

    def keep(self, rows: Tensor) -> None:
        self.cache.batch_select_indices(rows)
        self.attn, self.position = self.attn[rows], self.position[rows]

    def __call__(self, token: Tensor) -> Tensor:
        self.attn = torch.cat([self.attn, self.attn.new_ones(self.attn.shape[0], 1)], dim=1)
        out = self.model(input_ids=token[:, None], attention_mask=self.attn, position_ids=self.position[:, None],
                         past_key_values=self.cache, use_cache=True, logits_to_keep=1)
        self.cache = out.past_key_values
        self.position = self.position + 1
        return out.logits[:, -1]


def _sample(model, prompt_ids: Tensor, prompt_mask: Tensor, *, n: int, temperature: float, top_p: float,
            max_new_tokens: int, eos_ids: list[int], pad_id: int, generator: torch.Generator | None, decode: str,
            ) -> tuple[Tensor, Tensor]:
    device = prompt_ids.device
    rows = prompt_ids.shape[0] * n
    eos = torch.tensor(sorted(set(eos_ids)), device=device)
    hand = hand_decoder(model, decode, prompt_ids.shape[1] + max_new_tokens, device)  # before any model work
    out = model(input_ids=prompt_ids, attention_mask=prompt_mask.long(), position_ids=position_ids(prompt_mask),
                use_cache=True, logits_to_keep=1)
    prompt_of = torch.arange(prompt_ids.shape[0], device=device).repeat_interleave(n)  # (rows,)
    logits = out.logits[prompt_of, -1]
    steps = (HandSteps(hand, out.past_key_values, prompt_of, prompt_mask, max_new_tokens) if hand is not None
             else _ForwardSteps(model, out.past_key_values, prompt_of, prompt_mask))
    del out
    live = torch.arange(rows, device=device)
    response = torch.full((rows, max_new_tokens), pad_id, dtype=torch.long, device=device)
    logp = torch.zeros(rows, max_new_tokens, dtype=torch.float32, device=device)
    width = 0
    for t in range(max_new_tokens):
        z = nucleus_logits(logits.float() / temperature, top_p)
        log_probs = z.log_softmax(-1)
        token = torch.multinomial(log_probs.exp(), 1, generator=generator).squeeze(1)
        response[live, t] = token
        logp[live, t] = log_probs.gather(1, token[:, None]).squeeze(1)
        width = t + 1
        going = ~torch.isin(token, eos)
        if t + 1 == max_new_tokens or not bool(going.any()):
            break
        if not bool(going.all()):
            keep = going.nonzero().squeeze(1)
            live, token = live[keep], token[keep]
            steps.keep(keep)
        logits = steps(token)
    return response[:, :width], logp[:, :width]
