"""Sweeps: every combination of a grid of config fields, once per seed, in parallel, resumable.

    from ppo_async import run_sweep  # ppo_async.sweep.execute.run_sweep
    summary = run_sweep("sweep.toml", "runs/lr_vtrace", workers=2)  # a DataFrame, a row per point

``ppo-async sweep sweep.toml --out runs/lr_vtrace`` does the same on the
command line. A sweep file is TOML (or YAML, with pyyaml installed)::

    preset = "acrobot"           # optional: the starting config (ppo_async.presets)
    seeds = [0, 1, 2]            # every grid point runs once per seed (default [0])
    [base]                       # config fields over the preset, for every run
    total_env_steps = 300000
    [grid]                       # every combination of these lists
    learning_rate = [3e-4, 1e-3]
    use_vtrace = [false, true]

and, for fields that change together rather than crossed, a list of
``[[points]]`` tables, each crossed with the grid (``num_actors = 2`` with
``envs_per_actor = 4``, ``num_actors = 4`` with ``envs_per_actor = 2``).
Every run's config is built and validated before anything runs
(`SweepSpec.runs`): a bad value is one `ConfigError` naming the file, the
grid point and the field.

The sweep directory ``DIR`` holds

================== ==========================================================
``sweep.toml``     the sweep as run (`SweepSpec.to_toml`); a rerun into DIR
                   must start from the same preset and ``[base]``
``<run>/``         one run directory per (grid point, seed), named by
                   `run_name`: ``learning_rate=0.001,use_vtrace=true,seed=0``
``runs.csv``       one row per run: its grid values, seed, status (pending,
                   running, done, failed, interrupted), final return (the
                   mean of the last 100 training episodes), policy lag, env
                   steps, wall time (seconds of the process that trained it,
                   summed over attempts), and a failed run's error
``summary.csv``,   one row per grid point: the interquartile mean of the
``summary.md``     final return over its finished seeds with a 95%
                   stratified-bootstrap interval (`ppo_async.runs.analysis`),
                   mean and std, mean wall time and policy lag
``logs/<job>.log`` each worker's output
================== ==========================================================

Backends. ``local`` trains each run in a process of its own (at most
``workers`` at once; by default as many as the cores hold, counting each run's
actor threads and its learner). ``ray`` makes each run a Ray task that asks
for as many CPUs (a local private instance, or the cluster at
``ray_address``, whose nodes must all see DIR). ``twin=True`` (gymnax envs)
trains all pending seeds of a grid point in one ``jax.vmap`` of the
synchronous twin (`ppo_async.sync.make_train`, acting at the config's exact
policy lag, as one actor at ``exact_policy_lag=K`` does), and writes the same
run directories, tables and summary.

Resuming: the same sweep again skips the runs whose directory holds a
``summary.json`` (finished), resumes those with a checkpoint from it, and
starts the rest (a failed run is tried again). Ctrl-C stops every worker (each
asynchronous run checkpoints first), records who finished, and raises
`SweepInterrupted` with the command that continues. A run that fails is
recorded with its error and the others go on.

The modules:

- `spec`: `SweepSpec` and `load_sweep` (the sweep file or table, checked),
  `run_name` and `point_label`.
- `table`: ``runs.csv`` (`RunsTable`, `run_state`) and the summary
  (`summarize`, `summary_markdown`).
- `pools`: the jobs and the workers that train them: local processes
  (`LocalPool`) or Ray tasks (`RayPool`); `run_job`, a worker's whole work.
- `execute`: `plan_sweep`, `execute_sweep` and `run_sweep`; `SweepInterrupted`.
"""
