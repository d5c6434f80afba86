"""OpSharding proto conversion; oracle = jaxlib's HloSharding.to_proto / from_proto."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from test_sharding_model import SETTINGS
from test_sharding_text import sharding_text

from hlo_spmd.errors import ShardingError
from hlo_spmd.proto import xla_data_pb2 as pb
from hlo_spmd.sharding import (HloSharding, OpMetadata, TileAssignment, from_proto,
                               parse_sharding, to_proto)


def _xla():
    return pytest.importorskip("jaxlib._hlo", reason="jaxlib provides XLA's OpSharding")


@settings(SETTINGS, max_examples=300)
@given(sharding_text(with_metadata=True))
def test_to_proto_bytes_match_xla(text):
    hlo = _xla()
    xla_bytes = hlo.HloSharding.from_string(text).to_proto().SerializeToString()
    mine = parse_sharding(text)
    assert to_proto(mine).SerializeToString() == xla_bytes
    back = from_proto(xla_bytes)
    op = hlo.OpSharding()
    op.ParseFromString(xla_bytes)
    assert str(back) == str(hlo.HloSharding.from_proto(op))
    if str(back) == str(mine):  # differs only where FromProto makes 1 device replicated
        assert back == mine
        assert back.to_string(include_metadata=True) == mine.to_string(include_metadata=True)


@settings(SETTINGS, max_examples=150)
@given(sharding_text(with_metadata=False))
def test_from_proto_matches_xla(text):
    hlo = _xla()
    msg = to_proto(parse_sharding(text))
    op = hlo.OpSharding()
    op.ParseFromString(msg.SerializeToString())
    assert str(from_proto(msg)) == str(hlo.HloSharding.from_proto(op))
    assert from_proto(op) == from_proto(msg)  # jaxlib's message type is accepted too


def test_iota_and_explicit_fields():
    iota = to_proto(parse_sharding("{devices=[2,4]<=[4,2]T(1,0)}"))
    assert list(iota.iota_reshape_dims) == [4, 2] and list(iota.iota_transpose_perm) == [1, 0]
    assert not iota.tile_assignment_devices
    ex = to_proto(parse_sharding("{devices=[2,2]0,2,1,3 last_tile_dim_replicate}"))
    assert list(ex.tile_assignment_devices) == [0, 2, 1, 3] and ex.replicate_on_last_tile_dim
    big = to_proto(HloSharding.iota_tile([16, 8, 16], [8, 16, 16], [1, 2, 0]))
    assert len(big.SerializeToString()) < 40  # 2048 devices, still a handful of ints


def test_from_proto_canonicalises_like_xla():
    msg = pb.OpSharding(type=pb.OpSharding.OTHER, tile_assignment_dimensions=[1, 1],
                        tile_assignment_devices=[3])
    assert from_proto(msg).is_replicated
    msg = pb.OpSharding(type=pb.OpSharding.OTHER, tile_assignment_dimensions=[2, 2],
                        iota_reshape_dims=[4], iota_transpose_perm=[0],
                        replicate_on_last_tile_dim=True)
    assert str(from_proto(msg)) == "{devices=[2,2]<=[4] last_tile_dim_replicate}"
    msg = pb.OpSharding(type=pb.OpSharding.OTHER, tile_assignment_dimensions=[2, 2, 2],
                        iota_reshape_dims=[8], iota_transpose_perm=[0],
                        last_tile_dims=[pb.OpSharding.REPLICATED, pb.OpSharding.MANUAL])
    assert str(from_proto(msg)) == \
        "{devices=[2,2,2]<=[2,2,2]T(0,2,1) last_tile_dims={manual, replicated}}"


@pytest.mark.parametrize("msg,fragment", [
    (pb.OpSharding(type=pb.OpSharding.MAXIMAL), "exactly one device"),
    (pb.OpSharding(type=pb.OpSharding.OTHER, tile_assignment_dimensions=[2]),
     "without tile_assignment_devices"),
    (pb.OpSharding(type=pb.OpSharding.OTHER, tile_assignment_dimensions=[3],
                   tile_assignment_devices=[0, 1]), "hold 3 devices"),
    (pb.OpSharding(type=pb.OpSharding.OTHER, tile_assignment_dimensions=[2],
                   iota_reshape_dims=[2], iota_transpose_perm=[0, 1]), "differ in length"),
    (pb.OpSharding(type=pb.OpSharding.OTHER, tile_assignment_dimensions=[2],
                   tile_assignment_devices=[1, 1]), "more than once"),
    (pb.OpSharding(type=pb.OpSharding.TUPLE, metadata=[pb.OpMetadata(op_name="x")]),
     "metadata"),
])
def test_from_proto_errors(msg, fragment):
    with pytest.raises(ShardingError, match=fragment):
        from_proto(msg)


def test_metadata_extra_fields_survive():
    md = pb.OpMetadata(op_name="a", size_of_generated_code_in_bytes=77)
    msg = pb.OpSharding(type=pb.OpSharding.REPLICATED, metadata=[md])
    s = from_proto(msg)
    assert s.metadata[0].op_name == "a" and s.metadata[0].extra
    out = to_proto(s)
    assert out.metadata[0].size_of_generated_code_in_bytes == 77
    assert out.SerializeToString() == msg.SerializeToString()
    assert from_proto(to_proto(HloSharding.maximal(4, [OpMetadata(op_type="T")]))) \
        .metadata == (OpMetadata(op_type="T"),)


def test_explicit_round_trip_preserves_form():
    s = HloSharding.tile(TileAssignment.from_array([[0, 1], [2, 3]]))
    back = from_proto(to_proto(s))
    assert str(back) == "{devices=[2,2]0,1,2,3}" and back == s
