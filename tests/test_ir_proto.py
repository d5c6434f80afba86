"""Proto -> IR -> proto is lossless; wrappers are detected; corrupt input is rejected."""
from __future__ import annotations

import glob
import os
import random

import pytest

from hlo_spmd.errors import InputError
from hlo_spmd.ir.io import load_module, load_module_bytes, module_bytes, save_module
from hlo_spmd.ir.proto_io import module_from_proto, module_to_proto, shape_from_proto
from hlo_spmd.ir.shape import Shape
from hlo_spmd.proto import hlo_pb2

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = sorted(glob.glob(os.path.join(ROOT, "fixtures", "hlo", "*.pb")))


def _read(path: str) -> hlo_pb2.HloModuleProto:
    with open(path, "rb") as f:
        return hlo_pb2.HloModuleProto.FromString(f.read())


def test_there_are_fixtures():
    assert len(FIXTURES) >= 15


@pytest.mark.parametrize("path", FIXTURES, ids=os.path.basename)
def test_fixture_round_trips_to_equal_message(path):
    original = _read(path)
    module = load_module(path)
    assert module_to_proto(module) == _with_both_orderings(original)


def _with_both_orderings(msg: hlo_pb2.HloModuleProto) -> hlo_pb2.HloModuleProto:
    """``msg`` as hlo-spmd writes it: a compare whose ordering is not its element type's
    default carries it in both encodings (comparison_type and comparison_order), so XLA
    before and after 0.11 reads the same compare. Nothing else changes."""
    from hlo_spmd.ir.comparison import complete_encodings

    out = hlo_pb2.HloModuleProto()
    out.CopyFrom(msg)
    for comp in out.computations:
        by_id = {i.id: i for i in comp.instructions}
        for inst in comp.instructions:
            if inst.opcode == "compare" and inst.operand_ids:
                complete_encodings(inst, by_id[inst.operand_ids[0]].shape.element_type)
    return out


def _with_unknown_fields(data: bytes) -> bytes:
    """Append unknown fields at module, computation and instruction level."""
    msg = hlo_pb2.HloModuleProto.FromString(data)
    # Field 999, varint 7: tag = (999 << 3) | 0, encoded as a varint.
    def tag(num: int, wire: int) -> bytes:
        v = (num << 3) | wire
        out = bytearray()
        while True:
            b = v & 0x7F
            v >>= 7
            out.append(b | (0x80 if v else 0))
            if not v:
                return bytes(out)
    unknown = tag(999, 0) + b"\x07" + tag(998, 2) + b"\x03abc"
    inst = msg.computations[-1].instructions[0]
    inst.MergeFromString(unknown)
    msg.computations[0].MergeFromString(unknown)
    shape = msg.computations[-1].instructions[-1].shape
    shape.MergeFromString(unknown)
    sharded = [i for c in msg.computations for i in c.instructions if i.HasField("sharding")]
    if sharded:
        sharded[0].sharding.MergeFromString(unknown)
    return msg.SerializeToString() + unknown


@pytest.mark.parametrize("path", FIXTURES[:6], ids=os.path.basename)
def test_unknown_fields_survive(path):
    with open(path, "rb") as f:
        data = _with_unknown_fields(f.read())
    module = load_module_bytes(data, path)
    out = module_bytes(module)
    assert hlo_pb2.HloModuleProto.FromString(out) == _with_both_orderings(
        hlo_pb2.HloModuleProto.FromString(data))
    assert b"abc" in out and out.count(b"abc") == data.count(b"abc")


@pytest.mark.parametrize("path", FIXTURES[:4], ids=os.path.basename)
def test_rebuilt_shapes_and_shardings_are_equivalent(path):
    """Shapes and shardings written from the IR's own values (no cached source proto)."""
    original = _read(path)
    module = load_module(path)
    for inst in module.instructions():
        inst.shape = _fresh(inst.shape)
        inst.source_sharding = None
    rebuilt = module_to_proto(module)
    from hlo_spmd.sharding.proto import from_proto

    for c1, c2 in zip(original.computations, rebuilt.computations):
        for i1, i2 in zip(c1.instructions, c2.instructions):
            s1, s2 = shape_from_proto(i1.shape), shape_from_proto(i2.shape)
            assert s1 == s2, i1.name
            assert i1.HasField("sharding") == i2.HasField("sharding")
            if i1.HasField("sharding"):
                assert from_proto(i1.sharding) == from_proto(i2.sharding), i1.name


def _fresh(shape: Shape) -> Shape:
    return Shape(shape.element_type, shape.dims, tuple(_fresh(s) for s in shape.tuple_shapes),
                 shape.layout, shape.dynamic_dims)


def test_hlo_proto_and_snapshot_wrappers(tmp_path):
    module_msg = _read(FIXTURES[0])
    wrapped = hlo_pb2.HloProto(hlo_module=module_msg)
    snapshot = hlo_pb2.HloSnapshot(hlo=wrapped, execution_platform="Host")
    for i, msg in enumerate((module_msg, wrapped, snapshot)):
        p = tmp_path / f"m{i}.bin"
        p.write_bytes(msg.SerializeToString())
        assert module_to_proto(load_module(p)) == _with_both_orderings(module_msg)


@pytest.mark.parametrize("data,needle", [
    (b"", "empty file"),
    (b"\x0a\xff\xff\xff\xff\x0f", "not a serialized"),
    (bytes(random.Random(0).randrange(256) for _ in range(500)), "not a serialized"),
])
def test_corrupt_bytes_rejected(data, needle):
    with pytest.raises(InputError, match=needle):
        load_module_bytes(data, "x.pb")


def test_truncated_proto_rejected():
    with open(FIXTURES[0], "rb") as f:
        data = f.read()
    with pytest.raises(InputError):
        load_module_bytes(data[: len(data) // 2], "half.pb")


def test_missing_file(tmp_path):
    with pytest.raises(InputError, match="no such file"):
        load_module(tmp_path / "nope.pb")


def test_dangling_operand_id_named():
    msg = _read(FIXTURES[0])
    msg.computations[-1].instructions[-1].operand_ids.append(123456789)
    with pytest.raises(InputError, match="operand id 123456789"):
        module_from_proto(msg, "bad.pb")


def test_save_is_atomic_on_error(tmp_path, monkeypatch):
    module = load_module(FIXTURES[0])
    target = tmp_path / "out.pb"

    def boom(_):
        raise RuntimeError("serialization failed")

    import hlo_spmd.ir.io as io_mod

    monkeypatch.setattr(io_mod, "module_bytes", boom)
    with pytest.raises(RuntimeError):
        save_module(module, target)
    assert list(tmp_path.iterdir()) == []
    monkeypatch.undo()
    save_module(module, target)  # and a good save writes the file
    assert _read(str(target)) == _with_both_orderings(_read(FIXTURES[0]))
