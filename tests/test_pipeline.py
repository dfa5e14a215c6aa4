"""The math pipeline: multi-dataset evaluation, the pass-rate filter, recipes and their dry runs, and the scale
options (chat templates, LoRA, bf16 autocast, gradient checkpointing, the vLLM adapter's own logic; the adapter
against real vLLM is tests/test_vllm.py)."""

import json
from dataclasses import dataclass, replace
from math import comb
from pathlib import Path

import pytest
import torch
import yaml
from conftest import FIXTURES

from entropy_rft.commands.pipeline import EvalRequest, dry_run, filter_to_dir, parse_data_specs
from entropy_rft.config import load_config
from entropy_rft.evaluate import evaluate_datasets, results_markdown
from entropy_rft.rollout import HFEngine
from entropy_rft.rollout.hf import Rollout, render_prompts
from entropy_rft.rollout.vllm import VLLMEngine, merged_state_dict, rollout_from_outputs, unmerge
from entropy_rft.tasks import TASKS, MathProblem
from entropy_rft.train.forward import policy_forward
from entropy_rft.train.policy import STAND_IN, load_policy, prepare_policy, resolve_model_path

RECIPES = sorted((Path(__file__).parent.parent / "entropy_rft" / "configs" / "paper").glob("*.yaml"))
pytest.importorskip("math_verify")


class ScriptedEngine:
    """Answers problem i correctly in its first `right(i)` samples and wrongly after: known pass rates."""

    def __init__(self, problems, right):
        self.index = {p.question: i for i, p in enumerate(problems)}
        self.right = right
        self.calls = 0
        self.seeds = []

    def generate(self, prompts, *, n, temperature, top_p=1.0, max_new_tokens, seed=None):
        self.calls += 1
        self.seeds.append(seed)
        texts, finished = [], []
        for prompt in prompts:
            i = next(v for q, v in self.index.items() if q in prompt)
            for j in range(n):
                texts.append(f"Work.\nAnswer: {'' if j < self.right(i) else 'not '}{ANSWERS[i]}")
                finished.append(True)
        b = len(texts)
        return Rollout(
            torch.zeros(b, 1, dtype=torch.long),
            torch.ones(b, 1, dtype=torch.bool),
            torch.ones(b, 3, dtype=torch.long),
            torch.ones(b, 3, dtype=torch.bool),
            torch.tensor(finished),
            texts,
        )


PROBLEMS = [MathProblem(f"Question number {i}?", str(10 + i), str(i)) for i in range(6)]
ANSWERS = [p.answer for p in PROBLEMS]


def test_parse_data_specs():
    """A trailing @K sets one dataset's K; the rest take the common k; paths with '=' survive."""
    assert parse_data_specs("aime24,aime25,dapo500@8", 32) == [("aime24", 32), ("aime25", 32), ("dapo500", 8)]
    assert parse_data_specs("x=/d/a.parquet@4", 32) == [("x=/d/a.parquet", 4)]
    with pytest.raises(ValueError):
        parse_data_specs(" , ", 32)


def test_evaluate_datasets_matches_brute_force():
    """Avg@K and Pass@K of a scripted engine (problem i right in min(i, n) of n samples) equal the mean over
    problems of c/n and of 1 - C(n-c, K)/C(n, K)."""
    task = TASKS.get("math")
    n, k = 5, 2
    engine = ScriptedEngine(PROBLEMS, right=lambda i: min(i, n))
    res = evaluate_datasets(engine, task, {"d": (PROBLEMS, k)}, n=n, temperature=0.7, max_new_tokens=8)["d"]
    cs = [min(i, n) for i in range(len(PROBLEMS))]
    assert res["pass_rates"] == [c / n for c in cs]
    assert res["avg_at_k"] == pytest.approx(sum(c / n for c in cs) / len(cs))
    assert res["pass_at_k"] == pytest.approx(sum(1 - comb(n - c, k) / comb(n, k) for c in cs) / len(cs))
    text = results_markdown({"d": res})
    assert f"{100 * res['avg_at_k']:.2f}" in text and "d Pass@2" in text


def test_filter_keeps_the_paper_band_and_resumes(tmp_path):
    """With 16 samples, problems right in 0, 1, 15 or 16 of them are dropped and 2..14 kept; pass rates are saved;
    a second run reads scored.jsonl and generates nothing."""
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(p.to_json()) + "\n" for p in PROBLEMS))
    counts = [0, 1, 2, 14, 15, 16]
    engine = ScriptedEngine(PROBLEMS, right=lambda i: counts[i])
    out = tmp_path / "filtered"
    request = EvalRequest("scripted", n=16, engine=engine)
    summary = filter_to_dir(request, task_name="math", spec=f"train={data}", out=out, chunk=4)
    kept = [json.loads(line) for line in (out / "train.jsonl").read_text().splitlines()]
    assert [r["id"] for r in kept] == ["2", "3"] and [r["pass_rate"] for r in kept] == [2 / 16, 14 / 16]
    assert (summary["kept"], summary["dropped_low"], summary["dropped_high"]) == (2, 2, 2)
    assert engine.calls == 2 and (out / "pass_rates.png").exists()
    again = filter_to_dir(request, task_name="math", spec=f"train={data}", out=out)
    assert engine.calls == 2 and again == summary


def test_filter_resumed_after_a_stop_scores_as_the_unstopped_run(tmp_path):
    """A filter stopped while writing its second chunk (scored.jsonl holds the first chunk and half a line) drops the
    cut line, samples only the chunks not finished, each with the seed the unstopped run gave it (seed + its first
    problem's index in the whole list), and ends with the unstopped run's scored.jsonl and train.jsonl bytes."""
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(p.to_json()) + "\n" for p in PROBLEMS))
    counts = [0, 1, 2, 14, 15, 16]

    def run(out):
        engine = ScriptedEngine(PROBLEMS, right=lambda i: counts[i])
        spec = f"train={data}"
        filter_to_dir(
            EvalRequest("scripted", n=16, engine=engine, seed=7), task_name="math", spec=spec, out=out, chunk=2
        )
        return engine

    assert run(tmp_path / "full").seeds == [7, 9, 11]
    stopped = tmp_path / "stopped"
    stopped.mkdir()
    lines = (tmp_path / "full" / "scored.jsonl").read_text().splitlines(keepends=True)
    (stopped / "scored.jsonl").write_text(lines[0] + lines[1] + lines[2][:10])
    assert run(stopped).seeds == [9, 11]
    for name in ("scored.jsonl", "train.jsonl"):
        assert (stopped / name).read_bytes() == (tmp_path / "full" / name).read_bytes()


def test_eval_cli_on_fixture_datasets(tmp_path, capsys):
    """`entropy-rft eval` on two schema fixtures writes JSON, markdown, the pass-rate PNG and every sample."""
    from entropy_rft.commands.cli import main

    data = f"aime24={FIXTURES / 'math' / 'aime24.parquet'},aime25={FIXTURES / 'math' / 'aime25.jsonl'}@2"
    main(["eval", "--model", STAND_IN, "--data", data, "--k", "3", "--max-new-tokens", "8", "--out", str(tmp_path)])
    assert "aime24 Avg@3" in capsys.readouterr().out
    results = json.loads((tmp_path / "eval.json").read_text())["results"]
    assert (results["aime24"]["k"], results["aime25"]["k"]) == (3, 2)
    assert len(results["aime24"]["pass_rates"]) == 4
    rows = [json.loads(x) for x in (tmp_path / "samples" / "aime25.jsonl").read_text().splitlines()]
    assert len(rows) == 4 and all(len(r["responses"]) == 2 for r in rows)
    assert (tmp_path / "pass_rates.png").stat().st_size > 0


@pytest.mark.slow
def test_eval_quiet_draws_no_generation_bar(tmp_path, capsys):
    """`eval --quiet` generates without the per-batch bar that a plain eval draws on stderr (four batches here:
    --batch-size 3 holds one problem's 3 samples), and scores the same: the bar is display only."""
    from entropy_rft.commands.cli import main

    data = f"aime24={FIXTURES / 'math' / 'aime24.parquet'}"
    args = ["eval", "--model", STAND_IN, "--data", data, "--k", "3", "--max-new-tokens", "4", "--batch-size", "3"]
    main([*args, "--out", str(tmp_path / "loud")])
    loud = capsys.readouterr().err
    main([*args, "--out", str(tmp_path / "quiet"), "--quiet"])
    quiet = capsys.readouterr().err
    assert "generate" in loud and "generate" not in quiet
    rates = [
        json.loads((tmp_path / d / "eval.json").read_text())["results"]["aime24"]["pass_rates"]
        for d in ("loud", "quiet")
    ]
    assert rates[0] == rates[1]


# ---------------------------------------------------------------------------------------------------------------
# Recipes


def test_there_is_a_recipe_per_table_row():
    """Table 1 (2 models x GRPO, Clip_B, Clip_V), Table 4 (PPO, +Clip_B, +Clip_V) and Table 3's baselines."""
    names = {p.stem for p in RECIPES}
    for model in ("qwen2.5-7b-instruct", "qwen3-4b-base"):
        assert {f"{model}_grpo", f"{model}_clip_b", f"{model}_clip_v"} <= names
    assert {"qwen2.5-7b-instruct_ppo", "qwen2.5-7b-instruct_ppo_clip_b", "qwen2.5-7b-instruct_ppo_clip_v"} <= names


@pytest.mark.parametrize("path", RECIPES, ids=[p.stem for p in RECIPES])
def test_recipe_holds_the_papers_settings(path):
    """Every recipe loads and carries Appendix B's settings: lr 4e-7, Adam (0.9, 0.999), 64 prompts, 16 rollouts
    for Qwen2.5-7B-Instruct and 8 for Qwen3-4B-Base, temperature 1.0 for rollouts and 0.7 for evaluation."""
    cfg = load_config(path)
    assert (cfg.lr, cfg.betas, cfg.prompts_per_step, cfg.temperature, cfg.eval_temperature) == (
        4e-7,
        (0.9, 0.999),
        64,
        1.0,
        0.7,
    )
    assert cfg.group_size == (16 if "qwen2.5" in path.stem else 8)
    assert cfg.kl_coef == 0 and cfg.task == "math_boxed"
    if cfg.method in ("clip_b", "ppo_clip_b"):
        assert cfg.mu == 2.5
    if cfg.method in ("clip_v", "ppo_clip_v"):
        assert (cfg.mu, cfg.max_frac) == (8.5, 1e-4)
    assert yaml.safe_load(path.read_text())["method"] == cfg.method


@pytest.mark.slow
@pytest.mark.parametrize("path", RECIPES, ids=[p.stem for p in RECIPES])
def test_recipe_dry_run(path, tmp_path):
    """`train --dry-run`: the recipe validates and runs two finite steps on the CPU stand-in."""
    report = dry_run(load_config(path), tmp_path / "dry")
    assert report["ok"] and len(report["steps"]) == 2
    metrics = [json.loads(x) for x in (tmp_path / "dry" / "metrics.jsonl").read_text().splitlines()]
    assert len(metrics) == 2 and all(torch.isfinite(torch.tensor(m["entropy"])) for m in metrics)


@pytest.mark.slow
def test_dry_run_cli(tmp_path, capsys):
    """`entropy-rft train --config RECIPE --dry-run` prints its report and a pass line."""
    from entropy_rft.commands.cli import main

    main(["train", "--config", str(RECIPES[0]), "--dry-run", "--out", str(tmp_path)])
    assert "dry run passed" in capsys.readouterr().out


# ---------------------------------------------------------------------------------------------------------------
# Scale options


@pytest.fixture(scope="module")
def stand_in():
    return resolve_model_path(STAND_IN)


def test_chat_template_wraps_prompts(stand_in):
    """With chat_template the prompt ids are exactly the tokenised chat rendering of one user turn."""
    model, tokenizer = load_policy(STAND_IN, torch.device("cpu"))
    ro = HFEngine(model, tokenizer, chat_template=True).generate(["What is 1+1?"], n=1, max_new_tokens=4, seed=0)
    want = tokenizer(render_prompts(tokenizer, ["What is 1+1?"], True)[0], add_special_tokens=False)["input_ids"]
    assert ro.prompt_ids[0][ro.prompt_mask[0]].tolist() == want
    assert render_prompts(tokenizer, ["x"], True)[0].startswith("<|user|>\nx\n<|assistant|>")


def test_bf16_autocast_keeps_float32_statistics(stand_in):
    """bf16 autocast gives float32 token statistics close to the fp32 forward (bf16 has ~3 significant digits)."""
    model, tokenizer = load_policy(STAND_IN, torch.device("cpu"))
    ro = HFEngine(model, tokenizer, chat_template=True).generate(["What is 1+1?"], n=2, max_new_tokens=6, seed=0)
    full, _ = policy_forward(model, ro, 1.0)
    half, _ = policy_forward(model, ro, 1.0, precision="bf16")
    assert half.entropy.dtype == torch.float32 and half.logp.dtype == torch.float32
    m = ro.response_mask
    torch.testing.assert_close(half.entropy[m], full.entropy[m], atol=0.05, rtol=0.02)
    assert next(model.parameters()).dtype == torch.float32


def test_gradient_checkpointing_gives_the_same_gradients(stand_in):
    """Recomputing activations in the backward pass changes memory, not gradients."""
    grads = []
    for checkpointing in (False, True):
        model, tokenizer = load_policy(STAND_IN, torch.device("cpu"), trainable=True)
        cfg = load_config(None, gradient_checkpointing=checkpointing)
        model = prepare_policy(model, cfg)
        flag = getattr(model, "is_activation_checkpointing", None)
        assert (flag if flag is not None else model.is_gradient_checkpointing) == checkpointing
        model.train()
        ro = HFEngine(model, tokenizer).generate(["abc", "de"], n=2, max_new_tokens=5, seed=3)
        model.train()
        stats, _ = policy_forward(model, ro, 1.0)
        (stats.logp * ro.response_mask).sum().backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys()
    for name in grads[0]:
        torch.testing.assert_close(grads[0][name], grads[1][name], atol=1e-6, rtol=1e-5)


def test_lora_trains_only_adapters_and_round_trips(stand_in, tmp_path):
    """lora_rank > 0: only LoRA weights require grad; after a step the base weights are unchanged; the saved
    adapter directory loads back (merged) with the same logits."""
    pytest.importorskip("peft")
    model, tokenizer = load_policy(STAND_IN, torch.device("cpu"), trainable=True)
    base = {k: v.clone() for k, v in model.state_dict().items()}
    model = prepare_policy(model, load_config(None, lora_rank=4))
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    ro = HFEngine(model, tokenizer).generate(["abc"], n=2, max_new_tokens=5, seed=1)
    stats, _ = policy_forward(model, ro, 1.0)
    (-(stats.logp * ro.response_mask).sum()).backward()
    opt.step()
    merged = merged_state_dict(model)
    unmerge(model)
    assert merged.keys() == base.keys()  # vLLM receives the base model's names
    changed = [k for k in base if not torch.equal(merged[k], base[k])]
    assert changed and all(k.endswith(".weight") for k in changed)  # the LoRA delta is merged into linears
    model.save_pretrained(tmp_path / "adapter")
    tokenizer.save_pretrained(tmp_path / "adapter")
    reloaded, _ = load_policy(str(tmp_path / "adapter"), torch.device("cpu"))
    model.eval()
    ids = ro.input_ids()
    with torch.no_grad():
        torch.testing.assert_close(reloaded(input_ids=ids).logits, model(input_ids=ids).logits, atol=1e-5, rtol=1e-5)


@dataclass
class _Completion:
    token_ids: list
    finish_reason: str
    logprobs: list | None = None


@dataclass
class _Logprob:
    logprob: float


@dataclass
class _Output:
    outputs: list


def test_vllm_outputs_become_a_rollout(stand_in):
    """rollout_from_outputs: grouped rows, left-padded prompts, masks up to and including EOS, truncation and a
    stop without a returned EOS both handled (the vLLM library itself needs a GPU and is not run here)."""
    _, tokenizer = load_policy(STAND_IN, torch.device("cpu"))
    eos = tokenizer.eos_token_id
    outs = [
        _Output([_Completion([5, 6, eos, 9], "stop"), _Completion([7, 7, 7], "length")]),
        _Output([_Completion([8], "stop"), _Completion([], "stop")]),
    ]
    ro = rollout_from_outputs(outs, [[1, 2, 3], [4]], eos_ids=[eos], pad_id=tokenizer.pad_token_id, tokenizer=tokenizer)
    assert ro.finished.tolist() == [True, False, True, True]
    assert ro.response_mask.sum(-1).tolist() == [3, 3, 2, 1]
    assert ro.response_ids[0, :3].tolist() == [5, 6, eos] and ro.response_ids[2, :2].tolist() == [8, eos]
    assert ro.prompt_mask.tolist() == [[True] * 3, [True] * 3, [False, False, True], [False, False, True]]
    assert ro.sampler_logp is None  # no completion carried log-probs


def test_vllm_sampled_logprobs_travel_with_the_rollout(stand_in):
    """Each completion's per-token log-probs (vLLM's {token: Logprob} per step) fill sampler_logp up to the
    response length; concat pads them and select keeps them row by row."""
    _, tokenizer = load_policy(STAND_IN, torch.device("cpu"))
    eos = tokenizer.eos_token_id
    steps = lambda toks, lps: [{t: _Logprob(lp), 99: _Logprob(-9.0)} for t, lp in zip(toks, lps)]  # noqa: E731
    outs = [
        _Output(
            [
                _Completion([5, eos], "stop", steps([5, eos], [-0.5, -1.5])),
                _Completion([7, 8, 9], "length", steps([7, 8, 9], [-0.1, -0.2, -0.3])),
            ]
        )
    ]
    ro = rollout_from_outputs(outs, [[1, 2]], eos_ids=[eos], pad_id=tokenizer.pad_token_id, tokenizer=tokenizer)
    torch.testing.assert_close(ro.sampler_logp, torch.tensor([[-0.5, -1.5, 0.0], [-0.1, -0.2, -0.3]]))
    wide = Rollout.concat([ro.select([1]), ro.select([0])], tokenizer.pad_token_id)
    torch.testing.assert_close(wide.sampler_logp, torch.tensor([[-0.1, -0.2, -0.3], [-0.5, -1.5, 0.0]]))
    hf = HFEngine(load_policy(STAND_IN, torch.device("cpu"))[0], tokenizer).generate(["a"], n=1, max_new_tokens=2)
    both = Rollout.concat([ro, hf], tokenizer.pad_token_id).sampler_logp  # the HF engine's sampler keeps them too
    torch.testing.assert_close(both[2, : hf.sampler_logp.shape[1]], hf.sampler_logp[0])
    plain = replace(hf, sampler_logp=None)
    assert Rollout.concat([ro, plain], tokenizer.pad_token_id).sampler_logp is None  # only when every part has them


def test_vllm_responses_end_at_any_eos_of_the_checkpoint(stand_in, tmp_path, fake_vllm):
    """Every EOS id of the checkpoint ends a response (the tokenizer's first, then generation_config.json's): the
    mask runs to the first of them inclusive, nothing after it is kept, and the HF engine's mask of the same ids
    agrees; vLLM is asked to stop on all of them."""
    from entropy_rft.rollout.hf import response_mask_from_lengths
    from entropy_rft.rollout.vllm import checkpoint_eos_ids

    _, tokenizer = load_policy(STAND_IN, torch.device("cpu"))
    eos, other = tokenizer.eos_token_id, 7
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [other, eos]}))
    ids = checkpoint_eos_ids(str(tmp_path), tokenizer)
    assert ids == [eos, other]
    assert checkpoint_eos_ids(str(tmp_path / "none"), tokenizer) == [eos]
    outs = [_Output([_Completion([5, other], "stop"), _Completion([5, 6, eos, other, 9], "stop")])]
    ro = rollout_from_outputs(outs, [[1, 2]], eos_ids=ids, pad_id=tokenizer.pad_token_id, tokenizer=tokenizer)
    assert ro.finished.tolist() == [True, True] and ro.response_mask.sum(-1).tolist() == [2, 3]
    assert ro.response_ids[0, :2].tolist() == [5, other] and ro.response_ids[1, :3].tolist() == [5, 6, eos]
    assert torch.equal(response_mask_from_lengths(ro.response_ids, ids)[0], ro.response_mask)
    llm = _FakeLLM()
    engine = VLLMEngine(None, tokenizer, model_path=str(tmp_path), llm=llm)
    engine.generate(["a"], n=1, max_new_tokens=4)
    assert llm.params[0].stop_token_ids == [eos, other]


@pytest.fixture
def fake_vllm(monkeypatch):
    """A `vllm` module holding only SamplingParams (its arguments kept as attributes), where vLLM is absent."""
    import sys
    import types

    if "vllm" not in sys.modules:
        try:
            import vllm  # noqa: F401
        except ImportError:
            monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(SamplingParams=types.SimpleNamespace))


class _FakeLLM:
    """vllm.LLM's methods the engine calls, recorded (no vLLM needed): generate returns one 2-token completion per
    request; `reload` is how collective_rpc('reload_weights') behaves (a TypeError for a no-argument version)."""

    def __init__(self, reload=None):
        self.calls, self.params, self.reload = [], [], reload

    def generate(self, prompts, params, use_tqdm=False):
        self.calls.append("generate")
        self.params += params
        return [_Output([_Completion([5, 6], "length")]) for _ in prompts]

    def collective_rpc(self, method, kwargs=None):
        self.calls.append(method)
        if self.reload is not None:
            raise self.reload

    def apply_model(self, fn):
        self.calls.append("load_weights")

    def reset_prefix_cache(self):
        self.calls.append("reset_prefix_cache")

    def sleep(self, level):
        self.calls.append(f"sleep {level}")

    def wake_up(self, tags=None):
        self.calls.append(f"wake {','.join(tags)}")


class _SeededLLM(_FakeLLM):
    """A recording vllm.LLM that samples as vLLM seeds: a request seeded s draws its one completion from the stream
    s, and the j-th child of an n-sample request from s + j (vLLM's ParentRequest._get_child_sampling_params); each
    row's stream is recorded in `streams`."""

    def __init__(self):
        super().__init__()
        self.streams = []

    def generate(self, prompts, params, use_tqdm=False):
        self.params += params
        outs = []
        for p in params:
            children = []
            for j in range(p.n):
                stream = p.seed if p.n == 1 else p.seed + j
                self.streams.append(stream)
                draw = torch.randint(3, 60, (8,), generator=torch.Generator().manual_seed(stream)).tolist()
                children.append(_Completion(draw, "length"))
            outs.append(_Output(children))
        return outs


def test_vllm_rows_draw_their_own_streams(stand_in, fake_vllm):
    """Every row of one generate call draws its own random stream (4 prompts x 4 samples: 16 streams, no two the
    same, as vLLM seeds requests and their children), so two identical prompts in a batch get different samples;
    the rows stay grouped by prompt; the same seed repeats every row, and the next seed (the trainer's next step)
    shares no stream with it."""
    _, tokenizer = load_policy(STAND_IN, torch.device("cpu"))
    prompts = ["abc", "abc", "de", "fgh"]

    def call(seed):
        llm = _SeededLLM()
        ro = VLLMEngine(None, tokenizer, model_path=STAND_IN, llm=llm).generate(
            prompts, n=4, max_new_tokens=8, seed=seed
        )
        return llm, ro

    llm, ro = call(5)
    assert len(llm.streams) == 16 and len(set(llm.streams)) == 16
    rows = [tuple(r) for r in ro.response_ids.tolist()]
    assert len(set(rows)) == 16  # identical prompts included: no two rows alike
    ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
    for row in range(16):  # row i * 4 + j is prompt i's
        want = ids[row // 4]
        assert ro.prompt_ids[row, ro.prompt_mask[row]].tolist() == want
    again, ro_again = call(5)
    assert again.streams == llm.streams and torch.equal(ro_again.response_ids, ro.response_ids)
    assert not set(call(6)[0].streams) & set(llm.streams)


@pytest.mark.parametrize("error", [None, NotImplementedError("no reload"), TypeError("takes 1 positional argument")])
def test_vllm_sync_falls_back_to_load_weights(stand_in, error):
    """sync_weights hands the weights to the worker's reload_weights; where vLLM has none (NotImplementedError) or
    one that takes no weights (a TypeError), to the model's load_weights; then the prefix cache is reset."""
    model, tokenizer = load_policy(STAND_IN, torch.device("cpu"))
    llm = _FakeLLM(reload=error)
    VLLMEngine(model, tokenizer, model_path=STAND_IN, llm=llm).sync_weights()
    fallback = [] if error is None else ["load_weights"]
    assert llm.calls == ["reload_weights", *fallback, "reset_prefix_cache"]


@pytest.mark.parametrize("level", [1, 2])
def test_vllm_sleeps_between_rollouts(stand_in, level, fake_vllm):
    """Sleep mode (departure 6): after each generate vLLM sleeps; sync_weights wakes the weights alone to load the
    new ones; generate wakes the KV cache (and resets the prefixes); at level 2 a generate with no sync since the
    sleep pushes the policy's weights back first. Off (level 0) nothing sleeps; level 2 without a policy and sleep
    without CUDA are refused."""
    model, tokenizer = load_policy(STAND_IN, torch.device("cpu"))
    llm = _FakeLLM()
    engine = VLLMEngine(model, tokenizer, model_path=STAND_IN, llm=llm, sleep_level=level)
    engine.generate(["a"], n=1, max_new_tokens=2)
    engine.sync_weights()
    engine.generate(["a"], n=1, max_new_tokens=2)
    engine.generate(["a"], n=1, max_new_tokens=2)  # an evaluation right after a rollout: no sync between
    push = ["wake weights", "reload_weights"]  # (no prefix reset while the KV cache sleeps: waking it resets)
    again = push if level == 2 else ["wake weights"]
    wake = ["wake kv_cache", "reset_prefix_cache"]
    assert llm.calls == [
        "generate",
        f"sleep {level}",
        *push,
        *wake,
        "generate",
        f"sleep {level}",
        *again,
        *wake,
        "generate",
        f"sleep {level}",
    ]
    off = _FakeLLM()
    VLLMEngine(model, tokenizer, model_path=STAND_IN, llm=off).generate(["a"], n=1, max_new_tokens=2)
    assert off.calls == ["generate"]
    with pytest.raises(ValueError, match="needs the policy"):
        VLLMEngine(None, tokenizer, model_path=STAND_IN, llm=off, sleep_level=2)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="needs a CUDA GPU"):
            VLLMEngine(model, tokenizer, model_path=STAND_IN, sleep_level=1)


def test_vllm_generates_in_bfloat16_on_cuda():
    """vLLM's dtype: bfloat16 on CUDA whatever the training precision (no float32 FlashAttention), the training
    precision on the CPU; vllm_args override it and every other vllm.LLM argument; sleep mode only when asked."""
    from entropy_rft.rollout.vllm import engine_args, generation_dtype

    assert generation_dtype("fp32", cuda=True) == generation_dtype("bf16", cuda=True) == "bfloat16"
    assert generation_dtype("fp32", cuda=False) == "float32" and generation_dtype("bf16", cuda=False) == "bfloat16"
    args = engine_args("m", dtype="bfloat16", seed=1, gpu_memory=0.3, sleep_level=0, llm_args={"dtype": "float16"})
    assert args["dtype"] == "float16" and args["enable_sleep_mode"] is False and args["model"] == "m"
    assert engine_args("m", dtype="bfloat16", seed=1, gpu_memory=0.3, sleep_level=1, llm_args=None)["enable_sleep_mode"]
    assert load_config(None, engine="vllm", vllm_sleep=1).vllm_sleep == 1
    with pytest.raises(Exception, match="vllm_sleep"):
        load_config(None, vllm_sleep=3)


def test_vllm_engine_without_vllm_says_how_to_install():
    """Choosing engine vllm where vLLM is absent fails with the install command."""
    try:
        import vllm  # noqa: F401

        pytest.skip("vllm is installed")
    except ImportError:
        pass
    from entropy_rft.rollout import ENGINES

    with pytest.raises(ImportError, match=r"entropy-rft\[vllm\]"):
        ENGINES.get("vllm")(None, type("T", (), {"eos_token_id": 1})(), load_config(None, engine="vllm"), "x")


@pytest.mark.slow
def test_eval_of_a_run_scores_it_as_the_run_did(tmp_path, capsys, monkeypatch):
    """eval --model RUN_DIR, or RUN_DIR/checkpoint-N, scores the run's checkpoint on the run's own task, evaluation
    data and response limit, read from its config.yaml (not the shipped countdown at 16 tokens), with a note naming
    them; an option given on the command line wins over the run's. A checkpoint whose weights changed since they were
    written is refused naming the file, before anything is written."""
    from entropy_rft.commands.cli import main

    monkeypatch.chdir(tmp_path)
    tiny = ["prompts_per_step=2", "group_size=2", "eval_problems=2", "eval_k=1"]
    main(["train", "--steps", "1", "--out", "run", "--quiet", "--set", "task=countdown5", "max_new_tokens=12", *tiny])
    capsys.readouterr()
    for i, model in enumerate(["run", "run/checkpoint-1"]):
        main(["eval", "--model", model, "--eval-problems", "2", "--eval-k", "1", "--out", f"e{i}", "--quiet"])
        report = json.loads((tmp_path / f"e{i}" / "eval.json").read_text())
        assert report["meta"]["task"] == "countdown5" and report["meta"]["max_new_tokens"] == 12
        assert list(report["results"]) == ["countdown5"]
        assert "scoring as the run run was: task countdown5, data countdown5" in capsys.readouterr().err
    given = ["--task", "countdown", "--data", "countdown", "--max-new-tokens", "5"]
    main(["eval", "--model", "run", "--eval-problems", "2", "--eval-k", "1", "--out", "e3", "--quiet", *given])
    meta = json.loads((tmp_path / "e3" / "eval.json").read_text())["meta"]
    assert meta["task"] == "countdown" and meta["max_new_tokens"] == 5
    weights = tmp_path / "run" / "checkpoint-1" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1] + b"x")  # a damaged checkpoint is named, never scored
    for model in ("run", "run/checkpoint-1"):
        with pytest.raises(SystemExit):
            main(["eval", "--model", model, "--eval-problems", "2", "--eval-k", "1", "--out", "e4", "--quiet"])
        assert "run/checkpoint-1/model.safetensors is damaged (its SHA-256 differs" in capsys.readouterr().err
    assert not (tmp_path / "e4").exists()
