"""Newer Shardy attributes honoured by completion: sharding groups and propagation barriers.

(Open / closed dims of ``xla.sdy.sharding`` become unspecified dims, tested in
test_annotations; GlobalToLocalShape manual computations run in test_partition_fixtures.)
"""
from __future__ import annotations

from pathlib import Path

import pytest

from hlo_spmd.ir.io import load_module, load_module_bytes, module_bytes
from hlo_spmd.passes.propagation import propagate
from hlo_spmd.sharding import parse_sharding

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "hlo"
TILED = parse_sharding("{devices=[2,4]<=[8]}")


def test_sdy_sharding_group_shards_members_alike():
    module = load_module(FIXTURES / "shardy_sharding_group.pb")
    propagate(module)
    by = {i.name: i for i in module.instructions()}
    assert by["sin.1"].sharding == TILED
    # cos(b) has no sharding source of its own: only the group (shard_alike) gives it one.
    assert by["cos.1"].sharding == TILED


BARRIER = """HloModule m, num_partitions=8

ENTRY %e (x: f32[8,16], y: f32[8,16]) -> (f32[8,16], f32[8,16]) {
  %x = f32[8,16] parameter(0), sharding=X_SHARDING
  %s = f32[8,16] sine(%x)
  %b = f32[8,16] custom-call(%s), custom_call_target="xla.sdy.PropagationBarrier", frontend_attributes={xla.sdy.allowed_direction="DIR"}
  %c = f32[8,16] cosine(%b), sharding=C_SHARDING
  %y = f32[8,16] parameter(1), sharding={replicated}
  ROOT %t = (f32[8,16], f32[8,16]) tuple(%c, %y)
}
"""


def _propagated(direction: str, x: str, c: str):
    text = BARRIER.replace("DIR", direction).replace("X_SHARDING", x).replace("C_SHARDING", c)
    text = text.replace(", sharding={}", "")
    module = load_module_bytes(text.encode())
    propagate(module)
    return {i.name: i.sharding for i in module.instructions()}


@pytest.mark.parametrize("direction, passes", [("NONE", False), ("FORWARD", True),
                                               ("BACKWARD", False), ("BOTH", True)])
def test_barrier_forward(direction, passes):
    got = _propagated(direction, "{devices=[2,4]<=[8]}", "{}")
    assert (got["b"] == TILED) is passes
    assert (got["c"] == TILED) is passes


@pytest.mark.parametrize("direction, passes", [("NONE", False), ("FORWARD", False),
                                               ("BACKWARD", True), ("BOTH", True)])
def test_barrier_backward(direction, passes):
    got = _propagated(direction, "{}", "{devices=[2,4]<=[8]}")
    assert (got["s"] == TILED) is passes


def test_barrier_partitions_and_runs():
    pytest.importorskip("jax")
    from hlo_spmd.passes.partition import partition_in_place
    from hlo_spmd.runtime import verify

    text = BARRIER.replace("DIR", "FORWARD").replace("X_SHARDING", "{devices=[2,4]<=[8]}") \
        .replace(", sharding=C_SHARDING", "")
    out = partition_in_place(load_module_bytes(text.encode()), 8).module
    # The reference: the same module with the barrier as a plain copy (XLA's own
    # compiler does not know Shardy's custom-calls without Shardy).
    plain = text.replace('custom-call(%s), custom_call_target="xla.sdy.PropagationBarrier", '
                         'frontend_attributes={xla.sdy.allowed_direction="FORWARD"}',
                         "copy(%s)")
    report = verify(module_bytes(load_module_bytes(plain.encode())), module_bytes(out), 8)
    assert report.ok, str(report)
