"""A hand-written decode step for the Llama family (Qwen2, Qwen3, Llama, Mistral), used by the sampling loop of
rollout/sampling.py: on the CPU with finished rows leaving the batch (HandSteps), on CUDA at fixed shapes so that
one CUDA graph replays the whole step (FixedSteps over the pure `fixed_logits`: every buffer allocated once per
rollout, the column and the positions index tensors, nothing read back to the host), compiled whole by
torch.compile there (sampling.py departure 3).

Why: decoding one token runs the whole model on a [rows, 1] input. At the demo's sizes most of that time is not the
matmuls but the machinery around them: transformers rebuilds the attention mask and the rotary cos/sin on every
call, grows its cache by concatenation and dispatches through module wrappers and hooks. This step reads the
model's own weights and does only the arithmetic: keys and values go into buffers allocated once, cos/sin come
from a table computed once per rollout, the padding mask is a boolean column per row, and attention is two
batched matmuls (at these shapes the CPU's fused attention kernel costs more than it saves). Measured on the demo's
rollouts (32 prompts x 8 samples, 16 new tokens, 2-core CPU): 0.86x the rollout time of decoding through the
model's forward, with the same tokens sampled (benchmarks/decode_ab.py).

The arithmetic is the modules', op for op: RMSNorm in float32 (x * rsqrt(mean(x^2) + eps), weight applied in the
model's dtype), Qwen3's per-head q/k norms, rotary embedding q cos + rotate_half(q) sin with cos/sin from the
module's inv_freq and attention_scaling, attention softmax(q k^T * scaling) v over the cached keys with the left
padding masked, as transformers' eager attention computes it (softmax in float32; GQA as its sdpa path does it for
one query: the query heads of a key/value head act as its queries), and the gated MLP down(silu(gate(h)) * up(h)).
tests/test_decode.py samples with this step and through the model's forward for each family (biases, GQA, left
padding, a llama3 rope, bfloat16) and checks the same tokens come out and every sampled log-prob equals a full
forward's.

Attention at fixed shapes reads every column of the preallocated cache, the unwritten ones hidden (-inf before the
softmax), not only the filled part: one graph per rollout shape. The cost, for the Qwen2.5-0.5B shape in bf16
(24 layers, 2 key/value heads of 64) with 128 prompt and 256 new columns: keys and values are 12,288 bytes per row
and column, so a step reads 151 MB of cache at 32 rows and 1.21 GB at 256 rows, against a mean filled part of
101 MB and 805 MB; a Qwen3-4B cache is 1.13 GB a row at 7,680 columns, all of it read from an RL response's first
token. So on CUDA (FixedSteps' `block`, sampling.LENGTH_BLOCK) attention reads length buckets: the prompt and the
response so far rounded up to a multiple of the block, as views of the buffers whose column dimension is marked
dynamic, so one compiled graph serves every bucket, each bucket captured in its own CUDA graph when the rollout
reaches it. The bound is the step's, not each row's: a fixed-shape rollout's rows all advance one column a step,
and a finished row is still attended until the rollout ends (a per-row ragged kernel, FlashAttention's kv-cache
kernel or FlexAttention's block mask, would skip those too; not checkable here against the module's arithmetic).
The fused projections (`fuse`: QKV in one GEMM, gate/up in one) are the other CUDA default of this file.

Only a model this file can read exactly is decoded here; anything else returns a reason from `unsupported` and
the loop uses the model's forward: an architecture outside the family, a wrapped or replaced module (a PEFT LoRA
layer, a patched kernel), a rope whose frequencies change with the length (dynamic, longrope), an activation other
than SiLU, or a sequence longer than a sliding attention window. (sampling.sample runs the model in eval mode, so
no dropout applies.)
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

FAMILY = {  # model class -> the class names of its decoder parts that this file mirrors
    "Qwen2ForCausalLM": ("Qwen2RMSNorm", "Qwen2Attention", "Qwen2MLP", "Qwen2RotaryEmbedding"),
    "Qwen3ForCausalLM": ("Qwen3RMSNorm", "Qwen3Attention", "Qwen3MLP", "Qwen3RotaryEmbedding"),
    "LlamaForCausalLM": ("LlamaRMSNorm", "LlamaAttention", "LlamaMLP", "LlamaRotaryEmbedding"),
    "MistralForCausalLM": ("MistralRMSNorm", "MistralAttention", "MistralMLP", "MistralRotaryEmbedding"),
}
STATIC_ROPE = ("default", "linear", "llama3", "yarn")  # inv_freq fixed at init; dynamic and longrope rescale it


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """The family's RMSNorm: normalised in float32, scaled by the weight in the input's dtype."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x cos + rotate_half(x) sin, rotate_half(x) = (-x2, x1) for x = (x1, x2) halves of the head dimension."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def _is_linear(module) -> bool:
    return type(module) is torch.nn.Linear  # a LoRA layer or a quantised linear is a subclass or another type


def unsupported(model) -> str | None:
    """Why this file cannot decode `model` exactly, or None when it can."""
    name = type(model).__name__
    if name not in FAMILY:
        return f"{name} is not one of {', '.join(FAMILY)}"
    norm_cls, attn_cls, mlp_cls, rope_cls = FAMILY[name]
    base = getattr(model, "model", None)
    if base is None or type(getattr(base, "embed_tokens", None)) is not torch.nn.Embedding:
        return "the model has no plain embedding at model.embed_tokens"
    if not _is_linear(model.lm_head) or type(base.norm).__name__ != norm_cls:
        return "the LM head or the final norm is not the family's own"
    rope = base.rotary_emb
    if type(rope).__name__ != rope_cls or getattr(rope, "rope_type", "default") not in STATIC_ROPE:
        return f"rotary embedding {type(rope).__name__} ({getattr(rope, 'rope_type', '?')}) changes with the length"
    if getattr(model.config, "hidden_act", None) != "silu":
        return f"activation {getattr(model.config, 'hidden_act', None)!r} is not silu"
    for i, layer in enumerate(base.layers):
        attn, mlp = layer.self_attn, layer.mlp
        parts = [
            type(attn).__name__ == attn_cls,
            type(mlp).__name__ == mlp_cls,
            type(layer.input_layernorm).__name__ == norm_cls,
            type(layer.post_attention_layernorm).__name__ == norm_cls,
            all(_is_linear(getattr(attn, p)) for p in ("q_proj", "k_proj", "v_proj", "o_proj")),
            all(_is_linear(getattr(mlp, p)) for p in ("gate_proj", "up_proj", "down_proj")),
        ]
        if not all(parts):
            return f"layer {i} has a module this file does not mirror (a LoRA or patched layer?)"
        for extra in ("q_norm", "k_norm"):
            if hasattr(attn, extra) and type(getattr(attn, extra)).__name__ != norm_cls:
                return f"layer {i}'s {extra} is not the family's RMSNorm"
    for module in model.modules():
        if "forward" in vars(module):
            return f"{type(module).__name__}.forward is replaced on the instance"
    return None


class Layer(NamedTuple):
    """One decoder layer's tensors as the step reads them (biases and Qwen3's q/k norms None where absent)."""

    ln1: Tensor
    eps1: float
    q: Tensor
    q_bias: Tensor | None
    k: Tensor
    k_bias: Tensor | None
    v: Tensor
    v_bias: Tensor | None
    o: Tensor
    o_bias: Tensor | None
    q_norm: Tensor | None
    q_eps: float
    k_norm: Tensor | None
    k_eps: float
    ln2: Tensor
    eps2: float
    gate: Tensor
    gate_bias: Tensor | None
    up: Tensor
    up_bias: Tensor | None
    down: Tensor
    down_bias: Tensor | None
    # a fused layer (`fuse`): q, k, v (and biases) joined row-wise into one projection, gate and up into another;
    # the parts above are None then
    qkv: Tensor | None = None
    qkv_bias: Tensor | None = None
    gate_up: Tensor | None = None
    gate_up_bias: Tensor | None = None


FUSED = {"qkv": ("q", "k", "v"), "qkv_bias": ("q_bias", "k_bias", "v_bias"), "gate_up": ("gate", "up")}
FUSED["gate_up_bias"] = ("gate_bias", "up_bias")
JOINED = {part for parts in FUSED.values() for part in parts}  # the fields a fused layer holds None in


class Weights(NamedTuple):
    """Every tensor the step reads: the model's parameters themselves (so an in-place update is seen), or copies
    in another dtype made once per rollout (bfloat16 generation)."""

    embed: Tensor
    layers: list[Layer]
    norm: Tensor
    norm_eps: float
    head: Tensor
    head_bias: Tensor | None


def fuse(params: Weights, dtype: torch.dtype | None = None, out: Weights | None = None) -> Weights:
    """params (the model's parameters, HandDecoder.weights()) with each layer's q, k and v projections joined into one
    (qkv: q's rows, then k's, then v's; their biases alike) and gate and up into one (gate_up), copies in dtype (None:
    the parameters' own); every other tensor is cast as HandDecoder.weights casts it (a copy where the dtype differs,
    a tied one copied once, else the parameter itself). out: an earlier result for these parameters, overwritten in
    place (copy_ into each joined tensor's row blocks) and returned, so a step compiled or captured on it reads the
    new values at the same addresses. Saves 3 of a layer's 7 projection GEMMs a decode step (gpt-fast, vLLM and
    SGLang fuse the same two); costs a copy of those weights where the decode reads the parameters themselves."""
    dtype = dtype or params.embed.dtype
    if out is not None:
        _refresh(out, params)
        return out
    copies: dict[int, Tensor] = {}

    def cast(t):
        if not isinstance(t, Tensor) or t.dtype == dtype:
            return t
        if id(t) not in copies:
            copies[id(t)] = t.to(dtype)
        return copies[id(t)]

    def join(parts: list[Tensor | None]) -> Tensor | None:
        if all(p is None for p in parts):
            return None
        if any(p is None for p in parts):
            raise ValueError("a fused projection needs a bias on every part or on none")
        return torch.cat([p.to(dtype) for p in parts if p is not None])

    layers = []
    for lp in params.layers:
        fields = {k: None if k in JOINED else cast(v) for k, v in lp._asdict().items()}
        fields.update({name: join([getattr(lp, p) for p in parts]) for name, parts in FUSED.items()})
        layers.append(Layer(**fields))
    return Weights(
        cast(params.embed), layers, cast(params.norm), params.norm_eps, cast(params.head), cast(params.head_bias)
    )


def _refresh(out: Weights, params: Weights) -> None:
    """`fuse`'s out overwritten in place with the values of params (each tensor once)."""
    done: set[int] = set()

    def put(mine, theirs) -> None:
        if isinstance(mine, Tensor) and mine is not theirs and id(mine) not in done:
            mine.copy_(theirs)
            done.add(id(mine))

    for mine, theirs in ((out.embed, params.embed), (out.norm, params.norm), (out.head, params.head)):
        put(mine, theirs)
    put(out.head_bias, params.head_bias)
    for lo, lp in zip(out.layers, params.layers, strict=True):
        for name, value in lo._asdict().items():
            if name in FUSED and value is not None:
                at = 0
                for part in (getattr(lp, p) for p in FUSED[name]):
                    value[at : at + part.shape[0]].copy_(part)
                    at += part.shape[0]
            elif name not in FUSED:
                put(value, getattr(lp, name))


def weight_tensors(w: Weights) -> list[Tensor]:
    """Every tensor of w in a fixed order (None and the float fields skipped)."""
    values = (w.embed, *(v for layer in w.layers for v in layer), w.norm, w.head, w.head_bias)
    return [v for v in values if isinstance(v, Tensor)]


class Dims(NamedTuple):
    """The model's attention dimensions (Python numbers: a compiled step specialises on them)."""

    heads: int
    kv_heads: int
    head_dim: int
    scaling: float


class HandDecoder:
    """The decode step of a supported model, reading its parameters in place (so it follows every update)."""

    def __init__(self, model):
        reason = unsupported(model)
        if reason is not None:
            raise ValueError(f"cannot hand-decode this model: {reason}")
        base = model.model
        self.embed, self.norm, self.head = base.embed_tokens, base.norm, model.lm_head
        self.layers = list(base.layers)
        first = self.layers[0].self_attn
        self.dims = Dims(
            model.config.num_attention_heads, model.config.num_key_value_heads, first.head_dim, first.scaling
        )
        self.rope = base.rotary_emb
        # the narrowest sliding window of any layer (Qwen2/Qwen3 name it per layer, Mistral in the config); a
        # sequence within it attends to every earlier token, as here
        windows = [getattr(layer.self_attn, "sliding_window", None) for layer in self.layers]
        windows.append(getattr(model.config, "sliding_window", None))
        self.window = min((w for w in windows if w), default=None)

    def weights(self, dtype: torch.dtype | None = None, out: Weights | None = None) -> Weights:
        """The tensors the step reads: the parameters themselves, or (dtype given and different) copies in dtype.
        out: copies an earlier call made for this model, overwritten in place (copy_) and returned, so a step
        compiled or captured on them reads the new values at the same addresses. A parameter shared by two places
        (tied embedding and LM head) is copied once."""
        if out is not None:
            done: set[int] = set()
            for mine, theirs in zip(weight_tensors(out), weight_tensors(self.weights()), strict=True):
                if mine is not theirs and id(mine) not in done:
                    mine.copy_(theirs)
                    done.add(id(mine))
            return out
        copies: dict[int, Tensor] = {}

        def cast(t):
            if t is None or dtype is None or t.dtype == dtype:
                return t
            if id(t) not in copies:
                copies[id(t)] = t.to(dtype)
            return copies[id(t)]

        layers = []
        for layer in self.layers:
            attn, mlp = layer.self_attn, layer.mlp
            qn, kn = getattr(attn, "q_norm", None), getattr(attn, "k_norm", None)
            ln1, ln2 = layer.input_layernorm, layer.post_attention_layernorm
            layers.append(
                Layer(
                    cast(ln1.weight),
                    ln1.variance_epsilon,
                    cast(attn.q_proj.weight),
                    cast(attn.q_proj.bias),
                    cast(attn.k_proj.weight),
                    cast(attn.k_proj.bias),
                    cast(attn.v_proj.weight),
                    cast(attn.v_proj.bias),
                    cast(attn.o_proj.weight),
                    cast(attn.o_proj.bias),
                    None if qn is None else cast(qn.weight),
                    0.0 if qn is None else qn.variance_epsilon,
                    None if kn is None else cast(kn.weight),
                    0.0 if kn is None else kn.variance_epsilon,
                    cast(ln2.weight),
                    ln2.variance_epsilon,
                    cast(mlp.gate_proj.weight),
                    cast(mlp.gate_proj.bias),
                    cast(mlp.up_proj.weight),
                    cast(mlp.up_proj.bias),
                    cast(mlp.down_proj.weight),
                    cast(mlp.down_proj.bias),
                )
            )
        return Weights(
            cast(self.embed.weight),
            layers,
            cast(self.norm.weight),
            self.norm.variance_epsilon,
            cast(self.head.weight),
            cast(self.head.bias),
        )

    def rope_table(self, positions: int, dtype: torch.dtype, device) -> tuple[Tensor, Tensor]:
        """(cos, sin), (positions, head_dim) each: the rotary module's formula at positions 0 .. positions - 1."""
        freqs = torch.arange(positions, device=device).float()[:, None] * self.rope.inv_freq.float()[None]
        emb = torch.cat((freqs, freqs), dim=-1)
        scale = self.rope.attention_scaling
        return (emb.cos() * scale).to(dtype), (emb.sin() * scale).to(dtype)

    def forward(self, w: Weights, token: Tensor, cos: Tensor, sin: Tensor, attend) -> Tensor:
        """`forward` with this model's dimensions."""
        return forward(w, self.dims, token, cos, sin, attend)

    def attention(self, q: Tensor, keys: Tensor, values: Tensor, hidden: Tensor) -> Tensor:
        """`attention` with this model's scaling."""
        return attention(q, keys, values, hidden, self.dims.scaling)


def forward(w: Weights, dims: Dims, token: Tensor, cos: Tensor, sin: Tensor, attend) -> Tensor:
    """Logits (n, V) after one token per row. token (n,), cos/sin (n, 1, d) at each row's position;
    attend(i, q, k, v) -> (n, KV, G, d) stores layer i's new keys and values (q (n, KV, G, d), k and v
    (n, KV, d), rotated) and returns the attention output, so the caller owns the cache's layout."""
    n, d = token.shape[0], dims.head_dim
    x = F.embedding(token, w.embed)  # (n, D)
    for i, lw in enumerate(w.layers):
        h = rms_norm(x, lw.ln1, lw.eps1)
        if lw.qkv is not None:  # one GEMM for the three (`fuse`)
            q, k, v = F.linear(h, lw.qkv, lw.qkv_bias).split([dims.heads * d, dims.kv_heads * d, dims.kv_heads * d], -1)
        else:
            q, k, v = F.linear(h, lw.q, lw.q_bias), F.linear(h, lw.k, lw.k_bias), F.linear(h, lw.v, lw.v_bias)
        q, k, v = q.view(n, dims.heads, d), k.view(n, dims.kv_heads, d), v.view(n, dims.kv_heads, d)
        if lw.q_norm is not None:  # Qwen3: RMSNorm over each head before the rotation
            q = rms_norm(q, lw.q_norm, lw.q_eps)
            k = rms_norm(k, lw.k_norm, lw.k_eps)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        q = q.view(n, dims.kv_heads, dims.heads // dims.kv_heads, d)  # a KV head's query heads as its queries
        o = attend(i, q, k, v)  # (n, KV, G, d)
        x = x + F.linear(o.reshape(n, dims.heads * d), lw.o, lw.o_bias)
        h = rms_norm(x, lw.ln2, lw.eps2)
        if lw.gate_up is not None:  # one GEMM for the two (`fuse`)
            gate, up = F.linear(h, lw.gate_up, lw.gate_up_bias).chunk(2, -1)
        else:
            gate, up = F.linear(h, lw.gate, lw.gate_bias), F.linear(h, lw.up, lw.up_bias)
        x = x + F.linear(F.silu(gate) * up, lw.down, lw.down_bias)
    x = rms_norm(x, w.norm, w.norm_eps)
    return F.linear(x, w.head, w.head_bias)


def attention(q: Tensor, keys: Tensor, values: Tensor, hidden: Tensor, scaling: float) -> Tensor:
    """softmax(q k^T * scaling) v as transformers' eager attention computes it (softmax in float32), over the
    cached keys/values (n, KV, C, d); hidden (n, 1, 1, C) is True where no query may look."""
    scores = torch.matmul(q, keys.transpose(-1, -2)) * scaling  # (n, KV, G, C)
    weights = scores.masked_fill_(hidden, float("-inf")).softmax(-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(weights, values)  # (n, KV, G, d)


def cache_tensors(cache) -> list[tuple[Tensor, Tensor]]:
    """(keys, values) per layer, (P, KV, T, d) each, of a transformers cache (version 5's layers or 4's lists)."""
    if hasattr(cache, "layers"):
        return [(layer.keys, layer.values) for layer in cache.layers]
    return list(zip(cache.key_cache, cache.value_cache))


class HandSteps:
    """The decode state of HandDecoder: key/value buffers with room for every new token, the padding columns and
    each row's next position, built after a prefill: `cache` holds each distinct prompt's keys and values (a
    transformers cache), rows (n,) says which prompt each decoded row continues, prompt_mask its left padding.
    `keep(rows)` drops finished rows; calling it with the sampled tokens gives the next logits."""

    def __init__(self, decoder: HandDecoder, cache, rows: Tensor, prompt_mask: Tensor, max_new_tokens: int):
        self.decoder, self.weights = decoder, decoder.weights()
        width = prompt_mask.shape[1]
        self.col = width  # the column the next token's keys go to
        columns = width + max_new_tokens
        self.keys, self.values = [], []
        for k, v in cache_tensors(cache):
            k_buf = k.new_empty(len(rows), k.shape[1], columns, k.shape[3])
            v_buf = torch.empty_like(k_buf)
            k_buf[:, :, :width] = k.index_select(0, rows)
            v_buf[:, :, :width] = v.index_select(0, rows)
            self.keys.append(k_buf)
            self.values.append(v_buf)
        mask = prompt_mask.index_select(0, rows).bool()
        self.padding = torch.cat([~mask, mask.new_zeros(len(rows), max_new_tokens)], dim=1)  # (n, C)
        self.position = mask.long().sum(-1)  # (n,) the next token's position (real tokens so far)
        positions = int(self.position.max()) + max_new_tokens
        self.cos, self.sin = decoder.rope_table(positions, self.keys[0].dtype, self.keys[0].device)

    def keep(self, rows: Tensor) -> None:
        self.keys = [k.index_select(0, rows) for k in self.keys]
        self.values = [v.index_select(0, rows) for v in self.values]
        self.padding, self.position = self.padding.index_select(0, rows), self.position.index_select(0, rows)

    def __call__(self, token: Tensor) -> Tensor:
        at, col = self.position, self.col
        padding = self.padding[:, None, None, : col + 1]

        def attend(i, q, k, v):
            k_buf, v_buf = self.keys[i], self.values[i]
            k_buf[:, :, col] = k
            v_buf[:, :, col] = v
            return self.decoder.attention(q, k_buf[:, :, : col + 1], v_buf[:, :, : col + 1], padding)

        logits = self.decoder.forward(self.weights, token, self.cos[at][:, None], self.sin[at][:, None], attend)
        self.col += 1
        self.position = at + 1
        return logits


class Fixed(NamedTuple):
    """The fixed-shape decode state FixedSteps owns, as the pure step `fixed_logits` reads it: one tensor per field
    (a list per layer for the keys and values), so a compiled step is specialised on their shapes and dtypes only."""

    keys: list[Tensor]  # (n, KV, C, d) per layer
    values: list[Tensor]  # (n, KV, C, d) per layer
    padding: Tensor  # (n, 1, 1, C) bool: the prompt's left padding
    columns: Tensor  # (C,) 0 .. C - 1
    col: Tensor  # (1,) the column the next token's keys and values go to
    position: Tensor  # (n,) each row's next position
    cos: Tensor  # (positions, d)
    sin: Tensor  # (positions, d)


def fixed_logits(w: Weights, dims: Dims, state: Fixed, token: Tensor) -> Tensor:
    """Logits (n, V) after token (n,): one token per row at its position, keys and values written to column `col`
    of every row (in place), which then advances (in place) with the positions. Attention reads every column, the
    padding and the columns not yet written hidden. Nothing is read back to the host."""
    hidden = state.padding | (state.columns > state.col)  # (n, 1, 1, C): padding and columns not yet written
    at, col = state.position, state.col

    def attend(i, q, k, v):
        k_buf, v_buf = state.keys[i], state.values[i]
        k_buf.index_copy_(2, col, k[:, :, None])
        v_buf.index_copy_(2, col, v[:, :, None])
        return attention(q, k_buf, v_buf, hidden, dims.scaling)

    logits = forward(w, dims, token, state.cos[at][:, None], state.sin[at][:, None], attend)
    col.add_(1)
    at.add_(1)
    return logits


class FixedSteps:
    """HandSteps at fixed shapes, for a step that can be captured once and replayed (a CUDA graph): every row stays
    in the batch to the end (a finished row keeps decoding, and its tokens are masked by the sampling loop), the
    key/value buffers hold (rows, KV, prompt columns + max_new_tokens, d) from the start, the next column and each
    row's position are index tensors updated in place, and attention reads all columns with the ones not yet
    written hidden (`fixed_logits`). Nothing in `__call__` reads a value back to the host.

    dtype: the dtype of the weights, cache and arithmetic (None: the model's; bfloat16 generation casts the weights
    here). weights: the step's weights when the caller keeps them (a persistent decode copy, HandDecoder.weights's
    `out`); None: `decoder.weights(dtype)`. rope_positions: the rope table's length (None: the positions this
    rollout reaches, read once; a compiled step passes the rollout's columns, so that every rollout of one shape
    has tables of one shape). block: attention bounded by the filled length (None: every column, as above): the step
    at decode step t reads the first `bound(t)` columns only, the prompt's width plus t rounded up to a multiple of
    block, as views of the buffers (`fixed(bound)`), marked dynamic in that dimension so that one compiled graph
    serves every bound (the buffers get one spare column that no view reaches: a view as wide as its buffer would be
    contiguous and make the compiler specialise again). An RL-length response then reads its cache as it fills
    instead of all of it from the first token."""

    def __init__(
        self,
        decoder: HandDecoder,
        cache,
        rows: Tensor,
        prompt_mask: Tensor,
        max_new_tokens: int,
        dtype: torch.dtype | None = None,
        weights: Weights | None = None,
        rope_positions: int | None = None,
        block: int | None = None,
    ):
        self.decoder, self.weights = decoder, weights if weights is not None else decoder.weights(dtype)
        width = prompt_mask.shape[1]
        columns = width + max_new_tokens
        self.width, self.block, self.filled_max = width, block, columns
        if block is not None:
            if block < 1:
                raise ValueError(f"block must be >= 1, got {block}")
            columns += 1  # the spare column (see the class docstring)
        self.keys, self.values = [], []
        for k, v in cache_tensors(cache):
            # zeros, not empty: a hidden column's weight is 0, and 0 times uninitialised memory may be NaN
            k_buf = k.new_zeros(len(rows), k.shape[1], columns, k.shape[3], dtype=dtype or k.dtype)
            v_buf = torch.zeros_like(k_buf)
            k_buf[:, :, :width] = k.index_select(0, rows)
            v_buf[:, :, :width] = v.index_select(0, rows)
            self.keys.append(k_buf)
            self.values.append(v_buf)
        mask = prompt_mask.index_select(0, rows).bool()
        padding = torch.cat([~mask, mask.new_zeros(len(rows), columns - width)], dim=1)  # (n, C)
        self.padding = padding[:, None, None, :]  # (n, 1, 1, C): the prompt's left padding
        self.columns = torch.arange(columns, device=mask.device)  # (C,)
        self.col = torch.full((1,), width, dtype=torch.long, device=mask.device)  # the next token's column
        self.position = mask.long().sum(-1)  # (n,) the next token's position (real tokens so far)
        # the table HandSteps builds (its length read once per rollout, outside the step): the same cos/sin bits
        positions = rope_positions or int(self.position.max()) + max_new_tokens
        self.cos, self.sin = decoder.rope_table(positions, self.keys[0].dtype, self.keys[0].device)

    def state(self) -> list[Tensor]:
        """The tensors a step changes besides the key/value columns it writes (saved around a capture's warm-up)."""
        return [self.col, self.position]

    def bound(self, step: int) -> int | None:
        """The columns the attention of decode step `step` (1, 2, ...: it writes column width + step - 1) reads: the
        prompt's width plus step rounded up to a multiple of block, at most the rollout's columns; None without a
        block (every column)."""
        if self.block is None:
            return None
        return min(self.filled_max, self.width + -(-step // self.block) * self.block)

    def fixed(self, bound: int | None = None) -> Fixed:
        """The state as `fixed_logits` reads it (the tensors themselves, not copies); bound: the key/value buffers,
        padding and column index as views of their first `bound` columns, that dimension marked dynamic."""
        keys, values, padding, columns = self.keys, self.values, self.padding, self.columns
        if bound is not None:
            keys, values = [k[:, :, :bound] for k in keys], [v[:, :, :bound] for v in values]
            padding, columns = padding[..., :bound], columns[:bound]
            for t in [*keys, *values]:
                torch._dynamo.mark_dynamic(t, 2)
            torch._dynamo.mark_dynamic(padding, 3)
            torch._dynamo.mark_dynamic(columns, 0)
        return Fixed(keys, values, padding, columns, self.col, self.position, self.cos, self.sin)

    def __call__(self, token: Tensor, bound: int | None = None) -> Tensor:
        """`fixed_logits` on this state (bound: see `fixed`)."""
        return fixed_logits(self.weights, self.decoder.dims, self.fixed(bound), token)
