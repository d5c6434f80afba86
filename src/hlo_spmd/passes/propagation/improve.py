"""When a candidate sharding replaces an instruction's current one (XLA's
ReturnImprovedShardingImpl): never coarser, never incompatible, manual only over
tile-maximal; partial shardings may combine into a strictly finer one."""
from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple, Union

from hlo_spmd.ir.shape import Shape
from hlo_spmd.passes.propagation import provenance as prov
from hlo_spmd.passes.propagation import sharding_ops as ops
from hlo_spmd.sharding import HloSharding, is_spatially_partitioned, is_subtiling, merge_sharding
from hlo_spmd.sharding.unreduced import is_unreduced


SAME = "same as current"


# Whether partial shardings may combine: a bool, or a function asked only when the
# verdict depends on it (propagation notes which levels an inference's answer holds at).
MayCombine = Union[bool, Callable[[], bool]]


class Verdict(NamedTuple):
    sharding: HloSharding | None   # the sharding to adopt, None to keep the current one
    reason: str                    # why not (when sharding is None)


def improved(candidate: HloSharding, current: HloSharding | None, shape: Shape,
             may_combine_partial: MayCombine, allow_aggressive: bool = False) -> Verdict:
    """The sharding to adopt given ``candidate`` (ReturnImprovedShardingImpl)."""
    if current is not None and candidate == current:
        return Verdict(None, SAME)
    if current is not None and ops.strictly_better(candidate, current):
        return Verdict(candidate, "")
    if not is_spatially_partitioned(candidate):
        return Verdict(None, prov.TILE_MAXIMAL)
    if current is None:
        return Verdict(candidate, "")
    if candidate.is_manual:
        return Verdict(None, prov.MANUAL)
    if is_unreduced(candidate) or is_unreduced(current):
        # Partial sums and reduced values are different states of a value, not finer and
        # coarser tilings of one: they never merge (and ``{unreduced}`` has no tiles to
        # compare).
        return Verdict(None, prov.INCOMPATIBLE)
    if candidate.is_tuple != current.is_tuple:
        return Verdict(None, prov.INCOMPATIBLE)
    if callable(may_combine_partial):
        may_combine_partial = may_combine_partial()
    ok, merged = merge_sharding(current, candidate, may_combine_partial)
    if not ok:
        return Verdict(None, prov.NOT_FINER)
    # (candidate and current are both tuples or both not, from here on)
    if (not allow_aggressive and not shape.is_tuple and not current.is_tile_maximal
            and not current.is_tuple and merged.num_tiles == candidate.num_tiles):
        if not is_subtiling(merged, current, shape.dims):
            return Verdict(None, prov.INCOMPATIBLE)
    return Verdict(merged, "")


def improved_sub(candidate: HloSharding, current: HloSharding | None, shape: Shape, index: int,
                 may_combine_partial: MayCombine, allow_aggressive: bool = False) -> HloSharding | None:
    """ReturnImprovedSubSharding + the tuple rebuild of MaybeImproveInstructionSubSharding:
    the whole new sharding of a tuple-shaped instruction, or None."""
    if not shape.is_tuple:
        return improved(candidate, current, shape, may_combine_partial, allow_aggressive).sharding
    sub_shape = shape.tuple_shapes[index]
    cur_sub = None if current is None else ops.sub_sharding(current, shape, index)
    v = improved(candidate, cur_sub, sub_shape, may_combine_partial, allow_aggressive)
    if v.sharding is None:
        return None
    base = current if current is not None else ops.single_tuple(shape, HloSharding.replicate())
    return ops.with_sub_sharding(base, shape, index, v.sharding)
