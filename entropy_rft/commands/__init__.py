"""The command line: `entropy-rft` (cli) and what only its subcommands use: shared options (options), the demo,
compare and sweep, eval and filter (pipeline), report, the inspector page, theory checks and the Evidence page's
figures (evidence)."""
