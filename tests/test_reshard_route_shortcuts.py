"""reshard_routes' exact shortcuts against the full route search (no XLA needed).

``_chosen_plan`` answers "through replicated" from the tile counts alone when the source
or the target is untiled (``_replicated_route_wins``); here every such answer is checked
against what ``plan_reshard``'s whole search decides, on random shapes (uneven dims
included), element sizes, device orders and meshes of up to 256 devices.
"""
from __future__ import annotations

import math

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hlo_spmd.passes.partition.reshard_routes import (_replicated_route_wins, layout_of,
                                                      plan_reshard)
from hlo_spmd.sharding import HloSharding


@st.composite
def tiled(draw, n: int, rank: int, untiled: bool) -> HloSharding:
    """Over n (a power of 2) devices in a random order; ``untiled``: all data tiles 1
    (replicated, or a partial tiling that replicates everything)."""
    if untiled and draw(st.booleans()):
        return HloSharding.replicate()
    tiles = [1] * (rank + 1)
    for _ in range(int(math.log2(n))):
        tiles[rank if untiled else draw(st.integers(0, rank))] *= 2
    order = np.asarray(draw(st.permutations(range(n)))) if draw(st.booleans()) \
        else np.arange(n)
    arr = order.reshape(tiles)
    if tiles[-1] > 1:
        return HloSharding.partial_tile(arr)
    return HloSharding.tile(arr.reshape(tiles[:-1]))


@st.composite
def problems(draw):
    n = draw(st.sampled_from([2, 4, 8, 16, 64, 256]))
    rank = draw(st.integers(1, 4))
    dims = tuple(draw(st.lists(st.integers(1, 40), min_size=rank, max_size=rank)))
    side = draw(st.sampled_from(["src", "dst", "both", "neither"]))
    src = draw(tiled(n, rank, side in ("src", "both")))
    dst = draw(tiled(n, rank, side in ("dst", "both")))
    itemsize = draw(st.sampled_from([0.125, 1.0, 2.0, 4.0, 8.0]))
    return dims, src, dst, n, itemsize


@settings(max_examples=400, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(problems())
def test_shortcut_only_answers_what_the_search_answers(problem):
    dims, src, dst, n, itemsize = problem
    a, b = layout_of(src, n, len(dims)), layout_of(dst, n, len(dims))
    if a.same_as(b):
        return
    if not _replicated_route_wins(a, b, dims, itemsize):
        # Only the untiled cases may be decided here; anything else goes to the search.
        assert any(t != 1 for t in a.tiles)
        return
    assert all(t == 1 for t in a.tiles) or all(t == 1 for t in b.tiles)
    best, fallback = plan_reshard(a, b, dims, itemsize)
    assert best is None or best.key() >= fallback.key()


@settings(max_examples=200, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(problems())
def test_to_replicated_search_is_the_whole_dim_gathers(problem):
    """What the shortcut's cost sum stands for: to an untiled target the search's best
    plan gathers every tiled dim whole, in dim order, and nothing else."""
    dims, src, dst, n, itemsize = problem
    a, b = layout_of(src, n, len(dims)), layout_of(dst, n, len(dims))
    if a.same_as(b) or any(t != 1 for t in b.tiles) or all(t == 1 for t in a.tiles):
        return
    best, fallback = plan_reshard(a, b, dims, itemsize)
    assert best is not None
    assert [(type(s).__name__, s.dim, s.factor) for s in best.steps] == \
        [("AllGather", k, t) for k, t in enumerate(a.tiles) if t > 1]
    assert best.collectives == fallback.collectives
    assert len(best.steps) == len(fallback.steps)
    wins = _replicated_route_wins(a, b, dims, itemsize)
    assert wins == (best.key() >= fallback.key())
