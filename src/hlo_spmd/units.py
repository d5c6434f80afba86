"""Sizes written by people: ``1.5MiB``, ``2GB``, ``123456``.

One parser for every option that takes a size (``--max-bytes-per-device``,
``--max-peak-memory``, ``search --memory-limit``): binary units KiB, MiB, GiB, TiB
(powers of 1024), decimal units KB, MB, GB, TB (powers of 1000), ``B`` or no unit for
plain bytes. Units are case-insensitive (``mib`` = ``MiB``), a space may separate number
and unit, and fractional values are rounded down to whole bytes.
"""
from __future__ import annotations

import re

from hlo_spmd.errors import InputError

_UNITS = {
    "": 1, "b": 1,
    "kib": 1024, "mib": 1024 ** 2, "gib": 1024 ** 3, "tib": 1024 ** 4,
    "kb": 1000, "mb": 1000 ** 2, "gb": 1000 ** 3, "tb": 1000 ** 4,
}
_SIZE = re.compile(r"\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([A-Za-z]*)\s*")


def parse_size(text: str) -> int:
    """Bytes in ``text`` (see the module docstring). Raises :class:`InputError` with a
    one-line message for anything else (negative, no number, unknown unit)."""
    m = _SIZE.fullmatch(text)
    unit = m.group(2).lower() if m else None
    if m is None or unit not in _UNITS:
        raise InputError(f"bad size {text!r}: expected a number of bytes with an optional "
                         "unit (KiB, MiB, GiB, TiB, KB, MB, GB, TB), e.g. 1.5MiB, 2GB, 123456")
    number = m.group(1)
    if "." not in number:  # exact for integers of any size
        return int(number) * _UNITS[unit]
    whole, _, frac = number.partition(".")
    scale = 10 ** len(frac)
    return (int(whole or "0") * scale + int(frac or "0")) * _UNITS[unit] // scale
