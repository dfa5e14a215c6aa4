"""The golden runs: 3 seeded CPU steps of each method and entropy control, their metrics and final weights.

The characterisation behind the training step's restructuring (issue "One step, one owner"): every case's
metrics.jsonl (timings aside), eval.json and the SHA-256 of its final weights are recorded in
tests/fixtures/golden_steps.json, and tests/test_golden.py asserts them bit for bit. A commit that changes a
recorded value on purpose rewrites the fixture and says which values moved and why:

    python tests/golden.py --write [CASE ...]

The values are bit-exact on one platform only (summation orders differ between BLAS builds, CPU kernels, CPU
microarchitectures and thread counts), so the fixture records its platform; tests/test_golden.py compares every
case everywhere within bounds derived from float32 arithmetic, and bit for bit where the platform matches. Besides
the digest it records a count sketch of the final weights (SKETCH buckets) and how far training moved them,
for the bounded comparison."""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

import torch

FIXTURE = Path(__file__).parent / "fixtures" / "golden_steps.json"

BASE = dict(
    steps=3,
    prompts_per_step=8,
    group_size=4,
    max_new_tokens=16,
    lr=1e-4,
    eval_problems=4,
    eval_k=2,
    progress=False,
    probe_every=2,
    samples_every=2,
)
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


SKETCH = 256  # buckets of the count sketch of the final weights recorded for the bounded comparison
POLICY_WEIGHTS = Path(__file__).parents[1] / "entropy_rft" / "assets" / "countdown-tiny" / "model.safetensors"


def cpu_model() -> str:
    """The CPU's microarchitecture as the kernel reports it (vendor, family, model, stepping and model name; a
    generic model name such as "AMD EPYC" covers several generations whose float32 kernels round differently)."""
    fields = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key in ("vendor_id", "cpu family", "model", "stepping", "model name") and key not in fields:
                fields[key] = value.strip()
    except OSError:
        import platform as _platform

        return _platform.processor() or _platform.machine()
    return " / ".join(fields.get(k, "?") for k in ("vendor_id", "cpu family", "model", "stepping", "model name"))


def platform() -> dict:
    """What the bit-exact values depend on besides the code."""
    return {
        "torch": torch.__version__,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "threads": torch.get_num_threads(),
        "python": sys.version.split()[0],
        "cpu": cpu_model(),
    }


def _weights(checkpoint: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    tensors = load_file(checkpoint / "model.safetensors")
    if (checkpoint / "value_head.pt").exists():
        tensors.update({f"value_head.{k}": v for k, v in torch.load(checkpoint / "value_head.pt").items()})
    return tensors


def weights_sketch(tensors: dict[str, torch.Tensor]) -> list[float]:
    """A count sketch of the weights w flattened in key order: flat position i adds s(i) w_i to bucket b(i), with
    the bucket b in [0, SKETCH) and the sign s = +-1 taken from an integer hash of i (the same on every platform, no
    random number generator). For any x, |sketch(x)| estimates |x| (E |sketch(x)|^2 = |x|^2, relative spread of the
    square at most sqrt(2 / SKETCH)), and the sketch is linear, so the distance between two platforms' final
    weights is the distance between their sketches."""
    flat = torch.cat([tensors[k].reshape(-1).double() for k in sorted(tensors)])
    h = torch.arange(flat.numel(), dtype=torch.int64) * 0x5851F42D4C957F2D + 0x14057B7EF767814F  # wraps mod 2^64
    h = (h ^ (h >> 29)) * 0x2545F4914F6CDD1D
    bucket = (h >> 33) % SKETCH
    sign = 1.0 - 2.0 * ((h >> 17) & 1).to(torch.float64)
    return torch.zeros(SKETCH, dtype=torch.float64).scatter_add_(0, bucket, sign * flat).tolist()


def weights_move(tensors: dict[str, torch.Tensor]) -> float:
    """|w - w_0|: how far training moved the weights from the shipped policy's (a value head starts at 0)."""
    from safetensors.torch import load_file

    start = load_file(POLICY_WEIGHTS)
    return (
        sum(
            float(((v.double() - start[k].double() if k in start else v.double()) ** 2).sum())
            for k, v in tensors.items()
        )
        ** 0.5
    )


def weights_digest(checkpoint: Path) -> str:
    """SHA-256 over every tensor of the checkpoint's weights (and value head), in key order."""
    digest = hashlib.sha256()
    tensors = _weights(checkpoint)
    for key in sorted(tensors):
        digest.update(key.encode())
        digest.update(tensors[key].contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def run_case(name: str, out: Path) -> dict:
    """One golden case, run in `out`: its metrics lines (timings dropped), evaluations and weights' digest."""
    from entropy_rft.config import load_config
    from entropy_rft.logging import read_metrics
    from entropy_rft.train.trainer import train

    cfg = load_config(None, **{**BASE, **CASES[name], "out": str(out / name)})
    summary = train(cfg)
    metrics = [{k: v for k, v in row.items() if not k.startswith(UNTIMED)} for row in read_metrics(cfg.out)]
    checkpoint = Path(summary["checkpoint"])
    tensors = _weights(checkpoint)
    return {
        "metrics": metrics,
        "evals": json.loads((out / name / "eval.json").read_text()),
        "weights": weights_digest(checkpoint),
        "weights_sketch": weights_sketch(tensors),
        "weights_move": weights_move(tensors),
    }


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
