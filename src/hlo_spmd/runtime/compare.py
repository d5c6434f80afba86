"""Comparing outputs of two runs: one tolerance rule, per-output errors, a readable report.

A partitioned program sums in another order than the one-device program (partial sums
per device, then an all-reduce), so right programs differ from the reference by rounding.
How much depends on the precision the program computes in, on how many values it sums
into one element, and on the magnitude of those values, not on the element's own
magnitude: a sum that cancels to nearly zero keeps the rounding error of its large
summands. The rule, for a floating output ``e`` (reference) and ``a`` (actual)::

    |a_i - e_i| <= C_REL * eps * |e_i|  +  C_NORM * eps * sqrt(K) * rms(e)     (8, 16)

* ``eps``: machine epsilon of the coarsest floating type the program computes in (at least
  the output's): a float32 result of bfloat16 arithmetic has bfloat16's rounding.
* ``K``: the reduction depth, the most values the program sums into one element (dot
  contracting size, reduced elements, convolution window x input features, and at least
  the partial sums of the N devices); the rounding error of a K-term sum grows like
  ``sqrt(K) * eps`` times its summands (Higham & Mary's probabilistic bound), and
  ``rms(e)`` stands for the summands' magnitude (with random inputs of mean 0 an
  element's summands are of the size of the output's typical value). A sum accumulated
  at a finer precision than ``eps`` (XLA-CPU's bf16 dot sums in f32) counts for less:
  :func:`hlo_spmd.runtime.precision.program_precision` reads K and eps from a module.
* the first term is a few units in the last place of the element itself.

Integers and pred compare exactly (integer sums are exact). NaN equals NaN, an infinity
equals the same infinity. A wrong program (a maximum where a sum belongs, a missing
partial sum, values from the wrong neighbour) errs by the size of the values themselves,
orders of magnitude above this bound; tests/test_verify.py checks both sides on
mutated programs and the rule itself on simulated reassociations.

Explicit ``rtol`` / ``atol`` replace the rule by ``|a - e| <= atol + rtol * |e|``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

#: Units in the last place allowed relative to the element itself.
C_REL = 8.0
#: Multiple of ``eps * sqrt(K) * rms(expected)`` allowed in absolute terms. A training
#: step (errors compound through layers) reached 0.45 of the bound at 8 (fixtures'
#: transformer_train_step); 16 leaves a margin of 4 there, while a dropped or maximised
#: partial sum still errs by 5 (bf16) to 10^5 (f32) times the bound.
C_NORM = 16.0
#: Multiple of the largest error XLA's own partitioning of the module shows on the same
#: inputs, allowed on top when the rule alone fails (see :func:`widen_by_xla`).
C_XLA = 4.0


def machine_eps(dtype: np.dtype) -> float | None:
    """Machine epsilon of a floating / complex dtype (ml_dtypes types included); None for
    integers and bool (they compare exactly)."""
    dtype = np.dtype(dtype)
    if dtype.kind == "c":
        return float(np.finfo(dtype).eps)
    if dtype.kind == "f":
        return float(np.finfo(dtype).eps)
    try:
        import ml_dtypes

        return float(ml_dtypes.finfo(dtype).eps)
    except Exception:  # not a floating type
        return None


@dataclass(frozen=True)
class Tolerance:
    """``|a_i - e_i| <= rtol * |e_i| + norm * rms(e) + atol`` (see the module docstring).

    ``eps`` / ``depth`` record where ``rtol`` and ``norm`` came from (0 / 1 when given
    explicitly); all zero means exact.
    """

    rtol: float
    norm: float = 0.0
    atol: float = 0.0
    eps: float = 0.0
    depth: int = 1
    xla_error: float = 0.0  # the largest error of XLA's own partitioning, when it widened atol

    @property
    def exact(self) -> bool:
        return self.rtol == 0 and self.norm == 0 and self.atol == 0

    def allowed(self, expected: np.ndarray) -> np.ndarray:
        """Per-element bound for the reference values ``expected`` (float64 / complex)."""
        magnitude = np.abs(expected)
        finite = magnitude[np.isfinite(magnitude)]
        rms = float(np.sqrt(np.mean(finite ** 2))) if finite.size else 0.0
        bound = self.rtol * magnitude + (self.norm * rms + self.atol)
        return np.where(np.isfinite(bound), bound, np.inf)

    def describe(self) -> str:
        if self.exact:
            return "exact"
        if self.eps:
            norm = self.norm / (self.eps * math.sqrt(self.depth))
            xla = (f" + {C_XLA:g} x XLA's own error {self.xla_error:.3g}"
                   if self.xla_error else "")
            return (f"{self.rtol / self.eps:g} eps |ref| + {norm:g} eps sqrt(K) rms(ref)"
                    f"{xla}, eps={self.eps:.3g}, K={self.depth}")
        return f"rtol={self.rtol:g}, atol={self.atol:g}"


def tolerance_for(dtype: np.dtype, *, eps: float | None = None, depth: int = 1) -> Tolerance:
    """The rule for an output of ``dtype`` of a program computing with precision ``eps``
    (default: the dtype's own; the coarser of the two counts) and reduction depth ``depth``."""
    own = machine_eps(dtype)
    if own is None:
        return Tolerance(0.0)
    e = max(own, eps or 0.0)
    k = max(int(depth), 1)
    return Tolerance(C_REL * e, C_NORM * e * math.sqrt(k), 0.0, e, k)


@dataclass
class OutputComparison:
    """How one actual output compares with its expected value.

    ``worst`` is the largest ``|a_i - e_i| / allowed_i`` (above 1: the output fails),
    ``worst_at`` its index; ``rtol`` / ``atol`` the relative part and the absolute part of
    the bound as applied to this output.
    """

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
    worst: float = 0.0
    worst_at: tuple[int, ...] | None = None
    tolerance: Tolerance | None = None

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

    @property
    def worst(self) -> OutputComparison | None:
        """The output closest to (or furthest over) its tolerance."""
        judged = [o for o in self.outputs if o.shape_ok and o.dtype_ok and o.size]
        return max(judged, key=lambda o: o.worst, default=None)

    def __str__(self) -> str:
        header = ("out", "status", "expected", "actual", "max abs err", "worst/tol",
                  "mismatched")
        rows = []
        for o in self.outputs:
            exp = _fmt_array(o.expected_dtype, o.expected_shape)
            act = _fmt_array(o.actual_dtype, o.actual_shape)
            if not (o.shape_ok and o.dtype_ok):
                status, abs_e, worst, mism = "MISMATCH", "-", "-", "-"
            else:
                status = "ok" if o.ok else "FAIL"
                abs_e = f"{o.max_abs_error:.3g}"
                worst = _fmt_worst(o)
                mism = f"{o.mismatched}/{o.size}"
            rows.append((str(o.index), status, exp, act, abs_e, worst, mism))
        widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
        lines = [f"reference: {self.reference}"] if self.reference else []
        lines.append("  ".join(c.ljust(w) for c, w in zip(header, widths)).rstrip())
        lines.append("  ".join("-" * w for w in widths))
        lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
        rules = sorted({o.tolerance.describe() for o in self.outputs
                        if o.tolerance is not None and not o.tolerance.exact})
        if rules:
            lines.append("tolerance: |out - ref| <= " + "; ".join(rules)
                         + (" (integers, pred: exact)" if any(
                             o.tolerance is not None and o.tolerance.exact
                             for o in self.outputs) else ""))
        for o in self.outputs:
            if o.note:
                lines.append(f"output {o.index}: {o.note}")
        lines += [f"problem: {p}" for p in self.problems]
        worst = self.worst
        summary = "OK" if self.ok else "NOT OK"
        if worst is not None and worst.worst_at is not None:
            summary += (f" (worst: {_ratio(worst.worst)} of tolerance at out{worst.index}"
                        f"{_index(worst.worst_at)})")
        lines.append(summary)
        return "\n".join(lines)


def _ratio(x: float) -> str:
    return "inf" if not np.isfinite(x) else f"{x:.2g}"


def _fmt_worst(o: OutputComparison) -> str:
    if o.worst_at is None:
        return "0"
    return f"{_ratio(o.worst)} at {_index(o.worst_at)}"


def _index(at: tuple[int, ...]) -> str:
    return "[" + ",".join(map(str, at)) + "]"


def _fmt_array(dtype: str | None, shape: tuple[int, ...] | None) -> str:
    if dtype is None or shape is None:
        return "(missing)"
    return f"{dtype}[{','.join(map(str, shape))}]"


def _wide(x: np.ndarray) -> np.ndarray:
    return x.astype(np.complex128 if x.dtype.kind == "c" else np.float64)


def _error(e: np.ndarray, a: np.ndarray) -> np.ndarray:
    """``|a - e|``, 0 where both are NaN or the same infinity, inf where one is NaN."""
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.abs(a - e)
        both_nan = np.isnan(e) & np.isnan(a)
        same_inf = np.isinf(e) & np.isinf(a) & (e == a)
        diff = np.where(both_nan | same_inf, 0.0, diff)
        return np.where(np.isnan(diff), np.inf, diff)


def close_mask(expected: np.ndarray, actual: np.ndarray, tolerance: Tolerance) -> np.ndarray:
    """Elementwise: does ``actual`` agree with ``expected`` under ``tolerance``? (exact
    for integers and bool; NaN agrees with NaN). The one elementwise test: compare and
    the replica check of reassembly both use it."""
    expected, actual = np.asarray(expected), np.asarray(actual)
    if expected.dtype.kind in "iub" or tolerance.exact:
        return (expected == actual) | (_error(_wide(expected), _wide(actual)) == 0)
    e = _wide(expected)
    return _error(e, _wide(actual)) <= tolerance.allowed(e)


def compare_one(index: int, expected: np.ndarray, actual: np.ndarray,
                rtol: float | None = None, atol: float | None = None, *,
                eps: float | None = None, depth: int = 1,
                tolerance: Tolerance | None = None) -> OutputComparison:
    """Compare one output by the rule of :func:`tolerance_for` (``eps``, ``depth``), or by
    ``|a - e| <= atol + rtol * |e|`` when ``rtol`` or ``atol`` is given, or by an explicit
    ``tolerance``."""
    expected = np.asarray(expected)
    actual = np.asarray(actual)
    if tolerance is not None:
        tol = tolerance
    elif rtol is not None or atol is not None:
        tol = Tolerance(float(rtol or 0.0), 0.0, float(atol or 0.0))
    else:
        tol = tolerance_for(expected.dtype, eps=eps, depth=depth)
    result = OutputComparison(
        index, tuple(expected.shape), expected.dtype.name, tuple(actual.shape),
        actual.dtype.name, size=int(expected.size), tolerance=tol,
    )
    if not result.shape_ok:
        result.note = f"shape {list(actual.shape)} != expected {list(expected.shape)}"
        return result
    if not result.dtype_ok:
        result.note = f"dtype {actual.dtype} != expected {expected.dtype}"
        return result
    if expected.size == 0:
        return result
    e = _wide(expected)
    diff = _error(e, _wide(actual))
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        allowed = tol.allowed(e)
        bad = diff > allowed
        ratio = np.where(diff == 0, 0.0, diff / allowed)  # x / 0 = inf: exact and differs
        scale = np.abs(e)
        rel = np.where(diff == 0, 0.0,
                       diff / np.maximum(np.where(np.isfinite(scale), scale, np.inf),
                                         np.finfo(np.float64).tiny))
    result.rtol = tol.rtol
    result.atol = float(np.min(allowed - tol.rtol * np.abs(e))) if tol.norm else tol.atol
    result.max_abs_error = float(diff.max())
    result.max_rel_error = float(rel.max())
    result.mismatched = int(bad.sum())
    flat = int(np.argmax(ratio))
    result.worst = float(ratio.flat[flat])
    if result.worst > 0:
        result.worst_at = tuple(int(i) for i in np.unravel_index(flat, ratio.shape))
    if result.mismatched:
        result.first_mismatch = tuple(int(i) for i in np.argwhere(bad)[0])
        where = result.worst_at
        result.note = (f"{result.mismatched} of {result.size} elements differ; worst at "
                       f"{_index(where)}: expected {expected[where]!s}, got {actual[where]!s}")
    return result


def compare(expected: Sequence[np.ndarray], actual: Sequence[np.ndarray],
            rtol: float | None = None, atol: float | None = None, *,
            eps: float | None = None, depth: int | Sequence[int] = 1) -> ComparisonReport:
    """Compare output lists by the rule of the module docstring: one function for
    ``verify`` and the tests.

    ``eps``: the precision the program computes in (default: each output's dtype);
    ``depth``: its reduction depth K, one for all outputs or one per output
    (:func:`hlo_spmd.runtime.precision.program_precision` reads both from a module). Explicit ``rtol`` / ``atol`` replace the rule. Shape and
    dtype must match exactly.
    """
    report = ComparisonReport()
    if len(expected) != len(actual):
        report.problems.append(f"{len(actual)} outputs, expected {len(expected)}")
    for i, (e, a) in enumerate(zip(expected, actual)):
        k = depth if isinstance(depth, int) else (depth[i] if i < len(depth) else max(depth))
        report.outputs.append(compare_one(i, e, a, rtol, atol, eps=eps, depth=k))
    return report


def widen_by_xla(report: ComparisonReport, expected: Sequence[np.ndarray],
                 actual: Sequence[np.ndarray], xla: Sequence[np.ndarray]) -> None:
    """Judge again, in place, each output that failed on its numbers alone, allowing
    :data:`C_XLA` times the largest error XLA's own partitioned program shows on the same
    inputs (``xla``): a right program may round as much as XLA's does, a wrong one errs
    by the size of the values. Outputs XLA computes exactly stay judged by the rule."""
    for i, o in enumerate(report.outputs):
        if o.ok or not (o.shape_ok and o.dtype_ok) or o.tolerance is None \
                or o.tolerance.exact or i >= len(xla):
            continue
        e, x = np.asarray(expected[i]), np.asarray(xla[i])
        if x.shape != e.shape:
            continue
        noise = float(np.max(_error(_wide(e), _wide(x)), initial=0.0))
        if not 0 < noise < np.inf:
            continue
        t = o.tolerance
        widened = Tolerance(t.rtol, t.norm, t.atol + C_XLA * noise, t.eps, t.depth, noise)
        report.outputs[i] = compare_one(o.index, e, actual[i], tolerance=widened)
