"""`to_host`: what ``jax.device_get`` returns, read without its per-leaf copies on CPU devices."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from ppo_async.core.devices import to_host


def _tree():
    computed = jax.jit(lambda x: {"sum": x.sum(), "scaled": x * 2, "flags": x > 1,
                                  "count": jnp.int32(3)})(jnp.arange(6.0).reshape(2, 3))
    return {"computed": computed, "numpy": np.ones((2,), np.float32),
            "numpy_scalar": np.float32(1.5), "python": 2.0, "absent": None,
            "nested": (jnp.ones(4, jnp.int32), [np.zeros(1, bool)])}


def _assert_same(got, expected):
    assert jax.tree.structure(got) == jax.tree.structure(expected)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(expected), strict=True):
        assert type(a) is type(b)
        if isinstance(b, np.ndarray):
            assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)
            assert a.flags.writeable == b.flags.writeable
        else:
            assert a == b


def test_to_host_gives_what_device_get_gives_on_the_cpu():
    tree = _tree()
    got = to_host(tree)
    _assert_same(got, jax.device_get(tree))
    # Device arrays come back read-only, as device_get's; host leaves as they were.
    assert not got["computed"]["scaled"].flags.writeable
    assert got["numpy"] is tree["numpy"]


def test_to_host_hands_a_tree_it_cannot_read_directly_to_device_get(monkeypatch):
    key = jax.random.key(3)  # a PRNG key array: numpy cannot hold it
    tree = {"key": key, "x": jnp.ones(2)}
    taken = []
    real = jax.device_get
    monkeypatch.setattr(jax, "device_get", lambda t: taken.append(t) or real(t))
    got = to_host(tree)
    assert taken == [tree]  # one call for the whole tree
    assert np.array_equal(jax.random.key_data(got["key"]), jax.random.key_data(key))



def test_the_broadcast_bytes_are_those_of_device_get():
    import flax.serialization

    from ppo_async.runtime.messages import serialize_policy

    params = jax.jit(lambda x: {"dense": {"kernel": x * 3, "bias": x[0]}})(jnp.ones((4, 2)))
    assert serialize_policy(params) == flax.serialization.to_bytes(jax.device_get(params))
