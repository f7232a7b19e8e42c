"""Off-policy study: which correction keeps PPO's return as the policy lag grows?

Every cell trains the synchronous twin (`ppo_async.sync.make_train`) with a
simulated policy lag k: each rollout acts with the params of k updates ago,
exactly what one actor of the runtime does at ``exact_policy_lag=k``, so all
seeds of a cell run at once under ``jax.jit(jax.vmap(...))``. ``--validate``
checks it against the asynchronous runtime itself (one actor at
``exact_policy_lag=k``): the params agree byte for byte.

Variants (`VARIANTS`): the advantage estimator (GAE on the behaviour values,
or V-trace under the learner's current critic, its policy-gradient advantage
unweighted or weighted by the clipped rho as in IMPALA: ``vtrace-pgw``) x the
ratio's anchor (``ppo_ratio_anchor``: behaviour, learner, ewma). Envs: each preset of
`ppo_async.presets` with ``--total-env-steps`` (per env, `BUDGETS`).

Score of a run: the mean return of its last 100 training episodes
(`ppo_async.sync.recent_return_mean`). Per cell: the interquartile mean over
seeds with a 95% stratified-bootstrap interval (`ppo_async.runs.analysis`), and the
normalized score ``(IQM - random) / (IQM at lag 0 - random)`` against the same
variant's lag 0 and against plain PPO's (GAE, behaviour anchor) lag 0, where
``random`` is the mean return of a uniformly random policy (measured here).

The grid runs on `ppo_async.sweep` (``ppo-async sweep --twin``'s machinery):
per env and budget a sweep directory ``runs_<env>_<steps>/`` with a run
directory per cell and seed (the variants are the sweep's points, the lag its
config's ``exact_policy_lag``, at which the twin acts), trained in parallel
worker processes and resumable (finished runs are skipped).

Writes, under ``experiments/out/offpolicy_study/`` (or ``--out``):
``results.csv`` (one row per env, lag, variant and seed, rebuilt from the run
directories), ``curves.npz`` (each run's smoothed return per update), ``summary.json`` and ``summary.md`` (the IQM tables),
``return_vs_lag.png`` and ``curves_<env>.png``; with ``--validate``,
``validate.md``; with ``--stragglers``,
``stragglers.csv`` and ``stragglers.md`` (`run_stragglers`).

    python experiments/offpolicy_study.py --dry-run
    python experiments/offpolicy_study.py --envs acrobot pendulum --seeds 5
    python experiments/offpolicy_study.py --envs breakout-minatar --seeds 3 --lags 0 7 15
    python experiments/offpolicy_study.py --report-only          # tables and figures from results.csv
    python experiments/offpolicy_study.py --validate --envs acrobot --lags 7 --seeds 3
    python experiments/offpolicy_study.py --stragglers --variants vtrace+behaviour  # max_policy_lag
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import (  # noqa: E402
    append_csv_row,
    avoid_vmapped_qr_deadlock,
    configure_jax,
    machine_info,
    markdown_table,
    out_dir,
    print_reproduce,
    pyplot,
    read_csv,
    write_csv,
    write_json,
)

VARIANTS: dict[str, dict[str, Any]] = {
    "gae+behaviour": dict(use_vtrace=False, ppo_ratio_anchor="behaviour"),
    # V-trace with unweighted policy-gradient advantages q_s - V(x_s): the
    # surrogate's ratio (and the learner anchor's pi_prox / mu) weights them.
    "vtrace+behaviour": dict(use_vtrace=True, ppo_ratio_anchor="behaviour",
                             vtrace_pg_rho_bar=None),
    "vtrace+learner": dict(use_vtrace=True, ppo_ratio_anchor="learner", vtrace_pg_rho_bar=None),
    # "-pgw": IMPALA's weighted advantages min(1, rho_s) * (q_s - V(x_s));
    # with the behaviour anchor this is sample-factory's APPO.
    "vtrace-pgw+behaviour": dict(use_vtrace=True, ppo_ratio_anchor="behaviour",
                                 vtrace_pg_rho_bar=1.0),
    "vtrace-pgw+learner": dict(use_vtrace=True, ppo_ratio_anchor="learner",
                               vtrace_pg_rho_bar=1.0),
    "vtrace-pgw+ewma": dict(use_vtrace=True, ppo_ratio_anchor="ewma", vtrace_pg_rho_bar=1.0),
}
PLAIN_PPO = "gae+behaviour"
LAGS = (0, 1, 3, 7, 15)
# Env steps per run: what the 2-core CPU allows for 5 seeds x 5 lags x 4 variants.
BUDGETS = {"cartpole": 200_000, "acrobot": 300_000, "pendulum": 300_000,
           "breakout-minatar": 200_000}
FIELDS = ("env", "lag", "variant", "seed", "total_env_steps", "final_return", "nonfinite",
          "approx_kl_mean", "is_weight_mean", "clipped_rho_mean", "cell_wall_s")


def random_policy_return(preset_name: str, episodes: int = 64, seed: int = 0) -> float:
    """Mean return of uniformly random actions over ``episodes`` full episodes of the preset's env."""
    import jax
    import jax.numpy as jnp

    from ppo_async.envs.gymnax_env import BatchedEnv
    from ppo_async.presets import preset

    env = BatchedEnv(preset(preset_name).env_id, episodes)
    carry = env.reset(jax.random.key(seed))

    def step(state, key):
        env_state, returns, total, done_before = state
        action_key, step_key = jax.random.split(key)
        action = jax.vmap(lambda k: env.action_space.sample(k))(
            jax.random.split(action_key, episodes))
        _, env_state, reward, terminated, truncated, _ = env.step(step_key, env_state, action)
        returns = returns + jnp.where(done_before, 0.0, reward)
        return (env_state, returns, total, done_before | terminated | truncated), None

    init = (carry.env_state, jnp.zeros(episodes), 0.0, jnp.zeros(episodes, bool))
    (_, returns, _, done), _ = jax.lax.scan(
        step, init, jax.random.split(jax.random.key(seed + 1), env.max_episode_steps))
    assert bool(done.all()), "every random episode ends within max_episode_steps"
    return float(jnp.mean(returns))


def train_seeds(config, policy_lag: int | tuple[int, ...], seeds: int) -> list[dict[str, Any]]:
    """Train seeds ``0..seeds-1`` of ``config`` at once in the twin (`ppo_async.sync.train_seeds`);
    per seed the final return, whether anything went non-finite, and metric means."""
    import numpy as np

    from ppo_async.sync import recent_return_mean
    from ppo_async.sync import train_seeds as twin_seeds

    metrics = twin_seeds(config, list(range(seeds)), policy_lag).metrics
    return [seed_figures({k: v[i] for k, v in metrics.items()},
                         recent_return_mean({k: np.asarray(v[i]) for k, v in metrics.items()}))
            for i in range(seeds)]


def seed_figures(metrics: dict[str, Any], final_return: float) -> dict[str, Any]:
    """One seed's figures from its per-update ``metrics`` (the twin's, or a run's metrics.jsonl)."""
    import numpy as np

    nonfinite = bool(np.min(metrics["params_finite"]) < 1.0 or any(
        not np.all(np.isfinite(v)) for k, v in metrics.items() if k not in CURVE_METRICS))

    def mean_of(name):
        return float(np.mean(metrics[name])) if name in metrics else float("nan")

    return dict(
        final_return=final_return, nonfinite=int(nonfinite),
        approx_kl_mean=mean_of("approx_kl"), is_weight_mean=mean_of("is_weight_mean"),
        clipped_rho_mean=mean_of("vtrace_clipped_rho_mean"),
        # Nothing dropped where max_policy_lag is off (no such metric).
        dropped_fraction_mean=mean_of("dropped_fraction") if "dropped_fraction" in metrics
        else 0.0,
    )


# Metrics a run directory derives (NaN before the first episode or the second update).
CURVE_METRICS = ("episode_return", "wall_time_s", "env_steps_per_s_window")


def sweep_table(env: str, variants, lags, seeds: int, total_env_steps: int) -> dict[str, Any]:
    """One env's cells as a sweep (`ppo_async.sweep`): a point per variant, the lags crossed.

    A lag is the config's ``exact_policy_lag``: the sweep's twin acts at it.
    Fields left at None are the config's defaults and stay out (TOML has no null).
    """
    points = [{k: v for k, v in VARIANTS[variant].items() if v is not None}
              for variant in variants]
    return dict(preset=env, seeds=list(range(seeds)), base=dict(total_env_steps=total_env_steps),
                points=points, grid=dict(exact_policy_lag=list(lags)))


def variant_of(config) -> str:
    """The `VARIANTS` name a run's config (its config.json) belongs to."""
    from ppo_async import AsyncActorLearnerConfig

    defaults = AsyncActorLearnerConfig()
    for name, fields in VARIANTS.items():
        if all(config.get(k, getattr(defaults, k)) == v for k, v in fields.items()):
            return name
    raise ValueError(f"no variant has these fields: {config}")


def result_rows(sweep_dir, env: str) -> list[dict[str, Any]]:
    """A `FIELDS` row per finished run of one env's sweep directory, and each run's curve."""
    import numpy as np

    from ppo_async.runs.analysis import load_run

    wall = {r["run"]: r["wall_time_s"] for r in read_csv(sweep_dir / "runs.csv")}
    rows = []
    for r in read_csv(sweep_dir / "runs.csv"):
        if r["status"] != "done":
            continue
        run = load_run(sweep_dir / r["run"])
        figures = seed_figures(run.metrics, run.summary["episode_return_mean"])
        rows.append(dict(env=env, lag=run.config["exact_policy_lag"],
                         variant=variant_of(run.config), seed=run.config["seed"],
                         total_env_steps=run.config["total_env_steps"],
                         cell_wall_s=wall[r["run"]], curve=np.asarray(run.metrics["episode_return"]),
                         **{k: v for k, v in figures.items() if k in FIELDS}))
    return rows


STRAGGLER_ACTORS = 4
STRAGGLER_FIELDS = ("env", "straggler_lag", "variant", "max_policy_lag", "seed",
                    "total_env_steps", "final_return", "nonfinite", "dropped_fraction_mean")


def run_stragglers(args, out) -> None:
    """Variable lag: 3 actors at lag 1 and one straggler at lag k, with and without max_policy_lag=1.

    With one fixed lag for every sample, ``max_policy_lag`` either keeps all
    of them or drops all of them; what it is for is a batch of mixed ages,
    where it drops the straggler's stale quarter.
    """
    from ppo_async.presets import preset

    path = out / "stragglers.csv"
    done = {(r["env"], int(r["straggler_lag"]), r["variant"], r["max_policy_lag"],
             int(r["total_env_steps"])) for r in (read_csv(path) if path.exists() else [])}
    for env in args.envs:
        steps = args.total_env_steps or BUDGETS[env]
        for k in args.straggler_lags:
            for variant in args.variants:
                for cap in (None, 1):
                    if (env, k, variant, str(cap), steps) in done:
                        continue
                    base = preset(env, total_env_steps=steps, **VARIANTS[variant])
                    config = dataclasses.replace(
                        base, num_actors=STRAGGLER_ACTORS,
                        envs_per_actor=base.num_envs // STRAGGLER_ACTORS, max_policy_lag=cap)
                    lags = (1,) * (STRAGGLER_ACTORS - 1) + (k,)
                    start = time.perf_counter()
                    results = train_seeds(config, lags, args.seeds)
                    finals = [r["final_return"] for r in results]
                    for seed, r in enumerate(results):
                        append_csv_row(path, dict(
                            env=env, straggler_lag=k, variant=variant, max_policy_lag=cap,
                            seed=seed, total_env_steps=steps, final_return=r["final_return"],
                            nonfinite=r["nonfinite"],
                            dropped_fraction_mean=r["dropped_fraction_mean"],
                        ), STRAGGLER_FIELDS)
                    print(f"{env} straggler lag {k} {variant} max_policy_lag={cap}: "
                          f"{[round(f, 1) for f in finals]} ({time.perf_counter() - start:.0f} s)",
                          flush=True)


def straggler_report(out) -> str:
    """The straggler table: IQM [95% CI] with and without the cap, per env, lag and variant."""
    from ppo_async.runs.analysis import iqm, stratified_bootstrap_ci

    path = out / "stragglers.csv"
    if not path.exists():
        return ""
    groups: dict[tuple, list[float]] = {}
    for r in read_csv(path):
        groups.setdefault((r["env"], int(r["straggler_lag"]), r["variant"], r["max_policy_lag"]),
                          []).append(float(r["final_return"]))
    rows = []
    for (env, k, variant, cap), scores in sorted(groups.items()):
        est = stratified_bootstrap_ci(scores, iqm)
        rows.append([env, k, variant, cap or "None", len(scores),
                     f"{est.point:.1f} [{est.low:.1f}, {est.high:.1f}]"])
    text = ("Stragglers: 3 actors at lag 1 and one at the lag shown; max_policy_lag=1 drops "
            "the straggler's quarter of each batch.\n\n" + markdown_table(
                ["env", "straggler lag", "variant", "max_policy_lag", "seeds", "IQM [95% CI]"],
                rows))
    (out / "stragglers.md").write_text(text + "\n")
    print(text)
    return text


def validate(args) -> None:
    """The simulated lag against the asynchronous runtime itself, one actor at ``exact_policy_lag=lag``.

    Each seed runs the twin (`ppo_async.sync.make_train` with ``policy_lag=lag``,
    keyed ``jax.random.key(seed)`` as `train` keys itself) and `train` with one
    actor whose every chunk is exactly ``lag`` updates old: the two should give
    the same params, byte for byte, so the study's figures are the runtime's.
    """
    import flax.serialization
    import jax
    import numpy as np

    from ppo_async import train
    from ppo_async.presets import preset
    from ppo_async.sync import make_train, recent_return_mean

    rows = []
    for env in args.envs:
        for lag in args.lags:
            for variant in args.variants:
                steps = args.total_env_steps or BUDGETS[env]
                simulated, real, lags, identical = [], [], [], 0
                for seed in range(args.seeds):
                    base = preset(env, total_env_steps=steps, seed=seed, **VARIANTS[variant])
                    config = dataclasses.replace(base, num_actors=1, envs_per_actor=base.num_envs,
                                                 exact_policy_lag=lag)
                    twin = jax.device_get(
                        jax.jit(make_train(config, policy_lag=lag))(jax.random.key(seed)))
                    result = train(config, progress=False)
                    simulated.append(recent_return_mean(twin.metrics))
                    real.append(result.report.episode_return_mean)
                    lags.append(result.report.policy_lag_mean)
                    identical += (flax.serialization.to_bytes(twin.params)
                                  == flax.serialization.to_bytes(result.params))
                rows.append([env, lag, variant, f"{np.mean(simulated):.1f} ± {np.std(simulated):.1f}",
                             f"{np.mean(real):.1f} ± {np.std(real):.1f}", f"{np.mean(lags):.2f}",
                             f"{identical} of {args.seeds}"])
                print(rows[-1], flush=True)
    table = markdown_table(["env", "lag", "variant", "twin, simulated lag",
                            "train(), 1 actor, exact lag", "observed lag", "same params"], rows)
    print(table)
    out = out_dir("offpolicy_study", args.out) / "validate.md"
    out.write_text(table + "\n")


def report(path, out, random_returns: dict[str, float]) -> dict[str, Any]:
    """IQM tables and figures from ``results.csv``."""
    import numpy as np

    from ppo_async.runs.analysis import iqm, stratified_bootstrap_ci

    rows = read_csv(path)
    cells: dict[tuple[str, int, str], list[float]] = {}
    nonfinite: dict[tuple[str, int, str], int] = {}
    for row in rows:
        key = (row["env"], int(row["lag"]), row["variant"])
        cells.setdefault(key, []).append(float(row["final_return"]))
        nonfinite[key] = nonfinite.get(key, 0) + int(row["nonfinite"])
    envs = sorted({k[0] for k in cells}, key=list(BUDGETS).index)
    lags = sorted({k[1] for k in cells})
    variants = [v for v in VARIANTS if any(k[2] == v for k in cells)]
    summary: dict[str, Any] = {"random_return": random_returns, "cells": []}
    estimates = {}
    for key, scores in cells.items():
        scores = np.nan_to_num(np.array(scores), nan=random_returns.get(key[0], 0.0))
        estimates[key] = stratified_bootstrap_ci(scores, iqm)

    def normalized(env, value, reference):
        if reference is None:
            return float("nan")
        random = random_returns[env]
        return (value - random) / (reference - random)

    tables = []
    for env in envs:
        table = []
        for lag in sorted({k[1] for k in cells if k[0] == env}):
            line = [lag]
            for variant in variants:
                est = estimates.get((env, lag, variant))
                if est is None:
                    line.append("")
                    continue
                own = estimates.get((env, 0, variant))
                plain = estimates.get((env, 0, PLAIN_PPO))
                own_ratio = normalized(env, est.point, own.point if own else None)
                plain_ratio = normalized(env, est.point, plain.point if plain else None)
                bad = nonfinite[(env, lag, variant)]
                line.append(f"{est.point:.1f} [{est.low:.1f}, {est.high:.1f}] "
                            f"({own_ratio:.2f} / {plain_ratio:.2f})"
                            + (f" {bad} non-finite" if bad else ""))
                summary["cells"].append(dict(
                    env=env, lag=lag, variant=variant, iqm=est.point, ci=[est.low, est.high],
                    seeds=len(cells[(env, lag, variant)]), nonfinite_runs=bad,
                    normalized_own_lag0=own_ratio, normalized_plain_ppo_lag0=plain_ratio))
            table.append(line)
        seeds = max(len(cells[k]) for k in cells if k[0] == env)
        tables.append(
            f"**{env}** ({int(rows[[r['env'] for r in rows].index(env)]['total_env_steps']):,} env "
            f"steps, {seeds} seeds, random policy {random_returns[env]:.1f}); IQM [95% CI] "
            "(normalized to the variant's lag 0 / to plain PPO's lag 0):\n\n"
            + markdown_table(["lag"] + variants, table))
    text = "\n\n".join(tables)
    (out / "summary.md").write_text(text + "\n")
    print(text)

    plt = pyplot()
    fig, axes = plt.subplots(1, len(envs), figsize=(4.5 * len(envs), 3.6), squeeze=False)
    for ax, env in zip(axes[0], envs):
        for variant in variants:
            points = [(lag, estimates[(env, lag, variant)]) for lag in lags
                      if (env, lag, variant) in estimates]
            x = np.array([p[0] for p in points])
            y = np.array([p[1].point for p in points])
            err = np.array([[p[1].point - p[1].low for p in points],
                            [p[1].high - p[1].point for p in points]])
            ax.errorbar(x + 1, y, yerr=err, marker="o", capsize=3, label=variant)
        ax.axhline(random_returns[env], color="grey", linestyle=":", label="random policy")
        ax.set_xscale("log", base=2)
        ax.set_xticks([lag + 1 for lag in lags], [str(lag) for lag in lags])
        ax.set_xlabel("policy lag (updates)")
        ax.set_ylabel("final return (IQM, 95% CI)")
        ax.set_title(env)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "return_vs_lag.png", dpi=110)
    plt.close(fig)

    curves = dict(np.load(out / "curves.npz")) if (out / "curves.npz").exists() else {}
    for env in envs:
        shown = [lag for lag in (0, max(lags)) if lag in lags]
        fig, axes = plt.subplots(1, len(shown), figsize=(5 * len(shown), 3.6), squeeze=False)
        for ax, lag in zip(axes[0], shown):
            for variant in variants:
                name = f"{env}|{lag}|{variant}"
                if name not in curves:
                    continue
                runs = curves[name]  # [seeds, updates]
                steps = np.arange(1, runs.shape[1] + 1) * (
                    int(rows[[r["env"] for r in rows].index(env)]["total_env_steps"]) / runs.shape[1])
                ax.plot(steps, iqm(runs, axis=0), label=variant)
            ax.set_title(f"{env}, lag {lag}")
            ax.set_xlabel("env steps")
            ax.set_ylabel("return (IQM over seeds)")
        axes[0][0].legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out / f"curves_{env}.png", dpi=110)
        plt.close(fig)
    return summary


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", nargs="+", default=["acrobot", "pendulum"], choices=list(BUDGETS))
    parser.add_argument("--lags", nargs="+", type=int, default=list(LAGS))
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--total-env-steps", type=int, default=None,
                        help="override every env's budget (default: BUDGETS)")
    parser.add_argument("--out", default=None)
    parser.add_argument("--dry-run", action="store_true", help="list the cells and which are done")
    parser.add_argument("--report-only", action="store_true")
    parser.add_argument("--validate", action="store_true",
                        help="compare the simulated lag with train() at one actor")
    parser.add_argument("--stragglers", action="store_true",
                        help="the mixed-lag experiment for max_policy_lag (stragglers.csv)")
    parser.add_argument("--straggler-lags", nargs="+", type=int, default=[3, 7, 15])
    args = parser.parse_args(argv)
    avoid_vmapped_qr_deadlock()
    configure_jax()
    import numpy as np

    if args.validate:
        validate(args)
        return
    out = out_dir("offpolicy_study", args.out)
    if args.stragglers:
        if not args.report_only:
            run_stragglers(args, out)
        straggler_report(out)
        return
    from ppo_async.sweep.execute import execute_sweep, plan_sweep

    path = out / "results.csv"
    plans = {}
    for env in args.envs:
        steps = args.total_env_steps or BUDGETS[env]
        table = sweep_table(env, args.variants, args.lags, args.seeds, steps)
        plans[env] = (out / f"runs_{env}_{steps}", plan_sweep(table, out / f"runs_{env}_{steps}",
                                                              twin=True))
    if args.dry_run:
        for env, (_, plan) in plans.items():
            for run in plan.runs[::args.seeds]:
                cell = plan.runs[plan.runs.index(run):plan.runs.index(run) + args.seeds]
                done = all(plan.states[r.name] == "done" for r in cell)
                variant = variant_of(run.config.to_dict())
                print(f"{env:17s} lag {run.config.exact_lag:2d} {variant:17s} "
                      f"{run.config.total_env_steps:>9,} steps {'done' if done else 'todo'}")
        return
    if not args.report_only:
        print(f"machine: {machine_info()}", flush=True)
        for env, (sweep_dir, plan) in plans.items():
            todo = {(env, r.config.exact_lag, variant_of(r.config.to_dict()))
                    for r in plan.runs if plan.states[r.name] != "done"}
            if todo:
                execute_sweep(plan.spec, sweep_dir, twin=True)
            for key, cell in _cells(result_rows(sweep_dir, env)).items():
                if key in todo:
                    print(f"{env} lag {key[1]} {key[2]}: "
                          f"{[round(r['final_return'], 1) for r in cell]} "
                          f"({float(cell[0]['cell_wall_s']):.0f} s)", flush=True)
    rows = [row for sweep_dir in sorted(out.glob("runs_*"))
            for row in result_rows(sweep_dir, sweep_dir.name.split("_")[1])]
    write_csv(path, [{k: row[k] for k in FIELDS} for row in rows], FIELDS)
    np.savez(out / "curves.npz", **{f"{env}|{lag}|{variant}": np.stack([r["curve"] for r in cell])
                                    for (env, lag, variant), cell in _cells(rows).items()})
    envs_done = sorted({r["env"] for r in read_csv(path)}, key=list(BUDGETS).index)
    random_returns = {env: random_policy_return(env) for env in envs_done}
    summary = report(path, out, random_returns)
    summary["machine"] = machine_info()
    summary["command"] = print_reproduce(__file__, argv)
    write_json(out / "summary.json", summary)


def _cells(rows: list[dict[str, Any]]) -> dict[tuple, list[dict[str, Any]]]:
    """Rows grouped by (env, lag, variant), seeds in order."""
    cells: dict[tuple, list[dict[str, Any]]] = {}
    for row in sorted(rows, key=lambda r: r["seed"]):
        cells.setdefault((row["env"], row["lag"], row["variant"]), []).append(row)
    return cells


if __name__ == "__main__":
    main()
