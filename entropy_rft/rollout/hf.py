"""Rollouts with a Hugging Face causal LM: sampling from exactly softmax(z / T) with top-p (the loop of
rollout/sampling.py: each prompt prefilled once per group, no processor inherited from the model's
generation_config; tokens after the prompt decoded by rollout/decode.py's step where it applies, dropping finished
rows on the CPU, at fixed shapes in a CUDA graph on a GPU), up to max_new_tokens, stop at any EOS id.

The response mask comes from generated lengths: a response runs up to and including its first EOS token, or
to max_new_tokens when it has none (truncated). Positions after that are masked whatever token they hold; the
pad token is never used to infer the mask.

Prompts are left-padded so every response starts at the same column; the trainer's forward pass uses the same
position ids as generation (cumulative sum of the attention mask).
"""

from __future__ import annotations

import torch
from torch import Tensor

from .batch import Rollout
from .sampling import DecodeSession, Sampling, check_decode, position_ids, sample


def response_mask_from_lengths(response_ids: Tensor, eos_token_id: int | list[int]) -> tuple[Tensor, Tensor]:
    """(mask, finished): mask covers each response up to and including its first EOS (any of the given ids)."""
    eos = torch.tensor([eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id))
    is_eos = torch.isin(response_ids, eos.to(response_ids.device))
    finished = is_eos.any(dim=1)
    first = torch.where(
        finished, is_eos.int().argmax(dim=1) + 1, torch.full_like(finished, response_ids.shape[1], dtype=torch.long)
    )
    mask = torch.arange(response_ids.shape[1], device=response_ids.device).unsqueeze(0) < first.unsqueeze(1)
    return mask, finished


def eos_ids(model, tokenizer) -> list[int]:
    """Every id that ends a response: the tokenizer's EOS and each one the model's generation_config lists
    (Qwen2.5-Instruct's lists both <|im_end|> and <|endoftext|>)."""
    ids = set() if tokenizer.eos_token_id is None else {int(tokenizer.eos_token_id)}
    listed = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if listed is not None:
        ids.update(int(i) for i in ([listed] if isinstance(listed, int) else listed))
    if not ids:
        raise ValueError(
            "neither the tokenizer nor the model's generation_config names an EOS token; set "
            "tokenizer.eos_token (responses would never end)"
        )
    return sorted(ids)


def render_prompts(tokenizer, prompts: list[str], chat_template: bool) -> list[str]:
    """Prompt texts as the model reads them: each wrapped as one user turn of the tokenizer's chat template (with
    the assistant turn opened) when chat_template is set, else unchanged."""
    if not chat_template:
        return list(prompts)
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(
            "chat_template=True but the tokenizer has no chat template; set chat_template: false "
            "for a base model without one"
        )
    return [
        tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
        for p in prompts
    ]


def model_context(config) -> int | None:
    """The longest sequence the model's positions cover (max_position_embeddings, or GPT-2's n_positions), or None
    when its config names none."""
    for name in ("max_position_embeddings", "n_positions", "max_sequence_length"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


class PromptTooLong(ValueError):
    """A prompt longer than the model's context or the stated limit (check_prompt_lengths)."""


def check_prompt_lengths(
    engine, prompts: list[str], rows: list[str], *, max_new_tokens: int, limit: int = 0, option: str
) -> None:
    """Before any rollout: every prompt, as the engine reads it (its chat template applied), fits the model's context
    (`engine.context`, None: unknown) and `limit` tokens (0: no limit of its own); the first that does not raises
    PromptTooLong naming its row (`rows[i]`), its length, the limit and `option`, the setting that states one. A
    prompt whose characters alone prove it too long is refused without being tokenized: no token of the vocabulary
    spells more characters than its longest entry, so a text of c characters has at least c / longest tokens (a
    row of 2 million numbers is refused in milliseconds). A prompt that leaves fewer than max_new_tokens positions of
    the context for its response is one warning (the response runs past the positions the model was trained on)."""
    import sys

    context = getattr(engine, "context", None)
    bounds = [b for b in (context, limit or None) if b]
    if not prompts or not bounds:
        return
    bound = min(bounds)
    tokenizer = engine.tokenizer
    longest = max(map(len, tokenizer.get_vocab()), default=1)
    texts = render_prompts(tokenizer, prompts, engine.chat_template)

    def refuse(i: int, size: str) -> None:
        whose = f"the model's context of {context} tokens" if bound == context else f"{option} {limit}"
        fix = f"shorten or drop the row, or raise {option}" if bound != context else "shorten or drop the row"
        raise PromptTooLong(f"{rows[i]}: its prompt is {size}, longer than {whose}; {fix}")

    short = [i for i, text in enumerate(texts) if len(text) <= bound * longest]  # the others are never tokenized
    encoded = tokenizer([texts[i] for i in short], add_special_tokens=False)["input_ids"] if short else []
    lengths = dict(zip(short, map(len, encoded)))
    for i, text in enumerate(texts):  # the first row too long, in order
        if i not in lengths:
            refuse(i, f"{len(text):,} characters (at least {len(text) // longest:,} tokens)")
        elif lengths[i] > bound:
            refuse(i, f"{lengths[i]:,} tokens")
    worst = max(lengths, key=lengths.__getitem__)
    if context is not None and lengths[worst] + max_new_tokens > context:
        print(
            f"entropy-rft: warning: {rows[worst]}: its prompt of {lengths[worst]:,} tokens leaves "
            f"{context - lengths[worst]:,} of the model's context of {context} for a response of up to "
            f"{max_new_tokens} tokens (max_new_tokens); positions past {context} are beyond what the model was trained "
            "on",
            file=sys.stderr,
        )


class HFEngine:
    """Generation with a transformers causal LM and its tokenizer."""

    def __init__(
        self,
        model,
        tokenizer,
        *,
        batch_size: int = 512,
        chat_template: bool = False,
        progress: bool = False,
        decode: str = "auto",
        precision: str = "fp32",
        check_every: int | None = None,
        session: DecodeSession | None = None,
    ):
        self.model = model
        self.context = model_context(getattr(model, "config", None))  # check_prompt_lengths reads it
        self.decode = check_decode(decode)
        # kept across rollouts: the bfloat16 decode copy of the weights, the compiled step's seconds and failure
        self.session = session or DecodeSession()
        # the fixed-shape paths decode in bfloat16 where the policy trains under bf16 autocast; the others in the
        # model's dtype, as before
        self.dtype = torch.bfloat16 if precision == "bf16" else None
        self.check_every = check_every
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.chat_template = chat_template
        self.progress = progress
        if tokenizer.pad_token_id is None:
            raise ValueError("the tokenizer has no pad token; set tokenizer.pad_token (e.g. to the EOS token) first")
        self.eos_ids = eos_ids(model, tokenizer)
        self.eos_id = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else self.eos_ids[0]

    def sync_weights(self) -> None:
        """Nothing to do: HF generation samples from the trained model itself (the vLLM engine copies weights)."""

    def close(self) -> None:
        """Nothing to release: the model belongs to the caller."""

    def pop_compile_seconds(self) -> float:
        """Seconds spent compiling the decode step since the last call (decode="compile", or "auto" on CUDA: the
        first rollout of each shape); 0.0 when nothing compiled."""
        return self.session.pop_compile_seconds()

    def encode_prompts(self, prompts: list[str]) -> tuple[Tensor, Tensor]:
        self.tokenizer.padding_side = "left"
        texts = render_prompts(self.tokenizer, prompts, self.chat_template)
        enc = self.tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        return enc["input_ids"], enc["attention_mask"].bool()

    @torch.no_grad()
    def generate(
        self,
        prompts: list[str],
        *,
        n: int = 1,
        temperature: float = 1.0,
        top_p: float = 1.0,
        max_new_tokens: int = 32,
        seed: int | None = None,
    ) -> Rollout:
        """n samples of each prompt, grouped: rows [i * n, (i + 1) * n) belong to prompts[i]. sampler_logp holds
        each token's log-probability under the distribution it was drawn from (softmax(z / T) on the nucleus)."""
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0 for sampling, got {temperature}")
        if not 0 < top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {top_p}")
        device = self.model.device
        generator = None
        if seed is not None:
            generator = torch.Generator(device=device).manual_seed(seed)
        sampling = Sampling(
            n=n,
            temperature=temperature,
            top_p=top_p,
            max_new_tokens=max_new_tokens,
            eos_ids=self.eos_ids,
            pad_id=self.tokenizer.pad_token_id,
        )
        per_pass = max(1, self.batch_size // n)
        parts = []
        starts = range(0, len(prompts), per_pass)
        if self.progress and len(starts) > 1:
            from tqdm import tqdm

            starts = tqdm(starts, desc="generate", unit="batch", leave=False)
        for start in starts:  # sample() runs the model in eval mode: the rollouts come from the policy itself
            ids, mask = self.encode_prompts(prompts[start : start + per_pass])
            response_ids, sampler_logp = sample(
                self.model,
                ids.to(device),
                mask.to(device),
                sampling,
                generator=generator,
                decode=self.decode,
                dtype=self.dtype,
                check_every=self.check_every,
                session=self.session,
            )
            response_ids, sampler_logp = response_ids.cpu(), sampler_logp.cpu()
            response_mask, finished = response_mask_from_lengths(response_ids, self.eos_ids)
            shown = (response_mask & ~torch.isin(response_ids, torch.tensor(self.eos_ids))).tolist()
            texts = [
                self.tokenizer.decode([t for t, keep in zip(r, k) if keep], skip_special_tokens=False)
                for r, k in zip(response_ids.tolist(), shown)
            ]
            rows = torch.arange(ids.shape[0]).repeat_interleave(n)
            parts.append(Rollout(ids[rows], mask[rows], response_ids, response_mask, finished, texts, sampler_logp))
        return Rollout.concat(parts, self.tokenizer.pad_token_id)


def sequence_forward(model, rollout: Rollout, *, hidden: bool = False) -> tuple[Tensor, Tensor | None]:
    """Logits that predict each response token, (B, R, V), and optionally the last hidden states at the same
    positions, (B, R, D): one forward pass over prompt + response with the position ids generation used."""
    input_ids = rollout.input_ids().to(model.device)
    attn = rollout.attention_mask().to(model.device)
    out = model(
        input_ids=input_ids, attention_mask=attn.long(), position_ids=position_ids(attn), output_hidden_states=hidden
    )
    p = rollout.prompt_ids.shape[1]
    return out.logits[:, p - 1 : -1], (out.hidden_states[-1][:, p - 1 : -1] if hidden else None)
