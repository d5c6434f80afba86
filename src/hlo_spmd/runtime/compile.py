"""Compiling an HLO module with jaxlib's CPU client.

jaxlib 0.10 compiles StableHLO, not HLO protos, so the module is converted with
``jaxlib.xla_client._xla.mlir.hlo_to_stablehlo`` first. A module for ``N > 1``
partitions is compiled with ``use_spmd_partitioning=True`` (XLA refuses
``num_partitions > 1`` without it); a per-device program keeps XLA's own partitioner out
by carrying ``sharding={manual}`` on its entry parameters and root.
"""
from __future__ import annotations

import hashlib
from collections import OrderedDict
from typing import Any, Sequence

import numpy as np

from hlo_spmd.errors import HloSpmdError
from hlo_spmd.runtime._jax import cpu_devices, load_jax
from hlo_spmd.runtime.module_io import ModuleLike, to_proto_bytes

_CACHE_SIZE = 64
_cache: "OrderedDict[tuple[str, int], Any]" = OrderedDict()


def clear_compile_cache() -> None:
    """Forget every executable compiled by :func:`compile_module`."""
    _cache.clear()


def _first_lines(exc: BaseException, n: int = 6) -> str:
    lines = [line for line in str(exc).strip().splitlines() if line.strip()]
    return "\n".join(lines[:n])


def compile_options(num_partitions: int, device_ids: Sequence[int] | None = None):
    """``CompileOptions`` for one replica and ``num_partitions`` partitions on devices
    0..N-1, or on ``device_ids`` (partition p on ``device_ids[p]``: a multi-process run's
    global ids are not 0..N-1)."""
    xc = load_jax(num_partitions).xla_client
    n = int(num_partitions)
    options = xc.CompileOptions()
    options.num_replicas = 1
    options.num_partitions = n
    build = options.executable_build_options
    build.num_replicas = 1
    build.num_partitions = n
    build.use_spmd_partitioning = n > 1
    ids = np.arange(n) if device_ids is None else np.asarray(list(device_ids))
    assignment = xc.DeviceAssignment.create(ids.reshape(1, n))
    build.device_assignment = assignment
    options.device_assignment = assignment
    return options


def compile_module(module: ModuleLike, num_partitions: int, *, cache: bool = True):
    """Compile ``module`` (proto bytes or HLO text) for the first ``num_partitions`` CPU devices.

    Returns jaxlib's ``LoadedExecutable``. Executables are cached by module bytes and
    partition count unless ``cache=False``. XLA errors become :class:`HloSpmdError`.
    """
    if num_partitions < 1:
        raise HloSpmdError(f"num_partitions must be >= 1, got {num_partitions}")
    proto_bytes = to_proto_bytes(module)
    key = (hashlib.sha256(proto_bytes).hexdigest(), int(num_partitions))
    if cache and key in _cache:
        _cache.move_to_end(key)
        return _cache[key]
    devices = cpu_devices(num_partitions)
    jm = load_jax(num_partitions)
    xc = jm.xla_client
    try:
        stablehlo = xc._xla.mlir.hlo_to_stablehlo(proto_bytes)
    except Exception as exc:
        raise HloSpmdError("XLA could not import the module (HLO -> StableHLO): "
                           + _first_lines(exc)) from exc
    client = devices[0].client
    try:
        executable = client.compile_and_load(
            stablehlo, xc.DeviceList(tuple(devices)), compile_options(num_partitions)
        )
    except Exception as exc:
        raise HloSpmdError(
            f"XLA failed to compile the module for {num_partitions} partition(s): "
            + _first_lines(exc)
        ) from exc
    if cache:
        _cache[key] = executable
        while len(_cache) > _CACHE_SIZE:
            _cache.popitem(last=False)
    return executable
