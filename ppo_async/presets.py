"""Named configs (presets) and config files: a run's config given by name or by file.

A preset or a config file is a set of field overrides on top of a base config;
`AsyncActorLearnerConfig` stays the single source of truth: it names the
fields and validates every value (a bad one raises its `ConfigError`).
Precedence, lowest first: the dataclass defaults < the preset < the config
file < flags (or ``**overrides``).

    from ppo_async.presets import preset, load_config_file
    cfg = preset("pendulum", seed=3)                       # the README's Pendulum run, seed 3
    cfg = load_config_file("my_run.toml", base=preset("pendulum"))

``ppo-async train --preset pendulum --config my_run.toml --seed 3`` does the
same on the command line.

The presets of the README's learning-results table (``cartpole``,
``acrobot``, ``pendulum``, ``breakout-minatar``) are the exact configs
``experiments/learning_results.py`` trains (it reads them from here);
``atari-pong`` is a starting point for envpool's Atari (not measured here);
``hopper``, ``walker2d`` and ``ant`` are MuJoCo locomotion with cleanrl's PPO
settings, which ``experiments/mujoco_results.py`` trains; ``breakout-minatar-10m``,
``asterix-minatar``, ``freeway-minatar`` and ``space-invaders-minatar`` are
MinAtar at 10M env steps with gymnax-blines' PPO settings, which
``experiments/minatar_results.py`` trains.
"""

from __future__ import annotations

import dataclasses
import math
import pathlib
import re
import tomllib
import types
import typing
from collections.abc import Mapping
from typing import Any

from ppo_async.config import AsyncActorLearnerConfig, ConfigError, fields_from_json
from ppo_async.errors import did_you_mean

# MuJoCo locomotion (pip install 'ppo-async[mujoco]'): the PPO continuous-control
# settings of cleanrl's ppo_continuous_action.py (Huang et al. 2022, "The 37
# implementation details of PPO"), whose 1M-step results on the v4 envs are the
# published reference in docs/results.md. 2048 env steps per update, spread as
# 2 actors x 4 envs x 256 steps (two actors overlap the Python simulator with
# the learner); 10 epochs x 32 minibatches (of 64); lr 3e-4 annealed; gamma
# 0.99, GAE lambda 0.95, clip 0.2 for the ratio and (cleanrl's clip_vloss) the
# value; no entropy bonus; observations and rewards normalized and clipped at
# 10. The policy's log-std is a learned vector, independent of the state
# (networks.actor_critic), as in cleanrl; actions are clipped to the box for
# the env only. The actors are processes: each steps its simulator with a GIL
# of its own (1.6x lock-step on Hopper on 2 cores, where thread actors reach
# 1.0-1.1x; docs/benchmarks.md), and at the exact lag a run gives the bytes
# of thread actors, so the results measured with threads hold.
MUJOCO_FIELDS: dict[str, Any] = dict(
    total_env_steps=1_000_000, num_actors=2, envs_per_actor=4, num_steps=256,
    actor_backend="processes",
    num_epochs=10, num_minibatches=32, learning_rate=3e-4, anneal_lr=True, gamma=0.99,
    gae_lambda=0.95, clip_eps=0.2, value_clip_eps=0.2, ent_coef=0.0, vf_coef=0.5,
    max_grad_norm=0.5, normalize_observations=True, normalize_rewards=True,
)
MUJOCO_PRESETS = ("hopper", "walker2d", "ant")

# MinAtar at 10M env steps: the PPO settings of gymnax-blines
# (github.com/RobertTLange/gymnax-blines, agents/<Game>-MinAtar/ppo.yaml, the
# same file for all four games), whose checkpoints' returns gymnax's README
# lists (the reference in experiments/minatar_results.py). 64 envs x 128
# steps per update (here 2 actors x 32 envs), 4 epochs x 8 minibatches (of
# 1024), Adam lr 5e-4 held constant, gamma 0.999, GAE lambda 0.95, clip 0.2
# for the ratio and the value, entropy 0.01, value weight 0.5, grad norm 0.5,
# separate actor and critic MLPs of 2 x 256 on the flattened 10x10xC grid
# (torso "none"). What differs here: the MLPs are tanh (theirs relu), the
# orthogonal init is this package's, and there is no 5% warm-up of the lr.
MINATAR_FIELDS: dict[str, Any] = dict(
    total_env_steps=10_000_000, num_actors=2, envs_per_actor=32, num_steps=128,
    num_epochs=4, num_minibatches=8, learning_rate=5e-4, anneal_lr=False, gamma=0.999,
    gae_lambda=0.95, clip_eps=0.2, value_clip_eps=0.2, ent_coef=0.01, vf_coef=0.5,
    max_grad_norm=0.5, torso="none", hidden_sizes=(256, 256),
)
# Preset name -> gymnax id. Breakout's is "breakout-minatar-10m": "breakout-minatar"
# stays the README table's short-budget config.
MINATAR_PRESETS: dict[str, str] = {
    "breakout-minatar-10m": "Breakout-MinAtar", "asterix-minatar": "Asterix-MinAtar",
    "freeway-minatar": "Freeway-MinAtar", "space-invaders-minatar": "SpaceInvaders-MinAtar",
}

# Field overrides on the dataclass defaults (2 actors x 4 envs x 64 steps, lr
# 5e-4, gamma 0.99, 4 epochs x 4 minibatches). Pendulum's rewards reach -16
# per step and this preset does not scale them (normalize_rewards is off: the
# results were measured without it), so a short horizon (gamma
# 0.95) keeps the value targets small; it gets a larger batch (16 envs x 128),
# more epochs, a higher lr and no entropy bonus, as continuous-control PPO
# usually does. MinAtar's conv torso is expensive on CPU: a short budget, far
# from the 10M steps of published curves. What each preset reaches is in
# docs/results.md.
PRESETS: dict[str, dict[str, Any]] = {
    "cartpole": dict(env_id="CartPole-v1", total_env_steps=500_000),
    "acrobot": dict(env_id="Acrobot-v1", total_env_steps=500_000),
    "pendulum": dict(
        env_id="Pendulum-v1", total_env_steps=500_000, envs_per_actor=8, num_steps=128,
        num_epochs=10, num_minibatches=8, learning_rate=1e-3, gamma=0.95, ent_coef=0.0,
    ),
    "breakout-minatar": dict(
        env_id="Breakout-MinAtar", total_env_steps=500_000, envs_per_actor=8, num_steps=128,
        num_minibatches=8,
    ),
    # The PPO Atari settings of Huang et al. (2022), "The 37 implementation
    # details of PPO" (cleanrl ppo_atari.py): 8 envs x 128 steps, 4 epochs x 4
    # minibatches, lr 2.5e-4 annealed, clip 0.1, 10M env steps, the Nature CNN
    # (which scales the frames to [0, 1]). The env gets the standard Atari
    # settings (envs.registry.ATARI_TRAIN_KWARGS: 4 stacked 84x84 grey frames,
    # episodic life, clipped rewards). Not trained to the end here (only its
    # speed was measured, experiments/bench_atari.py).
    "atari-pong": dict(
        env_id="envpool:Pong-v5", torso="nature", total_env_steps=10_000_000, num_actors=2,
        envs_per_actor=4,
        num_steps=128, num_epochs=4, num_minibatches=4, learning_rate=2.5e-4, clip_eps=0.1,
        ent_coef=0.01, vf_coef=0.5, gamma=0.99, gae_lambda=0.95,
    ),
    **{name: dict(env_id=env_id, **MINATAR_FIELDS) for name, env_id in MINATAR_PRESETS.items()},
    **{name: dict(env_id=f"gymnasium:{env}-v5", **MUJOCO_FIELDS)
       for name, env in (("hopper", "Hopper"), ("walker2d", "Walker2d"))},
    # Ant differs from the other two in two measured ways (docs/results.md, "Why
    # the ant preset did not walk"; experiments/ant_diagnosis.py). Its policy
    # starts with a std of exp(-1) = 0.37, not 1: at a std of 1 the actions'
    # cost (0.5 x the sum of their squares over 8 joints, about 2.1 a step)
    # outweighs the healthy reward of 1 a step, so the first policies learn
    # that falling over early pays; at 0.37 staying up pays from the start. And
    # it observes Ant-v4's 27 numbers, not v5's default 105 (the other 78 are
    # contact forces, 54 of them never nonzero in 10 random episodes):
    # 27 learnt faster at either std. Seed 0 at 1M env steps, training return:
    # 105 numbers and std 1 419.6, 27 and std 1 679.5, 105 and 0.37 1320.9,
    # 27 and 0.37 2510.1.
    "ant": dict(env_id="gymnasium:Ant-v5", **MUJOCO_FIELDS,
                gymnasium_kwargs=(("include_cfrc_ext_in_observation", False),),
                init_log_std=-1.0),
}

# The presets behind the README's learning-results table, in its row order.
LEARNING_RESULTS_PRESETS = ("cartpole", "acrobot", "pendulum", "breakout-minatar")


def preset_names() -> list[str]:
    return list(PRESETS)


def preset_overrides(name: str) -> dict[str, Any]:
    """The field overrides of preset ``name`` (a copy); `ConfigError` listing the names if unknown."""
    if name not in PRESETS:
        raise ConfigError(
            f"preset={name!r}: unknown preset{did_you_mean(name, PRESETS)}; choose one of "
            f"{', '.join(PRESETS)}"
        )
    return dict(PRESETS[name])


def apply_overrides(base: AsyncActorLearnerConfig, overrides: Mapping[str, Any],
                    source: str = "overrides") -> AsyncActorLearnerConfig:
    """``base`` with ``overrides`` (field name -> value) applied and validated.

    An unknown field name raises `ConfigError` naming it (and the closest
    field); lists become tuples (``hidden_sizes``); the dataclass validates
    every value, and its `ConfigError` is prefixed with ``source``.
    """
    fields = {f.name for f in dataclasses.fields(AsyncActorLearnerConfig)}
    for key in overrides:
        if key not in fields:
            hint = did_you_mean(key, fields).strip(" ()")
            raise ConfigError(
                f"{source}: {key!r} is not a config field; {hint + ' ' if hint else ''}"
                "`ppo-async train --help` lists the fields"
            )
    values = fields_from_json(overrides)
    try:
        return dataclasses.replace(base, **values)
    except ConfigError as error:
        raise ConfigError(f"{source}: {error}") from None
    except TypeError as error:  # a value the validation's comparisons cannot handle
        raise ConfigError(f"{source}: {error}") from None


def preset(name: str, **overrides: Any) -> AsyncActorLearnerConfig:
    """The config of preset ``name`` with ``overrides`` applied (e.g. ``seed=1``)."""
    config = apply_overrides(AsyncActorLearnerConfig(), preset_overrides(name), f"preset {name!r}")
    return apply_overrides(config, overrides)


def read_config_file(path: str | pathlib.Path) -> dict[str, Any]:
    """The field overrides a config file holds: TOML (``.toml``), or YAML (``.yaml``/``.yml``, needs pyyaml).

    The file is a flat table of config field names and values. TOML has no
    null: leave a key out to keep its default (``max_lead_steps``,
    ``learner_device``). In YAML a numeric field may be written ``3e-4``
    (YAML 1.2 reads it as a number; PyYAML, on its own, as a string). Raises
    `ConfigError` for a missing or unreadable file.
    """
    fields = read_table_file(path, "config file")
    for key, value in fields.items():
        if isinstance(value, dict):
            raise ConfigError(
                f"config file {str(path)!r}: [{key}] is a table; config files are flat "
                "(field = value, no sections)"
            )
    return fields


def read_table_file(path: str | pathlib.Path, what: str) -> dict[str, Any]:
    """The table a TOML or YAML file holds (``what`` names the file in errors: "config file").

    YAML's e-notation numbers of numeric config fields are read as numbers,
    in the top table and in the tables under it (a sweep file's ``[base]``
    and ``[grid]``, whose lists are read element by element). Raises
    `ConfigError` for a missing, unreadable or malformed file.
    """
    path = pathlib.Path(path)
    if not path.is_file():
        raise ConfigError(f"{what} {str(path)!r}: not found; give the path of a .toml file")
    suffix = path.suffix.lower()
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(f"{what} {str(path)!r}: cannot be read ({error})") from None
    if suffix in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError:
            raise ConfigError(
                f"{what} {str(path)!r}: reading YAML needs pyyaml (pip install pyyaml); "
                "or write the file as TOML"
            ) from None
        try:
            fields = yaml.safe_load(text)
        except yaml.YAMLError as error:
            problem = " ".join(str(error).split())
            raise ConfigError(f"{what} {str(path)!r}: not valid YAML ({problem})") from None
        fields = _yaml_numbers({} if fields is None else fields)
    elif suffix == ".toml":
        try:
            fields = tomllib.loads(text)
        except tomllib.TOMLDecodeError as error:
            raise ConfigError(f"{what} {str(path)!r}: not valid TOML ({error})") from None
    else:
        raise ConfigError(
            f"{what} {str(path)!r}: unknown format {suffix or '(no suffix)'!r}; "
            "name it .toml (or .yaml with pyyaml installed)"
        )
    if not isinstance(fields, dict):
        raise ConfigError(f"{what} {str(path)!r}: expected a table of key = value lines")
    return fields


# A number in e-notation without a dot (3e-4, 1E6): YAML 1.2 reads it as a float,
# PyYAML (YAML 1.1) as a string.
_E_NOTATION = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")


def _numeric_fields() -> set[str]:
    """The config fields whose type is a number (int or float, maybe None)."""
    hints = typing.get_type_hints(AsyncActorLearnerConfig)

    def numeric(hint: Any) -> bool:
        if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
            return all(numeric(arg) for arg in typing.get_args(hint) if arg is not type(None))
        return hint in (int, float)

    return {name for name, hint in hints.items() if numeric(hint)}


def _yaml_numbers(fields: Any) -> Any:
    """``fields`` with the e-notation strings of numeric fields read as floats, as YAML 1.2 does.

    Any other string stays as it is, so the config's validation names a true
    non-number (``learning_rate='fast': must be a number > 0``). A table
    inside is read the same way, and a list under a numeric field element by
    element (a sweep's ``[grid]``).
    """
    if not isinstance(fields, dict):
        return fields
    numeric = _numeric_fields()

    def number(value: Any) -> Any:
        if isinstance(value, str) and _E_NOTATION.fullmatch(value.strip()):
            return float(value)
        return value

    def read(key: Any, value: Any) -> Any:
        if isinstance(value, dict):
            return _yaml_numbers(value)
        if key not in numeric:
            return value
        return [number(v) for v in value] if isinstance(value, list) else number(value)

    return {key: read(key, value) for key, value in fields.items()}


def load_config_file(path: str | pathlib.Path,
                     base: AsyncActorLearnerConfig | None = None) -> AsyncActorLearnerConfig:
    """``base`` (default: the dataclass defaults) with the fields of config file ``path``.

    Raises `ConfigError` naming the file and the field for an unknown key or a
    bad value.
    """
    overrides = read_config_file(path)
    base = AsyncActorLearnerConfig() if base is None else base
    return apply_overrides(base, overrides, f"config file {str(path)!r}")


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(int(value))
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{value!r} has no TOML form")
        return repr(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    raise ValueError(f"{value!r} has no TOML form")


def config_to_toml(config: AsyncActorLearnerConfig) -> str:
    """``config`` as a TOML config file that `load_config_file` reads back to an equal config.

    Fields that are None are left out (TOML has no null; a missing key keeps
    the default), so an unset ``max_lead_steps`` stays unset and the file
    keeps deriving it. Free-running actors (``exact_policy_lag=None``) are
    written as their lead (`AsyncActorLearnerConfig.lead_steps`): a
    ``max_lead_steps`` given alone chooses them.
    """
    lines = []
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        if field.name == "max_lead_steps" and config.exact_policy_lag is None:
            value = config.lead_steps
        if value is not None:
            lines.append(f"{field.name} = {toml_value(value)}")
    return "\n".join(lines) + "\n"
