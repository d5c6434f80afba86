"""Checks on arrays of device ids (no XLA counterpart: XLA checks its tile assignments in
C++ where this costs nothing).

``np.unique`` without return options asks ``np.ma.is_masked`` about its input, and that
first touch imports ``numpy.ma`` (~25 ms, a tenth of a small module's whole run) just to
learn that a plain array is not masked. The distinctness checks on device ids need only
a sort, so they live here instead.
"""
from __future__ import annotations

import numpy as np


def all_distinct(ids: np.ndarray) -> bool:
    """True when no value occurs twice in ``ids`` (any shape)."""
    flat = np.asarray(ids).reshape(-1)
    if flat.size < 2:
        return True
    if flat.size >= 256 and flat.dtype.kind == "i" and int(flat.min()) >= 0 and int(flat.max()) < 4 * flat.size:
        # Non-negative ids in a small range (device ids are): a bincount, not a sort.
        return bool(np.bincount(flat).max() <= 1)
    flat = np.sort(flat)
    return bool(np.all(flat[1:] != flat[:-1]))
