"""The numpy model of "which device holds which elements", shared strategies.

Other tests/test_sharding_*.py modules import ``holder_mask`` and the hypothesis
strategies from here.  The model is written straight from the definition with
plain loops (fine for <= 64 devices) so it shares no code with the library's
vectorised implementation.  The tests at the bottom check the model itself.
"""
from __future__ import annotations

import itertools
import math
import os

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hlo_spmd.sharding import HloSharding, ShardingType, TileAssignment

# SHARDING_EXAMPLES=2000 for a deeper (slower) run.
SETTINGS = settings(max_examples=int(os.environ.get("SHARDING_EXAMPLES", "60")), deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


# -- the model ---------------------------------------------------------------------
def tile_index_of_device(s: HloSharding) -> dict[int, tuple[int, ...]]:
    """device -> full tile-array index, by scanning the array."""
    arr = s.tile_assignment.array()
    return {int(arr[idx]): idx for idx in itertools.product(*[range(d) for d in arr.shape])}


def holder_mask(s: HloSharding, dims, num_devices: int) -> np.ndarray:
    """bool [num_devices, *dims]: True where the device holds that real element."""
    dims = tuple(dims)
    mask = np.zeros((num_devices,) + dims, dtype=bool)
    if s.kind in ("replicated", "manual", "unreduced"):
        mask[:] = True
        return mask
    if s.kind == "maximal":
        mask[s.device] = True
        return mask
    assert s.kind == "tiled"
    r = s.tiled_data_rank
    tiles = s.tile_assignment.dims[:r]
    for dev, idx in tile_index_of_device(s).items():
        sl = []
        for i in range(r):
            size = -(-dims[i] // tiles[i])
            sl.append(slice(min(idx[i] * size, dims[i]), min((idx[i] + 1) * size, dims[i])))
        mask[(dev,) + tuple(sl)] = True
    return mask


def manual_group_of_device(s: HloSharding) -> dict[int, int]:
    """device -> manual subgroup index (0 when there is no manual subgroup)."""
    m = s.subgroup_manual_dim
    return {d: (idx[m] if m is not None else 0) for d, idx in tile_index_of_device(s).items()}


# -- strategies --------------------------------------------------------------------
def prime_factors(n: int) -> list[int]:
    """Prime factors of n with multiplicity (shared by the sharding test strategies)."""
    out, f = [], 2
    while n > 1:
        while n % f == 0:
            out.append(f)
            n //= f
        f += 1
    return out


@st.composite
def reshape_dims_for(draw, n: int) -> list[int]:
    """A random factorisation of n (random grouping of prime factors, maybe 1s)."""
    factors = prime_factors(n)
    rnd = draw(st.randoms(use_true_random=False))
    rnd.shuffle(factors)
    dims: list[int] = []
    for f in factors:
        if dims and rnd.random() < 0.4:
            dims[-1] *= f
        else:
            dims.append(f)
    if not dims or rnd.random() < 0.15:
        dims.insert(rnd.randrange(len(dims) + 1), 1)
    return dims


@st.composite
def tile_assignments(draw, dims) -> TileAssignment:
    """Iota (random reshape/transpose) or explicit (random permutation) of prod(dims)."""
    n = math.prod(dims)
    kind = draw(st.sampled_from(["iota", "iota", "explicit", "explicit_iota"]))
    if kind == "explicit" and n > 1:
        perm = draw(st.permutations(range(n)))
        return TileAssignment.from_devices(dims, perm)
    rd = draw(reshape_dims_for(n))
    perm = draw(st.permutations(range(len(rd))))
    ta = TileAssignment(dims, rd, perm)
    return ta.explicit() if kind == "explicit_iota" and n > 1 else ta


@st.composite
def tile_dims(draw, rank: int, max_devices: int = 64, choices=(1, 1, 2, 2, 3, 4)) -> list[int]:
    out: list[int] = []
    for _ in range(rank):
        budget = max_devices // max(1, math.prod(out))
        opts = [c for c in choices if c <= budget] or [1]
        out.append(draw(st.sampled_from(opts)))
    return out


@st.composite
def tiled_shardings(draw, max_rank: int = 4, max_devices: int = 64, min_rank: int = 1,
                    subgroups: bool = True, manual: bool = True) -> HloSharding:
    """Tiled shardings with random partial replication / manual subgroups."""
    rank = draw(st.integers(min_rank, max_rank))
    data = draw(tile_dims(rank, max_devices // 2))
    if math.prod(data) < 2:
        data[draw(st.integers(0, rank - 1))] = 2  # always tiled, never replicated
    budget = max_devices // math.prod(data)
    mode = draw(st.sampled_from(["full", "replicate", "replicate", "manual"]
                                if subgroups else ["full"]))
    if mode == "manual" and not manual:
        mode = "replicate"
    if mode == "full" or budget < 2:
        return HloSharding.tile(draw(tile_assignments(data)))
    if mode == "replicate":
        rep = draw(st.sampled_from([c for c in (2, 3, 4) if c <= budget] or [1]))
        return HloSharding.tile(draw(tile_assignments(data + [rep])),
                                replicate_on_last_tile_dim=True)
    man = draw(st.sampled_from([c for c in (2, 3) if c <= budget] or [1]))
    rep = draw(st.sampled_from([c for c in (1, 2) if c * man <= budget] or [1]))
    types = [ShardingType.MANUAL, ShardingType.REPLICATED]
    return HloSharding.tile(draw(tile_assignments(data + [man, rep])), last_tile_dims=types)


@st.composite
def sharding_on_devices(draw, n: int, rank: int) -> HloSharding:
    """A tiled sharding over exactly devices 0..n-1 (prime factors spread over dims)."""
    dims = [1] * (rank + 1)
    for f in prime_factors(n):
        dims[draw(st.integers(0, rank))] *= f
    ta = draw(tile_assignments(dims))
    return HloSharding.tile(ta, replicate_on_last_tile_dim=True)


@st.composite
def shapes_for(draw, s: HloSharding, max_dim: int = 9,
               max_elements: int = 2048) -> tuple[int, ...]:
    """Array dims for a sharding: often uneven, sometimes smaller than the tile count.

    High-rank shapes get small dims so the model's masks stay small.
    """
    tiles = s.tile_dims_for_data()
    dims: list[int] = []
    for i, t in enumerate(tiles):
        rest = math.prod(tiles[i + 1:])  # leave room for at least 1 element per tile
        cap = max(1, max_elements // (math.prod(dims) * rest))
        dims.append(draw(st.integers(1, max(1, min(max(max_dim, t + 2), cap)))))
    return tuple(dims)


@st.composite
def sharding_and_shape(draw, **kw):
    """(tiled sharding, shape); rank 1..8 unless max_rank is given."""
    kw.setdefault("max_rank", 8)
    s = draw(tiled_shardings(**kw))
    return s, draw(shapes_for(s))


# -- tests of the model itself ----------------------------------------------------
def test_model_small_cases():
    s = HloSharding.tile(TileAssignment([2, 1]))
    m = holder_mask(s, (3, 2), 2)
    assert m[0].tolist() == [[True, True], [True, True], [False, False]]
    assert m[1].tolist() == [[False, False], [False, False], [True, True]]
    p = HloSharding.partial_tile(TileAssignment([2, 2]))
    m = holder_mask(p, (4,), 4)
    assert m[0].tolist() == m[1].tolist() == [True, True, False, False]
    assert m[2].tolist() == m[3].tolist() == [False, False, True, True]
    assert holder_mask(HloSharding.maximal(1), (2,), 3).tolist() == [[False] * 2, [True] * 2,
                                                                    [False] * 2]


@SETTINGS
@given(sharding_and_shape())
def test_model_tiles_cover_every_element_once_per_replica(ss):
    s, dims = ss
    n = s.tile_assignment.num_devices
    m = holder_mask(s, dims, n)
    reps = n // s.num_tiles
    assert (m.sum(axis=0) == reps).all()


@SETTINGS
@given(st.data())
def test_strategies_make_valid_shardings(data):
    s = data.draw(tiled_shardings())
    assert s.is_tiled or s.is_replicated or s.is_manual
    if s.is_tiled:
        flat = s.tile_assignment.flat()
        assert sorted(flat.tolist()) == list(range(flat.size))
