"""Randomized differential tests of convolution partitioning (issue 20).

Hypothesis builds one convolution at a time: 0-2 spatial dims, each a real window
(random size, stride, padding, lhs and rhs dilation, reversal) or one
of the degenerate forms the shared dims model reads as a dot dim (a window spanning the
whole input dim, a size-1 window); random ``dim_labels`` permutations for all three
tensors; now and then ``feature_group_count`` or ``batch_group_count``; bf16 or f32.
Operands and result get random shardings over 2-8 devices: tiled on any dims (uneven
too), partially replicated (``last_tile_dim_replicate``), with the device order written
as a plain iota, an iota with a reshape and transpose (``<=[2,2,2]T(2,1,0)``) or an
explicit permutation; sometimes the result is left for completion to choose. The
partitioned program runs on N CPU devices (padding poisoned) and must match the
unpartitioned one on one device within a tolerance scaled by the dtype's precision and
the output's magnitude.

The default suite runs a handful of seeded examples; ``-m slow`` runs the deep search.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("jax")

from hlo_spmd.ir.io import module_bytes  # noqa: E402
from hlo_spmd.ir.text_parser import parse_module  # noqa: E402
from hlo_spmd.passes.partition import partition_in_place  # noqa: E402
from hlo_spmd.runtime import random_inputs  # noqa: E402
from hlo_spmd.runtime.compare import compare  # noqa: E402
from hlo_spmd.runtime.run import run_partitioned_detailed, run_unpartitioned  # noqa: E402

# Unit roundoff of each dtype: the tolerance is a few roundings of the output's magnitude
# per summation level (a partitioned sum adds its partial sums in another order).
EPS = {"f32": 2.0 ** -23, "bf16": 2.0 ** -8}
NP_DTYPE = {"f32": np.float32}


# -- shardings --------------------------------------------------------------------------------
def _factorizations(n: int) -> list[list[int]]:
    """Ways to write ``n`` as a product of factors > 1 (order matters), up to 3 factors."""
    out = [[n]]
    for a in range(2, n):
        if n % a == 0:
            out += [[a] + rest for rest in _factorizations(n // a) if len(rest) < 3]
    return out


def device_order(draw, n: int) -> str:
    """The tile assignment's device list: ``<=[n]``, a transposed iota, or explicit."""
    kind = draw(st.sampled_from(["iota", "iota", "transposed", "explicit"]))
    if kind == "iota" or n < 4:
        return f"<=[{n}]"
    if kind == "transposed":
        dims = draw(st.sampled_from([f for f in _factorizations(n) if len(f) > 1]))
        perm = draw(st.permutations(list(range(len(dims)))))
        return f"<=[{','.join(map(str, dims))}]T({','.join(map(str, perm))})"
    return ",".join(map(str, draw(st.permutations(list(range(n))))))


def sharding_text(draw, dims: list[int], n: int) -> str:
    """A random sharding of an array of ``dims`` over ``n`` devices, as XLA writes it."""
    if draw(st.integers(0, 6)) == 0:
        return "{replicated}"
    tiles = [1] * len(dims)
    remaining = n
    for d in draw(st.permutations(list(range(len(dims))))):
        if remaining == 1:
            break
        f = draw(st.sampled_from([f for f in (1, 2, 4, 8) if remaining % f == 0]))
        tiles[d] = f
        remaining //= f
    if math.prod(tiles) == 1:
        return "{replicated}"
    shape = tiles + ([remaining] if remaining > 1 else [])
    tail = " last_tile_dim_replicate" if remaining > 1 else ""
    return f"{{devices=[{','.join(map(str, shape))}]{device_order(draw, n)}{tail}}}"


# -- convolutions -----------------------------------------------------------------------------
def _out_size(x: int, k: int, stride: int, lo: int, hi: int, ld: int, rd: int) -> int:
    dilated = 0 if x == 0 else (x - 1) * ld + 1
    padded = lo + dilated + hi
    span = (k - 1) * rd + 1
    return 0 if padded < span else (padded - span) // stride + 1


def _spatial(draw) -> tuple[int, int, int, str]:
    """(input size, kernel size, output size, window text) of one spatial dim."""
    kind = draw(st.sampled_from(["window", "window", "window", "whole", "one"]))
    x = draw(st.integers(1, 10))
    if kind == "whole":      # the window spans the whole dim: a contracting dim of a dot
        return x, x, 1, f"{x}|1|0_0|1|1|0"
    if kind == "one":        # a size-1 window and kernel: a non-contracting dim
        return x, 1, x, "1|1|0_0|1|1|0"
    while True:
        k = draw(st.integers(1, 4))
        stride = draw(st.sampled_from([1, 1, 2, 3]))
        # No negative padding: XLA's CPU runtime computes some such convolutions wrong
        # on one device already (a grouped 4x4 window with padding -1_1 differs from a
        # numpy reference), so the reference itself cannot be trusted there.
        lo, hi = draw(st.integers(0, 3)), draw(st.integers(0, 3))
        ld = draw(st.sampled_from([1, 1, 1, 2]))
        rd = draw(st.sampled_from([1, 1, 1, 2]))
        rev = draw(st.sampled_from([0, 0, 0, 1]))
        o = _out_size(x, k, stride, lo, hi, ld, rd)
        if o >= 1:
            return x, k, o, f"{k}|{stride}|{lo}_{hi}|{ld}|{rd}|{rev}"
        x += 2


def _window_attr(parts: list[str]) -> str:
    if not parts:
        return ""
    cols = list(zip(*(p.split("|") for p in parts)))
    names = ["size", "stride", "pad", "lhs_dilate", "rhs_dilate", "rhs_reversal"]
    defaults = ["", "1", "0_0", "1", "1", "0"]
    fields = [f"{name}={'x'.join(col)}" for name, col, dflt in zip(names, cols, defaults)
              if name == "size" or any(v != dflt for v in col)]
    return ", window={" + " ".join(fields) + "}"


@st.composite
def convolutions(draw):
    n = draw(st.sampled_from([2, 4, 8, 8]))
    dtype = draw(st.sampled_from(["f32", "bf16"]))
    nsp = draw(st.sampled_from([0, 1, 1, 2, 2]))
    groups = draw(st.sampled_from(["none"] * 6 + ["feature", "batch"]))
    g = draw(st.integers(2, 4)) if groups != "none" else 1
    batch = draw(st.integers(1, 4)) * (g if groups == "batch" else 1)
    k_in = draw(st.integers(1, 4))
    in_feature = k_in * (g if groups == "feature" else 1)
    out_feature = draw(st.integers(1, 3)) * g
    spatial = [_spatial(draw) for _ in range(nsp)]
    digits = [str(i) for i in range(nsp)]
    lhs_l = draw(st.permutations(["b", "f", *digits]))
    rhs_l = draw(st.permutations(["i", "o", *digits]))
    out_l = draw(st.permutations(["b", "f", *digits]))
    sizes = {"lhs": {"b": batch, "f": in_feature}, "rhs": {"i": k_in, "o": out_feature},
             "out": {"b": batch // (g if groups == "batch" else 1), "f": out_feature}}
    for i, (x, k, o, _) in enumerate(spatial):
        sizes["lhs"][str(i)], sizes["rhs"][str(i)], sizes["out"][str(i)] = x, k, o
    lhs = [sizes["lhs"][c] for c in lhs_l]
    rhs = [sizes["rhs"][c] for c in rhs_l]
    out = [sizes["out"][c] for c in out_l]
    labels = f"{''.join(lhs_l)}_{''.join(rhs_l)}->{''.join(out_l)}"
    extra = _window_attr([w for *_, w in spatial])
    if groups == "feature":
        extra += f", feature_group_count={g}"
    elif groups == "batch":
        extra += f", batch_group_count={g}"
    ls, rs = sharding_text(draw, lhs, n), sharding_text(draw, rhs, n)
    os_ = sharding_text(draw, out, n) if draw(st.integers(0, 3)) else None

    def shape(dims):
        return f"{dtype}[{','.join(map(str, dims))}]"

    out_sharding = f", sharding={os_}" if os_ else ""
    text = f"""HloModule random_conv, num_partitions={n}
ENTRY %main (x: {shape(lhs)}, k: {shape(rhs)}) -> {shape(out)} {{
  %x = {shape(lhs)} parameter(0), sharding={ls}
  %k = {shape(rhs)} parameter(1), sharding={rs}
  ROOT %conv = {shape(out)} convolution(%x, %k){extra}, dim_labels={labels}{out_sharding}
}}
"""
    reduction = k_in * math.prod(k for _, k, _, _ in spatial) * (g if groups == "batch" else 1)
    return text, n, dtype, reduction


def check_conv(text: str, n: int, dtype: str, reduction: int, seed: int = 0) -> None:
    module = parse_module(text, "random_conv")
    original = module_bytes(module)
    result = partition_in_place(module, n, complete=True)
    inputs = random_inputs([(p.shape.dims, np.float32) for p in module.entry.parameters],
                           seed=seed)
    if dtype == "bf16":
        import ml_dtypes

        inputs = [x.astype(ml_dtypes.bfloat16) for x in inputs]
    expected = run_unpartitioned(original, inputs)
    run = run_partitioned_detailed(module_bytes(result.module), inputs, n,
                                   output_shapes=[e.shape for e in expected],
                                   poison_padding=True)
    scale = max(1.0, float(np.max(np.abs(expected[0].astype(np.float32)), initial=0.0)))
    # A few roundings of the output's magnitude per level of the (re-associated) sum.
    atol = 4.0 * EPS[dtype] * scale * (2.0 + math.log2(max(2, reduction)))
    report = compare(expected, run.outputs, 0.0, atol)
    report.problems[:0] = run.problems
    assert report.ok, f"\n{report}\n{text}"


SETTINGS = dict(deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)


@settings(max_examples=12, **SETTINGS)
@given(convolutions())
def test_random_convolutions(case):
    check_conv(*case)


@pytest.mark.slow
@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(convolutions())
def test_random_convolutions_deep(case):
    check_conv(*case)
