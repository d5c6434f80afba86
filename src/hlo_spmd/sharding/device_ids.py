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
    flat = np.sort(np.asarray(ids).reshape(-1))
    return bool(flat.size < 2 or np.all(flat[1:] != flat[:-1]))
