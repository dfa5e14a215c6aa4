"""Rollouts: response masks from generated lengths, and log-probs recomputed by the trainer equal the sampler's."""

import torch

from entropy_rft.config import TrainConfig
from entropy_rft.rollout import HFEngine, Rollout
from entropy_rft.rollout.hf import response_mask_from_lengths
from entropy_rft.tasks import CountdownTask
from entropy_rft.trainer import batch_stats, default_data, load_policy, load_problems


def test_mask_from_lengths_not_from_pad():
    """The mask runs through the first EOS (included) or to the end; a pad id inside a response is kept."""
    eos, pad = 1, 0
    ids = torch.tensor([[5, 0, 6, 1, 0, 0], [5, 6, 7, 8, 9, 4], [1, 3, 1, 0, 0, 0]])
    mask, finished = response_mask_from_lengths(ids, eos)
    assert mask.tolist() == [[1, 1, 1, 1, 0, 0], [1] * 6, [1, 0, 0, 0, 0, 0]]
    assert finished.tolist() == [True, False, True]
    assert mask[0, 1]  # token equal to the pad id inside the response stays in the mask


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
    out = model.generate(input_ids=ids, attention_mask=mask.long(), do_sample=True, temperature=1.0, top_p=1.0,
                         top_k=0, max_new_tokens=16, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                         output_scores=True, return_dict_in_generate=True)
    resp = out.sequences[:, ids.shape[1]:]
    sampled = torch.stack(out.scores, 1).log_softmax(-1).gather(-1, resp.unsqueeze(-1)).squeeze(-1)
    rmask, finished = response_mask_from_lengths(resp, tok.eos_token_id)
    stats = batch_stats(model, Rollout(ids, mask, resp, rmask, finished, [""] * 12), 1.0, 5)
    torch.testing.assert_close(stats.logp[rmask], sampled[rmask], atol=1e-5, rtol=0)


def test_generate_groups_and_seed():
    """n samples per prompt are grouped in order, and a seed makes sampling reproducible."""
    model, tok = load_policy("countdown-tiny", torch.device("cpu"))
    engine = HFEngine(model, tok)
    a = engine.generate(["1,2,3>6:", "4,5,6>9:"], n=3, seed=7)
    b = engine.generate(["1,2,3>6:", "4,5,6>9:"], n=3, seed=7)
    assert a.texts == b.texts and len(a.texts) == 6
    assert torch.equal(a.prompt_ids[0], a.prompt_ids[2]) and not torch.equal(a.prompt_ids[0], a.prompt_ids[3])
