"""rollout/decode.py's hand-written decode step against the model's own forward, for each family it reads."""

import pytest
import torch

from entropy_rft.dynamics import token_stats
from entropy_rft.rollout import HFEngine, Rollout
from entropy_rft.rollout.decode import unsupported
from entropy_rft.rollout.hf import response_mask_from_lengths, sequence_forward
from entropy_rft.rollout.sampling import sample

SMALL = dict(vocab_size=29, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=128)


def _model(family: str, dtype=torch.float32, seed: int = 0, **extra):
    import transformers

    config_cls, model_cls = {"qwen2": ("Qwen2Config", "Qwen2ForCausalLM"), "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
                             "llama": ("LlamaConfig", "LlamaForCausalLM"),
                             "mistral": ("MistralConfig", "MistralForCausalLM")}[family]
    torch.manual_seed(seed)
    cfg = getattr(transformers, config_cls)(**{**SMALL, **extra})
    model = getattr(transformers, model_cls)(cfg).eval()
    with torch.no_grad():  # biases and norm weights away from their init (0 and 1), so a dropped one would show
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.add_(torch.randn_like(p) * 0.3)
    return model.to(dtype)


def _prompts(vocab: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Three left-padded prompts of lengths 6, 3 and 1 (ids >= 4; 0 is the pad)."""
    lengths, width = [6, 3, 1], 6
    ids = torch.zeros(3, width, dtype=torch.long)
    mask = torch.zeros(3, width, dtype=torch.bool)
    for i, n in enumerate(lengths):
        ids[i, width - n :] = torch.randint(4, vocab, (n,), generator=generator)
        mask[i, width - n :] = True
    return ids, mask


def _both(model, temperature=0.8, n=5, new=12, seed=3):
    ids, mask = _prompts(model.config.vocab_size, torch.Generator().manual_seed(seed))
    runs = {}
    for path in ("hf", "hand"):
        runs[path] = sample(model, ids, mask, n=n, temperature=temperature, top_p=1.0, max_new_tokens=new,
                            eos_ids=[3], pad_id=0, generator=torch.Generator().manual_seed(seed), decode=path)
    return ids, mask, runs


FAMILIES = [
    ("qwen2", {}),
    ("qwen3", {"head_dim": 16}),  # per-head q/k norms; a head_dim other than hidden / heads
    ("llama", {"attention_bias": True, "mlp_bias": True,
               "rope_parameters": {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0,
                                   "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                   "original_max_position_embeddings": 16}}),
    ("mistral", {"sliding_window": 64}),
]


@pytest.mark.parametrize("family,extra", FAMILIES, ids=[f for f, _ in FAMILIES])
def test_hand_decode_is_the_policy(family, extra):
    """Sampling with the hand step draws the same tokens as sampling through the model's forward (same generator),
    and every sampled token's log-prob equals log softmax(z / T) of one full forward over the whole sequence:
    biases, GQA, Qwen3's q/k norms, a llama3 rope, left padding of three lengths, rows dropped as they finish."""
    model = _model(family, **extra)
    assert unsupported(model) is None
    ids, mask, runs = _both(model)
    (hf_tokens, hf_logp), (tokens, logp) = runs["hf"], runs["hand"]
    assert torch.equal(tokens, hf_tokens)
    done = (tokens == 3).any(1)
    assert done.any() and not done.all()  # some rows left the batch early, some ran to the end
    rmask, finished = response_mask_from_lengths(tokens, 3)
    rows = torch.arange(3).repeat_interleave(5)
    rollout = Rollout(ids[rows], mask[rows], tokens, rmask, finished, [""] * len(rows))
    with torch.no_grad():
        logits, _ = sequence_forward(model, rollout)
    ref = token_stats(logits, tokens, temperature=0.8).logp
    torch.testing.assert_close(logp[rmask], ref[rmask], atol=2e-5, rtol=0)
    torch.testing.assert_close(logp, hf_logp, atol=2e-5, rtol=0)


def test_hand_decode_in_bfloat16():
    """A bfloat16 model: the hand step's log-probs stay within bfloat16 rounding of the model's forward decode."""
    model = _model("qwen2", dtype=torch.bfloat16)
    _, _, runs = _both(model, new=6)
    (hf_tokens, hf_logp), (tokens, logp) = runs["hf"], runs["hand"]
    same = (tokens == hf_tokens).all(1) & (tokens[:, 0] == hf_tokens[:, 0])
    assert same.sum() >= 10  # a near-tie may sample differently after a rounding difference; most rows agree
    torch.testing.assert_close(logp[same], hf_logp[same], atol=0.05, rtol=0)


def _lora(model):
    from peft import LoraConfig, get_peft_model

    return get_peft_model(model, LoraConfig(r=2, target_modules=["q_proj", "v_proj"])).base_model.model


@pytest.mark.parametrize("change,reason", [
    (lambda m: _lora(m), "layer 0"),
    (lambda m: setattr(m.model.layers[1].mlp, "forward", lambda x: x), "forward is replaced"),
    (lambda m: setattr(m.model.rotary_emb, "rope_type", "dynamic"), "changes with the length"),
    (lambda m: setattr(m.config, "hidden_act", "gelu"), "activation"),
], ids=["lora", "patched-forward", "dynamic-rope", "gelu"])
def test_models_it_cannot_read_decode_through_the_forward(change, reason):
    """A model the hand step does not mirror exactly is named unsupported (with why); decode='auto' then samples
    through the model's forward (the same tokens as decode='hf'), and decode='hand' refuses with the reason."""
    model = _model("qwen2")
    change(model)
    assert reason in unsupported(model)
    ids, mask = _prompts(model.config.vocab_size, torch.Generator().manual_seed(0))
    kwargs = dict(n=2, temperature=1.0, top_p=1.0, max_new_tokens=4, eos_ids=[3], pad_id=0)
    auto = sample(model, ids, mask, generator=torch.Generator().manual_seed(1), decode="auto", **kwargs)
    hf = sample(model, ids, mask, generator=torch.Generator().manual_seed(1), decode="hf", **kwargs)
    assert torch.equal(auto[0], hf[0]) and torch.equal(auto[1], hf[1])
    with pytest.raises(ValueError, match="decode='hand' cannot decode this model"):
        sample(model, ids, mask, decode="hand", **kwargs)


def test_sampling_runs_the_policy_in_eval_mode():
    """sample() runs the model in eval mode whatever its flag (no dropout: the rollouts come from the policy itself;
    and gradient checkpointing, which turns the cache off in training mode, leaves it on), then restores the flag:
    a model in training mode with dropout and checkpointing samples exactly what its eval-mode self samples."""
    model = _model("qwen2")
    ids, mask = _prompts(model.config.vocab_size, torch.Generator().manual_seed(0))
    kwargs = dict(n=2, temperature=1.0, top_p=1.0, max_new_tokens=4, eos_ids=[3], pad_id=0)
    want = sample(model.eval(), ids, mask, generator=torch.Generator().manual_seed(1), **kwargs)
    model.model.layers[0].self_attn.attention_dropout = 0.5
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    got = sample(model, ids, mask, generator=torch.Generator().manual_seed(1), **kwargs)
    assert model.training and torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_sliding_window_shorter_than_the_rollout_uses_the_forward():
    """Mistral's sliding window: within it attention is full and the hand step applies; a rollout that could
    outgrow it (prompt columns + new tokens > window) decodes through the model's forward."""
    from entropy_rft.rollout.sampling import hand_decoder

    model = _model("mistral", sliding_window=16)
    assert hand_decoder(model, "auto", 16, torch.device("cpu")) is not None
    assert hand_decoder(model, "auto", 17, torch.device("cpu")) is None
    with pytest.raises(ValueError, match="sliding attention window of 16"):
        hand_decoder(model, "hand", 17, torch.device("cpu"))
    assert hand_decoder(model, "hf", 8, torch.device("cpu")) is None


def test_shipped_policy_is_hand_decoded_and_the_option_is_checked():
    """The demo's policy is one the hand step reads; an unknown decode value is refused by the engine and the config."""
    from entropy_rft.config import load_config
    from entropy_rft.policy import load_policy

    model, tokenizer = load_policy("countdown-tiny", torch.device("cpu"))
    assert unsupported(model) is None
    with pytest.raises(ValueError, match="decode must be one of auto, hand, hf"):
        HFEngine(model, tokenizer, decode="fast")
    with pytest.raises(ValueError, match="decode must be one of"):
        load_config(None, decode="fast")
