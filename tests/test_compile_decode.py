"""decode="compile": the whole fixed-shape step (rollout/sampling.py `fixed_step`) compiled by torch.compile with
fullgraph=True, dynamic=False, against the hand and static paths it must equal.

Most tests compile with backend="aot_eager" (dynamo's tracing and AOT autograd's functionalisation, the parts that
raise at a graph break or a data-dependent shape, in seconds); one compiles with Inductor, as a GPU run does
(a cold compile of the tiny model took 45 s on a shared 2-core CPU)."""

import dataclasses
import warnings

import pytest
import torch
from test_decode import FAMILIES, _model, _prompts, _static_state, _to_meta

from entropy_rft.rollout import HFEngine, Rollout
from entropy_rft.rollout.hf import response_mask_from_lengths, sequence_forward
from entropy_rft.rollout.sampling import (
    DecodeSession,
    Sampling,
    StaticLoop,
    bucket_width,
    decode_path,
    fixed_step,
    sample,
    sample_static,
)

SAMPLING = Sampling(n=5, temperature=0.8, top_p=1.0, max_new_tokens=12, eos_ids=[3], pad_id=0)


class Counting:
    """A dynamo backend that counts the graphs it is given and runs them through aot_eager."""

    def __init__(self):
        self.graphs = 0

    def __call__(self, gm, example_inputs):
        self.graphs += 1
        return torch._dynamo.lookup_backend("aot_eager")(gm, example_inputs)


def _policy_logp(model, ids, mask, tokens, top_p=1.0):
    """log p of each sampled token under softmax(z / T) (on the top-p nucleus) of one full forward."""
    from entropy_rft.rollout.sampling import nucleus_logits

    rmask, finished = response_mask_from_lengths(tokens, 3)
    rows = torch.arange(ids.shape[0]).repeat_interleave(tokens.shape[0] // ids.shape[0])
    rollout = Rollout(ids[rows], mask[rows], tokens, rmask, finished, [""] * len(rows))
    with torch.no_grad():
        logits, _ = sequence_forward(model, rollout)
    z = logits.float() / 0.8
    z = nucleus_logits(z.reshape(-1, z.shape[-1]), top_p).reshape(z.shape)
    return z.log_softmax(-1).gather(-1, tokens[..., None]).squeeze(-1), rmask


@pytest.mark.slow
@pytest.mark.parametrize("family,extra", FAMILIES, ids=[f for f, _ in FAMILIES])
def test_compiled_step_samples_the_hand_paths_tokens(family, extra):
    """For each family the step reads: the compiled step (fullgraph, so no graph break) samples the very tokens
    of the row-dropping hand path and of the static path from the same seed, rows finishing at different times,
    with the prompts padded to their bucket; its log-probs equal theirs within the static path's bound (a few
    float32 ulps) and a full forward's within the hand path's."""
    torch._dynamo.reset()
    model = _model(family, **extra)
    ids, mask = _prompts(model.config.vocab_size, torch.Generator().manual_seed(3))
    top_p = 0.7 if family == "llama" else 1.0  # the nucleus's sort and cumsum inside the compiled graph too
    runs = {}
    for path in ("hand", "static", "compile"):
        session = DecodeSession(backend="aot_eager")
        runs[path] = sample(
            model,
            ids,
            mask,
            dataclasses.replace(SAMPLING, top_p=top_p),
            generator=torch.Generator().manual_seed(3),
            decode=path,
            session=session,
        )
    tokens, logp = runs["compile"]
    assert session.compiled == 1 and session.failed is None
    assert torch.equal(tokens, runs["hand"][0]) and torch.equal(tokens, runs["static"][0])
    done = (tokens == 3).any(1)
    assert top_p < 1 or (done.any() and not done.all())
    torch.testing.assert_close(logp, runs["hand"][1], atol=1e-6, rtol=0)
    torch.testing.assert_close(logp, runs["static"][1], atol=1e-6, rtol=0)
    ref, rmask = _policy_logp(model, ids, mask, tokens, top_p)
    assert torch.equal(logp == 0, ~rmask)
    torch.testing.assert_close(logp[rmask], ref[rmask], atol=2e-5, rtol=0)


@pytest.mark.slow
def test_one_compile_across_rollouts_and_optimizer_steps():
    """The compiled step is specialised on shapes and dtypes only. Through two engines (float32, and bfloat16
    decoding of the float32 policy) sharing one session: a second rollout, of a prompt batch of another width in the
    same bucket, after optimizer steps (weights changed in place), reuses the one graph per dtype; the bfloat16
    decode copy keeps its address and holds the updated weights; each float32 rollout's log-probs are the policy's
    as it is then; the compile seconds are reported after the first rollout only (the trainer's time/compile)."""
    from test_rollout import _IdTokenizer

    torch._dynamo.reset()
    counting = Counting()
    model = _model("qwen2")
    session = DecodeSession(backend=counting)
    fp32, bf16 = (
        HFEngine(model, _IdTokenizer(pad=0, eos=3), decode="compile", precision=p, session=session)
        for p in ("fp32", "bf16")
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    seconds, addresses = [], set()
    for rollout, prompts in enumerate((["5 6 7 8 9 10", "11 12 13", "14"], ["5 6 7 8 9 10 11 12 13", "4", "7 8"])):
        assert bucket_width(len(prompts[0].split())) == 16
        got = fp32.generate(prompts, n=5, temperature=0.8, max_new_tokens=12, seed=rollout)
        bf16.generate(prompts, n=5, temperature=0.8, max_new_tokens=12, seed=rollout)
        seconds.append(fp32.pop_compile_seconds())
        with torch.no_grad():
            logits, _ = sequence_forward(model, got)
        ref = (logits.float() / 0.8).log_softmax(-1).gather(-1, got.response_ids[..., None]).squeeze(-1)
        mask = got.response_mask
        torch.testing.assert_close(got.sampler_logp[mask], ref[mask], atol=2e-5, rtol=0)
        copy = session._copy[-1]
        addresses.add(copy.embed.data_ptr())
        assert torch.equal(copy.layers[1].down, model.model.layers[1].mlp.down_proj.weight.bfloat16())
        for _ in range(2):  # optimizer steps between two rollouts, the weights changed in place
            model.train()
            model(input_ids=torch.tensor([[5, 6, 7]])).logits.float().logsumexp(-1).mean().backward()
            optimizer.step()
            optimizer.zero_grad()
    assert counting.graphs == 2 and session.compiled == 2  # one graph per dtype, for both rollouts
    assert seconds[0] > 0 and seconds[1] == 0.0
    assert len(addresses) == 1


def _failing(gm, example_inputs):
    raise RuntimeError("no C compiler\nsecond line")


@pytest.mark.slow
def test_a_failed_compile_falls_back_to_the_static_step():
    """When compiling fails: with fallback (decode='auto') one one-line warning names the reason (the innermost
    error's first line), the rollout samples what the static step samples, and the session remembers it (auto
    then takes 'static'); without (decode='compile') the error is raised."""
    model = _model("qwen2")
    ids, mask = _prompts(model.config.vocab_size, torch.Generator().manual_seed(3))
    session = DecodeSession(backend=_failing)
    with pytest.warns(RuntimeWarning, match=r"compiling the decode step failed \(.*no C compiler\); decoding with"):
        with torch.inference_mode():
            got = sample_static(
                model,
                decode_path(model, "static", 18, ids.device)[1],
                ids,
                mask,
                SAMPLING,
                generator=torch.Generator().manual_seed(3),
                session=session,
                loop=StaticLoop(compiled=True, fallback=True),
            )
    want = sample(model, ids, mask, SAMPLING, generator=torch.Generator().manual_seed(3), decode="static")
    assert torch.equal(got[0], want[0])  # this rollout's prompts stay padded to the bucket: log-probs within ulps
    torch.testing.assert_close(got[1], want[1], atol=1e-6, rtol=0)
    assert "second line" not in session.failed and session.compile_seconds == 0.0
    assert decode_path(model, "auto", 18, torch.device("cuda"), compile_failed=session.failed is not None)[0] == (
        "static"
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(Exception, match="no C compiler"):
            sample(model, ids, mask, SAMPLING, decode="compile", session=DecodeSession(backend=_failing))


HOST_READS = ("aten._local_scalar_dense", "aten.nonzero", "aten.masked_select", "aten.unique", "aten.item")


def _leaky_draw(kind: str):
    """draw() with one host read whose value is used (so no compiler may drop it)."""
    from entropy_rft.rollout import sampling

    real = sampling.draw

    def leaky(logits, noise, **kw):
        token, logp = real(logits, noise, **kw)
        if kind == "item":
            token = token + int(token[0].item())
        elif kind == "tolist":
            token = token + max(token.tolist())
        elif kind == "cpu":
            token = token.cpu()
        elif kind == "if":
            if (token == 3).any():
                token = token.clone() + 1
        elif kind == "nonzero":
            token = token.index_fill(0, (token == 3).nonzero().squeeze(1), 0)
        return token, logp

    return leaky


def _host_reads(graphs) -> list[str]:
    """The nodes of ATen graphs that read a value back to the host: a scalar read, an op whose output size depends
    on the data (a symbolic size under dynamic=False), or a copy to another device."""
    found = []
    for gm in graphs:
        for node in gm.graph.nodes:
            name = str(node.target)
            val = node.meta.get("val")
            sizes = [v.shape for v in (val if isinstance(val, (list, tuple)) else [val]) if hasattr(v, "shape")]
            if (
                name.startswith(HOST_READS)
                or any(not isinstance(d, int) for shape in sizes for d in shape)
                or (name.startswith(("aten._to_copy", "prims.device_put")) and "device" in node.kwargs)
            ):
                found.append(name)
    return found


@pytest.mark.slow
@pytest.mark.parametrize("leak", [None, "item", "tolist", "cpu", "if", "nonzero"])
def test_compiled_step_reads_nothing_back(leak, monkeypatch):
    """The ATen graph the compiler receives for the whole step (after dynamo and AOT autograd, traced on the meta
    device) holds no host read: no scalar read, no data-dependent size, no copy to another device (the meta-device
    test of tests/test_decode.py checks the same step run eagerly); the check is not vacuous: each kind of host
    read added to the step's sampling either fails (a graph break under fullgraph, or a read the meta device cannot
    make) or shows in the graph."""
    from torch._dynamo.backends.common import aot_autograd

    from entropy_rft.rollout import sampling

    torch._dynamo.reset()
    graphs = []

    def record(gm, example_inputs):
        graphs.append(gm)
        return gm

    state = _to_meta(_static_state(_model("qwen3", head_dim=16)))  # on meta, .cpu() is a real change of device
    state.fn = torch.compile(fixed_step, fullgraph=True, dynamic=False, backend=aot_autograd(fw_compiler=record))
    if leak is not None:
        monkeypatch.setattr(sampling, "draw", _leaky_draw(leak))
    try:
        with torch.inference_mode():
            state.step()
    except Exception as err:  # a graph break under fullgraph, or a read the meta device cannot make
        assert leak is not None, err
        return
    assert len(graphs) == 1
    assert (_host_reads(graphs) == []) == (leak is None), _host_reads(graphs)


def test_bucket_widths():
    """The bucket rule: 16, 24, 32, 48, 64, 96, 128, 192, ...; each width goes to the smallest that holds it."""
    assert [bucket_width(w) for w in (1, 16, 17, 24, 25, 33, 64, 65, 100, 129, 300)] == [
        16,
        16,
        24,
        24,
        32,
        48,
        64,
        96,
        128,
        192,
        384,
    ]


@pytest.mark.slow
def test_inductor_compiles_the_step_in_place():
    """The one test with Inductor itself (as a GPU run compiles it): the compiled step samples the hand path's tokens
    with log-probs within a few float32 ulps, and the generated code writes each step's key/value column into the
    cache buffers in place (no kernel runs over a whole cache buffer: its element count appears in no loop)."""
    from torch._inductor.utils import run_and_get_code

    model = _model("qwen2")
    ids, mask = _prompts(model.config.vocab_size, torch.Generator().manual_seed(3))
    # 16 + 13 = 29 columns: 5 x 2 x 29 x 8 = 2320 elements per buffer
    sampling = dataclasses.replace(SAMPLING, max_new_tokens=13)
    hand = sample(model, ids, mask, sampling, generator=torch.Generator().manual_seed(3), decode="hand")
    session = DecodeSession()
    (tokens, logp), code = run_and_get_code(
        lambda: sample(
            model,
            ids,
            mask,
            sampling,
            generator=torch.Generator().manual_seed(3),
            decode="compile",
            session=session,
        ),
    )
    assert session.compiled == 1 and session.failed is None
    print(f"inductor: compiled in {session.compile_seconds:.1f} s")
    assert torch.equal(tokens, hand[0])
    torch.testing.assert_close(logp, hand[1], atol=1e-6, rtol=0)
    source = "\n".join(code)  # the generated module (also when Inductor's cache served it)
    assert "index_copy" in source and "232L" in source  # a column's write: a head's stride is 29 x 8 = 232
    assert "2320L" not in source


# ---------------------------------------------------------------------------------------------------------------
# Fewer kernels a step (issue 64): QKV and gate/up fused, the noise drawn inside the step from a per-rollout seed


def _loop_sample(model, ids, mask, sampling, seed, session=None, **loop):
    from entropy_rft.rollout.decode import HandDecoder

    with torch.inference_mode():
        tokens, logp = sample_static(
            model,
            HandDecoder(model),
            ids,
            mask,
            sampling,
            generator=torch.Generator().manual_seed(seed),
            session=session or DecodeSession(backend="aot_eager"),
            loop=StaticLoop(**loop),
        )
    return tokens.clone(), logp.clone()


@pytest.mark.parametrize("family,extra", FAMILIES, ids=[f for f, _ in FAMILIES])
def test_fused_projections_sample_the_unfused_steps_tokens(family, extra):
    """For each family (biases, GQA, Qwen3's q/k norms, tied and untied heads): the step reading QKV and gate/up
    joined (decode.fuse) samples the very tokens of the step reading the seven projections apart, from the same
    noise, compiled (fullgraph) and eager alike; its log-probs equal theirs within a few float32 ulps (one GEMM of
    the joined rows may round a column otherwise than three of the parts: 1e-6 on log-probs of a few nats)."""
    torch._dynamo.reset()
    model = _model(family, **extra)
    ids, mask = _prompts(model.config.vocab_size, torch.Generator().manual_seed(3))
    apart = _loop_sample(model, ids, mask, SAMPLING, 3)
    for compiled in (False, True):
        session = DecodeSession(backend="aot_eager")
        tokens, logp = _loop_sample(model, ids, mask, SAMPLING, 3, session, fused=True, compiled=compiled)
        assert session._copy is not None and session._copy[-1].layers[0].qkv is not None  # the fused step ran
        assert torch.equal(tokens, apart[0]), compiled
        torch.testing.assert_close(logp, apart[1], atol=1e-6, rtol=0)


def test_fuse_joins_the_projections_and_refreshes_them_in_place():
    """decode.fuse: each layer's qkv is q's rows, then k's, then v's (biases alike) and gate_up is gate's then up's,
    copies in the dtype asked for; the other tensors are the parameters themselves (float32) or one copy each (a
    tied embedding and head copied once); refreshed with out= after the parameters change, every tensor keeps its
    address and holds the new values bit for bit (bfloat16: the parameters rounded once)."""
    from entropy_rft.rollout.decode import HandDecoder, fuse, weight_tensors

    model = _model("qwen2", tie_word_embeddings=True)
    decoder = HandDecoder(model)
    for dtype in (torch.float32, torch.bfloat16):
        fused = fuse(decoder.weights(), dtype)
        addresses = [t.data_ptr() for t in weight_tensors(fused)]
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p))
        assert fuse(decoder.weights(), dtype, out=fused) is fused
        assert [t.data_ptr() for t in weight_tensors(fused)] == addresses
        params = decoder.weights()
        for lf, lp in zip(fused.layers, params.layers):
            assert lf.q is None and lf.gate_bias is None
            assert torch.equal(lf.qkv, torch.cat([lp.q, lp.k, lp.v]).to(dtype))
            assert torch.equal(lf.qkv_bias, torch.cat([lp.q_bias, lp.k_bias, lp.v_bias]).to(dtype))
            assert torch.equal(lf.gate_up, torch.cat([lp.gate, lp.up]).to(dtype))
            assert (lf.o is lp.o) == (dtype == torch.float32) and torch.equal(lf.o, lp.o.to(dtype))
        assert fused.embed is fused.head  # tied: one copy (or the parameter itself)
        assert torch.equal(fused.head, params.head.to(dtype))


@pytest.mark.slow
def test_seeded_noise_is_exponential_and_a_pure_function_of_seed_and_step():
    """seeded_noise: the same hashed integers eagerly and compiled (Inductor's generated code), so the draws agree
    within the rounding of the two logarithms (each within an ulp of -log U: 2 ulps, 2^-22 relative, apart; measured
    here 2^-23), positive and finite; another
    step or seed gives other draws; the draws are Exp(1): over 2^20 of them the share above each of x = 0.1, 0.5, 1,
    2, 4 is e^-x within 6 binomial standard deviations (sqrt(q (1 - q) / N) for the share q), and two steps' draws are
    uncorrelated within 6 / sqrt(N)."""
    from entropy_rft.rollout.sampling import seeded_noise

    seed, t = torch.tensor([123456789, 987654321]), torch.tensor([5])
    rows, vocab = 64, 2**14
    eager = seeded_noise(seed, t, rows, vocab)
    torch._dynamo.reset()
    compiled = torch.compile(seeded_noise, fullgraph=True, dynamic=False)(seed, t, rows, vocab)
    assert float(((eager - compiled).abs() / eager).max()) <= 2.0**-22
    assert bool(torch.isfinite(eager).all()) and float(eager.min()) > 0 and float(eager.max()) < 17.4
    other_step = seeded_noise(seed, t + 1, rows, vocab)
    other_seed = seeded_noise(seed + torch.tensor([1, 0]), t, rows, vocab)
    n = eager.numel()
    for x in (0.1, 0.5, 1.0, 2.0, 4.0):
        q = torch.tensor(-x).exp().item()
        share = float((eager > x).double().mean())
        assert abs(share - q) <= 6 * (q * (1 - q) / n) ** 0.5, (x, share, q)
    for other in (other_step, other_seed):
        a, b = eager.double().flatten() - 1, other.double().flatten() - 1
        assert abs(float((a * b).mean())) <= 6 / n**0.5  # Var Exp(1) = 1


def test_seeded_draws_sample_the_distribution():
    """draw() with seeded_noise samples softmax(z / T): over 4096 rows of one distribution of 8 tokens the count of
    each token is within 6 binomial standard deviations of 4096 p_i (the noise is drawn per row and column, so rows
    are independent draws)."""
    from entropy_rft.rollout.sampling import draw, seeded_noise

    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -0.5, -1.0, -3.0, 1.5]]).expand(4096, 8)
    p = (logits[0] / 0.8).softmax(-1).double()
    token, _ = draw(logits, seeded_noise(torch.tensor([7, 11]), torch.tensor([0]), 4096, 8), temperature=0.8, top_p=1)
    counts = torch.bincount(token, minlength=8).double()
    assert ((counts - 4096 * p).abs() <= 6 * (4096 * p * (1 - p)).sqrt()).all(), (counts, 4096 * p)


@pytest.mark.slow
def test_seeded_step_compiled_samples_the_eager_steps_tokens_and_follows_updates():
    """The CUDA default on the CPU (noise drawn inside the step from a per-rollout seed, QKV and gate/up fused):
    compiled whole (fullgraph: no graph break) it samples the eager step's very tokens with log-probs within a few
    float32 ulps, every log-prob the policy's; the caller's generator advances by one draw per rollout; after
    optimizer steps (weights changed in place) a second rollout reuses the one graph (no recompile) and reads the
    updated weights from the same fused copy."""
    torch._dynamo.reset()
    counting = Counting()
    model = _model("qwen2")
    ids, mask = _prompts(model.config.vocab_size, torch.Generator().manual_seed(3))
    session = DecodeSession(backend=counting)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    addresses = set()
    for rollout in range(2):
        eager = _loop_sample(model, ids, mask, SAMPLING, rollout, noise="seeded", fused=True)
        tokens, logp = _loop_sample(
            model, ids, mask, SAMPLING, rollout, session, noise="seeded", fused=True, compiled=True
        )
        assert torch.equal(tokens, eager[0])
        torch.testing.assert_close(logp, eager[1], atol=1e-6, rtol=0)
        ref, rmask = _policy_logp(model, ids, mask, tokens)
        torch.testing.assert_close(logp[rmask], ref[rmask], atol=2e-5, rtol=0)
        copy = session._copy[-1]
        addresses.add(copy.layers[0].qkv.data_ptr())
        assert torch.equal(
            copy.layers[1].gate_up[: model.config.intermediate_size], model.model.layers[1].mlp.gate_proj.weight
        )
        for _ in range(2):
            model.train()
            model(input_ids=torch.tensor([[5, 6, 7]])).logits.logsumexp(-1).mean().backward()
            optimizer.step()
            optimizer.zero_grad()
        model.eval()
    assert counting.graphs == 1 and session.compiled == 1 and len(addresses) == 1
    generator = torch.Generator().manual_seed(9)
    _loop_sample(model, ids, mask, SAMPLING, 0, noise="seeded")  # its own generator
    from entropy_rft.rollout.sampling import rollout_seed

    rollout_seed(generator, torch.device("cpu"))
    after_one = generator.get_state()
    generator = torch.Generator().manual_seed(9)
    with torch.inference_mode():
        sample_static(
            model,
            decode_path(model, "static", 18, ids.device)[1],
            ids,
            mask,
            SAMPLING,
            generator=generator,
            loop=StaticLoop(noise="seeded"),
        )
    assert torch.equal(generator.get_state(), after_one)


@pytest.mark.slow
def test_inductor_compiles_the_cuda_default_step_once():
    """With Inductor itself (as on a GPU), the step as CUDA runs it (fused projections, noise drawn in the step,
    attention bounded by length buckets of 4 columns: 4 buckets over 12 new tokens) compiles once for every bucket
    and samples the eager step's very tokens in float32 with log-probs within a few float32 ulps."""
    torch._dynamo.reset()
    model = _model("qwen3", head_dim=16)
    ids, mask = _prompts(model.config.vocab_size, torch.Generator().manual_seed(3))
    default = dict(noise="seeded", fused=True, block=4)
    eager = _loop_sample(model, ids, mask, SAMPLING, 3, **default)
    session = DecodeSession()
    tokens, logp = _loop_sample(model, ids, mask, SAMPLING, 3, session, compiled=True, **default)
    assert session.compiled == 1 and session.failed is None
    assert tokens.shape[1] > 8  # the rollout reached its third bucket
    assert torch.equal(tokens, eager[0])
    torch.testing.assert_close(logp, eager[1], atol=1e-6, rtol=0)


@pytest.mark.slow
@pytest.mark.parametrize("family,extra", FAMILIES[:2], ids=[f for f, _ in FAMILIES[:2]])
def test_bounded_attention_samples_the_whole_cache_steps_tokens(family, extra):
    """Attention bounded by the filled length (length buckets of 3 columns; FixedSteps.bound) samples the very
    tokens of the step reading the whole cache, eager and compiled (fullgraph) alike, with log-probs within a few
    float32 ulps (the softmax sums fewer hidden zeros); compiled, one graph serves every bucket (the bounded
    dimension is dynamic: no recompile as the response grows), and a second rollout reuses it."""
    torch._dynamo.reset()
    counting = Counting()
    model = _model(family, **extra)
    ids, mask = _prompts(model.config.vocab_size, torch.Generator().manual_seed(3))
    whole = _loop_sample(model, ids, mask, SAMPLING, 3)
    assert whole[0].shape[1] > 9  # four buckets at least
    session = DecodeSession(backend=counting)
    for compiled in (False, True, True):
        tokens, logp = _loop_sample(model, ids, mask, SAMPLING, 3, session, block=3, compiled=compiled)
        assert torch.equal(tokens, whole[0]), compiled
        torch.testing.assert_close(logp, whole[1], atol=1e-6, rtol=0)
    assert counting.graphs == 1 and session.compiled == 1


def test_length_buckets():
    """FixedSteps.bound: step t (writing column width + t - 1) reads width + t rounded up to the block, at most the
    rollout's columns; without a block, every column (None). The buffers have one spare column beyond them."""
    from entropy_rft.rollout.cache import cache_of
    from entropy_rft.rollout.decode import FixedSteps, HandDecoder

    model = _model("qwen2")
    ids, mask = _prompts(model.config.vocab_size, torch.Generator().manual_seed(3))
    with torch.inference_mode():
        out = model(input_ids=ids, attention_mask=mask.long(), use_cache=True)
    decoder, cache = HandDecoder(model), cache_of(out)
    assert FixedSteps(decoder, cache, torch.arange(3), mask, 10).bound(1) is None
    bounded = FixedSteps(decoder, cache, torch.arange(3), mask, 10, block=4)
    assert [bounded.bound(t) for t in (1, 4, 5, 8, 9, 10)] == [10, 10, 14, 14, 16, 16]
    assert bounded.keys[0].shape[2] == 6 + 10 + 1
    fixed = bounded.fixed(14)
    assert fixed.keys[0].shape[2] == 14 and fixed.padding.shape[-1] == 14 and fixed.columns.shape == (14,)


@pytest.mark.slow
def test_fused_step_runs_four_projection_gemms_a_layer():
    """The ATen graph the compiler receives for the whole step (after AOT autograd): with the projections fused, each
    layer runs 4 GEMMs (qkv, o, gate_up, down) instead of 7, plus the LM head's; with the noise drawn in the step, the
    graph takes no (rows, V) float input (nothing filled outside it each step)."""
    from torch._dynamo.backends.common import aot_autograd

    counts = {}
    for fused in (False, True):
        torch._dynamo.reset()
        graphs: list = []

        def keep(gm, example_inputs, graphs=graphs):
            graphs.append((gm, example_inputs))
            return gm

        model = _model("qwen2")
        ids, mask = _prompts(model.config.vocab_size, torch.Generator().manual_seed(3))
        session = DecodeSession(backend=aot_autograd(fw_compiler=keep))
        _loop_sample(model, ids, mask, SAMPLING, 3, session, noise="seeded", fused=fused, block=4, compiled=True)
        assert len(graphs) == 1
        gm, inputs = graphs[0]
        targets = [str(node.target) for node in gm.graph.nodes if node.op == "call_function"]
        counts[fused] = sum(t.startswith(("aten.mm", "aten.addmm")) for t in targets)
        vocab = model.config.vocab_size
        rows = 15
        assert not any(
            isinstance(x, torch.Tensor) and x.is_floating_point() and tuple(x.shape) == (rows, vocab) for x in inputs
        )
    layers = model.config.num_hidden_layers
    assert counts == {False: 7 * layers + 1, True: 4 * layers + 1}, counts
