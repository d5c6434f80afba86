"""Run HLO modules on the real XLA runtime (jaxlib's CPU client): the ``xla`` extra.

Importing this package does not import jax; the functions do, lazily, and raise
:class:`hlo_spmd.errors.HloSpmdError` if jax/jaxlib are missing.

* :func:`ensure_host_devices` - N host CPU devices in one process.
* :func:`compile_module` - HLO proto / text -> loaded executable on the first N devices.
* :func:`run_unpartitioned` - run a (possibly annotated) module on one device.
* :func:`run_partitioned` - run a per-device SPMD program on N devices, global in / out.
* :func:`run_xla_spmd` - run an annotated module through XLA's own SPMD partitioner.
* :func:`verify` - run both and :func:`compare`; returns a :class:`ComparisonReport`.
* :func:`random_inputs` - deterministic inputs from spec strings.
* :func:`shard_pieces` / :func:`assemble` - global array <-> per-device pieces.
"""
from hlo_spmd.runtime.compare import ComparisonReport, OutputComparison, compare
from hlo_spmd.runtime.compile import clear_compile_cache, compile_module
from hlo_spmd.runtime.devices import ensure_host_devices
from hlo_spmd.runtime.inputs import random_inputs
from hlo_spmd.runtime.module_io import (
    entry_signature,
    read_spmd_shardings,
    strip_shardings,
    to_proto_bytes,
    with_spmd_shardings,
)
from hlo_spmd.runtime.run import (
    PartitionedRun,
    ReplicaMismatchError,
    UnpartitionedRunError,
    execute_per_device,
    run_partitioned,
    run_partitioned_detailed,
    run_unpartitioned,
    run_xla_spmd,
    verify,
)
from hlo_spmd.runtime.slicing import assemble, assemble_checked, shard_pieces

__all__ = [
    "ComparisonReport",
    "OutputComparison",
    "PartitionedRun",
    "ReplicaMismatchError",
    "assemble",
    "assemble_checked",
    "clear_compile_cache",
    "compare",
    "compile_module",
    "ensure_host_devices",
    "entry_signature",
    "execute_per_device",
    "random_inputs",
    "read_spmd_shardings",
    "run_partitioned",
    "run_partitioned_detailed",
    "run_unpartitioned",
    "run_xla_spmd",
    "UnpartitionedRunError",
    "shard_pieces",
    "strip_shardings",
    "to_proto_bytes",
    "verify",
    "with_spmd_shardings",
]
