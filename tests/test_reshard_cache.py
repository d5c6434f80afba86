"""The reshard cache (XLA's PartitionedHlo reshard cache): a value resharded to a target
once is reused by every later user in the same computation and device grouping, and the
way back is remembered. Checked on small programs (collective counts, and the programs
run correctly on XLA) and on every fixture: no partitioned output holds two identical
collectives of the same operands."""
from __future__ import annotations

import glob
import json
import os

import pytest

from hlo_spmd.collectives.cost import collective_kind
from hlo_spmd.ir.io import load_module

from test_partition_shapes import check, collectives_in, module  # shared helpers

pytest.importorskip("jax")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def duplicate_collectives(out_module) -> list[tuple[str, str]]:
    """(first, duplicate) names of collectives in one computation with the same opcode,
    operands, result shape, attributes (channel id, name and ids aside) and reducer."""
    dups = []
    for comp in out_module.computations:
        seen: dict[tuple, str] = {}
        for inst in comp.instructions:
            if collective_kind(inst) is None:
                continue
            attrs = inst.attrs.__class__()
            attrs.CopyFrom(inst.attrs)
            for f in ("channel_id", "name", "id", "metadata", "operand_ids",
                      "called_computation_ids"):
                attrs.ClearField(f)
            reducer = tuple((c.root.opcode, str(c.root.shape)) for c in inst.called_computations)
            key = (inst.opcode, tuple(id(o) for o in inst.operands), str(inst.shape),
                   attrs.SerializeToString(deterministic=True), reducer)
            if key in seen:
                dups.append((seen[key], inst.name))
            else:
                seen[key] = inst.name
    return dups


def test_two_users_share_one_all_gather():
    text = module("""
  p = f32[16,8] parameter(0), sharding={devices=[4,1]<=[4]}
  a = f32[16,8] negate(p), sharding={replicated}
  b = f32[16,8] exponential(p), sharding={replicated}
  ROOT t = (f32[16,8], f32[16,8]) tuple(a, b), sharding={{replicated},{replicated}}""")
    result = check(text, 4)
    assert collectives_in(result.module) == ["all-gather"]


def _context(n: int, groups=None):
    import numpy as np

    from hlo_spmd.collectives.factory import CollectiveFactory
    from hlo_spmd.passes.partition.causes import CauseLog
    from hlo_spmd.collectives.groups import DeviceGrouping
    from hlo_spmd.ir.builder import Builder
    from hlo_spmd.ir.computation import Computation
    from hlo_spmd.ir.module import Module
    from hlo_spmd.passes.partition.context import PartitionContext
    from hlo_spmd.passes.partition.state import ModuleState, PartitionReport

    out = Module("cache")
    comp = Computation("main")
    out.add_computation(comp)
    out.entry = comp
    b = Builder(comp)
    grouping = DeviceGrouping.flat(n) if groups is None else DeviceGrouping(np.asarray(groups))
    return PartitionContext(ModuleState(out, out, n, PartitionReport()), b,
                            CollectiveFactory(b, grouping, CauseLog()))


def test_reverse_direction_is_remembered():
    from hlo_spmd.ir.primitive_types import PrimitiveType
    from hlo_spmd.ir.shape import Shape
    from hlo_spmd.passes.partition.pvalue import PValue
    from hlo_spmd.passes.partition.reshard import reshard
    from hlo_spmd.sharding import HloSharding

    ctx = _context(4)
    base = Shape.array(PrimitiveType.F32, (16, 8))
    whole = PValue(ctx.b.parameter(0, base, name="p"), base, HloSharding.replicate())
    rows = HloSharding.iota_tile([4, 1])
    sliced = reshard(ctx, whole, rows)
    assert sliced.hlo.opcode == "dynamic-slice"
    # Back to replicated: the source value itself, no all-gather.
    assert reshard(ctx, sliced, HloSharding.replicate()).hlo is whole.hlo
    # Forward again: the same dynamic-slice.
    assert reshard(ctx, whole, rows).hlo is sliced.hlo
    # Another grouping of the same computation does not share it.
    inner = ctx.in_group(ctx.grouping.subgroup([[0, 1], [2, 3]]))
    half = PValue(whole.hlo, base, HloSharding.replicate())
    assert reshard(inner, half, HloSharding.iota_tile([2, 1])).hlo is not sliced.hlo
    assert not any(i.opcode == "all-gather" for i in ctx.b.computation.instructions)


def test_reshard_twice_to_a_tiled_target_shares_the_all_to_all():
    text = module("""
  p = f32[16,16] parameter(0), sharding={devices=[4,1]<=[4]}
  a = f32[16,16] negate(p), sharding={devices=[1,4]<=[4]}
  b = f32[16,16] abs(p), sharding={devices=[1,4]<=[4]}
  ROOT c = f32[16,16] add(a, b), sharding={devices=[1,4]<=[4]}""")
    result = check(text, 4)
    assert collectives_in(result.module) == ["all-to-all"]


def _fixture_cases():
    for path in sorted(glob.glob(os.path.join(ROOT, "fixtures", "hlo", "*.pb"))):
        meta = json.load(open(path[:-3] + ".json"))
        yield pytest.param(path, meta["num_partitions"], id=os.path.basename(path)[:-3])
    for path in sorted(glob.glob(os.path.join(ROOT, "fixtures", "hlo", "handwritten", "*.hlo"))):
        n = 4 if "maximal" in path else None  # the one case whose shardings name no count
        yield pytest.param(path, n, id=os.path.basename(path)[:-4])


@pytest.mark.parametrize("path,n", list(_fixture_cases()))
def test_no_duplicate_collectives_in_fixture_outputs(path, n):
    from hlo_spmd.passes.partition import partition_in_place

    out = partition_in_place(load_module(path), n).module
    assert duplicate_collectives(out) == []
