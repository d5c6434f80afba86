"""Random chains of shape ops (broadcast, reshape, transpose, slice, pad, concatenate,
reverse, dynamic-slice, dynamic-update-slice, iota, clamp) with random shardings on 1-8
devices: every instruction annotated, partitioned with ``complete=True`` and run on XLA
against the unpartitioned module with poisoned padding."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hlo_spmd.ir.builder import Builder
from hlo_spmd.ir.computation import Computation
from hlo_spmd.ir.io import module_bytes, module_text
from hlo_spmd.ir.module import Module
from hlo_spmd.ir.primitive_types import PrimitiveType as PT
from hlo_spmd.ir.shape_inference import array_shape
from hlo_spmd.passes.partition import partition_in_place
from hlo_spmd.proto import hlo_pb2
from hlo_spmd.runtime import verify
from hlo_spmd.sharding import HloSharding

pytest.importorskip("jax")

from test_sharding_model import prime_factors  # noqa: E402

MAX_ELEMS = 4000


@st.composite
def shardings(draw, rank: int, n: int):
    """A random tiled / partially replicated / replicated sharding over ``n`` devices."""
    if n == 1 or rank == 0 or draw(st.integers(0, 5)) == 0:
        return HloSharding.replicate()
    tiles = [1] * rank
    rep = 1
    for f in prime_factors(n):
        d = draw(st.integers(-1, rank - 1))
        if d < 0:
            rep *= f
        else:
            tiles[d] *= f
    if rep == n:
        return HloSharding.replicate()
    if draw(st.booleans()):
        devices = np.arange(n)
    else:
        devices = np.asarray(draw(st.permutations(list(range(n)))))
    if rep > 1:
        return HloSharding.partial_tile(devices.reshape(tiles + [rep]))
    return HloSharding.tile(devices.reshape(tiles))


class Chain:
    def __init__(self, n: int) -> None:
        self.n = n
        self.module = Module("chain")
        # partition_module copies module attributes (a builder-made module has none).
        self.module.attrs = hlo_pb2.HloModuleProto()
        comp = Computation("main")
        self.module.add_computation(comp)
        self.module.entry = comp
        self.b = Builder(comp)
        self.params = 0
        self.ops: list[str] = []

    def __repr__(self) -> str:
        return f"Chain(n={self.n}, ops={self.ops})\n{module_text(self.module)}"

    def param(self, dims, sharding, et=PT.F32):
        p = self.b.parameter(self.params, array_shape(et, dims), name=f"p{self.params}")
        self.params += 1
        p.sharding = sharding
        return p

    def const(self, value, et=PT.S32):
        c = self.b.constant(np.asarray(value).astype(np.int32 if et == PT.S32 else np.float32), et)
        c.sharding = HloSharding.replicate()
        return c


def _small(dims) -> bool:
    return 0 < math.prod(dims) <= MAX_ELEMS and all(d >= 1 for d in dims)


@st.composite
def step(draw, c: Chain, x):
    """Append one random op consuming ``x``; returns the new value (or None to skip)."""
    b = c.b
    dims = list(x.shape.dims)
    rank = len(dims)
    op = draw(st.sampled_from(["transpose", "broadcast", "reshape", "slice", "pad", "concat",
                               "reverse", "dynamic-slice", "dus", "iota", "clamp"]))
    if op == "transpose":
        perm = draw(st.permutations(list(range(rank))))
        y = b.transpose(x, perm)
    elif op == "broadcast":
        if rank >= 4:
            return None, op
        pos = draw(st.integers(0, rank))
        size = draw(st.integers(1, 4))
        out = dims[:pos] + [size] + dims[pos:]
        if not _small(out):
            return None, op
        y = b.broadcast(x, out, [i if i < pos else i + 1 for i in range(rank)])
    elif op == "reshape":
        kind = draw(st.sampled_from(["merge", "split", "unit", "drop_unit", "any"]))
        if kind == "merge" and rank >= 2:
            i = draw(st.integers(0, rank - 2))
            out = dims[:i] + [dims[i] * dims[i + 1]] + dims[i + 2:]
        elif kind == "split":
            i = draw(st.integers(0, rank - 1))
            divs = [f for f in range(2, dims[i]) if dims[i] % f == 0]
            if not divs or rank >= 4:
                return None, op
            f = draw(st.sampled_from(divs))
            out = dims[:i] + [f, dims[i] // f] + dims[i + 1:]
        elif kind == "unit" and rank < 4:
            i = draw(st.integers(0, rank))
            out = dims[:i] + [1] + dims[i:]
        elif kind == "drop_unit" and 1 in dims and rank > 1:
            i = dims.index(1)
            out = dims[:i] + dims[i + 1:]
        else:
            total = math.prod(dims)
            divs = [f for f in range(1, total + 1) if total % f == 0]
            f = draw(st.sampled_from(divs))
            out = [f, total // f]
        y = b.reshape(x, out)
    elif op == "slice":
        starts, limits, strides = [], [], []
        for d in dims:
            s = draw(st.integers(0, d - 1))
            lim = draw(st.integers(s + 1, d))
            starts.append(s)
            limits.append(lim)
            strides.append(draw(st.integers(1, 3)))
        y = b.slice(x, starts, limits, strides)
    elif op == "pad":
        lows, highs, inter = [], [], []
        out = []
        for d in dims:
            i = draw(st.integers(0, 2))
            lo = draw(st.integers(-2, 4))
            hi = draw(st.integers(-2, 4))
            size = lo + d + (d - 1) * i + hi
            if size < 1:
                lo, hi = 0, 0
                size = d + (d - 1) * i
            lows.append(lo)
            highs.append(hi)
            inter.append(i)
            out.append(size)
        if not _small(out):
            return None, op
        value = c.const(draw(st.sampled_from([0.0, -2.5, 7.0])), PT.F32)
        y = b.pad(x, value, lows, highs, inter)
    elif op == "concat":
        dim = draw(st.integers(0, rank - 1))
        parts = [x]
        for _ in range(draw(st.integers(1, 2))):
            other = list(dims)
            other[dim] = draw(st.integers(1, 6))
            if draw(st.booleans()):
                parts.append(c.param(other, draw(shardings(rank, c.n))))
            else:
                parts.append(x)
        out = list(dims)
        out[dim] = sum(p.shape.dims[dim] for p in parts)
        if not _small(out):
            return None, op
        order = draw(st.permutations(list(range(len(parts)))))
        y = b.concatenate([parts[i] for i in order], dim)
    elif op == "reverse":
        rd = sorted(draw(st.sets(st.integers(0, rank - 1), min_size=1)))
        y = b.reverse(x, rd)
    elif op == "dynamic-slice":
        sizes = [draw(st.integers(1, d)) for d in dims]
        starts = [c.const(draw(st.integers(-2, d + 2))) for d in dims]
        y = b.dynamic_slice(x, starts, sizes)
    elif op == "dus":
        usizes = [draw(st.integers(1, d)) for d in dims]
        upd = c.param(usizes, draw(shardings(rank, c.n)))
        starts = [c.const(draw(st.integers(-2, d + 2))) for d in dims]
        y = b.dynamic_update_slice(x, upd, starts)
    elif op == "iota":
        dim = draw(st.integers(0, rank - 1))
        io = b.iota(PT.F32, dims, dim)
        io.sharding = draw(shardings(rank, c.n))
        y = b.add(x, io)
    else:  # clamp with scalar bounds
        lo = c.const(-0.5, PT.F32)
        hi = c.const(0.75, PT.F32)
        y = b.clamp(lo, x, hi)
    y.sharding = draw(shardings(y.shape.rank, c.n))
    return y, op


@st.composite
def chains(draw, max_steps: int = 4, max_dim: int = 9):
    n = draw(st.integers(1, 8))
    c = Chain(n)
    rank = draw(st.integers(1, 3))
    dims = [draw(st.integers(1, max_dim)) for _ in range(rank)]
    x = c.param(dims, draw(shardings(rank, n)))
    for _ in range(draw(st.integers(1, max_steps))):
        y, op = draw(step(c, x))
        if y is not None:
            x = y
            c.ops.append(op)
    c.b.set_root(x)
    return c


def run_chain(c: Chain) -> None:
    original = module_bytes(c.module)
    text = module_text(c.module)
    result = partition_in_place(c.module, c.n, complete=True)
    assert not result.report.replicated_fallbacks, (result.report.replicated_fallbacks, text)
    report = verify(original, module_bytes(result.module), c.n, poison_padding=True)
    assert report.ok, f"ops {c.ops} on {c.n} devices\n{report}\n{text}\n" \
                      f"{module_text(result.module)}"


_COMMON = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                    HealthCheck.data_too_large])


@settings(max_examples=120, derandomize=True, **_COMMON)
@given(chains())
def test_random_chains(c):
    run_chain(c)


@pytest.mark.slow
@settings(max_examples=400, **_COMMON)
@given(chains(max_steps=6, max_dim=17))
def test_random_chains_deep(c):
    run_chain(c)
