"""The spread over reruns of the suite's timing-dependent learning runs.

The asynchronous learning tests (their configs are in ``tests/timing_cases.py``)
each see one draw of thread timing. This script reruns each config
``--reruns`` times in this process, records the final return (mean of the
last 100 episodes) and the policy lag of every rerun, and writes them with
their minimum, median and maximum, so that each test's bound can be checked
against what the runs actually do. Writes ``results.json``, ``runs.csv`` and
``spread.png`` under ``experiments/out/timing_spread/``.

    python experiments/timing_spread.py --reruns 10
    python experiments/timing_spread.py --reruns 10 --cases gymnasium_cartpole
    python experiments/timing_spread.py --reruns 1 --seeds 0 1 2 3 --cases gymnasium_cartpole

A config at an exact policy lag (the default) gives the same run every time:
its spread is over seeds (``--seeds``: each rerun of each seed, the config's
``seed`` replaced). Each row also records where the running mean first
reached 475 (``solved_at``, an update) and its lowest value over the
``HOLD_UPDATES`` updates that follow (``hold_min``), what the CartPole tests
assert.
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
import statistics
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "tests"))

from common import configure_jax, out_dir, save_result, write_csv  # noqa: E402

SOLVED = 475.0  # CartPole's running mean of 100 episodes counted as solved
HOLD_UPDATES = 100  # after SOLVED, the updates whose lowest running mean is recorded

# case -> (config names in tests/timing_cases.py, the test, its asserted bound on the return)
CASES = {
    "default_cartpole": (("DEFAULT_CARTPOLE",),
                         "tests/test_learning.py::test_default_config_solves_cartpole"),
    "vtrace_long_lead": (("VTRACE_LONG_LEAD",),
                         "tests/test_learning.py::test_vtrace_with_four_actors_and_a_long_lead_learns_cartpole"),
    "gymnasium_cartpole": (("GYMNASIUM_CARTPOLE",),
                           "tests/envs/test_host_envs.py::test_gymnasium_cartpole_learns_through_train"),
    "ray_cartpole": (("RAY_CARTPOLE",),
                     "tests/runtime/test_ray.py::test_two_ray_actors_learn_cartpole_with_the_lag_bound"),
    "memory_chain": (("MEMORY_CHAIN_LSTM", "MEMORY_CHAIN"),
                     "tests/networks/test_recurrent.py::test_an_asynchronous_lstm_remembers_what_the_mlp_cannot"),
}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reruns", type=int, default=10)
    parser.add_argument("--cases", nargs="+", choices=sorted(CASES), default=list(CASES))
    parser.add_argument("--seeds", type=int, nargs="+", default=None,
                        help="run each config with these seeds (default: its own)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    if args.reruns < 1:
        parser.error("--reruns must be >= 1")
    if args.seeds is not None and min(args.seeds) < 0:
        parser.error("--seeds must be >= 0")
    configure_jax()
    import os

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # private local Ray instances only
    from ppo_async import train

    import timing_cases

    rows = []
    for case in args.cases:
        names, test = CASES[case]
        for rerun in range(args.reruns):
            for name, seed in ((n, s) for n in names for s in args.seeds or [None]):
                config = getattr(timing_cases, name)
                if seed is not None:
                    config = dataclasses.replace(config, seed=seed)
                start = time.perf_counter()
                running_means = []  # each update's mean return of the last 100 episodes
                report = train(config, progress=False,
                               on_update=lambda m: running_means.append(m["episode_return"])).report
                solved_at = next((i for i, mean in enumerate(running_means) if mean >= SOLVED),
                                 None)
                row = {
                    "case": case, "config": name, "seed": config.seed, "rerun": rerun,
                    "episode_return_mean": report.episode_return_mean,
                    "best_running_mean": max(running_means),
                    "solved_at": solved_at,
                    "hold_min": (None if solved_at is None else
                                 min(running_means[solved_at:solved_at + HOLD_UPDATES + 1])),
                    "policy_lag_mean": report.policy_lag_mean,
                    "policy_lag_max": report.policy_lag_max,
                    "wall_s": time.perf_counter() - start,
                    "load_average_1min": os.getloadavg()[0],
                }
                rows.append(row)
                held = ("never reached 475" if solved_at is None else
                        f"475 at update {solved_at}, then >= {row['hold_min']:.2f}")
                print(f"{case} {name} seed {config.seed} rerun {rerun}: return "
                      f"{row['episode_return_mean']:.2f} (best {row['best_running_mean']:.2f}; "
                      f"{held}), "
                      f"lag mean {row['policy_lag_mean']:.2f} max {row['policy_lag_max']}, "
                      f"{row['wall_s']:.1f} s, load {row['load_average_1min']:.1f}", flush=True)
    summary = _summarize(rows)
    out = out_dir("timing_spread", args.out)
    write_csv(out / "runs.csv", rows, list(rows[0]))
    _plot(rows, out / "spread.png")
    save_result("timing_spread", args.out, __file__, sys.argv[1:] if argv is None else argv,
                {"tests": {case: CASES[case][1] for case in args.cases},
                 "summary": summary, "runs": rows})
    for key, figures in summary.items():
        print(f"{key:40s} return min {figures['return_min']:.2f} median "
              f"{figures['return_median']:.2f} max {figures['return_max']:.2f}; lag max "
              f"{figures['lag_max_min']}-{figures['lag_max_max']} ({figures['reruns']} reruns)")
    return summary


def _summarize(rows: list[dict]) -> dict:
    summary = {}
    for key in dict.fromkeys((row["case"], row["config"]) for row in rows):
        returns = [row["episode_return_mean"] for row in rows if (row["case"], row["config"]) == key]
        best = [row["best_running_mean"] for row in rows if (row["case"], row["config"]) == key]
        lags = [row["policy_lag_max"] for row in rows if (row["case"], row["config"]) == key]
        summary[f"{key[0]}/{key[1]}"] = {"reruns": len(returns), "return_min": min(returns),
                        "return_median": statistics.median(returns), "return_max": max(returns),
                        "best_running_mean_min": min(best),
                        "lag_max_min": min(lags), "lag_max_max": max(lags)}
    return summary


def _plot(rows: list[dict], path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = list(dict.fromkeys((row["case"], row["config"]) for row in rows))
    fig, axes = plt.subplots(1, len(keys), figsize=(2.6 * len(keys), 3.2), squeeze=False)
    for ax, key in zip(axes[0], keys):
        returns = [row["episode_return_mean"] for row in rows if (row["case"], row["config"]) == key]
        ax.plot([0] * len(returns), returns, "o", alpha=0.6)
        ax.set_title(f"{key[1]}", fontsize=8)
        ax.set_xticks([])
        ax.set_ylabel("final return (last 100 episodes)")
    fig.suptitle("final return over reruns of one seed (thread timing only)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    main()
