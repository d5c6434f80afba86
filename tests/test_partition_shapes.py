"""Shape-op handlers (broadcast, reshape, transpose, slice, pad, concatenate,
dynamic-slice, dynamic-update-slice, reverse, iota; scalar-operand elementwise ops):
every case is fully annotated, partitioned with ``complete=True`` and run on N CPU
devices against the unpartitioned module with poisoned padding."""
from __future__ import annotations

import math

import numpy as np
import pytest

from hlo_spmd.ir.io import module_bytes, module_text
from hlo_spmd.ir.text_parser import parse_module
from hlo_spmd.ir.verifier import verify_module
from hlo_spmd.passes.partition import partition_in_place
from hlo_spmd.runtime import random_inputs, entry_signature, verify
from hlo_spmd.sharding import HloSharding, reshape_sharding, reverse_sharding

pytest.importorskip("jax")

COLLECTIVES = ("all-gather", "all-reduce", "all-to-all", "collective-permute",
               "reduce-scatter")


# -- sharding text ---------------------------------------------------------------------------
def sh(n: int, *tiles: int, order: str | None = None) -> str:
    """``tiles`` over ``n`` devices, the rest replicated (last_tile_dim_replicate);
    ``order="rev"`` lists devices in reverse, ``"T"`` uses a transposed iota."""
    p = math.prod(tiles)
    assert n % p == 0, (n, tiles)
    rep = n // p
    dims = list(tiles) + ([rep] if rep > 1 else [])
    suffix = " last_tile_dim_replicate" if rep > 1 else ""
    if order == "rev":
        devs = ",".join(str(d) for d in reversed(range(n)))
        return f"{{devices=[{','.join(map(str, dims))}]{devs}{suffix}}}"
    if order == "T" and n >= 4:
        return f"{{devices=[{','.join(map(str, dims))}]<=[2,{n // 2}]T(1,0){suffix}}}"
    return f"{{devices=[{','.join(map(str, dims))}]<=[{n}]{suffix}}}"


def R() -> str:
    return "{replicated}"


# -- running ---------------------------------------------------------------------------------
def partition_text(text: str, n: int):
    module = parse_module(text)
    verify_module(module)
    original = module_bytes(module)
    result = partition_in_place(module, n, complete=True)
    return original, result


def collectives_in(module) -> list[str]:
    return [i.opcode for i in module.instructions() if i.opcode in COLLECTIVES]


def check(text: str, n: int, inputs=None, local: bool = False, seeds=(0,)):
    original, result = partition_text(text, n)
    partitioned = module_bytes(result.module)
    if local:
        assert collectives_in(result.module) == [], module_text(result.module)
    assert not result.report.replicated_fallbacks, result.report.replicated_fallbacks
    input_sets = inputs if inputs is not None else [None]
    # A module without parameters records no parameter shardings: say so explicitly.
    params = [] if not entry_signature(original).parameters else None
    for seed in seeds:
        for ins in input_sets:
            report = verify(original, partitioned, n, inputs=ins, seed=seed,
                            poison_padding=True, param_shardings=params)
            assert report.ok, f"{report}\n{text}\n{module_text(result.module)}"
    return result


def module(body: str, name: str = "m") -> str:
    return f"HloModule {name}\n\nENTRY main {{\n{body}\n}}\n"


NS = (2, 4, 8)


# -- broadcast -------------------------------------------------------------------------------
def broadcast_cases(n):
    h = n // 2
    return {
        "along_new_dim_operand_tiled": (module(f"""
  x = f32[7] parameter(0), sharding={sh(n, n)}
  ROOT b = f32[7,5] broadcast(x), dimensions={{0}}, sharding={sh(n, n, 1)}"""), True),
        "new_dim_tiled_operand_replicated": (module(f"""
  x = f32[7] parameter(0), sharding={R()}
  ROOT b = f32[5,7] broadcast(x), dimensions={{1}}, sharding={sh(n, n, 1)}"""), True),
        "both_partial": (module(f"""
  x = f32[6,5] parameter(0), sharding={sh(n, 2, 1)}
  ROOT b = f32[3,6,4,5] broadcast(x), dimensions={{1,3}}, sharding={sh(n, 1, 2, h, 1)}"""),
                         True),
        "unit_dim_kept": (module(f"""
  x = f32[1,5] parameter(0), sharding={sh(n, 1, n)}
  ROOT b = f32[9,1,5] broadcast(x), dimensions={{1,2}}, sharding={sh(n, 2, 1, n // 2)}"""),
                          False),
        "scalar": (module(f"""
  x = f32[] parameter(0), sharding={R()}
  ROOT b = f32[9,10] broadcast(x), dimensions={{}}, sharding={sh(n, 2, h)}"""), True),
        "operand_resharded": (module(f"""
  x = f32[8,6] parameter(0), sharding={sh(n, 1, n)}
  ROOT b = f32[8,6,3] broadcast(x), dimensions={{0,1}}, sharding={sh(n, n, 1, 1)}"""), False),
        "transposed_devices": (module(f"""
  x = f32[9,6] parameter(0), sharding={sh(n, h, 2, order="T")}
  ROOT b = f32[9,4,6] broadcast(x), dimensions={{0,2}}, sharding={sh(n, h, 1, 2, order="T")}"""),
                               True),
    }


# -- transpose -------------------------------------------------------------------------------
def transpose_cases(n):
    h = n // 2
    return {
        "2d_tiled": (module(f"""
  x = f32[7,6] parameter(0), sharding={sh(n, n, 1)}
  ROOT t = f32[6,7] transpose(x), dimensions={{1,0}}, sharding={sh(n, 1, n)}"""), True),
        "3d_two_dims": (module(f"""
  x = f32[5,6,7] parameter(0), sharding={sh(n, 2, 1, h)}
  ROOT t = f32[7,5,6] transpose(x), dimensions={{2,0,1}}, sharding={sh(n, h, 2, 1, order=None)}"""),
                        False),
        "partial": (module(f"""
  x = f32[9,4,3] parameter(0), sharding={sh(n, 2, 1, 1)}
  ROOT t = f32[3,9,4] transpose(x), dimensions={{2,0,1}}, sharding={sh(n, 1, 2, 1)}"""), True),
        "needs_reshard": (module(f"""
  x = f32[8,6] parameter(0), sharding={sh(n, n, 1)}
  ROOT t = f32[6,8] transpose(x), dimensions={{1,0}}, sharding={sh(n, n, 1)}"""), False),
    }


# -- reshape ---------------------------------------------------------------------------------
def _reshape_text(n, in_dims, in_sh, out_dims, out_sh):
    return module(f"""
  x = f32[{','.join(map(str, in_dims))}] parameter(0), sharding={in_sh}
  ROOT r = f32[{','.join(map(str, out_dims))}] reshape(x), sharding={out_sh}""")


def _mapped(in_sh, in_dims, out_dims):
    s = reshape_sharding(HloSharding.from_string(in_sh), in_dims, out_dims)
    assert s is not None
    return s.to_string()


def reshape_cases(n):
    h = n // 2
    cases = {}
    # Local: the result sharding is what reshape_sharding maps the operand's to.
    for name, ind, insh, outd in [
        ("split_major_even", (16, 6), sh(n, n, 1), (4, 4, 6)),
        ("split_major_partial", (16, 6), sh(n, 2, 1), (2, 8, 6)),
        ("merge_major", (4, 6, 5), sh(n, 2, 1, 1), (24, 5)),
        ("uneven_batch", (7, 6), sh(n, n, 1), (7, 2, 3)),
        ("add_unit_dims", (9, 4), sh(n, 2, h), (9, 1, 4, 1)),
        ("minor_split", (5, 16), sh(n, 1, n), (5, 4, 4)),
    ]:
        cases[name] = (_reshape_text(n, ind, insh, outd, _mapped(insh, ind, outd)), True)
    cases["back_map_operand_resharded"] = (
        _reshape_text(n, (16, 6), sh(n, 1, 2), (4, 4, 6), _mapped(sh(n, n, 1), (16, 6), (4, 4, 6))),
        False)
    cases["no_map_minor_tiled"] = (_reshape_text(n, (6, 4), sh(n, 1, 2), (24,), sh(n, n)), False)
    cases["no_map_uneven_merge"] = (_reshape_text(n, (7, 6), sh(n, n, 1), (42,), sh(n, n)), False)
    # A tiled size-1 dim: half the devices hold only padding, so no local reshape.
    cases["tiled_unit_dim"] = (_reshape_text(n, (2, 3, 1), f"{{devices=[2,1,{h}]<=[{n}]}}"
                                             if n > 2 else sh(n, 1, 1, 2), (6, 1), sh(n, n, 1)),
                               False)
    cases["to_replicated"] = (_reshape_text(n, (7, 6), sh(n, n, 1), (6, 7), R()), False)
    cases["from_replicated"] = (_reshape_text(n, (6, 7), R(), (7, 6), sh(n, 1, n)), True)
    return cases


# -- slice -----------------------------------------------------------------------------------
def slice_cases(n):
    h = n // 2
    return {
        "unsharded_dim": (module(f"""
  x = f32[8,10] parameter(0), sharding={sh(n, n, 1)}
  ROOT s = f32[8,7] slice(x), slice={{[0:8], [2:9]}}, sharding={sh(n, n, 1)}"""), True),
        "keep_front": (module(f"""
  x = f32[8,3] parameter(0), sharding={sh(n, n, 1)}
  ROOT s = f32[7,3] slice(x), slice={{[0:7], [0:3]}}, sharding={sh(n, n, 1)}"""), n < 8),
        "shifted": (module(f"""
  x = f32[13,4] parameter(0), sharding={sh(n, n, 1)}
  ROOT s = f32[8,4] slice(x), slice={{[3:11], [0:4]}}, sharding={sh(n, n, 1)}"""), False),
        "strided": (module(f"""
  x = f32[17,3] parameter(0), sharding={sh(n, n, 1)}
  ROOT s = f32[5,3] slice(x), slice={{[1:16:3], [0:3]}}, sharding={sh(n, n, 1)}"""), False),
        "replicated_operand": (module(f"""
  x = f32[12,5] parameter(0), sharding={R()}
  ROOT s = f32[5,5] slice(x), slice={{[2:12:2], [0:5]}}, sharding={sh(n, n, 1)}"""), True),
        "two_dims_partial": (module(f"""
  x = f32[11,9] parameter(0), sharding={sh(n, 2, h)}
  ROOT s = f32[4,4] slice(x), slice={{[1:11:3], [2:9:2]}}, sharding={sh(n, 2, h)}"""), False),
        "second_half": (module(f"""
  x = f32[32,2] parameter(0), sharding={sh(n, n, 1)}
  ROOT s = f32[16,2] slice(x), slice={{[16:32], [0:2]}}, sharding={sh(n, n, 1)}"""), False),
        "reverse_devices": (module(f"""
  x = f32[10,3] parameter(0), sharding={sh(n, n, 1, order="rev")}
  ROOT s = f32[9,3] slice(x), slice={{[1:10], [0:3]}}, sharding={sh(n, n, 1, order="rev")}"""),
                            False),
        "output_replicated": (module(f"""
  x = f32[9,3] parameter(0), sharding={sh(n, n, 1)}
  ROOT s = f32[4,3] slice(x), slice={{[2:6], [0:3]}}, sharding={R()}"""), False),
    }


# -- pad -------------------------------------------------------------------------------------
def pad_cases(n):
    h = n // 2
    return {
        "unsharded_dim": (module(f"""
  x = f32[8,5] parameter(0), sharding={sh(n, n, 1)}
  c = f32[] constant(0), sharding={R()}
  ROOT p = f32[8,8] pad(x, c), padding=0_0x1_2, sharding={sh(n, n, 1)}"""), True),
        "low_high_param_value": (module(f"""
  x = f32[7,3] parameter(0), sharding={sh(n, n, 1)}
  v = f32[] parameter(1), sharding={R()}
  ROOT p = f32[12,3] pad(x, v), padding=2_3x0_0, sharding={sh(n, n, 1)}"""), False),
        "interior": (module(f"""
  x = f32[5,4] parameter(0), sharding={sh(n, n, 1)}
  c = f32[] constant(-1.5), sharding={R()}
  ROOT p = f32[17,4] pad(x, c), padding=1_3_2x0_0, sharding={sh(n, n, 1)}"""), False),
        "negative": (module(f"""
  x = f32[13,2] parameter(0), sharding={sh(n, n, 1)}
  c = f32[] constant(0), sharding={R()}
  ROOT p = f32[8,2] pad(x, c), padding=-3_-2x0_0, sharding={sh(n, n, 1)}"""), False),
        "high_only_same_tiles": (module(f"""
  x = f32[14,2] parameter(0), sharding={sh(n, n, 1)}
  c = f32[] constant(7), sharding={R()}
  ROOT p = f32[16,2] pad(x, c), padding=0_2x0_0, sharding={sh(n, n, 1)}"""), n > 2),
        "mixed_2d": (module(f"""
  x = f32[9,6] parameter(0), sharding={sh(n, 2, h)}
  c = f32[] constant(3), sharding={R()}
  ROOT p = f32[19,13] pad(x, c), padding=-2_4_1x3_-1_1, sharding={sh(n, 2, h)}"""), False),
        "replicated_operand": (module(f"""
  x = s32[6,3] parameter(0), sharding={R()}
  c = s32[] constant(-9), sharding={R()}
  ROOT p = s32[15,3] pad(x, c), padding=2_2_1x0_0, sharding={sh(n, n, 1)}"""), True),
        "pred": (module(f"""
  x = pred[9] parameter(0), sharding={sh(n, n)}
  c = pred[] constant(false), sharding={R()}
  ROOT p = pred[14] pad(x, c), padding=3_2, sharding={sh(n, n)}"""), False),
    }


# -- concatenate -----------------------------------------------------------------------------
def concat_cases(n):
    h = n // 2
    return {
        "unsharded_dim": (module(f"""
  a = f32[8,3] parameter(0), sharding={sh(n, n, 1)}
  b = f32[8,5] parameter(1), sharding={sh(n, n, 1)}
  ROOT c = f32[8,8] concatenate(a, b), dimensions={{1}}, sharding={sh(n, n, 1)}"""), True),
        "sharded_uneven": (module(f"""
  a = f32[5,4] parameter(0), sharding={sh(n, n, 1)}
  b = f32[7,4] parameter(1), sharding={sh(n, n, 1)}
  d = f32[3,4] parameter(2), sharding={sh(n, n, 1)}
  ROOT c = f32[15,4] concatenate(a, b, d), dimensions={{0}}, sharding={sh(n, n, 1)}"""), False),
        "sharded_even": (module(f"""
  a = f32[16] parameter(0), sharding={sh(n, n)}
  b = f32[16] parameter(1), sharding={sh(n, n)}
  ROOT c = f32[32] concatenate(a, b), dimensions={{0}}, sharding={sh(n, n)}"""), False),
        "mixed_operand_shardings": (module(f"""
  a = f32[6,5] parameter(0), sharding={R()}
  b = f32[3,5] parameter(1), sharding={sh(n, n, 1)}
  ROOT c = f32[9,5] concatenate(a, b), dimensions={{0}}, sharding={sh(n, n, 1)}"""), False),
        "2d_partial": (module(f"""
  a = f32[6,3] parameter(0), sharding={sh(n, 1, 2)}
  b = f32[6,4] parameter(1), sharding={sh(n, 1, 2)}
  ROOT c = f32[6,7] concatenate(a, b), dimensions={{1}}, sharding={sh(n, 1, 2)}"""), False),
        "many_small": (module(f"""
  a = s32[1,2] parameter(0), sharding={R()}
  b = s32[2,2] parameter(1), sharding={sh(n, 2, 1)}
  d = s32[1,2] parameter(2), sharding={R()}
  e = s32[5,2] parameter(3), sharding={sh(n, n, 1)}
  ROOT c = s32[9,2] concatenate(a, b, d, e), dimensions={{0}}, sharding={sh(n, h, 2)}"""), False),
    }


# -- dynamic-slice / dynamic-update-slice ----------------------------------------------------
def _starts(*values):
    return [np.asarray(v, np.int32) for v in values]


def dynamic_cases(n):
    h = n // 2
    rng = np.random.default_rng(n)
    x816 = rng.normal(size=(8, 10)).astype(np.float32)
    x163 = rng.normal(size=(16, 3)).astype(np.float32)
    b134 = rng.normal(size=(13, 4)).astype(np.float32)
    u54 = rng.normal(size=(5, 4)).astype(np.float32)
    b910 = rng.normal(size=(9, 10)).astype(np.float32)
    u34 = rng.normal(size=(3, 4)).astype(np.float32)
    return {
        "ds_unsharded_dim": (module(f"""
  x = f32[8,10] parameter(0), sharding={sh(n, n, 1)}
  i = s32[] parameter(1), sharding={R()}
  z = s32[] constant(0), sharding={R()}
  ROOT d = f32[8,4] dynamic-slice(x, z, i), dynamic_slice_sizes={{8,4}}, sharding={sh(n, n, 1)}"""),
                             True, [[x816, *_starts(s)] for s in (0, 3, 9, -4)]),
        "ds_sharded_dim": (module(f"""
  x = f32[16,3] parameter(0), sharding={sh(n, n, 1)}
  i = s32[] parameter(1), sharding={R()}
  j = s32[] parameter(2), sharding={R()}
  ROOT d = f32[5,3] dynamic-slice(x, i, j), dynamic_slice_sizes={{5,3}}, sharding={sh(n, n, 1)}"""),
                           False, [[x163, *_starts(s, 1)] for s in (0, 6, 14, -2)]),
        "ds_replicated_operand": (module(f"""
  x = f32[16,3] parameter(0), sharding={R()}
  i = s32[] parameter(1), sharding={R()}
  j = s32[] parameter(2), sharding={R()}
  ROOT d = f32[7,2] dynamic-slice(x, i, j), dynamic_slice_sizes={{7,2}}, sharding={sh(n, n, 1)}"""),
                                  True, [[x163, *_starts(s, t)] for s, t in ((2, 0), (20, 5))]),
        "dus_unsharded_dim": (module(f"""
  x = f32[8,10] parameter(0), sharding={sh(n, n, 1)}
  u = f32[8,3] parameter(1), sharding={sh(n, n, 1)}
  i = s32[] parameter(2), sharding={R()}
  z = s32[] constant(0), sharding={R()}
  ROOT d = f32[8,10] dynamic-update-slice(x, u, z, i), sharding={sh(n, n, 1)}"""),
                              True, [[x816, x816[:, :3], *_starts(s)] for s in (0, 4, 8, -1)]),
        "dus_sharded_dim": (module(f"""
  x = f32[13,4] parameter(0), sharding={sh(n, n, 1)}
  u = f32[5,4] parameter(1), sharding={R()}
  i = s32[] parameter(2), sharding={R()}
  z = s32[] constant(0), sharding={R()}
  ROOT d = f32[13,4] dynamic-update-slice(x, u, i, z), sharding={sh(n, n, 1)}"""),
                            True, [[b134, u54, *_starts(s)] for s in (0, 3, 4, 8, 11, -2)]),
        "dus_two_split_dims": (module(f"""
  x = f32[9,10] parameter(0), sharding={sh(n, 2, h)}
  u = f32[3,4] parameter(1), sharding={sh(n, 1, 2)}
  i = s32[] parameter(2), sharding={R()}
  j = s32[] parameter(3), sharding={R()}
  ROOT d = f32[9,10] dynamic-update-slice(x, u, i, j), sharding={sh(n, 2, h)}"""),
                               False, [[b910, u34, *_starts(s, t)]
                                       for s, t in ((0, 0), (4, 3), (7, 9), (2, 6))]),
        "dus_split_and_whole_dim": (module(f"""
  x = f32[9,10] parameter(0), sharding={sh(n, n, 1)}
  u = f32[3,4] parameter(1), sharding={R()}
  i = s32[] parameter(2), sharding={R()}
  j = s32[] parameter(3), sharding={R()}
  ROOT d = f32[9,10] dynamic-update-slice(x, u, i, j), sharding={sh(n, n, 1)}"""),
                                    True, [[b910, u34, *_starts(s, t)]
                                           for s, t in ((0, 0), (4, 3), (7, 9), (5, -3))]),
        "dus_u32_starts": (module(f"""
  x = f32[13,4] parameter(0), sharding={sh(n, n, 1)}
  u = f32[5,4] parameter(1), sharding={R()}
  i = u32[] parameter(2), sharding={R()}
  z = u32[] constant(0), sharding={R()}
  ROOT d = f32[13,4] dynamic-update-slice(x, u, i, z), sharding={sh(n, n, 1)}"""),
                           True, [[b134, u54, np.asarray(s, np.uint32)] for s in (2, 4000000000)]),
    }


# -- reverse ---------------------------------------------------------------------------------
def reverse_cases(n):
    h = n // 2
    out = sh(n, n, 1)
    mirrored = reverse_sharding(HloSharding.from_string(out), [0]).to_string()
    return {
        "even_mirror": (module(f"""
  x = f32[8,3] parameter(0), sharding={sh(n, n, 1)}
  ROOT r = f32[8,3] reverse(x), dimensions={{0}}, sharding={out}"""), False),
        "uneven": (module(f"""
  x = f32[7,3] parameter(0), sharding={sh(n, n, 1)}
  ROOT r = f32[7,3] reverse(x), dimensions={{0}}, sharding={out}"""), False),
        "operand_mirrored_local": (module(f"""
  x = f32[8,3] parameter(0), sharding={mirrored}
  ROOT r = f32[8,3] reverse(x), dimensions={{0}}, sharding={out}"""), True),
        "unsharded_dim": (module(f"""
  x = f32[7,5] parameter(0), sharding={sh(n, n, 1)}
  ROOT r = f32[7,5] reverse(x), dimensions={{1}}, sharding={out}"""), True),
        "both_dims_partial": (module(f"""
  x = f32[5,6] parameter(0), sharding={sh(n, 2, 1)}
  ROOT r = f32[5,6] reverse(x), dimensions={{0,1}}, sharding={sh(n, 2, h)}"""), False),
        "two_dims_operand_tiles_one": (module(f"""
  x = f32[3,6] parameter(0), sharding={sh(n, 1, n)}
  ROOT r = f32[3,6] reverse(x), dimensions={{0,1}}, sharding={sh(n, h, 2, order="T")}"""), False),
        "replicated_operand": (module(f"""
  x = f32[9,2] parameter(0), sharding={R()}
  ROOT r = f32[9,2] reverse(x), dimensions={{0}}, sharding={out}"""), True),
    }


# -- iota ------------------------------------------------------------------------------------
def iota_cases(n):
    h = n // 2
    return {
        "s32_tiled": (module(f"""
  ROOT i = s32[9,5] iota(), iota_dimension=0, sharding={sh(n, n, 1)}"""), True),
        "f32_2d": (module(f"""
  ROOT i = f32[7,6] iota(), iota_dimension=1, sharding={sh(n, 2, h)}"""), True),
        "other_dim_tiled": (module(f"""
  ROOT i = s32[9,5] iota(), iota_dimension=1, sharding={sh(n, n, 1)}"""), True),
        "u8_wraps": (module(f"""
  ROOT i = u8[300] iota(), iota_dimension=0, sharding={sh(n, n)}"""), True),
        "bf16_rounding": (module(f"""
  ROOT i = bf16[1000] iota(), iota_dimension=0, sharding={sh(n, n)}"""), True),
        "partial_reversed": (module(f"""
  p = s32[10] parameter(0), sharding={sh(n, 2, order="rev")}
  i = s32[10] iota(), iota_dimension=0, sharding={sh(n, 2, order="rev")}
  ROOT a = s32[10] add(p, i), sharding={sh(n, 2, order="rev")}"""), True),
    }


# -- elementwise with scalar operands ----------------------------------------------------------
def elementwise_cases(n):
    h = n // 2
    return {
        "clamp_scalar_bounds": (module(f"""
  lo = f32[] parameter(0), sharding={R()}
  x = f32[9,4] parameter(1), sharding={sh(n, n, 1)}
  hi = f32[] constant(0.5), sharding={R()}
  ROOT c = f32[9,4] clamp(lo, x, hi), sharding={sh(n, n, 1)}"""), True),
        "select_compare_convert": (module(f"""
  x = f32[7,6] parameter(0), sharding={sh(n, 2, h)}
  y = f32[7,6] parameter(1), sharding={sh(n, 2, h)}
  p = pred[7,6] compare(x, y), direction=GT, sharding={sh(n, 2, h)}
  s = f32[7,6] select(p, x, y), sharding={sh(n, 2, h)}
  ROOT c = s32[7,6] convert(s), sharding={sh(n, 2, h)}"""), True),
        "bitcast_convert_same_width": (module(f"""
  x = f32[11] parameter(0), sharding={sh(n, n)}
  ROOT c = s32[11] bitcast-convert(x), sharding={sh(n, n)}"""), True),
        "bitcast_convert_widen": (module(f"""
  x = f32[9,3] parameter(0), sharding={sh(n, h, 2)}
  ROOT c = u8[9,3,4] bitcast-convert(x), sharding={sh(n, h, 2, 1)}"""), True),
        "bitcast_convert_widen_minor_tiled": (module(f"""
  x = f32[7] parameter(0), sharding={sh(n, n)}
  ROOT c = u16[7,2] bitcast-convert(x), sharding={sh(n, h, 2)}"""), False),
        "bitcast_convert_narrow": (module(f"""
  x = u8[9,4] parameter(0), sharding={sh(n, n, 1)}
  ROOT c = f32[9] bitcast-convert(x), sharding={sh(n, n)}"""), True),
        "bitcast_convert_scalar_widen": (module(f"""
  x = f32[] parameter(0), sharding={R()}
  ROOT c = u8[4] bitcast-convert(x), sharding={sh(n, 2)}"""), True),
    }


FAMILIES = {
    "broadcast": broadcast_cases, "transpose": transpose_cases, "reshape": reshape_cases,
    "slice": slice_cases, "pad": pad_cases, "concatenate": concat_cases,
    "dynamic": dynamic_cases, "reverse": reverse_cases, "iota": iota_cases,
    "elementwise": elementwise_cases,
}


def _all_cases():
    out = []
    for family, fn in FAMILIES.items():
        for n in NS:
            for name, spec in fn(n).items():
                out.append(pytest.param(family, name, n, id=f"{family}-{name}-n{n}"))
    return out


@pytest.mark.parametrize("family,name,n", _all_cases())
def test_case(family, name, n):
    spec = FAMILIES[family](n)[name]
    text, local = spec[0], spec[1]
    inputs = spec[2] if len(spec) > 2 else None
    check(text, n, inputs=inputs, local=local)


def test_elementwise_compute_sharding_choice():
    from hlo_spmd.passes.partition.handlers.elementwise import compute_sharding
    from hlo_spmd.sharding import parse_sharding

    tiled = parse_sharding("{devices=[2,4]<=[8]}")
    partial = parse_sharding("{devices=[2,1,4]<=[8] last_tile_dim_replicate}")
    # three operands already tiled, result partially replicated: compute tiled
    assert compute_sharding(partial, [tiled, tiled, tiled]) == tiled
    # one operand: resharding it or the result costs the same -> the result's sharding
    assert compute_sharding(partial, [tiled]) == partial
    # operands disagree: the result's sharding
    assert compute_sharding(partial, [tiled, partial]) == partial
