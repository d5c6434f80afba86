"""Random gathers and scatters with random shardings on 1-8 devices (issue 21 item 2):
embedding-like lookups (indexed dims with slice size 1, collapsed or not), explicit
batching dims with passthrough dims, windows smaller than their dim, indexed dims in any
order, the index vector dim anywhere (or implicit), offset / window dims anywhere in the
result; operand, indices, updates and result each tiled, partially replicated or
replicated. Indices include out-of-range values (gather clamps them, scatter drops them)
and repeats. Each module is partitioned (parameters and root annotated, nothing else) and
run on XLA's CPU runtime against the unpartitioned module, with poisoned padding."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hlo_spmd.ir.io import module_bytes, module_text
from hlo_spmd.ir.text_parser import parse_module
from hlo_spmd.passes.partition import partition_in_place
from hlo_spmd.runtime import verify

pytest.importorskip("jax")

from test_partition_shapes_random import shardings  # noqa: E402

DIMS = st.sampled_from([2, 3, 4, 6, 8, 12, 16])
COMBINERS = {
    "add": "ROOT %r = f32[] add(%a, %b)",
    "max": "ROOT %r = f32[] maximum(%a, %b)",
    "set": "ROOT %r = f32[] add(%b, %zero)",
}


def _shape(dims) -> str:
    return "f32[" + ",".join(map(str, dims)) + "]"


def _ishape(dims) -> str:
    return "s32[" + ",".join(map(str, dims)) + "]"


def _set(xs) -> str:
    return "{" + ",".join(map(str, xs)) + "}"


@st.composite
def _layout(draw):
    """Operand dims and roles shared by gathers and scatters: ``batching`` (operand dim,
    or None), ``index_map`` (indexed operand dims, any order), per operand dim its slice /
    window size, ``collapsed`` (indexed dims of size 1 dropped from the window)."""
    rank = draw(st.integers(1, 3))
    dims = [draw(DIMS) for _ in range(rank)]
    free = list(range(rank))
    batching = None
    if rank >= 2 and draw(st.integers(0, 2)) == 0:
        batching = draw(st.sampled_from(free))
        free.remove(batching)
    k = draw(st.integers(1, min(2, len(free))))
    index_map = draw(st.permutations(free))[:k]
    sizes = [1] * rank
    collapsed = []
    for d in range(rank):
        if d == batching:
            continue
        if d in index_map:
            # Mostly single rows (an embedding), sometimes a window smaller than the dim.
            sizes[d] = 1 if draw(st.integers(0, 3)) else draw(st.integers(1, dims[d]))
            if sizes[d] == 1 and draw(st.integers(0, 3)):
                collapsed.append(d)
        else:
            sizes[d] = dims[d] if draw(st.integers(0, 3)) else draw(st.integers(1, dims[d]))
    return dims, batching, list(index_map), sizes, collapsed


@st.composite
def _indices(draw, dims, batching, index_map):
    """Indices batch dims (one matches the batching dim), the index vector dim position
    (or implicit when one dim is indexed) and the indices' shape."""
    nb = draw(st.integers(1, 2))
    bdims = [draw(st.sampled_from([1, 3, 5, 8])) for _ in range(nb)]
    bpos = None
    if batching is not None:
        bpos = draw(st.integers(0, nb - 1))
        bdims[bpos] = dims[batching]
    implicit = len(index_map) == 1 and draw(st.booleans())
    if implicit:
        return bdims, nb, bdims, bpos
    ivd = draw(st.integers(0, nb))
    shape = bdims[:ivd] + [len(index_map)] + bdims[ivd:]
    # Indices batch dim j of the batch list -> its position in the indices array.
    return bdims, ivd, shape, bpos


def _pos(j: int, ivd: int) -> int:
    return j if j < ivd else j + 1


@st.composite
def gathers(draw):
    n = draw(st.integers(1, 8))
    dims, batching, index_map, sizes, collapsed = draw(_layout())
    bdims, ivd, ishape, bpos = draw(_indices(dims, batching, index_map))
    window = [d for d in range(len(dims)) if d not in collapsed and d != batching]
    nb, no = len(bdims), len(window)
    offset = sorted(draw(st.permutations(list(range(nb + no))))[:no])
    out, bi, wi = [], 0, 0
    for q in range(nb + no):
        if q in offset:
            out.append(sizes[window[wi]])
            wi += 1
        else:
            out.append(bdims[bi])
            bi += 1
    attrs = (f"offset_dims={_set(offset)}, collapsed_slice_dims={_set(collapsed)}, "
             f"start_index_map={_set(index_map)}, index_vector_dim={ivd}, "
             f"slice_sizes={_set(sizes)}")
    if batching is not None:
        attrs += (f", operand_batching_dims={{{batching}}}, "
                  f"start_indices_batching_dims={{{_pos(bpos, ivd)}}}")
    s_op = draw(shardings(len(dims), n))
    s_idx = draw(shardings(len(ishape), n))
    s_out = draw(shardings(len(out), n))
    text = f"""HloModule g
ENTRY %main (t: {_shape(dims)}, i: {_ishape(ishape)}) -> {_shape(out)} {{
  %t = {_shape(dims)} parameter(0), sharding={s_op}
  %i = {_ishape(ishape)} parameter(1), sharding={s_idx}
  ROOT %g = {_shape(out)} gather(%t, %i), {attrs}, sharding={s_out}
}}
"""
    return n, text


@st.composite
def scatters(draw):
    n = draw(st.integers(1, 8))
    dims, batching, index_map, sizes, inserted = draw(_layout())
    bdims, ivd, ishape, bpos = draw(_indices(dims, batching, index_map))
    window = [d for d in range(len(dims)) if d not in inserted and d != batching]
    nb, nw = len(bdims), len(window)
    uwd = sorted(draw(st.permutations(list(range(nb + nw))))[:nw])
    upd, bi, wi = [], 0, 0
    for q in range(nb + nw):
        if q in uwd:
            upd.append(sizes[window[wi]])
            wi += 1
        else:
            upd.append(bdims[bi])
            bi += 1
    fn = draw(st.sampled_from(sorted(COMBINERS)))
    attrs = (f"update_window_dims={_set(uwd)}, inserted_window_dims={_set(inserted)}, "
             f"scatter_dims_to_operand_dims={_set(index_map)}, index_vector_dim={ivd}")
    if batching is not None:
        attrs += (f", input_batching_dims={{{batching}}}, "
                  f"scatter_indices_batching_dims={{{_pos(bpos, ivd)}}}")
    s_op = draw(shardings(len(dims), n))
    s_idx = draw(shardings(len(ishape), n))
    s_upd = draw(shardings(len(upd), n))
    s_out = draw(shardings(len(dims), n))
    text = f"""HloModule s
%{fn} (a: f32[], b: f32[]) -> f32[] {{
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  %zero = f32[] constant(0)
  {COMBINERS[fn]}
}}
ENTRY %main (t: {_shape(dims)}, i: {_ishape(ishape)}, u: {_shape(upd)}) -> {_shape(dims)} {{
  %t = {_shape(dims)} parameter(0), sharding={s_op}
  %i = {_ishape(ishape)} parameter(1), sharding={s_idx}
  %u = {_shape(upd)} parameter(2), sharding={s_upd}
  ROOT %s = {_shape(dims)} scatter(%t, %i, %u), {attrs}, to_apply=%{fn}, sharding={s_out}
}}
"""
    return n, text


def _inputs(module, seed):
    """Floats from a normal; indices in [-3, largest dim + 3): some out of range, many
    repeated."""
    rng = np.random.RandomState(seed)
    params = module.entry.parameters
    bound = max(max(p.shape.dims, default=1) for p in params
                if p.shape.element_type.name.startswith("F"))
    out = []
    for p in params:
        dims = tuple(p.shape.dims)
        if p.shape.element_type.name.startswith("F"):
            out.append(rng.randn(*dims).astype(np.float32))
        else:
            out.append(rng.randint(-3, bound + 3, size=dims).astype(np.int32))
    return out


def run_case(n: int, text: str) -> None:
    module = parse_module(text)
    original = module_bytes(module)
    inputs = _inputs(module, 0)
    result = partition_in_place(module, n)
    report = verify(original, module_bytes(result.module), n, inputs=inputs,
                    poison_padding=True)
    assert report.ok, f"on {n} devices\n{report}\n{text}\n{module_text(result.module)}"


_COMMON = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                    HealthCheck.data_too_large])


@settings(max_examples=80, derandomize=True, **_COMMON)
@given(gathers())
def test_random_gathers(case):
    run_case(*case)


@settings(max_examples=80, derandomize=True, **_COMMON)
@given(scatters())
def test_random_scatters(case):
    run_case(*case)
