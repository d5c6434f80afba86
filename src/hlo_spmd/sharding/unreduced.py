"""Unreduced (partial-sum) shardings: recognising them and adding the partial sums up.

``{unreduced}`` and tiled shardings with an ``unreduced`` subgroup (XLA's UNREDUCED
type, JAX's unreduced axes) say that the devices of one unreduced group hold partial
sums of the same tile.  ``reduced`` is the sharding of the summed value: the unreduced
devices replicate it instead.
"""
from __future__ import annotations

from hlo_spmd.sharding.hlo_sharding import HloSharding, ShardingType

__all__ = ["is_unreduced", "reduced", "reduce_all"]


def is_unreduced(s: HloSharding | None) -> bool:
    """A leaf sharding some of whose devices hold partial sums."""
    if s is None or s.is_tuple:
        return False
    return s.is_unreduced or ShardingType.UNREDUCED in s.subgroup_types


def reduced(s: HloSharding) -> HloSharding:
    """``s`` with its partial sums added up (unreduced devices replicate instead)."""
    if s.is_unreduced:
        return HloSharding.replicate(s.metadata)
    if not is_unreduced(s):
        return s
    ta = s.tile_assignment
    assert ta is not None
    types = [ShardingType.REPLICATED if t == ShardingType.UNREDUCED else t
             for t in s.subgroup_types]
    return HloSharding.subgroup(ta, types, s.metadata)


def reduce_all(s: HloSharding) -> HloSharding:
    """``reduced`` on every leaf (tuples too)."""
    if s.is_tuple:
        leaves = s.tuple_elements
        if (not any(is_unreduced(e) for e in leaves) and not s.metadata
                and s.named is None and s.shard_group is None):
            return s  # the rebuilt tuple would hold the same leaves and nothing else
        return HloSharding.tuple([reduced(e) for e in leaves])
    return reduced(s)
