"""The Nature CNN's update on the CPU, three ways: the project's update, a plain jit, PyTorch.

Each way runs the ``atari-pong`` preset's network (the Nature CNN torso, the
actor and critic MLPs of 64 x 64) forward and backward through the clipped
PPO loss over one minibatch of that preset (``batch_size / num_minibatches``
= 256 frames of 84x84x4), and the figure is the median milliseconds per
minibatch:

- ``update``: the project's jitted update (`ppo_async.core.update.make_update_fn`)
  on a batch of the preset's shape, placed on the device first; one call runs
  ``num_epochs x num_minibatches`` minibatches (and the advantages, the
  shuffle's gather and Adam), so its median is divided by that count.
- ``jit``: ``jax.jit(jax.value_and_grad(loss))`` of the same network
  (`AsyncActorLearnerConfig.make_network`) and loss (`ppo_async.core.losses.ppo_loss`)
  over one minibatch; ``jit-fwd`` is its forward alone.
- ``torch``: the same layers in PyTorch on the CPU (NCHW, its native layout,
  and ``--torch-channels-last`` too), forward, loss and ``backward()``, in the
  side venv ``experiments/peers/.venvs/torch`` (``--torch-python``); created with
  ``python3 -m venv experiments/peers/.venvs/torch &&
  experiments/peers/.venvs/torch/bin/pip install torch==2.13.0 numpy``.

Every way runs in a fresh process, one after the other, with the
observations as ``--obs-dtype`` (float32, what the host actors send the
learner; or uint8, the env's frames). The JAX ways run once per
``--xla-flags`` given (each is the whole ``XLA_FLAGS`` of that child;
``--xla-flags=`` is none), so XLA's CPU options can be compared. Reports the ratios to the
fastest way, with `common.machine_info()`; writes
``experiments/out/cnn_update/results.json`` and ``results.csv``.

    python experiments/cnn_update.py                                   # all three ways
    python experiments/cnn_update.py --ways update jit --xla-flags= --xla-flags=--xla_cpu_use_xnnpack=true
    python experiments/cnn_update.py --ways update jit --conv lax canonical   # before / after conv_nhwc
    python experiments/cnn_update.py --cores 1                            # each way on one core
    python experiments/cnn_update.py --ways jit --num-steps 8 --repeats 2   # smoke
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time
from typing import Any

WAYS = ("update", "jit", "torch")
EXPERIMENTS = pathlib.Path(__file__).resolve().parent
TORCH_PYTHON = EXPERIMENTS / "peers" / ".venvs" / "torch" / "bin" / "python"
FIELDS = ("way", "conv", "xla_flags", "obs_dtype", "layout", "minibatch", "fwd_bwd_ms", "fwd_ms",
          "repeats", "threads", "load_average_1_min")


# --- the children: one way each, in a fresh process ---------------------------------------


def _median_ms(fn, repeats: int) -> float:
    fn()  # compile / warm up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def _random_inputs(minibatch: int, obs_dtype: str, num_actions: int, leading=()):
    """Frames in [0, 255] (as ``obs_dtype``), actions and the loss's other inputs, seeded."""
    import numpy as np

    rng = np.random.default_rng(0)
    shape = (*leading, minibatch)
    frames = rng.integers(0, 256, (*shape, 84, 84, 4), dtype=np.uint8).astype(obs_dtype)
    return dict(obs=frames, action=rng.integers(0, num_actions, shape).astype(np.int32),
                logp=np.full(shape, -np.log(num_actions), np.float32),
                advantages=rng.standard_normal(shape).astype(np.float32),
                values=rng.standard_normal(shape).astype(np.float32),
                targets=rng.standard_normal(shape).astype(np.float32))


def _pong_network(config):
    import gymnasium

    return config.make_network((84, 84, 4), gymnasium.spaces.Discrete(6))


def jax_child(args) -> dict[str, Any]:
    """``update`` or ``jit``: median ms per minibatch (``fwd_ms`` for ``jit`` only)."""
    import jax
    import numpy as np

    from ppo_async.core.losses import ppo_loss
    from ppo_async.core.update import Batch, init_learner_state, make_update_fn
    from ppo_async.networks import actor_critic
    from ppo_async.networks.actor_critic import init_params
    from ppo_async.presets import preset

    if args.conv == ["lax"]:  # the torsos' convolutions as before conv_nhwc: autodiff's gradients
        actor_critic.conv_nhwc = jax.lax.conv_general_dilated

    config = preset(args.preset, num_steps=args.num_steps or preset(args.preset).num_steps)
    network = _pong_network(config)
    params = init_params(network, jax.random.key(0), (84, 84, 4))
    minibatch = config.minibatch_size
    options = config.update_options()
    row: dict[str, Any] = dict(minibatch=minibatch, fwd_ms=float("nan"))
    if args.one == "jit":
        x = jax.device_put(_random_inputs(minibatch, args.obs_dtype, 6))

        def loss(params, x):
            dist, values = network.apply(params, x["obs"])
            return ppo_loss(dist.log_prob(x["action"]), x["logp"], x["advantages"], values,
                            x["values"], x["targets"], dist.entropy(), clip_eps=options.clip_eps,
                            vf_coef=options.vf_coef, ent_coef=options.ent_coef,
                            value_clip_eps=options.value_clip_eps)[0]

        forward_backward = jax.jit(jax.value_and_grad(loss))
        forward = jax.jit(loss)
        row["fwd_bwd_ms"] = _median_ms(
            lambda: jax.block_until_ready(forward_backward(params, x)), args.repeats)
        row["fwd_ms"] = _median_ms(lambda: jax.block_until_ready(forward(params, x)),
                                   args.repeats)
        return row
    steps, envs = config.num_steps, config.num_envs
    x = _random_inputs(envs, args.obs_dtype, 6, leading=(steps,))
    batch = jax.device_put(Batch(
        obs=x["obs"], action=x["action"], reward=x["advantages"],
        done=np.zeros((steps, envs), bool), behaviour_logp=x["logp"],
        behaviour_value=x["values"], bootstrap_obs=x["obs"][0],
        bootstrap_value=x["values"][0]))
    update = make_update_fn(options, network)
    state = init_learner_state(options, params, jax.random.key(1))
    calls = options.num_epochs * options.num_minibatches
    # The same state each call: every call does the same work, and the state's
    # buffers are not donated, so it stays valid.
    row["fwd_bwd_ms"] = _median_ms(
        lambda: jax.block_until_ready(update(state, batch)), args.repeats) / calls
    row["minibatches_per_call"] = calls
    return row


def torch_child(args) -> dict[str, Any]:
    """The Nature CNN, the MLPs and the PPO loss in PyTorch; imports nothing of this project."""
    import numpy as np
    import torch

    torch.manual_seed(0)
    nn = torch.nn

    def mlp(out: int):
        return nn.Sequential(nn.Linear(512, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(),
                             nn.Linear(64, out))

    class ActorCritic(nn.Module):
        def __init__(self):
            super().__init__()
            self.torso = nn.Sequential(
                nn.Conv2d(4, 32, 8, 4), nn.ReLU(), nn.Conv2d(32, 64, 4, 2), nn.ReLU(),
                nn.Conv2d(64, 64, 3, 1), nn.ReLU(), nn.Flatten(), nn.Linear(3136, 512), nn.ReLU())
            self.actor, self.critic = mlp(6), mlp(1)

        def forward(self, frames):
            features = self.torso(frames.float() / 255.0)
            return self.actor(features), self.critic(features)[:, 0]

    network = ActorCritic()
    x = _random_inputs(args.minibatch, args.obs_dtype, 6)
    frames = torch.from_numpy(np.ascontiguousarray(x["obs"].transpose(0, 3, 1, 2)))  # NCHW
    if args.layout == "channels_last":
        network = network.to(memory_format=torch.channels_last)
        frames = frames.contiguous(memory_format=torch.channels_last)
    action, logp, advantages, old_values, targets = (
        torch.from_numpy(x[k]) for k in ("action", "logp", "advantages", "values", "targets"))
    clip = 0.1  # the atari-pong preset's clip_eps, vf_coef 0.5, ent_coef 0.01

    def loss():
        logits, values = network(frames)
        log_probs = torch.log_softmax(logits, -1)
        new_logp = log_probs.gather(1, action[:, None].long())[:, 0]
        ratio = torch.exp(new_logp - logp)
        normalized = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
        policy = -torch.minimum(ratio * normalized,
                                torch.clamp(ratio, 1 - clip, 1 + clip) * normalized).mean()
        entropy = -(log_probs.exp() * log_probs).sum(-1).mean()
        return policy + 0.5 * 0.5 * ((values - targets) ** 2).mean() - 0.01 * entropy

    def forward_backward():
        network.zero_grad(set_to_none=True)
        loss().backward()

    def forward():
        with torch.no_grad():
            loss()

    return dict(minibatch=args.minibatch, threads=torch.get_num_threads(),
                fwd_bwd_ms=_median_ms(forward_backward, args.repeats),
                fwd_ms=_median_ms(forward, args.repeats))


# --- the parent: every way in a fresh process, the table ----------------------------------


def _child(argv: list[str], python: str, xla_flags: str | None, what: str,
           cores: int = 0) -> dict[str, Any]:
    from ppo_async.runtime.process_transport import inherited_cache_env

    # This process's compilation cache, if any: compiling is outside the timings.
    env = {**os.environ, **inherited_cache_env()}
    if xla_flags is not None:
        env["XLA_FLAGS"] = xla_flags
    env.setdefault("JAX_PLATFORMS", "cpu")
    pin = None
    if cores:
        # Both frameworks size their thread pools from the CPUs they may run on.
        env["OMP_NUM_THREADS"] = str(cores)
        cpus = sorted(os.sched_getaffinity(0))[:cores]
        pin = lambda: os.sched_setaffinity(0, cpus)  # noqa: E731 - runs in the child
    completed = subprocess.run([python, __file__, *argv], capture_output=True, text=True,
                               timeout=1800, env=env, preexec_fn=pin)
    if completed.returncode != 0:
        raise RuntimeError(f"{what} failed:\n{completed.stderr[-3000:]}")
    return json.loads(completed.stdout.strip().splitlines()[-1])


def measure(args) -> list[dict[str, Any]]:
    from ppo_async.presets import preset

    config = preset(args.preset, num_steps=args.num_steps or preset(args.preset).num_steps)
    common_argv = ["--preset", args.preset, "--repeats", str(args.repeats),
                   "--obs-dtype", args.obs_dtype, "--num-steps", str(config.num_steps)]
    rows = []
    for way in args.ways:
        if way == "torch":
            for layout in ("nchw", *(["channels_last"] if args.torch_channels_last else [])):
                row = _child(["--one", "torch", "--minibatch", str(config.minibatch_size),
                              "--layout", layout, *common_argv],
                             str(args.torch_python), None, f"torch {layout}", args.cores)
                rows.append(dict(way="torch", conv="", xla_flags="", obs_dtype=args.obs_dtype,
                                 layout=layout, repeats=args.repeats,
                                 load_average_1_min=os.getloadavg()[0], **row))
                _print_row(rows[-1])
            continue
        for conv in args.conv:
            for flags in args.xla_flags:
                row = _child(["--one", way, "--conv", conv, *common_argv], sys.executable, flags,
                             f"{way} (conv {conv}) with XLA_FLAGS={flags!r}", args.cores)
                rows.append(dict(way=way, conv=conv, xla_flags=flags, obs_dtype=args.obs_dtype,
                                 layout="nhwc", repeats=args.repeats,
                                 threads=args.cores or os.cpu_count(),
                                 load_average_1_min=os.getloadavg()[0], **row))
                _print_row(rows[-1])
    return rows


def _print_row(row: dict[str, Any]) -> None:
    flags = f" XLA_FLAGS={row['xla_flags']!r}" if row["xla_flags"] else ""
    conv = f" conv {row['conv']}" if row["conv"] else ""
    print(f"   {row['way']:6s} {row['layout']:13s}{conv}{flags}: {row['fwd_bwd_ms']:.1f} ms "
          f"forward+backward per minibatch of {row['minibatch']}"
          + (f" (forward {row['fwd_ms']:.1f} ms)" if row["fwd_ms"] == row["fwd_ms"] else "")
          + f", load {row['load_average_1_min']:.2f}", flush=True)


def table(rows: list[dict[str, Any]]) -> str:
    import common

    fastest = min(r["fwd_bwd_ms"] for r in rows)
    return common.markdown_table(
        ["way", "conv", "layout", "XLA_FLAGS", "obs dtype", "minibatch", "forward+backward ms",
         "forward ms", "x fastest"],
        [[r["way"], r["conv"], r["layout"], f"`{r['xla_flags']}`" if r["xla_flags"] else "",
          r["obs_dtype"], r["minibatch"], f"{r['fwd_bwd_ms']:.1f}",
          f"{r['fwd_ms']:.1f}" if r["fwd_ms"] == r["fwd_ms"] else "",
          f"{r['fwd_bwd_ms'] / fastest:.2f}"] for r in rows])


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ways", nargs="+", default=list(WAYS), choices=WAYS)
    parser.add_argument("--preset", default="atari-pong", help="whose network and minibatch")
    parser.add_argument("--num-steps", type=int, default=0,
                        help="steps per env of the batch (0: the preset's, 128); fewer make "
                             "the minibatch smaller (a smoke run)")
    parser.add_argument("--obs-dtype", default="float32", choices=("float32", "uint8"),
                        help="the frames as the learner gets them (float32: from host actors)")
    parser.add_argument("--repeats", type=int, default=10, help="timed calls per way")
    parser.add_argument("--conv", nargs="+", default=["canonical"], choices=("canonical", "lax"),
                        help="the JAX ways' convolutions, a run each: canonical "
                             "(ppo_async.networks.conv, what the torsos use) and/or lax (plain "
                             "lax.conv_general_dilated, autodiff's gradients: as before conv_nhwc)")
    parser.add_argument("--xla-flags", action="append", default=None,
                        help="XLA_FLAGS of the JAX ways' children; repeat it for one run each "
                             "(--xla-flags= is none; default: none)")
    parser.add_argument("--torch-python", default=str(TORCH_PYTHON),
                        help="the side venv's python that has torch")
    parser.add_argument("--torch-channels-last", action="store_true",
                        help="also time torch with channels-last tensors (NHWC in memory)")
    parser.add_argument("--cores", type=int, default=0,
                        help="pin every child to this many cores (torch gets as many threads); "
                             "0: all. One core is less at the mercy of other work on the machine")
    parser.add_argument("--out", default=None)
    # A child's own arguments (the parent passes them).
    parser.add_argument("--one", choices=WAYS, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--minibatch", type=int, default=256, help=argparse.SUPPRESS)
    parser.add_argument("--layout", default="nchw", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.xla_flags = args.xla_flags or [""]
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    if "torch" in args.ways and args.one is None and not pathlib.Path(args.torch_python).is_file():
        parser.error(f"--ways torch needs {args.torch_python} (see the module docstring), or "
                     "leave torch out: --ways update jit")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.one is not None:  # a child: one way, one JSON line
        result = torch_child(args) if args.one == "torch" else jax_child(args)
        print(json.dumps(result))
        return result
    sys.path.insert(0, str(EXPERIMENTS))
    import common

    common.configure_jax()  # the children inherit the compilation cache
    print(f"== {args.preset}: the Nature CNN forward and backward per minibatch, "
          f"ways {args.ways}", flush=True)
    rows = measure(args)
    out = common.out_dir("cnn_update", args.out)
    common.write_csv(out / "results.csv", rows, [*FIELDS, "minibatches_per_call"])
    markdown = table(rows)
    print("\n" + markdown)
    result = dict(rows=rows, table=markdown)
    common.save_result("cnn_update", args.out, __file__, argv, result)
    return result


if __name__ == "__main__":
    main()
