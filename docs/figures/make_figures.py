"""The figures of docs/concepts.md, made with the library's own functions: `python docs/figures/make_figures.py`.

Each figure is computed on small, seeded, synthetic softmax distributions (no model), so it shows the paper's
statements (arXiv 2602.03392, Section 3 and Algorithms 1-2) as this code computes them:
- s_star.png: S_i = p_i (H + log p_i) of every token of two distributions, against p_i; its sign changes at
  p_i = exp(-H) (eq. 6).
- theorem1.png: the exact entropy change when one logit moves by eps, against Theorem 1's -eps S* (eq. 4).
- theorem2.png: the exact entropy change of one GRPO step on a token's logits (delta z = alpha (e_k - p), eq. 9),
  against Theorem 2's -alpha S_c (eq. 10) and against -alpha S* (Theorem 1's score, which misses the baseline).
- clipping.png: a batch's S* and S_c with the thresholds of Clip_B and Clip_V (masks.clip_b / clip_v, one-sided
  on negative-advantage tokens, the authors' defaults) and the tokens they clip.
- first_order.png: the same batch's tokens by advantage and S_c: each token's first-order entropy term
  -lr A S_c / (|T_B| |T|) (eq. 23 with the token-mean loss) has the sign of -A S_c: negative where A and S_c
  share a sign.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import torch

from entropy_rft.core.dynamics import theorem1_entropy_change, theorem2_entropy_change, token_stats
from entropy_rft.core.masks import clip_b, clip_v

OUT = Path(__file__).resolve().parent
torch.set_default_dtype(torch.float64)  # the exact changes are differences of entropies: float64 keeps them exact


def entropy(z: torch.Tensor) -> torch.Tensor:
    logp = torch.log_softmax(z, dim=-1)
    return -(logp.exp() * logp).sum(-1)


def all_tokens(z: torch.Tensor):
    """Statistics of every token k of one distribution z [V]: (p [V], H, S* [V], S_c [V])."""
    v = z.shape[-1]
    stats = token_stats(z.expand(v, v), torch.arange(v))
    return stats.logp.exp(), stats.entropy[0], stats.s_star, stats.s_centered


def figure_s_star(gen: torch.Generator) -> None:
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4), sharey=False)
    for ax, scale, name in zip(axes, (4.0, 1.0), ("a peaked distribution", "a flat distribution")):
        z = scale * torch.randn(30, generator=gen)
        p, h, s_star, _ = all_tokens(z)
        ax.axhline(0, color="0.6", lw=0.8)
        ax.axvline(float(torch.exp(-h)), color="tab:red", ls="--", lw=1, label=f"p = exp(-H), H = {float(h):.2f}")
        ax.scatter(p, s_star, s=18, c=["tab:blue" if s > 0 else "tab:orange" for s in s_star])
        ax.set_xscale("log")
        ax.set_xlabel("token probability p_i")
        ax.set_ylabel("S_i = p_i (H + log p_i)")
        ax.set_title(name)
        ax.legend(loc="upper left", fontsize=8)
    fig.suptitle("S* > 0 for tokens likelier than exp(-H), S* < 0 for the unlikely ones (eq. 6)", fontsize=10)
    fig.tight_layout()
    fig.savefig(OUT / "s_star.png", dpi=110)
    plt.close(fig)


def figure_theorem1(gen: torch.Generator) -> None:
    exact, predicted, signs = [], [], []
    for _ in range(6):
        z = 2.0 * torch.randn(20, generator=gen)
        _, h, s_star, _ = all_tokens(z)
        for k in range(z.shape[0]):
            for eps in (-0.05, 0.05):
                exact.append(float(entropy(z + eps * torch.nn.functional.one_hot(torch.tensor(k), 20)) - h))
                predicted.append(float(theorem1_entropy_change(s_star[k], eps)))
                signs.append(eps)
    fig, ax = plt.subplots(figsize=(4.6, 4.2))
    lim = max(map(abs, exact + predicted)) * 1.1
    ax.plot([-lim, lim], [-lim, lim], color="0.6", lw=0.8)
    ax.scatter(predicted, exact, s=10, c=["tab:blue" if e > 0 else "tab:orange" for e in signs])
    ax.set_xlabel("Theorem 1: -eps S*")
    ax.set_ylabel("exact entropy change")
    ax.set_title("raising (blue) or lowering (orange) one logit\nby eps = 0.05", fontsize=10)
    fig.tight_layout()
    fig.savefig(OUT / "theorem1.png", dpi=110)
    plt.close(fig)


def figure_theorem2(gen: torch.Generator) -> None:
    exact, by_sc, by_star = [], [], []
    alpha = 0.05
    for _ in range(6):
        z = 2.0 * torch.randn(20, generator=gen)
        p, h, s_star, s_c = all_tokens(z)
        for k in range(z.shape[0]):
            step = alpha * (torch.nn.functional.one_hot(torch.tensor(k), 20) - p)  # eq. 9: delta z = alpha (e_k - p)
            exact.append(float(entropy(z + step) - h))
            by_sc.append(float(theorem2_entropy_change(s_c[k], alpha)))
            by_star.append(float(theorem1_entropy_change(s_star[k], alpha)))
    fig, ax = plt.subplots(figsize=(4.6, 4.2))
    lim = max(map(abs, exact + by_sc + by_star)) * 1.1
    ax.plot([-lim, lim], [-lim, lim], color="0.6", lw=0.8)
    ax.scatter(by_star, exact, s=10, c="tab:gray", label="-alpha S* (no baseline)")
    ax.scatter(by_sc, exact, s=10, c="tab:green", label="Theorem 2: -alpha S_c")
    ax.set_xlabel("predicted entropy change")
    ax.set_ylabel("exact entropy change")
    ax.set_title("one GRPO step on a token, alpha = lr r A = 0.05", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(OUT / "theorem2.png", dpi=110)
    plt.close(fig)


def synthetic_batch(gen: torch.Generator):
    """16 responses x 48 tokens over a vocabulary of 200, tokens sampled from the policy, one advantage per response."""
    b, t, v = 16, 48, 200
    logits = 8.0 * torch.randn(b, t, v, generator=gen)  # mean token entropy about 0.7 nats
    tokens = torch.multinomial(torch.softmax(logits, -1).reshape(-1, v), 1, generator=gen).reshape(b, t)
    advantages = torch.where(torch.arange(b) % 2 == 0, 1.0, -1.0) * (0.5 + torch.rand(b, generator=gen))
    mask = torch.ones(b, t, dtype=torch.bool)
    return token_stats(logits, tokens), advantages, mask


def figure_clipping(stats, advantages, mask) -> None:
    keep_b, _ = clip_b(stats.s_star, advantages, mask, mu=1.5)
    keep_v, _ = clip_v(stats.s_centered, advantages, mask, mu=1.5, max_frac=None)
    adv = advantages[:, None].expand_as(stats.s_star)
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
    for ax, score, keep, name, centre in (
        (axes[0], stats.s_star, keep_b, "Clip_B on S* (mu 1.5)", float(stats.s_star.mean())),
        (axes[1], stats.s_centered, keep_v, "Clip_V on S_c (mu 1.5, no cap)", 0.0),
    ):
        std = float(score.std(unbiased=False))
        bins = torch.linspace(float(score.min()), float(score.max()), 50)
        ax.hist(
            [score[adv > 0], score[(adv < 0) & keep], score[~keep]],
            bins=bins.numpy(),
            stacked=True,
            color=["tab:blue", "tab:orange", "tab:red"],
            label=["A > 0", "A < 0, kept", "clipped"],
        )
        ax.axvline(centre - 1.5 * std, color="tab:red", ls="--", lw=1, label="threshold")
        ax.set_yscale("log")
        ax.set_xlabel(name.split(" on ")[1].split(" ")[0])
        ax.set_title(f"{name}: {int((~keep).sum())} of {int(mask.sum())} tokens clipped", fontsize=10)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(OUT / "clipping.png", dpi=110)
    plt.close(fig)


def figure_first_order(stats, advantages, mask) -> None:
    keep, _ = clip_b(stats.s_star, advantages, mask, mu=1.5)
    adv = advantages[:, None].expand_as(stats.s_centered)
    term = -adv * stats.s_centered  # each token's term of eq. 23 is lr / (|T_B| |T|) times this
    fig, ax = plt.subplots(figsize=(6.2, 4.2))
    lim = float(term.abs().max())
    sc = ax.scatter(stats.s_centered[keep], adv[keep], c=term[keep], cmap="coolwarm_r", vmin=-lim, vmax=lim, s=9)
    ax.scatter(
        stats.s_centered[~keep],
        adv[~keep],
        facecolors="none",
        edgecolors="k",
        s=26,
        lw=0.8,
        label="clipped by Clip_B (mu 1.5)",
    )
    ax.axhline(0, color="0.6", lw=0.8)
    ax.axvline(0, color="0.6", lw=0.8)
    ax.set_xlabel("S_c = S* - E_p[S]")
    ax.set_ylabel("advantage A")
    for x, y, text in (
        (0.98, 0.96, "A > 0, S_c > 0:\nentropy down"),
        (0.02, 0.96, "A > 0, S_c < 0:\nentropy up"),
        (0.98, 0.04, "A < 0, S_c > 0:\nentropy up"),
        (0.02, 0.04, "A < 0, S_c < 0:\nentropy down"),
    ):
        ax.text(
            x,
            y,
            text,
            transform=ax.transAxes,
            ha="right" if x > 0.5 else "left",
            va="top" if y > 0.5 else "bottom",
            fontsize=8,
        )
    fig.colorbar(sc, ax=ax, label="-A S_c: the sign and size of the token's term")
    ax.legend(loc="center left", fontsize=8)
    fig.tight_layout()
    fig.savefig(OUT / "first_order.png", dpi=110)
    plt.close(fig)


def main() -> None:
    gen = torch.Generator().manual_seed(0)
    figure_s_star(gen)
    figure_theorem1(gen)
    figure_theorem2(gen)
    batch = synthetic_batch(gen)
    figure_clipping(*batch)
    figure_first_order(*batch)
    print("wrote", ", ".join(sorted(p.name for p in OUT.glob("*.png"))))


if __name__ == "__main__":
    main()
