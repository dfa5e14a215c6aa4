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
        copy = session._copy[2]
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
