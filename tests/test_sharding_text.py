"""Sharding text form: XLA-exact printing, parsing, errors; oracle = jaxlib's XLA parser."""
from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_sharding_model import SETTINGS, reshape_dims_for

from hlo_spmd.errors import ShardingError
from hlo_spmd.sharding import (HloSharding, OpMetadata, ShardGroup, ShardingType,
                               TileAssignment, parse_metadata, parse_sharding)

TYPE_NAMES = ["manual", "replicated", "unreduced", "maximal"]


# -- generated valid sharding strings --------------------------------------------
@st.composite
def tiled_text(draw) -> str:
    mode = draw(st.sampled_from(["plain", "plain", "replicate", "replicate", "subgroups"]))
    rank = draw(st.integers(0 if mode == "subgroups" else 1, 4))
    dims = [draw(st.sampled_from([1, 1, 2, 2, 3, 4])) for _ in range(rank)]
    attrs = ""
    if mode == "replicate":
        dims.append(draw(st.sampled_from([1, 2, 2, 3, 4])))
        attrs = " last_tile_dim_replicate"
    elif mode == "subgroups":
        k = draw(st.integers(1, 3))
        types = [draw(st.sampled_from(TYPE_NAMES)) for _ in range(k)]
        dims += [draw(st.sampled_from([1, 2, 2, 3])) for _ in range(k)]
        sep = draw(st.sampled_from([", ", ","]))
        attrs = " last_tile_dims={" + sep.join(types) + "}"
    while math.prod(dims) > 64:
        dims[dims.index(max(dims))] = 1
    n = math.prod(dims)
    if rank == 0 and n == 1:
        dims[-1] = 2  # XLA would print a zero-dim tile assignment, "devices=[]<=[1]"
        n = 2
    head = "devices=[" + ",".join(map(str, dims)) + "]"
    form = draw(st.sampled_from(["iota", "iota", "explicit"]))
    if form == "explicit" and n > 1:
        if draw(st.booleans()):
            devs = draw(st.permutations(range(n)))
        else:  # an iota in disguise
            rd = draw(reshape_dims_for(n))
            perm = draw(st.permutations(range(len(rd))))
            devs = TileAssignment([n], rd, perm).array().tolist()
        body = head + ",".join(map(str, devs))
    else:
        rd = draw(reshape_dims_for(n))
        perm = draw(st.permutations(range(len(rd))))
        body = head + "<=[" + ",".join(map(str, rd)) + "]"
        if len(rd) > 1:
            body += "T(" + ",".join(map(str, perm)) + ")"
    return body + attrs


@st.composite
def metadata_text(draw) -> str:
    def one() -> str:
        parts = []
        if draw(st.booleans()):
            name = draw(st.sampled_from(["a", "jit(f)/dot", "x\\ty", "q\\\"z"]))
            parts.append('op_name="' + name + '"')
        if draw(st.booleans()):
            parts.append('op_type="' + draw(st.sampled_from(["Add", "MatMul"])) + '"')
        if draw(st.booleans()):
            parts.append('source_file="f.py" source_line=' + str(draw(st.integers(1, 99))))
        if draw(st.booleans()):
            parts.append("source_column=" + str(draw(st.integers(1, 9))))
        draw(st.randoms(use_true_random=False)).shuffle(parts)
        return " ".join(parts)
    if draw(st.booleans()):
        return " metadata={" + one() + "}"
    entries = ["{" + one() + "}" for _ in range(draw(st.integers(1, 3)))]
    return " metadata={" + ", ".join(entries) + "}"


@st.composite
def leaf_text(draw, with_metadata: bool = False) -> str:
    kind = draw(st.sampled_from(["replicated", "manual", "unknown", "unreduced", "maximal",
                                 "tiled", "tiled", "tiled", "tiled"]))
    if kind == "maximal":
        body = f"maximal device={draw(st.integers(0, 70))}"
    elif kind == "tiled":
        body = draw(tiled_text())
    else:
        body = kind
    if draw(st.integers(0, 5)) == 0:
        body += f" {draw(st.sampled_from(['shard_as', 'shard_like']))} {draw(st.integers(0, 9))}"
    if with_metadata and draw(st.booleans()):
        body += draw(metadata_text())
    return "{" + body + "}"


@st.composite
def sharding_text(draw, with_metadata: bool = False) -> str:
    if draw(st.integers(0, 6)) == 0:
        n = draw(st.integers(0, 12))
        return "{" + ", ".join(draw(leaf_text(with_metadata)) for _ in range(n)) + "}"
    return draw(leaf_text(with_metadata))


# -- oracle tests -------------------------------------------------------------------
def _xla():
    return pytest.importorskip("jaxlib._hlo", reason="jaxlib provides XLA's sharding parser")


ORACLE = settings(SETTINGS, max_examples=max(500, SETTINGS.max_examples))


@ORACLE
@given(sharding_text(with_metadata=True))
def test_print_matches_xla(text):
    hlo = _xla()
    xla = str(hlo.HloSharding.from_string(text))
    mine = parse_sharding(text)
    assert str(mine) == xla
    # XLA's output fed back in: same text as XLA prints for it.  (Usually the
    # same value again; XLA's own normalisation is not idempotent in degenerate
    # subgroup cases such as "{devices=[2]<=[2] last_tile_dims={unreduced}}".)
    xla2 = str(hlo.HloSharding.from_string(xla))
    again = parse_sharding(xla)
    assert str(again) == xla2
    if xla2 == xla:
        assert again == mine


def _xla_text_with_metadata(hlo, text: str) -> str:
    """XLA's printing with metadata, via an HLO module (HloSharding str() drops it)."""
    mod = hlo.hlo_module_from_text(
        "HloModule m\nENTRY e {\n  ROOT p = f32[2] parameter(0), sharding=" + text + "\n}")
    opts = hlo.HloPrintOptions.short_parsable()
    opts.print_metadata = True
    line = [ln for ln in mod.to_string(opts).splitlines() if "parameter(0)" in ln][0]
    return line.split("sharding=", 1)[1]


@settings(SETTINGS, max_examples=150)
@given(sharding_text(with_metadata=True))
def test_metadata_printing_matches_xla(text):
    hlo = _xla()
    xla = _xla_text_with_metadata(hlo, text)
    assert parse_sharding(text).to_string(include_metadata=True) == xla


# -- hand-written cases ------------------------------------------------------------
@pytest.mark.parametrize("text,want", [
    ("{replicated}", "{replicated}"),
    ("{maximal device=3}", "{maximal device=3}"),
    ("{manual}", "{manual}"),
    ("{unknown}", "{unknown}"),
    ("{unreduced}", "{unreduced}"),
    ("{devices=[2,1]0,1}", "{devices=[2,1]0,1}"),
    ("{devices=[2,4]<=[4,2]T(1,0)}", "{devices=[2,4]<=[4,2]T(1,0)}"),
    ("{devices=[2,2]<=[2,2]T(0,1)}", "{devices=[2,2]<=[4]}"),
    ("{devices=[2,1,2]<=[4] last_tile_dim_replicate}",
     "{devices=[2,1,2]<=[4] last_tile_dim_replicate}"),
    ("{devices=[1,1,4]<=[4] last_tile_dim_replicate}", "{replicated}"),
    ("{devices=[2,1,1]<=[2] last_tile_dim_replicate}", "{devices=[2,1]<=[2]}"),
    ("{devices=[2,1,4]<=[2,4]T(1,0) last_tile_dim_replicate}",
     "{devices=[2,1,4]<=[2,2,2]T(1,0,2) last_tile_dim_replicate}"),
    ("{devices=[2,2]3,2,1,0 last_tile_dim_replicate}",
     "{devices=[2,2]2,3,0,1 last_tile_dim_replicate}"),
    ("{devices=[2,2,2]<=[8] last_tile_dims={manual, replicated}}",
     "{devices=[2,2,2]<=[8] last_tile_dims={manual, replicated}}"),
    ("{devices=[2,3,2]<=[12] last_tile_dims={replicated,manual}}",
     "{devices=[2,2,3]<=[2,3,2]T(0,2,1) last_tile_dims={manual, replicated}}"),
    ("{devices=[2,1,1,2]<=[4] last_tile_dims={manual,replicated}}",
     "{devices=[2,1,2]<=[4] last_tile_dim_replicate}"),
    ("{devices=[1,2,2]<=[4] last_tile_dims={manual,manual}}", "{manual}"),
    ("{{replicated}, {devices=[2]<=[2]}}", "{{replicated}, {devices=[2]<=[2]}}"),
    ("{}", "{}"),
    ("{{replicated}, {manual}, {maximal device=1}, {unknown}, {replicated}, /*index=5*/"
     "{replicated}, {replicated}}",
     "{{replicated}, {manual}, {maximal device=1}, {unknown}, {replicated}, /*index=5*/"
     "{replicated}, {replicated}}"),
    ("{devices=[2]0,1 shard_like 1}", "{devices=[2]0,1 shard_like 1}"),
    ("{ replicated  shard_as 3 }", "{replicated shard_as 3}"),
])
def test_known_texts(text, want):
    s = parse_sharding(text)
    assert str(s) == want
    assert parse_sharding(want) == s


def test_metadata_round_trip():
    text = ('{devices=[2,2]<=[4] shard_as 2 metadata={{op_name="a\\"b\\n" source_line=3}, '
            '{op_type="T" profile_type={1,2}}}}')
    s = parse_sharding(text)
    assert s.metadata == (OpMetadata(op_name='a"b\n', source_line=3),
                          OpMetadata(op_type="T", profile_type=(1, 2)))
    assert s.shard_group == ShardGroup(2, True)
    printed = s.to_string(include_metadata=True)
    assert printed == ('{devices=[2,2]<=[4] shard_as 2 metadata={{op_name="a\\"b\\n" '
                       'source_line=3}, {op_type="T" profile_type={1,2}}}}')
    assert parse_sharding(printed).metadata == s.metadata
    # Metadata is not part of the value.
    assert s == s.without_metadata() and hash(s) == hash(s.without_metadata())
    assert str(s) == "{devices=[2,2]<=[4] shard_as 2}"
    assert parse_metadata('{op_name="x"}') == [OpMetadata(op_name="x")]
    assert parse_metadata("{}") == [OpMetadata()]
    assert OpMetadata(op_name="é").to_text() == 'op_name="\\303\\251"'
    parsed = parse_sharding('{replicated metadata={op_name="\\303\\251"}}')
    assert parsed.metadata[0].op_name == "é"


@pytest.mark.parametrize("text,fragment,pos", [
    ("", "expected '{'", 0),
    ("{replicated", "got end of input", 11),
    ("{replicated} x", "unexpected text after", 13),
    ("{devices=[2,2]0,1,2}", "need 4 devices, got 3", 1),
    ("{devices=[2]0,0}", "device 0 appears more than once", 1),
    ("{devices=[2]-1,0}", "negative", 1),
    ("{devices=[4]<=[2,2]T(1,2)}", "not a permutation", 1),
    ("{devices=[4]<=[2,3]T(1,0)}", "hold", 1),
    ("{devices=[2,2]<=[2,2]}", "expected 'T('", 21),
    ("{replicated manual}", "conflicting sharding kinds", 12),
    ("{maximal}", "exactly one device", 1),
    ("{device=1}", "only valid with maximal", 1),
    ("{devices=[2]0,1 replicated}", "must not have devices", 16),
    ("{devices=[1]0}", "more than one device", 1),
    ("{devices=[2,2]<=[4] last_tile_dim_replicate last_tile_dims={manual}}",
     "cannot be combined", 44),
    ("{devices=[2,2]<=[4] last_tile_dims={other}}", "subgroup type", 36),
    ("{devices=[4]<=[4] last_tile_dims={manual, replicated}}", "subgroup dims", 18),
    ("{bogus}", "unknown attribute 'bogus'", 1),
    ("{{{replicated}}}", "nested tuple", 2),
    ('{replicated metadata={op_name="a" op_name="b"}}', "already exists", 34),
    ('{replicated metadata={op_name=1}}', "quoted string", 30),
    ("{devices=[0]<=[0]}", "positive", 1),
    ("{mesh[x=2], [{x}]}", "expected a quoted mesh axis name", 6),
    ("{devices=[2]0,1 @}", "unexpected character '@'", 16),
])
def test_parse_errors_name_problem_and_position(text, fragment, pos):
    with pytest.raises(ShardingError) as ei:
        parse_sharding(text)
    msg = str(ei.value)
    assert fragment in msg
    assert f"at character {pos}" in msg
    assert getattr(ei.value, "position", None) == pos


def test_constructors_match_text():
    ta = TileAssignment([2, 2, 2])
    assert HloSharding.tile(ta, last_tile_dims=[ShardingType.MANUAL, ShardingType.REPLICATED]) \
        == parse_sharding("{devices=[2,2,2]<=[8] last_tile_dims={manual, replicated}}")
    assert HloSharding.partial_tile(TileAssignment([1, 4])) == HloSharding.replicate()
    assert HloSharding.iota_tile([2, 4], [4, 2], [1, 0]) == \
        parse_sharding("{devices=[2,4]0,2,4,6,1,3,5,7}")
    nested = HloSharding.tuple([HloSharding.tuple([HloSharding.manual()]),
                                HloSharding.replicate()])
    assert nested == parse_sharding("{{manual}, {replicated}}")
    assert HloSharding.from_string("{manual}").is_manual
    assert repr(HloSharding.maximal(2)) == "HloSharding('{maximal device=2}')"


def test_properties():
    s = parse_sharding("{devices=[2,3,2,2]<=[24] last_tile_dims={manual, replicated}}")
    assert s.is_tiled and s.is_partial_replicated and s.is_manual_subgroup
    assert s.tiled_data_rank == s.data_rank == 2
    assert s.tile_dims_for_data() == (2, 3)
    assert s.num_devices == 24 and s.num_tiles == 6
    assert s.subgroup_manual_dim == 2 and s.subgroup_replication_dim == 3
    p = parse_sharding("{devices=[2,1,2]<=[4] last_tile_dim_replicate}")
    assert p.replicate_on_last_tile_dim and p.subgroup_types == ()
    assert p.subgroup_replication_dim == 2 and p.data_rank == 2
    r = HloSharding.replicate()
    assert r.is_replicated and r.is_tile_maximal and not r.is_tiled and r.num_devices is None
    assert r.tile_dims_for_data(3) == (1, 1, 1)
    m = HloSharding.maximal(5)
    assert m.is_maximal and m.unique_device == 5 and m.num_devices == 1 and m.uses_device(5)
    t = parse_sharding("{{replicated}, {replicated}}")
    assert t.is_tuple and t.is_replicated and not t.is_manual
    assert HloSharding.manual().num_devices is None
    assert len({parse_sharding("{devices=[2,2]0,1,2,3}"),
                parse_sharding("{devices=[2,2]<=[4]}")}) == 1


def test_value_semantics():
    import copy
    import pickle
    s = parse_sharding('{{devices=[2,2,2]<=[8] last_tile_dims={manual, replicated} shard_as 1 '
                       'metadata={op_name="x"}}, {maximal device=2}}')
    t = pickle.loads(pickle.dumps(s))
    assert t == s and t.to_string(True) == s.to_string(True)
    assert copy.deepcopy(s) == s
    with pytest.raises(AttributeError):
        s._kind = "replicated"  # type: ignore[misc]
    with pytest.raises(TypeError):
        HloSharding()
    assert s.tuple_elements[0].with_shard_group(None) != s.tuple_elements[0]
    md = [OpMetadata(op_name="y")]
    assert s.with_metadata(md).tuple_elements[1].metadata == tuple(md)
    assert s.with_metadata(md, overwrite=False).tuple_elements[0].metadata[0].op_name == "x"
    assert HloSharding.tile([[0, 1], [2, 3]]) == parse_sharding("{devices=[2,2]<=[4]}")
    assert HloSharding.tile(TileAssignment([2, 2]), last_tile_dims=[4]) == \
        parse_sharding("{devices=[2,2]<=[4] last_tile_dims={manual}}")


def test_validate_for_shape():
    s = parse_sharding("{devices=[2,2]0,1,2,3}")
    s.validate_for_shape([4, 6])
    s.validate_for_shape([4, 6], num_devices=4)
    with pytest.raises(ShardingError, match="rank 3"):
        s.validate_for_shape([4, 6, 1])
    with pytest.raises(ShardingError, match="expected 8"):
        s.validate_for_shape([4, 6], num_devices=8)
    with pytest.raises(ShardingError, match=">= num_devices"):
        parse_sharding("{devices=[2]0,5}").validate_for_shape([4], num_devices=2)
    with pytest.raises(ShardingError, match="single device"):
        parse_sharding("{devices=[1,1]<=[1]}").validate_for_shape([4, 4])
    with pytest.raises(ShardingError, match="maximal device 3"):
        HloSharding.maximal(3).validate_for_shape([2], num_devices=2)
    HloSharding.replicate().validate_for_shape([7, 7], num_devices=2)
    tup = parse_sharding("{{replicated}, {devices=[2]<=[2]}}")
    tup.validate_for_shape([[3], [4]], num_devices=2)
    with pytest.raises(ShardingError, match="3 leaves"):
        tup.validate_for_shape([[3], [4], [5]])
    with pytest.raises(ShardingError, match="tuple leaf 1"):
        tup.validate_for_shape([[3], [4, 4]])
    with pytest.raises(ShardingError, match="non-tuple shape"):
        tup.validate_for_shape([3])
    with pytest.raises(ShardingError, match="tuple shape"):
        s.validate_for_shape([[4, 6]])
    rep = HloSharding.replicate()
    assert rep.normalize_for_shape([[2], [[3], [4]]]) == HloSharding.tuple([rep] * 3)
    assert rep.normalize_for_shape([2, 3]) is rep and tup.normalize_for_shape([[1]]) is tup
    parse_sharding("{}").validate_for_shape([])
    HloSharding.tuple([HloSharding.replicate()]).validate_for_shape([])
    HloSharding.replicate().validate_for_shape([])  # scalar
