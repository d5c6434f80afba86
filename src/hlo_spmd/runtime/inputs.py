"""Deterministic random inputs for running modules.

Spec strings (the fixture sidecar JSON uses them under ``inputs[i].value``):

=====================  ===========================================================
``normal``             standard normal; ``normal:STD`` scales, ``normal:MEAN:STD``
``uniform``            uniform in [0, 1) (``uniform:LO:HI`` for [LO, HI))
``int_range:LO:HI``    integers in [LO, HI) (half open, like ``range``); any dtype
``bernoulli[:P]``      booleans, True with probability P (default 0.5)
``zeros`` / ``ones``   constant 0 / 1
``const:V``            constant V
``iota``               0, 1, 2, ... in row-major order (handy to see who holds what)
=====================  ===========================================================

Defaults when no spec is given: floating and complex -> ``normal``; signed integers ->
``int_range:-8:8``; unsigned -> ``int_range:0:16``; ``bool`` -> ``bernoulli``.
Input ``i`` draws from its own generator seeded with ``(seed, i)``, so adding an input
does not change the others.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from hlo_spmd.errors import HloSpmdError

DTypeLike = Any


def as_dtype(dtype: DTypeLike) -> np.dtype:
    """numpy dtype from a numpy dtype / type, a numpy name, or an XLA name (``bf16``, ``pred``)."""
    if isinstance(dtype, str):
        from hlo_spmd.ir import primitive_types as pt

        element_type = pt.from_text(dtype)
        if element_type is not None:
            try:
                return pt.numpy_dtype(element_type)
            except ValueError as exc:
                raise HloSpmdError(str(exc)) from exc
        try:
            import ml_dtypes

            if hasattr(ml_dtypes, dtype):
                return np.dtype(getattr(ml_dtypes, dtype))
        except ImportError:  # pragma: no cover
            pass
    try:
        return np.dtype(dtype)
    except TypeError as exc:
        raise HloSpmdError(f"unknown element type {dtype!r}") from exc


def _is_float(dtype: np.dtype) -> bool:
    # ml_dtypes types (bfloat16, float8_*) have kind 'V'; ask ml_dtypes about them.
    if dtype.kind == "f":
        return True
    try:
        import ml_dtypes

        ml_dtypes.finfo(dtype)
        return True
    except Exception:
        return False


def _is_int(dtype: np.dtype) -> bool:
    if dtype.kind in "iu":
        return True
    try:
        import ml_dtypes

        ml_dtypes.iinfo(dtype)
        return True
    except Exception:
        return False


def default_spec(dtype: DTypeLike) -> str:
    """The spec used for ``dtype`` when none is given."""
    dtype = as_dtype(dtype)
    if dtype == np.bool_:
        return "bernoulli"
    if _is_float(dtype) or dtype.kind == "c":
        return "normal"
    if _is_int(dtype):
        return "int_range:0:16" if dtype.kind == "u" or "uint" in dtype.name else "int_range:-8:8"
    raise HloSpmdError(f"no default input generator for element type {dtype}")


def _numbers(parts: list[str], count: int, spec: str) -> list[float]:
    if len(parts) != count:
        raise HloSpmdError(f"input spec {spec!r}: expected {count} numbers after the name")
    try:
        return [float(p) for p in parts]
    except ValueError as exc:
        raise HloSpmdError(f"input spec {spec!r}: {exc}") from exc


def generate(shape: Sequence[int], dtype: DTypeLike, spec: str | None,
             rng: np.random.Generator) -> np.ndarray:
    """One array of ``shape`` / ``dtype`` following ``spec`` (see module docstring)."""
    dtype = as_dtype(dtype)
    shape = tuple(int(d) for d in shape)
    spec = spec or default_spec(dtype)
    name, *parts = spec.strip().split(":")
    is_float = _is_float(dtype)
    is_complex = dtype.kind == "c"
    if name == "normal":
        if not (is_float or is_complex):
            raise HloSpmdError(f"input spec {spec!r} needs a floating type, not {dtype}")
        if len(parts) == 1:
            mean, std = 0.0, _numbers(parts, 1, spec)[0]
        else:
            mean, std = _numbers(parts, 2, spec) if parts else (0.0, 1.0)
        values = rng.normal(mean, std, size=shape)
        if is_complex:
            values = values + 1j * rng.normal(mean, std, size=shape)
    elif name == "uniform":
        if not (is_float or is_complex):
            raise HloSpmdError(f"input spec {spec!r} needs a floating type, not {dtype}")
        low, high = _numbers(parts, 2, spec) if parts else (0.0, 1.0)
        values = rng.uniform(low, high, size=shape)
    elif name == "int_range":
        low, high = _numbers(parts, 2, spec)
        if high <= low:
            raise HloSpmdError(f"input spec {spec!r}: empty range")
        values = rng.integers(int(low), int(high), size=shape)
        if dtype == np.bool_:
            values = values != 0
    elif name == "bernoulli":
        (p,) = _numbers(parts, 1, spec) if parts else (0.5,)
        values = rng.random(size=shape) < p
    elif name in ("zeros", "ones"):
        values = np.full(shape, 0 if name == "zeros" else 1)
    elif name == "const":
        (value,) = _numbers(parts, 1, spec)
        values = np.full(shape, value)
    elif name == "iota":
        values = np.arange(int(np.prod(shape, dtype=np.int64))).reshape(shape)
    else:
        raise HloSpmdError(
            f"unknown input spec {spec!r} (normal, uniform, int_range:LO:HI, bernoulli, "
            "zeros, ones, const:V, iota)"
        )
    return np.asarray(values).astype(dtype)


def random_inputs(shapes_dtypes: Sequence[tuple[Sequence[int], DTypeLike]] | Sequence[Any],
                  seed: int = 0, spec: str | Sequence[str | None] | None = None
                  ) -> list[np.ndarray]:
    """Deterministic inputs for the given ``(shape, dtype)`` pairs.

    ``shapes_dtypes`` items may also be objects with ``.shape`` and ``.dtype`` (e.g.
    :class:`hlo_spmd.runtime.module_io.ArraySpec`). ``spec`` is one spec string for all
    inputs or one per input (``None`` = the dtype's default).
    """
    items = list(shapes_dtypes)
    if spec is None or isinstance(spec, str):
        specs: list[str | None] = [spec] * len(items)
    else:
        specs = list(spec)
        if len(specs) != len(items):
            raise HloSpmdError(f"{len(specs)} input specs for {len(items)} inputs")
    out = []
    for i, (item, item_spec) in enumerate(zip(items, specs)):
        if hasattr(item, "shape") and hasattr(item, "dtype"):
            shape, dtype = item.shape, item.dtype
        else:
            shape, dtype = item
        rng = np.random.default_rng([int(seed), i])
        out.append(generate(shape, dtype, item_spec, rng))
    return out


def sidecar_inputs(meta: dict, seed: int = 0) -> list[np.ndarray]:
    """Inputs for a fixture from its sidecar JSON (``inputs[i].shape/.dtype/.value``)."""
    try:
        entries = meta["inputs"]
        items = [(e["shape"], e["dtype"]) for e in entries]
        specs = [e.get("value") for e in entries]
    except (KeyError, TypeError) as exc:
        raise HloSpmdError(f"fixture sidecar has no usable 'inputs' list: {exc}") from exc
    return random_inputs(items, seed=seed, spec=specs)
