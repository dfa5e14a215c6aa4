"""Triton kernels for the token statistics streamed from hidden states (the GPU path of
`dynamics.token_stats_from_hidden`).

The design is the one the CPU path follows, with the per-tile arithmetic fused: cuBLAS writes one
[rows, vocab_chunk] tile of logits h @ W_chunk^T (in the matmul's dtype, bf16 under autocast) into a buffer that is
reused for every tile; one Triton program per row then reads its tile row once and folds it into that row's online
accumulators, all fp32, relative to the running maximum m:

    Z = sum_i e_i,  A = sum_i e_i d_i,  Q = sum_i e_i^2,  B = sum_i e_i^2 d_i,   e_i = exp(d_i), d_i = z_i / T - m

from which log p_k, H = log Z - A / Z, S* = p_k (H + log p_k) and E_p[S] = (B - (A / Z) Q) / Z^2 follow (the same
identities as `dynamics._stream_rows`). The backward pass recomputes each tile, a second kernel turns it in place
into dL/dz = g_logp ([i = k] - p_i) - g_H p_i (z_i - zbar) (divided by T), and two GEMMs accumulate dL/dh (fp32)
and dL/dW (fp32). No [N, V] tensor exists in either direction.

Triton is imported lazily: `available(tensor)` says whether this path can run (a CUDA tensor and an importable
Triton). With TRITON_INTERPRET=1 set before import, the kernels run in Triton's interpreter on CPU tensors, which
is how tests/test_kernels.py checks them on a machine without a GPU.

Departures:
1. The running maximum starts at -1e30 rather than -inf, so the first merge (weight exp(-1e30 - m) = 0) needs no
   special case; a row whose logits are all below -1e30 is not representable in fp32 logits anyway.
"""

from __future__ import annotations

import functools
import os

import torch
from torch import Tensor

_NEG = -1.0e30
GPU_ROW_CHUNK = 8192
GPU_VOCAB_CHUNK = 8192


def accumulator_stats(m: Tensor, big_z: Tensor, a: Tensor, q: Tensor, b: Tensor, zk: Tensor) -> tuple[Tensor, ...]:
    """(log p_k, H, S*, E_p[S], log Z + m, zbar) from the online accumulators relative to the running max m:
    Z = sum e_i, A = sum e_i d_i, Q = sum e_i^2, B = sum e_i^2 d_i (e_i = exp(d_i), d_i = z_i - m) and z_k."""
    c = a / big_z  # zbar - m
    log_z = big_z.log()
    logp = zk - m - log_z
    return logp, log_z - c, logp.exp() * (zk - m - c), (b - c * q) / (big_z * big_z), m + log_z, m + c


@functools.cache
def _triton():
    """The Triton module and the two kernels, or None where Triton is not importable."""
    try:
        import triton
        import triton.language as tl
    except ImportError:
        return None
    return triton, _fold_tile_kernel(triton, tl), _tile_grad_kernel(triton, tl)


def _fold_tile_kernel(triton, tl):
    """fold_tile: one vocabulary tile folded into each row's running statistics (m, Z, A, Q, B) and the sampled
    token's logit."""

    @triton.jit
    def fold_tile(
        tile_ptr,
        stride,
        tokens_ptr,
        m_ptr,
        z_ptr,
        a_ptr,
        q_ptr,
        b_ptr,
        zk_ptr,
        v0,
        inv_t,
        n_cols: tl.constexpr,  # type: ignore[name-defined]  # Triton's annotation, read by its JIT
        BLOCK: tl.constexpr,  # type: ignore[name-defined]  # Triton's annotation, read by its JIT
    ):
        row = tl.program_id(0)
        base = tile_ptr + row.to(tl.int64) * stride
        m = tl.load(m_ptr + row)
        big_z = tl.load(z_ptr + row)
        a = tl.load(a_ptr + row)
        q = tl.load(q_ptr + row)
        b = tl.load(b_ptr + row)
        for start in range(0, n_cols, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            valid = cols < n_cols
            x = tl.load(base + cols, mask=valid, other=float("-inf")).to(tl.float32) * inv_t
            new_m = tl.maximum(m, tl.max(x, axis=0))
            d = tl.where(valid, x - new_m, 0.0)
            e = tl.where(valid, tl.exp(d), 0.0)
            e2 = e * e
            shift = m - new_m
            al = tl.exp(shift)
            # moving the reference from m to new_m: e -> al e, d -> d + shift
            a = al * (a + shift * big_z) + tl.sum(e * d, axis=0)
            b = al * al * (b + shift * q) + tl.sum(e2 * d, axis=0)
            big_z = al * big_z + tl.sum(e, axis=0)
            q = al * al * q + tl.sum(e2, axis=0)
            m = new_m
        tl.store(m_ptr + row, m)
        tl.store(z_ptr + row, big_z)
        tl.store(a_ptr + row, a)
        tl.store(q_ptr + row, q)
        tl.store(b_ptr + row, b)
        tok = tl.load(tokens_ptr + row)
        in_tile = (tok >= v0) & (tok < v0 + n_cols)
        picked = tl.load(base + tl.where(in_tile, tok - v0, 0)).to(tl.float32) * inv_t
        tl.store(zk_ptr + row, tl.where(in_tile, picked, tl.load(zk_ptr + row)))

    return fold_tile


def _tile_grad_kernel(triton, tl):
    """tile_grad: the logits' gradient of one vocabulary tile, written over the tile."""

    @triton.jit
    def tile_grad(
        tile_ptr,
        stride,
        tokens_ptr,
        lse_ptr,
        zbar_ptr,
        g_logp_ptr,
        g_h_ptr,
        v0,
        inv_t,
        n_cols: tl.constexpr,  # type: ignore[name-defined]  # Triton's annotation, read by its JIT
        BLOCK: tl.constexpr,  # type: ignore[name-defined]  # Triton's annotation, read by its JIT
    ):
        row = tl.program_id(0)
        base = tile_ptr + row.to(tl.int64) * stride
        lse = tl.load(lse_ptr + row)
        zbar = tl.load(zbar_ptr + row)
        g_logp = tl.load(g_logp_ptr + row)
        g_h = tl.load(g_h_ptr + row)
        target = tl.load(tokens_ptr + row) - v0
        for start in range(0, n_cols, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            valid = cols < n_cols
            x = tl.load(base + cols, mask=valid, other=0.0).to(tl.float32) * inv_t
            p = tl.exp(x - lse)
            dz = tl.where(cols == target, g_logp, 0.0) - p * (g_logp + g_h * (x - zbar))
            tl.store(base + cols, (dz * inv_t).to(tile_ptr.dtype.element_ty), mask=valid)

    return tile_grad


def interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def available(tensor: Tensor) -> bool:
    """Whether the Triton path can run on this tensor: CUDA (or Triton's CPU interpreter) and Triton importable."""
    return (tensor.is_cuda or interpreted()) and _triton() is not None


def _block(n_cols: int) -> int:
    return 64 if interpreted() else min(4096, 1 << max(n_cols - 1, 1).bit_length())


def _matmul_dtype(hidden: Tensor) -> torch.dtype:
    kind = hidden.device.type
    return torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else hidden.dtype


class TritonTokenStats(torch.autograd.Function):
    """(log p, H, S*, E_p[S]) of hidden @ weight.T / T; log p and H differentiable in hidden and weight."""

    @staticmethod
    def forward(ctx, hidden, weight, tokens, temperature, v_chunk, r_chunk):
        _, fold_tile, _ = _triton()
        n, vocab = hidden.shape[0], weight.shape[0]
        dtype = _matmul_dtype(hidden)
        f32 = dict(dtype=torch.float32, device=hidden.device)
        m = torch.full((n,), _NEG, **f32)
        big_z, a, q, b, zk = (torch.zeros(n, **f32) for _ in range(5))
        tokens = tokens.contiguous()
        buf = torch.empty(min(n, r_chunk), min(vocab, v_chunk), dtype=dtype, device=hidden.device)
        inv_t = 1.0 / temperature
        for r0 in range(0, n, r_chunk):
            h = hidden[r0 : r0 + r_chunk].to(dtype)
            rows = h.shape[0]
            for v0 in range(0, vocab, v_chunk):
                w = weight[v0 : v0 + v_chunk].to(dtype)
                tile = buf[:rows, : w.shape[0]]
                torch.mm(h, w.t(), out=tile)
                rs = slice(r0, r0 + rows)
                fold_tile[(rows,)](
                    tile,
                    tile.stride(0),
                    tokens[rs],
                    m[rs],
                    big_z[rs],
                    a[rs],
                    q[rs],
                    b[rs],
                    zk[rs],
                    v0,
                    inv_t,
                    n_cols=w.shape[0],
                    BLOCK=_block(w.shape[0]),
                )
        logp, entropy, s_star, s_expect, lse, zbar = accumulator_stats(m, big_z, a, q, b, zk)
        ctx.save_for_backward(hidden, weight, tokens, lse, zbar)
        ctx.temperature, ctx.v_chunk, ctx.r_chunk, ctx.dtype = temperature, v_chunk, r_chunk, dtype
        ctx.mark_non_differentiable(s_star, s_expect)
        return logp, entropy, s_star, s_expect

    @staticmethod
    def backward(ctx, g_logp, g_entropy, _g_s_star, _g_s_expect):
        _, _, tile_grad = _triton()
        hidden, weight, tokens, lse, zbar = ctx.saved_tensors
        dtype, v_chunk, r_chunk = ctx.dtype, ctx.v_chunk, ctx.r_chunk
        g_logp = torch.zeros_like(lse) if g_logp is None else g_logp.float().contiguous()
        g_entropy = torch.zeros_like(lse) if g_entropy is None else g_entropy.float().contiguous()
        want_h, want_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        n, vocab = hidden.shape[0], weight.shape[0]
        grad_h = torch.zeros(hidden.shape, dtype=torch.float32, device=hidden.device) if want_h else None
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if want_w else None
        buf = torch.empty(min(n, r_chunk), min(vocab, v_chunk), dtype=dtype, device=hidden.device)
        inv_t = 1.0 / ctx.temperature
        for r0 in range(0, n, r_chunk):
            h = hidden[r0 : r0 + r_chunk].to(dtype)
            rows = h.shape[0]
            rs = slice(r0, r0 + rows)
            for v0 in range(0, vocab, v_chunk):
                w = weight[v0 : v0 + v_chunk].to(dtype)
                tile = buf[:rows, : w.shape[0]]
                torch.mm(h, w.t(), out=tile)
                tile_grad[(rows,)](
                    tile,
                    tile.stride(0),
                    tokens[rs],
                    lse[rs],
                    zbar[rs],
                    g_logp[rs],
                    g_entropy[rs],
                    v0,
                    inv_t,
                    n_cols=w.shape[0],
                    BLOCK=_block(w.shape[0]),
                )
                if grad_h is not None:
                    grad_h[rs] += (tile @ w).float()
                if grad_w is not None:
                    grad_w[v0 : v0 + w.shape[0]] += (tile.t() @ h).float()
        return (
            None if grad_h is None else grad_h.to(hidden.dtype),
            None if grad_w is None else grad_w.to(weight.dtype),
            None,
            None,
            None,
            None,
        )
