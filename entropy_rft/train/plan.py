"""Memory plan of a training run from the model's config.json alone (no weights): `entropy-rft plan`.

What the built-in trainer holds on its device, row by row (P: parameters, P_t: trainable parameters, P_lin: the
parameters of the decoder's linear weight matrices, N = rows x T tokens in one pass, T = prompt + max_new_tokens,
N_r = rows x max_new_tokens response tokens; bytes):

1. weights, 4 P. `policy.load_policy` loads the policy in float32. precision bf16 is autocast: the float32 weights
   are the master weights and there is no second copy (and no bf16 weight storage outside autocast's casts).
2. gradients, 4 P_t (float32, kept from backward until the next step's zero_grad).
3. Adam, 8 P_t: torch.optim.Adam's exp_avg and exp_avg_sq in float32. Its `step` counters are 0-dim float32
   tensors, one per parameter tensor (on the device for the fused Adam the trainer uses: 4 bytes each, left out).
4. LoRA (lora_rank r > 0): P_t = r (d_in + d_out) per adapted linear layer ('all-linear': every linear layer of
   the decoder, not the LM head, as PEFT chooses); the frozen base stays in float32 (4 P).
5. entropy probe (rules.StepRules.probe_every: probe_every, or every step under the mu controller): on probe steps
   the trainer keeps d(mean H)/d(theta) of every trainable parameter through the update, 4 P_t (forward.EntropyProbe).
6. reference policy (kl_coef > 0): a second float32 copy, 4 P. PPO's value head: hidden + 1 trainable parameters.
7. autocast casts (bf16): each trainable weight matrix is cast to bfloat16 once per forward and cached until the
   forward ends, 2 P_lin; frozen (LoRA base) matrices are cast per call and held by autograd for the backward only
   without checkpointing.
8. activations: the tensors autograd saves, counted per decoder layer and token for the decoders supported here
   (qwen2, qwen3, llama, mistral, under HF's sdpa attention with a padding mask, so keys and values are repeated
   to every head). With a = 2 bytes (bf16) or 4 (fp32), h hidden, i intermediate, H heads of size d:
     two RMSNorms (float32 residual stream: input and normalised output each)   16 h
     the linear layers' inputs: bf16, q, k, v, gate and up inputs cast (10 h);
       fp32, the two norms' outputs (8 h)                                          10 h or 8 h
     attention: q, k, v (repeated to H heads), output, and float32 logsumexp      4 a H d + 4 H
     the padding mask converted to an additive bias, per row                      a T  (per token: a T^2 per row)
     MLP: gate, SiLU(gate), up and their product                                  4 a i
     qwen3 only, the q and k RMSNorms over d                                      ((4 + a) d + 4) (H + KV)
     LoRA: each adapter's rank-r input                                            a r per adapted layer
       (and: the frozen norms keep no normalised output, -8 h; bf16 o_proj input copy, +2 H d)
   plus, once per pass: the final norm (8 h per token), the last hidden state of each response token (4 h), the
   RoPE tables (8 d per token), token ids (8 per token). Without gradient checkpointing every layer's activations
   are saved. With it, each layer saves only its float32 input (4 h per token; the boolean mask, T^2 per row, stays
   with the checkpoints) and the backward recomputes one layer at a time: saved inputs + one layer's activations
   + the residual stream's gradients (8 h per token).
   tests/test_plan.py checks the count against the bytes autograd saves on the CPU (exact for qwen2, qwen3, llama
   and mistral, bf16 and fp32) and the peak against the profiler's (within 1.5%). On CUDA the attention kernel
   (memory-efficient SDPA under a padding mask) should save the same tensors up to padding: not measured here.
   Allocator fragmentation is not modelled; the CUDA context is a fixed row (10).
9. statistics tile: on CUDA `dynamics.token_stats_from_hidden` runs the Triton kernels of `entropy_rft.core.kernels`,
   which reuse one row_chunk x vocab_chunk buffer of logits in the matmul's dtype (a bytes each, their defaults);
   the backward adds the float32 gradient of the hidden states (4 h N_r), one GEMM product of a tile and W or h
   and its float32 copy ((a + 4) h x the longer tile side; the vocab side only when the LM head trains) and, when
   the LM head trains, a float32 [V, h] buffer for its gradient.
   On a CPU (kernel "torch") it streams 512 x 2048 float32 tiles instead: about three live in the forward and
   five in the backward (tests/test_plan.py measures that path against the profiler). Models whose logits are
   not lm_head(hidden) (or stats_from_hidden false) materialise [N, V] logits instead (about a V N + 16 V N_r).
10. vLLM (engine vllm): `vllm_gpu_memory` of the device is vLLM's (its bf16 weights, 2 P, and its KV cache);
   the trainer gets the rest. CUDA context and workspace: a fixed 1 GiB.

Measured on an H100 (benchmarks/gpu.md: Qwen2.5-0.5B and 1.5B full fine-tuning, a 7B-shaped LoRA, bf16,
checkpointing, 32 rows x (512 + 2048) tokens): torch.cuda.max_memory_allocated was 2% to 9% above the plan's
rows without the fixed CUDA row (what CUDA allocates outside the model is not modelled). So a plan "fits" only
with HEADROOM (10%) of its trainer peak to spare.

The peak is the largest of four moments: the end of a forward (autocast's cached casts, every saved activation),
the statistics' backward (saved activations, the tiles, d hidden and the LM head's gradient buffer), the backward
through the decoder layers (saved activations, one recomputed layer under checkpointing, the residual stream's
gradients) and, with the HF engine, generation (the float32 KV cache of one generate call of up to 512 rows,
every row at prompt + max_new_tokens, and a step's [rows, V] logits). Rows 1-6 are held throughout.

Departures from the trainer, numbered (where the plan is conservative):
1. The shared-prefix forward (each GRPO group's prompt run once, without checkpointing) is counted as if every
   row ran its prompt: an upper estimate of the prompt's share.
2. Every response is taken at max_new_tokens and the prompt at `prompt_tokens` (a planning input, default 512).
3. Gradients are counted as held at the peak: true under gradient accumulation (from a mini-batch's second
   micro-batch on) and while generating; with a single micro-batch they grow during the backward as activations
   are freed, so the plan overstates that case by up to 4 P_t.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path

from ..config import TrainConfig

GIB = 1 << 30
SHAPES_DIR = Path(__file__).parents[1] / "assets" / "shapes"
SUPPORTED = ("qwen2", "qwen3", "llama", "mistral")
CUDA_CONTEXT_BYTES = 1 * GIB  # CUDA context, cuBLAS workspace, allocator slack (a fixed estimate)
DEFAULT_DEVICE_GIB = 80.0
DEFAULT_PROMPT_TOKENS = 512
HF_GENERATE_ROWS = 512  # rollout.hf.HFEngine's default batch_size: sequences per generate call
HEADROOM = 0.10  # measured: CUDA allocated 2-9% above the plan's rows on an H100 (module docstring)
LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class ModelShape:
    """The sizes of a decoder-only transformer that decide its memory, read from config.json."""

    model_type: str
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    qk_norm: bool

    @classmethod
    def from_config(cls, config: dict, *, source: str = "config.json") -> ModelShape:
        config = config.get("text_config", config)
        kind = config.get("model_type")
        if kind not in SUPPORTED:
            raise ValueError(
                f"{source}: model_type {kind!r} is not one the plan counts ({', '.join(SUPPORTED)}); "
                "its layer layout would need adding to entropy_rft/train/plan.py"
            )
        missing = [
            k
            for k in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size")
            if k not in config
        ]
        if missing:
            raise ValueError(f"{source}: config.json lacks {missing}; pass the model's own config.json")
        h, heads = config["hidden_size"], config["num_attention_heads"]
        attention_bias = bool(config.get("attention_bias", False))
        return cls(
            model_type=kind,
            hidden=h,
            intermediate=config["intermediate_size"],
            layers=config["num_hidden_layers"],
            heads=heads,
            kv_heads=config.get("num_key_value_heads") or heads,
            head_dim=config.get("head_dim") or h // heads,
            vocab=config["vocab_size"],
            tied=bool(config.get("tie_word_embeddings", False)),
            qkv_bias=kind == "qwen2" or attention_bias,  # Qwen2 always biases q, k, v
            o_bias=kind != "qwen2" and attention_bias,
            mlp_bias=bool(config.get("mlp_bias", False)),
            qk_norm=kind == "qwen3",
        )

    def linear_shapes(self) -> dict[str, tuple[int, int]]:
        """(in, out) of each linear layer of one decoder layer."""
        h, i, q, kv = self.hidden, self.intermediate, self.heads * self.head_dim, self.kv_heads * self.head_dim
        return {
            "q_proj": (h, q),
            "k_proj": (h, kv),
            "v_proj": (h, kv),
            "o_proj": (q, h),
            "gate_proj": (h, i),
            "up_proj": (h, i),
            "down_proj": (i, h),
        }

    def layer_linear_params(self) -> int:
        return sum(a * b for a, b in self.linear_shapes().values())

    def layer_params(self) -> int:
        s = self.linear_shapes()
        bias = 0
        if self.qkv_bias:
            bias += s["q_proj"][1] + s["k_proj"][1] + s["v_proj"][1]
        if self.o_bias:
            bias += self.hidden
        if self.mlp_bias:
            bias += 2 * self.intermediate + self.hidden
        norms = 2 * self.hidden + (2 * self.head_dim if self.qk_norm else 0)
        return self.layer_linear_params() + bias + norms

    def params(self) -> int:
        embed = self.vocab * self.hidden
        return embed * (1 if self.tied else 2) + self.layers * self.layer_params() + self.hidden

    def param_tensors(self) -> int:
        """How many parameter tensors (one Adam step counter each)."""
        per_layer = 7 + 2 + (3 if self.qkv_bias else 0) + self.o_bias + (3 if self.mlp_bias else 0) + 2 * self.qk_norm
        return (1 if self.tied else 2) + self.layers * per_layer + 1

    def lora_params(self, rank: int, targets: str) -> tuple[int, int]:
        """(trainable adapter parameters, adapted linear layers per decoder layer) for PEFT LoRA."""
        shapes = self.linear_shapes()
        names = list(LINEARS) if targets == "all-linear" else [t.strip() for t in targets.split(",") if t.strip()]
        unknown = [n for n in names if n not in shapes]
        if unknown:
            raise ValueError(
                f"lora_targets names {unknown}, not linear layers of a {self.model_type} decoder "
                f"({', '.join(LINEARS)}); use 'all-linear' or a comma-separated subset"
            )
        return self.layers * sum(rank * sum(shapes[n]) for n in names), len(names)


def shipped_shape_dir(model: str) -> Path:
    """Where a hub id's shipped config.json lives: assets/shapes/ORG--NAME/config.json."""
    return SHAPES_DIR / model.replace("/", "--")


def find_model_config(model: str) -> tuple[dict, str]:
    """config.json of a model without loading it: a shipped model name, a local directory (a LoRA checkpoint's
    base model followed), or a hub id whose shape ships in entropy_rft/assets/shapes. Returns (config, source)."""
    from .policy import BUILTIN_MODELS, STAND_IN

    if model == STAND_IN:
        from .policy import resolve_model_path

        model = resolve_model_path(model)
    path = BUILTIN_MODELS.get(model, Path(model).expanduser())
    if path.is_dir():
        if (path / "config.json").exists():
            return json.loads((path / "config.json").read_text()), str(path / "config.json")
        if (path / "adapter_config.json").exists():
            base = json.loads((path / "adapter_config.json").read_text()).get("base_model_name_or_path")
            if base:
                return find_model_config(base)
        raise FileNotFoundError(f"{path} holds no config.json; pass --model DIR with the model's config.json")
    shipped = shipped_shape_dir(model) / "config.json"
    if shipped.exists():
        return json.loads(shipped.read_text()), f"{shipped} (shipped shape of {model})"
    raise FileNotFoundError(
        f"no config.json for model {model!r}: it is not a local directory and no shape of it ships in "
        f"{SHAPES_DIR}. Download only its config.json (e.g. `hf download {model} config.json --local-dir DIR`) "
        "and pass --model DIR"
    )


def stats_tile(kernel: str = "triton") -> tuple[int, int]:
    """(row_chunk, vocab_chunk): the tile token_stats_from_hidden streams with `kernel`: "triton" on a CUDA device
    (entropy_rft.core.kernels' defaults) or "torch" (the torch-ops path of a CPU or a GPU without Triton)."""
    from ..core import dynamics, kernels

    if kernel == "triton":
        return kernels.GPU_ROW_CHUNK, kernels.GPU_VOCAB_CHUNK
    if kernel == "torch":
        return dynamics.TORCH_ROW_CHUNK, dynamics.TORCH_VOCAB_CHUNK
    raise ValueError(f"kernel must be 'triton' or 'torch', got {kernel!r}")


# ---------------------------------------------------------------------------------------------------------------
# Activations (module docstring, row 8)


def layer_activation_bytes(
    shape: ModelShape, *, precision: str, lora_rank: int = 0, lora_layers: int = 0, seq_len: int
) -> float:
    """Bytes autograd saves in one decoder layer per token (the padding mask's bias: seq_len of them per token)."""
    a = 2 if precision == "bf16" else 4
    h, i, heads, d, kv = shape.hidden, shape.intermediate, shape.heads, shape.head_dim, shape.kv_heads
    # two RMSNorms on the float32 residual stream: input, normalised output (kept for a trained norm weight), 1/rms
    norms = (8 if lora_rank else 16) * h + 8
    # the linear layers' inputs: bf16, the q, k, v, gate and up inputs cast to bf16; fp32, the two norms' outputs
    casts = 10 * h if precision == "bf16" else 8 * h
    attention = 4 * a * heads * d + 4 * heads  # q, k, v repeated to every head, output; logsumexp
    mask_bias = a * seq_len
    mlp = 4 * a * i
    qk_norm = ((4 + a) * d + 4) * (heads + kv) if shape.qk_norm else 0  # float32 input, cast output, 1/rms
    lora = a * lora_rank * lora_layers
    if lora_rank and precision == "bf16":  # PEFT casts o_proj's bf16 input to float32 and autocast casts it back
        lora += 2 * heads * d
    return norms + casts + attention + mask_bias + mlp + qk_norm + lora


def pass_activation_bytes(
    shape: ModelShape,
    *,
    rows: int,
    prompt: int,
    response: int,
    precision: str,
    checkpointing: bool,
    lora_rank: int = 0,
    lora_layers: int = 0,
    value_head: bool = False,
) -> dict[str, float]:
    """Activation bytes of one training forward over `rows` rows: 'saved' at the end of the forward, and
    'backward' as the backward reaches the decoder layers (saved + one recomputed layer under checkpointing + the
    residual stream's gradients). Every response is taken at full length (the worst batch): the trainer's forward
    skips right padding (forward.length_buckets), so a batch of shorter responses keeps less."""
    t = prompt + response - 1  # the decoder's inputs: the last response token predicts nothing the loss uses
    n, n_r, h = rows * t, rows * response, shape.hidden
    layer = n * layer_activation_bytes(
        shape, precision=precision, lora_rank=lora_rank, lora_layers=lora_layers, seq_len=t
    )
    outside = (
        n * ((4 if lora_rank else 8) * h + 4)  # final RMSNorm: input (and normalised output, if trained)
        + n_r * (4 * h + 8)  # the last hidden state of each response token, its logsumexp and mean logit
        + n_r * (8 + 8 + 1)  # log p and H (scattered back to rows), their flat positions, the valid mask
        + n * 8 * shape.head_dim  # RoPE cos and sin (float32)
        + 8 * ((0 if lora_rank else n) + n_r)  # input ids (for a trained embedding), token ids
        + (n * 4 * h if value_head else 0)
    )  # the value head's input
    if checkpointing:
        saved = shape.layers * n * 4 * h + outside + rows * t * t  # the checkpoints keep the boolean mask
        return {"saved": saved, "backward": saved + layer + 8 * n * h}
    saved = shape.layers * layer + outside
    return {"saved": saved, "backward": saved + 8 * n * h}


# ---------------------------------------------------------------------------------------------------------------
# The plan


@dataclass
class Plan:
    model: str
    source: str
    shape: ModelShape
    params: int
    trainable: int
    rows: int
    prompt_tokens: int
    response_tokens: int
    precision: str
    checkpointing: bool
    lora_rank: int
    device_bytes: float
    device_note: str
    vllm_bytes: float
    items: dict[str, float]  # held throughout, bytes
    phase: str  # the peak's moment (forward, statistics backward, layer backward, generate)
    peak_items: dict[str, float]  # the peak moment's transient rows, bytes
    notes: list[str]
    phase_totals: dict[str, float]  # trainer memory at each moment, bytes

    @property
    def training_bytes(self) -> float:
        return sum(self.items.values()) + sum(self.peak_items.values())

    @property
    def budget_bytes(self) -> float:
        return self.device_bytes - self.vllm_bytes

    @property
    def fits(self) -> bool:
        return self.training_bytes * (1 + HEADROOM) <= self.budget_bytes

    def to_json(self) -> dict:
        g = lambda x: round(x / GIB, 3)  # noqa: E731
        return {
            "model": self.model,
            "config": self.source,
            "params": self.params,
            "trainable": self.trainable,
            "rows_per_pass": self.rows,
            "prompt_tokens": self.prompt_tokens,
            "response_tokens": self.response_tokens,
            "precision": self.precision,
            "gradient_checkpointing": self.checkpointing,
            "lora_rank": self.lora_rank,
            "peak_phase": self.phase,
            "gib": {**{k: g(v) for k, v in self.items.items()}, **{k: g(v) for k, v in self.peak_items.items()}},
            "training_gib": g(self.training_bytes),
            "vllm_gib": g(self.vllm_bytes),
            "phases_gib": {k: g(v) for k, v in self.phase_totals.items()},
            "device_gib": g(self.device_bytes),
            "fits": self.fits,
            "notes": self.notes,
        }

    def table(self) -> str:
        g = lambda x: f"{x / GIB:10.2f}"  # noqa: E731
        lines = [
            f"Memory plan for {self.model} ({self.source})",
            f"  {self.params / 1e9:.3f}B parameters, {self.trainable / 1e9:.4f}B trainable"
            + (f" (LoRA rank {self.lora_rank})" if self.lora_rank else "")
            + f"; {self.precision}; gradient checkpointing {'on' if self.checkpointing else 'off'}; "
            f"{self.rows} rows x ({self.prompt_tokens} prompt + {self.response_tokens} response) tokens per pass",
            "",
            f"  {'what':<72}{'GiB':>10}",
        ]
        for k, v in self.items.items():
            lines.append(f"  {k:<72}{g(v)}")
        for k, v in self.peak_items.items():
            lines.append(f"  {k + ' [' + self.phase + ']':<72}{g(v)}")
        lines += [
            f"  {'= trainer peak (estimate)':<72}{g(self.training_bytes)}",
            "    (trainer at each moment, GiB: "
            + ", ".join(f"{k} {v / GIB:.2f}" for k, v in self.phase_totals.items())
            + ")",
        ]
        if self.vllm_bytes:
            lines.append(f"  {'+ vLLM share (vllm_gpu_memory)':<72}{g(self.vllm_bytes)}")
        lines += [
            f"  {'= total':<72}{g(self.training_bytes + self.vllm_bytes)}",
            f"  {'device (' + self.device_note + ')':<72}{g(self.device_bytes)}",
        ]
        lines += [f"  note: {n}" for n in self.notes]
        verdict = "fits" if self.fits else "does NOT fit"
        lines.append(
            f"  -> {verdict}: {(self.training_bytes + self.vllm_bytes) / GIB:.1f} of "
            f"{self.device_bytes / GIB:.1f} GiB, with {HEADROOM:.0%} of the trainer peak kept as headroom "
            "(module docstring)"
        )
        return "\n".join(lines)


def _peak_phase(phases: list[tuple[str, dict[str, float]]]) -> tuple[str, dict[str, float]]:
    """The phase with the most bytes above what is held throughout, and its non-zero items (activations and HF
    generate's items shown even at 0)."""
    phase, peak = max(phases, key=lambda kv: sum(kv[1].values()))
    return phase, {k: v for k, v in peak.items() if v or k.startswith(("activations", "HF"))}


def _generate_items(shape: ModelShape, rows: int, length: int) -> dict[str, float]:
    """HF generate's bytes between updates: the float32 KV cache of one generate call (rows at length tokens) and
    one step's logits and sampling."""
    kv_bytes = 2 * shape.layers * shape.kv_heads * shape.head_dim * 4
    return {
        f"HF generate: float32 KV cache ({rows} rows x {length})": kv_bytes * rows * length,
        "HF generate: logits and sampling of one step (float32 [rows, V] x 3)": 3 * 4 * rows * shape.vocab,
    }


def plan_memory(
    cfg: TrainConfig,
    shape: ModelShape,
    *,
    device_gib: float = DEFAULT_DEVICE_GIB,
    prompt_tokens: int = DEFAULT_PROMPT_TOKENS,
    model: str | None = None,
    source: str = "config.json",
    device_note: str = "given",
    kernel: str = "triton",
) -> Plan:
    """The memory plan of `cfg` for a model of `shape` on a device of `device_gib` GiB (module docstring);
    `kernel` names the statistics' path (row 9): "triton" on CUDA, "torch" on a CPU."""
    from .rules import StepRules

    if prompt_tokens < 1:
        raise ValueError(f"prompt_tokens must be >= 1, got {prompt_tokens}")
    if device_gib <= 0:
        raise ValueError(f"device memory must be > 0 GiB, got {device_gib}")
    rules = StepRules.of(cfg)  # the step's shape: rows per pass, a critic, a reference, the probe's cadence
    held, trainable, head_params, lora_layers = _held_bytes(cfg, shape, rules)
    rows, notes = _rows_per_pass(cfg, rules)
    phases = _phases(
        cfg,
        shape,
        rules,
        rows=rows,
        prompt_tokens=prompt_tokens,
        kernel=kernel,
        adapters_bf16=2 * (trainable - head_params) if cfg.lora_rank > 0 else 0,
        lora_layers=lora_layers,
    )
    phase_totals = {name: sum(held.values()) + sum(rows_.values()) for name, rows_ in phases}
    phase, peak = _peak_phase(phases)
    vllm = cfg.vllm_gpu_memory * device_gib * GIB if cfg.engine == "vllm" else 0.0
    if vllm:
        notes.append(_vllm_note(shape, vllm))
    return Plan(
        model=model or cfg.model,
        source=source,
        shape=shape,
        params=shape.params(),
        trainable=trainable,
        rows=rows,
        prompt_tokens=prompt_tokens,
        response_tokens=cfg.max_new_tokens,
        precision=cfg.precision,
        checkpointing=cfg.gradient_checkpointing,
        lora_rank=cfg.lora_rank,
        device_bytes=device_gib * GIB,
        device_note=device_note,
        vllm_bytes=vllm,
        items=held,
        phase=phase,
        peak_items=peak,
        notes=notes,
        phase_totals=phase_totals,
    )


def _rows_per_pass(cfg: TrainConfig, rules) -> tuple[int, list[str]]:
    """(rows in one pass, the plan's notes so far): a micro-batch, or the whole batch when the update's forward is
    held for the filter."""
    batch = cfg.prompts_per_step * cfg.group_size
    if rules.holds_whole_batch(batch):
        note = (
            f"reuse_forward on holds every micro-batch's forward until the filter: {batch} rows of activations at once"
        )
        return batch, [note]
    return rules.rows_per_pass(batch), []


def _phases(
    cfg: TrainConfig,
    shape: ModelShape,
    rules,
    *,
    rows: int,
    prompt_tokens: int,
    kernel: str,
    adapters_bf16: int,
    lora_layers: int,
) -> list[tuple[str, dict[str, float]]]:
    """The step's moments above what it holds throughout: one pass's activations in each forward and backward (rows
    7-9), and HF generate's bytes between updates."""
    response = cfg.max_new_tokens
    act = pass_activation_bytes(
        shape,
        rows=rows,
        prompt=prompt_tokens,
        response=response,
        precision=cfg.precision,
        checkpointing=cfg.gradient_checkpointing,
        lora_rank=cfg.lora_rank,
        lora_layers=lora_layers,
        value_head=rules.critic,
    )
    phases = _pass_phases(
        cfg, shape, act, rows=rows, prompt_tokens=prompt_tokens, kernel=kernel, adapters_bf16=adapters_bf16
    )
    if cfg.engine == "hf":  # generation between updates
        batch = cfg.prompts_per_step * cfg.group_size
        phases.append(("generate", _generate_items(shape, min(HF_GENERATE_ROWS, batch), prompt_tokens + response)))
    return phases


def _held_bytes(cfg: TrainConfig, shape: ModelShape, rules) -> tuple[dict[str, float], int, int, int]:
    """(what the whole step holds: weights, gradients, Adam, the probe's gradient, the reference; trainable
    parameters; the value head's; LoRA's adapted layers)."""
    P = shape.params()
    head_params = shape.hidden + 1 if rules.critic else 0
    lora_layers = 0
    if cfg.lora_rank > 0:
        adapters, lora_layers = shape.lora_params(cfg.lora_rank, cfg.lora_targets)
        trainable = adapters + head_params
    else:
        trainable = P + head_params
    if cfg.lora_rank > 0:
        held: dict[str, float] = {"weights (float32: frozen base + adapters)": 4 * (P + trainable)}
    else:
        held = {"weights (float32, the master copy)": 4 * (P + head_params)}
    held["gradients (float32)"] = 4 * trainable
    held["Adam exp_avg + exp_avg_sq (float32)"] = 8 * trainable
    if rules.probe_every > 0:
        every = "every step" if rules.probe_every == 1 else f"every {rules.probe_every} steps"
        held[f"entropy probe: d(mean H)/d(theta) ({every})"] = 4 * trainable
    if rules.reference:
        held["reference policy (float32, kl_coef > 0)"] = 4 * P
    held["CUDA context and workspace (fixed estimate)"] = CUDA_CONTEXT_BYTES
    return held, trainable, head_params, lora_layers


def _pass_phases(
    cfg: TrainConfig, shape: ModelShape, act: dict, *, rows: int, prompt_tokens: int, kernel: str, adapters_bf16: float
) -> list[tuple[str, dict[str, float]]]:
    """What one pass of `rows` rows holds besides the step's state, in each phase: forward, the statistics'
    backward, the layers' backward (rows 7-9 of the module docstring)."""
    response = cfg.max_new_tokens
    # autocast's bf16 casts of the weight matrices (row 7): cached while a forward runs (trainable) and held by
    # autograd until the backward without checkpointing; under checkpointing, one layer's during its recompute
    one_layer = 2 * shape.layer_linear_params()
    lm_lin = 2 * shape.layers * shape.layer_linear_params()
    if cfg.precision != "bf16":
        casts_fwd = casts_saved = casts_recompute = 0.0
    elif cfg.gradient_checkpointing:
        casts_fwd = (one_layer + adapters_bf16) if cfg.lora_rank > 0 else lm_lin
        casts_saved, casts_recompute = 0.0, one_layer
    else:
        casts_fwd = casts_saved = casts_recompute = lm_lin + adapters_bf16
    # statistics (row 9)
    n_r, n = rows * response, rows * (prompt_tokens + response)
    a = 2 if cfg.precision == "bf16" else 4
    row_chunk, vocab_chunk = stats_tile(kernel)
    rows_t, cols_t = min(row_chunk, n_r), min(vocab_chunk, shape.vocab)
    head_trains = cfg.lora_rank == 0
    streams = cfg.stats_from_hidden and shape.model_type in SUPPORTED
    if streams and kernel == "triton":  # one logits tile in the matmul's dtype; the backward's GEMM product + fp32 copy
        tile = a * rows_t * cols_t
        stats_fwd = tile
        stats_bwd = tile + 4 * shape.hidden * n_r + (a + 4) * max(rows_t, cols_t if head_trains else 0) * shape.hidden
        stats_name = (
            f"statistics tile ({row_chunk} x {vocab_chunk} {'bf16' if a == 2 else 'float32'}; backward: + d hidden)"
        )
    elif streams:  # the torch-ops path: float32 tiles, about three live in the forward and five in the backward
        tile = 4 * rows_t * cols_t
        stats_fwd = 3 * tile
        stats_bwd = 5 * tile + 4 * shape.hidden * n_r
        stats_name = f"statistics tiles ({row_chunk} x {vocab_chunk} float32; backward: + d hidden)"
    else:
        stats_fwd = stats_bwd = a * n * shape.vocab + 16 * shape.vocab * n_r
        stats_name = "logits [N, V] and their float32 statistics (stats_from_hidden off)"
    lm_grad = 4 * shape.vocab * shape.hidden if head_trains else 0
    acts = "activations" + (" (checkpointed layer inputs)" if cfg.gradient_checkpointing else "")
    casts = "bf16 weight casts (autocast)"
    forward = {casts: casts_fwd, acts: act["saved"], stats_name: stats_fwd}
    stats_backward = {
        casts: casts_saved,
        acts: act["saved"],
        stats_name: stats_bwd,
        "LM head gradient buffer (float32 [V, h])": lm_grad,
    }
    layer_backward = {
        casts: casts_recompute,
        "activations"
        + (" (layer inputs + one recomputed layer)" if cfg.gradient_checkpointing else "")
        + " + residual gradients": act["backward"],
    }
    return [("forward", forward), ("statistics backward", stats_backward), ("layer backward", layer_backward)]


def _vllm_note(shape: ModelShape, vllm: float) -> str:
    """What vLLM's share of the device holds: its bf16 weights and the KV cache the rest allows."""
    weights16 = 2 * shape.params()
    if weights16 >= vllm:
        return (
            f"vLLM's share ({vllm / GIB:.1f} GiB) is smaller than its bf16 weights "
            f"({weights16 / GIB:.1f} GiB): raise vllm_gpu_memory"
        )
    kv = 2 * shape.layers * shape.kv_heads * shape.head_dim * 2
    return (
        f"vLLM: {weights16 / GIB:.1f} GiB of bf16 weights, about {(vllm - weights16) / GIB:.1f} GiB "
        f"for its KV cache ({(vllm - weights16) / kv / 1e3:.0f}k tokens at {kv // 1024} KiB each)"
    )


def zero3_gpus(plan: Plan, cfg: TrainConfig, shape: ModelShape, *, device_gib: float, max_gpus: int = 64) -> int | None:
    """Fewest GPUs on which DeepSpeed ZeRO-3 (bf16 weights and gradients, float32 master weights and Adam: 16 bytes
    per parameter, sharded) plus this plan's activations fit, with TRL's vLLM on a GPU of its own; None if none."""
    act = sum(v for k, v in plan.peak_items.items() if "weight casts" not in k)
    layer = 2 * shape.layer_params()  # one gathered bf16 layer
    for gpus in (2, 4, 8, 16, 32, 64):
        if gpus > max_gpus:
            break
        per_gpu = 16 * plan.params / gpus + act + 2 * layer + CUDA_CONTEXT_BYTES
        if per_gpu <= device_gib * GIB:
            return gpus
    return None


def suggestions(cfg: TrainConfig, shape: ModelShape, plan: Plan, **kw) -> list[str]:
    """Changes that make the run fit, each checked with the same plan."""
    out = []

    def fits(**changes) -> Plan | None:
        p = plan_memory(dataclasses.replace(cfg, **changes), shape, **kw)
        return p if p.fits else None

    def best_micro(**changes) -> int | None:
        from .rules import StepRules

        m = StepRules.of(cfg).rows_per_pass(cfg.prompts_per_step * cfg.group_size)
        while m >= 1:
            if fits(micro_batch_size=m, **changes):
                return m
            m //= 2
        return None

    if not cfg.gradient_checkpointing:
        m = best_micro(gradient_checkpointing=True)
        if m:
            out.append(f"gradient_checkpointing: true with micro_batch_size: {m}")
    if cfg.gradient_checkpointing or not out:
        m = best_micro(gradient_checkpointing=cfg.gradient_checkpointing)
        if m:
            out.append(f"micro_batch_size: {m}")
    if cfg.lora_rank == 0:
        for rank in (64, 16):
            m = best_micro(lora_rank=rank, gradient_checkpointing=True)
            if m:
                out.append(
                    f"LoRA: lora_rank: {rank} with gradient_checkpointing: true and micro_batch_size: {m} "
                    "(a larger lr than full fine-tuning's; see configs/one_gpu/)"
                )
                break
    if cfg.engine == "vllm":
        weights16 = 2 * plan.params
        low = math.ceil((weights16 / GIB + 4) / (plan.device_bytes / GIB) * 100) / 100
        if low < cfg.vllm_gpu_memory and fits(vllm_gpu_memory=low):
            out.append(f"vllm_gpu_memory: {low} (vLLM's bf16 weights and a small KV cache)")
    device_gib = plan.device_bytes / GIB
    gpus = zero3_gpus(plan, cfg, shape, device_gib=device_gib)
    if gpus:
        out.append(
            f"about {gpus} or more GPUs of {device_gib:.0f} GiB: the TRL adapter "
            "(entropy_rft.integrations.trl) under accelerate with DeepSpeed ZeRO-3 "
            "(examples/accelerate/deepspeed_zero3.yaml; estimate: 16 bytes per parameter sharded, plus this "
            "plan's activations on each GPU, vLLM on a GPU of its own)"
        )
    return out


def detect_device_gib() -> tuple[float | None, str]:
    try:
        import torch

        if torch.cuda.is_available():
            props = torch.cuda.get_device_properties(0)
            return props.total_memory / GIB, f"{props.name}, detected"
    except (ImportError, RuntimeError):
        pass
    return None, "no GPU here: 80 GiB assumed, pass --device-memory"


def plan_for_config(
    cfg: TrainConfig,
    *,
    model: str | None = None,
    device_gib: float | None = None,
    prompt_tokens: int = DEFAULT_PROMPT_TOKENS,
) -> tuple[Plan, ModelShape, dict]:
    """The plan of a loaded recipe: the model's config.json found from `model` (or the recipe's model)."""
    config, source = find_model_config(model or cfg.model)
    shape = ModelShape.from_config(config, source=source)
    note = "given"
    if device_gib is None:
        device_gib, note = detect_device_gib()
        device_gib = device_gib or DEFAULT_DEVICE_GIB
    kw = {
        "device_gib": device_gib,
        "prompt_tokens": prompt_tokens,
        "model": model or cfg.model,
        "source": source,
        "device_note": note,
    }
    return plan_memory(cfg, shape, **kw), shape, kw


def device_memory(device) -> tuple[float | None, str]:
    """(bytes, name) of a torch device's memory: a GPU's total, or a CPU's physical memory; (None, name) when
    unknown (mps)."""
    import os

    import torch

    device = torch.device(device)
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device.index or 0)
        return float(props.total_memory), props.name
    if device.type == "cpu":
        try:
            return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")), "this machine's memory"
        except (ValueError, OSError, AttributeError):
            return None, "cpu"
    return None, device.type


def _shape_of(model: str) -> ModelShape | None:
    """The model's shape for a refusal check, or None where the plan cannot read it (then nothing is checked): the dry
    run's stand-in before it is built (building it here would print its own progress before any refusal), a model
    without a config.json here."""
    from .policy import STAND_IN, cache_dir

    if model == STAND_IN and not (cache_dir() / STAND_IN / "config.json").exists():
        return None
    try:
        config, source = find_model_config(model)
        return ModelShape.from_config(config, source=source)
    except (FileNotFoundError, ValueError, OSError):
        return None


def _refuse_if_too_big(
    need,
    smallest: dict[str, dict],
    *,
    names: dict[str, str],
    shown: dict[str, str],
    total: float,
    where: str,
    device,
    what: str,
    fixes: dict,
) -> None:
    """The one refusal of a size that cannot be allocated (check_fits, check_eval_fits). need(changes) is the bytes
    with `changes` applied, arithmetic on sizes only. When need({}) exceeds `total`, ConfigError names the first size
    of `smallest` (name -> the changes that make it smallest) whose smallest setting fits, else "model": as
    `shown[name]` says it (the field or option and its value), with `fixes[name]` (else fixes["*"] with {name} the
    field or option, names[name])."""
    import warnings

    from ..config import ConfigError

    bytes_needed = need({})
    if bytes_needed <= total:
        return
    culprit = "model"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, changes in smallest.items():
            try:
                if need(changes) <= total:
                    culprit = name
                    break
            except ValueError:
                continue
    fix = fixes.get(culprit, fixes["*"].format(name=names.get(culprit, culprit)))
    raise ConfigError(
        f"{shown[culprit]} cannot be allocated: {what.format(gib=f'{bytes_needed / GIB:.3g}')} and {where} "
        f"({device}) holds {total / GIB:,.1f} GiB; {fix}",
        [(culprit, "cannot be allocated")],
    )


def check_fits(cfg: TrainConfig, device) -> None:
    """Refuse, with ConfigError naming the field, a run whose memory plan (module docstring) exceeds the device's
    memory even at its smallest: a 1-token prompt, no headroom, no CUDA row on a CPU. So only lengths and batch
    sizes that cannot be allocated at all stop here (`--set max_new_tokens=1000000000` would ask 2 TB); a plan near
    the limit is the `plan` subcommand's to judge. The plan is arithmetic on sizes (no tensor of rows), so a batch of
    10^9 rows is refused in milliseconds (benchmarks/refusal_times.py). A model whose shape the plan cannot read is
    not checked (_shape_of)."""
    shape = _shape_of(cfg.model)
    if shape is None:
        return
    total, where = device_memory(device)
    if total is None:
        return
    cuda = str(device).startswith("cuda")

    def need(changes: dict) -> float:
        c = dataclasses.replace(cfg, **changes) if changes else cfg
        p = plan_memory(c, shape, device_gib=total / GIB, prompt_tokens=1, kernel="triton" if cuda else "torch")
        return p.training_bytes + p.vllm_bytes - (0 if cuda else CUDA_CONTEXT_BYTES)

    names = ("max_new_tokens", "prompts_per_step", "group_size", "micro_batch_size")
    _refuse_if_too_big(
        need,
        {n: {n: 1, **({"mini_batches": 1} if n == "prompts_per_step" else {})} for n in names},
        names={},
        shown={"model": f"model={cfg.model}", **{n: f"{n}={getattr(cfg, n)}" for n in names}},
        total=total,
        where=where,
        device=device,
        what="the run needs about {gib} GiB (the memory plan of `entropy-rft plan`, at its smallest: a 1-token prompt)",
        fixes={
            "model": "the model's weights, gradients and Adam state alone exceed it: use LoRA (lora_rank), a smaller "
            "model or a larger device",
            "max_new_tokens": "lower max_new_tokens",
            "*": "lower {name}, or set micro_batch_size to a few rows (gradients accumulate over smaller passes)",
        },
    )


def generate_rows(prompts: int, n: int, batch_size: int) -> int:
    """Rows of one HF generate call (rollout.hf.HFEngine.generate): max(1, batch_size // n) prompts at a time, each
    sampled n times, so a call holds at least n rows whatever batch_size says."""
    return min(prompts, max(1, batch_size // n)) * n


def eval_bytes(
    shape: ModelShape,
    *,
    problems: int,
    n: int,
    max_new_tokens: int,
    batch_size: int,
    engine: str,
    prompt_tokens: int = 1,
) -> float:
    """What `entropy-rft eval` holds at its peak (bytes), as plan_memory counts a training run: the float32 weights
    (row 1), one HF generate call (row 9's generate moment: its rows' float32 KV cache and a step's logits), and the
    samples of every row, kept until they are scored (the rollout's token ids, masks and sampler log p: 13 bytes per
    response token, 9 per prompt token; their texts left out). vLLM holds its own weights and cache in its share of
    the device: only the samples are counted."""
    rows = problems * n
    samples = rows * (13 * max_new_tokens + 9 * prompt_tokens + 1)
    if engine != "hf":
        return float(samples)
    call = generate_rows(problems, n, batch_size)
    return 4 * shape.params() + sum(_generate_items(shape, call, prompt_tokens + max_new_tokens).values()) + samples


def check_eval_fits(
    model: str, device, *, problems: int, n: int, max_new_tokens: int, batch_size: int, engine: str, options: dict
) -> None:
    """check_fits for `entropy-rft eval`: refuse, with ConfigError naming the option (`options`: size -> the option
    given, e.g. {"n": "--eval-k"}), an evaluation whose eval_bytes at a 1-token prompt exceed the device's memory.
    Arithmetic on sizes only; a model whose shape the plan cannot read is not checked."""
    shape = _shape_of(model)
    if shape is None:
        return
    total, where = device_memory(device)
    if total is None:
        return
    sizes = {"n": n, "max_new_tokens": max_new_tokens, "problems": problems, "batch_size": batch_size}
    label = lambda k: options.get(k, k) + ("" if options.get(k, k).endswith("@") else " ")  # noqa: E731
    _refuse_if_too_big(
        lambda changes: eval_bytes(shape, engine=engine, **{**sizes, **changes}),
        {name: {name: 1} for name in sizes},
        names=options,
        shown={"model": f"--model {model}", **{k: f"{label(k)}{v}" for k, v in sizes.items()}},
        total=total,
        where=where,
        device=device,
        what=f"{problems} problem{'s' if problems != 1 else ''} x {n} samples of up to {max_new_tokens} tokens need "
        "about {gib} GiB (the "
        "weights, one generate call and every sample, at a 1-token prompt: plan.eval_bytes)",
        fixes={
            "model": "the model's weights alone exceed it: use a smaller model or a larger device",
            "*": "lower {name}",
        },
    )
