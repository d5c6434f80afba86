"""Generate large sharding-annotated HLO modules for the propagation benchmark.

Each module is a stack of L transformer-like blocks unrolled in one entry computation
(what an unrolled scan of layers looks like to XLA), written as HLO text in XLA's
syntax. Per block (~40 instructions): the block's weights sliced out of stacked
``[L, ...]`` parameters, a ReLU-free MLP (dot / tanh / dot / add), a layer norm (reduce,
broadcast, subtract, multiply, rsqrt) and a single-head-group attention (reshape,
transpose, batched dots, exp, reduce, divide). Only the entry parameters, the root and
a few ``Sharding`` custom-calls on the residual stream carry shardings - about 0.7% of
the instructions, as in the GSPMD paper - on a 2x4 (data x model) mesh of 8 devices:

* ``x`` [B,S,D]: batch over data (``{devices=[2,1,1,4]<=[8] last_tile_dim_replicate}``)
* ``w1`` [L,D,F]: F over model; ``w2`` [L,F,D]: F over model; ``ln`` [L,D]: replicated
* every k-th residual: a ``Sharding`` custom-call (batch over data), the root likewise.

Output: ``benchmarks/generated/transformer_<size>.hlo`` plus a ``.json`` sidecar
(``num_partitions``, instruction and annotation counts), and a ``.pb`` made by jaxlib's
HLO parser when jax is installed (which also checks that XLA accepts the text).

    python benchmarks/gen_modules.py                 # 1k, 10k, 100k
    python benchmarks/gen_modules.py --sizes 1k,10k --no-pb --check
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
GENERATED = HERE / "generated"
DEFAULT_SIZES = ("1k", "10k", "100k")

# Model dimensions: small arrays; the benchmark measures instruction counts, not FLOPs.
B, S, D, F, H = 8, 16, 64, 128, 4
DH = D // H
NUM_PARTITIONS = 8
ANNOTATED_FRACTION = 0.007

DATA = "{devices=[2,1,1,4]<=[8] last_tile_dim_replicate}"          # [B,S,D] batch on data
W1_SHARDING = "{devices=[1,1,4,2]<=[2,4]T(1,0) last_tile_dim_replicate}"  # [L,D,F] F on model
W2_SHARDING = "{devices=[1,4,1,2]<=[2,4]T(1,0) last_tile_dim_replicate}"  # [L,F,D] F on model
LN_SHARDING = "{replicated}"


def parse_size(text: str) -> int:
    """``"1k"`` -> 1000, ``"100k"`` -> 100000, ``"2500"`` -> 2500."""
    t = text.strip().lower()
    mult = 1
    if t.endswith("k"):
        mult, t = 1000, t[:-1]
    elif t.endswith("m"):
        mult, t = 1000000, t[:-1]
    return int(float(t) * mult)


def _block(i: int, x: str, constrain: bool) -> tuple[list[str], str]:
    """Instructions of block ``i`` reading residual ``x``; returns (lines, output name)."""
    p = f"b{i}"
    f32 = "f32"
    bsd = f"{f32}[{B},{S},{D}]"
    bsf = f"{f32}[{B},{S},{F}]"
    bs = f"{f32}[{B},{S}]"
    bhsd = f"{f32}[{B},{H},{S},{DH}]"
    bhss = f"{f32}[{B},{H},{S},{S}]"
    bshd = f"{f32}[{B},{S},{H},{DH}]"
    L = [
        # this block's weights out of the stacked parameters
        f"%{p}.w1s = {f32}[1,{D},{F}] slice(%w1), slice={{[{i}:{i + 1}], [0:{D}], [0:{F}]}}",
        f"%{p}.w1 = {f32}[{D},{F}] reshape(%{p}.w1s)",
        f"%{p}.w2s = {f32}[1,{F},{D}] slice(%w2), slice={{[{i}:{i + 1}], [0:{F}], [0:{D}]}}",
        f"%{p}.w2 = {f32}[{F},{D}] reshape(%{p}.w2s)",
        f"%{p}.lns = {f32}[1,{D}] slice(%ln), slice={{[{i}:{i + 1}], [0:{D}]}}",
        f"%{p}.ln = {f32}[{D}] reshape(%{p}.lns)",
        # layer norm of the residual
        f"%{p}.sum = {bs} reduce({x}, %zero), dimensions={{2}}, to_apply=%add_f32",
        f"%{p}.invd = {bs} broadcast(%inv_d), dimensions={{}}",
        f"%{p}.mean = {bs} multiply(%{p}.sum, %{p}.invd)",
        f"%{p}.meanb = {bsd} broadcast(%{p}.mean), dimensions={{0,1}}",
        f"%{p}.c = {bsd} subtract({x}, %{p}.meanb)",
        f"%{p}.sq = {bsd} multiply(%{p}.c, %{p}.c)",
        f"%{p}.var = {bs} reduce(%{p}.sq, %zero), dimensions={{2}}, to_apply=%add_f32",
        f"%{p}.epsb = {bs} broadcast(%eps), dimensions={{}}",
        f"%{p}.vare = {bs} add(%{p}.var, %{p}.epsb)",
        f"%{p}.rs = {bs} rsqrt(%{p}.vare)",
        f"%{p}.rsb = {bsd} broadcast(%{p}.rs), dimensions={{0,1}}",
        f"%{p}.n = {bsd} multiply(%{p}.c, %{p}.rsb)",
        f"%{p}.lnb = {bsd} broadcast(%{p}.ln), dimensions={{2}}",
        f"%{p}.y = {bsd} multiply(%{p}.n, %{p}.lnb)",
        # attention over heads (q = k = v = y: no projections, same structure)
        f"%{p}.y4 = {bshd} reshape(%{p}.y)",
        f"%{p}.q = {bhsd} transpose(%{p}.y4), dimensions={{0,2,1,3}}",
        f"%{p}.s = {bhss} dot(%{p}.q, %{p}.q), lhs_batch_dims={{0,1}}, "
        f"lhs_contracting_dims={{3}}, rhs_batch_dims={{0,1}}, rhs_contracting_dims={{3}}",
        f"%{p}.e = {bhss} exponential(%{p}.s)",
        f"%{p}.esum = {f32}[{B},{H},{S}] reduce(%{p}.e, %zero), dimensions={{3}}, "
        f"to_apply=%add_f32",
        f"%{p}.esumb = {bhss} broadcast(%{p}.esum), dimensions={{0,1,2}}",
        f"%{p}.pr = {bhss} divide(%{p}.e, %{p}.esumb)",
        f"%{p}.ctx = {bhsd} dot(%{p}.pr, %{p}.q), lhs_batch_dims={{0,1}}, "
        f"lhs_contracting_dims={{3}}, rhs_batch_dims={{0,1}}, rhs_contracting_dims={{2}}",
        f"%{p}.ctxt = {bshd} transpose(%{p}.ctx), dimensions={{0,2,1,3}}",
        f"%{p}.att = {bsd} reshape(%{p}.ctxt)",
        f"%{p}.r1 = {bsd} add({x}, %{p}.att)",
        # MLP
        f"%{p}.h = {bsf} dot(%{p}.r1, %{p}.w1), lhs_contracting_dims={{2}}, "
        f"rhs_contracting_dims={{0}}",
        f"%{p}.t = {bsf} tanh(%{p}.h)",
        f"%{p}.o = {bsd} dot(%{p}.t, %{p}.w2), lhs_contracting_dims={{2}}, "
        f"rhs_contracting_dims={{0}}",
        f"%{p}.r2 = {bsd} add(%{p}.r1, %{p}.o)",
    ]
    out = f"%{p}.r2"
    if constrain:
        L.append(f"%{p}.sc = {bsd} custom-call(%{p}.r2), custom_call_target=\"Sharding\", "
                 f"sharding={DATA}")
        out = f"%{p}.sc"
    return L, out


INSTRUCTIONS_PER_BLOCK = len(_block(0, "%x", False)[0])
# entry: x, w1, w2, ln, zero, inv_d, eps; reducer: 3; root: 1
FIXED_INSTRUCTIONS = 7 + 3 + 1
FIXED_ANNOTATIONS = 5  # 4 parameters + root


def blocks_for(target: int) -> int:
    return max(1, round((target - FIXED_INSTRUCTIONS) / (INSTRUCTIONS_PER_BLOCK + 0.007)))


def generate(target: int, name: str | None = None) -> tuple[str, dict]:
    """HLO text of a module with about ``target`` instructions, and its sidecar dict."""
    layers = blocks_for(target)
    approx = FIXED_INSTRUCTIONS + layers * INSTRUCTIONS_PER_BLOCK
    wanted = max(FIXED_ANNOTATIONS + 1, round(ANNOTATED_FRACTION * approx))
    constraints = min(layers, wanted - FIXED_ANNOTATIONS)
    every = max(1, layers // constraints)
    constrained = {i for i in range(layers) if (i + 1) % every == 0}
    constrained = set(sorted(constrained)[:constraints])
    name = name or f"transformer_{target}"
    lines = [
        f"HloModule {name}, num_partitions={NUM_PARTITIONS}",
        "",
        "%add_f32 (a: f32[], b: f32[]) -> f32[] {",
        "  %a = f32[] parameter(0)",
        "  %b = f32[] parameter(1)",
        "  ROOT %sum = f32[] add(%a, %b)",
        "}",
        "",
        f"ENTRY %main (x: f32[{B},{S},{D}], w1: f32[{layers},{D},{F}], "
        f"w2: f32[{layers},{F},{D}], ln: f32[{layers},{D}]) -> f32[{B},{S},{D}] {{",
        f"  %x = f32[{B},{S},{D}] parameter(0), sharding={DATA}",
        f"  %w1 = f32[{layers},{D},{F}] parameter(1), sharding={W1_SHARDING}",
        f"  %w2 = f32[{layers},{F},{D}] parameter(2), sharding={W2_SHARDING}",
        f"  %ln = f32[{layers},{D}] parameter(3), sharding={LN_SHARDING}",
        "  %zero = f32[] constant(0)",
        f"  %inv_d = f32[] constant({1.0 / D})",
        "  %eps = f32[] constant(1e-05)",
    ]
    x = "%x"
    for i in range(layers):
        body, x = _block(i, x, i in constrained)
        lines.extend("  " + line for line in body)
    lines.append(f"  ROOT %out = f32[{B},{S},{D}] copy({x}), sharding={DATA}")
    lines.append("}")
    text = "\n".join(lines) + "\n"
    instructions = sum(1 for line in lines if line.startswith("  "))
    annotated = FIXED_ANNOTATIONS + len(constrained)
    meta = {
        "name": name,
        "description": f"{layers} unrolled transformer-like blocks on a 2x4 mesh",
        "num_partitions": NUM_PARTITIONS,
        "target": target,
        "blocks": layers,
        "instructions": instructions,
        "annotated": annotated,
        "annotated_percent": round(100.0 * annotated / instructions, 3),
    }
    return text, meta


def text_to_pb(text: str) -> bytes | None:
    """Serialized HloModuleProto via jaxlib's parser, or None without jax."""
    try:
        from jaxlib import _hlo
    except ImportError:
        return None
    return _hlo.hlo_module_from_text(text).as_serialized_hlo_module_proto()


def write(size: str, out_dir: Path = GENERATED, pb: bool = True) -> dict:
    """Generate one size; returns the sidecar (with ``paths``)."""
    target = parse_size(size)
    name = f"transformer_{size}"
    text, meta = generate(target, name)
    out_dir.mkdir(parents=True, exist_ok=True)
    hlo = out_dir / f"{name}.hlo"
    hlo.write_text(text)
    meta["paths"] = {"hlo": str(hlo)}
    if pb:
        data = text_to_pb(text)
        if data is not None:
            (out_dir / f"{name}.pb").write_bytes(data)
            meta["paths"]["pb"] = str(out_dir / f"{name}.pb")
    (out_dir / f"{name}.json").write_text(json.dumps(meta, indent=1) + "\n")
    return meta


def paths_for(size: str, out_dir: Path = GENERATED) -> dict[str, Path]:
    name = f"transformer_{size}"
    return {"hlo": out_dir / f"{name}.hlo", "pb": out_dir / f"{name}.pb",
            "json": out_dir / f"{name}.json"}


def _ensure_src_on_path() -> None:
    try:
        import hlo_spmd  # noqa: F401
    except ImportError:
        sys.path.insert(0, str(HERE.parent / "src"))


def check(meta: dict) -> str:
    """Load the generated files with hlo_spmd.ir.io.load_module; a one-line summary."""
    _ensure_src_on_path()
    from hlo_spmd.ir.io import load_module

    parts = []
    for kind, path in meta["paths"].items():
        t = time.perf_counter()
        m = load_module(path)
        dt = time.perf_counter() - t
        n = m.instruction_count()
        annotated = sum(1 for i in m.instructions() if i.sharding is not None)
        if n != meta["instructions"] or annotated != meta["annotated"]:
            raise SystemExit(f"{path}: loaded {n} instructions / {annotated} annotated, "
                             f"expected {meta['instructions']} / {meta['annotated']}")
        parts.append(f"{kind} loads in {dt:.2f} s")
    return ", ".join(parts)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default=",".join(DEFAULT_SIZES),
                    help="comma-separated instruction counts (1k, 10k, 100k, 2500, ...)")
    ap.add_argument("--out", type=Path, default=GENERATED)
    ap.add_argument("--no-pb", action="store_true", help="do not write the jaxlib .pb")
    ap.add_argument("--check", action="store_true",
                    help="load every file with hlo_spmd.ir.io.load_module")
    args = ap.parse_args(argv)
    for size in [s for s in args.sizes.split(",") if s.strip()]:
        t = time.perf_counter()
        meta = write(size.strip(), args.out, pb=not args.no_pb)
        line = (f"{meta['name']}: {meta['instructions']} instructions, {meta['blocks']} blocks, "
                f"{meta['annotated']} annotated ({meta['annotated_percent']}%), "
                f"written in {time.perf_counter() - t:.2f} s")
        if args.check:
            line += "; " + check(meta)
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
