"""Wire-compatibility checks of hlo_spmd.proto against real jaxlib output.

The schema in src/hlo_spmd/proto/*.proto is our own transcription of XLA's
hlo.proto / xla_data.proto.  These tests make sure that:

* every HloModuleProto jaxlib produces (before and after SPMD partitioning,
  with Shardy on and off) parses with *no* unknown fields anywhere;
* parse -> serialize -> parse is lossless;
* jaxlib accepts the bytes we serialize and prints the same module;
* unknown fields survive a parse/serialize round trip (forward compatibility);
* our descriptors agree field-by-field with the descriptors compiled into the
  installed jaxlib (skipped if they cannot be located in the binary).
"""

from __future__ import annotations

import mmap
import os
import pathlib
import re

import pytest

# Must happen before jax is imported anywhere in this process.
_flags = os.environ.get("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in _flags:
    os.environ["XLA_FLAGS"] = (
        _flags + " --xla_force_host_platform_device_count=8"
    ).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
np = pytest.importorskip("numpy")

from google.protobuf import descriptor_pb2  # noqa: E402

from hlo_spmd.proto import hlo_pb2, xla_data_pb2  # noqa: E402

try:  # protobuf >= 4.21 (required for upb, the only backend in 5.x+)
    from google.protobuf import unknown_fields as _unknown_fields
except ImportError:  # pragma: no cover - very old protobuf
    _unknown_fields = None

from jax import lax  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

N_DEVICES = 8


# ---------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------


def _unknown_of(msg):
    """List of (field_number, wire_type) of the unknown fields of `msg` itself."""
    if _unknown_fields is not None:
        return [(f.field_number, f.wire_type) for f in _unknown_fields.UnknownFieldSet(msg)]
    return [(f.field_number, f.wire_type) for f in msg.UnknownFields()]  # pragma: no cover


def _is_repeated(fd):
    if hasattr(fd, "is_repeated"):
        return fd.is_repeated
    return fd.label == fd.LABEL_REPEATED  # pragma: no cover - protobuf < 6


def walk_unknown(msg, path="$"):
    """Yield (path, unknown fields) for every message in the tree that has any."""
    unknown = _unknown_of(msg)
    if unknown:
        yield path, unknown
    for fd, value in msg.ListFields():
        if fd.message_type is None:
            continue
        sub = f"{path}.{fd.name}"
        if fd.message_type.GetOptions().map_entry:
            value_fd = fd.message_type.fields_by_name["value"]
            if value_fd.message_type is not None:
                for key, item in value.items():
                    yield from walk_unknown(item, f"{sub}[{key!r}]")
        elif _is_repeated(fd):
            for i, item in enumerate(value):
                yield from walk_unknown(item, f"{sub}[{i}]")
        else:
            yield from walk_unknown(value, sub)


def _mesh():
    if len(jax.devices()) < N_DEVICES:
        pytest.skip(
            f"needs {N_DEVICES} host devices (jax was initialised before this "
            "module could set XLA_FLAGS)"
        )
    axis_type = getattr(jax.sharding, "AxisType", None)
    if axis_type is None:  # pragma: no cover - older jax
        return jax.make_mesh((4, 2), ("x", "y"))
    # Auto axes: the classic "sharding annotations + propagation" mode that an
    # SPMD partitioner consumes (newer jax defaults to Explicit axes).
    return jax.make_mesh((4, 2), ("x", "y"), axis_types=(axis_type.Auto,) * 2)


def _lower(fn, args, in_specs=None, out_specs=None, **jit_kwargs):
    kwargs = dict(jit_kwargs)
    if in_specs is not None or out_specs is not None:
        mesh = _mesh()
        if in_specs is not None:
            kwargs["in_shardings"] = tuple(NamedSharding(mesh, s) for s in in_specs)
        if out_specs is not None:
            kwargs["out_shardings"] = (
                tuple(NamedSharding(mesh, s) for s in out_specs)
                if isinstance(out_specs, tuple)
                else NamedSharding(mesh, out_specs)
            )
    return jax.jit(fn, **kwargs).lower(*args)


def _hlo_bytes(lowered):
    return lowered.compiler_ir("hlo").as_serialized_hlo_module_proto()


# ---------------------------------------------------------------------------
# Module builders.  Each returns the serialized HloModuleProto bytes.
# ---------------------------------------------------------------------------


def build_matmul_tanh():
    a = jnp.arange(16 * 8, dtype=jnp.float32).reshape(16, 8)
    b = jnp.ones((8, 4), jnp.float32)
    return _hlo_bytes(
        _lower(lambda a, b: jnp.tanh(a @ b), (a, b),
               in_specs=(P("x", None), P(None, "y")), out_specs=P("x", "y"))
    )


def build_while_loop():
    def f(x):
        def cond(c):
            return c[0] < 10

        def body(c):
            i, v = c
            return i + 1, v * 1.5 + jnp.sin(v)

        return lax.while_loop(cond, body, (jnp.int32(0), x))[1]

    x = jnp.ones((8, 4), jnp.float32)
    return _hlo_bytes(_lower(f, (x,), in_specs=(P("x", None),), out_specs=P("x", None)))


def build_conv():
    def f(lhs, rhs):
        return lax.conv_general_dilated(
            lhs, rhs, window_strides=(2, 1), padding=((1, 1), (0, 2)),
            lhs_dilation=(1, 1), rhs_dilation=(1, 2),
            dimension_numbers=("NHWC", "HWIO", "NHWC"),
            feature_group_count=1,
        )

    lhs = jnp.ones((8, 16, 16, 4), jnp.float32)
    rhs = jnp.ones((3, 3, 4, 6), jnp.float32)
    return _hlo_bytes(
        _lower(f, (lhs, rhs), in_specs=(P("x"), P()), out_specs=P("x"))
    )


def build_gather_scatter():
    def f(table, idx, upd):
        g = table[idx]                      # gather
        s = table.at[idx].add(upd)          # scatter
        return g, s

    table = jnp.ones((32, 8), jnp.float32)
    idx = jnp.array([1, 5, 7, 3, 0, 31, 2, 2], jnp.int32)
    upd = jnp.ones((8, 8), jnp.float32)
    return _hlo_bytes(
        _lower(f, (table, idx, upd), in_specs=(P(None, "y"), P(), P()),
               out_specs=(P(), P(None, "y")))
    )


def build_sort():
    def f(k, v):
        keys, vals = lax.sort((k, v), dimension=1, is_stable=True, num_keys=1)
        return keys, vals, jnp.argsort(k, axis=0)

    k = jnp.arange(8 * 16, dtype=jnp.float32).reshape(8, 16)[:, ::-1]
    v = jnp.arange(8 * 16, dtype=jnp.int32).reshape(8, 16)
    return _hlo_bytes(
        _lower(f, (k, v), in_specs=(P("x"), P("x")), out_specs=(P("x"), P("x"), P()))
    )


def build_reduce():
    def f(x):
        return jnp.sum(x, axis=1), jnp.max(x, axis=0), jnp.argmax(x, axis=1)

    x = jnp.ones((16, 8), jnp.float32)
    return _hlo_bytes(
        _lower(f, (x,), in_specs=(P("x", "y"),), out_specs=(P("x"), P("y"), P("x")))
    )


def build_constants():
    consts = [
        np.arange(12, dtype=np.float32).reshape(3, 4) * 0.5,
        np.array([1.5, -2.25, 3.0, 7.0], dtype=jnp.bfloat16),
        np.array([0.5, -1.0, 2.0], dtype=np.float16),
        np.array([-3, 1, 4, -1, 5], dtype=np.int8),
        np.array([3, 1, 4, 255], dtype=np.uint8),
        np.array([100000, -7, 3], dtype=np.int32),
        np.array([4000000000, 1], dtype=np.uint32),
        np.array([True, False, True]),
        np.array([1 + 2j, -3.5j], dtype=np.complex64),
        np.array([1, -2, 3, -4], dtype=jnp.int4),
    ]

    def f(x):
        # lax.rev keeps the element type, so each constant is embedded as a
        # literal of its own type (jnp reductions would promote and fold it).
        outs = [lax.rev(jnp.asarray(c), (0,)) for c in consts]
        return x + jnp.asarray(consts[0]).sum(), outs

    x = jnp.ones((4,), jnp.float32)
    return _hlo_bytes(_lower(f, (x,)))


def build_control_flow_and_misc():
    def f(x, y):
        z = lax.cond(x.sum() > 0, lambda v: v * 2.0, lambda v: v - 1.0, x)
        vals, idx = lax.top_k(z, 3)
        c = lax.cumsum(z, axis=1)
        w = lax.reduce_window(z, -jnp.inf, lax.max, (1, 2), (1, 1), "SAME")
        p = lax.pad(z, 0.0, ((1, 2, 0), (0, 0, 1)))
        d = lax.dynamic_slice(z, (jnp.int32(1), jnp.int32(0)), (2, 4))
        fx = jnp.fft.fft(y)
        r = jnp.flip(z, 0)
        cl = jnp.clip(z, -1.0, 1.0)
        return vals, idx, c, w, p, d, fx, r, cl

    x = jnp.ones((8, 4), jnp.float32)
    y = jnp.ones((8, 4), jnp.complex64)
    return _hlo_bytes(_lower(f, (x, y), in_specs=(P("x"), P("x"))))


def build_grad_maxpool():
    # select-and-scatter via the gradient of a max-pool.
    def loss(x):
        return lax.reduce_window(x, -jnp.inf, lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID").sum()

    x = jnp.ones((8, 8, 8, 2), jnp.float32)
    return _hlo_bytes(_lower(jax.grad(loss), (x,), in_specs=(P("x"),), out_specs=P("x")))


def build_shard_map_collectives():
    mesh = _mesh()

    def body(a):
        s = lax.psum(a, "x")
        g = lax.all_gather(a, "y", tiled=True)
        pp = lax.ppermute(a, "x", perm=[(i, (i + 1) % 4) for i in range(4)])
        return s, g, pp

    sm = jax.shard_map(
        body, mesh=mesh, in_specs=P("x", "y"),
        out_specs=(P(None, "y"), P("x", None), P("x", "y")), check_vma=False,
    )
    x = jnp.arange(16 * 8, dtype=jnp.float32).reshape(16, 8)
    return _hlo_bytes(jax.jit(sm).lower(x))


def build_sharding_constraint_and_donation():
    mesh = _mesh()

    def f(x, y):
        x = lax.with_sharding_constraint(x * 2, NamedSharding(mesh, P("y", "x")))
        return x + y, (y - 1).T

    x = jnp.ones((8, 8), jnp.float32)
    y = jnp.ones((8, 8), jnp.float32)
    return _hlo_bytes(
        _lower(f, (x, y), in_specs=(P("x"), P()), out_specs=(P("x"), P()),
               donate_argnums=(1,))
    )


def build_compiled_spmd():
    # Post-partitioning, optimized module: fusions, schedule, collectives with
    # replica groups, backend configs.
    a = jnp.ones((16, 8), jnp.float32)
    b = jnp.ones((8, 4), jnp.float32)
    lowered = _lower(lambda a, b: jnp.tanh(a @ b).sum(0), (a, b),
                     in_specs=(P("x", "y"), P("y", None)))
    modules = lowered.compile().runtime_executable().hlo_modules()
    return modules[0].as_serialized_hlo_module_proto()


def build_compiled_while():
    # Optimized module whose kWhile carries a JSON WhileLoopBackendConfig.
    def f(x):
        return lax.fori_loop(0, 10, lambda i, v: v * 1.5 + jnp.sin(v) + i, x)

    x = jnp.ones((8, 4), jnp.float32)
    lowered = _lower(f, (x,), in_specs=(P("x", None),), out_specs=P("x", None))
    return lowered.compile().runtime_executable().hlo_modules()[0].as_serialized_hlo_module_proto()


BUILDERS = {
    "matmul_tanh": build_matmul_tanh,
    "while_loop": build_while_loop,
    "conv": build_conv,
    "gather_scatter": build_gather_scatter,
    "sort": build_sort,
    "reduce": build_reduce,
    "constants": build_constants,
    "control_flow_misc": build_control_flow_and_misc,
    "grad_maxpool": build_grad_maxpool,
    "shard_map_collectives": build_shard_map_collectives,
    "constraint_donation": build_sharding_constraint_and_donation,
    "compiled_spmd": build_compiled_spmd,
    "compiled_while": build_compiled_while,
}


@pytest.fixture(params=[True, False], ids=["shardy", "gspmd"])
def shardy(request):
    """Run a test with jax_use_shardy_partitioner on and off."""
    old = jax.config.jax_use_shardy_partitioner
    jax.config.update("jax_use_shardy_partitioner", request.param)
    try:
        yield request.param
    finally:
        jax.config.update("jax_use_shardy_partitioner", old)


_CACHE: dict = {}


def module_bytes(name, use_shardy):
    key = (name, use_shardy)
    if key not in _CACHE:
        _CACHE[key] = BUILDERS[name]()
    return _CACHE[key]


def _jaxlib_text(data):
    from jaxlib import _hlo

    return _hlo.HloModule.from_serialized_hlo_module_proto(data).to_string()


# ---------------------------------------------------------------------------
# Tests
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_jaxlib_module_parses_without_unknown_fields(name, shardy):
    data = module_bytes(name, shardy)
    msg = hlo_pb2.HloModuleProto.FromString(data)
    assert msg.computations, "empty module"
    assert msg.entry_computation_name

    unknown = list(walk_unknown(msg))
    assert not unknown, f"fields unknown to our schema: {unknown[:10]}"

    # Lossless round trip.
    ser = msg.SerializeToString(deterministic=True)
    again = hlo_pb2.HloModuleProto.FromString(ser)
    assert again == msg
    assert again.SerializeToString(deterministic=True) == ser
    # Same field set => same encoded size (map entry order may differ from
    # jaxlib's, so the bytes themselves need not be identical).
    assert len(msg.SerializeToString()) == len(data)
    assert msg.ByteSize() == len(data)


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_jaxlib_accepts_our_bytes(name, shardy):
    data = module_bytes(name, shardy)
    msg = hlo_pb2.HloModuleProto.FromString(data)
    ours = msg.SerializeToString(deterministic=True)

    text = _jaxlib_text(ours)
    entry = next(c for c in msg.computations if c.id == msg.entry_computation_id)
    for inst in entry.instructions:
        assert inst.name in text, f"{inst.name} missing from jaxlib's print-out"
    assert text == _jaxlib_text(data)


def test_module_features_are_exercised():
    """The builders above really produce the fields the schema must carry."""
    seen_opcodes = set()
    seen_fields = set()
    for use_shardy in (True, False):
        old = jax.config.jax_use_shardy_partitioner
        jax.config.update("jax_use_shardy_partitioner", use_shardy)
        try:
            for name in BUILDERS:
                msg = hlo_pb2.HloModuleProto.FromString(module_bytes(name, use_shardy))
                seen_fields.update(fd.name for fd, _ in msg.ListFields())
                for comp in msg.computations:
                    for inst in comp.instructions:
                        seen_opcodes.add(inst.opcode)
                        seen_fields.update("inst." + fd.name for fd, _ in inst.ListFields())
                        if inst.HasField("literal"):
                            seen_fields.update(
                                "literal." + fd.name for fd, _ in inst.literal.ListFields()
                            )
        finally:
            jax.config.update("jax_use_shardy_partitioner", old)

    for op in ("dot", "tanh", "while", "convolution", "gather", "scatter", "sort",
               "reduce", "constant", "conditional", "all-reduce", "fusion",
               "select-and-scatter", "fft", "custom-call"):
        assert op in seen_opcodes, op
    for field in ("schedule", "stack_frame_index", "frontend_attributes",
                  "spmd_output_sharding", "spmd_parameters_shardings",
                  "inst.sharding", "inst.window", "inst.convolution_dimension_numbers",
                  "inst.gather_dimension_numbers", "inst.scatter_dimension_numbers",
                  "inst.dot_dimension_numbers", "inst.channel_id",
                  "inst.backend_config", "inst.frontend_attributes",
                  "inst.collective_device_list", "inst.mesh_axes_replica_group_list",
                  "inst.source_target_pairs", "inst.use_global_device_ids",
                  "inst.padding_config", "inst.slice_dimensions", "inst.is_stable",
                  "literal.f32s", "literal.bf16s", "literal.f16s", "literal.s8s",
                  "literal.u8s", "literal.s32s", "literal.u32s", "literal.preds",
                  "literal.c64s", "literal.s4s"):
        assert field in seen_fields, field


def test_while_backend_config_json_uses_our_field_names():
    """XLA stores WhileLoopBackendConfig as JSON: field *names* must match."""
    from google.protobuf import json_format

    msg = hlo_pb2.HloModuleProto.FromString(
        module_bytes("compiled_while", jax.config.jax_use_shardy_partitioner)
    )
    configs = [
        inst.backend_config
        for comp in msg.computations
        for inst in comp.instructions
        if inst.opcode == "while" and inst.backend_config
    ]
    assert configs, "no kWhile with a backend_config in the optimized module"
    for raw in configs:
        cfg = json_format.Parse(raw.decode(), xla_data_pb2.WhileLoopBackendConfig())
        assert cfg.known_trip_count.n == 10
        assert cfg.known_init_step.step == 1


def test_unknown_fields_survive_round_trip():
    data = module_bytes("matmul_tanh", jax.config.jax_use_shardy_partitioner)
    msg = hlo_pb2.HloModuleProto.FromString(data)
    comp = msg.computations[-1]
    inst = comp.instructions[0]

    # Append field 999 (varint, value 42) to the instruction's encoding.
    tag = (999 << 3) | 0
    raw = bytearray()
    while True:
        byte = tag & 0x7F
        tag >>= 7
        raw.append(byte | (0x80 if tag else 0))
        if not tag:
            break
    raw.append(42)
    patched = hlo_pb2.HloInstructionProto.FromString(inst.SerializeToString() + bytes(raw))
    assert _unknown_of(patched) == [(999, 0)]

    inst.CopyFrom(patched)
    blob = msg.SerializeToString()
    assert bytes(raw) in blob

    back = hlo_pb2.HloModuleProto.FromString(blob)
    found = list(walk_unknown(back))
    assert len(found) == 1
    path, fields = found[0]
    assert fields == [(999, 0)]
    assert ".instructions[0]" in path
    assert back.SerializeToString(deterministic=True) == msg.SerializeToString(deterministic=True)
    assert back == msg

    # Unknown fields are ignored (not rejected) by XLA itself.
    assert inst.name in _jaxlib_text(blob)


def test_package_reexports():
    import hlo_spmd.proto as proto

    assert proto.hlo_pb2 is hlo_pb2
    assert proto.xla_data_pb2 is xla_data_pb2
    assert hlo_pb2.DESCRIPTOR.package == "xla"
    assert xla_data_pb2.DESCRIPTOR.package == "xla"
    assert hlo_pb2.DESCRIPTOR.dependencies[0].name == "hlo_spmd/proto/xla_data.proto"


# ---------------------------------------------------------------------------
# Field-by-field comparison with the descriptors compiled into jaxlib.
# ---------------------------------------------------------------------------

# Numbers retired in the XLA built into jaxlib 0.10.2 but kept by us as
# deprecated legacy fields (older XLA releases emit them).
LEGACY_FIELDS = {
    (".xla.NamedShardingProto", 1),
    (".xla.CollectiveDeviceListProto", 2),
    (".xla.WhileLoopBackendConfig", 4),
    (".xla.HloInstructionProto", 86),
}
LEGACY_TYPES = {
    ".xla.SparsityDescriptor",
    ".xla.SparsityType",
    ".xla.HloModuleProto.ProfileGenerationStrategy",
}
# What jaxlib 0.12 has and 0.10.2 lacks: checked exactly against a jaxlib that has them,
# allowed as extras against an older one (the schema reads both generations).
NEWER_FIELDS = {
    (".xla.SparsityConfig.TensorSparsityConfig", 5),
    (".xla.NamedShardingProto", 8),
    (".xla.OriginalValueProto", 3),
    (".xla.HloInstructionProto", 100),
    (".xla.HloInstructionProto", 101),
    (".xla.HloInstructionProto", 102),
    (".xla.HloInstructionProto", 103),
    (".xla.HloComputationProto", 9),
    (".xla.HloModuleProto", 24),
    (".xla.HloModuleProto", 25),
}
NEWER_TYPES = {
    ".xla.BlockScalingConfig", ".xla.BlockScalingConfig.TensorBlockScalingConfig",
    ".xla.ShuffleMode", ".xla.ShuffleMode.Rotate", ".xla.X64ConfigProto",
    ".xla.DebugAttributesProto", ".xla.DebugAttributeTableEntryProto",
    ".xla.NamedShardingProto.ReductionOpProto",
    ".xla.DebugAttributesProto.DebugLogModeProto",
}
NEWER_ENUM_VALUES = {".xla.PrecisionConfig.Algorithm": {"ALG_DOT_BF16_BF16_FP8X3",
                                                         "ALG_DOT_BF16_BF16_FP8X4"}}
# Fields newer XLA marked deprecated (the mark is not on the wire).
NEWER_DEPRECATED = {(".xla.OriginalValueProto", 2)}
# jaxlib messages we deliberately leave out (compiler-dump metadata that needs
# google.protobuf.Any and xla/service/metrics.proto).
OMITTED_TYPES = {".xla.HloModuleMetadataProto", ".xla.HloPassMetadata"}


def _read_varint(buf, pos):
    result = shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return result, pos


def _embedded_file_descriptor(blob, file_name):
    """Find the serialized FileDescriptorProto for `file_name` in a binary."""
    name = file_name.encode()
    start_pat = re.compile(re.escape(b"\x0a" + bytes([len(name)]) + name + b"\x12\x03xla"))
    for match in start_pat.finditer(blob):
        pos = match.start()
        # Walk top-level fields while they look like FileDescriptorProto fields.
        try:
            while pos < len(blob):
                key, nxt = _read_varint(blob, pos)
                number, wire = key >> 3, key & 7
                if not 1 <= number <= 14:
                    break
                if wire == 2:
                    length, nxt = _read_varint(blob, nxt)
                    nxt += length
                elif wire == 0:
                    _, nxt = _read_varint(blob, nxt)
                else:
                    break
                if nxt > len(blob):
                    break
                pos = nxt
        except IndexError:
            pass
        fdp = descriptor_pb2.FileDescriptorProto()
        try:
            fdp.ParseFromString(bytes(blob[match.start():pos]))
        except Exception:
            continue
        if fdp.message_type:
            return fdp
    return None


@pytest.fixture(scope="module")
def jaxlib_descriptors():
    import jaxlib

    libdir = pathlib.Path(jaxlib.__file__).parent
    found = {}
    for so in sorted(libdir.glob("*.so"), key=lambda p: -p.stat().st_size):
        with open(so, "rb") as fh:
            try:
                blob = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
            except ValueError:
                continue
            try:
                if blob.find(b"xla/service/hlo.proto") < 0:
                    continue
                for fname in ("xla/xla_data.proto", "xla/service/hlo.proto"):
                    fdp = _embedded_file_descriptor(blob, fname)
                    if fdp is not None:
                        found[fname] = fdp
            finally:
                blob.close()
        if len(found) == 2:
            return found
    pytest.skip("could not locate XLA's proto descriptors inside jaxlib")


def _collect(fdp):
    messages, enums = {}, {}

    def visit(msg, prefix):
        full = prefix + msg.name
        messages[full] = msg
        for enum in msg.enum_type:
            enums[f"{full}.{enum.name}"] = {v.name: v.number for v in enum.value}
        for nested in msg.nested_type:
            visit(nested, full + ".")

    for msg in fdp.message_type:
        visit(msg, f".{fdp.package}.")
    for enum in fdp.enum_type:
        enums[f".{fdp.package}.{enum.name}"] = {v.name: v.number for v in enum.value}
    return messages, enums


def _field_signature(msg, fd):
    oneof = None
    if fd.HasField("oneof_index") and not fd.proto3_optional:
        oneof = msg.oneof_decl[fd.oneof_index].name
    return (fd.name, fd.number, fd.label, fd.type, fd.type_name,
            fd.proto3_optional, oneof, fd.options.deprecated)


def test_schema_matches_jaxlib_descriptors(jaxlib_descriptors):
    theirs_m, theirs_e = {}, {}
    for fdp in jaxlib_descriptors.values():
        m, e = _collect(fdp)
        theirs_m.update(m)
        theirs_e.update(e)
    ours_m, ours_e = {}, {}
    for mod in (xla_data_pb2, hlo_pb2):
        fdp = descriptor_pb2.FileDescriptorProto()
        mod.DESCRIPTOR.CopyToProto(fdp)
        m, e = _collect(fdp)
        ours_m.update(m)
        ours_e.update(e)

    problems = []
    for name, their in theirs_m.items():
        if name in OMITTED_TYPES:
            continue
        our = ours_m.get(name)
        if our is None:
            problems.append(f"missing message {name}")
            continue
        our_fields = {f.number: f for f in our.field}
        for fd in their.field:
            mine = our_fields.get(fd.number)
            if mine is None:
                problems.append(f"{name}: missing field {fd.number} ({fd.name})")
            elif _field_signature(their, fd) != _field_signature(our, mine) and not (
                    (name, fd.number) in NEWER_DEPRECATED
                    and _field_signature(their, fd)[:-1] == _field_signature(our, mine)[:-1]):
                problems.append(
                    f"{name}: field {fd.number} differs: jaxlib={_field_signature(their, fd)} "
                    f"ours={_field_signature(our, mine)}"
                )
        their_numbers = {f.number for f in their.field}
        for fd in our.field:
            if fd.number not in their_numbers and (name, fd.number) not in LEGACY_FIELDS \
                    and (name, fd.number) not in NEWER_FIELDS:
                problems.append(f"{name}: field {fd.number} ({fd.name}) not in jaxlib")
        their_reserved = {n for r in their.reserved_range for n in range(r.start, r.end)}
        our_reserved = {n for r in our.reserved_range for n in range(r.start, r.end)}
        legacy = {n for (m, n) in LEGACY_FIELDS if m == name}
        if their_reserved - our_reserved - legacy:
            problems.append(f"{name}: not reserved here: {sorted(their_reserved - our_reserved - legacy)}")
        legacy_names = {f.name for f in our.field if f.number in legacy}
        missing_names = set(their.reserved_name) - set(our.reserved_name) - legacy_names
        if missing_names:
            problems.append(f"{name}: reserved names not reserved here: {sorted(missing_names)}")
    for name in ours_m:
        if name not in theirs_m and name not in LEGACY_TYPES and name not in NEWER_TYPES:
            problems.append(f"message {name} not in jaxlib")
    for name, values in theirs_e.items():
        ours_values = dict(ours_e.get(name) or {})
        for extra in NEWER_ENUM_VALUES.get(name, ()):
            if extra not in values:
                ours_values.pop(extra, None)
        if ours_values != values:
            problems.append(f"enum {name}: jaxlib={values} ours={ours_e.get(name)}")
    for name in ours_e:
        if name not in theirs_e and name not in LEGACY_TYPES and name not in NEWER_TYPES:
            problems.append(f"enum {name} not in jaxlib")

    assert not problems, "schema drift vs jaxlib:\n" + "\n".join(problems)
