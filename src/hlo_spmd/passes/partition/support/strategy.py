"""Plans as data: a handler's candidate partitionings, priced before anything is emitted.

A handler lists its candidates as ``Strategy`` values, each with its price in the one cost
model (bytes per device on the wire as collectives/cost.py counts them for ``stats``, via
``reshard.reshard_price`` / ``reshard_cost`` for reshards, and the bytes of the largest new
array), picks the cheapest with ``cheapest`` and emits only that one -- the way the dot
planner (dot_plan.py) does; DTensor's strategies and XLA's sort / gather handlers compare
their options the same way. Nothing of a loser reaches the program.

The ordering key weighs communication and per-device memory the same: a strategy that
saves a little traffic by making an operand whole on every device loses to one that keeps
tensors small; ties: fewer bytes on the wire, then the earlier candidate.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Sequence

from hlo_spmd.ir.primitive_types import element_bytes
from hlo_spmd.ir.shape import Shape
from hlo_spmd.passes.partition.context import PartitionContext
from hlo_spmd.passes.partition.pvalue import PValue
from hlo_spmd.passes.partition.reshard import reshard_cost, reshard_peak, reshard_price
from hlo_spmd.sharding import HloSharding, tile_shape


class Strategy:
    """One candidate: what it is (``grid``: any planner-specific description), its price
    (``bytes`` on the wire per device, ``peak``: bytes of its largest new array) and how
    to emit it."""
    __slots__ = ("grid", "bytes", "peak", "emit")

    def __init__(self, grid: Any, nbytes: float, peak: float,
                 emit: Callable[[], PValue]) -> None:
        self.grid = grid
        self.bytes = nbytes
        self.peak = peak
        self.emit = emit

    def key(self) -> tuple[float, float]:
        """(bytes + largest new array, bytes): the module docstring's ordering."""
        return (round(self.bytes + self.peak, 3), round(self.bytes, 3))


def cheapest(cands: Sequence[Strategy]) -> Strategy | None:
    """The candidate with the smallest ``key`` (the earlier on ties), None when empty."""
    return min(cands, key=Strategy.key) if cands else None


def itemsize(shape: Shape) -> float:
    """Bytes per element (packed widths: s4 is half a byte)."""
    return element_bytes(shape.element_type)


def local_bytes(shape: Shape, s: HloSharding) -> float:
    """Bytes of one device's piece of an array of ``shape`` sharded ``s``."""
    dims = tile_shape(s, shape.dims) if s.is_tiled else tuple(shape.dims)
    return float(math.prod(dims)) * itemsize(shape)


def moves(ctx: PartitionContext,
          pairs: Sequence[tuple[PValue, HloSharding]]) -> tuple[float, float]:
    """(bytes, largest new array) of resharding every value of ``pairs`` to its target
    (reshards the cache already holds are free)."""
    nbytes, peak = 0.0, 0.0
    for pv, s in pairs:
        b, p = reshard_price(ctx, pv, s)
        nbytes, peak = nbytes + b, max(peak, p)
    return nbytes, peak


def result_move(ctx: PartitionContext, shape: Shape, src: HloSharding,
                dst: HloSharding) -> tuple[float, float]:
    """(bytes, largest new array) of taking a fresh result from ``src`` to ``dst``; the
    piece ``dst`` leaves on each device counts as new."""
    if src == dst:
        return 0.0, local_bytes(shape, dst)
    size, n = itemsize(shape), ctx.num_devices
    return (reshard_cost(shape.dims, size, src, dst, n),
            max(reshard_peak(shape.dims, size, src, dst, n), local_bytes(shape, dst)))


def result_leaves(ctx: PartitionContext, shape: Shape,
                  s: HloSharding) -> list[tuple[Shape, HloSharding]]:
    """(array shape, its sharding) of every result array of an instruction of ``shape``
    sharded ``s`` (a flat tuple, or one array)."""
    shapes = list(shape.tuple_shapes) if shape.is_tuple else [shape]
    leaves = list(s.tuple_elements) if s.is_tuple else [s] * len(shapes)
    return list(zip(shapes, leaves))


def replicated_price(ctx: PartitionContext, shape: Shape, vals: Sequence[PValue],
                     wanted: HloSharding) -> tuple[float, float]:
    """(bytes, largest new array) of ``handle_replicated``: every operand made whole,
    the whole result, its piece cut out for ``wanted``."""
    nbytes, peak = moves(ctx, [(v, HloSharding.replicate()) for v in vals
                               if not v.sharding.is_manual])
    for leaf_shape, s in result_leaves(ctx, shape, wanted):
        peak = max(peak, local_bytes(leaf_shape, HloSharding.replicate()))
        if not (s.is_manual or s.is_maximal or s.subgroup_types):
            nbytes += result_move(ctx, leaf_shape, HloSharding.replicate(), s)[0]
    return nbytes, peak
