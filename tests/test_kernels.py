"""The Triton kernels of entropy_rft.core.kernels against token_stats on materialised logits.

On a machine with a GPU and Triton the kernels run on CUDA tensors; on a CPU machine with Triton installed they run
in Triton's interpreter (TRITON_INTERPRET=1, set before Triton is imported, so in a subprocess). Without Triton the
module is skipped: the main environment's CPU torch does not bring Triton (`pip install triton` to run these).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

pytest.importorskip("triton")

CHECK = r"""
import json, torch
from entropy_rft.core.dynamics import token_stats, token_stats_from_hidden
torch.manual_seed(0)
dev = "cuda" if torch.cuda.is_available() else "cpu"
out = {}
# odd sizes: a partial last row chunk and a partial last vocabulary tile, the target in every tile
for n, d, v, t, vc, rc in [(37, 24, 203, 1.0, 64, 16), (29, 16, 150, 0.7, 50, 29), (8, 8, 33, 1.3, 40, 4)]:
    h = torch.randn(n, d, dtype=torch.float64, device=dev) * 2
    w = torch.randn(v, d, dtype=torch.float64, device=dev)
    tok = torch.randint(0, v, (n,), device=dev)
    tok[:3] = torch.tensor([0, v - 1, min(vc, v - 2)], device=dev)  # first, last, first of the second tile
    gl, gh = torch.randn(n, dtype=torch.float64, device=dev), torch.randn(n, dtype=torch.float64, device=dev)
    hr, wr = h.clone().requires_grad_(), w.clone().requires_grad_()
    ref = token_stats(hr @ wr.T, tok, temperature=t)
    ((ref.logp * gl).sum() + (ref.entropy * gh).sum()).backward()
    h32, w32 = h.float().requires_grad_(), w.float().requires_grad_()
    got = token_stats_from_hidden(h32, w32, tok, temperature=t, vocab_chunk=vc, row_chunk=rc, use_triton=True)
    ((got.logp * gl.float()).sum() + (got.entropy * gh.float()).sum()).backward()
    fields = ("logp", "entropy", "s_star", "s_expect")
    err = {k: (getattr(got, k).double() - getattr(ref, k)).abs().max().item() for k in fields}
    err["grad_h"] = ((h32.grad.double() - hr.grad).abs().max() / hr.grad.abs().max()).item()
    err["grad_w"] = ((w32.grad.double() - wr.grad).abs().max() / wr.grad.abs().max()).item()
    out[f"{n}x{v}"] = err
print(json.dumps(out))
"""


def test_triton_kernels_match_token_stats_and_autograd():
    """The four statistics of the Triton path equal token_stats on the materialised logits (float64 reference), and
    the gradients of a random combination of log p and H equal autograd through the logits, with partial row and
    vocabulary tiles, targets at tile edges and temperatures != 1."""
    env = dict(os.environ)
    if not torch.cuda.is_available():
        env["TRITON_INTERPRET"] = "1"
    done = subprocess.run([sys.executable, "-c", CHECK], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    errors = json.loads(done.stdout.strip().splitlines()[-1])
    for case, err in errors.items():
        for key, value in err.items():
            assert value < 1e-4, (case, key, value)
