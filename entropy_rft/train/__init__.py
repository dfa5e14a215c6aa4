"""The built-in trainer: the RL loop (trainer), one step over a scored batch (step) and its shape (rules), the
policy's forward pass and entropy probe (forward), the per-step diagnostics (diagnostics), the policy's set-up
(policy, with dropout off: dropout), a run's problems and each step's scored batch (problems) and the memory plan
(plan). Only commands/ and integrations/ import it (tests/test_layout.py holds that border)."""
