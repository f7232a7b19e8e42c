"""Milliseconds per video frame of ``ppo-async enjoy`` on gymnax classic-control envs.

For each env, steps one gymnax env ``--frames`` times with random actions,
then draws the same states two ways in this process, alternating, and reports
the median of ``--repeats`` timings of each:

- ``enjoy``: what ``ppo-async enjoy`` runs (`ppo_async.tools.video`'s player: one
  gymnasium env kept open, fed each gymnax state);
- ``gymnax``: gymnax's own per-frame adapter,
  ``gymnax.visualize.vis_gym.render_gym_frame`` (makes, renders and closes a
  gymnasium env for every frame), the baseline.

Without a display it uses the headless backends that ``enjoy`` picks. Writes
``results.json`` under ``experiments/out/bench_render/``.

    python experiments/bench_render.py
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from common import save_result  # noqa: E402

ENVS = ("CartPole-v1", "Acrobot-v1", "Pendulum-v1", "MountainCar-v0",
        "MountainCarContinuous-v0")


def _states(env_id: str, frames: int):
    import numpy as np

    from ppo_async import AsyncActorLearnerConfig
    from ppo_async.envs.registry import env_backend

    config = AsyncActorLearnerConfig(env_id=env_id, num_actors=1, envs_per_actor=1,
                                     num_minibatches=1)
    player = env_backend(env_id).player(config, seed=0)
    player.reset(0)
    rng = np.random.default_rng(0)
    space, continuous = player.env.action_space, player.env.continuous
    states = []
    for _ in range(frames):
        states.append(player.snapshot())
        if continuous:
            action = rng.uniform(space.low, space.high, size=(1, *space.shape)).astype(np.float32)
        else:
            action = rng.integers(space.n, size=(1,)).astype(np.int32)
        player.step(action)
    return player, states


def _time_ms_per_frame(draw, frames: int) -> float:
    start = time.perf_counter()
    draw()
    return 1000 * (time.perf_counter() - start) / frames


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frames", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--envs", nargs="+", default=list(ENVS))
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    if args.frames < 1 or args.repeats < 1:
        parser.error("--frames and --repeats must be >= 1")
    from ppo_async.tools.video import use_headless_backends

    use_headless_backends()
    import jax
    from gymnax.visualize.vis_gym import render_gym_frame

    results = {}
    for env_id in args.envs:
        player, states = _states(env_id, args.frames)
        host_states = jax.device_get(states)
        name, env_params = player.env.env.name, player.env.env_params
        player.draw(states[:1])  # the kept env is made once, outside the timing
        enjoy, gymnax = [], []
        for _ in range(args.repeats):
            enjoy.append(_time_ms_per_frame(lambda: player.draw(states),
                                            args.frames))
            gymnax.append(_time_ms_per_frame(
                lambda: [render_gym_frame(name, state, env_params) for state in host_states],
                args.frames))
        player.close()
        results[env_id] = {"enjoy_ms_per_frame": statistics.median(enjoy),
                           "gymnax_ms_per_frame": statistics.median(gymnax)}
        results[env_id]["speed_up"] = (results[env_id]["gymnax_ms_per_frame"]
                                       / results[env_id]["enjoy_ms_per_frame"])
        print(f"{env_id:26s} enjoy {results[env_id]['enjoy_ms_per_frame']:6.1f} ms/frame, "
              f"gymnax's adapter {results[env_id]['gymnax_ms_per_frame']:6.1f} ms/frame "
              f"({results[env_id]['speed_up']:.0f}x)", flush=True)
    save_result("bench_render", args.out, __file__, sys.argv[1:] if argv is None else argv,
                {"frames": args.frames, "repeats": args.repeats, "envs": results})
    return results


if __name__ == "__main__":
    main()
