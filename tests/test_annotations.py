"""hlo_spmd.annotations: every sharding-annotation form read into HloSharding.

* unit tests of the Shardy attribute parser and of the Shardy -> HloSharding
  conversion (expected strings are what XLA/JAX print for the same shardings);
* normalize_annotations on hand-built modules (classic, Sharding custom-calls,
  manual regions, Shardy attributes; contradictions and device-count errors);
* JAX programs exported both ways (Shardy default and classic): both normalize to
  the same shardings, equal to jax's own ``_to_xla_hlo_sharding``;
* every checked-in fixture under fixtures/hlo normalizes.
"""
from __future__ import annotations

import glob
import json
import os
import pathlib
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import pytest

# Must happen before jax is imported anywhere in this process.
_flags = os.environ.get("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in _flags:
    os.environ["XLA_FLAGS"] = (_flags + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

from hlo_spmd.annotations import (  # noqa: E402
    AnnotationReport,
    module_device_count,
    normalize_annotations,
    parse_unspecified_dims,
)
from hlo_spmd.annotations import sdy  # noqa: E402
from hlo_spmd.errors import ShardingError  # noqa: E402
from hlo_spmd.ir import Computation, Instruction, Module, PrimitiveType, Shape  # noqa: E402
from hlo_spmd.proto import hlo_pb2  # noqa: E402
from hlo_spmd.sharding import parse_sharding  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures" / "hlo"

MESHES_2x4 = '{mesh = #sdy.mesh<["x"=2, "y"=4]>}'


# =======================================================================================
# Shardy parser
# =======================================================================================
def test_parse_mesh_forms():
    m = sdy.parse_mesh('#sdy.mesh<["x"=2, "y"=4]>')
    assert m.axis_names == ("x", "y") and m.total_size == 8 and m.device_ids == ()
    assert sdy.parse_mesh('<["x"=2, "y"=4]>') == m
    assert sdy.parse_mesh('mesh<["x"=2,"y"=4]>') == m
    d = sdy.parse_mesh('#sdy.mesh<["a"=2, "b"=2], device_ids=[3, 1, 2, 0]>')
    assert d.device_ids == (3, 1, 2, 0)
    mx = sdy.parse_mesh("#sdy.mesh<[], device_ids=[3]>")
    assert mx.is_maximal and mx.total_size == 1
    empty = sdy.parse_mesh("#sdy.mesh<[]>")
    assert empty.axes == () and not empty.is_maximal
    q = sdy.parse_mesh(r'#sdy.mesh<["a \"q\""=2]>')
    assert q.axis_names == ('a "q"',)
    assert str(m) == '#sdy.mesh<["x"=2, "y"=4]>'
    assert str(d) == '#sdy.mesh<["a"=2, "b"=2], device_ids=[3, 1, 2, 0]>'


def test_parse_meshes_dictionary():
    ms = sdy.parse_meshes('{mesh = #sdy.mesh<["x"=2, "y"=4]>, maximal_mesh_0 = '
                          '#sdy.mesh<[], device_ids=[0]>, "other mesh" = #sdy.mesh<["z"=8]>}')
    assert list(ms) == ["mesh", "maximal_mesh_0", "other mesh"]
    assert ms["mesh"].axis_names == ("x", "y")
    assert ms["maximal_mesh_0"].is_maximal
    assert ms["other mesh"].total_size == 8
    assert sdy.parse_meshes("{}") == {}


def test_parse_sharding_full_syntax():
    s = sdy.parse_sharding('#sdy.sharding<@mesh, [{"x"}, {"y", ?}, {}], replicated={"z"}>')
    assert s.mesh == "mesh" and s.rank == 3
    assert s.dims[0].axes == (sdy.AxisRef("x"),) and s.dims[0].is_closed
    assert s.dims[1].axes == (sdy.AxisRef("y"),) and not s.dims[1].is_closed
    assert s.dims[2].axes == () and s.dims[2].is_closed
    assert s.open_dims == (1,)
    assert s.replicated == (sdy.AxisRef("z"),)
    assert s.text == '<@mesh, [{"x"}, {"y", ?}, {}], replicated={"z"}>'
    assert str(s) == '#sdy.sharding<@mesh, [{"x"}, {"y", ?}, {}], replicated={"z"}>'

    p = sdy.parse_sharding('#sdy.sharding<@mesh, [{"a"}p0, {"b", "c"}p12, {?}p3]>')
    assert p.priorities == {0: 0, 1: 12, 2: 3}
    assert p.open_dims == (2,)
    assert str(p) == '#sdy.sharding<@mesh, [{"a"}p0, {"b", "c"}p12, {?}p3]>'

    sub = sdy.parse_sharding('#sdy.sharding<@mesh, [{"x":(1)2, "y"}, {"x":(2)2}]>')
    assert sub.dims[0].axes[0] == sdy.AxisRef("x", 1, 2)
    assert sub.dims[1].axes[0].is_sub_axis
    assert str(sub.dims[0].axes[0]) == '"x":(1)2'

    u = sdy.parse_sharding('#sdy.sharding<@mesh, [{"x"}, {}], unreduced={"y"}, replicated={}>')
    assert u.unreduced == (sdy.AxisRef("y"),) and u.replicated == ()

    inline = sdy.parse_sharding('#sdy.sharding<mesh<["a"=2, "b"=2]>, [{"a"}, {}]>')
    assert isinstance(inline.mesh, sdy.SdyMesh) and inline.mesh.total_size == 4

    scalar = sdy.parse_sharding("#sdy.sharding<@mesh, []>")
    assert scalar.rank == 0
    quoted_ref = sdy.parse_sharding('#sdy.sharding<@"my mesh", [{}]>')
    assert quoted_ref.mesh == "my mesh"


def test_parse_sharding_per_value_and_manual_axes():
    vals = sdy.parse_sharding_per_value(
        '#sdy.sharding_per_value<[<@mesh, [{"x"}, {"y"}]>, <@mesh, [{?}, {"y", ?}]>]>')
    assert len(vals) == 2 and vals[1].open_dims == (0, 1)
    assert sdy.parse_sharding_per_value("#sdy.sharding_per_value<[]>") == ()
    both, per_value = sdy.parse_shardings('#sdy.sharding_per_value<[<@mesh, []>]>')
    assert per_value and len(both) == 1
    single, per_value = sdy.parse_shardings('#sdy.sharding<@mesh, [{}]>')
    assert not per_value and single[0].rank == 1
    assert sdy.parse_manual_axes('#sdy<manual_axes{"x", "y"}>') == ("x", "y")
    assert sdy.parse_manual_axes("#sdy<manual_axes{}>") == ()


@pytest.mark.parametrize("text, message", [
    ('#sdy.sharding<@mesh, [{"x"}, {"y"]>', "expected ',' or '}'"),
    ('#sdy.sharding<@mesh, [{"x", ?, "y"}]>', "'?' must be the last"),
    ('#sdy.sharding<@mesh, [{"x"}p01]>', "leading zeros"),
    ('#sdy.sharding<@mesh, [{"x"}q1]>', "priority in format 'p<number>'"),
    ('#sdy.sharding<@mesh, [{x}]>', "expected a quoted axis name or '?'"),
    ('#sdy.sharding<@mesh, [{"x"}], bogus={"y"}>', "expected 'replicated' or 'unreduced'"),
    ('#sdy.sharding<@mesh, [{"x"}], replicated={"y"}, replicated={"z"}>', "given twice"),
    ('#sdy.sharding<@mesh, [{"x":(1}]>', "expected ')'"),
    ('#sdy.sharding<@mesh, [{"x"}]> trailing', "unexpected trailing 'trailing'"),
    ('#sdy.sharding<@mesh, [{"x}]>', "unterminated string"),
    ('#sdy.sharding<mesh, [{}]>', "expected '<'"),
    ('#sdy.sharding<[{"x"}]>', "expected a mesh reference"),
    ('#sdy.foo<@mesh, []>', "expected '#sdy.sharding<...>'"),
    ("#sdy.sharding<@mesh, [{}]", "expected '>', got end of text"),
    ("", "expected '<', got end of text"),
])
def test_parse_sharding_errors(text, message):
    with pytest.raises(ShardingError) as e:
        sdy.parse_sharding(text, where="main: instruction p.1")
    msg = str(e.value)
    assert message in msg
    assert repr(text) in msg                   # the bad text is quoted
    assert "column" in msg
    assert e.value.where == "main: instruction p.1"


@pytest.mark.parametrize("text, message", [
    ('#sdy.mesh<["x"=0]>', "must be positive"),
    ('#sdy.mesh<["x"=2, "x"=2]>', "duplicate mesh axis"),
    ('#sdy.mesh<["x"=2], device_ids=[0, 0]>', "permutation"),
    ('#sdy.mesh<["x"=2], device_ids=[0]>', "mesh has 2 devices but device_ids lists 1"),
    ("#sdy.mesh<[], device_ids=[0, 1]>", "exactly one device id"),
    ('#sdy.mesh<["x"=2], devices=[0, 1]>', "expected 'device_ids'"),
    ('#sdy.mesh<[x=2]>', "expected a quoted axis name"),
])
def test_parse_mesh_errors(text, message):
    with pytest.raises(ShardingError) as e:
        sdy.parse_mesh(text)
    assert message in str(e.value) and repr(text) in str(e.value)


def test_parse_other_errors():
    with pytest.raises(ShardingError, match="defined twice"):
        sdy.parse_meshes('{m = #sdy.mesh<["x"=2]>, m = #sdy.mesh<["x"=2]>}')
    with pytest.raises(ShardingError, match="listed twice"):
        sdy.parse_manual_axes('#sdy<manual_axes{"x", "x"}>')
    with pytest.raises(ShardingError, match="expected 'manual_axes'"):
        sdy.parse_manual_axes('#sdy<manual{"x"}>')
    with pytest.raises(ShardingError, match="expected '#sdy.sharding_per_value"):
        sdy.parse_sharding_per_value('#sdy.sharding<@mesh, []>')


# =======================================================================================
# Shardy -> HloSharding
# =======================================================================================
_M = {
    "mesh": '#sdy.mesh<["x"=2, "y"=4]>',
    "m3": '#sdy.mesh<["a"=2, "b"=2, "c"=2]>',
    "m8": '#sdy.mesh<["x"=8]>',
    "m4": '#sdy.mesh<["x"=4]>',
    "perm": '#sdy.mesh<["x"=2, "y"=4], device_ids=[0, 2, 4, 6, 1, 3, 5, 7]>',
    "maximal_mesh_3": "#sdy.mesh<[], device_ids=[3]>",
    "empty": "#sdy.mesh<[]>",
    "big": '#sdy.mesh<["x"=4, "y"=4]>',
}
MESHES = {k: sdy.parse_mesh(v) for k, v in _M.items()}


# Expected strings: what JAX 0.10.2 writes in the classic field for the same sharding
# (first block taken from real exports), or XLA's Shardy export semantics.
@pytest.mark.parametrize("text, manual, expected", [
    ('<@mesh, [{"x"}, {"y"}]>', (), "{devices=[2,4]<=[8]}"),
    ('<@mesh, [{"y"}, {"x"}]>', (), "{devices=[4,2]<=[2,4]T(1,0)}"),
    ('<@mesh, [{"x"}, {}]>', (), "{devices=[2,1,4]<=[8] last_tile_dim_replicate}"),
    ('<@mesh, [{}, {"y"}]>', (), "{devices=[1,4,2]<=[2,4]T(1,0) last_tile_dim_replicate}"),
    ('<@mesh, [{"x", "y"}, {}]>', (), "{devices=[8,1]<=[8]}"),
    ('<@mesh, [{"y", "x"}, {}]>', (), "{devices=[8,1]<=[2,4]T(1,0)}"),
    ('<@mesh, [{}, {}]>', (), "{replicated}"),
    ("<@mesh, []>", (), "{replicated}"),
    ('<@mesh, [{?}, {?}]>', (), "{replicated}"),
    ('<@mesh, [{?}, {"x"}]>', (), "{devices=[1,2,4]<=[8] last_tile_dim_replicate}"),
    ('<@m3, [{"a"}, {"b", "c"}]>', (), "{devices=[2,4]<=[8]}"),
    ('<@m3, [{"c"}, {"a"}, {}]>', (), "{devices=[2,2,1,2]<=[4,2]T(1,0) last_tile_dim_replicate}"),
    ('<@m3, [{}, {"b"}]>', (), "{devices=[1,2,4]<=[2,2,2]T(1,0,2) last_tile_dim_replicate}"),
    ('<@m3, [{"b"}, {}, {}]>', (), "{devices=[2,1,1,4]<=[2,2,2]T(1,0,2) last_tile_dim_replicate}"),
    ('<@m8, [{}, {"x"}]>', (), "{devices=[1,8]<=[8]}"),
    ('<@m4, [{"x"}, {}]>', (), "{devices=[4,1]<=[4]}"),
    ('<@mesh, [{"x"}, {}], unreduced={"y"}>', (),
     "{devices=[2,1,4]<=[8] last_tile_dims={unreduced}}"),
    # inside manual computations (JAX classic export of the same shard_map)
    ("<@mesh, []>", ("y",), "{devices=[4,2]<=[2,4]T(1,0) last_tile_dims={manual, replicated}}"),
    ('<@mesh, [{"x"}, {}]>', ("y",), "{devices=[2,1,4]<=[8] last_tile_dims={manual}}"),
    ('<@mesh, [{?}, {?}]>', ("y",),
     "{devices=[1,1,4,2]<=[2,4]T(1,0) last_tile_dims={manual, replicated}}"),
    ('<@mesh, [{}, {}]>', ("x", "y"), "{manual}"),
    # explicit replicated axes change nothing
    ('<@mesh, [{"x"}, {}], replicated={"y"}>', (),
     "{devices=[2,1,4]<=[8] last_tile_dim_replicate}"),
    # maximal / empty meshes
    ("<@maximal_mesh_3, []>", (), "{maximal device=3}"),
    ("<@maximal_mesh_3, []>", ("y",), "{maximal device=3}"),
    ("<@empty, [{}, {}]>", (), "{replicated}"),
    # inline mesh
    ('<mesh<["x"=2, "y"=4]>, [{"x"}, {"y"}]>', (), "{devices=[2,4]<=[8]}"),
    # device_ids give an explicit tile assignment
    ('<@perm, [{"x"}, {"y"}]>', (), "{devices=[2,4]0,2,4,6,1,3,5,7}"),
    ('<@perm, [{"x"}, {}]>', (), "{devices=[2,1,4]0,2,4,6,1,3,5,7 last_tile_dim_replicate}"),
])
def test_to_hlo_sharding(text, manual, expected):
    s = sdy.parse_sharding_per_value(f"#sdy.sharding_per_value<[{text}]>")[0]
    h = sdy.to_hlo_sharding(s, MESHES, manual)
    assert str(h) == expected
    assert h == parse_sharding(expected)


def _mesh_coords(mesh: sdy.SdyMesh) -> dict[int, dict[str, int]]:
    """device id -> {axis: coordinate} (row-major over the mesh, device_ids honoured)."""
    sizes = [a.size for a in mesh.axes]
    ids = list(mesh.device_ids) or list(range(mesh.total_size))
    out = {}
    for pos, dev in enumerate(ids):
        coords = np.unravel_index(pos, sizes)
        out[dev] = {a.name: int(c) for a, c in zip(mesh.axes, coords)}
    return out


def _expected_tile(sh: sdy.TensorSharding, mesh: sdy.SdyMesh, coords: dict[str, int]) -> tuple:
    """Independent model: tile index of a device per dim from its mesh coordinates."""
    idx = []
    for d in sh.dims:
        t = 0
        for ref in d.axes:
            pre, size = ref.extent(mesh)
            full = mesh.axis_size(ref.name)
            digit = (coords[ref.name] // (full // (pre * size))) % size
            t = t * size + digit
        idx.append(t)
    return tuple(idx)


@pytest.mark.parametrize("mesh_name, text", [
    ("mesh", '<@mesh, [{"y":(1)2}, {"y":(2)2, "x"}]>'),
    ("mesh", '<@mesh, [{"y":(2)2}, {"x", "y":(1)2}]>'),
    ("big", '<@big, [{"y":(2)2, "x":(1)2}, {"x":(2)2}]>'),
    ("big", '<@big, [{"x":(2)2}, {"y"}, {"x":(1)2}]>'),
    ("perm", '<@perm, [{"y"}, {"x"}]>'),
    ("perm", '<@perm, [{"y":(2)2}, {}]>'),
    ("m3", '<@m3, [{"c", "a"}, {}]>'),
])
def test_to_hlo_sharding_semantics(mesh_name, text):
    """Every device holds the tile its mesh coordinates select (sub-axes, device_ids)."""
    mesh = MESHES[mesh_name]
    s = sdy.parse_sharding_per_value(f"#sdy.sharding_per_value<[{text}]>")[0]
    h = sdy.to_hlo_sharding(s, MESHES)
    assert h.is_tiled
    arr = h.tile_assignment.array()
    rank = s.rank
    coords = _mesh_coords(mesh)
    seen = set()
    for pos in np.ndindex(arr.shape):
        dev = int(arr[pos])
        seen.add(dev)
        assert tuple(pos[:rank]) == _expected_tile(s, mesh, coords[dev]), (pos, dev)
    assert seen == set(range(mesh.total_size))


@pytest.mark.parametrize("text, manual, message", [
    ('<@nope, [{"x"}]>', (), "refers to unknown mesh @nope"),
    ('<@mesh, [{"z"}]>', (), 'uses axis "z" which is not in mesh'),
    ('<@mesh, [{"x"}, {"x"}]>', (), 'uses axis "x" twice'),
    ('<@mesh, [{"y":(1)2}, {"y"}]>', (), "overlapping"),
    ('<@mesh, [{"y":(1)3}]>', (), "does not fit axis"),
    ('<@mesh, [{"y":(2)4}]>', (), "does not fit axis"),
    ('<@mesh, [{"x"}], replicated={"x"}>', (), 'uses axis "x" twice'),
    ('<@mesh, [{"y"}, {}]>', ("y",), "which is manual here"),
    ('<@mesh, [{}, {}]>', ("q",), 'manual axis "q" is not in mesh'),
])
def test_to_hlo_sharding_errors(text, manual, message):
    s = sdy.parse_sharding_per_value(f"#sdy.sharding_per_value<[{text}]>")[0]
    with pytest.raises(ShardingError) as e:
        sdy.to_hlo_sharding(s, MESHES, manual, where="computation main, instruction a.1")
    assert message in str(e.value)
    assert e.value.where == "computation main, instruction a.1"


def test_to_hlo_sharding_rank_check():
    s = sdy.parse_sharding('#sdy.sharding<@mesh, [{"x"}, {}]>')
    with pytest.raises(ShardingError, match="has 2 dimension shardings but the value has rank 3"):
        sdy.to_hlo_sharding(s, MESHES, rank=3)


@pytest.mark.parametrize("config, dims", [
    ("", ()), ("{}", ()), ("unspecified_dims=[0,1]", (0, 1)), (b"unspecified_dims=[1]", (1,)),
    (" unspecified_dims=[ 2 , 0 ] ", (2, 0)), ("unspecified_dims=[]", ()),
])
def test_parse_unspecified_dims(config, dims):
    assert parse_unspecified_dims(config) == dims


@pytest.mark.parametrize("config, message", [
    ("foo=[1]", "unknown attribute 'foo'"),
    ("unspecified_dims=0", "expected unspecified_dims=[d0,d1,...]"),
    ("[0,1]", "cannot parse sharding op attributes"),
])
def test_parse_unspecified_dims_errors(config, message):
    with pytest.raises(ShardingError, match=message.replace("[", r"\[").replace("]", r"\]")
                       .replace(".", r"\.")):
        parse_unspecified_dims(config)


# =======================================================================================
# normalize_annotations on hand-built modules
# =======================================================================================
class _Builder:
    """Tiny module builder: one entry computation, optional extra computations."""

    def __init__(self, meshes: str | None = None, module_attrs: dict | None = None) -> None:
        self.m = Module("test")
        self.m.attrs = hlo_pb2.HloModuleProto()
        if meshes is not None:
            self.m.attrs.frontend_attributes.map["xla.sdy.meshes"] = meshes
        for k, v in (module_attrs or {}).items():
            self.m.attrs.frontend_attributes.map[k] = v
        self.c = self.computation("main")
        self.m.entry = self.c

    def computation(self, name: str) -> Computation:
        c = Computation(name)
        self.m.add_computation(c)
        return c

    def inst(self, opcode: str, shape: Shape, operands=(), name: str = "", sharding=None,
             sdy_text: str | None = None, target: str | None = None, backend_config=None,
             fa: dict | None = None, comp: Computation | None = None, called=(),
             **attrs: Any) -> Instruction:
        p = hlo_pb2.HloInstructionProto(**attrs)
        if target is not None:
            p.custom_call_target = target
        if backend_config is not None:
            p.backend_config = backend_config.encode()
        if sdy_text is not None:
            p.frontend_attributes.map["xla.sdy.sharding"] = sdy_text
        for k, v in (fa or {}).items():
            p.frontend_attributes.map[k] = v
        i = Instruction(opcode, shape, operands, name, p, called_computations=called)
        if sharding is not None:
            i.sharding = parse_sharding(sharding) if isinstance(sharding, str) else sharding
        return (comp if comp is not None else self.c).add(i, name or opcode)

    def param(self, n: int, dims, comp: Computation | None = None, **kw) -> Instruction:
        return self.inst("parameter", _f32(dims), (), parameter_number=n, comp=comp, **kw)

    def cc(self, target: str, operands, dims_or_shape, **kw) -> Instruction:
        shape = dims_or_shape if isinstance(dims_or_shape, Shape) else _f32(dims_or_shape)
        return self.inst("custom-call", shape, list(operands), target=target, **kw)

    def root(self, inst: Instruction, comp: Computation | None = None) -> Module:
        (comp if comp is not None else self.c).root = inst
        return self.m


def _f32(dims) -> Shape:
    return Shape.array(PrimitiveType.F32, dims)


def test_classic_fields_and_sharding_custom_call():
    b = _Builder()
    p = b.param(0, [8, 16], name="p", sharding="{devices=[2,4]<=[8]}")
    c = b.cc("Sharding", [p], [8, 16], name="c",
             sharding="{devices=[1,2,4]<=[8] last_tile_dim_replicate}",
             backend_config="unspecified_dims=[0]")
    e = b.inst("exponential", _f32([8, 16]), [c], name="e")
    m = b.root(e)
    rep = normalize_annotations(m)
    assert isinstance(rep, AnnotationReport)
    assert rep["p"].origin == "sharding-field"
    assert rep["c"].origin == "sharding-custom-call"
    assert rep["c"].unspecified_dims == (0,)
    assert rep.unspecified_dims("c") == (0,)
    assert "e" not in rep
    assert rep.user_annotated == {"p", "c"}
    assert rep.device_count == 8 and module_device_count(m) == 8
    assert not rep.has_shardy
    assert e.sharding is None


@pytest.mark.parametrize("config, message", [
    ("unspecified_dims=[2]", "dim 2 out of range for rank 2"),
    ("unspecified_dims=[0,0]", "repeated dims"),
    ("bogus=[0]", "unknown attribute 'bogus'"),
])
def test_sharding_custom_call_bad_unspecified_dims(config, message):
    b = _Builder()
    p = b.param(0, [8, 16], name="p")
    c = b.cc("Sharding", [p], [8, 16], name="c", sharding="{replicated}", backend_config=config)
    with pytest.raises(ShardingError) as e:
        normalize_annotations(b.root(c))
    assert message in str(e.value) and "instruction c" in str(e.value)


def test_sharding_custom_call_without_sharding():
    b = _Builder()
    p = b.param(0, [8], name="p")
    c = b.cc("Sharding", [p], [8], name="c")
    with pytest.raises(ShardingError, match="Sharding custom-call has no sharding"):
        normalize_annotations(b.root(c))


def test_sdy_only_sets_sharding_and_open_dims():
    b = _Builder(MESHES_2x4)
    p = b.param(0, [8, 16], name="p", sdy_text='#sdy.sharding<@mesh, [{"x"}, {"y"}]>')
    c = b.cc("Sharding", [p], [8, 16], name="c",
             sdy_text='#sdy.sharding_per_value<[<@mesh, [{?}, {"x"}p1]>]>')
    q = b.param(1, [], name="q", sdy_text="#sdy.sharding<@mesh, []>")
    t = b.inst("tuple", Shape.tuple_of([_f32([8, 16]), _f32([])]), [c, q], name="t")
    rep = normalize_annotations(b.root(t))
    assert str(p.sharding) == "{devices=[2,4]<=[8]}"
    assert str(c.sharding) == "{devices=[1,2,4]<=[8] last_tile_dim_replicate}"
    assert str(q.sharding) == "{replicated}"
    assert rep["p"].origin == "sdy" and rep["p"].sdy_text.startswith("#sdy.sharding<@mesh")
    assert rep["c"].origin == "sharding-custom-call" and rep["c"].unspecified_dims == (0,)
    assert rep.has_shardy and rep.device_count == 8
    assert set(rep.meshes) == {"mesh"}
    assert t.sharding is None


def test_sdy_and_classic_agree_keeps_classic_object():
    b = _Builder(MESHES_2x4)
    classic = parse_sharding("{devices=[2,1,4]<=[8] last_tile_dim_replicate}")
    p = b.param(0, [8, 16], name="p", sharding=classic,
                sdy_text='#sdy.sharding<@mesh, [{"x"}, {}]>')
    normalize_annotations(b.root(p))
    assert p.sharding is classic


def test_sdy_contradicts_classic():
    b = _Builder(MESHES_2x4)
    p = b.param(0, [8, 16], name="p.1", sharding="{devices=[2,4]<=[8]}",
                sdy_text='#sdy.sharding<@mesh, [{"y"}, {"x"}]>')
    with pytest.raises(ShardingError) as e:
        normalize_annotations(b.root(p), "m.pb")
    msg = str(e.value)
    assert "instruction p.1" in msg and "m.pb" in msg
    assert "{devices=[2,4]<=[8]}" in msg and '[{"y"}, {"x"}]' in msg
    assert "contradicts" in msg


def test_sdy_parse_error_names_instruction():
    b = _Builder(MESHES_2x4)
    p = b.param(0, [8, 16], name="p.7", sdy_text='#sdy.sharding<@mesh, [{"x"}, {"y"]>')
    with pytest.raises(ShardingError) as e:
        normalize_annotations(b.root(p))
    assert "instruction p.7" in str(e.value)
    assert '[{"x"}, {"y"]' in str(e.value)
    assert "xla.sdy.sharding" in str(e.value)


def test_sdy_unknown_mesh_and_bad_meshes_attr():
    b = _Builder()
    p = b.param(0, [8], name="p", sdy_text='#sdy.sharding<@mesh, [{"x"}]>')
    with pytest.raises(ShardingError, match="unknown mesh @mesh.*no xla.sdy.meshes"):
        normalize_annotations(b.root(p))
    b = _Builder('{mesh = #sdy.mesh<["x"=2>}')
    p = b.param(0, [8], name="p")
    with pytest.raises(ShardingError) as e:
        normalize_annotations(b.root(p))
    assert "xla.sdy.meshes" in str(e.value) and "module test" in str(e.value)


def test_sdy_rank_mismatch():
    b = _Builder(MESHES_2x4)
    p = b.param(0, [8, 16, 2], name="p", sdy_text='#sdy.sharding<@mesh, [{"x"}, {}]>')
    with pytest.raises(ShardingError, match="has 2 dimension shardings but the value has rank 3"):
        normalize_annotations(b.root(p))


def test_func_result_sharding_sets_results():
    b = _Builder(MESHES_2x4)
    p = b.param(0, [8, 16], name="p", sdy_text='#sdy.sharding<@mesh, [{"x"}, {"y"}]>')
    e = b.inst("exponential", _f32([8, 16]), [p], name="e")
    r0 = b.cc("xla.sdy.FuncResultSharding", [e], [8, 16], name="r0",
              sdy_text='#sdy.sharding_per_value<[<@mesh, [{"y"}, {}]>]>')
    r1 = b.cc("xla.sdy.FuncResultSharding", [p], [8, 16], name="r1",
              sdy_text='#sdy.sharding_per_value<[<@mesh, [{}, {?}]>]>')
    t = b.inst("tuple", Shape.tuple_of([_f32([8, 16])] * 2), [r0, r1], name="t")
    rep = normalize_annotations(b.root(t))
    assert rep["r0"].origin == "sdy-func-result" and rep["r0"].result_indices == ((0,),)
    assert rep["r1"].result_indices == ((1,),) and rep["r1"].unspecified_dims == (1,)
    assert str(r0.sharding) == "{devices=[4,1,2]<=[2,4]T(1,0) last_tile_dim_replicate}"
    assert str(t.sharding) == \
        "{{devices=[4,1,2]<=[2,4]T(1,0) last_tile_dim_replicate}, {replicated}}"
    assert rep["t"].origin == "sdy-func-result"
    assert {"p", "r0", "r1", "t"} <= rep.user_annotated


def test_func_result_contradicts_root():
    b = _Builder(MESHES_2x4)
    p = b.param(0, [8, 16], name="p")
    r = b.cc("xla.sdy.FuncResultSharding", [p], [8, 16], name="r",
             sdy_text='#sdy.sharding_per_value<[<@mesh, [{"y"}, {}]>]>')
    t = b.inst("tuple", Shape.tuple_of([_f32([8, 16])]), [r], name="t")
    g = b.inst("get-tuple-element", _f32([8, 16]), [t], name="g", tuple_index=0,
               sharding="{devices=[2,4]<=[8]}")
    with pytest.raises(ShardingError) as e:
        normalize_annotations(b.root(g))
    assert "instruction g" in str(e.value) and "xla.sdy.FuncResultSharding r" in str(e.value)


def test_device_count_mismatch_classic():
    b = _Builder()
    p = b.param(0, [8, 16], name="p", sharding="{devices=[2,4]<=[8]}")
    q = b.param(1, [8, 16], name="q.3", sharding="{devices=[4,1]<=[4]}")
    a = b.inst("add", _f32([8, 16]), [p, q], name="a")
    m = b.root(a)
    with pytest.raises(ShardingError) as e:
        module_device_count(m)
    assert e.value.message == "sharding uses 4 devices but the module uses 8"
    assert "instruction q.3" in e.value.where
    with pytest.raises(ShardingError, match="sharding uses 4 devices but the module uses 8"):
        normalize_annotations(m)


def test_device_count_mismatch_sdy_meshes():
    b = _Builder('{mesh = #sdy.mesh<["x"=2, "y"=4]>, small = #sdy.mesh<["z"=4]>}')
    p = b.param(0, [8, 16], name="p", sdy_text='#sdy.sharding<@mesh, [{"x"}, {"y"}]>')
    q = b.param(1, [8, 16], name="q", sdy_text='#sdy.sharding<@small, [{"z"}, {}]>')
    a = b.inst("add", _f32([8, 16]), [p, q], name="a")
    with pytest.raises(ShardingError) as e:
        normalize_annotations(b.root(a))
    assert e.value.message == "sharding uses 4 devices but the module uses 8"
    assert "instruction q" in e.value.where
    # A replicated sharding on a 4-device mesh is caught through the mesh.
    b = _Builder('{mesh = #sdy.mesh<["x"=2, "y"=4]>, small = #sdy.mesh<["z"=4]>}')
    p = b.param(0, [8, 16], name="p", sdy_text='#sdy.sharding<@mesh, [{"x"}, {"y"}]>')
    q = b.param(1, [8, 16], name="q", sdy_text='#sdy.sharding<@small, [{}, {}]>')
    a = b.inst("add", _f32([8, 16]), [p, q], name="a")
    with pytest.raises(ShardingError, match="mesh @small has 4 devices but the module uses 8"):
        normalize_annotations(b.root(a))


def test_sharding_shape_validation():
    b = _Builder()
    p = b.param(0, [8, 16], name="p", sharding="{devices=[2,2,2]<=[8]}")
    with pytest.raises(ShardingError) as e:
        normalize_annotations(b.root(p))
    assert "rank 2" in str(e.value) and "instruction p" in str(e.value)
    b = _Builder()
    p = b.param(0, [8], name="p", sharding="{devices=[8]<=[8]}")
    q = b.param(1, [8], name="q", sharding="{maximal device=9}")
    a = b.inst("add", _f32([8]), [p, q], name="a")
    with pytest.raises(ShardingError, match="device 9 but the module uses 8"):
        normalize_annotations(b.root(a))


def test_tuple_args_and_results_shardings():
    b = _Builder(MESHES_2x4, {
        "xla.sdy.tuple_args_shardings":
            '#sdy.sharding_per_value<[<@mesh, [{"x"}, {}]>, <@mesh, [{}]>]>',
        "xla.sdy.tuple_results_shardings": '#sdy.sharding_per_value<[<@mesh, [{"y"}, {}]>]>',
    })
    p = b.param(0, [8, 16], name="p")
    q = b.param(1, [4], name="q")
    a = b.inst("exponential", _f32([8, 16]), [p], name="a")
    rep = normalize_annotations(b.root(a))
    assert str(p.sharding) == "{devices=[2,1,4]<=[8] last_tile_dim_replicate}"
    assert str(q.sharding) == "{replicated}"
    assert str(a.sharding) == "{devices=[4,1,2]<=[2,4]T(1,0) last_tile_dim_replicate}"
    assert rep["a"].origin == "sdy"


def _classic_manual_module(manual_sharding: str = "{manual}") -> tuple[Module, dict]:
    b = _Builder()
    x = b.param(0, [16, 8], name="x", sharding="{devices=[4,1]<=[4]}")
    s = b.cc("Sharding", [x], [16, 8], name="s", sharding="{devices=[4,1]<=[4]}")
    f2s = b.cc("SPMDFullToShardShape", [s], [4, 8], name="local", sharding=manual_sharding)
    two = b.inst("constant", _f32([]), [], name="two")
    bc = b.inst("broadcast", _f32([4, 8]), [two], name="bc", sharding="{manual}")
    mul = b.inst("multiply", _f32([4, 8]), [f2s, bc], name="mul", sharding="{manual}")
    s2 = b.cc("Sharding", [mul], [4, 8], name="s2", sharding="{manual}")
    s2f = b.cc("SPMDShardToFullShape", [s2], [16, 8], name="full",
               sharding="{devices=[4,1]<=[4]}")
    return b.root(s2f), dict(x=x, s=s, f2s=f2s, mul=mul, s2f=s2f)


def test_classic_manual_region():
    m, i = _classic_manual_module()
    rep = normalize_annotations(m)
    assert rep.device_count == 4
    (region,) = rep.manual_regions
    assert region.form == "classic" and region.computation == "main"
    assert set(region.instructions) == {"two", "bc", "mul", "s2"}
    (enter,) = region.entries
    (exit_,) = region.exits
    assert enter.name == "local" and enter.kind == "enter"
    assert enter.full_shape.dims == (16, 8) and enter.shard_shape.dims == (4, 8)
    assert str(enter.full_sharding) == "{devices=[4,1]<=[4]}" and enter.manual_sharding.is_manual
    assert exit_.name == "full" and exit_.full_shape.dims == (16, 8)
    assert exit_.manual_sharding.is_manual
    assert rep["local"].origin == "manual-boundary" and rep["full"].origin == "manual-boundary"
    assert region.boundary_names == ("local", "full")


def test_classic_manual_region_needs_manual_sharding():
    m, _ = _classic_manual_module("{devices=[4,1]<=[4]}")
    with pytest.raises(ShardingError, match="SPMDFullToShardShape result sharding .* not manual"):
        normalize_annotations(m)


def _sdy_manual_module(local_dims=(4, 4), axes='{"x", "y"}', body_sharding=None):
    b = _Builder(MESHES_2x4)
    body = b.computation("xla.sdy.manual_computation_body.1")
    bp = b.param(0, list(local_dims), comp=body, name="bp")
    last = b.inst("exponential", _f32(list(local_dims)), [bp], name="bexp", comp=body)
    if body_sharding is not None:
        last = b.inst("custom-call", _f32(list(local_dims)), [last], name="bsc", comp=body,
                      target="Sharding", sdy_text=body_sharding)
    body.root = last
    b.m.computations.remove(body)
    b.m.computations.insert(0, body)
    x = b.param(0, [8, 16], name="x", sdy_text='#sdy.sharding<@mesh, [{"x"}, {"y"}]>')
    g2l = b.cc("xla.sdy.GlobalToLocalShape", [x], list(local_dims), name="g2l", fa={
        "xla.sdy.manual_axes": f"#sdy<manual_axes{axes}>",
        "xla.sdy.in_shardings": '#sdy.sharding_per_value<[<@mesh, [{"x", ?}, {"y"}]>]>'})
    call = b.inst("call", _f32(list(local_dims)), [g2l], name="call", called=[body],
                  fa={"inlineable": "false"})
    l2g = b.cc("xla.sdy.LocalToGlobalShape", [call], [8, 16], name="l2g", fa={
        "xla.sdy.manual_axes": f"#sdy<manual_axes{axes}>",
        "xla.sdy.out_shardings": '#sdy.sharding_per_value<[<@mesh, [{"x"}, {"y"}]>]>'})
    return b.root(l2g)


def test_sdy_manual_region():
    m = _sdy_manual_module()
    rep = normalize_annotations(m)
    (region,) = rep.manual_regions
    assert region.form == "sdy" and region.manual_axes == ("x", "y")
    assert region.instructions == ("call",)
    assert region.body_computations == ("xla.sdy.manual_computation_body.1",)
    (enter,) = region.entries
    (exit_,) = region.exits
    assert str(enter.full_sharding) == "{devices=[2,4]<=[8]}"
    assert enter.manual_sharding.is_manual and enter.unspecified_dims == (0,)
    assert enter.full_shape.dims == (8, 16) and enter.shard_shape.dims == (4, 4)
    assert str(exit_.full_sharding) == "{devices=[2,4]<=[8]}"
    g2l, l2g = m.find("g2l"), m.find("l2g")
    assert g2l.sharding.is_manual
    assert str(l2g.sharding) == "{devices=[2,4]<=[8]}"
    assert rep["g2l"].origin == "manual-boundary" and rep["g2l"].unspecified_dims == (0,)
    assert {"g2l", "l2g", "x"} <= rep.user_annotated


def test_sdy_partial_manual_region_body_context():
    m = _sdy_manual_module(local_dims=(8, 4), axes='{"y"}',
                           body_sharding='#sdy.sharding_per_value<[<@mesh, [{"x"}, {?}]>]>')
    rep = normalize_annotations(m)
    (region,) = rep.manual_regions
    assert region.manual_axes == ("y",) and region.all_manual_axes == ("y",)
    # x is auto inside: the in-sharding minus the manual axis, plus the manual subgroup
    assert str(m.find("g2l").sharding) == \
        "{devices=[2,1,4]<=[8] last_tile_dims={manual}}"
    bsc = rep["bsc"]
    assert bsc.manual_axes == ("y",)
    assert str(bsc.sharding) == "{devices=[2,1,4]<=[8] last_tile_dims={manual}}"
    assert bsc.unspecified_dims == (1,)


def test_sdy_manual_region_errors():
    with pytest.raises(ShardingError, match="dim 1 has global size 16 and local size 8"):
        normalize_annotations(_sdy_manual_module(local_dims=(4, 8)))
    with pytest.raises(ShardingError, match="which is manual here"):
        normalize_annotations(_sdy_manual_module(
            body_sharding='#sdy.sharding_per_value<[<@mesh, [{"x"}, {}]>]>'))


# =======================================================================================
# JAX exports, both forms
# =======================================================================================
N_DEVICES = 8


@pytest.fixture(scope="module")
def jx():
    jax = pytest.importorskip("jax")
    if len(jax.devices()) < N_DEVICES:
        pytest.skip(f"needs {N_DEVICES} host devices (jax was initialised before this module "
                    "could set XLA_FLAGS)")
    return jax


@dataclass
class Case:
    name: str
    fn: Callable
    args: list
    in_shardings: Any
    out_shardings: Any = None
    # Expected top-level Sharding custom-calls, in program order of the entry computation:
    # (NamedSharding, unspecified dims).
    constraints: list = field(default_factory=list)
    set_mesh: Any = None
    # False: the expected constraints are the last ones (JAX adds more in explicit mode).
    constraints_exact: bool = True


def _mesh(jax, shape, names, axis_type=None):
    from jax.sharding import AxisType, Mesh
    n = int(np.prod(shape))
    at = axis_type or AxisType.Auto
    return Mesh(np.array(jax.devices()[:n]).reshape(shape), names, axis_types=(at,) * len(names))


def _cases(jax) -> dict[str, Case]:
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import AxisType, NamedSharding
    from jax.sharding import PartitionSpec as P

    m24 = _mesh(jax, (2, 4), ("x", "y"))
    m222 = _mesh(jax, (2, 2, 2), ("a", "b", "c"))
    m8 = _mesh(jax, (8,), ("x",))
    m4 = _mesh(jax, (4,), ("x",))
    me = _mesh(jax, (2, 4), ("x", "y"), AxisType.Explicit)

    def ns(m, *spec):
        return NamedSharding(m, P(*spec))

    a = jnp.zeros((8, 16), jnp.float32)
    cases: list[Case] = []

    cases.append(Case("basic_2d", lambda x: x * 2, [a], ns(m24, "x", "y"), ns(m24, "y", "x")))
    cases.append(Case("partial_replication", lambda x: x + 1, [a], ns(m24, "x", None),
                      ns(m24, None, "y")))
    cases.append(Case("combined_axes", lambda x: x + 1, [a], ns(m24, ("x", "y")),
                      ns(m24, ("y", "x"))))
    cases.append(Case("replicated_in", lambda x: x + 1, [a], ns(m24), ns(m24, "x")))
    cases.append(Case("mesh_3d", lambda x, y: (x + 1, y * 2),
                      [a, jnp.zeros((4, 4, 2), jnp.float32)],
                      (ns(m222, "a", ("b", "c")), ns(m222, "c", "a", None)),
                      (ns(m222, None, "b"), ns(m222, "b"))))
    cases.append(Case("mesh_1d_transpose", lambda x: x.T, [a], ns(m8, "x"), ns(m8, None, "x")))
    cases.append(Case("four_devices", lambda x: x + 1, [a], ns(m4, "x"), ns(m4, None, "x")))
    cases.append(Case("pytree_scalar", lambda d: {"a": d["a"] * 2, "b": d["b"] + 1},
                      [{"a": a, "b": jnp.float32(1)}], ({"a": ns(m24, "x"), "b": ns(m24)},),
                      {"a": ns(m24, None, "y"), "b": ns(m24)}))

    def wsc(x):
        y = lax.with_sharding_constraint(x * 2, ns(m24, "y", None))
        z = lax.with_sharding_constraint(y + 1, ns(m24, P.UNCONSTRAINED, "x"))
        return lax.with_sharding_constraint(z - 1, ns(m24, P.UNCONSTRAINED, P.UNCONSTRAINED))
    cases.append(Case("sharding_constraints", wsc, [a], ns(m24, "x", "y"), None,
                      [(ns(m24, "y", None), ()), (ns(m24, None, "x"), (0,)),
                       (ns(m24), (0, 1))]))

    def control_flow(x):
        def body(c):
            i, v = c
            return i + 1, lax.with_sharding_constraint(v * 2, ns(m24, "x", "y"))
        _, v = lax.while_loop(lambda c: c[0] < 3, body, (0, x))
        return lax.cond(v.sum() > 0,
                        lambda v: lax.with_sharding_constraint(v + 1, ns(m24, None, "y")),
                        lambda v: v - 1, v)
    cases.append(Case("while_cond", control_flow, [a], ns(m24, "x", "y"), ns(m24, "x", "y")))

    def sm_full(x, y):
        def inner(b, c):
            return b * 2, c.sum(0, keepdims=True)
        return jax.shard_map(inner, mesh=m24, in_specs=(P("x", "y"), P("x")),
                             out_specs=(P("x", "y"), P("x")))(x, y)
    cases.append(Case("shard_map_full", sm_full, [a, a], (ns(m24, "x", "y"), ns(m24, "x")),
                      None))

    def sm_partial(x):
        def inner(b):
            b = lax.with_sharding_constraint(b + 1, P("x"))
            c = lax.with_sharding_constraint(b * 3, P(P.UNCONSTRAINED, None))
            return lax.psum(b * 2 + c, "y")
        return jax.shard_map(inner, in_specs=P(None, "y"), out_specs=P(None, None),
                             axis_names={"y"})(x)
    cases.append(Case("shard_map_partial", sm_partial, [a], ns(m24, "x", "y"),
                      ns(m24, "x", None), set_mesh=m24))

    def nested_sm(x):
        def outer(b):
            def inner(c):
                return lax.psum(c * 2, "b")
            return jax.shard_map(inner, in_specs=P(None, "b"), out_specs=P(None, None),
                                 axis_names={"b"})(b)
        return jax.shard_map(outer, in_specs=P("a"), out_specs=P("a"), axis_names={"a"})(x)
    cases.append(Case("shard_map_nested", nested_sm, [a], ns(m222, "a", "b"), None,
                      set_mesh=m222))

    def sm_in_while(x):
        def body(c):
            i, v = c
            v = jax.shard_map(lambda b: b * 2, mesh=m24, in_specs=P("x", "y"),
                              out_specs=P("x", "y"))(v)
            return i + 1, v
        return lax.while_loop(lambda c: c[0] < 2, body, (0, x))[1]
    cases.append(Case("shard_map_in_while", sm_in_while, [a], ns(m24, "x", "y"),
                      ns(m24, "x", "y")))

    def grad_sm(x):
        def f(x):
            return jax.shard_map(jnp.sin, mesh=m24, in_specs=P("x", "y"),
                                 out_specs=P("x", "y"))(x).sum()
        return jax.grad(f)(x)
    cases.append(Case("shard_map_grad", grad_sm, [a], ns(m24, "x", "y"), ns(m24, "x", "y")))

    def sm_no_inputs():
        return jax.shard_map(lambda: jnp.ones((2, 2)), mesh=m24, in_specs=(),
                             out_specs=P("x", "y"))()
    cases.append(Case("shard_map_no_inputs", sm_no_inputs, [], None, None))

    def scan(x):
        def step(c, xs):
            c = lax.with_sharding_constraint(c + xs, ns(m24, "y"))
            return c, c.sum()
        return lax.scan(step, jnp.zeros((16,)), x)
    cases.append(Case("scan_constraint", scan, [a], ns(m24, "x", "y"), None))

    def callbacks(x):
        from jax.experimental import io_callback
        y = jax.pure_callback(lambda v: np.asarray(v) * 2,
                              jax.ShapeDtypeStruct(x.shape, x.dtype), x)
        z = io_callback(lambda v: (np.asarray(v), np.asarray(v).sum()),
                        (jax.ShapeDtypeStruct(x.shape, x.dtype),
                         jax.ShapeDtypeStruct((), x.dtype)), y, ordered=True)
        return z[0] + z[1]
    cases.append(Case("callbacks", callbacks, [a], ns(m24, "x", "y"), None))

    cases.append(Case("passthrough_results", lambda x: (x, x * 2, x.sum(0)), [a],
                      ns(m24, "x", "y"), (ns(m24, "x", "y"), ns(m24, "y"), ns(m24, "x"))))
    cases.append(Case("bf16_and_empty", lambda x, z: (x.astype(jnp.bfloat16), z + 1),
                      [a, jnp.zeros((0, 8), jnp.float32)], (ns(m24, "x"), ns(m24, None, "y")),
                      (ns(m24, "x"), ns(m24))))

    # Constraints on other meshes over the same devices: the Shardy form expresses them
    # with sub-axes of the one module mesh, e.g. [{"y":(2)2}, {"x", "y":(1)2}].
    m8z = _mesh(jax, (8,), ("z",))
    m42 = _mesh(jax, (4, 2), ("p", "q"))

    def other_meshes(x):
        y = lax.with_sharding_constraint(x * 2, ns(m8z, None, "z"))
        return lax.with_sharding_constraint(y + 1, ns(m42, "q", "p"))
    cases.append(Case("sub_axes", other_meshes, [a], ns(m24, "x", "y"), None,
                      [(ns(m8z, None, "z"), ()), (ns(m42, "q", "p"), ())]))

    def explicit(x):
        return jax.sharding.reshard(x * 2, P("y", "x"))
    cases.append(Case("explicit_reshard", explicit,
                      [jax.ShapeDtypeStruct((8, 16), jnp.float32, sharding=ns(me, "x", "y"))],
                      None, None, [(ns(me, "y", "x"), ())], set_mesh=me,
                      constraints_exact=False))
    return {c.name: c for c in cases}


CASE_NAMES = ["basic_2d", "partial_replication", "combined_axes", "replicated_in", "mesh_3d",
              "mesh_1d_transpose", "four_devices", "pytree_scalar", "sharding_constraints",
              "while_cond", "shard_map_full", "shard_map_partial", "shard_map_nested",
              "shard_map_in_while", "shard_map_grad", "shard_map_no_inputs", "scan_constraint",
              "callbacks", "passthrough_results", "bf16_and_empty", "sub_axes",
              "explicit_reshard"]


@pytest.fixture(scope="module")
def cases(jx):
    return _cases(jx)


def _export(jax, case: Case, shardy: bool) -> bytes:
    import contextlib
    old = jax.config.jax_use_shardy_partitioner
    jax.config.update("jax_use_shardy_partitioner", shardy)
    try:
        ctx = jax.set_mesh(case.set_mesh) if case.set_mesh is not None else \
            contextlib.nullcontext()
        with ctx:
            kw = {}
            if case.in_shardings is not None:
                kw["in_shardings"] = case.in_shardings
            if case.out_shardings is not None:
                kw["out_shardings"] = case.out_shardings
            lowered = jax.jit(case.fn, **kw).lower(*case.args)
            return lowered.compiler_ir("hlo").as_serialized_hlo_module_proto()
    finally:
        jax.config.update("jax_use_shardy_partitioner", old)


def _load(data: bytes, source: str) -> Module:
    from hlo_spmd.ir.io import load_module_bytes
    return load_module_bytes(data, source)


def _summary(m: Module, rep: AnnotationReport) -> dict:
    """What must agree between the two export forms."""
    entry = m.entry
    # (ordered effects add token parameters, which carry no user sharding)
    params = [None if p.sharding is None else str(p.sharding) for p in entry.parameters
              if not p.shape.is_token]
    root = entry.root
    results = None
    if root.sharding is not None:
        leaves = root.sharding.tuple_elements if root.sharding.is_tuple else (root.sharding,)
        results = [str(s) for s in leaves]
    # Sharding custom-calls; the classic form's extra constraints around manual
    # boundaries (full-side / manual-side of SPMDFullToShardShape etc.) are left out.
    constraints = []
    for comp in m.computations:
        users = comp.users()
        for inst in comp.instructions:
            if inst.opcode != "custom-call" or inst.custom_call_target != "Sharding":
                continue
            us = users.get(id(inst), [])
            if us and all(u.opcode == "custom-call" and u.custom_call_target in
                          ("SPMDFullToShardShape", "SPMDShardToFullShape") for u in us):
                continue
            rec = rep[inst.name]
            constraints.append((str(rec.sharding), rec.unspecified_dims, inst.shape.dims))
    regions = []
    for r in rep.manual_regions:
        for bnd in r.entries + r.exits:
            regions.append((bnd.kind, str(bnd.full_sharding), str(bnd.manual_sharding),
                            bnd.unspecified_dims, bnd.full_shape.dims, bnd.shard_shape.dims))
    return dict(params=params, results=results, constraints=sorted(constraints),
                regions=sorted(regions), device_count=rep.device_count)


def _leaves(tree) -> list:
    import jax
    return jax.tree_util.tree_leaves(tree)


def _xla_str(named, ndim: int) -> str:
    return str(named._to_xla_hlo_sharding(ndim))


@pytest.mark.parametrize("name", CASE_NAMES)
def test_jax_export_both_forms_agree(jx, cases, name):
    case = cases[name]
    out = {}
    for shardy in (True, False):
        data = _export(jx, case, shardy)
        m = _load(data, f"{name}-{'shardy' if shardy else 'classic'}")
        rep = normalize_annotations(m, name)
        assert rep.has_shardy == shardy, "export form not as requested"
        out[shardy] = (m, rep, _summary(m, rep))
    s_sdy, s_classic = out[True][2], out[False][2]
    assert s_sdy == s_classic

    # ... and both equal what jax itself says the shardings are.
    m, rep, summary = out[True]
    arg_leaves = _leaves(case.args)
    if case.in_shardings is not None:
        in_sh = case.in_shardings
        in_leaves = _leaves(in_sh if isinstance(in_sh, (tuple, list)) else (in_sh,))
        expect = [_xla_str(s, np.ndim(x)) for s, x in zip(in_leaves, arg_leaves)]
        assert summary["params"] == expect
    else:
        expect = [_xla_str(x.sharding, len(x.shape)) for x in arg_leaves]
        assert summary["params"] == expect
    if case.out_shardings is not None:
        import contextlib

        import jax
        ctx = jax.set_mesh(case.set_mesh) if case.set_mesh is not None else \
            contextlib.nullcontext()
        with ctx:
            out_struct = jax.eval_shape(case.fn, *case.args)
        out_leaves = _leaves(out_struct)
        sh = case.out_shardings
        sh_leaves = _leaves(sh if isinstance(sh, (tuple, list, dict)) else (sh,))
        expect = [_xla_str(s, len(o.shape)) for s, o in zip(sh_leaves, out_leaves)]
        assert summary["results"] == expect
        # The Shardy form states the results through FuncResultSharding custom-calls.
        frs = sorted(rep.by_origin("sdy-func-result"), key=lambda r: r.result_indices)
        frs = [r for r in frs if r.name != m.entry.root.name]
        assert [str(r.sharding) for r in frs] == expect
    if case.constraints:
        entry_cs = [(str(r.sharding), r.unspecified_dims) for r in rep.records
                    if r.origin == "sharding-custom-call" and r.computation == m.entry.name]
        expect = [(_xla_str(s, 2), dims) for s, dims in case.constraints]
        if case.constraints_exact:
            assert entry_cs == expect
        else:
            assert entry_cs[-len(expect):] == expect
    if name == "sub_axes":
        assert any(r.sdy_text and '"y":(2)2' in r.sdy_text for r in rep.records)
    # Every annotated instruction is kept fixed by propagation.
    assert rep.user_annotated == {r.name for r in rep.records}
    assert rep.device_count == (4 if name == "four_devices" else 8)


def test_jax_shard_map_manual_region(jx, cases):
    m = _load(_export(jx, cases["shard_map_partial"], True), "sm")
    rep = normalize_annotations(m)
    (region,) = rep.manual_regions
    assert region.form == "sdy" and region.manual_axes == ("y",)
    assert any(c.startswith("xla.sdy.manual_computation_body") for c in region.body_computations)
    (enter,) = region.entries
    assert enter.full_shape.dims == (8, 16) and enter.shard_shape.dims == (8, 4)
    assert str(enter.full_sharding) == "{devices=[1,4,2]<=[2,4]T(1,0) last_tile_dim_replicate}"
    assert str(enter.manual_sharding) == \
        "{devices=[1,1,4,2]<=[2,4]T(1,0) last_tile_dims={manual, replicated}}"
    assert enter.unspecified_dims == (0, 1)
    # Constraints inside the body carry the manual axis explicitly.
    body = [r for r in rep.records if r.computation.startswith("xla.sdy.manual_computation_body")]
    assert body and all(r.sharding.is_manual_subgroup or r.sharding.is_manual for r in body)
    assert all(r.manual_axes == ("y",) for r in body)
    # The custom-calls stay in place.
    targets = [i.custom_call_target for i in m.instructions() if i.opcode == "custom-call"]
    assert "xla.sdy.GlobalToLocalShape" in targets and "xla.sdy.LocalToGlobalShape" in targets

    mc = _load(_export(jx, cases["shard_map_partial"], False), "sm-classic")
    repc = normalize_annotations(mc)
    (rc,) = repc.manual_regions
    assert rc.form == "classic"
    assert [str(e.manual_sharding) for e in rc.entries] == [str(enter.manual_sharding)]
    assert rc.entries[0].unspecified_dims == (0, 1)


def test_jax_unreduced(jx):
    import jax.numpy as jnp
    from jax.sharding import AxisType, NamedSharding
    from jax.sharding import PartitionSpec as P
    me = _mesh(jx, (2, 4), ("x", "y"), AxisType.Explicit)
    with jx.set_mesh(me):
        xs = jx.ShapeDtypeStruct((8, 16), jnp.float32, sharding=NamedSharding(me, P("x", "y")))
        ws = jx.ShapeDtypeStruct((16, 4), jnp.float32, sharding=NamedSharding(me, P("y", None)))
        def f(x, w):
            return jnp.einsum("ij,jk->ik", x, w, out_sharding=P("x", None, unreduced={"y"}))
        data = jx.jit(f).lower(xs, ws).compiler_ir("hlo").as_serialized_hlo_module_proto()
    m = _load(data, "unreduced")
    rep = normalize_annotations(m)
    cs = rep.by_origin("sharding-custom-call")
    expect = _xla_str(NamedSharding(me, P("x", None, unreduced={"y"})), 2)
    assert [str(r.sharding) for r in cs] == [expect]
    assert expect == "{devices=[2,1,4]<=[8] last_tile_dims={unreduced}}"


def _edit_proto(data: bytes, fn) -> bytes:
    msg = hlo_pb2.HloModuleProto()
    msg.ParseFromString(data)
    fn(msg)
    return msg.SerializeToString()


def _entry_inst(msg, pred):
    entry = next(c for c in msg.computations if c.id == msg.entry_computation_id)
    return next(i for i in entry.instructions if pred(i))


def test_jax_contradictory_classic_and_sdy(jx, cases):
    data = _export(jx, cases["basic_2d"], True)

    def edit(msg):
        p = _entry_inst(msg, lambda i: i.opcode == "parameter")
        p.frontend_attributes.map["xla.sdy.sharding"] = '#sdy.sharding<@mesh, [{"y"}, {"x"}]>'
    m = _load(_edit_proto(data, edit), "edited.pb")
    pname = m.entry.parameters[0].name
    with pytest.raises(ShardingError) as e:
        normalize_annotations(m, "edited.pb")
    assert f"instruction {pname}" in str(e.value)
    assert '[{"y"}, {"x"}]' in str(e.value) and "{devices=[2,4]<=[8]}" in str(e.value)

    def edit_result(msg):
        frs = _entry_inst(msg, lambda i: i.custom_call_target == "xla.sdy.FuncResultSharding")
        frs.frontend_attributes.map["xla.sdy.sharding"] = \
            '#sdy.sharding_per_value<[<@mesh, [{"x"}, {"y"}]>]>'
    m = _load(_edit_proto(data, edit_result), "edited2.pb")
    with pytest.raises(ShardingError, match="contradicts Shardy result sharding"):
        normalize_annotations(m)


def test_jax_device_count_mismatch(jx, cases):
    from hlo_spmd.sharding.proto import to_proto
    data = _export(jx, cases["mesh_3d"], False)

    def edit(msg):
        entry = next(c for c in msg.computations if c.id == msg.entry_computation_id)
        params = [i for i in entry.instructions if i.opcode == "parameter"]
        params[1].sharding.CopyFrom(to_proto(parse_sharding("{devices=[4,1,1]<=[4]}")))
    m = _load(_edit_proto(data, edit), "mismatch.pb")
    with pytest.raises(ShardingError) as e:
        normalize_annotations(m, "mismatch.pb")
    assert e.value.message == "sharding uses 4 devices but the module uses 8"
    assert m.entry.parameters[1].name in e.value.where


def test_jax_sdy_only_module(jx, cases):
    """Classic fields stripped: the Shardy attributes alone give the same shardings."""
    data = _export(jx, cases["mesh_3d"], True)
    full = _load(data, "full")
    normalize_annotations(full)

    def strip(msg):
        for c in msg.computations:
            for i in c.instructions:
                if i.HasField("sharding") and i.opcode != "tuple" and (
                        i.opcode == "parameter" or i.custom_call_target):
                    i.ClearField("sharding")
    m = _load(_edit_proto(data, strip), "stripped")
    assert all(p.sharding is None for p in m.entry.parameters)
    rep = normalize_annotations(m)
    assert [str(p.sharding) for p in m.entry.parameters] == \
        [str(p.sharding) for p in full.entry.parameters]
    assert all(rep[p.name].origin == "sdy" for p in m.entry.parameters)


# =======================================================================================
# Checked-in fixtures
# =======================================================================================
_PB = sorted(glob.glob(str(FIXTURES / "**" / "*.pb"), recursive=True))


@pytest.mark.skipif(not _PB, reason="no fixtures under fixtures/hlo yet")
@pytest.mark.parametrize("path", _PB, ids=[os.path.relpath(p, FIXTURES) for p in _PB])
def test_fixture_normalizes(path):
    from hlo_spmd.ir.io import load_module
    m = load_module(path)
    rep = normalize_annotations(m, path)
    name = os.path.basename(path)
    if name.startswith("shardy_"):
        assert rep.has_shardy
        assert rep.meshes
    sidecar = pathlib.Path(path).with_suffix(".json")
    if not sidecar.exists():
        return
    meta = json.loads(sidecar.read_text())
    if "num_partitions" in meta and rep.device_count is not None:
        assert rep.device_count == meta["num_partitions"]
    inputs = meta.get("inputs", [])
    params = m.entry.parameters
    if len(inputs) == len(params):
        for p, spec in zip(params, inputs):
            if spec.get("sharding") is None:
                continue
            got = "{replicated}" if p.sharding is None else str(p.sharding)
            assert got == spec["sharding"], p.name
    outputs = meta.get("outputs", [])
    root = m.entry.root
    if root.sharding is not None and outputs and all(o.get("sharding") for o in outputs):
        leaves = root.sharding.tuple_elements if root.sharding.is_tuple else (root.sharding,)
        if len(leaves) == len(outputs):
            assert [str(s) for s in leaves] == [o["sharding"] for o in outputs]


_SHARDY_PB = [p for p in _PB if os.path.basename(p).startswith("shardy_")]


@pytest.mark.skipif(not _SHARDY_PB, reason="no shardy_*.pb fixtures yet")
@pytest.mark.parametrize("path", _SHARDY_PB, ids=[os.path.basename(p) for p in _SHARDY_PB])
def test_shardy_fixture_matches_classic_fields(path):
    """In the Shardy fixtures every Shardy-annotated instruction agrees with its classic field."""
    from hlo_spmd.ir.io import load_module
    m = load_module(path)
    rep = normalize_annotations(m, path)
    sdy_records = [r for r in rep.records if r.sdy_text is not None]
    assert sdy_records
    for r in sdy_records:
        if r.classic is not None and not r.manual_axes:
            assert r.classic == r.sharding, r.name


_HLO_TEXT = sorted(glob.glob(str(FIXTURES / "handwritten" / "*.hlo")))


@pytest.mark.skipif(not _HLO_TEXT, reason="no handwritten fixtures")
@pytest.mark.parametrize("path", _HLO_TEXT, ids=[os.path.basename(p) for p in _HLO_TEXT])
def test_handwritten_fixture_normalizes(path):
    from hlo_spmd.ir.io import load_module
    m = load_module(path)
    rep = normalize_annotations(m, path)
    if "manual" in os.path.basename(path):
        assert rep.manual_regions


def test_normalize_is_idempotent_and_keeps_custom_calls():
    m = _sdy_manual_module(local_dims=(8, 4), axes='{"y"}',
                           body_sharding='#sdy.sharding_per_value<[<@mesh, [{"x"}, {?}]>]>')
    before = [(i.name, i.opcode, i.custom_call_target) for i in m.instructions()]
    first = normalize_annotations(m)
    shardings = {i.name: i.sharding for i in m.instructions()}
    second = normalize_annotations(m)
    assert [(i.name, i.opcode, i.custom_call_target) for i in m.instructions()] == before
    assert {i.name: i.sharding for i in m.instructions()} == shardings
    assert [(r.name, str(r.sharding), r.unspecified_dims) for r in first.records] == \
        [(r.name, str(r.sharding), r.unspecified_dims) for r in second.records]


def test_non_tuple_sharding_on_tuple_shape():
    b = _Builder()
    p = b.param(0, [8], name="p", sharding="{devices=[8]<=[8]}")
    t = b.inst("tuple", Shape.tuple_of([_f32([8]), _f32([8])]), [p, p], name="t",
               sharding="{replicated}")
    rep = normalize_annotations(b.root(t))
    assert rep["t"].origin == "sharding-field" and rep.device_count == 8


def test_sdy_attr_on_other_ops_is_ignored_like_xla():
    """XLA copies frontend attributes onto new instructions (e.g. the GTEs of a
    callback), so its Shardy import reads xla.sdy.sharding only where it belongs."""
    b = _Builder('{maximal_mesh_0 = #sdy.mesh<[], device_ids=[0]>, '
                 'mesh = #sdy.mesh<["x"=2, "y"=4]>}')
    x = b.param(0, [8, 16], name="x", sdy_text='#sdy.sharding<@mesh, [{"x"}, {"y"}]>')
    three = '#sdy.sharding_per_value<[<@maximal_mesh_0, []>, <@maximal_mesh_0, []>]>'
    cb = b.cc("xla_ffi_python_cpu_callback", [x], Shape.tuple_of([Shape.token(), _f32([8, 16])]),
              name="cb", sdy_text=three)
    g = b.inst("get-tuple-element", _f32([8, 16]), [cb], name="g", tuple_index=1,
               sdy_text=three, sharding="{maximal device=0}")
    rep = normalize_annotations(b.root(g))
    assert str(cb.sharding) == "{{maximal device=0}, {maximal device=0}}"
    assert rep["cb"].origin == "sdy"
    assert rep["g"].origin == "sharding-field"
    assert rep.ignored_sdy == ["g"]


def test_maximal_mesh_single_sharding_for_whole_op():
    b = _Builder('{maximal_mesh_2 = #sdy.mesh<[], device_ids=[2]>, '
                 'mesh = #sdy.mesh<["x"=2, "y"=4]>}')
    x = b.param(0, [8, 16], name="x", sdy_text='#sdy.sharding<@mesh, [{"x"}, {"y"}]>')
    cb = b.cc("xla_python_cpu_callback", [x], Shape.tuple_of([_f32([8, 16]), _f32([])]),
              name="cb", sdy_text="#sdy.sharding_per_value<[<@maximal_mesh_2, []>]>")
    rep = normalize_annotations(b.root(cb))
    assert str(cb.sharding) == "{{maximal device=2}, {maximal device=2}}"
    assert rep.device_count == 8
