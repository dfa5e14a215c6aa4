"""Thin adapters that run entropy-rft's methods inside other engines; each imports its engine lazily:
`entropy_rft.integrations.trl` (TRL's GRPOTrainer)."""
