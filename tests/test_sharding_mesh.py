"""mesh_split / named_split against a mesh-coordinate model and JAX's NamedSharding."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_sharding_model import SETTINGS, manual_group_of_device, tile_index_of_device

from hlo_spmd.errors import ShardingError
from hlo_spmd.sharding import HloSharding, mesh_split, named_split, parse_sharding


@st.composite
def mesh_case(draw):
    naxes = draw(st.integers(1, 4))
    shape = [draw(st.sampled_from([1, 2, 2, 3, 4])) for _ in range(naxes)]
    while math.prod(shape) > 64:
        shape[shape.index(max(shape))] = 1
    n = math.prod(shape)
    if draw(st.booleans()):
        mesh = np.asarray(draw(st.permutations(range(n)))).reshape(shape)
    else:
        mesh = tuple(shape)
    rank = draw(st.integers(0, 4))
    axes = draw(st.permutations(range(naxes)))
    mapping: list = [None] * rank
    for a in axes:
        slot = draw(st.integers(0, rank + 1))  # rank, rank+1: unused / manual
        if slot < rank:
            mapping[slot] = a if mapping[slot] is None else \
                (tuple(mapping[slot]) if isinstance(mapping[slot], tuple) else
                 (mapping[slot],)) + (a,)
        elif slot == rank + 1:
            mapping.append(("manual", a))
    manual = [m[1] for m in mapping[rank:]]
    dims_mapping = [-1 if m is None else m for m in mapping[:rank]]
    return mesh, shape, dims_mapping, manual


@SETTINGS
@given(mesh_case())
def test_mesh_split_places_devices_by_mesh_coordinates(case):
    mesh, shape, dims_mapping, manual = case
    s = mesh_split(len(dims_mapping), mesh, dims_mapping, manual_axes=manual)
    dev_mesh = np.arange(math.prod(shape)).reshape(shape) if isinstance(mesh, tuple) else mesh
    if isinstance(mesh, tuple):
        assert not s.is_tiled or s.tile_assignment.is_iota

    def radix(coords, axes):
        v = 0
        for a in axes:
            v = v * shape[a] + int(coords[a])
        return v

    axes_of = [[] if m == -1 else ([m] if isinstance(m, int) else list(m)) for m in dims_mapping]
    if not s.is_tiled:
        sharded = [a for ax in axes_of for a in ax if shape[a] > 1]
        assert not sharded
        if s.is_manual:
            assert any(shape[a] > 1 for a in manual)
        return
    idx = tile_index_of_device(s)
    groups = manual_group_of_device(s)
    seen: dict[int, int] = {}
    for coords in np.ndindex(*shape):
        dev = int(dev_mesh[coords])
        want = [radix(coords, ax) for ax in axes_of]
        assert list(idx[dev][: len(dims_mapping)]) == want
        if manual:
            # Devices agree on the manual group iff they agree on the manual axes.
            key = radix(coords, manual)
            assert seen.setdefault(key, groups[dev]) == groups[dev]
    assert s.tile_dims_for_data() == tuple(math.prod(shape[a] for a in ax) for ax in axes_of)


@SETTINGS
@given(st.data())
def test_named_split_matches_jax(data):
    pytest.importorskip("jax")
    from jax._src import mesh as mesh_lib
    from jax.sharding import NamedSharding, PartitionSpec

    naxes = data.draw(st.integers(1, 3))
    names = ["x", "y", "z"][:naxes]
    sizes = [data.draw(st.sampled_from([1, 2, 3, 4])) for _ in names]
    rank = data.draw(st.integers(1, 4))
    spec: list = [None] * rank
    for name in data.draw(st.permutations(names)):
        slot = data.draw(st.integers(0, rank))
        if slot < rank:
            spec[slot] = name if spec[slot] is None else \
                (spec[slot] if isinstance(spec[slot], tuple) else (spec[slot],)) + (name,)
    am = mesh_lib.AbstractMesh(tuple(sizes), tuple(names))
    want = NamedSharding(am, PartitionSpec(*spec))._to_xla_hlo_sharding(rank)
    mine = named_split(rank, list(zip(names, sizes)), spec)
    assert str(mine) == str(want)


def test_examples():
    assert str(mesh_split(2, (2, 4), [0, -1])) == "{devices=[2,1,4]<=[8] last_tile_dim_replicate}"
    assert str(mesh_split(2, (2, 4), [1, 0])) == "{devices=[4,2]<=[2,4]T(1,0)}"
    assert str(mesh_split(2, np.arange(8).reshape(2, 4), [1, 0])) == \
        "{devices=[4,2]<=[2,4]T(1,0)}"
    assert str(mesh_split(2, np.array([[3, 2], [1, 0]]), [0, 1])) == "{devices=[2,2]3,2,1,0}"
    assert mesh_split(2, (2, 2), [-1, -1]).is_replicated
    assert mesh_split(0, (4,), []).is_replicated
    assert str(mesh_split(2, (2, 2, 2), [0, -1], manual_axes=[2])) == \
        "{devices=[2,1,2,2]<=[2,2,2]T(0,2,1) last_tile_dims={manual, replicated}}"
    assert mesh_split(1, (4,), [-1], manual_axes=[0]).is_manual
    assert str(named_split(3, {"data": 2, "model": 4}, ["data", None, "model"])) == \
        "{devices=[2,1,4]<=[8]}"
    assert str(named_split(2, {"x": 2, "y": 4}, [("y", "x")])) == \
        "{devices=[8,1]<=[2,4]T(1,0)}"
    devs = np.array([[0, 2], [1, 3]])
    assert named_split(1, [("a", 2), ("b", 2)], ["b"], devices=devs) == \
        parse_sharding("{devices=[2,2]0,1,2,3 last_tile_dim_replicate}")


@pytest.mark.parametrize("call,fragment", [
    (lambda: mesh_split(2, (2, 2), [0]), "has 1 entries"),
    (lambda: mesh_split(2, (2, 2), [0, 0]), "more than one tensor dim"),
    (lambda: mesh_split(1, (2, 2), [2]), "mesh has 2 axes"),
    (lambda: mesh_split(1, (2, 2), [0], manual_axes=[0]), "both shard data and be manual"),
    (lambda: mesh_split(1, np.array([0, 0]), [0]), "distinct"),
    (lambda: named_split(1, {"x": 2}, ["y"]), "unknown mesh axis 'y'"),
    (lambda: named_split(1, {"x": 2}, ["x", None]), "more entries than the tensor rank"),
    (lambda: named_split(1, {"x": 2}, ["x"], devices=np.arange(4)), "does not match"),
])
def test_errors(call, fragment):
    with pytest.raises(ShardingError, match=fragment):
        call()


def test_2048_device_mesh_stays_iota():
    s = named_split(3, {"dp": 16, "fsdp": 8, "tp": 16}, [("dp", "fsdp"), None, "tp"])
    assert s.tile_assignment.is_iota and s.num_tiles == 2048
    assert str(s) == "{devices=[128,1,16]<=[2048]}"
    s2 = named_split(2, {"dp": 16, "fsdp": 8, "tp": 16}, ["tp", "dp"])
    assert s2.tile_assignment.is_iota
    assert str(s2) == "{devices=[16,16,8]<=[128,16]T(1,0) last_tile_dim_replicate}"
    assert isinstance(s2, HloSharding)
