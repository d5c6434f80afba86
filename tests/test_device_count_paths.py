"""The device-count fast paths of the sharding algebra and the route layouts give what the
plain numpy forms give (position coords, ordering by key then device, layouts of
untransposed iota shardings, iota-form early rejection)."""
import numpy as np

from hlo_spmd.passes.partition import reshard_routes as rr
from hlo_spmd.sharding import algebra
from hlo_spmd.sharding.hlo_sharding import HloSharding
from hlo_spmd.sharding.tile_assignment import TileAssignment, iota_form


def test_position_coords_match_unravel_index():
    for dims in [(), (1,), (5,), (2, 3), (4, 1, 8), (2, 2, 2, 64), (0, 3)]:
        n = int(np.prod(dims)) if dims else 1
        want = np.stack(np.unravel_index(np.arange(n), dims), axis=1) if dims \
            else np.zeros((1, 0), np.int64)
        got = algebra._position_coords.__wrapped__(dims)
        assert got.dtype == np.int64 and got.shape == want.shape
        assert np.array_equal(got, want)
        assert not got.flags.writeable


def test_order_by_key_then_device_matches_lexsort():
    rng = np.random.default_rng(0)
    for n in [8, 300, 2048]:
        for ascending in (True, False):
            devices = np.arange(n, dtype=np.int64) if ascending else rng.permutation(n)
            for tiles in [1, 4, n // 4]:
                key = rng.integers(0, tiles, n).astype(np.int64)
                want = np.lexsort((devices, key))
                assert np.array_equal(algebra._order_by_key_then_device(key, devices), want)


def test_layout_of_untransposed_iota_matches_scatter():
    for dims, rd, perm in [((4, 8, 2), (64,), (0,)), ((16, 64, 2), (2048,), (0,)),
                           ((4, 8, 2), (8, 8), (1, 0))]:
        ta = TileAssignment(dims, rd, perm)
        s = HloSharding.partial_tile(ta)
        lay = rr._layout_of(s, ta.num_devices, 2)
        devices, coords = algebra.tile_coords(s)
        want = np.empty((ta.num_devices, 2), np.int64)
        want[devices] = coords[:, :2]
        assert lay is not None and lay.tiles == (dims[0], dims[1])
        assert np.array_equal(lay.coords, want)


def test_iota_form_rejects_non_iota_starts():
    assert iota_form(np.array([1, 0, 2, 3])) is None
    assert iota_form(np.array([0, 0, 1, 2])) is None
    assert iota_form(np.array([0, 2, 1, 3])) == ((2, 2), (1, 0))
    assert iota_form(np.array([3])) is None
    assert iota_form(np.array([0])) == ((1,), (0,))
