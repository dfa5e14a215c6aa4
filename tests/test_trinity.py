"""entropy_rft.integrations.trinity against the real Trinity-RFT 0.6.0 (and its verl 0.8.0) objects on CPU: the
registry, the authors' advantage functions, DataProto batches, verl's FSDP engine output code and its
forward_backward_batch, Trinity's VERLTrainer._compute_old_log_prob and TrinityPolicyLoss; then Trinity's whole
trainer step (VERLTrainer.train_step: recompute with E_p[S], reference forward, values, advantage and filter, critic
update, actor update) on verl's workers and FSDP engine with the tiny Qwen2, where every optimizer step's gradient is
compared with the token mean written directly, with mutation checks (no write-back, a per-micro-batch denominator,
a critic that reads the filtered mask). What stands in for the GPU and the cluster is listed where it is built
(tests/engine_step.py and the fixtures below). Run with `make test-trinity` (its own environment); skipped where
Trinity-RFT is not installed."""

import numpy as np
import pytest
import torch
from conftest import f32, load_fixture

pytest.importorskip("trinity")
trinity_adapter = pytest.importorskip("entropy_rft.integrations.trinity")

from types import SimpleNamespace  # noqa: E402

from trinity.algorithm import ADVANTAGE_FN, POLICY_LOSS_FN  # noqa: E402
from trinity.trainer.verl.monkey_patch import left_right_2_no_padding  # noqa: E402
from verl import DataProto  # noqa: E402
from verl.utils import tensordict_utils as tu  # noqa: E402
from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead  # noqa: E402

from entropy_rft.core import masks  # noqa: E402
from entropy_rft.core.dynamics import TokenStats, token_stats  # noqa: E402

ADV_PATH = "entropy_rft.integrations.trinity.EntropyAdvantageFn"
LOSS_PATH = "entropy_rft.integrations.trinity.GlobalTokenMeanPPO"
CLIP_B = load_fixture("clip_b.json")["cases"]
CLIP_V = load_fixture("clip_v.json")["cases"]


def data_proto(inputs: dict, keys: tuple) -> DataProto:
    """A Trinity trainer batch (verl DataProto) from a fixture case: bool response_mask, as Trinity passes it."""
    tensors = {k: f32(inputs[k]) for k in ("token_level_rewards", *keys)}
    tensors["response_mask"] = f32(inputs["response_mask"]).bool()
    return DataProto.from_dict(tensors=tensors, non_tensors={"uid": np.array(inputs["uid"], dtype=object)})


def options(case) -> dict:
    return {k: v for k, v in case["params"].items() if k != "epsilon"}


def test_registry_resolves_the_dotted_paths():
    """Trinity's own registries load the adapter by dotted path (what `advantage_fn:` / `policy_loss_fn:` in a
    YAML do), and the policy loss asks TrinityPolicyLoss for the engine's global token count."""
    assert ADVANTAGE_FN.get(ADV_PATH) is trinity_adapter.EntropyAdvantageFn
    loss_cls = POLICY_LOSS_FN.get(LOSS_PATH)
    assert loss_cls is trinity_adapter.GlobalTokenMeanPPO
    assert {"batch_num_tokens", "dp_size", "old_log_probs", "response_mask"} <= set(loss_cls().select_keys)


def check_against_authors(case, method, keys, log_prob_key):
    """Our advantage function and the authors' (Trinity's clipb/clipv) on the same DataProto: advantages,
    returns and the written-back response_mask equal the fixture exactly, metrics to 1e-6."""
    i, out = case["inputs"], case["outputs"]
    ours = ADVANTAGE_FN.get(ADV_PATH)(
        method=method, base_args={"epsilon": case["params"]["epsilon"]}, log_prob_key=log_prob_key, **options(case)
    )
    batch, metrics = ours(data_proto(i, keys))
    authors = ADVANTAGE_FN.get(method.replace("_", ""))(**case["params"])
    theirs, _ = authors(data_proto(i, keys))
    expected_mask = f32(out["response_mask"]).bool()
    assert torch.equal(batch.batch["response_mask"], expected_mask)
    assert torch.equal(theirs.batch["response_mask"], expected_mask)
    torch.testing.assert_close(batch.batch["advantages"], f32(out["advantages"]), atol=1e-7, rtol=0)
    torch.testing.assert_close(batch.batch["returns"], f32(out["returns"]), atol=1e-7, rtol=0)
    for key, value in out["metrics"].items():
        assert metrics[f"entropy_rft/{key}"] == pytest.approx(value, abs=1e-6), key


@pytest.mark.parametrize("case", CLIP_B, ids=lambda c: c["name"])
def test_clip_b_equals_the_authors_on_the_same_batch(case):
    """Clip_B through Trinity (GRPO base + whole-batch filter) = the authors' ClipBAdvantageFn (they read
    rollout_log_probs: departure 1)."""
    check_against_authors(case, "clip_b", ("rollout_log_probs", "entropys"), "rollout_log_probs")


@pytest.mark.parametrize("case", CLIP_V, ids=lambda c: c["name"])
def test_clip_v_equals_the_authors_on_the_same_batch(case):
    """Clip_V through Trinity = the authors' ClipVAdvantageFn, cap branches and zero-advantage tokens included."""
    check_against_authors(case, "clip_v", ("old_log_probs", "entropys", "necs"), "old_log_probs")


def test_mutation_without_write_back_the_oracle_test_fails(monkeypatch):
    """Mutation check: with the mask write-back disabled the parity test above fails (it can fail)."""
    monkeypatch.setattr(trinity_adapter, "write_back", lambda batch, keep: None)
    with pytest.raises(AssertionError):
        check_against_authors(CLIP_B[0], "clip_b", ("rollout_log_probs", "entropys"), "rollout_log_probs")


def test_keep_mask_is_the_whole_batch_filter_not_per_micro_batch():
    """The written-back mask equals masks.clip_b over the whole batch, and differs from filtering two halves
    separately (each half has its own mean and std of S*: on the paper's mu = 2.5 case the whole batch clips 3
    tokens, the halves none)."""
    case = CLIP_B[0]
    i = case["inputs"]
    batch, _ = trinity_adapter.EntropyAdvantageFn(method="clip_b", log_prob_key="rollout_log_probs", **options(case))(
        data_proto(i, ("rollout_log_probs", "entropys"))
    )
    lp, h, mask = f32(i["rollout_log_probs"]), f32(i["entropys"]), f32(i["response_mask"]).bool()
    s_star, adv = lp.exp() * (h + lp), batch.batch["advantages"]
    whole, _ = masks.clip_b(s_star, adv, mask, **options(case))
    assert torch.equal(batch.batch["response_mask"], whole & mask)
    half = mask.shape[0] // 2
    parts = [masks.clip_b(s_star[r], adv[r], mask[r], **options(case))[0] for r in (slice(0, half), slice(half, None))]
    assert int((~whole & mask).sum()) == 3 and int((~torch.cat(parts) & mask).sum()) == 0


def test_clear_errors():
    """No entropies (bypass_old_logprobs true) names the setting; Clip_V without E_p[S] names the policy loss;
    non-filter methods, unknown options and explorer-side base advantages are refused."""
    i = CLIP_V[0]["inputs"]
    with pytest.raises(ValueError, match="bypass_old_logprobs: false"):
        trinity_adapter.EntropyAdvantageFn(method="clip_b")(data_proto(i, ("old_log_probs",)))
    with pytest.raises(ValueError, match="policy_loss_fn"):
        trinity_adapter.EntropyAdvantageFn(method="clip_v")(data_proto(i, ("old_log_probs", "entropys")))
    with pytest.raises(ValueError, match="not a token filter"):
        trinity_adapter.EntropyAdvantageFn(method="dapo")
    with pytest.raises(ValueError, match="no option"):
        trinity_adapter.EntropyAdvantageFn(method="clip_b", max_frac=0.1)
    for composed in ("stare+clip_b", "grpo_dropout+clip_b", "entrocraft+clip_b", "tre_k+clip_b"):
        with pytest.raises(ValueError, match="does not run"):  # their other rule would be silently skipped
            trinity_adapter.EntropyAdvantageFn(method=composed)
    with pytest.raises(ValueError, match="explorer"):
        trinity_adapter.EntropyAdvantageFn(method="clip_b", base="grpo")
    with pytest.raises(ValueError, match="loss_agg_mode: token-mean"):
        trinity_adapter.GlobalTokenMeanPPO(loss_agg_mode="seq-mean-token-mean")


def test_no_cap_and_figure1_filters_run():
    """max_frac None (no cap) clips every Clip_V violator; an S*-sign filter of Figure 1 keeps what masks.s_sign
    keeps on the whole batch."""
    case = CLIP_V[1]  # mu 2.0: more violators than the 1e-4 cap (k = 1)
    i = case["inputs"]
    keys = ("old_log_probs", "entropys", "necs")
    capped, _ = trinity_adapter.EntropyAdvantageFn(method="clip_v", mu=2.0, max_frac=1e-4)(data_proto(i, keys))
    free, _ = trinity_adapter.EntropyAdvantageFn(method="clip_v", mu=2.0, max_frac=None)(data_proto(i, keys))
    lp, h, n = f32(i["old_log_probs"]), f32(i["entropys"]), f32(i["necs"])
    mask = f32(i["response_mask"]).bool()
    expected, _ = masks.clip_v(lp.exp() * (h + lp) - n, free.batch["advantages"], mask, mu=2.0, max_frac=None)
    assert torch.equal(free.batch["response_mask"], expected)
    assert int(mask.sum()) - int(capped.batch["response_mask"].sum()) == 1
    assert int(free.batch["response_mask"].sum()) < int(capped.batch["response_mask"].sum())
    sign, _ = trinity_adapter.EntropyAdvantageFn(method="s_sign:mask:pos_s:neg_samples")(data_proto(i, keys))
    expected, _ = masks.s_sign(
        lp.exp() * (h + lp), sign.batch["advantages"], mask, action="mask", sign="positive", samples="negative"
    )
    assert torch.equal(sign.batch["response_mask"], expected)


def test_rsi_and_the_entropy_gate_run_through_the_advantage_fn():
    """RSI-S (it reads log p and H) keeps exactly masks.rsi_band's tokens over the whole batch; Clip_B's entropy_gate
    closed (target 1e-6: the batch's entropy is above it) keeps every valid token, open (a large target) keeps
    Clip_B's."""
    case = CLIP_V[1]
    i = case["inputs"]
    keys = ("old_log_probs", "entropys", "necs")
    lp, h = f32(i["old_log_probs"]), f32(i["entropys"])
    mask = f32(i["response_mask"]).bool()
    band = {"rsi_upper_bound": 1.0}
    rsi, metrics = trinity_adapter.EntropyAdvantageFn(method="rsi", **band)(data_proto(i, keys))
    expected, _ = masks.rsi_band(TokenStats(lp, h, lp, lp), rsi.batch["advantages"], mask, **band)
    assert torch.equal(rsi.batch["response_mask"], expected) and (mask & ~expected).any()
    assert "entropy_rft/rsi_drop_high" in metrics
    closed, _ = trinity_adapter.EntropyAdvantageFn(method="clip_b", mu=0.2, entropy_gate=1e-6)(data_proto(i, keys))
    assert torch.equal(closed.batch["response_mask"], mask)
    opened, _ = trinity_adapter.EntropyAdvantageFn(method="clip_b", mu=0.2, entropy_gate=1e9)(data_proto(i, keys))
    plain, _ = trinity_adapter.EntropyAdvantageFn(method="clip_b", mu=0.2)(data_proto(i, keys))
    assert torch.equal(opened.batch["response_mask"], plain.batch["response_mask"])
    assert not torch.equal(plain.batch["response_mask"], mask)


# ---------------------------------------------------------------------------------------------------------------
# The engine side: verl's FSDP LM engine output code (real, on an instance built without FSDP, as verl's own
# *_on_cpu tests do), Trinity's padding conversions and VERLTrainer._compute_old_log_prob, a bigram table as the
# model (logits of a position = table[its token]).

VOCAB, TEMPERATURE = 13, 0.7


@pytest.fixture(autouse=True)
def _cpu_bert_padding(monkeypatch):
    """Trinity's left_right_2_no_padding unpads through flash_attn.bert_padding, which installs only with CUDA;
    on CPU the same pure-PyTorch helpers come from verl's own port (verl.utils.npu_flash_attn_utils)."""
    import sys
    import types

    from verl.utils import npu_flash_attn_utils as port

    module = types.ModuleType("flash_attn.bert_padding")
    for name in ("index_first_axis", "pad_input", "rearrange", "unpad_input"):
        setattr(module, name, getattr(port, name))
    monkeypatch.setitem(sys.modules, "flash_attn", types.ModuleType("flash_attn"))
    monkeypatch.setitem(sys.modules, "flash_attn.bert_padding", module)


def cpu_engine(cls=FSDPEngineWithLMHead):
    engine = object.__new__(cls)
    engine.use_ulysses_sp, engine.ulysses_sequence_parallel_size, engine.ulysses_device_mesh = False, 1, None
    engine.engine_config = SimpleNamespace(entropy_checkpointing=False)
    from verl.utils.torch_functional import entropy_from_logits

    engine.compute_entropy_from_logits = entropy_from_logits
    return engine


def engine_outputs(engine, table, micro_batch, *, remove_padding: bool):
    """The engine's prepare_model_outputs on the bigram model's logits for the micro-batch's packed sequences."""
    ids = micro_batch["input_ids"]
    flat = ids.values()
    rolled = torch.roll(flat, -1)
    temperature = tu.get_non_tensor_data(micro_batch, "temperature", 1.0)
    tu.assign_non_tensor(micro_batch, use_remove_padding=remove_padding)
    if remove_padding:
        output = SimpleNamespace(logits=table[flat].unsqueeze(0))
        args = {"input_ids_rmpad_rolled": rolled, "temperature_rmpad": torch.full(flat.shape, temperature)}
    else:
        lengths = ids.offsets().diff().tolist()
        padded = torch.zeros(len(lengths), max(lengths), dtype=torch.long)
        for row, seq in enumerate(ids.unbind()):
            padded[row, : seq.shape[0]] = seq
        output = SimpleNamespace(logits=table[padded])
        args = {"input_ids_rmpad_rolled": rolled, "temperature": torch.full((len(lengths),), temperature)}
    return engine.prepare_model_outputs(output, args, micro_batch, None)


def trainer_batch(seed: int, rows: int = 6, prompt: int = 4, response: int = 7) -> DataProto:
    """A Trinity trainer batch as to_data_proto lays it out: left-padded prompts, right-padded responses."""
    g = torch.Generator().manual_seed(seed)
    p_len = torch.randint(1, prompt + 1, (rows,), generator=g)
    r_len = torch.randint(1, response + 1, (rows,), generator=g)
    prompts = torch.zeros(rows, prompt, dtype=torch.long)
    responses = torch.zeros(rows, response, dtype=torch.long)
    attention = torch.zeros(rows, prompt + response, dtype=torch.long)
    for b in range(rows):
        prompts[b, prompt - p_len[b] :] = torch.randint(0, VOCAB, (int(p_len[b]),), generator=g)
        responses[b, : r_len[b]] = torch.randint(0, VOCAB, (int(r_len[b]),), generator=g)
        attention[b, prompt - p_len[b] : prompt + r_len[b]] = 1
    response_mask = attention[:, prompt:].bool()
    position = (attention.cumsum(-1) - 1).clamp_min(0)
    rewards = torch.zeros(rows, response)
    rewards[torch.arange(rows), r_len - 1] = torch.randint(0, 2, (rows,), generator=g).float()
    return DataProto.from_dict(
        tensors={
            "input_ids": torch.cat([prompts, responses], -1),
            "attention_mask": attention,
            "position_ids": position,
            "prompts": prompts,
            "responses": responses,
            "response_mask": response_mask,
            "token_level_rewards": rewards,
        },
        non_tensors={"uid": np.array([f"q{b // 3}" for b in range(rows)], dtype=object)},
    )


def reference_stats(batch: DataProto, table: torch.Tensor):
    """token_stats of each response token from the logits that predict it (the previous token's row), [B, R]."""
    prompts, responses = batch.batch["prompts"], batch.batch["responses"]
    previous = torch.cat([prompts[:, -1:], responses[:, :-1]], -1)
    return token_stats(table[previous] / TEMPERATURE, responses)


@pytest.mark.parametrize("remove_padding", [True, False], ids=["packed", "padded"])
def test_engine_log_p_entropy_and_s_expect_equal_token_stats(remove_padding):
    """verl's engine (with the adapter's hook) gives log p, H and E_p[S] equal to token_stats on the same logits,
    aligned with the packed sequences, in both the remove-padding and the padded layout."""
    table = torch.randn(VOCAB, VOCAB, generator=torch.Generator().manual_seed(1)) * 3
    batch = trainer_batch(0)
    td = left_right_2_no_padding(batch.to_tensordict())
    tu.assign_non_tensor(td, calculate_entropy=True, temperature=TEMPERATURE, **{trinity_adapter._REQUEST: True})
    out = engine_outputs(cpu_engine(), table, td, remove_padding=remove_padding)
    ids = td["input_ids"].values()
    expected = token_stats(table[ids] / TEMPERATURE, torch.roll(ids, -1))
    for key, value in (("log_probs", expected.logp), ("entropy", expected.entropy), ("necs", expected.s_expect)):
        torch.testing.assert_close(out[key].values(), value, atol=2e-5, rtol=1e-5, msg=key)


def test_engine_refuses_fused_kernels():
    """E_p[S] needs the logits: the hook names use_fused_kernels instead of returning something wrong."""
    td = left_right_2_no_padding(trainer_batch(0).to_tensordict())
    tu.assign_non_tensor(td, **{trinity_adapter._REQUEST: True}, use_fused_kernels=True)
    output = SimpleNamespace(log_probs=torch.zeros(1, td["input_ids"].values().shape[0]), entropy=None)
    with pytest.raises(NotImplementedError, match="use_fused_kernels"):
        trinity_adapter._s_expect_like_engine(cpu_engine(), output, {}, td)


class StandInWorkers:
    """The actor worker group as VERLTrainer calls it: the real engine output code on the bigram model."""

    def __init__(self, table):
        self.table = table

    def compute_log_prob(self, batch_td):
        out = engine_outputs(cpu_engine(), self.table, batch_td, remove_padding=True)
        return tu.get_tensordict(tensor_dict=out, non_tensor_dict={"metrics": {}})


def stand_in_trainer(advantage_fn, table):
    from trinity.trainer.verl.trainer import VERLTrainer

    trainer = object.__new__(VERLTrainer)
    trainer.advantage_fn, trainer.actor_rollout_wg = advantage_fn, StandInWorkers(table)
    trainer.config = SimpleNamespace(actor=SimpleNamespace(calculate_sum_pi_squared=False))
    trainer.global_config = SimpleNamespace(
        model=SimpleNamespace(temperature=TEMPERATURE), algorithm=SimpleNamespace(loss_agg_mode="token-mean")
    )
    return trainer


def test_trainer_recompute_brings_s_expect_for_clip_v():
    """With a Clip_V advantage function, Trinity's own _compute_old_log_prob (wrapped) stores old_log_probs,
    entropys and necs equal to token_stats of the response tokens; Clip_V then keeps what masks.clip_v keeps.
    With Clip_B nothing is requested, and a worker without the hook is a clear error."""
    table = torch.randn(VOCAB, VOCAB, generator=torch.Generator().manual_seed(2)) * 3
    batch = trainer_batch(3, rows=9)
    clip_v = trinity_adapter.EntropyAdvantageFn(method="clip_v", mu=0.5, max_frac=None)
    batch = stand_in_trainer(clip_v, table)._compute_old_log_prob(batch, {})
    ref, mask = reference_stats(batch, table), batch.batch["response_mask"]
    for key, value in (("old_log_probs", ref.logp), ("entropys", ref.entropy), ("necs", ref.s_expect)):
        torch.testing.assert_close(batch.batch[key][mask], value[mask], atol=2e-5, rtol=1e-5, msg=key)
    batch, _ = clip_v(batch)
    expected, _ = masks.clip_v(ref.s_centered, batch.batch["advantages"], mask, mu=0.5, max_frac=None)
    assert torch.equal(batch.batch["response_mask"], expected) and not torch.equal(expected, mask)

    plain = trainer_batch(3, rows=9)
    clip_b = trinity_adapter.EntropyAdvantageFn(method="clip_b")
    plain = stand_in_trainer(clip_b, table)._compute_old_log_prob(plain, {})
    assert "necs" not in plain.batch.keys() and "entropys" in plain.batch.keys()

    unhooked = stand_in_trainer(clip_v, table)
    unhooked.actor_rollout_wg.compute_log_prob = lambda td: tu.get_tensordict(
        tensor_dict={
            k: v for k, v in engine_outputs(cpu_engine(), table, td, remove_padding=True).items() if k != "necs"
        },
        non_tensor_dict={"metrics": {}},
    )
    with pytest.raises(RuntimeError, match="policy_loss_fn"):
        unhooked._compute_old_log_prob(trainer_batch(3, rows=9), {})


# ---------------------------------------------------------------------------------------------------------------
# The loss scale: verl 0.8's forward_backward_batch (real) sums the micro-batch losses of TrinityPolicyLoss (real).


class BigramEngine(FSDPEngineWithLMHead):
    """verl's FSDP LM engine with the bigram table as its model (prepare_model_outputs and the loss are verl's
    and Trinity's)."""

    def forward_step(self, micro_batch, loss_function, forward_only):
        model_output = engine_outputs(self, self.table, micro_batch, remove_padding=True)
        loss, metrics = loss_function(model_output=model_output, data=micro_batch, dp_group=None)
        return loss, {"model_output": model_output, "loss": loss.detach().item(), "metrics": metrics}


@pytest.fixture(scope="module")
def process_group(tmp_path_factory):
    """A one-rank gloo group: the engine all-reduces its token count over the data-parallel group."""
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group(
            "gloo", init_method=f"file://{tmp_path_factory.mktemp('pg')}/store", rank=0, world_size=1
        )
    yield
    dist.destroy_process_group()


def loss_batch(table):
    """A trainer batch after Trinity's recompute (stand-in workers) and Clip_V over the whole batch (tokens
    dropped), with old log-probs moved off the current ones so that the PPO clip is active on some tokens."""
    g = torch.Generator().manual_seed(5)
    clip_v = trinity_adapter.EntropyAdvantageFn(method="clip_v", mu=0.5, max_frac=None)
    batch = stand_in_trainer(clip_v, table)._compute_old_log_prob(trainer_batch(7, rows=8), {})
    batch, _ = clip_v(batch)
    old = batch.batch["old_log_probs"]
    batch.batch["old_log_probs"] = old + 0.3 * torch.randn(old.shape, generator=g)
    return batch


def engine_gradient(policy_loss_fn: str, micro_batch_size: int) -> torch.Tensor:
    """d loss / d table after one forward_backward_batch with Trinity's TrinityPolicyLoss."""
    from trinity.common.config import AlgorithmConfig
    from trinity.trainer.verl.losses import TrinityPolicyLoss

    config = AlgorithmConfig(
        policy_loss_fn=policy_loss_fn,
        policy_loss_fn_args={"clip_range": 0.2},
        kl_loss_fn="none",
        kl_loss_fn_args={},
        entropy_loss_fn="none",
        entropy_loss_fn_args={"entropy_coef": 0.0},
        loss_agg_mode="token-mean",
    )
    engine = cpu_engine(BigramEngine)
    engine.table = torch.randn(VOCAB, VOCAB, generator=torch.Generator().manual_seed(4)).requires_grad_()
    td = left_right_2_no_padding(loss_batch(engine.table.detach()).to_tensordict())
    tu.assign_non_tensor(
        td,
        temperature=TEMPERATURE,
        calculate_entropy=False,
        use_dynamic_bsz=False,
        micro_batch_size_per_gpu=micro_batch_size,
    )
    engine.forward_backward_batch(td, TrinityPolicyLoss(config), forward_only=False)
    return engine.table.grad


def whole_batch_token_mean_gradient(micro_batches: int = 1) -> torch.Tensor:
    """The reference: PPO's token mean over the kept tokens of the whole batch (micro_batches=1), or the sum of
    per-micro-batch token means (what Trinity 0.6.0 computes), written directly from the padded batch."""
    from entropy_rft.core.losses import ppo_clip_loss

    table = torch.randn(VOCAB, VOCAB, generator=torch.Generator().manual_seed(4)).requires_grad_()
    batch = loss_batch(table.detach())
    stats = reference_stats(batch, table)
    total = 0
    for rows in torch.arange(8).chunk(micro_batches):
        b = batch.batch
        total = (
            total
            + ppo_clip_loss(
                stats.logp[rows],
                b["old_log_probs"][rows],
                b["advantages"][rows],
                b["response_mask"][rows],
                eps_low=0.2,
                eps_high=0.2,
                dual_clip_c=3.0,
            )[0]
        )
    total.backward()
    return table.grad


def test_global_token_mean_loss_is_invariant_to_the_micro_batch_size(process_group):
    """GlobalTokenMeanPPO through verl's engine: the gradient for micro-batch sizes 8, 4, 2, 1 equals the
    whole-batch token mean over the kept tokens (the dropped tokens are out of the loss and its count)."""
    batch = loss_batch(torch.randn(VOCAB, VOCAB, generator=torch.Generator().manual_seed(4)))
    dropped = int(batch.batch["attention_mask"][:, 4:].sum()) - int(batch.batch["response_mask"].sum())
    assert dropped > 0  # Clip_V dropped some tokens
    expected = whole_batch_token_mean_gradient()
    for size in (8, 4, 2, 1):
        torch.testing.assert_close(engine_gradient(LOSS_PATH, size), expected, rtol=1e-4, atol=1e-6, msg=str(size))


def test_trinity_ppo_loss_scales_with_the_number_of_micro_batches(process_group):
    """Measured behaviour of Trinity 0.6.0 (departure 2): with its `ppo` loss the engine's gradient is the SUM of
    per-micro-batch token means, so it grows with the number of micro-batches (one micro-batch: the token mean)."""
    torch.testing.assert_close(engine_gradient("ppo", 8), whole_batch_token_mean_gradient(1), rtol=1e-4, atol=1e-6)
    four = engine_gradient("ppo", 2)
    torch.testing.assert_close(four, whole_batch_token_mean_gradient(4), rtol=1e-4, atol=1e-6)
    ratio = float(four.norm() / whole_batch_token_mean_gradient(1).norm())
    print(f"Trinity ppo loss, 4 micro-batches: gradient norm x{ratio:.2f} the whole-batch token mean")
    assert ratio > 2.0


# ---------------------------------------------------------------------------------------------------------------
# Trinity's whole trainer step on the CPU: VERLTrainer.train_step itself (to_data_proto, batch balancing, Trinity's
# old-log-prob recompute with the adapter's E_p[S], reference forward, values, KL-in-reward and the advantage step,
# critic update, actor update, metrics) on verl 0.8's TrinityActorRolloutRefWorker / TrinityCriticWorker,
# TrainingWorker and FSDP engine code path with the shipped tiny Qwen2, TrinityPolicyLoss and value_loss. Stood in
# (tests/engine_step.py): the Ray worker groups (one rank, called in this process), FSDP's sharding, the optimizer
# (it records each mini-batch's gradient and never steps: the oracle), the MFU counter, gloo's ReduceOp.AVG; the
# explorer's rollout is a list of Experiences.

GROUPS, N, MINI_BATCHES, EPOCHS = 4, 4, 2, 2  # 16 rows, 2 mini-batches x 2 epochs: 4 optimizer steps


@pytest.fixture(scope="module")
def whole_step_env(process_group):
    """verl's device helpers pointed at the CPU, gloo's AVG, one torch thread (the tiny model's matrices are small:
    two threads on a shared 2-core machine were several times slower), and the tiny Qwen2 actor, reference copy
    and value model (weights never change)."""
    from functools import partial
    from pathlib import Path

    import torch.distributed as dist
    import verl.utils.seqlen_balancing as seqlen_balancing
    import verl.workers.engine.fsdp.transformer_impl as fsdp_impl
    import verl.workers.engine_workers as engine_workers
    from engine_step import all_reduce_with_average
    from transformers import AutoModelForCausalLM, AutoModelForTokenClassification

    import entropy_rft

    tiny = Path(entropy_rft.__file__).parent / "assets" / "countdown-tiny"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(fsdp_impl, "get_device_id", lambda: "cpu")
        mp.setattr(fsdp_impl, "get_device_name", lambda: "cpu")
        mp.setattr(seqlen_balancing, "get_device_name", lambda: "cpu")
        mp.setattr(
            engine_workers,
            "get_torch_device",
            lambda: SimpleNamespace(max_memory_allocated=lambda: 0, max_memory_reserved=lambda: 0),
        )
        mp.setattr(dist, "all_reduce", partial(all_reduce_with_average, dist.all_reduce))
        torch.manual_seed(0)  # the value head is initialised at random
        critic = AutoModelForTokenClassification.from_pretrained(tiny, num_labels=1).float()
        critic.dropout.p = 0.0  # the head's dropout would make each gradient random
        yield SimpleNamespace(
            actor=AutoModelForCausalLM.from_pretrained(tiny).float(),
            ref=AutoModelForCausalLM.from_pretrained(tiny).float(),
            critic=critic,
        )
    torch.set_num_threads(threads)


def experiences(vocab, seed=0):
    """GROUPS x N single-turn Experiences as the explorer hands them over: prompt + response tokens, a reward in
    [0, 1] (graded: every group has positive and negative advantages) and rollout log-probs."""
    from trinity.common.experience import EID, Experience

    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(GROUPS * N):
        p, r = int(torch.randint(2, 6, (), generator=g)), int(torch.randint(3, 11, (), generator=g))
        out.append(
            Experience(
                eid=EID(batch=0, task=i // N, run=i % N),
                tokens=torch.randint(2, vocab, (p + r,), generator=g),
                prompt_length=p,
                reward=float(torch.rand((), generator=g)),
                logprobs=-torch.rand(r, generator=g),
            )
        )
    return out


def trinity_trainer(env, method, options, *, ppo=False, policy_loss_fn=LOSS_PATH, micro_batch=None):
    """VERLTrainer as its __init__ and _init_workers wire it (worker groups, configs, advantage and KL functions),
    over in-process workers; micro_batch None: dynamic batch sizes (24-token budget), else fixed micro-batches."""
    import logging
    from functools import partial

    from engine_step import InProcessWorkerGroup, actor_rollout_ref_worker, fsdp_engine, training_worker
    from trinity.algorithm import ALGORITHM_TYPE, KL_FN
    from trinity.common.config import AlgorithmConfig
    from trinity.trainer.verl.trainer import VERLTrainer
    from trinity.trainer.verl.workers import TrinityActorRolloutRefWorker, TrinityCriticWorker
    from verl.workers.config import FSDPEngineConfig
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithValueHead
    from verl.workers.utils.losses import value_loss

    algo = AlgorithmConfig(
        algorithm_type="ppo" if ppo else "grpo_verl",
        advantage_fn=ADV_PATH,
        advantage_fn_args={"method": method, "base": "ppo" if ppo else "grpo_verl", **options},
        kl_penalty_fn="none",
        kl_penalty_fn_args={},
        policy_loss_fn=policy_loss_fn,
        policy_loss_fn_args={"clip_range": 0.2},
        kl_loss_fn="none",
        kl_loss_fn_args={},
        entropy_loss_fn="none",
        entropy_loss_fn_args={"entropy_coef": 0.0},
        loss_agg_mode="token-mean",
        bypass_old_logprobs=False,
    )
    eng_cfg = FSDPEngineConfig(
        strategy="fsdp",
        use_dynamic_bsz=micro_batch is None,
        max_token_len_per_gpu=24,
        infer_max_token_len_per_gpu=24,
        micro_batch_size_per_gpu=micro_batch,
        infer_micro_batch_size_per_gpu=4,
        use_remove_padding=True,
        use_torch_compile=False,
    )
    actor = training_worker(fsdp_engine(FSDPEngineWithLMHead, env.actor, eng_cfg), None, True)
    ref = training_worker(fsdp_engine(FSDPEngineWithLMHead, env.ref, eng_cfg), None, True)
    worker = actor_rollout_ref_worker(actor, ref, cls=TrinityActorRolloutRefWorker)
    worker.set_trinity_config(algo, "vllm", "test")  # Trinity's own wiring of its policy loss into the actor
    rows = GROUPS * N // MINI_BATCHES
    trainer = object.__new__(VERLTrainer)
    trainer.logger, trainer.global_steps = logging.getLogger("trinity-step"), 0
    trainer.global_config = SimpleNamespace(
        model=SimpleNamespace(temperature=1.0),
        algorithm=algo,
        trainer=SimpleNamespace(balance_batch=True, critic_warmup=0),
    )
    trainer.algorithm_config, trainer.algorithm = algo, ALGORITHM_TYPE.get(algo.algorithm_type)
    trainer.advantage_fn = ADVANTAGE_FN.get(algo.advantage_fn)(**algo.advantage_fn_args)
    trainer.kl_fn = KL_FN.get(algo.kl_penalty_fn)(**algo.kl_penalty_fn_args)
    loop = SimpleNamespace(ppo_mini_batch_size=rows, ppo_epochs=EPOCHS, data_loader_seed=42, shuffle=False)
    trainer.config = SimpleNamespace(actor=SimpleNamespace(calculate_sum_pi_squared=False, **vars(loop)), critic=loop)
    trainer.actor_rollout_wg = trainer.ref_policy_wg = InProcessWorkerGroup(worker)
    trainer.use_reference_policy, trainer.ref_in_actor = True, False
    trainer.use_critic = trainer.algorithm.use_critic
    if trainer.use_critic:  # verl 0.8's value loss averages each micro-batch: one micro-batch per mini-batch
        critic_cfg = FSDPEngineConfig(
            strategy="fsdp",
            use_dynamic_bsz=False,
            micro_batch_size_per_gpu=rows,
            infer_micro_batch_size_per_gpu=4,
            use_remove_padding=True,
            use_torch_compile=False,
        )
        loss = partial(value_loss, SimpleNamespace(cliprange_value=0.5, loss_agg_mode="token-mean"))
        trainer.critic_wg = InProcessWorkerGroup(
            training_worker(
                fsdp_engine(FSDPEngineWithValueHead, env.critic, critic_cfg), loss, True, cls=TrinityCriticWorker
            )
        )
    trainer.tokenizer, trainer.empty_model = SimpleNamespace(pad_token_id=0), SimpleNamespace()
    trainer.resource_pool_manager = SimpleNamespace(get_n_gpus=lambda: 1)
    return trainer


def run_train_step(trainer):
    """Trinity's train_step on the experiences; returns the batch after the step (the advantage function's output,
    kept by a spy; Trinity mutates that DataProto in place), its rows' (ids, response length), and the metrics."""
    import asyncio

    seen = {}
    real = trainer.advantage_fn

    def spy(batch, **kwargs):
        seen["batch"], metrics = real(batch, **kwargs)
        return seen["batch"], metrics

    trainer.advantage_fn = spy
    trainer.advantage_fn.needs_s_expect = real.needs_s_expect
    metrics = asyncio.run(
        trainer.train_step(experiences(trainer.actor_rollout_wg.worker.actor.engine.module.config.vocab_size))
    )
    batch = seen["batch"].batch
    p = batch["prompts"].shape[1]
    sequences = [(ids[att.bool()], int(att[p:].sum())) for ids, att in zip(batch["input_ids"], batch["attention_mask"])]
    return batch, sequences, metrics


def step_keep(batch, sequences, env, method, options, *, written_back=True):
    """The filter over the whole batch, from the statistics Trinity's recompute stored (checked against
    token_stats of each sequence alone) and the batch's advantages: masks.* called directly."""
    from entropy_rft.core.methods import METHODS

    valid = batch[trinity_adapter.VALID_KEY].bool()
    lp, h = batch["old_log_probs"].float(), batch["entropys"].float()
    s_star = lp.exp() * (h + lp)
    s_expect = batch["necs"].float() if "necs" in batch.keys() else torch.zeros_like(s_star)
    with torch.no_grad():
        for r, (x, n) in enumerate(sequences):
            ref = token_stats(env.actor(input_ids=x[None]).logits[0, :-1][-n:], x[1:][-n:])
            torch.testing.assert_close(s_star[r, :n], ref.s_star, atol=1e-5, rtol=1e-4)
            if "necs" in batch.keys():
                torch.testing.assert_close(s_expect[r, :n], ref.s_expect, atol=1e-5, rtol=1e-4)
    spec = METHODS.get(method)
    score = s_star - s_expect if spec.score == "s_centered" else s_star
    if spec.score == "stats":  # RSI-S reads log p and H
        score = TokenStats(lp, h, s_star, s_expect)
    keep, _ = spec.filter(score, batch["advantages"].float(), valid, **{**spec.options, **options})
    dropped = int((valid & ~keep).sum()) / int(valid.sum())
    assert 0.03 < dropped < 0.75, f"the filter should drop some tokens, not all: {dropped:.2f}"
    if written_back:
        assert torch.equal(batch["response_mask"].bool(), valid & keep)  # the authors' write-back
    return keep & valid


def trinity_blocks():
    rows = GROUPS * N // MINI_BATCHES
    return [list(range(j * rows, (j + 1) * rows)) for j in range(MINI_BATCHES)] * EPOCHS


def check_trinity_actor(trainer, env, batch, sequences, keep):
    """Every actor optimizer step's gradient = the token mean of A * ratio over the mini-batch's kept tokens."""
    from engine_step import GRAD_RTOL, policy_gradient, rel_diff

    grads = trainer.actor_rollout_wg.worker.actor.engine.optimizer.grads
    assert len(grads) == MINI_BATCHES * EPOCHS
    for k, (rows, got) in enumerate(zip(trinity_blocks(), grads, strict=True)):
        want = policy_gradient(
            env.actor,
            [sequences[r] for r in rows],
            batch["advantages"][rows].float(),
            keep[rows].float(),
            keep[rows].sum(),
        )
        assert rel_diff(got, want) < GRAD_RTOL, f"actor step {k}: relative difference {rel_diff(got, want):.2e}"


def check_trinity_critic(trainer, env, batch, sequences):
    """Every critic optimizer step's gradient = the value loss's token mean over every valid token of the
    mini-batch (one micro-batch per mini-batch)."""
    from engine_step import GRAD_RTOL, rel_diff, value_gradient

    grads = trainer.critic_wg.worker.engine.optimizer.grads
    valid = batch[trinity_adapter.VALID_KEY].float()
    assert len(grads) == MINI_BATCHES * EPOCHS
    for k, (rows, got) in enumerate(zip(trinity_blocks(), grads, strict=True)):
        want = value_gradient(env.critic, [sequences[r] for r in rows], batch["returns"][rows].float(), valid[rows])
        assert rel_diff(got, want) < GRAD_RTOL, f"critic step {k}: relative difference {rel_diff(got, want):.2e}"


@pytest.mark.slow
@pytest.mark.parametrize(
    "method,options,micro_batch",
    [
        ("clip_b", {"mu": 0.2}, None),
        ("clip_v", {"mu": 0.5, "max_frac": None}, 2),
        ("s_sign:mask:neg_s:neg_samples", {}, 2),
        ("rsi", {"rsi_lower_bound": 2.0}, 2),
    ],
    ids=["clip_b-dynamic_bsz", "clip_v-micro2", "s_sign-micro2", "rsi-micro2"],
)
def test_whole_train_step_actor_gradients_are_the_kept_token_mean(whole_step_env, method, options, micro_batch):
    """Trinity's whole train_step (GRPO in the trainer, recompute on, GlobalTokenMeanPPO, 2 mini-batches x 2
    epochs): the filter is over the whole batch (Clip_V with the engine's E_p[S]) and every actor optimizer step's
    gradient is the token mean over the mini-batch's kept tokens."""
    trainer = trinity_trainer(whole_step_env, method, options, micro_batch=micro_batch)
    batch, sequences, metrics = run_train_step(trainer)
    keep = step_keep(batch, sequences, whole_step_env, method, options)
    check_trinity_actor(trainer, whole_step_env, batch, sequences, keep)
    assert metrics["advantage/entropy_rft/kept_frac"] == pytest.approx(
        float(keep.sum() / batch[trinity_adapter.VALID_KEY].sum())
    )


@pytest.mark.slow
def test_whole_train_step_ppo_critic_learns_on_every_valid_token(whole_step_env):
    """Trinity's PPO (GAE in the trainer, Table 4) + Clip_B: the critic's every optimizer step is the value loss's
    token mean over every valid response token, the actor's over the kept tokens."""
    trainer = trinity_trainer(whole_step_env, "clip_b", {"mu": 0.2}, ppo=True)
    batch, sequences, _ = run_train_step(trainer)
    keep = step_keep(batch, sequences, whole_step_env, "clip_b", {"mu": 0.2})
    check_trinity_critic(trainer, whole_step_env, batch, sequences)
    check_trinity_actor(trainer, whole_step_env, batch, sequences, keep)


@pytest.mark.slow
@pytest.mark.parametrize(
    "mutation", ["terms and denominator unfiltered", "per-micro-batch denominator", "critic sees the filter"]
)
def test_mutations_fail_the_train_step_oracle(whole_step_env, monkeypatch, mutation):
    """Mutation checks: no write-back (the loss keeps every token), Trinity's own ppo loss (a token mean per
    micro-batch, summed) and a critic that reads the filtered mask each make the oracle checks above fail."""
    from trinity.trainer.verl.trainer import VERLTrainer

    ppo, loss, micro_batch = False, LOSS_PATH, None
    if mutation == "terms and denominator unfiltered":
        monkeypatch.setattr(trinity_adapter, "write_back", lambda batch, keep: None)
    elif mutation == "per-micro-batch denominator":
        loss, micro_batch = "ppo", 2
    else:
        monkeypatch.setattr(VERLTrainer, "_update_critic", VERLTrainer._update_critic.original)
        ppo = True
    trainer = trinity_trainer(
        whole_step_env, "clip_b", {"mu": 0.2}, ppo=ppo, policy_loss_fn=loss, micro_batch=micro_batch
    )
    batch, sequences, _ = run_train_step(trainer)
    keep = step_keep(
        batch,
        sequences,
        whole_step_env,
        "clip_b",
        {"mu": 0.2},
        written_back=mutation != "terms and denominator unfiltered",
    )
    with pytest.raises(AssertionError, match="relative difference"):
        if ppo:
            check_trinity_critic(trainer, whole_step_env, batch, sequences)
        else:
            check_trinity_actor(trainer, whole_step_env, batch, sequences, keep)
