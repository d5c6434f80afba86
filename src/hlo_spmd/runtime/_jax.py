"""Lazy access to jax / jaxlib.

Nothing outside :mod:`hlo_spmd.runtime` may import jax: partitioning works without the
``xla`` extra. Every runtime function that needs the XLA runtime goes through
:func:`load_jax`, which imports jax on first use (after configuring N host CPU devices
when jax was not imported yet) and turns a missing installation into a clear
:class:`~hlo_spmd.errors.HloSpmdError`.
"""
from __future__ import annotations

import sys
from types import ModuleType
from typing import NamedTuple

from hlo_spmd.errors import HloSpmdError

MISSING_JAX_MESSAGE = "jax/jaxlib not installed: pip install hlo-spmd[xla]"

#: Host CPU devices requested when the runtime imports jax itself.
DEFAULT_HOST_DEVICES = 8


class JaxModules(NamedTuple):
    """The handful of jax / jaxlib modules the runtime uses."""

    jax: ModuleType
    xla_client: ModuleType
    hlo: ModuleType  # jaxlib._hlo


def jax_imported() -> bool:
    """True when jax has already been imported in this process."""
    return "jax" in sys.modules


def load_jax(min_devices: int = 1) -> JaxModules:
    """Import jax/jaxlib (configuring host devices first if jax is not imported yet).

    Raises :class:`HloSpmdError` if jax/jaxlib are missing.
    """
    if not jax_imported():
        from hlo_spmd.runtime.devices import ensure_host_devices

        ensure_host_devices(max(min_devices, DEFAULT_HOST_DEVICES))
    try:
        import jax
        from jaxlib import _hlo, xla_client
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise HloSpmdError(MISSING_JAX_MESSAGE) from exc
    return JaxModules(jax, xla_client, _hlo)


def cpu_devices(n: int) -> list:
    """The first ``n`` CPU devices, or an :class:`HloSpmdError` if there are fewer."""
    from hlo_spmd.runtime.devices import ensure_host_devices

    ensure_host_devices(n)
    jm = load_jax(n)
    devs = jm.jax.devices("cpu")
    if len(devs) < n:  # ensure_host_devices already checked; keep the guard cheap
        raise HloSpmdError(
            f"need {n} CPU devices but jax has {len(devs)}; set "
            f"XLA_FLAGS=--xla_force_host_platform_device_count={n} before importing jax"
        )
    return list(devs[:n])
