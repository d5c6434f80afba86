"""reduce / variadic reduce partitioning, checked on XLA (2/4/8 CPU devices, padding poisoned).

Every instruction carries the sharding the test wants (completion is not under test); the
partitioned module must compute what the unannotated module computes on one device, and
the collectives must be the ones the plan in handlers/reduce.py promises.
"""
from __future__ import annotations

import numpy as np
import pytest

from hlo_spmd.runtime import ensure_host_devices

ensure_host_devices(8)
pytest.importorskip("jax")

from hlo_spmd.ir.io import module_bytes  # noqa: E402
from hlo_spmd.ir.primitive_types import PrimitiveType  # noqa: E402
from hlo_spmd.ir.text_parser import parse_module  # noqa: E402
from hlo_spmd.passes.partition import partition_in_place  # noqa: E402
from hlo_spmd.passes.partition.handlers.reduce import (identity_value,  # noqa: E402
                                                      reduced_sharding, reducer_opcode,
                                                      reduction_groups)
from hlo_spmd.runtime import verify  # noqa: E402
from hlo_spmd.runtime.module_io import strip_shardings  # noqa: E402
from hlo_spmd.sharding import HloSharding  # noqa: E402
from hlo_spmd.stats import module_stats  # noqa: E402


def partition_and_verify(text: str, n: int, **kw):
    module = parse_module(text, "test")
    original = strip_shardings(module_bytes(module))
    result = partition_in_place(module, n, complete=True)
    report = verify(original, module_bytes(result.module), n, poison_padding=True, **kw)
    assert report.ok, str(report)
    assert not [f for f in result.report.replicated_fallbacks if f[1] == "reduce"]
    return result


def reducer(name: str, op: str, et: str) -> str:
    return f"""
%{name} (a: {et}[], b: {et}[]) -> {et}[] {{
  %a = {et}[] parameter(0)
  %b = {et}[] parameter(1)
  ROOT %c = {et}[] {op}(%a, %b)
}}
"""


def reduce_module(op: str, et: str, init: str, dims_in, dims, x_sharding: str,
                  out_sharding: str) -> str:
    out_dims = [d for i, d in enumerate(dims_in) if i not in dims]
    layout_in = ",".join(str(i) for i in reversed(range(len(dims_in))))
    layout_out = ",".join(str(i) for i in reversed(range(len(out_dims))))
    shape_in = f"{et}[{','.join(map(str, dims_in))}]{{{layout_in}}}"
    shape_out = f"{et}[{','.join(map(str, out_dims))}]" + (f"{{{layout_out}}}" if out_dims else "")
    return f"""
HloModule reduce_test
{reducer("red", op, et)}
ENTRY %main (x: {shape_in}) -> {shape_out} {{
  %x = {shape_in} parameter(0), sharding={x_sharding}
  %init = {et}[] constant({init}), sharding={{replicated}}
  ROOT %r = {shape_out} reduce(%x, %init), dimensions={{{','.join(map(str, dims))}}}, to_apply=%red, sharding={out_sharding}
}}
"""


REDUCERS = [  # (opcode, element type, identity init as HLO text, input spec)
    ("add", "f32", "0", None),
    ("maximum", "f32", "-inf", None),
    ("minimum", "s32", "2147483647", "int_range:-50:50"),
    ("multiply", "f32", "1", "uniform:0.5:1.5"),
    ("and", "pred", "true", "bernoulli:0.9"),
    ("or", "pred", "false", "bernoulli:0.1"),
    ("and", "s32", "-1", "int_range:0:1000"),   # no all-reduce for this: gather path
    ("xor", "u32", "0", "int_range:0:1000"),
]


def _cases(n: int):
    """(operand sharding, result sharding) for [10,7] reduced over dim 1 on n devices."""
    half = n // 2
    cases = [
        (f"{{devices=[1,{n}]<=[{n}]}}", "{replicated}"),                  # reduced dim sharded
        (f"{{devices=[{n},1]<=[{n}]}}", f"{{devices=[{n}]<=[{n}]}}"),      # kept dim only
        ("{replicated}", f"{{devices=[{n}]<=[{n}]}}"),                     # slice first
        (f"{{devices=[{n},1]<=[{n}]}}", "{replicated}"),                   # result all-gathered
    ]
    if n >= 4:
        cases.append((f"{{devices=[2,{half}]<=[{n}]}}",                    # both, 2-D mesh
                      f"{{devices=[2,{half}]<=[{n}] last_tile_dim_replicate}}"))
        cases.append((f"{{devices=[2,{half}]<=[{half},2]T(1,0)}}",          # transposed mesh
                      f"{{devices=[{half},2]<=[{n}] last_tile_dim_replicate}}"))
    return cases


@pytest.mark.parametrize("op,et,init,spec", REDUCERS, ids=[f"{r[0]}-{r[1]}" for r in REDUCERS])
@pytest.mark.parametrize("case", range(6))
def test_reduce_on_4_devices(op, et, init, spec, case):
    cases = _cases(4)
    x_sharding, out_sharding = cases[case]
    text = reduce_module(op, et, init, [10, 7], [1], x_sharding, out_sharding)
    partition_and_verify(text, 4, input_spec=spec)


@pytest.mark.parametrize("n", [2, 8])
@pytest.mark.parametrize("op,et,init,spec", REDUCERS[:6], ids=[f"{r[0]}-{r[1]}" for r in REDUCERS[:6]])
def test_reduce_on_2_and_8_devices(n, op, et, init, spec):
    for x_sharding, out_sharding in _cases(n)[::2] + _cases(n)[-1:]:
        text = reduce_module(op, et, init, [10, 7], [1], x_sharding, out_sharding)
        partition_and_verify(text, n, input_spec=spec)


@pytest.mark.parametrize("n", [2, 4, 8])
def test_reduce_to_scalar_and_rank3(n):
    # all dims reduced (scalar result), uneven everywhere
    text = reduce_module("add", "f32", "0", [5, 9], [0, 1],
                         f"{{devices=[2,{n // 2}]<=[{n}]}}" if n > 2 else "{devices=[2,1]<=[2]}",
                         "{replicated}")
    partition_and_verify(text, n)
    # rank 3, two reduced dims sharded, one kept dim sharded
    if n == 8:
        text = reduce_module("maximum", "f32", "-inf", [6, 5, 3], [0, 2],
                             "{devices=[2,2,2]<=[8]}",
                             "{devices=[2,4]<=[2,2,2]T(1,0,2) last_tile_dim_replicate}")
        partition_and_verify(text, n)


def test_even_shapes_need_no_mask():
    text = reduce_module("add", "f32", "0", [8, 16], [1], "{devices=[2,4]<=[8]}",
                         "{devices=[2,4]<=[8] last_tile_dim_replicate}")
    result = partition_and_verify(text, 8)
    ops = [i.opcode for i in result.module.entry.instructions]
    assert "select" not in ops and "iota" not in ops


def test_reduced_dim_sharded_is_one_all_reduce_over_the_right_groups():
    text = reduce_module("add", "f32", "0", [10, 7], [1], "{devices=[2,4]<=[8]}",
                         "{devices=[2,4]<=[8] last_tile_dim_replicate}")
    result = partition_and_verify(text, 8)
    stats = module_stats(result.module)
    assert stats.count("all-reduce") == 1 and stats.total_count == 1
    (ar,) = [i for i in result.module.entry.instructions if i.opcode == "all-reduce"]
    from hlo_spmd.ir.shape_inference import replica_groups

    assert replica_groups(ar.attrs).tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert list(ar.shape.dims) == [5]


def test_replicated_operand_is_sliced_not_communicated():
    text = reduce_module("add", "f32", "0", [10, 7], [1], "{replicated}",
                         "{devices=[8]<=[8]}")
    result = partition_and_verify(text, 8)
    assert module_stats(result.module).total_count == 0


def test_non_identity_init_is_applied_once():
    text = reduce_module("add", "f32", "3.5", [10, 7], [1], "{devices=[1,4]<=[4]}",
                         "{replicated}")
    partition_and_verify(text, 4)
    text = reduce_module("maximum", "f32", "0.25", [10, 7], [0, 1], "{devices=[4,1]<=[4]}",
                         "{replicated}")
    partition_and_verify(text, 4)


def test_unrecognized_reducer_gathers_partials():
    text = """
HloModule unrec

%red (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  %m = f32[] maximum(%a, %b)
  ROOT %c = f32[] copy(%m)
}

ENTRY %main (x: f32[6,11]) -> f32[6] {
  %x = f32[6,11]{1,0} parameter(0), sharding={devices=[2,4]<=[8]}
  %init = f32[] constant(-inf), sharding={replicated}
  ROOT %r = f32[6]{0} reduce(%x, %init), dimensions={1}, to_apply=%red, sharding={devices=[2,4]<=[8] last_tile_dim_replicate}
}
"""
    result = partition_and_verify(text, 8)
    stats = module_stats(result.module)
    assert stats.count("all-reduce") == 0 and stats.count("all-gather") == 1


ARGMAX = """
HloModule argmax

%argmax (a: f32[], ai: s32[], b: f32[], bi: s32[]) -> (f32[], s32[]) {
  %a = f32[] parameter(0)
  %ai = s32[] parameter(1)
  %b = f32[] parameter(2)
  %bi = s32[] parameter(3)
  %gt = pred[] compare(%a, %b), direction=GT
  %eq = pred[] compare(%a, %b), direction=EQ
  %lt = pred[] compare(%ai, %bi), direction=LT
  %tie = pred[] and(%eq, %lt)
  %pick = pred[] or(%gt, %tie)
  %v = f32[] select(%pick, %a, %b)
  %i = s32[] select(%pick, %ai, %bi)
  ROOT %t = (f32[], s32[]) tuple(%v, %i)
}

ENTRY %main (x: f32[6,13]) -> (f32[6], s32[6]) {
  %x = f32[6,13]{1,0} parameter(0), sharding=XS
  %io = s32[6,13]{1,0} iota(), iota_dimension=1, sharding=XS
  %ninf = f32[] constant(-inf), sharding={replicated}
  %zero = s32[] constant(0), sharding={replicated}
  ROOT %r = (f32[6]{0}, s32[6]{0}) reduce(%x, %io, %ninf, %zero), dimensions={1}, to_apply=%argmax, sharding=OS
}
"""


@pytest.mark.parametrize("n", [2, 4, 8])
@pytest.mark.parametrize("layout", ["reduced", "both", "kept", "mixed_out"])
def test_argmax_variadic(n, layout):
    half = max(n // 2, 1)
    xs, os_ = {
        "reduced": (f"{{devices=[1,{n}]<=[{n}]}}", "{replicated}"),
        "both": (f"{{devices=[2,{half}]<=[{n}]}}",
                 f"{{devices=[2,{half}]<=[{n}] last_tile_dim_replicate}}"),
        "kept": (f"{{devices=[{n},1]<=[{n}]}}", f"{{devices=[{n}]<=[{n}]}}"),
        "mixed_out": (f"{{devices=[1,{n}]<=[{n}]}}",
                      f"{{{{devices=[{n}]<=[{n}]}}, {{replicated}}}}"),
    }[layout]
    text = ARGMAX.replace("XS", xs).replace("OS", os_)
    # ties (repeated values) exercise the lower-index rule across devices
    x = np.round(np.random.default_rng(n).normal(size=(6, 13)) * 2).astype(np.float32)
    result = partition_and_verify(text, n, inputs=[x])
    if layout == "reduced":
        stats = module_stats(result.module)
        assert stats.count("all-gather") == 2 and stats.count("all-reduce") == 0


# -- unit tests of the helpers ---------------------------------------------------------------
def test_reducer_opcode_detection():
    module = parse_module(reduce_module("maximum", "f32", "0", [4], [0], "{replicated}",
                                        "{replicated}"), "t")
    assert reducer_opcode(module.computation("red")) == "maximum"
    argmax = parse_module(ARGMAX.replace("XS", "{replicated}").replace("OS", "{replicated}"),
                          "t")
    assert reducer_opcode(argmax.computation("argmax")) is None


def test_identity_values():
    assert identity_value("add", PrimitiveType.F32) == 0
    assert identity_value("multiply", PrimitiveType.S32) == 1
    assert np.isneginf(identity_value("maximum", PrimitiveType.F32))
    assert identity_value("minimum", PrimitiveType.S8) == 127
    assert identity_value("maximum", PrimitiveType.U16) == 0
    assert bool(identity_value("and", PrimitiveType.PRED)) is True
    assert bool(identity_value("or", PrimitiveType.PRED)) is False
    assert identity_value("and", PrimitiveType.S32) == -1


def test_reduced_sharding_and_groups():
    s = HloSharding.from_string("{devices=[2,4]<=[8]}")
    assert reduced_sharding(s, [1]) == HloSharding.from_string(
        "{devices=[2,4]<=[8] last_tile_dim_replicate}")
    assert reduced_sharding(s, [0, 1]).is_replicated
    assert reduction_groups(s, [1]).tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert reduction_groups(s, [0]).tolist() == [[0, 4], [1, 5], [2, 6], [3, 7]]
