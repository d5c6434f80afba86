"""Shared material for the HLO text tests: modules lowered with jax, a hand-written HLO
corpus covering every opcode and attribute, the checked-in fixtures, and jaxlib helpers.

jax/jaxlib are the oracle (jaxlib's HLO printer and parser); everything that needs them
skips when they are missing.  Every corpus entry was checked to be accepted by jaxlib's
parser (a jaxlib CHECK failure would abort the whole test process).
"""
from __future__ import annotations

import functools
import os
import re
from pathlib import Path

import pytest

os.environ.setdefault("JAX_PLATFORMS", "cpu")
if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                               " --xla_force_host_platform_device_count=8").strip()

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures" / "hlo"


def fixture_protos() -> list[Path]:
    return sorted(FIXTURES.glob("**/*.pb"))


def fixture_texts() -> list[Path]:
    return sorted(FIXTURES.glob("**/*.hlo"))


def fixture_id(path: Path) -> str:
    return str(path.relative_to(FIXTURES))


# -- jaxlib helpers -------------------------------------------------------------------------------
def hlo_ext():
    pytest.importorskip("jaxlib")
    return pytest.importorskip("jaxlib._hlo")


def jax_print_proto(pb: bytes) -> str:
    h = hlo_ext()
    opts = h.HloPrintOptions()
    opts.print_large_constants = True
    return h.HloModule.from_serialized_hlo_module_proto(pb).to_string(opts)


def jax_print_text(text: str) -> str:
    """jaxlib's text round trip: parse ``text`` and print it again."""
    h = hlo_ext()
    opts = h.HloPrintOptions()
    opts.print_large_constants = True
    return h.hlo_module_from_text(text).to_string(opts)


def jax_text_to_proto(text: str) -> bytes:
    return hlo_ext().hlo_module_from_text(text).as_serialized_hlo_module_proto()


_TABLES = re.compile(r"\n\nFileNames\n(.*?)\nFunctionNames\n(.*?)\nFileLocations\n(.*?)"
                     r"\nStackFrames\n(.*?)\n\n", re.S)
_NEG_ZERO = re.compile(r"(?<=[({ ,])-0(?=[,)} ])")


def canon(text: str) -> str:
    """Text modulo what XLA's own text round trip does not preserve: stack frame ids are
    resolved into file:line chains (jaxlib renumbers them) and ``-0`` becomes ``0``
    (jaxlib's parser reads ``-0`` as an integer)."""
    m = _TABLES.search(text)
    if m:
        files = dict(re.findall(r'(\d+) (".*")', m.group(1)))
        funcs = dict(re.findall(r'(\d+) (".*")', m.group(2)))
        locs = dict(re.findall(r"(\d+) \{(.*?)\}", m.group(3)))
        frames = dict(re.findall(r"(\d+) \{(.*?)\}", m.group(4)))

        def loc(i: str) -> str:
            d = dict(x.split("=") for x in locs.get(i, "").split())
            return (f"{files.get(d.get('file_name_id'))}:{funcs.get(d.get('function_name_id'))}:"
                    f"{d.get('line')}:{d.get('column')}-{d.get('end_line')}:{d.get('end_column')}")

        def chain(i: str, depth: int = 0) -> str:
            if i == "0" or i not in frames or depth > 64:
                return ""
            d = dict(x.split("=") for x in frames[i].split())
            return loc(d["file_location_id"]) + "<" + chain(str(int(d["parent_frame_id"]) - 1),
                                                           depth + 1)

        text = text[:m.start()] + "\n\n" + text[m.end():]
        text = re.sub(r"stack_frame_id=(\d+)", lambda mm: "frame=" + chain(mm.group(1)), text)
    return _NEG_ZERO.sub("0", text)


# -- modules lowered with jax ---------------------------------------------------------------------
def _unsharded_cases():
    import jax
    import jax.numpy as jnp
    from jax import lax

    f32 = jnp.float32
    S = jax.ShapeDtypeStruct
    x, y = S((8, 16), f32), S((16, 4), f32)
    img, ker = S((2, 3, 17, 17), f32), S((5, 3, 3, 3), f32)
    c: dict = {}
    c["dot"] = (lambda a, b: a @ b, (x, y))
    c["dot_batch_highest"] = (lambda a, b: jnp.einsum("bij,bjk->bik", a, b,
                                                       precision=lax.Precision.HIGHEST),
                              (S((2, 3, 4), f32), S((2, 4, 5), f32)))
    c["conv_stride_pad_dilation"] = (lambda a, k: lax.conv_general_dilated(
        a, k, (2, 2), ((1, 2), (0, 1)), lhs_dilation=(1, 1), rhs_dilation=(2, 1)), (img, ker))
    c["conv_lhs_dilation"] = (lambda a, k: lax.conv_general_dilated(
        a, k, (1, 1), ((1, 1), (1, 1)), lhs_dilation=(2, 2)), (img, ker))
    c["conv_grouped_nhwc"] = (lambda a, k: lax.conv_general_dilated(
        a, k, (1, 1), "SAME", feature_group_count=3, dimension_numbers=("NHWC", "HWIO", "NHWC")),
        (S((1, 8, 8, 6), f32), S((3, 3, 2, 6), f32)))
    c["reduce_window"] = (lambda a: lax.reduce_window(a, -jnp.inf, lax.max, (1, 1, 3, 3),
                                                      (1, 1, 2, 2), "SAME"), (img,))

    def maxpool(a):
        return jnp.sum(lax.reduce_window(a, -jnp.inf, lax.max, (1, 1, 2, 2), (1, 1, 2, 2), "VALID"))
    c["select_and_scatter"] = (jax.grad(maxpool), (S((2, 3, 8, 8), f32),))
    c["gather"] = (lambda a, i: a[i], (S((10, 4), f32), S((3,), jnp.int32)))
    c["gather_batched"] = (lambda a, i: jnp.take_along_axis(a, i, axis=1),
                           (S((5, 6), f32), S((5, 2), jnp.int32)))
    c["scatter_add"] = (lambda a, i, u: a.at[i].add(u),
                        (S((10, 4), f32), S((3,), jnp.int32), S((3, 4), f32)))
    c["sort_multi_operand"] = (lambda a, b: lax.sort((a, b), num_keys=1),
                               (S((5, 7), f32), S((5, 7), jnp.int32)))
    c["argsort_stable"] = (lambda a: jnp.argsort(a, stable=True), (S((9,), f32),))
    c["top_k"] = (lambda a: lax.top_k(a, 3), (S((4, 9), f32),))
    c["approx_top_k"] = (lambda a: lax.approx_max_k(a, 2), (S((4, 16), f32),))

    def while_loop(a):
        return lax.while_loop(lambda s: s[0] < 10, lambda s: (s[0] + 1, s[1] * 2), (0, a))
    c["while"] = (while_loop, (S((3,), f32),))
    c["fori"] = (lambda a: lax.fori_loop(0, 5, lambda i, s: s + i, a), (S((3,), f32),))
    c["scan"] = (lambda a: lax.scan(lambda s, v: (s + v, s * v), 0.0, a), (S((5,), f32),))
    c["cond"] = (lambda p, a: lax.cond(p, lambda v: v + 1, lambda v: v * 2, a),
                 (S((), jnp.bool_), S((3,), f32)))
    c["switch"] = (lambda i, a: lax.switch(i, [lambda v: v + 1, lambda v: v * 2, jnp.sin], a),
                   (S((), jnp.int32), S((3,), f32)))
    c["cumsum"] = (lambda a: jnp.cumsum(a, axis=1), (S((4, 50), f32),))
    c["cummax_reverse"] = (lambda a: lax.cummax(a, axis=0, reverse=True), (S((30, 3), f32),))
    c["rng_bit_generator"] = (lambda k: lax.rng_bit_generator(k, (4, 5))[1],
                              (S((4,), jnp.uint32),))
    c["random_normal"] = (lambda: jax.random.normal(jax.random.key(0), (3, 4)), ())
    c["rfft2"] = (lambda a: jnp.fft.rfft2(a), (S((4, 8), f32),))
    c["ifft"] = (lambda a: jnp.fft.ifft(a), (S((8,), jnp.complex64),))
    c["cholesky"] = (lambda a: jnp.linalg.cholesky(a), (S((4, 4), f32),))
    c["triangular_solve"] = (lambda a, b: lax.linalg.triangular_solve(
        a, b, left_side=True, lower=True, transpose_a=True), (S((4, 4), f32), S((4, 3), f32)))
    c["eigh"] = (lambda a: jnp.linalg.eigh(a), (S((4, 4), f32),))
    c["constants"] = (lambda: (
        jnp.array([1.5, -2.25, jnp.inf, -jnp.inf, jnp.nan, 1e-5, 3e10, 0.1], f32),
        jnp.array([[1, 2], [3, 4]], jnp.bfloat16),
        jnp.array([0.5, -1.0, 448.0], jnp.float8_e4m3fn),
        jnp.array([1.0, -2.0, 57344.0], jnp.float8_e5m2),
        jnp.array([1, -2, 7, -8], jnp.int4), jnp.array([1, 2, 15], jnp.uint4),
        jnp.array([True, False, True]), jnp.array([1 + 2j, -3.5j], jnp.complex64),
        jnp.array([65535], jnp.uint16), jnp.array([-129], jnp.int16),
        jnp.array([255], jnp.uint8), jnp.array([-128], jnp.int8),
        jnp.array([1.5, 65504], jnp.float16), jnp.float32(3.0),
        jnp.arange(30.0).reshape(2, 3, 5), jnp.arange(48.0).reshape(2, 2, 3, 4)), ())
    c["constants_x64"] = (lambda: (
        jnp.array([1.0, 1e300, -1e-300, 0.1, 1 / 3], jnp.float64),
        jnp.array([2 ** 40, -5], jnp.int64), jnp.array([2 ** 63 + 5], jnp.uint64),
        jnp.array([1 + 2j], jnp.complex128)), (), "x64")
    c["complex_ops"] = (lambda a: jnp.abs(a) + jnp.real(a * jnp.conj(a)) + jnp.angle(a),
                        (S((3,), jnp.complex64),))
    c["elementwise"] = (lambda a, b: (
        jnp.tanh(a) + jnp.exp(b) - jnp.log1p(jnp.abs(a)) ** 2 / jnp.sqrt(jnp.abs(b) + 1)
        + jnp.maximum(a, b) * jnp.minimum(a, b) + jnp.floor(a) + jnp.ceil(b) + jnp.round(a)
        + jnp.sign(a) + jnp.cos(a) + jnp.expm1(a) + lax.rsqrt(jnp.abs(a) + 1) + lax.cbrt(a)
        + jnp.arctan2(a, b) + lax.erf(a) + jnp.clip(a, -1, 1) + lax.logistic(a)
        + jnp.where(a > b, a, b) + jnp.remainder(a, 3.0) + jnp.tan(a) + jnp.isfinite(a)),
        (S((4,), f32), S((4,), f32)))
    c["int_ops"] = (lambda a, b: ((a << 2) ^ (b >> 1) | (a & b), lax.shift_right_logical(a, b),
                                  lax.population_count(a), lax.clz(a), ~a, a // b, a % b,
                                  a.astype(f32), lax.bitcast_convert_type(a, f32)),
                    (S((4,), jnp.int32), S((4,), jnp.int32)))
    c["reduce_precision"] = (lambda a: lax.reduce_precision(a, 5, 10), (S((4,), f32),))
    c["shape_ops"] = (lambda a: (
        jnp.transpose(a, (2, 0, 1)), a.reshape(6, 4), a[:, 1:3:2, ::2],
        jnp.pad(a, ((1, 2), (0, 1), (2, 0))), lax.pad(a, 0.0, ((1, 2, 1), (0, 0, 0), (-1, 1, 2))),
        jnp.concatenate([a, a], axis=1), jnp.flip(a, (0, 2)),
        lax.dynamic_slice(a, (1, 0, 1), (1, 2, 2)),
        lax.dynamic_update_slice(a, jnp.ones((1, 1, 4)), (1, 2, 0)),
        jnp.broadcast_to(a[:, :, None, :], (2, 3, 5, 4)), lax.iota(jnp.int32, 7),
        jnp.argmax(a, axis=2)), (S((2, 3, 4), f32),))
    c["pure_callback"] = (lambda a: jax.pure_callback(lambda v: v, S((3,), f32), a),
                          (S((3,), f32),))
    c["opt_barrier"] = (lambda a: lax.optimization_barrier((a, a + 1)), (S((3,), f32),))
    c["bf16_f8"] = (lambda a, b: (a.astype(jnp.bfloat16) @ b.astype(jnp.bfloat16)).astype(
        jnp.float8_e4m3fn), (x, y))
    c["int4"] = (lambda a: a.astype(jnp.int4).astype(jnp.int32) +
                 jnp.array([1, 2, 3, 4], jnp.int4).astype(jnp.int32)[0], (S((4,), jnp.int32),))
    c["map"] = (lambda a: lax.map(jnp.sin, a), (S((3, 2), f32),))
    c["checkpoint_grad"] = (jax.grad(lambda a: jnp.sum(jax.checkpoint(jnp.sin)(a) ** 2)),
                            (S((3,), f32),))
    c["special_functions"] = (lambda a: lax.erf_inv(a) + lax.lgamma(a) + lax.digamma(a),
                              (S((3,), f32),))
    return c


def _sharded_cases():
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("x", "y"))

    def ns(spec):
        return NamedSharding(mesh, spec)

    a = jax.ShapeDtypeStruct((8, 16), jnp.float32)
    b = jax.ShapeDtypeStruct((16, 4), jnp.float32)
    c: dict = {}
    c["sharded_dot"] = (lambda u, v: u @ v, (a, b), dict(
        in_shardings=(ns(P("x", "y")), ns(P("y", None))), out_shardings=ns(P("x"))))

    def constrain(u):
        v = jnp.sin(u)
        v = jax.lax.with_sharding_constraint(v, ns(P(None, "y")))
        return v * 2
    c["sharding_constraint"] = (constrain, (a,), dict(in_shardings=(ns(P("x", None)),)))
    c["replicated_in"] = (lambda u: u + 1, (a,), dict(in_shardings=(ns(P()),),
                                                     out_shardings=ns(P(("x", "y")))))

    def shard_map(f, mesh, in_specs, out_specs, check_rep=True):
        return jax.shard_map(f, mesh=mesh, in_specs=in_specs, out_specs=out_specs,
                             check_vma=check_rep)

    def sm(u):
        return shard_map(lambda t: jax.lax.psum(t, "x") + jax.lax.all_gather(
            t, "y", axis=0, tiled=True)[:t.shape[0]], mesh=mesh, in_specs=P("x", "y"),
            out_specs=P("x", "y"), check_rep=False)(u)
    c["shard_map_psum_gather"] = (sm, (a,), {})

    def sm2(u):
        return shard_map(lambda t: jax.lax.ppermute(t, "y", [(i, (i + 1) % 4) for i in range(4)])
                         + jax.lax.all_to_all(t, "y", 0, 0, tiled=True), mesh=mesh,
                         in_specs=P("x", "y"), out_specs=P("x", "y"))(u)
    c["shard_map_permute_all_to_all"] = (sm2, (a,), {})

    def sm3(u):
        return shard_map(lambda t: jax.lax.psum_scatter(t, "y", scatter_dimension=1, tiled=True),
                         mesh=mesh, in_specs=P("x", None), out_specs=P("x", "y"))(u)
    c["shard_map_reduce_scatter"] = (sm3, (a,), {})
    return c


@functools.lru_cache(maxsize=None)
def jax_modules() -> dict[str, bytes]:
    """name -> serialized HloModuleProto of modules lowered with jax (cached)."""
    pytest.importorskip("jax")
    import jax

    out: dict[str, bytes] = {}

    def lower(f, args, kw=None):
        return jax.jit(f, **(kw or {})).lower(*args).compiler_ir("hlo") \
            .as_serialized_hlo_module_proto()

    for name, (f, args, *flags) in _unsharded_cases().items():
        if flags:
            with jax.enable_x64(True):
                out[name] = lower(f, args)
        else:
            out[name] = lower(f, args)
    if len(jax.devices()) >= 8:
        old = jax.config.jax_use_shardy_partitioner
        try:
            for shardy in (False, True):
                jax.config.update("jax_use_shardy_partitioner", shardy)
                for name, (f, args, kw) in _sharded_cases().items():
                    out[name + ("_shardy" if shardy else "_gspmd")] = lower(f, args, kw)
        finally:
            jax.config.update("jax_use_shardy_partitioner", old)
    return out


_CASE_NAMES = [
    "dot", "dot_batch_highest", "conv_stride_pad_dilation", "conv_lhs_dilation",
    "conv_grouped_nhwc", "reduce_window", "select_and_scatter", "gather", "gather_batched",
    "scatter_add", "sort_multi_operand", "argsort_stable", "top_k", "approx_top_k", "while",
    "fori", "scan", "cond", "switch", "cumsum", "cummax_reverse", "rng_bit_generator",
    "random_normal", "rfft2", "ifft", "cholesky", "triangular_solve", "eigh", "constants",
    "constants_x64", "complex_ops", "elementwise", "int_ops", "reduce_precision", "shape_ops",
    "pure_callback", "opt_barrier", "bf16_f8", "int4", "map", "checkpoint_grad",
    "special_functions",
] + [f"{n}_{form}" for form in ("gspmd", "shardy") for n in (
    "sharded_dot", "sharding_constraint", "replicated_in", "shard_map_psum_gather",
    "shard_map_permute_all_to_all", "shard_map_reduce_scatter")]


def jax_module(name: str) -> bytes:
    mods = jax_modules()
    if name not in mods:
        pytest.skip(f"{name} needs 8 devices")
    return mods[name]


def test_case_names_match_builders() -> None:
    """The static name list used for parametrization matches what is lowered."""
    pytest.importorskip("jax")
    import jax

    mods = jax_modules()
    expected = set(_CASE_NAMES) if len(jax.devices()) >= 8 else {
        n for n in _CASE_NAMES if not n.endswith(("_gspmd", "_shardy"))}
    assert set(mods) == expected


# -- hand-written corpus (jaxlib parses every entry) -----------------------------------------------
CORPUS: dict[str, str] = {}

CORPUS["elementwise"] = """HloModule elementwise, entry_computation_layout={(f32[4]{0}, f32[4]{0}, s32[4]{0}, u32[4]{0}, pred[4]{0})->(f32[4]{0}, s32[4]{0}, u32[4]{0}, pred[4]{0})}

ENTRY %main (a: f32[4], b: f32[4], i: s32[4], u: u32[4], p: pred[4]) -> (f32[4], s32[4], u32[4], pred[4]) {
  %a = f32[4]{0} parameter(0)
  %b = f32[4]{0} parameter(1)
  %i = s32[4]{0} parameter(2)
  %u = u32[4]{0} parameter(3)
  %p = pred[4]{0} parameter(4)
  %abs = f32[4]{0} abs(%a)
  %acos = f32[4]{0} acos(%abs)
  %acosh = f32[4]{0} acosh(%acos)
  %asin = f32[4]{0} asin(%acosh)
  %asinh = f32[4]{0} asinh(%asin)
  %atanh = f32[4]{0} atanh(%asinh), result_accuracy={mode=highest}
  %cbrt = f32[4]{0} cbrt(%atanh), result_accuracy={tolerance={atol=0.5,rtol=0.25,ulps=2}}
  %ceil = f32[4]{0} ceil(%cbrt)
  %cos = f32[4]{0} cosine(%ceil)
  %cosh = f32[4]{0} cosh(%cos)
  %erf = f32[4]{0} erf(%cosh)
  %exp = f32[4]{0} exponential(%erf)
  %expm1 = f32[4]{0} exponential-minus-one(%exp)
  %floor = f32[4]{0} floor(%expm1)
  %log = f32[4]{0} log(%floor)
  %log1p = f32[4]{0} log-plus-one(%log)
  %logistic = f32[4]{0} logistic(%log1p)
  %neg = f32[4]{0} negate(%logistic)
  %rafz = f32[4]{0} round-nearest-afz(%neg)
  %reven = f32[4]{0} round-nearest-even(%rafz)
  %rsqrt = f32[4]{0} rsqrt(%reven)
  %sign = f32[4]{0} sign(%rsqrt)
  %sin = f32[4]{0} sine(%sign)
  %sinh = f32[4]{0} sinh(%sin)
  %sqrt = f32[4]{0} sqrt(%sinh)
  %tan = f32[4]{0} tan(%sqrt)
  %tanh = f32[4]{0} tanh(%tan)
  %add = f32[4]{0} add(%tanh, %b)
  %atan2 = f32[4]{0} atan2(%add, %b)
  %div = f32[4]{0} divide(%atan2, %b)
  %max = f32[4]{0} maximum(%div, %b)
  %min = f32[4]{0} minimum(%max, %b)
  %mul = f32[4]{0} multiply(%min, %b)
  %pow = f32[4]{0} power(%mul, %b)
  %rem = f32[4]{0} remainder(%pow, %b)
  %sub = f32[4]{0} subtract(%rem, %b)
  %clamp = f32[4]{0} clamp(%a, %sub, %b)
  %select = f32[4]{0} select(%p, %clamp, %b)
  %rp = f32[4]{0} reduce-precision(%select), exponent_bits=5, mantissa_bits=10
  %and = s32[4]{0} and(%i, %i)
  %or = s32[4]{0} or(%and, %i)
  %xor = s32[4]{0} xor(%or, %i)
  %not = s32[4]{0} not(%xor)
  %shl = s32[4]{0} shift-left(%not, %i)
  %sra = s32[4]{0} shift-right-arithmetic(%shl, %i)
  %srl = s32[4]{0} shift-right-logical(%sra, %i)
  %clz = s32[4]{0} count-leading-zeros(%srl)
  %popcnt = s32[4]{0} popcnt(%clz)
  %mulhi = u32[4]{0} mulhi(%u, %u)
  %isfin = pred[4]{0} is-finite(%rp)
  %cmp1 = pred[4]{0} compare(%a, %b), direction=LT
  %cmp2 = pred[4]{0} compare(%a, %b), direction=GE, type=TOTALORDER
  %cmp3 = pred[4]{0} compare(%i, %i), direction=NE
  %cmp4 = pred[4]{0} compare(%u, %u), direction=EQ, type=SIGNED
  %cmp5 = pred[4]{0} compare(%p, %p), direction=GT
  %and2 = pred[4]{0} and(%cmp1, %cmp2)
  %and3 = pred[4]{0} and(%and2, %cmp3)
  %and4 = pred[4]{0} and(%and3, %cmp4)
  %and5 = pred[4]{0} and(%and4, %cmp5)
  %and6 = pred[4]{0} and(%and5, %isfin)
  ROOT %t = (f32[4]{0}, s32[4]{0}, u32[4]{0}, pred[4]{0}) tuple(%rp, %popcnt, %mulhi, %and6)
}
"""

CORPUS["convert_complex"] = """HloModule convert_complex

ENTRY %main (a: f32[4], c: c64[4]) -> (c64[4], f32[4], f32[4], s32[4], bf16[4], f16[4], f8e4m3fn[4], s4[4], u8[4]) {
  %a = f32[4]{0} parameter(0)
  %c = c64[4]{0} parameter(1)
  %cplx = c64[4]{0} complex(%a, %a)
  %real = f32[4]{0} real(%c)
  %imag = f32[4]{0} imag(%c)
  %bc = s32[4]{0} bitcast-convert(%a)
  %cv1 = bf16[4]{0} convert(%a)
  %cv2 = f16[4]{0} convert(%cv1)
  %cv3 = f8e4m3fn[4]{0} convert(%cv2)
  %cv4 = s4[4]{0} convert(%a)
  %rnd = u8[4]{0} bitcast-convert(%a)
  %rnd32 = u32[4]{0} bitcast-convert(%a)
  %sc = f8e4m3fn[4]{0} stochastic-convert(%a, %rnd32)
  ROOT %t = (c64[4]{0}, f32[4]{0}, f32[4]{0}, s32[4]{0}, bf16[4]{0}, f16[4]{0}, f8e4m3fn[4]{0}, s4[4]{0}, u8[4]{0}) tuple(%cplx, %real, %imag, %bc, %cv1, %cv2, %sc, %cv4, %rnd)
}
"""

CORPUS["shape_ops"] = """HloModule shape_ops

ENTRY %main (a: f32[2,3,4], i: s32[]) -> (f32[4,2,3], f32[6,4], f32[2,1,2], f32[5,4,6], f32[2,6,4], f32[2,3,4], f32[1,2,2], f32[2,3,4], f32[2,3,5,4], s32[7], f32[2,3,4]) {
  %a = f32[2,3,4]{2,1,0} parameter(0)
  %i = s32[] parameter(1)
  %tr = f32[4,2,3]{2,1,0} transpose(%a), dimensions={2,0,1}
  %rs = f32[6,4]{1,0} reshape(%a)
  %rs2 = f32[6,4]{1,0} reshape(%a), inferred_dimension=0
  %sl = f32[2,1,2]{2,1,0} slice(%a), slice={[0:2], [1:3:2], [0:4:2]}
  %z = f32[] constant(0)
  %pad = f32[5,4,6]{2,1,0} pad(%a, %z), padding=1_2x0_1x2_0
  %pad2 = f32[5,4,6]{2,1,0} pad(%a, %z), padding=1_2_0x-1_1_1x0_-1_1
  %cat = f32[2,6,4]{2,1,0} concatenate(%a, %a), dimensions={1}
  %rev = f32[2,3,4]{2,1,0} reverse(%a), dimensions={0,2}
  %ds = f32[1,2,2]{2,1,0} dynamic-slice(%a, %i, %i, %i), dynamic_slice_sizes={1,2,2}
  %upd = f32[1,1,4]{2,1,0} broadcast(%z), dimensions={}
  %dus = f32[2,3,4]{2,1,0} dynamic-update-slice(%a, %upd, %i, %i, %i)
  %bc = f32[2,3,5,4]{3,2,1,0} broadcast(%a), dimensions={0,1,3}
  %iota = s32[7]{0} iota(), iota_dimension=0
  %copy = f32[2,3,4]{2,1,0} copy(%a)
  %bitcast = f32[2,3,4]{2,1,0} bitcast(%copy)
  ROOT %t = (f32[4,2,3]{2,1,0}, f32[6,4]{1,0}, f32[2,1,2]{2,1,0}, f32[5,4,6]{2,1,0}, f32[2,6,4]{2,1,0}, /*index=5*/f32[2,3,4]{2,1,0}, f32[1,2,2]{2,1,0}, f32[2,3,4]{2,1,0}, f32[2,3,5,4]{3,2,1,0}, s32[7]{0}, /*index=10*/f32[2,3,4]{2,1,0}) tuple(%tr, %rs2, %sl, %pad2, %cat, %rev, %ds, %dus, %bc, %iota, %bitcast)
}
"""

CORPUS["layouts"] = """HloModule layouts

ENTRY %main (a: f32[8,128], b: f32[8,128]) -> (f32[8,128], f32[8,128], s4[16], f32[<=8,3], f32[]) {
  %a = f32[8,128]{0,1} parameter(0)
  %b = f32[8,128]{1,0:T(8,128)} parameter(1)
  %c = f32[8,128]{1,0:T(8,128)(2,1)S(1)} copy(%a)
  %d = s4[16]{0:E(4)} constant({1, -2, 3, -4, 5, -6, 7, -8, 0, 1, 2, 3, 4, 5, 6, 7})
  %dyn = f32[<=8,3]{1,0} parameter(2)
  %s = f32[]{:S(2)} constant(1)
  ROOT %t = (f32[8,128]{1,0:T(8,128)}, f32[8,128]{1,0:T(8,128)(2,1)S(1)}, s4[16]{0:E(4)}, f32[<=8,3]{1,0}, f32[]{:S(2)}) tuple(%b, %c, %d, %dyn, %s)
}
"""

CORPUS["conv_dot"] = """HloModule conv_dot

ENTRY %main (x: f32[2,3,17,17], k: f32[5,3,3,3], l: f32[2,3,4], r: f32[2,4,5]) -> (f32[2,5,8,8], f32[2,3,5], f32[2,5,8,8], f32[2,3,5], f32[10,6,9,9]) {
  %x = f32[2,3,17,17]{3,2,1,0} parameter(0)
  %k = f32[5,3,3,3]{3,2,1,0} parameter(1)
  %l = f32[2,3,4]{2,1,0} parameter(2)
  %r = f32[2,4,5]{2,1,0} parameter(3)
  %conv = f32[2,5,8,8]{3,2,1,0} convolution(%x, %k), window={size=3x3 stride=2x2 pad=1_2x0_1 rhs_dilate=2x1}, dim_labels=bf01_oi01->bf01
  %conv2 = f32[2,5,8,8]{3,2,1,0} convolution(%x, %k), window={size=3x3 stride=2x2 pad=1_1x1_1 lhs_dilate=1x1 rhs_reversal=1x0}, dim_labels=bf01_oi01->bf01, operand_precision={high,highest}
  %xg = f32[2,6,17,17]{3,2,1,0} parameter(4)
  %kg = f32[10,3,3,3]{3,2,1,0} parameter(5)
  %conv3 = f32[10,6,9,9]{3,2,1,0} convolution(%xg, %kg), window={size=3x3 stride=2x2 pad=1_1x1_1}, dim_labels=bf01_oi01->bf01, batch_group_count=2
  %dot = f32[2,3,5]{2,1,0} dot(%l, %r), lhs_batch_dims={0}, lhs_contracting_dims={2}, rhs_batch_dims={0}, rhs_contracting_dims={1}
  %dot2 = f32[2,3,5]{2,1,0} dot(%l, %r), lhs_batch_dims={0}, lhs_contracting_dims={2}, rhs_batch_dims={0}, rhs_contracting_dims={1}, operand_precision={highest,default}, algorithm=dot_bf16_bf16_f32
  ROOT %t = (f32[2,5,8,8]{3,2,1,0}, f32[2,3,5]{2,1,0}, f32[2,5,8,8]{3,2,1,0}, f32[2,3,5]{2,1,0}, f32[10,6,9,9]{3,2,1,0}) tuple(%conv, %dot, %conv2, %dot2, %conv3)
}
"""

CORPUS["grouped_conv"] = """HloModule grouped_conv

ENTRY %main (x: f32[1,8,8,6], k: f32[3,3,2,6]) -> f32[1,8,8,6] {
  %x = f32[1,8,8,6]{3,2,1,0} parameter(0)
  %k = f32[3,3,2,6]{3,2,1,0} parameter(1)
  ROOT %conv = f32[1,8,8,6]{3,2,1,0} convolution(%x, %k), window={size=3x3 pad=1_1x1_1}, dim_labels=b01f_01io->b01f, feature_group_count=3
}
"""

CORPUS["reductions"] = """HloModule reductions

%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %r = f32[] add(%x, %y)
}

%argmax (a: f32[], b: s32[], c: f32[], d: s32[]) -> (f32[], s32[]) {
  %a = f32[] parameter(0)
  %b = s32[] parameter(1)
  %c = f32[] parameter(2)
  %d = s32[] parameter(3)
  %gt = pred[] compare(%a, %c), direction=GT
  %v = f32[] select(%gt, %a, %c)
  %i = s32[] select(%gt, %b, %d)
  ROOT %t = (f32[], s32[]) tuple(%v, %i)
}

%ge (p: f32[], q: f32[]) -> pred[] {
  %p = f32[] parameter(0)
  %q = f32[] parameter(1)
  ROOT %cmp = pred[] compare(%p, %q), direction=GE
}

%lt (sa: f32[], sb: f32[], t0: s32[], t1: s32[]) -> pred[] {
  %sa = f32[] parameter(0)
  %sb = f32[] parameter(1)
  %t0 = s32[] parameter(2)
  %t1 = s32[] parameter(3)
  ROOT %c = pred[] compare(%sa, %sb), direction=LT, type=TOTALORDER
}

ENTRY %main (a: f32[4,8], ix: s32[4,8], src: f32[2,4]) -> (f32[4], (f32[4], s32[4]), f32[2,4], f32[4,8], (f32[4,8], s32[4,8]), f32[4,8], f32[4,8]) {
  %a = f32[4,8]{1,0} parameter(0)
  %ix = s32[4,8]{1,0} parameter(1)
  %src = f32[2,4]{1,0} parameter(2)
  %zero = f32[] constant(0)
  %izero = s32[] constant(0)
  %red = f32[4]{0} reduce(%a, %zero), dimensions={1}, to_apply=%add
  %red2 = (f32[4]{0}, s32[4]{0}) reduce(%a, %ix, %zero, %izero), dimensions={1}, to_apply=%argmax
  %rw = f32[2,4]{1,0} reduce-window(%a, %zero), window={size=2x2 stride=2x2}, to_apply=%add
  %rw2 = f32[4,8]{1,0} reduce-window(%a, %zero), window={size=1x3 pad=0_0x1_1 lhs_dilate=1x1 rhs_dilate=1x1}, to_apply=%add
  %sas = f32[4,8]{1,0} select-and-scatter(%a, %src, %zero), window={size=2x2 stride=2x2}, select=%ge, scatter=%add
  %sort = (f32[4,8]{1,0}, s32[4,8]{1,0}) sort(%a, %ix), dimensions={1}, is_stable=true, to_apply=%lt
  %map = f32[4,8]{1,0} map(%a, %a), dimensions={0,1}, to_apply=%add
  ROOT %t = (f32[4]{0}, (f32[4]{0}, s32[4]{0}), f32[2,4]{1,0}, f32[4,8]{1,0}, (f32[4,8]{1,0}, s32[4,8]{1,0}), /*index=5*/f32[4,8]{1,0}, f32[4,8]{1,0}) tuple(%red, %red2, %rw, %rw2, %sort, %map, %sas)
}
"""

CORPUS["gather_scatter"] = """HloModule gather_scatter

%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %r = f32[] add(%x, %y)
}

ENTRY %main (op: f32[5,6], idx: s32[5,2], upd: f32[5,2], i2: s32[3,1], upd2: f32[3,6]) -> (f32[5,2], f32[5,6], f32[3,6], f32[5,6]) {
  %op = f32[5,6]{1,0} parameter(0)
  %idx = s32[5,2]{1,0} parameter(1)
  %upd = f32[5,2]{1,0} parameter(2)
  %i2 = s32[3,1]{1,0} parameter(3)
  %upd2 = f32[3,6]{1,0} parameter(4)
  %iota = s32[5,2,1]{2,1,0} iota(), iota_dimension=0
  %ri = s32[5,2,1]{2,1,0} reshape(%idx)
  %g = f32[5,2]{1,0} gather(%op, %ri), offset_dims={}, collapsed_slice_dims={1}, start_index_map={1}, operand_batching_dims={0}, start_indices_batching_dims={0}, index_vector_dim=2, slice_sizes={1,1}, indices_are_sorted=true
  %s = f32[5,6]{1,0} scatter(%op, %ri, %upd), update_window_dims={}, inserted_window_dims={1}, scatter_dims_to_operand_dims={1}, input_batching_dims={0}, scatter_indices_batching_dims={0}, index_vector_dim=2, indices_are_sorted=true, unique_indices=true, to_apply=%add
  %g2 = f32[3,6]{1,0} gather(%op, %i2), offset_dims={1}, collapsed_slice_dims={0}, start_index_map={0}, index_vector_dim=1, slice_sizes={1,6}
  %sc2 = f32[5,6]{1,0} scatter(%op, %i2, %upd2), update_window_dims={1}, inserted_window_dims={0}, scatter_dims_to_operand_dims={0}, index_vector_dim=1, to_apply=%add
  ROOT %t = (f32[5,2]{1,0}, f32[5,6]{1,0}, f32[3,6]{1,0}, f32[5,6]{1,0}) tuple(%g, %s, %g2, %sc2)
}
"""

CORPUS["control_flow"] = """HloModule control_flow, is_scheduled=true

%body (p: (s32[], f32[3])) -> (s32[], f32[3]) {
  %p = (s32[], f32[3]{0}) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %v = f32[3]{0} get-tuple-element(%p), index=1
  %one = s32[] constant(1)
  %i2 = s32[] add(%i, %one)
  %v2 = f32[3]{0} add(%v, %v)
  ROOT %t = (s32[], f32[3]{0}) tuple(%i2, %v2)
}

%cond (q: (s32[], f32[3])) -> pred[] {
  %q = (s32[], f32[3]{0}) parameter(0)
  %j = s32[] get-tuple-element(%q), index=0
  %ten = s32[] constant(10)
  ROOT %lt = pred[] compare(%j, %ten), direction=LT
}

%b0 (x0: f32[3]) -> f32[3] {
  %x0 = f32[3]{0} parameter(0)
  ROOT %n0 = f32[3]{0} negate(%x0)
}

%b1 (x1: f32[3]) -> f32[3] {
  %x1 = f32[3]{0} parameter(0)
  ROOT %n1 = f32[3]{0} abs(%x1)
}

%b2 (x2: f32[3]) -> f32[3] {
  %x2 = f32[3]{0} parameter(0)
  ROOT %n2 = f32[3]{0} sine(%x2)
}

%callee (y: f32[3]) -> f32[3] {
  %y = f32[3]{0} parameter(0)
  ROOT %yy = f32[3]{0} multiply(%y, %y)
}

ENTRY %main (v: f32[3], pr: pred[], bi: s32[]) -> (f32[3], f32[3], f32[3], f32[3], f32[3]) {
  %v = f32[3]{0} parameter(0)
  %pr = pred[] parameter(1)
  %bi = s32[] parameter(2)
  %zero = s32[] constant(0)
  %init = (s32[], f32[3]{0}) tuple(%zero, %v)
  %w = (s32[], f32[3]{0}) while(%init), condition=%cond, body=%body
  %wv = f32[3]{0} get-tuple-element(%w), index=1
  %c1 = f32[3]{0} conditional(%pr, %v, %wv), true_computation=%b0, false_computation=%b1
  %c2 = f32[3]{0} conditional(%bi, %v, %v, %wv), branch_computations={%b0, %b1, %b2}
  %call = f32[3]{0} call(%c2), to_apply=%callee
  %comp = f32[3]{0} call(%call), to_apply=%callee, is_composite=true, frontend_attributes={composite.attributes={n = 1 : i32},composite.name="my.op",composite.version="1"}
  %ob = (s32[], f32[3]{0}) opt-barrier((s32[], f32[3]{0}) %init)
  ROOT %t = (f32[3]{0}, f32[3]{0}, f32[3]{0}, f32[3]{0}, f32[3]{0}) tuple(%wv, %c1, %c2, %call, %comp)
}
"""

CORPUS["misc_ops"] = """HloModule misc_ops

ENTRY %main (a: f32[4,4], b: f32[4,3], k: u64[2], c: c64[8], x: f32[2,3,4,4]) -> (f32[4,4], f32[4,3], (u64[2], u32[4,5]), c64[8], f32[4,5], (f32[4,2], s32[4,2]), f32[2,3,4,4]) {
  %a = f32[4,4]{1,0} parameter(0)
  %b = f32[4,3]{1,0} parameter(1)
  %k = u64[2]{0} parameter(2)
  %c = c64[8]{0} parameter(3)
  %x = f32[2,3,4,4]{3,2,1,0} parameter(4)
  %chol = f32[4,4]{1,0} cholesky(%a), lower=true
  %chol2 = f32[4,4]{1,0} cholesky(%chol)
  %ts = f32[4,3]{1,0} triangular-solve(%chol2, %b), left_side=true, lower=true, unit_diagonal=true, transpose_a=TRANSPOSE
  %ts2 = f32[4,3]{1,0} triangular-solve(%chol2, %ts), left_side=true, transpose_a=NO_TRANSPOSE
  %rbg = (u64[2]{0}, u32[4,5]{1,0}) rng-bit-generator(%k), algorithm=rng_philox
  %rbg2 = (u64[2]{0}, u32[4,5]{1,0}) rng-bit-generator(%k), algorithm=rng_default
  %fft = c64[8]{0} fft(%c), fft_type=FFT, fft_length={8}
  %ifft = c64[8]{0} fft(%fft), fft_type=IFFT, fft_length={8}
  %r = f32[8]{0} real(%ifft)
  %rfft = c64[5]{0} fft(%r), fft_type=RFFT, fft_length={8}
  %irfft = f32[8]{0} fft(%rfft), fft_type=IRFFT, fft_length={8}
  %lo = f32[] constant(0)
  %hi = f32[] constant(1)
  %rng = f32[4,5]{1,0} rng(%lo, %hi), distribution=rng_uniform
  %rng2 = f32[4,5]{1,0} rng(%lo, %hi), distribution=rng_normal
  %st = u64[2]{0} rng-get-and-update-state(), delta=8
  %topk = (f32[4,2]{1,0}, s32[4,2]{1,0}) topk(%a), k=2, largest=false
  %topk2 = (f32[4,2]{1,0}, s32[4,2]{1,0}) topk(%a), k=2, largest=true
  %scale = f32[3]{0} parameter(5)
  %off = f32[3]{0} parameter(6)
  %mean = f32[3]{0} parameter(7)
  %var = f32[3]{0} parameter(8)
  %bnt = (f32[2,3,4,4]{3,2,1,0}, f32[3]{0}, f32[3]{0}) batch-norm-training(%x, %scale, %off), epsilon=0.001, feature_index=1
  %bni = f32[2,3,4,4]{3,2,1,0} batch-norm-inference(%x, %scale, %off, %mean, %var), epsilon=1e-05, feature_index=1
  %bng = (f32[2,3,4,4]{3,2,1,0}, f32[3]{0}, f32[3]{0}) batch-norm-grad(%x, %scale, %mean, %var, %bni), epsilon=0.001, feature_index=1
  %gds = s32[] get-dimension-size(%x), dimensions={2}
  %sds = f32[2,3,<=4,4]{3,2,1,0} set-dimension-size(%x, %gds), dimensions={2}
  %pid = u32[] partition-id()
  %rid = u32[] replica-id()
  ROOT %t = (f32[4,4]{1,0}, f32[4,3]{1,0}, (u64[2]{0}, u32[4,5]{1,0}), c64[8]{0}, f32[4,5]{1,0}, /*index=5*/(f32[4,2]{1,0}, s32[4,2]{1,0}), f32[2,3,4,4]{3,2,1,0}) tuple(%chol, %ts2, %rbg, %ifft, %rng, %topk, %bni)
}
"""

CORPUS["custom_calls"] = """HloModule custom_calls

%comp (p0: f32[4]) -> f32[4] {
  %p0 = f32[4]{0} parameter(0)
  ROOT %n = f32[4]{0} negate(%p0)
}

ENTRY %main (a: f32[4], x: f32[1,8,8,2], k: f32[3,3,2,4]) -> (f32[4], f32[4], f32[4], (f32[4], s32[]), f32[4], f32[1,8,8,4], f32[4]) {
  %a = f32[4]{0} parameter(0)
  %x = f32[1,8,8,2]{3,2,1,0} parameter(1)
  %k = f32[3,3,2,4]{3,2,1,0} parameter(2)
  %cc1 = f32[4]{0} custom-call(%a), custom_call_target="foo", backend_config={"key": "value", "n": {"nested": [1, 2]}}
  %cc2 = f32[4]{0} custom-call(%cc1), custom_call_target="bar\\"baz\\n", backend_config="raw \\"string\\" \\001", custom_call_has_side_effect=true, api_version=API_VERSION_STATUS_RETURNING
  %cc3 = f32[4]{0} custom-call(%cc2), custom_call_target="lit", literal=s32[2]{0} {1, 2}, schedule=SCHEDULE_LATEST
  %cc4 = (f32[4]{0}, s32[]) custom-call(%cc3), custom_call_target="lc", operand_layout_constraints={f32[4]{0}}, output_to_operand_aliasing={{0}: (0, {})}, api_version=API_VERSION_TYPED_FFI
  %cc5 = f32[4]{0} custom-call(%a), custom_call_target="with_comp", called_computations={%comp}
  %cc6 = f32[1,8,8,4]{3,2,1,0} custom-call(%x, %k), window={size=3x3 pad=1_1x1_1}, dim_labels=b01f_01io->b01f, feature_group_count=1, custom_call_target="conv_like", operand_precision={high,default}
  %cc7 = f32[4]{0} custom-call(%a), custom_call_target="to_apply_cc", to_apply=%comp, padding_type=PADDING_SAME
  ROOT %t = (f32[4]{0}, f32[4]{0}, f32[4]{0}, (f32[4]{0}, s32[]), f32[4]{0}, /*index=5*/f32[1,8,8,4]{3,2,1,0}, f32[4]{0}) tuple(%cc1, %cc2, %cc3, %cc4, %cc5, %cc6, %cc7)
}
"""

CORPUS["collectives"] = """HloModule collectives, replica_count=2, num_partitions=4

%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %r = f32[] add(%x, %y)
}

ENTRY %main (a: f32[8]) -> (f32[8], f32[16], f32[4], f32[8], f32[8], f32[8], f32[8], f32[8], f32[16], f32[8]) {
  %a = f32[8]{0} parameter(0)
  %ar = f32[8]{0} all-reduce(%a), channel_id=1, replica_groups=[2,4]<=[8], use_global_device_ids=true, to_apply=%add
  %ar2 = f32[8]{0} all-reduce(%a), replica_groups={{0,1},{2,3},{4,5},{6,7}}, to_apply=%add
  %ar3 = f32[8]{0} all-reduce(%a), replica_groups={}, constrain_layout=true, to_apply=%add
  %ag = f32[16]{0} all-gather(%a), channel_id=2, replica_groups=[4,2]<=[2,4]T(1,0), dimensions={0}, use_global_device_ids=true
  %rs = f32[4]{0} reduce-scatter(%a), channel_id=3, replica_groups=[4,2]<=[8], use_global_device_ids=true, dimensions={0}, to_apply=%add
  %a2a = f32[8]{0} all-to-all(%a), channel_id=4, replica_groups={{0,1,2,3},{4,5,6,7}}, dimensions={0}
  %a2a2 = f32[8]{0} all-to-all(%a), replica_groups={{0,1}}
  %cp = f32[8]{0} collective-permute(%a), channel_id=5, source_target_pairs={{0,1},{1,2},{2,3},{3,0}}
  %cb = f32[8]{0} collective-broadcast(%a), replica_groups={{0,1}}
  %ars = f32[8]{0} all-reduce-start(%a), channel_id=6, replica_groups={{0,1},{2,3},{4,5},{6,7}}, to_apply=%add
  %ard = f32[8]{0} all-reduce-done(%ars)
  %ags = (f32[8]{0}, f32[16]{0}) all-gather-start(%a), channel_id=7, replica_groups={{0,1},{2,3},{4,5},{6,7}}, dimensions={0}
  %agd = f32[16]{0} all-gather-done(%ags)
  %cps = (f32[8]{0}, f32[8]{0}, u32[], u32[]) collective-permute-start(%a), channel_id=8, source_target_pairs={{0,1},{1,0}}
  %cpd = f32[8]{0} collective-permute-done(%cps)
  ROOT %t = (f32[8]{0}, f32[16]{0}, f32[4]{0}, f32[8]{0}, f32[8]{0}, /*index=5*/f32[8]{0}, f32[8]{0}, f32[8]{0}, f32[16]{0}, f32[8]{0}) tuple(%ar, %ag, %rs, %a2a, %cp, %cb, %ard, %ar2, %agd, %cpd)
}
"""

CORPUS["io_tokens"] = """HloModule io_tokens

ENTRY %main (a: f32[4]) -> (f32[4], token[]) {
  %a = f32[4]{0} parameter(0)
  %tok = token[] after-all()
  %inf = ((f32[4]{0}, s32[]), token[]) infeed(%tok), infeed_config="cfg"
  %val = (f32[4]{0}, s32[]) get-tuple-element(%inf), index=0
  %t2 = token[] get-tuple-element(%inf), index=1
  %out = token[] outfeed(%val, %t2), outfeed_shape=(f32[4]{0}, s32[]), outfeed_config="ocfg"
  %snd = (f32[4]{0}, u32[], token[]) send(%a, %out), channel_id=1
  %sd = token[] send-done(%snd), channel_id=1
  %rcv = (f32[4]{0}, u32[], token[]) recv(%sd), channel_id=2, is_host_transfer=true
  %rd = (f32[4]{0}, token[]) recv-done(%rcv), channel_id=2, is_host_transfer=true
  %rv = f32[4]{0} get-tuple-element(%rd), index=0
  %rt = token[] get-tuple-element(%rd), index=1
  %dep = f32[4]{0} add-dependency(%rv, %rt)
  %tok2 = token[] after-all(%rt, %tok)
  ROOT %t = (f32[4]{0}, token[]) tuple(%dep, %tok2)
}
"""

CORPUS["generic_attrs"] = """HloModule generic_attrs, input_output_alias={ {0}: (0, {}, may-alias), {1}: (1, {}, must-alias) }, buffer_donor={ (2, {}) }, frontend_attributes={attr_a="x",attr_b={"json": 1}}

FileNames
1 "a.py"
2 "b\\\\c.py"

FunctionNames
1 "f"
2 "<module>"

FileLocations
1 {file_name_id=1 function_name_id=1 line=10 end_line=10 column=3 end_column=9}
2 {file_name_id=2 function_name_id=2 line=1 end_line=2 column=0 end_column=5}

StackFrames
1 {file_location_id=2 parent_frame_id=1}
2 {file_location_id=1 parent_frame_id=2}


ENTRY %main (a: f32[4], b: f32[4], c: f32[4]) -> (f32[4], f32[4]) {
  %a = f32[4]{0} parameter(0), parameter_replication={true}, metadata={op_name="a"}
  %b = f32[4]{0} parameter(1), frontend_attributes={k="v"}
  %c = f32[4]{0} parameter(2)
  %n = f32[4]{0} negate(%a), metadata={op_type="Neg" op_name="jit(f)/neg" source_file="x.py" source_line=12 source_end_line=13 source_column=4 source_end_column=9 deduplicated_name="dd" scheduling_name="sched" stack_frame_id=2}
  %m = f32[4]{0} add(%n, %b), control-predecessors={%c}, statistics={visualizing_index=1,count_nan=1.5,count_inf=100}, backend_config={"x": [1, 2]}
  %o = f32[4]{0} exponential(%m), origin={{"orig" {1}}}
  ROOT %t = (f32[4]{0}, f32[4]{0}) tuple(%o, %c), origin={({"x"}, {"y" {0,1}})}
}
"""

CORPUS["fusion_async"] = """HloModule fusion_async

%fused (fp0: f32[4], fp1: f32[4]) -> f32[4] {
  %fp0 = f32[4]{0} parameter(0)
  %fp1 = f32[4]{0} parameter(1)
  ROOT %fa = f32[4]{0} add(%fp0, %fp1)
}

%async_comp (ap: f32[4]) -> f32[4] {
  %ap = f32[4]{0} parameter(0)
  ROOT %acc = f32[4]{0} custom-call(%ap), custom_call_target="AsyncOp"
}

%thread_comp (tp: f32[4]) -> f32[4] {
  %tp = f32[4]{0} parameter(0)
  ROOT %tn = f32[4]{0} negate(%tp)
}, execution_thread="parallel"

ENTRY %main (a: f32[4], b: f32[4]) -> (f32[4], f32[4], f32[4], f32[4]) {
  %a = f32[4]{0} parameter(0)
  %b = f32[4]{0} parameter(1)
  %f = f32[4]{0} fusion(%a, %b), kind=kLoop, calls=%fused
  %f2 = f32[4]{0} fusion(%a, %b), kind=kInput, output_to_operand_aliasing={{}: (0, {})}, calls=%fused
  %as = ((f32[4]{0}), f32[4]{0}, s32[]) async-start(%a), calls=%async_comp
  %au = ((f32[4]{0}), f32[4]{0}, s32[]) async-update(%as)
  %ad = f32[4]{0} async-done(%au)
  %cs = (f32[4]{0}, f32[4]{0}, u32[]) copy-start(%b), cross_program_prefetch_index=0
  %cd = f32[4]{0} copy-done(%cs)
  %ts = ((f32[4]{0}), f32[4]{0}, s32[]) async-start(%b), async_execution_thread="parallel", calls=%thread_comp
  %td = f32[4]{0} async-done(%ts)
  ROOT %t = (f32[4]{0}, f32[4]{0}, f32[4]{0}, f32[4]{0}) tuple(%f, %ad, %cd, %f2)
}
"""

CORPUS["constants"] = """HloModule constants

ENTRY %main () -> (f32[3], bf16[2,2], pred[], c128[2], s8[2,1,2], f64[2], f8e5m2[2], u64[1], f16[2,2,2,2], s32[0], s2[3], f4e2m1fn[2]) {
  %c0 = f32[3]{0} constant({1.5, -inf, nan})
  %c1 = bf16[2,2]{1,0} constant({ { 1, 2.5 }, { -3, 4e+10 } })
  %c2 = pred[] constant(true)
  %c3 = c128[2]{0} constant({(1, -2), (0.333333333333, 1e-300)})
  %c4 = s8[2,1,2]{2,1,0} constant({ { { -128, 127 } }, { { 0, 1 } } })
  %c5 = f64[2]{0} constant({0.1, -nan(0x1234)})
  %c6 = f8e5m2[2]{0} constant({57344, -0.5})
  %c7 = u64[1]{0} constant({18446744073709551615})
  %c8 = f16[2,2,2,2]{3,2,1,0} constant({ { /*i0=0*/ { /*i1=0*/ {1, 2}, {3, 4} }, { /*i1=1*/ {5, 6}, {7, 8} } }, { /*i0=1*/ { /*i1=0*/ {1, 2}, {3, 4} }, { /*i1=1*/ {5, 6}, {7, 8} } } })
  %c9 = s32[0]{0} constant({})
  %c10 = s2[3]{0} constant({-2, 1, 0})
  %c11 = f4e2m1fn[2]{0} constant({6, -0.5})
  %c12 = f32[2,2]{0,1} constant({ { 1, 2 }, { 3, 4 } })
  %c13 = (f32[2]{0}, s32[]) constant(( {1, 2}, 3 ))
  ROOT %t = (f32[3]{0}, bf16[2,2]{1,0}, pred[], c128[2]{0}, s8[2,1,2]{2,1,0}, /*index=5*/f64[2]{0}, f8e5m2[2]{0}, u64[1]{0}, f16[2,2,2,2]{3,2,1,0}, s32[0]{0}, /*index=10*/s2[3]{0}, f4e2m1fn[2]{0}) tuple(%c0, %c1, %c2, %c3, %c4, %c5, %c6, %c7, %c8, %c9, %c10, %c11)
}
"""

CORPUS["sharding"] = """HloModule sharding, num_partitions=8

ENTRY %main (a: f32[8,16], b: (f32[8], f32[8])) -> (f32[8,16], f32[8,16]) {
  %a = f32[8,16]{1,0} parameter(0), sharding={devices=[2,4]<=[8]}
  %b = (f32[8]{0}, f32[8]{0}) parameter(1), sharding={{replicated}, {devices=[2,4]<=[8] last_tile_dim_replicate}}
  %c = f32[8,16]{1,0} custom-call(%a), custom_call_target="Sharding", sharding={devices=[1,4,2]<=[2,4]T(1,0) last_tile_dim_replicate}
  %d = f32[8,16]{1,0} copy(%c), sharding={maximal device=3}
  %e = f32[8,16]{1,0} copy(%d), sharding={manual}
  %f = f32[8,16]{1,0} copy(%e), sharding={devices=[2,2,2]0,1,4,5,2,3,6,7 last_tile_dims={manual}}
  %g = f32[8,16]{1,0} copy(%f), sharding={replicated metadata={op_name="x"}}
  %dom = f32[8,16]{1,0} domain(%g), domain={kind="sharding", entry={maximal device=0}, exit={replicated}}
  ROOT %t = (f32[8,16]{1,0}, f32[8,16]{1,0}) tuple(%dom, %f), sharding={{replicated}, {devices=[2,4]<=[8]}}
}
"""

CORPUS["ragged_scan"] = """HloModule ragged_scan

%add2 (x: f32[], c: f32[]) -> (f32[], f32[]) {
  %x = f32[] parameter(0)
  %c = f32[] parameter(1)
  %s = f32[] add(%x, %c)
  ROOT %t = (f32[], f32[]) tuple(%s, %s)
}

ENTRY %main (l: f32[11,5], r: f32[3,5,7], g: s64[3], i: f32[8]) -> (f32[11,7], (f32[8], f32[])) {
  %l = f32[11,5]{1,0} parameter(0)
  %r = f32[3,5,7]{2,1,0} parameter(1)
  %g = s64[3]{0} parameter(2)
  %i = f32[8]{0} parameter(3)
  %rd = f32[11,7]{1,0} ragged-dot(%l, %r, %g), lhs_contracting_dims={1}, rhs_contracting_dims={1}, lhs_ragged_dims={0}, rhs_group_dims={0}
  %z = f32[] constant(0)
  %sc = (f32[8]{0}, f32[]) scan(%i, %z), dimensions={0}, num_carries=1, to_apply=%add2
  ROOT %t = (f32[11,7]{1,0}, (f32[8]{0}, f32[])) tuple(%rd, %sc)
}
"""


CORPUS["newer_ops"] = """HloModule newer_ops, num_partitions=4

%add2 (x: f32[], c: f32[]) -> (f32[], f32[]) {
  %x = f32[] parameter(0)
  %c = f32[] parameter(1)
  %s = f32[] add(%x, %c)
  ROOT %t = (f32[], f32[]) tuple(%s, %s)
}

ENTRY %main (a: f32[4,6], n: s32[], l: f32[8,16], r: f32[16,8], ls: f32[8,1], rs: f32[1,8], i: f32[8], buf: f32[16], out: f32[16], off: s64[4], sz: s64[4], x: f32[1,8,8,3], k: f32[3,3,3,4]) -> (f32[2,<=12], f32[8,8], (f32[8], f32[]), f32[16], f32[1,8,8,4], f32[1,8,8,4]) {
  %a = f32[4,6]{1,0} parameter(0)
  %n = s32[] parameter(1)
  %dr = f32[2,<=12]{1,0} dynamic-reshape(%a, %n, %n)
  %l = f32[8,16]{1,0} parameter(2)
  %r = f32[16,8]{1,0} parameter(3)
  %ls = f32[8,1]{1,0} parameter(4)
  %rs = f32[1,8]{1,0} parameter(5)
  %sd = f32[8,8]{1,0} scaled-dot(%l, %r, %ls, %rs), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %i = f32[8]{0} parameter(6)
  %z = f32[] constant(0)
  %sc = (f32[8]{0}, f32[]) scan(%i, %z), dimensions={0}, num_carries=1, is_reverse=true, is_associative=true, to_apply=%add2
  %buf = f32[16]{0} parameter(7)
  %out = f32[16]{0} parameter(8)
  %off = s64[4]{0} parameter(9)
  %sz = s64[4]{0} parameter(10)
  %ra = f32[16]{0} ragged-all-to-all(%buf, %out, %off, %sz, %off, /*index=5*/%sz), channel_id=3, replica_groups={{0,1,2,3}}
  %x = f32[1,8,8,3]{3,2,1,0} parameter(11)
  %k = f32[3,3,3,4]{3,2,1,0} parameter(12)
  %cv = f32[1,8,8,4]{3,2,1,0} convolution(%x, %k), window={size=3x3 pad=1_1x1_1}, dim_labels=b01f_01io->b01f, convolution_kind=dgrad, operand_precision={high,highest}, sparsity_config={lhs={sparsity=1x2 dimension=3 stride=1} rhs={sparsity=1x4 dimension=2 stride=0}}
  %cv2 = f32[1,8,8,4]{3,2,1,0} convolution(%x, %k), window={size=3x3 pad=1_1x1_1}, dim_labels=b01f_01io->b01f, convolution_kind=wgrad, sparsity_config={rhs={stride=2 sparsity=1x2}}
  ROOT %t = (f32[2,<=12]{1,0}, f32[8,8]{1,0}, (f32[8]{0}, f32[]), f32[16]{0}, f32[1,8,8,4]{3,2,1,0}, /*index=5*/f32[1,8,8,4]{3,2,1,0}) tuple(%dr, %sd, %sc, %ra, %cv, /*index=5*/%cv2)
}
"""

# async-start/-update/-done over a one-instruction wrapped computation print as sugar
CORPUS["async_sugar"] = """HloModule sugar

ENTRY %main (a: f32[4]) -> f32[4] {
  %a = f32[4]{0} parameter(0)
  %cs = ((f32[4]{0}), f32[4]{0}, s32[]) custom-call-start(%a), custom_call_target="foo", async_execution_thread="th"
  %cu = ((f32[4]{0}), f32[4]{0}, s32[]) custom-call-update(%cs)
  %cd = f32[4]{0} custom-call-done(%cu)
  %ns = ((f32[4]{0}), f32[4]{0}) negate-start(%cd)
  ROOT %nd = f32[4]{0} negate-done(%ns)
}
"""

# wrapped ops are named after their opcode; XLA uniquifies them before the caller's names
CORPUS["async_sugar_names"] = """HloModule sugar2

ENTRY %main (a: f32[4]) -> f32[4] {
  %negate = f32[4]{0} parameter(0)
  %ns = ((f32[4]{0}), f32[4]{0}) negate-start(%negate)
  %nd = f32[4]{0} negate-done(%ns)
  %ns2 = ((f32[4]{0}), f32[4]{0}) negate-start(%nd)
  %negate.1 = f32[4]{0} negate-done(%ns2)
  %ns3 = ((f32[4]{0}), f32[4]{0}) negate-start(%negate.1)
  ROOT %nd3 = f32[4]{0} negate-done(%ns3)
}
"""

# -- proto comparison -------------------------------------------------------------------------------
def _attrs_of(inst) -> bytes:
    from hlo_spmd.ir.instruction import clear_owned
    from hlo_spmd.proto import hlo_pb2

    a = hlo_pb2.HloInstructionProto()
    a.CopyFrom(inst)
    clear_owned(a)
    return a.SerializeToString(deterministic=True)


def _fields_diff(a, b) -> str:
    fa = {fd.name: v for fd, v in a.ListFields()}
    fb = {fd.name: v for fd, v in b.ListFields()}
    keys = sorted(k for k in set(fa) | set(fb) if str(fa.get(k)) != str(fb.get(k)))
    return "; ".join(f"{k}: {str(fa.get(k, '<absent>'))[:120]!r} vs {str(fb.get(k, '<absent>'))[:120]!r}"
                     for k in keys)


def _frame_chain(sfi, frame_id: int) -> str:
    out = []
    depth = 0
    while 0 < frame_id <= len(sfi.stack_frames) and depth < 64:
        fr = sfi.stack_frames[frame_id - 1]
        loc = sfi.file_locations[fr.file_location_id - 1] if 0 < fr.file_location_id <= len(
            sfi.file_locations) else None
        if loc is not None:
            fname = sfi.file_names[loc.file_name_id - 1] if 0 < loc.file_name_id <= len(
                sfi.file_names) else "?"
            func = sfi.function_names[loc.function_name_id - 1] if 0 < loc.function_name_id <= len(
                sfi.function_names) else "?"
            out.append(f"{fname}:{func}:{loc.line}:{loc.column}-{loc.end_line}:{loc.end_column}")
        frame_id = fr.parent_frame_id
        depth += 1
    return "<".join(out)


def _resolve_frames(inst, sfi):
    from hlo_spmd.proto import hlo_pb2

    if not inst.metadata.stack_frame_id:
        return inst
    copy = hlo_pb2.HloInstructionProto()
    copy.CopyFrom(inst)
    copy.metadata.op_type = copy.metadata.op_type + "@" + _frame_chain(
        sfi, inst.metadata.stack_frame_id)
    copy.metadata.stack_frame_id = 0
    return copy


def _canonical_compares(module) -> dict:
    """Instructions by name, each compare's ordering in one encoding (its order): XLA
    up to 0.10 writes only comparison_type, newer XLA only comparison_order, hlo-spmd
    both when the ordering is not the default (ir/comparison.py). Newer XLA also writes
    an empty block_scaling_config / sparsity_config on every dot and convolution: an
    empty one says nothing, so its presence is not compared."""
    from hlo_spmd.ir import comparison
    from hlo_spmd.proto import hlo_pb2

    by_id = {i.id: i for c in module.computations for i in c.instructions}
    out = {}
    for c in module.computations:
        for i in c.instructions:
            if i.opcode == "compare" and i.operand_ids:
                et = by_id[i.operand_ids[0]].shape.element_type
                copy = hlo_pb2.HloInstructionProto()
                copy.CopyFrom(i)
                copy.comparison_order = comparison.order(i, et)
                copy.ClearField("comparison_type")
                i = copy
            for f in ("block_scaling_config", "sparsity_config"):
                if i.HasField(f) and not getattr(i, f).ListFields():
                    copy = hlo_pb2.HloInstructionProto()
                    copy.CopyFrom(i)
                    copy.ClearField(f)
                    i = copy
            out[i.name] = i
    return out


def proto_differences(ref, ours, *, stack_frames: bool = True) -> list[str]:
    """Differences between two HloModuleProtos modulo ids and instruction order:
    per-instruction attributes (everything but the fields Instruction owns), shapes and
    shardings matched by name, plus module and computation fields."""
    from hlo_spmd.ir.instruction import clear_owned
    from hlo_spmd.proto import hlo_pb2

    probs: list[str] = []
    i1 = _canonical_compares(ref)
    i2 = _canonical_compares(ours)
    if not stack_frames:
        # jaxlib renumbers stack frames when it parses text: compare resolved frames.
        i1 = {k: _resolve_frames(v, ref.stack_frame_index) for k, v in i1.items()}
        i2 = {k: _resolve_frames(v, ours.stack_frame_index) for k, v in i2.items()}
    if set(i1) != set(i2):
        probs.append(f"instruction names differ: {sorted(set(i1) ^ set(i2))[:10]}")
    for name, a in i1.items():
        b = i2.get(name)
        if b is None:
            continue
        if _attrs_of(a) != _attrs_of(b):
            x, y = hlo_pb2.HloInstructionProto(), hlo_pb2.HloInstructionProto()
            x.CopyFrom(a)
            y.CopyFrom(b)
            clear_owned(x)
            clear_owned(y)
            probs.append(f"attrs of {name} ({a.opcode}): {_fields_diff(x, y)}")
        if a.shape.SerializeToString(deterministic=True) != b.shape.SerializeToString(
                deterministic=True):
            probs.append(f"shape of {name}: {a.shape} vs {b.shape}".replace("\n", " "))
        if a.HasField("sharding") != b.HasField("sharding") or a.sharding.SerializeToString(
                deterministic=True) != b.sharding.SerializeToString(deterministic=True):
            probs.append(f"sharding of {name}: {a.sharding} vs {b.sharding}".replace("\n", " "))
        if a.opcode != b.opcode or len(a.operand_ids) != len(b.operand_ids) or \
                len(a.called_computation_ids) != len(b.called_computation_ids) or \
                len(a.control_predecessor_ids) != len(b.control_predecessor_ids):
            probs.append(f"structure of {name} differs")
    fields = ["host_program_shape", "input_output_alias", "buffer_donor", "frontend_attributes",
              "spmd_output_sharding", "device_assignment"]
    if stack_frames:
        fields.append("stack_frame_index")
    for f in fields:
        if getattr(ref, f) != getattr(ours, f):
            probs.append(f"module {f}: {str(getattr(ref, f))[:200]!r} vs "
                         f"{str(getattr(ours, f))[:200]!r}")
    if ref.HasField("schedule") != ours.HasField("schedule"):
        probs.append("schedule presence differs")
    if ref.name != ours.name or ref.entry_computation_name != ours.entry_computation_name:
        probs.append("module / entry names differ")
    c2 = {c.name: c for c in ours.computations}
    for c1 in ref.computations:
        c = c2.get(c1.name)
        if c is None:
            probs.append(f"missing computation {c1.name}")
            continue
        for f in ("program_shape", "is_fusion_computation", "execution_thread"):
            if getattr(c1, f) != getattr(c, f):
                probs.append(f"computation {c1.name} {f} differs")
    return probs
