"""The paper's math, importing nothing else of the package (tests/test_layout.py holds it): the entropy
discriminator S* and the first-order entropy change of Theorems 1-2 (dynamics, with kernels for the streamed token
statistics), the token masks of Clip_B / Clip_V and the baselines (masks), advantages, policy losses and their
aggregation (losses), the methods and their registries (methods, registry), the objective a step minimises
(objective) and the entropy controls (control)."""
