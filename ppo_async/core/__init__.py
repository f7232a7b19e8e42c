"""Pure, jittable math: no threads, no queues, no environments.

- `advantages`: GAE and V-trace targets.
- `losses`: the clipped PPO loss.
- `normalization`: running observation and reward statistics.
- `devices`: device strings to devices, and where the learner's arrays live on them.
- `keys`: JAX's PRNG keys (seed, split, fold-in) derived on the host, without compiling.
- `update`: the learner's jitted step (batch, targets, optimizer and schedule,
  minibatching, recurrent sequences), shared by the runtime's learner loop and
  the fully jitted twin (`ppo_async.sync`).
"""
