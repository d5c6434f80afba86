"""Randomized differential tests for unreduced and manual values (issue 20, items 2-4).

Hypothesis writes small HLO programs in which
* manual values (fully manual, or manual over one mesh axis with the other one still
  tiled) enter through SPMDFullToShardShape and leave through SPMDShardToFullShape, meet
  manual leaves of tuple parameters, and go through layout constraints, tuple /
  get-tuple-element, while loops, conditionals and collectives inside the region; the
  reference is XLA's own partitioned program run on the same per-device inputs
  (tests/_xla_compare.py), since these programs have no single-device meaning;
* unreduced values (partial sums: ``{unreduced}`` or a tiled sharding with an unreduced
  subgroup) go through the same ops and end in a random tiled, partially replicated or
  unreduced root; the reference is the original run on one device (the runtime feeds
  unreduced parameters as partial sums).
A modest number of examples runs by default; deeper runs are marked ``slow``.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("jax")

from _xla_compare import compare_with_xla  # noqa: E402
from hlo_spmd.ir.io import load_module_bytes, module_bytes  # noqa: E402
from hlo_spmd.passes.partition import partition_in_place  # noqa: E402
from hlo_spmd.runtime import verify  # noqa: E402

SUM = """sum {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT add = f32[] add(a, b)
}
"""


def _devices(draw, n: int) -> list[int]:
    return list(range(n)) if draw(st.booleans()) else list(draw(st.permutations(range(n))))


def _tiled(dims: list[int], devices: list[int], suffix: str = "") -> str:
    return "{devices=[" + ",".join(map(str, dims)) + "]" + ",".join(map(str, devices)) + \
        (" " + suffix if suffix else "") + "}"


def _random_root(draw, n: int) -> str:
    """A random sharding of a rank-2 value: replicated, tiled or partially replicated."""
    kind = draw(st.sampled_from(["replicated", "tiled", "partial"]))
    if kind == "replicated" or n == 1:
        return "{replicated}"
    devices = _devices(draw, n)
    if kind == "tiled":
        a = draw(st.sampled_from([f for f in (1, 2, 4, 8) if n % f == 0]))
        return _tiled([a, n // a], devices)
    a = draw(st.sampled_from([f for f in (1, 2, 4) if n % f == 0 and f < n]))
    return _tiled([a, 1, n // a], devices, "last_tile_dim_replicate")


class Region:
    """Shardings of the values of one manual region over the mesh ``devices[a, m]``."""

    def __init__(self, a: int, m: int, devices: list[int], full: bool):
        self.a, self.m, self.devices, self.full = a, m, devices, full
        self.outer = _tiled([a, m], devices)
        if full:
            self.array = self.scalar = "{manual}"
        else:
            self.array = _tiled([a, 1, m], devices, "last_tile_dims={manual}")
            self.scalar = _tiled([a, m], devices, "last_tile_dims={replicated, manual}")

    def groups(self) -> str:
        """Replica groups a collective may use inside the region: all devices when fully
        manual, otherwise the devices that share one automatic tile."""
        rows = np.asarray(self.devices).reshape(self.a, self.m)
        if self.full:
            rows = rows.reshape(1, -1)
        return "{" + ",".join("{" + ",".join(map(str, r)) + "}" for r in rows) + "}"


@st.composite
def manual_programs(draw):
    n = draw(st.sampled_from([2, 4, 8]))
    m = draw(st.sampled_from([f for f in (2, 4, 8) if n % f == 0]))
    a = n // m
    full = draw(st.booleans())
    region = Region(a, m, _devices(draw, n), full)
    A, B = a * draw(st.integers(1, 3)), m * draw(st.integers(1, 3))
    local = [A // a if full else A, B // m]
    L = f"f32[{local[0]},{local[1]}]"
    G = f"f32[{A},{B}]"
    MS, SS = region.array, region.scalar
    comps, body = [], []
    body.append(f"  p0 = {G} parameter(0), sharding={region.outer}")
    body.append(f"  p1 = ({G}, {L}) parameter(1), sharding={{{_random_root(draw, n)}, "
                f"{MS}}}")
    body.append(f"  g0 = {G} get-tuple-element(p1), index=0")
    body.append(f"  g1 = {L} get-tuple-element(p1), index=1, sharding={MS}")
    body.append(f"  s0 = {L} custom-call(p0), custom_call_target=\"SPMDFullToShardShape\", "
                f"sharding={MS}")
    v = "s0"
    for k, op in enumerate(draw(st.lists(st.sampled_from(
            ["add_leaf", "negate", "layout", "tuple", "while", "cond", "all-reduce"]),
            min_size=1, max_size=4))):
        y = f"v{k}"
        if op == "add_leaf":
            body.append(f"  {y} = {L} add({v}, g1), sharding={MS}")
        elif op == "negate":
            body.append(f"  {y} = {L} negate({v}), sharding={MS}")
        elif op == "layout":
            body.append(f"  {y} = {L} custom-call({v}), custom_call_target=\"LayoutConstraint\", "
                        f"operand_layout_constraints={{{L}{{0,1}}}}, sharding={MS}")
        elif op == "tuple":
            body.append(f"  t{k} = ({L}, {L}) tuple({v}, g1), sharding={{{MS}, {MS}}}")
            body.append(f"  {y} = {L} get-tuple-element(t{k}), index=0, sharding={MS}")
        elif op == "all-reduce":
            body.append(f"  {y} = {L} all-reduce({v}), channel_id={k + 1}, replica_groups="
                        f"{region.groups()}, use_global_device_ids=true, to_apply=sum, "
                        f"sharding={MS}")
        elif op == "while":
            T = f"(s32[], {L})"
            comps.append(f"""cond{k} {{
  p = {T} parameter(0), sharding={{{SS}, {MS}}}
  i = s32[] get-tuple-element(p), index=0, sharding={SS}
  c = s32[] constant(3), sharding={SS}
  ROOT lt = pred[] compare(i, c), direction=LT, sharding={SS}
}}
body{k} {{
  p = {T} parameter(0), sharding={{{SS}, {MS}}}
  i = s32[] get-tuple-element(p), index=0, sharding={SS}
  one = s32[] constant(1), sharding={SS}
  j = s32[] add(i, one), sharding={SS}
  x = {L} get-tuple-element(p), index=1, sharding={MS}
  h = f32[] constant(0.5), sharding={SS}
  hb = {L} broadcast(h), dimensions={{}}, sharding={MS}
  y = {L} multiply(x, hb), sharding={MS}
  z = {L} add(y, x), sharding={MS}
  ROOT r = {T} tuple(j, z), sharding={{{SS}, {MS}}}
}}
""")
            body.append(f"  z{k} = s32[] constant(0), sharding={SS}")
            body.append(f"  i{k} = {T} tuple(z{k}, {v}), sharding={{{SS}, {MS}}}")
            body.append(f"  w{k} = {T} while(i{k}), condition=cond{k}, body=body{k}, "
                        f"sharding={{{SS}, {MS}}}")
            body.append(f"  {y} = {L} get-tuple-element(w{k}), index=1, sharding={MS}")
        else:  # cond
            comps.append(f"""neg{k} {{
  x = {L} parameter(0), sharding={MS}
  ROOT r = {L} negate(x), sharding={MS}
}}
keep{k} {{
  x = {L} parameter(0), sharding={MS}
  ROOT r = {L} copy(x), sharding={MS}
}}
""")
            flag = "true" if draw(st.booleans()) else "false"
            body.append(f"  b{k} = pred[] constant({flag}), sharding={SS}")
            body.append(f"  {y} = {L} conditional(b{k}, {v}, {v}), true_computation=neg{k}, "
                        f"false_computation=keep{k}, sharding={MS}")
        v = y
    body.append(f"  f = {G} custom-call({v}), custom_call_target=\"SPMDShardToFullShape\", "
                f"sharding={region.outer}")
    if draw(st.booleans()):
        body.append(f"  mul = {G} multiply(f, g0), sharding={region.outer}")
        v = "mul"
    else:
        v = "f"
    if draw(st.booleans()):
        body.append(f"  lc = {G} custom-call({v}), custom_call_target=\"LayoutConstraint\", "
                    f"operand_layout_constraints={{{G}{{0,1}}}}")
        v = "lc"
    body.append(f"  out = {G} copy({v}), sharding={_random_root(draw, n)}")
    if draw(st.booleans()):   # re-enter the region, as the module does
        # (as JAX writes it: the value annotated with the full sharding, then entered)
        body.append(f"  a = {G} custom-call(out), custom_call_target=\"Sharding\", "
                    f"sharding={region.outer}")
        body.append(f"  e = {L} custom-call(a), custom_call_target=\"SPMDFullToShardShape\", "
                    f"sharding={MS}")
        body.append(f"  ROOT root = ({G}, {L}) tuple(out, e), sharding="
                    f"{{{_random_root(draw, n)}, {MS}}}")
    else:
        body.append(f"  ROOT root = ({G}, {L}) tuple(out, g1), sharding={{{{replicated}}, {MS}}}")
    text = "HloModule random_manual\n\n" + SUM + "".join(comps) + "\nENTRY main {\n" + \
        "\n".join(body) + "\n}\n"
    return text, n


@st.composite
def unreduced_programs(draw):
    n = draw(st.sampled_from([2, 4, 8]))
    if draw(st.booleans()):
        U = "{unreduced}"
    else:
        t = draw(st.sampled_from([f for f in (2, 4) if n % f == 0 and f < n] or [1]))
        U = _tiled([t, 1, n // t], _devices(draw, n), "last_tile_dims={unreduced}")
    A, B = draw(st.sampled_from([4, 6, 8])), draw(st.sampled_from([4, 5, 8]))
    G = f"f32[{A},{B}]"
    comps, body = [], []
    body.append(f"  p0 = {G} parameter(0), sharding={U}")
    body.append(f"  p1 = {G} parameter(1), sharding={U}")
    body.append(f"  p2 = {G} parameter(2), sharding={_random_root(draw, n)}")
    v = "p0"
    for k, op in enumerate(draw(st.lists(st.sampled_from(
            ["layout", "layout_open", "negate", "add", "tuple", "while", "cond"]),
            min_size=1, max_size=4))):
        y = f"v{k}"
        if op in ("layout", "layout_open"):
            s = f", sharding={U}" if op == "layout" else ""
            body.append(f"  {y} = {G} custom-call({v}), custom_call_target=\"LayoutConstraint\", "
                        f"operand_layout_constraints={{{G}{{0,1}}}}{s}")
        elif op == "negate":
            body.append(f"  {y} = {G} negate({v}), sharding={U}")
        elif op == "add":
            body.append(f"  {y} = {G} add({v}, p1), sharding={U}")
        elif op == "tuple":
            body.append(f"  t{k} = ({G}, {G}) tuple({v}, p2)")
            body.append(f"  {y} = {G} get-tuple-element(t{k}), index=0")
        elif op == "while":
            T = f"(s32[], {G})"
            comps.append(f"""cond{k} {{
  p = {T} parameter(0)
  i = s32[] get-tuple-element(p), index=0
  c = s32[] constant(2)
  ROOT lt = pred[] compare(i, c), direction=LT
}}
body{k} {{
  p = {T} parameter(0)
  i = s32[] get-tuple-element(p), index=0
  one = s32[] constant(1)
  j = s32[] add(i, one)
  x = {G} get-tuple-element(p), index=1
  z = {G} add(x, x)
  ROOT r = {T} tuple(j, z)
}}
""")
            body.append(f"  z{k} = s32[] constant(0)")
            body.append(f"  i{k} = {T} tuple(z{k}, {v})")
            body.append(f"  w{k} = {T} while(i{k}), condition=cond{k}, body=body{k}")
            body.append(f"  {y} = {G} get-tuple-element(w{k}), index=1")
        else:  # cond
            comps.append(f"""neg{k} {{
  x = {G} parameter(0)
  ROOT r = {G} negate(x)
}}
keep{k} {{
  x = {G} parameter(0)
  ROOT r = {G} copy(x)
}}
""")
            flag = "true" if draw(st.booleans()) else "false"
            body.append(f"  b{k} = pred[] constant({flag})")
            body.append(f"  {y} = {G} conditional(b{k}, {v}, {v}), true_computation=neg{k}, "
                        f"false_computation=keep{k}")
        v = y
    root = draw(st.sampled_from([U, _random_root(draw, n)]))
    body.append(f"  ROOT out = {G} multiply({v}, p2), sharding={_random_root(draw, n)}"
                if draw(st.booleans()) and root != U else
                f"  ROOT out = {G} copy({v}), sharding={root}")
    text = "HloModule random_unreduced\n\n" + "".join(comps) + "\nENTRY main {\n" + \
        "\n".join(body) + "\n}\n"
    return text, n


def _check_unreduced(text: str, n: int) -> None:
    original = load_module_bytes(text.encode())
    result = partition_in_place(load_module_bytes(text.encode()), n)
    report = verify(module_bytes(original), module_bytes(result.module), n,
                    poison_padding=True)
    assert report.ok, f"\n{report}\n{text}"


def _check_manual(text: str, n: int) -> None:
    try:
        compare_with_xla(text, n)
    except AssertionError as e:
        raise AssertionError(f"{e}\n{text}") from None


SETTINGS = dict(deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)


@settings(max_examples=12, **SETTINGS)
@given(manual_programs())
def test_random_manual_regions_match_xla(case):
    _check_manual(*case)


@settings(max_examples=15, **SETTINGS)
@given(unreduced_programs())
def test_random_unreduced_values_match_one_device(case):
    _check_unreduced(*case)


@pytest.mark.slow
@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(manual_programs())
def test_random_manual_regions_deep(case):
    _check_manual(*case)


@pytest.mark.slow
@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(unreduced_programs())
def test_random_unreduced_values_deep(case):
    _check_unreduced(*case)
