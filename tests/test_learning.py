"""Learning runs: the defaults solve CartPole-v1, with and without V-trace.

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
    assert report.env_steps <= 500_000
    assert report.episode_return_mean >= 475.0, report
    assert report.policy_lag_max <= config.max_lead_chunks - 1


def test_vtrace_with_four_actors_and_a_long_lead_solves_cartpole():
    config = dataclasses.replace(
        AsyncActorLearnerConfig(), use_vtrace=True, num_actors=4, envs_per_actor=2,
        max_lead_steps=4 * 64,
    )
    report = train(config, progress=False).report
    assert report.env_steps <= 500_000
    # The valve allows up to 3 updates of lag; the run must actually use it.
    assert report.policy_lag_max == 3
    assert report.episode_return_mean >= 475.0, report
