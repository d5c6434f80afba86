"""The runtime harness (hlo_spmd.runtime) proven on hand-written per-device modules.

Each hand-written SPMD program is run on N of 8 host CPU devices and compared with the
annotated original on one device and with numpy; deliberately wrong programs must be
reported. Cases live in tests/_runtime_cases.py.
"""
from __future__ import annotations

import functools
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from hlo_spmd.errors import HloSpmdError, InputError
from hlo_spmd.runtime import ensure_host_devices

ensure_host_devices(8)  # before jax creates its backends
jax = pytest.importorskip("jax")

from hlo_spmd import runtime as rt  # noqa: E402
from hlo_spmd.runtime import slicing  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _runtime_cases as cases  # noqa: E402

SRC = Path(__file__).resolve().parent.parent / "src"


@functools.lru_cache(maxsize=None)
def partitioned_proto(case: cases.Case) -> bytes:
    """The case's per-device module as proto bytes with fields 12 / 14 set."""
    return rt.with_spmd_shardings(case.partitioned, case.param_shardings,
                                  case.output_sharding)


def _run_python(code: str, env_extra: dict[str, str]) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
    env.update(env_extra)
    env["PYTHONPATH"] = str(SRC) + os.pathsep + env.get("PYTHONPATH", "")
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


# --------------------------------------------------------------------------- setup


def test_importing_runtime_does_not_import_jax():
    out = _run_python("""
        import sys
        import hlo_spmd.runtime, hlo_spmd.runtime.run, hlo_spmd.runtime.slicing
        print(sorted(m for m in ("jax", "jaxlib") if m in sys.modules))
    """, {})
    assert out.strip() == "[]"


def test_ensure_host_devices_configures_a_fresh_process():
    out = _run_python("""
        import os
        from hlo_spmd.runtime import ensure_host_devices
        ensure_host_devices(5)
        print(os.environ["XLA_FLAGS"]); print(os.environ["JAX_PLATFORMS"])
        import jax
        print(len(jax.devices()))
    """, {"XLA_FLAGS": "--xla_cpu_enable_fast_math=false "
                       "--xla_force_host_platform_device_count=2"})
    flags, platforms, count = out.split("\n")[:3]
    assert "--xla_cpu_enable_fast_math=false" in flags
    assert "--xla_force_host_platform_device_count=5" in flags
    assert "device_count=2" not in flags
    assert platforms == "cpu"
    assert count == "5"


def test_ensure_host_devices_after_init_checks_the_count():
    assert len(jax.devices("cpu")) >= 8
    ensure_host_devices(8)  # enough: no error
    with pytest.raises(HloSpmdError, match="need 64 host CPU devices"):
        ensure_host_devices(64)


def test_missing_jax_is_a_clear_error(monkeypatch):
    from hlo_spmd.runtime._jax import load_jax

    monkeypatch.setitem(sys.modules, "jax", None)  # makes `import jax` fail
    with pytest.raises(HloSpmdError, match=r"pip install hlo-spmd\[xla\]"):
        load_jax()


# --------------------------------------------------------------------------- inputs


def test_random_inputs_are_deterministic_and_follow_specs():
    import ml_dtypes

    items = [((3, 4), "f32"), ((5,), "bf16"), ((2, 2), np.int32), ((6,), "pred"),
             ((4,), "float16"), ((50,), "s32"), ((2,), "f32")]
    specs = [None, "uniform:2:3", None, None, "normal:0.1", "int_range:0:3", "const:7"]
    a = rt.random_inputs(items, seed=3, spec=specs)
    b = rt.random_inputs(items, seed=3, spec=specs)
    c = rt.random_inputs(items, seed=4, spec=specs)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)
    assert not np.array_equal(a[0], c[0])
    assert [x.dtype for x in a] == [np.float32, ml_dtypes.bfloat16, np.int32, np.bool_,
                                    np.float16, np.int32, np.float32]
    assert [x.shape for x in a] == [s for s, _ in items]
    assert np.all((a[1].astype(np.float32) >= 2) & (a[1].astype(np.float32) <= 3))
    assert np.all((a[2] >= -8) & (a[2] < 8))
    assert set(np.unique(a[5])) == {0, 1, 2}  # half open: never 3
    assert np.abs(a[4]).max() < 1.0
    np.testing.assert_array_equal(a[6], [7, 7])
    # Input i does not depend on the inputs after it.
    first = rt.random_inputs(items[:1], seed=3)
    np.testing.assert_array_equal(first[0], a[0])


def test_random_inputs_rejects_bad_specs():
    with pytest.raises(HloSpmdError, match="unknown input spec"):
        rt.random_inputs([((2,), "f32")], spec="gaussian")
    with pytest.raises(HloSpmdError, match="needs a floating type"):
        rt.random_inputs([((2,), "s32")], spec="normal")
    with pytest.raises(HloSpmdError, match="2 input specs for 1 inputs"):
        rt.random_inputs([((2,), "f32")], spec=["normal", "normal"])


# --------------------------------------------------------------------------- slicing

SLICING_CASES = [
    # sharding, global shape, devices, expected per-device shape
    ("{devices=[2,1]<=[2]}", (8, 16), 2, (4, 16)),
    ("{devices=[4,1]<=[4]}", (10, 3), 4, (3, 3)),           # uneven: 3,3,3,1
    ("{devices=[1,4]<=[4]}", (2, 3), 4, (2, 1)),            # empty last shard
    ("{devices=[2,4]<=[4,2]T(1,0)}", (5, 9), 8, (3, 3)),
    ("{devices=[2,1,2]<=[4] last_tile_dim_replicate}", (7, 2), 4, (4, 2)),
    ("{devices=[2,2]3,1,0,2}", (4, 4), 4, (2, 2)),
    ("{replicated}", (3, 2), 4, (3, 2)),
    ("{maximal device=2}", (3,), 4, (3,)),
    ("{replicated}", (), 2, ()),
]


@pytest.mark.parametrize("text,shape,n,piece_shape", SLICING_CASES,
                         ids=[f"{c[0]}{list(c[1])}" for c in SLICING_CASES])
def test_shard_pieces_and_assemble_round_trip(text, shape, n, piece_shape):
    x = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape) + 1
    pieces = rt.shard_pieces(x, text, n, pad_value=-1)
    assert len(pieces) == n
    assert all(p.shape == piece_shape for p in pieces)
    # Every real element appears in some piece at its bounds; the rest is padding.
    bounds = slicing.device_bounds(text, shape, n)
    for d, piece in enumerate(pieces):
        if d not in slicing.data_holders(text, n):
            assert np.all(piece == -1)
            continue
        real = tuple(slice(0, int(hi - lo)) for lo, hi in bounds[d])
        region = tuple(slice(int(lo), int(hi)) for lo, hi in bounds[d])
        np.testing.assert_array_equal(piece[real], x[region])
        assert (piece == -1).sum() == piece.size - x[region].size
    np.testing.assert_array_equal(rt.assemble(pieces, text, shape), x)


def test_uneven_bounds_follow_xla_ceil_rule():
    bounds = slicing.device_bounds("{devices=[4,1]<=[4]}", (10, 3), 4)
    assert bounds[:, 0].tolist() == [[0, 3], [3, 6], [6, 9], [9, 10]]
    bounds = slicing.device_bounds("{devices=[1,4]<=[4]}", (2, 3), 4)
    assert bounds[:, 1].tolist() == [[0, 1], [1, 2], [2, 3], [3, 3]]
    # The tile assignment, not the device number, decides the position.
    bounds = slicing.device_bounds("{devices=[2,2]3,1,0,2}", (4, 4), 4)
    assert bounds[3].tolist() == [[0, 2], [0, 2]]
    assert bounds[0].tolist() == [[2, 4], [0, 2]]


def test_poison_padding_values():
    x = np.ones((3,), np.float32)
    pieces = rt.shard_pieces(x, "{devices=[2]<=[2]}", 2, pad_value=slicing.poison_value(x.dtype))
    assert pieces[1][0] == 1 and np.isnan(pieces[1][1])
    assert slicing.poison_value(np.dtype(np.int32)) == np.iinfo(np.int32).max
    assert slicing.poison_value(np.dtype(np.bool_)) is True


def test_assemble_reports_disagreeing_replicas_and_bad_shapes():
    text = "{devices=[2,1,2]<=[4] last_tile_dim_replicate}"
    x = np.arange(8, dtype=np.float32).reshape(4, 2)
    pieces = rt.shard_pieces(x, text, 4)
    pieces[3] = pieces[3] + 1  # device 3 holds rows 2..3 with device 2
    out, problems = rt.assemble_checked(pieces, text, (4, 2))
    assert len(problems) == 1 and "device 3 disagrees with device 2" in problems[0]
    np.testing.assert_array_equal(out, x)  # the lowest device wins
    with pytest.raises(HloSpmdError, match="disagrees"):
        rt.assemble(pieces, text, (4, 2))
    with pytest.raises(HloSpmdError, match=r"needs \[2, 2\]"):
        rt.assemble([np.zeros((3, 2), np.float32)] * 4, text, (4, 2))
    # ints compare exactly
    ints = [np.zeros((2,), np.int32), np.array([0, 1], np.int32)]
    assert rt.assemble_checked(ints, "{replicated}", (2,))[1]


# --------------------------------------------------------------------------- compare


def test_compare_report():
    e = [np.array([1.0, 2.0, np.nan], np.float32), np.arange(3, dtype=np.int32),
         np.zeros((2, 2), np.float32)]
    good = rt.compare(e, [e[0] + 1e-6, e[1].copy(), e[2].copy()])
    assert good.ok and bool(good)
    assert "OK" in str(good) and "NOT OK" not in str(good)

    bad = rt.compare(e, [np.array([1.0, 2.5, np.nan], np.float32),
                         np.array([0, 1, 3], np.int32), np.zeros((2, 3), np.float32)])
    assert not bad.ok
    o0, o1, o2 = bad.outputs
    assert not o0.ok and o0.max_abs_error == pytest.approx(0.5) and o0.mismatched == 1
    assert o0.max_rel_error == pytest.approx(0.25) and o0.first_mismatch == (1,)
    assert not o1.ok and o1.mismatched == 1
    assert not o2.shape_ok and not o2.ok
    table = str(bad)
    assert "NOT OK" in table and "MISMATCH" in table and "FAIL" in table
    assert "float32[2,2]" in table and "float32[2,3]" in table

    nan_leak = rt.compare([np.ones(2, np.float32)], [np.array([1, np.nan], np.float32)])
    assert not nan_leak.ok and nan_leak.outputs[0].max_abs_error == np.inf
    assert not rt.compare([np.ones(2, np.float32)], [np.ones(2, np.float64)]).ok
    assert not rt.compare([np.ones(2)], []).ok  # missing output
    loose = rt.compare([np.ones(2, np.float32)], [np.ones(2, np.float32) * 1.01], rtol=0.05)
    assert loose.ok


# --------------------------------------------------------------------------- running


@pytest.mark.parametrize("case", cases.GOOD_CASES, ids=lambda c: c.name)
def test_hand_partitioned_module_matches(case):
    inputs = case.inputs()
    reference = case.reference(*inputs)
    # (e) the annotated original runs as a single-device program.
    expected = rt.run_unpartitioned(case.original, inputs)
    assert len(expected) == len(reference)
    for got, ref in zip(expected, reference):
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
    # The per-device program, shardings read from the proto (fields 14 / 12).
    outputs = rt.run_partitioned(partitioned_proto(case), inputs, case.num_partitions,
                                 output_shapes=[r.shape for r in reference])
    for got, ref in zip(outputs, reference):
        assert got.shape == ref.shape
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
    report = rt.verify(case.original, partitioned_proto(case), case.num_partitions,
                       inputs=inputs)
    assert report.ok, str(report)


def test_verify_with_generated_inputs_and_text_module():
    case = cases.CONTRACTING_MATMUL
    report = rt.verify(case.original, case.partitioned, 4, seed=7,
                       param_shardings=case.param_shardings,
                       output_sharding=case.output_sharding)
    assert report.ok, str(report)


def test_per_device_results_are_exposed():
    case = cases.UNEVEN
    x = np.arange(30, dtype=np.float32).reshape(10, 3)
    run = rt.run_partitioned_detailed(partitioned_proto(case), [x], 4,
                                      output_shapes=[(3,), (10, 3)], poison_padding=True)
    assert not run.problems
    assert [p.shape for p in run.per_device[1]] == [(3, 3)] * 4
    # device 3 holds row 9 and two poisoned padding rows
    np.testing.assert_array_equal(run.input_pieces[0][3][0], x[9])
    assert np.isnan(run.input_pieces[0][3][1:]).all()
    assert np.isnan(run.per_device[1][3][1:]).all()  # 2 * NaN, dropped on reassembly
    np.testing.assert_array_equal(run.outputs[1], 2 * x)
    np.testing.assert_array_equal(run.outputs[0], x.sum(axis=0))


def test_run_unpartitioned_sharding_custom_call_and_tuple():
    text = """
HloModule annotated

ENTRY main {
  x = f32[8,6] parameter(0), sharding={devices=[2,4]<=[8]}
  y = s32[] parameter(1), sharding={replicated}
  c = f32[8,6] custom-call(x), custom_call_target="Sharding", sharding={devices=[8,1]<=[8]}
  e = f32[8,6] exponential(c), sharding={devices=[4,1,2]<=[8] last_tile_dim_replicate}
  z = s32[] multiply(y, y), sharding={maximal device=3}
  ROOT t = (f32[8,6], s32[]) tuple(e, z), sharding={{replicated}, {maximal device=3}}
}
"""
    x = np.linspace(-1, 1, 48, dtype=np.float32).reshape(8, 6)
    e, z = rt.run_unpartitioned(text, [x, np.int32(-7)])
    np.testing.assert_allclose(e, np.exp(x), rtol=1e-6)
    assert z.dtype == np.int32 and z.shape == () and int(z) == 49


def test_spmd_fields_round_trip_and_absence():
    case = cases.REDUCE_SCATTER
    params, output = rt.read_spmd_shardings(partitioned_proto(case))
    assert len(params) == 2 and output is not None
    assert str(slicing.as_sharding(params[0])) == "{devices=[2,4]<=[4,2]T(1,0)}"
    bare = rt.to_proto_bytes(case.partitioned)
    assert rt.read_spmd_shardings(bare) == (None, None)
    with pytest.raises(HloSpmdError, match="spmd_parameters_shardings"):
        rt.run_partitioned(bare, case.inputs(), 8)
    with pytest.raises(HloSpmdError, match="1 parameter shardings for 2 parameters"):
        rt.run_partitioned(bare, case.inputs(), 8, param_shardings=["{replicated}"],
                           output_sharding="{replicated}")


def test_input_shape_that_does_not_fit_the_module_is_an_error():
    case = cases.ROW_MATMUL
    x, w = case.inputs()
    with pytest.raises(HloSpmdError, match=r"per-device shape \[5, 16\], but the module.s parameter 0 is float32\[4,16\]"):
        rt.run_partitioned(partitioned_proto(case), [np.zeros((10, 16), np.float32), w], 2)
    with pytest.raises(HloSpmdError, match="1 inputs given"):
        rt.run_unpartitioned(case.original, [x])


def test_bad_text_is_an_input_error():
    with pytest.raises(InputError, match="could not parse"):
        rt.run_unpartitioned("HloModule m\nENTRY e {\n ROOT x = f32[2] bogus()\n}\n", [])


def test_compile_module_returns_cached_executable():
    case = cases.ALL_GATHER
    a = rt.compile_module(partitioned_proto(case), 4)
    assert rt.compile_module(partitioned_proto(case), 4) is a
    assert rt.compile_module(case.partitioned, 4) is not None  # text accepted too
    assert "all-gather" in a.get_hlo_text()


# --------------------------------------------------------------------------- (d) wrong programs


def test_forgotten_all_reduce_is_reported():
    case = cases.CONTRACTING_NO_ALL_REDUCE
    report = rt.verify(case.original, partitioned_proto(case), 4, inputs=case.inputs())
    assert not report.ok
    assert report.outputs[0].mismatched > 0
    assert any("disagrees" in p for p in report.problems)  # replicas differ too
    assert "NOT OK" in str(report)
    with pytest.raises(rt.ReplicaMismatchError):
        rt.run_partitioned(partitioned_proto(case), case.inputs(), 4)


def test_collective_permute_to_wrong_neighbour_is_reported():
    case = cases.PERMUTE_WRONG_NEIGHBOUR
    report = rt.verify(case.original, partitioned_proto(case), 4, inputs=case.inputs())
    assert not report.ok
    assert not report.problems  # a consistent but wrong answer
    # Shard k receives shard k+1 instead of k-1 (mod 4): every element is wrong.
    assert report.outputs[0].mismatched == 8 * 3


def test_padding_leak_is_caught_by_poison_only():
    case = cases.UNEVEN_LEAKY
    inputs = case.inputs()
    lenient = rt.verify(case.original, partitioned_proto(case), 4, inputs=inputs,
                        poison_padding=False)
    assert lenient.ok, str(lenient)  # zero padding hides the bug
    strict = rt.verify(case.original, partitioned_proto(case), 4, inputs=inputs)
    assert not strict.ok
    assert strict.outputs[0].max_abs_error == np.inf  # the NaN leaked into the sums
    assert strict.outputs[1].ok  # the elementwise output never looks at padding
    masked = rt.verify(case.original, partitioned_proto(cases.UNEVEN), 4, inputs=inputs)
    assert masked.ok, str(masked)


def test_partially_replicated_output_replicas_must_agree():
    case = cases.REPLICAS_DISAGREE
    with pytest.raises(rt.ReplicaMismatchError, match="device 1 disagrees with device 0"):
        rt.run_partitioned(partitioned_proto(case), case.inputs(), 4)
    report = rt.verify(case.original, partitioned_proto(case), 4, inputs=case.inputs())
    assert not report.ok and len(report.problems) == 2  # devices 1 and 3


def test_program_without_manual_entry_is_refused():
    case = cases.ROW_MATMUL
    text = case.partitioned.replace("parameter(0), sharding={manual}", "parameter(0)")
    pb = rt.with_spmd_shardings(text, case.param_shardings, case.output_sharding)
    with pytest.raises(HloSpmdError, match="parameter x lack sharding={manual}"):
        rt.run_partitioned(pb, case.inputs(), 2)


def test_manual_region_uses_xla_spmd_as_reference():
    case = cases.MANUAL_REGION
    inputs = case.inputs()
    (reference,) = case.reference(*inputs)
    with pytest.raises(rt.UnpartitionedRunError, match="run_xla_spmd"):
        rt.run_unpartitioned(case.original, inputs)
    (xla_result,) = rt.run_xla_spmd(case.original, inputs, 4)
    np.testing.assert_allclose(xla_result, reference, rtol=1e-5, atol=1e-5)
    report = rt.verify(case.original, partitioned_proto(case), 4, inputs=inputs)
    assert report.ok, str(report)
    assert "XLA's own SPMD partitioner" in str(report)
    with pytest.raises(rt.UnpartitionedRunError):
        rt.verify(case.original, partitioned_proto(case), 4, inputs=inputs,
                  reference="unpartitioned")


def test_xla_spmd_reference_agrees_on_an_uneven_module():
    case = cases.UNEVEN
    inputs = case.inputs()
    got = rt.run_xla_spmd(case.original, inputs, 4, poison_padding=True)
    for g, r in zip(got, case.reference(*inputs)):
        np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-5)
    report = rt.verify(case.original, partitioned_proto(case), 4, inputs=inputs,
                       reference="xla")
    assert report.ok and "XLA's own" in report.reference


def test_output_of_the_wrong_per_device_shape_is_reported():
    case = cases.ROW_MATMUL
    run = rt.run_partitioned_detailed(partitioned_proto(case), case.inputs(), 2,
                                      output_sharding="{devices=[1,2]<=[2]}",
                                      output_shapes=[(8, 8)])
    assert len(run.problems) == 1
    assert "device 0 returned shape [4, 8]" in run.problems[0]
    assert "needs [8, 4]" in run.problems[0]


def test_module_without_parameters_needs_no_parameter_shardings():
    """Zero entry parameters record an empty spmd_parameters_shardings, which the proto
    cannot tell from an absent one: the runtime takes it as the empty list."""
    original = """
HloModule no_params

ENTRY main {
  ROOT i = s32[4,3] iota(), iota_dimension=0, sharding={devices=[2,1]0,1}
}
"""
    per_device = """
HloModule no_params_spmd

ENTRY main {
  pid = u32[] partition-id()
  id = s32[] convert(pid)
  two = s32[] constant(2)
  off = s32[] multiply(id, two)
  b = s32[2,3] broadcast(off), dimensions={}
  i = s32[2,3] iota(), iota_dimension=0
  ROOT r = s32[2,3] add(i, b), sharding={manual}
}
"""
    partitioned = rt.with_spmd_shardings(per_device, [], "{devices=[2,1]0,1}")
    params, output = rt.read_spmd_shardings(partitioned)
    assert params is None and output is not None  # empty reads as absent
    expected = np.repeat(np.arange(4, dtype=np.int32)[:, None], 3, axis=1)
    (got,) = rt.run_partitioned(partitioned, [], 2)
    np.testing.assert_array_equal(got, expected)
    report = rt.verify(original, partitioned, 2)
    assert report.ok, str(report)
    # Parameters that exist still need their shardings.
    case = cases.REDUCE_SCATTER
    with pytest.raises(HloSpmdError, match="spmd_parameters_shardings"):
        rt.run_partitioned(rt.to_proto_bytes(case.partitioned), case.inputs(), 8)


def test_partitioner_output_without_parameters_verifies():
    from hlo_spmd.ir.io import module_bytes
    from hlo_spmd.ir.text_parser import parse_module
    from hlo_spmd.passes.partition import partition_in_place

    module = parse_module("""
HloModule no_params

ENTRY main {
  i = f32[4,6] iota(), iota_dimension=1, sharding={devices=[2,1]0,1}
  ROOT n = f32[4,6] negate(i), sharding={devices=[1,2]0,1}
}
""")
    original = module_bytes(module)
    partitioned = module_bytes(partition_in_place(module, 2, complete=True).module)
    report = rt.verify(original, partitioned, 2, poison_padding=True)
    assert report.ok, str(report)
