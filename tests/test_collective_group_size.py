"""collectives.cost.group_size reads the size off the proto; it must agree with the size of
the expanded ``replica_groups`` array in every encoding, and fall back to the device count
where the expansion fails."""
from __future__ import annotations

import pytest

from hlo_spmd.collectives.cost import _counted_group_size
from hlo_spmd.ir.shape_inference import replica_groups
from hlo_spmd.proto import hlo_pb2


def _explicit(groups: list[list[int]], legacy: bool = False):
    a = hlo_pb2.HloInstructionProto()
    for g in groups:
        rg = a.replica_groups.add() if legacy else a.collective_device_list.replica_groups.add()
        rg.replica_ids.extend(g)
    return a


def _iota(ng: int, gs: int, dims=(), perm=(), field92: bool = True):
    a = hlo_pb2.HloInstructionProto()
    p = a.iota_collective_device_list if field92 else a.collective_device_list.iota_replica_group_list
    p.num_replica_groups, p.num_devices_per_group = ng, gs
    p.iota_reshape_dims.extend(dims)
    p.iota_transpose_perm.extend(perm)
    return a


def _expanded(a) -> int | None:
    try:
        g = replica_groups(a)
    except (ValueError, IndexError):
        return None
    if g.dtype == object:
        return max(len(x) for x in g)
    return int(g.shape[1])


@pytest.mark.parametrize("attrs", [
    _explicit([[0, 1], [2, 3]]), _explicit([[0, 1, 2], [3]]), _explicit([[3], [0, 1, 2]]),
    _explicit([[0, 2], [1, 3]], legacy=True), _explicit([[0, 1, 2, 3]]),
    _iota(2, 4), _iota(4, 2, (2, 2, 2), (2, 0, 1)), _iota(2, 4, (4, 2), (1, 0), field92=False),
    _iota(1, 8, (8,), (0,)),
])
def test_counted_size_is_the_expanded_size(attrs):
    assert _counted_group_size(attrs) == _expanded(attrs)


@pytest.mark.parametrize("attrs", [_iota(2, 4, (3, 3)), _iota(2, 4, (2, 4), (0, 0)),
                                   _iota(2, 4, (-2, -4))])
def test_invalid_iota_takes_the_full_path(attrs):
    assert _counted_group_size(attrs) is None
    assert _expanded(attrs) is None
