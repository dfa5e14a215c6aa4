"""Token statistics from hidden states: streaming (token_stats_from_hidden) against materialised logits.

Three ways to get per-token statistics from last hidden states h [N, D] and an LM head W [V, D]:
  fused     token_stats_from_hidden: log p, H, S*, E_p[S] streamed over vocabulary tiles, no [N, V] tensor
  naive     logits = h @ W.T, then softmax / log_softmax / p^2 as full [N, V] tensors (all four statistics)
  logp      logits = h @ W.T, then gather - logsumexp (log p only: what a plain GRPO step needs)
Each (method, dtype) runs in a fresh subprocess; the script prints the median wall time over --repeats calls
and the peak resident memory above the inputs (Linux VmHWM, reset before the timed calls), then the fused/logp
time ratio. Target (issue 2): fused <= 1.3x logp, and fused memory that does not grow with V beyond one tile.

    python benchmarks/token_stats.py                 # N=2048, D=896, V=151936, fp32 and bf16
    python benchmarks/token_stats.py --vocab 32768   # quicker
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time


def _rss_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1])
    return 0


def _reset_peak() -> None:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def worker(
    method: str, dtype_name: str, n: int, d: int, v: int, repeats: int, vocab_chunk: int, row_chunk: int
) -> dict:
    import torch

    from entropy_rft.core.dynamics import token_stats_from_hidden

    torch.manual_seed(0)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype_name]
    h = (torch.randn(n, d) * 0.5).to(dtype)
    w = (torch.randn(v, d) / d**0.5 * 4).to(dtype)
    t = torch.randint(0, v, (n,))

    def fused():
        with torch.no_grad():
            s = token_stats_from_hidden(h, w, t, vocab_chunk=vocab_chunk, row_chunk=row_chunk)
        return s.logp

    def naive():
        with torch.no_grad():
            z = (h @ w.T).float()
            logp_all = torch.log_softmax(z, -1)
            p = logp_all.exp()
            ent = -(p * logp_all).sum(-1)
            s_all = p * (ent.unsqueeze(-1) + logp_all)
            s_expect = (p * s_all).sum(-1)
            lp = logp_all.gather(-1, t.unsqueeze(-1)).squeeze(-1)
            return lp, ent, s_all.gather(-1, t.unsqueeze(-1)).squeeze(-1), s_expect

    def logp_only():
        with torch.no_grad():
            z = (h @ w.T).float()
            return z.gather(-1, t.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(z, -1)

    fn = {"fused": fused, "naive": naive, "logp": logp_only}[method]
    fn()  # warm-up
    base = _rss_kib("VmRSS")
    _reset_peak()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    peak = _rss_kib("VmHWM")
    return {
        "method": method,
        "dtype": dtype_name,
        "median_s": statistics.median(times),
        "peak_mib": max(peak - base, 0) / 1024,
        "threads": torch.get_num_threads(),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--hidden", type=int, default=896)
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--vocab-chunk", type=int, default=2048)
    ap.add_argument("--row-chunk", type=int, default=512)
    ap.add_argument("--dtypes", default="fp32,bf16")
    ap.add_argument("--methods", default="logp,fused,naive")
    ap.add_argument("--worker", nargs=8, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        m, dt, n, d, v, r, c, rc = args.worker
        print(json.dumps(worker(m, dt, int(n), int(d), int(v), int(r), int(c), int(rc))))
        return
    print(
        f"N={args.tokens} D={args.hidden} V={args.vocab} repeats={args.repeats} "
        f"tile={args.row_chunk} rows x {args.vocab_chunk} vocabulary entries"
    )
    print(f"{'dtype':6} {'method':6} {'median s':>9} {'peak MiB':>9}")
    for dt in args.dtypes.split(","):
        res = {}
        for m in args.methods.split(","):
            cmd = [
                sys.executable,
                __file__,
                "--worker",
                m,
                dt,
                str(args.tokens),
                str(args.hidden),
                str(args.vocab),
                str(args.repeats),
                str(args.vocab_chunk),
                str(args.row_chunk),
            ]
            out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]
            res[m] = json.loads(out)
            print(f"{dt:6} {m:6} {res[m]['median_s']:9.3f} {res[m]['peak_mib']:9.1f}", flush=True)
        if "fused" in res and "logp" in res:
            ratio = res["fused"]["median_s"] / res["logp"]["median_s"]
            print(
                f"{dt:6} fused / logp time = {ratio:.2f}x (target <= 1.3x); fused peak "
                f"{res['fused']['peak_mib']:.0f} MiB vs logp {res['logp']['peak_mib']:.0f} MiB",
                flush=True,
            )


if __name__ == "__main__":
    main()
