"""A learner over several devices: the same updates as on one, the arrays on every device.

The checks need several devices, and XLA fixes the host's device count when
JAX starts, so they run in a fresh process with
``XLA_FLAGS=--xla_force_host_platform_device_count=4``: this file, run as a
script, trains the cases and prints what it measured as JSON; the tests
read it. The devices share the same cores, so nothing here is timed.

What it runs, all lock-step (one actor's chunk per column, never ahead),
8 updates each, 2 actors x 4 envs:

- ``mlp``: feed-forward, GAE, observation and reward normalization;
- ``gru``: recurrent, V-trace, observation normalization;

each on 1 device, on ``cpu:0,cpu:1`` and on ``cpu:all`` (4), ``mlp`` on 4
twice; an interrupted ``mlp`` run resumed on another device count (4 -> 1,
1 -> 2); and the synchronous twin on 1 and 2 devices.
"""

import hashlib
import json
import os
import pathlib
import subprocess
import sys
import tempfile

import pytest

DEVICES = 4
# Reduction order differs between device counts: params may differ by float rounding only.
TOLERANCE = 1e-4


def _config(case: str, **fields):
    from ppo_async import AsyncActorLearnerConfig

    common = dict(
        env_id="CartPole-v1", num_actors=2, envs_per_actor=4, num_steps=8, num_epochs=2,
        num_minibatches=2, total_env_steps=8 * 2 * 4 * 8, max_lead_steps=8, hidden_sizes=(16,),
        seed=3, learner_timeout_s=120.0,
    )
    cases = {
        "mlp": dict(normalize_observations=True, normalize_rewards=True),
        "gru": dict(network="gru", use_vtrace=True, normalize_observations=True),
    }
    return AsyncActorLearnerConfig(**{**common, **cases[case], **fields})


def _leaves(params):
    import jax
    import numpy as np

    return [np.asarray(leaf) for leaf in jax.tree.leaves(jax.device_get(params))]


def _relative_difference(params, reference) -> float:
    """Max over leaves of ``max|a - b| / max|b|``."""
    import numpy as np

    return max(float(np.max(np.abs(a - b)) / max(float(np.max(np.abs(b))), 1e-12))
               for a, b in zip(_leaves(params), _leaves(reference)))


def _digest(params) -> str:
    import flax.serialization
    import jax

    return hashlib.sha256(flax.serialization.to_bytes(jax.device_get(params))).hexdigest()


def _placement(tree) -> dict:
    """The devices and partition specs the leaves of ``tree`` have."""
    import jax

    leaves = [leaf for leaf in jax.tree.leaves(tree) if hasattr(leaf, "sharding")]
    return {
        "devices": sorted({d.id for leaf in leaves for d in leaf.sharding.device_set}),
        "specs": sorted({str(tuple(leaf.sharding.spec)) if hasattr(leaf.sharding, "spec")
                         else "one device" for leaf in leaves}),
        "shard_shapes": sorted({tuple(shard.data.shape) for leaf in leaves
                                for shard in leaf.addressable_shards}),
        "whole": all(shard.data.shape == leaf.shape for leaf in leaves
                     for shard in leaf.addressable_shards),
    }


def _record_learner(seen: dict):
    """Wrap `train`'s update to keep where its first batch and state lived."""
    import importlib

    train_module = importlib.import_module("ppo_async.train")
    original = train_module.with_normalization  # the outermost jitted update

    def with_normalization(inner, options):
        update = original(inner, options)

        def recorded(state, batch):
            new_state, metrics = update(state, batch)
            if "batch_obs" not in seen:
                seen["batch_obs"] = _placement(batch.obs)
                seen["batch_bootstrap_obs"] = _placement(batch.bootstrap_obs)
                seen["state_in"] = _placement(state)
                seen["state_out"] = _placement(new_state)
            return new_state, metrics

        return recorded

    train_module.with_normalization = with_normalization
    return lambda: setattr(train_module, "with_normalization", original)


def _resumed(config, first_device, then_device, run_dir: pathlib.Path):
    """``config`` stopped after 4 updates on ``first_device``, then finished on ``then_device``."""
    import dataclasses

    from ppo_async import train

    from run_helpers import interrupt_at

    try:
        train(dataclasses.replace(config, learner_device=first_device), run_dir=run_dir,
              progress=False, on_update=interrupt_at(4))
    except KeyboardInterrupt:
        pass
    else:
        raise AssertionError("the first half was not interrupted")
    return train(dataclasses.replace(config, learner_device=then_device), resume_from=run_dir,
                 progress=False)


def main() -> None:
    import dataclasses

    import jax

    from ppo_async import ConfigError, train
    from ppo_async.sync import make_train

    if os.environ.get("PPO_ASYNC_JAX_CACHE"):  # conftest's on-disk cache, which a script does not load
        jax.config.update("jax_compilation_cache_dir", os.environ["PPO_ASYNC_JAX_CACHE"])
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
    out: dict = {"device_count": jax.device_count()}
    two, every = "cpu:0,cpu:1", "cpu:all"
    for case in ("mlp", "gru"):
        config = _config(case)
        one = train(config, progress=False).params
        results = {}
        for name, device in (("two", two), ("every", every)):
            seen: dict = {}
            restore = _record_learner(seen)
            try:
                params = train(dataclasses.replace(config, learner_device=device),
                               progress=False).params
            finally:
                restore()
            results[name] = {"relative_difference": _relative_difference(params, one),
                             "digest": _digest(params), "seen": seen}
        if case == "mlp":
            again = train(dataclasses.replace(config, learner_device=every), progress=False)
            results["every_again_digest"] = _digest(again.params)
            with tempfile.TemporaryDirectory() as scratch:
                for name, first, then in (("4_to_1", every, None), ("1_to_2", None, two)):
                    resumed = _resumed(config, first, then, pathlib.Path(scratch) / name)
                    results[f"resume_{name}"] = {
                        "relative_difference": _relative_difference(resumed.params, one),
                        "updates": resumed.report.updates,
                    }
            twin_one = jax.jit(make_train(config))(jax.random.key(config.seed)).params
            twin_two = jax.jit(make_train(dataclasses.replace(config, learner_device=two)))(
                jax.random.key(config.seed)).params
            results["twin_two_relative_difference"] = _relative_difference(twin_two, twin_one)
            results["twin_two_placement"] = _placement(twin_two)
        out[case] = results
    # 'cpu:all' is counted only when train() looks the devices up: 6 envs do not split over 4.
    try:
        train(_config("mlp", num_actors=3, envs_per_actor=2, learner_device=every),
              progress=False)
    except ConfigError as error:
        out["indivisible"] = str(error)
    print(json.dumps(out))


@pytest.fixture(scope="module")
def measured():
    env = dict(os.environ)
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "")
                        + f" --xla_force_host_platform_device_count={DEVICES}").strip()
    env["JAX_PLATFORMS"] = "cpu"
    env.setdefault("PPO_ASYNC_JAX_CACHE",
                   os.path.join(tempfile.gettempdir(), "ppo_async_jax_cache"))
    tests = pathlib.Path(__file__).resolve().parent
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tests), env.get("PYTHONPATH")]))
    done = subprocess.run([sys.executable, __file__], env=env, capture_output=True, text=True,
                          timeout=500)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("case", ["mlp", "gru"])
@pytest.mark.parametrize("devices", ["two", "every"])
def test_several_devices_train_the_one_device_params(measured, case, devices):
    assert measured["device_count"] == DEVICES
    assert measured[case][devices]["relative_difference"] <= TOLERANCE


@pytest.mark.parametrize("case", ["mlp", "gru"])
def test_the_batch_is_split_over_every_device_and_the_state_replicated(measured, case):
    seen = measured[case]["every"]["seen"]
    # Time-major fields split on their env axis, [B, ...] fields on their first.
    # CartPole's observations are 4 numbers; 8 envs over 4 devices are 2 per device.
    assert seen["batch_obs"] == {"devices": [0, 1, 2, 3], "specs": ["(None, 'data')"],
                                 "shard_shapes": [[8, 2, 4]], "whole": False}  # [T, B / 4, 4]
    assert seen["batch_bootstrap_obs"] == {"devices": [0, 1, 2, 3],
                                           "specs": ["('data',)"],
                                           "shard_shapes": [[2, 4]], "whole": False}
    for state in (seen["state_in"], seen["state_out"]):
        assert state["devices"] == [0, 1, 2, 3]
        # Params, optimizer state and statistics: whole on every device.
        assert state["specs"] == ["()"] and state["whole"]


def test_two_multi_device_runs_are_byte_identical(measured):
    assert measured["mlp"]["every"]["digest"] == measured["mlp"]["every_again_digest"]


@pytest.mark.parametrize("resume", ["4_to_1", "1_to_2"])
def test_a_run_resumes_on_another_device_count(measured, resume):
    resumed = measured["mlp"][f"resume_{resume}"]
    assert resumed["updates"] == 8
    assert resumed["relative_difference"] <= TOLERANCE


def test_a_device_count_known_only_at_the_start_is_checked_there(measured):
    assert measured["indivisible"].startswith("num_actors * envs_per_actor=6: learner_device="
                                              "'cpu:all' shards the update over 4 devices")


def test_the_twin_shards_its_update_the_same_way(measured):
    assert measured["mlp"]["twin_two_relative_difference"] <= TOLERANCE
    assert measured["mlp"]["twin_two_placement"]["devices"] == [0, 1]


if __name__ == "__main__":
    main()
