"""Learning runs: the defaults solve CartPole-v1; V-trace with a long lead learns it.

Each is a full 500k-step run (about a minute on a 2-core machine), marked
``slow``; ``make test`` runs them.
"""

import pytest

from ppo_async import train

from timing_cases import DEFAULT_CARTPOLE, VTRACE_LONG_LEAD

pytestmark = pytest.mark.slow


def test_default_config_solves_cartpole():
    """Timing-dependent (tests/timing_cases.py): 10 reruns of this config ended at
    500.0 every time (lag max 1), on a 2-core machine under a load of 6-8
    (experiments/timing_spread.py), so the solved bound of 475 holds."""
    config = DEFAULT_CARTPOLE
    report = train(config, progress=False).report
    assert report.updates == config.num_updates
    # The actors produced at least what the learner consumed (what is left over
    # was still in flight when the run ended).
    assert sum(stats.env_steps for stats in report.actor_stats) >= report.env_steps
    assert report.episode_return_mean >= 475.0, report
    assert report.policy_lag_max <= config.max_lead_chunks - 1


def test_vtrace_with_four_actors_and_a_long_lead_learns_cartpole():
    config = VTRACE_LONG_LEAD
    report = train(config, progress=False).report
    assert report.updates == config.num_updates
    # The valve allows up to 3 updates of lag; the run must actually use it.
    assert report.policy_lag_max == 3
    # Learns, far above a random policy (about 22), but "solved" (>= 475) is not
    # asserted: with lag, V-trace (decoupled PPO) does not reliably solve CartPole
    # in 500k steps. Timing-dependent (tests/timing_cases.py): this config ended
    # at 500 in 10 of 12 earlier runs, at 471.4 in one and below 475 in one, and
    # at 500.0 in 10 of 10 reruns of experiments/timing_spread.py (lag max 3 in
    # each, so the equality above holds too), and again in 8 of 8 once the 4
    # actors' chunks were one call from one thread (the default from 4 gymnax
    # actors; lag max 3 in each); the staleness sweep in docs/results.md shows
    # why lag costs return here.
    assert report.episode_return_mean >= 200.0, report.episode_return_mean
