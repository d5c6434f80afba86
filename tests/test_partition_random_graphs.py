"""Randomized differential tests of the whole partitioner.

Hypothesis builds small graphs of elementwise, broadcast, reduce, transpose, reshape,
slice, pad, concatenate and dot ops on random shapes (even and uneven), gives every
instruction a random sharding (tiled, partially replicated, permuted device orders) on
1-8 devices, partitions with the real driver and runs both programs on XLA: the
partitioned program on N CPU devices (padding poisoned) must match the original on one.
A second mode annotates only the parameters and lets completion do the rest.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("jax")

from hlo_spmd.ir.builder import Builder  # noqa: E402
from hlo_spmd.ir.computation import Computation  # noqa: E402
from hlo_spmd.ir.io import module_bytes  # noqa: E402
from hlo_spmd.ir.module import Module  # noqa: E402
from hlo_spmd.ir.primitive_types import PrimitiveType  # noqa: E402
from hlo_spmd.ir.shape import Shape  # noqa: E402
from hlo_spmd.passes.partition import partition_in_place  # noqa: E402
from hlo_spmd.runtime import verify  # noqa: E402
from hlo_spmd.sharding import HloSharding, TileAssignment  # noqa: E402

F32 = PrimitiveType.F32
OPS = ("unary", "binary", "broadcast", "reduce", "transpose", "reshape", "slice", "pad",
       "concatenate", "dot")


def random_sharding(draw, rank: int, n: int) -> HloSharding:
    """A random tiling of ``rank`` dims over ``n`` devices (+ replication), random order."""
    if n == 1 or draw(st.integers(0, 5)) == 0:
        return HloSharding.replicate()
    tiles = [1] * rank
    remaining = n
    for d in draw(st.permutations(list(range(rank)))) if rank else []:
        if remaining == 1:
            break
        choices = [f for f in (1, 2, 4, 8) if remaining % f == 0]
        f = draw(st.sampled_from(choices))
        tiles[d] = f
        remaining //= f
    if math.prod(tiles) == 1:
        return HloSharding.replicate()
    dims = tiles + ([remaining] if remaining > 1 else [])
    if draw(st.booleans()):
        devices = np.arange(n)
    else:
        devices = np.array(draw(st.permutations(list(range(n)))))
    ta = TileAssignment.from_array(devices.reshape(dims))
    return HloSharding.tile(ta, replicate_on_last_tile_dim=remaining > 1)


@st.composite
def graphs(draw, annotate_all: bool = True):
    n = draw(st.sampled_from([1, 2, 4, 8]))
    rank = draw(st.integers(1, 3))
    dims = [draw(st.integers(1, 12)) for _ in range(rank)]
    module = Module("random_graph")
    comp = Computation("main")
    module.add_computation(comp)
    module.entry = comp
    b = Builder(comp)
    params = []
    x = b.parameter(0, Shape.array(F32, dims), name="p0")
    x.sharding = random_sharding(draw, rank, n)
    params.append(x)
    values = [x]
    for _ in range(draw(st.integers(1, 5))):
        x = draw(st.sampled_from(values[-2:]))
        op = draw(st.sampled_from(OPS))
        d = list(x.shape.dims)
        r = len(d)
        if op == "unary":
            y = b.unary(draw(st.sampled_from(["tanh", "negate", "abs", "exponential"])), x)
        elif op == "binary":
            other = draw(st.sampled_from([v for v in values if v.shape.dims == x.shape.dims]))
            y = b.binary(draw(st.sampled_from(["add", "multiply", "maximum", "subtract"])), x, other)
        elif op == "broadcast":
            if r >= 3:
                continue
            pos = draw(st.integers(0, r))
            out = d[:pos] + [draw(st.integers(1, 6))] + d[pos:]
            y = b.broadcast(x, out, [i if i < pos else i + 1 for i in range(r)])
        elif op == "reduce":
            if r < 2:
                continue
            dim = draw(st.integers(0, r - 1))
            y = b.reduce(x, 0.0, [dim], draw(st.sampled_from(["add", "maximum"])))
        elif op == "transpose":
            y = b.transpose(x, draw(st.permutations(list(range(r)))))
        elif op == "reshape":
            if r >= 2 and draw(st.booleans()):
                i = draw(st.integers(0, r - 2))
                y = b.reshape(x, d[:i] + [d[i] * d[i + 1]] + d[i + 2:])
            else:
                splittable = [i for i in range(r) if d[i] % 2 == 0 and d[i] > 2]
                if not splittable or r >= 3:
                    continue
                i = draw(st.sampled_from(splittable))
                y = b.reshape(x, d[:i] + [2, d[i] // 2] + d[i + 1:])
        elif op == "slice":
            dim = draw(st.integers(0, r - 1))
            start = draw(st.integers(0, d[dim] - 1))
            limit = draw(st.integers(start + 1, d[dim]))
            stride = draw(st.sampled_from([1, 1, 2]))
            starts, limits, strides = [0] * r, list(d), [1] * r
            starts[dim], limits[dim], strides[dim] = start, limit, stride
            y = b.slice(x, starts, limits, strides)
        elif op == "pad":
            low = [draw(st.integers(0, 3)) for _ in range(r)]
            high = [draw(st.integers(-1 if dd > 1 else 0, 3)) for dd in d]
            interior = [draw(st.sampled_from([0, 0, 1])) for _ in range(r)]
            y = b.pad(x, b.scalar(draw(st.sampled_from([0.0, 1.5])), F32), low, high, interior)
        elif op == "concatenate":
            dim = draw(st.integers(0, r - 1))
            y = b.concatenate([x, draw(st.sampled_from([v for v in values if v.shape.rank == r
                                                         and all(v.shape.dims[i] == d[i] for i in range(r) if i != dim)]))], dim)
        else:  # dot: contract the last dim with a new parameter
            k = d[-1]
            m = draw(st.integers(1, 10))
            w = b.parameter(len(params), Shape.array(F32, [k, m]), name=f"p{len(params)}")
            w.sharding = random_sharding(draw, 2, n)
            params.append(w)
            y = b.dot(x, w, lhs_contracting=[r - 1], rhs_contracting=[0])
        values.append(y)
    b.set_root(values[-1])
    for inst in comp.instructions:
        if inst.opcode == "parameter":
            continue
        if annotate_all or inst is comp.root:
            inst.sharding = random_sharding(draw, inst.shape.rank, n)
    # Keep the root's sharding for the mode that completes the rest.
    return module, n


def _check(module: Module, n: int, complete: bool) -> None:
    original = module_bytes(module)
    result = partition_in_place(module, n, complete=complete)
    report = verify(original, module_bytes(result.module), n, poison_padding=True)
    assert report.ok, f"\n{report}\n{module_text(module)}"


def module_text(module: Module) -> str:
    from hlo_spmd.ir.text_printer import print_module

    return print_module(module, print_metadata=False)


SETTINGS = dict(deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)


@settings(max_examples=40, **SETTINGS)
@given(graphs(annotate_all=True))
def test_random_graphs_every_instruction_annotated(case):
    module, n = case
    _check(module, n, complete=True)


@settings(max_examples=25, **SETTINGS)
@given(graphs(annotate_all=False))
def test_random_graphs_completed_from_parameters(case):
    module, n = case
    _check(module, n, complete=False)


@pytest.mark.slow
@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(graphs(annotate_all=True))
def test_random_graphs_deep(case):
    module, n = case
    _check(module, n, complete=True)
