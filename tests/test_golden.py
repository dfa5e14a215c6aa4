"""The training step's characterisation: 3 seeded CPU steps per method and entropy control (tests/golden.py).

Two tiers, and the test never skips:
- everywhere: every case's metrics, evaluations and final weights against the recorded ones within bounds derived
  below from float32 arithmetic, with every decision (a sampled token, a filter's or a clip's choice) exact;
- on the recording platform (torch, CPU capability and microarchitecture, Python: golden.platform(); each case runs
  on the recorded torch thread count, whatever the test process's, e.g. under `make test`'s parallel workers),
  additionally bit for bit: every metric equal and the SHA-256 of the final weights.
Only a commit that says which values it moves and why may rewrite tests/fixtures/golden_steps.json
(`python tests/golden.py --write CASE`).

The bounds. Two platforms differ only in the order of float32 summations (vector width, BLAS blocking, the CPU's
kernels). A forward pass of the shipped policy (L layers, widest dot product n) gives logits within
FORWARD = (2L + 3) n 2^-24 of their exact value, relative to the largest logit: 2L + 3 rounded contributions
reach the residual stream and the head, and a float32 dot product of length n rounds up to n times (the count
tests/invariants.py's stats_tolerance uses and tests/test_recipe_shapes.py checks against float64). The policy here
has L = 4, n = 384: FORWARD = 2.5e-4. Each platform is within FORWARD of the exact step, so two are within
2 FORWARD per step; a step's statistics feed the next step's weights through Adam, whose update
m / (sqrt(v) + eps) changes by at most twice the relative change of its gradient (m is linear in it, sqrt(v) halves
it), so relative errors add up step by step to first order: RTOL = 2 STEPS FORWARD = 1.5e-3 relative on every
continuous metric. The final weights are compared in norm, relative to how far training moved them:
|w - w_recorded| <= RTOL |w_recorded - w_0|, the same argument applied to the whole update. Not element by element:
where an element's gradient is itself of rounding size (its contributions cancel), Adam's normalisation makes its
update's direction arbitrary (measured: about 60 of 791,424 weights per case differ by up to 6e-6, 0.06 lr, between
PyTorch's avx2 and AVX512 kernels), and those elements are few, so in norm they stay far inside the bound. The
distance is read off a count sketch of the weights (golden.weights_sketch; its estimate of the norm was within 10%
of the true distance on every case measured), recorded with |w - w_0| in the fixture.
Measured between the avx2 and AVX512 kernels on this 2-core machine, the largest relative difference of a continuous
metric was 1.2e-5 (cov_a_sc and the predicted entropy change of clip_v at step 2) and of the weights 5e-5 of their
movement: 30 to 100 times inside the bounds; every decision and evaluation was equal. A change of the step's logic
moves far more than 1.5e-3 (tests/test_golden.py's mutation check below).

Three kinds of metric need more than a relative bound:
- decisions: a sampled token, a filter's keep mask, a clip's choice, the mu controller's mu. Both platforms take
  the same decision unless a float sits within rounding of its threshold (a uniform draw within ~1e-7 of a CDF
  boundary: about 2e-3 per case over its ~2,000 draws, by the logits' measured rounding), so they are exact, and
  on such a tie the whole trajectory would move: a rewrite on that platform is then the remedy, which the failure
  message names. Counts, fractions of tokens, rewards, lengths and the evaluations' pass rates are decisions;
- rounding-scale metrics: the sampler-to-trainer log-prob gap, ppo_kl, the mean ratio in strict on-policy steps
  are differences of log-probs of order 1 that are exactly or nearly 0: within RTOL absolutely;
- sums that cancel: the loss terms (a GAE advantage's mean is ~1e-8) within RTOL of the objective's largest term;
  the realised entropy change, a difference of two entropies, within RTOL of the step's entropy.
"""

import json
import math
from pathlib import Path

import pytest
import torch
from golden import BASE, CASES, FIXTURE, platform, run_case

RECORD = json.loads(FIXTURE.read_text())
THREADS = RECORD["platform"]["threads"]  # a case runs on the recorded thread count, a choice rather than the platform
SAME_PLATFORM = RECORD["platform"] == {**platform(), "threads": THREADS}

POLICY = json.loads(
    (Path(__file__).parents[1] / "entropy_rft" / "assets" / "countdown-tiny" / "config.json").read_text()
)
U = 2.0**-24  # float32's unit roundoff
WIDEST = max(POLICY["hidden_size"], POLICY["intermediate_size"])
FORWARD = (2 * POLICY["num_hidden_layers"] + 3) * WIDEST * U
STEPS = BASE["steps"]
RTOL = 2 * STEPS * FORWARD

DECISIONS = (
    "step",
    "accuracy",
    "reward_mean",
    "response_length",
    "truncation_rate",
    "frac_zero_advantage",
    "sampling/",
    "update/frac_rows_no_backward",
    "clip_frac",
    "filter/frac_clipped",
    "filter/mu",
    "loss/clipfrac",
    "loss/cov_selected_frac",
    "loss/vf_clipfrac",
    "entropic/high_prob_frac",
    "lr",
)
ROUNDING_SCALE = ("rollout/sampler_logp_gap", "loss/ppo_kl", "loss/ratio_mean")


def kind(key: str) -> str:
    if key.startswith(DECISIONS):
        return "decision"
    if key.startswith(ROUNDING_SCALE):
        return "rounding"
    if key.startswith("loss/"):
        return "loss"
    if key == "entropy_change/realised":
        return "difference"
    return "relative"


def within(key: str, got, want, row: dict) -> bool:
    """Whether a metric of one step is within its bound (module docstring) of the recorded value."""
    if got is None or want is None or isinstance(got, str) or kind(key) == "decision":
        return got == want
    if not (math.isfinite(got) and math.isfinite(want)):
        return got == want
    floor = {
        "rounding": 1.0,
        "loss": max(abs(v) for k, v in row.items() if k.startswith("loss/") and kind(k) == "loss"),
        "difference": abs(row.get("entropy", 0.0)),
    }.get(kind(key), 0.0)
    return abs(got - want) <= RTOL * (max(abs(got), abs(want)) + floor)


def test_the_bounds_are_the_derived_ones():
    """The bounds are computed from the shipped policy's shape (not tuned): 2.5e-4 a forward, 1.5e-3 over 3 steps."""
    assert (POLICY["num_hidden_layers"], WIDEST) == (4, 384)
    assert math.isclose(FORWARD, 11 * 384 * 2.0**-24) and math.isclose(RTOL, 6 * FORWARD)


def weights_distance(got: list[float], want: list[float]) -> float:
    return math.sqrt(sum((a - b) ** 2 for a, b in zip(got, want)))


def beyond_bounds(got: dict, want: dict) -> list[str]:
    """What of a case's run lies beyond the bounded tier's bounds against the record (empty: nothing)."""
    problems = []
    if [row["step"] for row in got["metrics"]] != [row["step"] for row in want["metrics"]]:
        return [f"steps {[row['step'] for row in got['metrics']]}"]
    for row, expected in zip(got["metrics"], want["metrics"]):
        if set(row) != set(expected):
            problems.append(f"step {row['step']}: keys {sorted(set(row) ^ set(expected))}")
            continue
        moved = {k: (expected[k], row[k]) for k in row if not within(k, row[k], expected[k], expected)}
        if moved:
            problems.append(f"step {row['step']} beyond the bounds (RTOL {RTOL:.2e}): {moved}")
    if got["evals"] != want["evals"]:
        problems.append(f"evaluations {got['evals']} != {want['evals']}")
    dw, move = weights_distance(got["weights_sketch"], want["weights_sketch"]), want["weights_move"]
    if not dw <= RTOL * move:
        problems.append(f"final weights {dw:.3e} apart, beyond {RTOL:.2e} of their movement {move:.3e}")
    return problems


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CASES))
def test_golden_case(name, tmp_path):
    """The case's metrics, evaluations and final weights: within the derived bounds on any platform (decisions
    exact), and bit for bit on the recording one."""
    want = RECORD["cases"][name]
    torch.set_num_threads(THREADS)  # conftest's _deterministic restores the count after the test
    got = run_case(name, tmp_path)
    assert [row["step"] for row in got["metrics"]] == [1, 2, 3]
    problems = beyond_bounds(got, want)
    assert not problems, (
        f"{problems}; if this platform ({platform()}) differs from the recording one "
        f"({RECORD['platform']}) and the step's logic did not change, a decision sat on a rounding "
        f"tie: rewrite with `python tests/golden.py --write {name}` and say why in the commit"
    )
    if SAME_PLATFORM:  # the bit-exact tier
        for row, expected in zip(got["metrics"], want["metrics"]):
            moved = {
                k: (expected.get(k), row.get(k)) for k in set(row) | set(expected) if row.get(k) != expected.get(k)
            }
            assert not moved, f"step {row['step']} (bit-exact on the recording platform): {moved}"
        assert got["weights"] == want["weights"]


@pytest.mark.slow
def test_a_changed_step_fails_the_bounded_tier(tmp_path, monkeypatch):
    """Mutation check: with Clip_B's filter computed but not applied to the loss (the real step's decision keeps
    every valid token in the loss mask: the paper's method silently off), the clip_b case falls outside the bounded
    tier's bounds: the tier protects on every platform, not only where it is bit-exact."""
    import dataclasses

    from entropy_rft.train import step

    decide = step.Step.decide

    def unfiltered(self, batch, behaviour):
        decision = decide(self, batch, behaviour)
        return dataclasses.replace(decision, loss_mask=batch.rollout.response_mask.clone())

    monkeypatch.setattr(step.Step, "decide", unfiltered)
    assert any(row["clip_frac"] > 0 for row in RECORD["cases"]["clip_b"]["metrics"])  # the filter drops tokens there
    problems = beyond_bounds(run_case("clip_b", tmp_path), RECORD["cases"]["clip_b"])
    assert problems, "the mutated step stayed inside the bounds"
