"""rollout/decode.py's hand-written decode step against the model's own forward, for each family it reads."""

import pytest
import torch

from entropy_rft.core.dynamics import token_stats
from entropy_rft.rollout import HFEngine, Rollout
from entropy_rft.rollout.decode import unsupported
from entropy_rft.rollout.hf import response_mask_from_lengths, sequence_forward
from entropy_rft.rollout.sampling import Sampling, sample

SMALL = dict(
    vocab_size=29,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
)


def _model(family: str, dtype=torch.float32, seed: int = 0, **extra):
    import transformers

    config_cls, model_cls = {
        "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
        "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
        "llama": ("LlamaConfig", "LlamaForCausalLM"),
        "mistral": ("MistralConfig", "MistralForCausalLM"),
    }[family]
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
        runs[path] = sample(
            model,
            ids,
            mask,
            Sampling(n=n, temperature=temperature, top_p=1.0, max_new_tokens=new, eos_ids=[3], pad_id=0),
            generator=torch.Generator().manual_seed(seed),
            decode=path,
        )
    return ids, mask, runs


FAMILIES = [
    ("qwen2", {}),
    ("qwen3", {"head_dim": 16}),  # per-head q/k norms; a head_dim other than hidden / heads
    (
        "llama",
        {
            "attention_bias": True,
            "mlp_bias": True,
            "rope_parameters": {
                "rope_type": "llama3",
                "rope_theta": 10000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 16,
            },
        },
    ),
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


@pytest.mark.parametrize(
    "change,reason",
    [
        (lambda m: _lora(m), "layer 0"),
        (lambda m: setattr(m.model.layers[1].mlp, "forward", lambda x: x), "forward is replaced"),
        (lambda m: setattr(m.model.rotary_emb, "rope_type", "dynamic"), "changes with the length"),
        (lambda m: setattr(m.config, "hidden_act", "gelu"), "activation"),
    ],
    ids=["lora", "patched-forward", "dynamic-rope", "gelu"],
)
def test_models_it_cannot_read_decode_through_the_forward(change, reason):
    """A model the hand step does not mirror exactly is named unsupported (with why); decode='auto' then samples
    through the model's forward (the same tokens as decode='hf'), and decode='hand' refuses with the reason."""
    model = _model("qwen2")
    change(model)
    assert reason in unsupported(model)
    ids, mask = _prompts(model.config.vocab_size, torch.Generator().manual_seed(0))
    sampling = Sampling(n=2, temperature=1.0, top_p=1.0, max_new_tokens=4, eos_ids=[3], pad_id=0)
    auto = sample(model, ids, mask, sampling, generator=torch.Generator().manual_seed(1), decode="auto")
    hf = sample(model, ids, mask, sampling, generator=torch.Generator().manual_seed(1), decode="hf")
    assert torch.equal(auto[0], hf[0]) and torch.equal(auto[1], hf[1])
    with pytest.raises(ValueError, match="decode='hand' cannot decode this model"):
        sample(model, ids, mask, sampling, decode="hand")


def test_sampling_runs_the_policy_in_eval_mode():
    """sample() runs the model in eval mode whatever its flag (no dropout: the rollouts come from the policy itself;
    and gradient checkpointing, which turns the cache off in training mode, leaves it on), then restores the flag:
    a model in training mode with dropout and checkpointing samples exactly what its eval-mode self samples."""
    model = _model("qwen2")
    ids, mask = _prompts(model.config.vocab_size, torch.Generator().manual_seed(0))
    sampling = Sampling(n=2, temperature=1.0, top_p=1.0, max_new_tokens=4, eos_ids=[3], pad_id=0)
    want = sample(model.eval(), ids, mask, sampling, generator=torch.Generator().manual_seed(1))
    model.model.layers[0].self_attn.attention_dropout = 0.5
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    got = sample(model, ids, mask, sampling, generator=torch.Generator().manual_seed(1))
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
    from entropy_rft.train.policy import load_policy

    model, tokenizer = load_policy("countdown-tiny", torch.device("cpu"))
    assert unsupported(model) is None
    with pytest.raises(ValueError, match="decode must be one of auto, hand, hf"):
        HFEngine(model, tokenizer, decode="fast")
    with pytest.raises(ValueError, match="decode must be one of"):
        load_config(None, decode="fast")


# The fixed-shape path (decode="static": rollout/sampling.py's sample_static, decode.py's FixedSteps): the path a GPU
# captures in a CUDA graph, run here eagerly.


def _static(model, ids, mask, seed, top_p=1.0, max_new_tokens=12, **kw):
    sampling = Sampling(n=5, temperature=0.8, top_p=top_p, max_new_tokens=max_new_tokens, eos_ids=[3], pad_id=0)
    return sample(model, ids, mask, sampling, generator=torch.Generator().manual_seed(seed), decode="static", **kw)


@pytest.mark.slow
@pytest.mark.parametrize("top_p", [1.0, 0.7])
@pytest.mark.parametrize("family,extra", FAMILIES, ids=[f for f, _ in FAMILIES])
def test_static_decode_samples_the_hand_paths_tokens(family, extra, top_p):
    """With every row kept in place to the end and attention over all columns (the unwritten ones hidden), the
    fixed-shape path samples the very tokens of the row-dropping hand path (same generator: its noise is the stream
    the hand path's multinomial draws), for each family, with rows finishing at different times, in and outside a
    top-p nucleus; each log-prob equals the hand path's within a few float32 ulps (not bit for bit: sampling.py's
    departure 2, kernels that round a row by how many rows and columns share the call) and a full forward's."""
    model = _model(family, **extra)
    ids, mask = _prompts(model.config.vocab_size, torch.Generator().manual_seed(3))
    sampling = Sampling(n=5, temperature=0.8, top_p=top_p, max_new_tokens=12, eos_ids=[3], pad_id=0)
    hand_tokens, hand_logp = sample(
        model, ids, mask, sampling, generator=torch.Generator().manual_seed(3), decode="hand"
    )
    tokens, logp = _static(model, ids, mask, 3, top_p=top_p)
    assert torch.equal(tokens, hand_tokens)
    done = (tokens == 3).any(1)
    assert top_p < 1 or (done.any() and not done.all())  # rows finished at different times (a nucleus may cut EOS)
    rmask, finished = response_mask_from_lengths(tokens, 3)
    assert torch.equal(logp == 0, ~rmask)  # finished rows recorded nothing after their EOS
    torch.testing.assert_close(logp, hand_logp, atol=1e-6, rtol=0)
    rows = torch.arange(3).repeat_interleave(5)
    with torch.no_grad():
        logits, _ = sequence_forward(model, Rollout(ids[rows], mask[rows], tokens, rmask, finished, [""] * 15))
    z = logits.float() / 0.8
    if top_p < 1:  # the nucleus of each position's distribution, as the sampler applied it
        from entropy_rft.rollout.sampling import nucleus_logits

        z = nucleus_logits(z.reshape(-1, z.shape[-1]), top_p).reshape(z.shape)
    ref = z.log_softmax(-1).gather(-1, tokens[..., None]).squeeze(-1)
    torch.testing.assert_close(logp[rmask], ref[rmask], atol=2e-5, rtol=0)


def test_draw_is_multinomial():
    """draw() given Exp(1) noise from a generator picks, bit for bit, the token torch.multinomial picks with the same
    generator state (the exponential race it computes for one sample), in and outside a nucleus, and returns that
    token's log-prob under the distribution it was drawn from."""
    from entropy_rft.rollout.sampling import draw, nucleus_logits

    logits = torch.randn(64, 50, generator=torch.Generator().manual_seed(0)) * 3
    for top_p in (1.0, 0.8):
        log_probs = nucleus_logits(logits / 0.7, top_p).log_softmax(-1)
        want = torch.multinomial(log_probs.exp(), 1, generator=torch.Generator().manual_seed(5)).squeeze(1)
        noise = torch.empty(64, 50).exponential_(1, generator=torch.Generator().manual_seed(5))
        token, logp = draw(logits, noise, temperature=0.7, top_p=top_p)
        assert torch.equal(token, want)
        assert torch.equal(logp, log_probs.gather(1, want[:, None]).squeeze(1))


@pytest.mark.parametrize("noise", ["stream", "device", "seeded"])
def test_static_tokens_do_not_depend_on_check_every(noise):
    """The loop looks at "every row done" every k steps and runs finished rows masked in between: the tokens, the
    log-probs and the state the caller's generator is left in are the same bits whatever k (1, 2, 5, 16), with
    either noise source; a rollout that stops early returns the same width."""
    from entropy_rft.rollout.decode import HandDecoder
    from entropy_rft.rollout.sampling import StaticLoop, sample_static

    model = _model("qwen2")
    ids, mask = _prompts(model.config.vocab_size, torch.Generator().manual_seed(3))
    runs = []
    for k in (1, 2, 5, 16):
        generator = torch.Generator().manual_seed(3)
        with torch.inference_mode():
            tokens, logp = sample_static(
                model,
                HandDecoder(model),
                ids,
                mask,
                Sampling(n=5, temperature=0.8, top_p=1.0, max_new_tokens=40, eos_ids=[3, 4, 5, 6, 7, 8], pad_id=0),
                generator=generator,
                loop=StaticLoop(check_every=k, noise=noise),
            )
        runs.append((tokens.clone(), logp.clone(), generator.get_state()))
    assert runs[0][0].shape[1] < 40  # every row finished before max_new_tokens: the early stop was exercised
    for tokens, logp, state in runs[1:]:
        assert torch.equal(tokens, runs[0][0]) and torch.equal(logp, runs[0][1]) and torch.equal(state, runs[0][2])


def test_device_noise_samples_the_policy():
    """With the GPU's noise source (each rollout's own generator, Exp(1) for every row each step), every recorded
    log-prob is the policy's own: log softmax(z / T) of a full forward at that token."""
    from entropy_rft.rollout.decode import HandDecoder
    from entropy_rft.rollout.sampling import StaticLoop, sample_static

    model = _model("llama")
    ids, mask = _prompts(model.config.vocab_size, torch.Generator().manual_seed(4))
    with torch.inference_mode():
        tokens, logp = sample_static(
            model,
            HandDecoder(model),
            ids,
            mask,
            Sampling(n=5, temperature=0.8, top_p=1.0, max_new_tokens=12, eos_ids=[3], pad_id=0),
            generator=torch.Generator().manual_seed(4),
            loop=StaticLoop(noise="device"),
        )
    tokens, logp = tokens.clone(), logp.clone()
    rmask, finished = response_mask_from_lengths(tokens, 3)
    rows = torch.arange(3).repeat_interleave(5)
    with torch.no_grad():
        logits, _ = sequence_forward(model, Rollout(ids[rows], mask[rows], tokens, rmask, finished, [""] * 15))
    ref = token_stats(logits, tokens, temperature=0.8).logp
    torch.testing.assert_close(logp[rmask], ref[rmask], atol=2e-5, rtol=0)


def test_static_decode_in_bfloat16():
    """dtype=bfloat16 (the engine's choice when the policy trains under bf16 autocast): the float32 model decodes
    with bfloat16 copies of its weights and cache; its log-probs stay within bfloat16 rounding of float32 decoding
    where the tokens agree, and most rows agree; sampling under bf16 autocast takes the same path, bit for bit."""
    model = _model("qwen2")
    ids, mask = _prompts(model.config.vocab_size, torch.Generator().manual_seed(3))
    tokens32, logp32 = _static(model, ids, mask, 3, max_new_tokens=6)
    tokens16, logp16 = _static(model, ids, mask, 3, max_new_tokens=6, dtype=torch.bfloat16)
    assert next(model.parameters()).dtype == torch.float32  # the policy itself is untouched
    with torch.autocast("cpu", dtype=torch.bfloat16):  # a caller generating under bf16 autocast gets the same path
        autocast = _static(model, ids, mask, 3, max_new_tokens=6)
    assert torch.equal(autocast[0], tokens16) and torch.equal(autocast[1], logp16)
    width = min(tokens32.shape[1], tokens16.shape[1])
    same = (tokens32[:, :width] == tokens16[:, :width]).all(1)
    assert same.sum() >= 10
    torch.testing.assert_close(logp16[same, :width], logp32[same, :width], atol=0.05, rtol=0)


def test_auto_takes_the_compiled_path_on_cuda():
    """decode='auto': the row-dropping hand step on the CPU, the fixed-shape step compiled and captured in a CUDA
    graph on CUDA (the static step, captured uncompiled, once compiling has failed in the session), the model's
    forward for a model the step cannot read; 'static' refuses such a model with the reason. (Only the choice: no
    GPU is needed to make it.)"""
    from entropy_rft.rollout.sampling import decode_path

    model = _model("qwen2")
    assert decode_path(model, "auto", 16, torch.device("cpu"))[0] == "hand"
    assert decode_path(model, "auto", 16, torch.device("cpu"), compile_failed=True)[0] == "hand"
    assert decode_path(model, "auto", 16, torch.device("cuda"))[0] == "compile"
    assert decode_path(model, "auto", 16, torch.device("cuda"), compile_failed=True)[0] == "static"
    assert decode_path(model, "static", 16, torch.device("cpu"))[0] == "static"
    assert decode_path(model, "compile", 16, torch.device("cpu"))[0] == "compile"
    assert decode_path(model, "hf", 16, torch.device("cuda")) == ("hf", None)
    lora = _lora(_model("qwen2"))
    assert decode_path(lora, "auto", 16, torch.device("cuda")) == ("hf", None)
    with pytest.raises(ValueError, match="decode='static' cannot decode this model"):
        decode_path(lora, "static", 16, torch.device("cuda"))


def _static_state(model, max_new: int = 6):
    """A StaticRollout after its first token (from the prefill), as sample_static builds it, for stepping by hand."""
    from entropy_rft.rollout.cache import cache_of
    from entropy_rft.rollout.decode import FixedSteps, HandDecoder
    from entropy_rft.rollout.sampling import StaticRollout, position_ids, stream_noise

    ids, mask = _prompts(model.config.vocab_size, torch.Generator().manual_seed(3))
    rows = torch.arange(3).repeat_interleave(2)
    with torch.no_grad():
        out = model(
            input_ids=ids, attention_mask=mask.long(), position_ids=position_ids(mask), use_cache=True, logits_to_keep=1
        )
    steps = FixedSteps(HandDecoder(model), cache_of(out), rows, mask, max_new)
    state = StaticRollout(
        steps,
        len(rows),
        model.config.vocab_size,
        max_new,
        eos_ids=[3],
        pad_id=0,
        temperature=0.8,
        top_p=0.9,
        device=torch.device("cpu"),
    )
    stream_noise(torch.Generator().manual_seed(0))(state)
    state.record(out.logits[rows, -1])
    return state


def _to_meta(state):
    """The same state with every tensor on the meta device (shapes and dtypes, no data)."""
    from entropy_rft.rollout.decode import Layer, Weights

    def meta(x):
        if isinstance(x, torch.Tensor):
            return x.to("meta")
        if isinstance(x, list):
            return [meta(v) for v in x]
        if isinstance(x, Weights):
            return Weights(
                meta(x.embed),
                [Layer(*(meta(v) for v in layer)) for layer in x.layers],
                meta(x.norm),
                x.norm_eps,
                meta(x.head),
                meta(x.head_bias),
            )
        return x

    for obj in (state, state.steps):
        for name, value in list(vars(obj).items()):
            setattr(obj, name, meta(value))
    return state


def _leak(kind: str):
    """draw() with one host read added: the mutations the check below must catch."""
    from entropy_rft.rollout import sampling

    real = sampling.draw

    def leaky(logits, noise, **kw):
        token, logp = real(logits, noise, **kw)
        if kind == "item":
            token = token + int(token[0].item()) * 0
        elif kind == "tolist":
            token = token + len(token.tolist()) * 0
        elif kind == "cpu":
            token = token.cpu()
        elif kind == "if":
            if (token == 3).any():
                token = token.clone()
        elif kind == "nonzero":
            token = token.index_fill(0, (token == 3).nonzero().squeeze(1), 0)
        return token, logp

    return leaky


@pytest.mark.parametrize("leak", [None, "item", "tolist", "cpu", "if", "nonzero"])
def test_static_step_reads_nothing_back(leak, monkeypatch):
    """The step a CUDA graph captures reads nothing back to the host: run on the meta device (shapes, no data),
    where any .item(), .tolist(), .cpu(), `if tensor` or data-dependent shape raises, it completes; the same check
    fails when one such read is added to the step's sampling (each of the five kinds)."""
    from entropy_rft.rollout import sampling

    model = _model("qwen3", head_dim=16)
    state = _to_meta(_static_state(model))
    if leak is not None:
        monkeypatch.setattr(sampling, "draw", _leak(leak))
        with pytest.raises((RuntimeError, NotImplementedError), match="meta|nonzero"), torch.inference_mode():
            state.step()
        return
    with torch.inference_mode():
        for _ in range(3):
            state.step()
    assert state.response.device.type == "meta" and state.response.shape == (6, 6)


def test_static_step_compiles_without_a_graph_break():
    """torch.compile(fullgraph=True) traces the step whole (dynamo raises at a graph break under fullgraph), through
    AOT autograd's functionalisation too (backend aot_eager: no C compiler needed, seconds instead of inductor's
    minutes here), and the compiled step samples what the eager one samples from the same state and noise."""
    torch._dynamo.reset()
    model = _model("qwen2")
    eager, compiled = _static_state(model), _static_state(model)
    step = torch.compile(compiled.step, fullgraph=True, dynamic=False, backend="aot_eager")
    with torch.inference_mode():
        for _ in range(4):
            eager.step()
            step()
    assert torch.equal(compiled.response, eager.response)
    torch.testing.assert_close(compiled.logp, eager.logp, atol=1e-5, rtol=0)


CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@CUDA
def test_captured_step_replays_the_eager_step_on_cuda():
    """On CUDA: the step captured once in a CUDA graph and replayed gives the same tokens as the same step run
    eagerly with the same noise, and log-probs within float32 rounding, also through sample(decode='static'); and
    the step itself makes no host synchronisation (torch.cuda's sync debug mode raises on one)."""
    from entropy_rft.rollout.decode import HandDecoder
    from entropy_rft.rollout.sampling import StaticLoop, decode_path, sample_static

    model = _model("qwen2").cuda()
    ids, mask = (t.cuda() for t in _prompts(model.config.vocab_size, torch.Generator().manual_seed(3)))
    assert decode_path(model, "static", 18, ids.device)[0] == "static"
    sampling = Sampling(n=5, temperature=0.8, top_p=0.9, max_new_tokens=12, eos_ids=[3], pad_id=0)
    runs = []
    for capture in (False, True):
        with torch.inference_mode():
            tokens, logp = sample_static(
                model,
                HandDecoder(model),
                ids,
                mask,
                sampling,
                generator=torch.Generator("cuda").manual_seed(3),
                loop=StaticLoop(capture=capture),
            )
        runs.append((tokens.clone(), logp.clone()))
    assert torch.equal(runs[0][0], runs[1][0])  # cuBLAS may choose another kernel under capture: log-probs close
    torch.testing.assert_close(runs[0][1], runs[1][1], atol=1e-5, rtol=0)
    static = sample(model, ids, mask, sampling, generator=torch.Generator("cuda").manual_seed(3), decode="static")
    assert torch.equal(static[0], runs[1][0])
    state = _static_state(model.cpu())
    model.cuda()
    for obj in (state, state.steps):
        for name, value in list(vars(obj).items()):
            if isinstance(value, torch.Tensor):
                setattr(obj, name, value.cuda())
            elif isinstance(value, list):
                setattr(obj, name, [v.cuda() for v in value])
    state.steps.weights = state.steps.decoder.weights()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        with torch.inference_mode():
            for _ in range(3):
                state.step()
    finally:
        torch.cuda.set_sync_debug_mode("default")


@CUDA
def test_auto_compiles_the_step_and_replays_it_like_the_eager_step_on_cuda():
    """On CUDA: decode='auto' takes decode='compile' (the session compiled one graph, Inductor, and did not fail),
    and the compiled step captured in a CUDA graph samples the tokens of the same step run eagerly, uncompiled and
    uncaptured, from the same seed (the same noise), log-probs within float32 rounding of Inductor's fused
    kernels (the same fused projections, in-step noise and length buckets); a second rollout of the same shape
    compiles nothing."""
    from entropy_rft.rollout.decode import HandDecoder
    from entropy_rft.rollout.sampling import (
        LENGTH_BLOCK,
        DecodeSession,
        StaticLoop,
        bucket_width,
        pad_left,
        sample_static,
    )

    model = _model("qwen2").cuda()
    ids, mask = (t.cuda() for t in _prompts(model.config.vocab_size, torch.Generator().manual_seed(3)))
    sampling = Sampling(n=5, temperature=0.8, top_p=0.9, max_new_tokens=12, eos_ids=[3], pad_id=0)
    session = DecodeSession()
    auto = sample(model, ids, mask, sampling, generator=torch.Generator("cuda").manual_seed(3), session=session)
    assert session.compiled == 1 and session.failed is None and session.pop_compile_seconds() > 0
    wide = pad_left(ids, mask, bucket_width(ids.shape[1]), 0)  # the compiled path's prompts, for the same prefill
    with torch.inference_mode():
        eager = sample_static(  # CUDA's defaults: noise drawn in the step, fused projections, length buckets
            model,
            HandDecoder(model),
            *wide,
            sampling,
            generator=torch.Generator("cuda").manual_seed(3),
            loop=StaticLoop(fused=True, block=LENGTH_BLOCK),
        )
    assert torch.equal(auto[0], eager[0])
    torch.testing.assert_close(auto[1], eager[1], atol=1e-5, rtol=0)
    sample(model, ids, mask, sampling, generator=torch.Generator("cuda").manual_seed(4), session=session)
    assert session.compiled == 1 and session.pop_compile_seconds() == 0.0
