"""Shape inference (hlo_spmd.ir.shape_inference) against real XLA.

* Every instruction of a wide range of JAX programs (lowered by jax 0.10.2, shardings and
  collectives included) gets exactly the shape XLA gave it.
* Hypothesis draws random shapes and attributes for slice / pad / concatenate / transpose /
  broadcast / reduce / reduce-window / dot / convolution, builds the op with the Builder
  and compares with jax's result shape for the same op; one property compiles the built
  module with XLA, whose verifier rejects any wrong shape.
* Rule-by-rule error cases and the replica-group helpers.

Helpers here (``lower``, ``compile_module``, ``JAX_PROGRAMS``...) are reused by
test_builder.py and test_verifier.py.
"""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest

if "jax" not in sys.modules:  # N host devices must be requested before jax starts
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in flags:
        os.environ["XLA_FLAGS"] = (flags + " --xla_force_host_platform_device_count=8").strip()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hlo_spmd.errors import VerifierError
from hlo_spmd.ir import opcodes
from hlo_spmd.ir.builder import Builder, IotaGroups, make_window
from hlo_spmd.ir.computation import Computation
from hlo_spmd.ir.module import Module
from hlo_spmd.ir.primitive_types import PrimitiveType as PT
from hlo_spmd.ir.proto_io import module_from_proto, module_to_proto
from hlo_spmd.ir.shape import Shape
from hlo_spmd.ir import shape_inference as si
from hlo_spmd.ir.shape_inference import array_shape, infer_shape
from hlo_spmd.proto import hlo_pb2

F32 = PT.F32
HYP = settings(max_examples=60, deadline=None,
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


# -- jax helpers (shared with test_builder / test_verifier) -------------------------------------
def jax_or_skip():
    return pytest.importorskip("jax")


def lower_proto(f, *args) -> hlo_pb2.HloModuleProto:
    jax = jax_or_skip()
    data = jax.jit(f).lower(*args).compiler_ir("hlo").as_serialized_hlo_module_proto()
    return hlo_pb2.HloModuleProto.FromString(data)


def lower(f, *args) -> Module:
    return module_from_proto(lower_proto(f, *args))


def compile_module(module: Module, num_partitions: int = 1):
    """Compile with jaxlib's CPU client (XLA's verifier runs); returns (executable, devices)."""
    jax = jax_or_skip()
    from jaxlib import xla_client as xc

    devices = jax.devices("cpu")[:num_partitions]
    if len(devices) < num_partitions:
        pytest.skip(f"needs {num_partitions} host devices")
    data = module_to_proto(module).SerializeToString()
    stablehlo = xc._xla.mlir.hlo_to_stablehlo(data)
    opts = xc.CompileOptions()
    if num_partitions > 1:
        opts.num_replicas = 1
        opts.num_partitions = num_partitions
        build = opts.executable_build_options
        build.num_replicas = 1
        build.num_partitions = num_partitions
        build.use_spmd_partitioning = True
        assignment = xc.DeviceAssignment.create(np.arange(num_partitions).reshape(1, -1))
        build.device_assignment = assignment
        opts.device_assignment = assignment
    exe = devices[0].client.compile_and_load(stablehlo, xc.DeviceList(tuple(devices)), opts)
    return exe, devices


def run_module(module: Module, per_device_args, num_partitions: int = 1):
    """Run: ``per_device_args[p][d]`` is parameter p on device d. Returns out[o][d]."""
    jax = jax_or_skip()
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    exe, devices = compile_module(module, num_partitions)
    replicated = NamedSharding(Mesh(np.array(devices), ("d",)), PartitionSpec())
    args = []
    for pieces in per_device_args:
        bufs = [jax.device_put(np.asarray(p), d) for p, d in zip(pieces, devices)]
        args.append(jax.make_array_from_single_device_arrays(np.shape(pieces[0]), replicated, bufs))
    outs = exe.execute_sharded(args).disassemble_into_single_device_arrays()
    order = {d.id: i for i, d in enumerate(devices)}
    return [[np.asarray(b) for b in sorted(o, key=lambda b: order[next(iter(b.devices())).id])]
            for o in outs]


def new_module(name: str = "m") -> tuple[Module, Builder]:
    module = Module(name)
    comp = Computation("main")
    module.add_computation(comp)
    module.entry = comp
    return module, Builder(comp)


def check_module_shapes(module: Module) -> int:
    """Assert infer_shape reproduces every instruction's shape; returns the count."""
    n = 0
    for comp in module.computations:
        for inst in comp.instructions:
            inferred = infer_shape(inst.opcode, [o.shape for o in inst.operands], inst.attrs,
                                   inst.called_computations, inst.shape, where=inst.name)
            assert inferred.compatible(inst.shape), (inst.name, inst.opcode, str(inferred),
                                                     str(inst.shape))
            n += 1
    return n


def _programs():
    import jax
    import jax.numpy as jnp

    lax = jax.lax
    x = jnp.ones((4, 6), jnp.float32)
    img = jnp.ones((2, 3, 9, 9), jnp.float32)
    return [
        ("tanh_dot", lambda x: jnp.tanh(x) @ x.T, x),
        ("sum", lambda x: jnp.sum(x, axis=1), x),
        ("softmax", jax.nn.softmax, x),
        ("pad", lambda x: jnp.pad(x, ((1, 2), (0, 3))), x),
        ("pad_negative_interior", lambda x: lax.pad(x, 0., ((1, -2, 1), (0, 3, 2))), x),
        ("concat", lambda x: jnp.concatenate([x, x * 2], axis=1), x),
        ("slice_strided", lambda x: x[1:3, ::2], x),
        ("dynamic_slice", lambda x: lax.dynamic_slice(x, (1, 2), (2, 2)), x),
        ("dynamic_update_slice", lambda x: lax.dynamic_update_slice(x, jnp.zeros((2, 2)), (1, 2)), x),
        ("sort", lambda x: jnp.sort(x, axis=0), x),
        ("argsort", lambda x: jnp.argsort(x, axis=1), x),
        ("multi_sort", lambda x: lax.sort((x, x.astype(jnp.int32), -x), num_keys=2), x),
        ("top_k", lambda x: lax.top_k(x, 3), x),
        ("cumsum", lambda x: jnp.cumsum(x, axis=1), x),
        ("cumlogsumexp", lambda x: lax.cumlogsumexp(x, axis=0), x),
        ("fft", jnp.fft.fft, x),
        ("rfft", jnp.fft.rfft, x),
        ("irfft", lambda x: jnp.fft.irfft(jnp.fft.rfft(x)), x),
        ("fft2", lambda x: jnp.fft.fft2(x.astype(jnp.complex64)), x),
        ("take", lambda x: x[jnp.array([0, 2, 3])], x),
        ("scatter_add", lambda x: x.at[jnp.array([0, 2])].add(1.), x),
        ("vmap_gather", lambda x: jax.vmap(lambda a, i: a[i])(x, jnp.arange(4)), x),
        ("vmap_scatter", lambda x: jax.vmap(lambda a, i: a.at[i].set(5.))(x, jnp.arange(4)), x),
        ("gather_window", lambda x: lax.gather(
            x, jnp.array([[0, 1], [2, 3]]),
            lax.GatherDimensionNumbers(offset_dims=(1,), collapsed_slice_dims=(0,),
                                       start_index_map=(0, 1)), (1, 3)), x),
        ("argmax", lambda x: jnp.argmax(x, axis=1), x),
        ("variadic_reduce", lambda x: lax.reduce((x, x.astype(jnp.int32)), (0., 0),
                                                 lambda a, b: (a[0] + b[0], a[1] + b[1]), (0,)), x),
        ("max_min", lambda x: jnp.max(x) + jnp.min(x), x),
        ("cholesky", lambda x: jnp.linalg.cholesky(x.T @ x + jnp.eye(6)), x),
        ("triangular_solve", lambda x: jax.scipy.linalg.solve_triangular(
            jnp.eye(4) + 1, x, lower=True), x),
        ("qr", lambda x: jnp.linalg.qr(x)[0], x),
        ("eigh", lambda x: jnp.linalg.eigh(x.T @ x)[0], x),
        ("svd", lambda x: jnp.linalg.svd(x)[1], x),
        ("inv", lambda x: jnp.linalg.inv(x.T @ x + jnp.eye(6)), x),
        ("einsum_batch", lambda x: jnp.einsum("bij,bkj->bik", x.reshape(2, 2, 6), x.reshape(2, 2, 6)), x),
        ("dot_preferred", lambda x: lax.dot_general(
            x.astype(jnp.bfloat16), x.astype(jnp.bfloat16), (((1,), (1,)), ((), ())),
            preferred_element_type=jnp.float32), x),
        ("reduce_window_same", lambda x: lax.reduce_window(x, 0., lax.add, (2, 2), (1, 2), "SAME"), x),
        ("max_pool_grad", lambda x: jax.grad(lambda y: jnp.sum(lax.reduce_window(
            y, -jnp.inf, lax.max, (2, 2), (2, 2), "VALID")))(x), x),
        ("conv_same", lambda x: lax.conv_general_dilated(x[None, None], jnp.ones((3, 1, 3, 3)),
                                                         (1, 1), "SAME"), x),
        ("conv_dilated", lambda x: lax.conv_general_dilated(
            x[None, None], jnp.ones((3, 1, 3, 3)), (2, 1), ((1, 1), (2, 0)),
            lhs_dilation=(2, 1), rhs_dilation=(1, 2)), x),
        ("conv_nhwc", lambda x: lax.conv_general_dilated(
            jnp.ones((2, 9, 8, 3)), jnp.ones((3, 3, 3, 5)), (1, 2), "VALID",
            dimension_numbers=("NHWC", "HWIO", "NHWC")), x),
        ("conv_feature_groups", lambda x: lax.conv_general_dilated(
            img.reshape(2, 3, 9, 9).repeat(2, 1), jnp.ones((6, 3, 3, 3)), (1, 1), "VALID",
            feature_group_count=2), x),
        ("conv_batch_groups", lambda x: lax.conv_general_dilated(
            jnp.ones((4, 6, 5, 5)), jnp.ones((8, 6, 3, 3)), (1, 1), "VALID",
            batch_group_count=2), x),
        ("conv_grad", lambda x: jax.grad(lambda w: jnp.sum(lax.conv_general_dilated(
            img, w, (2, 2), "SAME")))(jnp.ones((4, 3, 3, 3))), x),
        ("convert", lambda x: x.astype(jnp.bfloat16).astype(jnp.int32), x),
        ("bitcast_narrow", lambda x: lax.bitcast_convert_type(x, jnp.uint8), x),
        ("bitcast_wide", lambda x: lax.bitcast_convert_type(
            x.astype(jnp.float16).reshape(4, 3, 2), jnp.float32), x),
        ("bitcast_same", lambda x: lax.bitcast_convert_type(x, jnp.int32), x),
        ("where", lambda x: jnp.where(x > 0, x, -x), x),
        ("clip", lambda x: jnp.clip(x, 0, 1), x),
        ("clamp_scalar", lambda x: lax.clamp(0., x, 1.), x),
        ("while", lambda x: lax.while_loop(lambda c: c[0] < 3, lambda c: (c[0] + 1, c[1] * 2),
                                           (0, x)), x),
        ("fori", lambda x: lax.fori_loop(0, 3, lambda i, v: v + i, x), x),
        ("cond", lambda x: lax.cond(x[0, 0] > 0, lambda y: y + 1, lambda y: y * 2, x), x),
        ("switch", lambda x: lax.switch(2, [lambda y: y, lambda y: y * 2, lambda y: -y], x), x),
        ("scan", lambda x: lax.scan(lambda c, r: (c + r, c * r), jnp.zeros(6), x), x),
        ("map", lambda x: lax.map(jnp.sum, x), x),
        ("random_normal", lambda x: jax.random.normal(jax.random.key(0), x.shape), x),
        ("random_uniform_iota", lambda x: jax.random.uniform(jax.random.key(1), (3,))
         + lax.iota(jnp.float32, 3), x),
        ("rng_bit_generator", lambda x: lax.rng_bit_generator(jnp.zeros((4,), jnp.uint32), (3, 3))[1], x),
        ("transpose", lambda x: jnp.transpose(x.reshape(2, 2, 6), (2, 0, 1)), x),
        ("flip", lambda x: jnp.flip(x, 0), x),
        ("complex", lambda x: jnp.abs(x + 1j * x) + jnp.real(x * (1 + 2j)) + jnp.imag(x * 1j), x),
        ("lax_complex", lambda x: lax.complex(x, x), x),
        ("reduce_precision", lambda x: lax.reduce_precision(x, 5, 10), x),
        ("rounding", lambda x: jnp.round(x) + jnp.floor(x) + jnp.ceil(x) + jnp.sign(x), x),
        ("bit_ops", lambda x: (x.astype(jnp.int32) >> 2) & 3 | 1 ^ 7, x),
        ("shift_logical", lambda x: lax.shift_right_logical(x.astype(jnp.uint32), jnp.uint32(3))
         << jnp.uint32(1), x),
        ("popcnt_clz", lambda x: lax.population_count(x.astype(jnp.uint32))
         + lax.clz(x.astype(jnp.uint32)), x),
        ("not", lambda x: ~(x > 0) | ~x.astype(jnp.int8).astype(bool), x),
        ("is_finite", jnp.isfinite, x),
        ("transcendental", lambda x: jax.nn.gelu(x) + lax.erf(x) + jnp.log1p(x) + jnp.expm1(x)
         + jnp.arctan2(x, x) + x ** 3.5 + jnp.remainder(x, 2.), x),
        ("trig", lambda x: jnp.sin(x) + jnp.cos(x) + jnp.tan(x) + jnp.arcsin(x) + jnp.arccos(x)
         + jnp.arctan(x) + jnp.sinh(x) + jnp.cosh(x) + jnp.arcsinh(x) + jnp.arctanh(x), x),
        ("roots", lambda x: lax.rsqrt(x) + jnp.cbrt(x) + jax.nn.sigmoid(x) + jnp.sqrt(x), x),
        ("opt_barrier", lambda x: lax.optimization_barrier((x, x * 2)), x),
        ("one_hot", lambda x: jax.nn.one_hot(jnp.arange(4), 5) @ jnp.ones((5, 2)), x),
        ("select_n", lambda x: lax.select_n(jnp.array(1), x, x * 2), x),
        ("integer_div", lambda x: x.astype(jnp.int32) // 3 + x.astype(jnp.int32) % 3, x),
        ("f16", lambda x: x.astype(jnp.float16) * 2, x),
        ("mlp_grad", lambda x: jax.grad(lambda w: jnp.sum(jax.nn.relu(x @ w) ** 2))(jnp.ones((6, 3))), x),
        ("attention", lambda x: jax.nn.dot_product_attention(
            x.reshape(1, 4, 2, 3), x.reshape(1, 4, 2, 3), x.reshape(1, 4, 2, 3)), x),
        ("layer_norm", lambda x: (x - x.mean(-1, keepdims=True)) / jnp.sqrt(x.var(-1, keepdims=True) + 1e-5), x),
    ]


def _sharded_programs():
    """shard_map collectives and jit shardings (the modules carry shardings)."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    if len(jax.devices()) < 8:
        return []
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("a", "b"))
    lax = jax.lax

    def sm(f, ins=P("a", "b"), outs=P("a", "b")):
        return jax.shard_map(f, mesh=mesh, in_specs=ins, out_specs=outs, check_vma=False)

    x = jnp.ones((8, 16), jnp.float32)
    return [
        ("psum", sm(lambda y: lax.psum(y, "a")), x),
        ("psum_2axes", sm(lambda y: lax.psum(y, ("a", "b"))), x),
        ("pmax", sm(lambda y: lax.pmax(y, "b")), x),
        ("all_gather_tiled", sm(lambda y: lax.all_gather(y, "b", axis=1, tiled=True),
                                outs=P("a", None)), x),
        ("all_gather_stacked", sm(lambda y: lax.all_gather(y, "a", axis=0),
                                  outs=P(None, None, "b")), x),
        ("psum_scatter", sm(lambda y: lax.psum_scatter(y, "b", scatter_dimension=1, tiled=True),
                            ins=P("a", None)), x),
        ("all_to_all", sm(lambda y: lax.all_to_all(y, "b", 0, 1, tiled=True),
                          ins=P("a", None)), x),
        ("ppermute", sm(lambda y: lax.ppermute(y, "b", [(i, (i + 1) % 4) for i in range(4)])), x),
        ("axis_index", sm(lambda y: y * lax.axis_index("b")), x),
        ("jit_sharded", jax.jit(lambda y: jnp.tanh(y @ y.T),
                                in_shardings=NamedSharding(mesh, P("a", "b")),
                                out_shardings=NamedSharding(mesh, P("a", None))), x),
    ]


_PROGRAM_CACHE: dict[str, list] = {}


def jax_programs() -> list:
    jax_or_skip()
    if "all" not in _PROGRAM_CACHE:
        _PROGRAM_CACHE["all"] = _programs() + _sharded_programs()
    return _PROGRAM_CACHE["all"]


PROGRAM_IDS = [
    "tanh_dot", "sum", "softmax", "pad", "pad_negative_interior", "concat", "slice_strided",
    "dynamic_slice", "dynamic_update_slice", "sort", "argsort", "multi_sort", "top_k",
    "cumsum", "cumlogsumexp", "fft", "rfft", "irfft", "fft2", "take", "scatter_add",
    "vmap_gather", "vmap_scatter", "gather_window", "argmax", "variadic_reduce", "max_min",
    "cholesky", "triangular_solve", "qr", "eigh", "svd", "inv", "einsum_batch",
    "dot_preferred", "reduce_window_same", "max_pool_grad", "conv_same", "conv_dilated",
    "conv_nhwc", "conv_feature_groups", "conv_batch_groups", "conv_grad", "convert",
    "bitcast_narrow", "bitcast_wide", "bitcast_same", "where", "clip", "clamp_scalar", "while",
    "fori", "cond", "switch", "scan", "map", "random_normal", "random_uniform_iota",
    "rng_bit_generator", "transpose", "flip", "complex", "lax_complex", "reduce_precision",
    "rounding", "bit_ops", "shift_logical", "popcnt_clz", "not", "is_finite",
    "transcendental", "trig", "roots", "opt_barrier", "one_hot", "select_n", "integer_div",
    "f16", "mlp_grad", "attention", "layer_norm",
    "psum", "psum_2axes", "pmax", "all_gather_tiled", "all_gather_stacked", "psum_scatter",
    "all_to_all", "ppermute", "axis_index", "jit_sharded",
]


def program(name: str):
    for entry in jax_programs():
        if entry[0] == name:
            return entry
    pytest.skip(f"program {name} unavailable (needs 8 host devices)")


# -- the table ---------------------------------------------------------------------------------------
def test_every_opcode_has_a_table_entry():
    missing = [op for op in opcodes.ALL_OPCODES if op not in si._RULES]
    assert not missing
    for alias, xla in si.XLA_SPELLING.items():
        assert si._RULES[alias] is si._RULES[xla]
        assert xla in si.KNOWN_OPCODES
    groups = [si.DECLARED_ONLY, si.DECLARED_ELEMENT_TYPE, si.DECLARED_DIMS]
    for i, a in enumerate(groups):
        for b in groups[i + 1:]:
            assert not a & b
    assert si.has_rule("add") and si.has_rule("broadcast") and not si.has_rule("custom-call")


def test_unknown_opcode():
    with pytest.raises(VerifierError, match="unknown opcode"):
        infer_shape("frobnicate", [])


def test_program_list_ids_match():
    assert [p[0] for p in jax_programs()] == PROGRAM_IDS[:len(jax_programs())]


# -- real XLA: every instruction of lowered JAX programs --------------------------------------------
@pytest.mark.parametrize("name", PROGRAM_IDS)
def test_jax_module_shapes(name):
    _, f, arg = program(name)
    module = lower(f, arg)
    assert check_module_shapes(module) > 0


def test_jax_collective_attributes_seen():
    """The sharded programs really exercise the collective rules."""
    seen = set()
    for name in ("psum", "all_gather_tiled", "psum_scatter", "all_to_all", "ppermute"):
        _, f, arg = program(name)
        for inst in lower(f, arg).instructions():
            seen.add(inst.opcode)
    assert {"all-reduce", "all-gather", "reduce-scatter", "all-to-all",
            "collective-permute"} <= seen


# -- hypothesis: builder vs jax ------------------------------------------------------------------------
def jax_shape(f, *shapes):
    jax = jax_or_skip()
    import jax.numpy as jnp

    structs = [jax.ShapeDtypeStruct(tuple(s), jnp.float32) for s in shapes]
    out = jax.eval_shape(f, *structs)
    return tuple(out.shape)


dims_st = st.lists(st.integers(0, 6), min_size=0, max_size=4)
pos_dims_st = st.lists(st.integers(1, 6), min_size=1, max_size=4)


@st.composite
def slice_case(draw):
    dims = draw(dims_st)
    starts, limits, strides = [], [], []
    for d in dims:
        a = draw(st.integers(0, d))
        b = draw(st.integers(a, d))
        starts.append(a)
        limits.append(b)
        strides.append(draw(st.integers(1, 3)))
    return dims, starts, limits, strides


@given(slice_case())
@HYP
def test_slice_matches_jax(case):
    dims, starts, limits, strides = case
    _, b = new_module()
    x = b.parameter(0, array_shape(F32, dims))
    y = b.slice(x, starts, limits, strides)
    import jax

    assert y.shape.dims == jax_shape(lambda v: jax.lax.slice(v, starts, limits, strides), dims)


@st.composite
def pad_case(draw):
    dims = draw(dims_st)
    cfg = []
    for d in dims:
        interior = draw(st.integers(0, 3))
        full = d + max(d - 1, 0) * interior
        lo = draw(st.integers(-full, 4))
        hi = draw(st.integers(-(full + lo) if full + lo > 0 else 0, 4))
        cfg.append((lo, hi, interior))
    return dims, cfg


@given(pad_case())
@HYP
def test_pad_matches_jax(case):
    dims, cfg = case
    _, b = new_module()
    x = b.parameter(0, array_shape(F32, dims))
    y = b.pad(x, 0.0, [c[0] for c in cfg], [c[1] for c in cfg], [c[2] for c in cfg])
    import jax

    assert y.shape.dims == jax_shape(lambda v: jax.lax.pad(v, 0.0, cfg), dims)


@st.composite
def concat_case(draw):
    dims = draw(pos_dims_st)
    dim = draw(st.integers(0, len(dims) - 1))
    sizes = draw(st.lists(st.integers(0, 5), min_size=1, max_size=4))
    shapes = []
    for s in sizes:
        d = list(dims)
        d[dim] = s
        shapes.append(d)
    return shapes, dim


@given(concat_case())
@HYP
def test_concatenate_matches_jax(case):
    shapes, dim = case
    _, b = new_module()
    xs = [b.parameter(i, array_shape(F32, s)) for i, s in enumerate(shapes)]
    y = b.concatenate(xs, dim)
    import jax

    assert y.shape.dims == jax_shape(lambda *v: jax.lax.concatenate(v, dim), *shapes)


@st.composite
def transpose_case(draw):
    dims = draw(dims_st)
    perm = draw(st.permutations(range(len(dims))))
    return dims, list(perm)


@given(transpose_case())
@HYP
def test_transpose_matches_jax(case):
    dims, perm = case
    _, b = new_module()
    y = b.transpose(b.parameter(0, array_shape(F32, dims)), perm)
    import jax

    assert y.shape.dims == jax_shape(lambda v: jax.lax.transpose(v, perm), dims)


@st.composite
def broadcast_case(draw):
    out = draw(st.lists(st.integers(0, 5), min_size=0, max_size=4))
    mapped = sorted(draw(st.sets(st.integers(0, max(len(out) - 1, 0)), max_size=len(out))))
    mapped = [m for m in mapped if m < len(out)]
    return [out[m] for m in mapped], out, mapped


@given(broadcast_case())
@HYP
def test_broadcast_matches_jax(case):
    dims, out, mapped = case
    _, b = new_module()
    y = b.broadcast(b.parameter(0, array_shape(F32, dims)), out, mapped)
    import jax

    assert y.shape.dims == jax_shape(lambda v: jax.lax.broadcast_in_dim(v, out, mapped), dims)


@st.composite
def reduce_case(draw):
    dims = draw(dims_st)
    red = sorted(draw(st.sets(st.integers(0, max(len(dims) - 1, 0)), max_size=len(dims))))
    return dims, [r for r in red if r < len(dims)]


@given(reduce_case(), st.sampled_from(["add", "maximum", "multiply"]))
@HYP
def test_reduce_matches_jax(case, op):
    dims, red = case
    _, b = new_module()
    y = b.reduce(b.parameter(0, array_shape(F32, dims)), 0.0, red, op)
    import jax

    assert y.shape.dims == jax_shape(lambda v: jax.lax.reduce(v, 0.0, jax.lax.add, red), dims)
    assert y.shape.element_type == F32


@st.composite
def dot_case(draw):
    nb, nc = draw(st.integers(0, 2)), draw(st.integers(0, 2))
    nl, nr = draw(st.integers(0, 2)), draw(st.integers(0, 2))
    batch = draw(st.lists(st.integers(1, 4), min_size=nb, max_size=nb))
    contract = draw(st.lists(st.integers(1, 4), min_size=nc, max_size=nc))
    lfree = draw(st.lists(st.integers(1, 4), min_size=nl, max_size=nl))
    rfree = draw(st.lists(st.integers(1, 4), min_size=nr, max_size=nr))
    lperm = draw(st.permutations(range(nb + nc + nl)))
    rperm = draw(st.permutations(range(nb + nc + nr)))
    # logical order: batch, contracting, free; lperm[i] = physical position of logical dim i
    lhs = [0] * len(lperm)
    for i, size in enumerate(batch + contract + lfree):
        lhs[lperm[i]] = size
    rhs = [0] * len(rperm)
    for i, size in enumerate(batch + contract + rfree):
        rhs[rperm[i]] = size
    return (lhs, rhs, [lperm[i] for i in range(nb)], [rperm[i] for i in range(nb)],
            [lperm[nb + i] for i in range(nc)], [rperm[nb + i] for i in range(nc)])


@given(dot_case(), st.sampled_from([None, PT.F64]))
@HYP
def test_dot_matches_jax(case, result_type):
    lhs, rhs, lb, rb, lc, rc = case
    _, b = new_module()
    y = b.dot(b.parameter(0, array_shape(F32, lhs)), b.parameter(1, array_shape(F32, rhs)),
              lb, rb, lc, rc, result_type=result_type)
    import jax

    expect = jax_shape(lambda u, v: jax.lax.dot_general(u, v, ((lc, rc), (lb, rb))), lhs, rhs)
    assert y.shape.dims == expect
    assert y.shape.element_type == (result_type or F32)


@st.composite
def window_case(draw):
    dims = draw(st.lists(st.integers(1, 7), min_size=1, max_size=3))
    sizes = [draw(st.integers(1, 3)) for _ in dims]
    strides = [draw(st.integers(1, 3)) for _ in dims]
    base = [draw(st.integers(1, 2)) for _ in dims]
    wdil = [draw(st.integers(1, 2)) for _ in dims]
    pads = [(draw(st.integers(-1, 2)), draw(st.integers(-1, 2))) for _ in dims]
    return dims, sizes, strides, base, wdil, pads


@given(window_case())
@HYP
def test_reduce_window_matches_jax(case):
    dims, sizes, strides, base, wdil, pads = case
    _, b = new_module()
    x = b.parameter(0, array_shape(F32, dims))
    import jax

    try:
        expect = jax_shape(lambda v: jax.lax.reduce_window(
            v, 0.0, jax.lax.add, sizes, strides, pads, base, wdil), dims)
    except Exception:
        with pytest.raises(VerifierError):
            b.reduce_window(x, 0.0, sizes, "add", strides, pads, base, wdil)
        return
    y = b.reduce_window(x, 0.0, sizes, "add", strides, pads, base, wdil)
    assert y.shape.dims == expect


@st.composite
def conv_case(draw):
    nsp = draw(st.integers(1, 2))
    fgc = draw(st.integers(1, 2))
    bgc = 1 if fgc > 1 else draw(st.integers(1, 2))
    batch = draw(st.integers(1, 2)) * bgc
    cin = draw(st.integers(1, 2)) * fgc
    cout = draw(st.integers(1, 2)) * fgc * bgc
    spatial = [draw(st.integers(3, 7)) for _ in range(nsp)]
    kernel = [draw(st.integers(1, 3)) for _ in range(nsp)]
    strides = [draw(st.integers(1, 2)) for _ in range(nsp)]
    pads = [(draw(st.integers(0, 2)), draw(st.integers(0, 2))) for _ in range(nsp)]
    ldil = [draw(st.integers(1, 2)) for _ in range(nsp)]
    rdil = [draw(st.integers(1, 2)) for _ in range(nsp)]
    return nsp, fgc, bgc, batch, cin, cout, spatial, kernel, strides, pads, ldil, rdil


@given(conv_case())
@HYP
def test_convolution_matches_jax(case):
    nsp, fgc, bgc, batch, cin, cout, spatial, kernel, strides, pads, ldil, rdil = case
    lhs = [batch, cin, *spatial]
    rhs = [cout, cin // fgc, *kernel]
    sp = "".join(str(i) for i in range(nsp))
    _, b = new_module()
    y = b.convolution(b.parameter(0, array_shape(F32, lhs)), b.parameter(1, array_shape(F32, rhs)),
                      make_window(kernel, strides, pads, ldil, rdil),
                      f"bf{sp}_oi{sp}->bf{sp}", fgc, bgc)
    import jax

    expect = jax_shape(lambda u, v: jax.lax.conv_general_dilated(
        u, v, strides, pads, ldil, rdil, feature_group_count=fgc, batch_group_count=bgc), lhs, rhs)
    assert y.shape.dims == expect


# -- hypothesis: XLA's own verifier (compile) -----------------------------------------------------------
@given(slice_case(), pad_case(), transpose_case(), reduce_case(), dot_case())
@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
def test_built_modules_compile_in_xla(sl, pd, tr, rd, dt):
    """XLA compiles (and verifies) modules whose shapes all come from infer_shape."""
    jax_or_skip()
    module, b = new_module("random_ops")
    outs = []
    x = b.parameter(0, array_shape(F32, sl[0]))
    outs.append(b.slice(x, sl[1], sl[2], sl[3]))
    x = b.parameter(1, array_shape(F32, pd[0]))
    outs.append(b.pad(x, 1.0, [c[0] for c in pd[1]], [c[1] for c in pd[1]], [c[2] for c in pd[1]]))
    outs.append(b.transpose(b.parameter(2, array_shape(F32, tr[0])), tr[1]))
    outs.append(b.reduce(b.parameter(3, array_shape(F32, rd[0])), 0.0, rd[1], "maximum"))
    lhs, rhs, lb, rb, lc, rc = dt
    outs.append(b.dot(b.parameter(4, array_shape(F32, lhs)), b.parameter(5, array_shape(F32, rhs)),
                      lb, rb, lc, rc))
    b.set_root(b.tuple(outs))
    compile_module(module)


# -- rule-by-rule error cases ---------------------------------------------------------------------------
def _attrs(**kw) -> hlo_pb2.HloInstructionProto:
    return hlo_pb2.HloInstructionProto(**kw)


S = array_shape


@pytest.mark.parametrize("opcode, shapes, attrs, match", [
    ("add", [S(F32, (2, 3)), S(F32, (3, 2))], None, "equal dimensions"),
    ("add", [S(F32, (2,)), S(PT.S32, (2,))], None, "same element type"),
    ("and", [S(F32, (2,)), S(F32, (2,))], None, "pred or integral"),
    ("subtract", [S(PT.PRED, (2,)), S(PT.PRED, (2,))], None, "arithmetic"),
    ("floor", [S(PT.S32, (2,))], None, "floating"),
    ("negate", [S(F32, (2,)), S(F32, (2,))], None, "expects 1 operand"),
    ("select", [S(F32, (2,)), S(F32, (2,)), S(F32, (2,))], None, "predicate must be pred"),
    ("select", [S(PT.PRED, (3,)), S(F32, (2,)), S(F32, (2,))], None, "differ in dimensions"),
    ("clamp", [S(F32, (3,)), S(F32, (2,)), S(F32, ())], None, "scalar or match"),
    ("transpose", [S(F32, (2, 3))], _attrs(dimensions=[0, 0]), "permutation"),
    ("slice", [S(F32, (4,))], _attrs(slice_dimensions=[{"start": 0, "limit": 5, "stride": 1}]),
     "out of bounds"),
    ("slice", [S(F32, (4,))], _attrs(slice_dimensions=[{"start": 0, "limit": 2, "stride": 0}]),
     "positive"),
    ("pad", [S(F32, (4,)), S(F32, ())],
     _attrs(padding_config={"dimensions": [{"edge_padding_low": -5}]}), "negative"),
    ("pad", [S(F32, (4,)), S(F32, ())],
     _attrs(padding_config={"dimensions": [{"interior_padding": -1}]}), "interior"),
    ("pad", [S(F32, (4,)), S(PT.S32, ())],
     _attrs(padding_config={"dimensions": [{}]}), "padding value"),
    ("concatenate", [S(F32, (2, 3)), S(F32, (3, 3))], _attrs(dimensions=[1]), "differ in dim 0"),
    ("concatenate", [S(F32, (2, 3))], _attrs(dimensions=[2]), "out of range"),
    ("dynamic-slice", [S(F32, (4, 4)), S(PT.S32, ()), S(PT.S32, ())],
     _attrs(dynamic_slice_sizes=[5, 1]), "out of range"),
    ("dynamic-slice", [S(F32, (4, 4)), S(PT.S32, ())], _attrs(dynamic_slice_sizes=[1, 1]),
     "start indices"),
    ("dynamic-slice", [S(F32, (4, 4)), S(F32, ()), S(F32, ())],
     _attrs(dynamic_slice_sizes=[1, 1]), "integral scalar"),
    ("dynamic-update-slice", [S(F32, (4,)), S(F32, (5,)), S(PT.S32, ())], None, "exceeds"),
    ("reverse", [S(F32, (4,))], _attrs(dimensions=[1]), "out of range"),
    ("get-tuple-element", [S(F32, (4,))], _attrs(tuple_index=0), "not a tuple"),
    ("get-tuple-element", [Shape.tuple_of([S(F32, ())])], _attrs(tuple_index=1), "out of range"),
    ("dot", [S(F32, (2, 3)), S(F32, (4, 5))],
     _attrs(dot_dimension_numbers={"lhs_contracting_dimensions": [1],
                                   "rhs_contracting_dimensions": [0]}), "contracting dims differ"),
    ("dot", [S(F32, (2, 3)), S(F32, (3, 5))],
     _attrs(dot_dimension_numbers={"lhs_contracting_dimensions": [2],
                                   "rhs_contracting_dimensions": [0]}), "out of range"),
    ("top-k", [S(F32, (2, 3))], _attrs(k=4), "out of range"),
    ("cholesky", [S(F32, (2, 3))], None, "square"),
    ("fft", [S(F32, (8,))], _attrs(fft_type=0, fft_length=[8]), "complex"),
    ("fft", [S(F32, (8,))], _attrs(fft_type=2, fft_length=[4]), "fft_length"),
    ("after-all", [S(F32, ())], None, "token"),
    ("get-dimension-size", [S(F32, (3,))], _attrs(dimensions=[1]), "out of range"),
    ("bitcast-convert", [S(F32, (3,))], None, "declared"),
    ("reduce-scatter", [S(F32, (6,))], _attrs(dimensions=[0]), "called computation"),
])
def test_rule_errors(opcode, shapes, attrs, match):
    with pytest.raises(VerifierError, match=match):
        infer_shape(opcode, shapes, attrs, where="test")


def test_error_carries_where():
    with pytest.raises(VerifierError) as info:
        infer_shape("add", [S(F32, (2,)), S(F32, (3,))], where="computation c, instruction i")
    assert info.value.where == "computation c, instruction i"
    assert "add:" in info.value.message


def test_declared_result_parts():
    x = S(F32, (2, 3))
    assert infer_shape("convert", [x], declared=S(PT.BF16, ())).compatible(S(PT.BF16, (2, 3)))
    assert infer_shape("bitcast-convert", [x], declared=S(PT.U8, ())).dims == (2, 3, 4)
    assert infer_shape("bitcast-convert", [S(PT.F16, (3, 2))], declared=S(F32, ())).dims == (3,)
    with pytest.raises(VerifierError, match="ratio"):
        infer_shape("bitcast-convert", [S(PT.F16, (3, 4))], declared=S(F32, ()))
    b = infer_shape("broadcast", [S(F32, (3,))], _attrs(dimensions=[1]), declared=S(F32, (2, 3)))
    assert b.dims == (2, 3)
    with pytest.raises(VerifierError, match="must equal"):
        infer_shape("broadcast", [S(F32, (1,))], _attrs(dimensions=[1]), declared=S(F32, (2, 3)))
    with pytest.raises(VerifierError, match="element counts"):
        infer_shape("reshape", [x], declared=S(F32, (7,)))
    # dot: element type from the declared shape (preferred element type), dims inferred
    dn = _attrs(dot_dimension_numbers={"lhs_contracting_dimensions": [1],
                                       "rhs_contracting_dimensions": [1]})
    assert infer_shape("dot", [x, x], dn, declared=S(PT.F64, (9, 9))).compatible(S(PT.F64, (2, 2)))
    assert infer_shape("dot", [x, x], dn).compatible(S(F32, (2, 2)))
    # declared-only ops need it
    with pytest.raises(VerifierError, match="declared"):
        infer_shape("parameter", [])
    assert infer_shape("iota", [], _attrs(dimensions=[1]), declared=x) is x
    with pytest.raises(VerifierError, match="iota dimension"):
        infer_shape("iota", [], _attrs(dimensions=[2]), declared=x)


def test_fixed_and_token_shapes():
    assert infer_shape("partition-id", []).compatible(S(PT.U32, ()))
    assert infer_shape("replica-id", []).compatible(S(PT.U32, ()))
    assert infer_shape("after-all", [Shape.token(), Shape.token()]).is_token
    assert infer_shape("after-all", []).is_token
    assert infer_shape("get-dimension-size", [S(F32, (3, 4))], _attrs(dimensions=[1])).compatible(
        S(PT.S32, ()))
    tup = Shape.tuple_of([S(F32, (2,)), S(PT.S32, ())])
    assert infer_shape("opt-barrier", [tup]) is tup
    assert infer_shape("optimization-barrier", [tup]) is tup
    assert infer_shape("tuple", [S(F32, (2,)), S(PT.S32, ())]).compatible(tup)


def test_scaled_dot_and_unmodelled_opcodes():
    dn = _attrs(dot_dimension_numbers={"lhs_contracting_dimensions": [1],
                                       "rhs_contracting_dimensions": [0]})
    ops = [S(PT.F8E4M3FN, (4, 32)), S(PT.F8E4M3FN, (32, 8)), S(PT.F8E8M0FNU, (4, 1)),
           S(PT.F8E8M0FNU, (1, 8))]
    out = infer_shape("scaled-dot", ops, dn, declared=S(PT.BF16, (4, 8)))
    assert out.compatible(S(PT.BF16, (4, 8)))
    for op in ("scan", "shuffle", "collective-reduce"):
        assert op in si.DECLARED_ONLY
        assert infer_shape(op, [], declared=S(F32, (2,))).dims == (2,)


def test_top_k_shape():
    out = infer_shape("topk", [S(F32, (5, 7))], _attrs(k=3))
    assert out.compatible(Shape.tuple_of([S(F32, (5, 3)), S(PT.S32, (5, 3))]))


def test_gather_with_batching_dims():
    # operand [B, N, D], indices [B, K, 1] -> [B, K, D] (jax's batched gather)
    g = _attrs(gather_dimension_numbers={
        "offset_dims": [2], "collapsed_slice_dims": [1], "start_index_map": [1],
        "index_vector_dim": 2, "operand_batching_dims": [0], "start_indices_batching_dims": [0]},
        gather_slice_sizes=[1, 1, 5])
    out = infer_shape("gather", [S(F32, (3, 7, 5)), S(PT.S32, (3, 4, 1))], g)
    assert out.dims == (3, 4, 5)


# -- collectives -------------------------------------------------------------------------------------
def _collective(opcode, groups=None, **kw):
    a = _attrs(**kw)
    from hlo_spmd.ir.builder import set_replica_groups

    set_replica_groups(a, groups)
    return a


def test_all_gather_group_size_forms():
    x = S(F32, (2, 3))
    explicit = _collective("all-gather", [[0, 1, 2, 3], [4, 5, 6, 7]], dimensions=[1],
                           channel_id=1, use_global_device_ids=True)
    assert infer_shape("all-gather", [x], explicit).dims == (2, 12)
    iota = _collective("all-gather", IotaGroups(4, 2, (4, 2), (1, 0)), dimensions=[0],
                       channel_id=1, use_global_device_ids=True)
    assert infer_shape("all-gather", [x], iota).dims == (4, 3)
    assert infer_shape("all-gather", [x, S(PT.S32, (5, 1))], iota).compatible(
        Shape.tuple_of([S(F32, (4, 3)), S(PT.S32, (10, 1))]))
    # legacy encodings: deprecated replica_groups field and the nested iota list
    legacy = _attrs(dimensions=[0], replica_groups=[{"replica_ids": [0, 1, 2]}])
    assert infer_shape("all-gather", [x], legacy).dims == (6, 3)
    nested = _attrs(dimensions=[0])
    nested.collective_device_list.iota_replica_group_list.num_replica_groups = 1
    nested.collective_device_list.iota_replica_group_list.num_devices_per_group = 5
    assert infer_shape("all-gather", [x], nested).dims == (10, 3)
    # empty groups: the size is not recorded, the declared result supplies it
    empty = _attrs(dimensions=[0])
    with pytest.raises(VerifierError, match="declared"):
        infer_shape("all-gather", [x], empty)
    assert infer_shape("all-gather", [x], empty, declared=S(F32, (16, 3))).dims == (16, 3)


def test_reduce_scatter_and_all_to_all():
    module, b = new_module()
    add = b.scalar_computation("add", F32)
    x = S(F32, (8, 6))
    rs = _collective("reduce-scatter", IotaGroups(2, 4), dimensions=[0], channel_id=1,
                     use_global_device_ids=True)
    assert infer_shape("reduce-scatter", [x], rs, [add]).dims == (2, 6)
    bad = _collective("reduce-scatter", IotaGroups(2, 4), dimensions=[1], channel_id=1,
                      use_global_device_ids=True)
    with pytest.raises(VerifierError, match="divisible"):
        infer_shape("reduce-scatter", [x], bad, [add])
    a2a = _collective("all-to-all", IotaGroups(4, 2), dimensions=[1], channel_id=1)
    assert infer_shape("all-to-all", [x], a2a) is x
    tup = _collective("all-to-all", IotaGroups(4, 2), channel_id=1)
    assert infer_shape("all-to-all", [x, x], tup).compatible(Shape.tuple_of([x, x]))
    with pytest.raises(VerifierError, match="one operand per group member"):
        infer_shape("all-to-all", [x], tup)
    assert infer_shape("all-reduce", [x, S(PT.S32, ())], _attrs(), [add]).is_tuple
    assert infer_shape("collective-permute", [x], _attrs()) is x


def test_iota_groups_expansion():
    assert si.expand_iota_groups(2, 4, (4, 2), (1, 0)).tolist() == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert si.expand_iota_groups(4, 2).tolist() == [[0, 1], [2, 3], [4, 5], [6, 7]]
    a = _collective("all-reduce", IotaGroups(2, 4, (2, 2, 2), (2, 0, 1)))
    expect = np.arange(8).reshape(2, 2, 2).transpose(2, 0, 1).reshape(2, 4)
    assert si.replica_groups(a).tolist() == expect.tolist()
    assert si.replica_group_size(a) == 4
    assert si.replica_groups(_attrs()) is None and si.replica_group_size(_attrs()) is None
    ragged = _attrs(replica_groups=[{"replica_ids": [0, 1]}, {"replica_ids": [2]}])
    assert [list(g) for g in si.replica_groups(ragged)] == [[0, 1], [2]]


def test_iota_groups_match_jaxlib_parse():
    """jaxlib parses ``[2,4]<=[4,2]T(1,0)`` into the same field our builder writes."""
    jax_or_skip()
    from jaxlib import _hlo

    text = """HloModule m
add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT c = f32[] add(a, b)
}
ENTRY e {
  p = f32[8] parameter(0)
  ROOT ar = f32[8] all-reduce(p), replica_groups=[2,4]<=[4,2]T(1,0), to_apply=add, channel_id=1, use_global_device_ids=true
}
"""
    proto = hlo_pb2.HloModuleProto.FromString(
        _hlo.hlo_module_from_text(text).as_serialized_hlo_module_proto())
    ar = [i for c in proto.computations for i in c.instructions if i.opcode == "all-reduce"][0]
    ours = _collective("all-reduce", IotaGroups(2, 4, (4, 2), (1, 0)))
    assert ar.WhichOneof("replica_group_list") == ours.WhichOneof("replica_group_list")
    assert ar.iota_collective_device_list == ours.iota_collective_device_list
    assert si.replica_groups(ar).tolist() == [[0, 2, 4, 6], [1, 3, 5, 7]]


def test_mesh_axes_groups():
    a = _attrs()
    m = a.mesh_axes_replica_group_list
    for name, size in (("x", 2), ("y", 4)):
        m.mesh.axes.add(name=name, size=size)
    m.axes.add(mesh_axis_index=1)
    assert si.replica_group_size(a) == 4
    assert si.replica_groups(a).tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    b = _attrs()
    m = b.mesh_axes_replica_group_list
    for name, size in (("x", 2), ("y", 4)):
        m.mesh.axes.add(name=name, size=size)
    ax = m.axes.add(mesh_axis_index=1)
    ax.sub_axis_info.pre_size = 1
    ax.sub_axis_info.size = 2  # the major half of y: y = [2 (selected), 2]
    assert si.replica_group_size(b) == 2
    assert si.replica_groups(b).tolist() == [[0, 2], [1, 3], [4, 6], [5, 7]]
    m.axes.add(mesh_axis_index=0)
    assert si.replica_group_size(b) == 4
    assert si.replica_groups(b).tolist() == [[0, 4, 2, 6], [1, 5, 3, 7]]


# -- callee signatures -------------------------------------------------------------------------------
def test_reducer_signature_errors():
    module, b = new_module()
    add = b.scalar_computation("add", F32)
    x = S(F32, (4, 3))
    with pytest.raises(VerifierError, match="init value"):
        infer_shape("reduce", [x, S(PT.S32, ())], _attrs(dimensions=[0]), [add])
    with pytest.raises(VerifierError, match="must take 4 parameters"):
        infer_shape("reduce", [x, x, S(F32, ()), S(F32, ())], _attrs(dimensions=[0]), [add])
    with pytest.raises(VerifierError, match="duplicate"):
        infer_shape("reduce", [x, S(F32, ())], _attrs(dimensions=[0, 0]), [add])
    assert infer_shape("reduce", [x, S(F32, ())], _attrs(dimensions=[0]), [add]).dims == (3,)


def test_while_signature_errors():
    module, b = new_module()
    state = S(F32, (3,))
    body_b = b.new_computation("body")
    p = body_b.parameter(0, state)
    body_b.set_root(body_b.negate(p))
    cond_b = b.new_computation("cond")
    q = cond_b.parameter(0, state)
    cond_b.set_root(cond_b.compare(cond_b.reduce(q, 0.0, [0], "add"), cond_b.constant(0.0), "LT"))
    body, cond = body_b.computation, cond_b.computation
    assert infer_shape("while", [state], called=[body, cond]) is state
    with pytest.raises(VerifierError, match="differs from the loop state"):
        infer_shape("while", [S(F32, (4,))], called=[body, cond])
    with pytest.raises(VerifierError, match="must return pred"):
        infer_shape("while", [state], called=[body, body])
    with pytest.raises(VerifierError, match="2 called computation"):
        infer_shape("while", [state], called=[body])
