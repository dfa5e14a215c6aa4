"""Generation engines. `hf` (Hugging Face generate, CPU or GPU) is the default."""

from .hf import HFEngine, Rollout

__all__ = ["HFEngine", "Rollout"]
