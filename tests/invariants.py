"""The trainer's guarantees, measured in a recipe's own shape: a random-init model of the recipe's architecture
with small widths, and the recipe's real settings otherwise (precision, gradient checkpointing, LoRA, micro-batch
size, loss aggregation, method, policy loss, advantage estimator, mini-batches and epochs). One step runs through
the trainer's own step (step.Step: statistics, decide, update, the same calls trainer.py makes, with the recipe's
reward shaping, frozen zero-advantage rows, reference KL and entropy control), and `recipe_step` returns what it
computed, so the guarantees can be checked:

1. strict on-policy: the update's forward gives the statistics pass's log p bit for bit (forward.py: one
   construction), and the loss sees ratio exactly 1 (ppo_kl 0, no PPO or GSPO clipping);
2. the keep mask is the method's filter over the whole batch's statistics, whatever the micro-batch size;
3. each optimizer step's gradient does not depend on the micro-batch size beyond rounding;
4. log p, H and S* of the statistics pass are within the precision's rounding of a float64 forward
   (`stats_tolerance` derives the bound from the precision's unit roundoff and the depth of the network).

tests/test_recipe_shapes.py asserts them for every shipped recipe (configs/paper, configs/one_gpu) and, with
Hypothesis, over micro-batch sizes, padding, group sizes and response lengths. On a GPU the same functions run with
device="cuda" (the Triton statistics and CUDA attention kernels).

What the scaled-down step stands in for, numbered:
1. Rollouts are synthetic (`synthetic_batch`): random prompts of several lengths left-padded, groups of rows
   sharing a prompt, responses sampled from the policy by the trainer's sampling loop and cut at random lengths
   (right-padded); rewards drawn from the paper's 1 / 0 / -0.1 / -1 with one group all equal (advantage 0). The
   rollout engine's batching and the task's reward are not exercised.
2. The optimizer (`RecordingOptimizer`) records each step's gradient and does not step, so every micro-batch size
   sees the same weights and the gradients can be compared element by element. A reference model (KL) is whatever
   the caller passes (another scaled model), none by default.
3. Widths: hidden 64, 2 layers, 4 heads of 16 (grouped-query as the real model when it is), vocabulary 2304 (two of
   the CPU statistics' 2048-wide vocabulary tiles); initialiser range 0.2 and the LM head scaled by 2.5, so the
   policy is peaked like a trained one (mean entropy about 3 nats of the 7.7 possible) while its trunk stays well
   conditioned (with every weight at 0.5, bf16 moved the gradient by 45% of its norm).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import torch
from torch import Tensor

from entropy_rft.config import TrainConfig
from entropy_rft.core.dynamics import TokenStats, token_stats
from entropy_rft.rollout import Rollout
from entropy_rft.rollout.hf import sequence_forward
from entropy_rft.rollout.sampling import Sampling, sample
from entropy_rft.train.dropout import check_deterministic, disable_dropout
from entropy_rft.train.policy import ValueHead, prepare_policy
from entropy_rft.train.problems import Scored
from entropy_rft.train.rules import StepRules
from entropy_rft.train.step import Decision, Step

SMALL = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "head_dim": 16,
    "vocab_size": 2304,
    "max_position_embeddings": 512,
}
_DROP = (
    "architectures",
    "torch_dtype",
    "dtype",
    "layer_types",
    "max_window_layers",
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
    "transformers_version",
    "auto_map",
    "quantization_config",
)


def scaled_config(model: str, *, init_range: float = 0.2, **widths) -> dict:
    """The recipe model's config.json (a shipped shape, a local directory) with small widths: the same model_type,
    activation, norm, rope, biases and embedding tying, and its grouped-query ratio as far as 4 heads allow."""
    from entropy_rft.train.plan import find_model_config

    real, _ = find_model_config(model)
    real = real.get("text_config", real)
    small = {k: v for k, v in real.items() if k not in _DROP}
    small.update(SMALL, **widths)
    heads, kv = (
        real.get("num_attention_heads", 1),
        real.get("num_key_value_heads") or real.get("num_attention_heads", 1),
    )
    small["num_key_value_heads"] = max(1, small["num_attention_heads"] * kv // heads)
    small.update(initializer_range=init_range, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    return small


def scaled_model(
    model: str,
    cfg: TrainConfig,
    *,
    seed: int = 0,
    device: str | torch.device = "cpu",
    head_scale: float = 2.5,
    **widths,
):
    """A random-init model of the recipe's architecture (scaled_config), its LM head scaled by head_scale (so the
    policy is peaked like a trained one while its trunk stays well conditioned), prepared as the trainer prepares
    the policy: LoRA and gradient checkpointing as configured, dropout off and checked. The global RNG is
    untouched."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(**scaled_config(model, **widths))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        net = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        with torch.no_grad():
            net.get_output_embeddings().weight.mul_(head_scale)
        net = prepare_policy(net.to(device), cfg)
    disable_dropout(net)
    check_deterministic(net)
    return net


def synthetic_batch(
    n_prompts: int,
    group: int,
    *,
    vocab: int,
    max_prompt: int = 9,
    max_response: int = 12,
    seed: int = 0,
    model=None,
    temperature: float = 1.0,
) -> Scored:
    """The step's batch (problems.Scored: one None problem per group, so its group_ids are the groups; correct where
    the reward is positive): n_prompts groups of `group` rows sharing a left-padded prompt of random tokens;
    responses sampled from `model` (the trainer's sampling loop, so the tokens are the policy's own and S* takes both
    signs as in training) or, without a model, random tokens; each response cut to a random length in
    [1, max_response] (one at full length), as if it had ended there; the paper's rewards 1 / 0 / -0.1 / -1 drawn per
    row, the first group all 1 (its advantages are 0)."""
    gen = torch.Generator().manual_seed(seed)
    rows = n_prompts * group
    p_len = torch.randint(2, max_prompt + 1, (n_prompts,), generator=gen)
    p_mask = torch.arange(max_prompt)[None] >= (max_prompt - p_len)[:, None]  # left padding
    p_ids = torch.randint(3, vocab, (n_prompts, max_prompt), generator=gen).masked_fill(~p_mask, 0)
    lengths = torch.randint(1, max_response + 1, (rows,), generator=gen)
    lengths[int(torch.randint(rows, (1,), generator=gen))] = max_response
    response_mask = torch.arange(max_response)[None] < lengths[:, None]
    if model is None:
        responses = torch.randint(3, vocab, (rows, max_response), generator=gen)
    else:
        device = next(model.parameters()).device  # the draws come from a generator on the model's device
        draws = torch.Generator(device=device).manual_seed(seed)
        responses, _ = sample(
            model,
            p_ids.to(device),
            p_mask.to(device),
            Sampling(
                n=group, temperature=temperature, top_p=1.0, max_new_tokens=max_response, eos_ids=[vocab + 1], pad_id=0
            ),
            generator=draws,
        )
        responses = responses.cpu()  # no id ends a response: every row runs max_response tokens before the cut
    rollout = Rollout(
        p_ids.repeat_interleave(group, 0),
        p_mask.repeat_interleave(group, 0),
        responses.masked_fill(~response_mask, 0),
        response_mask,
        lengths < max_response,
        [""] * rows,
    )
    rewards = torch.tensor([1.0, 0.0, -0.1, -1.0])[torch.randint(4, (rows,), generator=gen)]
    rewards[:group] = 1.0
    return Scored([None] * n_prompts, rollout, rewards, rewards > 0)


class RecordingOptimizer:
    """Stands in for Adam (departure 2): each step() records every parameter's gradient and changes nothing."""

    def __init__(self, groups: list[dict]):
        self.param_groups = [{"lr": 0.0, **g} for g in groups]
        self.grads: list[list[Tensor]] = []

    def params(self) -> list[Tensor]:
        return [p for g in self.param_groups for p in g["params"]]

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params():
            p.grad = None

    def step(self) -> None:
        self.grads.append(
            [torch.zeros(p.shape) if p.grad is None else p.grad.detach().double().cpu() for p in self.params()]
        )


@dataclass
class StepRecord:
    stats: TokenStats  # the behaviour policy's statistics over the batch, (B, R) each
    decision: Decision  # the step's choices over the whole batch: advantages, keep mask, old log p, ...
    grads: list[list[Tensor]]  # per optimizer step, per trainable parameter (float64 copies)
    metrics: dict  # the update's
    update_logp: Tensor  # (B, R) the update's forward log p at its first optimizer step (nan where not computed)
    update_old: Tensor  # (B, R) the old log p its loss used there
    frozen: Tensor | None  # (B,) rows whose forward ran without a graph
    rules: StepRules  # the step's shape: rows per pass, optimizer steps (rules.StepRules.of, as the trainer's)

    adv = property(lambda self: self.decision.adv)  # (B,) or (B, R)
    returns = property(lambda self: self.decision.returns)  # (B, R) for GAE
    old_values = property(lambda self: self.decision.old_values)
    keep = property(lambda self: self.decision.keep)  # (B, R) bool: the filter's decision over the whole batch


def recipe_step(
    cfg: TrainConfig,
    model,
    batch: Scored,
    *,
    value_head: ValueHead | None = None,
    ref_model=None,
    given: StepRecord | None = None,
    seed: int = 0,
    step: int = 0,
    observe=None,
) -> StepRecord:
    """One trainer step (step.Step, as trainer.py runs it) on `batch` (`synthetic_batch`) with a RecordingOptimizer:
    its statistics, its decision (or, with `given`, that record's decision: advantages, keep mask, old log p / values,
    so runs that differ only in micro-batch size feed their updates identical inputs) and its update.
    `observe(rows, stats, old_logp, i)`, if given, sees every micro-batch's forward too, i its optimizer step (0, 1,
    ...)."""
    rollout = batch.rollout
    mask = rollout.response_mask
    groups = [{"params": [p for p in model.parameters() if p.requires_grad]}]
    if value_head is not None:
        groups.append({"params": list(value_head.parameters())})
    optimizer = RecordingOptimizer(groups)
    runner = Step(
        cfg,
        model,
        optimizer,
        value_head=value_head,
        ref_model=ref_model,
        update_gen=torch.Generator().manual_seed(seed),
    )
    behaviour = runner.statistics(batch, step)
    decision = runner.decide(batch, behaviour) if given is None else given.decision
    update_logp = torch.full(mask.shape, math.nan)
    update_old = torch.full(mask.shape, math.nan)

    def record(rows: Tensor, st: TokenStats, old: Tensor) -> None:
        if not optimizer.grads:  # the first optimizer step: the weights are the behaviour policy's
            update_logp[rows] = st.logp.detach().float().cpu()
            update_old[rows] = old.detach().float().cpu()
        if observe is not None:
            observe(rows, st, old, len(optimizer.grads))

    metrics = runner.update(rollout, decision, held=behaviour.held, observe=record)
    return StepRecord(
        behaviour.stats, decision, optimizer.grads, metrics, update_logp, update_old, behaviour.frozen, runner.rules
    )


@torch.no_grad()
def float64_reference(model, rollout: Rollout, temperature: float) -> tuple[TokenStats, Tensor]:
    """(statistics, logits / temperature (B, R, V)) of the same weights in float64, from materialised logits
    (token_stats), with no autocast: the slow, obviously correct reference of the statistics pass."""
    ref = copy.deepcopy(model).double().eval()
    logits, _ = sequence_forward(ref, rollout)
    return token_stats(logits, rollout.response_ids.to(logits.device), temperature=temperature), logits / temperature


UNIT_ROUNDOFF = {"bf16": 2.0**-8, "fp32": 2.0**-24}  # half a unit in the last place: bf16 8 bits, float32 24


def stats_tolerance(ref: TokenStats, logits: Tensor, *, precision: str, layers: int, width: int) -> dict[str, Tensor]:
    """Per-token bounds on |statistic - float64| for a forward in `precision`, to first order (x2 for the second).

    A logit z carries the roundings of its path: each layer adds two rounded contributions (attention, MLP) to the
    residual stream, then the final norm and the LM head, 2L + 3 in all, each within u |z| at the precision's unit
    roundoff u (bf16 autocast rounds every matmul's output to bfloat16); in float32 a dot product of length D
    accumulates up to D roundings itself, so there the count is multiplied by D. Then with dz = (2L + 3) u max|z|:
    |d log p_k| <= 2 dz, |dH| <= dz sum_i p_i |log p_i + H| (dH/dz_i = -p_i (log p_i + H)), and
    |dS*| <= p_k ((|H + log p_k| + 1) |d log p_k| + |dH|) (S* = p_k (H + log p_k))."""
    u = UNIT_ROUNDOFF[precision] * (width if precision == "fp32" else 1)
    dz = (2 * layers + 3) * u * logits.abs().amax(-1)  # (B, R)
    logp_all = torch.log_softmax(logits, -1)
    h_lip = (logp_all.exp() * (logp_all + ref.entropy[..., None]).abs()).sum(-1)
    d_logp = 2 * dz
    d_h = dz * h_lip
    d_s = ref.logp.exp() * ((ref.entropy + ref.logp).abs() + 1) * d_logp + ref.logp.exp() * d_h
    return {"logp": 2 * d_logp, "entropy": 2 * d_h, "s_star": 2 * d_s}


def grad_distance(a: list[Tensor], b: list[Tensor]) -> float:
    """Euclidean distance between two gradients given as lists of tensors."""
    return math.sqrt(sum(float(((x - y) ** 2).sum()) for x, y in zip(a, b)))


def grad_norm(a: list[Tensor]) -> float:
    return math.sqrt(sum(float((x**2).sum()) for x in a))
