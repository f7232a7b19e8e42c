"""A 2-D convolution whose gradients XLA's CPU backend runs on its fast path inside loops.

XLA's CPU backend runs a convolution with Eigen's kernels only when it is
"canonical": input NHWC, kernel HWIO, output NHWC, no window reversal
(``PotentiallyImplementedAsEigenConvolution`` in ``xla/service/cpu/ir_emission_utils.cc``);
any other falls to a generic loop nest that is many times slower. JAX's
autodiff writes a convolution's two gradients as non-canonical convolutions
(the kernel's gradient with batch and features swapped, ``f01b_i01o->01bf``;
the input's with a reversed, ``01oi`` kernel). The pass that rewrites such
convolutions into canonical ones with explicit transposes
(``ConvCanonicalization``, ``xla/service/cpu/conv_canonicalization.cc``)
visits only the program's entry computation, not the body of a loop, and the
learner's update runs its minibatches in a ``lax.scan`` (a loop). So in the
update, the Nature CNN's forward and backward over a minibatch of 256 frames
ran about 7x slower than the same gradient jitted alone
(``experiments/cnn_update.py``).

`conv_nhwc` is ``lax.conv_general_dilated`` (VALID padding, NHWC / HWIO,
strides, nothing else) with a custom VJP whose two gradients are canonical
convolutions written with the transposes explicit: what ``ConvCanonicalization``
would have made of them. Its forward is the same call, so the forward's bits
do not change; its gradients equal autodiff's up to the order of float
sums (tests/networks/test_conv.py). The canonical form is chosen for the CPU
only (``lax.platform_dependent``): on a GPU or TPU the backward is autodiff's,
as before. Being a ``custom_vjp``, it has no forward-mode derivative (``jax.jvp``,
``jax.jacfwd``); nothing in the package takes one.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

NHWC = ("NHWC", "HWIO", "NHWC")


def _lax_conv(x: jax.Array, kernel: jax.Array, strides: tuple[int, int]) -> jax.Array:
    return lax.conv_general_dilated(x, kernel, strides, "VALID", dimension_numbers=NHWC)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _conv(x: jax.Array, kernel: jax.Array, strides: tuple[int, int]) -> jax.Array:
    return _lax_conv(x, kernel, strides)


def _conv_forward(x, kernel, strides):
    return _lax_conv(x, kernel, strides), (x, kernel)


def canonical_gradients(strides: tuple[int, int], x: jax.Array, kernel: jax.Array,
                        output_cotangent: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``(d x, d kernel)`` of a VALID NHWC conv, each one canonical convolution.

    For ``y = conv(x, w)`` with ``x [N, H, W, C]``, ``w [kh, kw, C, O]``, stride
    ``s`` and ``dy [N, Ho, Wo, O]``:

    - ``dx = conv(dilate_s(dy), flip(w)^T)``, padded ``kh - 1`` below and
      ``kh - 1 + (H - kh) mod s`` above (the rows no window reached get zeros),
      with the kernel flipped in space and its features swapped, ``[kh, kw, O, C]``;
    - ``dw[a, b, c, o] = sum_{n,i,j} x[n, s i + a, s j + b, c] dy[n, i, j, o]``:
      a conv of ``x`` as ``[C, H, W, N]`` (channels as the batch) with ``dy`` as
      the kernel ``[Ho, Wo, N, O]`` dilated by ``s``, transposed back to ``[kh, kw, C, O]``.
    """
    kh, kw = kernel.shape[:2]
    _, height, width, _ = x.shape
    _, out_height, out_width, _ = output_cotangent.shape
    sh, sw = strides
    flipped = jnp.flip(kernel, (0, 1)).transpose(0, 1, 3, 2)  # [kh, kw, O, C]
    padding = ((kh - 1, kh - 1 + (height - kh) % sh), (kw - 1, kw - 1 + (width - kw) % sw))
    dx = lax.conv_general_dilated(output_cotangent, flipped, (1, 1), padding,
                                  lhs_dilation=strides, dimension_numbers=NHWC)
    reached = x[:, :(out_height - 1) * sh + kh, :(out_width - 1) * sw + kw]
    dw = lax.conv_general_dilated(reached.transpose(3, 1, 2, 0),
                                  output_cotangent.transpose(1, 2, 0, 3), (1, 1), "VALID",
                                  rhs_dilation=strides, dimension_numbers=NHWC)
    return dx, dw.transpose(1, 2, 0, 3)


def _autodiff_gradients(strides, x, kernel, output_cotangent):
    _, vjp = jax.vjp(lambda x, kernel: _lax_conv(x, kernel, strides), x, kernel)
    return vjp(output_cotangent)


def _conv_backward(strides, residuals, output_cotangent):
    x, kernel = residuals
    return lax.platform_dependent(
        x, kernel, output_cotangent,
        cpu=functools.partial(canonical_gradients, strides),
        default=functools.partial(_autodiff_gradients, strides))


_conv.defvjp(_conv_forward, _conv_backward)


def conv_nhwc(inputs: jax.Array, kernel: jax.Array, window_strides: Sequence[int],
              padding: Any, lhs_dilation: Sequence[int] | None = None,
              rhs_dilation: Sequence[int] | None = None, dimension_numbers: Any = None,
              feature_group_count: int = 1, precision: Any = None) -> jax.Array:
    """``lax.conv_general_dilated`` for ``flax.linen.Conv(conv_general_dilated=conv_nhwc)``.

    ``inputs [N, H, W, C]`` (any leading dims flattened by flax already),
    ``kernel [kh, kw, C, O]``: VALID padding, strides, no dilation, one
    feature group, default precision; anything else raises ValueError (the
    torsos of `ppo_async.networks.actor_critic` need nothing else).
    """
    dilated = any(d != 1 for d in (*(lhs_dilation or ()), *(rhs_dilation or ())))
    nhwc = dimension_numbers is None or lax.conv_dimension_numbers(
        inputs.shape, kernel.shape, NHWC) == dimension_numbers
    if (padding != "VALID" or dilated or feature_group_count != 1 or precision is not None
            or not nhwc or inputs.ndim != 4):
        raise ValueError(
            "conv_nhwc takes 2-D NHWC convolutions with VALID padding and strides only; got "
            f"padding={padding!r}, lhs_dilation={lhs_dilation}, rhs_dilation={rhs_dilation}, "
            f"feature_group_count={feature_group_count}, precision={precision}, "
            f"input rank {inputs.ndim}")
    return _conv(inputs, kernel, tuple(int(s) for s in window_strides))
