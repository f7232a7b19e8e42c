"""Run the runtime's ``hopper`` / ``walker2d`` preset (in the project's venv).

    .venv/bin/python experiments/peers/run_ppo_async.py --result R.json \\
        --env Hopper-v5 --seed 0 --total-env-steps 1000000 --torch-threads default

``ppo_async.presets.preset(NAME, seed=SEED, total_env_steps=N)`` as it is
(cleanrl's settings on ``gymnasium:NAME-v5``: 2 actor processes x 4 envs x 256
steps, 10 epochs x 32 minibatches), trained by `ppo_async.train`. Marks: the
``on_update`` calls (``metrics["env_steps"]``), only the last of each program
call where the learner's program collects the chunks (`common.last_mark_of_each_call`).
The return: ``report.episode_return_mean`` (the last 100 training episodes).

``--torch-threads 1`` has no torch to set: run_peers.py gives this process XLA's
single-threaded CPU ops instead (``XLA_FLAGS=--xla_cpu_multi_thread_eigen=false``,
bench_throughput's ``async-1t``), which the actor processes inherit.
"""

from __future__ import annotations

import os
import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]
import child  # noqa: E402
import common  # noqa: E402

PACKAGES = ("ppo-async", "jax", "jaxlib", "gymnasium", "mujoco", "numpy")
PRESETS = {"Hopper-v5": "hopper", "Walker2d-v5": "walker2d"}


def main(argv=None) -> None:
    args = child.parse_args(argv)
    recorder = child.Recorder()
    common.configure_jax()
    from ppo_async import train
    from ppo_async.presets import preset

    config = preset(PRESETS[args.env], seed=args.seed, total_env_steps=args.total_env_steps)
    result = train(config, progress=False,
                   on_update=lambda metrics: recorder.mark(metrics["env_steps"]))
    if common.collects_in_learner(config):
        recorder.marks = common.last_mark_of_each_call(recorder.marks)
    report = result.report
    child.write_result(args.result, recorder.result(
        "ppo_async", PACKAGES, final_return=report.episode_return_mean,
        episodes=report.episodes, xla_flags=os.environ.get("XLA_FLAGS", ""),
        layout=report.layout, policy_lag_mean=report.policy_lag_mean))


if __name__ == "__main__":
    main()
