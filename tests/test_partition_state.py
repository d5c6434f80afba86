"""The partition run's use lists (passes/partition/state.ModuleState): who reads a value,
each reader once and in program order, and the per-opcode readers a look-ahead asks."""
from __future__ import annotations

from hlo_spmd.ir.text_parser import parse_module
from hlo_spmd.passes.partition.state import ModuleState, PartitionReport

TEXT = """
HloModule m

ENTRY e {
  x = f32[8] parameter(0)
  i = s32[] parameter(1)
  sq = f32[8] multiply(x, x)
  ds = f32[2] dynamic-slice(sq, i), dynamic_slice_sizes={2}
  ds2 = f32[2] dynamic-slice(x, i), dynamic_slice_sizes={2}
  sum = f32[2] add(ds, ds2)
  ROOT t = (f32[2], f32[8]) tuple(sum, sq)
}
"""


def _state() -> tuple[ModuleState, dict]:
    module = parse_module(TEXT)
    by_name = {inst.name: inst for inst in module.entry.instructions}
    return ModuleState(module, module, 2, PartitionReport()), by_name


def test_users_lists_each_reader_once_in_program_order():
    state, at = _state()
    users = state.users()
    # x is read twice by sq (listed once), then by ds2
    assert users[id(at["x"])] == [at["sq"], at["ds2"]]
    assert users[id(at["sq"])] == [at["ds"], at["t"]]
    # the root's list ends with None: its computation's caller reads it
    assert users[id(at["t"])] == [None]
    assert id(at["i"]) in users and users[id(at["i"])] == [at["ds"], at["ds2"]]
    assert state.user_counts()[id(at["x"])] == 2


def test_readers_of_one_opcode():
    state, at = _state()
    readers = state.readers("dynamic-slice")
    assert readers[id(at["sq"])] == [at["ds"]]
    assert readers[id(at["x"])] == [at["ds2"]]
    assert readers[id(at["i"])] == [at["ds"], at["ds2"]]
    assert id(at["ds"]) not in readers     # read by add, not by a dynamic-slice
    assert state.readers("dynamic-slice") is readers   # built once
    assert state.readers("sort") == {}
