"""Padding masks (passes.partition.masking) run on XLA.

Per-device programs built with a partition context (flat and grouped) mask the padding of
poisoned inputs; the raw per-device buffers are compared with what each device should
hold, and masked reductions with numpy.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hlo_spmd.runtime import ensure_host_devices

ensure_host_devices(8)
pytest.importorskip("jax")

from hlo_spmd import runtime as rt  # noqa: E402
from hlo_spmd.collectives.factory import CollectiveFactory  # noqa: E402
from hlo_spmd.passes.partition.causes import CauseLog
from hlo_spmd.collectives.groups import DeviceGrouping  # noqa: E402
from hlo_spmd.ir.builder import Builder  # noqa: E402
from hlo_spmd.ir.computation import Computation  # noqa: E402
from hlo_spmd.ir.io import module_bytes  # noqa: E402
from hlo_spmd.ir.module import Module  # noqa: E402
from hlo_spmd.ir.primitive_types import PrimitiveType, numpy_dtype  # noqa: E402
from hlo_spmd.ir.shape import Shape  # noqa: E402
from hlo_spmd.passes.partition.context import PartitionContext  # noqa: E402
from hlo_spmd.passes.partition.state import ModuleState, PartitionReport  # noqa: E402
from hlo_spmd.passes.partition.masking import (mask_padding, pad_value_identity,  # noqa: E402
                                               padded_dims, valid_mask)
from hlo_spmd.passes.partition.pvalue import PValue  # noqa: E402
from hlo_spmd.proto import hlo_pb2  # noqa: E402
from hlo_spmd.runtime.slicing import poison_value  # noqa: E402
from hlo_spmd.sharding import HloSharding, parse_sharding, shard_bounds, tile_shape  # noqa: E402

PT = PrimitiveType


# -- identities ---------------------------------------------------------------------------------
@pytest.mark.parametrize("op,et,expected", [
    ("add", PT.F32, 0.0), ("multiply", PT.F32, 1.0), ("maximum", PT.F32, -np.inf),
    ("minimum", PT.F32, np.inf), ("max", PT.F64, -np.inf), ("min", PT.BF16, np.inf),
    ("add", PT.S32, 0), ("multiply", PT.S8, 1), ("maximum", PT.S32, -2**31),
    ("minimum", PT.S32, 2**31 - 1), ("maximum", PT.U8, 0), ("minimum", PT.U16, 65535),
    ("and", PT.S32, -1), ("and", PT.U8, 255), ("or", PT.S64, 0), ("xor", PT.U32, 0),
    ("and", PT.PRED, True), ("or", PT.PRED, False), ("maximum", PT.PRED, False),
    ("minimum", PT.PRED, True), ("add", PT.C64, 0), ("multiply", PT.C128, 1),
    ("maximum", PT.F8E4M3FN, -448.0), ("minimum", PT.F8E4M3FN, 448.0),
    ("maximum", PT.F8E5M2, -np.inf),
])
def test_pad_value_identity(op, et, expected):
    v = pad_value_identity(op, et)
    assert np.asarray(v).dtype == numpy_dtype(et)
    assert np.asarray(v).astype(np.float64 if et not in (PT.C64, PT.C128) else np.complex128) \
        == expected


@pytest.mark.parametrize("op,et", [("and", PT.F32), ("maximum", PT.C64), ("atan2", PT.F32)])
def test_pad_value_identity_rejects(op, et):
    with pytest.raises(ValueError, match="no identity"):
        pad_value_identity(op, et)


@pytest.mark.parametrize("op", ["add", "multiply", "maximum", "minimum"])
@pytest.mark.parametrize("et", [PT.F32, PT.S32, PT.U8, PT.BF16])
def test_identity_is_neutral(op, et):
    dtype = numpy_dtype(et)
    xs = np.array([3, 0, 7, 1]).astype(dtype)
    f = {"add": np.add, "multiply": np.multiply, "maximum": np.maximum,
         "minimum": np.minimum}[op]
    ident = pad_value_identity(op, et)
    assert np.array_equal(f(xs, np.full_like(xs, ident)), xs)


# -- per-device programs ------------------------------------------------------------------------
def _global(s: HloSharding, groups: np.ndarray, rank: int) -> HloSharding:
    """The global sharding of a value sharded ``s`` within every group of ``groups``."""
    m = groups.shape[1]
    if s.is_replicated:
        arr = np.arange(m).reshape((1,) * rank + (m,))
    else:
        arr = s.tile_assignment.array()
        if not s.replicate_on_last_tile_dim:
            arr = arr.reshape(arr.shape + (1,))
    phys = np.moveaxis(groups[:, arr], 0, -1)
    return HloSharding.partial_tile(phys.reshape(phys.shape[:-2] + (-1,)))


class Program:
    """One per-device program: ``param`` (the local tile of ``sharding``) in a context with
    ``groups`` (default: all devices, flat)."""

    def __init__(self, dims, sharding: HloSharding, n: int, et=PT.F32, groups=None):
        self.dims, self.sharding, self.n, self.et = list(dims), sharding, n, et
        self.groups = np.arange(n).reshape(1, n) if groups is None else np.asarray(groups)
        self.module = Module("masking")
        self.module.attrs = hlo_pb2.HloModuleProto()
        comp = Computation("main")
        self.module.add_computation(comp)
        self.module.entry = comp
        self.b = Builder(comp)
        state = ModuleState(self.module, self.module, n, PartitionReport())
        self.ctx = PartitionContext(state, self.b,
                                    CollectiveFactory(self.b, DeviceGrouping(self.groups),
                                                      CauseLog()))
        base = Shape.array(et, dims)
        local = tile_shape(sharding, dims) if sharding.is_tiled else tuple(dims)
        self.param = self.b.parameter(0, base.with_dims(local), name="p")
        self.pv = PValue(self.param, base, sharding)

    def run(self, outputs, x, output_shardings):
        root = self.b.tuple(outputs) if len(outputs) > 1 else outputs[0]
        self.b.set_root(root)
        self.param.sharding = HloSharding.manual()
        root.sharding = HloSharding.manual() if len(outputs) == 1 else \
            HloSharding.tuple([HloSharding.manual()] * len(outputs))
        gsrc = _global(self.sharding, self.groups, len(self.dims))
        proto = rt.with_spmd_shardings(module_bytes(self.module), [gsrc],
                                       HloSharding.tuple(output_shardings)
                                       if len(outputs) > 1 else output_shardings[0])
        return rt.run_partitioned_detailed(proto, [x], self.n, poison_padding=True)

    def logical(self) -> np.ndarray:
        return DeviceGrouping(self.groups).logical_ids()


def _expected_pieces(x, s: HloSharding, m: int, logical: np.ndarray, dims_masked, value):
    """Per physical device: (expected masked buffer with NaN where poison stays, mask)."""
    rank = x.ndim
    local = tile_shape(s, x.shape) if s.is_tiled else x.shape
    bounds = shard_bounds(s, x.shape, m)
    masked_set = set(range(rank) if dims_masked is None else dims_masked)
    tiles = s.tile_dims_for_data() if s.is_tiled else (1,) * rank
    uneven = {k for k in masked_set if x.shape[k] % tiles[k]}
    out = []
    for p in range(len(logical)):
        lo, hi = bounds[logical[p], :, 0], bounds[logical[p], :, 1]
        idx = np.indices(local)
        real = np.all([(idx[k] < hi[k] - lo[k]) for k in range(rank)], axis=0)
        keep = np.all([(idx[k] < hi[k] - lo[k]) if k in uneven else np.ones(local, bool)
                       for k in range(rank)], axis=0) if uneven else np.ones(local, bool)
        buf = np.full(local, np.nan)
        sl = tuple(slice(0, h - lo_) for lo_, h in zip(lo, hi))
        buf[sl] = x[tuple(slice(a, b) for a, b in zip(lo, hi))]
        want = np.where(keep, buf, value)
        want = np.where(keep & ~real, np.nan, want)  # padding of unmasked dims: poison
        out.append((want, keep))
    return out


def check_mask(dims, s: HloSharding, n: int, dims_masked=None, et=PT.F32, value=None,
               groups=None):
    prog = Program(dims, s, n, et, groups)
    value = pad_value_identity("maximum", et) if value is None else value
    before = len(prog.b.computation.instructions)
    masked = mask_padding(prog.ctx, prog.pv, dims_masked, value)
    if not padded_dims(prog.pv, dims_masked):
        assert masked is prog.param
        assert len(prog.b.computation.instructions) == before
    mask = prog.b.convert(valid_mask(prog.ctx, prog.pv, dims_masked), PT.S32)
    rng = np.random.default_rng(1)
    x = (rng.standard_normal(dims) * 10).astype(numpy_dtype(et))
    if masked is prog.param:
        masked = prog.b.op("copy", [masked], declared=masked.shape)
    run = prog.run([masked, mask], x, [s, s])
    got_vals, got_masks = run.per_device
    m = prog.groups.shape[1]
    for p, (want, keep) in enumerate(_expected_pieces(x.astype(np.float64), s, m,
                                                      prog.logical(), dims_masked,
                                                      float(np.asarray(value, np.float64)))):
        got = np.asarray(got_vals[p]).astype(np.float64)
        poison = np.isnan(want)
        if np.issubdtype(numpy_dtype(et), np.integer):
            poison_int = float(poison_value(numpy_dtype(et)))
            assert np.array_equal(got[poison], np.full(poison.sum(), poison_int)), p
        else:
            assert np.all(np.isnan(got[poison])), p
        np.testing.assert_array_equal(got[~poison], want[~poison], err_msg=f"device {p}")
        np.testing.assert_array_equal(got_masks[p].astype(bool), keep, err_msg=f"device {p}")


CASES = [
    ([5], "{devices=[2]<=[2]}", 2, None),
    ([5, 7], "{devices=[2,4]<=[8]}", 8, None),
    ([5, 7], "{devices=[2,4]<=[8]}", 8, [1]),
    ([5, 7], "{devices=[4,2]<=[2,4]T(1,0)}", 8, [0]),
    ([1, 3], "{devices=[4,2]7,6,5,4,3,2,1,0}", 8, None),        # tiles of pure padding
    ([3, 6], "{devices=[2,1,2]<=[4] last_tile_dim_replicate}", 4, None),
    ([6, 6], "{devices=[2,3]<=[6]}", 6, None),                    # even: nothing to mask
    ([7, 2, 3], "{devices=[2,1,2,2]<=[8] last_tile_dim_replicate}", 8, [0, 2]),
]


@pytest.mark.parametrize("dims,s,n,masked", CASES, ids=[f"{c[0]}{c[1]}" for c in CASES])
def test_mask_padding_on_xla(dims, s, n, masked):
    check_mask(dims, parse_sharding(s), n, masked)


@pytest.mark.parametrize("et,value", [(PT.S32, -7), (PT.F32, 0.0), (PT.BF16, 1.0)])
def test_mask_padding_values_and_types(et, value):
    check_mask([5, 3], parse_sharding("{devices=[4,2]<=[8]}"), 8, None, et, value)


def test_mask_value_may_be_an_instruction():
    prog = Program([5], parse_sharding("{devices=[4]<=[4]}"), 4)
    fill = prog.b.constant(np.float32(2.5), PT.F32)
    out = mask_padding(prog.ctx, prog.pv, [0], fill)
    run = prog.run([out], np.arange(5, dtype=np.float32), [prog.sharding])
    pieces = [np.asarray(p) for p in run.per_device[0]]
    assert pieces[2].tolist() == [4.0, 2.5] and pieces[3].tolist() == [2.5, 2.5]


@pytest.mark.parametrize("groups", [[[0, 2, 4, 6], [1, 3, 5, 7]], [[6, 1, 0, 3], [2, 7, 4, 5]],
                                    [[0, 1], [2, 3], [4, 5], [6, 7]]])
def test_mask_inside_device_groups(groups):
    m = len(groups[0])
    check_mask([5, 3], HloSharding.tile(np.arange(m).reshape(m, 1)), 8, None, groups=groups)
    check_mask([3, 5], HloSharding.tile(np.arange(m)[::-1].reshape(1, m)), 8, None,
               groups=groups)


@pytest.mark.parametrize("op", ["maximum", "minimum", "add"])
def test_masked_reduction_matches_numpy(op):
    """What a reduce handler does: mask with the identity, reduce locally, all-reduce."""
    dims, n = [5, 7], 8
    s = parse_sharding("{devices=[4,2]<=[8]}")
    prog = Program(dims, s, n)
    ident = pad_value_identity(op, PT.F32)
    x = mask_padding(prog.ctx, prog.pv, None, ident)
    local = prog.b.reduce(x, prog.b.constant(ident, PT.F32), [0, 1], op)
    total = prog.ctx.f.all_reduce(local, op, np.arange(n).reshape(1, n))
    data = np.random.default_rng(3).standard_normal(dims).astype(np.float32)
    run = prog.run([total], data, [HloSharding.replicate()])
    want = {"maximum": data.max(), "minimum": data.min(), "add": data.sum()}[op]
    for piece in run.per_device[0]:
        np.testing.assert_allclose(np.asarray(piece), want, rtol=1e-5)


# -- random shardings --------------------------------------------------------------------------
@st.composite
def mask_cases(draw):
    n = draw(st.sampled_from([1, 2, 4, 8]))
    rank = draw(st.integers(1, 3))
    dims = draw(st.lists(st.integers(1, 9), min_size=rank, max_size=rank))
    tiles = [1] * (rank + 1)
    for _ in range(int(math.log2(n))):
        tiles[draw(st.integers(0, rank))] *= 2
    arr = np.asarray(draw(st.permutations(range(n)))).reshape(tiles)
    s = HloSharding.partial_tile(arr) if tiles[-1] > 1 else HloSharding.tile(
        arr.reshape(tiles[:-1]))
    masked = draw(st.one_of(st.none(), st.lists(st.integers(0, rank - 1), unique=True)))
    return dims, s, n, masked


@settings(max_examples=40, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(mask_cases())
def test_random_masks(case):
    dims, s, n, masked = case
    check_mask(dims, s, n, masked)
