"""A batch of rollouts: left-padded prompts, right-padded responses with their masks (the type every engine returns
and the trainer's forward reads; it lives below both)."""

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
    def concat(parts: list[Rollout], pad_id: int) -> Rollout:
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

    def select(self, rows) -> Rollout:
        return Rollout(
            self.prompt_ids[rows],
            self.prompt_mask[rows],
            self.response_ids[rows],
            self.response_mask[rows],
            self.finished[rows],
            [self.texts[i] for i in torch.arange(len(self.texts))[rows].tolist()],
            None if self.sampler_logp is None else self.sampler_logp[rows],
        )
