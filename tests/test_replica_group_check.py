"""Explicit replica groups are checked once per distinct list (shape_inference's
``_check_replica_groups`` remembers the lists that passed): a remembered list does not
hide a bad one, and the all-reduce rule (mixed group sizes allowed) does not vouch for
the all-gather rule (equal sizes required)."""
from __future__ import annotations

import numpy as np
import pytest

from hlo_spmd.errors import VerifierError
from hlo_spmd.ir.builder import set_replica_groups
from hlo_spmd.ir.computation import Computation
from hlo_spmd.ir.shape_inference import array_shape, infer_shape
from hlo_spmd.proto import hlo_pb2

F32 = 11


def _attrs(groups, dim: int | None = None) -> hlo_pb2.HloInstructionProto:
    a = hlo_pb2.HloInstructionProto(channel_id=1, use_global_device_ids=True)
    set_replica_groups(a, groups)
    if dim is not None:
        a.dimensions.append(dim)
    return a


def _adder() -> list[Computation]:
    from hlo_spmd.ir.builder import Builder
    from hlo_spmd.ir.module import Module

    m = Module("m")
    comp = m.add_computation(Computation("add"))
    b = Builder(comp)
    x = b.parameter(0, array_shape(F32, ()))
    y = b.parameter(1, array_shape(F32, ()))
    b.set_root(b.binary("add", x, y))
    return [comp]


def test_many_devices_checked_and_repeated() -> None:
    groups = np.random.RandomState(0).permutation(2048).reshape(64, 32)
    s = array_shape(F32, (4,))
    for _ in range(2):  # the second time from the memo
        assert infer_shape("all-gather", [s], _attrs(groups, 0)).dims == (128,)


def test_bad_list_after_a_good_one() -> None:
    s = array_shape(F32, (4,))
    infer_shape("all-gather", [s], _attrs([[0, 1], [2, 3]], 0))
    with pytest.raises(VerifierError, match="device 1 appears twice"):
        infer_shape("all-gather", [s], _attrs([[0, 1], [1, 3]], 0))
    with pytest.raises(VerifierError, match="exactly once"):
        infer_shape("all-gather", [s], _attrs([[0, 1], [2, 5]], 0))
    with pytest.raises(VerifierError, match="appears twice"):  # again: never remembered
        infer_shape("all-gather", [s], _attrs([[0, 1], [1, 3]], 0))


def test_mixed_sizes_pass_all_reduce_not_all_gather() -> None:
    s = array_shape(F32, (4,))
    mixed = [[0, 1, 2], [3]]
    assert infer_shape("all-reduce", [s], _attrs(mixed), _adder()) == s
    with pytest.raises(VerifierError, match="same size"):
        infer_shape("all-gather", [s], _attrs(mixed, 0))
