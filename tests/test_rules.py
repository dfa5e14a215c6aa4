"""rules.StepRules: the shape of every shipped recipe's step, and the rules against slow references.

Properties: each shipped recipe (and each method cell of the demo-style files) has the step shape in TABLE (rows per
pass of its batch, optimizer steps per update, strict on-policy, reuse of the update's forward, a critic, a
reference policy, the probe's cadence, frozen zero-advantage rows); `passes` is the consecutive slicing every
forward used before it had one owner; `schedule` draws the same random numbers, in the same order, as the update's
loop did (a permutation per phase and epoch when there are several mini-batches, none otherwise); the memory plan
labels the entropy probe with the cadence the step runs it at."""

import pytest
import torch

from entropy_rft.config import load_config
from entropy_rft.recipes import is_multi_method, read_yaml, recipe_file, shipped_recipes
from entropy_rft.train.rules import StepRules, passes

# recipe (or demo-file:method) -> (rows per pass of the step's batch, optimizer steps per update, strict, reuse,
# critic, reference, probe_every, may_freeze). Read off the recipes: the paper's recipes run micro-batches of 8
# (the one_gpu LoRA ones 2 or 4) with one epoch and one mini-batch, except KL-Cov's 8 mini-batches (Cui et al.'s
# off-policy setting); PPO's have GAE's critic; no recipe sets kl_coef; the demos run the whole batch of 256 rows
# at once, so the statistics are the update's own forward (reuse auto) and zero-advantage rows may skip the graph,
# except under the adaptive bonus (its entropy term does not vanish at A = 0); the mu controller probes every step.
TABLE = {
    "demo:grpo": (256, 1, True, True, False, False, 10, True),
    "demo:clip_b": (256, 1, True, True, False, False, 10, True),
    "demo:clip_v": (256, 1, True, True, False, False, 10, True),
    "entropy_target:grpo": (256, 1, True, True, False, False, 10, True),
    "entropy_target:clip_b": (256, 1, True, True, False, False, 10, True),
    "entropy_target:clip_b_target": (256, 1, True, True, False, False, 1, True),
    "entropy_target:entropic_target": (256, 1, True, True, False, False, 10, True),
    "entropy_target:bonus_target": (256, 1, True, True, False, False, 10, False),
    "one_gpu/qwen2.5-7b-instruct_clip_b_lora": (2, 1, True, False, False, False, 10, False),
    "one_gpu/qwen2.5-7b-instruct_clip_v_lora": (2, 1, True, False, False, False, 10, False),
    "one_gpu/qwen2.5-7b-instruct_grpo_lora": (2, 1, True, False, False, False, 10, False),
    "one_gpu/qwen3-4b-base_clip_b_lora": (4, 1, True, False, False, False, 10, False),
    "one_gpu/qwen3-4b-base_clip_v_lora": (4, 1, True, False, False, False, 10, False),
    "one_gpu/qwen3-4b-base_grpo_lora": (4, 1, True, False, False, False, 10, False),
    "paper/qwen2.5-7b-instruct_clip_b": (8, 1, True, False, False, False, 10, False),
    "paper/qwen2.5-7b-instruct_clip_cov": (8, 1, True, False, False, False, 10, False),
    "paper/qwen2.5-7b-instruct_clip_v": (8, 1, True, False, False, False, 10, False),
    "paper/qwen2.5-7b-instruct_forking": (8, 1, True, False, False, False, 10, False),
    "paper/qwen2.5-7b-instruct_grpo": (8, 1, True, False, False, False, 10, False),
    "paper/qwen2.5-7b-instruct_kl_cov": (8, 8, False, False, False, False, 10, False),
    "paper/qwen2.5-7b-instruct_ppo": (8, 1, True, False, True, False, 10, False),
    "paper/qwen2.5-7b-instruct_ppo_clip_b": (8, 1, True, False, True, False, 10, False),
    "paper/qwen2.5-7b-instruct_ppo_clip_v": (8, 1, True, False, True, False, 10, False),
    "paper/qwen2.5-7b-instruct_unlikely": (8, 1, True, False, False, False, 10, False),
    "paper/qwen3-4b-base_clip_b": (8, 1, True, False, False, False, 10, False),
    "paper/qwen3-4b-base_clip_v": (8, 1, True, False, False, False, 10, False),
    "paper/qwen3-4b-base_grpo": (8, 1, True, False, False, False, 10, False),
    # the packaged real model's recipe (issue 46): GRPO on 4 x 4 = 16 rows at once, every other setting a default
    "smollm2-135m": (16, 1, True, True, False, False, 10, True),
}


def shipped_configs() -> dict:
    """Every shipped recipe's config; a demo-style file gives one per method cell (common settings + the cell's)."""
    out = {}
    for name in shipped_recipes():
        data = read_yaml(recipe_file(name))
        if is_multi_method(data):
            for method, cell in data["methods"].items():
                out[f"{name}:{method}"] = load_config(None, **{**data["common"], **(cell or {})})
        else:
            out[name] = load_config(name)
    return out


CONFIGS = shipped_configs()


def test_every_shipped_recipe_is_in_the_table():
    """A recipe added to the package needs its row here (and a row here needs its recipe)."""
    assert sorted(CONFIGS) == sorted(TABLE)


@pytest.mark.parametrize("name", sorted(TABLE))
def test_step_rules_of_each_shipped_recipe(name):
    """The recipe's step shape is its row of TABLE."""
    cfg = CONFIGS[name]
    rules = StepRules.of(cfg)
    batch = cfg.prompts_per_step * cfg.group_size
    got = (
        rules.rows_per_pass(batch),
        rules.optimizer_steps,
        rules.strict,
        rules.reuse,
        rules.critic,
        rules.reference,
        rules.probe_every,
        rules.may_freeze,
    )
    assert got == TABLE[name]
    assert len(rules.passes(batch)) == -(-batch // rules.rows_per_pass(batch))


@pytest.mark.parametrize("n", [1, 5, 12])
@pytest.mark.parametrize("micro", [0, 1, 3, 5, 12, 40])
def test_passes_are_the_consecutive_slices(n, micro):
    """passes(n, micro): rows i*m .. (i+1)*m - 1 with m = micro (0 or more than n: all n), the last one shorter;
    over a given order of rows (a mini-batch) the same slicing of that order."""
    m = micro if 0 < micro < n else n
    want = [torch.arange(i, min(i + m, n)) for i in range(0, n, m)]
    got = passes(n, micro)
    assert len(got) == len(want) and all(torch.equal(a, b) for a, b in zip(got, want))
    order = torch.randperm(n, generator=torch.Generator().manual_seed(n))
    assert torch.equal(torch.cat(passes(order, micro)), order)
    assert all(len(p) == m for p in passes(order, micro)[:-1])


def reference_schedule(cfg, loss_mask, old_logp, gen):
    """The update's loop as it was written before StepRules owned it (step.apply_update at 3fe4bc1)."""
    phases = [loss_mask]
    if cfg.lopti_eta is not None:
        low = old_logp.exp() < cfg.lopti_eta
        phases = [loss_mask & low, loss_mask & ~low]
    out = []
    for phase_mask, _epoch in ((pm, e) for pm in phases for e in range(cfg.ppo_epochs)):
        order = torch.randperm(len(loss_mask), generator=gen) if cfg.mini_batches > 1 else torch.arange(len(loss_mask))
        for rows in order.chunk(cfg.mini_batches):
            out.append((phase_mask, rows))
    return out


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"mini_batches": 2},
        {"mini_batches": 4, "ppo_epochs": 2},
        {"ppo_epochs": 3},
        {"method": "lopti"},
        {"method": "lopti", "mini_batches": 2, "ppo_epochs": 2},
    ],
)
def test_schedule_draws_what_the_update_drew(kw):
    """schedule + phase_masks give the same (phase tokens, mini-batch rows) sequence as the old loop, from the same
    generator state, and leave the generator in the same state (the next step's draws are unchanged); the count is
    optimizer_steps."""
    cfg = load_config(None, prompts_per_step=4, group_size=3, **kw)
    rules = StepRules.of(cfg)
    g = torch.Generator().manual_seed(7)
    loss_mask = torch.rand(12, 5, generator=g) < 0.7
    old_logp = torch.rand(12, 5, generator=g).log()
    a, b = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    want = reference_schedule(cfg, loss_mask, old_logp, a)
    masks = rules.phase_masks(loss_mask, old_logp)
    got = [(masks[phase], rows) for phase, rows in rules.schedule(12, b)]
    assert len(got) == len(want) == rules.optimizer_steps
    assert all(torch.equal(gm, wm) and torch.equal(gr, wr) for (gm, gr), (wm, wr) in zip(got, want))
    assert torch.equal(a.get_state(), b.get_state())


def test_probe_cadence_is_the_steps_and_the_plans():
    """The mu controller probes every step (it fits kappa on every step's first-order change) whatever probe_every
    says; the memory plan names the same cadence (before, it said "every 10 steps" for a run that probed every step).
    """
    from entropy_rft.train.plan import ModelShape, plan_memory

    mu = load_config(None, method="clip_b", entropy_target=0.3, entropy_control="mu", probe_every=10)
    plain = load_config(None, probe_every=10)
    off = load_config(None, probe_every=0)
    assert StepRules.of(mu).probe_every == 1 and [s for s in range(4) if StepRules.of(mu).probing(s)] == [0, 1, 2, 3]
    assert StepRules.of(plain).probe_every == 10 and not StepRules.of(off).probing(9)
    shape = ModelShape(
        "qwen2",
        hidden=64,
        intermediate=128,
        layers=2,
        heads=4,
        kv_heads=4,
        head_dim=16,
        vocab=256,
        tied=True,
        qkv_bias=True,
        o_bias=False,
        mlp_bias=False,
        qk_norm=False,
    )
    labels = {
        name: [k for k in plan_memory(c, shape).items if k.startswith("entropy probe")]
        for name, c in (("mu", mu), ("plain", plain), ("off", off))
    }
    assert labels == {
        "mu": ["entropy probe: d(mean H)/d(theta) (every step)"],
        "plain": ["entropy probe: d(mean H)/d(theta) (every 10 steps)"],
        "off": [],
    }


def test_needs_follow_the_config():
    """A critic exactly with a token-level advantage (GAE), a reference policy exactly with kl_coef > 0; strict
    on-policy only with one epoch, one mini-batch and no Lopti."""
    assert StepRules.of(load_config(None, method="ppo")).critic and not StepRules.of(load_config(None)).critic
    assert StepRules.of(load_config(None, kl_coef=0.01)).reference and not StepRules.of(load_config(None)).reference
    for kw in ({"mini_batches": 2}, {"ppo_epochs": 2}, {"method": "lopti"}):
        assert not StepRules.of(load_config(None, **kw)).strict
    assert StepRules.of(load_config(None)).strict
