"""Host CPU devices for running SPMD programs in one process.

XLA's CPU client creates ``N`` devices when ``XLA_FLAGS`` holds
``--xla_force_host_platform_device_count=N`` at the time jax creates its backends
(that is: before the first ``jax.devices()`` / first computation, importing jax alone
is not too late). Tests use a fixed 8 so one process can run 1, 2, 4 and 8-device
programs: a program for N devices is compiled for the first N of them.
"""
from __future__ import annotations

import os
import re
import sys

from hlo_spmd.errors import HloSpmdError

_COUNT_FLAG = "--xla_force_host_platform_device_count"
_COUNT_RE = re.compile(re.escape(_COUNT_FLAG) + r"=(\d+)")


def _requested_count(flags: str) -> int | None:
    match = _COUNT_RE.search(flags)
    return int(match.group(1)) if match else None


def _set_count_flag(n: int) -> None:
    """Make ``XLA_FLAGS`` ask for at least ``n`` host devices (other flags are kept)."""
    flags = os.environ.get("XLA_FLAGS", "")
    current = _requested_count(flags)
    if current is None:
        flags = f"{flags} {_COUNT_FLAG}={n}".strip()
    elif current < n:
        flags = _COUNT_RE.sub(f"{_COUNT_FLAG}={n}", flags)
    os.environ["XLA_FLAGS"] = flags


def _backends_initialized(jax_module) -> bool:
    """Whether jax already created its backends (then the device count is fixed)."""
    try:
        from jax._src import xla_bridge  # private, but the only way to ask

        return bool(xla_bridge.backends_are_initialized())
    except Exception:  # pragma: no cover - API moved: assume the worst
        return True


def ensure_host_devices(n: int) -> None:
    """Make sure jax's CPU backend has at least ``n`` devices.

    * jax not imported yet: set ``XLA_FLAGS=--xla_force_host_platform_device_count=N``
      (appended to any existing ``XLA_FLAGS``; an existing smaller count is raised to
      ``n``, a larger one is kept) and ``JAX_PLATFORMS=cpu`` when ``JAX_PLATFORMS`` is
      unset (a user value without ``cpu`` gets ``,cpu`` appended).
    * jax imported but its backends not created yet: the same ``XLA_FLAGS`` change
      still takes effect (and ``jax_num_cpu_devices`` is raised if it was set lower).
    * jax backends already created with fewer than ``n`` CPU devices: raise
      :class:`HloSpmdError`, because the count can no longer change in this process.

    Does not import jax when it was not imported.
    """
    if n < 1:
        raise HloSpmdError(f"device count must be >= 1, got {n}")
    jax_module = sys.modules.get("jax")
    if jax_module is None:
        _set_count_flag(n)
        platforms = os.environ.get("JAX_PLATFORMS")
        if not platforms:
            os.environ["JAX_PLATFORMS"] = "cpu"
        elif "cpu" not in platforms.split(","):
            os.environ["JAX_PLATFORMS"] = platforms + ",cpu"
        return
    if not _backends_initialized(jax_module):
        _set_count_flag(n)
        try:
            configured = int(jax_module.config.jax_num_cpu_devices)
        except Exception:  # pragma: no cover - option renamed/removed
            configured = -1
        if 0 <= configured < n:
            jax_module.config.update("jax_num_cpu_devices", n)
        return
    try:
        have = len(jax_module.devices("cpu"))
    except RuntimeError as exc:
        raise HloSpmdError(
            f"jax has no CPU backend ({exc}); set JAX_PLATFORMS=cpu before importing jax"
        ) from exc
    if have < n:
        raise HloSpmdError(
            f"need {n} host CPU devices but jax was already initialized with {have}; "
            f"set XLA_FLAGS={_COUNT_FLAG}={n} (and JAX_PLATFORMS=cpu) before jax is "
            "imported, or call hlo_spmd.runtime.ensure_host_devices() first"
        )
