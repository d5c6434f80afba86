"""Re-express a module's mesh shardings on a mesh of other axis sizes (tests, benchmarks).

The generated fixtures shard over a 2x4 (data x model) mesh with iota tile assignments;
their tile dims and iota reshape dims of 2, 4 and 8 are the data axis, the model axis and
both. ``rescale_mesh`` maps those sizes (e.g. {2: 32, 4: 64, 8: 2048}) and keeps each iota's
transpose structure, so the same program can be partitioned for 8 or 2048 devices.
"""
from __future__ import annotations

from typing import Mapping

from hlo_spmd.ir.module import Module
from hlo_spmd.sharding import HloSharding, TileAssignment


def rescale_mesh(module: Module, mapping: Mapping[int, int]) -> None:
    """Rewrite every tiled sharding of ``module`` in place, mapping tile / reshape dims by
    ``mapping``; a non-iota tile assignment is a ValueError naming the instruction."""
    def scale(dims):
        return [mapping.get(d, d) for d in dims]

    for inst in module.instructions():
        s = inst.sharding
        if s is None:
            continue
        leaves = list(s.tuple_elements) if s.is_tuple else [s]
        new = []
        for leaf in leaves:
            if not leaf.is_tiled:
                new.append(leaf)
                continue
            ta = leaf.tile_assignment
            if not ta.is_iota:
                raise ValueError(f"{inst.name}: not an iota tile assignment: {leaf}")
            reshape = scale(ta.reshape_dims) if ta.reshape_dims else None
            scaled = TileAssignment(scale(ta.dims), reshape, ta.transpose_perm or None)
            if leaf.replicate_on_last_tile_dim:
                new.append(HloSharding.tile(scaled, replicate_on_last_tile_dim=True))
            elif leaf.subgroup_types:
                new.append(HloSharding.subgroup(scaled, leaf.subgroup_types))
            else:
                new.append(HloSharding.tile(scaled))
        inst.sharding = HloSharding.tuple(new) if s.is_tuple else new[0]
        inst.source_sharding = None
