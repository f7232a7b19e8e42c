"""Recurrent policies: learning on a memory task and on CartPole, and what the recurrence costs.

Learning. For each env in ``ENV_CONFIGS``, each network (``mlp``, ``lstm``,
``gru``) and each seed: one asynchronous run (``ppo_async.train``, default
topology: 2 actor threads, a valve of two chunks, so policy lag up to 1) and
the synchronous twin (``ppo_async.sync.make_train``, all seeds at once under
``jax.jit(jax.vmap(...))``), at equal env steps and hyperparameters. Final
return: mean of the last 100 training episodes (as in
``experiments/learning_results.py``), mean ± std over seeds.

- ``MemoryChain-bsuite`` (gymnax's bsuite port, memory_length 5): a context bit
  is shown at the first two steps of a 6-step episode and must be repeated at
  the last one for +1 (else -1). A memoryless policy averages 0; the optimum is 1.
- ``CartPole-v1``: fully observed; a recurrent policy should not be worse.

Cost. On CartPole with the default topology (2 actors x 4 envs x 64 steps,
4 epochs x 4 minibatches), per network: the actor's rollout of one chunk
(jitted, fixed params, this thread alone), the learner's update of one batch,
and inside it the forward pass over the batch the update starts with (the
V-trace re-evaluation: a per-step ``lax.scan`` for a recurrent network, one
batched call for the MLP) and that pass with its gradient (what the epochs
repeat, minibatch by minibatch). Each as ms and as env steps/s; medians of
``--cost-reps`` calls after a compiling one. Plus the end-to-end env steps/s of
the async runs above. The machine is shared: the load average is recorded.

Writes, under ``experiments/out/recurrent_results/`` (or ``--out``):
``results.csv`` (env, network, mode, seed, final return, wall time, lag),
``curves_<env>.csv`` / ``.png``, ``cost.csv``, ``results.json`` (summary,
machine, command), and prints markdown tables for docs/results.md.

    python experiments/recurrent_results.py                       # 3 seeds, both envs, ~25 min on 2 cores
    python experiments/recurrent_results.py --envs MemoryChain-bsuite --seeds 2
    python experiments/recurrent_results.py --budget-scale 0.01 --seeds 1 --cost-reps 2   # smoke run
    python experiments/recurrent_results.py --cost-only --cost-reps 50                    # the cost table alone, ~1 min
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import (  # noqa: E402
    MIN_EPISODES,
    avoid_vmapped_qr_deadlock,
    check_seeds_and_budget,
    configure_jax,
    format_mean_std,
    markdown_table,
    mean_std,
    one_real_batch,
    out_dir,
    pyplot,
    reproduce_command,
    save_result,
    write_csv,
)

# Before anything starts JAX's CPU backend (importing ppo_async does).
avoid_vmapped_qr_deadlock()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from ppo_async import AsyncActorLearnerConfig, train  # noqa: E402
from ppo_async.core.update import init_learner_state, make_update_fn, reevaluate_recurrent
from ppo_async.networks.actor_critic import init_params, is_recurrent  # noqa: E402
from ppo_async.sync import make_train, recent_return_mean  # noqa: E402

NETWORKS = ("mlp", "lstm", "gru")
MODES = ("async", "sync")
RNN_HIDDEN_SIZE = 64  # the cell's width in every run here (the config default is 128)
# Budgets sized for a shared 2-core CPU. MemoryChain: 8 envs x 32 steps per
# update; its episodes are 6 steps, so 50k steps hold ~8k episodes. CartPole:
# the default topology, 150k steps (the feed-forward default needs ~300-500k
# to solve it; this budget compares networks, it does not solve the task).
ENV_CONFIGS: dict[str, dict[str, Any]] = {
    "MemoryChain-bsuite": dict(total_env_steps=50_000, num_steps=32),
    "CartPole-v1": dict(total_env_steps=150_000),
}
RESULT_FIELDS = ("env_id", "network", "mode", "seed", "env_steps", "final_return",
                 "wall_time_s", "env_steps_per_s", "policy_lag_mean", "policy_lag_max")
CURVE_FIELDS = ("network", "mode", "seed", "env_steps", "episode_return")
COST_FIELDS = ("network", "rollout_ms_per_chunk", "actor_env_steps_per_s",
               "update_ms_per_batch", "learner_env_steps_per_s", "forward_ms_per_batch",
               "forward_backward_ms_per_batch", "forward_backward_ms_per_minibatch",
               "minibatch_steps_share_of_update")


def make_config(env_id: str, network: str, seed: int, budget_scale: float):
    fields = dict(ENV_CONFIGS[env_id])
    base = AsyncActorLearnerConfig(
        env_id=env_id, network=network, rnn_hidden_size=RNN_HIDDEN_SIZE, seed=seed,
        **{k: v for k, v in fields.items() if k != "total_env_steps"},
    )
    total = max(2 * base.batch_size, int(fields["total_env_steps"] * budget_scale))
    return dataclasses.replace(base, total_env_steps=total)


def run_async(config) -> tuple[dict[str, Any], list[tuple[int, float]]]:
    curve: list[tuple[int, float]] = []
    start = time.perf_counter()
    report = train(config, progress=False, on_update=lambda m: curve.append(
        (int(m["env_steps"]), float(m["episode_return"])))).report
    return dict(
        final_return=report.episode_return_mean, env_steps=report.env_steps,
        wall_time_s=round(time.perf_counter() - start, 2),
        env_steps_per_s=round(report.env_steps_per_s, 1),
        policy_lag_mean=round(report.policy_lag_mean, 4), policy_lag_max=report.policy_lag_max,
    ), curve


def run_sync(config, seeds: list[int]):
    keys = jax.vmap(jax.random.key)(jnp.asarray(seeds))
    start = time.perf_counter()
    metrics = jax.device_get(jax.jit(jax.vmap(make_train(config)))(keys).metrics)
    wall = time.perf_counter() - start
    rows, curves = [], []
    for i in range(len(seeds)):
        m = {k: np.asarray(v[i]) for k, v in metrics.items()}
        rows.append(dict(
            final_return=recent_return_mean(m, MIN_EPISODES),
            env_steps=config.num_updates * config.batch_size, wall_time_s=round(wall, 2),
            env_steps_per_s=round(len(seeds) * config.num_updates * config.batch_size / wall, 1),
            policy_lag_mean=0.0, policy_lag_max=0,
        ))
        curves.append([
            ((u + 1) * config.batch_size,
             recent_return_mean({k: v[: u + 1] for k, v in m.items()}, MIN_EPISODES))
            for u in range(config.num_updates)
        ])
    return rows, curves


def envs_axis_slice(field: str, envs: int):
    """The first ``envs`` envs of a `Batch` field (``[B, ...]`` or ``[T, B, ...]``)."""
    if field in ("bootstrap_obs", "bootstrap_value", "initial_hidden", "policy_lag"):
        return np.s_[:envs]
    return np.s_[:, :envs]


def _median_ms(fn, reps: int) -> float:
    jax.block_until_ready(fn())  # compiles
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def measure_cost(network: str, reps: int) -> dict[str, Any]:
    """Actor chunk, learner update and the update's forward pass for one network on CartPole."""
    config = dataclasses.replace(
        AsyncActorLearnerConfig(network=network, rnn_hidden_size=RNN_HIDDEN_SIZE),
        use_vtrace=True,  # so the update re-evaluates the batch (the re-unroll)
    )
    program, params, batch = one_real_batch(config)
    cpu = jax.devices("cpu")[0]
    params = init_params(program.network, jax.random.key(0), program.observation_shape)
    carry = program.reset(jax.random.key(1), cpu)
    rollout_ms = _median_ms(lambda: program.rollout(params, carry)[1], reps)
    update = make_update_fn(config.update_options(), program.network)
    state = jax.device_put(init_learner_state(config.update_options(), params, jax.random.key(2)))
    batch = jax.device_put(batch, cpu)
    update_ms = _median_ms(lambda: update(state, batch)[1], reps)
    if is_recurrent(program.network):
        forward = jax.jit(lambda p, b: reevaluate_recurrent(program.network, p, b))
    else:
        forward = jax.jit(lambda p, b: program.network.apply(p, b.obs))
    forward_ms = _median_ms(lambda: forward(params, batch), reps)
    # The same pass with its gradient: what each minibatch step of the update runs.
    if is_recurrent(program.network):
        def total_logp(p):
            return reevaluate_recurrent(program.network, p, batch)[0].sum()
    else:
        def total_logp(p):
            return program.network.apply(p, batch.obs)[0].log_prob(batch.action).sum()
    gradient = jax.jit(jax.grad(total_logp))
    gradient_ms = _median_ms(lambda: gradient(params), reps)
    # One minibatch (B / num_minibatches envs, all T steps): a recurrent pass is
    # T sequential cell steps whatever the batch, so it barely shrinks.
    envs = config.num_envs // config.num_minibatches
    minibatch = batch._replace(**{
        name: getattr(batch, name)[envs_axis_slice(name, envs)]
        for name in batch._fields if getattr(batch, name) is not None
    })
    if is_recurrent(program.network):
        def minibatch_logp(p):
            return reevaluate_recurrent(program.network, p, minibatch)[0].sum()
    else:
        def minibatch_logp(p):
            return program.network.apply(p, minibatch.obs)[0].log_prob(minibatch.action).sum()
    minibatch_gradient = jax.jit(jax.grad(minibatch_logp))
    minibatch_ms = _median_ms(lambda: minibatch_gradient(params), reps)
    chunk_steps = config.envs_per_actor * config.num_steps
    return dict(
        network=network, rollout_ms_per_chunk=round(rollout_ms, 3),
        actor_env_steps_per_s=round(1e3 * chunk_steps / rollout_ms),
        update_ms_per_batch=round(update_ms, 3),
        learner_env_steps_per_s=round(1e3 * config.batch_size / update_ms),
        forward_ms_per_batch=round(forward_ms, 3),
        forward_backward_ms_per_batch=round(gradient_ms, 3),
        forward_backward_ms_per_minibatch=round(minibatch_ms, 3),
        # The update runs forward and backward on num_epochs x num_minibatches
        # minibatches, after one forward for V-trace; the rest is Adam and shuffling.
        minibatch_steps_share_of_update=round(
            config.num_epochs * config.num_minibatches * minibatch_ms / update_ms, 3),
    )


def plot_curves(path, title: str, curves: dict[tuple[str, str], dict[int, list]]) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4))
    colors = {"mlp": "tab:gray", "lstm": "tab:blue", "gru": "tab:green"}
    for (network, mode), per_seed in sorted(curves.items()):
        if not per_seed:
            continue
        length = min(len(c) for c in per_seed.values())
        steps = np.array([s for s, _ in next(iter(per_seed.values()))[:length]])
        returns = np.array([[r for _, r in c[:length]] for c in per_seed.values()], float)
        mean = np.nanmean(returns, 0) if np.isfinite(returns).any() else returns[0]
        ax.plot(steps, mean, color=colors[network], linestyle="-" if mode == "async" else "--",
                label=f"{network} {mode} ({len(per_seed)} seeds)")
    ax.set_title(title)
    ax.set_xlabel("env steps")
    ax.set_ylabel("return (last 100 episodes)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--envs", nargs="+", default=list(ENV_CONFIGS), choices=list(ENV_CONFIGS))
    parser.add_argument("--networks", nargs="+", default=list(NETWORKS), choices=NETWORKS)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--budget-scale", type=float, default=1.0)
    parser.add_argument("--cost-reps", type=int, default=20,
                        help="timed calls per cost figure (0: skip the cost measurement)")
    parser.add_argument("--cost-only", action="store_true",
                        help="skip the learning runs; write cost.csv and cost.json only")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    check_seeds_and_budget(parser, args)
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    configure_jax()
    out = out_dir("recurrent_results", args.out)
    seeds = list(range(args.seeds))
    rows: list[dict[str, Any]] = []
    load_start = os.getloadavg()
    for env_id in ([] if args.cost_only else args.envs):
        curves: dict[tuple[str, str], dict[int, list]] = {}
        for network in args.networks:
            config = make_config(env_id, network, 0, args.budget_scale)
            print(f"== {env_id} {network}: {config.num_updates} updates x "
                  f"{config.batch_size} env steps, seeds {seeds}", flush=True)
            curves[network, "async"] = {}
            for seed in seeds:
                row, curve = run_async(dataclasses.replace(config, seed=seed))
                rows.append(dict(env_id=env_id, network=network, mode="async", seed=seed, **row))
                curves[network, "async"][seed] = curve
                print(f"   async seed {seed}: return {row['final_return']:.2f} in "
                      f"{row['wall_time_s']:.0f} s (lag max {row['policy_lag_max']})", flush=True)
            sync_rows, sync_curves = run_sync(config, seeds)
            curves[network, "sync"] = dict(zip(seeds, sync_curves))
            rows.extend(dict(env_id=env_id, network=network, mode="sync", seed=seed, **row)
                        for seed, row in zip(seeds, sync_rows))
            print(f"   sync  seeds {seeds}: returns "
                  f"{[round(r['final_return'], 2) for r in sync_rows]} in "
                  f"{sync_rows[0]['wall_time_s']:.0f} s (vmapped)", flush=True)
        write_csv(out / f"curves_{env_id}.csv", [
            dict(network=n, mode=m, seed=s, env_steps=steps, episode_return=ret)
            for (n, m), per_seed in curves.items() for s, curve in per_seed.items()
            for steps, ret in curve
        ], CURVE_FIELDS)
        title = env_id if args.budget_scale == 1 else f"{env_id} (budget x{args.budget_scale:g})"
        plot_curves(out / f"curves_{env_id}.png", title, curves)
        write_csv(out / "results.csv", rows, RESULT_FIELDS)

    summary = []
    for env_id in ([] if args.cost_only else args.envs):
        for network in args.networks:
            entry = dict(env_id=env_id, network=network)
            for mode in MODES:
                runs = [r for r in rows if (r["env_id"], r["network"], r["mode"]) == (
                    env_id, network, mode)]
                mean, std = mean_std(r["final_return"] for r in runs)
                entry[mode] = dict(
                    final_return_mean=mean, final_return_std=std,
                    env_steps=runs[0]["env_steps"],
                    env_steps_per_s_mean=mean_std(r["env_steps_per_s"] for r in runs)[0],
                    policy_lag_max=max(r["policy_lag_max"] for r in runs),
                )
            summary.append(entry)
    learning_table = markdown_table(
        ["env", "network", "env steps", "seeds", "async return", "sync twin return",
         "async lag max", "async env steps/s"],
        [[e["env_id"], e["network"], f"{e['async']['env_steps']:,}", len(seeds),
          format_mean_std(e["async"]["final_return_mean"], e["async"]["final_return_std"], 2),
          format_mean_std(e["sync"]["final_return_mean"], e["sync"]["final_return_std"], 2),
          e["async"]["policy_lag_max"], f"{e['async']['env_steps_per_s_mean']:,.0f}"]
         for e in summary],
    )
    if summary:
        print("\n" + learning_table)

    cost = []
    if args.cost_reps > 0:
        print("\n== cost on CartPole-v1 (default topology, V-trace on)", flush=True)
        cost = [measure_cost(network, args.cost_reps) for network in args.networks]
        write_csv(out / "cost.csv", cost, COST_FIELDS)
        baseline = next((c for c in cost if c["network"] == "mlp"), cost[0])
        cost_table = markdown_table(
            ["network", "actor chunk ms (256 steps)", "actor env steps/s", "update ms (512 steps)",
             "learner env steps/s", "forward ms (batch)", "fwd+bwd ms (batch)",
             "fwd+bwd ms (minibatch)", "16 minibatch steps / update", "learner cost vs mlp"],
            [[c["network"], c["rollout_ms_per_chunk"], f"{c['actor_env_steps_per_s']:,}",
              c["update_ms_per_batch"], f"{c['learner_env_steps_per_s']:,}",
              c["forward_ms_per_batch"], c["forward_backward_ms_per_batch"],
              c["forward_backward_ms_per_minibatch"],
              f"{c['minibatch_steps_share_of_update']:.0%}",
              f"x{c['update_ms_per_batch'] / baseline['update_ms_per_batch']:.1f}"]
             for c in cost],
        )
        print("\n" + cost_table)
    result = dict(
        rnn_hidden_size=RNN_HIDDEN_SIZE, budget_scale=args.budget_scale, seeds=seeds,
        configs={env_id: make_config(env_id, "lstm", 0, args.budget_scale).to_dict()
                 for env_id in args.envs},
        learning=summary, cost=cost, load_average_start=load_start,
        load_average_end=os.getloadavg(), command_line=reproduce_command(__file__, argv),
    )
    path = save_result("recurrent_results", args.out, __file__, argv, result,
                       filename="cost.json" if args.cost_only else "results.json")
    written = "cost.csv" if args.cost_only else "results.csv, curves_*.csv/png, cost.csv"
    print(f"wrote {path} and {written} in {out}")
    return result


if __name__ == "__main__":
    main()
