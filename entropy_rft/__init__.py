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

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("entropy-rft")
except PackageNotFoundError:  # run from a source tree that was never installed
    __version__ = "unknown (not installed)"
