"""The per-instruction partition path's shortcuts behave as the general code they replace
(the driver's scope per instruction, per-grouping logical ids, physical table memo)."""
from __future__ import annotations

import numpy as np

from hlo_spmd.collectives.factory import CollectiveFactory
from hlo_spmd.collectives.groups import DeviceGrouping
from hlo_spmd.ir.builder import Builder
from hlo_spmd.ir.computation import Computation
from hlo_spmd.ir.module import Module
from hlo_spmd.ir.primitive_types import PrimitiveType
from hlo_spmd.ir.shape import Shape
from hlo_spmd.passes.partition.causes import CauseLog
from hlo_spmd.sharding import HloSharding


def test_enter_instruction_is_scope_none_inst():
    log = CauseLog()
    marker = object()
    src, dst = HloSharding.replicate(), HloSharding.manual()
    with log.scope("fallback", None, src, dst):
        with log.scope(None, marker) as expected:
            pass
        log.enter_instruction(marker)
        assert log.current == expected
        assert log.current.cause == "fallback" and log.current.serves is marker
        log.leave()
        assert log.current.serves is None and log.current.cause == "fallback"
    assert log.current.cause is None


def test_logical_ids_cached_read_only_and_correct():
    groups = np.array([[3, 1], [0, 2]], dtype=np.int64)
    g = DeviceGrouping(groups)
    ids = g.logical_ids()
    assert ids is g.logical_ids()
    assert not ids.flags.writeable
    assert ids.tolist() == [0, 1, 1, 0]
    assert g.expand_table(np.array([10, 20])).tolist() == [10, 20, 20, 10]


def _module() -> tuple[Module, Builder]:
    m = Module("m")
    c = Computation("e")
    m.add_computation(c)
    m.entry = c
    return m, Builder(c)


def _table_of(inst) -> list[int]:
    """The constant table a lookup reads (constant -> dynamic-slice -> reshape)."""
    from hlo_spmd.ir.literal import literal_to_numpy

    table = inst.operands[0].operands[0]
    assert table.opcode == "constant"
    return literal_to_numpy(table.attrs.literal).reshape(-1).tolist()


def test_logical_table_memo_keys_on_grouping():
    _, b = _module()
    flat = CollectiveFactory(b, DeviceGrouping.flat(4), CauseLog())
    swapped = flat.with_grouping(DeviceGrouping(np.array([[1, 0], [3, 2]], dtype=np.int64)))
    values = np.array([5, 7], dtype=np.int64)
    a = swapped.logical_table_lookup(values)
    assert _table_of(a) == [7, 5, 7, 5]
    other = flat.with_grouping(DeviceGrouping(np.array([[0, 1], [2, 3]], dtype=np.int64)))
    assert _table_of(other.logical_table_lookup(values)) == [5, 7, 5, 7]
    # same factory, same table: the instruction is shared; uniform tables are constants
    assert swapped.logical_table_lookup(values) is a
    assert flat.logical_table_lookup(np.array([4, 4, 4, 4])).opcode == "constant"


def test_collective_iota_groups_written_as_set_replica_groups():
    from hlo_spmd.ir.builder import IotaGroups, set_replica_groups
    from hlo_spmd.proto import hlo_pb2

    _, b = _module()
    x = b.parameter(0, Shape.array(PrimitiveType.F32, (4, 2)))
    groups = IotaGroups(2, 4, (4, 2), (1, 0))
    one = b.all_reduce(x, "add", groups)
    two = b.all_reduce(x, "add", groups)
    expected = hlo_pb2.HloInstructionProto()
    set_replica_groups(expected, groups)
    for inst in (one, two):
        assert inst.attrs.iota_collective_device_list == expected.iota_collective_device_list
    # each instruction owns its copy of the (memoised) group list
    one.attrs.iota_collective_device_list.num_replica_groups = 7
    assert two.attrs.iota_collective_device_list.num_replica_groups == 2
    assert b.all_reduce(x, "add", groups).attrs.iota_collective_device_list.num_replica_groups == 2
