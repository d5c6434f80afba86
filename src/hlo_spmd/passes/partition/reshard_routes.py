"""Resharding routes: any tiled / partially replicated sharding to any other, cheapest first.

A sharding is handled here as a *layout*: the number of tiles along every data dim and,
for every logical device, the data tile it holds (its replication position does not
matter: devices holding the same tile hold the same data). Layouts change through five
kinds of steps, each checked exactly (uneven dims included) before it is used:

  slice       every device cuts a finer tile out of what it holds: dynamic-slice at a
              per-device offset, no traffic (XLA's ReshardFromPartialReplicateWith-
              DynamicSlice and the replicated -> tiled case);
  halo slice  as slice, but on one dim the new tile runs past the local one (uneven
              re-tiling): the edge rows it lacks come from a neighbour tile's holder by
              one collective-permute per side (XLA's halo exchange in its partially
              replicated -> tiled reshard);
  all-gather  ``f`` neighbouring tiles of one dim are joined within groups of ``f``
              devices (XLA's ReshardToPartialReplicateWithAllGather); on an uneven dim
              one collective-permute first brings each member its piece of the coarser
              tile;
  all-to-all  a factor ``f`` of the tiling moves from dim ``a`` to dim ``b``; several
              moves (2-D swaps, one dim to two) share one all-to-all (XLA's
              ReshardWithAllToAll); uneven dims are padded first and sliced after, their
              tiles re-cut by halo exchanges where they do not split or join evenly;
  permute     same tiling, different devices: one collective-permute whose pairs come
              from matching the holders of every tile (XLA's ReshardWithCollectivePermute).

A *plan* is a chain ``[permute] slice all-to-all* all-gather* slice [permute]`` (or
ending in a halo slice instead of the gathers of uneven dims and the last slice). Candidate
plans are built from the two tilings (factors that leave a dim move to a dim that needs
them, in every order that matters; excess factors are gathered; missing ones are sliced,
before the other steps while the source's replication allows, after them otherwise), with
the device-order fix-up either last or first (on the source shards, through a pre-image of
the target), simulated on the layouts, and costed in bytes per device on the wire, each
collective as collectives/cost.py prices it for ``stats`` (``plan_cost``; ties: fewer collectives, fewer steps). The cheapest wins; when nothing
beats going through the fully replicated value, ``reshard`` keeps its baseline route.

Everything speaks in logical device ids and builds collectives through the factory, so
the routes work unchanged inside a device group.
"""
from __future__ import annotations

import itertools
import math
from functools import cached_property
from typing import TYPE_CHECKING, NamedTuple, Sequence

import numpy as np

from hlo_spmd.collectives.cost import bytes_per_device
from hlo_spmd.ir.instruction import Instruction
from hlo_spmd.ir.primitive_types import PrimitiveType
from hlo_spmd.memo import BoundedMemo
from hlo_spmd.passes.partition.local_cut import pad_to, slice_to
from hlo_spmd.passes.partition.pvalue import PValue
from hlo_spmd.sharding import HloSharding, ShardingType, tile_coords
from hlo_spmd.sharding.array_key import array_token
from hlo_spmd.sharding.device_ids import all_distinct

if TYPE_CHECKING:
    from hlo_spmd.passes.partition.state import ReshardContext

__all__ = ["Layout", "layout_of", "plan_reshard", "plan_cost", "chosen_plan",
           "reshard_with_plan",
           "Slice", "HaloSlice", "AllGather", "AllToAll", "Permute", "Plan"]


# The records here are plain classes, not dataclasses: they need no generated equality,
# and a dataclass costs ~1 ms of start-up each (Python 3.11 compiles its methods).

# -- layouts ---------------------------------------------------------------------------------
class Layout:
    """``tiles[k]`` tiles along dim k; ``coords[d]`` the data tile logical device d holds.
    Equality is identity (compare with ``same_as``); never changed once made."""

    def __init__(self, tiles: tuple[int, ...], coords: np.ndarray) -> None:
        self.tiles = tiles
        self.coords = coords  # [num_devices, rank] int64

    @property
    def num_devices(self) -> int:
        return int(self.coords.shape[0])

    @property
    def replication(self) -> int:
        return self.num_devices // math.prod(self.tiles)

    def __repr__(self) -> str:
        return f"Layout(tiles={list(self.tiles)}, tile_of_device={self.tile_ids().tolist()})"

    def same_as(self, other: "Layout") -> bool:
        if self is other:
            return True
        if self.tiles != other.tiles:
            return False
        if self.coords.dtype == other.coords.dtype:
            # The memo keys are made once per layout and name equal coords equally.
            return self.key == other.key
        return bool(np.array_equal(self.coords, other.coords))

    def tile_ids(self) -> np.ndarray:
        """Per logical device, the flat index of the tile it holds (read-only)."""
        return self._tile_ids

    # A layout's coords never change after it is made (every transform copies), and
    # route search asks the same layouts for their tile ids and memo keys many times:
    # both are O(devices) work, done once per layout object.
    @cached_property
    def _tile_ids(self) -> np.ndarray:
        if not self.tiles:
            out = np.zeros(self.num_devices, np.int64)
        else:
            out = np.ravel_multi_index(tuple(self.coords.T), self.tiles).astype(np.int64)
        out.flags.writeable = False
        return out

    @cached_property
    def key(self) -> tuple:
        """The layout as a small hashable value: tiles and the coords' array_token (the
        coords' bytes were the key: 48 KB to copy and hash a layout at 2048 devices)."""
        self.coords.flags.writeable = False  # never changed once made (see the class)
        return (self.tiles, array_token(self.coords))

    def balanced(self) -> bool:
        """Every tile held by the same number of devices (a valid sharding)."""
        return self._balanced

    @cached_property
    def _balanced(self) -> bool:
        counts = np.bincount(self.tile_ids(), minlength=math.prod(self.tiles))
        return bool(np.all(counts == self.replication)) and \
            self.replication * math.prod(self.tiles) == self.num_devices


# One device table per distinct (sharding, device count, rank): the dot planner and the
# routes ask for the same few layouts thousands of times. The cached arrays are made
# read-only (every transform copies before it writes).
_LAYOUTS = BoundedMemo(4096)  # (sharding, devices, rank) -> Layout or None


def layout_of(s: HloSharding, num_devices: int, rank: int) -> Layout | None:
    """The layout of a replicated or (partially replicated) tiled sharding over
    ``num_devices`` logical devices; None for anything else (manual / unreduced
    subgroups, maximal, tuples, a tile assignment over another device count)."""
    key = (s, num_devices, rank)
    if key in _LAYOUTS:
        return _LAYOUTS[key]
    lay = _layout_of(s, num_devices, rank)
    if lay is not None:
        lay.coords.flags.writeable = False
    return _LAYOUTS.put(key, lay)


def _layout_of(s: HloSharding, num_devices: int, rank: int) -> Layout | None:
    if s.is_tuple:
        return None
    if s.is_replicated:
        return Layout((1,) * rank, np.zeros((num_devices, rank), np.int64))
    if not s.is_tiled or s.is_manual:
        return None
    if any(t != ShardingType.REPLICATED for t in s.subgroup_types):
        return None
    if s.tiled_data_rank != rank:
        return None
    ta = s.tile_assignment
    if ta is None or ta.num_devices != num_devices:
        return None
    devices, coords = tile_coords(s)
    tiles = tuple(int(t) for t in s.tile_dims_for_data())
    perm = ta.transpose_perm if ta.is_iota else None
    if perm is not None and perm == tuple(sorted(perm)):
        # An untransposed iota lists devices 0..N-1 in position order: device d holds
        # position d, so the (read-only, shared) position coords are the layout as they
        # stand, without a device check or a scatter.
        return Layout(tiles, coords[:, :rank])
    if devices.min() < 0 or devices.max() >= num_devices or \
            not all_distinct(devices):
        return None
    out = np.empty((num_devices, rank), np.int64)
    out[devices] = coords[:, :rank]
    return Layout(tiles, out)


def _rows_all(mask: np.ndarray) -> np.ndarray:
    """``np.all(mask, axis=1)`` for a ``[devices, rank]`` mask, one column at a time:
    numpy reduces a short trailing axis row by row (~5x slower at 2048 devices)."""
    if mask.shape[1] == 0:
        return np.ones(mask.shape[0], bool)
    out = mask[:, 0].copy()
    for k in range(1, mask.shape[1]):
        out &= mask[:, k]
    return out


def _local(tiles: Sequence[int], dims: Sequence[int]) -> tuple[int, ...]:
    return tuple(-(-int(d) // int(t)) for d, t in zip(dims, tiles))


def array_bytes(shape: Sequence[int], itemsize: float) -> float:
    """Bytes of an array of ``shape`` with ``itemsize`` bytes per element, sub-byte
    elements packed and the array rounded up to whole bytes (``Shape.byte_size``: the
    size ``stats`` measures collectives on)."""
    return float(math.ceil(math.prod(shape) * itemsize))


def replicate_cost(dims: Sequence[int], itemsize: float, tiles: Sequence[int]) -> float:
    """What ``replicate`` moves from data tiles ``tiles``: one all-gather per tiled dim, in
    dim order, of the padded local array (the padding is sliced off at the end); cutting a
    tile out of the replicated value afterwards is free."""
    local = [-(-int(d) // int(t)) for d, t in zip(dims, tiles)]
    total = 0.0
    for k, t in enumerate(tiles):
        if t > 1:
            local[k] *= t
            gathered = array_bytes(local, itemsize)
            total += bytes_per_device("all-gather", gathered / t, gathered, int(t))
    return total


_nbytes = array_bytes


def _groups(keys: np.ndarray, member: np.ndarray, size: int) -> np.ndarray | None:
    """Device groups ``[G, size]``: devices sharing a key row form ``R`` groups, member
    ``m`` of a group being a device whose ``member`` value is m (the i-th such device by
    id goes to the i-th group). None unless every (key, member) class has R devices."""
    n = keys.shape[0]
    if keys.shape[1]:
        # Rows of small non-negative coordinates: one mixed-radix integer per row keeps
        # their lexicographic order, and a 1-D unique is far cheaper than a row unique.
        radix = keys.max(axis=0).astype(np.int64) + 1
        if keys.min() >= 0 and float(np.prod(radix.astype(np.float64))) < 2.0 ** 62:
            flat = np.ravel_multi_index(tuple(keys.T.astype(np.int64)), tuple(radix))
            _, key_id = np.unique(flat, return_inverse=True)
        else:
            _, key_id = np.unique(keys, axis=0, return_inverse=True)
        key_id = key_id.reshape(-1).astype(np.int64)
    else:
        key_id = np.zeros(n, np.int64)
    num_keys = int(key_id.max()) + 1 if n else 0
    cls = key_id * size + member
    counts = np.bincount(cls, minlength=num_keys * size)
    if counts.size != num_keys * size or np.any(counts != counts[0]) or counts[0] == 0:
        return None
    reps = int(counts[0])
    order = np.lexsort((np.arange(n), cls))
    rank = np.arange(n) - np.repeat(np.arange(num_keys * size) * reps, reps)
    out = np.empty((num_keys * reps, size), np.int64)
    out[key_id[order] * reps + rank, member[order]] = order
    return out


def _assign(region: np.ndarray, pref: np.ndarray, nsub: int, cap: int) -> np.ndarray | None:
    """Give every device a sub-position 0..nsub-1 of its region, each used by exactly
    ``cap`` devices of every region, honouring ``pref`` (-1: none) where capacity allows."""
    n = region.size
    num_regions = int(region.max()) + 1 if n else 0
    if np.any(np.bincount(region, minlength=num_regions) != nsub * cap):
        return None
    has = pref >= 0
    if has.all():
        # Every device has a preference: when each (region, sub-position) is preferred
        # by exactly ``cap`` devices, the preferences are the answer (what the general
        # path below gives, without its sorts).
        counts = np.bincount(region * nsub + pref, minlength=num_regions * nsub)
        if counts.size == num_regions * nsub and np.all(counts == cap):
            return pref.astype(np.int64, copy=True)
    out = np.full(n, -1, np.int64)
    key = np.where(has, region * nsub + pref, -1)
    order = np.lexsort((np.arange(n), key))
    sk = key[order]
    first = np.searchsorted(sk, sk, side="left")
    rank = np.arange(n) - first
    keep = (sk >= 0) & (rank < cap)
    out[order[keep]] = sk[keep] % nsub
    kept = np.bincount(sk[keep], minlength=num_regions * nsub) if keep.any() \
        else np.zeros(num_regions * nsub, np.int64)
    left = cap - kept[: num_regions * nsub]
    slots = np.repeat(np.arange(num_regions * nsub), left)
    rest = np.nonzero(out < 0)[0]
    rest = rest[np.lexsort((rest, region[rest]))]
    if slots.size != rest.size:
        return None
    out[rest] = slots % nsub
    return out


# Device groups of a step per distinct (step, layout): every layer of a model emits the
# same reshards, and the groups are O(devices) numpy work (np.unique, lexsort) per call.
_STEP_GROUPS = BoundedMemo(1024)  # keys hold O(devices) bytes


def _step_groups(step_key: tuple, lay: "Layout", make) -> "np.ndarray | None":
    key = (step_key, lay.key)
    if key in _STEP_GROUPS:
        return _STEP_GROUPS[key]
    out = make(lay)
    if out is not None:
        out.flags.writeable = False
    return _STEP_GROUPS.put(key, out)


# Layouts after a gather or an all-to-all per distinct (step, layout, dims): route search
# realizes and then simulates every candidate chain, mostly the same steps from the same
# layouts. A shared result also keeps its cached tile ids and key for the next lookups.
_APPLIED = BoundedMemo(4096)  # keys hold O(devices) bytes


def _applied(step_key: tuple, lay: "Layout", dims: tuple[int, ...], make) -> "Layout | None":
    key = (step_key, lay.key, dims)
    if key in _APPLIED:
        return _APPLIED[key]
    out = make(lay, dims)
    if out is not None:
        out.coords.flags.writeable = False
    return _APPLIED.put(key, out)


# -- steps -----------------------------------------------------------------------------------
class Step:
    collectives = 0

    def apply(self, lay: Layout, dims: tuple[int, ...]) -> Layout | None:
        raise NotImplementedError

    def cost(self, lay: Layout, dims: tuple[int, ...], itemsize: float) -> float:
        return 0.0

    def peak(self, lay: Layout, dims: tuple[int, ...], itemsize: float) -> float:
        """Bytes per device of the largest array ``emit`` makes from the value (its data
        padded, gathered, exchanged or cut; not the offset tables)."""
        raise NotImplementedError

    def count(self, lay: Layout, dims: tuple[int, ...]) -> int:
        """The collectives the step emits from ``lay``."""
        return self.collectives

    def emit(self, ctx: "ReshardContext", x: Instruction, lay: Layout,
             dims: tuple[int, ...]) -> Instruction:
        raise NotImplementedError


# Slice offsets per distinct (layout, target layout, dims); see Slice._offsets.
_OFFSETS = BoundedMemo(4096)
_SLICE_FORMS = BoundedMemo(4096)  # the same key -> Slice._emit_form


class Slice(Step):
    """Cut ``to``'s tile out of the local buffer (pad first where a tile runs past it)."""

    def __init__(self, to: Layout) -> None:
        self.to = to
        # (id(source layout), dims) -> (layout, what ``emit`` builds from): a chosen plan's
        # steps are shared by every reshard taking it (one per instruction of every layer).
        self._emits: dict[tuple, tuple] = {}

    def _offsets(self, lay: Layout, dims):
        # Pure in the two layouts and the dims, and asked for by route search and emit
        # alike: one computation per distinct value (the arrays are [num_devices, rank],
        # so this is work that grows with the device count). Results are read-only.
        key = (lay.key, self.to.key, tuple(int(v) for v in dims))
        if key in _OFFSETS:
            return _OFFSETS[key]
        out = self._offsets_uncached(lay, dims)
        if out is not None:
            for a in out:
                a.flags.writeable = False
        return _OFFSETS.put(key, out)

    def _offsets_uncached(self, lay: Layout, dims):
        lx = np.asarray(_local(lay.tiles, dims), np.int64)
        ly = np.asarray(_local(self.to.tiles, dims), np.int64)
        n, rank = self.to.coords.shape
        # Dim by dim on [devices] columns: numpy broadcasts a [devices, rank] array
        # against a [rank] row several times slower than it runs rank 1-D operations.
        empty = np.zeros(n, bool)  # the whole target tile is padding
        ok = np.ones(n, bool)
        starts = []
        for k in range(rank):
            d, a, b = int(dims[k]), int(lx[k]), int(ly[k])
            xs = lay.coords[:, k] * a
            ys = self.to.coords[:, k] * b
            empty |= ys >= d
            ok &= (xs <= ys) & (np.minimum(ys + b, d) <= np.minimum(xs + a, d))
            starts.append(ys - xs)
        ok |= empty
        if not np.all(ok):
            return None
        off = np.stack(starts, axis=1) if rank else np.zeros((n, 0), np.int64)
        off[empty] = 0
        return off, lx, ly

    def _emit_form(self, lay: Layout, dims, off: np.ndarray, lx: np.ndarray, ly: np.ndarray
                   ) -> tuple[tuple[int, ...], bool, bool]:
        # (padded size, all offsets zero, the same offsets on every device) of an offsets
        # table: [num_devices, rank] reductions that every emission of the same slice (one
        # per instruction of every layer) would otherwise redo. Keyed as _offsets.
        key = (lay.key, self.to.key, tuple(int(v) for v in dims))
        hit = _SLICE_FORMS.get(key)
        if hit is None:
            need = np.maximum((off + ly).max(axis=0), lx) if off.size else lx
            hit = _SLICE_FORMS.put(key, (tuple(int(v) for v in need), bool(np.all(off == 0)),
                                         bool(np.all(off == off[:1]))))
        return hit

    def __repr__(self) -> str:
        return f"Slice(to {self.to!r})"

    def apply(self, lay, dims):
        if self.to.num_devices != lay.num_devices or self._offsets(lay, dims) is None:
            return None
        return self.to

    def peak(self, lay, dims, itemsize):
        off, lx, ly = self._offsets(lay, dims)
        need, zero, _ = self._emit_form(lay, dims, off, lx, ly)
        padded = _nbytes(need, itemsize) if need != tuple(int(v) for v in lx) else 0.0
        cut = 0.0 if zero and tuple(int(v) for v in ly) == need else _nbytes(ly, itemsize)
        return max(padded, cut)

    def emit(self, ctx, x, lay, dims):
        key = (id(lay), tuple(dims))
        got = self._emits.get(key)
        if got is None:  # (the layout is held, so its id stays its own)
            off, lx, ly = self._offsets(lay, dims)
            need, zero, uniform = self._emit_form(lay, dims, off, lx, ly)
            sizes = tuple(int(v) for v in ly)
            lo = [int(v) for v in off[0]] if uniform else None
            columns = None if uniform else [_frozen_copy(off[:, k]) for k in range(len(dims))]
            got = self._emits[key] = (lay, list(need), zero, sizes, lo, columns)
        _, need, zero, sizes, lo, columns = got
        x = pad_to(ctx, x, need)
        if zero and sizes == tuple(x.shape.dims):
            return x
        if lo is not None:  # the same offsets everywhere: a static slice
            return ctx.b.slice(x, lo, [a + b for a, b in zip(lo, sizes)])
        starts = [ctx.logical_table(c) for c in columns]
        return ctx.b.dynamic_slice(x, starts, list(sizes))


def _frozen_copy(a: np.ndarray) -> np.ndarray:
    """A read-only contiguous copy: a table every emission of a slice looks up, which the
    factory's memo then knows by identity."""
    out = np.array(a, dtype=a.dtype, copy=True, order="C")
    out.flags.writeable = False
    return out


class AllGather(Step):
    """Join ``factor`` neighbouring tiles of ``dim`` (the minor part of its tile index).

    ``realign`` (uneven dims, where the joined tiles are not the coarser tiles: 8 tiles
    of 1 row of 2 joined in fours hold rows 0-3 and 4-7, not 0 and 1): first one
    collective-permute brings every group member its piece of the coarser tile (member m
    of group J: ``p`` rows from J * coarse + m * p, p = coarse / factor rounded up, each
    piece inside one source tile), then the pieces are joined (XLA's halo exchange with
    padding ahead of a partially replicated target)."""
    collectives = 1

    def __init__(self, dim: int, factor: int, realign: bool = False) -> None:
        self.dim = dim
        self.factor = factor
        self.realign = realign

    def __repr__(self) -> str:
        return f"AllGather(dim={self.dim!r}, factor={self.factor!r}, realign={self.realign!r})"

    def apply(self, lay, dims):
        return _applied(("all-gather", self.dim, self.factor, self.realign), lay, tuple(dims),
                        self._apply)

    def _uneven(self, lay, dims) -> bool:
        t, f, d = lay.tiles[self.dim], self.factor, dims[self.dim]
        return t // f > 1 and f * -(-d // t) != -(-d // (t // f))

    def _recut(self, lay, dims):
        """(piece rows, pairs or None when every piece is already local, per-device offset
        of the piece to send in the local tile, data members per group) for a realigning
        gather; None when a piece spans two source tiles or holders do not suffice."""
        key = (("all-gather-recut", self.dim, self.factor), lay.key, tuple(dims))
        if key in _RECUTS:
            return _RECUTS[key]
        return _RECUTS.put(key, self._recut_uncached(lay, dims))

    def _recut_uncached(self, lay, dims):
        k, f = self.dim, self.factor
        t, d = lay.tiles[k], int(dims[k])
        length = -(-d // t)
        coarse = -(-d // (t // f))
        p = -(-coarse // f)
        c = lay.coords[:, k]
        group, member = c // f, c % f
        start = group * coarse + member * p
        end = np.minimum(np.minimum(start + p, (group + 1) * coarse), d)
        valid = start < end
        src_tile = start // length
        if np.any(valid & (end > (src_tile + 1) * length)):
            return None  # a piece spans two source tiles
        need = lay.coords.copy()
        need[:, k] = np.where(valid, src_tile, c)
        own = lay.tile_ids()
        want = np.ravel_multi_index(tuple(need.T), lay.tiles).astype(np.int64)
        mine = valid & (want == own)
        recv = np.nonzero(valid & ~mine)[0]
        off = np.where(valid, start - src_tile * length, 0)
        send = np.zeros(lay.num_devices, np.int64)
        send[mine] = off[mine]
        pairs = None
        if recv.size:
            # A device keeping its own piece sends it to itself; others serve receivers.
            holders = np.where(mine, -1, own)
            moved = _match_holders(holders, recv, want[recv])
            if moved is None:
                return None
            send[moved[:, 0]] = off[moved[:, 1]]
            keep = np.nonzero(mine)[0]
            pairs = np.concatenate([np.stack([keep, keep], axis=1), moved]).astype(np.int64)
            pairs.flags.writeable = False
        send.flags.writeable = False
        # (Members with a piece come first in every group.)
        counts = np.bincount(np.ravel_multi_index(
            tuple(np.concatenate([lay.coords[:, :k], group[:, None], lay.coords[:, k + 1:]],
                                 axis=1).T),
            tuple(lay.tiles[:k]) + (t // f,) + tuple(lay.tiles[k + 1:])), weights=valid)
        return p, pairs, send, int(counts.max()) if counts.size else 0

    def _apply(self, lay, dims):
        t = lay.tiles[self.dim]
        f = self.factor
        if f < 2 or t % f:
            return None
        if self._uneven(lay, dims):
            if not self.realign or self._recut(lay, dims) is None:
                return None  # the joined tiles would not be the coarser tiles (uneven dim)
        elif self.realign:
            return None  # (nothing to realign: the plain gather)
        coords = lay.coords.copy()
        coords[:, self.dim] //= f
        tiles = list(lay.tiles)
        tiles[self.dim] = t // f
        return Layout(tuple(tiles), coords)

    def groups(self, lay):
        return _step_groups(("all-gather", self.dim, self.factor), lay, self._groups)

    def _groups(self, lay):
        keys = lay.coords.copy()
        keys[:, self.dim] //= self.factor
        return _groups(keys, lay.coords[:, self.dim] % self.factor, self.factor)

    def data_tiles(self, lay, dims) -> int:
        """How many of the joined tiles hold data when the whole dim is joined and the
        trailing ones are all padding (a size-1 slice of a stage-sharded dim: only tile 0);
        ``factor`` otherwise. Realigning: the members holding a piece."""
        if self.realign:
            return self._recut(lay, dims)[3]
        t, d = lay.tiles[self.dim], int(dims[self.dim])
        if t != self.factor:
            return self.factor
        return min(self.factor, -(-d // -(-d // t)))

    def masked(self, lay, dims) -> bool:
        """Whether the join is cheaper as one all-reduce of the ``data_tiles`` tiles placed
        at their offsets (zeros elsewhere): 2 (f-1)/f * k tiles against the gather's
        (f-1) tiles, i.e. when fewer than half of the tiles hold data."""
        return 2 * self.data_tiles(lay, dims) < self.factor

    def count(self, lay, dims):
        return 1 + (self.realign and self._recut(lay, dims)[1] is not None)

    def cost(self, lay, dims, itemsize):
        local = list(_local(lay.tiles, dims))
        total = 0.0
        if self.realign:
            p, pairs, _, _ = self._recut(lay, dims)
            local[self.dim] = p
            if pairs is not None:
                size = _nbytes(local, itemsize)
                total = bytes_per_device("collective-permute", size, size, 2)
        return total + self._join_cost(lay, dims, itemsize, local)

    def _join_cost(self, lay, dims, itemsize, local):
        part = _nbytes(local, itemsize)
        if self.masked(lay, dims):
            span = list(local)  # (the summed array, rounded up as ``stats`` counts it)
            span[self.dim] *= self.data_tiles(lay, dims)
            k = _nbytes(span, itemsize)
            return bytes_per_device("all-reduce", k, k, self.factor)
        local[self.dim] *= self.factor
        return bytes_per_device("all-gather", part, _nbytes(local, itemsize), self.factor)

    def peak(self, lay, dims, itemsize):
        # the gathered (or, masked, the summed span of the data tiles) array; the slice
        # of the padding that follows is smaller
        local = list(_local(lay.tiles, dims))
        held = list(local)
        local[self.dim] *= self.data_tiles(lay, dims) if self.masked(lay, dims) else \
            self.factor
        peak = _nbytes(local, itemsize)
        recut = self._recut(lay, dims) if self.realign else None
        if recut is not None:
            p, _, send, _ = recut
            if p != held[self.dim] or send.any():  # (as ``emit``: the tile padded to
                held[self.dim] += p                 # hold the piece it sends)
                peak = max(peak, _nbytes(held, itemsize))
        return peak

    def emit(self, ctx, x, lay, dims):
        if self.realign:
            # Each device cuts the piece it sends (pad first: a piece may run past the
            # tile's end, into padding); one permute brings every member its piece.
            p, pairs, send, _ = self._recut(lay, dims)
            local = list(x.shape.dims)
            if p != local[self.dim] or send.any():  # (else every piece is the whole tile)
                padded = list(local)
                padded[self.dim] += p
                x = pad_to(ctx, x, padded)
                sizes = list(local)
                sizes[self.dim] = p
                zero = ctx.b.constant(np.int64(0), PrimitiveType.S32)
                starts = [zero] * len(local)
                starts[self.dim] = ctx.logical_table(send)
                x = ctx.b.dynamic_slice(x, starts, sizes)
            if pairs is not None:
                x = ctx.f.collective_permute(x, pairs)
        if self.masked(lay, dims):
            x = self._masked_sum(ctx, x, lay, dims)
        else:
            x = ctx.f.all_gather(x, self.dim, self.groups(lay))
        new = self.apply(lay, dims)
        return slice_to(ctx, x, _local(new.tiles, dims))

    def _masked_sum(self, ctx, x, lay, dims):
        # Every device writes its tile at its offset into zeros spanning the k data tiles
        # (a device whose tile is all padding writes nothing), then the group sums.
        k = self.data_tiles(lay, dims)
        b = ctx.b
        et = x.shape.element_type
        pos = lay.coords[:, self.dim] % self.factor
        holds = ctx.logical_table((pos < k).astype(np.int64))
        pred = b.compare(holds, b.constant(np.int64(1), PrimitiveType.S32), "EQ")
        zero = b.scalar(0, x)
        local = list(x.shape.dims)
        if k > 1:
            span = list(local)
            span[self.dim] *= k
            starts = [b.constant(np.int64(0), PrimitiveType.S32)] * len(local)
            starts[self.dim] = ctx.logical_table(np.minimum(pos, k - 1) * local[self.dim])
            x = b.dynamic_update_slice(b.broadcast(zero, span, []), x, starts)
            local = span
        x = b.select(b.broadcast(pred, local, []), x, b.broadcast(zero, local, []))
        op = "or" if et == PrimitiveType.PRED else "add"
        return ctx.f.all_reduce(x, op, self.groups(lay))


class AllToAll(Step):
    """Tiling factors move between dims in one all-to-all: for each ``(a, b, f)`` the next
    minor factor ``f`` of dim ``a``'s tile index becomes the next minor factor of dim
    ``b``'s. A dim may give to several dims or receive from several; no dim does both.

    Uneven dims (``realign``, XLA's ReshardWithAllToAll on padded shapes): when a local
    tile of a receiving dim does not split into the finer tiles (5 rows in 2 tiles of 3
    -> 4 tiles of 2 need tiles of 4), a halo exchange first re-cuts it to ``f`` finer
    tiles' worth of rows; when the joined tiles of a giving dim are not its coarser tiles
    (4 tiles of 2 joined in pairs hold rows 0-3 and 4-7, not 3 each), a halo exchange
    after it re-cuts them (HaloSlice with explicit tile lengths). One such dim per side."""
    collectives = 1

    def __init__(self, moves: tuple[tuple[int, int, int], ...], realign: bool = False) -> None:
        self.moves = moves
        self.realign = realign

    def __repr__(self) -> str:
        return f"AllToAll(moves={self.moves!r}, realign={self.realign!r})"

    def _uneven(self, lay: Layout, dims) -> tuple[list[tuple[int, int, int]],
                                                  list[tuple[int, int, int]]]:
        """(receiving dims re-cut before, giving dims re-cut after) as (dim, held rows,
        wanted rows) per local tile."""
        fa, fb = self._factors()
        pre, post = [], []
        for b, f in fb.items():
            tb, d = lay.tiles[b], dims[b]
            held, wanted = -(-d // tb), f * -(-d // (tb * f))
            if tb > 1 and held != wanted:
                pre.append((b, held, wanted))
        for a, f in fa.items():
            ta, d = lay.tiles[a], dims[a]
            if ta % f == 0 and ta // f > 1:
                held, wanted = f * -(-d // ta), -(-d // (ta // f))
                if held != wanted:
                    post.append((a, held, wanted))
        return pre, post

    def _halos(self, lay: Layout, dims) -> tuple[list, list] | None:
        """The halo re-cuts before and after the exchange (from ``lay``, and from the
        layout after it), or None when a dim is uneven and cannot be realigned."""
        key = (("all-to-all-halos", self.moves, self.realign), lay.key, tuple(dims))
        if key in _A2A_HALOS:
            return _A2A_HALOS[key]
        return _A2A_HALOS.put(key, self._halos_uncached(lay, dims))

    def _halos_uncached(self, lay, dims):
        pre, post = self._uneven(lay, dims)
        if not pre and not post:
            return [], []
        if not self.realign or len(pre) > 1 or len(post) > 1:
            return None
        after = self._core_apply(lay, dims)
        if after is None:
            return None
        before = [HaloSlice(lay, lengths=p) for p in pre]
        behind = [HaloSlice(after, lengths=p) for p in post]
        if any(h._form(lay, dims) is None for h in before) or \
                any(h._form(after, dims) is None for h in behind):
            return None
        return before, behind

    @property
    def group_size(self) -> int:
        return math.prod(f for _, _, f in self.moves)

    def _factors(self) -> tuple[dict[int, int], dict[int, int]]:
        fa: dict[int, int] = {}
        fb: dict[int, int] = {}
        for a, b, f in self.moves:
            fa[a] = fa.get(a, 1) * f
            fb[b] = fb.get(b, 1) * f
        return fa, fb

    def _parts(self, lay: Layout) -> list[np.ndarray]:
        """Per move, the part of each device's source index that moves."""
        seen: dict[int, int] = {}
        out = []
        for a, _, f in self.moves:
            out.append((lay.coords[:, a] // seen.get(a, 1)) % f)
            seen[a] = seen.get(a, 1) * f
        return out

    def apply(self, lay, dims):
        return _applied(("all-to-all", self.moves, self.realign), lay, tuple(dims),
                        self._apply)

    def _apply(self, lay, dims):
        out = self._core_apply(lay, dims)
        if out is None or self._halos(lay, dims) is None:
            return None  # an uneven dim that is not realigned
        return out

    def _core_apply(self, lay, dims):
        """The layout after the exchange, uneven dims aside."""
        if not self.moves or any(f < 2 for _, _, f in self.moves):
            return None
        fa, fb = self._factors()
        if set(fa) & set(fb):
            return None
        tiles = list(lay.tiles)
        for a, f in fa.items():
            if tiles[a] % f:
                return None
        coords = lay.coords.copy()
        for (a, b, f), part in zip(self.moves, self._parts(lay)):
            coords[:, b] = coords[:, b] * f + part
        for a, f in fa.items():
            coords[:, a] = lay.coords[:, a] // f
            tiles[a] //= f
        for b, f in fb.items():
            tiles[b] *= f
        return Layout(tuple(tiles), coords)

    def groups(self, lay):
        return _step_groups(("all-to-all", self.moves), lay, self._groups)

    def _groups(self, lay):
        fa, _ = self._factors()
        keys = lay.coords.copy()
        for a, f in fa.items():
            keys[:, a] //= f
        member = np.zeros(lay.num_devices, np.int64)
        for (_, _, f), part in zip(self.moves, self._parts(lay)):
            member = member * f + part
        return _groups(keys, member, self.group_size)

    def _padded_local(self, lay, dims):
        _, fb = self._factors()
        local = list(_local(lay.tiles, dims))
        for b, f in fb.items():
            local[b] = f * -(-dims[b] // (lay.tiles[b] * f))
        return local

    def cost(self, lay, dims, itemsize):
        size = _nbytes(self._padded_local(lay, dims), itemsize)
        total = bytes_per_device("all-to-all", size, size, self.group_size)
        before, behind = self._halos(lay, dims)
        after = self._core_apply(lay, dims) if behind else None
        return (total + sum(h.cost(lay, dims, itemsize) for h in before)
                + sum(h.cost(after, dims, itemsize) for h in behind))

    def count(self, lay, dims):
        before, behind = self._halos(lay, dims)
        after = self._core_apply(lay, dims) if behind else None
        return (1 + sum(h.count(lay, dims) for h in before)
                + sum(h.count(after, dims) for h in behind))

    def peak(self, lay, dims, itemsize):
        # every array between the padding and the final slice is the padded local
        # array, re-shaped; the realigning halo exchanges around it make their own
        before, behind = self._halos(lay, dims)
        after = self._core_apply(lay, dims) if behind else None
        return max([_nbytes(self._padded_local(lay, dims), itemsize)]
                   + [h.peak(lay, dims, itemsize) for h in before]
                   + [h.peak(after, dims, itemsize) for h in behind])

    def emit(self, ctx, x, lay, dims):
        """Split every receiving dim into (its factors, its new shard), exchange the factor
        axes, then put each received factor before its source dim and merge.

        The all-to-all always reads a reshape that changes the rank, never a transpose
        (nor a same-shape reshape, which XLA's importer folds away): XLA gives such a
        reshape the default layout, and so the all-to-all's result. This matters on
        XLA's CPU pipeline: the all-to-all decomposer turns the all-to-all into a tuple
        all-to-all of slices, whose operands must agree in shape *and* layout, and the
        layout-blind algebraic simplifier may forward one slice to an earlier value of
        the same dims. Were an all-to-all fed a transpose (a permuted layout), its
        result would carry that layout, and a later all-to-all given one forwarded piece
        of it next to a fresh slice is rejected ("all-to-all has operands with different
        shapes: f32[1,1,2,1] ... f32[1,1,2,1]"). Reordering transposes therefore come
        after the exchange, as in XLA's own ReshardWithAllToAll."""
        bld = ctx.b
        rank = len(dims)
        k = len(self.moves)
        fa, fb = self._factors()
        padded = self._padded_local(lay, dims)
        before, behind = self._halos(lay, dims)
        for h in before:
            x = h.emit(ctx, x, lay, dims)
        x = pad_to(ctx, x, padded)
        # Split every receiving dim b into (its factors in move order, its new shard): the
        # rank grows by one axis per move.
        split: list[int] = []
        f_axis = [0] * k
        main_axis = [0] * rank
        for j in range(rank):
            if j in fb:
                for i, (_, b, f) in enumerate(self.moves):
                    if b == j:
                        f_axis[i] = len(split)
                        split.append(f)
            main_axis[j] = len(split)
            split.append(padded[j] // fb.get(j, 1))
        rest = [split[p] for p in main_axis]
        fs = [f for _, _, f in self.moves]
        y = bld.reshape(x, split)
        groups = self.groups(lay)
        if k == 1:
            # One factor axis: exchange it in place (member m gets chunk m of it and
            # stacks what it receives along it in member order).
            y = ctx.f.all_to_all(y, f_axis[0], groups)
            f_pos, main_pos = f_axis, main_axis
        else:
            # Several: bring the factor axes together (move order: the first is the most
            # major part of the member index) and merge them into one axis of group size;
            # the merging reshape lowers the rank, so the all-to-all still reads a
            # default-layout value.
            perm = f_axis + main_axis
            y = bld.transpose(y, perm)
            y = bld.reshape(y, [self.group_size] + rest)
            y = ctx.f.all_to_all(y, 0, groups)
            y = bld.reshape(y, fs + rest)
            f_pos, main_pos = list(range(k)), [k + j for j in range(rank)]
        # Each received factor axis goes before its source dim (the first move of a dim
        # is its most minor factor), then they merge.
        perm2: list[int] = []
        merged: list[int] = []
        for j in range(rank):
            if j in fa:
                perm2 += [f_pos[i] for i in reversed(range(k)) if self.moves[i][0] == j]
            perm2.append(main_pos[j])
            merged.append(fa.get(j, 1) * rest[j])
        if perm2 != list(range(len(perm2))):
            y = bld.transpose(y, perm2)
        y = bld.reshape(y, merged)
        new = self.apply(lay, dims)
        for h in behind:
            y = h.emit(ctx, y, new, dims)
        return slice_to(ctx, y, _local(new.tiles, dims))


class Permute(Step):
    """Same tiling on other devices: one collective-permute; a device already holding its
    new tile sends to itself."""
    collectives = 1

    def __init__(self, to: Layout) -> None:
        self.to = to

    def apply(self, lay, dims):
        if lay.tiles != self.to.tiles or not self.to.balanced():
            return None
        return self.to

    def __repr__(self) -> str:
        return f"Permute(to {self.to!r})"

    def pairs(self, lay) -> np.ndarray:
        n = lay.num_devices
        src_tile, dst_tile = lay.tile_ids(), self.to.tile_ids()
        same = src_tile == dst_tile
        devs = np.arange(n)
        senders = devs[~same]
        receivers = devs[~same]
        senders = senders[np.lexsort((senders, src_tile[senders]))]
        receivers = receivers[np.lexsort((receivers, dst_tile[receivers]))]
        assert np.array_equal(src_tile[senders], dst_tile[receivers])
        own = np.stack([devs[same], devs[same]], axis=1)
        moved = np.stack([senders, receivers], axis=1)
        return np.concatenate([own, moved]).astype(np.int64)

    def cost(self, lay, dims, itemsize):
        if np.array_equal(lay.tile_ids(), self.to.tile_ids()):
            return 0.0
        size = _nbytes(_local(lay.tiles, dims), itemsize)
        return bytes_per_device("collective-permute", size, size, 2)

    def peak(self, lay, dims, itemsize):
        if np.array_equal(lay.tile_ids(), self.to.tile_ids()):
            return 0.0
        return _nbytes(_local(lay.tiles, dims), itemsize)

    def emit(self, ctx, x, lay, dims):
        if np.array_equal(lay.tile_ids(), self.to.tile_ids()):
            return x
        return ctx.f.collective_permute(x, self.pairs(lay))


_HALO_FORMS = BoundedMemo(4096)  # (layout, target layout, dims) -> HaloSlice._form
_RECUTS = BoundedMemo(4096)  # (gather, layout, dims) -> AllGather._recut
_A2A_HALOS = BoundedMemo(4096)  # (moves, layout, dims) -> AllToAll._halos


class HaloSlice(Step):
    """Cut ``to``'s tile where, along one dim, it runs past the local tile into the
    neighbouring tiles (uneven re-tiling, 3 rows per tile -> 2): the rows missing below
    and above arrive by one collective-permute per side from a holder of the neighbour
    tile (each holder sends to at most one device), the rest is a local cut; the pieces
    are joined and the tile is cut out at a per-device offset. Priced as the permutes of
    the widest halo on each side (XLA's halo exchange for partially replicated ->
    tiled). ``join=(dim, f)``: first an all-gather joining ``f`` neighbouring tiles of
    ``dim`` whose joined tiles are not a sharding's tiles (uneven dim: 4 tiles of 2 rows
    of 6 joined in pairs hold rows 0-3 and 4-7, not 3 each), cut from as they are."""
    collectives = 1

    def __init__(self, to: Layout, join: tuple[int, int] | None = None,
                 lengths: tuple[int, int, int] | None = None) -> None:
        self.to = to
        self.join = join
        # (dim, held, wanted): along ``dim`` the local buffer holds tiles of ``held`` rows
        # and the result tiles of ``wanted`` rows (tile j from row j * length), not the
        # sharding's own; only inside an all-to-all that realigns uneven tiles.
        self.lengths = lengths

    def __repr__(self) -> str:
        return f"HaloSlice(to {self.to!r}, join={self.join!r})"

    def _form(self, lay: Layout, dims):
        key = (lay.key, self.to.key, tuple(int(v) for v in dims), self.join, self.lengths)
        if key in _HALO_FORMS:
            return _HALO_FORMS[key]
        return _HALO_FORMS.put(key, self._form_uncached(lay, dims))

    def _form_uncached(self, lay: Layout, dims):
        if self.to.num_devices != lay.num_devices or not self.to.balanced():
            return None
        lx = np.asarray(_local(lay.tiles, dims), np.int64)
        ly = np.asarray(_local(self.to.tiles, dims), np.int64)
        n, rank = self.to.coords.shape
        coords, tiles = lay.coords, lay.tiles
        if self.join is not None:  # the layout after the join, tiles of f * lx rows
            gk, f = self.join
            if f < 2 or tiles[gk] % f:
                return None
            coords = coords.copy()
            coords[:, gk] //= f
            tiles = tuple(t // f if j == gk else t for j, t in enumerate(tiles))
            lx[gk] *= f
        if self.lengths is not None:
            lk, held, wanted = self.lengths
            lx[lk], ly[lk] = held, wanted
        holder = np.ravel_multi_index(tuple(coords.T), tiles).astype(np.int64) \
            if tiles else np.zeros(n, np.int64)
        empty = np.zeros(n, bool)  # the whole target tile is padding
        xs, ys, xe, ye = [], [], [], []
        for k in range(rank):
            d = int(dims[k])
            xs.append(coords[:, k] * lx[k])
            ys.append(self.to.coords[:, k] * ly[k])
            xe.append(np.minimum(xs[k] + lx[k], d))
            ye.append(np.minimum(ys[k] + ly[k], d))
            empty |= ys[k] >= d
        halo = [k for k in range(rank)
                if not np.all(empty | ((xs[k] <= ys[k]) & (ye[k] <= xe[k])))]
        if self.lengths is not None and not halo:
            halo = [self.lengths[0]]  # a realignment that happens to need no rows
        if len(halo) != 1:
            return None  # a plain slice (or halos on two dims: corners, not handled)
        k = halo[0]
        left = np.where(empty, 0, np.maximum(xs[k] - ys[k], 0))
        right = np.where(empty, 0, np.maximum(ye[k] - xe[k], 0))
        if left.max() > lx[k] or right.max() > lx[k]:
            return None  # beyond the neighbour tiles
        off = np.stack([np.where(empty, 0, ys[j] - xs[j]) for j in range(rank)], axis=1)
        hl, hr = int(left.max()), int(right.max())
        sides = []
        for width, need, step in ((hl, left, -1), (hr, right, 1)):
            if width == 0:
                sides.append(None)
                continue
            nb = coords.copy()
            nb[:, k] += step
            recv = np.nonzero(need > 0)[0]
            want = np.ravel_multi_index(tuple(nb[recv].T), tiles).astype(np.int64)
            pairs = _match_holders(holder, recv, want)
            if pairs is None:
                return None
            sides.append((width, pairs))
        # The local buffer padded so every cut fits (other dims: the target's tile at the
        # device's offset; dim k: whole, the halos joined on either side).
        need = np.maximum((off + ly).max(axis=0), lx)
        need[k] = lx[k]
        joined = hl + int(lx[k]) + hr
        kneed = max(joined, int((off[:, k] + hl + ly[k]).max()))
        return k, off, lx, ly, need, sides, hl, kneed

    def apply(self, lay, dims):
        return self.to if self._form(lay, dims) is not None else None

    def count(self, lay, dims):
        joins = self.join is not None
        return joins + sum(side is not None for side in self._form(lay, dims)[5])

    def cost(self, lay, dims, itemsize):
        k, _, _, ly, _, sides, _, _ = self._form(lay, dims)
        total = 0.0
        if self.join is not None:
            local = list(_local(lay.tiles, dims))
            part = _nbytes(local, itemsize)
            j, f = self.join
            local[j] *= f  # (the joined array, rounded up as ``stats`` counts it)
            total += bytes_per_device("all-gather", part, _nbytes(local, itemsize), f)
        for side in sides:
            if side is not None:
                shape = [int(v) for v in ly]
                shape[k] = side[0]
                size = _nbytes(shape, itemsize)
                total += bytes_per_device("collective-permute", size, size, 2)
        return total

    def peak(self, lay, dims, itemsize):
        # the arrays ``emit`` makes, in its order: the joined tiles, the padded buffer,
        # this device's own part and the halo pieces, their concatenation, padded, cut
        k, _, lx, ly, need, sides, _, kneed = self._form(lay, dims)
        held = list(_local(lay.tiles, dims))
        shapes = []
        if self.join is not None:
            held[self.join[0]] *= self.join[1]
            shapes.append(held)
        if [int(v) for v in need] != held:
            shapes.append([int(v) for v in need])
        own = [int(v) for v in ly]
        own[k] = int(lx[k])
        shapes.append(own)
        widths = [side[0] for side in sides if side is not None]
        for w in widths:
            shapes.append(own[:k] + [w] + own[k + 1:])
        joined = own[:k] + [own[k] + sum(widths)] + own[k + 1:]
        shapes.append(joined)
        shapes.append(joined[:k] + [max(kneed, joined[k])] + joined[k + 1:])
        shapes.append([int(v) for v in ly])
        return max(_nbytes(x, itemsize) for x in shapes)

    def emit(self, ctx, x, lay, dims):
        k, off, lx, ly, need, sides, hl, kneed = self._form(lay, dims)
        rank = len(dims)
        if self.join is not None:
            gk, f = self.join
            x = ctx.f.all_gather(x, gk, AllGather(gk, f).groups(lay))
        x = pad_to(ctx, x, [int(v) for v in need])
        n = lay.num_devices
        # This device's own part: the target's tile on the other dims, dim k whole.
        sizes = [int(v) for v in ly]
        sizes[k] = int(lx[k])
        own_off = off.copy()
        own_off[:, k] = 0
        mid = ctx.b.dynamic_slice(x, [ctx.logical_table(_frozen_copy(own_off[:, j]))
                                      for j in range(rank)], sizes)
        parts = []
        for side, below in zip(sides, (True, False)):
            if side is None:
                parts.append(None)
                continue
            width, pairs = side
            # Each sender cuts its receiver's box: the receiver's offsets on the other
            # dims (it holds the same tile there), the edge rows on dim k.
            send_off = np.zeros((n, rank), np.int64)
            send_off[pairs[:, 0]] = off[pairs[:, 1]]
            send_off[:, k] = int(lx[k]) - width if below else 0  # the edge rows
            cut = list(sizes)
            cut[k] = width
            piece = ctx.b.dynamic_slice(x, [ctx.logical_table(_frozen_copy(send_off[:, j]))
                                            for j in range(rank)], cut)
            parts.append(ctx.f.collective_permute(piece, pairs))
        ops = [p for p in (parts[0], mid, parts[1]) if p is not None]
        joined = ctx.b.concatenate(ops, k) if len(ops) > 1 else mid
        full = list(sizes)
        full[k] = kneed
        joined = pad_to(ctx, joined, full)
        cut_off = np.zeros((n, rank), np.int64)
        cut_off[:, k] = off[:, k] + hl
        return ctx.b.dynamic_slice(joined, [ctx.logical_table(_frozen_copy(cut_off[:, j]))
                                            for j in range(rank)], [int(v) for v in ly])


def _match_holders(holder_tile: np.ndarray, recv: np.ndarray,
                   want: np.ndarray) -> np.ndarray | None:
    """(sender, receiver) pairs: each receiver ``recv[i]`` gets a distinct holder of tile
    ``want[i]``; None when a tile has fewer holders than receivers."""
    devs = np.arange(holder_tile.size)
    order_h = np.lexsort((devs, holder_tile))
    sorted_h = holder_tile[order_h]
    start = np.searchsorted(sorted_h, want, "left")
    count = np.searchsorted(sorted_h, want, "right") - start
    order_r = np.lexsort((recv, want))
    sorted_w = want[order_r]
    ranks = np.empty(recv.size, np.int64)
    ranks[order_r] = np.arange(recv.size) - np.searchsorted(sorted_w, sorted_w, "left")
    if np.any(ranks >= count):
        return None
    return np.stack([order_h[start + ranks], recv], axis=1).astype(np.int64)


# -- plans -----------------------------------------------------------------------------------
class Plan:
    """A chain of steps with its cost and the layouts it passes through."""

    def __init__(self, steps: list[Step], cost: float = 0.0, collectives: int = 0,
                 through_replicated: bool = False, name: str = "",
                 layouts: list[Layout] | None = None) -> None:
        self.steps = steps
        self.cost = cost
        self.collectives = collectives
        self.through_replicated = through_replicated
        self.name = name
        self.layouts = [] if layouts is None else layouts

    def key(self) -> tuple:
        return (self.cost, self.collectives, len(self.steps))

    def __repr__(self) -> str:
        return f"Plan({self.describe()}, {self.cost:g} bytes, {self.collectives} collectives)"

    def describe(self) -> str:
        return " -> ".join(type(s).__name__ for s in self.steps) or "nothing"


def simulate(steps: Sequence[Step], src: Layout, dims: tuple[int, ...],
             itemsize: float) -> Plan | None:
    lay = src
    total = 0.0
    layouts = [src]
    collectives = 0
    for step in steps:
        new = step.apply(lay, dims)
        if new is None:
            return None
        c = step.cost(lay, dims, itemsize)
        total += c
        if c > 0 or isinstance(step, (AllGather, AllToAll)):
            collectives += step.count(lay, dims)
        lay = new
        layouts.append(lay)
    return Plan(list(steps), total, collectives, layouts=layouts)


def plan_peak(plan: Plan, dims: Sequence[int], itemsize: float) -> float:
    """Bytes per device of the largest array the plan's steps make from the value (each
    step's ``peak`` at the layout it starts from)."""
    dims = tuple(int(d) for d in dims)
    return max((step.peak(lay, dims, itemsize) for step, lay in zip(plan.steps, plan.layouts)),
               default=0.0)


def plan_cost(plan: Plan) -> float:
    """Bytes per device on the wire along the plan, each step's collective costed by
    collectives/cost.py (dynamic-slice: 0)."""
    return plan.cost


# Refinements per distinct (layout, tiles, preference): route search realizes several
# specs of one reshard, and they refine the same layouts the same way (O(devices) sorts).
_REFINED = BoundedMemo(1024)  # keys hold O(devices) bytes


def _refine(lay: Layout, tiles: Sequence[int], prefer: Layout | None) -> Layout | None:
    """A layout with ``tiles`` (each a multiple of the current count) where every device
    takes a sub-tile of its tile, ``prefer``'s coordinates where capacity allows (a
    preference may hold -1: none, see ``_prefer_for``)."""
    tiles = tuple(int(t) for t in tiles)
    if any(t % c for t, c in zip(tiles, lay.tiles)):
        return None
    g = tuple(t // c for t, c in zip(tiles, lay.tiles))
    if all(v == 1 for v in g):
        return lay
    key = (lay.key, tiles, None if prefer is None else prefer.key)
    if key in _REFINED:
        return _REFINED[key]
    out = _refine_uncached(lay, tiles, g, None if prefer is None else prefer.coords)
    if out is not None:
        out.coords.flags.writeable = False
    return _REFINED.put(key, out)


def _refine_uncached(lay: Layout, tiles: tuple[int, ...], g: tuple[int, ...],
                     prefer: np.ndarray | None) -> Layout | None:
    n = lay.num_devices
    nsub = math.prod(g)
    total = math.prod(tiles)
    if n % total:
        return None
    cap = n // total
    region = lay.tile_ids()
    # Dim by dim on [devices] columns (numpy broadcasts [devices, rank] against a [rank]
    # row several times slower): the preferred sub-tile, row-major over ``g``.
    if prefer is None:
        pref = np.full(n, -1, np.int64)
    else:
        inside = np.ones(n, bool)
        flat = np.zeros(n, np.int64)
        for k, gk in enumerate(g):
            pk = prefer[:, k] - lay.coords[:, k] * gk
            inside &= (pk >= 0) & (pk < gk)
            flat = flat * gk + pk
        pref = np.where(inside, flat, -1)
    sub = _assign(region, pref, nsub, cap)
    if sub is None:
        return None
    cols = []
    stride = nsub
    for k, gk in enumerate(g):
        stride //= gk
        cols.append(lay.coords[:, k] * gk + (sub // stride) % gk)
    return Layout(tiles, np.stack(cols, axis=1))


def refinable(size: int, have: int, want: int) -> bool:
    """Whether each of ``want`` tiles of a dim of ``size`` lies inside one of ``have``
    tiles (``want`` a multiple of ``have``), real elements only: uneven dims may not."""
    if want % have:
        return False
    if want == have or have == 1:
        return True
    l1, l2 = -(-size // have), -(-size // want)
    j = np.arange(want)
    ys = j * l2
    ye = np.minimum(ys + l2, size)
    xs = (j // (want // have)) * l1
    xe = np.minimum(xs + l1, size)
    return bool(np.all((ys >= size) | ((xs <= ys) & (ye <= xe))))


_PREFER = BoundedMemo(1024)  # keys hold O(devices) bytes


def _prefer_for(dst: Layout, tiles: Sequence[int]) -> Layout:
    """A preference for ``_refine``: dst's coordinates coarsened to ``tiles`` (dims whose
    count does not divide dst's: -1, no preference). Not a sharding's layout (the -1s),
    only its coordinates and key are read. One per distinct (dst, tiles)."""
    tiles = tuple(int(t) for t in tiles)
    key = (dst.key, tiles)
    hit = _PREFER.get(key)
    if hit is not None:
        return hit
    out = np.empty_like(dst.coords)
    for k, (t, c) in enumerate(zip(dst.tiles, tiles)):
        out[:, k] = dst.coords[:, k] // (t // c) if t % c == 0 else -1
    out.flags.writeable = False
    return _PREFER.put(key, Layout(tiles, out))


class _Spec(NamedTuple):
    pre: tuple[int, ...]                       # pre-slice factors per dim
    moves: tuple[tuple[int, int, int], ...]    # all-to-all moves (a, b, f)
    combine: bool                              # one all-to-all for all moves
    gathers: tuple[tuple[int, int], ...]       # (dim, factor)
    early: tuple[tuple[int, int], ...] = ()    # (dim, factor) gathered before the moves


def _spec(src: Layout, dst: Layout, dims, pre_slice: bool, use_a2a: bool,
          whole_first: bool = False, mixed: bool = False) -> _Spec:
    """Which factors to slice first (``pre_slice``: as far as the source's replication
    allows), move with all-to-all (``use_a2a``: factors a dim has too many of, to dims that
    lack them; ``whole_first``: each source dim gives to the target dims taking the most
    of it first, in dim order otherwise) and gather (the rest of the excess); the rest of
    what is missing is sliced at the end. ``mixed``: a dim may both give and lack (it
    gives first and is sliced at the end: [1,2]+3 copies -> [2,3]) or both have excess and
    take (its excess is gathered before the all-to-all: [2,3] -> [1,2]+3 copies), as XLA's
    uneven partially replicated <-> tiled reshards do; one all-to-all still has disjoint
    sources and targets."""
    r = len(dims)
    s, t = list(src.tiles), list(dst.tiles)
    pre = [1] * r
    if pre_slice:
        reps = src.replication
        for k in range(r):
            if t[k] > s[k] and t[k] % s[k] == 0:
                h = math.gcd(t[k] // s[k], reps)
                if h > 1 and refinable(dims[k], s[k], s[k] * h):
                    pre[k] = h
                    reps //= h
    cur = [a * b for a, b in zip(s, pre)]
    g = [math.gcd(c, tt) for c, tt in zip(cur, t)]
    excess = [c // gg for c, gg in zip(cur, g)]
    deficit = [tt // gg for tt, gg in zip(t, g)]
    moves: list[tuple[int, int, int]] = []
    early: list[tuple[int, int]] = []
    givers: set[int] = set()
    takers: set[int] = set()
    if use_a2a:
        for a in range(r):
            order = range(r)
            if whole_first:
                # (A dim whose tiling moves whole to one dim keeps every device's tile
                # coordinate there: one all-to-all, no device-order fix-up after it.)
                order = sorted(range(r), key=lambda b: (-math.gcd(excess[a], deficit[b]), b))
            for b in order:
                if a == b or excess[a] == 1 or deficit[b] == 1:
                    continue
                if mixed:
                    if a in takers or b in givers:
                        continue
                elif deficit[a] > 1 or excess[b] > 1:
                    continue  # keep sources and targets disjoint
                f = math.gcd(excess[a], deficit[b])
                if f > 1:
                    if excess[b] > 1:
                        early.append((b, excess[b]))
                        excess[b] = 1
                    moves.append((a, b, f))
                    givers.add(a)
                    takers.add(b)
                    excess[a] //= f
                    deficit[b] //= f
    gathers = tuple((k, excess[k]) for k in range(r) if excess[k] > 1)
    return _Spec(tuple(pre), tuple(moves), True, gathers, tuple(early))


def _realize(spec: _Spec, src: Layout, dst: Layout, dims,
             halo: bool = False, realign: bool = False) -> list[Step] | None:
    """The steps of ``spec`` from ``src``, slices choosing ``dst``'s tiles where they can,
    and a final permute if the result is not ``dst``. Moves and gathers that do not work
    on an uneven dim are replaced by gathering the dim whole and slicing afterwards;
    ``halo``: the last step is a HaloSlice onto ``dst`` instead (None if it does not
    apply); ``realign``: moves on uneven dims realign the tiles by halo exchanges instead
    (AllToAll.realign)."""
    steps: list[Step] = []
    lay = src

    def take(st: Step) -> bool:
        """Append ``st`` if it applies to the layout so far, and move on to its result."""
        nonlocal lay
        new = st.apply(lay, dims)
        if new is None:
            return False
        steps.append(st)
        lay = new
        return True

    if any(h > 1 for h in spec.pre):
        tiles = [a * b for a, b in zip(src.tiles, spec.pre)]
        new = _refine(lay, tiles, _prefer_for(dst, tiles))
        if new is None:
            return None
        steps.append(Slice(new))
        lay = new
    for k, f in spec.early:
        st = AllGather(k, f)
        if st.apply(lay, dims) is None:
            st = AllGather(k, lay.tiles[k])  # the whole dim
        if not take(st):
            return None
    moves = []
    for mv in spec.moves:
        if AllToAll((mv,), realign).apply(lay, dims) is not None:
            moves.append(mv)
    dropped = [mv for mv in spec.moves if mv not in moves]
    if moves:
        groups = ([AllToAll(tuple(moves), realign)] if spec.combine
                  else [AllToAll((m,), realign) for m in moves])
        for st in groups:
            if not take(st):
                return None
    gathers = dict(spec.gathers)
    for a, _, f in dropped:
        gathers[a] = gathers.get(a, 1) * f
    join = None
    for k in sorted(gathers):
        st = AllGather(k, gathers[k])
        if st.apply(lay, dims) is None and realign and \
                AllGather(k, gathers[k], True).apply(lay, dims) is not None:
            st = AllGather(k, gathers[k], True)
        if st.apply(lay, dims) is None:
            if lay.tiles[k] < 2:
                continue
            if halo and join is None and gathers[k] > 1:
                join = (k, gathers[k])  # joined as they are, in the halo slice
                continue
            st = AllGather(k, lay.tiles[k])  # the whole dim
        if not take(st):
            return None
    if halo:
        # The target's tiles straddle the current ones on one dim: the missing edge rows
        # come from the neighbours instead of gathering the dim whole.
        st = HaloSlice(dst, join)
        if st.apply(lay, dims) is None:
            return None
        steps.append(st)
        return steps
    # Any dim whose tiles do not split into the target's: gather it whole.
    for k, (c, t) in enumerate(zip(lay.tiles, dst.tiles)):
        if c > 1 and not refinable(dims[k], c, t):
            st = AllGather(k, c)
            lay = st.apply(lay, dims)
            steps.append(st)
    new = _refine(lay, dst.tiles, dst)
    if new is None:
        return None
    if new is not lay:
        steps.append(Slice(new))
        lay = new
    if not lay.same_as(dst):
        steps.append(Permute(dst))
    return steps


def _preimage(plain: list[Step], src: Layout, dst: Layout, dims) -> \
        tuple[Layout, list[Layout]] | None:
    """A layout P with src's tiling from which ``plain``'s kind of chain lands exactly on
    dst, chosen close to src; plus the layouts P's chain passes through at its slices."""
    body = [s for s in plain if not isinstance(s, Permute)]
    # Layouts along the chain from src (to guide choices towards src's own placement).
    fwd = [src]
    for st in body:
        fwd.append(st.apply(fwd[-1], dims))
    lay = dst
    intended_rev: list[Layout] = []
    for i in range(len(body) - 1, -1, -1):
        st = body[i]
        before = fwd[i]
        if isinstance(st, Slice):
            intended_rev.append(lay)
            g = [t // c for t, c in zip(lay.tiles, before.tiles)]
            lay = Layout(before.tiles, lay.coords // np.asarray(g, np.int64))
        elif isinstance(st, AllGather):
            k, f = st.dim, st.factor
            coarse = lay
            region = coarse.tile_ids()
            guide = fwd[i]
            match = _rows_all(np.delete(guide.coords, k, axis=1) ==
                              np.delete(coarse.coords, k, axis=1)) & \
                (guide.coords[:, k] // f == coarse.coords[:, k])
            pref = np.where(match, guide.coords[:, k] % f, -1)
            cap = coarse.replication // f
            if cap * f != coarse.replication:
                return None
            sub = _assign(region, pref, f, cap)
            if sub is None:
                return None
            coords = coarse.coords.copy()
            coords[:, k] = coords[:, k] * f + sub
            tiles = list(coarse.tiles)
            tiles[k] *= f
            lay = Layout(tuple(tiles), coords)
        elif isinstance(st, AllToAll):
            coords = lay.coords.copy()
            tiles = list(lay.tiles)
            for a, b, f in reversed(st.moves):
                coords[:, a] = coords[:, a] * f + coords[:, b] % f
                coords[:, b] //= f
                tiles[a] *= f
                tiles[b] //= f
            lay = Layout(tuple(tiles), coords)
        else:
            return None
    if lay.tiles != src.tiles or not lay.balanced():
        return None
    return lay, list(reversed(intended_rev))


def _orderings(moves: tuple[tuple[int, int, int], ...]):
    """The move orders that differ in effect: which factor of a source dim goes to which
    target dim, and in which order a target dim stacks what it receives."""
    if len(moves) < 2 or len(moves) > 4:
        yield moves
        return
    seen = set()
    for perm in itertools.permutations(moves):
        key = (tuple(sorted((a, tuple(m for m in perm if m[0] == a)) for a, _, _ in perm)),
               tuple(sorted((b, tuple(m for m in perm if m[1] == b)) for _, b, _ in perm)))
        if key not in seen:
            seen.add(key)
            yield perm


_PLAN_CACHE = BoundedMemo(4096)


def plan_reshard(src: Layout, dst: Layout, dims: Sequence[int],
                 itemsize: float = 4.0) -> tuple[Plan | None, Plan]:
    """(the cheapest plan that is not "through replicated", the through-replicated plan).
    The first is None when no other plan applies. Plans are cached per (layouts, dims,
    element size): a model reshards the same way many times."""
    dims = tuple(int(d) for d in dims)
    key = (src.key, dst.key, dims, float(itemsize))
    hit = _PLAN_CACHE.get(key)
    if hit is not None:
        return hit
    return _PLAN_CACHE.put(key, _plan_reshard(src, dst, dims, float(itemsize)))


# Spec kinds tried: (slice first, move with all-to-all, each source dim to the dims taking
# the most of it first, a dim may give and lack or have excess and take).
_SPEC_KINDS = ((True, True, False, False), (True, True, True, False),
               (True, False, False, False), (False, True, False, False),
               (False, True, True, False), (False, False, False, False),
               (True, True, False, True), (False, True, False, True))


def _plan_reshard(src: Layout, dst: Layout, dims: tuple[int, ...],
                  itemsize: float) -> tuple[Plan | None, Plan]:
    if src.same_as(dst):
        return (Plan([], name="nothing", layouts=[src]),
                Plan([], through_replicated=True, layouts=[src]))
    fallback_steps: list[Step] = [AllGather(k, t) for k, t in enumerate(src.tiles) if t > 1]
    if any(t > 1 for t in dst.tiles):
        fallback_steps.append(Slice(dst))
    fallback = simulate(fallback_steps, src, dims, itemsize)
    assert fallback is not None
    # Priced as ``reshard`` emits it (reshard.replicate: padded gathers, slice at the end).
    fallback.cost = replicate_cost(dims, itemsize, src.tiles)
    fallback.through_replicated = True
    fallback.name = "through replicated"
    best: Plan | None = None
    seen: set[tuple] = set()
    for pre_slice, use_a2a, whole_first, mixed in _SPEC_KINDS:
        base = _spec(src, dst, dims, pre_slice, use_a2a, whole_first, mixed)
        # (Also nothing moved nor gathered: the target's tiles cut out of the local ones
        # with halos from the neighbours, HaloSlice.)
        orders = itertools.chain(((m, base.gathers) for m in _orderings(base.moves)),
                                 (((), ()),))
        for moves, gathers in orders:
            for combine in ((True, False) if len(moves) > 1 else (True,)):
                spec = _Spec(base.pre, tuple(moves), combine, gathers,
                             base.early if moves else ())
                key = (spec.pre, spec.moves, combine, spec.gathers, spec.early)
                if key in seen:
                    continue
                seen.add(key)
                for plan in _candidates(spec, src, dst, dims, itemsize):
                    if best is None or plan.key() < best.key():
                        best = plan
    return best, fallback


def _candidates(spec: _Spec, src: Layout, dst: Layout, dims, itemsize):
    """The plan of ``spec`` with a final permute if needed, and with the permute moved to
    the start (on the source shards) when a pre-image exists."""
    steps = _realize(spec, src, dst, dims)
    # (The halo variants last: on a tie the plans without them win.)
    halo = _realize(spec, src, dst, dims, halo=True)
    last = [] if halo is None else [halo]
    if _fell_back(spec, steps):
        # Uneven moves and gathers realigned by halo exchanges / a permute instead of
        # gathering their dims whole.
        realigned = _realize(spec, src, dst, dims, realign=True)
        if realigned is not None and any(
                (isinstance(st, AllToAll) and st.realign and st._uneven(lay, dims) != ([], []))
                or (isinstance(st, AllGather) and st.realign)
                for st, lay in _walk(realigned, src, dims)):
            last.append(realigned)
    if steps is None:
        yield from _simulated(last, src, dst, dims, itemsize)
        return
    variants = [steps]
    if steps and isinstance(steps[-1], Permute):
        pre = _preimage(steps, src, dst, dims)
        if pre is not None:
            start, intended = pre
            body = [s for s in steps if not isinstance(s, Permute)]
            replayed = _replay(body, start, intended, dims)
            if replayed is not None and replayed[1].same_as(dst):
                first = [] if start.same_as(src) else [Permute(start)]
                variants.append(first + replayed[0])
    yield from _simulated(variants + last, src, dst, dims, itemsize)


def _fell_back(spec: _Spec, steps: list[Step] | None) -> bool:
    """Whether realizing ``spec`` dropped a move or gathered a dim whole instead of the
    spec's factor (an uneven dim): only then can realigning give another plan."""
    if not (spec.moves or spec.gathers or spec.early):
        return False
    if steps is None:
        return True
    moved = sum(len(st.moves) for st in steps if isinstance(st, AllToAll))
    joined = sorted((st.dim, st.factor) for st in steps if isinstance(st, AllGather))
    return moved != len(spec.moves) or joined != sorted(spec.gathers + spec.early)


def _walk(steps: list[Step], src: Layout, dims):
    """(step, the layout it starts from) along ``steps``."""
    lay = src
    for st in steps:
        yield st, lay
        lay = st.apply(lay, dims)
        if lay is None:
            return


def _simulated(variants, src: Layout, dst: Layout, dims, itemsize):
    for v in variants:
        plan = simulate(v, src, dims, itemsize)
        if plan is not None and plan.layouts[-1].same_as(dst):
            plan.name = plan.describe()
            yield plan


def _replay(body: list[Step], start: Layout, intended: list[Layout], dims):
    """``body`` from ``start`` with its slices retargeted to the ``intended`` layouts;
    returns (steps, final layout) or None."""
    out: list[Step] = []
    lay = start
    it = iter(intended)
    for st in body:
        if isinstance(st, Slice):
            st = Slice(next(it))
        new = st.apply(lay, dims)
        if new is None:
            return None
        out.append(st)
        lay = new
    return out, lay


def reshard_with_plan(ctx: "ReshardContext", pv: PValue, target: HloSharding,
                      plan: Plan) -> PValue:
    dims = tuple(int(d) for d in pv.base_shape.dims)
    src = layout_of(pv.sharding, ctx.num_devices, len(dims))
    x = pv.hlo
    lay = src
    # The plan was simulated from this very layout (plans are keyed by it): its recorded
    # layouts are what re-applying each step would give, without the O(devices) work.
    after = plan.layouts[1:] if len(plan.layouts) == len(plan.steps) + 1 else None
    for i, step in enumerate(plan.steps):
        x = step.emit(ctx, x, lay, dims)
        lay = after[i] if after is not None else step.apply(lay, dims)
    assert tuple(x.shape.dims) == _local(lay.tiles, dims), (x.shape, lay.tiles)
    return PValue(x, pv.base_shape, target)


def chosen_plan(dims: Sequence[int], itemsize: float, src: HloSharding, dst: HloSharding,
                num_devices: int) -> Plan | None:
    """The plan ``route`` emits for these shardings, or None when ``reshard`` goes
    through the replicated value instead (nothing cheaper, or not handled here). Shared by
    emission and by reshard.reshard_cost, so what is priced is what is built."""
    dims = tuple(int(d) for d in dims)
    # Asked by every reshard and every pricing: one answer per distinct (immutable) key,
    # without rebuilding the per-device layouts and their keys (O(devices) each).
    key = (dims, float(itemsize), src, dst, num_devices)
    if key in _CHOSEN:
        return _CHOSEN[key]
    return _CHOSEN.put(key, _chosen_plan(dims, itemsize, src, dst, num_devices))


_CHOSEN = BoundedMemo(4096)


def _chosen_plan(dims: tuple[int, ...], itemsize: float, src: HloSharding,
                 dst: HloSharding, num_devices: int) -> Plan | None:
    if not dims or any(d == 0 for d in dims):
        return None
    a = layout_of(src, num_devices, len(dims))
    b = layout_of(dst, num_devices, len(dims))
    if a is None or b is None:
        return None
    if a.same_as(b):
        return Plan([], name="nothing", layouts=[a])
    if _replicated_route_wins(a, b, dims, itemsize):
        return None
    best, fallback = plan_reshard(a, b, dims, itemsize)
    if best is None or best.key() >= fallback.key():
        return None
    return best


class _Tiles:
    """The tile counts of a layout without its device table: all a gather's cost reads."""

    def __init__(self, tiles: tuple[int, ...]) -> None:
        self.tiles = tiles


def _replicated_route_wins(src: Layout, dst: Layout, dims: tuple[int, ...],
                           itemsize: float) -> bool:
    """Whether ``_chosen_plan`` would answer None for two different layouts, decided from
    their tile counts alone, in the two cases where that is exact; False otherwise (then
    the search decides). The search is O(devices) numpy work per step it tries, and about
    half of a model's distinct reshards are from or to a replicated value.

    * From replicated (``src`` untiled): the through-replicated plan is one slice, cost 0,
      no collective, one step; every other plan has at least one step and costs >= 0,
      so none is strictly cheaper in ``Plan.key``.
    * To replicated (``dst`` untiled): every spec plan_reshard builds is the same one
      (nothing to pre-slice or move: dst lacks no factor), which gathers each tiled dim
      whole in dim order and lands on dst without a permute; it has the through-replicated
      plan's steps and collectives, so it wins only if it is cheaper. Its cost is summed
      here exactly as ``simulate`` sums it (AllGather.cost reads only the tile counts).
    """
    if all(t == 1 for t in src.tiles):
        return True
    if any(t != 1 for t in dst.tiles):
        return False
    tiles = list(src.tiles)
    total = 0.0
    for k in range(len(tiles)):
        if tiles[k] > 1:
            total += AllGather(k, tiles[k]).cost(_Tiles(tuple(tiles)), dims, itemsize)
            tiles[k] = 1
    return total >= replicate_cost(dims, itemsize, src.tiles)
