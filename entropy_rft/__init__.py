"""entropy-rft: reinforcement fine-tuning of language models with entropy control (arXiv 2602.03392).

The package's folders (docs/design.md draws them; tests/test_layout.py holds them):
- core/: the paper's math, importing nothing else of the package: the entropy discriminator and the first-order
  entropy change (dynamics, kernels), the masks of Clip_B / Clip_V and the baselines (masks), advantages, losses,
  methods and their registries, the objective, the entropy controls;
- run/: a run's record on disk: its directory and lock (rundir), the settings digest and completeness checks
  (record), the checkpoint (checkpoint), the stops (stops);
- train/: the built-in trainer: the loop (trainer), one step (step) and its shape (rules), the forward (forward),
  the diagnostics, the policy's set-up (policy, dropout), the problems (problems) and the memory plan (plan);
- commands/: the command line (cli) and what only its subcommands use;
- rollout/ (the generation engines), tasks/ (prompts, rewards, the math datasets) and integrations/ for verl, TRL
  and Trinity-RFT; what several folders share (config, recipes, samples, logging, evaluate, ...) at the top.
"""

import importlib
import importlib.abc
import importlib.util
import sys
from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("entropy-rft")
except PackageNotFoundError:  # run from a source tree that was never installed
    __version__ = "unknown (not installed)"

# Where each module of the flat layout (up to 0.x, issue 55) now lives. The old names stay importable as the same
# module objects: user code (`from entropy_rft.masks import clip_b`), installed console scripts naming
# entropy_rft.cli:main, and class paths pickled into older runs' trainer_state.pt all resolve.
MOVED = {
    **{f"entropy_rft.{m}": f"entropy_rft.core.{m}" for m in (
        "registry", "dynamics", "kernels", "masks", "advantages", "losses", "methods", "objective", "control")},
    **{f"entropy_rft.{m}": f"entropy_rft.run.{m}" for m in ("rundir", "record", "checkpoint", "stops")},
    **{f"entropy_rft.{m}": f"entropy_rft.commands.{m}" for m in (
        "cli", "options", "demo", "compare", "pipeline", "report", "inspect_page", "theory", "evidence")},
}  # fmt: skip


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports an old module name as the module that now holds it (MOVED): one module object under both names."""

    def find_spec(self, name, path=None, target=None):
        if name not in MOVED:
            return None
        moved = importlib.util.find_spec(MOVED[name])  # a package stays one (`python -m entropy_rft.cli` runs)
        return importlib.util.spec_from_loader(name, self, is_package=moved.submodule_search_locations is not None)

    def create_module(self, spec):
        return importlib.import_module(MOVED[spec.name])

    def exec_module(self, module) -> None:
        pass  # the module under its new name has run already


if not any(isinstance(f, _MovedModules) for f in sys.meta_path):
    sys.meta_path.insert(0, _MovedModules())  # before any other finder: an old name never loads a second copy
