"""Env steps/s against envs in flight (1 to 256), per way of running the actors, with the ideal.

Runs `bench_scaling.py` (the sleep env: each step takes ``--step-ms``; each
row a fresh process, ``--seconds`` of steady updates) for each series below
at 1, 4, 16, 64 and 256 envs in flight (``N x 1`` up to 64, then 64 actors x
4 envs), and draws env steps/s against envs in flight on log-log axes beside
the ideal ``envs / step time``:

- thread actors, each stepping its own envs (``sampler="actors"``);
- thread actors, the shared sampler, the env with its own ``step_async``;
- actor processes (one per core), the shared sampler, the env with ``step_async``;
- actor processes, the shared sampler, the blocking env;
- env workers, one per thread actor (1 to 16 envs: each is a process);
- Ray actor processes (1 to 16: each imports JAX).

The figure goes to ``docs/figures/scaling.png`` (``--figure``), the rows to
``experiments/out/scaling_figure/results.json``.

    python experiments/scaling_figure.py [--step-ms 2] [--seconds 6] [--figure PATH]
"""

from __future__ import annotations

import argparse
import os
import sys

import common

ENVS_IN_FLIGHT = (1, 4, 16, 64, 256)
SERIES = (  # label, bench_scaling arguments, the largest envs in flight run
    ("threads, a thread per actor", ["--backend", "threads", "--sampler", "actors"], 256),
    ("threads, shared sampler, env with step_async",
     ["--backend", "threads", "--sampler", "shared", "--env-async"], 256),
    ("actor processes, shared sampler, env with step_async",
     ["--backend", "processes", "--sampler", "shared", "--env-async"], 256),
    ("actor processes, shared sampler, blocking env",
     ["--backend", "processes", "--sampler", "shared"], 256),
    ("env workers (a process per actor)",
     ["--backend", "threads", "--sampler", "actors", "--env-workers", "1"], 16),
    ("Ray processes", ["--backend", "ray"], 16),
)


def layout(envs: int) -> tuple[int, int]:
    """``(actors, envs per actor)`` for ``envs`` in flight: one env each up to 64 actors."""
    return (envs, 1) if envs <= 64 else (64, envs // 64)


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--step-ms", type=float, default=2.0)
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--envs", type=int, nargs="+", default=list(ENVS_IN_FLIGHT))
    parser.add_argument("--series", nargs="+", default=None,
                        help="labels of the series to run (default: all)")
    parser.add_argument("--figure", default=os.path.join(
        os.path.dirname(__file__), "..", "docs", "figures", "scaling.png"))
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    import bench_scaling

    load_before = os.getloadavg()[0]
    series = {}
    for label, options, largest in SERIES:
        if args.series and label not in args.series:
            continue
        rows = []
        for envs in (e for e in args.envs if e <= largest):
            actors, per_actor = layout(envs)
            rows += bench_scaling.main(
                ["--actors", str(actors), "--envs-per-actor", str(per_actor), "--step-ms",
                 str(args.step_ms), "--seconds", str(args.seconds), "--inference", "batched",
                 "--out", os.path.join(common.out_dir("scaling_figure", args.out), "rows"),
                 *options])["rows"]
        series[label] = [{"envs_in_flight": r["num_actors"] * r["envs_per_actor"],
                          "env_steps_per_s": r["env_steps_per_s"], "ratio": r["ratio"],
                          "rss_mb": r["rss_mb"]} for r in rows]
    plt = common.pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    envs = sorted({p["envs_in_flight"] for points in series.values() for p in points})
    ax.plot(envs, [e / (args.step_ms / 1e3) for e in envs], "k--", label="ideal")
    for label, points in series.items():
        ax.plot([p["envs_in_flight"] for p in points], [p["env_steps_per_s"] for p in points],
                "o-", label=label)
    ax.set(xscale="log", yscale="log", xlabel="envs in flight",
           ylabel="env steps/s (steady, training)",
           title=f"host env of {args.step_ms:g} ms a step, {os.cpu_count()} cores")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(args.figure, dpi=120)
    print(f"figure: {os.path.normpath(args.figure)}")
    for label, points in series.items():
        print(f"{label}: " + ", ".join(f"{p['envs_in_flight']} -> {p['ratio']:.2f}"
                                        for p in points))
    result = {"step_ms": args.step_ms, "series": series}
    common.save_with_load("scaling_figure", args.out, __file__, argv, result, load_before)
    return result


if __name__ == "__main__":
    main()
