"""Methods chosen by name (`--method`): each is a token filter from masks.py, the TokenStats field it reads, and
its default options. A method with no filter is the plain GRPO/PPO update.

Registered here:
- grpo: no filter.
- clip_b: Algorithm 1, reads S* (defaults: mu 2.5, negative samples, lower tail; the authors' code).
- clip_v: Algorithm 2, reads S_c (defaults: mu 8.5, max_frac 1e-4; the authors' code).
- s_sign:{retain|mask}:{pos|neg}_s:{pos|neg}_samples, eight filters for Figure 1, e.g.
  "s_sign:retain:pos_s:pos_samples" keeps only tokens with S* > 0 in positive samples.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from . import masks
from .registry import Registry


@dataclass(frozen=True)
class Method:
    name: str
    filter: Callable | None = None  # masks.* function: (score, advantages, mask, **options) -> (keep, metrics)
    score: str = "s_star"  # TokenStats field passed as the score
    options: dict = field(default_factory=dict)  # default keyword options of the filter
    summary: str = ""

    def apply(self, stats, advantages, mask, **overrides):
        """(keep, metrics) for a batch; overrides replace the default options (None values are ignored)."""
        if self.filter is None:
            return mask.clone(), {}
        options = {**self.options, **{k: v for k, v in overrides.items() if v is not None}}
        return self.filter(getattr(stats, self.score), advantages, mask, **options)


METHODS: Registry[Method] = Registry("method")
METHODS.register("grpo", Method("grpo", summary="plain clipped policy gradient, no token filter"))
METHODS.register("clip_b", Method("clip_b", masks.clip_b, "s_star", {"mu": 2.5},
                                  "Clip_B: drop batch-outlier S* tokens (Algorithm 1)"))
METHODS.register("clip_v", Method("clip_v", masks.clip_v, "s_centered", {"mu": 8.5, "max_frac": 1e-4},
                                  "Clip_V: drop outlier S_c tokens (Algorithm 2)"))
for _action in ("retain", "mask"):
    for _sign in ("pos", "neg"):
        for _samples in ("pos", "neg"):
            _name = f"s_sign:{_action}:{_sign}_s:{_samples}_samples"
            METHODS.register(_name, Method(
                _name, masks.s_sign, "s_star",
                {"action": _action, "sign": "positive" if _sign == "pos" else "negative",
                 "samples": "positive" if _samples == "pos" else "negative"},
                f"Figure 1: {_action} tokens with S* {'>' if _sign == 'pos' else '<'} 0 in "
                f"{'positive' if _samples == 'pos' else 'negative'} samples"))
