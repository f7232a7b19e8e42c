"""Presets and config files: the exact learning-results configs, TOML/YAML round trips,
every bad value named, and the precedence defaults < preset < config file < flags."""

import dataclasses
import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

from ppo_async import AsyncActorLearnerConfig, ConfigError
from ppo_async.presets import (
    LEARNING_RESULTS_PRESETS,
    PRESETS,
    config_to_toml,
    load_config_file,
    preset,
)

ROOT = pathlib.Path(__file__).resolve().parents[1]

# The overrides experiments/learning_results.py held as ENV_CONFIGS at 1a0b0b6,
# when the README's learning-results table was measured (copied, not imported,
# so a changed preset fails here).
README_TABLE_CONFIGS = {
    "CartPole-v1": dict(total_env_steps=500_000),
    "Acrobot-v1": dict(total_env_steps=500_000),
    "Pendulum-v1": dict(
        total_env_steps=500_000, envs_per_actor=8, num_steps=128,
        num_epochs=10, num_minibatches=8, learning_rate=1e-3, gamma=0.95,
        ent_coef=0.0,
    ),
    "Breakout-MinAtar": dict(
        total_env_steps=500_000, envs_per_actor=8, num_steps=128,
        num_minibatches=8,
    ),
}


@pytest.mark.parametrize("name", LEARNING_RESULTS_PRESETS)
def test_each_learning_results_preset_is_the_config_the_table_used(name):
    config = preset(name)
    expected = AsyncActorLearnerConfig(env_id=config.env_id, **README_TABLE_CONFIGS[config.env_id])
    assert config.to_dict() == expected.to_dict()
    assert config == expected


def test_the_learning_results_script_trains_the_presets():
    """One implementation: the script's configs are the presets (with its budget scale and seed)."""
    code = (
        "import json, sys; sys.argv = ['x']; sys.path.insert(0, 'experiments');"
        "import learning_results as L;"
        "print(json.dumps({e: L.make_config(e, 2, 1.0).to_dict() for e in L.ENV_PRESETS}))"
    )
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         timeout=120, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert run.returncode == 0, run.stderr
    configs = json.loads(run.stdout.strip().splitlines()[-1])
    assert list(configs) == list(README_TABLE_CONFIGS)
    for name in LEARNING_RESULTS_PRESETS:
        env_id = PRESETS[name]["env_id"]
        assert configs[env_id] == preset(name, seed=2).to_dict()


def test_the_atari_preset_is_ppo_atari_on_envpool():
    fields = PRESETS["atari-pong"]
    assert fields["env_id"] == "envpool:Pong-v5" and fields["torso"] == "nature"
    assert fields["num_actors"] * fields["envs_per_actor"] == 8 and fields["num_steps"] == 128
    assert (fields["learning_rate"], fields["clip_eps"], fields["total_env_steps"]) == (2.5e-4, 0.1, 10_000_000)
    pytest.importorskip("envpool")
    config = preset("atari-pong")
    assert config.batch_size == 1024 and config.minibatch_size == 256
    assert config.network_torso == "nature"


# cleanrl's ppo_continuous_action.py defaults (its published MuJoCo results
# used them), copied here so that a changed preset fails.
CLEANRL_CONTINUOUS = dict(
    learning_rate=3e-4, anneal_lr=True, num_epochs=10, num_minibatches=32, gamma=0.99,
    gae_lambda=0.95, clip_eps=0.2, value_clip_eps=0.2, normalize_advantages=True, ent_coef=0.0,
    vf_coef=0.5, max_grad_norm=0.5, normalize_observations=True, normalize_rewards=True,
    obs_clip=10.0, reward_clip=10.0, hidden_sizes=(64, 64), network="mlp",
    total_env_steps=1_000_000,
)


@pytest.mark.parametrize("name, env_id", [("hopper", "gymnasium:Hopper-v5"),
                                          ("walker2d", "gymnasium:Walker2d-v5"),
                                          ("ant", "gymnasium:Ant-v5")])
def test_the_mujoco_presets_are_cleanrls_continuous_ppo_on_gymnasium_v5(name, env_id):
    config = preset(name)
    assert config.env_id == env_id
    assert {field: getattr(config, field) for field in CLEANRL_CONTINUOUS} == CLEANRL_CONTINUOUS
    # 2048 env steps per update, in minibatches of 64, as cleanrl's 1 env x 2048 steps.
    assert config.batch_size == 2048 and config.minibatch_size == 64
    assert (config.num_actors, config.envs_per_actor, config.num_steps) == (2, 4, 256)
    assert config.num_updates == 488  # cleanrl: 1M // 2048 iterations too
    # Ant alone observes Ant-v4's 27 numbers and starts with a std of exp(-1)
    # (docs/results.md, "Why the ant preset did not walk").
    assert (config.gymnasium_kwargs, config.init_log_std) == (
        ((("include_cfrc_ext_in_observation", False),), -1.0) if name == "ant" else ((), 0.0))
    # Actor processes: a GIL per simulator (docs/benchmarks.md, "Env workers").
    assert not config.use_vtrace and config.actor_backend == "processes"


# gymnax-blines' agents/<Game>-MinAtar/ppo.yaml (the same for the four games), whose
# checkpoints' returns gymnax's README lists; copied here so that a changed preset fails.
GYMNAX_BLINES_MINATAR = dict(
    total_env_steps=10_000_000, num_epochs=4, num_minibatches=8, learning_rate=5e-4,
    anneal_lr=False, gamma=0.999, gae_lambda=0.95, clip_eps=0.2, value_clip_eps=0.2,
    ent_coef=0.01, vf_coef=0.5, max_grad_norm=0.5, hidden_sizes=(256, 256), torso="none",
)


@pytest.mark.parametrize("name, env_id", [
    ("breakout-minatar-10m", "Breakout-MinAtar"), ("asterix-minatar", "Asterix-MinAtar"),
    ("freeway-minatar", "Freeway-MinAtar"), ("space-invaders-minatar", "SpaceInvaders-MinAtar")])
def test_the_minatar_presets_are_gymnax_blines_ppo(name, env_id):
    config = preset(name)
    assert config.env_id == env_id
    assert {f: getattr(config, f) for f in GYMNAX_BLINES_MINATAR} == GYMNAX_BLINES_MINATAR
    # 64 envs x 128 steps per update, minibatches of 1024, as theirs.
    assert (config.num_envs, config.num_steps, config.minibatch_size) == (64, 128, 1024)
    # The MLPs read the flattened 10x10xC grid.
    assert config.network_torso == "none"


def test_preset_overrides_and_unknown_names():
    config = preset("pendulum", seed=3, num_actors=4)
    assert (config.seed, config.num_actors, config.gamma) == (3, 4, 0.95)
    with pytest.raises(ConfigError, match="unknown preset.*did you mean 'cartpole'"):
        preset("CartPole")
    with pytest.raises(ConfigError, match="num_minibatches=7"):
        preset("cartpole", num_minibatches=7)


@pytest.mark.parametrize("config", [
    AsyncActorLearnerConfig(),
    preset("pendulum"),
    AsyncActorLearnerConfig(env_id="Acrobot-v1", use_vtrace=True, hidden_sizes=(32, 16, 8),
                            max_lead_steps=320, learner_device="cpu:0", learning_rate=1e-5,
                            seed=7, anneal_lr=False),
], ids=["defaults", "pendulum", "custom"])
def test_a_config_round_trips_through_a_toml_file(tmp_path, config):
    path = tmp_path / "run.toml"
    path.write_text(config_to_toml(config))
    loaded = load_config_file(path)
    assert loaded == config
    assert loaded.to_dict() == config.to_dict()
    # A derived max_lead_steps stays derived: a new num_steps derives it again.
    assert dataclasses.replace(loaded, num_steps=256).lead_steps == (
        dataclasses.replace(config, num_steps=256).lead_steps)


def test_a_yaml_file_is_read_too(tmp_path):
    pytest.importorskip("yaml")
    path = tmp_path / "run.yaml"
    path.write_text("env_id: Acrobot-v1\nhidden_sizes: [32, 32]\nlearner_device: null\nseed: 4\n")
    config = load_config_file(path)
    assert (config.env_id, config.hidden_sizes, config.learner_device, config.seed) == (
        "Acrobot-v1", (32, 32), None, 4)


def test_yaml_e_notation_is_a_number_for_numeric_fields(tmp_path):
    pytest.importorskip("yaml")
    path = tmp_path / "run.yaml"
    # PyYAML reads 3e-4 and 1E-3 (no dot) as strings; YAML 1.2 and TOML read numbers.
    path.write_text("learning_rate: 3e-4\nent_coef: 1E-3\nvtrace_pg_rho_bar: 2e0\n"
                    "env_id: 1e5\n")
    with pytest.raises(ConfigError, match="env_id='1e5'"):  # a string field keeps its string
        load_config_file(path)
    path.write_text("learning_rate: 3e-4\nent_coef: 1E-3\nvtrace_pg_rho_bar: 2e0\n")
    config = load_config_file(path)
    assert (config.learning_rate, config.ent_coef, config.vtrace_pg_rho_bar) == (3e-4, 1e-3, 2.0)
    # A true non-number is still named; an int field refuses 1e6 as TOML's 1e6 is refused.
    for text, message in [("learning_rate: fast", "learning_rate='fast': must be a number > 0"),
                          ("total_env_steps: 1e6", "total_env_steps=1000000.0: must be an integer")]:
        path.write_text(text + "\n")
        with pytest.raises(ConfigError, match=re.escape(message)):
            load_config_file(path)
    toml = tmp_path / "run.toml"
    toml.write_text("total_env_steps = 1e6\n")
    with pytest.raises(ConfigError, match=re.escape("total_env_steps=1000000.0: must be an integer")):
        load_config_file(toml)
    toml.write_text('learning_rate = "3e-4"\n')  # TOML has numbers; a quoted one is a string
    with pytest.raises(ConfigError, match=re.escape("learning_rate='3e-4'")):
        load_config_file(toml)


@pytest.mark.parametrize("text, field", [
    ("num_steps = 64.0", "num_steps=64.0"),
    ("learning_rate = -1.0", "learning_rate=-1.0"),
    ('use_vtrace = "yes"', "use_vtrace='yes'"),
    ("gamma = 1.5", "gamma=1.5"),
    ('env_id = "NoSuchEnv-v0"', "env_id='NoSuchEnv-v0'"),
    ("hidden_sizes = [64, 0]", "hidden_sizes=(64, 0)"),
    ("num_stpes = 64", "'num_stpes' is not a config field; did you mean 'num_steps'"),
    ("[ppo]\nclip_eps = 0.1", "[ppo] is a table"),
    ("num_steps = ", "not valid TOML"),
])
def test_a_bad_value_in_a_config_file_is_a_config_error_naming_the_field(tmp_path, text, field):
    path = tmp_path / "bad.toml"
    path.write_text(text + "\n")
    with pytest.raises(ConfigError) as info:
        load_config_file(path)
    assert field in str(info.value) and str(path) in str(info.value)


def test_files_that_cannot_be_config_files(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config_file(tmp_path / "missing.toml")
    (tmp_path / "run.json").write_text("{}")
    with pytest.raises(ConfigError, match="name it .toml"):
        load_config_file(tmp_path / "run.json")


# --- the command line ------------------------------------------------------------------


def _parsed_config(monkeypatch, argv):
    """The config ``ppo-async train ARGV`` would train (training itself is stubbed out)."""
    from ppo_async.tools import cli

    seen = []
    monkeypatch.setattr(cli, "_train", lambda config, *rest: seen.append((config, rest)))
    cli.main(["train", *argv])
    (call,) = seen
    return call[0]


def test_precedence_defaults_preset_file_flags(tmp_path, monkeypatch):
    path = tmp_path / "run.toml"
    # The file overrides two of the preset's fields and one default.
    path.write_text("learning_rate = 3e-4\nnum_epochs = 2\nclip_eps = 0.3\n")
    config = _parsed_config(monkeypatch, [
        "--preset", "pendulum", f"--config={path}", "--num-epochs", "3", "--no-progress"])
    assert config.clip_eps == 0.3  # file over default
    assert config.learning_rate == 3e-4  # file over preset
    assert config.num_epochs == 3  # flag over file (and preset)
    assert (config.env_id, config.gamma, config.num_steps) == ("Pendulum-v1", 0.95, 128)  # preset
    assert config.vf_coef == AsyncActorLearnerConfig().vf_coef  # default
    # The Python API builds the same config.
    assert config == dataclasses.replace(load_config_file(path, base=preset("pendulum")),
                                         num_epochs=3)
    # A flag that changes the sizes re-derives the lead, as with no preset.
    config = _parsed_config(monkeypatch, ["--preset", "pendulum", "--num-steps", "512"])
    assert config.lead_steps == 1024


@pytest.mark.parametrize("args, expected", [
    (["--preset", "nope"], "unknown preset"),
    (["--preset"], "--preset needs a preset name"),
    (["--config", "{dir}/missing.toml"], "not found"),
    (["--config", "{dir}/bad.toml"], "num_steps=64.5: must be an integer"),
    (["--preset", "cartpole", "--resume", "{dir}"], "a resumed run keeps its own config.json"),
    (["--wandb-tags", "a", "--num-steps", "8"], "--wandb-tags needs --wandb-project"),
])
def test_preset_and_config_errors_on_the_command_line_are_one_line(tmp_path, capsys, args, expected):
    from ppo_async.tools.cli import main

    (tmp_path / "bad.toml").write_text("num_steps = 64.5\n")
    with pytest.raises(SystemExit) as info:
        main(["train", *[a.replace("{dir}", str(tmp_path)) for a in args], "--no-progress"])
    assert info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and expected in err, err
