"""Device grouping for recursive partitioning (GSPMD section 4.4).

A ``DeviceGrouping`` says how the physical devices are split into equal groups while a
handler works inside a group: ``groups[g, l]`` is the physical id of logical partition
``l`` in group ``g``. At the top level there is one group of all devices, in order.
Handlers speak in logical ids; the collective factory turns them into physical ones.
Everything is numpy indexing, never a per-device Python loop.
"""
from __future__ import annotations

import numpy as np

from hlo_spmd.memo import BoundedMemo
from hlo_spmd.sharding.array_key import array_token


class DeviceGrouping:
    """Equality is identity. A plain class, not a dataclass: a dataclass costs ~1 ms of
    start-up (Python 3.11 compiles its methods)."""

    def __init__(self, groups: np.ndarray) -> None:
        self.groups = groups  # [num_groups, group_size] physical device ids; never changed
        self._key: tuple | None = None
        self._logical: np.ndarray | None = None

    @property
    def key(self) -> tuple:
        """The grouping as a hashable value (the array_token of ``groups``). Made once per
        grouping: memos on the partition path key on it for every instruction."""
        if self._key is None:
            self._key = array_token(self.groups)
        return self._key

    @staticmethod
    def flat(num_devices: int) -> "DeviceGrouping":
        arr = np.arange(num_devices, dtype=np.int64).reshape(1, num_devices)
        arr.flags.writeable = False
        return DeviceGrouping(arr)

    @property
    def num_groups(self) -> int:
        return int(self.groups.shape[0])

    @property
    def group_size(self) -> int:
        return int(self.groups.shape[1])

    @property
    def num_devices(self) -> int:
        return int(self.groups.size)

    @property
    def is_flat(self) -> bool:
        return self.num_groups == 1 and bool(
            np.array_equal(self.groups[0], np.arange(self.group_size)))

    def physical(self, logical_groups: np.ndarray) -> np.ndarray:
        """Logical groups ``[k, m]`` (ids within a group) -> physical ``[num_groups*k, m]``."""
        logical_groups = np.asarray(logical_groups, dtype=np.int64)
        return self.groups[:, logical_groups].reshape(-1, logical_groups.shape[-1])

    def physical_pairs(self, logical_pairs: np.ndarray) -> np.ndarray:
        """Logical (source, target) pairs ``[p, 2]`` -> physical pairs for every group."""
        logical_pairs = np.asarray(logical_pairs, dtype=np.int64).reshape(-1, 2)
        return self.groups[:, logical_pairs].reshape(-1, 2)

    def logical_ids(self) -> np.ndarray:
        """``[num_devices]``: the logical id of each physical device (read-only; made once
        per grouping: every per-device table of a handler is expanded through it)."""
        out = self._logical
        if out is None:
            out = np.empty(self.num_devices, dtype=np.int64)
            out[self.groups] = np.arange(self.group_size)[None, :]
            out.flags.writeable = False
            self._logical = out
        return out

    def expand_table(self, logical_values: np.ndarray) -> np.ndarray:
        """Per-logical-device values ``[group_size, ...]`` -> per-physical-device ``[N, ...]``."""
        logical_values = np.asarray(logical_values)
        return logical_values[self.logical_ids()]

    def subgroup(self, inner_groups: np.ndarray) -> "DeviceGrouping":
        """Split every group by ``inner_groups`` (logical ids, ``[k, m]``): the grouping a
        recursive handler runs in. One grouping per distinct pair of arrays (every layer
        of a model recurses into the same groups); its array is read-only."""
        inner = np.asarray(inner_groups, dtype=np.int64)
        key = (self.key, array_token(inner))
        hit = _SUBGROUPS.get(key)
        if hit is None:
            arr = self.physical(inner)
            arr.flags.writeable = False
            hit = _SUBGROUPS.put(key, DeviceGrouping(arr))
        return hit


_SUBGROUPS = BoundedMemo(1024)
