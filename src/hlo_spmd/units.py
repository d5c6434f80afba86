"""Sizes written by people: ``123456``, ``1.5MiB``, ``2GB``, ``16GiB`` -> bytes.

Binary units (KiB, MiB, GiB, TiB: powers of 1024) and decimal ones (KB, MB, GB, TB:
powers of 1000); a plain number is bytes (``B`` may follow). Used by ``search
--memory-limit``.
"""
from __future__ import annotations

import re

from hlo_spmd.errors import HloSpmdError

_UNITS = {"": 1, "B": 1,
          "KIB": 1024, "MIB": 1024 ** 2, "GIB": 1024 ** 3, "TIB": 1024 ** 4,
          "KB": 1000, "MB": 1000 ** 2, "GB": 1000 ** 3, "TB": 1000 ** 4}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([A-Za-z]*)\s*$")


def parse_size(text: str) -> int:
    """Bytes named by ``text``; a one-line :class:`HloSpmdError` when it is not a size."""
    m = _SIZE.match(str(text))
    unit = m.group(2).upper() if m else None
    if m is None or unit not in _UNITS:
        raise HloSpmdError(f"{text!r} is not a size (e.g. 123456, 1.5MiB, 2GB, 16GiB)")
    return int(float(m.group(1)) * _UNITS[unit])


__all__ = ["parse_size"]
