"""Configuration validation and the registry: bad input fails early with the fix in the message."""

import pytest

from entropy_rft.config import load_config
from entropy_rft.core.registry import Registry
from entropy_rft.train.policy import resolve_model_path


def test_registry_duplicate_and_unknown():
    reg = Registry("thing")
    reg.register("a", 1)
    with pytest.raises(ValueError, match="already registered"):
        reg.register("a", 2)
    with pytest.raises(KeyError, match="known things: a"):
        reg.get("b")


def test_unknown_method_lists_known_ones():
    with pytest.raises(KeyError, match="clip_b.*clip_v"):
        load_config(None, method="clip_x")


def test_bad_mu_and_unknown_key():
    """mu must be a number >= 0 (0 is the authors' clip-below-the-mean); unknown keys are named."""
    with pytest.raises(ValueError, match="mu must be >= 0"):
        load_config(None, method="clip_b", mu=-1.0)
    with pytest.raises(ValueError, match="mu: got nan .*finite"):
        load_config(None, method="clip_v", mu=float("nan"))
    assert load_config(None, method="clip_b", mu=0).mu == 0
    with pytest.raises(ValueError, match="unknown config keys \\['learning_rate'\\]"):
        load_config(None, learning_rate=1e-3)


def test_group_of_one_warns():
    with pytest.warns(UserWarning, match="group_size=1"):
        load_config(None, group_size=1)


def test_yaml_overrides(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text("method: clip_v\nmu: 4.0\nbetas: [0.9, 0.99]\n")
    cfg = load_config(path, steps=3)
    assert (cfg.method, cfg.mu, cfg.betas, cfg.steps) == ("clip_v", 4.0, (0.9, 0.99), 3)
    with pytest.raises(FileNotFoundError):
        load_config(tmp_path / "missing.yaml")


def test_model_path_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        resolve_model_path(str(tmp_path / "no-such-model"))
    with pytest.raises(FileNotFoundError, match="no config.json"):
        resolve_model_path(str(tmp_path))
    assert resolve_model_path("Qwen/Qwen2.5-7B-Instruct") == "Qwen/Qwen2.5-7B-Instruct"


def test_direct_construction_warns_that_method_defaults_are_not_applied():
    from entropy_rft.config import TrainConfig

    with pytest.warns(UserWarning, match="load_config"):
        TrainConfig(method="dapo")
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_config(None, method="dapo")  # applies them: no warning


def test_demo_run_config_layers_common_method_and_given_overrides():
    """run_config: common settings, then the method's entry, then overrides; an override left as None (an
    option not given) keeps the spec's value instead of falling back to the dataclass default."""
    from entropy_rft.config import load_demo_config, run_config

    spec = load_demo_config()
    cfg = run_config(spec, "clip_b", steps=None, out="x")
    assert (cfg.steps, cfg.mu, cfg.lr, cfg.out) == (150, 1.5, 5e-5, "x")
    assert run_config(spec, "clip_b", steps=7).steps == 7
    assert run_config(spec, None, method="clip_v", mu=2.0).mu == 2.0


def test_registry_suggests_the_close_name():
    """Property (issue 43): an unknown name close to a known one is answered with it (case, '-' and '_' ignored, or
    difflib's closest); a far one gets no guess."""
    from entropy_rft.core.registry import did_you_mean

    reg = Registry("method")
    for name in ("clip_b", "clip_v", "grpo"):
        reg.register(name, name)
    with pytest.raises(KeyError, match=r"unknown method 'clipb' \(did you mean 'clip_b'\?\); known methods"):
        reg.get("clipb")
    assert did_you_mean("CLIP-V", reg.names()) == " (did you mean 'clip_v'?)"
    assert did_you_mean("grp0", reg.names()) == " (did you mean 'grpo'?)"
    assert did_you_mean("unlikelihood", reg.names()) == ""


def test_settings_that_train_little_or_nothing_are_named(tmp_path, capsys):
    """lr 0, a temperature below 0.1 (near-greedy: a group's responses alike, advantages 0), groups of one under
    GRPO and an empty recipe file each give one SettingWarning naming the setting, which the command line shows as
    one line `entropy-rft SUBCOMMAND: warning: ...`; the defaults give none."""
    import warnings

    from entropy_rft.commands.cli import main
    from entropy_rft.config import SettingWarning, read_recipe

    def named(**settings) -> list[str]:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            load_config(None, **settings)
        return [str(w.message) for w in caught if issubclass(w.category, SettingWarning)]

    assert named() == [] and named(temperature=0.1, lr=1e-6, group_size=2) == []
    assert [m.split(":")[0] for m in named(lr=0.0)] == ["lr=0"]
    assert [m.split(":")[0] for m in named(temperature=1e-6)] == ["temperature=1e-06"]
    assert [m.split(":")[0] for m in named(group_size=1)] == ["group_size=1"]
    (tmp_path / "empty.yaml").write_text("# settings to come\n")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert read_recipe(tmp_path / "empty.yaml") == {}
    assert [str(w.message).split(" (")[0] for w in caught] == [f"{tmp_path / 'empty.yaml'} holds no settings"]
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        try:  # plan returns, or exits 1 when the plan does not fit; the warnings come first either way
            main(["plan", "--config", str(tmp_path / "empty.yaml"), "--set", "lr=0", "temperature=0.01"])
        except SystemExit as stop:
            assert stop.code == 1
    err = capsys.readouterr().err.splitlines()
    assert f"entropy-rft plan: warning: {tmp_path / 'empty.yaml'} holds no settings" in "\n".join(err)
    assert any(line.startswith("entropy-rft plan: warning: lr=0: ") for line in err)
    assert any(line.startswith("entropy-rft plan: warning: temperature=0.01: ") for line in err)
