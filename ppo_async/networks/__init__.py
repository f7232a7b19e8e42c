"""The actor-critic networks (flax): torsos, heads, recurrent cells, action distributions.

- `distributions`: categorical and diagonal-Gaussian action distributions.
- `actor_critic`: torsos (MLP, MinAtar, Nature CNN), the feed-forward and
  recurrent actor-critics, `make_network` and `make_config_network`.
"""
