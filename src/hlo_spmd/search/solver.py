"""The integer program the search solves each round, with HiGHS (``scipy.optimize.milp``).

Around the incumbent assignment, every group ``g`` picks one candidate ``c`` (binary
``x[g,c]``, one per group). Costs are measured, not estimated: ``unary[g][c]`` is the
change in (bytes, collectives, peak) of the whole partitioned program when only group
``g`` moves to ``c``; ``pairs[(g, c, h, d)]`` is what moving both ``g`` and ``h`` costs
beyond the two unary changes (the interaction of parameters that meet in one op), with a
product variable ``y >= x[g,c] + x[h,d] - 1`` (and ``y <= x[g,c]``, ``y <= x[h,d]``) so
that it counts exactly when both are chosen. The memory limit is the constraint
``peak0 + sum(dpeak x) + sum(dpeak_pair y) <= limit``. Objective: bytes, then
collectives, then peak (scaled so that each breaks the ties of the one before).

:func:`solve` returns up to ``k`` distinct best solutions (each further one excludes the
previous with a no-good cut); the caller prices each exactly.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

Delta = tuple[float, float, float]  # (bytes, collectives, peak) change


def _objective(d: Delta, scale_bytes: float, scale_peak: float) -> float:
    b, n, p = d
    return b / scale_bytes + 1e-4 * n + 1e-7 * p / scale_peak


def solve(unary: Sequence[Sequence[Delta | None]],
          pairs: Mapping[tuple[int, int, int, int], Delta],
          memory_slack: float | None, k: int = 4,
          time_limit: float = 10.0) -> list[list[int]]:
    """Up to ``k`` assignments (one candidate index per group), best first by the
    model's objective. ``None`` unary entries are forbidden candidates. ``memory_slack``:
    limit minus the incumbent's peak (None: no limit). When no assignment meets the
    memory limit in the model, the model's smallest-peak assignment is returned."""
    from scipy.optimize import Bounds, LinearConstraint, milp

    if not unary:
        return [[]]  # nothing left to decide (every parameter fixed): the one assignment
    offsets = []
    n = 0
    for cands in unary:
        offsets.append(n)
        n += len(cands)
    pair_list = list(pairs.items())
    m = n + len(pair_list)
    vals = [d for cands in unary for d in cands if d is not None] + [d for _, d in pair_list]
    scale_bytes = max([abs(d[0]) for d in vals] + [1.0])
    scale_peak = max([abs(d[2]) for d in vals] + [1.0])
    cost = np.zeros(m)
    peak = np.zeros(m)
    upper = np.ones(m)
    for g, cands in enumerate(unary):
        for c, d in enumerate(cands):
            if d is None:
                upper[offsets[g] + c] = 0
            else:
                cost[offsets[g] + c] = _objective(d, scale_bytes, scale_peak)
                peak[offsets[g] + c] = d[2]
    rows: list[np.ndarray] = []
    lo: list[float] = []
    hi: list[float] = []
    for g, cands in enumerate(unary):
        r = np.zeros(m)
        r[offsets[g]:offsets[g] + len(cands)] = 1
        rows.append(r)
        lo.append(1)
        hi.append(1)
    for j, ((g, c, h, d), delta) in enumerate(pair_list):
        y = n + j
        cost[y] = _objective(delta, scale_bytes, scale_peak)
        peak[y] = delta[2]
        xa, xb = offsets[g] + c, offsets[h] + d
        r = np.zeros(m)
        r[y], r[xa], r[xb] = 1, -1, -1
        rows.append(r)
        lo.append(-1)
        hi.append(np.inf)
        for x in (xa, xb):
            r = np.zeros(m)
            r[y], r[x] = 1, -1
            rows.append(r)
            lo.append(-np.inf)
            hi.append(0)
    integrality = np.concatenate([np.ones(n), np.zeros(len(pair_list))])
    bounds = Bounds(np.zeros(m), upper)
    options = {"time_limit": time_limit, "disp": False}

    def run(objective: np.ndarray, with_memory: bool, cuts: list[np.ndarray]):
        a = list(rows) + list(cuts)
        lo2 = list(lo) + [-np.inf] * len(cuts)
        hi2 = list(hi) + [len(unary) - 1] * len(cuts)
        if with_memory and memory_slack is not None:
            a.append(peak)
            lo2.append(-np.inf)
            hi2.append(memory_slack)
        cons = LinearConstraint(np.array(a), np.array(lo2), np.array(hi2))
        return milp(objective, constraints=cons, integrality=integrality, bounds=bounds,
                    options=options)

    objective, with_memory = cost, True
    out: list[list[int]] = []
    cuts: list[np.ndarray] = []
    for _ in range(k):
        res = run(objective, with_memory, cuts)
        if res.x is None:
            if not out and with_memory:  # nothing fits in the model: fit as best it can
                objective, with_memory = peak / scale_peak + 1e-3 * cost, False
                res = run(objective, with_memory, cuts)
            if res.x is None:
                break
        x = res.x
        pick = []
        cut = np.zeros(m)
        for g, cands in enumerate(unary):
            seg = x[offsets[g]:offsets[g] + len(cands)]
            c = int(np.argmax(seg))
            pick.append(c)
            cut[offsets[g] + c] = 1
        out.append(pick)
        cuts.append(cut)
    return out


__all__ = ["solve", "Delta"]
