"""Device strings of the config (``'cpu'``, ``'gpu:0'``) to the ``jax.Device`` they name."""

from __future__ import annotations

import jax

from ppo_async.config import ConfigError, parse_device_spec


def resolve_device(spec: str | None):
    """The ``jax.Device`` a config device string names (``None``: the default device)."""
    if spec is None:
        return jax.devices()[0]
    parsed = parse_device_spec(spec) if isinstance(spec, str) else None
    if parsed is None:
        raise ConfigError(f"device {spec!r}: must look like 'cpu', 'gpu:0' or 'cpu:1'")
    platform, index = parsed
    try:
        devices = jax.devices(platform)
    except RuntimeError as error:
        raise ConfigError(f"device {spec!r}: no {platform} backend here ({error})") from None
    if index >= len(devices):
        raise ConfigError(
            f"device {spec!r}: only {len(devices)} {platform} device(s) here "
            "(on CPU, XLA_FLAGS=--xla_force_host_platform_device_count=N makes N)"
        )
    return devices[index]
