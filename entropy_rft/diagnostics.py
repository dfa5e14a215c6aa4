"""The per-step diagnostics of the paper's figures, as plain floats over a batch's response tokens."""

from __future__ import annotations

import torch


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> float:
    """Mean of x over the mask's tokens, as a float (0 for an empty mask)."""
    m = mask.float()
    return float((x.float() * m).sum() / m.sum().clamp_min(1.0))
