"""The model's key/value cache under the name the installed transformers gives it.

transformers 5.x renamed the forward argument and the output field `past_key_values` to `cache` (the old name
still works but warns "deprecated and will be removed in version 5.40.0"); 4.x knows only `past_key_values`.
Every call that passes or reads a cache goes through these two helpers, so no deprecated name reaches
transformers whatever version is installed (tests/test_rollout.py turns the warning into an error)."""

from __future__ import annotations

import dataclasses

from transformers.modeling_outputs import CausalLMOutputWithPast

# the cache's name in this transformers: a field of the outputs dataclass, and the forward argument of that name
CACHE = "cache" if "cache" in {f.name for f in dataclasses.fields(CausalLMOutputWithPast)} else "past_key_values"


def cache_arg(cache) -> dict:
    """The keyword argument that hands `cache` to a model's forward: {"cache": cache} or {"past_key_values": ...}."""
    return {CACHE: cache}


def cache_of(outputs):
    """The cache a forward returned (outputs.cache, or outputs.past_key_values before transformers 5)."""
    return getattr(outputs, CACHE)
