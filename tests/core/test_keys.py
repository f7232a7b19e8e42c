"""Host-side keys (`ppo_async.core.keys`) against the Threefry paper's vectors and against JAX."""

import jax
import numpy as np
import pytest

from ppo_async.core import keys


def _data(key) -> np.ndarray:
    return np.asarray(jax.random.key_data(key))


# Random123's known-answer vectors for Threefry-2x32, 20 rounds: (key, counter, result).
KNOWN_ANSWERS = [
    ((0, 0), (0, 0), (0x6B200159, 0x99BA4EFE)),
    ((0xFFFFFFFF, 0xFFFFFFFF), (0xFFFFFFFF, 0xFFFFFFFF), (0x1CB996FC, 0xBB002BE7)),
    ((0x13198A2E, 0x03707344), (0x243F6A88, 0x85A308D3), (0xC4923A9C, 0x483DF7A0)),
]


@pytest.mark.parametrize("key, counter, expected", KNOWN_ANSWERS)
def test_threefry_known_answers(key, counter, expected):
    x0, x1 = keys.threefry2x32(np.array(key, np.uint32), np.uint32(counter[0]),
                               np.uint32(counter[1]))
    assert (int(x0), int(x1)) == expected


def test_threefry_is_elementwise_over_counters():
    key = np.array([7, 11], np.uint32)
    x0, x1 = keys.threefry2x32(key, np.array([0, 3], np.uint32), np.array([5, 9], np.uint32))
    for i, counter in enumerate([(0, 5), (3, 9)]):
        assert (x0[i], x1[i]) == keys.threefry2x32(key, *map(np.uint32, counter))


@pytest.mark.parametrize("pairs", [1, 64, keys.UNROLL_MAX_PAIRS, keys.UNROLL_MAX_PAIRS + 1, 512])
def test_jax_threefry_on_cpu_gives_the_papers_bits_straight_line_when_small(pairs):
    # `import ppo_async` lowers JAX's own hash on CPU without JAX's loop over its five
    # blocks for small calls, and with a loop of its own for large ones
    # (`keys.unroll_threefry_on_cpu`); the bits stay the paper's either way.
    from jax.extend.random import threefry_2x32

    hash_fn = jax.jit(lambda k0, k1, count: threefry_2x32((k0, k1), count))
    for key, counter, expected in KNOWN_ANSWERS:  # broadcast over `pairs` counters
        count = np.repeat(np.array(counter, np.uint32), pairs)
        got = np.asarray(hash_fn(np.uint32(key[0]), np.uint32(key[1]), count)).reshape(2, pairs)
        assert np.array_equal(got, np.repeat(np.array(expected, np.uint32)[:, None], pairs, 1))
    counters = np.random.default_rng(pairs).integers(0, 2**32, (2, pairs), dtype=np.uint32)
    key = np.array([0x13198A2E, 0x03707344], np.uint32)
    got = np.asarray(hash_fn(key[0], key[1], counters.ravel())).reshape(2, pairs)
    assert np.array_equal(got, np.stack(keys.threefry2x32(key, *counters)))
    looped = "while" in hash_fn.lower(key[0], key[1], counters.ravel()).as_text()
    assert looped == (pairs > keys.UNROLL_MAX_PAIRS)


def test_jax_threefry_on_cpu_counts_a_vmapped_calls_pairs_after_broadcasting():
    # Under vmap the counters ([50]) broadcast against the keys ([4, 1]) inside one call:
    # 200 pairs, above the limit, so a loop; the bits equal one call per key (50 pairs each).
    batch = jax.random.split(jax.random.key(3), 4)
    draw = jax.vmap(lambda key: jax.random.bits(key, (100,)))
    one_by_one = np.stack([np.asarray(jax.jit(lambda key: jax.random.bits(key, (100,)))(key))
                           for key in batch])
    assert np.array_equal(np.asarray(jax.jit(draw)(batch)), one_by_one)
    assert "while" in jax.jit(draw).lower(batch).as_text()


@pytest.mark.parametrize("seed", [0, 1, 42, -1, 2**31 - 1, -(2**31)])
def test_keys_equal_jax_bit_for_bit(seed):
    assert np.array_equal(_data(keys.key(seed)), _data(jax.random.key(seed)))
    key = jax.random.key(seed)
    for data in [0, 1, 7, 2**32 - 1]:
        assert np.array_equal(_data(keys.fold_in(key, data)),
                              _data(jax.random.fold_in(key, data)))
    for num in [1, 2, 5]:
        got = keys.split(key, num)
        assert isinstance(got, tuple) and len(got) == num
        assert np.array_equal(np.stack([_data(k) for k in got]),
                              _data(jax.random.split(key, num)))
        assert np.array_equal(_data(keys.split_array(key, num)), _data(jax.random.split(key, num)))


def test_keys_are_jax_keys_usable_in_jitted_code():
    key = keys.fold_in(keys.key(3), 2)
    assert jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key) and key.shape == ()
    expected = jax.random.uniform(jax.random.fold_in(jax.random.key(3), 2), (4,))
    assert np.array_equal(jax.jit(lambda k: jax.random.uniform(k, (4,)))(key), expected)


def test_other_settings_fall_back_to_jax():
    # Outside what the hash here reproduces, JAX computes the keys (and raises what it raises).
    assert np.array_equal(_data(keys.key(2**40)), _data(jax.random.key(2**40)))
    with pytest.raises(OverflowError):
        keys.fold_in(keys.key(0), -1)
    rbg = jax.random.key(0, impl="rbg")
    assert np.array_equal(np.stack([_data(k) for k in keys.split(rbg, 3)]),
                          _data(jax.random.split(rbg, 3)))
    assert np.array_equal(_data(keys.split_array(rbg, 3)), _data(jax.random.split(rbg, 3)))
    with jax.threefry_partitionable(False):
        key = jax.random.key(5)
        assert np.array_equal(np.stack([_data(k) for k in keys.split(key, 3)]),
                              _data(jax.random.split(key, 3)))
        assert np.array_equal(_data(keys.fold_in(key, 4)), _data(jax.random.fold_in(key, 4)))


def test_host_keys_leave_jax_random_alone(monkeypatch):
    # What makes them free: under the defaults no JAX random function (a compile each) runs.
    expected = _data(jax.random.split(jax.random.fold_in(jax.random.key(9), 4), 3))

    def refuse(*args, **kwargs):
        raise AssertionError("a JAX random function was called")

    for name in ("key", "split", "fold_in", "PRNGKey"):
        monkeypatch.setattr(jax.random, name, refuse)
    got = keys.split(keys.fold_in(keys.key(9), 4), 3)
    assert np.array_equal(np.stack([_data(k) for k in got]), expected)
    assert np.array_equal(_data(keys.split_array(keys.fold_in(keys.key(9), 4), 3)), expected)
