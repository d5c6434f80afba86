"""Run a module partitioned by hlo-spmd and by XLA's own SPMD partitioner on the same
per-device inputs, and compare: the reference for modules with no single-device meaning
(manual values entering as parameters, collectives written outside manual regions).

Inputs are built per parameter leaf from the original annotation:
* a fully manual leaf: each device its own random piece of the declared (local) shape;
* a partially manual leaf (``last_tile_dims={manual, ...}``): one random global array per
  manual index, sliced as if the manual devices replicated it;
* any other leaf: one random global array, sliced by the sharding each program records
  for it (ours: ``spmd_parameters_shardings``; XLA's: the executable's own).
Outputs: manual leaves compared device by device, the others reassembled by each
program's output sharding and compared as global arrays.
"""
from __future__ import annotations

import numpy as np

from hlo_spmd.ir.io import load_module_bytes, module_bytes
from hlo_spmd.ir.primitive_types import numpy_dtype
from hlo_spmd.passes.partition import partition_in_place
from hlo_spmd.runtime import slicing
from hlo_spmd.runtime.compile import compile_module
from hlo_spmd.runtime.module_io import read_spmd_shardings, tile_form_shardings, to_proto_bytes
from hlo_spmd.runtime.run import execute_per_device
from hlo_spmd.sharding import HloSharding, ShardingType


def _leaves(s: HloSharding | None, count: int) -> list[HloSharding | None]:
    if s is None:
        return [None] * count
    return list(s.tuple_elements) if s.is_tuple else [s] * count


def _manual_as_replicated(s: HloSharding) -> HloSharding:
    types = [ShardingType.REPLICATED if t == ShardingType.MANUAL else t
             for t in s.subgroup_types]
    return HloSharding.subgroup(s.tile_assignment, types)


def _manual_index(s: HloSharding, n: int) -> np.ndarray:
    """For each device, its index along the manual subgroup dim."""
    ta = s.tile_assignment
    mdim = s.subgroup_manual_dim
    arr = ta.array()
    idx = np.empty(n, dtype=np.int64)
    pos = np.indices(arr.shape)[mdim]
    idx[arr.reshape(-1)] = pos.reshape(-1)
    return idx


def _random(shape, dtype, rng: np.random.Generator) -> np.ndarray:
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng.integers(0, 2, size=shape).astype(bool)
    if dtype.kind in "iu":
        return rng.integers(-4 if dtype.kind == "i" else 0, 5, size=shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


class Leaf:
    """One entry parameter leaf: how its per-device pieces are made."""

    def __init__(self, sharding: HloSharding | None, shape, dtype, n: int,
                 rng: np.random.Generator):
        self.sharding, self.shape, self.dtype, self.n = sharding, tuple(shape), dtype, n
        s = sharding
        if s is not None and s.is_manual:
            self.pieces = [_random(self.shape, dtype, rng) for _ in range(n)]
        elif s is not None and s.is_manual_subgroup:
            repl = _manual_as_replicated(s)
            m = _manual_index(s, n)
            globals_ = [_random(self.shape, dtype, rng) for _ in range(int(m.max()) + 1)]
            per_m = [slicing.shard_pieces(g, repl, n) for g in globals_]
            self.pieces = [per_m[int(m[d])][d] for d in range(n)]
        else:
            self.pieces = None
            self.value = _random(self.shape, dtype, rng)

    def per_device(self, program_sharding) -> list[np.ndarray]:
        if self.pieces is not None:
            return self.pieces
        return slicing.shard_pieces(self.value, program_sharding, self.n)


def _is_manual_leaf(s: HloSharding | None) -> bool:
    return s is not None and (s.is_manual or s.is_manual_subgroup)


def compare_with_xla(text: str, n: int, seed: int = 0, rtol: float = 1e-4,
                     atol: float = 1e-4):
    """Partition ``text`` with hlo-spmd and with XLA, run both on ``n`` CPU devices on the
    same inputs; raise AssertionError on a difference. Returns our partition result."""
    original = load_module_bytes(text.encode())
    result = partition_in_place(load_module_bytes(text.encode()), n)
    ours = module_bytes(result.module)
    xla_bytes = tile_form_shardings(to_proto_bytes(module_bytes(original)))
    rng = np.random.default_rng(seed)

    leaves: list[Leaf] = []
    for p in original.entry.parameters:
        shapes = p.shape.tuple_shapes if p.shape.is_tuple else (p.shape,)
        for s, shape in zip(_leaves(p.sharding, len(shapes)), shapes):
            leaves.append(Leaf(s, shape.dims, numpy_dtype(shape.element_type), n, rng))

    our_params, our_out = read_spmd_shardings(ours)
    our_param_leaves = []
    for s in our_params or []:
        s = slicing.as_sharding(s)
        our_param_leaves += list(s.tuple_elements) if s.is_tuple else [s]
    our_out = slicing.as_sharding(our_out)

    exe_ours = compile_module(ours, n)
    got = execute_per_device(exe_ours, [leaf.per_device(s) for leaf, s in
                                        zip(leaves, our_param_leaves)], n)
    exe_xla = compile_module(xla_bytes, n)
    xla_params = exe_xla.get_parameter_shardings()
    xla_outs = exe_xla.get_output_shardings()
    want = execute_per_device(exe_xla, [
        leaf.per_device(leaf.sharding if _is_manual_leaf(leaf.sharding) else s)
        for leaf, s in zip(leaves, xla_params)], n)

    root = original.entry.root
    out_shapes = root.shape.tuple_shapes if root.shape.is_tuple else (root.shape,)
    root_leaves = _leaves(root.sharding, len(out_shapes))
    our_leaves = _leaves(our_out, len(out_shapes))
    assert len(got) == len(want) == len(out_shapes)
    for o, shape in enumerate(out_shapes):
        if _is_manual_leaf(root_leaves[o]):
            for d in range(n):
                np.testing.assert_allclose(got[o][d], want[o][d], rtol=rtol, atol=atol,
                                           err_msg=f"output {o}, device {d}")
            continue
        mine, problems = slicing.assemble_checked(got[o], our_leaves[o], shape.dims)
        theirs, theirs_problems = slicing.assemble_checked(want[o], xla_outs[o], shape.dims)
        if theirs_problems:
            # XLA's own "replicated" result differs across devices (a collective run
            # across whole copies): the programs must agree device by device.
            for d in range(n):
                np.testing.assert_allclose(got[o][d], want[o][d], rtol=rtol, atol=atol,
                                           err_msg=f"output {o}, device {d}")
            continue
        assert not problems, problems
        np.testing.assert_allclose(mine, theirs, rtol=rtol, atol=atol, err_msg=f"output {o}")
    return result
