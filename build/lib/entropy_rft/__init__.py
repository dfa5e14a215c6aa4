"""entropy-rft: reinforcement fine-tuning of language models with entropy control (arXiv 2602.03392)."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("entropy-rft")
except PackageNotFoundError:  # run from a source tree that was never installed
    __version__ = "unknown (not installed)"
