"""conv_nhwc: the forward is lax's, bit for bit; its canonical gradients equal autodiff's and a
numpy loop written from the definition; and inside a loop every convolution XLA's CPU backend
compiles is canonical (NHWC input, HWIO kernel), the form it runs with Eigen."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from ppo_async.networks.conv import NHWC, canonical_gradients, conv_nhwc

# (input [N, H, W, C], kernel [kh, kw, C, O], strides): the Nature CNN's three layers at a small
# batch, MinAtar's, and strides that leave rows no window reaches ((H - kh) % s != 0).
CASES = [
    ((2, 84, 84, 4), (8, 8, 4, 32), (4, 4)),
    ((2, 20, 20, 32), (4, 4, 32, 64), (2, 2)),
    ((2, 9, 9, 64), (3, 3, 64, 64), (1, 1)),
    ((3, 10, 10, 4), (3, 3, 4, 16), (1, 1)),
    ((2, 11, 13, 3), (3, 2, 3, 5), (3, 2)),
]


def _draw(rng, x_shape, kernel_shape, strides):
    x = rng.standard_normal(x_shape).astype(np.float32)
    kernel = rng.standard_normal(kernel_shape).astype(np.float32)
    out = lax.conv_general_dilated(x, kernel, strides, "VALID", dimension_numbers=NHWC)
    return x, kernel, rng.standard_normal(out.shape).astype(np.float32)


def _numpy_gradients(x, kernel, dy, strides):
    """dx and dw of y[n,i,j,o] = sum_{a,b,c} x[n, s i + a, s j + b, c] w[a, b, c, o], by loops."""
    kh, kw = kernel.shape[:2]
    sh, sw = strides
    dx, dw = np.zeros(x.shape, np.float64), np.zeros(kernel.shape, np.float64)
    for i in range(dy.shape[1]):
        for j in range(dy.shape[2]):
            window = x[:, sh * i:sh * i + kh, sw * j:sw * j + kw, :].astype(np.float64)
            dw += np.einsum("nabc,no->abco", window, dy[:, i, j, :])
            dx[:, sh * i:sh * i + kh, sw * j:sw * j + kw, :] += np.einsum(
                "abco,no->nabc", kernel.astype(np.float64), dy[:, i, j, :])
    return dx, dw


@pytest.mark.parametrize("x_shape, kernel_shape, strides", CASES)
def test_gradients_equal_autodiffs_and_a_numpy_loop(maybe_jit, x_shape, kernel_shape, strides):
    x, kernel, dy = _draw(np.random.default_rng(0), x_shape, kernel_shape, strides)
    dx, dw = maybe_jit(lambda *a: canonical_gradients(strides, *a))(x, kernel, dy)
    _, vjp = jax.vjp(lambda x, k: lax.conv_general_dilated(
        x, k, strides, "VALID", dimension_numbers=NHWC), x, kernel)
    auto_dx, auto_dw = vjp(dy)
    assert dx.shape == x.shape and dw.shape == kernel.shape
    np.testing.assert_allclose(dx, auto_dx, rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(dw, auto_dw, rtol=1e-4, atol=1e-3)
    if x_shape[1] <= 20:  # the loop is slow on 84x84
        loop_dx, loop_dw = _numpy_gradients(x, kernel, dy, strides)
        np.testing.assert_allclose(dx, loop_dx, rtol=1e-4, atol=1e-3)
        np.testing.assert_allclose(dw, loop_dw, rtol=1e-4, atol=1e-3)


def test_a_golden_case_small_enough_to_check_by_hand():
    # x = [[1, 2, 3], [4, 5, 6], [7, 8, 9]], a 2x2 kernel of ones, stride 1: y is the
    # four 2x2 sums. With dy = 1 everywhere, dw[a, b] = the sum of the 2x2 block at
    # (a, b) = [[12, 16], [24, 28]], and dx counts the windows covering each pixel.
    x = np.arange(1, 10, dtype=np.float32).reshape(1, 3, 3, 1)
    kernel = np.ones((2, 2, 1, 1), np.float32)
    dy = np.ones((1, 2, 2, 1), np.float32)
    dx, dw = canonical_gradients((1, 1), x, kernel, dy)
    np.testing.assert_array_equal(dw[..., 0, 0], [[12, 16], [24, 28]])
    np.testing.assert_array_equal(dx[0, ..., 0], [[1, 2, 1], [2, 4, 2], [1, 2, 1]])


def test_the_forward_is_lax_conv_bit_for_bit_and_grad_uses_the_canonical_form():
    x, kernel, dy = _draw(np.random.default_rng(1), *CASES[1])
    strides = CASES[1][2]
    np.testing.assert_array_equal(
        jax.jit(conv_nhwc, static_argnums=(2, 3))(x, kernel, strides, "VALID"),
        lax.conv_general_dilated(x, kernel, strides, "VALID", dimension_numbers=NHWC))
    _, vjp = jax.vjp(lambda x, k: conv_nhwc(x, k, strides, "VALID"), x, kernel)
    expected = canonical_gradients(strides, x, kernel, dy)  # on this CPU
    for got, want in zip(vjp(dy), expected):
        np.testing.assert_array_equal(got, want)


def test_inside_a_loop_every_convolution_the_cpu_compiles_is_canonical():
    """XLA's ConvCanonicalization visits the entry computation only: a scan's body keeps
    autodiff's non-canonical gradient convolutions (the slow path); conv_nhwc's are canonical."""
    x, kernel, _ = _draw(np.random.default_rng(2), (2, 11, 13, 3), (3, 2, 3, 5), (3, 2))
    xs = jnp.stack([x, x])

    def compiled_convolutions(conv):
        def step(kernel, x):
            grad = jax.grad(lambda k: jnp.sum(conv(x, k, (3, 2), "VALID") ** 2))(kernel)
            return kernel - 0.1 * grad, None

        text = jax.jit(lambda k, xs: lax.scan(step, k, xs)[0]).lower(kernel, xs).compile().as_text()
        return re.findall(r"dim_labels=(\S+?)[,}\s]", text)

    def lax_conv(x, k, strides, padding):
        return lax.conv_general_dilated(x, k, strides, padding, dimension_numbers=NHWC)

    assert set(compiled_convolutions(lax_conv)) - {"b01f_01io->b01f"}  # the XLA limitation
    labels = compiled_convolutions(conv_nhwc)
    # The forward and the kernel's gradient; the input's is unused, and XLA drops it.
    assert len(labels) == 2 and set(labels) == {"b01f_01io->b01f"}


@pytest.mark.parametrize("kwargs", [
    dict(padding="SAME"), dict(padding="VALID", rhs_dilation=(2, 2)),
    dict(padding="VALID", feature_group_count=2),
])
def test_anything_but_a_valid_strided_nhwc_conv_is_refused(kwargs):
    x = jnp.zeros((1, 8, 8, 4))
    with pytest.raises(ValueError, match="conv_nhwc takes"):
        conv_nhwc(x, jnp.zeros((3, 3, 4 // kwargs.get("feature_group_count", 1), 4)), (1, 1),
                  **kwargs)
