"""Population-based training (Jaderberg et al. 2017) on Ray Tune's `PopulationBasedTraining`.

    from ppo_async import run_pbt  # ppo_async.pbt.population.run_pbt
    rows = run_pbt("pbt.toml", "runs/pbt_cartpole")  # a dict per member; summary.csv

``ppo-async pbt pbt.toml --out runs/pbt_cartpole`` does the same on the
command line. A PBT file is a sweep file (`ppo_async.sweep`) whose ``[grid]``
lists are the values each explored field may take, plus a ``[pbt]`` table::

    preset = "cartpole"
    seeds = [0]                   # the population's seed: member i trains with 1000 * seed + i
    [base]
    total_env_steps = 200000
    [grid]                        # explored: a member moves to a neighbouring value or resamples
    learning_rate = [1e-4, 3e-4, 1e-3, 3e-3]
    [pbt]
    population = 4
    interval_updates = 10         # learner updates between perturbations
    [pbt.ranges]                  # explored: continuous, x0.8 / x1.2, clipped to [low, high]
    ent_coef = [0.001, 0.03]

Each member is a normal run directory (``DIR/member_<i>``: ``ppo-async eval``,
``plot`` and ``train --resume`` work on it) trained in segments of
``interval_updates``; every ``interval_updates`` Tune ranks the members by
their training return, the bottom ``quantile_fraction`` copy a top member's
checkpoint (params, optimizer state, normalization statistics, the
learning-rate schedule's position, env state) and perturb the explored
fields. ``RUN_DIR/pbt_schedule.jsonl`` records the fields each segment
trained with and where it came from.

The population directory ``DIR`` holds ``pbt.toml`` (the population as run),
``member_<i>/``, ``summary.csv`` and ``summary.md`` (a row per member, the
best marked), ``schedules.csv`` (every member's explored fields over time),
``pbt.png`` (the population's curves and schedules) and ``tune/`` (Tune's
state and each member's reported checkpoints). The same command again
continues it; Ctrl-C stops it with the command that continues. A member that
fails is restarted from its last checkpoint by Tune (``max_failures`` times).

The modules: `spec` (`PBTSpec`, `load_pbt`), `member` (a member's segments,
Tune's trainable), `population` (`run_pbt`), `report` (the tables and plot).
Importing this package imports no Ray; `run_pbt` does.
"""

