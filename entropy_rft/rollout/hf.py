"""Rollouts with Hugging Face `generate`: sampling with temperature and top-p, up to max_new_tokens, stop at EOS.

The response mask comes from generated lengths: a response runs up to and including its first EOS token, or
to max_new_tokens when it has none (truncated). Positions after that are masked whatever token they hold; the
pad token is never used to infer the mask.

Prompts are left-padded so every response starts at the same column; the trainer's forward pass uses the same
position ids as generation (cumulative sum of the attention mask).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class Rollout:
    prompt_ids: Tensor  # (B, P) left-padded
    prompt_mask: Tensor  # (B, P) bool
    response_ids: Tensor  # (B, R)
    response_mask: Tensor  # (B, R) bool, from generated lengths
    finished: Tensor  # (B,) bool: the response ended with EOS
    texts: list[str]  # decoded responses, EOS excluded
    sampler_logp: Tensor | None = None  # (B, R) log-prob the sampling engine gave each token (vLLM), else None

    @property
    def lengths(self) -> Tensor:
        return self.response_mask.sum(-1)

    def input_ids(self) -> Tensor:
        return torch.cat([self.prompt_ids, self.response_ids], dim=1)

    def attention_mask(self) -> Tensor:
        return torch.cat([self.prompt_mask, self.response_mask], dim=1)

    @staticmethod
    def concat(parts: list["Rollout"], pad_id: int) -> "Rollout":
        """Rows of several rollouts in one: prompts left-padded, responses right-padded to common widths."""
        wp = max(r.prompt_ids.shape[1] for r in parts)
        wr = max(r.response_ids.shape[1] for r in parts)
        pad = torch.nn.functional.pad
        sampler = None
        if all(r.sampler_logp is not None for r in parts):
            sampler = torch.cat([pad(r.sampler_logp, (0, wr - r.sampler_logp.shape[1])) for r in parts])
        return Rollout(
            torch.cat([pad(r.prompt_ids, (wp - r.prompt_ids.shape[1], 0), value=pad_id) for r in parts]),
            torch.cat([pad(r.prompt_mask, (wp - r.prompt_mask.shape[1], 0), value=False) for r in parts]),
            torch.cat([pad(r.response_ids, (0, wr - r.response_ids.shape[1]), value=pad_id) for r in parts]),
            torch.cat([pad(r.response_mask, (0, wr - r.response_mask.shape[1]), value=False) for r in parts]),
            torch.cat([r.finished for r in parts]),
            [t for r in parts for t in r.texts],
            sampler,
        )

    def select(self, rows) -> "Rollout":
        return Rollout(self.prompt_ids[rows], self.prompt_mask[rows], self.response_ids[rows],
                       self.response_mask[rows], self.finished[rows],
                       [self.texts[i] for i in torch.arange(len(self.texts))[rows].tolist()],
                       None if self.sampler_logp is None else self.sampler_logp[rows])


def response_mask_from_lengths(response_ids: Tensor, eos_token_id: int) -> tuple[Tensor, Tensor]:
    """(mask, finished): mask covers each response up to and including its first EOS."""
    is_eos = response_ids == eos_token_id
    finished = is_eos.any(dim=1)
    first = torch.where(finished, is_eos.int().argmax(dim=1) + 1, torch.full_like(finished, response_ids.shape[1], dtype=torch.long))
    mask = torch.arange(response_ids.shape[1], device=response_ids.device).unsqueeze(0) < first.unsqueeze(1)
    return mask, finished


def render_prompts(tokenizer, prompts: list[str], chat_template: bool) -> list[str]:
    """Prompt texts as the model reads them: each wrapped as one user turn of the tokenizer's chat template (with
    the assistant turn opened) when chat_template is set, else unchanged."""
    if not chat_template:
        return list(prompts)
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("chat_template=True but the tokenizer has no chat template; set chat_template: false "
                         "for a base model without one")
    return [tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
            for p in prompts]


class HFEngine:
    """Generation with a transformers causal LM and its tokenizer."""

    def __init__(self, model, tokenizer, *, batch_size: int = 512, chat_template: bool = False,
                 progress: bool = False):
        self.model = model
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.chat_template = chat_template
        self.progress = progress
        if tokenizer.pad_token_id is None:
            raise ValueError("the tokenizer has no pad token; set tokenizer.pad_token (e.g. to the EOS token) first")
        self.eos_id = tokenizer.eos_token_id

    def sync_weights(self) -> None:
        """Nothing to do: HF generation samples from the trained model itself (the vLLM engine copies weights)."""

    def close(self) -> None:
        """Nothing to release: the model belongs to the caller."""

    def encode_prompts(self, prompts: list[str]) -> tuple[Tensor, Tensor]:
        self.tokenizer.padding_side = "left"
        texts = render_prompts(self.tokenizer, prompts, self.chat_template)
        enc = self.tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        return enc["input_ids"], enc["attention_mask"].bool()

    @torch.no_grad()
    def generate(self, prompts: list[str], *, n: int = 1, temperature: float = 1.0, top_p: float = 1.0,
                 max_new_tokens: int = 32, seed: int | None = None) -> Rollout:
        """n samples of each prompt, grouped: rows [i * n, (i + 1) * n) belong to prompts[i]."""
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0 for sampling, got {temperature}")
        expanded = [p for p in prompts for _ in range(n)]
        if seed is not None:
            torch.manual_seed(seed)  # HF sampling draws from the global generator
        was_training = self.model.training
        self.model.eval()
        parts = []
        starts = range(0, len(expanded), self.batch_size)
        if self.progress and len(starts) > 1:
            from tqdm import tqdm

            starts = tqdm(starts, desc="generate", unit="batch", leave=False)
        for start in starts:
            ids, mask = self.encode_prompts(expanded[start : start + self.batch_size])
            out = self.model.generate(
                input_ids=ids.to(self.model.device), attention_mask=mask.long().to(self.model.device),
                do_sample=True, temperature=temperature, top_p=top_p, top_k=0, max_new_tokens=max_new_tokens,
                eos_token_id=self.eos_id, pad_token_id=self.tokenizer.pad_token_id,
            )
            response_ids = out[:, ids.shape[1]:].cpu()
            response_mask, finished = response_mask_from_lengths(response_ids, self.eos_id)
            texts = [self.tokenizer.decode(r[m & (r != self.eos_id)].tolist(), skip_special_tokens=False)
                     for r, m in zip(response_ids, response_mask)]
            parts.append(Rollout(ids, mask, response_ids, response_mask, finished, texts))
        self.model.train(was_training)
        return Rollout.concat(parts, self.tokenizer.pad_token_id)


def sequence_forward(model, rollout: Rollout, *, hidden: bool = False) -> tuple[Tensor, Tensor | None]:
    """Logits that predict each response token, (B, R, V), and optionally the last hidden states at the same
    positions, (B, R, D): one forward pass over prompt + response with the position ids generation used."""
    input_ids = rollout.input_ids().to(model.device)
    attn = rollout.attention_mask().to(model.device)
    position_ids = (attn.long().cumsum(-1) - 1).clamp_min(0)
    out = model(input_ids=input_ids, attention_mask=attn.long(), position_ids=position_ids, output_hidden_states=hidden)
    p = rollout.prompt_ids.shape[1]
    return out.logits[:, p - 1 : -1], (out.hidden_states[-1][:, p - 1 : -1] if hidden else None)
