"""Issue 52's pilot (docs/prereg_real_lm.md; records in benchmarks/real_lm_study/pilot/).

    python benchmarks/real_lm_pilot.py mu benchmarks/real_lm_study/pilot/runs/n_mul2x1
    python benchmarks/real_lm_pilot.py rescore benchmarks/real_lm_study/pilot/eval_strict

`mu`: the share of negative-advantage tokens Clip_B and Clip_V would clip at each mu, from the S* and S_c of the
token samples the GRPO pilot wrote (RUN/samples: 4 of the 8 groups of steps 1, 10, 20, 30, 40; batch statistics over
those written groups). The registered rule takes, for each method, the smallest mu of the grid that clips at most 5%
of the negative-advantage tokens, pooled over the written steps of the first 40.

`rescore`: the base model's evaluation samples (DIR/*.jsonl, written by `entropy-rft eval`) judged again by the
`math_numeral` checker (a stated Answer: line by DAPO's string checker, else the last number): Avg@K and Pass@K per
family, and how many right answers were stated on an Answer: line.
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from entropy_rft.core.masks import clip_b, clip_v

GRID = (0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.2, 1.5, 2.0, 2.5, 3.0, 4.0, 6.0, 8.5)
TARGET, LAST_STEP, MAX_FRAC = 0.05, 40, 0.05


def batches(run: Path):
    for path in sorted((run / "samples").glob("step-*.json.gz")):
        d = json.loads(gzip.open(path).read())
        if d["step"] > LAST_STEP:
            continue
        rows = [r for g in d["groups"] for r in g["responses"]]
        width = max(r["length"] for r in rows)
        s_star, s_c = torch.zeros(len(rows), width), torch.zeros(len(rows), width)
        mask = torch.zeros(len(rows), width, dtype=torch.bool)
        for i, r in enumerate(rows):
            s_star[i, : r["length"]] = torch.tensor(r["s_star"])
            s_c[i, : r["length"]] = torch.tensor(r["s_centered"])
            mask[i, : r["length"]] = True
        yield d["step"], s_star, s_c, torch.tensor([r["advantage"] for r in rows]), mask


def main(run: Path) -> dict:
    clipped = {"clip_b": dict.fromkeys(GRID, 0), "clip_v": dict.fromkeys(GRID, 0)}
    negative, stats = 0, []
    for step, s_star, s_c, adv, mask in batches(run):
        neg = (adv < 0)[:, None] & mask
        negative += int(neg.sum())
        stats.append(
            {
                "step": step,
                "negative_tokens": int(neg.sum()),
                "s_star_mean": float(s_star[mask].mean()),
                "s_star_std": float(s_star[mask].std()),
                "s_star_min": float(s_star[mask].min()),
            }
        )
        for mu in GRID:
            keep, _ = clip_b(s_star, adv, mask, mu=mu)
            clipped["clip_b"][mu] += int((~keep & neg).sum())
            keep, _ = clip_v(s_c, adv, mask, mu=mu, max_frac=MAX_FRAC)
            clipped["clip_v"][mu] += int((~keep & neg).sum())
    share = {m: {mu: c / max(negative, 1) for mu, c in d.items()} for m, d in clipped.items()}
    chosen = {m: min(mu for mu, f in d.items() if f <= TARGET) for m, d in share.items()}
    return {"steps": stats, "negative_tokens": negative, "share_clipped": share, "chosen_mu": chosen}


def rescore(directory: Path) -> dict:
    from entropy_rft.tasks.math import judge

    out = {}
    for path in sorted(directory.glob("*.jsonl")):
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        verdicts = [[judge(r_, True, row["answer"], verifier="numeral") for r_ in row["responses"]] for row in rows]
        samples = sum(len(v) for v in verdicts)
        out[path.stem] = {
            "problems": len(rows),
            "samples": samples,
            "avg": sum(x.correct for v in verdicts for x in v) / samples,
            "pass": sum(any(x.correct for x in v) for v in verdicts) / len(rows),
            "right_on_an_answer_line": sum(x.correct and x.stated is not None for v in verdicts for x in v),
        }
    return out


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("mu", "rescore"):
        raise SystemExit(__doc__)
    if sys.argv[1] == "rescore":
        print(json.dumps(rescore(Path(sys.argv[2])), indent=1))
    else:
        result = main(Path(sys.argv[2]))
        for m, d in result["share_clipped"].items():
            print(m, " ".join(f"{mu}:{100 * f:.1f}%" for mu, f in d.items()))
        print(json.dumps({"negative_tokens": result["negative_tokens"], "chosen_mu": result["chosen_mu"]}))
