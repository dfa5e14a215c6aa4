"""Rollouts: response masks from generated lengths, and log-probs recomputed by the trainer equal the sampler's."""

import pytest
import torch

from entropy_rft.config import TrainConfig
from entropy_rft.rollout import HFEngine, Rollout
from entropy_rft.rollout.hf import response_mask_from_lengths
from entropy_rft.tasks import CountdownTask
from entropy_rft.train.forward import batch_stats
from entropy_rft.train.policy import load_policy
from entropy_rft.train.problems import default_data, load_problems


def test_mask_from_lengths_not_from_pad():
    """The mask runs through the first EOS (included) or to the end; a pad id inside a response is kept."""
    eos = 1  # the pad id is 0: it occurs inside row 0's response and after its EOS
    ids = torch.tensor([[5, 0, 6, 1, 0, 0], [5, 6, 7, 8, 9, 4], [1, 3, 1, 0, 0, 0]])
    mask, finished = response_mask_from_lengths(ids, eos)
    assert mask.tolist() == [[1, 1, 1, 1, 0, 0], [1] * 6, [1, 0, 0, 0, 0, 0]]
    assert finished.tolist() == [True, False, True]
    assert mask[0, 1]  # token equal to the pad id inside the response stays in the mask


@pytest.mark.slow
def test_recomputed_logprobs_equal_sampling_logprobs():
    """With left-padded prompts of different lengths, the trainer's forward pass gives the same log p of each
    sampled token as the distribution generate sampled it from (position ids and padding agree)."""
    model, tok = load_policy("countdown-tiny", torch.device("cpu"))
    task = CountdownTask()
    problems = load_problems(default_data(TrainConfig(), "eval"), task)[:12]
    engine = HFEngine(model, tok)
    ids, mask = engine.encode_prompts([task.prompt(p) for p in problems])
    assert len(set(mask.sum(-1).tolist())) > 1  # prompts of different lengths
    torch.manual_seed(0)
    out = model.generate(
        input_ids=ids,
        attention_mask=mask.long(),
        do_sample=True,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        max_new_tokens=16,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        output_scores=True,
        return_dict_in_generate=True,
    )
    resp = out.sequences[:, ids.shape[1] :]
    sampled = torch.stack(out.scores, 1).log_softmax(-1).gather(-1, resp.unsqueeze(-1)).squeeze(-1)
    rmask, finished = response_mask_from_lengths(resp, tok.eos_token_id)
    stats = batch_stats(model, Rollout(ids, mask, resp, rmask, finished, [""] * 12), 1.0, 5)
    torch.testing.assert_close(stats.logp[rmask], sampled[rmask], atol=1e-5, rtol=0)


@pytest.mark.slow
def test_generate_groups_and_seed():
    """n samples per prompt are grouped in order, and a seed makes sampling reproducible."""
    model, tok = load_policy("countdown-tiny", torch.device("cpu"))
    engine = HFEngine(model, tok)
    a = engine.generate(["1,2,3>6:", "4,5,6>9:"], n=3, seed=7)
    b = engine.generate(["1,2,3>6:", "4,5,6>9:"], n=3, seed=7)
    assert a.texts == b.texts and len(a.texts) == 6
    assert torch.equal(a.prompt_ids[0], a.prompt_ids[2]) and not torch.equal(a.prompt_ids[0], a.prompt_ids[3])


def _tiny_lm(vocab: int = 24, seed: int = 0):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen2Config(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
    )
    return Qwen2ForCausalLM(cfg).eval()


class _IdTokenizer:
    """A tokenizer over the ids themselves: 'a b c' -> [a, b, c]."""

    def __init__(self, pad: int, eos: int):
        self.pad_token_id, self.eos_token_id, self.padding_side = pad, eos, "left"
        self.chat_template = None

    def __call__(self, texts, return_tensors=None, padding=None, add_special_tokens=None):
        rows = [[int(t) for t in s.split()] for s in texts]
        width = max(map(len, rows))
        ids = torch.tensor([[self.pad_token_id] * (width - len(r)) + r for r in rows])
        mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
        return {"input_ids": ids, "attention_mask": mask}

    def decode(self, ids, skip_special_tokens=False):
        return " ".join(map(str, ids))


def test_nucleus_equals_transformers_top_p():
    """nucleus_logits keeps exactly the tokens transformers' TopPLogitsWarper keeps (random logits, several p)."""
    from transformers.generation.logits_process import TopPLogitsWarper

    from entropy_rft.rollout.sampling import nucleus_logits

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(64, 50, generator=g) * 3
    for p in (0.1, 0.5, 0.9, 0.99):
        ours = torch.isfinite(nucleus_logits(logits, p))
        theirs = torch.isfinite(TopPLogitsWarper(p)(None, logits.clone()))
        assert torch.equal(ours, theirs), p
    assert torch.equal(nucleus_logits(logits, 1.0), logits)


def test_sampler_logp_is_the_policy_at_every_step():
    """Each sampled token's sampler log-prob equals log softmax(z / T) of a full forward over the whole sequence:
    the prefix cache shared across a group, the rows dropped as they finish and the position ids reproduce the
    policy exactly (left-padded prompts of different lengths, T = 0.7, two EOS ids)."""
    from entropy_rft.core.dynamics import token_stats
    from entropy_rft.rollout.hf import sequence_forward

    model = _tiny_lm()
    model.generation_config.eos_token_id = [3, 5]
    engine = HFEngine(model, _IdTokenizer(pad=0, eos=3))
    out = engine.generate(["7 8 9 10", "11 12", "13"], n=6, temperature=0.7, max_new_tokens=20, seed=1)
    assert out.finished.any() and not out.finished.all()  # some rows dropped early, some ran to the end
    logits, _ = sequence_forward(model, out)
    ref = token_stats(logits, out.response_ids, temperature=0.7).logp
    torch.testing.assert_close(out.sampler_logp[out.response_mask], ref[out.response_mask], atol=2e-5, rtol=0)
    # every EOS id ends a response: the mask stops at the first 3 or 5, and nothing after it is kept
    for ids, m, done in zip(out.response_ids, out.response_mask, out.finished):
        ended = torch.isin(ids, torch.tensor([3, 5]))
        if done:
            first = int(ended.int().argmax())
            assert int(m.sum()) == first + 1 and not ended[:first].any()
        else:
            assert m.all() and not ended.any()


def test_generation_config_processors_are_not_inherited():
    """A checkpoint whose generation_config carries top_k 1 and repetition_penalty 5 (as Qwen2.5-Instruct ships
    top_k 20, repetition_penalty 1.05) still samples from softmax(z / T): the first token's frequencies over 4000
    samples match the model's probabilities (greedy top_k 1 would give a single token)."""
    model = _tiny_lm(vocab=8, seed=3)
    model.generation_config.top_k = 1
    model.generation_config.repetition_penalty = 5.0
    engine = HFEngine(model, _IdTokenizer(pad=0, eos=1))
    out = engine.generate(["2 4 6"], n=4000, temperature=1.0, max_new_tokens=1, seed=0)
    with torch.no_grad():
        probs = model(input_ids=torch.tensor([[2, 4, 6]])).logits[0, -1].softmax(-1)
    freq = torch.bincount(out.response_ids[:, 0], minlength=8).float() / 4000
    assert (probs > 0.05).sum() >= 3  # the check has several likely tokens to tell apart
    assert (freq - probs).abs().max() < 0.03


@pytest.mark.slow
def test_a_training_step_uses_no_deprecated_transformers_name(tmp_path):
    """One `train` step of the shipped policy (sampling with the KV cache, the update's shared-prefix forward, the
    evaluation) raises no FutureWarning or DeprecationWarning and logs no deprecation through transformers' logger:
    the cache goes under the name the installed transformers gives it (rollout/cache.py). transformers 5 warns that
    `past_key_values` "will be removed in version 5.40.0"."""
    import logging
    import warnings

    from entropy_rft.config import load_config
    from entropy_rft.train.trainer import train

    said: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record):
            said.append(record.getMessage())

    from transformers.utils import logging as hf_logging

    hf_logging.warning_once.cache_clear()  # said once per process: an earlier test may have said it already
    handler = Keep(level=logging.WARNING)
    logging.getLogger("transformers").addHandler(handler)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", FutureWarning)
            warnings.simplefilter("error", DeprecationWarning)
            train(
                load_config(
                    None,
                    steps=1,
                    prompts_per_step=2,
                    group_size=2,
                    max_new_tokens=8,
                    eval_problems=2,
                    eval_k=1,
                    progress=False,
                    out=str(tmp_path / "run"),
                )
            )
    finally:
        logging.getLogger("transformers").removeHandler(handler)
    assert not [m for m in said if "deprecat" in m.lower()], said


def test_a_generator_on_another_device_than_the_model_is_refused():
    """sample() refuses a generator that lives elsewhere than the model (a CPU generator with a CUDA model fails deep
    in torch.multinomial otherwise), naming both devices; checked on a CPU machine through the check itself."""
    import pytest

    from entropy_rft.rollout.sampling import check_generator

    check_generator(torch.Generator(), torch.device("cpu"))
    check_generator(None, torch.device("cuda"))
    with pytest.raises(ValueError, match="generator is on cpu but the model samples on cuda"):
        check_generator(torch.Generator(), torch.device("cuda"))


def test_synthetic_batches_draw_on_the_models_device(monkeypatch):
    """invariants.synthetic_batch creates its sampling generator on the device of the model's parameters (the GPU
    guarantee suite failed at its first test when it handed a CUDA model a CPU generator): the generator sample()
    receives was created with the model's device named."""
    import invariants

    from entropy_rft.config import load_config

    created, received = [], []
    real = torch.Generator

    def recording(*args, **kwargs):
        created.append(kwargs.get("device", args[0] if args else None))
        return real(*args, **kwargs)

    def fake_sample(model, ids, mask, sampling, *, generator, **kw):
        received.append(generator)
        return torch.zeros(ids.shape[0] * sampling.n, sampling.max_new_tokens, dtype=torch.long), None

    cfg = load_config(None)
    model = invariants.scaled_model(
        "Qwen/Qwen2.5-7B-Instruct",
        cfg,
        hidden_size=16,
        intermediate_size=32,
        num_attention_heads=2,
        head_dim=8,
        vocab_size=50,
    )
    monkeypatch.setattr(invariants.torch, "Generator", recording)
    monkeypatch.setattr(invariants, "sample", fake_sample)
    invariants.synthetic_batch(2, 2, vocab=50, max_response=3, model=model)
    assert len(received) == 1
    device = next(model.parameters()).device
    assert received[0].device == device and device in [torch.device(d) for d in created if d is not None]
