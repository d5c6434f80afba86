"""The instruction builder (hlo_spmd.ir.builder): small computations built, verified,
accepted by jaxlib, and run on XLA's CPU runtime (1 and 8 devices)."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import test_shape_inference as tsi  # noqa: E402  (sets up N host devices before jax)

from hlo_spmd.errors import VerifierError  # noqa: E402
from hlo_spmd.ir.builder import (  # noqa: E402
    Builder,
    IotaGroups,
    conv_dimension_numbers,
    make_window,
    next_channel_id,
    reset_channel_ids,
    set_replica_groups,
)
from hlo_spmd.ir.computation import Computation  # noqa: E402
from hlo_spmd.ir.primitive_types import PrimitiveType as PT  # noqa: E402
from hlo_spmd.ir.proto_io import module_from_proto, module_to_proto  # noqa: E402
from hlo_spmd.ir.shape import Shape  # noqa: E402
from hlo_spmd.ir.shape_inference import array_shape  # noqa: E402
from hlo_spmd.ir.verifier import verify_module  # noqa: E402
from hlo_spmd.proto import hlo_pb2, xla_data_pb2  # noqa: E402

F32, S32 = PT.F32, PT.S32
new_module = tsi.new_module


def jaxlib_text(module) -> str:
    tsi.jax_or_skip()
    from jaxlib import _hlo

    data = module_to_proto(module).SerializeToString()
    return _hlo.HloModule.from_serialized_hlo_module_proto(data).to_string()


def run1(module, *args):
    return [o[0] for o in tsi.run_module(module, [[a] for a in args])]


# -- building ----------------------------------------------------------------------------------------
def _kitchen_sink():
    module, b = new_module("kitchen_sink")
    x = b.parameter(0, array_shape(F32, (8, 6)))
    y = b.parameter(1, array_shape(F32, (6, 4)))
    idx = b.parameter(2, array_shape(S32, (3, 1)))
    d = b.dot(x, y, lhs_contracting=[1], rhs_contracting=[0])
    outs = {
        "reduce": b.reduce(d, 0.0, [1], "add"),
        "reduce_max": b.reduce(d, -np.inf, [0], "max"),
        "pad": b.pad(d, 0.0, [1, -1], [0, 2], [0, 1]),
        "dynamic_slice": b.dynamic_slice(d, [b.constant(2), 1], [3, 2]),
        "dus": b.dynamic_update_slice(d, b.broadcast(b.constant(np.float32(7)), (2, 2)), [1, 1]),
        "concat_t": b.transpose(b.concatenate([d, d], 1), [1, 0]),
        "slice": b.slice(d, [1, 0], [7, 4], [2, 3]),
        "reverse": b.reverse(d, [0]),
        "reshape": b.reshape(d, (4, 8)),
        "sort": b.sort(d, 1),
        "convert": b.convert(d, PT.BF16),
        "reduce_window": b.reduce_window(d, -np.inf, [2, 2], "max", strides=[1, 2],
                                         padding=[(1, 0), (0, 1)]),
        "iota_select": b.select(
            b.compare(b.iota(S32, (4, 3), 1), b.broadcast(b.constant(1), (4, 3), []), "GT"),
            b.convert(b.iota(S32, (4, 3), 0), F32),
            b.broadcast(b.constant(np.float32(-1)), (4, 3))),
        "clamp": b.clamp(b.constant(np.float32(0)), d, b.constant(np.float32(50))),
        "elementwise": b.add(b.tanh(d), b.multiply(b.exponential(d), b.negate(d))),
        "gather": b.gather(x, idx, [1, 6], offset_dims=[1], collapsed_slice_dims=[0],
                           start_index_map=[0], index_vector_dim=1),
        "scatter": b.scatter(x, idx, b.broadcast(b.constant(np.float32(1)), (3, 6)), "add",
                             update_window_dims=[1], inserted_window_dims=[0],
                             scatter_dims_to_operand_dims=[0], index_vector_dim=1),
        "top_k_values": b.get_tuple_element(b.top_k(x, 2), 0),
        "bitcast_convert": b.bitcast_convert(d, S32),
        "reduce_precision": b.reduce_precision(d, 5, 10),
    }
    b.set_root(b.tuple(list(outs.values())))
    return module, list(outs)


def _kitchen_sink_reference(x, y, idx):
    d = x @ y
    pad = np.zeros((9, 8), np.float32)
    pad[1:, 1:6:2] = d[:, 1:]
    dus = d.copy()
    dus[1:3, 1:3] = 7
    rw_in = np.full((9, 5), -np.inf, np.float32)
    rw_in[1:, :4] = d
    rw = np.stack([[rw_in[i:i + 2, j:j + 2].max() for j in range(0, 4, 2)] for i in range(8)])
    sc = x.copy()
    for i in idx[:, 0]:
        sc[i] += 1
    io = np.broadcast_to(np.arange(3), (4, 3))
    return {
        "reduce": d.sum(1), "reduce_max": d.max(0), "pad": pad, "dynamic_slice": d[2:5, 1:3],
        "dus": dus, "concat_t": np.concatenate([d, d], 1).T, "slice": d[1:7:2, 0:4:3],
        "reverse": d[::-1], "reshape": d.reshape(4, 8), "sort": np.sort(d, 1),
        "reduce_window": rw,
        "iota_select": np.where(io > 1, np.broadcast_to(np.arange(4)[:, None], (4, 3)), -1),
        "clamp": np.clip(d, 0, 50), "elementwise": np.tanh(d) + np.exp(d) * -d,
        "gather": x[idx[:, 0]], "scatter": sc, "top_k_values": -np.sort(-x, 1)[:, :2],
        "bitcast_convert": d.view(np.int32),
    }


def test_kitchen_sink_builds_verifies_and_jaxlib_accepts():
    module, names = _kitchen_sink()
    verify_module(module)
    text = jaxlib_text(module)
    for opcode in ("dot(", "reduce(", "pad(", "dynamic-slice(", "dynamic-update-slice(",
                   "concatenate(", "transpose(", "slice(", "reverse(", "reshape(", "sort(",
                   "convert(", "reduce-window(", "iota(", "compare(", "select(", "clamp(",
                   "gather(", "scatter(", "topk(", "bitcast-convert(", "reduce-precision("):
        assert opcode in text, opcode
    # the module survives a proto round trip unchanged and still verifies
    again = module_from_proto(module_to_proto(module))
    verify_module(again)
    assert again.instruction_count() == module.instruction_count()


def test_kitchen_sink_runs_on_cpu():
    module, names = _kitchen_sink()
    rng = np.random.default_rng(0)
    x = rng.normal(size=(8, 6)).astype(np.float32)
    y = rng.normal(size=(6, 4)).astype(np.float32)
    idx = np.array([[1], [5], [1]], np.int32)
    outs = dict(zip(names, run1(module, x, y, idx)))
    ref = _kitchen_sink_reference(x, y, idx)
    for name, expect in ref.items():
        if name == "bitcast_convert":
            continue  # bit patterns of a float computation differ in the last ulp
        np.testing.assert_allclose(outs[name], expect, rtol=1e-4, atol=1e-4, err_msg=name)
    assert outs["convert"].dtype.name == "bfloat16"


def test_control_flow_runs_on_cpu():
    module, b = new_module("control")
    state_shape = Shape.tuple_of([array_shape(S32, ()), array_shape(F32, (3,))])
    body = b.new_computation("body")
    p = body.parameter(0, state_shape)
    i, v = body.get_tuple_element(p, 0), body.get_tuple_element(p, 1)
    body.set_root(body.tuple([body.add(i, body.constant(1)),
                              body.add(v, body.broadcast(body.convert(i, F32), (3,)))]))
    cond = b.new_computation("cond")
    q = cond.parameter(0, state_shape)
    cond.set_root(cond.compare(cond.get_tuple_element(q, 0), cond.constant(4), "LT"))
    neg = b.new_computation("neg")
    neg.set_root(neg.negate(neg.parameter(0, array_shape(F32, (3,)))))
    dbl = b.new_computation("dbl")
    z = dbl.parameter(0, array_shape(F32, (3,)))
    dbl.set_root(dbl.add(z, z))
    sq = b.new_computation("square")
    a0 = sq.parameter(0, array_shape(F32, (3,)))
    a1 = sq.parameter(1, array_shape(F32, ()))
    sq.set_root(sq.multiply(sq.multiply(a0, a0), sq.broadcast(a1, (3,))))

    x = b.parameter(0, array_shape(F32, (3,)))
    k = b.parameter(1, array_shape(S32, ()))
    loop = b.while_loop(cond.computation, body.computation, b.tuple([b.constant(0), x]))
    looped = b.get_tuple_element(loop, 1)
    branch = b.conditional(k, [neg.computation, dbl.computation], [looped, looped])
    pred_branch = b.conditional(b.compare(k, b.constant(0), "EQ"),
                                [dbl.computation, neg.computation], [x, x])
    called = b.call(sq.computation, [x, b.constant(np.float32(3))])
    b.set_root(b.tuple([looped, branch, pred_branch, called]))
    verify_module(module)
    assert "while(" in jaxlib_text(module)
    xv = np.array([1, 2, 3], np.float32)
    out = run1(module, xv, np.int32(1))
    np.testing.assert_allclose(out[0], xv + 6)          # 0+1+2+3
    np.testing.assert_allclose(out[1], 2 * (xv + 6))    # branch 1
    np.testing.assert_allclose(out[2], -xv)             # k != 0 -> false branch
    np.testing.assert_allclose(out[3], 3 * xv * xv)


def test_collectives_run_on_8_devices():
    tsi.jax_or_skip()
    from hlo_spmd.sharding import HloSharding

    n = 8
    module, b = new_module("collectives")
    x = b.parameter(0, array_shape(F32, (4, 8)))
    x.sharding = HloSharding.manual()
    groups = IotaGroups(2, 4, (4, 2), (1, 0))  # {0,2,4,6},{1,3,5,7}
    outs = [
        b.all_reduce(x, "add", groups),
        b.all_gather(x, 0, [[0, 1, 2, 3], [4, 5, 6, 7]]),
        b.reduce_scatter(x, 1, "add", groups),
        b.all_to_all(x, groups, split_dimension=1),
        b.collective_permute(x, [(i, (i + 1) % n) for i in range(n)]),
        b.broadcast(b.convert(b.partition_id(), F32), (2,)),
        b.all_reduce(b.reduce(x, 0.0, [0, 1], "max"), "max", None),
    ]
    root = b.tuple(outs)
    root.sharding = HloSharding.tuple([HloSharding.manual()] * len(outs))
    b.set_root(root)
    verify_module(module)
    assert [i.attrs.channel_id for i in module.entry.instructions if i.attrs.channel_id] == \
        [1, 2, 3, 4, 5, 6]
    pieces = [np.arange(32, dtype=np.float32).reshape(4, 8) * 10 + d for d in range(n)]
    res = tsi.run_module(module, [pieces], num_partitions=n)
    grid = groups.to_array()
    for d in range(n):
        grp = list(grid[np.where(grid == d)[0][0]])
        k = grp.index(d)
        total = sum(pieces[i] for i in grp)
        np.testing.assert_allclose(res[0][d], total)
        np.testing.assert_allclose(res[1][d], np.concatenate(
            [pieces[i] for i in (range(4) if d < 4 else range(4, 8))], 0))
        np.testing.assert_allclose(res[2][d], total[:, 2 * k:2 * k + 2])
        np.testing.assert_allclose(res[3][d], np.concatenate(
            [pieces[i][:, 2 * k:2 * k + 2] for i in grp], 1))
        np.testing.assert_allclose(res[4][d], pieces[(d - 1) % n])
        np.testing.assert_allclose(res[5][d], [d, d])
        np.testing.assert_allclose(res[6][d], max(p.max() for p in pieces))


# -- constants -------------------------------------------------------------------------------------
@pytest.mark.parametrize("value, et", [
    (np.arange(6, dtype=np.float32).reshape(2, 3), None),
    (np.array([[True, False], [False, True]]), None),
    (np.array([-3, 4, 7], np.int8), None),
    (np.array([1, 513], np.uint16), None),
    (np.array([1.5, -2.25]), PT.BF16),
    (np.array([1.5, -2.25]), PT.F16),
    (np.array([1 + 2j, 3 - 4j], np.complex64), None),
    (np.array([-2, 7, 1]), PT.S4),
    (np.array([2**40, -5], np.int64), None),
    (np.array([2**33, 5], np.uint64), None),
    (3.5, None),
    (7, None),
    (True, None),
])
def test_constants_round_trip_through_xla(value, et):
    from hlo_spmd.ir.literal import literal_to_numpy

    module, b = new_module("constants")
    c = b.constant(value, et)
    if c.shape.element_type in (PT.S4,):
        b.set_root(b.convert(c, S32))
    else:
        b.set_root(c)
    verify_module(module)
    got = literal_to_numpy(c.attrs.literal)
    np.testing.assert_array_equal(np.asarray(got).astype(np.float64 if not np.iscomplexobj(got)
                                                         else np.complex128),
                                  np.asarray(value).astype(got.dtype).astype(
                                      np.float64 if not np.iscomplexobj(got) else np.complex128))
    (out,) = run1(module)
    np.testing.assert_array_equal(np.asarray(out).astype(np.complex128),
                                  np.asarray(value).astype(got.dtype).astype(np.complex128))


def test_constant_default_types():
    _, b = new_module()
    assert b.constant(1).shape.element_type == S32
    assert b.constant(1.0).shape.element_type == F32
    assert b.constant(True).shape.element_type == PT.PRED
    assert b.constant(np.zeros((2,), np.float64)).shape.element_type == PT.F64
    assert b.constant([1, 2], "u8").shape.compatible(array_shape(PT.U8, (2,)))
    assert b.scalar(2, b.constant(np.float16(1))).shape.element_type == PT.F16


# -- attributes as XLA writes them --------------------------------------------------------------------
def _jaxlib_instruction(text: str, opcode: str) -> hlo_pb2.HloInstructionProto:
    tsi.jax_or_skip()
    from jaxlib import _hlo

    proto = hlo_pb2.HloModuleProto.FromString(
        _hlo.hlo_module_from_text(text).as_serialized_hlo_module_proto())
    return [i for c in proto.computations for i in c.instructions if i.opcode == opcode][0]


def test_replica_group_fields_match_jaxlib():
    text = """HloModule m
ENTRY e {
  p = f32[8] parameter(0)
  a = f32[32] all-gather(p), replica_groups={{0,1,2,3},{4,5,6,7}}, dimensions={0}, channel_id=1, use_global_device_ids=true
  b = f32[16] all-gather(p), replica_groups=[4,2]<=[8], dimensions={0}, channel_id=2, use_global_device_ids=true
  ROOT t = (f32[32], f32[16]) tuple(a, b)
}
"""
    theirs = [i for i in _all_instructions(text) if i.opcode == "all-gather"]
    explicit = hlo_pb2.HloInstructionProto()
    set_replica_groups(explicit, np.array([[0, 1, 2, 3], [4, 5, 6, 7]]))
    assert explicit.WhichOneof("replica_group_list") == theirs[0].WhichOneof("replica_group_list")
    assert explicit.collective_device_list == theirs[0].collective_device_list
    iota = hlo_pb2.HloInstructionProto()
    set_replica_groups(iota, IotaGroups(4, 2))
    assert iota.WhichOneof("replica_group_list") == theirs[1].WhichOneof("replica_group_list")
    assert iota.iota_collective_device_list == theirs[1].iota_collective_device_list


def test_replica_group_forms():
    a = hlo_pb2.HloInstructionProto()
    set_replica_groups(a, (2, 4, (4, 2), (1, 0)))
    assert a.WhichOneof("replica_group_list") == "iota_collective_device_list"
    assert list(a.iota_collective_device_list.iota_transpose_perm) == [1, 0]
    set_replica_groups(a, (4, 2))
    assert list(a.iota_collective_device_list.iota_reshape_dims) == [8]
    set_replica_groups(a, [[0, 1, 2], [3]])  # ragged lists are allowed (all-reduce)
    assert [list(g.replica_ids) for g in a.collective_device_list.replica_groups] == [[0, 1, 2], [3]]
    assert not a.HasField("iota_collective_device_list")
    set_replica_groups(a, None)
    assert a.WhichOneof("replica_group_list") is None
    with pytest.raises(ValueError):
        set_replica_groups(a, np.arange(8))
    assert IotaGroups(2, 4, (4, 2), (1, 0)).to_array().tolist() == [[0, 2, 4, 6], [1, 3, 5, 7]]


def test_jaxlib_ignores_the_legacy_nested_iota_field():
    """Why the builder writes field 92: jaxlib 0.10.2 drops
    ``collective_device_list.iota_replica_group_list`` (the groups silently become {})."""
    module, b = new_module()
    x = b.parameter(0, array_shape(F32, (8,)))
    ar = b.all_reduce(x, "add", IotaGroups(2, 4, (4, 2), (1, 0)))
    b.set_root(ar)
    assert "replica_groups=[2,4]<=[4,2]T(1,0)" in jaxlib_text(module)
    ar.attrs.ClearField("iota_collective_device_list")
    nested = ar.attrs.collective_device_list.iota_replica_group_list
    nested.num_replica_groups, nested.num_devices_per_group = 2, 4
    nested.iota_reshape_dims.extend([4, 2])
    nested.iota_transpose_perm.extend([1, 0])
    assert "replica_groups={}" in jaxlib_text(module)


def test_custom_call_after_all_and_tuple_all_to_all():
    tsi.jax_or_skip()
    from hlo_spmd.sharding import HloSharding

    n = 4
    module, b = new_module("misc")
    x = b.parameter(0, array_shape(F32, (4, 2)))
    x.sharding = HloSharding.manual()
    tok = b.after_all(b.after_all(), b.after_all())
    assert tok.shape.is_token
    cc = b.custom_call("Sharding", [x], x.shape, backend_config="cfg")
    assert cc.attrs.custom_call_target == "Sharding" and cc.attrs.backend_config == b"cfg"
    parts = [b.slice(x, [i, 0], [i + 1, 2]) for i in range(n)]
    a2a = b.all_to_all(parts, [[0, 1, 2, 3]])
    assert a2a.shape.is_tuple and len(a2a.shape.tuple_shapes) == n
    outs = [b.get_tuple_element(a2a, i) for i in range(n)]
    root = b.tuple(outs)
    root.sharding = HloSharding.tuple([HloSharding.manual()] * n)
    b.set_root(root)
    verify_module(module)
    text = jaxlib_text(module)
    assert 'custom_call_target="Sharding"' in text and "after-all(" in text
    # run without the annotation custom-call (XLA's partitioner would act on it)
    module.entry.instructions.remove(cc)
    pieces = [np.arange(8, dtype=np.float32).reshape(4, 2) + 100 * d for d in range(n)]
    res = tsi.run_module(module, [pieces], num_partitions=n)
    for d in range(n):
        for j in range(n):  # output j on device d = operand d of device j
            np.testing.assert_allclose(res[j][d], pieces[j][d:d + 1])


def _all_instructions(text):
    tsi.jax_or_skip()
    from jaxlib import _hlo

    proto = hlo_pb2.HloModuleProto.FromString(
        _hlo.hlo_module_from_text(text).as_serialized_hlo_module_proto())
    return [i for c in proto.computations for i in c.instructions]


def test_conv_dim_labels_match_jax():
    import jax

    proto = tsi.lower_proto(lambda a, w: jax.lax.conv_general_dilated(
        a, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")),
        np.ones((2, 5, 5, 3), np.float32), np.ones((3, 3, 3, 4), np.float32))
    conv = [i for c in proto.computations for i in c.instructions if i.opcode == "convolution"][0]
    assert conv_dimension_numbers("b01f_01io->b01f") == conv.convolution_dimension_numbers
    with pytest.raises(ValueError):
        conv_dimension_numbers("b01f01io->b01f")


def test_make_window_defaults():
    w = make_window([3, 2], strides=[2, 1], padding=[(1, 1), (0, -1)])
    assert [(d.size, d.stride, d.padding_low, d.padding_high, d.base_dilation,
             d.window_dilation) for d in w.dimensions] == [(3, 2, 1, 1, 1, 1), (2, 1, 0, -1, 1, 1)]


def test_convolution_builds_and_runs():
    module, b = new_module("conv")
    lhs = b.parameter(0, array_shape(F32, (1, 5, 5, 2)))
    rhs = b.parameter(1, array_shape(F32, (3, 3, 2, 4)))
    out = b.convolution(lhs, rhs, make_window([3, 3], padding=[(1, 1), (1, 1)]),
                        "b01f_01io->b01f")
    b.set_root(out)
    assert out.shape.dims == (1, 5, 5, 4)
    verify_module(module)
    import jax

    a = np.random.default_rng(1).normal(size=(1, 5, 5, 2)).astype(np.float32)
    w = np.random.default_rng(2).normal(size=(3, 3, 2, 4)).astype(np.float32)
    expect = jax.lax.conv_general_dilated(a, w, (1, 1), "SAME",
                                          dimension_numbers=("NHWC", "HWIO", "NHWC"))
    (got,) = run1(module, a, w)
    np.testing.assert_allclose(got, np.asarray(expect), rtol=1e-4, atol=1e-4)


# -- module bookkeeping ---------------------------------------------------------------------------------
def test_channel_ids_continue_after_loaded_ones():
    import jax
    from jax.sharding import Mesh, PartitionSpec as P

    if len(jax.devices()) < 8:
        pytest.skip("needs 8 host devices")
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("a", "b"))
    f = jax.shard_map(lambda y: jax.lax.psum(jax.lax.psum(y, "a"), "b"), mesh=mesh,
                      in_specs=P("a", "b"), out_specs=P("a", "b"), check_vma=False)
    module = tsi.lower(f, np.ones((8, 8), np.float32))
    top = max(i.attrs.channel_id for i in module.instructions())
    assert top >= 1
    assert next_channel_id(module) == top + 1
    assert next_channel_id(module) == top + 2
    reset_channel_ids(module)
    assert next_channel_id(module) == top + 1


def test_module_state_lives_as_long_as_the_module():
    import gc

    from hlo_spmd.ir import builder as bmod

    import weakref

    m, b = new_module()
    assert next_channel_id(m) == 1 and next_channel_id(m) == 2
    # The state holds the module's computations (a cached scalar computation; a callee
    # signature in the shape-inference memo): it must not keep the module alive.
    x = b.parameter(0, array_shape(F32, [4]))
    b.set_root(b.op("reduce", [x, b.scalar(0.0, F32)],
                    hlo_pb2.HloInstructionProto(dimensions=[0]),
                    [b.scalar_computation("add", F32)]))
    assert bmod._state(m).computations
    ref = weakref.ref(m)
    del m, b, x
    gc.collect()
    assert ref() is None


def test_scalar_computations_cached_and_placed_before_caller():
    module, b = new_module()
    add1 = b.scalar_computation("add", F32)
    add2 = b.scalar_computation("add", "f32")
    assert add1 is add2
    assert b.scalar_computation("add", S32) is not add1
    assert b.scalar_computation("max", F32).root.opcode == "maximum"
    comps = module.computations
    assert comps.index(add1) < comps.index(module.entry)
    x = b.parameter(0, array_shape(F32, (3,)))
    b.set_root(b.reduce(x, 0.0, [0], "add"))
    module.remove_unreachable_computations()
    verify_module(module)
    # a computation dropped from the module is rebuilt on demand
    b.set_root(x)
    module.entry.remove_dead()
    module.remove_unreachable_computations()
    assert add1 not in module.computations
    add3 = b.scalar_computation("add", F32)
    assert add3 is not add1 and add3 in module.computations


def test_comparator_default_sorts_descending_with_gt():
    module, b = new_module()
    x = b.parameter(0, array_shape(F32, (5,)))
    i = b.iota(S32, (5,), 0)
    srt = b.sort([x, i], 0, b.comparator_computation("GT", [F32, S32]))
    b.set_root(srt)
    verify_module(module)
    xv = np.array([3, 1, 4, 1.5, 9], np.float32)
    vals, perm = run1(module, xv)
    np.testing.assert_array_equal(vals, np.sort(xv)[::-1])
    np.testing.assert_array_equal(xv[perm], vals)


def test_metadata_is_copied():
    module, b = new_module()
    b.metadata = xla_data_pb2.OpMetadata(op_name="jit(f)/dot", source_file="f.py", source_line=3)
    x = b.parameter(0, array_shape(F32, (2,)))
    y = b.negate(x)
    assert y.attrs.metadata.op_name == "jit(f)/dot"


def test_generated_elementwise_methods_use_xla_opcodes():
    _, b = new_module()
    x = b.parameter(0, array_shape(F32, (2,)))
    i = b.parameter(1, array_shape(S32, (2,)))
    assert b.cos(x).opcode == "cosine" and b.cosine(x).opcode == "cosine"
    assert b.sin(x).opcode == "sine"
    assert b.clz(i).opcode == "count-leading-zeros"
    assert b.and_(i, i).opcode == "and" and b.or_(i, i).opcode == "or"
    assert b.not_(i).opcode == "not"
    assert b.shift_right_logical(i, i).opcode == "shift-right-logical"
    assert b.exp(x).opcode == "exponential" and b.max(x, x).opcode == "maximum"
    assert b.unary("optimization-barrier", x).opcode == "opt-barrier"
    assert b.optimization_barrier(x).opcode == "opt-barrier"
    assert b.is_finite(x).shape.element_type == PT.PRED
    assert b.complex(x, x).shape.element_type == PT.C64


# -- errors --------------------------------------------------------------------------------------------
def test_operand_from_another_computation_is_rejected():
    module, b = new_module()
    other = b.new_computation("other")
    y = other.parameter(0, array_shape(F32, (2,)))
    x = b.parameter(0, array_shape(F32, (2,)))
    with pytest.raises(VerifierError, match="another computation"):
        b.add(x, y)
    with pytest.raises(TypeError):
        b.add(x, 3)


def test_shape_errors_name_the_computation():
    module, b = new_module()
    x = b.parameter(0, array_shape(F32, (4, 3)))
    with pytest.raises(VerifierError) as info:
        b.dynamic_slice(x, [0, 0], [5, 1])
    assert info.value.where == "computation main"
    assert "dynamic-slice" in info.value.message
    with pytest.raises(VerifierError):
        b.reshape(x, (5,))
    with pytest.raises(VerifierError):
        b.slice(x, [0], [1])
    with pytest.raises(ValueError):
        b.compare(x, x, "BIGGER")
    n_before = len(module.entry.instructions)
    with pytest.raises(VerifierError):
        b.dot(x, x, lhs_contracting=[1], rhs_contracting=[1], lhs_batch=[0], rhs_batch=[1])
    assert len(module.entry.instructions) == n_before  # nothing appended on failure


def test_builder_on_detached_computation():
    comp = Computation("free")
    b = Builder(comp)
    x = b.parameter(0, array_shape(F32, ()))
    b.set_root(b.add(x, x))
    assert comp.root.shape.compatible(array_shape(F32, ()))
    with pytest.raises(VerifierError, match="not part of a module"):
        b.scalar_computation("add", F32)
