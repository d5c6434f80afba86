"""Hand-written HLO modules for tests/test_runtime_harness.py.

Each case pairs an annotated *original* module (runs on one device) with a hand-written
per-device SPMD program (entry parameters and root ``sharding={manual}``), the global
shardings of its parameters and outputs, and a numpy reference. Some cases are wrong on
purpose: the harness must catch them.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

ADD_F32 = """
add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT c = f32[] add(a, b)
}
"""


@dataclass(frozen=True)
class Case:
    name: str
    num_partitions: int
    original: str
    partitioned: str
    param_shardings: Sequence[str]
    output_sharding: str
    input_shapes: Sequence[tuple[int, ...]]
    reference: Callable[..., list[np.ndarray]]
    input_specs: Sequence[str | None] = field(default_factory=tuple)

    def inputs(self, seed: int = 0) -> list[np.ndarray]:
        rng = np.random.default_rng(seed)
        return [rng.normal(size=s).astype(np.float32) for s in self.input_shapes]


# (a) row-sharded matmul on 2 devices: no communication at all.
ROW_MATMUL = Case(
    name="row_matmul",
    num_partitions=2,
    original="""
HloModule row_matmul

ENTRY main {
  x = f32[8,16] parameter(0), sharding={devices=[2,1]<=[2]}
  w = f32[16,8] parameter(1), sharding={replicated}
  ROOT d = f32[8,8] dot(x, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}, sharding={devices=[2,1]<=[2]}
}
""",
    partitioned="""
HloModule row_matmul_spmd

ENTRY main {
  x = f32[4,16] parameter(0), sharding={manual}
  w = f32[16,8] parameter(1), sharding={manual}
  ROOT d = f32[4,8] dot(x, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}, sharding={manual}
}
""",
    param_shardings=("{devices=[2,1]<=[2]}", "{replicated}"),
    output_sharding="{devices=[2,1]<=[2]}",
    input_shapes=((8, 16), (16, 8)),
    reference=lambda x, w: [x @ w],
)

# (a) contracting dim sharded 4 ways: local dot + all-reduce -> replicated result.
_CONTRACTING_PARTITIONED = """
HloModule contracting_matmul_spmd
""" + ADD_F32 + """
ENTRY main {
  x = f32[4,4] parameter(0), sharding={manual}
  w = f32[4,8] parameter(1), sharding={manual}
  d = f32[4,8] dot(x, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT ar = f32[4,8] all-reduce(d), channel_id=1, replica_groups={{0,1,2,3}}, use_global_device_ids=true, to_apply=add, sharding={manual}
}
"""
CONTRACTING_MATMUL = Case(
    name="contracting_matmul",
    num_partitions=4,
    original="""
HloModule contracting_matmul

ENTRY main {
  x = f32[4,16] parameter(0), sharding={devices=[1,4]<=[4]}
  w = f32[16,8] parameter(1), sharding={devices=[4,1]<=[4]}
  ROOT d = f32[4,8] dot(x, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}, sharding={replicated}
}
""",
    partitioned=_CONTRACTING_PARTITIONED,
    param_shardings=("{devices=[1,4]<=[4]}", "{devices=[4,1]<=[4]}"),
    output_sharding="{replicated}",
    input_shapes=((4, 16), (16, 8)),
    reference=lambda x, w: [x @ w],
)

# (d) ... the same program that forgets its all-reduce.
CONTRACTING_NO_ALL_REDUCE = Case(
    name="contracting_no_all_reduce",
    num_partitions=4,
    original=CONTRACTING_MATMUL.original,
    partitioned="""
HloModule contracting_matmul_spmd_wrong

ENTRY main {
  x = f32[4,4] parameter(0), sharding={manual}
  w = f32[4,8] parameter(1), sharding={manual}
  ROOT d = f32[4,8] dot(x, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}, sharding={manual}
}
""",
    param_shardings=CONTRACTING_MATMUL.param_shardings,
    output_sharding="{replicated}",
    input_shapes=CONTRACTING_MATMUL.input_shapes,
    reference=CONTRACTING_MATMUL.reference,
)

# (b) uneven: 10 rows over 4 devices (3,3,3,1 real rows; device 3 has 2 padding rows).
# Output 0: column sums, the padding rows masked with partition-id before reducing.
# Output 1: 2*x, still row sharded (uneven) - reassembly must drop the padding rows.
_UNEVEN_TEMPLATE = """
HloModule uneven_spmd
""" + ADD_F32 + """
ENTRY main {
  x = f32[3,3] parameter(0), sharding={manual}
  zero = f32[] constant(0)
  %MASK%
  ps = f32[3] reduce(xm, zero), dimensions={0}, to_apply=add
  s = f32[3] all-reduce(ps), channel_id=1, replica_groups={{0,1,2,3}}, use_global_device_ids=true, to_apply=add
  two = f32[] constant(2)
  tb = f32[3,3] broadcast(two), dimensions={}
  y = f32[3,3] multiply(x, tb)
  ROOT t = (f32[3], f32[3,3]) tuple(s, y), sharding={{manual}, {manual}}
}
"""
_MASK = """pid = u32[] partition-id()
  three = u32[] constant(3)
  offset = u32[] multiply(pid, three)
  offsets = u32[3,3] broadcast(offset), dimensions={}
  local_row = u32[3,3] iota(), iota_dimension=0
  row = u32[3,3] add(local_row, offsets)
  ten = u32[] constant(10)
  limit = u32[3,3] broadcast(ten), dimensions={}
  valid = pred[3,3] compare(row, limit), direction=LT
  zeros = f32[3,3] broadcast(zero), dimensions={}
  xm = f32[3,3] select(valid, x, zeros)"""
UNEVEN = Case(
    name="uneven_masked",
    num_partitions=4,
    original="""
HloModule uneven
""" + ADD_F32 + """
ENTRY main {
  x = f32[10,3] parameter(0), sharding={devices=[4,1]<=[4]}
  zero = f32[] constant(0)
  s = f32[3] reduce(x, zero), dimensions={0}, to_apply=add, sharding={replicated}
  two = f32[] constant(2)
  tb = f32[10,3] broadcast(two), dimensions={}
  y = f32[10,3] multiply(x, tb), sharding={devices=[4,1]<=[4]}
  ROOT t = (f32[3], f32[10,3]) tuple(s, y), sharding={{replicated}, {devices=[4,1]<=[4]}}
}
""",
    partitioned=_UNEVEN_TEMPLATE.replace("%MASK%", _MASK),
    param_shardings=("{devices=[4,1]<=[4]}",),
    output_sharding="{{replicated}, {devices=[4,1]<=[4]}}",
    input_shapes=((10, 3),),
    reference=lambda x: [x.sum(axis=0), 2 * x],
)

# (d) ... the same program without the mask: right only if padding happens to be 0.
UNEVEN_LEAKY = Case(
    name="uneven_leaky",
    num_partitions=4,
    original=UNEVEN.original,
    partitioned=_UNEVEN_TEMPLATE.replace("%MASK%", "xm = f32[3,3] copy(x)"),
    param_shardings=UNEVEN.param_shardings,
    output_sharding=UNEVEN.output_sharding,
    input_shapes=UNEVEN.input_shapes,
    reference=UNEVEN.reference,
)

# (c) all-gather: row-sharded input gathered to a replicated result.
ALL_GATHER = Case(
    name="all_gather",
    num_partitions=4,
    original="""
HloModule all_gather

ENTRY main {
  x = f32[8,4] parameter(0), sharding={devices=[4,1]<=[4]}
  ROOT n = f32[8,4] negate(x), sharding={replicated}
}
""",
    partitioned="""
HloModule all_gather_spmd

ENTRY main {
  x = f32[2,4] parameter(0), sharding={manual}
  ag = f32[8,4] all-gather(x), channel_id=1, replica_groups={{0,1,2,3}}, dimensions={0}, use_global_device_ids=true
  ROOT n = f32[8,4] negate(ag), sharding={manual}
}
""",
    param_shardings=("{devices=[4,1]<=[4]}",),
    output_sharding="{replicated}",
    input_shapes=((8, 4),),
    reference=lambda x: [-x],
)

# (c) reduce-scatter on a 4x2 mesh of 8 devices (device = 2*a + b), iota replica groups.
# x[M=4, K=16]: M over b, K over a.  w[K=16, N=8]: K over a, replicated over b.
# Local dot gives partial sums over a's K-chunk; reduce-scatter over the a-groups
# {0,2,4,6},{1,3,5,7} (= [2,4]<=[4,2]T(1,0)) leaves N split over a.
# Output 1 returns -w, partially replicated, to exercise the replica check.
REDUCE_SCATTER = Case(
    name="reduce_scatter_iota",
    num_partitions=8,
    original="""
HloModule reduce_scatter
""" + ADD_F32 + """
ENTRY main {
  x = f32[4,16] parameter(0), sharding={devices=[2,4]<=[4,2]T(1,0)}
  w = f32[16,8] parameter(1), sharding={devices=[4,1,2]<=[8] last_tile_dim_replicate}
  d = f32[4,8] dot(x, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}, sharding={devices=[2,4]<=[4,2]T(1,0)}
  nw = f32[16,8] negate(w), sharding={devices=[4,1,2]<=[8] last_tile_dim_replicate}
  ROOT t = (f32[4,8], f32[16,8]) tuple(d, nw), sharding={{devices=[2,4]<=[4,2]T(1,0)}, {devices=[4,1,2]<=[8] last_tile_dim_replicate}}
}
""",
    partitioned="""
HloModule reduce_scatter_spmd
""" + ADD_F32 + """
ENTRY main {
  x = f32[2,4] parameter(0), sharding={manual}
  w = f32[4,8] parameter(1), sharding={manual}
  d = f32[2,8] dot(x, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  rs = f32[2,2] reduce-scatter(d), channel_id=1, replica_groups=[2,4]<=[4,2]T(1,0), use_global_device_ids=true, dimensions={1}, to_apply=add
  nw = f32[4,8] negate(w)
  ROOT t = (f32[2,2], f32[4,8]) tuple(rs, nw), sharding={{manual}, {manual}}
}
""",
    param_shardings=("{devices=[2,4]<=[4,2]T(1,0)}",
                     "{devices=[4,1,2]<=[8] last_tile_dim_replicate}"),
    output_sharding=("{{devices=[2,4]<=[4,2]T(1,0)}, "
                     "{devices=[4,1,2]<=[8] last_tile_dim_replicate}}"),
    input_shapes=((4, 16), (16, 8)),
    reference=lambda x, w: [x @ w, -w],
)

# (c) all-to-all, explicit replica group: rows sharded -> columns sharded.
# Local [2,8] -> reshape [2,4,2] -> transpose [4,2,2] (chunk j = columns 2j..2j+1)
# -> all-to-all on dim 0 (chunk j to device j; received chunk i = rows of device i)
# -> reshape [8,2].
ALL_TO_ALL = Case(
    name="all_to_all",
    num_partitions=4,
    original="""
HloModule all_to_all

ENTRY main {
  x = f32[8,8] parameter(0), sharding={devices=[4,1]<=[4]}
  ROOT n = f32[8,8] negate(x), sharding={devices=[1,4]<=[4]}
}
""",
    partitioned="""
HloModule all_to_all_spmd

ENTRY main {
  x = f32[2,8] parameter(0), sharding={manual}
  r = f32[2,4,2] reshape(x)
  t = f32[4,2,2] transpose(r), dimensions={1,0,2}
  a2a = f32[4,2,2] all-to-all(t), channel_id=1, replica_groups={{0,1,2,3}}, dimensions={0}
  cols = f32[8,2] reshape(a2a)
  ROOT n = f32[8,2] negate(cols), sharding={manual}
}
""",
    param_shardings=("{devices=[4,1]<=[4]}",),
    output_sharding="{devices=[1,4]<=[4]}",
    input_shapes=((8, 8),),
    reference=lambda x: [-x],
)

# (c) collective-permute: roll rows by one shard (2 rows) = each device takes the shard
# of its left neighbour.
_PERMUTE_TEMPLATE = """
HloModule roll_spmd

ENTRY main {
  x = f32[2,3] parameter(0), sharding={manual}
  ROOT cp = f32[2,3] collective-permute(x), channel_id=1, source_target_pairs=%PAIRS%, sharding={manual}
}
"""
COLLECTIVE_PERMUTE = Case(
    name="collective_permute",
    num_partitions=4,
    original="""
HloModule roll

ENTRY main {
  x = f32[8,3] parameter(0), sharding={devices=[4,1]<=[4]}
  tail = f32[2,3] slice(x), slice={[6:8], [0:3]}
  head = f32[6,3] slice(x), slice={[0:6], [0:3]}
  ROOT c = f32[8,3] concatenate(tail, head), dimensions={0}, sharding={devices=[4,1]<=[4]}
}
""",
    partitioned=_PERMUTE_TEMPLATE.replace("%PAIRS%", "{{0,1},{1,2},{2,3},{3,0}}"),
    param_shardings=("{devices=[4,1]<=[4]}",),
    output_sharding="{devices=[4,1]<=[4]}",
    input_shapes=((8, 3),),
    reference=lambda x: [np.roll(x, 2, axis=0)],
)

# (d) ... sent to the wrong neighbour (rolls the other way).
PERMUTE_WRONG_NEIGHBOUR = Case(
    name="permute_wrong_neighbour",
    num_partitions=4,
    original=COLLECTIVE_PERMUTE.original,
    partitioned=_PERMUTE_TEMPLATE.replace("%PAIRS%", "{{0,3},{1,0},{2,1},{3,2}}"),
    param_shardings=COLLECTIVE_PERMUTE.param_shardings,
    output_sharding=COLLECTIVE_PERMUTE.output_sharding,
    input_shapes=COLLECTIVE_PERMUTE.input_shapes,
    reference=COLLECTIVE_PERMUTE.reference,
)

# A partially replicated output whose replicas disagree (adds the partition id).
REPLICAS_DISAGREE = Case(
    name="replicas_disagree",
    num_partitions=4,
    original="""
HloModule ident

ENTRY main {
  ROOT x = f32[4,3] parameter(0), sharding={devices=[2,1,2]<=[4] last_tile_dim_replicate}
}
""",
    partitioned="""
HloModule ident_spmd

ENTRY main {
  x = f32[2,3] parameter(0), sharding={manual}
  pid = u32[] partition-id()
  p = f32[] convert(pid)
  pb = f32[2,3] broadcast(p), dimensions={}
  ROOT y = f32[2,3] add(x, pb), sharding={manual}
}
""",
    param_shardings=("{devices=[2,1,2]<=[4] last_tile_dim_replicate}",),
    output_sharding="{devices=[2,1,2]<=[4] last_tile_dim_replicate}",
    input_shapes=((4, 3),),
    reference=lambda x: [x],
)

GOOD_CASES = [ROW_MATMUL, CONTRACTING_MATMUL, UNEVEN, ALL_GATHER, REDUCE_SCATTER,
              ALL_TO_ALL, COLLECTIVE_PERMUTE]

# A shard_map-style manual region: no single-device meaning (XLA's num_partitions=1
# pipeline cannot remove the SPMDFullToShardShape / SPMDShardToFullShape pair), so its
# reference comes from XLA's own SPMD partitioner.
# Inside the region each device all-reduces its [2,4] row block; the result, tiled back
# over the rows, is the sum of the 4 blocks repeated 4 times.
MANUAL_REGION = Case(
    name="manual_region",
    num_partitions=4,
    original="""
HloModule manual_region
""" + ADD_F32 + """
ENTRY main {
  x = f32[8,4] parameter(0), sharding={devices=[4,1]<=[4]}
  xs = f32[8,4] custom-call(x), custom_call_target="Sharding", sharding={devices=[4,1]<=[4]}
  local = f32[2,4] custom-call(xs), custom_call_target="SPMDFullToShardShape", sharding={manual}
  summed = f32[2,4] all-reduce(local), channel_id=1, replica_groups={{0,1,2,3}}, use_global_device_ids=true, to_apply=add, sharding={manual}
  back = f32[2,4] custom-call(summed), custom_call_target="Sharding", sharding={manual}
  ROOT full = f32[8,4] custom-call(back), custom_call_target="SPMDShardToFullShape", sharding={devices=[4,1]<=[4]}
}
""",
    partitioned="""
HloModule manual_region_spmd
""" + ADD_F32 + """
ENTRY main {
  x = f32[2,4] parameter(0), sharding={manual}
  ROOT summed = f32[2,4] all-reduce(x), channel_id=1, replica_groups={{0,1,2,3}}, use_global_device_ids=true, to_apply=add, sharding={manual}
}
""",
    param_shardings=("{devices=[4,1]<=[4]}",),
    output_sharding="{devices=[4,1]<=[4]}",
    input_shapes=((8, 4),),
    reference=lambda x: [np.tile(x.reshape(4, 2, 4).sum(axis=0), (4, 1))],
)
