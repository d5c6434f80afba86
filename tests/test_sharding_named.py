"""Named (mesh-axis) shardings: text and proto against jaxlib's XLA, the tile form, errors.

Oracle: jaxlib's ``HloSharding.from_string`` parses and prints the named form
and serialises it (OpSharding field 14).  jaxlib aborts the process on invalid
named shardings, so only valid ones are fed to it.
"""
from __future__ import annotations

import itertools
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from hypothesis import settings
from test_sharding_model import SETTINGS
from hlo_spmd.errors import ShardingError
from hlo_spmd.sharding import HloSharding, from_proto, parse_sharding, to_proto
from hlo_spmd.sharding.named import mesh_groups_array, parse_mesh_groups

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "hlo" / "handwritten"


def _xla():
    return pytest.importorskip("jaxlib._hlo", reason="jaxlib provides XLA's sharding parser")


KNOWN = [
    "{mesh['x'=8], [{'x':(1)2, 'x':(4)2}, {}]}",
    "{mesh['x'=2,'y'=4], [{'y'}, {'x'}]}",
    "{mesh['x'=2,'y'=4], [{'x', 'y'}]}",
    "{mesh['x'=2,'y'=4], [{'x'}, {}], replicated={'y'}}",
    "{mesh['x'=2,'y'=4], [{'x'}, {}], unreduced={'y'}}",
    "{mesh['x'=2,'y'=4], [{}, {'y', ?}], manual={'x'}}",
    "{mesh['x'=2,'y'=4], [{?}, {?}]}",
    "{mesh['x'=2,'y'=4], [{'y':(2)2}, {}], replicated={'y':(1)2}}",
    "{mesh['x'=2,'y'=4], device_ids=([4,2]T(1,0)), [{'x'}, {}]}",
    "{mesh['x'=2,'y'=4], device_ids=(7,6,5,4,3,2,1,0), [{'x'}, {}]}",
    "{mesh['x'=2,'y'=2,'z'=2], device_ids=([2,2,2]T(2,1,0)), [{'z', 'x'}, {}]}",
    "{maximal_mesh[device_id=3]}",
    "{mesh['x'=2,'y'=4], unreduced}",
    "{mesh['x'=2,'y'=4], manual}",
    "{mesh['x'=2,'y'=4], replicated}",
    "{mesh['x'=2,'y'=4], [{}, {}], unreduced={'x', 'y'}}",
    "{mesh['x'=2,'y'=4], [{}, {}], unreduced={'x'}, manual={'y'}}",
    "{{mesh['x'=2,'y'=4], [{'x'}, {}]}, {replicated}, {devices=[2,4]<=[8]}}",
]


@pytest.mark.parametrize("text", KNOWN)
def test_known_forms_match_xla_text_and_proto(text):
    hlo = _xla()
    xla = hlo.HloSharding.from_string(text)
    mine = parse_sharding(text)
    assert str(mine) == str(xla) == text
    assert to_proto(mine).SerializeToString(deterministic=True) == \
        xla.to_proto().SerializeToString()
    back = from_proto(xla.to_proto().SerializeToString())
    assert str(back) == text and back == mine


def test_xla_test_spelling_without_comma_prints_canonically():
    # XLA's tests write no comma after the mesh; XLA's printer writes one.
    s = parse_sharding("{mesh['x'=8] [{'x':(1)2, 'x':(4)2}, {}]}")
    assert str(s) == "{mesh['x'=8], [{'x':(1)2, 'x':(4)2}, {}]}"


def test_metadata_prints_in_the_named_list_form():
    s = parse_sharding("{mesh['x'=2], [{'x'}], metadata={op_name=\"a\"}}")
    assert s.to_string(True) == "{mesh['x'=2], [{'x'}], metadata={{op_name=\"a\"}}}"
    assert str(s) == "{mesh['x'=2], [{'x'}]}"
    assert from_proto(to_proto(s)).to_string(True) == s.to_string(True)


def _devices_holding(s: HloSharding, shape: tuple[int, ...]) -> dict[int, tuple[slice, ...]]:
    """Device -> the block of a tensor it holds (numpy model from the tile form)."""
    ta = s.tile_assignment.array()
    r = len(shape)
    out = {}
    for idx in itertools.product(*[range(d) for d in ta.shape]):
        blocks = tuple(slice(i * (shape[k] // ta.shape[k]), (i + 1) * (shape[k] // ta.shape[k]))
                       for k, i in enumerate(idx[:r]))
        out[int(ta[idx])] = blocks
    return out


def _named_model(mesh_sizes, device_ids, dims_axes, shape):
    """Device -> block by the definition of mesh axes and sub-axes (independent of to_tiles)."""
    devs = np.asarray(device_ids).reshape(mesh_sizes)
    out = {}
    for coord in itertools.product(*[range(s) for s in mesh_sizes]):
        blocks = []
        for k, axes in enumerate(dims_axes):
            index, count = 0, 1
            for ax, pre, size in axes:
                full = mesh_sizes[ax]
                pre = pre or 1
                size = size or full
                digit = (coord[ax] // (full // (pre * size))) % size
                index, count = index * size + digit, count * size
            step = shape[k] // count
            blocks.append(slice(index * step, (index + 1) * step))
        out[int(devs[coord])] = tuple(blocks)
    return out


@st.composite
def named_case(draw):
    """A valid named sharding over a 1-3 axis mesh, with sub-axes and a device order."""
    n_axes = draw(st.integers(1, 3))
    sizes = [draw(st.sampled_from([1, 2, 4])) for _ in range(n_axes)]
    names = ["x", "y", "z"][:n_axes]
    total = math.prod(sizes)
    order = draw(st.sampled_from(["iota", "explicit", "transform"]))
    if order == "explicit" and total > 1:
        ids = draw(st.permutations(list(range(total))))
        if ids == list(range(total)):
            ids = ids[::-1]
    else:
        ids = list(range(total))
    # Split every axis into pieces (sub-axes), then hand the pieces to dims.
    pieces = []
    for a, s in enumerate(sizes):
        if s == 4 and draw(st.booleans()):
            pieces += [(a, 1, 2), (a, 2, 2)]
        elif s > 1:
            pieces.append((a, None, None))
    rank = draw(st.integers(1, 3))
    dims = [[] for _ in range(rank)]
    rest = []
    for p in draw(st.permutations(pieces)):
        slot = draw(st.integers(-1, rank - 1))
        (dims[slot] if slot >= 0 else rest).append(p)
    # XLA rejects adjacent sub-axes that merge into one ('y':(1)2, 'y':(2)2): write
    # them minor first in a dim, and as the whole axis in the replicated list.
    for d in dims:
        for i in range(len(d) - 1):
            if d[i][0] == d[i + 1][0] and d[i][1] == 1 and d[i + 1][1] == 2:
                d[i], d[i + 1] = d[i + 1], d[i]
    for a in range(n_axes):
        subs = [p for p in rest if p[0] == a and p[1] is not None]
        if len(subs) == 2:
            rest = [p for p in rest if p not in subs] + [(a, None, None)]
    shape = tuple(8 * draw(st.sampled_from([1, 2])) for _ in range(rank))

    def ax(p):
        a, pre, size = p
        return f"'{names[a]}'" + (f":({pre}){size}" if pre is not None else "")

    mesh = "mesh[" + ",".join(f"'{n}'={s}" for n, s in zip(names, sizes)) + "]"
    if order == "explicit" and total > 1:
        mesh += ", device_ids=(" + ",".join(map(str, ids)) + ")"
    text = "{" + mesh + ", [" + ", ".join("{" + ", ".join(ax(p) for p in d) + "}"
                                          for d in dims) + "]"
    rest.sort(key=lambda p: (p[0], p[1] or 1))
    if rest and draw(st.booleans()):
        text += ", replicated={" + ", ".join(ax(p) for p in rest) + "}"
    text += "}"
    return text, sizes, ids, dims, shape


@settings(SETTINGS, max_examples=max(300, SETTINGS.max_examples))
@given(named_case())
def test_random_named_print_proto_and_devices(case):
    text, sizes, ids, dims, shape = case
    hlo = _xla()
    mine = parse_sharding(text)
    xla = hlo.HloSharding.from_string(text)
    assert str(mine) == str(xla) == text
    assert to_proto(mine).SerializeToString(deterministic=True) == \
        xla.to_proto().SerializeToString()
    assert parse_sharding(str(mine)) == mine
    want = _named_model(sizes, ids, dims, shape)
    if mine.is_replicated:
        assert all(b == tuple(slice(0, d) for d in shape) for b in want.values())
    else:
        assert _devices_holding(mine, shape) == want


def test_tile_form_equals_and_is_used_by_the_algebra():
    s = parse_sharding("{mesh['x'=2,'y'=4], [{'x'}, {}]}")
    assert s == parse_sharding("{devices=[2,1,4]<=[8] last_tile_dim_replicate}")
    assert s.named is not None and s.without_named().named is None
    assert str(s.without_named()) == "{devices=[2,1,4]<=[8] last_tile_dim_replicate}"
    u = parse_sharding("{mesh['x'=2,'y'=4], unreduced}")
    assert u.is_unreduced and str(u) == "{mesh['x'=2,'y'=4], unreduced}"
    m = parse_sharding("{mesh['x'=2,'y'=4], [{'y'}, {}], manual={'x'}}")
    assert m.is_manual_subgroup and m.tile_dims_for_data() == (4, 1)


@pytest.mark.parametrize("text, fragment", [
    ("{mesh['x'=2,'y'=4], [{'z'}, {}]}", "axis 'z' is not in mesh"),
    ("{mesh['x'=2,'y'=4], [{'x'}, {'x'}]}", "axis 'x' used twice"),
    ("{mesh['x'=2,'y'=4], [{'x'}, {}], replicated={'x'}}", "axis 'x' used twice"),
    ("{mesh['x'=8], [{'x':(1)4}, {'x':(2)2}]}", "overlap"),
    ("{mesh['x'=2,'y'=4], [{'y':(1)3}]}", "does not divide axis 'y'"),
    ("{mesh['x'=2,'y'=4], [{'y':(1)4}]}", "does not divide axis 'y'"),
    ("{mesh['x'=2,'y'=4], device_ids=(0,1,2), [{'x'}]}", "sizes multiply to 8"),
    ("{mesh['x'=2,'y'=4], device_ids=(0,1,2,3,4,5,6,6), [{'x'}]}", "not a permutation"),
    ("{mesh['x'=2,'x'=4], [{'x'}]}", "declared twice"),
    ("{mesh['x'=2], [{'x'}] foo}", "expected ','"),
    ("{mesh['x'=2], [{'x'}], replicated}", "must stand alone"),
    ("{mesh['x'=2 [{'x'}]}", "',' or ']'"),
])
def test_bad_named_shardings_are_one_line_errors(text, fragment):
    with pytest.raises(ShardingError) as e:
        parse_sharding(text)
    assert fragment in str(e.value) and "\n" not in str(e.value)


def test_rank_mismatch_is_an_error():
    s = parse_sharding("{mesh['x'=2,'y'=4], [{}, {}]}")
    with pytest.raises(ShardingError, match="2 dim shardings but the shape has rank 3"):
        s.validate_for_shape([4, 4, 4])
    s.validate_for_shape([4, 4])


@pytest.mark.parametrize("text, groups", [
    ("mesh['x'=2,'y'=4] {'x'}", [[0, 4], [1, 5], [2, 6], [3, 7]]),
    ("mesh['x'=2,'y'=4] {'y'}", [[0, 1, 2, 3], [4, 5, 6, 7]]),
    ("mesh['x'=2,'y'=4] {'y','x'}", [[0, 4, 1, 5, 2, 6, 3, 7]]),
    ("mesh['x'=8] {'x':(2)2}", [[0, 2], [1, 3], [4, 6], [5, 7]]),
    ("mesh['x'=2,'y'=4], device_ids=(7,6,5,4,3,2,1,0) {'x'}", [[7, 3], [6, 2], [5, 1], [4, 0]]),
])
def test_mesh_replica_groups(text, groups):
    mesh, axes, end = parse_mesh_groups(text)
    assert end == len(text)
    got = mesh_groups_array(mesh, axes)
    assert sorted(map(sorted, got.tolist())) == sorted(map(sorted, groups))
    assert got.tolist() == groups


MODULE = """HloModule m, num_partitions=8

ENTRY e {
  p = f32[8,4] parameter(0), sharding=SHARDING
  ROOT n = f32[8,4] negate(p)
}
"""


@pytest.mark.parametrize("bad, fragment", [
    ("{mesh['x'=2,'y'=4], [{'z'}, {}]}", "axis 'z' is not in mesh"),
    ("{mesh['x'=2,'y'=4], [{'x'}, {'x'}]}", "axis 'x' used twice"),
    ("{mesh['x'=2,'y'=4], [{'y':(1)3}, {}]}", "does not divide axis 'y'"),
    ("{mesh['x'=2,'y'=4], device_ids=(0,1,2), [{'x'}, {}]}", "multiply to 8"),
    ("{mesh['x'=2,'y'=4], [{'x'}, {}, {}]}", "3 dim shardings but the shape has rank 2"),
])
def test_bad_named_sharding_in_a_module_names_the_instruction(bad, fragment):
    from hlo_spmd.errors import HloSpmdError
    from hlo_spmd.ir.io import load_module_bytes, verify_with_source
    with pytest.raises(HloSpmdError) as e:
        verify_with_source(load_module_bytes(MODULE.replace("SHARDING", bad).encode()), "m.hlo")
    msg = str(e.value)
    assert fragment in msg and "\n" not in msg
    assert " p" in msg or "p:" in msg or "instruction p" in msg


def test_module_text_with_named_shardings_and_mesh_groups_matches_jaxlib():
    hlo = _xla()
    from hlo_spmd.ir.io import load_module_bytes, module_bytes, module_text
    text = open(FIXTURES / "named_manual_mesh_groups.hlo").read()
    ours = module_text(load_module_bytes(text.encode()))
    theirs = hlo.hlo_module_from_text(text).to_string()
    assert ours.strip() == theirs.strip()
    # Our proto read by jaxlib, and jaxlib's proto read by us, print the same.
    mine = load_module_bytes(text.encode())
    back = hlo.HloModule.from_serialized_hlo_module_proto(module_bytes(mine)).to_string()
    assert back.split("\n", 1)[1] == theirs.split("\n", 1)[1]
    again = module_text(load_module_bytes(hlo.hlo_module_from_text(text)
                                          .as_serialized_hlo_module_proto()))
    assert again.split("\n", 1)[1].strip() == theirs.split("\n", 1)[1].strip()
