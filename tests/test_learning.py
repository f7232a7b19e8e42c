"""Learning runs: the defaults solve CartPole-v1; V-trace with a long lead learns it.

Each is a full 500k-step run (about a minute on a 2-core machine), marked
``slow``; ``make test`` runs them.
"""

import dataclasses

import pytest

from ppo_async import AsyncActorLearnerConfig, train

pytestmark = pytest.mark.slow


def test_default_config_solves_cartpole():
    config = AsyncActorLearnerConfig()
    report = train(config, progress=False).report
    assert report.updates == config.num_updates
    # The actors produced at least what the learner consumed (what is left over
    # was still in flight when the run ended).
    assert sum(stats.env_steps for stats in report.actor_stats) >= report.env_steps
    assert report.episode_return_mean >= 475.0, report
    assert report.policy_lag_max <= config.max_lead_chunks - 1


def test_vtrace_with_four_actors_and_a_long_lead_learns_cartpole():
    config = dataclasses.replace(
        AsyncActorLearnerConfig(), use_vtrace=True, num_actors=4, envs_per_actor=2,
        max_lead_steps=4 * 64,
    )
    report = train(config, progress=False).report
    assert report.updates == config.num_updates
    # The valve allows up to 3 updates of lag; the run must actually use it.
    assert report.policy_lag_max == 3
    # Learns, far above a random policy (about 22), but "solved" (>= 475) is not
    # asserted: with lag, V-trace (decoupled PPO) does not reliably solve CartPole
    # in 500k steps. This config ended at 500 in 10 of 12 runs, at 471.4 in one,
    # and below 475 in one; the staleness sweep in docs/results.md shows why.
    assert report.episode_return_mean >= 200.0, report.episode_return_mean
