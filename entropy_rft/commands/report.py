"""Plots and tables from runs: per-step curves of any metric for several runs, and the paper's Table 1 layout."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

LABELS = {
    "grpo": "GRPO",
    "clip_b": "GRPO+Clip_B",
    "clip_v": "GRPO+Clip_V",
    # the field's methods as their authors write them (docs/paper_index.md)
    "stare": "STARE",
    "entrocraft": "Entrocraft",
    "rsi": "RSI-S",
    "grpo_dropout": "GRPODropout",
    "tre_k": "TRE-K",
}


def label(name: str) -> str:
    return LABELS.get(name, name)


def plot_curves(
    runs: dict[str, list[float]],
    path: Path | str,
    *,
    ylabel: str,
    title: str = "",
    logy: bool = False,
    bands: dict[str, list[list[float]]] | None = None,
) -> Path:
    """One line per run of a per-step metric, saved as PNG; `bands` shades a [low, high] per step under a run's
    line (compare: the range over seeds)."""
    fig, ax = plt.subplots(figsize=(6, 3.6), dpi=120)
    for name, values in runs.items():
        steps = range(1, len(values) + 1)
        (line,) = ax.plot(steps, values, label=label(name), linewidth=1.6)
        if bands and name in bands:
            low, high = zip(*bands[name])
            ax.fill_between(steps, low, high, color=line.get_color(), alpha=0.18, linewidth=0)
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    if logy:
        ax.set_yscale("symlog", linthresh=1e-4)
    if title:
        ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path)
    plt.close(fig)
    return path


def table1(
    rows: list[tuple[str, float, float]],
    *,
    k: int,
    baseline: str = "grpo",
    initial: tuple[float, float] | None = None,
    dataset: str = "countdown (held-out)",
) -> str:
    """Markdown table shaped like the paper's Table 1: Avg@K and Pass@K (in %), gains against the baseline."""
    base = {name: (a, p) for name, a, p in rows}.get(baseline)
    out = [f"| Method | {dataset} Avg@{k} | {dataset} Pass@{k} |", "|---|---|---|"]
    if initial is not None:
        out.append(f"| initial policy | {100 * initial[0]:.2f} | {100 * initial[1]:.2f} |")
    for name, a, p in rows:
        cell_a, cell_p = f"{100 * a:.2f}", f"{100 * p:.2f}"
        if base is not None and name != baseline:
            cell_a += f" ({100 * (a - base[0]):+.2f})"
            cell_p += f" ({100 * (p - base[1]):+.2f})"
        out.append(f"| {label(name)} | {cell_a} | {cell_p} |")
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------------------------------------------------------
# `entropy-rft report`: the paper's figures from run directories.

import json  # noqa: E402
import math  # noqa: E402

import yaml  # noqa: E402

from ..logging import ENGINE_RUN_FILE, read_metrics  # noqa: E402


def load_run(run_dir: Path | str) -> dict:
    """A run directory's config, per-step metrics and evaluations."""
    run_dir = Path(run_dir)
    if run_dir.exists() and not run_dir.is_dir():
        raise ValueError(f"{run_dir} is a file, not a run directory: pass directories written by `entropy-rft train`")
    if not run_dir.is_dir():
        raise FileNotFoundError(
            f"run directory {run_dir} does not exist: pass directories written by `entropy-rft train`"
        )
    if not (run_dir / "metrics.jsonl").exists():
        raise FileNotFoundError(f"{run_dir} has no metrics.jsonl: pass directories written by `entropy-rft train`")
    damaged = "the run directory is damaged: rerun the run, or leave it out of the report"
    config, evals = {}, {}
    try:
        if (run_dir / "config.yaml").exists():
            config = yaml.safe_load((run_dir / "config.yaml").read_text()) or {}
        if (run_dir / "eval.json").exists():
            evals = json.loads((run_dir / "eval.json").read_text())
    except (yaml.YAMLError, json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(
            f"{run_dir}: config.yaml or eval.json is unreadable ({type(err).__name__}); {damaged}"
        ) from None
    if not isinstance(config, dict):
        raise ValueError(f"{run_dir}/config.yaml is not a mapping of config fields; {damaged}")
    number = lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)  # noqa: E731
    if not isinstance(evals, dict) or not all(
        k.isdigit()
        and isinstance(v, dict)
        and number(v.get("avg_at_k"))
        and number(v.get("pass_at_k"))
        and isinstance(v.get("pass_rates", []), list)
        and all(number(r) for r in v.get("pass_rates", []))
        for k, v in evals.items()
    ):
        raise ValueError(
            f"{run_dir}/eval.json is not a mapping of step -> evaluation (avg_at_k, pass_at_k, pass_rates); {damaged}"
        )
    engine = None
    if (run_dir / ENGINE_RUN_FILE).exists():  # written by the TRL or verl adapter: what it watched or ran
        try:
            engine = json.loads((run_dir / ENGINE_RUN_FILE).read_text())
        except (json.JSONDecodeError, UnicodeDecodeError):
            engine = None
        if not isinstance(engine, dict):
            raise ValueError(f"{run_dir}/{ENGINE_RUN_FILE} is not a mapping of the engine's settings; {damaged}")
    metrics = read_metrics(run_dir)
    if not metrics:
        raise ValueError(
            f"{run_dir}/metrics.jsonl holds no steps (the run stopped before its first step); rerun it "
            "or leave it out of the report"
        )
    for row in metrics:
        bad = [k for k, v in row.items() if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)))]
        if bad:
            raise ValueError(
                f"{run_dir}/metrics.jsonl step {row['step']}: {bad[0]} is {row[bad[0]]!r}, not a number; {damaged}"
            )
    return {
        "name": run_dir.name,
        "dir": str(run_dir),
        "config": config,
        "metrics": metrics,
        "evals": {int(k): v for k, v in evals.items()},
        "engine": engine,
    }


def series(run: dict, key: str) -> list[float]:
    return [m.get(key) if m.get(key) is not None else math.nan for m in run["metrics"]]


def correlation(xs: list[float], ys: list[float]) -> tuple[float, float, int]:
    """(Pearson r, sign agreement, n) over pairs where both values are finite and non-zero."""
    pairs = [
        (x, y) for x, y in zip(xs, ys) if x is not None and y is not None and math.isfinite(x) and math.isfinite(y)
    ]
    n = len(pairs)
    if n < 3:
        return math.nan, math.nan, n
    mx, my = sum(p[0] for p in pairs) / n, sum(p[1] for p in pairs) / n
    sxy = sum((x - mx) * (y - my) for x, y in pairs)
    sxx = sum((x - mx) ** 2 for x, _ in pairs)
    syy = sum((y - my) ** 2 for _, y in pairs)
    r = sxy / math.sqrt(sxx * syy) if sxx > 0 and syy > 0 else math.nan
    signed = [(x, y) for x, y in pairs if x != 0 and y != 0]
    agree = sum((x > 0) == (y > 0) for x, y in signed) / len(signed) if signed else math.nan
    return r, agree, n


def sign_base_rate(ys: list[float]) -> float:
    """The sign agreement a constant-sign predictor gets (it always says the more frequent sign): the share of
    the majority sign among the finite non-zero values. A predictor's sign agreement means something only above it."""
    signed = [y for y in ys if y is not None and math.isfinite(y) and y != 0]
    if not signed:
        return math.nan
    up = sum(y > 0 for y in signed) / len(signed)
    return max(up, 1 - up)


def prediction_summary(predicted: list[float], realised: list[float]) -> dict:
    """How a per-step prediction tracks the realised change, over the steps where both are finite: Pearson r,
    sign agreement beside the constant-sign base rate (on the same steps), the median ratio realised / predicted
    and the least-squares slope through the origin (realised ~ slope * predicted), and the step count."""
    pairs = [
        (x, y)
        for x, y in zip(predicted, realised)
        if x is not None and y is not None and math.isfinite(x) and math.isfinite(y)
    ]
    r, agree, n = correlation([x for x, _ in pairs], [y for _, y in pairs])
    signed = [(x, y) for x, y in pairs if x != 0 and y != 0]
    ratios = sorted(y / x for x, y in pairs if x != 0)
    sxx = sum(x * x for x, _ in pairs)
    median = math.nan
    if ratios:
        mid = len(ratios) // 2
        median = ratios[mid] if len(ratios) % 2 else (ratios[mid - 1] + ratios[mid]) / 2
    return {
        "corr": r,
        "sign_agreement": agree,
        "sign_base_rate": sign_base_rate([y for _, y in signed]),
        "median_ratio": median,
        "slope": sum(x * y for x, y in pairs) / sxx if sxx > 0 else math.nan,
        "n": n,
    }


def _fmt(x: float, spec: str = ".3f") -> str:
    return "-" if x is None or not math.isfinite(x) else format(x, spec)


def _panel_plot(runs: list[dict], keys: list[tuple[str, str]], path: Path, title: str) -> Path:
    fig, axes = plt.subplots(1, len(keys), figsize=(5.2 * len(keys), 3.5), dpi=120, squeeze=False)
    for ax, (key, ylabel) in zip(axes[0], keys):
        for run in runs:
            ax.plot([m["step"] for m in run["metrics"]], series(run, key), label=run["name"], linewidth=1.3)
        ax.set_xlabel("step")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def _mu_plot(runs: list[dict], path: Path) -> Path | None:
    """Figure 2: mean clipped fraction and final entropy against mu, one line per method."""
    by_method: dict[str, list[tuple[float, float, float]]] = {}
    for run in runs:
        cfg = run["config"]
        if (
            cfg.get("method") in ("clip_b", "clip_v")
            and isinstance(cfg.get("mu"), (int, float))
            and cfg.get("entropy_target") is None
        ):
            clip = [v for v in series(run, "clip_frac") if math.isfinite(v)]
            ent = [v for v in series(run, "entropy") if math.isfinite(v)]
            if not clip or not ent:
                continue
            tail = ent[-max(1, len(ent) // 10) :]
            by_method.setdefault(cfg["method"], []).append((cfg["mu"], sum(clip) / len(clip), sum(tail) / len(tail)))
    if not any(len(v) > 1 for v in by_method.values()):
        return None
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.5), dpi=120)
    for method, points in by_method.items():
        points.sort()
        a1.plot([p[0] for p in points], [p[1] for p in points], "o-", label=label(method))
        a2.plot([p[0] for p in points], [p[2] for p in points], "o-", label=label(method))
    a1.set(xlabel="mu", ylabel="mean clipped fraction", yscale="log")
    a2.set(xlabel="mu", ylabel="final entropy (last 10% of steps)")
    for ax in (a1, a2):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle("Clipped fraction and entropy against mu (paper Figure 2)")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


PASS_RATE_BINS = ["0", "(0,.25)", "[.25,.5)", "[.5,.75)", "[.75,1)", "1"]


def pass_rate_fractions(rates: list[float]) -> list[float]:
    """Fraction of problems in each PASS_RATE_BINS bin: exactly 0, four quarters of (0, 1), exactly 1."""
    from ..evaluate import pass_rate_histogram

    return [c / max(len(rates), 1) for c in pass_rate_histogram(rates, bins=4)]


def plot_pass_rates(
    curves: list[tuple[str, list[float]]], path: Path | str, title: str = "Pass-rate distribution (paper Figure 4)"
) -> Path:
    """Grouped bars: for each named list of per-problem pass rates, the fraction of problems per bin."""
    fig, ax = plt.subplots(figsize=(6.5, 3.6), dpi=120)
    width = 0.8 / max(len(curves), 1)
    for i, (name, rates) in enumerate(curves):
        ax.bar(
            [j + i * width for j in range(len(PASS_RATE_BINS))],
            pass_rate_fractions(rates),
            width=width,
            label=label(name),
        )
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(PASS_RATE_BINS))], PASS_RATE_BINS)
    ax.set(xlabel="pass rate of a problem", ylabel="fraction of problems", title=title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path)
    plt.close(fig)
    return path


def _pass_rate_plot(runs: list[dict], path: Path) -> Path | None:
    """Figure 4: distribution of per-problem pass rates at the first and last evaluation."""
    with_evals = [r for r in runs if r["evals"]]
    if not with_evals:
        return None
    first = with_evals[0]["evals"][min(with_evals[0]["evals"])]
    curves = [("initial", first["pass_rates"])] + [
        (r["name"], r["evals"][max(r["evals"])]["pass_rates"]) for r in with_evals
    ]
    return plot_pass_rates(curves, path)


PREDICTORS = (
    ("first_order", "entropy_change/first_order", "first-order change through the network"),
    (
        "logit_space",
        "entropy_change/predicted",
        "eq. 23 (Corollary 4) with SGD step sizes on the logits: -lr/|T_B| Cov_B(A, S_c)",
    ),
)


def _scatter_plot(runs: list[dict], path: Path) -> tuple[Path, dict]:
    """Two panels on the probed steps: the exact first-order change (grad of mean H . the applied step) and
    Corollary 4's logit-space prediction, each against the realised change of the batch's mean entropy."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), dpi=120)
    stats: dict[str, dict] = {}
    realised_key = "entropy_change/realised"
    for ax, (name, key, xlabel) in zip(axes, PREDICTORS):
        lo, hi = math.inf, -math.inf
        for run in runs:
            x, y = series(run, key), series(run, realised_key)
            s = stats.setdefault(run["name"], {})[name] = prediction_summary(x, y)
            ax.scatter(x, y, s=8, alpha=0.6, label=f"{run['name']} (r={_fmt(s['corr'], '.2f')})")
            finite = [v for v in x + y if math.isfinite(v)]
            lo, hi = min([lo, *finite]), max([hi, *finite])
        if name == "first_order" and lo < hi:
            ax.plot([lo, hi], [lo, hi], "k--", linewidth=0.7, label="realised = first order")
        ax.axhline(0, color="k", linewidth=0.5)
        ax.axvline(0, color="k", linewidth=0.5)
        ax.set(xlabel=xlabel, ylabel="realised change of mean entropy")
        ax.ticklabel_format(style="sci", scilimits=(-2, 2))
        ax.legend(fontsize=7)
    fig.suptitle("Predicted against realised entropy change, per probed step")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path, stats


REGION_LABELS = {
    "pos_likely": "A > 0, S* > 0 (likely)",
    "pos_unlikely": "A > 0, S* <= 0 (unlikely)",
    "neg_likely": "A < 0, S* > 0 (likely)",
    "neg_unlikely": "A < 0, S* <= 0 (unlikely)",
}


def region_plot(runs: list[dict], path: Path, *, columns: int | None = None, what: str = "") -> Path | None:
    """The predicted entropy change of each step split into its four regions (entropy_change/by_region/*, which
    sum to entropy_change/predicted), one panel per run (`columns` to a row; default all in one), with the realised
    change on the probed steps on an axis of its own (the logit-space sum's scale is not the real step's:
    docs/watch.md); `what` says what a panel's series are (compare: the mean over seeds). None when no run logged
    the regions (runs written before they existed)."""
    keyed = [
        run
        for run in runs
        if any(m.get(f"entropy_change/by_region/{r}") is not None for m in run["metrics"] for r in REGION_LABELS)
    ]
    if not keyed:
        return None
    across = min(columns or len(keyed), len(keyed))
    down = -(-len(keyed) // across)
    fig, axes = plt.subplots(down, across, figsize=(5.6 * across, 3.8 * down), dpi=120, squeeze=False)
    for ax in axes.flat[len(keyed) :]:
        ax.set_visible(False)
    for ax, run in zip(axes.flat, keyed):
        steps = [m["step"] for m in run["metrics"]]
        for region, text in REGION_LABELS.items():
            ax.plot(steps, series(run, f"entropy_change/by_region/{region}"), label=text, linewidth=1.2)
        ax.plot(steps, series(run, "entropy_change/predicted"), "k-", linewidth=0.8, alpha=0.6, label="sum: predicted")
        ax.axhline(0, color="k", linewidth=0.5)
        ax.set(xlabel="step", ylabel="predicted change, logit space (nats per token)", title=label(run["name"]))
        ax.ticklabel_format(axis="y", style="sci", scilimits=(-2, 2))
        ax.grid(alpha=0.3)
        handles = ax.get_legend_handles_labels()
        realised = series(run, "entropy_change/realised")
        if any(math.isfinite(v) for v in realised):  # its own axis: the logit-space sum has no usable scale
            right = ax.twinx()
            right.plot(steps, realised, "kx", markersize=5, label="realised (probed steps, right axis)")
            right.set_ylabel("realised change (nats per token)")
            extra = right.get_legend_handles_labels()
            handles = (handles[0] + extra[0], handles[1] + extra[1])
        ax.legend(*handles, fontsize=7)
    fig.suptitle(
        "Predicted entropy change by region: the sign of A x whether the token is likely (S* > 0)"
        + (f" ({what})" if what else "")
    )
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def _mu_cell(cfg: dict) -> str:
    """The run's mu: its setting, else its method's default (marked), else n/a for a method without one."""
    if cfg.get("mu") is not None:
        return str(cfg["mu"])
    from ..core.methods import METHODS

    method = cfg.get("method")
    default = METHODS.get(method).options.get("mu") if method in METHODS else None
    return f"{default} (default)" if default is not None else "n/a"


def prediction_lines(name: str, stats: dict) -> list[str]:
    """The report's summary line for each predictor of a run."""
    out = []
    for key, label_ in (
        ("first_order", "first-order change"),
        ("logit_space", "Corollary 4 (logit space, SGD step sizes)"),
    ):
        s = stats[key]
        out.append(
            f"- {name}, {label_} against realised over {s['n']} probed steps: r = {_fmt(s['corr'])}, "
            f"realised / predicted median {_fmt(s['median_ratio'], '.3g')} (slope {_fmt(s['slope'], '.3g')}), "
            f"same sign on {_fmt(s['sign_agreement'], '.0%')} of steps against "
            f"{_fmt(s['sign_base_rate'], '.0%')} for a constant-sign guess"
        )
    return out


def _mean(xs: list[float]) -> float:
    finite = [x for x in xs if math.isfinite(x)]
    return sum(finite) / len(finite) if finite else math.nan


def would_clip_filters(runs: list[dict]) -> list[str]:
    """The filters whose would_<name>/frac a monitored run logged (diagnostics.WOULD_CLIP), in order of appearance."""
    names: list[str] = []
    for run in runs:
        for m in run["metrics"]:
            for key in m:
                if key.startswith("would_") and key.endswith("/frac") and key[6:-5] not in names:
                    names.append(key[6:-5])
    return names


def engine_table(runs: list[dict], corr: dict) -> list[str]:
    """The table of runs from the TRL or verl adapter (diagnostics.ENGINE_RUN_FILE): what was watched (engine,
    method, the engine's loss), entropy, what Clip_B and Clip_V would drop (mean fraction, and the mean of their
    share of eq. 23's logit-space sum), the probe's first order against realised. A filter's clipped fraction is a
    column only when some run ran a filter (method "none" clips nothing by design)."""
    filtered = any(run["engine"].get("method") not in (None, "none") for run in runs)
    would = would_clip_filters(runs)
    head = ["run", "engine", "method", "loss watched", "steps", "entropy first -> last"]
    head += ["mean clip frac"] if filtered else []
    head += [f"{n} would drop (mean frac)" for n in would]
    head += [f"their share of eq. 23, {' / '.join(would)} (mean)"] if would else []
    head += ["probed steps", "realised / first order (median)", "sign agreement (constant-sign base rate)"]
    lines = [
        "Runs of an engine (TRL, verl) watched or filtered by entropy-rft:",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for run in runs:
        eng, ent = run["engine"], [v for v in series(run, "entropy") if math.isfinite(v)]
        loss = eng.get("loss_type") or eng.get("loss_agg_mode") or "?"
        if eng.get("importance_sampling_level") == "sequence":
            loss += " (sequence-level ratio, GSPO)"
        version = eng.get("trl_version") or eng.get("verl_version")
        fo = corr[run["name"]]["first_order"]
        row = [
            run["name"],
            f"{eng.get('source', '?')} {version}" if version else eng.get("source", "?"),
            str(eng.get("method", "?")),
            loss,
            str(len(run["metrics"])),
            f"{ent[0]:.4f} -> {ent[-1]:.4f}" if ent else "-",
        ]
        if filtered:
            row.append(_fmt(_mean(series(run, "clip_frac")), ".4f") if eng.get("method") != "none" else "-")
        row += [_fmt(_mean(series(run, f"would_{n}/frac")), ".4f") for n in would]
        if would:
            row.append(" / ".join(_fmt(_mean(series(run, f"would_{n}/entropy_change")), ".3g") for n in would))
        row += [
            str(fo["n"]),
            _fmt(fo["median_ratio"], ".3g"),
            f"{_fmt(fo['sign_agreement'], '.2f')} ({_fmt(fo['sign_base_rate'], '.2f')})",
        ]
        lines.append("| " + " | ".join(row) + " |")
    return lines


# what build_report writes (checked against run records by the CLI: rundir.check_output)
REPORT_FILES = (
    "report.md",
    "report.json",
    "report.html",
    "inspect.html",
    "entropy.png",
    "s_means.png",
    "cov.png",
    "grad_norm.png",
    "clip_vs_mu.png",
    "pass_rates.png",
    "predicted_vs_realised.png",
    "would_clip.png",
    "entropy_by_region.png",
)


def _figures(runs: list[dict], out: Path) -> tuple[list[tuple[str, Path]], dict]:
    """The report's figures as (title, path), written into out, and the prediction correlations per run."""
    figures = [
        (
            "Entropy (Figures 1, 2c-d)",
            _panel_plot(
                runs,
                [("entropy", "token entropy (all valid tokens)"), ("clip_frac", "clipped fraction")],
                out / "entropy.png",
                "Entropy and clipped fraction",
            ),
        ),
        (
            "S* and S_c batch means (Figure 3)",
            _panel_plot(
                runs,
                [("s_star_mean", "batch mean S*"), ("s_centered_mean", "batch mean S_c")],
                out / "s_means.png",
                "Corollary 2: S_c averages to about 0",
            ),
        ),
        (
            "Cov_B(A, S_c) (Figure 5)",
            _panel_plot(runs, [("cov_a_sc", "Cov_B(A, S_c)")], out / "cov.png", "Corollary 4's covariance"),
        ),
        (
            "Gradient norm (Figure 8)",
            _panel_plot(
                runs,
                [("grad_norm", "grad norm"), ("reward_mean", "mean reward")],
                out / "grad_norm.png",
                "Gradient norm and reward",
            ),
        ),
    ]
    mu_fig = _mu_plot(runs, out / "clip_vs_mu.png")
    if mu_fig:
        figures.append(("Clipped fraction and entropy against mu (Figure 2a-b)", mu_fig))
    pass_fig = _pass_rate_plot(runs, out / "pass_rates.png")
    if pass_fig:
        figures.append(("Pass-rate distribution (Figure 4)", pass_fig))
    watched = [run for run in runs if run["engine"] is not None]
    if would_clip_filters(watched):
        figures.append(
            (
                "What Clip_B and Clip_V would drop (monitored runs)",
                _panel_plot(
                    watched,
                    [(f"would_{name}/frac", f"fraction {name} would drop") for name in would_clip_filters(watched)],
                    out / "would_clip.png",
                    "Tokens the filters would drop at their default mu",
                ),
            )
        )
    regions = region_plot(runs, out / "entropy_by_region.png")
    if regions:
        figures.append(("Predicted entropy change by region", regions))
    scatter, corr = _scatter_plot(runs, out / "predicted_vs_realised.png")
    figures.append(("Predicted against realised entropy change", scatter))
    return figures, corr


def _builtin_table(runs: list[dict], corr: dict) -> list[str]:
    """The table of the built-in trainer's runs: method, mu, entropy, clipping, Avg@K and Pass@K before and
    after, and, where a step was probed, how the first-order prediction did."""
    lines: list[str] = []
    builtin = [run for run in runs if run["engine"] is None]
    probed = any(corr[run["name"]]["first_order"]["n"] for run in builtin)
    if builtin:
        lines += [
            "| run | method | mu | steps | entropy first -> last | mean clip frac | Avg@K before -> after | "
            "Pass@K before -> after |"
            + (
                " corr(first order, realised) | realised / first order | sign agreement (constant-sign base rate) |"
                if probed
                else ""
            ),
            "|---|---|---|---|---|---|---|---|" + ("---|---|---|" if probed else ""),
        ]
    for run in builtin:
        cfg, ent = run["config"], [v for v in series(run, "entropy") if math.isfinite(v)]
        clip = [v for v in series(run, "clip_frac") if math.isfinite(v)]
        ev = run["evals"]
        a = f"{ev[min(ev)]['avg_at_k']:.3f} -> {ev[max(ev)]['avg_at_k']:.3f}" if ev else "not evaluated"
        p = f"{ev[min(ev)]['pass_at_k']:.3f} -> {ev[max(ev)]['pass_at_k']:.3f}" if ev else "not evaluated"
        fo = corr[run["name"]]["first_order"]
        row = (
            f"| {run['name']} | {cfg.get('method', '?')} | {_mu_cell(cfg)} | {len(run['metrics'])} | "
            f"{f'{ent[0]:.4f} -> {ent[-1]:.4f}' if ent else 'not logged'} | "
            f"{f'{sum(clip) / len(clip):.4f}' if clip else 'not logged'} | "
            f"{a} | {p} |"
        )
        if probed:
            row += (
                f" {_fmt(fo['corr'])} | {_fmt(fo['median_ratio'], '.3g')} | {_fmt(fo['sign_agreement'], '.2f')} "
                f"({_fmt(fo['sign_base_rate'], '.2f')}) |"
                if fo["n"]
                else " not probed | not probed | not probed |"
            )
        lines.append(row)
    return lines


def _prediction_lines(runs: list[dict], corr: dict) -> list[str]:
    """Each run's first-order and Corollary 4 predictions against the realised entropy change."""
    lines: list[str] = []
    lines += [
        "",
        "Entropy change per probed step (`probe_every`): the exact first-order change through the network and "
        "Corollary 4's logit-space prediction, each against the realised change of the batch's mean entropy. A "
        "sign agreement means something only above the constant-sign base rate.",
        "",
    ]
    for run in runs:
        if corr[run["name"]]["first_order"]["n"]:
            lines += prediction_lines(run["name"], corr[run["name"]])
        else:
            every = run["config"].get("probe_every")
            lines.append(
                f"- {run['name']}: no probed step (probe_every {every}, {len(run['metrics'])} steps logged; a "
                "run probes every probe_every-th step: the 10th, 20th, ... at 10)"
            )
    return lines


def build_report(run_dirs: list[Path | str], out: Path | str) -> Path:
    """PNG figures and report.md for one or more runs."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    runs = [load_run(d) for d in run_dirs]
    figures, corr = _figures(runs, out)
    watched = [run for run in runs if run["engine"] is not None]
    lines = ["# entropy-rft report\n"]
    if watched:
        lines += engine_table(watched, corr) + [""]
    lines += _builtin_table(runs, corr) + _prediction_lines(runs, corr)
    lines.append("")
    for title, path in figures:
        lines += [f"## {title}\n", f"![{title}]({Path(path).name})\n"]
    page = out / "report.md"
    page.write_text("\n".join(lines))
    (out / "report.json").write_text(json.dumps({run["name"]: corr[run["name"]] for run in runs}, indent=1) + "\n")
    write_report_html(lines, figures, out, inspector_page(run_dirs, out))
    return page


# ---------------------------------------------------------------------------------------------------------------
# report.html: the same report as one self-contained page, its figures inline, with a link to the token view.


def inspector_page(run_dirs: list[Path | str], out: Path) -> Path | None:
    """OUT/inspect.html (`entropy-rft inspect`) of the runs that have token samples; None when none has."""
    from ..samples import steps_written
    from .inspect_page import build_page

    sampled = [d for d in run_dirs if steps_written(d)]
    return build_page(sampled, out / "inspect.html") if sampled else None


def _markdown_line(line: str) -> str:
    """One line of report.md as HTML: `code` spans, the rest escaped."""
    import html

    parts = line.split("`")
    return "".join(f"<code>{html.escape(p)}</code>" if i % 2 else html.escape(p) for i, p in enumerate(parts))


def write_report_html(lines: list[str], figures: list[tuple[str, Path]], out: Path, inspector: Path | None) -> Path:
    """OUT/report.html: report.md's table and summary lines, each figure inline (a PNG data URI), and a link to the
    inspector page (or why there is none). No request leaves the page (its Content-Security-Policy allows none)."""
    import base64
    import html

    body, table, items = [], [], []
    for line in lines + [""]:
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if not all(set(c) <= {"-"} for c in cells):
                tag = "th" if not table else "td"
                table.append("<tr>" + "".join(f"<{tag}>{_markdown_line(c)}</{tag}>" for c in cells) + "</tr>")
            continue
        if line.startswith("- "):
            items.append(f"<li>{_markdown_line(line[2:])}</li>")
            continue
        if table:
            body.append("<table>" + "".join(table) + "</table>")
            table = []
        if items:
            body.append("<ul>" + "".join(items) + "</ul>")
            items = []
        if line.strip() and not line.startswith(("# ", "## ", "![")):  # headings and figures: below, inline
            body.append(f"<p>{_markdown_line(line)}</p>")
    if inspector is not None:
        link = (
            f'<p class="inspect"><a href="{html.escape(inspector.name)}">Token view</a>: every sampled token of these '
            "runs coloured by H, S*, S_c or its term of the entropy change, the clipped ones marked "
            "(<code>entropy-rft inspect</code>).</p>"
        )
    else:
        link = (
            '<p class="inspect">No token view: these runs wrote no token samples (train with '
            "<code>samples_every</code> &gt; 0, the default 10).</p>"
        )
    for title, path in figures:
        data = base64.b64encode(Path(path).read_bytes()).decode()
        body.append(f'<h2>{html.escape(title)}</h2><img src="data:image/png;base64,{data}" alt="{html.escape(title)}">')
    page = out / "report.html"
    page.write_text(
        '<!doctype html><html lang="en"><head><meta charset="utf-8"><meta name="viewport" '
        'content="width=device-width, initial-scale=1"><meta http-equiv="Content-Security-Policy" '
        "content=\"default-src 'none'; style-src 'unsafe-inline'; img-src data:\"><title>entropy-rft report</title>"
        "<style>body{font:14px/1.45 system-ui,sans-serif;margin:1rem 2rem;max-width:80rem}table{border-collapse:"
        "collapse;font-size:13px}th,td{border:1px solid #ccc;padding:.2rem .4rem;text-align:right}th:first-child,"
        "td:first-child{text-align:left}img{max-width:100%}li{margin:.2rem 0}.inspect{font-size:15px;padding:.4rem "
        ".6rem;background:#f3f3f0;border-radius:4px}</style></head><body><h1>entropy-rft report</h1>"
        + link
        + "".join(body)
        + "</body></html>\n",
        encoding="utf-8",
    )
    return page
