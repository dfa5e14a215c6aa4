"""Evaluation of the paper's tables: Avg@K, unbiased Pass@K, and per-problem pass rates (Figure 4).

Avg@K is the mean accuracy over K responses per problem, averaged over problems. Pass@K is the probability that
at least one of K responses is correct, estimated without bias from n >= K samples with c correct
(Chen et al. 2021): 1 - C(n - c, K) / C(n, K), computed as a stable product.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = [
    "pass_at_k",
    "avg_at_k",
    "EvalResult",
    "sample_and_score",
    "sample_correctness",
    "evaluate_policy",
    "pass_rate_histogram",
    "filter_by_pass_rate",
    "evaluate_datasets",
    "results_markdown",
]


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased Pass@k from n samples with c correct: 1 - C(n - c, k) / C(n, k)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass_at_k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod((n - c - i) / (n - i) for i in range(k))


def avg_at_k(correct: list[list[bool]]) -> float:
    """Mean over problems of the fraction of correct responses."""
    return sum(sum(row) / len(row) for row in correct) / max(len(correct), 1)


@dataclass
class EvalResult:
    k: int
    avg_at_k: float
    pass_at_k: float
    pass_rates: list[float]  # per problem, fraction of the n samples that are correct
    mean_reward: float

    def to_json(self) -> dict:
        return {
            "k": self.k,
            "avg_at_k": self.avg_at_k,
            "pass_at_k": self.pass_at_k,
            "pass_rates": self.pass_rates,
            "mean_reward": self.mean_reward,
        }


def sample_and_score(
    engine, task, problems, *, n: int, temperature: float, top_p: float = 1.0, max_new_tokens: int, seed: int
):
    """(rollout, correct, rewards): n sampled responses per problem, correctness and rewards grouped by problem."""
    rollout = engine.generate(
        [task.prompt(p) for p in problems],
        n=n,
        temperature=temperature,
        top_p=top_p,
        max_new_tokens=max_new_tokens,
        seed=seed,
    )
    scored = task.score_batch(rollout.texts, rollout.finished.tolist(), [p for p in problems for _ in range(n)])
    correct = [[c for _, c in scored[i * n : (i + 1) * n]] for i in range(len(problems))]
    rewards = [[r for r, _ in scored[i * n : (i + 1) * n]] for i in range(len(problems))]
    return rollout, correct, rewards


def sample_correctness(
    engine, task, problems, *, n: int, temperature: float, top_p: float = 1.0, max_new_tokens: int, seed: int
) -> tuple[list[list[bool]], list[list[float]]]:
    """n sampled responses per problem: their correctness and rewards, grouped by problem."""
    _, correct, rewards = sample_and_score(
        engine, task, problems, n=n, temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens, seed=seed
    )
    return correct, rewards


def evaluate_policy(
    engine,
    task,
    problems,
    *,
    k: int,
    n: int | None = None,
    temperature: float = 0.7,
    top_p: float = 1.0,
    max_new_tokens: int,
    seed: int = 0,
) -> EvalResult:
    """Avg@K and Pass@K over problems with n >= k samples each (n defaults to k)."""
    n = n or k
    correct, rewards = sample_correctness(
        engine, task, problems, n=n, temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens, seed=seed
    )
    return eval_result(correct, rewards, k=k)


def eval_result(correct: list[list[bool]], rewards: list[list[float]], *, k: int) -> EvalResult:
    """Avg@K, unbiased Pass@K (from each problem's n = len(row) samples), pass rates and mean reward."""
    return EvalResult(
        k=k,
        avg_at_k=avg_at_k(correct),
        pass_at_k=sum(pass_at_k(len(row), sum(row), k) for row in correct) / max(len(correct), 1),
        pass_rates=[sum(row) / len(row) for row in correct],
        mean_reward=sum(map(sum, rewards)) / max(sum(map(len, rewards)), 1),
    )


def pass_rate_histogram(pass_rates: list[float], bins: int = 5) -> list[int]:
    """Counts of problems per pass-rate bin; bin 0 is exactly 0, the last exactly 1, the rest split (0, 1)."""
    counts = [0] * (bins + 2)
    for r in pass_rates:
        counts[0 if r == 0 else bins + 1 if r == 1 else 1 + min(int(r * bins), bins - 1)] += 1
    return counts


def filter_by_pass_rate(problems, pass_rates, *, low: float = 1 / 16, high: float = 15 / 16):
    """The paper's filter (Section 5.1): drop problems with pass rate <= low or >= high."""
    return [(p, r) for p, r in zip(problems, pass_rates) if low < r < high]


# ---------------------------------------------------------------------------------------------------------------
# Several datasets at once: the paper's Table 1 columns (AIME24, AIME25 at K=32; DAPO500 at K=8) and Figure 4.


def evaluate_datasets(
    engine,
    task,
    datasets: dict[str, tuple[list, int]],
    *,
    n: int | None = None,
    temperature: float = 0.7,
    top_p: float = 1.0,
    max_new_tokens: int,
    seed: int = 0,
    samples: dict | None = None,
) -> dict[str, dict]:
    """{name: EvalResult json + n_problems} for each {name: (problems, k)}; n samples per problem (default k).
    When `samples` is a dict, each dataset's responses, rewards and correctness are stored in it by name."""
    results = {}
    for name, (problems, k) in datasets.items():
        m = max(n or k, k)
        rollout, correct, grouped = sample_and_score(
            engine, task, problems, n=m, temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens, seed=seed
        )
        res = eval_result(correct, grouped, k=k)
        results[name] = {
            **res.to_json(),
            "n": m,
            "n_problems": len(problems),
            "response_length": float(rollout.lengths.float().mean()),
            "truncation_rate": float((~rollout.finished).float().mean()),
        }
        if samples is not None:
            samples[name] = [
                {
                    **p.to_json(),
                    "responses": rollout.texts[i * m : (i + 1) * m],
                    "rewards": grouped[i],
                    "correct": correct[i],
                }
                for i, p in enumerate(problems)
            ]
    return results


def results_markdown(results: dict[str, dict], *, title: str = "Evaluation") -> str:
    """Table 1's layout: one column pair (Avg@K, Pass@K) per dataset, in percent."""
    names = list(results)
    head = "| | " + " | ".join(f"{n} Avg@{results[n]['k']} | {n} Pass@{results[n]['k']}" for n in names) + " |"
    rule = "|---|" + "---|---|" * len(names)
    row = (
        "| policy | "
        + " | ".join(f"{100 * results[n]['avg_at_k']:.2f} | {100 * results[n]['pass_at_k']:.2f}" for n in names)
        + " |"
    )
    detail = [
        "",
        "| dataset | problems | samples each | mean reward | mean length | truncated |",
        "|---|---|---|---|---|---|",
    ]
    detail += [
        f"| {n} | {r['n_problems']} | {r['n']} | {r['mean_reward']:.3f} | {r['response_length']:.1f} | "
        f"{r['truncation_rate']:.3f} |"
        for n, r in results.items()
    ]
    return "\n".join([f"# {title}", "", head, rule, row, *detail, ""])


def run_eval(engine, task, problems, cfg, seed: int) -> EvalResult:
    """evaluate_policy with a run's settings (eval_k, eval_temperature, top_p, max_new_tokens)."""
    return evaluate_policy(
        engine,
        task,
        problems,
        k=cfg.eval_k,
        temperature=cfg.eval_temperature,
        top_p=cfg.top_p,
        max_new_tokens=cfg.max_new_tokens,
        seed=seed,
    )
