"""Tests of `ppo_async.config`: validation, derived values, serialization, devices."""

import ast
import dataclasses
import inspect
import json
import math
import pickle

import jax
import pytest

from ppo_async.config import AsyncActorLearnerConfig, ConfigError, fields_from_json
from ppo_async.core.devices import parse_device_list, resolve_device, resolve_devices


def test_defaults_construct_and_derive():
    cfg = AsyncActorLearnerConfig()
    assert cfg.env_id == "CartPole-v1"
    # None resolves to two chunks of the broadcast period, as a plain int.
    assert cfg.lead_steps == 2 * cfg.num_steps * cfg.broadcast_every == 128
    assert isinstance(cfg.lead_steps, int)
    assert cfg.num_envs == cfg.num_actors * cfg.envs_per_actor == 8
    assert cfg.batch_size == 8 * 64
    assert cfg.minibatch_size == cfg.batch_size // cfg.num_minibatches == 128
    assert cfg.num_updates == 500_000 // 512
    assert cfg.max_lead_chunks == 2
    assert cfg.lock_step is False


def test_derived_lead_follows_replace_but_explicit_lead_is_kept():
    cfg = AsyncActorLearnerConfig()
    bigger = dataclasses.replace(cfg, num_steps=128)
    assert bigger.lead_steps == 256
    assert bigger.max_lead_chunks == 2
    # An exact lag K leads by K + broadcast_every chunks; free-running actors by two broadcasts.
    slower = dataclasses.replace(cfg, broadcast_every=3)
    assert slower.lead_steps == (1 + 3) * 64
    free = dataclasses.replace(cfg, broadcast_every=3, exact_policy_lag=None)
    assert free.lead_steps == 2 * 64 * 3

    explicit = AsyncActorLearnerConfig(max_lead_steps=300)
    assert explicit.lead_steps == 300
    kept = dataclasses.replace(explicit, num_steps=128)
    assert kept.lead_steps == 300
    assert kept.max_lead_chunks == 2  # 300 // 128
    # An explicit lead that the new sizes make too short is refused, not rewritten.
    with pytest.raises(ConfigError, match="max_lead_steps"):
        dataclasses.replace(explicit, num_steps=512)


def test_unset_lag_and_lead_stay_unset_and_the_properties_resolve_them():
    cfg = AsyncActorLearnerConfig()
    assert (cfg.exact_policy_lag, cfg.max_lead_steps) == ("auto", None)
    assert (cfg.exact_lag, cfg.lead_steps) == (1, 128)
    assert (cfg.to_dict()["exact_policy_lag"], cfg.to_dict()["max_lead_steps"]) == ("auto", None)
    # A lead given alone: free-running, the lead as given.
    alone = AsyncActorLearnerConfig(max_lead_steps=192)
    assert (alone.exact_policy_lag, alone.exact_lag, alone.lead_steps) == ("auto", None, 192)
    # Unset again, the default exact lag is back.
    assert dataclasses.replace(alone, max_lead_steps=None).exact_lag == 1
    # An exact lag given on purpose beside a lead that disagrees names both.
    with pytest.raises(ConfigError, match=r"max_lead_steps=192 with exact_policy_lag=1"):
        AsyncActorLearnerConfig(exact_policy_lag=1, max_lead_steps=192)
    assert AsyncActorLearnerConfig(exact_policy_lag=1, max_lead_steps=128).exact_lag == 1
    # What a TOML file (no null) tries for free-running actors: told the way it has.
    with pytest.raises(ConfigError, match="exact_policy_lag='none'.*leaves it out and sets "
                                          "max_lead_steps"):
        AsyncActorLearnerConfig(exact_policy_lag="none")


def test_an_old_config_json_with_the_resolved_lag_and_lead_still_loads():
    # Written before the fields stayed as given: both resolved to ints.
    old = {**AsyncActorLearnerConfig().to_dict(), "exact_policy_lag": 1, "max_lead_steps": 128}
    loaded = AsyncActorLearnerConfig(**fields_from_json(json.loads(json.dumps(old))))
    assert (loaded.exact_lag, loaded.lead_steps, loaded.lock_step) == (1, 128, False)
    free = {**old, "exact_policy_lag": None}
    loaded = AsyncActorLearnerConfig(**fields_from_json(free))
    assert (loaded.exact_lag, loaded.lead_steps) == (None, 128)


@pytest.mark.parametrize(
    "kwargs, lock_step",
    [
        (dict(num_actors=1, max_lead_steps=64, broadcast_every=1), True),
        (dict(num_actors=1, max_lead_steps=65, broadcast_every=1), False),
        (dict(num_actors=1, max_lead_steps=128, broadcast_every=2), False),
        (dict(num_actors=1), False),
    ],
)
def test_lock_step(kwargs, lock_step):
    cfg = AsyncActorLearnerConfig(**kwargs)
    assert cfg.lock_step is lock_step


def test_derived_sizes_of_a_small_config():
    cfg = AsyncActorLearnerConfig(
        num_actors=3, envs_per_actor=2, num_steps=10, num_minibatches=5,
        total_env_steps=1000, max_lead_steps=35,
    )
    assert cfg.batch_size == 60
    assert cfg.minibatch_size == 12
    assert cfg.num_updates == 16  # 1000 // 60
    assert cfg.max_lead_chunks == 3
    assert cfg.lock_step is False


# (overrides, field the message must name)
BAD_CONFIGS = [
    (dict(num_actors=0), "num_actors"),
    (dict(num_actors=-1), "num_actors"),
    (dict(envs_per_actor=0), "envs_per_actor"),
    (dict(num_steps=0), "num_steps"),
    (dict(num_steps=-64), "num_steps"),
    (dict(broadcast_every=0), "broadcast_every"),
    (dict(num_epochs=0), "num_epochs"),
    (dict(num_minibatches=0), "num_minibatches"),
    (dict(num_minibatches=-4), "num_minibatches"),
    (dict(num_minibatches=3), "num_minibatches"),  # 3 does not divide 2 * 4 * 64
    (dict(max_lead_steps=63), "max_lead_steps"),  # below num_steps
    (dict(broadcast_every=2, max_lead_steps=100), "max_lead_steps"),  # below 64 * 2
    (dict(max_lead_steps=0), "max_lead_steps"),
    (dict(vtrace_rho_bar=0.0), "vtrace_rho_bar"),
    (dict(vtrace_rho_bar=-1.0), "vtrace_rho_bar"),
    (dict(vtrace_c_bar=0.0), "vtrace_c_bar"),
    (dict(gamma=1.01), "gamma"),
    (dict(gamma=-0.1), "gamma"),
    (dict(gae_lambda=-0.1), "gae_lambda"),
    (dict(vtrace_lambda=1.5), "vtrace_lambda"),
    (dict(learning_rate=0.0), "learning_rate"),
    (dict(learning_rate=-1e-3), "learning_rate"),
    (dict(learning_rate=math.nan), "learning_rate"),
    (dict(learning_rate=math.inf), "learning_rate"),
    (dict(clip_eps=0.0), "clip_eps"),
    (dict(ent_coef=-0.01), "ent_coef"),
    (dict(vf_coef=-0.5), "vf_coef"),
    (dict(max_grad_norm=0.0), "max_grad_norm"),
    (dict(hidden_sizes=()), "hidden_sizes"),
    (dict(hidden_sizes=(64, 0)), "hidden_sizes"),
    (dict(hidden_sizes=[64, 64]), "hidden_sizes"),  # a list is not a (hashable) tuple
    (dict(env_id="NoSuchEnv-v0"), "env_id"),
    (dict(total_env_steps=511), "total_env_steps"),  # below one batch of 2 * 4 * 64
    (dict(total_env_steps=0), "total_env_steps"),
    (dict(num_actors=True), "num_actors"),  # a bool is not an int
    (dict(num_steps=64.0), "num_steps"),
    (dict(seed=-1), "seed"),
    (dict(use_vtrace=1), "use_vtrace"),
    (dict(learner_device="gpu:x"), "learner_device"),
    (dict(actor_device=":0"), "actor_device"),
    (dict(actor_device=None), "actor_device"),
    (dict(learner_timeout_s=0.0), "learner_timeout_s"),
    (dict(learner_timeout_s=-5), "learner_timeout_s"),
]


@pytest.mark.parametrize(
    "overrides, field", BAD_CONFIGS, ids=[",".join(f"{k}={v!r}" for k, v in o.items()) for o, _ in BAD_CONFIGS]
)
def test_bad_config_raises_config_error_naming_the_field(overrides, field):
    with pytest.raises(ConfigError) as excinfo:
        AsyncActorLearnerConfig(**overrides)
    assert field in str(excinfo.value)


def test_bad_config_list_is_broad():
    assert len({repr(sorted(o.items())) for o, _ in BAD_CONFIGS}) == len(BAD_CONFIGS)
    assert len({f for _, f in BAD_CONFIGS}) >= 15


def test_unknown_env_id_message_lists_valid_ids():
    with pytest.raises(ConfigError) as excinfo:
        AsyncActorLearnerConfig(env_id="NoSuchEnv-v0")
    message = str(excinfo.value)
    assert "NoSuchEnv-v0" in message
    for valid in ("CartPole-v1", "Pendulum-v1", "Breakout-MinAtar"):
        assert valid in message


def test_a_misspelled_gymnax_id_gets_the_did_you_mean_of_gymnasium_ids_and_presets():
    with pytest.raises(ConfigError) as excinfo:
        AsyncActorLearnerConfig(env_id="CartPol-v1")
    assert "unknown environment (did you mean 'CartPole-v1'?); choose one of" in str(excinfo.value)
    with pytest.raises(ConfigError, match=r"\(did you mean 'Breakout-MinAtar'\?\)"):
        AsyncActorLearnerConfig(env_id="gymnax:breakout-minatar")


def test_messages_say_the_fix():
    with pytest.raises(ConfigError, match="must divide the batch .* = 512"):
        AsyncActorLearnerConfig(num_minibatches=3)
    with pytest.raises(ConfigError, match=r"num_steps \* broadcast_every = 64"):
        AsyncActorLearnerConfig(max_lead_steps=63)
    with pytest.raises(ConfigError, match="at least one batch"):
        AsyncActorLearnerConfig(total_env_steps=511)


@pytest.mark.parametrize(
    "overrides",
    [
        dict(gamma=1.0, gae_lambda=0.0, vtrace_lambda=1.0),  # closed interval [0, 1]
        dict(ent_coef=0.0, vf_coef=0.0),
        dict(num_actors=1, envs_per_actor=1, num_steps=1, num_minibatches=1, total_env_steps=1),
        dict(max_lead_steps=64),  # exactly num_steps * broadcast_every
        dict(learner_device="cpu:0", actor_device="gpu"),  # syntax only; resolved later
        dict(use_vtrace=True, vtrace_rho_bar=2.0, vtrace_c_bar=0.5),
        dict(hidden_sizes=(32,)),
        dict(env_id="Breakout-MinAtar"),
    ],
)
def test_edge_configs_are_accepted(overrides):
    config = AsyncActorLearnerConfig(**overrides)
    assert all(getattr(config, name) == value for name, value in overrides.items())


def test_config_error_is_value_error():
    assert issubclass(ConfigError, ValueError)
    with pytest.raises(ValueError):
        AsyncActorLearnerConfig(num_actors=0)


def test_config_is_frozen():
    cfg = AsyncActorLearnerConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.num_steps = 128
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.max_lead_steps = 1000
    assert cfg.num_steps == 64
    hash(cfg)  # frozen with hashable fields: usable as a dict key or static arg


def test_a_misspelled_keyword_suggests_the_field_as_the_cli_does():
    with pytest.raises(TypeError, match=r"'num_actor' \(did you mean 'num_actors'\?\)"):
        AsyncActorLearnerConfig(num_actor=2)
    with pytest.raises(TypeError, match=r"'lerning_rate' \(did you mean 'learning_rate'\?\)"):
        dataclasses.replace(AsyncActorLearnerConfig(), lerning_rate=1e-3)
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'zzz'$"):
        AsyncActorLearnerConfig(zzz=1)  # nothing close: Python's message alone
    # What goes through __init__ (or around it) still works: replace, pickle, the signature.
    config = dataclasses.replace(AsyncActorLearnerConfig(num_actors=3), seed=5)
    assert (config.num_actors, config.seed) == (3, 5)
    assert pickle.loads(pickle.dumps(config)) == config
    assert "num_actors" in inspect.signature(AsyncActorLearnerConfig).parameters


def _field_docstring(name):
    """A config field's docstring, as tyro and Sphinx read it (the string after the field)."""
    source = ast.parse(inspect.getsource(AsyncActorLearnerConfig))
    body = source.body[0].body
    for field, doc in zip(body, body[1:]):
        if isinstance(field, ast.AnnAssign) and field.target.id == name:
            return doc.value.value


def test_envpool_kwargs_help_reads_as_sentences_in_three_lines():
    # It read "over the standard Atari settings that envpool: Atari ids get", and Sphinx
    # took the text before that colon for a type.
    doc = _field_docstring("envpool_kwargs")
    assert len(doc.splitlines()) <= 3 and ":" not in doc.splitlines()[0]
    assert "envpool: Atari" not in doc and "--envpool-kwargs episodic_life False" in doc


@pytest.mark.parametrize(
    "overrides",
    [
        dict(),
        dict(max_lead_steps=300, hidden_sizes=(32, 16, 8), learner_device="cpu:0",
             use_vtrace=True, num_steps=32),
    ],
)
def test_to_dict_is_json_and_round_trips(overrides):
    cfg = AsyncActorLearnerConfig(**overrides)
    d = cfg.to_dict()
    assert set(d) == {f.name for f in dataclasses.fields(cfg)}
    assert isinstance(d["hidden_sizes"], list)
    # What was given, as its plain type: an int, or None when unset (derived on reading).
    assert type(d["max_lead_steps"]) is type(overrides.get("max_lead_steps"))
    loaded = json.loads(json.dumps(d))
    assert loaded == d
    loaded["hidden_sizes"] = tuple(loaded["hidden_sizes"])
    again = AsyncActorLearnerConfig(**loaded)
    assert again == cfg
    assert again.lead_steps == cfg.lead_steps
    assert again.to_dict() == d


def test_resolve_device():
    cpu = resolve_device("cpu")
    assert cpu.platform == "cpu"
    assert resolve_device("cpu:0") == jax.devices("cpu")[0]
    assert resolve_device(None) == jax.devices()[0]
    count = len(jax.devices("cpu"))
    with pytest.raises(ConfigError) as excinfo:
        resolve_device("cpu:99")
    message = str(excinfo.value)
    assert "cpu:99" in message
    assert f"only {count} cpu device" in message


def test_resolve_device_unknown_platform():
    with pytest.raises(ConfigError, match="nosuchplatform"):
        resolve_device("nosuchplatform")


@pytest.mark.parametrize("spec", ["gpu:x", ""])
def test_resolve_device_malformed_spec(spec):
    with pytest.raises(ConfigError, match="device"):
        resolve_device(spec)


@pytest.mark.parametrize("spec, parsed", [
    ("cpu", ("cpu", (0,))), ("gpu:1", ("gpu", (1,))), ("gpu:0,gpu:1", ("gpu", (0, 1))),
    ("cpu:0, cpu:2", ("cpu", (0, 2))), ("gpu:all", ("gpu", None)),
    ("gpu:0,cpu:1", None), ("gpu:0,gpu:0", None), ("gpu:all,gpu:1", None), ("gpu:0,", None),
    (":all", None), ("gpu:x", None),
])
def test_parse_device_list(spec, parsed):
    assert parse_device_list(spec) == parsed


@pytest.mark.parametrize("spec", ["gpu:0,cpu:1", "cpu:0,cpu:0", "gpu:all,gpu:1"])
def test_a_malformed_learner_device_list_is_refused(spec):
    with pytest.raises(ConfigError, match="learner_device"):
        AsyncActorLearnerConfig(learner_device=spec)


def test_a_learner_device_list_must_split_the_batch():
    # Feed-forward: 2 x 4 envs x 64 steps, 4 minibatches of 128 samples.
    AsyncActorLearnerConfig(learner_device="gpu:0,gpu:1")  # validated without looking devices up
    with pytest.raises(ConfigError, match=r"num_actors \* envs_per_actor=8: .*3 devices"):
        AsyncActorLearnerConfig(learner_device="gpu:0,gpu:1,gpu:2")
    with pytest.raises(ConfigError, match="num_minibatches=4: .*minibatch's 2 samples"):
        AsyncActorLearnerConfig(num_steps=1, learner_device="gpu:0,gpu:1,gpu:2,gpu:3,gpu:4,"
                                "gpu:5,gpu:6,gpu:7")
    # Recurrent: a minibatch's whole sequences split over the devices.
    AsyncActorLearnerConfig(network="gru", num_minibatches=2, learner_device="gpu:0,gpu:1")
    with pytest.raises(ConfigError, match="num_minibatches=4: .*recurrent minibatch's 2 env"):
        AsyncActorLearnerConfig(network="gru", num_minibatches=4,
                                learner_device="cpu:0,cpu:1,cpu:2,cpu:3")


def test_resolve_devices_names_every_device_in_order():
    every = resolve_devices("cpu:all")
    assert every == tuple(jax.devices("cpu"))
    assert resolve_devices("cpu:0") == (jax.devices("cpu")[0],)
    with pytest.raises(ConfigError, match=f"no index {len(every)} .*xla_force_host_platform"):
        resolve_devices(f"cpu:0,cpu:{len(every)}")


def test_a_placement_of_one_device_has_no_mesh():
    placement = AsyncActorLearnerConfig(learner_device="cpu:all").learner_placement()
    if jax.device_count("cpu") == 1:
        assert placement.mesh is None and placement.device == jax.devices("cpu")[0]


def test_an_annealed_schedule_past_the_int32_counter_is_refused():
    with pytest.raises(ConfigError, match="total_env_steps"):
        AsyncActorLearnerConfig(total_env_steps=10**12)
    AsyncActorLearnerConfig(total_env_steps=10**12, anneal_lr=False)  # no schedule to overflow


def test_every_field_has_a_short_docstring():
    """A field's docstring is its --help line and its API entry: one short paragraph, no essay."""
    body = ast.parse(inspect.getsource(AsyncActorLearnerConfig)).body[0].body
    docs = {field.target.id: doc.value.value for field, doc in zip(body, body[1:])
            if isinstance(field, ast.AnnAssign) and isinstance(doc, ast.Expr)}
    assert set(docs) == {field.name for field in dataclasses.fields(AsyncActorLearnerConfig)}
    for name, doc in docs.items():
        assert len(doc.splitlines()) <= 3, f"{name}: {len(doc.splitlines())} lines"
        assert len(" ".join(doc.split())) <= 260, f"{name}: {len(' '.join(doc.split()))} characters"
