"""Intervals over seeds and problems (entropy_rft/commands/evidence.py), checked against cases with a known answer: the
exact
bootstrap distribution by enumeration, its variance in closed form, and paired differences that are constant."""

import itertools
import math

import numpy as np
import pytest

from entropy_rft.commands.evidence import (
    Estimate,
    avg_scores,
    bootstrap_means,
    estimate,
    estimate_stream,
    evaluate_grid,
    markdown_table,
    paired_difference,
    pass_at_k_scores,
    seed_estimate,
)
from entropy_rft.evaluate import pass_at_k


def exact_bootstrap(x: np.ndarray) -> np.ndarray:
    """Every equally likely pigeonhole resample of a small grid, enumerated: the mean over rows I and columns J for
    each tuple of row indices I and column indices J (R^R C^C of them)."""
    rows, cols = x.shape
    return np.array(
        [
            x[np.ix_(i, j)].mean()
            for i in itertools.product(range(rows), repeat=rows)
            for j in itertools.product(range(cols), repeat=cols)
        ]
    )


def pigeonhole_variance(x: np.ndarray) -> float:
    """Closed form of the bootstrap variance of the grid mean when R rows and C columns are resampled independently:
    E[m^2] sums x[I_i, J_j] x[I_i', J_j'] over index pairs, whose expectation is mean(x^2) when i = i' and j = j',
    the mean squared row mean when only i = i', the mean squared column mean when only j = j', and mean(x)^2 else."""
    rows, cols = x.shape
    m2, a, b, m = (x**2).mean(), (x.mean(1) ** 2).mean(), (x.mean(0) ** 2).mean(), x.mean()
    second = (
        rows * cols * m2
        + rows * cols * (cols - 1) * a
        + cols * rows * (rows - 1) * b
        + rows * (rows - 1) * cols * (cols - 1) * m**2
    ) / (rows * cols) ** 2
    return second - m**2


def test_pass_at_k_scores_equal_the_estimator_and_subset_enumeration():
    """Per-problem Pass@k from counts equals evaluate.pass_at_k, and the fraction of the C(n, k) k-subsets of n
    samples (c of them correct) that hold a correct one; Avg is c / n."""
    n, k = 6, 3
    counts = np.array([[0, 1, 2], [3, 5, 6]])
    got = pass_at_k_scores(counts, n, k)
    for c, v in zip(counts.ravel(), got.ravel()):
        samples = [True] * int(c) + [False] * (n - int(c))
        subsets = list(itertools.combinations(samples, k))
        assert v == pytest.approx(sum(any(s) for s in subsets) / len(subsets), abs=1e-12)
        assert v == pass_at_k(n, int(c), k)
    np.testing.assert_array_equal(avg_scores(counts, n), counts / 6)


def test_bootstrap_distribution_matches_enumeration():
    """On a 2 x 3 grid (4 x 27 = 108 equally likely resamples) the Monte Carlo replicates follow the enumerated
    bootstrap distribution: the largest gap between their CDFs is under 0.02 (DKW: a false failure has probability
    below 2 exp(-2 B 0.02^2) = 2e-7 at B = 20000), and the closed-form variance equals the enumeration's."""
    x = np.array([[0.1, 0.7, 0.4], [0.9, 0.2, 0.55]])
    exact = exact_bootstrap(x)
    assert pigeonhole_variance(x) == pytest.approx(exact.var(), rel=1e-12)
    reps = bootstrap_means(x, np.random.default_rng(0), replicates=20000)
    exact, reps = exact.round(9), reps.round(9)  # the same atoms, summed in another order
    grid = np.unique(exact)
    gap = np.max(
        np.abs(
            np.searchsorted(np.sort(reps), grid, side="right") / reps.size
            - np.searchsorted(np.sort(exact), grid, side="right") / exact.size
        )
    )
    assert gap < 0.02
    assert gap > 0  # Monte Carlo, not the enumeration itself


def test_bootstrap_variance_matches_the_closed_form_on_a_larger_grid():
    """5 seeds x 40 problems: the replicates' mean is the grid mean and their variance the closed form, within
    Monte Carlo error (B = 40000: relative standard error of a variance about sqrt(2 / B) = 0.7%; allowed 5%)."""
    g = np.random.default_rng(1)
    x = g.normal(size=(5, 1)) * 0.3 + g.normal(size=(1, 40)) + g.normal(size=(5, 40)) * 0.5
    reps = bootstrap_means(x, np.random.default_rng(2), replicates=40000)
    var = pigeonhole_variance(x)
    assert abs(reps.mean() - x.mean()) < 5 * math.sqrt(var / reps.size)
    assert reps.var() == pytest.approx(var, rel=0.05)


def test_seed_only_interval_is_the_one_level_bootstrap():
    """A per-run metric resamples seeds only: its replicates follow the 3^3 enumerated resamples of 3 values, and
    the estimate reports no problem axis."""
    values = np.array([0.2, 0.5, 0.6])
    exact = np.array([values[list(i)].mean() for i in itertools.product(range(3), repeat=3)]).round(9)
    reps = bootstrap_means(values[:, None], np.random.default_rng(3), replicates=20000).round(9)
    for q in (0.1, 0.5, 0.9):
        assert np.mean(reps <= np.quantile(exact, q)) == pytest.approx(
            np.mean(exact <= np.quantile(exact, q)), abs=0.02
        )
    est = seed_estimate(values, np.random.default_rng(3))
    assert est.seeds == 3 and est.problems == 0 and est.value == pytest.approx(values.mean())
    assert values.min() <= est.low <= est.value <= est.high <= values.max()


def test_paired_difference_known_cases():
    """A method equal to the baseline differs by exactly 0 with a zero-width interval; one that adds c to every
    cell differs by exactly c, whatever the spread of the cells themselves; the paired interval of a method that
    moves with the baseline is narrower than the spread of the baseline's own mean."""
    g = np.random.default_rng(4)
    base = g.random((5, 30))
    same = paired_difference(base, base.copy(), np.random.default_rng(5))
    assert (same.value, same.low, same.high) == (0.0, 0.0, 0.0) and not same.excludes_zero
    shifted = paired_difference(base + 0.05, base, np.random.default_rng(5))
    assert shifted.value == pytest.approx(0.05) and shifted.low == pytest.approx(0.05)
    assert shifted.high == pytest.approx(0.05) and shifted.excludes_zero
    close = paired_difference(base + 0.01 * g.standard_normal((5, 30)), base, np.random.default_rng(6))
    alone = estimate(base, np.random.default_rng(6))
    assert close.high - close.low < 0.2 * (alone.high - alone.low)


def test_constant_data_and_seeded_generators():
    """Constant values give a zero-width interval at that value; the same generator seed gives the same interval,
    and the 95% interval holds the mean."""
    est = estimate(np.full((3, 4), 0.25), np.random.default_rng(0))
    assert (est.value, est.low, est.high, est.seeds, est.problems) == (0.25, 0.25, 0.25, 3, 4)
    x = np.random.default_rng(7).random((4, 20))
    a, b = estimate(x, np.random.default_rng(8)), estimate(x, np.random.default_rng(8))
    assert a == b and a.low < a.value < a.high


def test_bad_inputs_name_the_problem():
    with pytest.raises(ValueError, match="same seeds and problems"):
        paired_difference(np.zeros((2, 3)), np.zeros((3, 3)), np.random.default_rng(0))
    with pytest.raises(ValueError, match=r"\[0, n=4\]"):
        pass_at_k_scores(np.array([5]), 4, 2)
    with pytest.raises(ValueError, match="finite"):
        estimate(np.array([[0.1, np.nan]]), np.random.default_rng(0))
    with pytest.raises(ValueError, match="shaped"):
        estimate(np.zeros((2, 2, 2)), np.random.default_rng(0))


def test_evaluate_grid_reports_every_metric_and_the_paired_comparison():
    """Per method: Avg and Pass@k with the counts they rest on; each non-baseline method also has its paired
    difference against the baseline, equal to the difference of the two means; the table marks an interval that
    excludes 0."""
    g = np.random.default_rng(9)
    grpo = g.integers(0, 9, size=(3, 25))
    better = np.minimum(grpo + 4, 32)  # more correct samples on every problem and seed
    ev = evaluate_grid({"grpo": grpo, "clip_b": better}, 32, np.random.default_rng(10), ks=(8, 32), replicates=500)
    assert set(ev["grpo"]) == {"avg", "pass@8", "pass@32"} and "vs_grpo" in ev["clip_b"]
    d = ev["clip_b"]["vs_grpo"]["avg"]
    assert d["value"] == pytest.approx(ev["clip_b"]["avg"]["value"] - ev["grpo"]["avg"]["value"])
    assert d["excludes_zero"] and d["seeds"] == 3 and d["problems"] == 25 and d["samples"] == 32
    table = markdown_table(ev)
    assert "| clip_b |" in table and " *" in table and "3 training seeds x 25 evaluation problems x 32" in table
    assert Estimate(0.5, 0.4, 0.6, 3).text() == "50.0 [40.0, 60.0]"


def test_a_methods_intervals_do_not_depend_on_the_other_methods_in_the_table():
    """evaluate_grid with an int seed (what `compare` passes): each method's estimates, and its paired differences
    against the baseline, are the same with or without a third method in the table and in any order; each is the
    estimate drawn from its own stream (estimate_stream). With one shared Generator (the registered analyses' form)
    adding a method ahead of another moves that one's interval: that dependence is what the seed form removes."""
    g = np.random.default_rng(4)
    grids = {m: g.integers(0, 9, size=(3, 20)) for m in ("grpo", "clip_b", "clip_v")}

    def table(names, gen):
        return evaluate_grid({m: grids[m] for m in names}, 8, gen, ks=(4,), replicates=300)

    two = table(["grpo", "clip_b"], 7)
    three = table(["clip_v", "grpo", "clip_b"], 7)
    assert two["clip_b"] == three["clip_b"] and two["grpo"] == three["grpo"]
    alone = estimate(avg_scores(grids["clip_b"], 8), estimate_stream(7, "clip_b", "avg"), samples=8, replicates=300)
    assert two["clip_b"]["avg"] == alone.to_json()
    assert two["clip_b"]["avg"] != table(["grpo", "clip_b"], 8)["clip_b"]["avg"]  # the seed is used
    shared_two = table(["grpo", "clip_b"], np.random.default_rng(7))
    shared_three = table(["clip_v", "grpo", "clip_b"], np.random.default_rng(7))
    assert shared_two["clip_b"]["avg"] != shared_three["clip_b"]["avg"]


def test_bootstrap_p_counts_the_replicates_on_each_side():
    """bootstrap_p is 2 min(#{<= 0} + 1, #{>= 0} + 1) / (B + 1), capped at 1, counted here by a loop; a replicate
    exactly at 0 counts on both sides."""
    from entropy_rft.commands.evidence import bootstrap_p

    gen = np.random.default_rng(3)
    for reps in (gen.normal(0.3, 1.0, 999), gen.normal(-2.0, 1.0, 99), np.array([0.0, 0.0, 1.0]), np.ones(19)):
        le = sum(1 for r in reps if r <= 0)
        ge = sum(1 for r in reps if r >= 0)
        assert bootstrap_p(reps) == pytest.approx(min(1.0, 2 * (min(le, ge) + 1) / (len(reps) + 1)))
    assert bootstrap_p(np.ones(19)) == pytest.approx(0.1)  # never 0: the smallest p with B replicates is 2 / (B + 1)
    with pytest.raises(ValueError, match="1-d array"):
        bootstrap_p(np.ones((2, 2)))


def test_paired_test_uses_the_replicates_of_its_interval():
    """paired_test's interval equals paired_difference's under the same generator state, and its p equals
    bootstrap_p of bootstrap_means drawn from that state again; a large shift gives the smallest p, a grid of
    differences symmetric about 0 a p near 1."""
    from entropy_rft.commands.evidence import bootstrap_p, paired_test

    gen = np.random.default_rng(5)
    x, base = gen.normal(0.02, 0.1, (5, 40)), gen.normal(0.0, 0.1, (5, 40))
    est, p = paired_test(x, base, np.random.default_rng(11), replicates=500)
    assert est == paired_difference(x, base, np.random.default_rng(11), replicates=500)
    assert p == bootstrap_p(bootstrap_means(x - base, np.random.default_rng(11), replicates=500))
    _, p_far = paired_test(base + 1.0, base, np.random.default_rng(0), replicates=500)
    assert p_far == pytest.approx(2 / 501)
    sym = np.array([[1.0, -1.0], [-1.0, 1.0]])  # every replicate's mean is symmetric about 0 in distribution
    _, p_sym = paired_test(sym, np.zeros((2, 2)), np.random.default_rng(0), replicates=2000)
    assert p_sym > 0.9


def test_holm_matches_its_definition_by_brute_force():
    """holm: the adjusted p of hypothesis i is the largest, over the hypotheses j at or below it in the ascending order,
    of min(1, (m - rank_j) p_j) (rank from 0), checked against that definition written out, and on textbook cases:
    (0.01, 0.04) -> (0.02, 0.04); (0.03, 0.04) -> (0.06, 0.06); one p is unchanged."""
    from entropy_rft.commands.evidence import holm

    assert holm({"a": 0.01, "b": 0.04}) == pytest.approx({"a": 0.02, "b": 0.04})
    assert holm({"a": 0.04, "b": 0.03}) == pytest.approx({"a": 0.06, "b": 0.06})
    assert holm({"only": 0.2}) == {"only": 0.2}
    gen = np.random.default_rng(2)
    for _ in range(50):
        ps = {str(i): float(v) for i, v in enumerate(gen.uniform(0, 0.5, gen.integers(1, 6)))}
        order = sorted(ps, key=lambda k: ps[k])
        m = len(order)
        want = {k: max(min(1.0, (m - j) * ps[order[j]]) for j in range(order.index(k) + 1)) for k in ps}
        assert holm(ps) == pytest.approx(want)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        holm({"a": 1.5})


# ---------------------------------------------------------------------------------------------------------------
# Student-t intervals over a few seeds (departure 4)


@pytest.mark.parametrize("q", [0.6, 0.9, 0.975, 0.995])
def test_t_quantile_matches_the_closed_forms_of_df_1_and_2(q):
    """df 1 is the Cauchy, t = tan(pi (q - 1/2)); df 2 has t = (2q - 1) / sqrt(2 q (1 - q)): exact to within Simpson's
    rule on 4,000 intervals (error far below 1e-6 relative for these smooth densities) and 60 bisections."""
    from math import pi, sqrt, tan

    from entropy_rft.commands.evidence import t_quantile

    assert t_quantile(q, 1) == pytest.approx(tan(pi * (q - 0.5)), rel=1e-6)
    assert t_quantile(q, 2) == pytest.approx((2 * q - 1) / sqrt(2 * q * (1 - q)), rel=1e-6)


def test_t_quantile_falls_with_df_toward_the_normal_and_refuses_bad_input():
    """Property: at one q the quantile decreases with df and stays above the normal's (z = 1.959964 at 0.975); at
    df 200 it is z + (z^3 + z) / (4 df) to the next term's order, (5z^5 + 16z^3 + 3z) / (96 df^2) ~ 2e-4."""
    from entropy_rft.commands.evidence import t_quantile

    values = [t_quantile(0.975, df) for df in (1, 2, 3, 5, 10, 30, 200)]
    assert all(a > b for a, b in zip(values, values[1:])) and values[-1] > 1.959964
    z = 1.959964
    assert values[-1] == pytest.approx(z + (z**3 + z) / 800, abs=5e-4)
    for q, df in ((0.5, 3), (1.0, 3), (0.9, 0)):
        with pytest.raises(ValueError):
            t_quantile(q, df)


def test_seed_t_interval_is_mean_plus_minus_t_times_the_standard_error():
    from entropy_rft.commands.evidence import seed_t_interval, t_quantile

    x = np.array([0.9, 1.4, 1.1, 0.7])
    est = seed_t_interval(x)
    half = t_quantile(0.975, 3) * x.std(ddof=1) / 2
    assert (est.value, est.seeds, est.problems) == (pytest.approx(x.mean()), 4, 0)
    assert (est.low, est.high) == (pytest.approx(x.mean() - half), pytest.approx(x.mean() + half))
    assert seed_t_interval(x, level=0.5).high < est.high
    with pytest.raises(ValueError, match="at least 2 seeds"):
        seed_t_interval([1.0])


@pytest.mark.parametrize("t", [0.0, 0.3, 1.0, 2.0, 6.3, 40.0])
def test_t_two_sided_p_matches_the_closed_forms_of_df_1_and_2(t):
    """P(|T| >= t) is 1 - 2 atan(t) / pi at df 1 and 1 - t / sqrt(2 + t^2) at df 2; the quadrature (4,000 Simpson
    intervals, error ~ h^4) meets both to 1e-6."""
    from entropy_rft.commands.evidence import t_two_sided_p

    assert t_two_sided_p(t, 1) == pytest.approx(1 - 2 * math.atan(t) / math.pi, abs=1e-6)
    assert t_two_sided_p(-t, 2) == pytest.approx(1 - t / math.sqrt(2 + t * t), abs=1e-6)


def test_seed_t_test_is_the_one_sample_t_test_by_hand():
    """The p of a paired per-seed difference is the two-sided t test of mean 0 with t = mean / (sd / sqrt(S)) on S - 1
    degrees of freedom: computed here from the definition and t_two_sided_p, and (df 1) from the closed form."""
    from entropy_rft.commands.evidence import seed_t_test, t_two_sided_p

    d = np.array([-0.074, -0.009, -0.303, -0.055, -0.026])
    est, p = seed_t_test(d)
    t = d.mean() / (d.std(ddof=1) / math.sqrt(len(d)))
    assert p == t_two_sided_p(t, len(d) - 1) and est.value == pytest.approx(d.mean(), rel=1e-15)
    two = np.array([0.1, 0.3])
    _, p2 = seed_t_test(two)
    t2 = two.mean() / (two.std(ddof=1) / math.sqrt(2))
    assert p2 == pytest.approx(1 - 2 * math.atan(t2) / math.pi, abs=1e-6)
    assert seed_t_test([0.0, 0.0, 0.0])[1] == 1.0 and seed_t_test([0.2, 0.2])[1] == 0.0


def test_sign_flip_p_counts_the_assignments_by_enumeration():
    """The exact sign-flip p is the share of all 2^S sign vectors whose |sum| reaches the observed one, counted here
    with itertools; its floor is 2 / 2^S (all of one sign), and it refuses more than 20 seeds."""
    from entropy_rft.commands.evidence import sign_flip_p

    for d in ([-0.074, -0.009, -0.303, -0.055, -0.026], [0.1, -0.2, 0.05, 0.3, -0.01, 0.07], [0.0, 0.2, -0.2]):
        obs = abs(sum(d))
        hits = sum(
            abs(sum(s * x for s, x in zip(signs, d))) >= obs - 1e-15
            for signs in itertools.product((1, -1), repeat=len(d))
        )
        assert sign_flip_p(d) == hits / 2 ** len(d)
    assert sign_flip_p([0.3] * 8) == 2 / 256
    with pytest.raises(ValueError, match="1 to 20 seeds"):
        sign_flip_p(np.ones(21))
