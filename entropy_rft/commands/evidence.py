"""Intervals for comparisons of RL runs: a bootstrap over training seeds and evaluation problems, and paired
differences against a baseline on the same seeds and problems.

A metric of a comparison's table (Avg@K, Pass@K) is a mean over a grid: x[s, p] is its value for training seed s on
evaluation problem p (for Pass@K, the unbiased estimate from that problem's n samples), and the table reports
mean_{s, p} x[s, p]. Two things vary if the study were run again: the seeds (each seed is a different training run)
and the problems (another draw of evaluation problems, and of the samples on each). The interval here resamples
both at once, independently: each replicate draws S seeds with replacement and P problems with replacement and
takes the mean over the S x P grid they index (the two-way, "pigeonhole" bootstrap of Owen 2007, Annals of Applied
Statistics 1(1)). Its variance is the exact bootstrap variance of that design (checked against its closed form and
against enumeration in tests/test_evidence.py), which slightly over-counts the seed-by-problem interaction
(Owen 2007): the intervals are conservative. The 95% interval is the 2.5% and 97.5% percentiles of the replicates.

A paired comparison of a method against the baseline uses the same seeds (the runs started from the same seed share
their first rollouts and evaluation samples) and the same problems: the difference grid d[s, p] = x[s, p] -
base[s, p] is resampled the same way, so each replicate is the difference of the two means over the same indices.
Its interval "excludes 0" when both ends are on the same side of 0.

A metric measured once per run (entropy, entropy tracking error, clipped fraction, wall time) has no problem axis:
its interval resamples seeds only.

A pre-registered test (docs/prereg_avgk.md) also needs a p-value: `paired_test` gives the interval and the two-sided
bootstrap p-value of the same replicates, p = min(1, 2 min(#{rep <= 0} + 1, #{rep >= 0} + 1) / (B + 1)) (the
percentile test that matches the interval: an interval at level 1 - a excludes 0 about when p < a; the +1 keeps p
above 0 with B replicates), and `holm` adjusts a family of p-values (Holm 1979).

Departures and limits, numbered:
1. Conservative, and by much more than a seed-axis correction. With 5 seeds a percentile bootstrap over seeds
   alone has the plug-in variance (S - 1) / S of the usual estimate (0.8 at S = 5), about 10% narrow in width;
   the two-way interval is far wider than that offsets, because it also counts a new draw of problems and the
   over-counted seed-by-problem interaction. Measured on the committed issue-24 study
   (benchmarks/interval_widths.py, 36 paired differences against GRPO), the seed-only interval of a difference (the
   same problems, seeds resampled) is a median 51% narrower than the two-way one (23% to 89%; 49% on countdown5).
   Read the two-way interval as "another set of seeds and another draw of problems", not as the seed noise alone.
2. Problems are taken as exchangeable draws of the task's problem distribution, and sampling noise within a problem
   (n samples each) rides along with the problem it belongs to; it is not resampled separately.
3. Randomness comes only from the numpy Generator passed in; the same generator state gives the same interval.
   `evaluate_grid` given an int seed gives each estimate of its table its own generator (`estimate_stream`, from the
   seed and the estimate's method and metric), so a method's interval is the same whichever methods share the table.
4. With few seeds a percentile bootstrap of a per-run metric is too narrow: over 3 seeds it can take only 10
   distinct means and its variance is (S - 1) / S = 2/3 of the usual estimate's. `seed_t_interval` gives the
   Student-t interval instead, mean +- t_{(1+level)/2, S-1} sd / sqrt(S) (normal per-seed values assumed), used
   where a table rests on a handful of seeds (compare's entropy). No bootstrap, no generator.
"""

from __future__ import annotations

import zlib
from dataclasses import asdict, dataclass

import numpy as np

from ..evaluate import pass_at_k

__all__ = [
    "Estimate",
    "pass_at_k_scores",
    "avg_scores",
    "bootstrap_means",
    "estimate",
    "paired_difference",
    "paired_test",
    "bootstrap_p",
    "holm",
    "seed_estimate",
    "seed_t_interval",
    "t_quantile",
    "estimate_stream",
    "evaluate_grid",
    "markdown_table",
]

LEVEL = 0.95
REPLICATES = 4000


@dataclass(frozen=True)
class Estimate:
    """A mean with its bootstrap interval and what it rests on (seeds, problems, samples per problem)."""

    value: float
    low: float
    high: float
    seeds: int
    problems: int = 0  # 0: a per-run metric (no problem axis)
    samples: int = 0  # samples per problem behind each cell (0: not a sampled metric)

    @property
    def excludes_zero(self) -> bool:
        return self.low > 0 or self.high < 0

    def to_json(self) -> dict:
        return {**asdict(self), "excludes_zero": self.excludes_zero}

    @classmethod
    def from_json(cls, d: dict) -> Estimate:
        """The Estimate to_json wrote (its derived excludes_zero dropped)."""
        return cls(**{k: v for k, v in d.items() if k != "excludes_zero"})

    def text(self, scale: float = 100.0, digits: int = 1) -> str:
        """'57.6 [55.1, 60.0]' (scaled, e.g. to percent)."""
        return f"{scale * self.value:.{digits}f} [{scale * self.low:.{digits}f}, {scale * self.high:.{digits}f}]"


def pass_at_k_scores(correct: np.ndarray, n: int, k: int) -> np.ndarray:
    """Each problem's unbiased Pass@k (Chen et al. 2021) from its count of correct samples out of n, elementwise."""
    correct = np.asarray(correct)
    if correct.size and (correct.min() < 0 or correct.max() > n):
        raise ValueError(f"correct counts must lie in [0, n={n}], got [{correct.min()}, {correct.max()}]")
    table = np.array([pass_at_k(n, c, k) for c in range(n + 1)])  # pass_at_k checks 1 <= k <= n
    return table[correct.astype(int)]


def avg_scores(correct: np.ndarray, n: int) -> np.ndarray:
    """Each problem's fraction of correct samples (its Avg@K, the same estimand for every K <= n)."""
    correct = np.asarray(correct)
    if correct.size and (correct.min() < 0 or correct.max() > n):
        raise ValueError(f"correct counts must lie in [0, n={n}], got [{correct.min()}, {correct.max()}]")
    return correct / n


def _grid(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    if x.ndim == 1:
        x = x[:, None]  # a per-run metric: one column
    if x.ndim != 2 or x.shape[0] < 1 or x.shape[1] < 1:
        raise ValueError(f"expected values shaped (seeds, problems) or (seeds,), got shape {x.shape}")
    if not np.isfinite(x).all():
        raise ValueError("values must be finite (a run without this metric? leave it out instead)")
    return x


def bootstrap_means(x: np.ndarray, gen: np.random.Generator, *, replicates: int = REPLICATES) -> np.ndarray:
    """(replicates,) means of x (seeds, problems) over independently resampled seeds and problems (the pigeonhole
    bootstrap). A replicate with seed counts a_s and problem counts b_p (multinomial draws) has mean
    sum_{s,p} a_s x[s, p] b_p / (S P), which is the mean over the resampled grid without building it."""
    x = _grid(x)
    seeds, problems = x.shape
    a = gen.multinomial(seeds, np.full(seeds, 1.0 / seeds), size=replicates)  # (B, S)
    b = gen.multinomial(problems, np.full(problems, 1.0 / problems), size=replicates)  # (B, P)
    return np.einsum("bs,sp,bp->b", a, x, b) / (seeds * problems)


def _interval(reps: np.ndarray, level: float) -> tuple[float, float]:
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    lo, hi = np.quantile(reps, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)


def estimate(
    x: np.ndarray, gen: np.random.Generator, *, samples: int = 0, level: float = LEVEL, replicates: int = REPLICATES
) -> Estimate:
    """The grand mean of x (seeds, problems), or of x (seeds,) for a per-run metric, with its bootstrap interval."""
    grid = _grid(x)
    low, high = _interval(bootstrap_means(grid, gen, replicates=replicates), level)
    per_run = np.asarray(x).ndim == 1
    return Estimate(float(grid.mean()), low, high, grid.shape[0], 0 if per_run else grid.shape[1], samples)


def paired_difference(
    x: np.ndarray,
    base: np.ndarray,
    gen: np.random.Generator,
    *,
    samples: int = 0,
    level: float = LEVEL,
    replicates: int = REPLICATES,
) -> Estimate:
    """mean(x) - mean(base) over the same seeds and problems (rows and columns must correspond), with the interval of
    the difference under the same resampled indices."""
    x, base = np.asarray(x), np.asarray(base)
    if x.shape != base.shape:
        raise ValueError(f"a paired comparison needs the same seeds and problems: shapes {x.shape} and {base.shape}")
    return estimate(x - base, gen, samples=samples, level=level, replicates=replicates)


def bootstrap_p(reps: np.ndarray) -> float:
    """Two-sided percentile-bootstrap p-value of 'the mean is 0' from replicates of the mean:
    min(1, 2 min(#{rep <= 0} + 1, #{rep >= 0} + 1) / (B + 1))."""
    reps = np.asarray(reps)
    if reps.ndim != 1 or reps.size < 1:
        raise ValueError(f"expected a 1-d array of bootstrap replicates, got shape {reps.shape}")
    low, high = int((reps <= 0).sum()), int((reps >= 0).sum())
    return min(1.0, 2 * (min(low, high) + 1) / (reps.size + 1))


def paired_test(
    x: np.ndarray,
    base: np.ndarray,
    gen: np.random.Generator,
    *,
    samples: int = 0,
    level: float = LEVEL,
    replicates: int = REPLICATES,
) -> tuple[Estimate, float]:
    """paired_difference with its two-sided bootstrap p-value (bootstrap_p) from the same replicates: (Estimate, p).
    x and base are (seeds, problems) grids on the same seeds and problems, or (seeds,) per-run values."""
    x, base = np.asarray(x), np.asarray(base)
    if x.shape != base.shape:
        raise ValueError(f"a paired comparison needs the same seeds and problems: shapes {x.shape} and {base.shape}")
    d = _grid(x - base)
    reps = bootstrap_means(d, gen, replicates=replicates)
    low, high = _interval(reps, level)
    est = Estimate(float(d.mean()), low, high, d.shape[0], 0 if x.ndim == 1 else d.shape[1], samples)
    return est, bootstrap_p(reps)


def holm(pvalues: dict[str, float]) -> dict[str, float]:
    """Holm's step-down adjusted p-values of a family (Holm 1979): with p sorted ascending, p_(i) becomes
    max_{j <= i} min(1, (m - j + 1) p_(j)); reject at level a where the adjusted p < a (strong FWER control)."""
    if not pvalues:
        return {}
    bad = {k: v for k, v in pvalues.items() if not 0 <= v <= 1}
    if bad:
        raise ValueError(f"p-values must lie in [0, 1], got {bad}")
    order = sorted(pvalues, key=pvalues.get)
    m, running, out = len(order), 0.0, {}
    for j, name in enumerate(order):
        running = max(running, min(1.0, (m - j) * pvalues[name]))
        out[name] = running
    return {name: out[name] for name in pvalues}


def seed_estimate(values, gen: np.random.Generator, **kw) -> Estimate:
    """A per-run metric (one value per seed): its mean with an interval over seeds."""
    return estimate(np.asarray(values, dtype=np.float64).reshape(-1), gen, **kw)


def _t_density_integral(t: float, df: int) -> float:
    """The integral of Student's t density from 0 to t >= 0 (Simpson's rule on 4,000 intervals)."""
    from math import gamma, pi, sqrt

    norm = gamma((df + 1) / 2) / (sqrt(df * pi) * gamma(df / 2))
    weights = np.ones(4001)
    weights[1:-1:2], weights[2:-1:2] = 4, 2
    x = np.linspace(0.0, t, 4001)
    density = norm * (1 + x * x / df) ** (-(df + 1) / 2)
    return float(weights @ density) * t / (3 * 4000)


def t_quantile(q: float, df: int) -> float:
    """Student's t quantile: the t > 0 where the CDF, 1/2 + the integral of the density from 0 to t (Simpson's rule
    on 4,000 intervals), reaches q (1/2 < q < 1), by bisection. No scipy: df 1 and 2 have closed forms to test it
    against (tan(pi (q - 1/2)) and (2q - 1) / sqrt(2 q (1 - q)))."""
    if not 0.5 < q < 1 or df < 1:
        raise ValueError(f"t_quantile needs 1/2 < q < 1 and df >= 1, got q={q}, df={df}")

    def cdf(t: float) -> float:
        return 0.5 + _t_density_integral(t, df)

    high = 1.0
    while cdf(high) < q:
        high *= 2
    low = 0.0
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (mid, high) if cdf(mid) < q else (low, mid)
    return (low + high) / 2


def t_two_sided_p(t: float, df: int) -> float:
    """P(|T| >= |t|) for Student's t with df degrees of freedom: 1 - 2 * (the density's integral from 0 to |t|),
    the same quadrature as t_quantile; df 1 has the closed form 1 - 2 atan(|t|) / pi to test it against."""
    if df < 1:
        raise ValueError(f"t_two_sided_p needs df >= 1, got {df}")
    if not np.isfinite(t):
        return 0.0 if abs(t) == np.inf else 1.0
    return min(1.0, max(0.0, 1.0 - 2.0 * _t_density_integral(abs(float(t)), df)))


def seed_t_test(values, *, level: float = LEVEL) -> tuple[Estimate, float]:
    """A paired difference per seed (one value per seed, at least 2): seed_t_interval and the two-sided one-sample t
    test's p of 'the mean is 0' (t = mean / (sd / sqrt(S)), S - 1 degrees of freedom); p 1 when every value is 0."""
    x = np.asarray(values, dtype=np.float64).reshape(-1)
    est = seed_t_interval(x, level=level)
    sd = float(x.std(ddof=1))
    if sd == 0.0:
        return est, 1.0 if float(x.mean()) == 0.0 else 0.0
    return est, t_two_sided_p(float(x.mean()) / (sd / np.sqrt(len(x))), len(x) - 1)


def sign_flip_p(values) -> float:
    """The exact two-sided sign-flip (randomisation) p of 'the mean is 0' for paired per-seed differences: the share
    of the 2^S sign assignments whose |sum| is at least the observed |sum| (the observed assignment included, so the
    floor is 2 / 2^S). Exact enumeration: at most 20 seeds."""
    x = np.asarray(values, dtype=np.float64).reshape(-1)
    if not 1 <= len(x) <= 20:
        raise ValueError(f"sign_flip_p enumerates 2^S assignments: needs 1 to 20 seeds, got {len(x)}")
    signs = 1.0 - 2.0 * ((np.arange(2 ** len(x))[:, None] >> np.arange(len(x))) & 1)  # (2^S, S), row 0 all +1
    sums = np.abs(signs @ x)
    observed = sums[0]
    return float((sums >= observed * (1 - 1e-12)).mean())


def seed_t_interval(values, *, level: float = LEVEL) -> Estimate:
    """A per-run metric (one value per seed, at least 2): its mean with the Student-t interval over seeds,
    mean +- t_{(1+level)/2, S-1} sd / sqrt(S) (departure 4)."""
    x = _grid(np.asarray(values, dtype=np.float64).reshape(-1))[:, 0]
    if len(x) < 2:
        raise ValueError("a t interval over seeds needs at least 2 seeds")
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    half = t_quantile((1 + level) / 2, len(x) - 1) * float(x.std(ddof=1)) / float(np.sqrt(len(x)))
    mean = float(x.mean())
    return Estimate(mean, mean - half, mean + half, len(x))


def estimate_stream(seed: int, *names: str) -> np.random.Generator:
    """The bootstrap's own generator for one estimate, from `seed` and the names that say which estimate it is
    (method, metric, and the baseline for a paired difference; each name by its CRC-32): the interval of a method
    does not depend on which other methods are in the table, or in what order."""
    return np.random.default_rng([int(seed), *(zlib.crc32(name.encode()) for name in names)])


def evaluate_grid(
    correct: dict[str, np.ndarray],
    n: int,
    gen: int | np.random.Generator,
    *,
    ks=(8,),
    baseline: str | None = "grpo",
    level: float = LEVEL,
    replicates: int = REPLICATES,
) -> dict:
    """Avg@K and Pass@k (each k in ks) of every method from its correct counts (seeds, problems) out of n samples,
    with intervals; and, when `baseline` is among the methods, each other method's paired difference against it
    (methods must share the baseline's seeds and problems, in the same order). Returns
    {method: {metric: Estimate json, "vs_<baseline>": {metric: Estimate json}}}.

    `gen` an int seed: each estimate resamples with its own generator (estimate_stream), so a method's intervals are
    the same whichever methods it is compared with (what `compare` uses). `gen` a Generator: every estimate draws from
    it in turn (methods in order, then metrics), so one method's intervals move with the others in the table; the
    registered analyses (benchmarks/) named that procedure before the int form existed and keep it."""
    metrics = {"avg": lambda c: avg_scores(c, n)}
    metrics.update({f"pass@{k}": (lambda c, k=k: pass_at_k_scores(c, n, k)) for k in ks})
    scores = {m: {name: f(np.asarray(c)) for name, f in metrics.items()} for m, c in correct.items()}

    def stream(*names: str) -> np.random.Generator:
        return gen if isinstance(gen, np.random.Generator) else estimate_stream(gen, *names)

    out = {}
    for method, by_metric in scores.items():
        row = {
            name: estimate(v, stream(method, name), samples=n, level=level, replicates=replicates).to_json()
            for name, v in by_metric.items()
        }
        if baseline in scores and method != baseline:
            row[f"vs_{baseline}"] = {
                name: paired_difference(
                    v,
                    scores[baseline][name],
                    stream(method, name, baseline),
                    samples=n,
                    level=level,
                    replicates=replicates,
                ).to_json()
                for name, v in by_metric.items()
            }
        out[method] = row
    return out


def markdown_table(evidence: dict, *, baseline: str = "grpo", level: float = LEVEL) -> str:
    """Two tables in percent: each metric with its interval, then each method minus the baseline (paired), marked
    with * where the interval excludes 0; and the counts the numbers rest on."""
    methods = list(evidence)
    names = [k for k in evidence[methods[0]] if not k.startswith("vs_")]
    label = {"avg": "Avg@K"} | {n: n.replace("pass", "Pass") for n in names if n.startswith("pass")}
    first = evidence[methods[0]][names[0]]
    pct = f"{100 * level:g}%"
    lines = ["| method | " + " | ".join(f"{label[n]} [{pct} CI]" for n in names) + " |", "|---|" + "---|" * len(names)]
    lines += [
        f"| {m} | " + " | ".join(Estimate.from_json(evidence[m][n]).text() for n in names) + " |" for m in methods
    ]
    others = [m for m in methods if f"vs_{baseline}" in evidence[m]]
    if others:
        lines += [
            "",
            f"| method - {baseline} (paired) | " + " | ".join(label[n] for n in names) + " |",
            "|---|" + "---|" * len(names),
        ]
        for m in others:
            cells = []
            for n in names:
                d = evidence[m][f"vs_{baseline}"][n]
                est = Estimate.from_json(d)
                cells.append(est.text() + (" *" if est.excludes_zero else ""))
            lines.append(f"| {m} | " + " | ".join(cells) + " |")
    plural = lambda n, word: f"{n} {word}" + ("s" if n != 1 else "")  # noqa: E731
    lines += [
        "",
        f"Each number rests on {plural(first['seeds'], 'training seed')} x "
        f"{plural(first['problems'], 'evaluation problem')} x {plural(first['samples'], 'sample')} per problem; "
        "intervals: two-way bootstrap over seeds and problems "
        f"(entropy_rft/commands/evidence.py); * marks a paired difference whose {pct} interval excludes 0.",
    ]
    return "\n".join(lines) + "\n"
