"""Pure, jittable math: no threads, no queues, no environments.

- `advantages`: GAE and V-trace targets.
- `losses`: the clipped PPO loss.
- `normalization`: running observation and reward statistics.
- `update`: the learner's jitted step (batch, targets, optimizer and schedule,
  minibatching, recurrent sequences), shared by the runtime's learner loop and
  the fully jitted twin (`ppo_async.sync`).
"""
