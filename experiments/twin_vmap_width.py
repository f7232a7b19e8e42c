"""Whether the synchronous twin's seeds depend on how many seeds share its vmapped program.

Trains the ``acrobot`` preset for ``--updates`` updates in the twin, its seeds
vmapped in one ``jax.jit`` at each width of ``--widths``, and compares seeds
``0..min(widths)-1`` across the widths: bit for bit, and the largest absolute
difference of any float output (params, optimizer state, metrics). XLA
compiles one program per width, and its float sums may round differently.

    python experiments/twin_vmap_width.py                       # 20 updates, widths 5 and 32
    python experiments/twin_vmap_width.py --updates 3 --widths 2 5
"""

from __future__ import annotations

import argparse
import sys

import common

common.avoid_vmapped_qr_deadlock()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--updates", type=int, default=20)
    parser.add_argument("--widths", type=int, nargs=2, default=[5, 32])
    args = parser.parse_args()
    import jax
    import jax.numpy as jnp
    import numpy as np

    from ppo_async.presets import preset
    from ppo_async.sync import make_train

    config = preset("acrobot")
    config = preset("acrobot", total_env_steps=config.batch_size * args.updates)
    train = jax.jit(jax.vmap(make_train(config)))
    shared = min(args.widths)
    outputs = []
    for width in args.widths:
        keys = jax.vmap(jax.random.key)(jnp.arange(width))
        outputs.append(jax.tree.leaves(jax.tree.map(lambda x: np.asarray(x[:shared]),
                                                    train(keys))))
    same = all(np.array_equal(a, b) for a, b in zip(*outputs))
    largest = max(float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64))))
                  for a, b in zip(*outputs) if a.dtype.kind == "f")
    print(f"acrobot, {args.updates} updates, seeds 0..{shared - 1} vmapped {args.widths[0]} "
          f"and {args.widths[1]} wide: bit for bit equal: {same}; largest difference "
          f"{largest:.3g}")
    common.print_reproduce(__file__, sys.argv[1:])


if __name__ == "__main__":
    main()
