"""Thin adapters that run entropy-rft's methods inside other engines; each imports its engine lazily:
`entropy_rft.integrations.trl` (TRL's GRPOTrainer), `entropy_rft.integrations.verl` (verl's V1 trainer and FSDP
engine, loaded by verl through the `verl.plugins` entry point)."""
