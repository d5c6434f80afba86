"""Loading a proto without per-instruction copies (``module_from_proto(consume=True)``,
what ``load_module`` uses) is as lossless as the copying load."""
from __future__ import annotations

import glob
import os

import pytest

from hlo_spmd.ir.io import load_module, module_bytes
from hlo_spmd.ir.proto_io import module_from_proto
from hlo_spmd.proto import hlo_pb2

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = sorted(glob.glob(os.path.join(ROOT, "fixtures", "hlo", "*.pb")))


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _unknown_field(number: int, value: int) -> bytes:
    return _varint(number << 3) + _varint(value)  # wire type 0


@pytest.mark.parametrize("path", FIXTURES[:12], ids=os.path.basename)
def test_consuming_load_saves_what_the_copying_load_saves(path):
    data = open(path, "rb").read()
    copied = module_from_proto(hlo_pb2.HloModuleProto.FromString(data), path)
    consumed = module_from_proto(hlo_pb2.HloModuleProto.FromString(data), path, consume=True)
    assert module_bytes(consumed) == module_bytes(copied)
    assert module_bytes(load_module(path)) == module_bytes(copied)


def test_unknown_fields_survive_a_consuming_load(tmp_path):
    msg = hlo_pb2.HloModuleProto.FromString(open(FIXTURES[0], "rb").read())
    inst = msg.computations[-1].instructions[-1]
    inst.MergeFromString(_unknown_field(9001, 7))
    comp = msg.computations[-1]
    comp.MergeFromString(_unknown_field(9002, 5))
    data = msg.SerializeToString() + _unknown_field(9003, 3)
    path = tmp_path / "m.pb"
    path.write_bytes(data)
    out = module_bytes(load_module(path))
    assert out == module_bytes(module_from_proto(hlo_pb2.HloModuleProto.FromString(data)))
    for tag in (_unknown_field(9001, 7), _unknown_field(9002, 5), _unknown_field(9003, 3)):
        assert tag in out
    again = hlo_pb2.HloModuleProto.FromString(out)
    # Owned fields are written back by the IR, not duplicated from the consumed protos.
    assert [i.id for i in again.computations[-1].instructions] == \
        [i.id for i in msg.computations[-1].instructions]
    assert list(again.computations[-1].instructions[-1].operand_ids) == list(inst.operand_ids)
