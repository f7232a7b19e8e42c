"""The actor-critic networks (flax): torsos, heads, recurrent cells, action distributions.

- `distributions`: categorical and diagonal-Gaussian action distributions.
- `actor_critic`: torsos (MLP, MinAtar, Nature CNN), the feed-forward and
  recurrent actor-critics, and `make_network`, which takes the network's
  hyperparameters by name (a run's come from
  ``AsyncActorLearnerConfig.make_network``).
"""
