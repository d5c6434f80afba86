"""The Python API: load a module and partition it, as the CLI does, without the CLI.

    import hlo_spmd
    m = hlo_spmd.load("model.pb")                      # path, bytes, HLO text or a Module
    r = hlo_spmd.partition(m, mesh="data=2,model=4", shard={"#0": "data,_"})
    r.module, r.report, r.serialize()                  # Module, report dict, proto bytes

``partition`` never changes the module it is given: it works on a copy, so one loaded
module can be partitioned several times (other device counts, other annotations). The
report is the dict ``hlo-spmd partition --report`` writes (:mod:`hlo_spmd.report`).
The whole pipeline mirrors XLA's ShardingPropagation + SpmdPartitioner passes.
"""
from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any, Union

from hlo_spmd.ir.module import Module
from hlo_spmd.records import Record

Source = Union[str, bytes, os.PathLike, Module]


def load(src: Source, verify: bool = True) -> Module:
    """A module from a path, serialized bytes (HloModuleProto / HloProto / HloSnapshot),
    HLO text, or a Module (returned as is). ``verify`` runs the structural verifier."""
    from hlo_spmd.ir.io import load_module, load_module_bytes, looks_like_text, verify_with_source

    if isinstance(src, Module):
        return src
    if isinstance(src, (bytes, bytearray, memoryview)):
        module = load_module_bytes(bytes(src), "<bytes>")
        if verify:
            verify_with_source(module, "<bytes>")
        return module
    if isinstance(src, str) and looks_like_text(src[:4096].encode("utf-8", "replace")):
        module = load_module_bytes(src.encode("utf-8"), "<text>")
        if verify:
            verify_with_source(module, "<text>")
        return module
    return load_module(src, verify=verify)


def copy_module(module: Module) -> Module:
    """A deep copy (through the lossless proto form)."""
    from hlo_spmd.ir.proto_io import module_from_proto, module_to_proto

    copy = module_from_proto(module_to_proto(module), module.name, consume=True)
    copy.config = dict(module.config) if isinstance(module.config, dict) else module.config
    return copy


class PartitionResult(Record):
    """The per-device program and what it took."""
    # A records.Record: a dataclass costs ~0.4-0.8 ms to create at import.
    __match_args__ = ("module", "num_partitions", "report", "warnings")
    __slots__ = __match_args__

    def __init__(self, module: Module, num_partitions: int, report: dict | None,
                 warnings: list[str] | None = None) -> None:
        self.module = module
        self.num_partitions = num_partitions
        self.report = report
        self.warnings = [] if warnings is None else warnings

    def serialize(self) -> bytes:
        """The partitioned module as serialized HloModuleProto bytes."""
        from hlo_spmd.ir.io import module_bytes

        return module_bytes(self.module)

    def text(self) -> str:
        """The partitioned module as HLO text."""
        from hlo_spmd.ir.io import module_text

        return module_text(self.module)


def annotate(module: Module, mesh: Any = None, shard: Any = None) -> Module:
    """Apply ``mesh`` / ``shard`` annotations (see :mod:`hlo_spmd.annotations.cli_spec`)
    to ``module`` in place. Without ``mesh``, the module's own Shardy mesh is used."""
    if mesh is None and not shard:
        return module  # nothing to apply: skip importing the spec parser
    from hlo_spmd.annotations.cli_spec import (apply_shards, as_shard_specs, module_mesh,
                                               parse_mesh)

    specs = as_shard_specs(shard)
    if mesh is None and not specs:
        return module
    axes = parse_mesh(mesh) if mesh is not None else module_mesh(module)
    apply_shards(module, axes, specs)
    return module


def partition(src: Source, num_partitions: int | None = None, mesh: Any = None,
              shard: Mapping[str, Any] | Sequence[str] | None = None, *,
              complete: bool = False, options: Any = None,
              propagate_to_output: bool | Sequence[bool] | None = None,
              propagate_to_parameters: bool | Sequence[bool] | None = None
              ) -> PartitionResult:
    """Complete the shardings and partition ``src`` into one per-device SPMD program.

    ``mesh``: ``"data=2,model=4"``, ``{"data": 2, "model": 4}`` or pairs; ``shard``:
    ``{"#0": "data,_", "out": "_,model"}`` or ``["#0=data,_", ...]`` (targets: instruction
    name, ``#K`` entry parameter, ``out`` / ``out#K`` result). ``num_partitions``
    defaults to what the shardings (or the mesh) imply. A Module passed in is copied
    first (inlining, annotation normalization and completion rewrite what they work on).
    ``options``: a ``hlo_spmd.passes.partition.PartitionOptions`` (e.g. windowed einsum).
    ``propagate_to_output`` / ``propagate_to_parameters``: let completion choose the
    shardings of the outputs / entry parameters, as XLA's
    ``allow_spmd_sharding_propagation_to_output`` / ``..._to_parameters``: True, False,
    or one bool per output (root tuple element) / entry parameter (a single-element list
    applies to all). None (default): the module's own setting (its HLO text header),
    else False. A module from ``jax.jit(f).lower(...)`` with out_shardings left
    unspecified wants ``propagate_to_output=True``: JAX lets XLA choose them.
    """
    module = copy_module(src) if isinstance(src, Module) else load(src)
    return partition_owned(module, num_partitions, mesh, shard, complete=complete,
                           options=options, propagate_to_output=propagate_to_output,
                           propagate_to_parameters=propagate_to_parameters)


def partition_owned(module: Module, num_partitions: int | None = None, mesh: Any = None,
                    shard: Mapping[str, Any] | Sequence[str] | None = None, *,
                    complete: bool = False, options: Any = None,
                    report: bool = True,
                    propagate_to_output: bool | Sequence[bool] | None = None,
                    propagate_to_parameters: bool | Sequence[bool] | None = None
                    ) -> PartitionResult:
    """:func:`partition` on a module the caller gives up (it is rewritten: no copy).
    ``report=False``: no report is built (``report`` is None, ``warnings`` empty), for a
    caller that reads neither (the command line with ``-q`` and no ``--report``)."""
    import math

    from hlo_spmd.passes.partition import partition_in_place

    annotate(module, mesh, shard)
    if num_partitions is None and mesh is not None:
        from hlo_spmd.annotations.cli_spec import parse_mesh

        num_partitions = math.prod(s for _, s in parse_mesh(mesh))
    result = partition_in_place(module, num_partitions, complete=complete, options=options,
                           propagate_to_output=propagate_to_output,
                           propagate_to_parameters=propagate_to_parameters)
    if not report:
        return PartitionResult(result.module, result.num_partitions, None, [])
    from hlo_spmd.report import build_report

    built = build_report(result.module, result.report.causes, result.num_partitions,
                         module, result.report.replicated_fallbacks,
                         result.report.unknown_custom_calls)
    warnings = [r["message"] for r in built["full_rematerializations"]]
    return PartitionResult(result.module, result.num_partitions, built, warnings)


__all__ = ["load", "partition", "partition_owned", "annotate", "copy_module", "PartitionResult"]
