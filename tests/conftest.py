"""Test-wide JAX settings: implicit rank promotion is an error, as in rlax."""

import jax

jax.config.update("jax_numpy_rank_promotion", "raise")
