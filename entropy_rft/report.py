"""Plots and tables from runs: per-step curves of any metric for several runs, and the paper's Table 1 layout."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

LABELS = {"grpo": "GRPO", "clip_b": "GRPO+Clip_B", "clip_v": "GRPO+Clip_V"}


def label(name: str) -> str:
    return LABELS.get(name, name)


def plot_curves(runs: dict[str, list[float]], path: Path | str, *, ylabel: str, title: str = "",
                logy: bool = False) -> Path:
    """One line per run of a per-step metric, saved as PNG."""
    fig, ax = plt.subplots(figsize=(6, 3.6), dpi=120)
    for name, values in runs.items():
        ax.plot(range(1, len(values) + 1), values, label=label(name), linewidth=1.6)
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


def table1(rows: list[tuple[str, float, float]], *, k: int, baseline: str = "grpo", initial: tuple[float, float] | None = None,
           dataset: str = "countdown (held-out)") -> str:
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
