"""PRNG keys derived on the host: the bits of `jax.random.key`, `split` and `fold_in`, without XLA.

Each of those functions, called eagerly, is a small program that XLA compiles
the first time a process calls it: 0.1-0.6 s apiece on a 2-core CPU while
the learner's update compiles beside it, on the way from `train()` to its
first update (the learner's two keys, then each actor's key before its env
reset; ``experiments/startup_timeline.py`` lists them). Here the same keys
are computed with numpy, in microseconds: the Threefry-2x32 hash (Salmon et
al. 2011, "Parallel random numbers: as easy as 1, 2, 3", 20 rounds) on the
key data, then wrapped as a typed key (`jax.random.wrap_key_data`, which
compiles nothing).

The results equal JAX's bit for bit under its defaults: the ``threefry2x32``
implementation with ``jax_threefry_partitionable`` on (where ``split(key,
n)[i]`` and ``fold_in(key, i)`` both hash the counter ``(0, i)``). Under any
other setting, and for a seed outside int32 or data outside uint32, the
functions call JAX's own
(tests/core/test_keys.py checks both against JAX and the hash against the
paper's known-answer vectors).

The same rounds also lower JAX's own hash (the ``threefry2x32`` primitive
behind every ``jax.random`` call on a threefry key) on CPU, straight-line
for small calls: `unroll_threefry_on_cpu`, which ``import ppo_async``
calls. JAX lowers every call on CPU as a loop over five blocks; XLA then
compiles each call site as a while loop of its own, which made the gymnax
actors' reset and rollout programs slower to compile. The bits are the same
(the hash is integer arithmetic).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
_PARITY = np.uint32(0x1BD11BDA)  # the key schedule's third word: k0 ^ k1 ^ this


def threefry2x32(key: np.ndarray, x0: np.ndarray, x1: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The Threefry-2x32 hash (20 rounds) of the counters ``(x0, x1)`` under ``key`` (uint32 [2])."""
    k0, k1 = np.asarray(key, np.uint32)
    with np.errstate(over="ignore"):  # uint32 sums wrap around, as the hash intends
        return _rounds(k0, k1, np.asarray(x0, np.uint32), np.asarray(x1, np.uint32))


def _rounds(k0, k1, x0, x1):
    """The hash on uint32 arrays of numpy or of JAX (traced), straight-line."""
    schedule = (k0, k1, k0 ^ k1 ^ _PARITY)
    x0 = x0 + schedule[0]
    x1 = x1 + schedule[1]
    for block in range(5):  # four rounds, then a key injection
        x0, x1 = _four_rounds(x0, x1, [np.uint32(r) for r in _ROTATIONS[block % 2]])
        x0 = x0 + schedule[(block + 1) % 3]
        x1 = x1 + schedule[(block + 2) % 3] + np.uint32(block + 1)
    return x0, x1


def _four_rounds(x0, x1, rotations):
    for rotation in rotations:
        x0 = x0 + x1
        x1 = ((x1 << rotation) | (x1 >> (np.uint32(32) - rotation))) ^ x0
    return x0, x1


# Hash calls of up to this many counter pairs lower straight-line; larger ones keep a loop.
UNROLL_MAX_PAIRS = 128


def _rounds_in_a_loop(k0, k1, x0, x1):
    """`_rounds` as a loop over the hash's five blocks (JAX's own form on CPU), traced."""
    rotations = jnp.asarray(_ROTATIONS, jnp.uint32)

    def block(i, carry):
        x0, x1, s0, s1, s2 = carry  # the schedule, rotated by the block's index
        x0, x1 = _four_rounds(x0, x1, [rotations[i % 2, j] for j in range(4)])
        return x0 + s1, x1 + s2 + (i + 1).astype(jnp.uint32), s1, s2, s0

    schedule = jnp.broadcast_arrays(k0, k1, k0 ^ k1 ^ _PARITY)
    carry = (x0 + schedule[0], x1 + schedule[1], *schedule)
    return jax.lax.fori_loop(0, 5, block, carry)[:2]


def unroll_threefry_on_cpu() -> bool:
    """Lower JAX's ``threefry2x32`` primitive on CPU straight-line where it is small; same bits.

    A call of up to `UNROLL_MAX_PAIRS` counter pairs lowers as `_rounds`,
    a larger one as a loop over the hash's five blocks, as JAX lowers every
    call on CPU. Straight-line, XLA compiles a call faster: the default gymnax
    actor's env reset took 0.19-0.22 CPU s to compile against 0.34-0.35, its
    rollout 1.00-1.17 against 1.24-1.40 (``experiments/startup_timeline.py``'s
    ``alone_cpu_s``). A large call stays a loop because XLA splits a large
    straight-line kernel over its thread pool: with the update's shuffle (256
    pairs) straight-line, the synchronous twin ran 8% slower on 1.4 cores of
    2 instead of 1.0.

    Process-wide, from then on (programs lowered before keep JAX's lowering).
    False, changing nothing, where this JAX has no such primitive to lower.
    """
    try:
        from jax.extend.random import threefry2x32_p
        from jax.interpreters import mlir
    except ImportError:
        return False
    straight = mlir.lower_fun(_rounds, multiple_results=True)
    looped = mlir.lower_fun(_rounds_in_a_loop, multiple_results=True)

    def lowering(ctx, *operands):
        pairs = math.prod(ctx.avals_out[0].shape)  # the operands broadcast to it
        return (straight if pairs <= UNROLL_MAX_PAIRS else looped)(ctx, *operands)

    mlir.register_lowering(threefry2x32_p, lowering, platform="cpu")
    return True


def _host_keys() -> bool:
    """Whether JAX's keys are the ones this module computes (its defaults)."""
    return (jax.config.jax_default_prng_impl == "threefry2x32"
            and jax.config.jax_threefry_partitionable)


def _is_threefry(key: jax.Array) -> bool:
    return (jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key) and key.shape == ()
            and str(jax.random.key_impl(key)) == "threefry2x32")


def key(seed: int) -> jax.Array:
    """``jax.random.key(seed)``, built on the host."""
    if not (_host_keys() and -2**31 <= int(seed) < 2**31):
        return jax.random.key(seed)
    # JAX's seed: the high word of a 32-bit seed is 0, the low word its bits.
    return jax.random.wrap_key_data(np.array([0, int(seed) & 0xFFFFFFFF], np.uint32))


def fold_in(key: jax.Array, data: int) -> jax.Array:
    """``jax.random.fold_in(key, data)`` for a typed threefry ``key`` and a uint32 ``data``, on the host."""
    if not (_host_keys() and _is_threefry(key) and 0 <= int(data) < 2**32):
        return jax.random.fold_in(key, data)
    words = threefry2x32(np.asarray(jax.random.key_data(key)), np.uint32(0), np.uint32(data))
    return jax.random.wrap_key_data(np.array(words, np.uint32))


def split(key: jax.Array, num: int = 2) -> tuple[jax.Array, ...]:
    """``tuple(jax.random.split(key, num))`` for a typed threefry ``key``, on the host.

    A tuple, not an array of keys: unpacking a JAX array (``a, b = keys``)
    compiles a program of its own.
    """
    if not (_host_keys() and _is_threefry(key)):
        return tuple(jax.random.split(key, num))
    return tuple(jax.random.wrap_key_data(words) for words in _split_data(key, num))


def split_array(key: jax.Array, num: int) -> jax.Array:
    """``jax.random.split(key, num)`` (an array of ``num`` keys) for a typed threefry ``key``, on the host."""
    if not (_host_keys() and _is_threefry(key)):
        return jax.random.split(key, num)
    return jax.random.wrap_key_data(_split_data(key, num))


def _split_data(key: jax.Array, num: int) -> np.ndarray:
    """The key data ``[num, 2]`` of ``split(key, num)``: key ``i`` hashes the counter ``(0, i)``."""
    x0, x1 = threefry2x32(np.asarray(jax.random.key_data(key)),
                          np.zeros(num, np.uint32), np.arange(num, dtype=np.uint32))
    return np.stack([x0, x1], axis=-1)
