"""entropy_rft.integrations.trinity against the real Trinity-RFT 0.6.0 (and its verl 0.8.0) objects on CPU: the
registry, the authors' advantage functions, DataProto batches, verl's FSDP engine output code and its
forward_backward_batch, Trinity's VERLTrainer._compute_old_log_prob and TrinityPolicyLoss. Run with
`make test-trinity` (its own environment); skipped where Trinity-RFT is not installed."""

import copy

import numpy as np
import pytest
import torch
from conftest import f32, load_fixture

pytest.importorskip("trinity")
trinity_adapter = pytest.importorskip("entropy_rft.integrations.trinity")

from types import SimpleNamespace  # noqa: E402

from tensordict import TensorDict  # noqa: E402
from trinity.algorithm import ADVANTAGE_FN, POLICY_LOSS_FN  # noqa: E402
from trinity.trainer.verl.monkey_patch import left_right_2_no_padding  # noqa: E402
from verl import DataProto  # noqa: E402
from verl.utils import tensordict_utils as tu  # noqa: E402
from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead  # noqa: E402

from entropy_rft import masks  # noqa: E402
from entropy_rft.dynamics import token_stats  # noqa: E402

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
    ours = ADVANTAGE_FN.get(ADV_PATH)(method=method, base_args={"epsilon": case["params"]["epsilon"]},
                                      log_prob_key=log_prob_key, **options(case))
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
        data_proto(i, ("rollout_log_probs", "entropys")))
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
    with pytest.raises(ValueError, match="explorer"):
        trinity_adapter.EntropyAdvantageFn(method="clip_b", base="grpo")


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
    expected, _ = masks.s_sign(lp.exp() * (h + lp), sign.batch["advantages"], mask, action="mask", sign="positive",
                               samples="negative")
    assert torch.equal(sign.batch["response_mask"], expected)
