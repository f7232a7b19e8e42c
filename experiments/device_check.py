"""Accelerator check: the learner on one GPU or several, the actors on the CPU.

When GPUs are present this

1. times one learner update of the MinAtar-sized conv network
   (Breakout-MinAtar, the default PPO batch) on the CPU and on the GPU, on the
   same batch, and prints the GPU/CPU ratio of update time;
2. measures learner updates/s on 1, 2, 4, ... and all visible GPUs
   (``learner_device='gpu:0,gpu:1,...'``: the update data-parallel over a
   mesh) for the MinAtar conv network and the Nature CNN (84x84x4 frames) at
   two batch sizes each, on synthetic batches of the real shapes, and the
   speed-up over one GPU;
3. runs a short `ppo_async.train` with ``learner_device='gpu:0'`` and
   ``actor_device='cpu'`` (bounded by ``--seconds``) and prints learner
   updates/s and env steps/s.

Without a GPU, on a host with several CPU devices (forced with
``XLA_FLAGS=--xla_force_host_platform_device_count=N``) it checks agreement
only: the params after a few updates on one CPU device and on all of them.
Those devices share the same cores, so no speed-up is expected there and
none is measured (``--time-cpu`` times them anyway, to exercise the timing
code). On a host with one CPU device and no GPU it says so and exits 0.
Designed to stay well under 5 minutes of GPU time.

    python experiments/device_check.py [--seconds 120]
    XLA_FLAGS=--xla_force_host_platform_device_count=4 python experiments/device_check.py
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import types

import common

# (name, observation shape, actions, torso); batch sizes as (envs, steps) pairs.
NETWORKS = (("minatar-conv", (10, 10, 4), 3, "minatar"), ("nature-cnn", (84, 84, 4), 6, "nature"))
BATCHES = ((16, 64), (64, 128))


def _gpu_devices():
    import jax

    try:
        return jax.devices("gpu")
    except RuntimeError:
        return []


def _update_time(config, device, repeats: int) -> float:
    """Median seconds of one jitted learner update on ``device`` (compile excluded)."""
    import jax

    from ppo_async.core.update import init_learner_state, make_update_fn

    program, params, host_batch = common.one_real_batch(config)
    batch = jax.device_put(host_batch, device)
    state = jax.device_put(
        init_learner_state(config.update_options(), params, jax.random.key(1)), device)
    update = make_update_fn(config.update_options(), program.network)
    jax.block_until_ready(update(state, batch))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(update(state, batch))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _synthetic_case(obs_shape, num_actions: int, torso: str, envs: int, steps: int):
    """``(config, network, params, host batch)``: a feed-forward batch of the real shapes.

    Random observations and actions, uniform behaviour log-probs: what the
    update costs depends on the shapes alone, so no env has to run.
    """
    import jax
    import numpy as np

    from ppo_async import AsyncActorLearnerConfig
    from ppo_async.core.update import Batch
    from ppo_async.networks.actor_critic import init_params, make_network

    config = AsyncActorLearnerConfig(env_id="Breakout-MinAtar", num_actors=1, envs_per_actor=envs,
                                     num_steps=steps, total_env_steps=envs * steps * 100)
    network = make_network(obs_shape, types.SimpleNamespace(n=num_actions),
                           config.hidden_sizes, torso=torso)
    params = init_params(network, jax.random.key(0), obs_shape)
    rng = np.random.default_rng(0)
    dtype = np.uint8 if torso == "nature" else np.float32
    obs = rng.integers(0, 255 if torso == "nature" else 2, (steps + 1, envs, *obs_shape))
    batch = Batch(
        obs=obs[:-1].astype(dtype),
        action=rng.integers(0, num_actions, (steps, envs)).astype(np.int32),
        reward=rng.normal(size=(steps, envs)).astype(np.float32),
        done=rng.random((steps, envs)) < 0.01,
        behaviour_logp=np.full((steps, envs), -np.log(num_actions), np.float32),
        behaviour_value=np.zeros((steps, envs), np.float32),
        bootstrap_obs=obs[-1].astype(dtype),
        bootstrap_value=np.zeros((envs,), np.float32),
    )
    return config, network, params, batch


def _run_updates(case, devices, updates: int, timed: bool = True):
    """``(updates/s, final params)`` of ``updates`` updates on ``devices`` (compile excluded)."""
    import jax

    from ppo_async.core.devices import LearnerPlacement
    from ppo_async.core.update import init_learner_state, make_update_fn

    config, network, params, host_batch = case
    placement = LearnerPlacement(devices)
    update = make_update_fn(config.update_options(), network, mesh=placement.mesh)
    state = placement.put_state(
        init_learner_state(config.update_options(), params, jax.random.key(1)))
    batch = placement.put_batch(host_batch)
    jax.block_until_ready(update(state, batch))  # compiles
    start = time.perf_counter()
    for _ in range(updates):
        state, _ = update(state, batch)
    jax.block_until_ready(state)
    elapsed = time.perf_counter() - start
    return (updates / elapsed if timed else None), jax.device_get(state.params)


def _envs_by_steps(text: str) -> tuple[int, int]:
    envs, _, steps = text.partition("x")
    if not (envs.isdigit() and steps.isdigit() and int(envs) and int(steps)):
        raise argparse.ArgumentTypeError(f"{text!r}: give ENVSxSTEPS, e.g. 16x64")
    return int(envs), int(steps)


def _device_counts(available: int) -> list[int]:
    counts = [n for n in (1, 2, 4, 8, 16) if n < available]
    return counts + [available]


def _scaling(devices, updates: int, batches=BATCHES) -> list[dict]:
    """Updates/s on the first 1, 2, 4, ... and all ``devices``, per network and batch."""
    rows = []
    for name, obs_shape, actions, torso in NETWORKS:
        for envs, steps in batches:
            case = _synthetic_case(obs_shape, actions, torso, envs, steps)
            base = None
            for count in _device_counts(len(devices)):
                if envs % count or case[0].minibatch_size % count:
                    continue  # this batch does not split over this many devices
                rate, _ = _run_updates(case, devices[:count], updates)
                base = rate if count == 1 else base
                row = {"network": name, "batch": envs * steps, "devices": count,
                       "updates_per_s": rate, "speed_up": rate / base}
                rows.append(row)
                print(f"{name:>12} batch {envs * steps:>6}  {count:>2} device(s): "
                      f"{rate:8.2f} updates/s  x{rate / base:.2f}")
    return rows


def _agreement(devices, updates: int = 4) -> float:
    """Max relative params difference after ``updates`` updates: all ``devices`` against one."""
    import jax
    import numpy as np

    case = _synthetic_case((10, 10, 4), 3, "minatar", 4 * len(devices), 16)
    _, one = _run_updates(case, devices[:1], updates, timed=False)
    _, every = _run_updates(case, devices, updates, timed=False)
    return max(float(np.max(np.abs(a - b)) / max(float(np.max(np.abs(b))), 1e-12))
               for a, b in zip(jax.tree.leaves(every), jax.tree.leaves(one)))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=120.0,
                        help="wall-clock bound of the training run")
    parser.add_argument("--env-id", default="Breakout-MinAtar")
    parser.add_argument("--updates", type=int, default=20,
                        help="timed updates per device count in the scaling table")
    parser.add_argument("--time-cpu", action="store_true",
                        help="without a GPU, also time the forced CPU devices (no speed-up expected)")
    parser.add_argument("--batch", action="append", type=_envs_by_steps, default=None,
                        metavar="ENVSxSTEPS",
                        help=f"a batch of the scaling table (repeatable; default: "
                             f"{' '.join(f'{e}x{t}' for e, t in BATCHES)})")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    args.batch = tuple(args.batch or BATCHES)

    import jax

    gpus = _gpu_devices()
    if not gpus:
        return _without_gpu(args, argv)

    from ppo_async import AsyncActorLearnerConfig, StopTraining, train

    config = AsyncActorLearnerConfig(
        env_id=args.env_id, num_actors=2, envs_per_actor=8, num_steps=64,
        total_env_steps=50_000_000, learner_device="gpu:0", actor_device="cpu",
    )
    cpu_s = _update_time(config, jax.devices("cpu")[0], repeats=5)
    gpu_s = _update_time(config, gpus[0], repeats=20)
    print(f"one learner update ({args.env_id}, batch {config.batch_size}): "
          f"CPU {cpu_s * 1e3:.1f} ms, GPU {gpu_s * 1e3:.1f} ms, GPU/CPU {gpu_s / cpu_s:.3f}")

    scaling = _scaling(gpus, args.updates, args.batch) if len(gpus) > 1 else []
    start = time.perf_counter()

    def bounded(metrics):
        if time.perf_counter() - start > args.seconds:
            raise StopTraining

    result = train(config, progress=False, on_update=bounded)
    report = result.report
    updates_per_s = report.updates / report.wall_time_s
    print(f"train with learner on {gpus[0]} and actors on cpu: {report.updates} updates in "
          f"{report.wall_time_s:.1f} s ({updates_per_s:.2f} updates/s, "
          f"{report.env_steps_per_s:,.0f} env steps/s), learner idle "
          f"{report.learner_wait_s / report.wall_time_s:.0%}, return "
          f"{report.episode_return_mean:.2f}")
    summary = {
        "env_id": args.env_id, "gpu": str(gpus[0]), "update_cpu_s": cpu_s,
        "update_gpu_s": gpu_s, "gpu_over_cpu": gpu_s / cpu_s, "updates": report.updates,
        "updates_per_s": updates_per_s, "env_steps_per_s": report.env_steps_per_s,
        "learner_idle_fraction": report.learner_wait_s / report.wall_time_s,
        "gpus": len(gpus), "scaling": scaling,
    }
    common.save_result("device_check", args.out, __file__, argv, summary, "summary.json")
    return 0


def _without_gpu(args, argv) -> int:
    """Agreement over forced host CPU devices (timed only with ``--time-cpu``); else nothing."""
    import jax

    cpus = jax.devices("cpu")
    if len(cpus) == 1:
        print(f"no GPU on this machine (JAX backend: {jax.default_backend()}); nothing to check "
              "(XLA_FLAGS=--xla_force_host_platform_device_count=N checks N CPU devices agree)")
        return 0
    print(f"no GPU on this machine; {len(cpus)} forced host CPU devices share its cores, so no "
          "speed-up is expected from them: checking agreement only")
    difference = _agreement(cpus)
    print(f"params after 4 updates on {len(cpus)} CPU devices against 1: max relative "
          f"difference {difference:.2e}")
    summary = {"cpu_devices": len(cpus), "relative_difference": difference,
               "scaling": _scaling(cpus, args.updates, args.batch) if args.time_cpu else []}
    common.save_result("device_check", args.out, __file__, argv, summary, "summary.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
