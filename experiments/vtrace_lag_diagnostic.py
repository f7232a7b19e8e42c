"""Why does V-trace lose return as policy lag grows (``sweep_staleness.py``)?

One actor x 8 envs on CartPole-v1, 200k env steps, the sweep's config. Four
variants, each for ``--seeds`` seeds:

- V-trace off at lead 8 chunks (lag 7): PPO's ratio against the behaviour policy;
- V-trace on at lead 8, with the default truncation (rho_bar = c_bar = 1);
- V-trace on at lead 8 with truncation switched off (rho_bar = c_bar = 1e3);
- V-trace on at lead 2 (lag 1).

Per run: the final return, and the means over updates of
``vtrace_clipped_rho_mean`` (how much the truncation cuts), ``approx_kl`` and
``clip_fraction``. If truncation were what hurts, its mean clipped rho would
be well below 1 and switching it off would recover the return.

    python experiments/vtrace_lag_diagnostic.py [--seeds 2]
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import configure_jax, save_result  # noqa: E402

NUM_STEPS = 64
VARIANTS = {
    "off, lead 8": dict(use_vtrace=False, max_lead_steps=8 * NUM_STEPS),
    "on, lead 8": dict(use_vtrace=True, max_lead_steps=8 * NUM_STEPS),
    "on, lead 8, no truncation": dict(
        use_vtrace=True, max_lead_steps=8 * NUM_STEPS, vtrace_rho_bar=1e3, vtrace_c_bar=1e3
    ),
    "on, lead 2": dict(use_vtrace=True, max_lead_steps=2 * NUM_STEPS),
}


def _mean(values: list[float]) -> float:
    return statistics.mean(values) if values else math.nan


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=2, help="seeds 0..N-1 per variant")
    parser.add_argument("--total-env-steps", type=int, default=200_000)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    configure_jax()

    from ppo_async import AsyncActorLearnerConfig, train

    base = AsyncActorLearnerConfig(
        num_actors=1, envs_per_actor=8, num_steps=NUM_STEPS,
        total_env_steps=args.total_env_steps,
    )
    rows = []
    for name, fields in VARIANTS.items():
        for seed in range(args.seeds):
            metrics: list[dict[str, float]] = []
            config = dataclasses.replace(base, seed=seed, **fields)
            report = train(config, progress=False, on_update=metrics.append).report
            row = {
                "variant": name, "seed": seed, "final_return": report.episode_return_mean,
                "policy_lag_mean": report.policy_lag_mean,
                "clipped_rho_mean": _mean([
                    m["vtrace_clipped_rho_mean"] for m in metrics
                    if "vtrace_clipped_rho_mean" in m
                ]),
                "approx_kl_mean": _mean([m["approx_kl"] for m in metrics]),
                "clip_fraction_mean": _mean([m["clip_fraction"] for m in metrics]),
            }
            rows.append(row)
            print(f"{name:27s} seed {seed}: return {row['final_return']:6.1f}, lag "
                  f"{row['policy_lag_mean']:.2f}, clipped rho {row['clipped_rho_mean']:.3f}, "
                  f"approx_kl {row['approx_kl_mean']:.4f}, "
                  f"clip fraction {row['clip_fraction_mean']:.3f}", flush=True)

    result = {"rows": rows, "config": base.to_dict()}
    save_result("vtrace_lag_diagnostic", args.out, __file__, argv, result)
    return result


if __name__ == "__main__":
    main()
