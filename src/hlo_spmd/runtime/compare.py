"""Comparing outputs of two runs: per-output errors and a readable report."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

#: Default (rtol, atol) by dtype name; anything not listed (ints, bool) compares exactly.
DEFAULT_TOLERANCES: dict[str, tuple[float, float]] = {
    "float64": (1e-9, 1e-9),
    "complex128": (1e-9, 1e-9),
    "float32": (1e-4, 1e-4),
    "complex64": (1e-4, 1e-4),
    "float16": (2e-2, 2e-2),
    "bfloat16": (2e-2, 2e-2),
}
_NARROW_FLOAT = (1.5e-1, 1.5e-1)  # float8 / float4 types


def default_tolerance(dtype: np.dtype) -> tuple[float, float]:
    """``(rtol, atol)`` used for ``dtype`` when the caller gives none."""
    dtype = np.dtype(dtype)
    if dtype.name in DEFAULT_TOLERANCES:
        return DEFAULT_TOLERANCES[dtype.name]
    if dtype.name.startswith("float"):
        return _NARROW_FLOAT
    return (0.0, 0.0)


@dataclass
class OutputComparison:
    """How one actual output compares with its expected value."""

    index: int
    expected_shape: tuple[int, ...] | None
    expected_dtype: str | None
    actual_shape: tuple[int, ...] | None
    actual_dtype: str | None
    rtol: float = 0.0
    atol: float = 0.0
    max_abs_error: float = 0.0
    max_rel_error: float = 0.0
    mismatched: int = 0
    size: int = 0
    first_mismatch: tuple[int, ...] | None = None
    note: str = ""

    @property
    def shape_ok(self) -> bool:
        return self.expected_shape is not None and self.expected_shape == self.actual_shape

    @property
    def dtype_ok(self) -> bool:
        return self.expected_dtype is not None and self.expected_dtype == self.actual_dtype

    @property
    def ok(self) -> bool:
        return self.shape_ok and self.dtype_ok and self.mismatched == 0


@dataclass
class ComparisonReport:
    """Result of :func:`compare` (and of :func:`hlo_spmd.runtime.run.verify`).

    ``problems`` holds findings that are not per-output numbers (replicas that disagree,
    an output count mismatch, ...); any problem makes the report not ``ok``.
    """

    outputs: list[OutputComparison] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    reference: str = ""  # what produced the expected values (set by verify)

    @property
    def ok(self) -> bool:
        return not self.problems and all(o.ok for o in self.outputs)

    def __bool__(self) -> bool:  # `assert report` reads naturally
        return self.ok

    def __str__(self) -> str:
        header = ("out", "status", "expected", "actual", "max abs err", "max rel err",
                  "mismatched", "rtol/atol")
        rows = []
        for o in self.outputs:
            exp = _fmt_array(o.expected_dtype, o.expected_shape)
            act = _fmt_array(o.actual_dtype, o.actual_shape)
            if not (o.shape_ok and o.dtype_ok):
                status, abs_e, rel_e, mism = "MISMATCH", "-", "-", "-"
            else:
                status = "ok" if o.ok else "FAIL"
                abs_e, rel_e = f"{o.max_abs_error:.3g}", f"{o.max_rel_error:.3g}"
                mism = f"{o.mismatched}/{o.size}"
                if o.first_mismatch is not None:
                    mism += f" (first at {list(o.first_mismatch)})"
            rows.append((str(o.index), status, exp, act, abs_e, rel_e, mism,
                         f"{o.rtol:g}/{o.atol:g}"))
        widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
        lines = [f"reference: {self.reference}"] if self.reference else []
        lines.append("  ".join(c.ljust(w) for c, w in zip(header, widths)).rstrip())
        lines.append("  ".join("-" * w for w in widths))
        lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
        for o in self.outputs:
            if o.note:
                lines.append(f"output {o.index}: {o.note}")
        lines += [f"problem: {p}" for p in self.problems]
        lines.append("OK" if self.ok else "NOT OK")
        return "\n".join(lines)


def _fmt_array(dtype: str | None, shape: tuple[int, ...] | None) -> str:
    if dtype is None or shape is None:
        return "(missing)"
    return f"{dtype}[{','.join(map(str, shape))}]"


def _as_float(x: np.ndarray) -> np.ndarray:
    if x.dtype.kind == "c":
        return x.astype(np.complex128)
    if x.dtype == np.bool_:
        return x.astype(np.float64)
    return x.astype(np.float64)


def compare_one(index: int, expected: np.ndarray, actual: np.ndarray,
                rtol: float | None = None, atol: float | None = None) -> OutputComparison:
    """Compare one output; tolerances default to :func:`default_tolerance` of ``expected``."""
    expected = np.asarray(expected)
    actual = np.asarray(actual)
    d_rtol, d_atol = default_tolerance(expected.dtype)
    rtol = d_rtol if rtol is None else float(rtol)
    atol = d_atol if atol is None else float(atol)
    result = OutputComparison(
        index, tuple(expected.shape), expected.dtype.name, tuple(actual.shape),
        actual.dtype.name, rtol, atol, size=int(expected.size),
    )
    if not result.shape_ok:
        result.note = f"shape {list(actual.shape)} != expected {list(expected.shape)}"
        return result
    if not result.dtype_ok:
        result.note = f"dtype {actual.dtype} != expected {expected.dtype}"
        return result
    if expected.size == 0:
        return result
    e = _as_float(expected)
    a = _as_float(actual)
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.abs(a - e)
        both_nan = np.isnan(e) & np.isnan(a)
        same_inf = np.isinf(e) & np.isinf(a) & (e == a)
        diff = np.where(both_nan | same_inf, 0.0, diff)
        diff = np.where(np.isnan(diff), np.inf, diff)  # NaN on one side only
        scale = np.abs(e)
        scale = np.where(np.isfinite(scale), scale, np.inf)
        rel = np.where(diff == 0, 0.0, diff / np.maximum(scale, np.finfo(np.float64).tiny))
        bad = diff > atol + rtol * scale
    result.max_abs_error = float(diff.max())
    result.max_rel_error = float(rel.max())
    result.mismatched = int(bad.sum())
    if result.mismatched:
        result.first_mismatch = tuple(int(i) for i in np.argwhere(bad)[0])
        where = result.first_mismatch
        result.note = (f"{result.mismatched} of {result.size} elements differ; at "
                       f"{list(where)} expected {expected[where]!s}, got {actual[where]!s}")
    return result


def compare(expected: Sequence[np.ndarray], actual: Sequence[np.ndarray],
            rtol: float | None = None, atol: float | None = None) -> ComparisonReport:
    """Compare output lists elementwise (``|a - e| <= atol + rtol * |e|``, NaN == NaN).

    ``rtol`` / ``atol`` default per dtype (:data:`DEFAULT_TOLERANCES`; ints and bool
    compare exactly). Shape and dtype must match exactly.
    """
    report = ComparisonReport()
    if len(expected) != len(actual):
        report.problems.append(f"{len(actual)} outputs, expected {len(expected)}")
    for i, (e, a) in enumerate(zip(expected, actual)):
        report.outputs.append(compare_one(i, e, a, rtol, atol))
    return report
