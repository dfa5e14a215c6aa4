"""The golden runs: 3 seeded CPU steps of each method and entropy control, their metrics and final weights.

The characterisation behind the training step's restructuring (issue "One step, one owner"): every case's
metrics.jsonl (timings aside), eval.json and the SHA-256 of its final weights are recorded in
tests/fixtures/golden_steps.json, and tests/test_golden.py asserts them bit for bit. A commit that changes a
recorded value on purpose rewrites the fixture and says which values moved and why:

    python tests/golden.py --write [CASE ...]

The values are bit-exact on one platform only (summation orders differ between BLAS builds, CPU kernels and
thread counts), so the fixture records its platform and the test runs where the platform matches."""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

import torch

FIXTURE = Path(__file__).parent / "fixtures" / "golden_steps.json"

BASE = dict(steps=3, prompts_per_step=8, group_size=4, max_new_tokens=16, lr=1e-4, eval_problems=4, eval_k=2,
            progress=False, probe_every=2, samples_every=2)
CASES: dict[str, dict] = {
    "grpo": {},
    "clip_b": {"method": "clip_b", "mu": 1.0},
    "clip_v": {"method": "clip_v", "mu": 1.0, "max_frac": 0.05},
    "gspo": {"method": "gspo"},
    "kl_cov": {"method": "kl_cov"},
    "ppo": {"method": "ppo"},
    "lopti": {"method": "lopti"},
    "dapo": {"method": "dapo"},
    "control_mu": {"method": "clip_b", "entropy_target": 0.5, "entropy_control": "mu"},
    "control_bonus": {"entropy_target": 0.5, "entropy_control": "bonus"},
    "control_pi": {"entropy_target": 0.5, "entropy_control": "pi"},
    # the shapes that take the other paths through the step: micro-batches, two optimizer steps per update,
    # a reference KL term, the seq-mean aggregations
    "grpo_micro4_mini2": {"micro_batch_size": 4, "mini_batches": 2},
    "clip_b_kl_ref": {"method": "clip_b", "mu": 1.0, "kl_coef": 0.01},
    "dr_grpo": {"method": "dr_grpo"},
}
UNTIMED = ("seconds", "time/")


def platform() -> dict:
    """What the bit-exact values depend on besides the code."""
    return {"torch": torch.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "threads": torch.get_num_threads(), "python": sys.version.split()[0]}


def weights_digest(checkpoint: Path) -> str:
    """SHA-256 over every tensor of the checkpoint's weights (and value head), in key order."""
    from safetensors.torch import load_file

    digest = hashlib.sha256()
    tensors = load_file(checkpoint / "model.safetensors")
    if (checkpoint / "value_head.pt").exists():
        tensors.update({f"value_head.{k}": v for k, v in torch.load(checkpoint / "value_head.pt").items()})
    for key in sorted(tensors):
        digest.update(key.encode())
        digest.update(tensors[key].contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def run_case(name: str, out: Path) -> dict:
    """One golden case, run in `out`: its metrics lines (timings dropped), evaluations and weights' digest."""
    from entropy_rft.config import load_config
    from entropy_rft.logging import read_metrics
    from entropy_rft.trainer import train

    cfg = load_config(None, **{**BASE, **CASES[name], "out": str(out / name)})
    summary = train(cfg)
    metrics = [{k: v for k, v in row.items() if not k.startswith(UNTIMED)} for row in read_metrics(cfg.out)]
    return {"metrics": metrics, "evals": json.loads((out / name / "eval.json").read_text()),
            "weights": weights_digest(Path(summary["checkpoint"]))}


def main(argv=None) -> None:
    import tempfile

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="record the cases' values in the fixture")
    parser.add_argument("cases", nargs="*", default=list(CASES))
    args = parser.parse_args(argv)
    if not args.write:
        parser.error("pass --write to record values (tests/test_golden.py checks them)")
    record = json.loads(FIXTURE.read_text()) if FIXTURE.exists() else {"cases": {}}
    if record.get("platform") not in (None, platform()) and set(args.cases) != set(CASES):
        sys.exit(f"the fixture was recorded on {record['platform']}; this is {platform()}: rewrite every case")
    record["platform"] = platform()
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.cases:
            record["cases"][name] = run_case(name, Path(tmp))
            print(f"{name}: weights {record['cases'][name]['weights'][:12]}")
    record["cases"] = {k: record["cases"][k] for k in CASES if k in record["cases"]}
    FIXTURE.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
