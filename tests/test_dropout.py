"""Dropout off for every architecture (entropy_rft/train/dropout.py): nn.Dropout modules and float attributes (OPT's
dropout / attention_dropout / activation_dropout / layerdrop, Mixtral's router jitter) alike; a model that still
draws random numbers in training mode is refused with the module named."""

import pytest
import torch

from entropy_rft.train.dropout import check_deterministic, disable_dropout, has_active_dropout


def two_forwards(model, seed=0):
    ids = torch.randint(0, model.config.vocab_size, (2, 8), generator=torch.Generator().manual_seed(seed))
    model.train()
    with torch.no_grad():
        return model(input_ids=ids).logits, model(input_ids=ids).logits


def opt_model():
    from transformers import OPTConfig, OPTForCausalLM

    torch.manual_seed(0)
    return OPTForCausalLM(
        OPTConfig(
            vocab_size=64,
            hidden_size=32,
            ffn_dim=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            max_position_embeddings=64,
            word_embed_proj_dim=32,
            dropout=0.1,
            attention_dropout=0.1,
            activation_dropout=0.1,
            layerdrop=0.1,
        )
    )


def test_float_dropout_attributes_are_switched_off():
    """OPT keeps its dropout in float attributes, not modules: before, two training-mode forwards of one batch
    differ; disable_dropout zeroes every one of them (and the model's config is left as the user wrote it), after
    which they agree exactly and check_deterministic passes."""
    model = opt_model()
    assert has_active_dropout(model)
    a, b = two_forwards(model)
    assert (a - b).abs().max() > 1e-3
    changed = disable_dropout(model)
    assert changed == 6  # the decoder's dropout and layerdrop; per layer, the layer's and its attention's dropout
    assert not has_active_dropout(model)
    assert model.config.dropout == 0.1
    a, b = two_forwards(model)
    assert torch.equal(a, b)
    check_deterministic(model)


def test_router_jitter_is_switched_off():
    """Mixtral's router multiplies hidden states by uniform noise in training (jitter_noise, from
    router_jitter_noise): zeroed like a dropout."""
    from transformers import MixtralConfig, MixtralForCausalLM

    torch.manual_seed(0)
    model = MixtralForCausalLM(
        MixtralConfig(
            vocab_size=64,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=4,
            num_key_value_heads=2,
            num_local_experts=4,
            num_experts_per_tok=2,
            router_jitter_noise=0.5,
        )
    )
    a, b = two_forwards(model)
    assert not torch.equal(a, b)
    disable_dropout(model)
    check_deterministic(model)


class Noisy(torch.nn.Module):
    """Randomness no attribute names: Gaussian noise in training mode."""

    def forward(self, x):
        return x + 0.1 * torch.randn_like(x) if self.training else x


def test_unknown_randomness_is_refused_naming_the_module():
    """A module that draws random numbers in training mode and has no dropout attribute: check_deterministic stops
    with an error naming it (its path and class), and leaves the global random generator as it was."""
    model = opt_model()
    disable_dropout(model)
    model.model.decoder.layers[1].activation_fn = Noisy()
    state = torch.get_rng_state()
    with pytest.raises(RuntimeError, match=r"'model\.decoder\.layers\.1\.activation_fn' \(Noisy\)"):
        check_deterministic(model)
    assert torch.equal(torch.get_rng_state(), state)


def test_trainer_refuses_a_random_model(tmp_path, monkeypatch):
    """The trainer runs the check at set-up, before any step: a policy with leftover randomness fails there."""
    from entropy_rft.config import load_config
    from entropy_rft.train import policy, trainer

    real = policy.prepare_policy

    def noisy(model, cfg):
        model = real(model, cfg)
        model.model.layers[0].mlp.act_fn = Noisy()
        return model

    monkeypatch.setattr(policy, "prepare_policy", noisy)  # the set-up's (policy.set_up_policy)
    cfg = load_config(
        None,
        steps=1,
        prompts_per_step=2,
        group_size=2,
        eval_problems=1,
        eval_k=1,
        progress=False,
        out=str(tmp_path / "run"),
    )
    with pytest.raises(RuntimeError, match=r"model\.layers\.0\.mlp\.act_fn"):
        trainer.train(cfg)
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
