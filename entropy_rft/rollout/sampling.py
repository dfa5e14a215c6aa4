"""The HF engine's own sampling loop: exactly softmax(z / T) restricted to the top-p nucleus, nothing else.

`transformers.generate` merges the model's generation_config into every call, so processors the checkpoint
ships (Qwen2.5-Instruct: repetition_penalty 1.05, top_k 20) silently change the sampling distribution and the
rollouts stop being on-policy for the policy the trainer differentiates. This loop applies no processor but
temperature and top-p, and it is faster on GRPO batches:
- each distinct prompt is prefilled once and its keys and values are repeated to its n samples;
- on the CPU, rows that have finished (sampled any EOS id) leave the batch, so the model runs only on live
  rows;
- after the prefill, on the CPU, tokens go through rollout/decode.py's hand-written step for the model families it
  reads exactly (Qwen2, Qwen3, Llama, Mistral): the same arithmetic without transformers' per-call work;
- the same step at fixed shapes (`sample_static`, decode="static"): rows stay in place to the end (finished rows
  masked), every buffer is allocated once per rollout, the step is captured once in a CUDA graph and replayed,
  and "every row done" is read back every check_every steps only. Measured on an H100 (benchmarks/gpu.md section
  4): 3.51 ms a step at 32 rows of the Qwen2.5-0.5B shape in bf16, against 19.0 ms for the row-dropping loop
  (issue 45, an H200), bound by kernel launches and host round-trips;
- on CUDA (decode="auto" there, or "compile"), that whole step compiled by torch.compile into fused kernels
  before the capture (departures 3-7): the captured static step is still several hundred kernels (every norm,
  rotary embedding, activation and the sampler apart). Measured on an H200 (benchmarks/gpu.md section 5): 1.60 ms
  a step at 32 rows and 2.63 ms at 256 of the Qwen2.5-0.5B shape in bf16, against 3.30 and 5.00 ms for the captured
  static step, with a cold compile of about 30 s per shape.

Departures of the fixed-shape path:
1. Sampling is the exponential race argmax(p / E), E ~ Exp(1) per token (`draw`), which is what torch.multinomial
   computes for one sample (and what it draws), without multinomial's validity check that reads a flag back to
   the host every step. On the CPU the noise is the very stream the row-dropping loop draws (`stream_noise`), so
   the tokens are the same; on a GPU the noise is drawn inside the step (`seeded_noise`: Exp(1) from a 32-bit
   integer hash of each entry's index, keyed by a per-rollout seed drawn from the caller's generator and the step),
   so no (rows, V) buffer is filled outside the graph each step and the compiled step draws the eager step's
   noise; a GPU's tokens differ from the CPU's hand path under the same seed, while both sample the same
   distribution (the hash's draws take 2^24 values, the race's probabilities are exact to that resolution).
2. Its log-probs are not bit-identical to the "hand" path's, on the CPU either: MKL's sgemm rounds a row
   otherwise when fewer rows share the call (measured here: calls of 1-3, 5-7 or 9-11 rows against one of 32),
   and softmax and the value product over all columns (hidden ones at -inf and 0) sum in another order than over
   the written ones only. The gaps are a few float32
   ulps (<= 5e-7 on tests/test_decode.py's families, about 1e-5 on the demo's batch; the hf path's gap to "hand"
   is the same size), so "auto" keeps the "hand" path on the CPU and the recorded golden runs do not move.
3. decode="compile" compiles `fixed_step`, a module-level function of explicit tensors (the weights as a NamedTuple
   pytree, the key/value buffers, the state buffers, the noise, the cos/sin tables: `Fixed`, `Sampled`), with
   torch.compile(fullgraph=True, dynamic=False), Inductor by default: one graph per rollout shape and process, guarded
   on shapes and dtypes only, so a new rollout of the shape (new buffers) and weights updated in place by an optimizer
   step reuse it (tests/test_compile_decode.py counts the graphs). The graph is compiled by one step run before the
   capture (`DecodeSession.compile`, its effect undone), then captured and replayed as the static step is. Inductor's
   mode is COMPILE_MODE, one line: None (its default: fused Triton kernels, cuBLAS matmuls, no CUDA graphs of its own)
   inside our capture, chosen before any GPU measurement because it keeps the capture the static path proved and the
   cold compile short (about 30 s a shape on an H200); "max-autotune-no-cudagraphs" adds autotuned matmuls (as SGLang
   compiles inside its own capture), "reduce-overhead" uses Inductor's graph trees instead of our capture (every tensor
   of the step marked a static address, each step begun with cudagraph_mark_step_begin). Inductor writes each step's
   key/value column into the cache buffers in place (checked on its generated CPU code: no kernel over a whole buffer).
   A cold compile of the tests' 2-layer model took 31-45 s on a shared 2-core CPU (aot_eager: 1-2 s); it is paid on a
   run's first rollout of each shape and reported as time/compile. decode="auto" on CUDA takes this path; when compiling
   fails it warns once, in one line naming the error, and decodes with "static" for the rest of the session.
4. Compiled rollouts left-pad their prompts to `bucket_width` (16, 24, 32, 48, 64, 96, ...), so batches of similar
   width share a graph; the padding is masked like any left padding, and costs its key/value reads (under half of
   the prompt's width). The rope table spans every column, so its shape too is the bucket's.
5. bfloat16 decoding of a float32 policy (precision bf16) reads a decode copy of the weights the session keeps
   and overwrites in place (copy_) at each rollout, instead of fresh casts: the addresses a compiled or captured
   step reads stay valid and no allocation churns, at the price of the copy staying allocated between rollouts
   (0.99 GB for the Qwen2.5-0.5B shape). A float32 policy decoded in float32 reads its parameters themselves,
   except on CUDA, where the projections are fused (departure 6).
6. On CUDA the step reads each layer's q, k and v projections joined into one weight and gate and up into another
   (decode.fuse: 4 projection GEMMs a layer instead of the module's 7, as gpt-fast, vLLM and SGLang run them; the
   decode copy of departure 5 holds them joined, refreshed in place at each rollout); in float32 that copy is extra
   memory (the projections' size) the unfused step does not need. One GEMM of the joined rows may round a column
   otherwise than the parts' GEMMs: tokens the same in tests/test_compile_decode.py, log-probs within a few float32
   ulps.
7. On CUDA attention reads length buckets of LENGTH_BLOCK columns (decode.py's docstring), each bucket its own
   captured graph of the one compiled step; the softmax over fewer hidden columns sums in another order (float32
   ulps, as departure 2).

Top-p is the nucleus of Holtzman et al. as transformers' TopPLogitsWarper computes it: sort by probability,
keep the smallest prefix whose mass reaches top_p (a token is kept when the mass strictly before it is below
top_p, so at least one is kept); the kept logits are renormalised by the softmax. tests/test_rollout.py checks
the kept sets against TopPLogitsWarper and the sampled frequencies against the model's probabilities.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

from .cache import cache_arg, cache_of
from .decode import (
    Dims,
    Fixed,
    FixedSteps,
    HandDecoder,
    HandSteps,
    Weights,
    fixed_logits,
    fuse,
    unsupported,
    weight_tensors,
)


def nucleus_logits(logits: Tensor, top_p: float) -> Tensor:
    """logits [B, V] with the tokens outside each row's top-p nucleus set to -inf (top_p >= 1: unchanged)."""
    if top_p >= 1.0:
        return logits
    probs = logits.softmax(-1)
    sorted_p, order = probs.sort(dim=-1, descending=True)
    mass_before = sorted_p.cumsum(-1) - sorted_p
    drop_sorted = mass_before >= top_p
    drop_sorted[:, 0] = False
    drop = torch.zeros_like(drop_sorted).scatter_(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


def position_ids(mask: Tensor) -> Tensor:
    """Position ids of left-padded rows: each real token's index among its row's real tokens (padding: 0)."""
    return (mask.long().cumsum(-1) - 1).clamp_min(0)


DECODE = ("auto", "hand", "hf", "static", "compile")  # how tokens after the prompt go through the model (see `sample`)
NOISE = ("stream", "device", "seeded")  # the fixed-shape loop's noise sources (StaticLoop.noise)
# Attention's length buckets on CUDA (StaticLoop.block): a step reads the prompt and its response rounded up to a
# multiple of this many columns, not the whole cache. A rollout of at most this many new tokens reads every column
# as before (one bucket); a 4,096-token one reads on average 53% of its cache (2,048 + 128 of 4,096 columns) and
# captures 16 graphs of the one compiled step. Chosen before any GPU measurement: small enough that a bucket
# wastes at most 255 columns of reads, large enough that captures stay few (each a 2-step warm-up and a capture).
LENGTH_BLOCK = 256


def check_decode(decode: str) -> str:
    if decode not in DECODE:
        raise ValueError(f"decode must be one of {', '.join(DECODE)}, got {decode!r}")
    return decode


def check_every_default(device: torch.device) -> int:
    """How many steps the fixed-shape loop runs between two looks at "every row done": 1 on the CPU (the flag is
    already in host memory), 8 on a GPU (each look waits for the device; at most 7 steps of finished rows are
    wasted at the end of a rollout)."""
    return 1 if device.type == "cpu" else 8


def check_generator(generator: torch.Generator | None, device: torch.device) -> None:
    """A sampling generator must live on the device the model samples on (torch.multinomial draws there): a CPU
    generator with a CUDA model fails deep inside multinomial, so it is refused here naming both devices."""
    if generator is not None and generator.device.type != torch.device(device).type:
        raise ValueError(
            f"the sampling generator is on {generator.device} but the model samples on {device}: "
            f"create it with torch.Generator(device={str(device)!r})"
        )


@dataclass(frozen=True)
class Sampling:
    """What `sample` draws: n responses to each prompt, each token from softmax(z / temperature) restricted to the
    top-p nucleus (`nucleus_logits`), each response at most max_new_tokens long, running up to and including its
    first id of eos_ids and holding pad_id after. HFEngine.generate builds one per call: n, temperature, top_p and
    max_new_tokens are the call's, eos_ids and pad_id the model's and tokenizer's."""

    n: int
    temperature: float
    top_p: float
    max_new_tokens: int
    eos_ids: list[int]
    pad_id: int


def sample(
    model,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    sampling: Sampling,
    *,
    generator: torch.Generator | None = None,
    decode: str = "auto",
    dtype: torch.dtype | None = None,
    check_every: int | None = None,
    session: DecodeSession | None = None,
) -> tuple[Tensor, Tensor]:
    """sampling.n samples of each left-padded prompt, grouped (rows [i n, (i + 1) n) are prompt i's).

    The model runs in eval mode (its training flag is restored after). Returns (response_ids [P n, R],
    sampler_logp [P n, R]): R is the longest response (<= sampling.max_new_tokens); each
    response runs up to and including its first EOS id, then holds sampling.pad_id; sampler_logp is the log-probability
    of each sampled token under the distribution it was drawn from (0 after the response ends). The loop runs in
    inference mode (no autograd bookkeeping: 5% faster on the demo's rollouts); the results are ordinary tensors.

    decode: how each new token goes through the model after the prefill. "hf": the model's forward with its
    cache; "hand": rollout/decode.py's step (the same arithmetic without transformers' per-call machinery; an
    error for a model it cannot read), finished rows leaving the batch; "static": the same step at fixed shapes
    (`sample_static`), captured once in a CUDA graph and replayed on a GPU, run as it is on the CPU; "compile":
    that step compiled whole by torch.compile (Inductor) for the rollout's shape, the prompt width bucketed
    (`bucket_width`), then captured and replayed as "static" is (departures 3-7); "auto": "hand" on the CPU and
    "compile" on CUDA for a model the step reads ("static" for the rest of the session once compiling failed,
    with a warning), else "hf".
    dtype (static and compile paths): the weights' and cache's dtype while decoding (bfloat16 where the policy
    trains under bf16 autocast; None: the model's). check_every (same): steps between two looks at whether every
    row is done (None: `check_every_default`); the tokens do not depend on it. session: what these paths keep
    across the rollouts of a run (`DecodeSession`: the bfloat16 copy of the weights, the compiler's state and
    seconds, a failure); None: a fresh one for this call.
    """
    check_decode(decode)
    check_generator(generator, prompt_ids.device)
    was_training = model.training
    model.eval()  # the policy itself (no dropout), and a cache: gradient checkpointing turns it off in training mode
    try:
        with torch.inference_mode():
            response, logp = _sample(
                model,
                prompt_ids,
                prompt_mask,
                sampling,
                generator=generator,
                decode=decode,
                dtype=dtype,
                check_every=check_every,
                session=session or DecodeSession(),
            )
    finally:
        model.train(was_training)
    return response.clone(), logp.clone()


def hand_decoder(model, decode: str, columns: int, device: torch.device):
    """The HandDecoder `decode` asks for (None: decode with the model's forward); columns is the longest
    sequence the rollout can reach, prompt padding included."""
    if decode == "hf" or (decode == "auto" and device.type not in ("cpu", "cuda")):
        return None
    reason = unsupported(model)
    decoder = HandDecoder(model) if reason is None else None
    if decoder is not None and decoder.window is not None and columns > decoder.window:
        reason, decoder = f"{columns} tokens exceed the sliding attention window of {decoder.window}", None
    if decoder is None and decode in ("hand", "static", "compile"):
        raise ValueError(f"decode={decode!r} cannot decode this model: {reason}; use decode='auto' or 'hf'")
    return decoder


def decode_path(
    model, decode: str, columns: int, device: torch.device, compile_failed: bool = False
) -> tuple[str, HandDecoder | None]:
    """The path `decode` takes on `device` ("hf", "hand", "static" or "compile") and its decoder. "auto": the
    fastest exact one, "hand" on the CPU (its tokens and the golden runs' values are today's) and "compile" on CUDA
    (one graph replay a step of fused kernels instead of hundreds of launches and a host round-trip), "static"
    there once compiling has failed in this session (compile_failed), "hf" for a model the step does not read."""
    decoder = hand_decoder(model, decode, columns, device)
    if decoder is None:
        return "hf", None
    if decode == "auto":
        if device.type != "cuda":
            return "hand", decoder
        return ("static" if compile_failed else "compile"), decoder
    return decode, decoder


class _ForwardSteps:
    """Decoding through the model's own forward and cache (decode='hf')."""

    def __init__(self, model, cache, rows: Tensor, prompt_mask: Tensor):
        cache.batch_select_indices(rows)
        self.model, self.cache = model, cache
        self.attn = prompt_mask.long()[rows]
        self.position = prompt_mask.long().sum(-1)[rows]

    def keep(self, rows: Tensor) -> None:
        self.cache.batch_select_indices(rows)
        self.attn, self.position = self.attn[rows], self.position[rows]

    def __call__(self, token: Tensor) -> Tensor:
        self.attn = torch.cat([self.attn, self.attn.new_ones(self.attn.shape[0], 1)], dim=1)
        out = self.model(
            input_ids=token[:, None],
            attention_mask=self.attn,
            position_ids=self.position[:, None],
            **cache_arg(self.cache),
            use_cache=True,
            logits_to_keep=1,
        )
        self.cache = cache_of(out)
        self.position = self.position + 1
        return out.logits[:, -1]


def _sample(
    model,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    sampling: Sampling,
    *,
    generator: torch.Generator | None,
    decode: str,
    dtype: torch.dtype | None,
    check_every: int | None,
    session: DecodeSession,
) -> tuple[Tensor, Tensor]:
    device = prompt_ids.device
    n, max_new_tokens, pad_id = sampling.n, sampling.max_new_tokens, sampling.pad_id
    columns = prompt_ids.shape[1] + max_new_tokens
    path, hand = decode_path(model, decode, columns, device, session.failed is not None)  # before any model work
    if path in ("static", "compile"):
        loop = StaticLoop(
            dtype=dtype,
            check_every=check_every,
            capture=device.type == "cuda",
            compiled=path == "compile",
            fallback=decode == "auto",
            fused=device.type == "cuda",
            block=LENGTH_BLOCK if device.type == "cuda" else None,
        )
        return sample_static(
            model, hand, prompt_ids, prompt_mask, sampling, generator=generator, session=session, loop=loop
        )
    rows = prompt_ids.shape[0] * n
    eos = torch.tensor(sorted(set(sampling.eos_ids)), device=device)
    out = model(
        input_ids=prompt_ids,
        attention_mask=prompt_mask.long(),
        position_ids=position_ids(prompt_mask),
        use_cache=True,
        logits_to_keep=1,
    )
    prompt_of = torch.arange(prompt_ids.shape[0], device=device).repeat_interleave(n)  # (rows,)
    logits = out.logits[prompt_of, -1]
    steps = (
        HandSteps(hand, cache_of(out), prompt_of, prompt_mask, max_new_tokens)
        if hand is not None
        else _ForwardSteps(model, cache_of(out), prompt_of, prompt_mask)
    )
    del out
    live = torch.arange(rows, device=device)
    response = torch.full((rows, max_new_tokens), pad_id, dtype=torch.long, device=device)
    logp = torch.zeros(rows, max_new_tokens, dtype=torch.float32, device=device)
    width = 0
    for t in range(max_new_tokens):
        z = nucleus_logits(logits.float() / sampling.temperature, sampling.top_p)
        log_probs = z.log_softmax(-1)
        token = torch.multinomial(log_probs.exp(), 1, generator=generator).squeeze(1)
        response[live, t] = token
        logp[live, t] = log_probs.gather(1, token[:, None]).squeeze(1)
        width = t + 1
        going = ~torch.isin(token, eos)
        if t + 1 == max_new_tokens or not bool(going.any()):
            break
        if not bool(going.all()):
            keep = going.nonzero().squeeze(1)
            live, token = live[keep], token[keep]
            steps.keep(keep)
        logits = steps(token)
    return response[:, :width], logp[:, :width]


def draw(logits: Tensor, noise: Tensor, *, temperature: float, top_p: float) -> tuple[Tensor, Tensor]:
    """(token (n,), its log-prob (n,)): one sample per row of softmax(logits / T) on the top-p nucleus, given
    noise (n, V) of independent Exp(1) draws: the argmax of p / noise, which is a draw from p (the exponential
    race; torch.multinomial computes exactly this for one sample, so the same noise gives the same token)."""
    z = nucleus_logits(logits.float() / temperature, top_p)
    log_probs = z.log_softmax(-1)  # (n, V)
    token = (log_probs.exp() / noise).argmax(-1)
    return token, log_probs.gather(1, token[:, None]).squeeze(1)


class Sampled(NamedTuple):
    """The sampling state of a fixed-shape rollout as the pure step reads it (StaticRollout owns the tensors)."""

    token: Tensor  # (n,) the last token of each row
    noise: Tensor | None  # (n, V) Exp(1) draws, filled before each step; None: drawn in the step from `seed`
    eos: Tensor  # (E,) the ids that end a response
    t: Tensor  # (1,) the response column the next token goes to
    done: Tensor  # (n,) bool: the row has sampled an EOS id
    length: Tensor  # (n,) tokens recorded per row
    response: Tensor  # (n, R)
    logp: Tensor  # (n, R) float32
    seed: Tensor | None = None  # (2,) the rollout's two 32-bit keys of `seeded_noise` (None: `noise` is filled)


M32 = 0xFFFFFFFF


def _mix(x: Tensor) -> Tensor:
    """A bijective hash of 32-bit values held in int64 (xorshift-multiply rounds, MurmurHash-style): odd multipliers
    below 2^31, so every product stays below 2^63 and no integer overflows on any device."""
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & M32
    x = x ^ (x >> 15)
    x = (x * 0x5BD1E995) & M32
    return x ^ (x >> 16)


def seeded_noise(seed: Tensor, t: Tensor, rows: int, vocab: int) -> Tensor:
    """Exp(1) draws (rows, vocab) for step t of a rollout, a pure function of the rollout's keys seed (2,), t (1,)
    and each entry's index: -log U, U = (h + 1/2) / 2^24 for h the top 24 bits of a 32-bit hash of the index keyed
    twice. Integer arithmetic gives the same bits eagerly, compiled, captured and on any device, so the compiled
    step samples the eager step's tokens, and the draw runs inside the step (fused into the sampler's kernel on a GPU:
    no (rows, V) noise buffer written outside the graph each step). U lies in (0, 1), so the noise is positive and
    finite (at most 17.3)."""
    k1 = _mix(seed[:1] ^ _mix(t & M32))  # (1,) this step's keys
    k2 = _mix(seed[1:] ^ k1)
    index = torch.arange(rows * vocab, device=seed.device).view(rows, vocab)
    h = _mix(_mix(index ^ k1) ^ k2)
    return -torch.log(((h >> 8).float() + 0.5) * 2.0**-24)


def record(logits: Tensor, state: Sampled, *, temperature: float, top_p: float, pad_id: int) -> None:
    """Sample column t of every row from logits (n, V) and the noise (`seeded_noise` where state.seed is set); a
    finished row records pad_id and 0."""
    noise = state.noise if state.seed is None else seeded_noise(state.seed, state.t, *logits.shape)
    token, logp = draw(logits, noise, temperature=temperature, top_p=top_p)
    live = ~state.done
    state.response.index_copy_(1, state.t, torch.where(live, token, pad_id)[:, None])
    state.logp.index_copy_(1, state.t, torch.where(live, logp, 0.0)[:, None])
    state.length.add_(live.long())
    state.done.logical_or_(live & (token[:, None] == state.eos).any(-1))
    state.token.copy_(token)
    state.t.add_(1)


def fixed_step(
    w: Weights, dims: Dims, fixed: Fixed, sampled: Sampled, *, temperature: float, top_p: float, pad_id: int
) -> None:
    """One whole fixed-shape decode step, every tensor passed in and changed in place, nothing read back: forward the
    last tokens (decode.fixed_logits), sample the next for every row, record them where the row is still live. The
    unit a CUDA graph captures (decode="static") and torch.compile compiles (decode="compile")."""
    record(fixed_logits(w, dims, fixed, sampled.token), sampled, temperature=temperature, top_p=top_p, pad_id=pad_id)


class StaticRollout:
    """The fixed-shape sampling loop's state: FixedSteps plus the sampled tokens, their log-probs, each row's
    length and whether it has finished, all in buffers of the rollout's full size. `step()` runs `fixed_step` (or
    `fn`, its compiled form) on them: forward the last tokens, sample the next for every row from `noise`, record
    them where the row is still live (pad and 0 where it has finished), all on the device without reading anything
    back."""

    def __init__(
        self,
        steps: FixedSteps,
        rows: int,
        vocab: int,
        max_new_tokens: int,
        *,
        eos_ids: list[int],
        pad_id: int,
        temperature: float,
        top_p: float,
        device: torch.device,
        seed: Tensor | None = None,
    ):
        self.steps, self.pad_id, self.temperature, self.top_p = steps, pad_id, temperature, top_p
        self.seed = seed  # (2,): the noise is drawn inside the step (`seeded_noise`), no buffer
        self.fn = fixed_step
        self.eos = torch.tensor(sorted(set(eos_ids)), device=device)  # (E,)
        self.token = torch.full((rows,), pad_id, dtype=torch.long, device=device)  # the last token of each row
        self.t = torch.zeros(1, dtype=torch.long, device=device)  # the response column the next token goes to
        self.done = torch.zeros(rows, dtype=torch.bool, device=device)
        self.length = torch.zeros(rows, dtype=torch.long, device=device)
        self.response = torch.full((rows, max_new_tokens), pad_id, dtype=torch.long, device=device)
        self.logp = torch.zeros(rows, max_new_tokens, dtype=torch.float32, device=device)
        self.noise = None if seed is not None else torch.ones(rows, vocab, dtype=torch.float32, device=device)

    def state(self) -> list[Tensor]:
        """Every tensor a step changes besides the key/value columns (saved around a capture's warm-up)."""
        return [self.token, self.t, self.done, self.length, self.response, self.logp, *self.steps.state()]

    def sampled(self) -> Sampled:
        """The sampling state as `record` reads it (the tensors themselves)."""
        return Sampled(
            self.token, self.noise, self.eos, self.t, self.done, self.length, self.response, self.logp, self.seed
        )

    def record(self, logits: Tensor) -> None:
        """`record` on this state (column 0 comes from the prefill's logits)."""
        record(logits, self.sampled(), temperature=self.temperature, top_p=self.top_p, pad_id=self.pad_id)

    def step(self, bound: int | None = None) -> None:
        """One step (`fixed_step`, or `fn`); bound: the columns attention reads (FixedSteps.fixed; None: all)."""
        self.fn(
            self.steps.weights,
            self.steps.decoder.dims,
            self.steps.fixed(bound),
            self.sampled(),
            temperature=self.temperature,
            top_p=self.top_p,
            pad_id=self.pad_id,
        )


def stream_noise(generator: torch.Generator | None):
    """The noise today's loop draws (CPU): each step torch.multinomial draws Exp(1) values for the rows still in
    its batch, row after row; this fills the live rows' noise with those very values, so the fixed-shape loop
    samples the tokens the row-dropping loop samples. It reads which rows are live, a host read that costs
    nothing on the CPU (nothing to wait for), and draws nothing once every row is done: the generator ends where
    today's leaves it, whatever check_every is."""

    def fill(state: StaticRollout) -> None:
        live = (~state.done).nonzero().squeeze(1)
        if len(live):
            values = torch.empty(len(live), state.noise.shape[1], dtype=state.noise.dtype, device=state.noise.device)
            values.exponential_(1, generator=generator)
            state.noise.index_copy_(0, live, values)

    return fill


def device_noise(generator: torch.Generator | None, device: torch.device):
    """The noise of a GPU rollout: Exp(1) for every row each step, drawn on the device by a generator of this
    rollout seeded once from `generator` (one host read per rollout), so the caller's generator advances by the
    same amount whatever the number of steps and check_every. Clamped away from 0: a zero would make 0 / 0 for a
    token outside the nucleus, and argmax takes NaN for the largest."""
    seed = torch.randint(
        0, 2**62, (1,), device=generator.device if generator is not None else device, generator=generator
    )
    own = torch.Generator(device=device)
    own.manual_seed(int(seed))
    tiny = torch.finfo(torch.float32).tiny

    def fill(state: StaticRollout) -> None:
        state.noise.exponential_(1, generator=own).clamp_min_(tiny)

    return fill


def rollout_seed(generator: torch.Generator | None, device: torch.device) -> Tensor:
    """The two 32-bit keys (2,) of a rollout's `seeded_noise`, on device, drawn once per rollout from the caller's
    generator (on its own device: nothing is read back to the host), so the generator advances by the same amount
    whatever the number of steps and check_every."""
    where = generator.device if generator is not None else device
    return torch.randint(0, 2**32, (2,), device=where, generator=generator).to(device)


def _no_fill(state: StaticRollout) -> None:
    """The noise of a seeded rollout is drawn inside the step (`seeded_noise`): nothing to fill."""


def captured(state: StaticRollout, warmup: int = 2, bound: int | None = None, pool=None):
    """state.step(bound) captured once in a CUDA graph (in the memory pool `pool` where given: the graphs of one
    rollout's length buckets replay one at a time, so they share one); returns the graph. The warm-up (cuBLAS
    workspaces, allocator) runs on a side stream before the capture, and the state it advances is put back after:
    the replays start from the step the capture was made at. The key/value columns the warm-up wrote (this step's
    and the next ones, hidden until then) are written again before any step reads them."""
    saved = [t.clone() for t in state.state()]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            state.step(bound)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        state.step(bound)
    for t, s in zip(state.state(), saved):
        t.copy_(s)
    return graph


class Stepper:
    """Decode step t of a fixed-shape rollout (t = 1, 2, ...), at the attention bound of its length bucket
    (FixedSteps.bound): run as it is, or (capture) each bucket's step captured in a CUDA graph when the rollout first
    reaches the bucket and replayed after. A bucket first reached within `warmup` steps of the end runs uncaptured
    (its warm-up would write past the response buffers)."""

    def __init__(self, state: StaticRollout, max_new_tokens: int, capture: bool, warmup: int = 2):
        self.state, self.max_new_tokens, self.capture, self.warmup = state, max_new_tokens, capture, warmup
        self.graphs: dict[int | None, torch.cuda.CUDAGraph] = {}

    def __call__(self, t: int) -> None:
        bound = self.state.steps.bound(t)
        graph = self.graphs.get(bound)
        if graph is None and self.capture and t + self.warmup < self.max_new_tokens:
            pool = next(iter(self.graphs.values())).pool() if self.graphs else None
            graph = self.graphs[bound] = captured(self.state, self.warmup, bound, pool)
        if graph is not None:
            graph.replay()
        else:
            self.state.step(bound)


# decode="compile" (departures 3-7). COMPILE_MODE is Inductor's mode: None (its default: fused Triton kernels,
# cuBLAS matmuls, no CUDA graphs of its own), captured and replayed by `captured` as the static step is;
# "max-autotune-no-cudagraphs" the same with autotuned matmul templates (minutes more of cold compile);
# "reduce-overhead" Inductor's own CUDA graphs (graph trees) instead of `captured`, every tensor of the step marked a
# static address and each step begun with cudagraph_mark_step_begin. One line to switch; only None has been measured
# on a GPU (benchmarks/gpu.md section 5).
COMPILE_MODE: str | None = None


def compile_backend(backend, mode: str | None):
    """torch.compile(fixed_step, fullgraph=True, dynamic=False) with this backend (and Inductor's mode): one
    wrapper per (backend, mode) for the process, so a later rollout or a new session of the same shape finds
    dynamo's compiled graph instead of compiling again. fullgraph: a graph break raises instead of splitting the
    step; dynamic=False: one graph per shape, guarded on shapes and dtypes only (weights and buffers are
    arguments, so a new rollout's buffers and weights updated in place need no recompile)."""
    key = (backend, mode)
    if key not in _COMPILED:
        options = {"mode": mode} if backend == "inductor" and mode is not None else {}
        _COMPILED[key] = torch.compile(fixed_step, fullgraph=True, dynamic=False, backend=backend, **options)
    return _COMPILED[key]


_COMPILED: dict = {}
# graphs of the step one process may compile (one per shape): dynamo's own limit per function (8) would refuse a
# ninth shape under fullgraph; a run meets a handful (training and evaluation rows, prompt-width buckets)
MAX_SHAPES = 64
RECOMPILE_LIMIT = "recompile_limit" if hasattr(torch._dynamo.config, "recompile_limit") else "cache_size_limit"


def bucket_width(width: int) -> int:
    """The prompt width a compiled step is built for: the smallest of 16, 24, 32, 48, 64, 96, 128, 192, ...
    (2^k and 3 * 2^(k-1)) that holds `width`. Prompt batches whose widths share a bucket share one compiled
    step; a bucket wastes under half of the prompt's width in padding, and widths from w to 4w need at most 4
    (each bucket a compile, of at most MAX_SHAPES graphs per process)."""
    bucket = 16
    while bucket < width:
        bucket = bucket * 3 // 2 if bucket & (bucket - 1) == 0 else bucket * 4 // 3
    return bucket


def pad_left(ids: Tensor, mask: Tensor, width: int, pad_id: int) -> tuple[Tensor, Tensor]:
    """Left-padded prompts (P, W) padded further on the left to (P, width)."""
    extra = width - ids.shape[1]
    if extra <= 0:
        return ids, mask
    return (
        torch.cat([ids.new_full((ids.shape[0], extra), pad_id), ids], dim=1),
        torch.cat([mask.new_zeros(mask.shape[0], extra), mask], dim=1),
    )


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def compiled_graphs() -> int:
    """Graphs dynamo has compiled in this process (its own counter)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def failure_reason(err: BaseException) -> str:
    """One line naming why compiling failed: the innermost exception's type and first line (dynamo wraps a
    backend's error in BackendCompilerFailed, Inductor a toolchain's in InductorError), with the outer type."""
    inner = err
    for _ in range(8):  # a few wrappings deep at most
        wrapped = inner.__cause__ or getattr(inner, "inner_exception", None)
        if not isinstance(wrapped, BaseException) or wrapped is inner:
            break
        inner = wrapped
    lines = [line for line in str(inner).splitlines() if line.strip()]
    reason = f"{type(inner).__name__}: {lines[0].strip() if lines else ''}"
    return reason if inner is err else f"{type(err).__name__}, {reason}"


class DecodeSession:
    """What the fixed-shape paths keep across the rollouts of a run (an engine holds one; `sample` makes a fresh
    one per call when none is given):
    - the decode copy of the weights in another dtype (bfloat16 decoding of a float32 policy), made once and
      overwritten in place (copy_) at each rollout, so the step reads the updated policy at the same addresses;
    - decode="compile"'s backend (Inductor unless a test passes another) and mode, the seconds spent compiling not
      yet reported (`pop_compile_seconds`), the number of graphs compiled, and why compiling failed, if it did
      (decode="auto" then decodes with "static" for the rest of the session)."""

    def __init__(self, *, backend="inductor", mode: str | None = COMPILE_MODE, timing: bool = False):
        self.backend, self.mode = backend, mode
        self.failed: str | None = None
        self.compile_seconds = 0.0
        self.compiled = 0
        self._copy: tuple[int, torch.dtype | None, bool, Weights] | None = None
        # timing (benchmarks/gpu.py): each rollout's (decode steps, seconds of its decode loop), the prefill, the
        # compile and the capture left out; the device is synchronised around the loop, so off in training
        self.timing, self.loops = timing, []

    def weights(self, model, decoder: HandDecoder, dtype: torch.dtype | None, fused: bool = False) -> Weights:
        """The weights the step reads in dtype: the parameters themselves where they have it already and fused is
        False, else the session's copy of this model's (fused: QKV and gate/up joined, decode.fuse), refreshed in
        place."""
        params = decoder.weights()
        if not fused and (dtype is None or all(t.dtype == dtype for t in weight_tensors(params))):
            return params
        key = (id(model), dtype, fused)
        if self._copy is not None and self._copy[:3] == key:
            out = self._copy[3]
            return fuse(params, dtype, out=out) if fused else decoder.weights(dtype, out=out)
        self._copy = (*key, fuse(params, dtype) if fused else decoder.weights(dtype))
        return self._copy[3]

    def pop_compile_seconds(self) -> float:
        """Seconds spent compiling since the last call (0.0 when nothing compiled)."""
        seconds, self.compile_seconds = self.compile_seconds, 0.0
        return seconds

    def compile(self, state: StaticRollout, *, fallback: bool) -> None:
        """Make state.step run the compiled step, paying any compile now: one step is run (compiling a shape seen
        for the first time; timed into compile_seconds when dynamo compiled) and its effect undone, so the caller's
        first step is still column 1. When compiling fails: with fallback, warn once in one line, remember the
        reason (the session's later rollouts take "static") and leave the step eager; without, raise."""
        saved = [t.clone() for t in state.state()]
        state.fn = compile_backend(self.backend, self.mode)
        before, start = compiled_graphs(), time.perf_counter()
        try:
            with torch._dynamo.config.patch(**{RECOMPILE_LIMIT: MAX_SHAPES}):
                state.step(state.steps.bound(1))  # bounded: the graph is dynamic in the attention's columns
            _synchronize(state.token.device)
        except Exception as err:  # any compiler failure (dynamo, Inductor, a C or Triton toolchain): see docstring
            state.fn = fixed_step
            if not fallback:
                raise
            self.failed = failure_reason(err)
            warnings.warn(
                f"decode='auto': compiling the decode step failed ({self.failed[:300]}); decoding with 'static' "
                "for the rest of the run",
                RuntimeWarning,
                stacklevel=2,
            )
        finally:
            for t, s in zip(state.state(), saved):
                t.copy_(s)
        if compiled_graphs() > before:
            self.compiled += compiled_graphs() - before
            self.compile_seconds += time.perf_counter() - start


@dataclass(frozen=True)
class StaticLoop:
    """How `sample_static` runs the fixed-shape loop (`_sample` sets it from decode and the device).

    dtype: the weights' and cache's dtype while decoding (None: the model's, or autocast's where the caller samples
    under autocast). check_every: steps between two looks at whether every row is done (None:
    `check_every_default`); the tokens do not depend on it. capture: the step captured in a CUDA graph and
    replayed. noise: "stream" (`stream_noise`: the tokens of the "hand" path), "device" (`device_noise`: a buffer
    filled on the device before each step) or "seeded" (`seeded_noise`: drawn inside the step from a per-rollout
    seed, no buffer, the same tokens eager and compiled); None: "stream" on the CPU, "seeded" elsewhere. fused: the
    step reads QKV and gate/up joined (decode.fuse, a session copy refreshed in place at each rollout; 3 of 7
    projection GEMMs a layer fewer). block: attention reads length buckets of this many columns (FixedSteps' block,
    LENGTH_BLOCK on CUDA; None: every column). compiled: the step compiled by the session's backend
    (`DecodeSession.compile`), the prompts left-padded to `bucket_width` and the rope table as long as the columns,
    so that every rollout of a bucket has one shape. fallback: a compile failure leaves this and the session's later
    rollouts on the static step with a warning instead of raising."""

    dtype: torch.dtype | None = None
    check_every: int | None = None
    capture: bool = False
    noise: str | None = None
    fused: bool = False
    block: int | None = None
    compiled: bool = False
    fallback: bool = False


def sample_static(
    model,
    decoder: HandDecoder,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    sampling: Sampling,
    *,
    generator: torch.Generator | None,
    session: DecodeSession | None = None,
    loop: StaticLoop = StaticLoop(),
) -> tuple[Tensor, Tensor]:
    """`sample`'s "static" and "compile" paths (call it through `sample`): the prefill as in the other paths, then
    one StaticRollout step per token, captured in a CUDA graph and replayed when loop.capture, with every row in
    place to the end; the loop stops at sampling.max_new_tokens or when a look, every loop.check_every steps, finds
    every row done (`StaticLoop`: the loop's dtype, capture, noise, compile and fallback)."""
    device = prompt_ids.device
    session = session or DecodeSession()
    max_new_tokens = sampling.max_new_tokens
    check_every = loop.check_every or check_every_default(device)
    if check_every < 1:
        raise ValueError(f"check_every must be >= 1, got {check_every}")
    dtype = loop.dtype
    if dtype is None and torch.is_autocast_enabled(device.type):  # a caller generating under autocast
        dtype = torch.get_autocast_dtype(device.type)
    if loop.compiled:  # one shape per bucket (within a sliding window, which padding must not outgrow)
        width = bucket_width(prompt_ids.shape[1])
        if decoder.window is not None:
            width = max(prompt_ids.shape[1], min(width, decoder.window - max_new_tokens))
        prompt_ids, prompt_mask = pad_left(prompt_ids, prompt_mask, width, sampling.pad_id)
    kind = loop.noise or ("stream" if device.type == "cpu" else "seeded")
    if kind not in NOISE:
        raise ValueError(f"noise must be one of {', '.join(NOISE)}, got {kind!r}")
    seed = rollout_seed(generator, device) if kind == "seeded" else None
    state, logits = _prefilled(model, decoder, prompt_ids, prompt_mask, sampling, dtype, session, loop, seed)
    steps = state.steps
    noise = {"stream": stream_noise, "device": lambda g: device_noise(g, device), "seeded": lambda g: _no_fill}[kind](
        generator
    )
    # Inductor's graphs, not `captured`
    own_graphs = loop.compiled and loop.capture and session.mode == "reduce-overhead"
    with torch.autocast(device.type, enabled=False):  # the step's dtypes are its own (dtype), not autocast's
        noise(state)
        state.record(logits)  # column 0, from the prefill
        if own_graphs:
            buffers = [state.noise, state.seed, *weight_tensors(steps.weights), *steps.keys, *steps.values]
            for t in [*state.state(), *(b for b in buffers if b is not None)]:
                torch._dynamo.mark_static_address(t)
        if loop.compiled and max_new_tokens > 1:
            session.compile(state, fallback=loop.fallback)
        step = Stepper(state, max_new_tokens, capture=loop.capture and not own_graphs)
        _run(state, step, noise, max_new_tokens, check_every, session, own_graphs)
    width = int(state.length.max())
    return state.response[:, :width], state.logp[:, :width]


def _prefilled(model, decoder, prompt_ids, prompt_mask, sampling: Sampling, dtype, session, loop: StaticLoop, seed):
    """(StaticRollout, logits (rows, V) after each prompt): the prefill (under autocast to `dtype` where it is a
    half type), each prompt's keys and values repeated to its sampling.n rows in FixedSteps' buffers."""
    device, max_new_tokens = prompt_ids.device, sampling.max_new_tokens
    with torch.autocast(device.type, dtype=dtype or torch.bfloat16, enabled=dtype in (torch.bfloat16, torch.float16)):
        out = model(
            input_ids=prompt_ids,
            attention_mask=prompt_mask.long(),
            position_ids=position_ids(prompt_mask),
            use_cache=True,
            logits_to_keep=1,
        )
    prompt_of = torch.arange(prompt_ids.shape[0], device=device).repeat_interleave(sampling.n)  # (rows,)
    logits = out.logits[prompt_of, -1]
    steps = FixedSteps(
        decoder,
        cache_of(out),
        prompt_of,
        prompt_mask,
        max_new_tokens,
        dtype=dtype,
        weights=session.weights(model, decoder, dtype, loop.fused),
        rope_positions=prompt_ids.shape[1] + max_new_tokens if loop.compiled else None,
        block=loop.block,
    )
    del out  # the prefill's cache, copied into the step's buffers
    state = StaticRollout(
        steps,
        len(prompt_of),
        logits.shape[-1],
        max_new_tokens,
        eos_ids=sampling.eos_ids,
        pad_id=sampling.pad_id,
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        device=device,
        seed=seed,
    )
    return state, logits


def _run(state: StaticRollout, step, noise, max_new_tokens: int, check_every: int, session, own_graphs: bool):
    """Steps 1 .. max_new_tokens - 1 (column 0 came from the prefill), stopping early when a look every
    check_every steps finds every row done; timed into session.loops when the session times."""
    device, done = state.token.device, 0
    if session.timing:
        _synchronize(device)
    start = time.perf_counter()
    for t in range(1, max_new_tokens):
        if t % check_every == 0 and bool(state.done.all()):
            break
        noise(state)
        if own_graphs:
            torch.compiler.cudagraph_mark_step_begin()
        step(t)
        done = t
    if session.timing:
        _synchronize(device)
        session.loops.append((done, time.perf_counter() - start))
