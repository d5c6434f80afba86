"""The SPMD partitioner (GSPMD section 4): one per-device program with collectives."""
from __future__ import annotations

from typing import Sequence

from hlo_spmd.errors import ShardingError
from hlo_spmd.ir.module import Module
from hlo_spmd.passes.partition.state import PartitionOptions, PartitionReport
from hlo_spmd.passes.partition.driver import entry_interface, partition_module
from hlo_spmd.sharding import HloSharding
from hlo_spmd.records import Record


class PartitionedModule(Record):
    """What the pass pipeline returns: the per-device module, the device count and the
    pass-level ``PartitionReport`` (``hlo_spmd.PartitionResult``, the API's result, adds
    the report dict and warnings built from it)."""
    # A records.Record: a dataclass costs ~0.4-0.8 ms to create at import.
    __match_args__ = ("module", "num_partitions", "report")
    __slots__ = __match_args__

    def __init__(self, module: Module, num_partitions: int, report: PartitionReport) -> None:
        self.module = module
        self.num_partitions = num_partitions
        self.report = report


def infer_num_partitions(module: Module, requested: int | None) -> int:
    """The device count: what the shardings imply, checked against ``requested``."""
    from hlo_spmd.annotations.normalize import module_device_count

    implied = module_device_count(module)
    configured = (module.config or {}).get("num_partitions")
    if requested is None and configured and int(configured) > 1:
        requested = int(configured)  # HLO text header: num_partitions=N
    if requested is not None:
        if requested < 1:
            raise ShardingError(f"--num-partitions must be at least 1, got {requested}")
        if implied is not None and implied != requested:
            raise ShardingError(f"the module's shardings use {implied} devices but "
                                f"--num-partitions is {requested}")
        return requested
    if implied is None:
        raise ShardingError("no sharding names a device count; pass --num-partitions N")
    return implied


def debug_verify(module: Module, after: str) -> None:
    """With HLO_SPMD_DEBUG=1, run the structural verifier after every pass, naming it."""
    import os

    if not os.environ.get("HLO_SPMD_DEBUG"):
        return
    from hlo_spmd.errors import HloSpmdError
    from hlo_spmd.ir.verifier import verify_module

    try:
        verify_module(module)
    except HloSpmdError as e:
        e.message = f"after {after}: {e.message}"
        e.args = (f"{e.where}: {e.message}" if e.where else e.message,)
        raise


def prepare(module: Module, num_partitions: int | None = None, *,
            complete: bool = False,
            propagate_to_output: bool | Sequence[bool] | None = None,
            propagate_to_parameters: bool | Sequence[bool] | None = None) -> int:
    """What :func:`partition_in_place` does before partitioning, in place: inline calls,
    normalize annotations and complete the shardings (unless ``complete``). Returns the
    device count.

    ``propagate_to_output`` / ``propagate_to_parameters``: let completion choose the
    shardings of the outputs / entry parameters (XLA's
    ``allow_spmd_sharding_propagation_to_*``: a bool, or one per output / parameter);
    None takes the module's own setting (its HLO text header), else False."""
    from hlo_spmd.annotations import normalize_annotations
    from hlo_spmd.passes.inline_calls import inline_calls

    if not complete:
        inline_calls(module)  # as XLA does before sharding propagation
        debug_verify(module, "call inlining")
    annotations = normalize_annotations(module)
    n = infer_num_partitions(module, num_partitions)
    if not complete:
        from hlo_spmd.passes.propagation import propagate

        config = module.config if isinstance(module.config, dict) else {}
        if propagate_to_output is None:
            propagate_to_output = config.get("allow_spmd_sharding_propagation_to_output", False)
        if propagate_to_parameters is None:
            propagate_to_parameters = config.get(
                "allow_spmd_sharding_propagation_to_parameters", False)
        # The report just made: nothing changed the module since (saves a second
        # normalization pass inside propagate).
        propagate(module, annotations=annotations,
                  propagate_to_output=propagate_to_output,
                  propagate_to_parameters=propagate_to_parameters)
        debug_verify(module, "sharding completion")
    return n


def interface_shardings(module: Module, num_partitions: int | None = None, *,
                        complete: bool = False,
                        propagate_to_output: bool | Sequence[bool] | None = None,
                        propagate_to_parameters: bool | Sequence[bool] | None = None
                        ) -> tuple[list[HloSharding], HloSharding]:
    """The global shardings :func:`partition_in_place` records for ``module``'s entry
    parameters (``spmd_parameters_shardings``) and result (``spmd_output_sharding``), without
    partitioning: for a partitioned module that does not carry them (HLO text has no
    syntax for them). Completes ``module`` in place, as :func:`partition_in_place` would."""
    prepare(module, num_partitions, complete=complete,
            propagate_to_output=propagate_to_output,
            propagate_to_parameters=propagate_to_parameters)
    return entry_interface(module)


def partition_in_place(module: Module, num_partitions: int | None = None, *,
                       complete: bool = False, verify: bool = True,
                       options: PartitionOptions | None = None,
                       propagate_to_output: bool | Sequence[bool] | None = None,
                       propagate_to_parameters: bool | Sequence[bool] | None = None
                       ) -> PartitionedModule:
    """Complete the shardings (unless ``complete``) and partition ``module`` in place (the
    pass pipeline, the one implementation; ``hlo_spmd.partition`` is the API over it,
    which loads or copies its input and builds the report). The shardings completion
    chooses for the outputs / parameters (see :func:`prepare`) are the output's interface
    (``spmd_output_sharding`` / ``spmd_parameters_shardings``)."""
    n = prepare(module, num_partitions, complete=complete,
                propagate_to_output=propagate_to_output,
                propagate_to_parameters=propagate_to_parameters)
    out, report = partition_module(module, n, options)
    if verify:
        from hlo_spmd.ir.verifier import verify_module

        verify_module(out)
    return PartitionedModule(out, n, report)
