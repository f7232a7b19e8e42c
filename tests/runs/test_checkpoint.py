"""Checkpoints: exact round trip, pruning, atomicity, damage detection, resume checks."""

import contextlib
import dataclasses
import functools
import os
import time
import tracemalloc
import warnings

import flax.serialization
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from ppo_async.runs.checkpoint import (
    CheckpointError,
    CheckpointWarning,
    check_resume_compatible,
    checkpoint_path,
    list_checkpoints,
    load_latest_checkpoint,
    read_checkpoint,
    read_params,
    save_checkpoint,
    size_bounds,
)
from ppo_async.config import AsyncActorLearnerConfig, ConfigError
from ppo_async.envs.gymnax_env import BatchedEnv
from ppo_async.core.update import LearnerState, init_learner_state, make_optimizer
from ppo_async.networks.actor_critic import init_params, make_network

CONFIG = AsyncActorLearnerConfig(env_id="CartPole-v1", num_actors=1, envs_per_actor=2,
                                 num_steps=8, num_minibatches=2, total_env_steps=1_024)
COUNTERS = {"updates": 7, "env_steps": 112, "policy_version": 7}


@functools.partial(jax.jit, static_argnums=0)
def _fresh_state(config, key):
    # One jitted program instead of dozens of eager ops: each eager op compiles
    # on its own, which costs many seconds on a loaded 2-core machine.
    env = BatchedEnv(config.env_id, 1)
    network = make_network(env.observation_shape, env.action_space, config.hidden_sizes)
    params_key, learner_key = jax.random.split(key)
    params = init_params(network, params_key, env.observation_shape)
    return init_learner_state(config.update_options(), params, learner_key)


def _grads_like(params, seed):
    rng = np.random.default_rng(seed)
    return jax.tree.map(lambda x: jnp.asarray(rng.normal(size=x.shape), x.dtype), params)


@jax.jit
def _train_three_steps(state, grads):
    optimizer = make_optimizer(CONFIG.update_options())
    params, opt_state = state.params, state.opt_state
    for scale in (1.0, -0.5, 2.0):
        step_grads = jax.tree.map(lambda g: scale * g, grads)
        updates, opt_state = optimizer.update(step_grads, opt_state, params)
        params = optax.apply_updates(params, updates)
    return LearnerState(params, opt_state, jax.random.split(state.key)[0])


@pytest.fixture(scope="module")
def trained_state():
    """A state whose Adam moments, counts and key are all non-trivial."""
    state = _fresh_state(CONFIG, jax.random.key(0))
    return _train_three_steps(state, _grads_like(state.params, 0))


@pytest.fixture(scope="module")
def template():
    return _fresh_state(CONFIG, jax.random.key(123))


def _bytes_of(state):
    """Canonical bytes of a state (typed key as its data), to compare exactly."""
    state = state._replace(key=jax.random.key_data(state.key))
    return flax.serialization.to_bytes(jax.device_get(state))


def _save(directory, step, state, keep=3):
    return save_checkpoint(directory, step=step, state=state, counters=COUNTERS,
                           config_dict=CONFIG.to_dict(), keep=keep)


def test_round_trip_is_exact(tmp_path, trained_state, template):
    path = _save(tmp_path, 7, trained_state)
    assert path == tmp_path / "ckpt_000000007.msgpack"
    loaded = load_latest_checkpoint(tmp_path, template)
    assert loaded.path == path and loaded.step == 7
    assert loaded.counters == COUNTERS
    assert loaded.config == CONFIG.to_dict()
    assert AsyncActorLearnerConfig(**{**loaded.config,
                                      "hidden_sizes": tuple(loaded.config["hidden_sizes"])}) == CONFIG

    assert isinstance(loaded.state, LearnerState)
    assert _bytes_of(loaded.state) == _bytes_of(trained_state)
    assert jax.tree.structure(loaded.state) == jax.tree.structure(trained_state)
    for restored, original in zip(jax.tree.leaves(loaded.state), jax.tree.leaves(trained_state)):
        assert restored.dtype == original.dtype and restored.shape == original.shape
    # The key is a typed key again, of the same implementation, with the same stream.
    assert jax.dtypes.issubdtype(loaded.state.key.dtype, jax.dtypes.prng_key)
    assert jax.random.key_impl(loaded.state.key) == jax.random.key_impl(trained_state.key)
    np.testing.assert_array_equal(jax.random.uniform(loaded.state.key, (5,)),
                                  jax.random.uniform(trained_state.key, (5,)))
    # optax's counters come back as int32 counts, not floats or Python ints.
    adam_state = loaded.state.opt_state[1][0]
    assert isinstance(adam_state, optax.ScaleByAdamState)
    assert adam_state.count.dtype == np.int32 and int(adam_state.count) == 3


def test_optimizer_step_after_restore_equals_one_without(tmp_path, trained_state, template):
    _save(tmp_path, 1, trained_state)
    restored = jax.device_put(load_latest_checkpoint(tmp_path, template).state)
    optimizer = make_optimizer(CONFIG.update_options())
    grads = _grads_like(trained_state.params, 99)

    @jax.jit
    def step(state):
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        return LearnerState(optax.apply_updates(state.params, updates), opt_state,
                            jax.random.split(state.key)[0])

    assert _bytes_of(step(restored)) == _bytes_of(step(trained_state))


def test_other_key_implementations_round_trip(tmp_path):
    state = {"w": np.arange(3, dtype=np.float32), "key": jax.random.key(5, impl="rbg")}
    template = {"w": np.zeros(3, np.float32), "key": jax.random.key(0, impl="rbg")}
    save_checkpoint(tmp_path, step=0, state=state, counters={}, config_dict={}, keep=1)
    loaded = load_latest_checkpoint(tmp_path, template)
    assert jax.random.key_impl(loaded.state["key"]) == jax.random.key_impl(state["key"])
    np.testing.assert_array_equal(jax.random.key_data(loaded.state["key"]),
                                  jax.random.key_data(state["key"]))
    # A threefry template does not accept rbg key data: another layout, reported.
    with pytest.raises(CheckpointError, match="does not fit"):
        read_checkpoint(checkpoint_path(tmp_path, 0),
                        {"w": np.zeros(3, np.float32), "key": jax.random.key(0)})


def test_keep_prunes_to_the_newest(tmp_path, trained_state, template):
    for step in (1, 2, 3, 4, 5):
        _save(tmp_path, step, trained_state, keep=2)
    assert [p.name for p in list_checkpoints(tmp_path)] == [
        "ckpt_000000004.msgpack", "ckpt_000000005.msgpack"]
    _save(tmp_path, 6, trained_state, keep=1)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["ckpt_000000006.msgpack"]
    assert load_latest_checkpoint(tmp_path, template).step == 6
    with pytest.raises(ValueError, match="keep"):
        _save(tmp_path, 7, trained_state, keep=0)


def test_steps_sort_numerically_past_nine_digits(tmp_path):
    for step in (5, 999_999_999, 1_000_000_000):
        save_checkpoint(tmp_path, step=step, state={"x": np.zeros(1)}, counters={},
                        config_dict={}, keep=10)
    assert [int(p.stem[5:]) for p in list_checkpoints(tmp_path)] == [5, 999_999_999, 1_000_000_000]


def test_save_after_rewind_removes_later_checkpoints(tmp_path, trained_state, template):
    """A run resumed from step 2 must not be shadowed by step 3 of the abandoned run."""
    for step in (1, 2, 3):
        _save(tmp_path, step, trained_state, keep=5)
    _save(tmp_path, 2, trained_state, keep=5)
    assert [p.name for p in list_checkpoints(tmp_path)] == [
        "ckpt_000000001.msgpack", "ckpt_000000002.msgpack"]


def test_leftover_temp_file_is_ignored_and_cleaned(tmp_path, trained_state, template):
    _save(tmp_path, 1, trained_state)
    # A save that crashed before its rename leaves a half-written temp file.
    content = checkpoint_path(tmp_path, 1).read_bytes()
    leftover = tmp_path / ".tmp-ckpt_000000002.msgpack.crashed"
    leftover.write_bytes(content[: len(content) // 2])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loaded = load_latest_checkpoint(tmp_path, template)
    assert loaded.step == 1
    assert list_checkpoints(tmp_path) == [checkpoint_path(tmp_path, 1)]
    _save(tmp_path, 2, trained_state)
    assert not leftover.exists()
    assert sorted(os.listdir(tmp_path)) == ["ckpt_000000001.msgpack", "ckpt_000000002.msgpack"]


def test_failed_write_leaves_previous_checkpoints(tmp_path, trained_state, template):
    _save(tmp_path, 1, trained_state)

    class Unserializable:
        pass

    with pytest.raises(Exception):
        save_checkpoint(tmp_path, step=2, state={"x": Unserializable()}, counters={},
                        config_dict={}, keep=1)
    assert sorted(os.listdir(tmp_path)) == ["ckpt_000000001.msgpack"]
    assert load_latest_checkpoint(tmp_path, template).step == 1


@pytest.mark.parametrize("keep_fraction", [0.0, 0.001, 0.5, 0.999])
def test_truncated_newest_warns_and_uses_previous(tmp_path, trained_state, template,
                                                  keep_fraction):
    _save(tmp_path, 1, trained_state)
    newest = _save(tmp_path, 2, trained_state)
    content = newest.read_bytes()
    newest.write_bytes(content[: int(len(content) * keep_fraction)])
    with pytest.warns(CheckpointWarning, match=r"ckpt_000000002\.msgpack.*truncated"):
        loaded = load_latest_checkpoint(tmp_path, template)
    assert loaded.step == 1 and loaded.path.name == "ckpt_000000001.msgpack"
    assert _bytes_of(loaded.state) == _bytes_of(trained_state)


def test_every_truncation_is_detected(tmp_path, trained_state, template):
    path = _save(tmp_path, 1, trained_state)
    content = path.read_bytes()
    rng = np.random.default_rng(0)
    for length in [0, 1, 2, 16, len(content) - 1, *rng.integers(0, len(content), 40)]:
        path.write_bytes(content[:length])
        with pytest.raises(CheckpointError, match="ckpt_000000001"):
            read_checkpoint(path, template)


def test_flipped_byte_is_detected(tmp_path, trained_state, template):
    _save(tmp_path, 1, trained_state)
    newest = _save(tmp_path, 2, trained_state)
    content = bytearray(newest.read_bytes())
    content[len(content) - 100] ^= 0x01  # inside the params' bytes
    newest.write_bytes(bytes(content))
    with pytest.warns(CheckpointWarning, match="checksum mismatch"):
        assert load_latest_checkpoint(tmp_path, template).step == 1


def test_all_corrupt_is_a_clear_error(tmp_path, trained_state, template):
    for step in (1, 2):
        path = _save(tmp_path, step, trained_state)
        path.write_bytes(path.read_bytes()[:100])
    with pytest.warns(CheckpointWarning):
        with pytest.raises(CheckpointError, match=r"no usable checkpoint.*2 found") as info:
            load_latest_checkpoint(tmp_path, template)
    assert "ckpt_000000001" in str(info.value) and "ckpt_000000002" in str(info.value)


def test_no_checkpoint_is_none(tmp_path, template):
    assert load_latest_checkpoint(tmp_path / "missing", template) is None
    assert load_latest_checkpoint(tmp_path, template) is None


def test_renamed_file_is_rejected(tmp_path, trained_state, template):
    path = _save(tmp_path, 1, trained_state)
    path.rename(checkpoint_path(tmp_path, 9))
    with pytest.warns(CheckpointWarning, match="step 9.*contents say 1"):
        with pytest.raises(CheckpointError):
            load_latest_checkpoint(tmp_path, template)


def test_other_architecture_does_not_fit(tmp_path, trained_state):
    _save(tmp_path, 1, trained_state)
    wide = dataclasses.replace(CONFIG, hidden_sizes=(32,))
    with pytest.raises(CheckpointError, match="does not fit"):
        read_checkpoint(checkpoint_path(tmp_path, 1), _fresh_state(wide, jax.random.key(0)))


@pytest.mark.parametrize("field, value", [
    ("env_id", "Acrobot-v1"),
    ("hidden_sizes", (64, 32)),
    ("normalize_observations", True),
])
def test_incompatible_config_names_the_field(tmp_path, trained_state, template, field, value):
    _save(tmp_path, 1, trained_state)
    changed = dataclasses.replace(CONFIG, **{field: value}).to_dict()
    with pytest.raises(ConfigError, match=field):
        check_resume_compatible(CONFIG.to_dict(), changed)
    # Loading with the new config fails on the config, before the state is touched.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ConfigError, match=f"{field}=.*checkpoint was written with"):
            load_latest_checkpoint(tmp_path, template, config_dict=changed)


def test_compatible_changes_are_allowed(tmp_path, trained_state, template):
    _save(tmp_path, 1, trained_state)
    longer = dataclasses.replace(CONFIG, total_env_steps=4_096, learner_timeout_s=5.0,
                                 num_actors=2, learning_rate=1e-4, seed=3)
    # anneal_lr changes the optimizer state's structure, which ppo_async.resume fits.
    check_resume_compatible(CONFIG.to_dict(), dataclasses.replace(CONFIG, anneal_lr=False).to_dict())
    loaded = load_latest_checkpoint(tmp_path, template, config_dict=longer.to_dict())
    assert loaded.step == 1
    # A tuple and its JSON list are the same hidden_sizes.
    check_resume_compatible({**CONFIG.to_dict(), "hidden_sizes": [64, 64]},
                            {**CONFIG.to_dict(), "hidden_sizes": (64, 64)})


def test_saved_config_without_a_locked_field_is_refused():
    saved = CONFIG.to_dict()
    del saved["hidden_sizes"]
    with pytest.raises(ConfigError, match="hidden_sizes"):
        check_resume_compatible(saved, CONFIG.to_dict())


def test_counters_must_be_integers(tmp_path):
    with pytest.raises(TypeError, match="updates"):
        save_checkpoint(tmp_path, step=0, state={}, counters={"updates": 1.5},
                        config_dict={}, keep=1)
    assert list_checkpoints(tmp_path) == []


def test_checkpoint_is_not_pickle(tmp_path, trained_state):
    content = _save(tmp_path, 1, trained_state).read_bytes()
    assert not content.startswith(b"\x80")  # pickle protocol 2+ header
    envelope = flax.serialization.msgpack_restore(content)
    assert envelope["format"] == "ppo_async-checkpoint"


def test_actor_env_carry_round_trips(tmp_path):
    """A resume that must continue episodes can checkpoint the actors' env carries too."""
    env = BatchedEnv("CartPole-v1", 2)
    carry = env.reset(jax.random.key(1))
    state = {"actors": [carry]}
    save_checkpoint(tmp_path, step=0, state=state, counters={}, config_dict={}, keep=1)
    template = {"actors": [env.reset(jax.random.key(0))]}
    loaded = load_latest_checkpoint(tmp_path, template).state["actors"][0]
    assert jax.tree.structure(loaded) == jax.tree.structure(carry)
    for restored, original in zip(jax.tree.leaves(loaded), jax.tree.leaves(carry)):
        if jax.dtypes.issubdtype(original.dtype, jax.dtypes.prng_key):
            restored, original = jax.random.key_data(restored), jax.random.key_data(original)
        assert restored.dtype == original.dtype
        np.testing.assert_array_equal(restored, original)


HUGE = 2 << 30  # bytes of a sparse file: it costs nothing on disk, 2 GiB to whoever reads it


@contextlib.contextmanager
def _bounded(seconds, peak_bytes):
    """Asserts the block took under ``seconds`` and allocated under ``peak_bytes`` at its peak."""
    tracemalloc.start()
    start = time.monotonic()
    try:
        yield
        elapsed, (_, peak) = time.monotonic() - start, tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert elapsed < seconds and peak < peak_bytes, (elapsed, peak)


def test_a_huge_checkpoint_is_skipped_by_its_size_without_being_read(tmp_path, trained_state,
                                                                     template):
    _save(tmp_path, 1, trained_state)
    newest = _save(tmp_path, 2, trained_state)
    os.truncate(newest, HUGE)  # its header intact, then zeros
    with _bounded(seconds=10, peak_bytes=64 << 20):
        with pytest.warns(CheckpointWarning,
                          match=rf"ckpt_000000002\.msgpack: is {HUGE} bytes, where a checkpoint "
                                r"of this state would be \d+ to \d+: it does not fit"):
            assert load_latest_checkpoint(tmp_path, template).step == 1


def test_a_checkpoint_size_is_bounded_by_the_state_its_own_config_gives(tmp_path, trained_state,
                                                                        template):
    path = _save(tmp_path, 1, trained_state)
    saved = []

    def template_of(config):  # a template shaped by the saved config, as resume's is
        saved.append(config)
        return template

    assert read_checkpoint(path, template_of).step == 1  # the real size is in bounds
    assert saved == [CONFIG.to_dict()]
    low, high = size_bounds(flax.serialization.to_state_dict(jax.device_get(
        template._replace(key=jax.random.key_data(template.key)))))
    assert low < path.stat().st_size < high


def test_a_huge_params_file_is_refused_by_its_size_without_being_read(tmp_path, trained_state):
    path = tmp_path / "params.msgpack"
    path.write_bytes(flax.serialization.to_bytes(jax.device_get(trained_state.params)))
    assert read_params(path, trained_state.params) is not None
    os.truncate(path, HUGE)
    with _bounded(seconds=5, peak_bytes=16 << 20):
        with pytest.raises(ValueError, match=rf"^is {HUGE} bytes, where the params of this run's "
                                             r"network would be \d+ to \d+: it does not fit"):
            read_params(path, trained_state.params)
