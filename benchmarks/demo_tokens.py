"""What the demo's token samples show on countdown: the figures of the token-view paragraph in
docs/getting-started.md ("The demo").

Reads DEMO_DIR/runs/{grpo,clip_b,clip_v}/samples (written by `entropy-rft demo`) and prints:
1. step 1, where the three methods share the policy and the rollouts: per method the tokens in the loss, eq. 23's
   total over the whole batch (the first-order change of the mean entropy over the kept tokens, entropy_kept) and
   Corollary 4's (the logged prediction), and what the clipping methods removed in the
   written groups: how many tokens, which kind (countdown responses read `expression=target<eos>`: operand digits,
   operators, parentheses, '=', target digits, EOS), the sign of their advantage and of S_c, their mean p against
   the kept tokens', and the sum of their would-be terms;
2. over every sampled step, per method: the sum of the written tokens' terms by kind, and the share of the negative
   terms (those that lower entropy) carried by each kind.

    python benchmarks/demo_tokens.py [DEMO_DIR]      # default runs/demo
"""

from __future__ import annotations

import math
import sys
from collections import defaultdict
from pathlib import Path

from entropy_rft import samples

KINDS = ("operand", "operator", "paren", "=", "target", "eos", "other")


def kinds(texts: list[str]) -> list[str]:
    """The kind of each token of a countdown response (`expression=target<eos>`)."""
    out, after = [], False
    for t in texts:
        if t == "=":
            out.append("=")
            after = True
        elif t.isdigit():
            out.append("target" if after else "operand")
        elif t in "+-*/" and t:
            out.append("operator")
        elif t in ("(", ")"):
            out.append("paren")
        elif "eos" in t or t.startswith("<|"):
            out.append("eos")
        else:
            out.append("other")
    return out


def tokens(rec: dict):
    """(kind, text, kept, term, would-be term, advantage, S_c, p) of every written token of a record."""
    for g in rec["groups"]:
        for r in g["responses"]:
            for t, (kind, text) in enumerate(zip(kinds(r["text"]), r["text"])):
                a, s = r["advantage"], r["s_centered"][t]
                yield (
                    kind,
                    text,
                    bool(r["kept"][t]),
                    r["term"][t],
                    -r["term_scale"] * a * s,
                    a,
                    s,
                    math.exp(r["logp"][t]),
                )


def main() -> None:
    demo = Path(sys.argv[1] if len(sys.argv) > 1 else "runs/demo")
    runs = {
        m: samples.read_samples(demo / "runs" / m)
        for m in ("grpo", "clip_b", "clip_v")
        if (demo / "runs" / m / "samples").is_dir()
    }
    print(f"{demo}: sampled steps {', '.join(map(str, next(iter(runs.values()))))}\n")
    print("Step 1 (same policy and rollouts for every method):")
    for method, recs in runs.items():
        rec = recs[1]
        ec, b = rec["entropy_change"], rec["batch"]
        print(
            f"  {method}: {b['kept_tokens']} of {b['valid_tokens']} tokens in the loss; "
            f"eq. 23 total (change of entropy_kept) {ec['eq23']:+.3e}, "
            f"Corollary 4 (logged) {ec['corollary4']:+.3e}"
        )
        toks = list(tokens(rec))
        removed = [x for x in toks if not x[2]]
        if removed:
            by_kind = defaultdict(int)
            for x in removed:
                by_kind[x[0]] += 1
            kept = [x for x in toks if x[2]]
            print(
                f"    removed in the {len(rec['groups'])} written groups: {len(removed)} of {len(toks)} tokens, "
                + ", ".join(f"{k} {by_kind[k]}" for k in KINDS if by_kind[k])
                + f"; A < 0: {sum(x[5] < 0 for x in removed)}, S_c < 0: {sum(x[6] < 0 for x in removed)}; "
                f"mean p {sum(x[7] for x in removed) / len(removed):.3f} "
                f"(kept: {sum(x[7] for x in kept) / len(kept):.3f}); "
                f"would-be terms sum {sum(x[4] for x in removed):+.3e} "
                f"(the written kept tokens' terms sum {sum(x[3] for x in kept):+.3e})"
            )
    print(
        "\nEvery sampled step, written tokens: sum of terms by kind; share of the negative terms (entropy down) by kind"
    )
    for method, recs in runs.items():
        total, negative = defaultdict(float), defaultdict(float)
        for rec in recs.values():
            for kind, _, _, term, *_ in tokens(rec):
                total[kind] += term
                negative[kind] += min(term, 0.0)
        neg = sum(negative.values()) or 1.0
        print(
            f"  {method}: "
            + ", ".join(f"{k} {total[k]:+.2e} ({100 * negative[k] / neg:.0f}%)" for k in KINDS if k in total)
        )
    last = max(next(iter(runs.values())))
    print(f"\nStep {last}: tokens that lowered entropy most (whole batch), per method")
    for method, recs in runs.items():
        rec = recs.get(last)
        if rec:
            print(
                f"  {method}: "
                + "; ".join(
                    f"{e['before'][-6:]}[{e['text']}]{e['after'][:3]} A {e['advantage']:+.2f} "
                    f"S_c {e['s_centered']:+.3f}"
                    for e in rec["top"]["lower"][:4]
                )
            )


if __name__ == "__main__":
    main()
